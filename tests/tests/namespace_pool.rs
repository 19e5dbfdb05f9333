//! The warm pool (`--pool`) on the namespace backend: hits are served from it and it refills,
//! no instance is handed out twice, a hit carries the request's settings and behaves exactly
//! like a cold sandbox, misses are created as usual, instances that die while waiting are
//! replaced, shutdown leaves nothing behind, and pools past the cap are refused. See
//! docs/pool.md.

use std::collections::{BTreeMap, BTreeSet};

use api_types::{BackendKind, CreateSandbox};
use client::{Client, Endpoint};
use harness::leaks::{agent_pid, assert_nothing_held, assert_sandbox_released, eventually};
use harness::TestDaemon;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use wire::ExecRequest;

/// A namespace daemon keeping `spec` (`--pool` syntax) ready.
fn pooled_daemon(spec: &str) -> TestDaemon {
    let spec: engine::pool::PoolSpec = spec.parse().expect("a valid pool");
    TestDaemon::start_with(move |c| {
        c.engine.default_backend = Some(BackendKind::Namespace);
        c.engine.pools = vec![spec];
    })
}

/// Waits until the daemon's pools hold `n` ready instances.
async fn wait_ready(daemon: &TestDaemon, n: usize) {
    let pool = daemon.state.pool.clone();
    eventually(&format!("{n} ready pooled sandboxes"), || {
        pool.ready_ids().len() == n
    })
    .await;
}

/// A counter from `/metrics` (0 when absent).
async fn counter(c: &Client, name: &str) -> u64 {
    let metrics = c.metrics().await.expect("metrics");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
        .unwrap_or(0)
}

/// The environment a command started by the agent sees, NUL-separated as the kernel keeps it,
/// with the sandbox's own id (its `HOSTNAME`) replaced by a placeholder.
async fn environ(c: &Client, id: &str, env: &[(&str, &str)]) -> String {
    let mut request = ExecRequest::new(["cat", "/proc/self/environ"]);
    request.env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let out = c.exec_collect(id, &request).await.expect("exec");
    assert_eq!(
        out.result.exit_code,
        0,
        "cat /proc/self/environ in {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).replace(id, "<id>")
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn a_matching_create_is_served_from_the_pool_which_refills() {
    let daemon = pooled_daemon("default=2");
    let c = daemon.client();
    wait_ready(&daemon, 2).await;
    let waiting = daemon.state.pool.ready_ids();

    let info = c.create(&CreateSandbox::default()).await.expect("create");
    assert!(
        waiting.contains(&info.id),
        "{} is not one of the ready {waiting:?}",
        info.id
    );
    assert_eq!(counter(&c, "crucible_pool_hits_total").await, 1);
    assert_eq!(counter(&c, "crucible_pool_misses_total").await, 0);
    // No agent was started for it: creating took no longer than a lookup.
    assert!(
        info.timings.create_to_ready_ms < 5.0,
        "a pool hit took {} ms",
        info.timings.create_to_ready_ms
    );
    let out = c
        .exec_collect(&info.id, &ExecRequest::new(["hostname"]))
        .await
        .expect("exec in the hit");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), info.id);

    // It refills to two, with a new id; the one handed out is never there again.
    wait_ready(&daemon, 2).await;
    let refilled = daemon.state.pool.ready_ids();
    assert!(!refilled.contains(&info.id), "{refilled:?}");
    let metrics = c.metrics().await.expect("metrics");
    assert!(
        metrics.contains(
            "crucible_pool_ready{shape=\"default,memory=512,vcpus=1,backend=namespace\"} 2"
        ),
        "{metrics}"
    );
    assert!(
        counter(&c, "crucible_pool_refill_seconds_count").await >= 3,
        "{metrics}"
    );
    c.delete(&info.id).await.expect("delete");
}

#[tokio::test]
async fn concurrent_creates_never_get_the_same_instance() {
    let daemon = pooled_daemon("default=3");
    let c = daemon.client();
    wait_ready(&daemon, 3).await;
    let creates = (0..6).map(|_| {
        let c = c.clone();
        async move { c.create(&CreateSandbox::default()).await.expect("create") }
    });
    let infos = futures_util::future::join_all(creates).await;
    let ids: BTreeSet<&str> = infos.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids.len(), 6, "ids handed out twice: {infos:?}");
    let hits = counter(&c, "crucible_pool_hits_total").await;
    let misses = counter(&c, "crucible_pool_misses_total").await;
    // The first three takes find the full pool; a refill may serve a later one too.
    assert!(hits >= 3, "{hits} hits from a full pool of 3");
    assert_eq!(hits + misses, 6);
    // Six sandboxes, six distinct agents, each its own hostname.
    let parent = daemon.cgroup_parent().to_string();
    let pids: BTreeSet<i32> = ids
        .iter()
        .map(|id| agent_pid(&parent, id).expect("an agent"))
        .collect();
    assert_eq!(pids.len(), 6);
    for id in &ids {
        let out = c
            .exec_collect(id, &ExecRequest::new(["hostname"]))
            .await
            .expect("exec");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), *id);
    }
}

#[tokio::test]
async fn a_hit_carries_the_requests_owner_labels_ttl_and_env() {
    const ALICE: &str = "alice-key-0123456789abcdef";
    let spec: engine::pool::PoolSpec = "default=1".parse().expect("valid");
    let daemon = TestDaemon::start_with(move |c| {
        c.engine.default_backend = Some(BackendKind::Namespace);
        c.engine.pools = vec![spec];
        c.tcp = Some("127.0.0.1:0".parse().expect("addr"));
        c.api_keys = api::ApiKeys::parse(&format!("alice:{ALICE}")).expect("valid keys");
    });
    wait_ready(&daemon, 1).await;
    let waiting = daemon.state.pool.ready_ids();
    let alice = Client::new(Endpoint::Tcp(daemon.tcp.expect("tcp address").to_string()))
        .with_api_key(ALICE);
    let request = CreateSandbox {
        ttl_s: Some(120),
        labels: map(&[("job", "42")]),
        env: map(&[("GREETING", "hello from the request")]),
        ..CreateSandbox::default()
    };
    let info = alice.create(&request).await.expect("create");
    assert!(waiting.contains(&info.id), "not a hit: {info:?}");
    assert_eq!(info.owner.as_deref(), Some("alice"));
    assert_eq!(info.labels, map(&[("job", "42")]));
    let lifetime = info.expires_at_ms.saturating_sub(info.created_at_ms);
    assert!(
        (115_000..=120_500).contains(&lifetime),
        "TTL of 120 s gave a lifetime of {lifetime} ms"
    );
    let out = alice
        .exec_collect(&info.id, &ExecRequest::new(["sh", "-c", "echo $GREETING"]))
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"hello from the request\n");
}

#[tokio::test]
async fn a_pooled_sandbox_given_env_runs_commands_exactly_like_a_cold_one() {
    // The pool's shape has 512 MiB; the cold sandbox asks for 256 so that it is created
    // with its env, as without a pool.
    let daemon = pooled_daemon("default=1,memory=512");
    let c = daemon.client();
    wait_ready(&daemon, 1).await;
    let env = map(&[
        ("GREETING", "hi"),
        ("PATH", "/usr/local/bin:/bin:/usr/bin"),
        ("HOME", "/tmp"),
        ("ZZ_LAST", "z"),
    ]);
    let pooled = c
        .create(&CreateSandbox {
            env: env.clone(),
            ..CreateSandbox::default()
        })
        .await
        .expect("pooled create");
    assert_eq!(counter(&c, "crucible_pool_hits_total").await, 1);
    let cold = c
        .create(&CreateSandbox {
            env,
            memory_mib: Some(256),
            ..CreateSandbox::default()
        })
        .await
        .expect("cold create");
    assert_eq!(counter(&c, "crucible_pool_hits_total").await, 1);
    assert_eq!(counter(&c, "crucible_pool_unpooled_total").await, 1);

    for overrides in [
        &[][..],
        &[("GREETING", "from the exec")][..],
        &[("PATH", "/bin"), ("EXTRA", "1")][..],
    ] {
        let from_pool = environ(&c, &pooled.id, overrides).await;
        let from_cold = environ(&c, &cold.id, overrides).await;
        assert_eq!(
            from_pool.split('\0').collect::<Vec<_>>(),
            from_cold.split('\0').collect::<Vec<_>>(),
            "with exec env {overrides:?}"
        );
        assert!(from_pool.contains("HOSTNAME=<id>"), "{from_pool:?}");
    }
    // PATH from the sandbox's env is the one commands are looked up on, in both.
    for id in [&pooled.id, &cold.id] {
        let out = c
            .exec_collect(
                id,
                &ExecRequest::new(["sh", "-c", "echo $PATH $HOME $GREETING"]),
            )
            .await
            .expect("exec");
        assert_eq!(out.stdout, b"/usr/local/bin:/bin:/usr/bin /tmp hi\n");
    }
}

#[tokio::test]
async fn a_create_that_matches_no_pool_is_made_as_usual() {
    let daemon = pooled_daemon("default=1");
    let c = daemon.client();
    wait_ready(&daemon, 1).await;
    let waiting = daemon.state.pool.ready_ids();
    let other = c
        .create(&CreateSandbox {
            memory_mib: Some(256),
            vcpus: Some(1),
            ..CreateSandbox::default()
        })
        .await
        .expect("create of another shape");
    assert!(!waiting.contains(&other.id));
    assert_eq!(other.memory_mib, 256);
    assert_eq!(counter(&c, "crucible_pool_hits_total").await, 0);
    assert_eq!(counter(&c, "crucible_pool_unpooled_total").await, 1);
    // The pool is untouched.
    assert_eq!(daemon.state.pool.ready_ids(), waiting);
    let out = c
        .exec_collect(&other.id, &ExecRequest::new(["echo", "ok"]))
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"ok\n");

    // Asking for the pooled shape spelled out is a hit.
    let same = c
        .create(&CreateSandbox {
            memory_mib: Some(512),
            vcpus: Some(1),
            image: Some("default".into()),
            backend: Some(BackendKind::Namespace),
            ..CreateSandbox::default()
        })
        .await
        .expect("create of the pooled shape");
    assert_eq!(waiting, vec![same.id]);
    assert_eq!(counter(&c, "crucible_pool_hits_total").await, 1);
}

#[tokio::test]
async fn a_pooled_sandbox_killed_while_waiting_is_replaced() {
    let daemon = pooled_daemon("default=1");
    let c = daemon.client();
    wait_ready(&daemon, 1).await;
    let victim = daemon.state.pool.ready_ids().remove(0);
    let parent = daemon.cgroup_parent().to_string();
    let pid = agent_pid(&parent, &victim).expect("the pooled agent");
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill the pooled agent");

    let pool = daemon.state.pool.clone();
    eventually("a replacement in the pool", || {
        let ids = pool.ready_ids();
        ids.len() == 1 && ids[0] != victim
    })
    .await;
    assert_eq!(counter(&c, "crucible_pool_died_total").await, 1);
    let state_dir = daemon.state.config.state_dir.clone();
    assert_sandbox_released(&state_dir, &parent, &victim).await;

    // The replacement is handed out, and it works; the dead one never is.
    let info = c.create(&CreateSandbox::default()).await.expect("create");
    assert_ne!(info.id, victim);
    assert_eq!(counter(&c, "crucible_pool_hits_total").await, 1);
    let out = c
        .exec_collect(&info.id, &ExecRequest::new(["echo", "ok"]))
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"ok\n");
}

#[tokio::test]
async fn stopping_the_daemon_destroys_pooled_sandboxes_too() {
    let daemon = pooled_daemon("default=2,memory=256");
    let c = daemon.client();
    wait_ready(&daemon, 2).await;
    let hit = c
        .create(&CreateSandbox {
            memory_mib: Some(256),
            ..CreateSandbox::default()
        })
        .await
        .expect("create");
    assert_eq!(counter(&c, "crucible_pool_hits_total").await, 1);
    let state_dir = daemon.state.config.state_dir.clone();
    let parent = daemon.cgroup_parent().to_string();
    assert!(agent_pid(&parent, &hit.id).is_some());
    daemon.stop();
    assert_nothing_held(&state_dir, &parent).await;
}

#[tokio::test]
async fn pools_that_leave_no_room_under_the_cap_are_refused_at_startup() {
    harness::require_root();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = api::ServeConfig::new(harness::image_dir());
    let socket = dir.path().join("crucible.sock");
    config.unix_socket = Some(socket.clone());
    config.engine.state_dir = dir.path().join("state");
    config.engine.storage.data_dir = dir.path().join("data");
    config.engine.cgroup_parent = format!("crucible-test-pool-cap-{}", std::process::id());
    config.engine.default_backend = Some(BackendKind::Namespace);
    config.engine.limits.max_sandboxes = 4;
    config.engine.pools = vec![
        "default=2".parse().expect("valid"),
        "default=2,memory=256".parse().expect("valid"),
    ];
    let error = api::server::BackgroundDaemon::start(config, None)
        .expect_err("4 pooled of at most 4 sandboxes")
        .to_string();
    assert!(
        error.contains("leaves no room under --max-sandboxes 4"),
        "{error}"
    );
    assert!(!socket.exists(), "nothing was bound");
}

#[test]
fn an_unknown_pool_key_is_refused_with_the_key_named() {
    let error = "default=1,gpu=1"
        .parse::<engine::pool::PoolSpec>()
        .expect_err("unknown key")
        .to_string();
    assert!(error.contains("unknown key \"gpu\""), "{error}");
}
