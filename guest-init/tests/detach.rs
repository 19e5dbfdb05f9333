//! Commands that outlive their connection: detach on a dropped connection, re-attach by
//! `exec_id` from an offset, the tail's bound reported as dropped bytes, and the commands that
//! must die with their connection.

mod common;

use std::io::{BufReader, Read};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{read_output, sh, wait_gone, Agent};
use wire::agent::{AgentReply, AgentRequest};
use wire::{ExecState, ExecStatus, FrameType, OnDisconnect, HEADER_SIZE};

fn start(agent: &Agent, exec_id: &str, script: &str, tail_bytes: Option<u64>) -> UnixStream {
    let mut request = sh(script);
    request.exec_id = exec_id.into();
    agent.send(&AgentRequest::Exec {
        request,
        interactive: false,
        user: None,
        tail_bytes,
    })
}

fn status(agent: &Agent, exec_id: &str) -> Option<ExecStatus> {
    match agent.reply(&AgentRequest::Execs {
        exec_id: Some(exec_id.into()),
    }) {
        AgentReply::Execs(mut list) => list.execs.pop(),
        AgentReply::Error(e) if e.code == "not_found" => None,
        other => panic!("execs: {other:?}"),
    }
}

/// Waits until `exec_id` is in `state` with no client attached.
fn wait_for(agent: &Agent, exec_id: &str, state: ExecState) -> ExecStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = status(agent, exec_id) {
            if s.state == state && !s.attached {
                return s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{exec_id} never became {state:?} and detached: {:?}",
            status(agent, exec_id)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `attach` and reads its first answer; the stream (if any) follows on the reader.
fn attach(agent: &Agent, exec_id: &str, offset: u64) -> (AgentReply, BufReader<UnixStream>) {
    attach_with(agent, exec_id, offset, false)
}

/// [`attach`], saying whether stdin frames will follow.
fn attach_with(
    agent: &Agent,
    exec_id: &str,
    offset: u64,
    stdin: bool,
) -> (AgentReply, BufReader<UnixStream>) {
    let conn = agent.send(&AgentRequest::Attach {
        exec_id: exec_id.into(),
        offset,
        stdin,
    });
    let mut reader = BufReader::new(conn);
    let reply = wire::read_message(&mut reader).expect("attach answer");
    (reply, reader)
}

/// Reads whole frames until `want` stdout bytes have arrived; returns them.
fn read_stdout(conn: &mut UnixStream, want: usize) -> Vec<u8> {
    let mut got = Vec::new();
    while got.len() < want {
        let mut header = [0u8; 8];
        conn.read_exact(&mut header).expect("frame header");
        let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).expect("payload");
        assert_eq!(header[0], 1, "stdout only");
        got.extend_from_slice(&payload);
    }
    got
}

#[test]
fn a_command_runs_on_after_its_connection_drops_and_an_attach_gets_the_rest() {
    let agent = Agent::start();
    let script = "for i in $(seq 1 30); do echo line$i; sleep 0.02; done; exit 3";
    let mut first = start(&agent, "keep-rest", script, None);
    let head = read_stdout(&mut first, 6);
    drop(first);
    let running = wait_for(&agent, "keep-rest", ExecState::Running);
    assert!(running.keep);
    assert_eq!(running.cmd, ["sh", "-c", script]);

    let (reply, stream) = attach(&agent, "keep-rest", head.len() as u64);
    assert!(
        matches!(&reply, AgentReply::Attached(s) if s.exec_id == "keep-rest"),
        "{reply:?}"
    );
    let rest = read_output(stream);
    let expected: String = (1..=30).map(|i| format!("line{i}\n")).collect();
    let mut all = head;
    all.extend_from_slice(&rest.stdout);
    assert_eq!(
        String::from_utf8_lossy(&all),
        expected,
        "nothing lost, nothing twice"
    );
    assert_eq!(rest.result.exit_code, 3, "{:?}", rest.result);
    assert_eq!(rest.result.output_dropped_bytes, 0);
    assert!(status(&agent, "keep-rest").is_none(), "collected");
}

#[test]
fn a_command_that_ends_detached_keeps_its_result_and_reports_what_the_tail_dropped() {
    let agent = Agent::start();
    // 2,000 bytes of output against a 100-byte tail, all of it after the connection dropped.
    let conn = start(
        &agent,
        "keep-dropped",
        "sleep 0.3; head -c 2000 /dev/zero | tr '\\0' x; printf END; exit 7",
        Some(100),
    );
    drop(conn);
    let ended = wait_for(&agent, "keep-dropped", ExecState::Exited);
    assert_eq!((ended.output_bytes, ended.output_kept_from), (2003, 1903));
    assert_eq!(ended.result.as_ref().map(|r| r.exit_code), Some(7));

    let (reply, stream) = attach(&agent, "keep-dropped", 0);
    assert!(matches!(reply, AgentReply::Attached(_)), "{reply:?}");
    let out = read_output(stream);
    assert_eq!(out.stdout.len(), 100);
    assert!(out.stdout_str().ends_with("xxEND"), "{}", out.stdout_str());
    assert_eq!(out.result.exit_code, 7);
    assert_eq!(
        out.result.output_dropped_bytes, 1903,
        "reported, never silent"
    );
    // Collected once: a second attach finds nothing.
    let (again, _) = attach(&agent, "keep-dropped", 0);
    assert!(
        matches!(&again, AgentReply::Error(e) if e.code == "not_found"),
        "{again:?}"
    );
}

#[test]
fn a_second_client_is_refused_while_one_is_attached_and_offsets_past_the_end_are_refused() {
    let agent = Agent::start();
    let mut conn = start(&agent, "keep-busy", "echo hi; sleep 30", None);
    read_stdout(&mut conn, 3);
    let (busy, _) = attach(&agent, "keep-busy", 0);
    assert!(
        matches!(&busy, AgentReply::Error(e) if e.code == "conflict"),
        "{busy:?}"
    );
    drop(conn);
    wait_for(&agent, "keep-busy", ExecState::Running);
    let (past, _) = attach(&agent, "keep-busy", 4);
    assert!(
        matches!(&past, AgentReply::Error(e) if e.code == "invalid_request"),
        "{past:?}"
    );
    let signaled = agent.reply(&AgentRequest::Signal {
        signal: libc::SIGKILL,
        exec_id: Some("keep-busy".into()),
    });
    assert_eq!(signaled, AgentReply::Signaled);
    let (reply, stream) = attach(&agent, "keep-busy", 3);
    assert!(matches!(reply, AgentReply::Attached(_)), "{reply:?}");
    let out = read_output(stream);
    assert_eq!(out.result.signal, "SIGKILL", "{:?}", out.result);
}

#[test]
fn on_disconnect_kill_and_interactive_sessions_die_with_their_connection() {
    let agent = Agent::start();
    let mut request = sh("echo up; sleep 30");
    request.exec_id = "dies-kill".into();
    request.on_disconnect = Some(OnDisconnect::Kill);
    let mut killed = agent.send(&AgentRequest::Exec {
        request,
        interactive: false,
        user: None,
        tail_bytes: None,
    });
    read_stdout(&mut killed, 3);
    let pid = status(&agent, "dies-kill")
        .expect("listed while it runs")
        .pid;
    let (refused, _) = attach(&agent, "dies-kill", 0);
    assert!(
        matches!(&refused, AgentReply::Error(e) if e.code == "conflict"),
        "{refused:?}"
    );
    drop(killed);
    assert!(
        wait_gone(pid as u32, Duration::from_secs(5)),
        "killed with its connection"
    );

    let mut request = sh("echo up; sleep 30");
    request.exec_id = "dies-interactive".into();
    let mut session = agent.send(&AgentRequest::Exec {
        request,
        interactive: true,
        user: None,
        tail_bytes: None,
    });
    read_stdout(&mut session, 3);
    let pid = status(&agent, "dies-interactive").expect("listed").pid;
    assert!(!status(&agent, "dies-interactive").expect("listed").keep);
    drop(session);
    assert!(
        wait_gone(pid as u32, Duration::from_secs(5)),
        "interactive: killed"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while status(&agent, "dies-interactive").is_some() {
        assert!(
            Instant::now() < deadline,
            "a killed command leaves the list"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes `data` as one stdin frame (or a stdin_close frame for `None`).
fn send_stdin(conn: &mut UnixStream, data: Option<&[u8]>) {
    use std::io::Write;
    let mut frame = Vec::new();
    match data {
        Some(data) => wire::encode_frames(FrameType::Stdin, data, &mut frame),
        None => wire::encode_frames(FrameType::StdinClose, b"", &mut frame),
    }
    conn.write_all(&frame).expect("send stdin");
}

#[test]
fn an_interactive_session_that_asks_to_keep_carries_its_stdin_across_connections() {
    let agent = Agent::start();
    // `cat` echoes what it takes; the line count at its end proves every byte arrived once.
    let mut request = sh("cat; echo done");
    request.exec_id = "kept-interactive".into();
    request.on_disconnect = Some(OnDisconnect::Keep);
    let mut session = agent.send(&AgentRequest::Exec {
        request,
        interactive: true,
        user: None,
        tail_bytes: None,
    });
    session
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    send_stdin(&mut session, Some(b"one\n"));
    assert_eq!(read_stdout(&mut session, 4), b"one\n");
    // A frame cut off by the drop is lost with the connection, never half-delivered.
    use std::io::Write;
    let mut partial = Vec::new();
    wire::encode_frames(FrameType::Stdin, b"lost\n", &mut partial);
    session
        .write_all(&partial[..HEADER_SIZE + 2])
        .expect("a partial frame");
    drop(session);

    let detached = wait_for(&agent, "kept-interactive", ExecState::Running);
    assert!(detached.keep);
    assert_eq!(detached.stdin_bytes, Some(4), "{detached:?}");
    assert!(!detached.stdin_closed);
    let (reply, reader) = attach_with(&agent, "kept-interactive", 4, true);
    assert!(
        matches!(&reply, AgentReply::Attached(s) if s.stdin_bytes == Some(4)),
        "{reply:?}"
    );
    let mut session = reader.into_inner();
    send_stdin(&mut session, Some(b"two\n"));
    assert_eq!(read_stdout(&mut session, 4), b"two\n");
    send_stdin(&mut session, None);
    let out = read_output(session);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    assert_eq!(out.result.exit_code, 0, "{:?}", out.result);
    assert_eq!(out.exit_frames, 1);
}

#[test]
fn a_kept_interactive_session_with_its_stdin_closed_notices_a_half_close_and_keeps_its_result() {
    // As a vsock close looks to the guest: the host shuts its side down, and the command,
    // silent, its stdin closed, gives poll nothing else to report.
    let agent = Agent::start();
    let mut request = sh("sleep 1; exit 9");
    request.exec_id = "kept-quiet".into();
    request.on_disconnect = Some(OnDisconnect::Keep);
    let mut session = agent.send(&AgentRequest::Exec {
        request,
        interactive: true,
        user: None,
        tail_bytes: None,
    });
    send_stdin(&mut session, Some(b"abc"));
    send_stdin(&mut session, None);
    // The frames reach the agent before the half-close is noticed only if it reads them
    // first; either way what it took is what the status says.
    std::thread::sleep(Duration::from_millis(100));
    session
        .shutdown(std::net::Shutdown::Write)
        .expect("half-close");
    let detached = wait_for(&agent, "kept-quiet", ExecState::Running);
    assert_eq!(detached.stdin_bytes, Some(3), "{detached:?}");
    assert!(detached.stdin_closed, "{detached:?}");
    drop(session);
    // Ended while detached: its result waits, with its stdin position, for an attach.
    let ended = wait_for(&agent, "kept-quiet", ExecState::Exited);
    assert_eq!(ended.stdin_bytes, Some(3));
    // An attach with stdin, as the shim's after a restart, gets its result.
    let (reply, reader) = attach_with(&agent, "kept-quiet", 0, true);
    assert!(
        matches!(&reply, AgentReply::Attached(s) if s.stdin_bytes == Some(3)),
        "{reply:?}"
    );
    assert_eq!(read_output(reader).result.exit_code, 9);
}

#[test]
fn an_attach_with_stdin_to_a_one_shot_command_is_refused_before_it_collects_anything() {
    let agent = Agent::start();
    let conn = start(&agent, "one-shot-ended", "echo out; exit 2", None);
    drop(conn);
    wait_for(&agent, "one-shot-ended", ExecState::Exited);
    let (refused, _) = attach_with(&agent, "one-shot-ended", 0, true);
    assert!(
        matches!(&refused, AgentReply::Error(e) if e.code == "invalid_request"),
        "{refused:?}"
    );
    let (reply, reader) = attach(&agent, "one-shot-ended", 0);
    assert!(
        matches!(&reply, AgentReply::Attached(_)),
        "still there: {reply:?}"
    );
    let out = read_output(reader);
    assert_eq!(out.result.exit_code, 2);
}

#[test]
fn a_silent_command_notices_its_host_shut_its_side_as_a_vsock_close_looks() {
    // A vsock peer's close reaches the guest as a SHUTDOWN, which poll reports as POLLRDHUP
    // and never POLLHUP: a Unix socket whose peer shuts down only its write half looks the same.
    let agent = Agent::start();
    let mut conn = start(&agent, "keep-rdhup", "echo up; exec sleep 30", None);
    read_stdout(&mut conn, 3);
    conn.shutdown(std::net::Shutdown::Write)
        .expect("half-close");
    let detached = wait_for(&agent, "keep-rdhup", ExecState::Running);
    assert!(!detached.attached);

    let mut request = sh("echo up; exec sleep 30");
    request.exec_id = "kill-rdhup".into();
    request.on_disconnect = Some(OnDisconnect::Kill);
    let mut conn = agent.send(&AgentRequest::Exec {
        request,
        interactive: false,
        user: None,
        tail_bytes: None,
    });
    read_stdout(&mut conn, 3);
    let pid = status(&agent, "kill-rdhup").expect("listed").pid;
    conn.shutdown(std::net::Shutdown::Write)
        .expect("half-close");
    assert!(
        wait_gone(pid as u32, Duration::from_secs(5)),
        "killed although its host never fully closed"
    );
    let _ = agent.reply(&AgentRequest::Signal {
        signal: libc::SIGKILL,
        exec_id: Some("keep-rdhup".into()),
    });
}

/// A small deterministic generator (xorshift64*): the stress test's drop points vary run to
/// run, and a failure names its seed so that `DETACH_STRESS_SEED` can repeat them.
struct Rng(u64);

impl Rng {
    fn seeded() -> (Rng, u64) {
        let seed = std::env::var("DETACH_STRESS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1);
                nanos ^ (u64::from(std::process::id()) << 32)
            });
        (Rng(seed | 1), seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

/// What a re-attaching client has of one command's output, over all its connections.
#[derive(Debug, Default)]
struct Received {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exits: Vec<wire::ExecResult>,
    /// Frame header bytes of the current connection not yet whole (lost with it).
    header: Vec<u8>,
    /// The current frame's type and the payload bytes it has still to bring.
    frame: Option<(FrameType, usize)>,
    exit_payload: Vec<u8>,
}

impl Received {
    /// The offset to re-attach from: every payload byte received, whole frames or not (a
    /// frame cut by the drop leaves its first bytes, which the client has and counts).
    fn offset(&self) -> u64 {
        (self.stdout.len() + self.stderr.len()) as u64
    }

    /// A new connection starts at a frame boundary.
    fn new_connection(&mut self) {
        self.header.clear();
        self.frame = None;
        self.exit_payload.clear();
    }

    /// Takes in bytes of a frame stream as they arrived.
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let Some((kind, left)) = self.frame else {
                let take = (HEADER_SIZE - self.header.len()).min(bytes.len());
                self.header.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if self.header.len() == HEADER_SIZE {
                    let kind = FrameType::try_from(self.header[0]).expect("a frame type");
                    let len = u32::from_be_bytes([
                        self.header[4],
                        self.header[5],
                        self.header[6],
                        self.header[7],
                    ]) as usize;
                    self.header.clear();
                    self.frame = Some((kind, len));
                    if len == 0 {
                        self.end_frame(kind);
                    }
                }
                continue;
            };
            let take = left.min(bytes.len());
            let piece = &bytes[..take];
            bytes = &bytes[take..];
            match kind {
                FrameType::Stdout => self.stdout.extend_from_slice(piece),
                FrameType::Stderr => self.stderr.extend_from_slice(piece),
                FrameType::Exit => self.exit_payload.extend_from_slice(piece),
                other => panic!("unexpected {other} frame from the agent"),
            }
            self.frame = Some((kind, left - take));
            if left == take {
                self.end_frame(kind);
            }
        }
    }

    fn end_frame(&mut self, kind: FrameType) {
        self.frame = None;
        if kind == FrameType::Exit {
            let result = serde_json::from_slice(&self.exit_payload).expect("exit payload");
            self.exits.push(result);
            self.exit_payload.clear();
        }
    }
}

/// Re-attaches from `offset`, retrying while the agent has not yet seen the previous
/// connection go (it answers `conflict` until then).
fn reattach(agent: &Agent, exec_id: &str, offset: u64, what: &str) -> UnixStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut conn = agent.send(&AgentRequest::Attach {
            exec_id: exec_id.into(),
            offset,
            stdin: false,
        });
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        // Read without a buffer: the frames that follow the answer stay in the socket.
        match wire::read_message(&mut conn).expect("attach answer") {
            AgentReply::Attached(s) => {
                assert!(s.output_bytes >= offset, "{s:?} from {offset}");
                return conn;
            }
            AgentReply::Error(e) if e.code == "conflict" => {}
            other => panic!("{what}: attach {exec_id} from {offset}: {other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {exec_id} stayed attached 10 s after its client left"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Checks that `text` is exactly the lines `want`, in order; says where it is not.
fn check_lines(stream: &str, text: &[u8], want: impl Iterator<Item = String>) {
    let text = std::str::from_utf8(text).expect("ASCII output");
    let mut lines = text.split_inclusive('\n');
    let mut at = 0usize;
    for expected in want {
        match lines.next() {
            Some(line) if line == expected => at += line.len(),
            got => {
                let from = at.saturating_sub(60);
                let to = (at + 120).min(text.len());
                panic!(
                    "{stream}: byte {at}: wanted {expected:?}, got {got:?}; around it: {:?}",
                    &text[from..to]
                );
            }
        }
    }
    let rest: String = lines.take(3).collect();
    assert!(rest.is_empty(), "{stream}: more than expected: {rest:?}");
}

#[test]
fn re_attaching_again_and_again_while_the_command_writes_loses_and_repeats_nothing() {
    // Drops at random points (right after the answer, inside a frame header, inside a
    // payload, after a few frames; once in a while before reading the answer at all), each
    // followed at once by an attach from what the client has: every byte exactly once, in
    // order, then one exit frame. The command writes all the while, on both streams, and
    // waits for a file to exit, so that no exit frame is ever in flight when a connection
    // drops (a client that drops after its exit frame was sent has had its result).
    const CYCLES: usize = 40;
    // At most ~11 MB: more than the client's reads can ask for (40 × 192 KiB at most), so a
    // read never waits on a command that has stopped writing.
    const LINES: u64 = 1_000_000;
    let (mut rng, seed) = Rng::seeded();
    let agent = Agent::start();
    let stop = agent.dir.path().join("stop");
    let script = format!(
        "i=0; while [ $i -lt {LINES} ] && [ ! -e '{stop}' ]; do i=$((i+1)); echo \"o $i\"; \
         if [ $((i % 5)) -eq 0 ]; then echo \"e $i\" >&2; fi; done; \
         echo \"end $i\"; echo \"end $i\" >&2; while [ ! -e '{stop}' ]; do sleep 0.01; done; exit 7",
        stop = stop.display()
    );
    // Room for all of it: nothing may be dropped.
    let mut conn = start(&agent, "keep-stress", &script, Some(16 * 1024 * 1024));
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut got = Received::default();
    let mut log = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    for cycle in 0..CYCLES {
        let budget = match rng.below(8) {
            // The first connection reads at least a byte: until the agent has read the exec
            // request and registered the command, an attach rightly finds no such command
            // (the attach may even be read first), and only a byte of output proves it.
            0 if cycle > 0 => 0,
            0 | 1 => 1 + rng.below(15),
            2 => 1 + rng.below(4096),
            _ => 1 + rng.below(192 * 1024),
        } as usize;
        let mut read = 0;
        while read < budget {
            let want = (budget - read).min(buf.len());
            match conn.read(&mut buf[..want]) {
                Ok(0) => panic!("seed {seed}: cycle {cycle}: the agent closed: {log:?}"),
                Ok(n) => {
                    got.feed(&buf[..n]);
                    read += n;
                }
                Err(e) => panic!("seed {seed}: cycle {cycle}: reading: {e}: {log:?}"),
            }
        }
        assert!(
            got.exits.is_empty(),
            "seed {seed}: an exit frame before the end"
        );
        log.push((got.offset(), budget));
        drop(conn);
        if rng.below(10) == 0 {
            // An attach that is dropped unanswered: handed over or not, it got nothing.
            drop(agent.send(&AgentRequest::Attach {
                exec_id: "keep-stress".into(),
                offset: got.offset(),
                stdin: false,
            }));
        }
        got.new_connection();
        let what = format!("seed {seed}: cycle {cycle}: {log:?}");
        conn = reattach(&agent, "keep-stress", got.offset(), &what);
    }
    // The end: the command exits while attached, or (when the file comes first) while its
    // exec thread is detached or about to take the hand-off.
    let exit_detached = rng.below(2) == 0;
    if exit_detached {
        drop(conn);
        std::fs::write(&stop, b"").expect("stop file");
        got.new_connection();
        conn = reattach(
            &agent,
            "keep-stress",
            got.offset(),
            &format!("seed {seed}: last"),
        );
    } else {
        std::fs::write(&stop, b"").expect("stop file");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "seed {seed}: no end in 30 s");
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.feed(&buf[..n]),
            Err(e) => panic!("seed {seed}: reading the rest: {e}: {log:?}"),
        }
    }
    assert!(
        got.header.is_empty() && got.frame.is_none(),
        "seed {seed}: the stream ended inside a frame"
    );
    assert_eq!(got.exits.len(), 1, "seed {seed}: exactly one exit frame");
    let result = &got.exits[0];
    assert_eq!(result.exit_code, 7, "seed {seed}: {result:?}");
    assert_eq!(
        result.output_dropped_bytes, 0,
        "seed {seed}: the tail held everything"
    );
    let stdout = String::from_utf8_lossy(&got.stdout);
    let last: u64 = stdout
        .lines()
        .last()
        .and_then(|l| l.strip_prefix("end "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("seed {seed}: no end line: {:?}", stdout.lines().last()));
    let end = format!("end {last}\n");
    let out = (1..=last).map(|n| format!("o {n}\n"));
    check_lines("stdout", &got.stdout, out.chain([end.clone()]));
    let err = (1..=last / 5).map(|k| format!("e {}\n", k * 5));
    check_lines("stderr", &got.stderr, err.chain([end]));
    eprintln!(
        "seed {seed}: {last} lines, {} bytes, exit {}",
        got.offset(),
        if exit_detached {
            "detached"
        } else {
            "attached"
        }
    );
}
