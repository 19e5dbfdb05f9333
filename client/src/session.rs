//! Interactive sessions over a hijacked connection (`POST …/exec?stdin=1`).

use std::io::Cursor;

use tokio::io::{AsyncReadExt, Chain, ReadHalf, WriteHalf};
use wire::{AsyncFrameReader, AsyncFrameWriter, Direction, ExecRequest, FrameType, TerminalSize};

use crate::connection::{Endpoint, Stream};
use crate::error::ClientError;
use crate::exec::{event_from, ExecEvent};
use crate::path_segment;
use crate::raw;

type Reader = Chain<Cursor<Vec<u8>>, ReadHalf<Stream>>;

/// The output half of a session.
#[derive(Debug)]
pub struct SessionReader {
    frames: AsyncFrameReader<Reader>,
}

/// The input half of a session.
#[derive(Debug)]
pub struct SessionWriter {
    frames: AsyncFrameWriter<WriteHalf<Stream>>,
}

/// A running interactive command: send it input, read its output.
#[derive(Debug)]
pub struct Session {
    reader: SessionReader,
    writer: SessionWriter,
    exec_id: Option<String>,
}

/// Where a re-attached interactive session starts (`POST …/execs/{exec_id}/attach?stdin=1`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttachPosition {
    /// The command's output bytes so far (stdout and stderr payload, in stream order).
    pub output_bytes: u64,
    /// The oldest output byte still kept.
    pub output_kept_from: u64,
    /// The stdin payload bytes the command has taken: input sent past them was lost with the
    /// old connection and must be sent again.
    pub stdin_bytes: u64,
    /// Whether its stdin was closed already (nothing more is taken).
    pub stdin_closed: bool,
}

impl SessionReader {
    /// The next output event; `None` after the exit event.
    pub async fn next_event(&mut self) -> Option<Result<ExecEvent, ClientError>> {
        match self.frames.read_frame().await {
            Ok(Some(frame)) => Some(event_from(frame.frame_type, frame.payload)),
            Ok(None) => None,
            Err(e) => Some(Err(e.into())),
        }
    }
}

impl SessionWriter {
    /// Sends bytes to the command's stdin.
    pub async fn send_stdin(&mut self, data: &[u8]) -> Result<(), ClientError> {
        if data.is_empty() {
            return Ok(());
        }
        self.frames
            .write_data(FrameType::Stdin, data)
            .await
            .map_err(io)?;
        self.frames.flush().await.map_err(io)
    }

    /// Closes the command's stdin (it reads EOF).
    pub async fn close_stdin(&mut self) -> Result<(), ClientError> {
        self.frames
            .write_data(FrameType::StdinClose, &[])
            .await
            .map_err(io)?;
        self.frames.flush().await.map_err(io)
    }

    /// Resizes the command's terminal (a session started with `tty`; any other ignores it).
    pub async fn resize(&mut self, size: TerminalSize) -> Result<(), ClientError> {
        let payload = serde_json::to_vec(&size)
            .map_err(|e| ClientError::Http(format!("encoding a terminal size: {e}")))?;
        self.frames
            .write_data(FrameType::Resize, &payload)
            .await
            .map_err(io)?;
        self.frames.flush().await.map_err(io)
    }
}

fn io(e: std::io::Error) -> ClientError {
    ClientError::Http(format!("writing to the session: {e}"))
}

impl Session {
    /// Sends bytes to the command's stdin.
    pub async fn send_stdin(&mut self, data: &[u8]) -> Result<(), ClientError> {
        self.writer.send_stdin(data).await
    }

    /// Closes the command's stdin.
    pub async fn close_stdin(&mut self) -> Result<(), ClientError> {
        self.writer.close_stdin().await
    }

    /// Resizes the command's terminal (a session started with `tty`; any other ignores it).
    pub async fn resize(&mut self, size: TerminalSize) -> Result<(), ClientError> {
        self.writer.resize(size).await
    }

    /// The next output event; `None` after the exit event.
    pub async fn next_event(&mut self) -> Option<Result<ExecEvent, ClientError>> {
        self.reader.next_event().await
    }

    /// Splits the session so input and output can be driven concurrently.
    pub fn into_split(self) -> (SessionReader, SessionWriter) {
        (self.reader, self.writer)
    }

    /// The command's `exec_id` (`X-Crucible-Exec-Id`): the request's, or the one the daemon
    /// gave it.
    pub fn exec_id(&self) -> Option<&str> {
        self.exec_id.as_deref()
    }
}

/// The session over a hijacked response.
fn hijacked(response: raw::Response) -> Session {
    let exec_id = response.header("x-crucible-exec-id").map(str::to_string);
    let (rest, stream) = (response.rest, response.stream);
    let (read, write) = tokio::io::split(stream);
    let reader: Reader = Cursor::new(rest).chain(read);
    Session {
        reader: SessionReader {
            frames: AsyncFrameReader::new(reader, Direction::GuestToHost),
        },
        writer: SessionWriter {
            frames: AsyncFrameWriter::new(write),
        },
        exec_id,
    }
}

/// Re-attaches to interactive command `exec_id` from output byte `offset`, its stdin carried
/// on (the command must have asked for `on_disconnect: keep`).
pub(crate) async fn attach(
    endpoint: &Endpoint,
    api_key: Option<&str>,
    id: &str,
    container: Option<&str>,
    exec_id: &str,
    offset: u64,
) -> Result<(Session, AttachPosition), ClientError> {
    let target = format!(
        "/sandboxes/{}/execs/{}/attach?offset={offset}&stdin=1{}",
        path_segment(id),
        path_segment(exec_id),
        crate::in_container(container)
    );
    let response = raw::post(endpoint, api_key, &target, b"").await?;
    let number = |name: &str| {
        response
            .header(name)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| ClientError::Protocol(format!("the attach answer has no {name}")))
    };
    let position = AttachPosition {
        output_bytes: number("x-crucible-output-bytes")?,
        output_kept_from: number("x-crucible-output-kept-from")?,
        stdin_bytes: number("x-crucible-stdin-bytes")?,
        stdin_closed: response.header("x-crucible-stdin-closed") == Some("true"),
    };
    Ok((hijacked(response), position))
}

pub(crate) async fn open(
    endpoint: &Endpoint,
    api_key: Option<&str>,
    id: &str,
    container: Option<&str>,
    request: &ExecRequest,
) -> Result<Session, ClientError> {
    let body = serde_json::to_vec(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let target = format!(
        "/sandboxes/{}/exec?stdin=1{}",
        path_segment(id),
        crate::in_container(container)
    );
    let response = raw::post(endpoint, api_key, &target, &body).await?;
    Ok(hijacked(response))
}
