//! containerd (1.6, as Debian 12 ships it) and `ctr` running containers through
//! `containerd-shim-crucible-v2` on a real crucible daemon: output, exit statuses, signals,
//! execs, metrics, OOM, and nothing left behind.
//!
//! Each test starts its own daemon and its own containerd (root, state, sockets and FIFOs in a
//! temporary directory, CRI disabled). containerd finds the shim on its `PATH` and passes its
//! environment (`CRUCIBLE_HOST`) on to it.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::leaks;
use harness::TestDaemon;

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread")]
async fn ctr_run_rm_prints_the_output_exits_zero_and_leaves_nothing() {
    let daemon = TestDaemon::start();
    let containerd = Containerd::start(&daemon);
    for id in ["c1", "c1-again"] {
        let started = Instant::now();
        let out = containerd.run_container(id, &[], &["echo", "hi"]);
        eprintln!("ctr run --rm … {id} echo hi: {:?}", started.elapsed());
        assert!(
            out.status.success(),
            "ctr run: {:?}, stderr {}; containerd's log:\n{}",
            out.status,
            text(&out.stderr),
            containerd.log()
        );
        assert_eq!(text(&out.stdout), "hi\n");
    }
    let images: Vec<String> = daemon
        .client()
        .images()
        .await
        .expect("list images")
        .into_iter()
        .map(|i| i.name)
        .filter(|n| n.starts_with(shim::IMAGE_PREFIX))
        .collect();
    assert_eq!(
        images.len(),
        1,
        "one image for one layer chain, reused: {images:?}"
    );
    containerd.assert_nothing_left(&daemon).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_containerd_images_are_pruned_at_a_delete_and_held_ones_kept() {
    let daemon = TestDaemon::start();
    let containerd = Containerd::start_with_env(&daemon, &[("CRUCIBLE_SHIM_IMAGE_IDLE", "0")]);
    let c = daemon.client();
    let containerd_images = || async {
        c.images()
            .await
            .expect("list images")
            .into_iter()
            .map(|i| i.name)
            .filter(|n| n.starts_with(shim::IMAGE_PREFIX))
            .collect::<Vec<_>>()
    };
    // A running container holds its image through a prune at another's delete.
    containerd.start_detached("held", &["sleep", "1000"], Duration::from_secs(60));
    let out = containerd.run_container("short", &[], &["echo", "hi"]);
    assert_eq!(text(&out.stdout), "hi\n", "{}", text(&out.stderr));
    assert_eq!(
        containerd_images().await.len(),
        1,
        "held by the running one"
    );
    // Its own delete, with nothing left using the image (idle 0): pruned.
    containerd.kill_and_delete_task("held");
    assert_eq!(containerd_images().await, Vec::<String>::new());
    containerd.run_ok(&["container", "rm", "held"]);
    containerd.assert_nothing_left(&daemon).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stdout_and_stderr_stay_apart_and_the_exit_code_is_reported() {
    let daemon = TestDaemon::start();
    let containerd = Containerd::start(&daemon);
    let out = containerd.run_container("c2", &[], &["sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "stderr {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "out\n");
    assert_eq!(text(&out.stderr), "err\n");
    containerd.assert_nothing_left(&daemon).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_task_reports_128_plus_the_signal() {
    let daemon = TestDaemon::start();
    let containerd = Containerd::start(&daemon);
    // SIGTERM kills `sleep` here: crucible's agent is PID 1, so the command is not (under runc
    // the command is PID 1 and ignores it).
    for (id, signal, status) in [("c3", "SIGKILL", 137), ("c3-term", "SIGTERM", 143)] {
        let run = containerd.spawn_container(id, &["--rm"], &["sleep", "100"]);
        containerd.wait_for_status(id, "RUNNING");
        let kill = containerd.run(&["task", "kill", "-s", signal, id]);
        assert!(
            kill.status.success(),
            "ctr task kill: {}",
            text(&kill.stderr)
        );
        let out = finish_within(run, Duration::from_secs(30), "ctr run sleep 100");
        assert_eq!(
            out.status.code(),
            Some(status),
            "{signal}: stderr {}",
            text(&out.stderr)
        );
    }
    containerd.assert_nothing_left(&daemon).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_metrics_and_kill_delete_rm_on_a_running_container() {
    let daemon = TestDaemon::start();
    let containerd = Containerd::start(&daemon);
    containerd.start_detached("c4", &["sleep", "1000"], Duration::from_secs(60));

    let fifo = containerd.fifo_dir();
    let exec = containerd.run(&[
        "task",
        "exec",
        "--fifo-dir",
        &fifo,
        "--exec-id",
        "e1",
        "c4",
        "sh",
        "-c",
        "echo exec-out; exit 7",
    ]);
    assert_eq!(exec.status.code(), Some(7), "stderr {}", text(&exec.stderr));
    assert_eq!(text(&exec.stdout), "exec-out\n");

    // `--tty` runs the exec on a terminal of the sandbox's, sized through ResizePty as ctr's
    // own terminal is (script(1) gives ctr one, which `stty` sizes first).
    let ctr = containerd.ctr(&[
        "task",
        "exec",
        "--fifo-dir",
        &fifo,
        "--tty",
        "--exec-id",
        "e-tty",
        "c4",
        "sh",
        "-c",
        "tty; sleep 1; stty size; echo on-stderr >&2; exit 5",
    ]);
    let ctr_line = std::iter::once(ctr.get_program())
        .chain(ctr.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ");
    let on_terminal = output_within(
        {
            let mut script = Command::new("script");
            script
                .args(["-q", "-e", "-c"])
                .arg(format!("stty rows 33 cols 99; exec {ctr_line}"))
                .arg("/dev/null")
                .stdin(Stdio::null());
            script
        },
        Duration::from_secs(60),
    );
    let shown = text(&on_terminal.stdout);
    assert_eq!(
        on_terminal.status.code(),
        Some(5),
        "{shown:?} {}",
        text(&on_terminal.stderr)
    );
    assert!(shown.contains("/dev/pts/"), "{shown:?}");
    // (script's own terminal adds a `\r` to each line ending, and echoes what it types.)
    assert!(shown.contains("33 99\r"), "{shown:?}");
    assert!(
        shown.contains("on-stderr\r"),
        "stderr on the terminal: {shown:?}"
    );

    // An exec's own user, and the spec's rlimits (containerd's default spec gives
    // RLIMIT_NOFILE 1024:1024), reach the command.
    let exec = containerd.run(&[
        "task",
        "exec",
        "--fifo-dir",
        &fifo,
        "--exec-id",
        "e2",
        "--user",
        "4321",
        "c4",
        "sh",
        "-c",
        "id -u; ulimit -n; ulimit -Hn",
    ]);
    assert!(exec.status.success(), "stderr {}", text(&exec.stderr));
    assert_eq!(text(&exec.stdout), "4321\n1024\n1024\n");

    // `task kill --exec-id` ends that exec alone (143 for SIGTERM); the container runs on.
    let long = containerd.spawn(
        &[
            "task",
            "exec",
            "--fifo-dir",
            &fifo,
            "--exec-id",
            "e3",
            "c4",
            "sleep",
            "2000",
        ],
        Stdio::null(),
    );
    let sandboxes = daemon.client().list().await.expect("list sandboxes");
    let sandbox = &sandboxes.first().expect("the container's sandbox").id;
    harness::wait_for_process(&daemon.client(), sandbox, "sleep 2000").await;
    let kill = containerd.run(&["task", "kill", "--exec-id", "e3", "-s", "SIGTERM", "c4"]);
    assert!(
        kill.status.success(),
        "ctr task kill --exec-id: {}",
        text(&kill.stderr)
    );
    let long = finish_within(long, Duration::from_secs(30), "ctr task exec e3");
    assert_eq!(long.status.code(), Some(143), "{}", text(&long.stderr));
    assert_eq!(containerd.task_status("c4").as_deref(), Some("RUNNING"));
    let (ps, _, _) = harness::sh(&daemon.client(), sandbox, "ps -o args").await;
    assert!(ps.contains("sleep 1000"), "the container's process: {ps}");

    let table = text(&containerd.run_ok(&["task", "metrics", "c4"]).stdout);
    assert!(
        metric(&table, "memory.usage_in_bytes").is_some_and(|v| v > 0),
        "no memory usage in:\n{table}"
    );
    assert!(
        metric(&table, "cpuacct.usage").is_some_and(|v| v > 0),
        "no CPU usage in:\n{table}"
    );

    containerd.kill_and_delete_task("c4");
    containerd.run_ok(&["container", "rm", "c4"]);
    containerd.assert_nothing_left(&daemon).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oom_kill_is_reported_as_137_and_an_oom_event() {
    let daemon = TestDaemon::start();
    let containerd = Containerd::start(&daemon);
    let mut events = containerd
        .ctr(&["events"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ctr events");
    let seen = Arc::new(Mutex::new(String::new()));
    let reader = {
        let (seen, mut stdout) = (seen.clone(), events.stdout.take().expect("piped"));
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().expect("events").push_str(&text(&buf[..n]));
            }
        })
    };
    // Subscribed before the run: events of namespaces made until one shows up.
    let mut subscribed = false;
    for attempt in 0..50 {
        let probe = format!("events-probe-{attempt}");
        let made = containerd.run(&["namespaces", "create", &probe]);
        assert!(
            made.status.success(),
            "ctr namespaces create: {}",
            text(&made.stderr)
        );
        let deadline = Instant::now() + Duration::from_millis(200);
        while Instant::now() < deadline && !subscribed {
            subscribed = seen.lock().expect("events").contains(&probe);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if subscribed {
            break;
        }
    }
    assert!(subscribed, "ctr events never showed an event");
    // dd's 64 MiB buffer cannot fit in 32 MiB.
    let out = containerd.run_container(
        "c6",
        &["--memory-limit", "33554432"],
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"],
    );
    assert_eq!(out.status.code(), Some(137), "stderr {}", text(&out.stderr));
    leaks::eventually("the task's delete event", || {
        seen.lock().expect("events").contains("/tasks/delete")
    })
    .await;
    let _ = events.kill();
    let _ = events.wait();
    let _ = reader.join();
    let seen = seen.lock().expect("events").clone();
    let oom = seen.find("/tasks/oom");
    let exit = seen.find("/tasks/exit");
    assert!(oom.is_some(), "no /tasks/oom event in:\n{seen}");
    assert!(oom < exit, "the oom event comes before the exit:\n{seen}");
    assert!(seen.contains("\"exit_status\":137"), "exit 137 in:\n{seen}");
    containerd.assert_nothing_left(&daemon).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stdin_reaches_the_command_and_its_end_ends_it() {
    let daemon = TestDaemon::start();
    let containerd = Containerd::start(&daemon);
    let fifo = containerd.fifo_dir();
    containerd.note("c5");
    let mut run = containerd.spawn(
        &[
            "run",
            "--rm",
            "--runtime",
            RUNTIME,
            "--fifo-dir",
            &fifo,
            IMAGE,
            "c5",
            "cat",
        ],
        Stdio::piped(),
    );
    // Fed once the task runs: ctr only closes the task's stdin (CloseIO) after its own start,
    // an early end-of-file is lost with runc too.
    containerd.wait_for_status("c5", "RUNNING");
    let mut stdin = run.stdin.take().expect("piped");
    std::io::Write::write_all(&mut stdin, b"from-stdin\n").expect("write");
    drop(stdin);
    let out = finish_within(run, Duration::from_secs(30), "ctr run cat");
    assert!(out.status.success(), "ctr run cat: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "from-stdin\n");
    containerd.assert_nothing_left(&daemon).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_lost_under_a_running_task_ends_it_with_255_and_says_why() {
    let daemon = TestDaemon::start();
    let containerd = Containerd::start(&daemon);
    let run = containerd.spawn_container("c8", &["--rm"], &["sleep", "100"]);
    containerd.wait_for_status("c8", "RUNNING");
    let client = daemon.client();
    let sandboxes = client.list().await.expect("list");
    let sandbox = sandboxes
        .iter()
        .find(|s| s.labels.get("containerd.id").map(String::as_str) == Some("c8"))
        .unwrap_or_else(|| panic!("no sandbox labelled containerd.id=c8: {sandboxes:?}"));
    client
        .delete(&sandbox.id)
        .await
        .expect("delete the sandbox");
    let out = finish_within(run, Duration::from_secs(30), "ctr run sleep 100");
    assert_eq!(out.status.code(), Some(255), "stderr {}", text(&out.stderr));
    assert!(
        text(&out.stderr).starts_with("crucible: "),
        "the reason on stderr: {}",
        text(&out.stderr)
    );
    containerd.assert_nothing_left(&daemon).await;
}

/// A daemon restarted under a running task, twice (killed, then stopped for an upgrade), is
/// invisible to containerd: the task stays RUNNING, its output goes on (every line once, in
/// order), stdin fed after the restarts reaches it, and its exit is reported with its status.
#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_restarted_under_a_running_task_is_invisible_to_containerd() {
    use harness::process::{DaemonHome, DaemonProcess};
    use nix::sys::signal::Signal;
    let home = DaemonHome::new();
    let live = ["--live-restore"];
    let mut daemon = DaemonProcess::start_in(&home, &live).await;
    let containerd = Containerd::start_for(&home.socket(), &[]);
    let fifo = containerd.fifo_dir();
    containerd.note("c10");
    // Ticks for about 15 s, then echoes its stdin, then exits 5.
    let script = "i=0; while [ $i -lt 60 ]; do echo tick$i; i=$((i+1)); sleep 0.25; done; \
                  cat; exit 5";
    let mut run = containerd.spawn(
        &[
            "run",
            "--rm",
            "--runtime",
            RUNTIME,
            "--fifo-dir",
            &fifo,
            IMAGE,
            "c10",
            "sh",
            "-c",
            script,
        ],
        Stdio::piped(),
    );
    containerd.wait_for_status("c10", "RUNNING");
    std::thread::sleep(Duration::from_secs(2));

    daemon.stop_with(Signal::SIGKILL);
    // The shim waits for the daemon; containerd still sees the task run.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(containerd.task_status("c10").as_deref(), Some("RUNNING"));
    let mut daemon = DaemonProcess::start_in(&home, &live).await;
    std::thread::sleep(Duration::from_secs(3));

    assert!(daemon.stop_with(Signal::SIGTERM).success());
    assert_eq!(containerd.task_status("c10").as_deref(), Some("RUNNING"));
    let daemon = DaemonProcess::start_in(&home, &live).await;
    assert_eq!(containerd.task_status("c10").as_deref(), Some("RUNNING"));

    let mut stdin = run.stdin.take().expect("piped");
    std::io::Write::write_all(&mut stdin, b"after-restarts\n").expect("write");
    drop(stdin);
    let out = finish_within(run, Duration::from_secs(60), "ctr run");
    let expected: String = (0..60)
        .map(|i| format!("tick{i}\n"))
        .chain(["after-restarts\n".to_string()])
        .collect();
    assert_eq!(
        text(&out.stdout),
        expected,
        "every line once, in order; stderr {}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(5), "stderr {}", text(&out.stderr));
    let sandboxes = daemon.client().list().await.expect("list");
    assert!(sandboxes.is_empty(), "sandboxes left: {sandboxes:?}");
    leaks::eventually("the shims to exit", || containerd.shims().is_empty()).await;
    leaks::eventually("the sandbox cgroups to go", || {
        leaks::sandbox_cgroups(&home.cgroup_parent).is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_runs_as_a_qemu_tcg_microvm_with_its_output_status_and_metrics() {
    a_container_runs_as_a_microvm(api_types::Hypervisor::QemuTcg).await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(crucible_hardware_kvm),
    ignore = "needs hardware KVM (kvm_intel/kvm_amd) to boot the image; on other hosts `cargo xtask nested` runs it inside a nested-KVM L1"
)]
async fn a_container_runs_as_a_crucible_vmm_microvm_with_its_output_status_and_metrics() {
    a_container_runs_as_a_microvm(api_types::Hypervisor::CrucibleVmm).await;
}

/// A container as a microVM sandbox on `hv`: its output and exit status, a detached one's
/// metrics, and nothing left after it.
async fn a_container_runs_as_a_microvm(hv: api_types::Hypervisor) {
    let daemon = TestDaemon::start_microvm(hv, |_| {});
    let containerd = Containerd::start(&daemon);
    let out = containerd.run_container(
        "vm1",
        &[],
        &[
            "sh",
            "-c",
            "echo hi from $(uname -r); test -d /sys/block/vda && exit 4",
        ],
    );
    assert_eq!(out.status.code(), Some(4), "stderr {}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("hi from "),
        "{}",
        text(&out.stdout)
    );

    containerd.start_detached("vm2", &["sleep", "1000"], Duration::from_secs(120));
    let table = text(&containerd.run_ok(&["task", "metrics", "vm2"]).stdout);
    for name in ["memory.usage_in_bytes", "cpuacct.usage"] {
        assert!(
            metric(&table, name).is_some_and(|v| v > 0),
            "no {name} in:\n{table}"
        );
    }
    containerd.kill_and_delete_task("vm2");
    containerd.run_ok(&["container", "rm", "vm2"]);
    containerd.assert_nothing_left(&daemon).await;
}
