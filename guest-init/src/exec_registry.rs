//! The commands a client can find again by `exec_id`: those that run, and those that ended
//! while no client was attached, until their result is collected.
//!
//! A command started with `on_disconnect: keep` outlives its connection: its exec thread goes
//! on without one, feeding the command's output into its [`Tail`], and an `attach` hands it a
//! new connection (through [`Tracked`]'s hand-off slot and an eventfd that wakes its poll).
//! A command that ends while detached leaves its result here; the next `attach` gets the kept
//! output and the exit frame, and collects it.
//!
//! Memory is bounded three ways: each tail by its capacity, all tails together by
//! [`TAIL_BUDGET`] (a tail that would pass it drops its own oldest bytes first), and the ended
//! commands kept by [`MAX_ENDED`] (the oldest result is forgotten, with a log line).

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use wire::agent::AgentReply;
use wire::{ErrorBody, ExecResult, ExecState, ExecStatus, FrameType, HEADER_SIZE, MAX_PAYLOAD};

use crate::exec_tail::Tail;
use crate::log;
use crate::sys;

/// All tails together hold at most this much: a sandbox that starts many chatty commands and
/// drops their connections cannot make the agent (outside the commands' memory limit) grow
/// without end.
pub const TAIL_BUDGET: usize = 64 * 1024 * 1024;

/// Ended commands whose result waits to be collected, at most.
pub const MAX_ENDED: usize = 64;

/// Bytes held by every tail.
static TAILS_HELD: AtomicUsize = AtomicUsize::new(0);

static REGISTRY: LazyLock<Mutex<VecDeque<Arc<Tracked>>>> = LazyLock::new(Mutex::default);

fn registry() -> MutexGuard<'static, VecDeque<Arc<Tracked>>> {
    // Inserts and removals cannot leave the list inconsistent: a poisoned lock is still usable.
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Holds the registry, so that a test can see what a stream does while a command cannot be
/// collected.
#[cfg(test)]
pub(crate) fn hold_registry() -> MutexGuard<'static, VecDeque<Arc<Tracked>>> {
    registry()
}

/// Output a test streams to make sure that its writer is still writing when the reader has
/// read its first frame: many times what a Unix socket buffers.
#[cfg(test)]
pub(crate) const MORE_THAN_A_SOCKET_HOLDS: usize = 2 * 1024 * 1024;

/// Test helper: reads frames (and nothing after them, unlike a buffered reader) up to the exit
/// frame; returns the output payload bytes and the exit frame's payload.
#[cfg(test)]
pub(crate) fn read_to_exit_frame(conn: &mut UnixStream) -> (usize, Vec<u8>) {
    use std::io::Read;
    let mut output = 0;
    loop {
        let mut header = [0u8; wire::HEADER_SIZE];
        conn.read_exact(&mut header).expect("frame header");
        let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).expect("frame payload");
        if header[0] == FrameType::Exit.as_u8() {
            return (output, payload);
        }
        output += len;
    }
}

/// Test helper: asserts that `conn` stays open (no EOF) for a while, then, once `held` is
/// let go, that it ends.
#[cfg(test)]
pub(crate) fn assert_ends_only_after(conn: &mut UnixStream, held: impl Sized) {
    use std::io::Read;
    use std::time::Duration;
    let mut byte = [0u8; 1];
    conn.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    let early = conn.read(&mut byte);
    assert!(
        matches!(&early, Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)),
        "the stream ended while the command could not be collected yet: {early:?}"
    );
    drop(held);
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    assert_eq!(conn.read(&mut byte).expect("the end of the stream"), 0);
}

/// Why an attach was refused.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// No command of that name runs or waits to be collected.
    #[error("no command has exec_id {0:?} (it never ran, or its result was collected)")]
    NotFound(String),
    /// A client is attached to it now.
    #[error("exec_id {0:?} is attached to another connection")]
    Busy(String),
    /// It dies with its connection (`on_disconnect: kill`): nobody can attach to it.
    #[error("exec_id {0:?} does not outlive its connection (on_disconnect: kill)")]
    NotKept(String),
    /// The attach asks to send stdin, but the command takes none (it is not interactive).
    #[error("exec_id {0:?} is not an interactive command: it takes no stdin")]
    NoStdin(String),
    /// The offset is past its output.
    #[error("offset {offset} is past the {end} bytes exec_id {exec_id:?} has written")]
    PastTheEnd {
        /// The command.
        exec_id: String,
        /// What was asked.
        offset: u64,
        /// Its output's end.
        end: u64,
    },
    /// Answering on the connection failed.
    #[error("writing to the attaching connection")]
    Io(#[from] io::Error),
}

impl AttachError {
    /// The agent's error answer.
    pub fn to_body(&self) -> ErrorBody {
        let code = match self {
            AttachError::NotFound(_) => "not_found",
            AttachError::Busy(_) | AttachError::NotKept(_) => "conflict",
            AttachError::PastTheEnd { .. } | AttachError::NoStdin(_) => "invalid_request",
            AttachError::Io(_) => "io_error",
        };
        ErrorBody::new(code, report::chain(self))
    }
}

/// A connection handed to a detached command's exec thread.
#[derive(Debug)]
pub struct Handoff {
    /// The new client.
    pub conn: UnixStream,
    /// The first output byte it wants.
    pub offset: u64,
}

/// What may change while a command runs, under its lock.
#[derive(Debug)]
struct Shared {
    tail: Tail,
    attached: bool,
    /// Set by `attach` while the exec thread is detached; taken by the exec thread.
    handoff: Option<Handoff>,
    /// Wakes the detached exec thread's poll (made when it detaches).
    wake: Option<Arc<OwnedFd>>,
    /// Set when it ended while detached (or its exit frame could not be written).
    result: Option<ExecResult>,
    /// An interactive command's stdin as of its last detach: the bytes it took, and whether
    /// its client closed it.
    stdin: Option<StdinTaken>,
}

/// How far an interactive command's stdin got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StdinTaken {
    /// Payload bytes of the stdin frames taken.
    pub bytes: u64,
    /// Whether `stdin_close` came.
    pub closed: bool,
}

/// One command that can be found by name.
#[derive(Debug)]
pub struct Tracked {
    exec_id: String,
    cmd: Vec<String>,
    pid: i32,
    started_unix_ms: u64,
    keep: bool,
    /// Whether it reads stdin from its client (an interactive session).
    interactive: bool,
    shared: Mutex<Shared>,
}

impl Tracked {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether it outlives its connection.
    pub fn keeps_running(&self) -> bool {
        self.keep
    }

    fn status(&self, shared: &Shared) -> ExecStatus {
        ExecStatus {
            exec_id: self.exec_id.clone(),
            cmd: self.cmd.clone(),
            state: if shared.result.is_some() {
                ExecState::Exited
            } else {
                ExecState::Running
            },
            pid: self.pid,
            started_unix_ms: self.started_unix_ms,
            attached: shared.attached,
            keep: self.keep,
            output_bytes: shared.tail.end(),
            output_kept_from: shared.tail.kept_from(),
            result: shared.result.clone(),
            stdin_bytes: shared.stdin.map(|s| s.bytes),
            stdin_closed: shared.stdin.is_some_and(|s| s.closed),
        }
    }

    /// Records output the command just wrote (whether or not a client is attached).
    pub fn record(&self, kind: FrameType, bytes: &[u8]) {
        let mut shared = self.lock();
        let before = shared.tail.held();
        shared.tail.push(kind, bytes);
        let after = shared.tail.held();
        let total = if after >= before {
            TAILS_HELD.fetch_add(after - before, Ordering::Relaxed) + (after - before)
        } else {
            TAILS_HELD.fetch_sub(before - after, Ordering::Relaxed) - (before - after)
        };
        if total > TAIL_BUDGET {
            let limit = after.saturating_sub(total - TAIL_BUDGET);
            let dropped = shared.tail.shrink_to(limit);
            TAILS_HELD.fetch_sub(dropped, Ordering::Relaxed);
        }
    }

    /// The end of its output so far.
    pub fn output_end(&self) -> u64 {
        self.lock().tail.end()
    }

    /// Appends kept output from `cursor` on to `out` as frames, at most `room` bytes of them
    /// headers included: a re-attached client's replay. Returns the new cursor and how many
    /// bytes before it were no longer kept (skipped). A `room` larger than a header always
    /// takes some output if there is any, so an empty replay means the client is caught up.
    pub fn replay_into(&self, cursor: u64, room: usize, out: &mut Vec<u8>) -> (u64, u64) {
        let shared = self.lock();
        let kept_from = shared.tail.kept_from();
        let skipped = kept_from.saturating_sub(cursor);
        let mut cursor = cursor.max(kept_from);
        // Each run of one stream is a frame of its own, so output that alternates short writes
        // to stdout and stderr replays as mostly headers: the room bounds the frames, not
        // their payload, or they overflow the exec thread's buffer.
        let limit = out.len().saturating_add(room);
        for (kind, mut bytes) in shared.tail.read_from(cursor, room) {
            while !bytes.is_empty() {
                let fits = limit.saturating_sub(out.len() + HEADER_SIZE);
                if fits == 0 {
                    return (cursor, skipped);
                }
                let (frame, rest) = bytes.split_at(bytes.len().min(MAX_PAYLOAD).min(fits));
                out.extend_from_slice(&wire::encode_header(kind, frame.len()));
                out.extend_from_slice(frame);
                cursor += frame.len() as u64;
                bytes = rest;
            }
        }
        (cursor, skipped)
    }

    /// The exec thread lost its client: from now on an `attach` may hand it another, waking
    /// `wake`. `stdin` is how far an interactive command's input got (it cannot move while
    /// nobody is attached).
    pub fn detach(&self, wake: Arc<OwnedFd>, stdin: Option<StdinTaken>) {
        let mut shared = self.lock();
        shared.attached = false;
        shared.wake = Some(wake);
        shared.stdin = stdin;
    }

    /// A connection an `attach` handed over, if any; the command is attached again.
    pub fn take_handoff(&self) -> Option<Handoff> {
        let mut shared = self.lock();
        let handoff = shared.handoff.take()?;
        shared.attached = true;
        shared.wake = None;
        Some(handoff)
    }

    /// The command ended. `delivered`: its exit frame reached an attached client, and it is
    /// forgotten; else its result waits here for an `attach` to collect it, with `stdin`, how
    /// far an interactive command's input got.
    pub fn finish(
        self: &Arc<Self>,
        result: &ExecResult,
        delivered: bool,
        stdin: Option<StdinTaken>,
    ) {
        if delivered {
            forget(self);
            return;
        }
        {
            let mut shared = self.lock();
            if stdin.is_some() {
                shared.stdin = stdin;
            }
            shared.attached = false;
            shared.wake = None;
            shared.result = Some(result.clone());
            if let Some(handoff) = shared.handoff.take() {
                // An attach raced the exit: that client is served from here, below.
                drop(shared);
                let _ = serve_ended(self, handoff.conn, handoff.offset);
                return;
            }
        }
        log::debug(format_args!(
            "exec {:?} ended with no client attached; its result is kept",
            self.exec_id
        ));
        let mut list = registry();
        let ended: Vec<Arc<Tracked>> = list
            .iter()
            .filter(|t| t.lock().result.is_some())
            .cloned()
            .collect();
        if ended.len() > MAX_ENDED {
            for old in &ended[..ended.len() - MAX_ENDED] {
                log::info(format_args!(
                    "forgetting the uncollected result of exec {:?}: more than {MAX_ENDED} wait",
                    old.exec_id
                ));
                list.retain(|t| !Arc::ptr_eq(t, old));
                release(old);
            }
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let shared = self.shared.get_mut().unwrap_or_else(|p| p.into_inner());
        TAILS_HELD.fetch_sub(shared.tail.held(), Ordering::Relaxed);
    }
}

/// Gives back a forgotten command's tail to the budget now (others may still hold the `Arc`).
fn release(tracked: &Tracked) {
    let mut shared = tracked.lock();
    let held = shared.tail.held();
    shared.tail.shrink_to(0);
    TAILS_HELD.fetch_sub(held, Ordering::Relaxed);
}

fn forget(tracked: &Arc<Tracked>) {
    registry().retain(|t| !Arc::ptr_eq(t, tracked));
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Tracks a command that has just started under `exec_id` (which the running commands'
/// registry has reserved). An ended command of the same name still waiting to be collected
/// is forgotten: the name is the new command's now.
pub fn register(
    exec_id: &str,
    cmd: &[String],
    pid: i32,
    keep: bool,
    interactive: bool,
    tail_bytes: usize,
) -> Arc<Tracked> {
    let tracked = Arc::new(Tracked {
        exec_id: exec_id.to_string(),
        cmd: cmd.to_vec(),
        pid,
        started_unix_ms: now_unix_ms(),
        keep,
        interactive,
        shared: Mutex::new(Shared {
            tail: Tail::new(if keep { tail_bytes } else { 0 }),
            attached: true,
            handoff: None,
            wake: None,
            result: None,
            // An interactive command has taken nothing yet: a status says so from the start.
            stdin: interactive.then(StdinTaken::default),
        }),
    });
    let mut list = registry();
    list.retain(|t| {
        let same = t.exec_id == exec_id;
        if same {
            release(t);
        }
        !same
    });
    list.push_back(tracked.clone());
    tracked
}

/// The status of every command that can be found, oldest first, or of `exec_id` only.
pub fn statuses(exec_id: Option<&str>) -> Vec<ExecStatus> {
    registry()
        .iter()
        .filter(|t| exec_id.is_none_or(|id| t.exec_id == id))
        .map(|t| t.status(&t.lock()))
        .collect()
}

/// Serves an `attach` on `conn`: answers with the command's status, then either hands the
/// connection to its (detached) exec thread, or, if it has ended, replays its kept output and
/// its exit frame here and collects it.
pub fn attach(
    exec_id: &str,
    mut conn: UnixStream,
    offset: u64,
    stdin: bool,
) -> Result<(), AttachError> {
    let Some(tracked) = registry().iter().find(|t| t.exec_id == exec_id).cloned() else {
        return Err(AttachError::NotFound(exec_id.to_string()));
    };
    if !tracked.keep {
        return Err(AttachError::NotKept(exec_id.to_string()));
    }
    // Refused before anything is served: an attach that answered would collect an ended
    // command's result for a client that cannot use it.
    if stdin && !tracked.interactive {
        return Err(AttachError::NoStdin(exec_id.to_string()));
    }
    let mut shared = tracked.lock();
    let end = shared.tail.end();
    if offset > end {
        return Err(AttachError::PastTheEnd {
            exec_id: exec_id.to_string(),
            offset,
            end,
        });
    }
    if shared.attached || shared.handoff.is_some() {
        return Err(AttachError::Busy(exec_id.to_string()));
    }
    // The answer goes out under the lock: the exec thread cannot write frames to this
    // connection before it, and the status is exactly what the stream starts from.
    wire::write_message(&mut conn, &AgentReply::Attached(tracked.status(&shared)))
        .map_err(|e| io::Error::other(e.to_string()))?;
    if shared.result.is_some() {
        // Marked attached while it is served, so that a second client is refused meanwhile.
        shared.attached = true;
        drop(shared);
        let served = serve_ended(&tracked, conn, offset);
        if served.is_err() {
            tracked.lock().attached = false;
        }
        return Ok(served?);
    }
    shared.handoff = Some(Handoff { conn, offset });
    if let Some(wake) = &shared.wake {
        sys::eventfd_signal(wake.as_fd());
    }
    Ok(())
}

/// Writes an ended command's kept output from `offset` and its exit frame on `conn`, and
/// collects it once they went out.
fn serve_ended(tracked: &Arc<Tracked>, mut conn: UnixStream, offset: u64) -> io::Result<()> {
    let mut cursor = offset;
    let mut skipped = 0;
    let mut frames = Vec::new();
    loop {
        frames.clear();
        let (next, gap) = tracked.replay_into(cursor, 4 * MAX_PAYLOAD, &mut frames);
        skipped += gap;
        if frames.is_empty() {
            break;
        }
        conn.write_all(&frames)?;
        cursor = next;
    }
    let mut result = tracked.lock().result.clone().unwrap_or_default();
    result.output_dropped_bytes = skipped;
    wire::encode_frames(
        FrameType::Exit,
        &wire::encode_exit_payload(&result),
        &mut frames,
    );
    conn.write_all(&frames)?;
    // Collected before the stream ends: a client that has read to the end and then lists the
    // commands must not find it still waiting.
    forget(tracked);
    let _ = conn.shutdown(std::net::Shutdown::Write);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_commands_result_is_collected_by_one_attach_with_what_was_kept() {
        let tracked = register("registry-ended", &["echo".into()], 42, true, false, 8);
        tracked.record(FrameType::Stdout, b"0123456789");
        tracked.detach(Arc::new(sys::eventfd().expect("eventfd")), None);
        tracked.finish(&ExecResult::default(), false, None);
        let status = statuses(Some("registry-ended"));
        assert_eq!(status.len(), 1);
        assert_eq!(status[0].state, ExecState::Exited);
        assert_eq!(
            (status[0].output_bytes, status[0].output_kept_from),
            (10, 2)
        );

        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        attach("registry-ended", theirs, 0, false).expect("attach");
        let mut reader = std::io::BufReader::new(ours);
        let reply: AgentReply = wire::read_message(&mut reader).expect("reply");
        assert!(matches!(reply, AgentReply::Attached(s) if s.state == ExecState::Exited));
        let mut frames = wire::FrameReader::new(reader, wire::Direction::GuestToHost);
        let out = frames.read_frame().expect("frame").expect("stdout");
        assert_eq!(out.payload, b"23456789");
        let exit = frames.read_frame().expect("frame").expect("exit");
        let result: ExecResult = serde_json::from_slice(exit.payload).expect("result");
        assert_eq!(
            result.output_dropped_bytes, 2,
            "the two bytes beyond the tail"
        );
        assert!(statuses(Some("registry-ended")).is_empty(), "collected");
        assert!(matches!(
            attach(
                "registry-ended",
                UnixStream::pair().expect("pair").0,
                0,
                false
            ),
            Err(AttachError::NotFound(_))
        ));
    }

    #[test]
    fn an_ended_commands_stream_ends_only_once_it_is_collected() {
        // A client that reads to the end and then lists the commands must not find it still
        // waiting. The registry is held here from the attach's answer on: collecting needs it,
        // so the stream must not end meanwhile. (More output than the socket holds: the attach
        // is still writing it then, so it cannot have collected the command already.)
        let size = MORE_THAN_A_SOCKET_HOLDS;
        let tracked = register("registry-collected", &["yes".into()], 45, true, false, size);
        tracked.record(FrameType::Stdout, &vec![b'y'; size]);
        tracked.detach(Arc::new(sys::eventfd().expect("eventfd")), None);
        tracked.finish(&ExecResult::default(), false, None);
        let (mut ours, theirs) = UnixStream::pair().expect("socketpair");
        let server = std::thread::spawn(move || attach("registry-collected", theirs, 0, false));
        let reply: AgentReply = wire::read_message(&mut ours).expect("reply");
        assert!(matches!(reply, AgentReply::Attached(_)), "{reply:?}");
        let held = hold_registry();
        assert_eq!(read_to_exit_frame(&mut ours).0, size);
        assert_ends_only_after(&mut ours, held);
        assert!(statuses(Some("registry-collected")).is_empty(), "collected");
        server.join().expect("attach thread").expect("served");
    }

    #[test]
    fn a_replay_of_many_short_runs_stays_within_its_room_headers_included() {
        // A command that alternates one-byte writes to stdout and stderr: one frame per byte,
        // nine bytes of frames per byte of output. Replayed in rooms of 1,000 bytes, every
        // byte comes back once, in order, and no replay is larger than its room.
        let tracked = register(
            "registry-short-runs",
            &["sh".into()],
            46,
            true,
            false,
            4 << 20,
        );
        let mut want = (Vec::new(), Vec::new());
        for i in 0..10_000u32 {
            let byte = b'a' + (i % 26) as u8;
            tracked.record(FrameType::Stdout, &[byte]);
            tracked.record(FrameType::Stderr, &[byte]);
            want.0.push(byte);
            want.1.push(byte);
        }
        let room = 1000;
        let (mut cursor, mut got, mut replays) = (0, (Vec::new(), Vec::new()), 0);
        loop {
            let mut frames = Vec::new();
            let (next, skipped) = tracked.replay_into(cursor, room, &mut frames);
            assert_eq!(skipped, 0);
            assert!(frames.len() <= room, "{} bytes for {room}", frames.len());
            if frames.is_empty() {
                break;
            }
            let mut decoder = wire::Decoder::new(wire::Direction::GuestToHost);
            decoder.push(&frames);
            let mut payload = 0;
            while let Some(frame) = decoder.next_frame().expect("valid frames") {
                payload += frame.payload.len() as u64;
                match frame.frame_type {
                    FrameType::Stdout => got.0.extend_from_slice(frame.payload),
                    FrameType::Stderr => got.1.extend_from_slice(frame.payload),
                    other => panic!("{other} frame in a replay"),
                }
            }
            assert_eq!(
                next,
                cursor + payload,
                "the cursor moves by what was framed"
            );
            cursor = next;
            replays += 1;
        }
        assert_eq!(cursor, 20_000);
        assert!(replays >= 20_000 * 9 / room, "{replays} replays");
        assert_eq!(got, want);
        tracked.finish(&ExecResult::default(), true, None);
    }

    #[test]
    fn an_attached_or_unkept_command_refuses_a_second_client_and_offsets_are_checked() {
        let attached = register("registry-busy", &["sleep".into()], 43, true, false, 64);
        attached.record(FrameType::Stderr, b"abc");
        let pair = || UnixStream::pair().expect("pair").0;
        assert!(matches!(
            attach("registry-busy", pair(), 0, false),
            Err(AttachError::Busy(_))
        ));
        attached.detach(Arc::new(sys::eventfd().expect("eventfd")), None);
        assert!(matches!(
            attach("registry-busy", pair(), 4, false),
            Err(AttachError::PastTheEnd { end: 3, .. })
        ));
        let (_ours, theirs) = UnixStream::pair().expect("pair");
        attach("registry-busy", theirs, 1, false).expect("handed over");
        let handoff = attached.take_handoff().expect("a connection waits");
        assert_eq!(handoff.offset, 1);
        let mut frames = Vec::new();
        assert_eq!(attached.replay_into(1, 100, &mut frames), (3, 0));
        attached.finish(&ExecResult::default(), true, None);
        assert!(statuses(Some("registry-busy")).is_empty());

        let unkept = register("registry-unkept", &["sh".into()], 44, false, false, 64);
        unkept.record(FrameType::Stdout, b"not kept");
        assert_eq!(statuses(Some("registry-unkept"))[0].output_kept_from, 8);
        assert!(matches!(
            attach("registry-unkept", pair(), 0, false),
            Err(AttachError::NotKept(_))
        ));
        unkept.finish(&ExecResult::default(), true, None);
    }
}
