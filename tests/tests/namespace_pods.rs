//! Sandboxes with containers on the namespace backend, end to end through the daemon: services
//! reached on `localhost` from the sandbox's own root, shared scratch directories, exec, files
//! and logs addressed to a container, readiness and restarts, and the boundary a pod keeps
//! toward the host.

use std::time::Duration;

use api_types::{ContainerInfo, ContainerState, CreateSandbox};
use client::ClientError;
use harness::{sh, TestDaemon};
use wire::{Decoder, Direction, ExecRequest, ExecResult, FrameType};

/// A sandbox request from JSON, as an API user writes it.
fn request(json: serde_json::Value) -> CreateSandbox {
    serde_json::from_value(json).expect("a valid create request")
}

/// A database-like service on loopback port 5432, a helper that writes into the shared `work`
/// directory once the service is ready, and the sandbox's own root with `work` at `/work`.
fn pod() -> CreateSandbox {
    request(serde_json::json!({
        "shared": [{"name": "work", "path": "/work"}],
        "containers": [
            {"name": "db",
             "command": ["/bin/sh", "-c",
                         "echo db starting; while true; do echo hello-from-db | nc -l -p 5432; done"],
             "ready": {"tcp_port": 5432},
             "shared": [{"name": "work", "path": "/data"}]},
            {"name": "helper",
             "command": ["/bin/sh", "-c", "echo written-by-helper > /data/note; echo helper done"],
             "depends_on": ["db"],
             "shared": [{"name": "work", "path": "/data"}]}
        ]
    }))
}

async fn containers(c: &client::Client, id: &str) -> Vec<ContainerInfo> {
    c.containers(id).await.expect("listing containers")
}

/// Waits until container `name` has exited (its main process ended for good).
async fn until_exited(c: &client::Client, id: &str, name: &str) -> ContainerInfo {
    for _ in 0..200 {
        let info = containers(c, id)
            .await
            .into_iter()
            .find(|info| info.name == name)
            .expect("the container is listed");
        if info.state == ContainerState::Exited {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("container {name} did not exit within 10 s");
}

/// Runs `sh -c script` in container `container`: stdout, stderr, exit code.
async fn sh_in(
    c: &client::Client,
    id: &str,
    container: &str,
    script: &str,
) -> (String, String, i32) {
    let out = c
        .exec_in(id, container, &ExecRequest::new(["sh", "-c", script]))
        .await
        .expect("exec in a container")
        .collect()
        .await
        .expect("its output");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.result.exit_code,
    )
}

/// A container's log: its output, and its exit result when it has exited.
async fn log(c: &client::Client, id: &str, name: &str) -> (String, Option<ExecResult>) {
    let bytes = c.container_logs(id, name).await.expect("the log");
    let mut decoder = Decoder::new(Direction::GuestToHost);
    decoder.push(&bytes);
    let (mut text, mut exit) = (Vec::new(), None);
    while let Some(frame) = decoder.next_frame().expect("the log is a frame stream") {
        match frame.frame_type {
            FrameType::Exit => exit = Some(serde_json::from_slice(frame.payload).expect("exit")),
            _ => text.extend_from_slice(frame.payload),
        }
    }
    assert_eq!(decoder.buffered(), 0, "the log ends on a whole frame");
    (String::from_utf8_lossy(&text).into_owned(), exit)
}

/// One raw HTTP/1.1 GET on the daemon's socket: the whole answer.
async fn raw_get(daemon: &TestDaemon, target: &str) -> String {
    let request = format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    harness::raw_exchange(daemon, request.as_bytes()).await
}

fn api_code(error: ClientError) -> (u16, String, String) {
    match error {
        ClientError::Api {
            status,
            code,
            message,
        } => (status, code, message),
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test]
async fn services_are_reached_on_localhost_share_scratch_and_keep_their_logs() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let created = c.create(&pod()).await.expect("create");
    let id = created.id;
    let names: Vec<_> = created.containers.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["db", "helper"]);
    let db = &created.containers[0];
    assert_eq!(db.state, ContainerState::Ready, "{db:?}");
    assert_eq!(db.exec_id.as_deref(), Some("main"));

    // The job, in the sandbox's own root, reaches the service by name and reads what the
    // helper left in the shared directory.
    let helper = until_exited(&c, &id, "helper").await;
    assert_eq!(helper.exit_code, Some(0), "{helper:?}");
    let (out, err, code) = sh(&c, &id, "nc -w 2 localhost 5432 </dev/null; cat /work/note").await;
    assert_eq!(
        (out.as_str(), code),
        ("hello-from-db\nwritten-by-helper\n", 0),
        "{err}"
    );

    // Exec in a container runs under its agent, in its root, with the shared directory at
    // its own path.
    let (out, err, code) = sh_in(
        &c,
        &id,
        "db",
        "cat /proc/1/cmdline | tr '\\0' ' '; cat /data/note",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("init sandbox-container"), "{out}");
    assert!(out.ends_with("written-by-helper\n"), "{out}");
    // `main` names the sandbox's own root, where /work is.
    let (out, _, code) = sh_in(&c, &id, "main", "cat /work/note").await;
    assert_eq!((out.as_str(), code), ("written-by-helper\n", 0));

    // Files addressed to a container come from its root.
    let answer = raw_get(
        &daemon,
        &format!("/sandboxes/{id}/files?path=/data/note&container=db"),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("written-by-helper\n"), "{answer}");
    let answer = raw_get(&daemon, &format!("/sandboxes/{id}/files?path=/data/note")).await;
    assert!(
        answer.starts_with("HTTP/1.1 404"),
        "the main root has no /data: {answer}"
    );

    // Logs: a running service's so far (no exit frame), an exited one's with its exit.
    let (text, exit) = log(&c, &id, "db").await;
    assert_eq!((text.as_str(), exit), ("db starting\n", None));
    let (text, exit) = log(&c, &id, "helper").await;
    assert_eq!(text, "helper done\n");
    assert_eq!(exit.map(|e| e.exit_code), Some(0));

    // Unknown containers are 404s that name them.
    let (status, code, message) = api_code(
        c.exec_in(&id, "nope", &ExecRequest::new(["true"]))
            .await
            .expect_err("no such container"),
    );
    assert_eq!((status, code.as_str()), (404, "container_not_found"));
    assert!(message.contains("\"nope\""), "{message}");
    let (status, code, _) = api_code(c.container_logs(&id, "nope").await.expect_err("no logs"));
    assert_eq!((status, code.as_str()), (404, "container_not_found"));

    // The sandbox's own signal reaches its own processes and spares the containers'.
    let sleeper = harness::spawn_exec(&c, &id, &["sleep", "300"]);
    harness::wait_for_process(&c, &id, "sleep 300").await;
    c.signal(&id, 9).await.expect("signal the sandbox");
    let killed = tokio::time::timeout(Duration::from_secs(10), sleeper)
        .await
        .expect("the sleeper ends")
        .expect("its task");
    assert_eq!(killed.result.signal, "SIGKILL", "{:?}", killed.result);
    let (out, _, code) = sh(&c, &id, "nc -w 2 localhost 5432 </dev/null").await;
    assert_eq!(
        (out.as_str(), code),
        ("hello-from-db\n", 0),
        "the service outlived it"
    );
    let db = &containers(&c, &id).await[0];
    assert_eq!(
        (db.state, db.restarts),
        (ContainerState::Ready, 0),
        "{db:?}"
    );

    c.delete(&id).await.expect("delete");
    harness::leaks::assert_nothing_held(&daemon.state.config.state_dir, daemon.cgroup_parent())
        .await;
}

#[tokio::test]
async fn a_failing_service_restarts_and_one_that_never_gets_ready_fails_the_create() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let flaky = request(serde_json::json!({
        "containers": [{"name": "flaky", "restart": "on-failure",
                        "command": ["/bin/sh", "-c", "echo attempt; exit 7"]}]
    }));
    let id = c.create(&flaky).await.expect("create").id;
    let mut restarted = None;
    for _ in 0..100 {
        let info = containers(&c, &id).await.remove(0);
        if info.restarts >= 2 {
            restarted = Some(info);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let info = restarted.expect("restarted twice within 10 s");
    assert_eq!(info.exit_code, Some(7), "{info:?}");
    let (text, _) = log(&c, &id, "flaky").await;
    assert!(text.matches("attempt\n").count() >= 2, "{text:?}");
    c.delete(&id).await.expect("delete");

    // A service whose port never opens fails the create with the end of its log, and leaves
    // no sandbox behind.
    let deaf = request(serde_json::json!({
        "containers": [{"name": "deaf", "ready": {"tcp_port": 6000, "timeout_s": 2},
                        "command": ["/bin/sh", "-c", "echo never listening; sleep 300"]}]
    }));
    let (status, code, message) = api_code(c.create(&deaf).await.expect_err("not ready"));
    assert_eq!(
        (status, code.as_str()),
        (422, "container_not_ready"),
        "{message}"
    );
    assert!(message.contains("container deaf"), "{message}");
    assert!(message.contains("within 2 s"), "{message}");
    assert!(message.contains("never listening"), "{message}");
    // One that exits before it is ready says how it exited.
    let quitter = request(serde_json::json!({
        "containers": [{"name": "quitter", "ready": {"command": ["false"]},
                        "command": ["/bin/sh", "-c", "echo giving up >&2; exit 3"]}]
    }));
    let (status, _, message) = api_code(c.create(&quitter).await.expect_err("exited"));
    assert_eq!(status, 422, "{message}");
    assert!(message.contains("exited with 3"), "{message}");
    assert!(message.contains("giving up"), "{message}");
    assert!(
        c.list().await.expect("list").is_empty(),
        "failed creates leave nothing"
    );
    harness::leaks::assert_nothing_held(&daemon.state.config.state_dir, daemon.cgroup_parent())
        .await;

    // Requests that cannot be met are 400s before anything starts.
    for (bad, says) in [
        (
            serde_json::json!({"containers": [{"name": "a", "depends_on": ["b"]}]}),
            "\"b\"",
        ),
        (
            serde_json::json!({"containers": [{"name": "a", "depends_on": ["b"]},
                                              {"name": "b", "depends_on": ["a"]}]}),
            "circle",
        ),
        (
            serde_json::json!({"containers": [{"name": "main"}]}),
            "main",
        ),
        (
            serde_json::json!({"containers": [{"name": "a", "shared": [{"name": "../x", "path": "/x"}]}]}),
            "shared[0]",
        ),
    ] {
        let (status, _, message) =
            api_code(c.create(&request(bad.clone())).await.expect_err("bad"));
        assert_eq!(status, 400, "{bad}: {message}");
        assert!(message.contains(says), "{bad}: {message}");
    }
}

#[tokio::test]
async fn a_container_reaches_neither_the_host_image_nor_host_paths() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let image_passwd = harness::image_dir().join("rootfs/etc/passwd");
    let before = std::fs::read(&image_passwd).expect("the image's passwd");
    let id = c.create(&pod()).await.expect("create").id;

    // Root in a container rewrites its image's files; the image on the host is untouched and
    // the other roots see none of it.
    let (_, err, code) = sh_in(
        &c,
        &id,
        "db",
        "echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd && touch /pwned-by-db",
    )
    .await;
    assert_eq!(code, 0, "a container's root is its own to change: {err}");
    assert_eq!(std::fs::read(&image_passwd).expect("passwd"), before);
    assert!(!harness::image_dir().join("rootfs/pwned-by-db").exists());
    let (out, _, _) = sh(&c, &id, "grep -c evil /etc/passwd; ls /pwned-by-db 2>&1").await;
    assert!(
        out.starts_with("0\n") && out.contains("No such file"),
        "{out}"
    );

    // No mount of any root names a host path: the daemon's directories and the image's.
    let host_paths = [
        daemon.state.config.state_dir.display().to_string(),
        harness::image_dir().display().to_string(),
        "/tmp/crucible-test".to_string(),
    ];
    for container in ["db", "helper", "main"] {
        let (table, err, code) = sh_in(&c, &id, container, "cat /proc/self/mountinfo").await;
        assert_eq!(code, 0, "{container}: {err}");
        for path in &host_paths {
            assert!(
                !table.contains(path.as_str()),
                "{container} sees {path}:\n{table}"
            );
        }
    }
    // A container sees only its own processes: its agent and what runs under it.
    let (out, _, _) = sh_in(&c, &id, "db", "ps -o comm | sort -u | tr '\\n' ' '").await;
    assert!(!out.contains("sleep"), "{out}");
    let (out, _, code) = sh_in(&c, &id, "db", "kill -9 1; echo survived").await;
    assert_eq!(
        (out.as_str(), code),
        ("survived\n", 0),
        "its agent ignores the kill"
    );

    c.delete(&id).await.expect("delete");
}

/// Every process a root of the sandbox sees, one line each: `PID COMMAND LINE`.
const PROCESSES: &str =
    "for p in /proc/[0-9]*; do echo \"${p#/proc/} $(tr '\\0' ' ' < $p/cmdline)\"; done";

#[tokio::test]
async fn pod_members_see_none_of_each_others_processes_roots_or_environments() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = c
        .create(&request(serde_json::json!({
            "containers": [
                {"name": "db",
                 "env": {"DB_PASSWORD": "s3cret-of-db"},
                 "command": ["/bin/sh", "-c",
                             "echo db-secret-file > /tmp/dbsecret; exec sleep 1001"]},
                {"name": "cache", "command": ["sleep", "1002"]}
            ]
        })))
        .await
        .expect("create")
        .id;
    let (_, err, code) = sh(
        &c,
        &id,
        "sleep 1003 </dev/null >/dev/null 2>&1 & echo main-secret > /tmp/mainsecret",
    )
    .await;
    assert_eq!(code, 0, "{err}");

    // From the job (`main`): no service's process, agent, environment or root.
    let (seen, _, _) = sh(&c, &id, PROCESSES).await;
    for other in [
        "sleep 1001",
        "sleep 1002",
        "sandbox-container",
        "pod-factory",
    ] {
        assert!(!seen.contains(other), "main sees {other:?}:\n{seen}");
    }
    assert!(seen.contains("sleep 1003"), "main sees its own:\n{seen}");
    let (out, _, _) = sh(
        &c,
        &id,
        "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c s3cret-of-db; \
         cat /proc/[0-9]*/root/tmp/dbsecret 2>/dev/null; true",
    )
    .await;
    assert_eq!(out, "0\n", "main read the service's environment or root");

    // From a service: neither the job's processes nor another service's.
    for (name, own, others) in [
        ("db", "sleep 1001", ["sleep 1002", "sleep 1003"]),
        ("cache", "sleep 1002", ["sleep 1001", "sleep 1003"]),
    ] {
        let (seen, err, code) = sh_in(&c, &id, name, PROCESSES).await;
        assert_eq!(code, 0, "{name}: {err}");
        assert!(seen.contains(own), "{name} sees its own:\n{seen}");
        for other in others.iter().chain(&["sandbox-pid1", "pod-factory"]) {
            assert!(!seen.contains(other), "{name} sees {other:?}:\n{seen}");
        }
        let (out, _, _) = sh_in(
            &c,
            &id,
            name,
            "cat /proc/[0-9]*/root/tmp/mainsecret 2>/dev/null; true",
        )
        .await;
        assert_eq!(out, "", "{name} read main's root");
    }
    c.delete(&id).await.expect("delete");
}

#[tokio::test]
async fn a_sandbox_and_its_containers_take_the_hostname_asked_for() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let info = c
        .create(&request(serde_json::json!({
            "hostname": "build-7.ci",
            "containers": [{"name": "db", "command": ["sleep", "100"]}]
        })))
        .await
        .expect("create");
    assert_eq!(info.hostname.as_deref(), Some("build-7.ci"));
    for member in ["main", "db"] {
        let (out, err, code) = sh_in(&c, &info.id, member, "hostname; echo $HOSTNAME").await;
        assert_eq!(
            (out.as_str(), code),
            ("build-7.ci\nbuild-7.ci\n", 0),
            "{member}: {err}"
        );
    }
    c.delete(&info.id).await.expect("delete");
    for bad in ["bad_name", "-x", "a..b", &"h".repeat(65)] {
        let e = c
            .create(&request(serde_json::json!({ "hostname": bad })))
            .await
            .expect_err(bad);
        let (status, code, message) = api_code(e);
        assert_eq!(
            (status, code.as_str()),
            (400, "invalid_request"),
            "{bad}: {message}"
        );
        assert!(message.starts_with("hostname: "), "{bad}: {message}");
    }
}

/// Whether `seen` (a [`PROCESSES`] listing) has a process whose command line holds `what`.
fn lists(seen: &str, what: &str) -> bool {
    seen.lines().any(|line| line.contains(what))
}

#[tokio::test]
async fn a_pod_sharing_its_pid_namespace_sees_every_member_and_signals_its_own() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let info = c
        .create(&request(serde_json::json!({
            "share_process_namespace": true,
            "containers": [
                {"name": "db",
                 "env": {"DB_PASSWORD": "s3cret-of-db"},
                 "command": ["sleep", "1001"]},
                {"name": "cache", "command": ["sleep", "1002"]}
            ]
        })))
        .await
        .expect("create");
    assert!(info.share_process_namespace, "{info:?}");
    let id = info.id;
    // Added once it runs: made by the factory, which must put it in the same namespace.
    c.add_container(
        &id,
        &container(serde_json::json!({
        "name": "late", "command": ["sleep", "1004"]})),
    )
    .await
    .expect("add a container");
    let (_, err, code) = sh(&c, &id, "sleep 1003 </dev/null >/dev/null 2>&1 &").await;
    assert_eq!(code, 0, "{err}");

    // Every member sees every member's processes, with the sandbox's agent as PID 1 and the
    // factory still out of sight.
    for member in ["main", "db", "cache", "late"] {
        let (seen, err, code) = sh_in(&c, &id, member, PROCESSES).await;
        assert_eq!(code, 0, "{member}: {err}");
        for sleeper in ["sleep 1001", "sleep 1002", "sleep 1003", "sleep 1004"] {
            assert!(
                lists(&seen, sleeper),
                "{member} misses {sleeper:?}:\n{seen}"
            );
        }
        assert!(
            seen.lines()
                .any(|l| l.starts_with("1 ") && l.contains("sandbox-pid1")),
            "{member}: PID 1 is not the sandbox's agent:\n{seen}"
        );
        assert!(
            !lists(&seen, "pod-factory"),
            "{member} sees the factory:\n{seen}"
        );
    }
    let (out, _, _) = sh(
        &c,
        &id,
        "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c s3cret-of-db",
    )
    .await;
    assert_ne!(out.trim(), "0", "main cannot read db's environment");

    // A member's signal reaches its own processes alone; its agent and the others' stay.
    c.signal_in(
        &id,
        Some("cache"),
        api_types::SignalRequest {
            signal: 9,
            exec_id: None,
        },
    )
    .await
    .expect("signal cache");
    c.signal(&id, 9).await.expect("signal the sandbox");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (seen, err, code) = sh_in(&c, &id, "db", PROCESSES).await;
    assert_eq!(code, 0, "db's agent answers after both signals: {err}");
    for (sleeper, alive) in [
        ("sleep 1001", true),
        ("sleep 1004", true),
        ("sleep 1003", false),
    ] {
        assert_eq!(lists(&seen, sleeper), alive, "{sleeper}:\n{seen}");
    }
    for member in ["main", "cache", "late"] {
        let (out, err, code) = sh_in(&c, &id, member, "echo alive").await;
        assert_eq!(
            (out.as_str(), code),
            ("alive\n", 0),
            "{member}'s agent: {err}"
        );
    }
    c.delete(&id).await.expect("delete");
}

#[tokio::test]
async fn a_container_that_joins_mains_pid_namespace_sees_main_and_no_other() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = c
        .create(&request(serde_json::json!({
            "containers": [
                {"name": "joined", "share_process_namespace": true,
                 "command": ["sleep", "1011"]},
                {"name": "apart", "command": ["sleep", "1012"]}
            ]
        })))
        .await
        .expect("create")
        .id;
    c.add_container(
        &id,
        &container(serde_json::json!({
            "name": "late", "share_process_namespace": true, "command": ["sleep", "1014"]})),
    )
    .await
    .expect("add a container that joins");
    let (_, err, code) = sh(&c, &id, "sleep 1013 </dev/null >/dev/null 2>&1 &").await;
    assert_eq!(code, 0, "{err}");
    let together = ["sleep 1011", "sleep 1013", "sleep 1014"];
    for member in ["main", "joined", "late"] {
        let (seen, err, code) = sh_in(&c, &id, member, PROCESSES).await;
        assert_eq!(code, 0, "{member}: {err}");
        for sleeper in together {
            assert!(
                lists(&seen, sleeper),
                "{member} misses {sleeper:?}:\n{seen}"
            );
        }
        assert!(
            !lists(&seen, "sleep 1012"),
            "{member} sees apart's:\n{seen}"
        );
    }
    let (seen, err, code) = sh_in(&c, &id, "apart", PROCESSES).await;
    assert_eq!(code, 0, "apart: {err}");
    assert!(lists(&seen, "sleep 1012"), "apart sees its own:\n{seen}");
    for other in together {
        assert!(!lists(&seen, other), "apart sees {other:?}:\n{seen}");
    }
    // A signal to the joined container ends its processes only.
    c.signal_in(
        &id,
        Some("late"),
        api_types::SignalRequest {
            signal: 9,
            exec_id: None,
        },
    )
    .await
    .expect("signal late");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (seen, _, _) = sh(&c, &id, PROCESSES).await;
    assert!(
        !lists(&seen, "sleep 1014"),
        "late's process lives on:\n{seen}"
    );
    for alive in ["sleep 1011", "sleep 1013"] {
        assert!(lists(&seen, alive), "{alive} was signalled too:\n{seen}");
    }
    c.delete(&id).await.expect("delete");
}

#[tokio::test]
async fn a_containers_stats_are_its_own_processes_under_the_sandboxs_limits() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = c.create(&pod()).await.expect("create").id;
    let sleepers =
        "for i in 1 2 3 4 5; do sleep 3600 < /dev/null > /dev/null 2>&1 & done; echo started";

    let db_before = c.container_stats(&id, "db").await.expect("db's stats");
    assert!(
        db_before.pids.current >= 2 && db_before.memory.usage_bytes > 0,
        "its agent and its main process at least, resident: {db_before:?}"
    );
    let whole = c.stats(&id).await.expect("the sandbox's stats");
    assert_eq!(db_before.memory.limit_bytes, whole.memory.limit_bytes);
    assert_eq!(db_before.pids.limit, whole.pids.limit);
    assert!(
        whole.memory.limit_bytes > 0 && whole.pids.limit > 0,
        "{whole:?}"
    );

    // Five sleepers in the sandbox's own root: the sandbox counts them, db does not.
    let (out, err, code) = sh(&c, &id, sleepers).await;
    assert_eq!((out.as_str(), code), ("started\n", 0), "{err}");
    let db_after_main = c.container_stats(&id, "db").await.expect("db's stats");
    let whole_after = c.stats(&id).await.expect("the sandbox's stats");
    assert!(
        db_after_main.pids.current < db_before.pids.current + 5,
        "db counts main's processes: {db_before:?} → {db_after_main:?}"
    );
    // The sandbox's count holds db's processes and the five (not compared with its count
    // before: the helper's main process and the last exec may have been alive then).
    assert!(
        whole_after.pids.current >= db_after_main.pids.current + 5,
        "{db_after_main:?} within {whole_after:?}"
    );

    // Five in db: db counts them.
    let (out, err, code) = sh_in(&c, &id, "db", sleepers).await;
    assert_eq!((out.as_str(), code), ("started\n", 0), "{err}");
    let db_after = c.container_stats(&id, "db").await.expect("db's stats");
    // At least four more: db's service loop forks a short-lived `echo` per connection, which
    // the count before may have caught.
    assert!(
        db_after.pids.current >= db_before.pids.current + 4,
        "{db_before:?} → {db_after:?}"
    );

    // `main` is the whole sandbox; an unknown container is a 404 naming it.
    let main = c.container_stats(&id, "main").await.expect("main's stats");
    assert!(main.pids.current >= whole_after.pids.current, "{main:?}");
    let (status, code, message) = api_code(
        c.container_stats(&id, "nope")
            .await
            .expect_err("no such container"),
    );
    assert_eq!(
        (status, code.as_str()),
        (404, "container_not_found"),
        "{message}"
    );
    assert!(message.contains("nope"), "{message}");

    c.delete(&id).await.expect("delete");
}

/// A shared directory mounted read-only in a container: it reads what the sandbox's root
/// writes there, and cannot write itself, whether it was made with the sandbox or added later.
#[tokio::test]
async fn a_read_only_shared_directory_is_read_but_never_written() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = c
        .create(&request(serde_json::json!({
            "shared": [{"name": "conf", "path": "/conf"}],
            "containers": [
                {"name": "reader", "shared": [{"name": "conf", "path": "/in", "read_only": true}]}
            ]
        })))
        .await
        .expect("create")
        .id;
    let (_, err, code) = sh(&c, &id, "echo v1 > /conf/setting").await;
    assert_eq!(code, 0, "{err}");
    let late = container(serde_json::json!(
        {"name": "late", "shared": [{"name": "conf", "path": "/etc/app", "read_only": true}]}
    ));
    c.add_container(&id, &late).await.expect("add late");
    for (name, dir) in [("reader", "/in"), ("late", "/etc/app")] {
        let (out, err, code) = sh_in(
            &c,
            &id,
            name,
            &format!("cat {dir}/setting; echo v2 > {dir}/setting; touch {dir}/new"),
        )
        .await;
        assert_eq!(out, "v1\n", "{name}: {err}");
        assert_ne!(code, 0, "{name} wrote a read-only shared directory");
        assert!(err.contains("Read-only file system"), "{name}: {err}");
    }
    // Still the root's to change, and every reader sees the change.
    let (_, err, code) = sh(&c, &id, "echo v3 > /conf/setting && ls /conf").await;
    assert_eq!(code, 0, "{err}");
    let (out, _, _) = sh_in(&c, &id, "late", "cat /etc/app/setting; ls /etc/app").await;
    assert_eq!(out, "v3\nsetting\n");
    c.delete(&id).await.expect("delete");
}

/// A fork bomb raging in one container keeps the commands' process limit full; the agents,
/// the sandbox's and every container's, keep the room to answer and to start a command.
#[tokio::test]
async fn a_fork_bomb_in_a_container_leaves_every_agent_answering() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = c.create(&pod()).await.expect("create").id;
    let bomb = {
        let (c, id) = (c.clone(), id.clone());
        tokio::spawn(async move {
            let request = ExecRequest {
                timeout_s: 6,
                // The shell forks once, for the bomb's subshell, then waits by `exec`: on
                // the sandbox's one CPU the bomb may fill the pids limit before the shell is
                // scheduled again, and a fork of its own would fail.
                ..ExecRequest::new(["sh", "-c", "(b() { b | b & }; b) & exec sleep 60"])
            };
            c.exec_in(&id, "db", &request)
                .await
                .expect("exec in db")
                .collect()
                .await
                .expect("its output")
        })
    };
    let mut raging = false;
    for _ in 0..100 {
        let stats = c.stats(&id).await.expect("stats");
        if stats.pids.current >= stats.pids.limit / 4 * 3 {
            raging = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(raging, "the bomb never filled the process limit");
    let (out, err, code) = sh(&c, &id, "echo main answers").await;
    assert_eq!((out.as_str(), code), ("main answers\n", 0), "{err}");
    for container in ["db", "helper"] {
        let out = c
            .exec_in(&id, container, &ExecRequest::new(["echo", container]))
            .await
            .expect("exec in a container")
            .collect()
            .await
            .expect("its output");
        assert_eq!(
            (
                String::from_utf8_lossy(&out.stdout).trim(),
                out.result.exit_code
            ),
            (container, 0),
            "{:?}",
            out.result
        );
    }
    let bomb = bomb.await.expect("the bomb's exec");
    assert!(bomb.result.timed_out, "{:?}", bomb.result);
    c.delete(&id).await.expect("delete");
}

#[tokio::test]
async fn a_removed_container_ends_with_every_process_in_it_and_is_not_restarted() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let mut with_a_restarting_one = pod();
    with_a_restarting_one.containers.push(
        serde_json::from_value(serde_json::json!({
            "name": "flaky",
            "command": ["sleep", "3600"],
            "restart": "on-failure"
        }))
        .expect("a container request"),
    );
    let id = c.create(&with_a_restarting_one).await.expect("create").id;
    // Counted from the host (no root of the sandbox sees another's processes): db's `nc` and
    // flaky's `sleep` in the sandbox's cgroup.
    let cgroup = harness::leaks::memory_cgroup(daemon.cgroup_parent(), &id);
    let ps = || {
        harness::leaks::pids_in(&cgroup)
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| matches!(comm.trim(), "nc" | "sleep"))
            })
            .count()
    };
    // db's loop starts `nc` again after each connection (the ready check made one): asked
    // again until both run.
    let mut before = 0;
    for _ in 0..50 {
        before = ps();
        if before == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(before, 2, "db's nc and flaky's sleep run");

    c.remove_container(&id, "db").await.expect("remove db");
    c.remove_container(&id, "flaky")
        .await
        .expect("remove flaky");
    let names: Vec<_> = containers(&c, &id)
        .await
        .into_iter()
        .map(|info| info.name)
        .collect();
    assert_eq!(names, ["helper"]);
    // Every process of both is gone, and flaky's restart policy does not bring it back.
    let mut left = usize::MAX;
    for _ in 0..100 {
        left = ps();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(left, 0, "the removed containers' processes are gone");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ps(), 0, "flaky was not started again");

    // Its name answers 404 everywhere; `main` cannot be removed; the rest runs on.
    for result in [
        c.exec_in(&id, "db", &ExecRequest::new(["true"]))
            .await
            .err(),
        c.remove_container(&id, "db").await.err(),
        c.container_logs(&id, "db").await.err(),
    ] {
        let (status, code, _) = api_code(result.expect("refused"));
        assert_eq!((status, code.as_str()), (404, "container_not_found"));
    }
    let (status, code, message) =
        api_code(c.remove_container(&id, "main").await.expect_err("main"));
    assert_eq!(
        (status, code.as_str()),
        (400, "invalid_request"),
        "{message}"
    );
    let (out, _, code) = sh_in(&c, &id, "helper", "echo still here").await;
    assert_eq!((out.as_str(), code), ("still here\n", 0));
    assert_eq!(sh(&c, &id, "cat /work/note").await.0, "written-by-helper\n");

    c.delete(&id).await.expect("delete");
}

/// A container request from JSON, as an API user writes it.
fn container(json: serde_json::Value) -> api_types::ContainerRequest {
    serde_json::from_value(json).expect("a valid container request")
}

#[tokio::test]
async fn a_container_added_to_a_running_sandbox_joins_its_network_and_shared_dirs() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    // A sandbox made with no container at all gets one, then one that depends on it.
    let id = daemon.sandbox().await;
    sh(&c, &id, "echo from-main > /tmp/only-main").await;
    let db = c
        .add_container(
            &id,
            &container(serde_json::json!({
                "name": "db",
                "command": ["/bin/sh", "-c",
                            "echo db up; while true; do echo hello-from-db | nc -l -p 5432; done"],
                "ready": {"tcp_port": 5432},
                "shared": [{"name": "work", "path": "/data"}]
            })),
        )
        .await
        .expect("add db");
    assert_eq!(
        (db.name.as_str(), db.state),
        ("db", ContainerState::Ready),
        "{db:?}"
    );
    let job = c
        .add_container(
            &id,
            &container(serde_json::json!({
                "name": "job",
                // db's `nc` starts again after each connection: tried until it answers.
                "command": ["/bin/sh", "-c",
                            "until nc 127.0.0.1 5432 > /out/got.new && [ -s /out/got.new ]; \
                             do sleep 0.05; done; mv /out/got.new /out/got; echo job wrote; \
                             sleep 3600"],
                "depends_on": ["db"],
                "shared": [{"name": "work", "path": "/out"}]
            })),
        )
        .await
        .expect("add job");
    assert_eq!(job.state, ContainerState::Ready, "{job:?}");
    // The job reached db on the loopback they share, through a directory both mount.
    let mut got = String::new();
    for _ in 0..200 {
        got = sh_in(&c, &id, "db", "cat /data/got 2>/dev/null").await.0;
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(got, "hello-from-db\n");
    // Each has a root of its own: nothing of the sandbox's own root's /tmp. Its commands'
    // statuses are theirs.
    let (_, _, code) = sh_in(&c, &id, "job", "test -e /tmp/only-main").await;
    assert_eq!(code, 1, "an added container sees the sandbox root's /tmp");
    let (out, _, code) = sh_in(&c, &id, "job", "echo in-job; exit 7").await;
    assert_eq!((out.as_str(), code), ("in-job\n", 7));
    let (text, _) = log(&c, &id, "job").await;
    assert_eq!(text, "job wrote\n");
    let names: Vec<_> = containers(&c, &id)
        .await
        .into_iter()
        .map(|info| info.name)
        .collect();
    assert_eq!(names, ["db", "job"]);

    // A name in use is a conflict; a dependency the sandbox does not run, `main`, a bad
    // shared directory, an image nobody imported are 400s, as in a create. None of them leaves a
    // container behind.
    let (status, _, message) = api_code(
        c.add_container(&id, &container(serde_json::json!({"name": "db"})))
            .await
            .expect_err("twice"),
    );
    assert_eq!(status, 409, "{message}");
    for (bad, status, says) in [
        (
            serde_json::json!({"name": "x", "depends_on": ["nope"]}),
            400,
            "\"nope\"",
        ),
        (serde_json::json!({"name": "main"}), 400, "main"),
        (serde_json::json!({"name": "Bad"}), 400, "a-z"),
        (
            serde_json::json!({"name": "x", "shared": [{"name": "w", "path": "/proc/w"}]}),
            400,
            "shared[0]",
        ),
        (
            serde_json::json!({"name": "x", "image": "no-such-image"}),
            400,
            "no-such-image",
        ),
    ] {
        let (got, _, message) = api_code(
            c.add_container(&id, &container(bad.clone()))
                .await
                .expect_err("bad"),
        );
        assert_eq!(got, status, "{bad}: {message}");
        assert!(message.contains(says), "{bad}: {message}");
    }
    // One that never gets ready stays, failed, with its log, until it is removed.
    let (status, code, message) = api_code(
        c.add_container(
            &id,
            &container(serde_json::json!({
                "name": "deaf",
                "command": ["/bin/sh", "-c", "echo never listening; sleep 300"],
                "ready": {"tcp_port": 6001, "timeout_s": 1}
            })),
        )
        .await
        .expect_err("not ready"),
    );
    assert_eq!(
        (status, code.as_str()),
        (422, "container_not_ready"),
        "{message}"
    );
    assert!(message.contains("never listening"), "{message}");
    let deaf = containers(&c, &id)
        .await
        .into_iter()
        .find(|info| info.name == "deaf")
        .expect("deaf is listed");
    assert_eq!(deaf.state, ContainerState::Failed, "{deaf:?}");
    c.remove_container(&id, "deaf").await.expect("remove deaf");

    // One whose main process exits before it is ready is exited, with its status, however the
    // exit and the ready check interleave; it stays so after the check has given up.
    let (status, _, message) = api_code(
        c.add_container(
            &id,
            &container(serde_json::json!({
                "name": "quitter",
                "command": ["/bin/sh", "-c", "echo bye; exit 3"],
                "ready": {"tcp_port": 6002}
            })),
        )
        .await
        .expect_err("not ready"),
    );
    assert_eq!(status, 422, "{message}");
    assert!(message.contains("exited with 3"), "{message}");
    // Past the ready check's longest pause, so its verdict has landed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let quitter = containers(&c, &id)
        .await
        .into_iter()
        .find(|info| info.name == "quitter")
        .expect("quitter is listed");
    assert_eq!(
        (quitter.state, quitter.exit_code),
        (ContainerState::Exited, Some(3)),
        "{quitter:?}"
    );
    c.remove_container(&id, "quitter")
        .await
        .expect("remove quitter");

    // A removed name can be used again, with a fresh writable layer.
    sh_in(&c, &id, "job", "echo old > /left-behind").await;
    c.remove_container(&id, "job").await.expect("remove job");
    c.add_container(
        &id,
        &container(serde_json::json!({"name": "job", "command": ["sleep", "3600"]})),
    )
    .await
    .expect("add job again");
    let (_, _, code) = sh_in(&c, &id, "job", "test -e /left-behind").await;
    assert_eq!(code, 1, "the new job sees the removed one's files");
    let reach = "for i in $(seq 100); do out=$(nc 127.0.0.1 5432) && [ -n \"$out\" ] && \
                 { echo \"$out\"; exit 0; }; sleep 0.05; done; exit 1";
    let out = c
        .exec_in(&id, "job", &ExecRequest::new(["sh", "-c", reach]))
        .await
        .expect("exec in job")
        .collect()
        .await
        .expect("its output");
    assert_eq!(
        (
            String::from_utf8_lossy(&out.stdout).as_ref(),
            out.result.exit_code
        ),
        ("hello-from-db\n", 0),
        "{:?} {}",
        out.result,
        String::from_utf8_lossy(&out.stderr)
    );

    c.delete(&id).await.expect("delete");
    harness::leaks::assert_nothing_held(&daemon.state.config.state_dir, daemon.cgroup_parent())
        .await;
}

/// Imports, as `name`, a root of busybox whose `/var/run` is a symlink to `../run` (Debian's
/// layout, which a `postgres` image has).
async fn import_with_var_run_link(c: &client::Client, name: &str) {
    let busybox = std::fs::read(harness::image_dir().join("rootfs/bin/busybox")).expect("busybox");
    let layer = oci::write::LayerBuilder::new()
        .file("bin/busybox", 0o755, &busybox)
        .and_then(|l| l.symlink("bin/sh", "busybox"))
        .and_then(|l| l.dir("run", 0o755))
        .and_then(|l| l.dir("var", 0o755))
        .and_then(|l| l.symlink("var/run", "../run"))
        .and_then(|l| l.finish())
        .expect("layer");
    let dir = tempfile::tempdir().expect("tempdir");
    let tarball = dir.path().join("rootfs.tar");
    std::fs::write(&tarball, layer).expect("write");
    harness::images::import_file(c, name, &tarball)
        .await
        .expect("import");
}

#[tokio::test]
async fn a_shared_dir_through_a_symlink_of_the_image_is_a_400_naming_it() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    import_with_var_run_link(&c, "linked").await;
    let says = |message: &str, place: &str| {
        for part in [
            place,
            "\"/var/run/postgresql\"",
            "/var/run is a symlink (to \"../run\") in image \"linked\"",
        ] {
            assert!(message.contains(part), "{part:?} not in {message:?}");
        }
    };
    // A container's, the sandbox root's own, and (below) a container added later.
    let in_container = request(serde_json::json!({
        "containers": [
            {"name": "db", "image": "linked",
             "shared": [{"name": "sock", "path": "/var/run/postgresql"}]}]
    }));
    let in_main = request(serde_json::json!({
        "image": "linked",
        "shared": [{"name": "sock", "path": "/var/run/postgresql/"}]
    }));
    // A cache of the sandbox's own root is mounted the same way.
    let cache = request(serde_json::json!({
        "image": "linked",
        "caches": [{"name": "pg", "path": "/var/run/postgresql"}]
    }));
    for (create, place) in [
        (in_container, "containers[0] (db).shared[0] (sock)"),
        (in_main, "shared[0] (sock)"),
        (cache, "caches[0] (pg)"),
    ] {
        let (status, code, message) =
            api_code(c.create(&create).await.expect_err("through a symlink"));
        assert_eq!(
            (status, code.as_str()),
            (400, "invalid_request"),
            "{message}"
        );
        says(&message, place);
    }
    let id = daemon.sandbox().await;
    let (status, code, message) = api_code(
        c.add_container(
            &id,
            &container(serde_json::json!({
                "name": "db", "image": "linked",
                "shared": [{"name": "sock", "path": "/var/run/postgresql"}]
            })),
        )
        .await
        .expect_err("through a symlink"),
    );
    assert_eq!(
        (status, code.as_str()),
        (400, "invalid_request"),
        "{message}"
    );
    says(&message, "shared[0] (sock)");
    assert!(containers(&c, &id).await.is_empty());
    // The path the link stands for is fine.
    let fine = request(serde_json::json!({
        "containers": [
            {"name": "db", "image": "linked",
             "shared": [{"name": "sock", "path": "/run/postgresql"}]}]
    }));
    let created = c.create(&fine).await.expect("the real path");
    assert_eq!(created.containers[0].state, ContainerState::Ready);
    c.delete(&created.id).await.expect("delete");
    c.delete(&id).await.expect("delete");
}

/// The kernel's view of the calling process's security: `NoNewPrivs`, `CapEff`, `CapBnd`.
const SECURITY_OF_SELF: &str = "grep -E '^(NoNewPrivs|CapEff|CapBnd):' /proc/self/status";

#[tokio::test]
async fn a_containers_security_settings_hold_at_creation_and_when_added() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let strict = serde_json::json!({
        "read_only_root": true, "no_new_privileges": true, "capabilities": []
    });
    let created = c
        .create(&request(serde_json::json!({
            "shared": [{"name": "work", "path": "/work"}],
            "containers": [
                {"name": "locked", "command": ["sleep", "3600"], "security": strict,
                 "shared": [{"name": "work", "path": "/data"}]},
                {"name": "plain", "command": ["sleep", "3600"]},
                {"name": "nnp", "command": ["sleep", "3600"],
                 "security": {"no_new_privileges": true}}
            ]
        })))
        .await
        .expect("create");
    let id = created.id;
    // Through the factory, as the Kubernetes shim adds every pod member.
    c.add_container(
        &id,
        &container(serde_json::json!({
            "name": "added", "command": ["sleep", "3600"], "user": "1000:1000",
            "security": {"read_only_root": true, "no_new_privileges": true,
                         "capabilities": ["CAP_CHOWN", "kill"]}
        })),
    )
    .await
    .expect("add a container with security settings");

    let status = |kind: &str, bnd: &str, eff: &str| {
        format!("CapEff:\t{eff}\nCapBnd:\t{bnd}\nNoNewPrivs:\t{kind}\n")
    };
    let (out, _, code) = sh_in(&c, &id, "locked", SECURITY_OF_SELF).await;
    assert_eq!(
        (out.as_str(), code),
        (
            status("1", "0000000000000000", "0000000000000000").as_str(),
            0
        )
    );
    // Root as a sandbox makes it: every capability it grants, nothing more.
    let (out, _, _) = sh_in(&c, &id, "plain", SECURITY_OF_SELF).await;
    assert_eq!(out, status("0", "00000000800405fb", "00000000800405fb"));
    // The agent still starts commands as the container's user; theirs are bounded too.
    let (out, err, _) = sh_in(&c, &id, "added", &format!("id -u; {SECURITY_OF_SELF}")).await;
    assert_eq!(
        out,
        format!(
            "1000\n{}",
            status("1", "0000000000000021", "0000000000000000")
        ),
        "{err}"
    );

    // A read-only root, with its shared directories and /tmp writable.
    for name in ["locked", "added"] {
        let (out, _, code) = sh_in(
            &c,
            &id,
            name,
            "touch /new 2>&1; touch /tmp/t && echo tmp-ok",
        )
        .await;
        assert!(out.contains("Read-only file system"), "{name}: {out}");
        assert!(out.contains("tmp-ok"), "{name}: {out}");
        assert_eq!(code, 0, "{name}: {out}");
    }
    let (out, _, _) = sh_in(&c, &id, "locked", "echo shared > /data/x && cat /work/x").await;
    assert_eq!(
        out, "",
        "the shared dir is mounted in main at /work, not here"
    );
    assert_eq!(sh(&c, &id, "cat /work/x").await.0, "shared\n");
    let (out, _, code) = sh_in(&c, &id, "plain", "touch /new && echo root-ok").await;
    assert_eq!((out.as_str(), code), ("root-ok\n", 0));
    // Root in a container without CAP_CHOWN cannot give a file away.
    let (out, _, _) = sh_in(
        &c,
        &id,
        "locked",
        "chown 1000 /tmp/t 2>&1 | grep -c 'not permitted'",
    )
    .await;
    assert_eq!(out, "1\n");

    // A setuid-root binary run by another user: root without no_new_privileges, not with it.
    let probe = std::path::Path::new(env!("CRUCIBLE_ESCAPE_PROBE"));
    for (name, verdict) in [("plain", "euid-root OK\n"), ("nnp", "euid-root EPERM\n")] {
        c.put_path_in(&id, Some(name), probe, "/usr/local/bin")
            .await
            .expect("upload the probe");
        let (_, err, code) = sh_in(&c, &id, name, "chmod 4755 /usr/local/bin/escape-probe").await;
        assert_eq!(code, 0, "{err}");
        let mut as_user = ExecRequest::new(["/usr/local/bin/escape-probe", "euid-root"]);
        as_user.user = "1000".into();
        let out = c
            .exec_in(&id, name, &as_user)
            .await
            .expect("exec")
            .collect()
            .await
            .expect("output");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            verdict,
            "{name}: {:?}",
            out.result
        );
    }

    // Capabilities beyond the sandbox's set are granted within its user namespace: the
    // sandbox's hostname is its own to change with SYS_ADMIN, so are mounts in the
    // container's own mount namespace, and the seccomp filter still refuses new namespaces
    // and netfilter's sockets.
    c.add_container(
        &id,
        &container(serde_json::json!({
            "name": "admin", "command": ["sleep", "3600"],
            "security": {"capabilities": ["ALL", "SYS_ADMIN", "NET_ADMIN"]}
        })),
    )
    .await
    .expect("add a container granted SYS_ADMIN and NET_ADMIN");
    let (out, _, _) = sh_in(&c, &id, "admin", SECURITY_OF_SELF).await;
    assert_eq!(out, status("0", "00000000802415fb", "00000000802415fb"));
    let (out, code) = {
        let (out, err, code) = sh_in(&c, &id, "plain", "hostname not-granted 2>&1").await;
        (out + &err, code)
    };
    assert_ne!(code, 0, "hostname without SYS_ADMIN: {out}");
    let (_, err, code) = sh_in(&c, &id, "admin", "hostname granted").await;
    assert_eq!(code, 0, "hostname with SYS_ADMIN: {err}");
    assert_eq!(sh_in(&c, &id, "plain", "hostname").await.0, "granted\n");
    c.put_path_in(&id, Some("admin"), probe, "/usr/local/bin")
        .await
        .expect("upload the probe");
    let (out, err, _) = sh_in(
        &c,
        &id,
        "admin",
        "cd /usr/local/bin && for a in mount unshare-user socket-netfilter socket-packet \
         socket-rtnetlink; do ./escape-probe $a; done",
    )
    .await;
    assert_eq!(
        out,
        "mount OK\nunshare-user EPERM\nsocket-netfilter EPERM\nsocket-packet EPERM\n\
         socket-rtnetlink OK\n",
        "{err}"
    );
    // The probe's tmpfs is the admin container's alone: no other container sees it, and
    // without SYS_ADMIN the filter still refuses the call.
    let on_mnt = "grep -c ' /mnt ' /proc/self/mountinfo";
    assert_eq!(sh_in(&c, &id, "admin", on_mnt).await.0, "1\n");
    assert_eq!(sh_in(&c, &id, "plain", on_mnt).await.0, "0\n");
    let (out, err, code) = sh_in(&c, &id, "plain", "mount -t tmpfs none /tmp 2>&1").await;
    assert_ne!(code, 0, "mount without SYS_ADMIN: {out}{err}");

    // A name that is no capability is refused, naming it.
    let refused = c
        .add_container(
            &id,
            &container(serde_json::json!({
                "name": "typo", "command": ["sleep", "1"],
                "security": {"capabilities": ["NET_ADMINISTRATOR"]}
            })),
        )
        .await
        .expect_err("NET_ADMINISTRATOR");
    let message = refused.to_string();
    assert!(
        message.contains("security.capabilities") && message.contains("\"NET_ADMINISTRATOR\""),
        "{message}"
    );
    c.delete(&id).await.expect("delete");
}

#[tokio::test]
async fn a_containers_seccomp_profile_is_stacked_on_the_sandboxs_filter() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    // Denies chmod (critest's profile), fails personality(PER_LINUX32) with EINVAL, and
    // tries to allow what the sandbox's filter refuses.
    let profile = serde_json::json!({
        "default_action": "SCMP_ACT_ALLOW",
        "syscalls": [
            {"names": ["chmod", "fchmodat", "fchmodat2", "not_a_call"], "action": "SCMP_ACT_ERRNO"},
            {"names": ["personality"], "action": "SCMP_ACT_ERRNO", "errno_ret": 22,
             "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"}]},
            {"names": ["mount", "unshare"], "action": "SCMP_ACT_ALLOW"}
        ]
    });
    let created = c
        .create(&request(serde_json::json!({
            "containers": [
                {"name": "confined", "command": ["sleep", "3600"],
                 "security": {"seccomp": profile}},
                {"name": "plain", "command": ["sleep", "3600"]}
            ]
        })))
        .await
        .expect("create");
    let id = created.id;
    let (out, err, code) = sh_in(&c, &id, "confined", "touch /f && chmod 600 /f").await;
    assert_ne!(code, 0, "chmod under the profile: {out}");
    assert!(err.contains("not permitted"), "{err}");
    let (out, err, code) = sh_in(
        &c,
        &id,
        "plain",
        "touch /f && chmod 600 /f && stat -c %a /f",
    )
    .await;
    assert_eq!((out.as_str(), code), ("600\n", 0), "{err}");
    let (seccomp, _, _) = sh_in(
        &c,
        &id,
        "confined",
        "grep Seccomp_filters /proc/self/status",
    )
    .await;
    assert_eq!(seccomp.split_whitespace().last(), Some("2"), "{seccomp}");

    let probe = std::path::Path::new(env!("CRUCIBLE_ESCAPE_PROBE"));
    c.put_path_in(&id, Some("confined"), probe, "/usr/local/bin")
        .await
        .expect("upload the probe");
    let (out, err, _) = sh_in(
        &c,
        &id,
        "confined",
        "/usr/local/bin/escape-probe mount unshare-user personality-query personality-linux32",
    )
    .await;
    assert_eq!(
        out, "mount EPERM\nunshare-user EPERM\npersonality-query OK\npersonality-linux32 EINVAL\n",
        "the profile allows nothing the sandbox refuses: {err}"
    );

    // What cannot be compiled is refused, naming the rule, before anything is made.
    for (profile, named) in [
        (
            serde_json::json!({"default_action": "SCMP_ACT_NOTIFY"}),
            "seccomp: default_action",
        ),
        (
            serde_json::json!({"default_action": "SCMP_ACT_LOG"}),
            "host's kernel log",
        ),
        (
            serde_json::json!({"default_action": "SCMP_ACT_ALLOW", "syscalls": [
                {"names": ["read"], "action": "SCMP_ACT_ERRNO",
                 "args": [{"index": 6, "value": 0, "op": "SCMP_CMP_EQ"}]}]}),
            "argument index 6",
        ),
        (
            serde_json::json!({"default_action": "SCMP_ACT_ALLOW", "syscalls": [
                {"names": ["read"], "action": "SCMP_ACT_ERRNO",
                 "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_LIKE"}]}]}),
            "syscalls[0]",
        ),
    ] {
        let refused = c
            .add_container(
                &id,
                &container(serde_json::json!({
                    "name": "bad", "command": ["sleep", "1"],
                    "security": {"seccomp": profile}
                })),
            )
            .await
            .expect_err("an uncompilable profile");
        let message = refused.to_string();
        assert!(message.contains(named), "{named}: {message}");
    }
    assert_eq!(containers(&c, &id).await.len(), 2);
    c.delete(&id).await.expect("delete");
}

/// A host directory as a test makes it: root's, mode 0700, holding `flag`; unmounted and
/// removed on drop.
struct HostDir {
    dir: tempfile::TempDir,
    mounted: Vec<std::path::PathBuf>,
}

impl HostDir {
    fn new() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix("crucible-hostpath-")
            .tempdir()
            .expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        std::fs::write(dir.path().join("flag"), "from-the-host\n").expect("flag");
        HostDir {
            dir,
            mounted: Vec::new(),
        }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Makes it a shared mount of its own (bound on itself), as a node's `/var/lib/kubelet`
    /// is: what the host mounts below it then reaches its peers and slaves.
    fn make_shared(&mut self) {
        let path = self.path().to_path_buf();
        for args in [vec!["--bind"], vec!["--make-shared"]] {
            let mut mount = std::process::Command::new("mount");
            mount.args(&args).arg(&path);
            if args == ["--bind"] {
                mount.arg(&path);
            }
            assert!(mount.status().expect("mount").success(), "mount {args:?}");
        }
        self.mounted.push(path);
    }

    /// Mounts a tmpfs holding `name` at `below` in the host directory, on the host.
    fn mount_below(&mut self, below: &str, name: &str) {
        let at = self.path().join(below);
        std::fs::create_dir_all(&at).expect("mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&at)
            .status()
            .expect("mount");
        assert!(status.success(), "mount tmpfs on {}", at.display());
        std::fs::write(at.join(name), "later\n").expect("write below");
        self.mounted.push(at);
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        for at in self.mounted.iter().rev() {
            let _ = std::process::Command::new("umount").arg(at).status();
        }
    }
}

#[tokio::test]
async fn host_paths_are_mounted_idmapped_as_asked_and_never_reach_back() {
    use std::os::unix::fs::MetadataExt;
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let mut shared = HostDir::new();
    shared.make_shared();
    let read_only = HostDir::new();
    let link = shared.path().with_extension("link");
    std::os::unix::fs::symlink(shared.path(), &link).expect("symlink");
    let created = c
        .create(&request(serde_json::json!({})))
        .await
        .expect("create");
    let id = created.id;
    let host_path = |source: &std::path::Path, path: &str, read_only: bool, propagation: &str| {
        serde_json::json!({"source": source, "path": path, "read_only": read_only,
                           "propagation": propagation})
    };
    c.add_container(
        &id,
        &container(serde_json::json!({
            "name": "job", "command": ["sleep", "3600"],
            "host_paths": [
                host_path(shared.path(), "/cache", false, "private"),
                host_path(&link, "/tmp/linked/cache", false, "host_to_container"),
                host_path(read_only.path(), "/ro", true, "private"),
            ]
        })),
    )
    .await
    .expect("add a container with host paths");

    // Root's 0700 directories read as the sandbox root's: host uid 0 is its root.
    let (out, err, code) = sh_in(
        &c,
        &id,
        "job",
        "cat /cache/flag /tmp/linked/cache/flag /ro/flag; stat -c %u /cache",
    )
    .await;
    assert_eq!(
        (out.as_str(), code),
        ("from-the-host\nfrom-the-host\nfrom-the-host\n0\n", 0),
        "{err}"
    );
    // Written through the mount: the host's root owns it; a setuid bit does not act inside.
    let (_, err, code) = sh_in(
        &c,
        &id,
        "job",
        "echo from-the-sandbox > /cache/out && chown 1000 /cache/out",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let out = shared.path().join("out");
    assert_eq!(
        std::fs::read_to_string(&out).expect("written"),
        "from-the-sandbox\n"
    );
    assert_eq!(std::fs::metadata(&out).expect("stat").uid(), 1000);
    let (out, _, code) = sh_in(&c, &id, "job", "touch /ro/x 2>&1").await;
    assert_ne!(code, 0);
    assert!(out.contains("Read-only file system"), "{out}");
    let (out, _, _) = sh_in(
        &c,
        &id,
        "job",
        "grep -E ' /(cache|ro) ' /proc/self/mountinfo",
    )
    .await;
    for line in out.lines() {
        assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
    }

    // The host mounts below it later: seen through the HostToContainer one, not the other,
    // idmapped as the host path is (a root-owned 0700 directory reads as the container
    // root's, as critest's `rslave` spec checks); and gone again once the host unmounts it.
    shared.mount_below("later", "below");
    std::fs::set_permissions(
        shared.path().join("later"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod 0700 the host's later mount");
    let (out, err, _) = sh_in(
        &c,
        &id,
        "job",
        "cat /tmp/linked/cache/later/below; stat -c '%u %a' /tmp/linked/cache/later; \
         ls /cache/later | wc -l",
    )
    .await;
    assert_eq!(
        out, "later\n0 700\n0\n",
        "the host's later mount, idmapped through HostToContainer alone: {err}"
    );
    let host_mount = shared.mounted.pop().expect("the later mount");
    let status = std::process::Command::new("umount")
        .arg(&host_mount)
        .status()
        .expect("umount");
    assert!(status.success());
    let (out, err, _) = sh_in(&c, &id, "job", "ls /tmp/linked/cache/later | wc -l").await;
    assert_eq!(out, "0\n", "the host's unmount is carried too: {err}");
    // Nothing the container does mounts on the host: mounting is refused inside.
    let (_, _, code) = sh_in(&c, &id, "job", "mount -t tmpfs none /cache/later").await;
    assert_ne!(code, 0, "a container mounted");

    // Refused, naming the field: a file, a missing source, /proc, a twice-used target, at
    // creation, and for a tenant.
    let flag = shared.path().join("flag");
    for (host_paths, says) in [
        (
            vec![host_path(&flag, "/f", false, "private")],
            "not a directory",
        ),
        (
            vec![host_path(
                &shared.path().join("missing"),
                "/m",
                false,
                "private",
            )],
            "host_paths[0].source",
        ),
        (
            vec![host_path(shared.path(), "/proc/x", false, "private")],
            "/proc",
        ),
        (
            vec![
                host_path(shared.path(), "/a", false, "private"),
                host_path(read_only.path(), "/a", true, "private"),
            ],
            "twice",
        ),
    ] {
        let refused = c
            .add_container(
                &id,
                &container(serde_json::json!({
                    "name": "bad", "command": ["sleep", "1"], "host_paths": host_paths
                })),
            )
            .await
            .expect_err(says);
        assert!(refused.to_string().contains(says), "{says}: {refused}");
    }
    let at_creation = c
        .create(&request(serde_json::json!({
            "containers": [{"name": "early", "host_paths": [
                host_path(shared.path(), "/cache", false, "private")]}]
        })))
        .await
        .expect_err("host paths at creation");
    assert!(
        at_creation.to_string().contains("host_paths"),
        "{at_creation}"
    );
    // A HostToContainer source the host has removed since (as critest removes its temporary
    // directory before the pod) stands in the way of no command, and of no stop.
    std::fs::remove_file(&link).expect("remove the symlinked source");
    let (out, err, _) = sh_in(&c, &id, "job", "echo still-reached").await;
    assert_eq!(out, "still-reached\n", "{err}");
    c.delete(&id).await.expect("delete");
}

#[tokio::test]
async fn only_the_admin_mounts_host_paths() {
    const KEY: &str = "tenant-key-7d1f09e3aa";
    let daemon = TestDaemon::start_with(|c| {
        c.tcp = Some("127.0.0.1:0".parse().expect("addr"));
        c.api_keys = api::ApiKeys::parse(&format!("tenant:{KEY}")).expect("valid keys");
    });
    let tenant = client::Client::new(client::Endpoint::Tcp(
        daemon.tcp.expect("tcp address").to_string(),
    ))
    .with_api_key(KEY);
    let id = tenant
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let host = HostDir::new();
    match tenant
        .add_container(
            &id,
            &container(serde_json::json!({
                "name": "job", "host_paths": [{"source": host.path(), "path": "/etc-of-host"}]
            })),
        )
        .await
    {
        Err(ClientError::Api {
            status: 403,
            message,
            ..
        }) => assert!(message.contains("host_paths"), "{message}"),
        other => panic!("a tenant mounting a host directory: {other:?}"),
    }
    tenant.delete(&id).await.expect("delete");
}

#[tokio::test]
async fn masked_and_read_only_paths_hold_within_the_containers_root_only() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let created = c
        .create(&request(serde_json::json!({
            "shared": [{"name": "work", "path": "/work"}],
            "containers": [
                {"name": "rules", "command": ["sleep", "3600"],
                 "shared": [{"name": "work", "path": "/data"}],
                 "security": {
                     "masked_paths": ["/etc/hosts", "/sbin", "/not/in/the/image"],
                     "read_only_paths": ["/tmp", "/data"]
                 }}
            ]
        })))
        .await
        .expect("create");
    let id = created.id;
    let script = "wc -c < /etc/hosts; ls /sbin | wc -l; touch /sbin/x 2>&1; \
                  touch /tmp/x 2>&1; touch /data/x 2>&1; touch /new && echo root-rw";
    let (out, err, _) = sh_in(&c, &id, "rules", script).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first().map(|l| l.trim()), Some("0"), "{out} {err}");
    assert_eq!(lines.get(1).map(|l| l.trim()), Some("0"), "{out} {err}");
    assert_eq!(
        out.matches("Read-only file system").count(),
        3,
        "/sbin, /tmp and /data: {out}"
    );
    assert!(
        out.ends_with("root-rw\n"),
        "the root itself stays writable: {out}"
    );
    // The sandbox's own root, which shares /work, is untouched.
    let (out, _, _) = sh(
        &c,
        &id,
        "test -s /etc/hosts && ls /sbin | wc -l && touch /work/y && echo main-rw",
    )
    .await;
    assert!(
        out.ends_with("main-rw\n") && !out.starts_with("0\n"),
        "{out}"
    );

    // Symlinks a tenant plants are followed within the container's root, never out of it.
    let (_, err, code) = sh(
        &c,
        &id,
        "ln -s /etc /work/etc-link && ln -s ../../../../../../../../etc/passwd /work/up-link",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    c.add_container(
        &id,
        &container(serde_json::json!({
            "name": "linked", "command": ["sleep", "3600"],
            "shared": [{"name": "work", "path": "/data"}],
            "security": {"masked_paths": ["/data/etc-link/hosts", "/data/up-link"]}
        })),
    )
    .await
    .expect("add a container whose masked paths go through symlinks");
    let (out, _, _) = sh_in(&c, &id, "linked", "cat /etc/hosts /etc/passwd | wc -c").await;
    assert_eq!(
        out.trim(),
        "0",
        "its own /etc/hosts and /etc/passwd are hidden"
    );
    let (out, _, _) = sh(&c, &id, "cat /etc/passwd | wc -c").await;
    assert_ne!(out.trim(), "0", "main's /etc/passwd is not");
    let host = std::fs::read_to_string("/etc/passwd").expect("the host's /etc/passwd");
    assert!(
        host.starts_with("root:"),
        "the host's /etc/passwd: {host:.40}"
    );

    // Paths that are not plain absolute ones, or too many, are refused, naming the field.
    for (security, named) in [
        (
            serde_json::json!({"masked_paths": ["etc/hosts"]}),
            "security.masked_paths",
        ),
        (
            serde_json::json!({"read_only_paths": ["/a/../../b"]}),
            "security.read_only_paths",
        ),
        (
            serde_json::json!({"masked_paths": (0..65).map(|i| format!("/p{i}")).collect::<Vec<_>>()}),
            "more than 64",
        ),
    ] {
        let refused = c
            .add_container(
                &id,
                &container(serde_json::json!({
                    "name": "bad", "command": ["sleep", "1"], "security": security
                })),
            )
            .await
            .expect_err("refused");
        let message = refused.to_string();
        assert!(message.contains(named), "{named}: {message}");
    }
    c.delete(&id).await.expect("delete");
}

/// A tar archive of one regular file `path` holding `content`.
fn one_file_tar(path: &str, content: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, path, content)
        .expect("append to the archive");
    builder.into_inner().expect("the archive")
}

#[tokio::test]
async fn writable_files_stay_writable_under_a_read_only_root() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let sealed = serde_json::json!({
        "read_only_root": true,
        "writable_files": ["/etc/hosts", "/etc/resolv.conf", "/dev/termination-log"]
    });
    let created = c
        .create(&request(serde_json::json!({
            "shared": [{"name": "work", "path": "/work"}],
            "containers": [{"name": "sealed", "command": ["sleep", "3600"], "security": sealed}]
        })))
        .await
        .expect("create");
    let id = created.id;
    let (image_hosts, _, _) = sh(&c, &id, "cat /etc/hosts").await;
    assert!(!image_hosts.is_empty());
    let (out, err, _) = sh_in(
        &c,
        &id,
        "sealed",
        "cat /etc/hosts; wc -c < /etc/resolv.conf; echo nameserver 10.0.0.10 >> /etc/resolv.conf \
         && cat /etc/resolv.conf; touch /etc/other 2>&1",
    )
    .await;
    assert_eq!(
        out,
        format!("{image_hosts}0\nnameserver 10.0.0.10\ntouch: /etc/other: Read-only file system\n"),
        "{err}"
    );
    // As the Kubernetes shim puts kubelet's files: written in place, since a mount cannot be
    // replaced.
    let archive = one_file_tar("etc/hosts", b"10.1.2.3 pod\n");
    c.put_tar_in(&id, Some("sealed"), "/", std::io::Cursor::new(archive))
        .await
        .expect("put /etc/hosts into the read-only container");
    let (out, _, _) = sh_in(&c, &id, "sealed", "cat /etc/hosts").await;
    assert_eq!(out, "10.1.2.3 pod\n");
    let (out, _, _) = sh(&c, &id, "cat /etc/hosts").await;
    assert_eq!(out, image_hosts, "main's /etc/hosts is its own");

    // A FIFO or an oversized file a tenant plants in a shared directory is refused, at once.
    let (_, err, code) = sh(
        &c,
        &id,
        "mkfifo /work/fifo && head -c 1100000 /dev/zero > /work/big",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    for (file, named) in [("fifo", "regular file"), ("big", "1048576 bytes")] {
        let request = container(serde_json::json!({
            "name": format!("with-{file}"), "command": ["sleep", "3600"],
            "shared": [{"name": "work", "path": "/data"}],
            "security": {"writable_files": [format!("/data/{file}")]}
        }));
        let add = c.add_container(&id, &request);
        let refused = tokio::time::timeout(Duration::from_secs(30), add)
            .await
            .expect("an answer, not a hang")
            .expect_err("refused");
        let message = refused.to_string();
        assert!(message.contains(named), "{file}: {message}");
    }
    c.delete(&id).await.expect("delete");
}

/// `command_is_pid1` (what the Kubernetes shim asks for, critest's `ContainerPID`): the
/// container's command is PID 1 of its PID namespace, as under runc. Its agent and spawner are
/// out of that namespace's sight; later commands join it; a signal reaches PID 1 only when it
/// has a handler; once PID 1 exits, no command starts there and the refusal says why.
#[tokio::test]
async fn a_containers_command_is_pid1_of_its_namespace_when_asked() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = c
        .create(&request(serde_json::json!({})))
        .await
        .expect("create")
        .id;
    let main = "trap 'exit 3' TERM; trap 'echo usr1 >> /tmp/got' USR1; \
                echo started > /tmp/started; while true; do sleep 0.1; done";
    c.add_container(
        &id,
        &container(serde_json::json!({
            "name": "svc", "command": ["sh", "-c", main], "command_is_pid1": true
        })),
    )
    .await
    .expect("add a container whose command is PID 1");
    let mut started = false;
    for _ in 0..100 {
        if sh_in(&c, &id, "svc", "cat /tmp/started").await.0 == "started\n" {
            started = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(started, "the container's command never ran");
    let (out, err, code) = sh_in(
        &c,
        &id,
        "svc",
        "tr '\\0' ' ' < /proc/1/cmdline; echo; echo $$ > /tmp/me; \
         for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done \
         | grep -c -e '[s]andbox-container' -e '[c]ontainer-spawner' -e '[c]ontainer-init' \
         || true",
    )
    .await;
    assert_eq!(
        (out.as_str(), code),
        (format!("sh -c {main} \n0\n").as_str(), 0),
        "{err}"
    );
    // Commands run beside it, in its namespace, the agent's children: one's exit status and
    // output come back as ever.
    let (out, _, code) = sh_in(&c, &id, "svc", "echo beside; exit 7").await;
    assert_eq!((out.as_str(), code), ("beside\n", 7));
    // The container's signal reaches PID 1, which handles this one, and every other process
    // of the container; never its agent or spawner: commands still start.
    c.signal_in(
        &id,
        Some("svc"),
        api_types::SignalRequest {
            signal: 10, // SIGUSR1
            exec_id: None,
        },
    )
    .await
    .expect("signal the container");
    let mut got = String::new();
    for _ in 0..100 {
        got = sh_in(&c, &id, "svc", "cat /tmp/got 2>/dev/null").await.0;
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(got, "usr1\n");
    // A signal PID 1 handles ends it, and the container with it.
    let (_, err, code) = sh_in(&c, &id, "svc", "kill -TERM 1").await;
    assert_eq!(code, 0, "{err}");
    let mut refusal = String::new();
    for _ in 0..100 {
        match c
            .exec_in(&id, "svc", &ExecRequest::new(["true"]))
            .await
            .expect("exec")
            .collect()
            .await
        {
            Ok(out) if out.result.exit_code == 0 => {}
            Ok(out) => {
                refusal = out.result.error.clone();
                break;
            }
            Err(e) => {
                refusal = e.to_string();
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        refusal.contains("main process (PID 1 of its PID namespace) has exited"),
        "{refusal:?}"
    );
    // Refused where it cannot hold.
    let refused = c
        .add_container(
            &id,
            &container(serde_json::json!({
                "name": "again", "command": ["true"], "command_is_pid1": true,
                "restart": "on-failure"
            })),
        )
        .await
        .expect_err("restarted PID 1");
    assert!(refused.to_string().contains("command_is_pid1"), "{refused}");
}
