//! Async adapters over tokio's `AsyncRead`/`AsyncWrite` (feature `tokio`).

use std::io::{self, IoSlice};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::decoder::{Decoder, Direction, Frame};
use crate::encoder::{encode_exit_payload, encode_header};
use crate::frame::{FrameType, MAX_PAYLOAD};
use crate::io::ReadError;
use crate::message::{encode_message, message_len, MessageError};
use crate::types::ExecResult;

/// Reads frames from an async byte stream, straight into the decoder's buffer.
#[derive(Debug)]
pub struct AsyncFrameReader<R> {
    inner: R,
    decoder: Decoder,
    eof: bool,
}

impl<R: AsyncRead + Unpin> AsyncFrameReader<R> {
    /// Frames flowing in `direction` from `inner`.
    pub fn new(inner: R, direction: Direction) -> Self {
        AsyncFrameReader {
            inner,
            decoder: Decoder::with_capacity(direction, crate::io::READ_BUFFER_SIZE),
            eof: false,
        }
    }

    /// The next frame; `Ok(None)` at a clean end of stream. Cancel-safe: a cancelled call loses
    /// no bytes (they stay in the decoder's buffer).
    pub async fn read_frame(&mut self) -> Result<Option<Frame<'_>>, ReadError> {
        loop {
            if self.decoder.has_frame()? {
                return Ok(self.decoder.next_frame()?);
            }
            if self.eof {
                self.decoder.finish()?;
                return Ok(None);
            }
            let n = self.inner.read(self.decoder.unfilled_mut()).await?;
            if n == 0 {
                self.eof = true;
            }
            self.decoder.mark_filled(n);
        }
    }

    /// Whether the exit frame has been read.
    pub fn saw_exit(&self) -> bool {
        self.decoder.saw_exit()
    }

    /// The wrapped stream.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Unwraps the stream; bytes already buffered are lost.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// Writes frames to an async byte stream.
#[derive(Debug)]
pub struct AsyncFrameWriter<W> {
    inner: W,
}

impl<W: AsyncWrite + Unpin> AsyncFrameWriter<W> {
    /// Frames into `inner`.
    pub fn new(inner: W) -> Self {
        AsyncFrameWriter { inner }
    }

    /// Writes `data` as consecutive frames of at most [`MAX_PAYLOAD`] bytes; empty `data`
    /// writes one empty frame.
    pub async fn write_data(&mut self, frame_type: FrameType, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return self.inner.write_all(&encode_header(frame_type, 0)).await;
        }
        for chunk in data.chunks(MAX_PAYLOAD) {
            let header = encode_header(frame_type, chunk.len());
            let mut slices = [IoSlice::new(&header), IoSlice::new(chunk)];
            let mut bufs: &mut [IoSlice<'_>] = &mut slices;
            while !bufs.is_empty() {
                let n = self.inner.write_vectored(bufs).await?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                IoSlice::advance_slices(&mut bufs, n);
            }
        }
        Ok(())
    }

    /// Writes the exit frame for `result` and flushes.
    pub async fn write_exit(&mut self, result: &ExecResult) -> io::Result<()> {
        let payload = encode_exit_payload(result);
        self.write_data(FrameType::Exit, &payload).await?;
        self.inner.flush().await
    }

    /// Flushes the underlying stream.
    pub async fn flush(&mut self) -> io::Result<()> {
        self.inner.flush().await
    }

    /// The wrapped stream.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// Unwraps the stream.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

/// Writes one length-prefixed JSON message and flushes.
pub async fn write_message_async<W, T>(w: &mut W, value: &T) -> Result<(), MessageError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    w.write_all(&encode_message(value)?).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one length-prefixed JSON message. EOF before its first byte is
/// [`MessageError::Closed`].
pub async fn read_message_async<R, T>(r: &mut R) -> Result<T, MessageError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut prefix = [0u8; 4];
    let first = r.read(&mut prefix).await?;
    if first == 0 {
        return Err(MessageError::Closed);
    }
    r.read_exact(&mut prefix[first..]).await?;
    let len = message_len(prefix)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(serde_json::from_slice(&body)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::AgentRequest;

    #[tokio::test]
    async fn async_writer_output_reads_back() {
        let (a, b) = tokio::io::duplex(1000);
        let writer = tokio::spawn(async move {
            let mut w = AsyncFrameWriter::new(a);
            w.write_data(FrameType::Stdout, &vec![9u8; 200_000]).await?;
            w.write_exit(&ExecResult::default()).await
        });
        let mut r = AsyncFrameReader::new(b, Direction::GuestToHost);
        let mut total = 0;
        while let Some(f) = r.read_frame().await.expect("valid") {
            if f.frame_type == FrameType::Stdout {
                total += f.payload.len();
            }
        }
        assert_eq!(total, 200_000);
        writer.await.expect("joins").expect("writes");
    }

    #[tokio::test]
    async fn async_messages_round_trip() {
        let (mut a, mut b) = tokio::io::duplex(64);
        write_message_async(&mut a, &AgentRequest::Ping)
            .await
            .expect("write");
        let back: AgentRequest = read_message_async(&mut b).await.expect("read");
        assert_eq!(back, AgentRequest::Ping);
        drop(a);
        let closed: Result<AgentRequest, _> = read_message_async(&mut b).await;
        assert!(matches!(closed, Err(MessageError::Closed)));
    }
}
