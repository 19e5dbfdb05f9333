//! One process of a container (its init or an exec): its state, and the relay that runs it
//! through an interactive crucible exec session — taken up again when it breaks off (a daemon
//! restarted under live restore), so that containerd sees the task run on and end once.

use std::collections::VecDeque;
use std::time::Duration;

use containerd_shim::api::Status;
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::watch;
use wire::{ExecRequest, ExecResult, TerminalSize};

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
    /// For a process on a terminal: its latest size from `ResizePty`, which the relay sends.
    pub terminal_size: Option<watch::Sender<Option<TerminalSize>>>,
}

impl Process {
    /// A process not started yet.
    pub(crate) fn new(request: ExecRequest, stdio: StdioPaths) -> Self {
        Process {
            stdio,
            status: Status::CREATED,
            exited: watch::Sender::new(None),
            stdin_hold: None,
            terminal_size: request.tty.then(|| watch::Sender::new(None)),
            request,
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
    /// Its terminal's sizes as `ResizePty` sets them (a process on a terminal).
    pub sizes: Option<watch::Receiver<Option<TerminalSize>>>,
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Io")
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .field("stdin", &self.stdin.is_some())
            .field("terminal", &self.sizes.is_some())
            .finish_non_exhaustive()
    }
}

/// How a process's session is taken up again when it breaks off (its command asked to
/// outlive its connection): the daemon restarted, or the connection broke.
#[derive(Debug, Clone)]
pub(crate) struct Reattach {
    /// The daemon.
    pub client: client::Client,
    /// The process's sandbox.
    pub sandbox: String,
    /// Its container in the sandbox (a pod's member); `None`: the sandbox's own root.
    pub container: Option<String>,
    /// Its exec id at the daemon.
    pub exec_id: String,
    /// How long to keep trying (zero: not at all).
    pub patience: Duration,
}

/// Stdin bytes kept after they were sent, for a session taken up again to send once more
/// what the command had not taken when the old one broke off (at most what was in flight:
/// socket buffers between the shim and the command).
const KEPT_STDIN: usize = 4 * 1024 * 1024;

/// The process's stdin as the shim forwards it, across sessions.
struct Input {
    /// The FIFO, until its end.
    reader: Option<Box<dyn AsyncRead + Send + Unpin>>,
    /// The last bytes read from it.
    kept: VecDeque<u8>,
    /// The stdin offset of `kept`'s first byte.
    kept_from: u64,
    /// Bytes read from the FIFO so far.
    read: u64,
    /// Bytes the current session has been given (or the command took, after a re-attach).
    given: u64,
    /// Whether the FIFO ended (or there is none): the command's stdin is to be closed.
    ended: bool,
    /// Whether the current session has been given the close.
    close_given: bool,
}

impl Input {
    fn new(reader: Option<Box<dyn AsyncRead + Send + Unpin>>) -> Self {
        Input {
            ended: reader.is_none(),
            reader,
            kept: VecDeque::new(),
            kept_from: 0,
            read: 0,
            given: 0,
            close_given: false,
        }
    }

    /// A session taken up again: the command had taken `taken` bytes and, if `closed`, its
    /// close.
    fn resume(&mut self, taken: u64, closed: bool) {
        self.given = taken;
        self.close_given = closed;
    }

    /// Gives the session what it has not had (again, after a re-attach), then forwards the
    /// FIFO until its end, then closes the command's stdin; all along, sends each new size of
    /// its terminal (`sizes`). Cancel-safe between sends: what was read is kept before it is
    /// sent. A session that cannot be written to leaves it to the output side to notice.
    async fn feed(
        &mut self,
        writer: &mut client::SessionWriter,
        sizes: &mut Option<watch::Receiver<Option<TerminalSize>>>,
    ) {
        let again = self.not_taken();
        if !again.is_empty() {
            if writer.send_stdin(&again).await.is_err() {
                return std::future::pending().await;
            }
            self.given = self.read;
        }
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if self.reader.is_none() && self.ended && !self.close_given {
                match writer.close_stdin().await {
                    Ok(()) => self.close_given = true,
                    Err(e) => log::debug!("closing stdin: {e}"),
                }
            }
            let resized = async {
                match sizes.as_mut() {
                    Some(sizes) => match sizes.changed().await {
                        Ok(()) => Step::Resized(*sizes.borrow_and_update()),
                        Err(_) => Step::NoMoreSizes,
                    },
                    None => std::future::pending().await,
                }
            };
            let step = match self.reader.as_mut() {
                Some(reader) => tokio::select! {
                    read = reader.read(&mut buf) => Step::Read(read),
                    step = resized => step,
                },
                None => resized.await,
            };
            match step {
                Step::Read(Ok(0) | Err(_)) => {
                    self.reader = None;
                    self.ended = true;
                }
                Step::Read(Ok(n)) => {
                    self.keep(&buf[..n]);
                    if writer.send_stdin(&buf[..n]).await.is_err() {
                        return std::future::pending().await;
                    }
                    self.given = self.read;
                }
                Step::Resized(Some(size)) => {
                    if writer.resize(size).await.is_err() {
                        return std::future::pending().await;
                    }
                }
                Step::Resized(None) => {}
                Step::NoMoreSizes => *sizes = None,
            }
        }
    }

    /// What was read but the current session has not been given: after a re-attach, what the
    /// command had not taken when the old session broke off (as much of it as is kept).
    fn not_taken(&mut self) -> Vec<u8> {
        if self.given >= self.read || self.close_given {
            return Vec::new();
        }
        if self.given < self.kept_from {
            log::warn!(
                "{} stdin bytes sent before the session broke off were no longer kept; the \
                 command does not get them",
                self.kept_from - self.given
            );
            self.given = self.kept_from;
        }
        let start = usize::try_from(self.given - self.kept_from).unwrap_or(usize::MAX);
        self.kept.iter().skip(start).copied().collect()
    }

    fn keep(&mut self, bytes: &[u8]) {
        self.kept.extend(bytes);
        self.read += bytes.len() as u64;
        let excess = self.kept.len().saturating_sub(KEPT_STDIN);
        self.kept.drain(..excess);
        self.kept_from += excess as u64;
    }
}

/// What the input side of a session does next.
enum Step {
    /// Stdin was read.
    Read(std::io::Result<usize>),
    /// The terminal has a new size.
    Resized(Option<TerminalSize>),
    /// The process is gone: no size will come.
    NoMoreSizes,
}

/// How one session ended.
enum SessionEnd {
    /// With the command's exit.
    Exit(ExecResult),
    /// It broke off, for this reason, before the exit.
    Broke(String),
}

/// Relays a process's stdio until it ends and returns how it ended. A session that breaks off
/// is taken up again through `again` (from the output bytes already written and the stdin
/// the command took), for as long as its patience lasts; then it becomes a lost exec
/// (`exit_code: -1` and `error`). Output is written with backpressure: a client that reads
/// slowly slows the command. When this returns, stdout and stderr are closed (the client
/// waits for their end-of-file before it deletes the process).
pub(crate) async fn relay(io: Io, again: Reattach) -> ExecResult {
    let Io {
        session,
        mut stdout,
        mut stderr,
        stdin,
        mut sizes,
    } = io;
    let mut input = Input::new(stdin);
    let mut written = 0u64;
    let mut session = session;
    let result = loop {
        let end = run_session(
            session,
            (&mut stdout, &mut stderr),
            &mut input,
            &mut sizes,
            &mut written,
        )
        .await;
        let why = match end {
            SessionEnd::Exit(result) => break result,
            SessionEnd::Broke(why) => why,
        };
        match take_up(&again, written, &why).await {
            Ok((next, position)) => {
                if position.output_kept_from > written {
                    // The agent's tail no longer holds what we had not written: its replay
                    // starts later, so that is where this process's output goes on from.
                    log::warn!(
                        "exec {} of {}: {} output bytes were no longer kept when its session \
                         was taken up again; the output skips them",
                        again.exec_id,
                        again.sandbox,
                        position.output_kept_from - written
                    );
                    written = position.output_kept_from;
                }
                log::info!(
                    "exec {} of {}: its session broke off ({why}); taken up again at output \
                     byte {written}, stdin byte {}",
                    again.exec_id,
                    again.sandbox,
                    position.stdin_bytes
                );
                input.resume(position.stdin_bytes, position.stdin_closed);
                session = next;
            }
            Err(lost) => break lost,
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

/// One session: its output to the outputs (counting the bytes in `written`), `input` to it,
/// until its exit frame or its end.
async fn run_session(
    session: client::Session,
    (stdout, stderr): (&mut Option<Output>, &mut Option<Output>),
    input: &mut Input,
    sizes: &mut Option<watch::Receiver<Option<TerminalSize>>>,
    written: &mut u64,
) -> SessionEnd {
    let (mut reader, mut writer) = session.into_split();
    let output = async {
        loop {
            match reader.next_event().await {
                Some(Ok(client::ExecEvent::Stdout(bytes))) => {
                    write_or_drop(stdout, &bytes).await;
                    *written += bytes.len() as u64;
                }
                Some(Ok(client::ExecEvent::Stderr(bytes))) => {
                    write_or_drop(stderr, &bytes).await;
                    *written += bytes.len() as u64;
                }
                Some(Ok(client::ExecEvent::Exit(result))) => return SessionEnd::Exit(result),
                Some(Err(e)) => return SessionEnd::Broke(report::chain(&e)),
                None => return SessionEnd::Broke("the session ended without an exit".into()),
            }
        }
    };
    tokio::pin!(output);
    let feed = input.feed(&mut writer, sizes);
    tokio::select! {
        end = &mut output => end,
        () = feed => output.await,
    }
}

/// Re-attaches to the command after its session broke off (`why`), from output byte
/// `written`, retrying while the daemon cannot answer (restarting), until `again.patience`
/// is spent; a lost exec's result when it cannot.
async fn take_up(
    again: &Reattach,
    written: u64,
    why: &str,
) -> Result<(client::Session, client::AttachPosition), ExecResult> {
    let lost =
        |detail: String| ExecResult::failed(format!("the exec session broke off: {why}; {detail}"));
    if again.patience.is_zero() {
        return Err(lost(
            "not taken up again (CRUCIBLE_SHIM_RECONNECT=0)".into(),
        ));
    }
    let deadline = tokio::time::Instant::now() + again.patience;
    let mut pause = Duration::from_millis(100);
    loop {
        // Each attempt within what is left: a daemon that accepts but never answers (one
        // still taking its sandboxes back, or wedged) must not hold the process for ever.
        let attempt = again.client.attach_interactive_in(
            &again.sandbox,
            again.container.as_deref(),
            &again.exec_id,
            written,
        );
        let answer = match tokio::time::timeout_at(deadline, attempt).await {
            Ok(answer) => answer,
            Err(_) => {
                return Err(lost(format!(
                    "the daemon did not answer within {:?} (CRUCIBLE_SHIM_RECONNECT)",
                    again.patience
                )))
            }
        };
        let error = match answer {
            Ok(attached) => return Ok(attached),
            // The sandbox or the command is gone, or the request is wrong: no retry helps.
            Err(
                e @ client::ClientError::Api {
                    status: 400 | 401 | 403 | 404,
                    ..
                },
            ) => return Err(lost(report::chain(&e))),
            // The daemon is down or restarting, or still sees the old connection attached.
            Err(e) => e,
        };
        if tokio::time::Instant::now() + pause > deadline {
            return Err(lost(format!(
                "the daemon did not take it up again within {:?} (CRUCIBLE_SHIM_RECONNECT): \
                 {}",
                again.patience,
                report::chain(&error)
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_a_broken_session_did_not_take_is_given_again() {
        let mut input = Input::new(Some(Box::new(tokio::io::empty())));
        input.keep(b"0123456789");
        input.given = 10;
        assert!(input.not_taken().is_empty(), "all given to this session");
        // The session broke off; the command had taken 4 bytes.
        input.resume(4, false);
        assert_eq!(input.not_taken(), b"456789");
        // A command that took its close takes nothing more.
        input.resume(4, true);
        assert!(input.not_taken().is_empty());
    }

    #[test]
    fn kept_stdin_is_bounded_and_what_fell_out_is_skipped() {
        let mut input = Input::new(None);
        assert!(input.ended, "no stdin: closed at once");
        input.keep(&vec![1u8; KEPT_STDIN]);
        input.keep(&[2u8; 10]);
        assert_eq!(input.kept.len(), KEPT_STDIN);
        assert_eq!(input.kept_from, 10);
        assert_eq!(input.read, KEPT_STDIN as u64 + 10);
        // Taken up again with 5 bytes taken: bytes 5..10 are gone, the rest comes again.
        input.resume(5, false);
        let again = input.not_taken();
        assert_eq!(again.len(), KEPT_STDIN);
        assert_eq!(again.last(), Some(&2));
        assert_eq!(input.given, 10);
    }
}
