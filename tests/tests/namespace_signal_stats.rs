//! `POST /sandboxes/{id}/signal` and `GET /sandboxes/{id}/stats` through the real daemon: a
//! signal reaches every command of the sandbox (a trap sees SIGTERM, SIGKILL ends a sleep) and
//! never the agent, which serves the next command; with an `exec_id` it reaches that command
//! alone; stats come from the sandbox's cgroups.

use client::ClientError;
use harness::{sh, spawn_exec, spawn_request, wait_for_process, TestDaemon};
use wire::ExecRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_reaches_every_command_but_never_the_agent() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = daemon.sandbox().await;

    let script = "trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 0.05; done";
    let trapped = spawn_exec(&c, &id, &["sh", "-c", script]);
    let sleeper = spawn_exec(&c, &id, &["sleep", "1000"]);
    wait_for_process(&c, &id, "sleep 1000").await;
    wait_for_process(&c, &id, "trap").await;
    c.signal(&id, 15).await.expect("SIGTERM");
    let out = trapped.await.expect("join");
    assert_eq!(
        (
            String::from_utf8_lossy(&out.stdout).as_ref(),
            out.result.exit_code
        ),
        ("ready\ngot-term\n", 9),
        "{:?}",
        out.result
    );
    // sleep has no handler: SIGTERM ended it too.
    let out = sleeper.await.expect("join");
    assert_eq!(out.result.signal, "SIGTERM", "{:?}", out.result);

    // SIGKILL, the agent untouched: it serves the next command.
    let sleeper = spawn_exec(&c, &id, &["sleep", "1000"]);
    wait_for_process(&c, &id, "sleep 1000").await;
    c.signal(&id, 9).await.expect("SIGKILL");
    assert_eq!(sleeper.await.expect("join").result.signal, "SIGKILL");
    let (out, _, code) = sh(&c, &id, "echo still here").await;
    assert_eq!((out.as_str(), code), ("still here\n", 0));

    for bad in [0, 65, -9] {
        let refused = c.signal(&id, bad).await.expect_err("out of range");
        assert!(
            matches!(refused, ClientError::Api { status: 400, .. }),
            "{bad}: {refused}"
        );
    }
    let missing = c
        .signal("sb-0123456789abcdef", 15)
        .await
        .expect_err("no such sandbox");
    assert!(
        matches!(missing, ClientError::Api { status: 404, .. }),
        "{missing}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_report_the_sandboxs_memory_cpu_and_processes() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = c
        .create(&api_types::CreateSandbox {
            memory_mib: Some(256),
            ..api_types::CreateSandbox::default()
        })
        .await
        .expect("create")
        .id;
    let before = c.stats(&id).await.expect("stats");
    assert_eq!(before.memory.limit_bytes, 256 << 20, "{before:?}");
    assert!(before.pids.current >= 1, "the agent is counted: {before:?}");
    // 64 MiB held in the sandbox's tmpfs and a second of busy CPU.
    let (_, err, code) = sh(
        &c,
        &id,
        "head -c 67108864 /dev/zero > /tmp/held; end=$(($(date +%s) + 1)); \
         while [ $(date +%s) -le $end ]; do :; done",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let after = c.stats(&id).await.expect("stats");
    assert!(
        after.memory.usage_bytes >= 64 << 20,
        "the tmpfs file is the sandbox's memory: {after:?}"
    );
    assert!(after.memory.max_usage_bytes >= after.memory.usage_bytes);
    assert!(
        after.cpu.usage_ns >= before.cpu.usage_ns + 500_000_000,
        "a busy second shows: {before:?} → {after:?}"
    );
    assert_eq!(after.memory.oom_kills, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_with_an_exec_id_reaches_that_command_alone() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = daemon.sandbox().await;
    let named = |exec_id: &str, script: &str| ExecRequest {
        exec_id: exec_id.into(),
        ..ExecRequest::new(["sh", "-c", script])
    };
    // The target's child shares its process group: it gets the signal too.
    let target = spawn_request(&c, &id, named("step-1", "sleep 1001 & sleep 1002; wait"));
    let bystander = spawn_request(&c, &id, named("step-2", "sleep 1003; echo survived"));
    wait_for_process(&c, &id, "sleep 1001").await;
    wait_for_process(&c, &id, "sleep 1002").await;
    wait_for_process(&c, &id, "sleep 1003").await;
    c.signal_exec(&id, "step-1", 15).await.expect("SIGTERM");
    let out = target.await.expect("join");
    assert_eq!(out.result.signal, "SIGTERM", "{:?}", out.result);
    let (ps, _, _) = sh(&c, &id, "ps -o args").await;
    assert!(!ps.contains("sleep 1001"), "its group got it: {ps}");
    assert!(ps.contains("sleep 1003"), "the other command runs on: {ps}");

    // Gone: 404. Malformed: 400. Taken: the second command does not start.
    let gone = c
        .signal_exec(&id, "step-1", 15)
        .await
        .expect_err("finished");
    assert!(
        matches!(gone, ClientError::Api { status: 404, .. }),
        "{gone}"
    );
    let bad = c
        .signal_exec(&id, "no/slashes", 15)
        .await
        .expect_err("malformed");
    assert!(matches!(bad, ClientError::Api { status: 400, .. }), "{bad}");
    let taken = c
        .exec_collect(&id, &named("step-2", "echo second"))
        .await
        .expect("exec");
    assert!(
        taken.result.error.contains("is taken") && taken.stdout.is_empty(),
        "{:?}",
        taken.result
    );

    c.signal_exec(&id, "step-2", 9).await.expect("SIGKILL");
    let out = bystander.await.expect("join");
    assert_eq!(out.result.signal, "SIGKILL", "{:?}", out.result);
    let (out, _, code) = sh(&c, &id, "echo still here").await;
    assert_eq!((out.as_str(), code), ("still here\n", 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_sandboxs_limits_change_in_place_and_bad_ones_are_refused() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = c
        .create(&api_types::CreateSandbox {
            memory_mib: Some(256),
            ..api_types::CreateSandbox::default()
        })
        .await
        .expect("create")
        .id;
    let update = |memory_mib, vcpus| api_types::UpdateSandbox { memory_mib, vcpus };
    let info = c
        .update(&id, &update(Some(1024), Some(2)))
        .await
        .expect("update");
    assert_eq!((info.memory_mib, info.vcpus), (1024, 2));
    assert_eq!(c.get(&id).await.expect("get").memory_mib, 1024);
    // The kernel's limit, as the sandbox's commands meet it.
    let stats = c.stats(&id).await.expect("stats");
    assert_eq!(stats.memory.limit_bytes, 1024 << 20, "{stats:?}");
    let root = std::path::Path::new("/sys/fs/cgroup");
    let quota = if root.join("cgroup.controllers").exists() {
        let max = root.join(daemon.cgroup_parent()).join(&id).join("cpu.max");
        std::fs::read_to_string(max).expect("the sandbox's cpu.max")
    } else {
        let dir = root.join("cpu").join(daemon.cgroup_parent()).join(&id);
        std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).expect("the sandbox's CPU quota")
    };
    assert!(quota.starts_with("200000"), "{quota}");
    // Down again, one field alone: the other stays.
    let info = c
        .update(&id, &update(Some(128), None))
        .await
        .expect("shrink");
    assert_eq!((info.memory_mib, info.vcpus), (128, 2));
    let stats = c.stats(&id).await.expect("stats");
    assert_eq!(stats.memory.limit_bytes, 128 << 20, "{stats:?}");
    let (out, _, code) = sh(&c, &id, "echo still-running").await;
    assert_eq!((out.as_str(), code), ("still-running\n", 0));
    for (bad, field) in [
        (update(Some(8), None), "memory_mib"),
        (update(None, Some(999)), "vcpus"),
    ] {
        match c.update(&id, &bad).await {
            Err(ClientError::Api {
                status: 400,
                message,
                ..
            }) => {
                assert!(message.starts_with(field), "{message}")
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert_eq!(c.get(&id).await.expect("get").memory_mib, 128);
}
