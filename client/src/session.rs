//! Interactive sessions over a hijacked connection (`POST …/exec?stdin=1`).

use std::io::Cursor;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Chain, ReadHalf, WriteHalf};
use wire::{AsyncFrameReader, AsyncFrameWriter, Direction, ExecRequest, FrameType};

use crate::connection::{Endpoint, Stream};
use crate::error::ClientError;
use crate::exec::{event_from, ExecEvent};
use crate::{api_error_from, path_segment};

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

const MAX_HEAD: usize = 64 * 1024;

pub(crate) async fn open(
    endpoint: &Endpoint,
    api_key: Option<&str>,
    id: &str,
    request: &ExecRequest,
) -> Result<Session, ClientError> {
    let body = serde_json::to_vec(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let mut head = format!(
        "POST /sandboxes/{}/exec?stdin=1 HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        path_segment(id),
        endpoint.host_header(),
        body.len()
    );
    if let Some(key) = api_key {
        head.push_str(&format!("Authorization: Bearer {key}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = endpoint.connect().await?;
    let send = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&body).await?;
        stream.flush().await
    };
    send.await
        .map_err(|e| ClientError::Http(format!("sending the exec request: {e}")))?;

    let mut buf = Vec::with_capacity(1024);
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(ClientError::Protocol(
                "the daemon's response head is too large".into(),
            ));
        }
        let mut chunk = [0u8; 4096];
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| ClientError::Http(format!("reading the response: {e}")))?;
        if n == 0 {
            return Err(ClientError::Http(
                "the daemon closed the connection before answering".into(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let mut headers = [httparse_header(); 32];
    let (status, content_length) = parse_response_head(&buf[..head_end], &mut headers)?;
    let mut rest = buf.split_off(head_end);
    if status != 200 {
        let want = content_length.unwrap_or(0).min(1024 * 1024);
        while rest.len() < want {
            let mut chunk = vec![0u8; want - rest.len()];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => rest.extend_from_slice(&chunk[..n]),
            }
        }
        let status = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
        return Err(api_error_from(status, &rest));
    }
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

fn httparse_header() -> httparse::Header<'static> {
    httparse::EMPTY_HEADER
}

fn parse_response_head<'h>(
    head: &'h [u8],
    headers: &mut [httparse::Header<'h>],
) -> Result<(u16, Option<usize>), ClientError> {
    let mut response = httparse::Response::new(headers);
    match response.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => {
            return Err(ClientError::Protocol(
                "malformed HTTP response from the daemon".into(),
            ))
        }
    }
    let status = response.code.unwrap_or(0);
    let length = response
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .and_then(|v| v.trim().parse().ok());
    Ok((status, length))
}
