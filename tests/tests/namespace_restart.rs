//! Restarting the daemon with sandboxes running. The choice (docs/sandbox-namespace.md,
//! "Daemon restarts"): sandboxes are never re-adopted. They die with the daemon that made them
//! (their supervisors are tied to it), and the next daemon on the same state directory and
//! cgroup parent removes whatever is left before it listens; their ids are unknown to it (404).

use std::time::Duration;

use api_types::CreateSandbox;
use client::ExecEvent;
use harness::leaks::{
    agent_pid, assert_a_new_sandbox_works, assert_nothing_held, eventually, parent_cgroups,
    sandbox_cgroups, Footprint,
};
use harness::process::{DaemonHome, DaemonProcess};
use nix::sys::signal::Signal;
use wire::ExecRequest;

/// Starts a daemon in `home` with two sandboxes, one streaming a command, and returns them.
async fn daemon_with_work(home: &DaemonHome) -> (DaemonProcess, Vec<String>, client::ExecStream) {
    let daemon = DaemonProcess::start_in(home, &[]).await;
    let c = daemon.client();
    let mut ids = Vec::new();
    ids.push(
        c.create(&CreateSandbox::default())
            .await
            .expect("create")
            .id,
    );
    // The second holds a disk-backed layer and a cache: both must survive a daemon's death
    // correctly (the layer removed, the cache kept, neither left attached).
    let storage = c.create(&with_storage()).await.expect("create").id;
    let written = c
        .exec_collect(
            &storage,
            &ExecRequest::new([
                "sh",
                "-c",
                "echo kept > /cache/file && echo scratch > /root/f",
            ]),
        )
        .await
        .expect("exec");
    assert_eq!(written.result.exit_code, 0);
    ids.push(storage);
    let mut stream = c
        .exec(
            &ids[0],
            &ExecRequest::new(["sh", "-c", "echo started; sleep 1000"]),
        )
        .await
        .expect("exec");
    match stream.next_event().await {
        Some(Ok(ExecEvent::Stdout(b))) => assert_eq!(&b[..], b"started\n"),
        other => panic!("expected output first, got {other:?}"),
    }
    for id in &ids {
        assert!(agent_pid(&home.cgroup_parent, id).is_some(), "{id} runs");
    }
    (daemon, ids, stream)
}

fn with_storage() -> CreateSandbox {
    CreateSandbox {
        disk_mib: Some(64),
        caches: vec![api_types::CacheMount {
            name: "restart".into(),
            path: "/cache".into(),
            size_mib: Some(16),
            save: true,
        }],
        ..CreateSandbox::default()
    }
}

/// A new daemon in `home` holds nothing of the old one's sandboxes, does not know them, and
/// works; stopped, it leaves nothing at all behind.
async fn restart_finds_a_clean_slate(home: &DaemonHome, old_ids: &[String]) {
    let data_dir = home.state_dir().with_extension("data");
    eventually("the old sandboxes' loop devices to detach", || {
        harness::loops_backed_under(&data_dir).is_empty()
    })
    .await;
    let daemon = DaemonProcess::start_in(home, &[]).await;
    assert_nothing_held(&home.state_dir(), &home.cgroup_parent).await;
    let layers: Vec<_> = std::fs::read_dir(data_dir.join("scratch"))
        .expect("the scratch directory")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(layers.is_empty(), "disk-backed layers left: {layers:?}");
    let c = daemon.client();
    let caches = c.caches().await.expect("caches");
    assert_eq!(caches.len(), 1, "the cache outlives the daemon: {caches:?}");
    assert_eq!(caches[0].in_use_by, None);
    let again = c.create(&with_storage()).await.expect("the cache again").id;
    let read = c
        .exec_collect(
            &again,
            &ExecRequest::new(["sh", "-c", "cat /cache/file; ls /root"]),
        )
        .await
        .expect("exec");
    assert_eq!(String::from_utf8_lossy(&read.stdout), "kept\n");
    c.delete(&again).await.expect("delete");
    for id in old_ids {
        match c.get(id).await {
            Err(client::ClientError::Api { status: 404, .. }) => {}
            other => panic!("an old sandbox id answers 404, got {other:?}"),
        }
    }
    assert!(c.list().await.expect("list").is_empty());
    assert_a_new_sandbox_works(&c).await;

    let mut daemon = daemon;
    assert!(daemon.stop_with(Signal::SIGTERM).success());
    assert_nothing_held(&home.state_dir(), &home.cgroup_parent).await;
    assert!(
        parent_cgroups(&home.cgroup_parent).is_empty(),
        "{:?}",
        parent_cgroups(&home.cgroup_parent)
    );
    assert!(!home.socket().exists(), "the socket was removed");
}

#[tokio::test]
async fn a_killed_daemon_takes_its_sandboxes_with_it_and_the_next_one_cleans_up() {
    let home = DaemonHome::new();
    let (mut daemon, ids, mut stream) = daemon_with_work(&home).await;
    daemon.stop_with(Signal::SIGKILL);

    // The client sees the stream break: no exit frame can come from a dead daemon.
    let event = tokio::time::timeout(Duration::from_secs(30), stream.next_event())
        .await
        .expect("the stream ends");
    assert!(
        matches!(event, Some(Err(_)) | None),
        "expected a broken stream, got {event:?}"
    );
    // Every sandbox process dies with the daemon (no daemon is needed for that) ...
    let state_dir = home.state_dir();
    eventually("the sandboxes' processes to die with the daemon", || {
        let footprint = Footprint::of(&state_dir, &home.cgroup_parent);
        footprint.processes.is_empty() && footprint.sandbox_processes.is_empty()
    })
    .await;
    // ... leaving cgroups, runtime directories and the socket file for the next daemon.
    let left = Footprint::of(&state_dir, &home.cgroup_parent);
    eprintln!("left by the killed daemon: {left:?}");
    assert!(!sandbox_cgroups(&home.cgroup_parent).is_empty());
    assert!(home.socket().exists());
    assert!(
        left.mounts.is_empty(),
        "sandbox mounts live in their own namespaces"
    );

    restart_finds_a_clean_slate(&home, &ids).await;
}

#[tokio::test]
async fn a_stopped_daemon_ends_running_execs_deletes_its_sandboxes_and_the_next_starts_clean() {
    let home = DaemonHome::new();
    let (mut daemon, ids, mut stream) = daemon_with_work(&home).await;
    let status = daemon.stop_with(Signal::SIGTERM);
    assert!(status.success(), "{status:?}");

    // The running command was ended with its sandbox: the client gets an exit frame saying so.
    let event = tokio::time::timeout(Duration::from_secs(30), stream.next_event())
        .await
        .expect("the stream ends");
    match event {
        Some(Ok(ExecEvent::Exit(result))) => {
            assert_eq!(result.exit_code, -1, "{result:?}");
            assert!(result.error.contains(&ids[0]), "{}", result.error);
        }
        other => panic!("expected a synthesized exit frame, got {other:?}"),
    }
    assert_nothing_held(&home.state_dir(), &home.cgroup_parent).await;
    assert!(parent_cgroups(&home.cgroup_parent).is_empty());
    assert!(!home.socket().exists(), "the socket was removed");

    restart_finds_a_clean_slate(&home, &ids).await;
}

#[tokio::test]
async fn leftovers_still_running_when_a_daemon_starts_are_killed_and_removed() {
    // What a daemon that died without taking its sandboxes along would leave: a sandbox cgroup
    // in every controller with a live process in it, a runtime directory with a socket, a log.
    let home = DaemonHome::new();
    let id = "sb-00000000deadbeef";
    let mut survivor = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .expect("spawn");
    for controller in ["memory", "pids", "cpu"] {
        let dir = std::path::Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(&home.cgroup_parent)
            .join(id);
        std::fs::create_dir_all(&dir).expect("cgroup");
        std::fs::write(dir.join("cgroup.procs"), survivor.id().to_string()).expect("join");
    }
    let runtime_dir = home.state_dir().join("sandboxes").join(id);
    std::fs::create_dir_all(&runtime_dir).expect("runtime dir");
    let _socket =
        std::os::unix::net::UnixListener::bind(runtime_dir.join("agent.sock")).expect("socket");
    std::fs::create_dir_all(home.state_dir().join("logs")).expect("logs");
    std::fs::write(home.state_dir().join("logs").join(format!("{id}.log")), "").expect("log");
    assert!(!Footprint::of(&home.state_dir(), &home.cgroup_parent).is_empty());

    let daemon = DaemonProcess::start_in(&home, &[]).await;
    // Cleaned before the daemon listened, so before its first answer.
    let left = Footprint::of(&home.state_dir(), &home.cgroup_parent);
    assert!(left.is_empty(), "{left:?}");
    let status = survivor.wait().expect("wait");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the leftover process was SIGKILLed: {status:?}"
    );
    match daemon.client().get(id).await {
        Err(client::ClientError::Api { status: 404, .. }) => {}
        other => panic!("a leftover sandbox is unknown to the new daemon, got {other:?}"),
    }
    drop(daemon);
    assert_nothing_held(&home.state_dir(), &home.cgroup_parent).await;
    assert!(parent_cgroups(&home.cgroup_parent).is_empty());
}
