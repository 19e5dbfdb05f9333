//! One daemon per cgroup parent. A daemon takes whatever it finds under its cgroup parent at
//! startup for a dead daemon's leftovers and kills it; a second daemon given the parent of a
//! running one (the default, `crucible`, for any two on a host) killed that daemon's sandboxes.
//! Now it refuses to start, naming the parent and the daemon that holds it, before it touches
//! anything.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use api_types::CreateSandbox;
use client::ExecEvent;
use harness::leaks::agent_pid;
use harness::process::{DaemonHome, DaemonProcess};
use nix::sys::signal::Signal;
use wire::ExecRequest;

/// The `crucible-test-daemon` binary, beside the test binary's `deps/` directory.
fn daemon_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps")
        .join("crucible-test-daemon")
}

/// How a second daemon's start ended: its exit status if it exited within `within`, or `None`
/// if it answered on its socket (it started; it is stopped then) or was still running.
fn second_daemon_outcome(
    socket: &Path,
    state_dir: &Path,
    parent: &str,
    log: &Path,
    within: Duration,
) -> Option<ExitStatus> {
    let mut child = Command::new(daemon_binary())
        .arg(socket)
        .arg(state_dir)
        .arg(parent)
        .env("CRUCIBLE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("the second daemon's log"))
        .spawn()
        .expect("start crucible-test-daemon");
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        let serving = std::os::unix::net::UnixStream::connect(socket).is_ok();
        if serving || Instant::now() > deadline {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                Signal::SIGTERM,
            );
            let stop = Instant::now() + Duration::from_secs(30);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < stop {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn a_second_daemon_on_a_held_cgroup_parent_refuses_to_start_and_kills_nothing() {
    let home = DaemonHome::new();
    let mut first = DaemonProcess::start_in(&home, &[]).await;
    let c = first.client();
    let id = c
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let mut sleeping = c
        .exec(
            &id,
            &ExecRequest::new(["sh", "-c", "echo started; exec sleep 1000"]),
        )
        .await
        .expect("exec");
    match sleeping.next_event().await {
        Some(Ok(ExecEvent::Stdout(b))) => assert_eq!(&b[..], b"started\n"),
        other => panic!("expected output first, got {other:?}"),
    }
    let agent = agent_pid(&home.cgroup_parent, &id).expect("the sandbox runs");

    // Another socket, state and data directory: only the cgroup parent is shared.
    let other = tempfile::tempdir().expect("temp dir");
    let (socket, state_dir) = (other.path().join("b.sock"), other.path().join("state"));
    let log = other.path().join("b.log");
    let outcome = second_daemon_outcome(
        &socket,
        &state_dir,
        &home.cgroup_parent,
        &log,
        Duration::from_secs(30),
    );
    let said = std::fs::read_to_string(&log).unwrap_or_default();

    // The first daemon's sandbox, and the command in it, live on.
    let answer = c
        .exec_collect(
            &id,
            &ExecRequest::new(["sh", "-c", "ps -o args | grep -q '^[s]leep 1000'"]),
        )
        .await;
    let sleep_runs = answer.as_ref().is_ok_and(|out| out.result.exit_code == 0);
    let agent_lives = agent_pid(&home.cgroup_parent, &id) == Some(agent);
    assert!(
        matches!(outcome, Some(status) if !status.success()) && sleep_runs && agent_lives,
        "the second daemon must refuse and the first's sandbox live on: the second daemon \
         {outcome:?} (None: it started), the sandbox's command {answer:?}, its agent {agent} \
         alive: {agent_lives}; the second daemon said: {said}"
    );
    assert!(
        said.contains(&home.cgroup_parent),
        "names the parent: {said}"
    );
    assert!(
        said.contains(&format!("pid {}", first.pid())),
        "names the daemon holding it: {said}"
    );
    assert!(
        said.contains(&home.state_dir().display().to_string()),
        "and its state directory: {said}"
    );
    assert!(!said.contains("cleaned up"), "it cleaned nothing: {said}");
    // Refused before anything was made: no socket, no state or data directory.
    assert!(!socket.exists(), "no socket was bound");
    assert!(!state_dir.exists(), "no state directory was made");
    assert!(!state_dir.with_extension("data").exists());

    // The holder gone, the parent is free: a daemon starts on it.
    assert!(first.stop_with(Signal::SIGTERM).success());
    drop(sleeping);
    let again = DaemonProcess::start_in(&home, &[]).await;
    let c = again.client();
    let fresh = c
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let out = c
        .exec_collect(&fresh, &ExecRequest::new(["echo", "ok"]))
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"ok\n");
}
