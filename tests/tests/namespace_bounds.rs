//! The bounds on what one tenant can make the daemon hold (docs/security.md, "Bounds"): each
//! test drives one past its limit through the real daemon and checks the refusal, the
//! daemon's memory and that another tenant's sandbox still answers; and the deadline on a
//! container's agent that stops answering.

use std::path::Path;
use std::time::{Duration, Instant};

use api_types::{ContainerRequest, CreateSandbox};
use client::ClientError;
use harness::leaks::rss_kib;
use harness::process::DaemonProcess;
use harness::sh;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn container(json: serde_json::Value) -> ContainerRequest {
    serde_json::from_value(json).expect("a valid container request")
}

fn request(json: serde_json::Value) -> CreateSandbox {
    serde_json::from_value(json).expect("a valid create request")
}

/// The status and message of an API error.
fn refusal(error: ClientError) -> (u16, String) {
    match error {
        ClientError::Api {
            status, message, ..
        } => (status, message),
        other => panic!("expected an API error, got {other}"),
    }
}

/// The container sockets (`c<N>.sock`) under the daemon's state directory.
fn container_sockets(state_dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(sandboxes) = std::fs::read_dir(state_dir.join("sandboxes")) else {
        return found;
    };
    for sandbox in sandboxes.flatten() {
        for entry in std::fs::read_dir(sandbox.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('c') && name.ends_with(".sock") {
                found.push(name);
            }
        }
    }
    found
}

/// How long another tenant's `true` takes: printed, never asserted on (a shared machine's
/// timings are noise); it must answer, with 0.
async fn other_tenant_answers(c: &client::Client, id: &str) -> Duration {
    let started = Instant::now();
    let (_, err, code) = sh(c, id, "true").await;
    assert_eq!(code, 0, "the other sandbox's exec failed: {err}");
    started.elapsed()
}

fn median(mut samples: Vec<u64>) -> u64 {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// Adds a container that prints about 1 MiB (kept in its log by the daemon) and removes it.
async fn add_and_remove(c: &client::Client, id: &str) {
    let noisy = container(serde_json::json!({
        "name": "same",
        "command": ["/bin/sh", "-c",
                    "head -c 1100000 /dev/zero | tr '\\0' x; touch /tmp/printed; sleep 1000"],
        "ready": {"command": ["test", "-e", "/tmp/printed"]}
    }));
    c.add_container(id, &noisy)
        .await
        .expect("add the container");
    c.remove_container(id, "same")
        .await
        .expect("remove the container");
}

#[tokio::test]
async fn adding_and_removing_a_container_in_a_loop_holds_nothing_more_in_the_daemon() {
    harness::require_root();
    let daemon = DaemonProcess::start().await;
    let c = daemon.client();
    let id = c
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let other = c
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let pid = daemon.pid();
    let state_dir = daemon.home().state_dir();

    // A warm-up grows the allocator's caches to their working size; after it, what the daemon
    // keeps of each removed container shows as growth. RSS is sampled after every cycle and
    // the medians compared: one sample may catch a log's megabyte not yet handed back.
    let mut warm_up = Vec::new();
    for _ in 0..20 {
        add_and_remove(&c, &id).await;
        warm_up.push(rss_kib(pid));
    }
    let rss_before = median(warm_up);
    let before = other_tenant_answers(&c, &other).await;
    let started = Instant::now();
    let mut samples = Vec::new();
    for _ in 0..200 {
        add_and_remove(&c, &id).await;
        samples.push(rss_kib(pid));
    }
    let loop_time = started.elapsed();
    let rss_after = median(samples.split_off(180));
    let after = other_tenant_answers(&c, &other).await;
    eprintln!(
        "200 add/remove cycles in {loop_time:.1?}: daemon RSS (median) {rss_before} -> \
         {rss_after} KiB; another sandbox's exec {before:.1?} -> {after:.1?}"
    );
    // Before removed containers were forgotten, each cycle kept its 1 MiB log: +200 MiB.
    assert!(
        rss_after <= rss_before + 5 * 1024,
        "the daemon's RSS grew from {rss_before} KiB to {rss_after} KiB over 200 cycles"
    );
    assert!(
        c.containers(&id).await.expect("list").is_empty(),
        "a removed container is still listed"
    );
    let sockets = container_sockets(&state_dir);
    assert!(
        sockets.is_empty(),
        "removed containers left their sockets: {sockets:?}"
    );
    // The sandbox still takes a container, at the next index.
    add_and_remove(&c, &id).await;
}

#[tokio::test]
async fn a_sandbox_holds_at_most_sixteen_containers_and_says_so() {
    harness::require_root();
    let daemon = DaemonProcess::start().await;
    let c = daemon.client();
    let max = engine::sandbox::containers::MAX_CONTAINERS;

    let many: Vec<serde_json::Value> = (0..=max)
        .map(|i| serde_json::json!({"name": format!("c{i}")}))
        .collect();
    let (status, message) = refusal(
        c.create(&request(serde_json::json!({"containers": many})))
            .await
            .expect_err("17 containers at creation"),
    );
    assert_eq!(status, 400, "{message}");
    assert!(message.contains(&format!("at most {max}")), "{message}");

    let id = c
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    for i in 0..max {
        c.add_container(
            &id,
            &container(serde_json::json!({"name": format!("c{i}")})),
        )
        .await
        .unwrap_or_else(|e| panic!("container {i}: {e}"));
    }
    let (status, message) = refusal(
        c.add_container(&id, &container(serde_json::json!({"name": "one-more"})))
            .await
            .expect_err("a 17th container"),
    );
    assert_eq!(status, 409, "{message}");
    assert!(message.contains(&format!("{max} containers")), "{message}");
    // Removing one makes room again.
    c.remove_container(&id, "c0").await.expect("remove c0");
    c.add_container(&id, &container(serde_json::json!({"name": "one-more"})))
        .await
        .expect("room after a removal");
}

#[tokio::test]
async fn labels_and_env_past_their_bounds_are_refused_naming_the_limit() {
    harness::require_root();
    let daemon = DaemonProcess::start().await;
    let c = daemon.client();
    let labels: serde_json::Map<String, serde_json::Value> = (0..65)
        .map(|i| (format!("k{i}"), serde_json::Value::from("v")))
        .collect();
    let big = "x".repeat(70 * 1024);
    for (what, body, needle) in [
        (
            "65 labels",
            serde_json::json!({ "labels": labels }),
            "at most 64",
        ),
        (
            "a 70 KiB label",
            serde_json::json!({"labels": {"k": big}}),
            "byte limit",
        ),
        (
            "70 KiB of env",
            serde_json::json!({"env": {"K": big}}),
            "env: ",
        ),
    ] {
        let (status, message) = refusal(c.create(&request(body)).await.expect_err(what));
        assert_eq!(status, 400, "{what}: {message}");
        assert!(message.contains(needle), "{what}: {message}");
    }
    let id = c
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let (status, message) = refusal(
        c.add_container(
            &id,
            &container(serde_json::json!({"name": "db", "env": {"K": big}})),
        )
        .await
        .expect_err("a container's 70 KiB env"),
    );
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("env: "), "{message}");
    assert!(
        c.list().await.expect("list").len() == 1,
        "nothing else was made"
    );
}

#[tokio::test]
async fn an_exec_into_a_stopped_container_agent_fails_within_the_agent_deadline() {
    harness::require_root();
    let daemon = DaemonProcess::start().await;
    let c = daemon.client();
    let id = c
        .create(&request(serde_json::json!({
            "containers": [{"name": "db", "command": ["sleep", "1000"]}]
        })))
        .await
        .expect("create")
        .id;
    // Nothing inside can stop it (no root of the sandbox sees it): the host does, as a wedged
    // agent would be.
    let agents = harness::leaks::container_agent_pids(&daemon.home().cgroup_parent, &id);
    let [agent] = agents[..] else {
        panic!("expected the one container agent, found {agents:?}");
    };
    let agent = Pid::from_raw(agent);
    kill(agent, Signal::SIGSTOP).expect("stop the container's agent");

    let started = Instant::now();
    let request = wire::ExecRequest::new(["true"]);
    let out = tokio::time::timeout(Duration::from_secs(60), async {
        c.exec_in(&id, "db", &request)
            .await
            .expect("exec admitted")
            .collect()
            .await
    })
    .await
    .expect("the exec into a stopped agent hung past 60 s")
    .expect("its output");
    let took = started.elapsed();
    eprintln!(
        "exec into the stopped agent failed after {took:.1?}: {}",
        out.result.error
    );
    assert_eq!(out.result.exit_code, -1, "{:?}", out.result);
    assert!(
        out.result.error.contains("did not answer within 10 s"),
        "{}",
        out.result.error
    );

    // Once it runs again, so do execs.
    kill(agent, Signal::SIGCONT).expect("continue the container's agent");
    let out = c
        .exec_in(&id, "db", &wire::ExecRequest::new(["echo", "back"]))
        .await
        .expect("exec")
        .collect()
        .await
        .expect("output");
    assert_eq!(out.stdout, b"back\n", "{:?}", out.result);
}
