//! Interactive sessions over a hijacked connection (`POST …/exec?stdin=1`).

use std::io::Cursor;

use tokio::io::{AsyncReadExt, Chain, ReadHalf, WriteHalf};
use wire::{AsyncFrameReader, AsyncFrameWriter, Direction, ExecRequest, FrameType};

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

    /// The next output event; `None` after the exit event.
    pub async fn next_event(&mut self) -> Option<Result<ExecEvent, ClientError>> {
        self.reader.next_event().await
    }

    /// Splits the session so input and output can be driven concurrently.
    pub fn into_split(self) -> (SessionReader, SessionWriter) {
        (self.reader, self.writer)
    }
}

pub(crate) async fn open(
    endpoint: &Endpoint,
    api_key: Option<&str>,
    id: &str,
    request: &ExecRequest,
) -> Result<Session, ClientError> {
    let body = serde_json::to_vec(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let target = format!("/sandboxes/{}/exec?stdin=1", path_segment(id));
    let response = raw::post(endpoint, api_key, &target, &body).await?;
    let (rest, stream) = (response.rest, response.stream);
    let (read, write) = tokio::io::split(stream);
    let reader: Reader = Cursor::new(rest).chain(read);
    Ok(Session {
        reader: SessionReader {
            frames: AsyncFrameReader::new(reader, Direction::GuestToHost),
        },
        writer: SessionWriter {
            frames: AsyncFrameWriter::new(write),
        },
    })
}
