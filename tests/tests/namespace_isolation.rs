//! Escape attempts from inside a namespace sandbox; every one must fail.

use api_types::CreateSandbox;
use harness::TestDaemon;
use wire::ExecRequest;

async fn sh(c: &client::Client, id: &str, script: &str) -> (String, i32) {
    let out = c
        .exec_collect(id, &ExecRequest::new(["sh", "-c", script]))
        .await
        .expect("exec");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (text, out.result.exit_code)
}

#[tokio::test]
async fn commands_cannot_escape_the_namespace_sandbox() {
    let daemon = TestDaemon::start_with(|c| {
        c.tcp = Some("127.0.0.1:0".parse().expect("addr"));
        c.api_keys = harness::keys(&["daemon-secret-key"]);
    });
    let c = daemon.client().with_api_key("daemon-secret-key");
    let id = c
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let image = harness::image_dir().join("rootfs");

    // Writes land in the overlay, never in the image.
    let (_, code) = sh(&c, &id, "echo owned > /escape-marker && cat /escape-marker").await;
    assert_eq!(code, 0, "the sandbox's root is writable");
    assert!(
        !image.join("escape-marker").exists(),
        "the image was written to"
    );
    let (_, code) = sh(&c, &id, "rm /bin/ls && ! test -e /bin/ls").await;
    assert_eq!(code, 0, "image files can be removed inside");
    assert!(image.join("bin/ls").exists(), "…but not from the image");

    // Host processes are invisible: PID 1 is the agent and the only other processes are ours.
    let (ps, _) = sh(&c, &id, "ls /proc | grep -c '^[0-9]'").await;
    let visible: usize = ps.trim().parse().expect("a count");
    assert!(visible <= 5, "{visible} processes visible");
    let (comm, _) = sh(&c, &id, "cat /proc/1/comm").await;
    assert_eq!(comm.trim(), "init");

    // No network but loopback: the daemon's TCP port on the host is unreachable.
    let port = daemon.tcp.expect("tcp").port();
    let (ifaces, _) = sh(&c, &id, "ls /sys/class/net 2>/dev/null; cat /proc/net/dev").await;
    assert!(!ifaces.contains("eth"), "{ifaces}");
    let (_, code) = sh(&c, &id, &format!("nc -w 2 127.0.0.1 {port} </dev/null")).await;
    assert_ne!(code, 0, "reached the host's loopback");

    // The daemon's keys are not in the sandbox's environment.
    let (env, _) = sh(&c, &id, "env; cat /proc/1/environ | tr '\\0' '\\n'").await;
    assert!(!env.contains("daemon-secret-key"), "{env}");

    // Root inside holds only the namespaced capabilities it needs, bounded for good, under
    // the seccomp allowlist; mounting, unsharing, rebooting and renaming the host all fail.
    // (namespace_escape.rs attacks each class in depth.)
    let kept = format!("{:016x}", namespace::privileges::kept_mask());
    let (caps, _) = sh(&c, &id, "grep -E 'Cap(Eff|Prm|Bnd)' /proc/self/status").await;
    for line in caps.lines() {
        assert!(line.ends_with(&kept), "{line}");
    }
    let (seccomp, _) = sh(&c, &id, "grep '^Seccomp:' /proc/self/status").await;
    assert!(seccomp.contains('2'), "filter mode: {seccomp}");
    for attempt in [
        "mount -t tmpfs none /mnt",
        "mount -t proc proc /proc",
        "unshare -U true",
        "unshare -n true",
        "reboot -f",
        "hostname evil",
        "ip link add dummy0 type dummy",
    ] {
        let (out, code) = sh(&c, &id, attempt).await;
        assert_ne!(code, 0, "{attempt} succeeded: {out}");
    }
    let (name, _) = sh(&c, &id, "hostname").await;
    assert_eq!(name.trim(), id);

    // The host's filesystem is gone after pivot_root.
    let (_, code) = sh(&c, &id, "test -e /etc/shadow || test -e /root/.cargo").await;
    assert_ne!(code, 0, "host files are visible");

    // Memory and process limits hold, and the agent survives both.
    let limited = c
        .create(&CreateSandbox {
            memory_mib: Some(64),
            ..Default::default()
        })
        .await
        .expect("create")
        .id;
    let out = c
        .exec_collect(
            &limited,
            &ExecRequest::new(["sh", "-c", "x=a; while true; do x=$x$x; done"]),
        )
        .await
        .expect("exec");
    assert_eq!(out.result.signal, "SIGKILL", "{:?}", out.result);
    assert!(out.result.oom_killed, "{:?}", out.result);
    let (after, code) = sh(&c, &limited, "echo still here").await;
    assert_eq!((after.trim(), code), ("still here", 0));

    let bomb = c
        .exec_collect(
            &id,
            &ExecRequest {
                timeout_s: 5,
                ..ExecRequest::new(["sh", "-c", "for i in $(seq 2000); do sleep 30 & done; wait"])
            },
        )
        .await
        .expect("exec");
    assert!(
        bomb.result.exit_code != 0 || bomb.result.timed_out,
        "{:?}",
        bomb.result
    );
    // The bomb's `sleep`s outlive it and fill the commands' process limit, but that limit
    // leaves the agent room: it still answers, and still starts a command.
    let stats = c.stats(&id).await.expect("stats");
    assert!(
        stats.pids.current >= stats.pids.limit / 2,
        "the bomb's leftovers are gone already: {:?}",
        stats.pids
    );
    let after = c
        .exec_collect(&id, &ExecRequest::new(["echo", "agent answers"]))
        .await
        .expect("exec");
    assert_eq!(
        (
            String::from_utf8_lossy(&after.stdout).trim(),
            after.result.exit_code
        ),
        ("agent answers", 0),
        "{:?}",
        after.result
    );
}
