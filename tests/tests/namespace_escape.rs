//! The namespace sandbox's boundary, attacked from inside: one test per class of attack, each
//! trying it as hostile root inside a sandbox and then checking the host, not the sandbox's own
//! word for it. Every attack runs twice: from a plain sandbox's root, and from a container of a
//! pod (a sandbox with a service container and a shared directory beside it), whose root must
//! not reach the host through its own mounts or another container's.
//!
//! System calls a shell cannot make are made by `escape-probe` (tests/probe/escape_probe.c,
//! built static by tests/build.rs), uploaded into the sandbox. Attempts that would harm the host
//! if they succeeded are never made for real: `core_pattern` and `drop_caches` are only tested
//! for writability; the one sysctl actually written is harmless and restored.
//!
//! Per-key ownership, the API side of the boundary, is tests/tests/namespace_ownership.rs.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use api_types::CreateSandbox;
use harness::TestDaemon;
use wire::ExecRequest;

/// Where an attack runs: a plain sandbox's own root, or a container of a sandbox with
/// several, beside a service and a shared directory (a pod): every attack of this file runs
/// from both, and what it checks on the host must hold for both.
struct Sandbox {
    daemon: Arc<TestDaemon>,
    client: client::Client,
    id: String,
    /// The container attacked from, in a pod; `None`: the sandbox's own root.
    container: Option<&'static str>,
}

/// A pod: a service listening on loopback, and the container attacks run in, `job`, whose
/// `/probe` is the shared directory `tools` (the sandbox's own root has it at `/tools`).
fn pod_request() -> CreateSandbox {
    serde_json::from_value(serde_json::json!({
        "shared": [{"name": "tools", "path": "/tools"}],
        "containers": [
            {"name": "svc",
             "command": ["/bin/sh", "-c", "while true; do echo ok | nc -l -p 6379; done"],
             "ready": {"tcp_port": 6379},
             "shared": [{"name": "tools", "path": "/srv/tools"}]},
            {"name": "job",
             "command": ["sleep", "3600"],
             "shared": [{"name": "tools", "path": "/probe"}]}
        ]
    }))
    .expect("a valid create request")
}

impl Sandbox {
    /// A plain sandbox and a pod of `daemon`, to attack from each in turn.
    async fn both(daemon: TestDaemon) -> [Self; 2] {
        let daemon = Arc::new(daemon);
        let client = daemon.client();
        let plain = client
            .create(&CreateSandbox::default())
            .await
            .expect("create")
            .id;
        let pod = client
            .create(&pod_request())
            .await
            .expect("create a pod")
            .id;
        [
            Sandbox {
                daemon: daemon.clone(),
                client: client.clone(),
                id: plain,
                container: None,
            },
            Sandbox {
                daemon,
                client,
                id: pod,
                container: Some("job"),
            },
        ]
    }

    /// Which of the two this is, printed before each attack so a failure says where it was.
    fn announce(&self) {
        match self.container {
            None => println!("--- from sandbox {}'s own root", self.id),
            Some(name) => println!("--- from container {name} of pod {}", self.id),
        }
    }

    /// Runs `cmd` where the attacks run.
    async fn exec(&self, cmd: Vec<&str>) -> client::ExecOutput {
        let request = ExecRequest::new(cmd);
        let out = match self.container {
            None => self.client.exec_collect(&self.id, &request).await,
            Some(name) => match self.client.exec_in(&self.id, name, &request).await {
                Ok(stream) => stream.collect().await,
                Err(e) => Err(e),
            },
        };
        out.expect("exec")
    }

    /// Runs `script` with `sh -c`; stdout, stderr and the exit code.
    async fn sh(&self, script: &str) -> (String, String, i32) {
        let out = self.exec(vec!["sh", "-c", script]).await;
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            out.result.exit_code,
        )
    }

    /// Uploads the escape probe (into `/usr/local/bin`, or for a pod's container into the
    /// shared directory it has at `/probe`) and runs the attempts; the verdict of each (`OK` or
    /// the errno's name).
    async fn probe(&self, attempts: &[&str]) -> BTreeMap<String, String> {
        let probe = Path::new(env!("CRUCIBLE_ESCAPE_PROBE"));
        let (upload_to, run) = match self.container {
            None => ("/usr/local/bin", "/usr/local/bin/escape-probe"),
            Some(_) => ("/tools", "/probe/escape-probe"),
        };
        self.client
            .put_path(&self.id, probe, upload_to)
            .await
            .expect("upload the probe");
        let mut cmd = vec![run];
        cmd.extend_from_slice(attempts);
        let out = self.exec(cmd).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.result.exit_code,
            0,
            "the probe failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let verdicts: BTreeMap<String, String> = stdout
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(a, v)| (a.to_string(), v.to_string()))
            .collect();
        assert_eq!(verdicts.len(), attempts.len(), "{stdout}");
        verdicts
    }

    /// The agent still answers.
    async fn assert_alive(&self) {
        let (out, _, code) = self.sh("echo alive").await;
        assert_eq!((out.trim(), code), ("alive", 0));
    }
}

fn assert_verdicts(verdicts: &BTreeMap<String, String>, expected: &[(&str, &[&str])]) {
    for (attempt, allowed) in expected {
        let got = verdicts
            .get(*attempt)
            .map(String::as_str)
            .unwrap_or("missing");
        assert!(
            allowed.contains(&got),
            "{attempt}: got {got}, expected one of {allowed:?} (all: {verdicts:?})"
        );
    }
}

#[tokio::test]
async fn host_sysctls_cannot_be_written_and_proc_is_masked() {
    for sb in Sandbox::both(TestDaemon::start()).await {
        sb.announce();
        let sysctl = Path::new("/proc/sys/kernel/printk_ratelimit_burst");
        let before = std::fs::read_to_string(sysctl).expect("read the host's sysctl");
        let value: u64 = before.trim().parse().expect("a number");
        let (_, err, code) = sb
            .sh(&format!("echo {} > {}", value + 7, sysctl.display()))
            .await;
        let after = std::fs::read_to_string(sysctl).expect("read the host's sysctl");
        if after != before {
            std::fs::write(sysctl, &before).expect("restore the host's sysctl");
        }
        assert_eq!(after, before, "the sandbox changed a host sysctl");
        assert_ne!(code, 0, "the write reported success: {err}");

        // Opened for writing and closed unwritten: a write to these would act on the host.
        let attempts = [
            "openw:/proc/sys/kernel/core_pattern",
            "openw:/proc/sys/vm/drop_caches",
            "openw:/proc/sys/kernel/sysrq",
            "openw:/proc/sysrq-trigger",
            "openw:/proc/sys/kernel/modprobe",
        ];
        let verdicts = sb.probe(&attempts).await;
        // The first two exist in every kernel; the others depend on its configuration.
        let refused: &[&str] = &["EROFS", "EACCES", "EPERM"];
        let refused_or_absent: &[&str] = &["EROFS", "EACCES", "EPERM", "ENOENT"];
        let expected: Vec<(&str, &[&str])> = attempts
            .iter()
            .enumerate()
            .map(|(i, a)| (*a, if i < 2 { refused } else { refused_or_absent }))
            .collect();
        assert_verdicts(&verdicts, &expected);
        // A fresh procfs is not to be had either.
        let (_, _, code) = sb.sh("mkdir -p /tmp/p && mount -t proc proc /tmp/p").await;
        assert_ne!(code, 0, "mounted a new procfs");

        // runc's masked paths read as nothing; its read-only paths are read-only mounts.
        let (masked, _, _) = sb
            .sh(
                "for f in /proc/kcore /proc/keys /proc/timer_list /proc/sched_debug; do \
             test -e $f && wc -c < $f; done; \
             for d in /proc/acpi /proc/scsi; do test -d $d && ls -A $d | wc -l; done",
            )
            .await;
        for line in masked.lines() {
            assert_eq!(line.trim(), "0", "a masked path has content: {masked:?}");
        }
        let (mounts, _, _) = sb.sh("cat /proc/self/mountinfo").await;
        for path in [
            "/proc/sys",
            "/proc/sysrq-trigger",
            "/proc/irq",
            "/proc/bus",
            "/proc/fs",
        ] {
            if let Some(line) = mounts.lines().find(|l| mount_point(l) == Some(path)) {
                assert!(
                    mount_options(line).contains("ro"),
                    "{path} is not read-only: {line}"
                );
            }
        }
        assert!(
            mounts.lines().any(|l| mount_point(l) == Some("/proc/sys")),
            "/proc/sys is not a read-only mount: {mounts}"
        );
        // No /sys at all.
        let (_, _, code) = sb.sh("test -e /sys/kernel || test -e /sys/fs/cgroup").await;
        assert_ne!(code, 0, "/sys is visible");
        sb.assert_alive().await;
    }
}

#[tokio::test]
async fn sandbox_root_is_an_unprivileged_host_user_of_a_range_of_its_own() {
    let daemon = TestDaemon::start();
    let uid_base = daemon.state.config.uid_base;
    for a in Sandbox::both(daemon).await {
        a.announce();
        let b_id = a
            .client
            .create(&CreateSandbox::default())
            .await
            .expect("create")
            .id;
        let (map, _, _) = a.sh("cat /proc/self/uid_map /proc/self/gid_map").await;
        let ranges: Vec<(u64, u64, u64)> = map
            .lines()
            .map(|l| {
                let f: Vec<u64> = l
                    .split_whitespace()
                    .map(|n| n.parse().expect("a number"))
                    .collect();
                (f[0], f[1], f[2])
            })
            .collect();
        assert_eq!(ranges.len(), 2, "one uid and one gid range: {map}");
        for (inside, outside, count) in &ranges {
            assert_eq!((*inside, *count), (0, 65_536), "{map}");
            assert!(*outside >= u64::from(uid_base), "{map}");
        }
        let a_base = ranges[0].1;

        // From the host: every process of the sandbox runs as the range's base, never as root.
        let (pid_line, _, _) = a.sh("sleep 30 & echo $!; sleep 0.2").await;
        assert!(!pid_line.trim().is_empty());
        let parent = a.daemon.cgroup_parent().to_string();
        let mut seen = 0;
        for cgroup in harness::leaks::sandbox_cgroups(&parent) {
            for pid in harness::leaks::pids_in(&cgroup) {
                let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                    continue;
                };
                let uids = status
                    .lines()
                    .find(|l| l.starts_with("Uid:"))
                    .expect("Uid line");
                let is_supervisor = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                    .unwrap_or_default()
                    .contains("sandbox\0--rootfs");
                if is_supervisor {
                    continue; // the supervisor stays outside, as the daemon's child
                }
                for uid in uids.split_whitespace().skip(1) {
                    let uid: u64 = uid.parse().expect("uid");
                    assert_ne!(uid, 0, "pid {pid} of a sandbox runs as host root: {uids}");
                    assert!(uid >= u64::from(uid_base), "pid {pid}: {uids}");
                }
                seen += 1;
            }
        }
        assert!(seen >= 2, "found {seen} sandbox processes on the host");

        // A second sandbox gets a disjoint range.
        let out = a
            .client
            .exec_collect(&b_id, &ExecRequest::new(["cat", "/proc/self/uid_map"]))
            .await
            .expect("exec");
        let b_base: u64 = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .expect("b's base");
        assert!(
            b_base >= a_base + 65_536 || a_base >= b_base + 65_536,
            "ranges overlap: {a_base} and {b_base}"
        );

        // Root inside still is root for everything the sandbox owns.
        let (out, err, code) = a
            .sh(
                "echo 'builder:x:1000:1000::/home/builder:/bin/sh' >> /etc/passwd && \
             echo 'builder:x:1000:' >> /etc/group && mkdir -p /home/builder && \
             chown 1000:1000 /home/builder && su -s /bin/sh builder -c 'id -u; touch ~/f' && \
             stat -c %u /home/builder/f",
            )
            .await;
        assert_eq!(code, 0, "{out}{err}");
        assert_eq!(
            out.split_whitespace().collect::<Vec<_>>(),
            ["1000", "1000"],
            "{err}"
        );
    }
}

#[tokio::test]
async fn nothing_a_sandbox_writes_reaches_the_host_disk() {
    let daemon = TestDaemon::start_with(|c| c.engine.limits.scratch_mib = 256);
    let state_dir = daemon.state.config.state_dir.clone();
    for sb in Sandbox::both(daemon).await {
        sb.announce();
        // Every writable mount is memory (tmpfs, or the overlay whose upper layer is the tmpfs),
        // a procfs, a devpts or a device node.
        let (mounts, _, _) = sb.sh("cat /proc/self/mountinfo").await;
        for line in mounts.lines() {
            let writable = mount_options(line).split(',').any(|o| o == "rw");
            let fstype = line.split(" - ").nth(1).and_then(|r| r.split(' ').next());
            let device_node = line.split(' ').nth(3).is_some_and(|root| {
                ["/null", "/zero", "/full", "/random", "/urandom", "/tty"].contains(&root)
            });
            assert!(
                !writable
                    || device_node
                    || matches!(fstype, Some("tmpfs" | "overlay" | "proc" | "devpts")),
                "a writable mount of {fstype:?} inside: {line}"
            );
        }

        let disk_used = || {
            let stat = nix::sys::statvfs::statvfs(&state_dir).expect("statvfs");
            (stat.blocks() - stat.blocks_free()) * stat.fragment_size()
        };
        let before = disk_used();
        // Fill everything writable until ENOSPC: 256 MiB in all, wherever it is written.
        let (out, err, _) = sb
            .sh(
                "for d in / /tmp /dev/shm /root /etc /var /home /run /usr; do \
               mkdir -p $d 2>/dev/null; dd if=/dev/zero of=$d/fill bs=1M count=300 2>/dev/null; \
             done; df -k / | tail -1",
            )
            .await;
        let after = disk_used();
        let grew = after.saturating_sub(before);
        assert!(
            grew < 64 * 1024 * 1024,
            "the host disk grew by {} MiB while the sandbox filled its scratch: {out}{err}",
            grew / (1024 * 1024)
        );
        let (written, _, _) = sb.sh("du -sk / 2>/dev/null | tail -1").await;
        let kib: u64 = written
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(
            kib >= 200 * 1024,
            "the fill wrote only {kib} KiB: {written}"
        );
        sb.assert_alive().await;
    }
}

#[tokio::test]
async fn mountinfo_names_no_host_path() {
    let daemon = TestDaemon::start();
    let state_dir = daemon.state.config.state_dir.clone();
    let image_dir = daemon.state.config.image_dir.clone();
    for sb in Sandbox::both(daemon).await {
        sb.announce();
        let (mounts, _, _) = sb
            .sh("cat /proc/self/mountinfo /proc/1/mountinfo /proc/self/mounts 2>/dev/null")
            .await;
        assert!(mounts.contains("overlay"), "{mounts}");
        let host_paths = [
            state_dir.display().to_string(),
            image_dir.display().to_string(),
            std::env::temp_dir()
                .join("crucible-test-")
                .display()
                .to_string(),
            env!("CARGO_MANIFEST_DIR").to_string(),
        ];
        for path in &host_paths {
            assert!(
                !mounts.contains(path.as_str()),
                "mountinfo names {path}: {mounts}"
            );
        }
        for line in mounts.lines().filter(|l| l.contains("lowerdir=")) {
            for option in line.split(',') {
                if let Some((key, value)) = option.split_once('=') {
                    if ["lowerdir", "upperdir", "workdir"]
                        .contains(&key.rsplit(' ').next().unwrap_or(key))
                    {
                        assert!(
                            !value.contains('/'),
                            "an overlay layer names a path: {line}"
                        );
                    }
                }
            }
        }
    }
}

#[tokio::test]
async fn the_agent_cannot_be_traced_read_or_killed_from_inside() {
    for sb in Sandbox::both(TestDaemon::start()).await {
        sb.announce();
        let verdicts = sb
            .probe(&[
                "ptrace-agent",
                "ptrace-seize-agent",
                "vm-read-agent",
                "vm-write-agent",
                "agent-mem",
                "agent-fd",
                "pidfd-getfd-agent",
                "kill-agent",
                "ptrace-own-child",
            ])
            .await;
        assert_verdicts(
            &verdicts,
            &[
                ("ptrace-agent", &["EPERM"]),
                ("ptrace-seize-agent", &["EPERM"]),
                ("vm-read-agent", &["EPERM"]),
                ("vm-write-agent", &["EPERM"]),
                ("agent-mem", &["EACCES", "EPERM"]),
                ("agent-fd", &["EACCES", "EPERM"]),
                ("pidfd-getfd-agent", &["EPERM"]),
                // The kernel drops signals to a PID namespace's init that it has no handler for;
                // kill(2) still reports success. What matters is below: the agent is alive.
                ("kill-agent", &["OK"]),
                // Debuggers and sanitizers work on the workload's own processes.
                ("ptrace-own-child", &["OK"]),
            ],
        );
        for signal in ["KILL", "TERM", "INT", "HUP", "STOP", "SEGV", "ABRT", "USR1"] {
            sb.sh(&format!("kill -{signal} 1")).await;
        }
        let (status, _, _) = sb.sh("grep -E '^(State|Uid)' /proc/1/status").await;
        assert!(
            status.contains("S (sleeping)") || status.contains("R (running)"),
            "{status}"
        );
        sb.assert_alive().await;
    }
}

#[tokio::test]
async fn nested_namespaces_cannot_be_created() {
    for sb in Sandbox::both(TestDaemon::start()).await {
        sb.announce();
        let verdicts = sb
            .probe(&[
                "clone-newuser",
                "clone-newns",
                "clone-newnet",
                "clone-newpid",
                "unshare-user",
                "unshare-mount",
                "setns",
                "clone3",
                "clone-plain",
            ])
            .await;
        assert_verdicts(
            &verdicts,
            &[
                ("clone-newuser", &["EPERM"]),
                ("clone-newns", &["EPERM"]),
                ("clone-newnet", &["EPERM"]),
                ("clone-newpid", &["EPERM"]),
                ("unshare-user", &["EPERM"]),
                ("unshare-mount", &["EPERM"]),
                ("setns", &["EPERM"]),
                // ENOSYS, so that libc falls back to clone(2), whose flags the filter can check.
                ("clone3", &["ENOSYS"]),
                ("clone-plain", &["OK"]),
            ],
        );
        for attempt in ["unshare -U true", "unshare -r true", "unshare -m true"] {
            let (_, _, code) = sb.sh(attempt).await;
            assert_ne!(code, 0, "{attempt} succeeded");
        }
    }
}

#[tokio::test]
async fn kernel_attack_surface_is_refused_by_the_seccomp_allowlist() {
    for sb in Sandbox::both(TestDaemon::start()).await {
        sb.announce();
        let eperm: &[&str] = &["EPERM"];
        let refused = [
            "keyctl",
            "add-key",
            "request-key",
            "bpf",
            "perf-event-open",
            "userfaultfd",
            "io-uring-setup",
            "open-by-handle-at",
            "kexec-load",
            "init-module",
            "finit-module",
            "delete-module",
            "swapon",
            "settimeofday",
            "clock-settime",
            "acct",
            "quotactl",
            "reboot",
            "sethostname",
            "iopl",
            "syslog",
            "mount",
            "umount",
            "pivot-root",
            "fsopen",
            "open-tree",
            "personality-read-implies-exec",
            "socket-vsock",
            "socket-alg",
            "socket-packet",
            "socket-netfilter",
        ];
        let mut attempts: Vec<&str> = refused.to_vec();
        attempts.extend([
            "unknown-syscall",
            "x32-syscall",
            "personality-query",
            "socket-unix",
            "socket-rtnetlink",
        ]);
        let verdicts = sb.probe(&attempts).await;
        let mut expected: Vec<(&str, &[&str])> = refused.iter().map(|a| (*a, eperm)).collect();
        expected.extend([
            // Newer than the table: ENOSYS, so that libc falls back to an older call.
            ("unknown-syscall", &["ENOSYS"][..]),
            ("x32-syscall", &["EPERM", "ENOSYS"][..]),
            ("personality-query", &["OK"][..]),
            ("socket-unix", &["OK"][..]),
            ("socket-rtnetlink", &["OK"][..]),
        ]);
        assert_verdicts(&verdicts, &expected);
        let (name, _, _) = sb.sh("hostname").await;
        assert_eq!(name.trim(), sb.id, "the hostname changed");
        sb.assert_alive().await;
    }
}

/// The mount point (5th field) of a mountinfo line.
fn mount_point(line: &str) -> Option<&str> {
    line.split(' ').nth(4)
}

/// The per-mount options (6th field) of a mountinfo line.
fn mount_options(line: &str) -> &str {
    line.split(' ').nth(5).unwrap_or("")
}

/// The pid of the sandbox's container factory, as the attacker sees it; `None` when it sees
/// none.
async fn factory_pid(sb: &Sandbox) -> Option<String> {
    let (out, _, _) = sb
        .sh(
            "for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = pod-factory ] && \
             echo ${p#/proc/}; done",
        )
        .await;
    let pid = out.trim();
    (!pid.is_empty()).then(|| pid.to_string())
}

#[tokio::test]
async fn the_container_factory_is_out_of_every_roots_sight_and_losing_it_harms_nobody() {
    let daemon = TestDaemon::start();
    let state_dir = daemon.state.config.state_dir.clone();
    let image_dir = daemon.state.config.image_dir.clone();
    for sb in Sandbox::both(daemon).await {
        sb.announce();
        // Commands hold none of the agent's sockets: not the factory's (descriptor 6), nor
        // any other.
        let (fds, _, _) = sb
            .sh("for f in /proc/$$/fd/*; do echo \"$f $(readlink $f)\"; done")
            .await;
        assert!(!fds.contains("socket:"), "a command holds a socket: {fds}");
        assert!(
            !fds.contains("/fd/6 ") && !fds.contains("/fd/7 ") && !fds.contains("cgroup"),
            "a command holds descriptor 6 or 7 (the commands' cgroup): {fds}"
        );
        // Nor can it take the commands' cgroup (descriptor 7) from its agent, PID 1 of its
        // PID namespace, which opened it with the host's credentials.
        let verdicts = sb.probe(&["pidfd-getfd:1:7", "open:/proc/1/fd/7"]).await;
        assert_verdicts(
            &verdicts,
            &[
                ("pidfd-getfd:1:7", &["EPERM", "EACCES"]),
                ("open:/proc/1/fd/7", &["EPERM", "EACCES"]),
            ],
        );
        // Neither the sandbox's own root nor a container sees the factory: it is in the
        // sandbox's first PID namespace, and every root has a PID namespace of its own below
        // it. Nothing inside can name it to trace, enter, read or signal it.
        assert_eq!(
            factory_pid(&sb).await,
            None,
            "a root of the sandbox sees the container factory"
        );
        if sb.container.is_some() {
            continue;
        }
        // Its command line, readable by host root, names nothing of the host (it was forked
        // from the supervisor, whose command line is all host paths).
        let parent = sb.daemon.cgroup_parent().to_string();
        let cgroup = harness::leaks::memory_cgroup(&parent, &sb.id);
        let factory: Vec<i32> = harness::leaks::pids_in(&cgroup)
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "pod-factory")
            })
            .collect();
        let [pid] = factory[..] else {
            panic!(
                "expected one factory in {}, found {factory:?}",
                cgroup.display()
            );
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("its command line");
        assert_eq!(
            String::from_utf8_lossy(&cmdline).replace('\0', " ").trim(),
            "pod-factory",
            "its command line"
        );
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mounts");
        for path in [
            state_dir.display().to_string(),
            image_dir.display().to_string(),
            env!("CARGO_MANIFEST_DIR").to_string(),
        ] {
            assert!(
                !mounts.contains(&path),
                "the factory's mounts name {path}: {mounts}"
            );
        }

        // Lost (killed here from the host), it takes nothing with it: adding a container says
        // why it cannot, everything else runs on.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill the factory");
        let request: api_types::ContainerRequest =
            serde_json::from_value(serde_json::json!({"name": "late"})).expect("request");
        let refused = sb
            .client
            .add_container(&sb.id, &request)
            .await
            .expect_err("no factory");
        assert!(
            refused.to_string().contains("killed or stopped"),
            "{refused}"
        );
        sb.assert_alive().await;
    }
}

/// A container granted `SYS_ADMIN` (as Kubernetes' `privileged: true` is) may mount, in its
/// own mount namespace only: it can take crucible's read-only `/proc/sys` and masks away
/// there, as a privileged container under runc has none, but the kernel's own checks still
/// keep the host's settings, kernel memory and `/sys` out of reach, and nothing it mounts
/// reaches a peer, the sandbox's own root or the host.
#[tokio::test]
async fn a_container_granted_sys_admin_mounts_in_its_own_namespace_only() {
    let daemon = Arc::new(TestDaemon::start());
    let mut request = pod_request();
    request.containers[1].security.capabilities = Some(vec!["ALL".into(), "SYS_ADMIN".into()]);
    let client = daemon.client();
    let id = client.create(&request).await.expect("create a pod").id;
    let admin = Sandbox {
        daemon: daemon.clone(),
        client: client.clone(),
        id: id.clone(),
        container: Some("job"),
    };
    let host_mounts = || std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let before = host_mounts().lines().count();

    // The host's settings, with /proc/sys no longer read-only in the container.
    let sysctl = Path::new("/proc/sys/kernel/printk_ratelimit_burst");
    let value = std::fs::read_to_string(sysctl).expect("read the host's sysctl");
    let (out, err, code) = admin
        .sh(&format!(
            "umount /proc/sys && echo unmounted; echo 99 > {} && echo written",
            sysctl.display()
        ))
        .await;
    assert_eq!(out, "unmounted\n", "{err}");
    assert_ne!(code, 0);
    assert_eq!(
        std::fs::read_to_string(sysctl).expect("read the host's sysctl"),
        value,
        "a host sysctl changed"
    );
    let verdicts = admin
        .probe(&[
            "openw:/proc/sys/vm/drop_caches",
            "openw:/proc/sysrq-trigger",
            "openw:/proc/sys/kernel/core_pattern",
        ])
        .await;
    // drop_caches is in every kernel; the others depend on its configuration.
    let refused: &[&str] = &["EACCES", "EPERM", "EROFS"];
    let refused_or_absent: &[&str] = &["EACCES", "EPERM", "EROFS", "ENOENT"];
    assert_verdicts(
        &verdicts,
        &[
            ("openw:/proc/sys/vm/drop_caches", refused),
            ("openw:/proc/sysrq-trigger", refused_or_absent),
            ("openw:/proc/sys/kernel/core_pattern", refused_or_absent),
        ],
    );

    // A new /proc shows the container's own PID namespace, and no kernel memory; no /sys.
    let (out, err, code) = admin
        // One `ls` reads both `self` links, so the two name one process: the same number
        // when both are of one PID namespace (counting each /proc's processes raced with
        // the shell's own).
        .sh("mkdir -p /tmp/p && mount -t proc proc /tmp/p && \
             test \"$(ls -l /proc/self /tmp/p/self | sed 's/.*-> //' | sort -u | wc -l)\" = 1 && \
             echo own-pids; head -c 1 /tmp/p/kcore >/dev/null 2>&1 || echo no-kcore; \
             mkdir -p /tmp/s && mount -t sysfs sysfs /tmp/s 2>/dev/null || echo no-sysfs")
        .await;
    assert_eq!(
        (out.as_str(), code),
        ("own-pids\nno-kcore\nno-sysfs\n", 0),
        "{err}"
    );

    // A tmpfs over the shared directory is the container's alone.
    let (out, err, code) = admin
        .sh("mount -t tmpfs none /probe && touch /probe/over && mount --make-rshared /probe && echo ok")
        .await;
    assert_eq!((out.as_str(), code), ("ok\n", 0), "{err}");
    let peer = |container: &'static str| Sandbox {
        daemon: daemon.clone(),
        client: client.clone(),
        id: id.clone(),
        container: Some(container),
    };
    let (out, _, _) = peer("svc")
        .sh("ls /srv/tools; grep -c tmpfs /proc/self/mountinfo")
        .await;
    assert!(!out.contains("over"), "the peer sees the mount: {out}");
    let root = Sandbox {
        container: None,
        ..peer("svc")
    };
    let (out, _, _) = root.sh("ls /tools").await;
    assert!(
        !out.contains("over"),
        "the sandbox's root sees the mount: {out}"
    );
    assert_eq!(
        host_mounts().lines().count(),
        before,
        "the host's mounts changed"
    );
    admin.assert_alive().await;
}
