//! A one-shot exec's output as a stream of events.

use std::collections::VecDeque;

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use wire::{Decoder, Direction, ExecResult, FrameType};

use crate::chunked::Dechunker;
use crate::error::ClientError;
use crate::raw;

/// One piece of a command's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// Bytes on stdout.
    Stdout(Bytes),
    /// Bytes on stderr.
    Stderr(Bytes),
    /// The command ended; the last event.
    Exit(ExecResult),
}

/// Everything a command printed, and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// All of stdout.
    pub stdout: Vec<u8>,
    /// All of stderr.
    pub stderr: Vec<u8>,
    /// The exit frame's result.
    pub result: ExecResult,
}

/// Turns decoded frames into events; shared by the one-shot stream and interactive sessions.
pub(crate) fn event_from(frame_type: FrameType, payload: &[u8]) -> Result<ExecEvent, ClientError> {
    match frame_type {
        FrameType::Stdout => Ok(ExecEvent::Stdout(Bytes::copy_from_slice(payload))),
        FrameType::Stderr => Ok(ExecEvent::Stderr(Bytes::copy_from_slice(payload))),
        FrameType::Exit => serde_json::from_slice(payload)
            .map(ExecEvent::Exit)
            .map_err(|e| {
                ClientError::Protocol(format!("the exit frame is not an ExecResult: {e}"))
            }),
        other => Err(ClientError::Protocol(format!(
            "unexpected {other} frame from the daemon"
        ))),
    }
}

/// The events of a running one-shot exec.
#[derive(Debug)]
pub struct ExecStream {
    /// The command's name (the response's `X-Crucible-Exec-Id`).
    exec_id: Option<String>,
    /// Where the stream starts in the command's output (`X-Crucible-Output-Kept-From` of an
    /// attach), when the daemon said.
    kept_from: Option<u64>,
    body: raw::Reader,
    /// The response's chunked coding, when it has one (the daemon always sends one).
    dechunker: Option<Dechunker>,
    read_buf: Vec<u8>,
    data: Vec<u8>,
    decoder: Decoder,
    queue: VecDeque<ExecEvent>,
    finished: bool,
}

impl ExecStream {
    pub(crate) fn new(response: raw::Response) -> Self {
        let chunked = response.chunked;
        let exec_id = response.header("x-crucible-exec-id").map(str::to_string);
        let kept_from = response
            .header("x-crucible-output-kept-from")
            .and_then(|v| v.parse().ok());
        ExecStream {
            exec_id,
            kept_from,
            body: response.into_body(),
            dechunker: chunked.then(Dechunker::default),
            read_buf: vec![0u8; 64 * 1024],
            data: Vec::new(),
            decoder: Decoder::new(Direction::GuestToHost),
            queue: VecDeque::new(),
            finished: false,
        }
    }

    /// The command's `exec_id` (given in the request or by the daemon): what
    /// [`Client::attach`](crate::Client::attach) takes after the connection drops.
    pub fn exec_id(&self) -> Option<&str> {
        self.exec_id.as_deref()
    }

    /// For an attach: the oldest output byte the agent still kept when the stream started.
    pub fn output_kept_from(&self) -> Option<u64> {
        self.kept_from
    }

    /// The next event; `None` after the exit event. A stream that breaks off early is an
    /// error, never a silent end.
    pub async fn next_event(&mut self) -> Option<Result<ExecEvent, ClientError>> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Some(Ok(event));
            }
            if self.finished {
                return None;
            }
            // A chunked body can end before the connection does: never wait past it.
            let body_done = self.dechunker.as_ref().is_some_and(Dechunker::is_done);
            let n = if body_done {
                0
            } else {
                match self.body.read(&mut self.read_buf).await {
                    Ok(n) => n,
                    Err(e) => {
                        self.finished = true;
                        return Some(Err(ClientError::Http(format!(
                            "the exec stream broke off: {e}"
                        ))));
                    }
                }
            };
            if n == 0 {
                self.finished = true;
                if self.dechunker.as_ref().is_some_and(|d| !d.is_done()) {
                    return Some(Err(ClientError::Http(
                        "the exec stream broke off mid-body".into(),
                    )));
                }
                if let Err(e) = self.decoder.finish() {
                    return Some(Err(ClientError::Protocol(format!(
                        "invalid exec stream: {e}"
                    ))));
                }
                continue;
            }
            let bytes = &self.read_buf[..n];
            match &mut self.dechunker {
                Some(dechunker) => {
                    self.data.clear();
                    if let Err(e) = dechunker.decode(bytes, &mut self.data) {
                        self.finished = true;
                        return Some(Err(ClientError::Protocol(format!(
                            "invalid chunked exec response: {e}"
                        ))));
                    }
                    self.decoder.push(&self.data);
                }
                None => self.decoder.push(bytes),
            }
            loop {
                match self.decoder.next_frame() {
                    Ok(Some(f)) => match event_from(f.frame_type, f.payload) {
                        Ok(event) => self.queue.push_back(event),
                        Err(e) => {
                            self.finished = true;
                            return Some(Err(e));
                        }
                    },
                    Ok(None) => break,
                    Err(e) => {
                        self.finished = true;
                        return Some(Err(ClientError::Protocol(format!(
                            "invalid exec stream: {e}"
                        ))));
                    }
                }
            }
            if self.decoder.saw_exit() {
                // Nothing may follow the exit frame; the rest of the body is the terminator.
                self.finished = true;
            }
        }
    }

    /// Collects the whole output.
    pub async fn collect(mut self) -> Result<ExecOutput, ClientError> {
        let mut output = ExecOutput::default();
        while let Some(event) = self.next_event().await {
            match event? {
                ExecEvent::Stdout(b) => output.stdout.extend_from_slice(&b),
                ExecEvent::Stderr(b) => output.stderr.extend_from_slice(&b),
                ExecEvent::Exit(result) => output.result = result,
            }
        }
        Ok(output)
    }
}
