//! Commands that outlive their connection: detach on a dropped connection, re-attach by
//! `exec_id` from an offset, the tail's bound reported as dropped bytes, and the commands that
//! must die with their connection.

mod common;

use std::io::{BufReader, Read};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{read_output, sh, wait_gone, Agent};
use wire::agent::{AgentReply, AgentRequest};
use wire::{ExecState, ExecStatus, OnDisconnect};

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
    let conn = agent.send(&AgentRequest::Attach {
        exec_id: exec_id.into(),
        offset,
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
