//! A process's stdio as containerd gives it: paths of FIFOs the client reads and writes (or a
//! `file://` URI for stdout and stderr; empty for none).

use std::path::Path;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

use crate::error::ShimError;

/// Where one output stream goes.
pub(crate) type Output = Box<dyn AsyncWrite + Send + Unpin>;

/// Opens an output destination. A FIFO is opened read-write, as runc's shim keeps a read end:
/// the open never waits for the client, and a client that goes away (containerd restarting)
/// does not turn the command's next write into `EPIPE`. Empty means none.
pub(crate) async fn open_output(uri: &str) -> Result<Option<Output>, ShimError> {
    if uri.is_empty() {
        return Ok(None);
    }
    if let Some(path) = uri.strip_prefix("file://") {
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .await
            .map_err(|e| ShimError::io(format!("opening {path}"), e))?;
        return Ok(Some(Box::new(file)));
    }
    if uri.contains("://") && !uri.starts_with("fifo://") {
        return Err(ShimError::Unsupported(
            "stdio other than FIFOs and file:// is",
        ));
    }
    let path = uri.strip_prefix("fifo://").unwrap_or(uri);
    let sender = pipe::OpenOptions::new()
        .read_write(true)
        .open_sender(Path::new(path))
        .map_err(|e| ShimError::io(format!("opening the FIFO {path}"), e))?;
    Ok(Some(Box::new(sender)))
}

/// The read side of a stdin FIFO, and the write end the shim holds so that the command does
/// not see end-of-file before containerd says so (`CloseIO`): the client may open and close
/// its own end at any time.
pub(crate) struct Stdin {
    /// What the command reads.
    pub reader: Box<dyn AsyncRead + Send + Unpin>,
    /// Dropping it (at `CloseIO`) lets the reader reach end-of-file once the client's end
    /// is closed too.
    pub hold: pipe::Sender,
}

impl std::fmt::Debug for Stdin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stdin").finish_non_exhaustive()
    }
}

/// Opens a stdin FIFO; empty means none.
pub(crate) fn open_stdin(path: &str) -> Result<Option<Stdin>, ShimError> {
    if path.is_empty() {
        return Ok(None);
    }
    let path = path.strip_prefix("fifo://").unwrap_or(path);
    let receiver = pipe::OpenOptions::new()
        .open_receiver(Path::new(path))
        .map_err(|e| ShimError::io(format!("opening the FIFO {path}"), e))?;
    // Our reader is open, so a non-blocking open for writing succeeds at once.
    let hold = pipe::OpenOptions::new()
        .open_sender(Path::new(path))
        .map_err(|e| ShimError::io(format!("holding the FIFO {path} open"), e))?;
    Ok(Some(Stdin {
        reader: Box::new(receiver),
        hold,
    }))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .expect("run mkfifo");
        assert!(status.success());
    }

    #[tokio::test]
    async fn output_to_a_fifo_opens_without_a_reader_and_reaches_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("stdout");
        mkfifo(&fifo);
        let mut out = open_output(fifo.to_str().expect("utf-8"))
            .await
            .expect("opened")
            .expect("a writer");
        let mut reader = pipe::OpenOptions::new()
            .open_receiver(&fifo)
            .expect("reader");
        out.write_all(b"hi\n").await.expect("write");
        drop(out);
        let mut got = [0u8; 3];
        reader.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"hi\n");
        assert!(open_output("").await.expect("none").is_none());
        assert!(open_output("binary:///usr/bin/logger").await.is_err());
    }

    #[tokio::test]
    async fn stdin_reaches_eof_only_after_the_hold_is_dropped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("stdin");
        mkfifo(&fifo);
        let Stdin { mut reader, hold } = open_stdin(fifo.to_str().expect("utf-8"))
            .expect("opened")
            .expect("a reader");
        let mut client = pipe::OpenOptions::new()
            .open_sender(&fifo)
            .expect("client end");
        client.write_all(b"data").await.expect("write");
        drop(client);
        let mut buf = [0u8; 16];
        let n = reader.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], b"data");
        let early =
            tokio::time::timeout(std::time::Duration::from_millis(100), reader.read(&mut buf))
                .await;
        assert!(early.is_err(), "no EOF while the shim holds the FIFO open");
        drop(hold);
        assert_eq!(reader.read(&mut buf).await.expect("read"), 0);
    }
}
