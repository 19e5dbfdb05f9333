//! Faults and resource hygiene on the namespace backend: dying sandboxes, vanishing clients,
//! expiry, shutdown, and no leaks after many execs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use client::ExecEvent;
use harness::TestDaemon;
use wire::{CreateSandbox, ExecRequest, SandboxState};

fn memory_cgroup(daemon: &TestDaemon, id: &str) -> PathBuf {
    PathBuf::from("/sys/fs/cgroup/memory")
        .join(daemon.cgroup_parent())
        .join(id)
}

fn pids_in(cgroup: &std::path::Path) -> Vec<i32> {
    std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Waits (bounded) for `condition`, polling: only tests poll, never the product.
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn killing_the_sandbox_mid_exec_ends_the_stream_with_a_synthesized_exit_frame() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = daemon.sandbox().await;
    let mut stream = c
        .exec(
            &id,
            &ExecRequest::new(["sh", "-c", "echo started; sleep 1000"]),
        )
        .await
        .expect("exec");
    match stream.next_event().await {
        Some(Ok(ExecEvent::Stdout(b))) => assert_eq!(&b[..], b"started\n"),
        other => panic!("expected output first, got {other:?}"),
    }
    let cgroup = memory_cgroup(&daemon, &id);
    for pid in pids_in(&cgroup) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    match stream.next_event().await {
        Some(Ok(ExecEvent::Exit(result))) => {
            assert_eq!(result.exit_code, -1);
            assert!(result.error.contains(&id), "{}", result.error);
        }
        other => panic!("expected a synthesized exit frame, got {other:?}"),
    }
    assert!(
        stream.next_event().await.is_none(),
        "nothing after the exit frame"
    );

    let mut state = SandboxState::Running;
    for _ in 0..500 {
        state = c.get(&id).await.expect("still listed").state;
        if state == SandboxState::Dead {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(state, SandboxState::Dead);
    let info = c.get(&id).await.expect("get");
    assert!(!info.error.is_empty());
    match c.exec_collect(&id, &ExecRequest::new(["true"])).await {
        Err(client::ClientError::Api { status: 409, .. }) => {}
        other => panic!("a dead sandbox refuses execs with 409, got {other:?}"),
    }
    eventually("the dead sandbox's cgroup to be removed", || {
        !cgroup.exists()
    })
    .await;

    let fresh = c
        .create(&CreateSandbox::default())
        .await
        .expect("a new sandbox works")
        .id;
    let out = c
        .exec_collect(&fresh, &ExecRequest::new(["echo", "ok"]))
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"ok\n");
    c.delete(&id).await.expect("deleting the dead one");
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_kills_the_command() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = daemon.sandbox().await;
    let cgroup = memory_cgroup(&daemon, &id);
    let before = pids_in(&cgroup).len();
    let mut stream = c
        .exec(
            &id,
            &ExecRequest::new(["sh", "-c", "echo started; exec sleep 1000"]),
        )
        .await
        .expect("exec");
    assert!(matches!(
        stream.next_event().await,
        Some(Ok(ExecEvent::Stdout(_)))
    ));
    assert!(pids_in(&cgroup).len() > before, "the command runs");
    drop(stream);
    eventually("the command to be killed", || {
        pids_in(&cgroup).len() == before
    })
    .await;
}

#[tokio::test]
async fn ttl_and_idle_timeout_delete_sandboxes() {
    let daemon = TestDaemon::start_with(|c| c.limits.idle_timeout_s = 2);
    let c = daemon.client();
    let short = c
        .create(&CreateSandbox {
            ttl_s: Some(1),
            ..Default::default()
        })
        .await
        .expect("create")
        .id;
    let idle = daemon.sandbox().await;
    let start = Instant::now();
    loop {
        let remaining: Vec<String> = c
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|s| s.id)
            .collect();
        if !remaining.contains(&short) && !remaining.contains(&idle) {
            break;
        }
        if start.elapsed() < Duration::from_millis(900) {
            assert!(remaining.contains(&short), "deleted before its TTL");
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still there: {remaining:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!memory_cgroup(&daemon, &short).exists());
}

#[tokio::test]
async fn shutdown_deletes_every_sandbox_and_leaves_nothing_behind() {
    let daemon = TestDaemon::start();
    let mut cgroups = Vec::new();
    let mut pids = Vec::new();
    for _ in 0..2 {
        let id = daemon.sandbox().await;
        let cgroup = memory_cgroup(&daemon, &id);
        pids.extend(pids_in(&cgroup));
        cgroups.push(cgroup);
    }
    let parent = PathBuf::from("/sys/fs/cgroup/memory").join(daemon.cgroup_parent());
    let state_dir = daemon.state.config.state_dir.clone();
    let socket = daemon.socket.clone();
    daemon.stop();
    for cgroup in &cgroups {
        assert!(!cgroup.exists(), "{} left behind", cgroup.display());
    }
    assert!(!parent.exists(), "{} left behind", parent.display());
    for pid in pids {
        assert!(
            !PathBuf::from(format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "process {pid} survived the shutdown"
        );
    }
    let leftovers: Vec<_> = std::fs::read_dir(state_dir.join("sandboxes"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(!socket.exists(), "the socket was removed");
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

/// The daemon in its own process, so that its fds and memory are measured alone.
struct DaemonProcess {
    child: std::process::Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl DaemonProcess {
    async fn start() -> Self {
        harness::require_root();
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("d.sock");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_crucible-test-daemon"))
            .arg(&socket)
            .arg(dir.path().join("state"))
            .arg(format!("crucible-test-proc-{}", std::process::id()))
            .env("CRUCIBLE_LOG", "warn")
            .spawn()
            .expect("start the daemon");
        let daemon = DaemonProcess {
            child,
            socket,
            _dir: dir,
        };
        let path = daemon.socket.clone();
        eventually("the daemon's socket", || path.exists()).await;
        daemon
    }

    fn client(&self) -> client::Client {
        client::Client::new(client::Endpoint::Unix(self.socket.clone()))
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fds_and_memory_return_to_their_level_after_1000_sequential_and_100_concurrent_execs() {
    let daemon = DaemonProcess::start().await;
    let pid = daemon.child.id();
    let c = daemon.client();
    let id = c
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let request = ExecRequest::new(["echo", "x"]);
    let round = |sequential: usize| {
        let c = c.clone();
        let id = id.clone();
        let request = request.clone();
        async move {
            for _ in 0..sequential {
                let out = c.exec_collect(&id, &request).await.expect("exec");
                assert_eq!(out.stdout, b"x\n");
            }
            let concurrent = (0..100).map(|_| {
                let c = c.clone();
                let id = id.clone();
                let request = request.clone();
                tokio::spawn(async move { c.exec_collect(&id, &request).await })
            });
            for result in futures_util::future::join_all(concurrent).await {
                let out = result.expect("task").expect("exec");
                assert_eq!(out.result.exit_code, 0);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    // A warm-up round grows the allocator's caches to their working size; after it, a leak
    // shows as growth.
    round(1000).await;
    let (fds_before, rss_before) = (open_fds(pid), rss_kib(pid));
    round(1000).await;
    let (fds_after, rss_after) = (open_fds(pid), rss_kib(pid));
    eprintln!("daemon: fds {fds_before} -> {fds_after}, RSS {rss_before} -> {rss_after} KiB");
    assert!(
        fds_after <= fds_before,
        "file descriptors grew from {fds_before} to {fds_after}"
    );
    // Measured here: sequential execs leave RSS flat to the page; bursts of 100 concurrent
    // execs move it by up to about 2 MiB (allocator fragmentation). A leak of 3 KiB per exec
    // would add 3.3 MiB over this round.
    assert!(
        rss_after <= rss_before + 3072,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    let info = c.get(&id).await.expect("get");
    assert_eq!(info.active_execs, 0);
}
