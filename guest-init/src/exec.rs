//! The exec engine: one command on one connection.
//!
//! One thread per exec runs a poll(2) loop over the connection, the command's stdout and stderr
//! pipes, its stdin pipe (interactive only) and the command's pidfd, which turns readable at its
//! exit (the exec then reaps it). Output is read only when everything read before has been
//! written to the connection, so a host that stops reading stops the agent reading the pipes,
//! and then the command blocks on a full pipe: memory stays bounded (four 64 KiB frames per
//! stream) whatever the command writes. Stdin frames are read from the host only when
//! the previous one has reached the command, for the same reason.
//!
//! The stream ends with exactly one exit frame: after the command has exited, the agent forwards
//! what its pipes already hold (a snapshot of their fill level, so a background grandchild that
//! keeps writing cannot hold the exit back), then writes the exit frame and closes.
//!
//! A command started with `tty` has a pseudo-terminal ([`crate::pty`]) instead of the three
//! pipes: its master side is the one output stream (stdout frames) and, for an interactive
//! session, where stdin frames go; `resize` frames size it. A terminal has no fill level to
//! snapshot (the kernel hands the command's last writes to the master asynchronously), so after
//! the exit it is read until its other side is closed by every process holding it, or for
//! [`TERMINAL_DRAIN`] at most when a background process keeps it open.
//!
//! A named command that outlives its connection (`on_disconnect: keep`, [`crate::exec_registry`])
//! also copies its output into its tail. When the connection drops, the loop goes on without
//! one: the pipes are still read (into the tail only), the deadline still holds, and an
//! eventfd wakes it when an `attach` hands it a new connection, to which it first replays
//! the tail from the offset the client asked for, then goes live again.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wire::agent::{RunAs, MAX_GROUPS};
use wire::{
    Decoder, Direction, ExecRequest, ExecResult, FrameType, TerminalSize, Usage, HEADER_SIZE,
    MAX_PAYLOAD,
};

use crate::exec_registry::{self, Tracked};
use crate::pty::Terminal;
use crate::reaper::{Child, ExitInfo};
use crate::spawn::{self, ChildStdio, SpawnContext};
use crate::sys;

/// Why an exec stream could not be carried to its end (the command is killed in every case).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The host closed the connection or the connection failed.
    #[error("the host went away")]
    HostGone(#[source] Option<io::Error>),
    /// The host sent something that is not a valid stdin frame stream.
    #[error("invalid stdin frame stream: {0}")]
    Protocol(String),
    /// A local resource (pipe, eventfd, poll) failed.
    #[error("exec plumbing failed")]
    Io(#[from] io::Error),
}

/// Process-wide exec settings (see [`SpawnContext`]), plus what the OOM verdict needs.
#[derive(Debug)]
pub struct ExecContext {
    /// `/dev/null`.
    pub devnull: OwnedFd,
    /// `cgroup.procs` of the commands cgroup.
    pub cgroup_procs: Option<OwnedFd>,
    /// `memory.events` of the commands cgroup, kept open: each exec reads it twice, one
    /// `pread` each.
    pub cgroup_memory_events: Option<File>,
    /// Whether children must reset `oom_score_adj`.
    pub reset_oom_score: bool,
    /// The machine's memory, for the OOM heuristic.
    pub mem_total_bytes: u64,
}

impl ExecContext {
    /// A context with no cgroup.
    pub fn new() -> io::Result<ExecContext> {
        let devnull = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")?;
        Ok(ExecContext {
            devnull: devnull.into(),
            cgroup_procs: None,
            cgroup_memory_events: None,
            reset_oom_score: false,
            mem_total_bytes: mem_total_bytes().unwrap_or(0),
        })
    }

    fn spawn_context(&self) -> SpawnContext<'_> {
        SpawnContext {
            devnull: self.devnull.as_fd(),
            cgroup_procs: self.cgroup_procs.as_ref().map(|f| f.as_fd()),
            reset_oom_score: self.reset_oom_score,
            namespaces: crate::main_ns::get(),
        }
    }

    fn oom_kills(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 512];
        let len = self
            .cgroup_memory_events
            .as_ref()?
            .read_at(&mut buf, 0)
            .ok()?;
        let text = std::str::from_utf8(&buf[..len]).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
    }
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
pub fn mem_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// How long a terminal's output is still read after its command exited while another process
/// keeps the terminal open (a background job): what the command itself wrote arrives well
/// within it.
const TERMINAL_DRAIN: Duration = Duration::from_millis(250);

/// The descriptors between the agent and one command: the agent's ends and the child's.
#[derive(Debug)]
struct Plumbing {
    /// Read by the agent: the command's stdout, or its terminal.
    stdout: OwnedFd,
    /// Read by the agent: the command's stderr; `None` on a terminal (it is the terminal).
    stderr: Option<OwnedFd>,
    /// Written by the agent: the command's stdin, for an interactive session.
    stdin: Option<OwnedFd>,
    /// The terminal, when the request asked for one.
    terminal: Option<Terminal>,
    /// The child's stdin; `None`: `/dev/null`.
    child_stdin: Option<OwnedFd>,
    child_stdout: OwnedFd,
    /// The child's stderr; `None`: the same as its stdout.
    child_stderr: Option<OwnedFd>,
}

impl Plumbing {
    fn new(req: &ExecRequest, interactive: bool) -> io::Result<Plumbing> {
        if req.tty {
            let (terminal, peer) = Terminal::open(req.tty_size.unwrap_or_default())?;
            return Ok(Plumbing {
                stdout: terminal.master()?,
                stderr: None,
                stdin: if interactive {
                    Some(terminal.master()?)
                } else {
                    None
                },
                terminal: Some(terminal),
                child_stdin: Some(peer.try_clone()?),
                child_stdout: peer,
                child_stderr: None,
            });
        }
        let (out_r, out_w) = sys::pipe()?;
        let (err_r, err_w) = sys::pipe()?;
        let (stdin, child_stdin) = if interactive {
            let (r, w) = sys::pipe()?;
            (Some(w), Some(r))
        } else {
            (None, None)
        };
        Ok(Plumbing {
            stdout: out_r,
            stderr: Some(err_r),
            stdin,
            terminal: None,
            child_stdin,
            child_stdout: out_w,
            child_stderr: Some(err_w),
        })
    }

    fn child_stdio<'a>(&'a self, devnull: &'a OwnedFd) -> ChildStdio<'a> {
        ChildStdio {
            stdin: self.child_stdin.as_ref().unwrap_or(devnull).as_fd(),
            stdout: self.child_stdout.as_fd(),
            stderr: self
                .child_stderr
                .as_ref()
                .unwrap_or(&self.child_stdout)
                .as_fd(),
            controlling_terminal: self.terminal.is_some(),
        }
    }
}

/// Runs `req` on `conn`: validates, spawns, streams, writes the exit frame. Errors have
/// already been dealt with (command killed, stream abandoned) and are returned for logging.
pub fn run(
    conn: UnixStream,
    req: &ExecRequest,
    interactive: bool,
    user: Option<&RunAs>,
    tail_bytes: Option<u64>,
    ctx: &ExecContext,
) -> Result<(), ExecError> {
    let mut conn = conn;
    if let Err(e) = req.validate() {
        return write_exit(
            &mut conn,
            &ExecResult::failed(format!("invalid request: {e}")),
        );
    }
    if let Some(user) = user.filter(|u| u.groups.len() > MAX_GROUPS) {
        return write_exit(
            &mut conn,
            &ExecResult::failed(format!(
                "invalid request: user: {} supplementary groups, at most {MAX_GROUPS}",
                user.groups.len()
            )),
        );
    }
    let oom_before = ctx.oom_kills();
    // Programs on a terminal want to know its type (a full-screen one refuses to start
    // without it): `xterm`, as `docker exec -t` sets it, unless the request names one.
    let with_term;
    let req = if req.tty && !req.env.contains_key("TERM") {
        let mut env = req.env.clone();
        env.insert("TERM".into(), "xterm".into());
        with_term = ExecRequest { env, ..req.clone() };
        &with_term
    } else {
        req
    };

    let plumbing = match Plumbing::new(req, interactive) {
        Ok(plumbing) => plumbing,
        Err(e) if req.tty => {
            return write_exit(
                &mut conn,
                &ExecResult::failed(format!("cannot open a terminal: {e}")),
            )
        }
        Err(e) => return Err(e.into()),
    };
    let stdio = plumbing.child_stdio(&ctx.devnull);
    let started = Instant::now();
    let spawned = crate::exec_ids::spawn_named(&req.exec_id, || {
        match crate::container_init::get() {
            // A container whose first command is PID 1: its init or spawner makes it.
            Some(container) => container.spawn(req, user, stdio, &ctx.spawn_context()),
            None => spawn::spawn(req, user, stdio, &ctx.spawn_context()),
        }
    });
    let child = match spawned
        .map_err(|e| report::chain(&e))
        .and_then(|spawned| spawned.map_err(|e| report::chain(&e)))
    {
        Ok(child) => child,
        Err(why) => return write_exit(&mut conn, &ExecResult::failed(why)),
    };
    let Plumbing {
        stdout,
        stderr,
        stdin,
        terminal,
        child_stdin,
        child_stdout,
        child_stderr,
    } = plumbing;
    // Only the command holds its ends now: its exit (and its children's) closes them.
    drop((child_stdin, child_stdout, child_stderr));
    // Only a named command can be found again. A one-shot one outlives its connection unless
    // it asks not to; an interactive one only when it asks to (by default closing its
    // connection ends it, as the protocol says).
    let tracked = (!req.exec_id.is_empty()).then(|| {
        let keep = match req.on_disconnect {
            Some(wire::OnDisconnect::Kill) => false,
            Some(wire::OnDisconnect::Keep) => true,
            None => !interactive,
        };
        let tail = tail_bytes
            .unwrap_or(wire::agent::DEFAULT_TAIL_BYTES)
            .min(wire::agent::MAX_TAIL_BYTES);
        exec_registry::register(
            &req.exec_id,
            &req.cmd,
            child.pid(),
            keep,
            interactive,
            usize::try_from(tail).unwrap_or(usize::MAX),
        )
    });

    let mut session = Session {
        conn: Some(conn),
        tracked,
        wake: None,
        cursor: 0,
        live: true,
        skipped: 0,
        child,
        streams: [
            Stream::new(FrameType::Stdout, Some(stdout), terminal.is_some()),
            Stream::new(FrameType::Stderr, stderr, false),
        ],
        stdin: match stdin {
            Some(w) => Some(StdinPump::new(w, terminal)?),
            None => None,
        },
        terminal_drain_until: None,
        pending: OutBuf::take(),
        deadline: (req.timeout_s > 0)
            .then(|| started + Duration::from_secs(req.timeout_s.unsigned_abs())),
        timed_out: false,
        exit: None,
    };
    let outcome = session.pump();
    let exit = match outcome {
        Ok(exit) => exit,
        Err(e) => {
            // The host is gone or spoke nonsense: kill the whole group and reap the command.
            session.child.signal_group(libc::SIGKILL);
            let info = session.child.wait();
            if let Some(tracked) = &session.tracked {
                tracked.finish(
                    &ExecResult::failed("killed: its connection ended"),
                    true,
                    None,
                );
            }
            let info = info?;
            if let ExecError::Protocol(msg) = &e {
                let mut result = ExecResult::default();
                fill_result(&mut result, &info, started, false, None, ctx);
                result.error = format!("killed: invalid stdin frame stream: {msg}");
                let _ = session.finish_with(&result);
            }
            return Err(e);
        }
    };
    let mut result = ExecResult::default();
    fill_result(
        &mut result,
        &exit,
        started,
        session.timed_out,
        oom_before,
        ctx,
    );
    session.finish_with(&result)
}

/// Turns the reaped exit into the exit frame's fields.
fn fill_result(
    result: &mut ExecResult,
    info: &ExitInfo,
    started: Instant,
    timed_out: bool,
    oom_before: Option<u64>,
    ctx: &ExecContext,
) {
    result.duration_ms =
        u64::try_from(info.at.saturating_duration_since(started).as_millis()).unwrap_or(u64::MAX);
    let status = info.status;
    let mut killed_by = None;
    if libc::WIFEXITED(status) {
        result.exit_code = libc::WEXITSTATUS(status);
    } else if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        result.exit_code = -1;
        result.signal = sys::signal_name(sig);
        killed_by = Some(sig);
    } else {
        result.exit_code = -1;
    }
    result.timed_out = timed_out;
    let peak = info.usage.maxrss_kib.saturating_mul(1024);
    result.usage = Some(Usage {
        cpu_user_ms: info.usage.user_ms,
        cpu_sys_ms: info.usage.sys_ms,
        peak_memory_bytes: peak,
        page_faults_major: info.usage.majflt,
        context_switches_involuntary: info.usage.nivcsw,
        io_read_bytes: info.usage.read_bytes,
        io_write_bytes: info.usage.write_bytes,
    });
    let sigkill = killed_by == Some(libc::SIGKILL) && !timed_out;
    result.oom_killed = sigkill
        && match (oom_before, ctx.oom_kills()) {
            (Some(before), Some(after)) => after > before,
            _ => ctx.mem_total_bytes > 0 && peak >= ctx.mem_total_bytes / 100 * 95,
        };
}

/// Records the frames in `frames` (whole frames of one stream, as a read produced them) into
/// `tracked`'s tail; returns their payload bytes.
fn record_frames(tracked: &Tracked, mut frames: &[u8]) -> u64 {
    let mut total = 0u64;
    while frames.len() >= HEADER_SIZE {
        let Ok(kind) = FrameType::try_from(frames[0]) else {
            break;
        };
        let len = u32::from_be_bytes([frames[4], frames[5], frames[6], frames[7]]) as usize;
        let Some(payload) = frames.get(HEADER_SIZE..HEADER_SIZE + len) else {
            break;
        };
        tracked.record(kind, payload);
        total += len as u64;
        frames = &frames[HEADER_SIZE + len..];
    }
    total
}

/// Writes the exit frame on a blocking connection.
fn write_exit(conn: &mut UnixStream, result: &ExecResult) -> Result<(), ExecError> {
    let mut frame = Vec::new();
    wire::encode_frames(
        FrameType::Exit,
        &wire::encode_exit_payload(result),
        &mut frame,
    );
    conn.write_all(&frame)
        .map_err(|e| ExecError::HostGone(Some(e)))?;
    Ok(())
}

/// Frames one read of an output pipe may fill: a command that writes fast is forwarded in
/// rounds of up to 256 KiB (one `readv`, one `send`), not one 64 KiB frame per poll round.
const FRAMES_PER_READ: usize = 4;

/// One frame's room in the output buffer: header, then payload.
const FRAME_SLOT: usize = HEADER_SIZE + MAX_PAYLOAD;

/// Room for one read's frames from each output stream.
const OUT_BUF: usize = 2 * FRAMES_PER_READ * FRAME_SLOT;

/// The pipe size (`F_SETPIPE_SZ`) given to a stream once it has filled a read: the command can
/// run ahead of the host by this much instead of by the default 64 KiB. Best effort (the
/// system's `pipe-max-size` may refuse it); short commands never pay for the `fcntl`.
const BUSY_PIPE_SIZE: libc::c_int = 1024 * 1024;

thread_local! {
    /// Connection threads are reused: so is their output buffer (no allocation, no zeroing,
    /// no mmap per exec).
    static SPARE_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Encoded frames waiting for the host: `buf[written..len]`.
#[derive(Debug)]
struct OutBuf {
    buf: Vec<u8>,
    len: usize,
    written: usize,
}

impl OutBuf {
    fn take() -> OutBuf {
        let mut buf = SPARE_BUF.with(|b| b.take());
        buf.resize(OUT_BUF, 0);
        OutBuf {
            buf,
            len: 0,
            written: 0,
        }
    }

    fn unsent(&self) -> &[u8] {
        &self.buf[self.written..self.len]
    }

    fn is_empty(&self) -> bool {
        self.written >= self.len
    }

    fn clear(&mut self) {
        self.len = 0;
        self.written = 0;
    }
}

impl Drop for OutBuf {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        SPARE_BUF.with(|b| b.set(buf));
    }
}

/// One output pipe of the command.
#[derive(Debug)]
struct Stream {
    kind: FrameType,
    pipe: Option<File>,
    /// After the exit: how many more bytes to forward before closing.
    drain: Option<usize>,
    /// Whether the pipe has been enlarged (see [`BUSY_PIPE_SIZE`]).
    enlarged: bool,
    /// Whether it is a terminal's master side (read to its end after the exit, not drained
    /// by its fill level).
    terminal: bool,
}

impl Stream {
    /// The pipe stays blocking: it is read only after poll reported it readable (or, after
    /// the exit, for no more than the bytes it holds), so a read never waits.
    fn new(kind: FrameType, fd: Option<OwnedFd>, terminal: bool) -> Stream {
        Stream {
            kind,
            pipe: fd.map(File::from),
            drain: None,
            enlarged: false,
            terminal,
        }
    }

    /// Reads once (up to [`FRAMES_PER_READ`] frames' worth, with one `readv` straight into the
    /// frames' payload slots) and appends the frames to `out`, which has room for them.
    fn read_into(&mut self, out: &mut OutBuf) -> io::Result<()> {
        let Some(pipe) = self.pipe.as_mut() else {
            return Ok(());
        };
        let want = self
            .drain
            .unwrap_or(usize::MAX)
            .min(FRAMES_PER_READ * MAX_PAYLOAD);
        if want == 0 {
            self.pipe = None;
            return Ok(());
        }
        let start = out.len;
        let Some(room) = out.buf.get_mut(start..start + FRAMES_PER_READ * FRAME_SLOT) else {
            return Ok(()); // Cannot happen: callers read only when the buffer has room.
        };
        // Payload slots, each after room for its header, covering `want` bytes.
        let mut left = want;
        let mut chunks = room.chunks_mut(FRAME_SLOT);
        let mut slots: [io::IoSliceMut<'_>; FRAMES_PER_READ] = std::array::from_fn(|_| {
            let len = left.min(MAX_PAYLOAD);
            left -= len;
            let slot: &mut [u8] = chunks.next().unwrap_or_default();
            match slot.get_mut(HEADER_SIZE..HEADER_SIZE + len) {
                Some(payload) => io::IoSliceMut::new(payload),
                None => io::IoSliceMut::new(&mut []),
            }
        });
        match pipe.read_vectored(&mut slots) {
            Ok(0) => self.pipe = None,
            Ok(n) => {
                let mut framed = 0;
                let mut at = start;
                while framed < n {
                    let len = (n - framed).min(MAX_PAYLOAD);
                    out.buf[at..at + HEADER_SIZE]
                        .copy_from_slice(&wire::encode_header(self.kind, len));
                    at += HEADER_SIZE + len;
                    framed += len;
                }
                out.len = at;
                if let Some(d) = self.drain.as_mut() {
                    *d -= n.min(*d);
                    if *d == 0 {
                        self.pipe = None;
                    }
                } else if n >= MAX_PAYLOAD && !self.enlarged && !self.terminal {
                    // A full default pipe: this command writes fast.
                    self.enlarged = true;
                    if let Some(p) = &self.pipe {
                        let _ = sys::set_pipe_size(p.as_fd(), BUSY_PIPE_SIZE);
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if self.drain.is_some() {
                    self.pipe = None;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A terminal whose other side every process has closed: its end, once read.
            Err(e) if self.terminal && e.raw_os_error() == Some(libc::EIO) => self.pipe = None,
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

/// Host stdin frames to the command's stdin pipe.
#[derive(Debug)]
struct StdinPump {
    pipe: Option<File>,
    decoder: Decoder,
    /// Payload not yet written to the pipe.
    buf: Vec<u8>,
    pos: usize,
    /// Whether the host is done sending (stdin_close, or EOF and every frame consumed).
    host_done: bool,
    /// Whether the host half-closed the connection (frames may still be buffered).
    eof: bool,
    /// Payload bytes of the stdin frames taken from the host so far, across connections.
    taken: u64,
    /// Whether the host sent `stdin_close`.
    closed: bool,
    /// The command's terminal, which `resize` frames size (for as long as the session lasts,
    /// input ended or not).
    terminal: Option<Terminal>,
}

impl StdinPump {
    fn new(fd: OwnedFd, terminal: Option<Terminal>) -> io::Result<StdinPump> {
        sys::set_nonblocking(fd.as_fd(), true)?;
        Ok(StdinPump {
            pipe: Some(File::from(fd)),
            decoder: Decoder::new(Direction::HostToGuest),
            buf: Vec::new(),
            pos: 0,
            host_done: false,
            eof: false,
            taken: 0,
            closed: false,
            terminal,
        })
    }

    /// How far stdin got, for a client that re-attaches.
    fn progress(&self) -> exec_registry::StdinTaken {
        exec_registry::StdinTaken {
            bytes: self.taken,
            closed: self.closed,
        }
    }

    /// Its connection dropped: a frame it was in the middle of is lost with it (the client
    /// resends from [`StdinPump::progress`]), and the next connection starts a fresh stream.
    fn detach(&mut self) {
        self.decoder = Decoder::new(Direction::HostToGuest);
        self.eof = false;
    }

    fn wants_host_input(&self) -> bool {
        (!self.host_done || self.terminal.is_some()) && !self.eof && self.pos >= self.buf.len()
    }

    /// Moves decoded frames into the command's stdin until the pipe is full, the decoder has
    /// no whole frame left, or input has ended.
    fn advance(&mut self) -> Result<(), ExecError> {
        loop {
            self.write_some();
            if self.pos < self.buf.len() {
                return Ok(()); // The pipe is full: wait for POLLOUT.
            }
            if self.host_done && self.terminal.is_none() {
                self.pipe = None;
                return Ok(());
            }
            let frame = match self.decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => {
                    if self.eof {
                        // The host half-closed without stdin_close: that ends stdin too, unless
                        // it stopped inside a frame.
                        self.decoder
                            .finish()
                            .map_err(|e| ExecError::Protocol(e.to_string()))?;
                        self.host_done = true;
                        self.pipe = None;
                    }
                    return Ok(());
                }
                Err(e) => return Err(ExecError::Protocol(e.to_string())),
            };
            match frame.frame_type {
                // Input after its end (or after the command's exit) has nowhere to go; a
                // terminal's session is still read, for its resize frames.
                FrameType::Stdin | FrameType::StdinClose if self.host_done => {}
                FrameType::Stdin => {
                    self.buf.clear();
                    self.buf.extend_from_slice(frame.payload);
                    self.pos = 0;
                    self.taken += frame.payload.len() as u64;
                }
                FrameType::StdinClose => {
                    self.host_done = true;
                    self.closed = true;
                    // A terminal has no end of input but the one typed: its end-of-file
                    // character, which ends a read as a closed pipe would (in canonical mode;
                    // in raw mode the program decides what ends its input).
                    if let Some(eof) = self.terminal.as_ref().and_then(Terminal::end_of_input) {
                        self.buf.clear();
                        self.buf.push(eof);
                        self.pos = 0;
                    }
                }
                FrameType::Resize => {
                    let size: TerminalSize = serde_json::from_slice(frame.payload)
                        .map_err(|e| ExecError::Protocol(format!("a resize frame's size: {e}")))?;
                    // A session without a terminal has nothing to resize.
                    if let Some(terminal) = &self.terminal {
                        terminal.resize(size)?;
                    }
                }
                other => {
                    return Err(ExecError::Protocol(format!(
                        "unexpected {other} frame from the host"
                    )))
                }
            }
        }
    }

    fn write_some(&mut self) {
        let Some(pipe) = self.pipe.as_mut() else {
            self.pos = self.buf.len();
            return;
        };
        while self.pos < self.buf.len() {
            match pipe.write(&self.buf[self.pos..]) {
                Ok(n) => self.pos += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    // The command closed its stdin (EPIPE): discard what the host still sends.
                    self.pipe = None;
                    self.pos = self.buf.len();
                    return;
                }
            }
        }
        if self.host_done {
            self.pipe = None;
        }
    }
}

#[derive(Debug)]
struct Session {
    /// The client; `None` while a command that outlives its connection has none.
    conn: Option<UnixStream>,
    /// Its entry, when it has a name.
    tracked: Option<Arc<Tracked>>,
    /// Wakes the loop when an `attach` hands over a connection (made when it detaches).
    wake: Option<Arc<OwnedFd>>,
    /// The next output byte the client needs.
    cursor: u64,
    /// Whether the client has everything up to the output's end (else the tail is replayed
    /// before the pipes are read again).
    live: bool,
    /// Output bytes this client asked for that were no longer kept.
    skipped: u64,
    child: Child,
    streams: [Stream; 2],
    stdin: Option<StdinPump>,
    /// Encoded frames not yet written to the host.
    pending: OutBuf,
    deadline: Option<Instant>,
    timed_out: bool,
    exit: Option<ExitInfo>,
    /// After the exit: when a terminal still held open by another process stops being read.
    terminal_drain_until: Option<Instant>,
}

const CONN: usize = 0;
const EXIT: usize = 1;
const OUT: usize = 2;
const ERR: usize = 3;
const STDIN: usize = 4;
const WAKE: usize = 5;

impl Session {
    /// Moves data until the command has exited and its output is forwarded.
    fn pump(&mut self) -> Result<ExitInfo, ExecError> {
        // The connection stays blocking; the loop uses MSG_DONTWAIT sends and receives.
        loop {
            if self.conn.is_some() && !self.live && self.pending_empty() {
                self.replay_some();
            }
            if let Some(exit) = self.exit {
                if self.pending_empty()
                    && self.streams.iter().all(|s| s.pipe.is_none())
                    && (self.live || self.conn.is_none())
                {
                    return Ok(exit);
                }
            }
            let mut fds = [libc::pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            }; 6];
            // The connection: always watched for hang-up; for writing when frames wait; for
            // reading when interactive input is wanted. Without one: the hand-off's eventfd.
            match (&self.conn, &self.wake) {
                (Some(conn), _) => {
                    fds[CONN].fd = conn.as_raw_fd();
                    let kept = self.tracked.as_ref().is_some_and(|t| t.keeps_running());
                    if self.stdin.is_none() || kept {
                        // The host sends nothing after a one-shot request, so the end of its
                        // side means it is gone; for a session that outlives its connection,
                        // a half-close is a drop too (stdin it sent but we did not take is
                        // counted as not taken, and sent again after a re-attach). A vsock
                        // peer's close arrives as a SHUTDOWN that Linux reports as POLLRDHUP
                        // only, never POLLHUP: without this a silent command never noticed its
                        // client leave.
                        fds[CONN].events |= libc::POLLRDHUP;
                    }
                    if !self.pending_empty() {
                        fds[CONN].events |= libc::POLLOUT;
                    }
                    if self.stdin.as_ref().is_some_and(StdinPump::wants_host_input) {
                        fds[CONN].events |= libc::POLLIN;
                    }
                }
                (None, Some(wake)) => {
                    fds[WAKE].fd = wake.as_raw_fd();
                    fds[WAKE].events = libc::POLLIN;
                }
                (None, None) => {}
            }
            if self.exit.is_none() {
                fds[EXIT].fd = self.child.exit_fd().as_raw_fd();
                fds[EXIT].events = libc::POLLIN;
            }
            if self.pending_empty() && (self.live || self.conn.is_none()) {
                for (i, s) in [OUT, ERR].into_iter().zip(self.streams.iter()) {
                    if let Some(p) = &s.pipe {
                        fds[i].fd = p.as_raw_fd();
                        fds[i].events = libc::POLLIN;
                    }
                }
            }
            if let Some(stdin) = &self.stdin {
                if let Some(p) = &stdin.pipe {
                    if stdin.pos < stdin.buf.len() {
                        fds[STDIN].fd = p.as_raw_fd();
                        fds[STDIN].events = libc::POLLOUT;
                    }
                }
            }
            let wake_at = match (self.deadline, self.timed_out, self.exit.is_some()) {
                (Some(d), false, false) => Some(d),
                _ => None,
            };
            let timeout = match wake_at.into_iter().chain(self.terminal_drain_until).min() {
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    // Round up so that we never wake just before the deadline and spin.
                    libc::c_int::try_from(left.as_millis() + 1).unwrap_or(libc::c_int::MAX)
                }
                None => -1,
            };
            sys::poll(&mut fds, timeout)?;
            if self
                .terminal_drain_until
                .is_some_and(|d| Instant::now() >= d)
            {
                // Another process keeps the terminal open: what the command wrote is read.
                for s in self.streams.iter_mut().filter(|s| s.terminal) {
                    s.pipe = None;
                }
                self.terminal_drain_until = None;
            }

            let hung_up = libc::POLLHUP | libc::POLLERR | (fds[CONN].events & libc::POLLRDHUP);
            if fds[CONN].revents & hung_up != 0 {
                self.host_gone(ExecError::HostGone(None))?;
                continue;
            }
            if fds[CONN].revents & libc::POLLIN != 0 {
                if let Err(e) = self.read_host_input() {
                    self.host_gone(e)?;
                    continue;
                }
            }
            if fds[CONN].revents & libc::POLLOUT != 0 {
                if let Err(e) = self.flush_pending() {
                    self.host_gone(e)?;
                    continue;
                }
            }
            if fds[STDIN].revents != 0 {
                if let Some(stdin) = self.stdin.as_mut() {
                    stdin.advance()?;
                }
            }
            for (i, s) in [OUT, ERR].into_iter().zip(self.streams.iter_mut()) {
                if fds[i].revents != 0 {
                    let start = self.pending.len;
                    s.read_into(&mut self.pending)?;
                    if let Some(tracked) = &self.tracked {
                        let recorded =
                            record_frames(tracked, &self.pending.buf[start..self.pending.len]);
                        if self.live {
                            self.cursor += recorded;
                        }
                    }
                }
            }
            if self.conn.is_none() {
                // Nobody to send to: the tail has it.
                self.pending.clear();
            }
            // A hand-off is taken only now, after this round's output went to the tail alone:
            // taken before, output read in the same round would reach the new client ahead of
            // its replay, and then again in it (seen as a line out of order and twice).
            if fds[WAKE].revents != 0 {
                self.take_handoff();
            }
            if !self.pending_empty() {
                // Most of the time the socket has room: skip a poll round trip.
                if let Err(e) = self.flush_pending() {
                    self.host_gone(e)?;
                    continue;
                }
            }
            if fds[EXIT].revents != 0 {
                self.on_exit()?;
            }
            if let (Some(d), false, None) = (self.deadline, self.timed_out, self.exit) {
                if Instant::now() >= d {
                    self.timed_out = true;
                    self.child.signal_group(libc::SIGKILL);
                }
            }
        }
    }

    fn on_exit(&mut self) -> io::Result<()> {
        let Some(exit) = self.child.try_reap()? else {
            return Ok(());
        };
        self.exit = Some(exit);
        // Forward what the pipes hold now, then stop: later writers are background processes.
        for s in &mut self.streams {
            if s.terminal {
                if s.pipe.is_some() {
                    self.terminal_drain_until = Some(Instant::now() + TERMINAL_DRAIN);
                }
                continue;
            }
            if let Some(p) = &s.pipe {
                s.drain = Some(sys::bytes_available(p.as_fd()).unwrap_or(0));
                if s.drain == Some(0) {
                    s.pipe = None;
                }
            }
        }
        // Nobody will read the command's stdin any more.
        if let Some(stdin) = self.stdin.as_mut() {
            stdin.pipe = None;
            stdin.host_done = true;
        }
        Ok(())
    }

    /// The client went away (`why`): a command that outlives its connection goes on without
    /// one; any other ends with `why`.
    fn host_gone(&mut self, why: ExecError) -> Result<(), ExecError> {
        let Some(tracked) = self.tracked.as_ref().filter(|t| t.keeps_running()) else {
            return Err(why);
        };
        if !matches!(why, ExecError::HostGone(_)) {
            return Err(why);
        }
        let wake = Arc::new(sys::eventfd()?);
        self.conn = None;
        self.pending.clear();
        let stdin = self.stdin.as_mut().map(|stdin| {
            stdin.detach();
            stdin.progress()
        });
        tracked.detach(wake.clone(), stdin);
        self.wake = Some(wake);
        crate::log::debug(format_args!(
            "exec {:?}: its connection dropped; it runs on detached",
            self.child.pid()
        ));
        // An attach may have come between the hang-up and now.
        self.take_handoff();
        Ok(())
    }

    /// Takes the connection an `attach` handed over, if one waits.
    fn take_handoff(&mut self) {
        let Some(wake) = &self.wake else {
            return;
        };
        sys::eventfd_drain(wake.as_fd());
        let Some(handoff) = self.tracked.as_ref().and_then(|t| t.take_handoff()) else {
            return;
        };
        self.conn = Some(handoff.conn);
        self.wake = None;
        self.cursor = handoff.offset;
        self.live = false;
        self.skipped = 0;
    }

    /// Fills the empty output buffer with the next kept output the re-attached client has not
    /// had; once there is none, the client is live again.
    fn replay_some(&mut self) {
        let Some(tracked) = &self.tracked else {
            self.live = true;
            return;
        };
        let mut frames = Vec::new();
        // Bounded by the buffer they are copied into, headers included.
        let room = self.pending.buf.len();
        let (next, skipped) = tracked.replay_into(self.cursor, room, &mut frames);
        self.skipped += skipped;
        self.cursor = next;
        if frames.is_empty() {
            self.live = true;
            return;
        }
        self.pending.clear();
        self.pending.buf[..frames.len()].copy_from_slice(&frames);
        self.pending.len = frames.len();
    }

    fn read_host_input(&mut self) -> Result<(), ExecError> {
        let (Some(stdin), Some(conn)) = (self.stdin.as_mut(), self.conn.as_ref()) else {
            return Ok(());
        };
        match sys::recv_nowait(conn.as_fd(), stdin.decoder.unfilled_mut()) {
            Ok(0) if self.tracked.as_ref().is_some_and(|t| t.keeps_running()) => {
                // A session that outlives its connection cannot tell a half-close from a
                // connection lost: only `stdin_close` ends its input.
                return Err(ExecError::HostGone(None));
            }
            Ok(0) => {
                // The host half-closed its side: once the frames already received are
                // delivered, that ends stdin (see `advance`).
                stdin.eof = true;
            }
            Ok(n) => stdin.decoder.mark_filled(n),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(ExecError::HostGone(Some(e))),
        }
        stdin.advance()
    }

    fn pending_empty(&self) -> bool {
        self.pending.is_empty()
    }

    fn flush_pending(&mut self) -> Result<(), ExecError> {
        let Some(conn) = self.conn.as_ref() else {
            self.pending.clear();
            return Ok(());
        };
        while !self.pending.is_empty() {
            match sys::send_nowait(conn.as_fd(), self.pending.unsent()) {
                Ok(0) => return Err(ExecError::HostGone(None)),
                Ok(n) => self.pending.written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(ExecError::HostGone(Some(e))),
            }
        }
        self.pending.clear();
        Ok(())
    }

    /// Writes the exit frame (after any pending output) and closes the stream. Without a
    /// client (or when writing fails) a command that outlives its connection keeps its result
    /// for the next `attach`.
    fn finish_with(&mut self, result: &ExecResult) -> Result<(), ExecError> {
        let mut result = result.clone();
        result.output_dropped_bytes = self.skipped;
        let keep = self.tracked.as_ref().is_some_and(|t| t.keeps_running());
        let written = match self.conn.as_mut() {
            None => Err(ExecError::HostGone(None)),
            Some(conn) => conn
                .write_all(self.pending.unsent())
                .map_err(|e| ExecError::HostGone(Some(e)))
                .and_then(|()| write_exit(conn, &result)),
        };
        self.pending.clear();
        if let Some(tracked) = &self.tracked {
            // A result that did not go out waits, with the output the client did not have
            // (and, for an interactive command, how far its stdin got).
            result.output_dropped_bytes = 0;
            let stdin = self.stdin.as_ref().map(StdinPump::progress);
            tracked.finish(&result, written.is_ok() || !keep, stdin);
        }
        // The stream ends only once the registry says what became of the command: a client
        // that has read to the end and then lists the commands must find it collected.
        if let (Ok(()), Some(conn)) = (&written, &self.conn) {
            let _ = conn.shutdown(std::net::Shutdown::Write);
        }
        match written {
            Err(_) if keep => Ok(()),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reaper::RawUsage;

    fn killed(maxrss_kib: u64) -> ExitInfo {
        ExitInfo {
            status: libc::SIGKILL, // WIFSIGNALED with WTERMSIG = SIGKILL
            usage: RawUsage {
                maxrss_kib,
                read_bytes: 4096,
                ..RawUsage::default()
            },
            at: Instant::now(),
        }
    }

    fn ctx(mem_total_bytes: u64) -> ExecContext {
        let mut c = ExecContext::new().expect("context");
        c.mem_total_bytes = mem_total_bytes;
        c
    }

    #[test]
    fn oom_heuristic_needs_sigkill_not_ours_and_near_total_memory() {
        let started = Instant::now();
        let total = 1024 * 1024 * 1024;
        let mut r = ExecResult::default();
        fill_result(
            &mut r,
            &killed(1_000_000),
            started,
            false,
            None,
            &ctx(total),
        );
        assert!(r.oom_killed);
        assert_eq!(r.signal, "SIGKILL");
        assert_eq!(r.exit_code, -1);
        let usage = r.usage.expect("usage");
        assert_eq!(usage.peak_memory_bytes, 1_000_000 * 1024);
        assert_eq!(usage.io_read_bytes, 4096);

        let mut r = ExecResult::default();
        fill_result(&mut r, &killed(1_000_000), started, true, None, &ctx(total));
        assert!(!r.oom_killed, "our own timeout kill is not an OOM kill");

        let mut r = ExecResult::default();
        fill_result(&mut r, &killed(10_000), started, false, None, &ctx(total));
        assert!(!r.oom_killed, "a small process killed by someone else");
    }

    #[test]
    fn the_stream_ends_only_once_the_command_is_collected() {
        // A client that reads to the end and then lists the commands must find it collected
        // (it ended attached: its result was delivered). The registry is held here from the
        // first frame on (output comes only once the command is registered): collecting needs
        // it, so the stream must not end meanwhile. (More output than the socket holds: the
        // exec is still forwarding it then, so it cannot have collected the command already.)
        let size = exec_registry::MORE_THAN_A_SOCKET_HOLDS;
        let mut req = ExecRequest::new(["sh", "-c", &format!("head -c {size} /dev/zero; exit 4")]);
        req.exec_id = "exec-collected".into();
        let (mut ours, theirs) = UnixStream::pair().expect("socketpair");
        let exec = std::thread::spawn(move || {
            run(theirs, &req, false, None, None, &ctx(0)).map_err(|e| report::chain(&e))
        });
        let mut header = [0u8; HEADER_SIZE];
        ours.read_exact(&mut header).expect("the first frame");
        let first = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
        let held = exec_registry::hold_registry();
        let mut payload = vec![0u8; first];
        ours.read_exact(&mut payload).expect("its payload");
        let (rest, exit) = exec_registry::read_to_exit_frame(&mut ours);
        assert_eq!(first + rest, size);
        let result: ExecResult = serde_json::from_slice(&exit).expect("exit payload");
        assert_eq!(result.exit_code, 4, "{result:?}");
        exec_registry::assert_ends_only_after(&mut ours, held);
        assert!(exec_registry::statuses(Some("exec-collected")).is_empty());
        exec.join().expect("exec thread").expect("exec");
    }

    #[test]
    fn normal_exit_reports_the_code() {
        let mut r = ExecResult::default();
        let info = ExitInfo {
            status: 3 << 8,
            usage: RawUsage::default(),
            at: Instant::now(),
        };
        fill_result(&mut r, &info, Instant::now(), false, None, &ctx(0));
        assert_eq!(
            (r.exit_code, r.signal.as_str(), r.oom_killed),
            (3, "", false)
        );
    }
}
