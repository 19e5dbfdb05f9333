//! The boot smoke test: boot the image under QEMU's `microvm` machine (software emulation, so
//! it runs anywhere) with `crucible.selftest=1`, and check what the agent prints on the console.
//!
//! The agent's console contract:
//! - `crucible-agent: ready pid=<pid> version=<ver> kernel=<release> uptime_ms=<n>`
//! - `crucible-selftest: <name> ok` or `crucible-selftest: <name> FAIL <why>` for each of
//!   [`SELFTESTS`]
//! - `crucible-selftest: done passed=<n> failed=<m>`, then the agent reboots, and with
//!   `-no-reboot` QEMU exits by itself.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use contract::cmdline::{BootConfig, CmdlineError};
use thiserror::Error;

use crate::deps::{self, DepsError};
use crate::process::describe;
use crate::progress::Progress;

/// The selftests the agent runs with `crucible.selftest=1`; every one must report `ok`.
pub const SELFTESTS: &[&str] = &[
    "echo_stdout",
    "stderr",
    "exit_code",
    "timeout",
    "not_found",
    "pid1",
];
pub use contract::qemu::{BASE_APPEND, MACHINE};
pub const QEMU: &str = contract::qemu::BINARY;
pub const QEMU_PACKAGE: &str = contract::qemu::PACKAGE;

/// The guest's name for the first virtio-blk device, where the smoke root is attached.
const ROOTFS_DEVICE: &str = "/dev/vda";

#[derive(Debug, Error)]
pub enum SmokeError {
    #[error(transparent)]
    Deps(#[from] DepsError),
    #[error("the agent's boot settings")]
    Cmdline(#[from] CmdlineError),
    #[error("{} does not exist (run `cargo xtask build-image` first)", path.display())]
    Missing { path: PathBuf },
    #[error("could not start `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("waiting for qemu")]
    Wait(#[source] std::io::Error),
}

#[derive(Debug, Clone)]
pub struct SmokeOptions {
    pub vmlinux: PathBuf,
    pub initramfs: PathBuf,
    /// Kill QEMU and fail after this long.
    pub timeout: Duration,
    pub memory_mib: u32,
    /// Appended to [`BASE_APPEND`] and `crucible.selftest=1`.
    pub extra_append: Vec<String>,
    /// An ext4 root to attach read-only as the first virtio-blk device (`/dev/vda`) and boot
    /// into (`crucible.root=/dev/vda`: the agent mounts it under a tmpfs overlay).
    pub rootfs: Option<PathBuf>,
    /// vhost-user-blk sockets, each served by a backend that is already listening (e.g.
    /// `crucible-vmm vhost-user block`): attached as virtio-blk devices after the rootfs, with
    /// guest memory shared with the backends, and checked by the agent's block self-test
    /// ([`contract::block_selftest`]).
    pub vhost_user_blk: Vec<PathBuf>,
}

impl SmokeOptions {
    pub fn new(vmlinux: PathBuf, initramfs: PathBuf) -> Self {
        SmokeOptions {
            vmlinux,
            initramfs,
            timeout: Duration::from_secs(120),
            memory_mib: 256,
            extra_append: Vec::new(),
            rootfs: None,
            vhost_user_blk: Vec::new(),
        }
    }
}

/// What happened in one boot.
#[derive(Debug, Clone)]
pub struct BootRun {
    pub command: String,
    /// Everything QEMU wrote to stdout (the serial console) and stderr.
    pub console: String,
    /// Time from starting QEMU to the agent's ready line.
    pub ready_after: Option<Duration>,
    /// Time from starting QEMU until it exited (or was killed).
    pub total: Duration,
    /// QEMU's exit status; `None` when it was killed at the timeout.
    pub status: Option<ExitStatus>,
}

/// The agent's ready line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    pub pid: u32,
    pub version: String,
    pub kernel: String,
    pub uptime_ms: u64,
}

/// What the console says about the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsoleFacts {
    pub ready: Option<Ready>,
    /// Selftest name → `Ok(())` or `Err(why)`.
    pub selftests: BTreeMap<String, Result<(), String>>,
    /// `(passed, failed)` from the done line.
    pub done: Option<(u32, u32)>,
}

/// Reads the agent's lines out of a console log (kernel messages may surround them).
pub fn parse_console(console: &str) -> ConsoleFacts {
    let mut facts = ConsoleFacts::default();
    for raw in console.lines() {
        let line = raw.trim_matches(|c: char| c == '\r' || c.is_whitespace());
        if let Some(rest) = find_after(line, "crucible-agent: ready ") {
            let fields = key_values(rest);
            let ready = (|| {
                Some(Ready {
                    pid: fields.get("pid")?.parse().ok()?,
                    version: fields.get("version")?.to_string(),
                    kernel: fields.get("kernel")?.to_string(),
                    uptime_ms: fields.get("uptime_ms")?.parse().ok()?,
                })
            })();
            if ready.is_some() && facts.ready.is_none() {
                facts.ready = ready;
            }
        } else if let Some(rest) = find_after(line, "crucible-selftest: ") {
            if let Some(counts) = rest.strip_prefix("done ") {
                let fields = key_values(counts);
                let passed = fields.get("passed").and_then(|v| v.parse().ok());
                let failed = fields.get("failed").and_then(|v| v.parse().ok());
                if let (Some(p), Some(f)) = (passed, failed) {
                    facts.done = Some((p, f));
                }
                continue;
            }
            let mut parts = rest.splitn(3, ' ');
            let (Some(name), Some(verdict)) = (parts.next(), parts.next()) else {
                continue;
            };
            let why = parts.next().unwrap_or("").to_string();
            let result = match verdict {
                "ok" => Ok(()),
                "FAIL" => Err(why),
                other => Err(format!("unknown verdict {other:?}")),
            };
            facts.selftests.insert(name.to_string(), result);
        }
    }
    facts
}

fn find_after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.find(marker).map(|i| &line[i + marker.len()..])
}

fn key_values(text: &str) -> BTreeMap<&str, &str> {
    text.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect()
}

/// Every way the run fell short of a pass, in plain words; empty means it passed.
pub fn problems(run: &BootRun, facts: &ConsoleFacts, timeout: Duration) -> Vec<String> {
    let mut problems = Vec::new();
    match &facts.ready {
        None => problems.push("no `crucible-agent: ready` line on the console".to_string()),
        Some(r) if r.pid != 1 => problems.push(format!("the agent is pid {}, not pid 1", r.pid)),
        Some(_) => {}
    }
    for name in SELFTESTS {
        match facts.selftests.get(*name) {
            None => problems.push(format!("selftest {name}: no result")),
            Some(Err(why)) => problems.push(format!("selftest {name}: FAIL {why}")),
            Some(Ok(())) => {}
        }
    }
    for (name, result) in &facts.selftests {
        if let (false, Err(why)) = (SELFTESTS.contains(&name.as_str()), result) {
            problems.push(format!("selftest {name}: FAIL {why}"));
        }
    }
    match facts.done {
        None => problems.push("no `crucible-selftest: done` line".to_string()),
        Some((_, failed)) if failed != 0 => {
            problems.push(format!("the agent reported {failed} failed selftests"))
        }
        Some(_) => {}
    }
    match run.status {
        None => problems.push(format!(
            "QEMU did not exit by itself within {}s (killed): the VM did not end itself",
            timeout.as_secs()
        )),
        Some(s) if !s.success() => problems.push(format!("QEMU exited with {s}")),
        Some(_) => {}
    }
    problems
}

/// The QEMU command line for a smoke boot.
pub fn qemu_command(qemu: &Path, opts: &SmokeOptions) -> Result<Command, SmokeError> {
    let first_vhost_disk = usize::from(opts.rootfs.is_some());
    let boot = BootConfig {
        selftest: true,
        root: opts.rootfs.as_ref().map(|_| ROOTFS_DEVICE.to_string()),
        selftest_block: (0..opts.vhost_user_blk.len())
            .map(|i| virtio_disk_name(first_vhost_disk + i))
            .collect(),
        ..BootConfig::default()
    };
    let mut append = format!("{BASE_APPEND} {}", boot.to_cmdline()?);
    for extra in &opts.extra_append {
        append.push(' ');
        append.push_str(extra);
    }
    let mut cmd = Command::new(qemu);
    if opts.vhost_user_blk.is_empty() {
        cmd.args(["-M", MACHINE]);
    } else {
        // A vhost-user backend maps guest memory itself: it must be a shareable file.
        cmd.args(contract::qemu::shared_memory_machine_args(u64::from(
            opts.memory_mib,
        )));
    }
    cmd.args(["-accel", "tcg", "-cpu", "max"])
        .args(contract::qemu::MODERN_VIRTIO_MMIO)
        .args(["-m", &opts.memory_mib.to_string()])
        .args([
            "-nodefaults",
            "-no-reboot",
            "-display",
            "none",
            "-serial",
            "stdio",
        ])
        .arg("-kernel")
        .arg(&opts.vmlinux)
        .arg("-initrd")
        .arg(&opts.initramfs)
        .args(["-append", &append]);
    if let Some(rootfs) = &opts.rootfs {
        let mut drive = std::ffi::OsString::from("id=rootfs,format=raw,if=none,readonly=on,file=");
        drive.push(rootfs);
        cmd.arg("-drive")
            .arg(drive)
            .args(["-device", "virtio-blk-device,drive=rootfs"]);
    }
    for (i, socket) in opts.vhost_user_blk.iter().enumerate() {
        let mut chardev = std::ffi::OsString::from(format!("socket,id=vhostblk{i},path="));
        chardev.push(socket);
        cmd.arg("-chardev")
            .arg(chardev)
            .args(["-device", &format!("vhost-user-blk,chardev=vhostblk{i}")]);
    }
    Ok(cmd)
}

/// The guest's name for its `index`th virtio-blk disk (`/dev/vda`, `/dev/vdb`, …).
fn virtio_disk_name(index: usize) -> String {
    let letter = char::from(b'a' + (index % 26) as u8);
    format!("/dev/vd{letter}")
}

/// Boots once and collects the console. Installs QEMU with apt when it is missing.
pub fn boot(
    opts: &SmokeOptions,
    logs: &Path,
    progress: &dyn Progress,
) -> Result<BootRun, SmokeError> {
    for path in [&opts.vmlinux, &opts.initramfs]
        .into_iter()
        .chain(opts.rootfs.as_ref())
    {
        if !path.is_file() {
            return Err(SmokeError::Missing { path: path.clone() });
        }
    }
    let qemu = match deps::which(QEMU) {
        Some(q) => q,
        None => {
            deps::ensure(
                &[QEMU_PACKAGE],
                "the boot smoke test",
                &logs.join("apt.log"),
                progress,
            )?;
            deps::which(QEMU).unwrap_or_else(|| PathBuf::from(QEMU))
        }
    };
    let mut cmd = qemu_command(&qemu, opts)?;
    let command = describe(&cmd);
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| SmokeError::Spawn {
            command: command.clone(),
            source,
        })?;
    let (tx, rx) = mpsc::channel::<(Instant, String)>();
    let readers = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|stream| {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut line = Vec::new();
            while let Ok(n) = reader.read_until(b'\n', &mut line) {
                if n == 0 {
                    break;
                }
                let _ = tx.send((Instant::now(), String::from_utf8_lossy(&line).into_owned()));
                line.clear();
            }
        })
    })
    .collect::<Vec<_>>();
    drop(tx);

    let deadline = started + opts.timeout;
    let mut console = String::new();
    let mut ready_after = None;
    let mut killed = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((at, line)) => {
                if ready_after.is_none() && line.contains("crucible-agent: ready ") {
                    ready_after = Some(at - started);
                }
                console.push_str(&line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                kill(&mut child);
                killed = true;
                break;
            }
        }
    }
    let status = wait_until(&mut child, deadline).map_err(SmokeError::Wait)?;
    let total = started.elapsed();
    if status.is_none() && !killed {
        kill(&mut child);
    }
    for reader in readers {
        let _ = reader.join();
    }
    // Lines that arrived between the kill and the readers' end.
    console.extend(rx.try_iter().map(|(_, l)| l));
    Ok(BootRun {
        command,
        console,
        ready_after,
        total,
        status: if killed { None } else { status },
    })
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            kill(child);
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    const GOOD: &str = "\
[    0.000000] Linux version 6.12.117 (root@host) #1 SMP
Run /init as init process\r
crucible-agent: ready pid=1 version=0.1.0 kernel=6.12.117 uptime_ms=812\r
crucible-selftest: echo_stdout ok
crucible-selftest: stderr ok
crucible-selftest: exit_code ok
crucible-selftest: timeout ok
crucible-selftest: not_found ok
crucible-selftest: pid1 ok
crucible-selftest: done passed=6 failed=0
reboot: Restarting system
";

    fn run(console: &str, status: Option<i32>) -> BootRun {
        BootRun {
            command: "qemu".into(),
            console: console.into(),
            ready_after: Some(Duration::from_millis(900)),
            total: Duration::from_secs(2),
            status: status.map(|code| ExitStatus::from_raw(code << 8)),
        }
    }

    fn check(console: &str, status: Option<i32>) -> Vec<String> {
        problems(
            &run(console, status),
            &parse_console(console),
            Duration::from_secs(60),
        )
    }

    #[test]
    fn good_console_passes_and_is_parsed() {
        let facts = parse_console(GOOD);
        assert_eq!(
            facts.ready,
            Some(Ready {
                pid: 1,
                version: "0.1.0".into(),
                kernel: "6.12.117".into(),
                uptime_ms: 812
            })
        );
        assert_eq!(facts.done, Some((6, 0)));
        assert_eq!(facts.selftests.len(), 6);
        assert_eq!(check(GOOD, Some(0)), Vec::<String>::new());
    }

    #[test]
    fn failed_selftest_is_reported_with_its_reason() {
        let console = GOOD
            .replace("timeout ok", "timeout FAIL still running after 3s")
            .replace("passed=6 failed=0", "passed=5 failed=1");
        let problems = check(&console, Some(0));
        assert!(problems.contains(&"selftest timeout: FAIL still running after 3s".to_string()));
        assert!(problems.contains(&"the agent reported 1 failed selftests".to_string()));
    }

    #[test]
    fn agent_not_pid1_missing_tests_and_hang_all_fail() {
        let console = "crucible-agent: ready pid=7 version=x kernel=y uptime_ms=1\n\
                       crucible-selftest: echo_stdout ok\n";
        let problems = check(console, None);
        assert!(problems.iter().any(|p| p.contains("pid 7")), "{problems:?}");
        assert!(problems.iter().any(|p| p == "selftest pid1: no result"));
        assert!(problems
            .iter()
            .any(|p| p.contains("no `crucible-selftest: done`")));
        assert!(problems
            .iter()
            .any(|p| p.contains("did not exit by itself")));
    }

    #[test]
    fn kernel_panic_without_agent_lines_fails() {
        let console = "Kernel panic - not syncing: No working init found.\n";
        let problems = check(console, Some(0));
        assert!(
            problems[0].contains("no `crucible-agent: ready`"),
            "{problems:?}"
        );
        assert_eq!(
            check(GOOD, Some(1)),
            vec!["QEMU exited with exit status: 1"]
        );
    }

    #[test]
    fn agent_line_interleaved_with_kernel_output_is_still_found() {
        let console = "[    1.2] random: crng init\
                       crucible-agent: ready pid=1 version=0.1.0 kernel=6.12 uptime_ms=5\n";
        assert_eq!(parse_console(console).ready.map(|r| r.pid), Some(1));
    }

    #[test]
    fn qemu_command_uses_microvm_without_acpi_and_selftest_flag() {
        let opts = SmokeOptions::new("/img/vmlinux".into(), "/img/initramfs.cpio".into());
        let cmd = describe(&qemu_command(Path::new("qemu-system-x86_64"), &opts).unwrap());
        assert!(cmd.contains("acpi=off"), "{cmd}");
        assert!(cmd.contains("-no-reboot"), "{cmd}");
        assert!(cmd.contains("-kernel /img/vmlinux"), "{cmd}");
        assert!(cmd.contains("crucible.selftest=1"), "{cmd}");
        assert!(!cmd.contains("crucible.root"), "{cmd}");
    }

    #[test]
    fn qemu_command_shares_memory_with_vhost_user_disks_and_selftests_them() {
        let mut opts = SmokeOptions::new("/img/vmlinux".into(), "/img/initramfs.cpio".into());
        opts.vhost_user_blk = vec!["/run/a.sock".into(), "/run/b.sock".into()];
        let cmd = describe(&qemu_command(Path::new("qemu-system-x86_64"), &opts).unwrap());
        assert!(cmd.contains("acpi=off,memory-backend=mem"), "{cmd}");
        assert!(
            cmd.contains("memory-backend-memfd,id=mem,size=256M,share=on"),
            "{cmd}"
        );
        assert!(
            cmd.contains("socket,id=vhostblk1,path=/run/b.sock"),
            "{cmd}"
        );
        assert!(cmd.contains("vhost-user-blk,chardev=vhostblk0"), "{cmd}");
        assert!(
            cmd.contains("crucible.selftest_block=/dev/vda,/dev/vdb"),
            "{cmd}"
        );
        opts.rootfs = Some("/img/rootfs.ext4".into());
        let cmd = describe(&qemu_command(Path::new("qemu-system-x86_64"), &opts).unwrap());
        assert!(
            cmd.contains("crucible.selftest_block=/dev/vdb,/dev/vdc"),
            "{cmd}"
        );
    }

    #[test]
    fn qemu_command_attaches_rootfs_read_only_and_boots_into_it() {
        let mut opts = SmokeOptions::new("/img/vmlinux".into(), "/img/initramfs.cpio".into());
        opts.rootfs = Some("/img/rootfs.ext4".into());
        let cmd = describe(&qemu_command(Path::new("qemu-system-x86_64"), &opts).unwrap());
        assert!(cmd.contains("readonly=on,file=/img/rootfs.ext4"), "{cmd}");
        assert!(cmd.contains("virtio-blk-device,drive=rootfs"), "{cmd}");
        assert!(cmd.contains("crucible.root=/dev/vda"), "{cmd}");
    }
}
