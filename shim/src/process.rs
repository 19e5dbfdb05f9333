//! One process of a container (its init or an exec): its state, and the relay that runs it
//! through an interactive crucible exec session.

use containerd_shim::api::Status;
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::watch;
use wire::{ExecRequest, ExecResult};

use crate::stdio::Output;

/// The stdio paths containerd gave for a process.
#[derive(Debug, Clone, Default)]
pub(crate) struct StdioPaths {
    /// The stdin FIFO, or empty.
    pub stdin: String,
    /// The stdout FIFO (or `file://` URI), or empty.
    pub stdout: String,
    /// The stderr FIFO (or `file://` URI), or empty.
    pub stderr: String,
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exited {
    /// The status containerd reports (exit code, or 128 + signal).
    pub status: u32,
    /// When.
    pub at: Timestamp,
}

/// A process of the container.
#[derive(Debug)]
pub(crate) struct Process {
    /// What it runs.
    pub request: ExecRequest,
    /// Its stdio.
    pub stdio: StdioPaths,
    /// Created, running or stopped.
    pub status: Status,
    /// Set once when it ends; `Wait` subscribes (before `Start` too: ctr waits first).
    exited: watch::Sender<Option<Exited>>,
    /// The shim's write end of the stdin FIFO while `CloseIO` has not come.
    pub stdin_hold: Option<pipe::Sender>,
}

impl Process {
    /// A process not started yet.
    pub(crate) fn new(request: ExecRequest, stdio: StdioPaths) -> Self {
        Process {
            request,
            stdio,
            status: Status::CREATED,
            exited: watch::Sender::new(None),
            stdin_hold: None,
        }
    }

    /// How it ended, once it has.
    pub(crate) fn exited(&self) -> Option<Exited> {
        self.exited.borrow().clone()
    }

    /// A receiver that sees the end.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<Exited>> {
        self.exited.subscribe()
    }

    /// Records the end and wakes every waiter.
    pub(crate) fn set_exited(&mut self, exited: Exited) {
        self.status = Status::STOPPED;
        self.stdin_hold = None;
        self.exited.send_replace(Some(exited));
    }
}

/// What a started process is connected to.
pub(crate) struct Io {
    /// The interactive exec session.
    pub session: client::Session,
    /// Where stdout goes.
    pub stdout: Option<Output>,
    /// Where stderr goes.
    pub stderr: Option<Output>,
    /// What it reads, until end-of-file.
    pub stdin: Option<Box<dyn AsyncRead + Send + Unpin>>,
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Io")
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .field("stdin", &self.stdin.is_some())
            .finish_non_exhaustive()
    }
}

/// Relays a process's stdio until it ends and returns how it ended; a session that breaks off
/// becomes a lost exec (`exit_code: -1` and `error`). Output is written with backpressure: a
/// client that reads slowly slows the command. When this returns, stdout and stderr are
/// closed (the client waits for their end-of-file before it deletes the process).
pub(crate) async fn relay(io: Io) -> ExecResult {
    let Io {
        session,
        mut stdout,
        mut stderr,
        stdin,
    } = io;
    let (mut reader, mut writer) = session.into_split();
    // The futures borrow the outputs: they end with this block, before the outputs close.
    let result = {
        let input = forward_stdin(stdin, &mut writer);
        tokio::pin!(input);
        let mut input_done = false;
        let output = async {
            loop {
                match reader.next_event().await {
                    Some(Ok(client::ExecEvent::Stdout(bytes))) => {
                        write_or_drop(&mut stdout, &bytes).await;
                    }
                    Some(Ok(client::ExecEvent::Stderr(bytes))) => {
                        write_or_drop(&mut stderr, &bytes).await;
                    }
                    Some(Ok(client::ExecEvent::Exit(result))) => break result,
                    Some(Err(e)) => {
                        break ExecResult::failed(format!(
                            "the exec session broke off: {}",
                            report::chain(&e)
                        ))
                    }
                    None => break ExecResult::failed("the exec session ended without an exit"),
                }
            }
        };
        tokio::pin!(output);
        loop {
            tokio::select! {
                result = &mut output => break result,
                () = &mut input, if !input_done => input_done = true,
            }
        }
    };
    if result.exit_code == -1 && result.signal.is_empty() && !result.error.is_empty() {
        // containerd has nowhere else to show why: the command never ran, or was lost.
        let line = format!("crucible: {}\n", result.error);
        write_or_drop(&mut stderr, line.as_bytes()).await;
    }
    for out in [&mut stdout, &mut stderr].into_iter().flatten() {
        let _ = out.flush().await;
        let _ = out.shutdown().await;
    }
    result
}

/// Sends stdin to the session until end-of-file, then closes the command's stdin. Without a
/// stdin the command's is closed at once.
async fn forward_stdin(
    stdin: Option<Box<dyn AsyncRead + Send + Unpin>>,
    writer: &mut client::SessionWriter,
) {
    if let Some(mut stdin) = stdin {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if writer.send_stdin(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
    if let Err(e) = writer.close_stdin().await {
        log::debug!("closing stdin: {e}");
    }
}

/// Writes all of `bytes`; a destination that fails is dropped, so a broken client never
/// stalls the command (its output is then discarded).
async fn write_or_drop(out: &mut Option<Output>, bytes: &[u8]) {
    if let Some(writer) = out {
        if let Err(e) = writer.write_all(bytes).await {
            log::warn!("writing the process's output: {e}; discarding the rest");
            *out = None;
        }
    }
}
