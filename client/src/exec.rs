//! A one-shot exec's output as a stream of events.

use std::collections::VecDeque;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use wire::{Decoder, Direction, ExecResult, FrameType};

use crate::error::ClientError;

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
    body: Incoming,
    decoder: Decoder,
    queue: VecDeque<ExecEvent>,
    finished: bool,
}

impl ExecStream {
    pub(crate) fn new(body: Incoming) -> Self {
        ExecStream {
            body,
            decoder: Decoder::new(Direction::GuestToHost),
            queue: VecDeque::new(),
            finished: false,
        }
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
            match self.body.frame().await {
                None => {
                    self.finished = true;
                    if let Err(e) = self.decoder.finish() {
                        return Some(Err(ClientError::Protocol(format!(
                            "invalid exec stream: {e}"
                        ))));
                    }
                }
                Some(Err(e)) => {
                    self.finished = true;
                    return Some(Err(ClientError::Http(format!(
                        "the exec stream broke off: {e}"
                    ))));
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    self.decoder.push(&data);
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
                }
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
