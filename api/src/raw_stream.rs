//! A raw byte stream as an interactive exec's client: the hijacked connection, or Docker's
//! `Upgrade: tcp` one. The stdin frame stream is passed through as it comes.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use engine::exec::{ClientInput, ClientReader, ClientWriter, Ending};

/// Read in chunks of up to this much.
const CHUNK: usize = 64 * 1024;

/// The reading side.
#[derive(Debug)]
pub(crate) struct RawReader<R> {
    reader: R,
    buf: BytesMut,
}

impl<R> RawReader<R> {
    /// Reads from `reader`.
    pub(crate) fn new(reader: R) -> Self {
        RawReader {
            reader,
            buf: BytesMut::new(),
        }
    }
}

impl<R: AsyncRead + Unpin + Send> ClientReader for RawReader<R> {
    async fn recv(&mut self) -> ClientInput {
        // Reuses the buffer once the previous chunk was written and dropped.
        self.buf.reserve(CHUNK);
        match self.reader.read_buf(&mut self.buf).await {
            Ok(0) | Err(_) => ClientInput::Closed,
            Ok(_) => ClientInput::Data(self.buf.split().freeze()),
        }
    }

    /// After the exit frame and our half-close: what the client still sends (stdin written
    /// as the command ended) is read and dropped until it closes its side, for a moment.
    /// Closing with it unread would reset the connection, and a reset can destroy the exit
    /// frame the client has not read yet.
    async fn linger(&mut self) {
        let drain = async {
            let mut sink = vec![0u8; CHUNK];
            while matches!(self.reader.read(&mut sink).await, Ok(n) if n > 0) {}
        };
        let _ = tokio::time::timeout(LINGER, drain).await;
    }
}

/// How long a hijacked connection is drained after its session ended.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// The writing side.
#[derive(Debug)]
pub(crate) struct RawWriter<W>(pub W);

impl<W: AsyncWrite + Unpin + Send> ClientWriter for RawWriter<W> {
    async fn send(&mut self, frames: Bytes) -> std::io::Result<()> {
        self.0.write_all(&frames).await
    }

    async fn finish(&mut self, ending: &Ending) {
        if matches!(ending, Ending::Exited | Ending::Lost(_)) {
            let _ = self.0.flush().await;
            let _ = self.0.shutdown().await;
        }
    }
}

/// Whether the client asked for Docker's `Connection: Upgrade` + `Upgrade: tcp` hijack.
pub(crate) fn asks_tcp_upgrade(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("tcp"))
}
