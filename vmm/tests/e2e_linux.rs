//! End to end with a real Linux guest: our kernel + guest-init as PID 1, booted by
//! `crucible-vmm`; the agent says hello over vsock, answers ping, runs a command that reads and
//! writes the block device, and powers the VM off.
//!
//! Needs a host that can boot a stock kernel (hardware KVM: `kvm_intel`/`kvm_amd`); elsewhere it
//! is compiled `#[ignore]`d with the reason (`vmm/build.rs`; on kvm_pvm a stock kernel would
//! crawl through KVM's instruction emulator and die), and `CRUCIBLE_REQUIRE_KVM=1` makes it run,
//! and fail, anyway. The image: `CRUCIBLE_KERNEL` (uncompressed vmlinux) and
//! `CRUCIBLE_INITRAMFS` (cpio with guest-init as `/init` and a shell with `dd`), else the one
//! `cargo xtask build-image` wrote (`$CRUCIBLE_IMAGE` or `target/crucible/image`); without one
//! the test fails, saying how to get it.
//!
//! On a host without hardware KVM these run in the nested tier (`cargo xtask nested`): inside
//! an L1 Linux with `kvm_amd` under QEMU TCG, with the static `crucible-vmm`
//! (`$CRUCIBLE_VMM`). Every wait has a deadline sized for that: a guest that dies fails the
//! test with the VMM's own reason, never hangs it.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::vmm_binary;

use contract::cmdline::BootConfig;
use contract::vsock::{host_port_path, DEFAULT_AGENT_PORT, DEFAULT_READY_PORT};
use crucible_vmm::HostKind;
use wire::agent::{AgentReply, AgentRequest, Hello};
use wire::{Direction, ExecRequest, ExecResult, FrameReader, FrameType};

/// Fails the test, saying why, where this host cannot boot a stock kernel: the test only runs
/// here because `CRUCIBLE_REQUIRE_KVM=1` (or the host changed since the build).
fn assert_host_boots_a_stock_kernel() {
    let host = HostKind::detect();
    assert!(
        host.boots_stock_kernel(),
        "this test needs hardware KVM, but the host is {}: {}",
        host.name(),
        host.describe()
    );
}

/// The guest image: the environment's, else the built one; a missing file fails the test.
fn guest_image() -> (PathBuf, PathBuf) {
    let built = std::env::var_os("CRUCIBLE_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/crucible/image"));
    let kernel = std::env::var_os("CRUCIBLE_KERNEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| built.join("vmlinux"));
    let initramfs = std::env::var_os("CRUCIBLE_INITRAMFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| built.join("initramfs.cpio"));
    for f in [&kernel, &initramfs] {
        assert!(
            f.is_file(),
            "{} is missing: run `cargo xtask build-image`, or set CRUCIBLE_KERNEL and \
             CRUCIBLE_INITRAMFS to a guest image",
            f.display()
        );
    }
    (kernel, initramfs)
}

/// How long a boot may take to the agent's hello (about 2 s nested, under emulation).
const BOOT_LIMIT: Duration = Duration::from_secs(90);
/// How long one request (ping, a small exec, shutdown) may take.
const REQUEST_LIMIT: Duration = Duration::from_secs(60);

fn connect(uds: &std::path::Path, port: u32) -> UnixStream {
    let mut s = UnixStream::connect(uds).unwrap();
    s.set_read_timeout(Some(REQUEST_LIMIT)).unwrap();
    s.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(&mut s).read_line(&mut line).unwrap();
    assert!(line.starts_with("OK "), "handshake answer: {line:?}");
    s
}

/// `crucible-vmm` booting the image with a 1 MiB disk (`DISK0` at 0), vsock at `dir/v.sock`,
/// the console in `dir/console.log`, timings on stderr, and `cmdline` after the agent's own
/// settings.
fn boot(dir: &Path, cmdline: &str) -> Child {
    let (kernel, initramfs) = guest_image();
    let disk = dir.join("disk.img");
    let mut image = vec![0u8; 1 << 20];
    image[..5].copy_from_slice(b"DISK0");
    std::fs::write(&disk, &image).unwrap();
    let boot_args = BootConfig {
        boot_marker: true,
        ..BootConfig::default()
    }
    .to_cmdline()
    .unwrap();
    Command::new(vmm_binary())
        .arg("--kernel")
        .arg(&kernel)
        .arg("--initramfs")
        .arg(&initramfs)
        .arg("--block")
        .arg(&disk)
        .args(["--vsock-cid", "3", "--vsock-uds"])
        .arg(dir.join("v.sock"))
        .arg("--console")
        .arg(dir.join("console.log"))
        .arg("--cmdline")
        .arg(format!("{boot_args} {cmdline}"))
        .arg("--timings")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The VMM's exit status and stderr once it ends (at most `limit` from now), with the guest's
/// console, for assertions and for the failure message.
fn finish(mut vmm: Child, dir: &Path, limit: Duration) -> (Option<i32>, String) {
    let status = testkit::wait_within(&mut vmm, limit);
    let mut err = String::new();
    vmm.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let console = std::fs::read_to_string(dir.join("console.log")).unwrap_or_default();
    let report = format!("--- VMM stderr\n{err}--- guest console\n{console}---");
    eprintln!("{report}");
    let status = status.unwrap_or_else(|e| panic!("{e}\n{report}"));
    (status.code(), report)
}

/// The agent's hello on `<uds>_1025`, or the VMM's reason for never sending one.
fn await_hello(ready: &UnixListener, vmm: &mut Child, dir: &Path) -> Hello {
    let alive = || match vmm.try_wait() {
        Ok(None) => Ok(()),
        Ok(Some(status)) => Err(format!(
            "the VMM exited ({status}) before the agent's hello"
        )),
        Err(e) => Err(e.to_string()),
    };
    let mut conn = testkit::accept_within(ready, BOOT_LIMIT, alive).unwrap_or_else(|e| {
        let console = std::fs::read_to_string(dir.join("console.log")).unwrap_or_default();
        panic!("no hello from the agent: {e}\n--- guest console\n{console}---")
    });
    conn.set_read_timeout(Some(REQUEST_LIMIT)).unwrap();
    wire::read_message(&mut conn).unwrap()
}

/// Runs `cmd` in the guest; its stdout and exit status.
fn exec(uds: &Path, cmd: &[&str]) -> (Vec<u8>, ExecResult) {
    let mut c = connect(uds, DEFAULT_AGENT_PORT);
    wire::write_message(
        &mut c,
        &AgentRequest::Exec {
            tail_bytes: None,
            request: ExecRequest::new(cmd.iter().copied()),
            interactive: false,
            user: None,
        },
    )
    .unwrap();
    let mut reader = FrameReader::new(c, Direction::GuestToHost);
    let mut stdout = Vec::new();
    loop {
        let f = reader.read_frame().unwrap().expect("an exit frame");
        match f.frame_type {
            FrameType::Stdout => stdout.extend_from_slice(f.payload),
            FrameType::Exit => break (stdout, serde_json::from_slice(f.payload).unwrap()),
            _ => {}
        }
    }
}

#[test]
#[cfg_attr(
    not(crucible_hardware_kvm),
    ignore = "needs hardware KVM (kvm_intel/kvm_amd) to boot a stock kernel; on other hosts `cargo xtask nested` runs it inside a nested-KVM L1"
)]
fn e2e_linux_guest_boots_answers_over_vsock_uses_the_disk_and_powers_off() {
    assert_host_boots_a_stock_kernel();
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let ready = UnixListener::bind(host_port_path(&uds, DEFAULT_READY_PORT)).unwrap();
    // Words a kernel hands to init because it does not know them: an argument and an
    // environment variable. The agent must boot anyway, and keep them from its commands.
    let mut vmm = boot(dir.path(), "e2e_stray_word e2e_stray_var=1");

    // Readiness: the agent connects to host port 1025 and sends its hello.
    let hello = await_hello(&ready, &mut vmm, dir.path());
    assert_eq!(hello.pid, 1);

    let mut c = connect(&uds, DEFAULT_AGENT_PORT);
    wire::write_message(&mut c, &AgentRequest::Ping).unwrap();
    let pong: AgentReply = wire::read_message(&mut c).unwrap();
    assert!(matches!(pong, AgentReply::Pong(_)), "{pong:?}");

    let script = "head -c 5 /dev/vda; printf WRITTEN | dd of=/dev/vda bs=512 seek=1 conv=fsync \
                  2>/dev/null";
    let (stdout, result) = exec(&uds, &["sh", "-c", script]);
    assert_eq!(result.exit_code, 0);
    assert_eq!(stdout, b"DISK0");

    // A command's environment is the agent's own (PATH, HOME, HOSTNAME), as in a namespace
    // sandbox:
    // nothing the kernel handed init (HOME=/, TERM=linux, e2e_stray_var=1) leaks into it.
    let (env, result) = exec(&uds, &["env"]);
    assert_eq!(result.exit_code, 0);
    let mut names: Vec<String> = String::from_utf8_lossy(&env)
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_string()))
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["HOME", "HOSTNAME", "PATH"],
        "{}",
        String::from_utf8_lossy(&env)
    );
    assert!(String::from_utf8_lossy(&env).contains("HOME=/root\n"));

    // The guest found the MP table (one vCPU included): its interrupts go through the I/O APIC
    // and its timer is the local APIC's, not the PIT behind the 8259, whose every tick costs
    // port exits.
    let (irqs, result) = exec(
        &uds,
        &[
            "sh",
            "-c",
            "cat /proc/interrupts /sys/devices/system/clockevents/clockevent0/current_device",
        ],
    );
    assert_eq!(result.exit_code, 0);
    let irqs = String::from_utf8_lossy(&irqs);
    assert!(irqs.contains("IO-APIC"), "{irqs}");
    // (The 8259's cascade line is listed in either mode.)
    assert!(
        !irqs
            .lines()
            .any(|l| l.contains("XT-PIC") && !l.contains("cascade")),
        "{irqs}"
    );
    assert!(
        irqs.lines().last().is_some_and(|l| l.starts_with("lapic")),
        "{irqs}"
    );

    let mut c = connect(&uds, DEFAULT_AGENT_PORT);
    wire::write_message(&mut c, &AgentRequest::Shutdown).unwrap();
    let bye: AgentReply = wire::read_message(&mut c).unwrap();
    assert_eq!(bye, AgentReply::ShuttingDown);
    // Hanging up tells the agent its answer arrived: it resets the VM then.
    drop(c);

    let (status, report) = finish(vmm, dir.path(), REQUEST_LIMIT);
    assert_eq!(status, Some(0), "{report}");
    // The ready marker reached the VMM (the guest kernel has ioperm), and the agent's stop
    // marker made the power-off a clean one.
    let timings: serde_json::Value = report
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no timings line: {report}"));
    assert!(
        timings["boot_complete_us"]
            .as_u64()
            .is_some_and(|us| us > 0),
        "{report}"
    );
    assert_eq!(timings["exit"], "guest_stop", "{report}");
    let after = std::fs::read(dir.path().join("disk.img")).unwrap();
    assert_eq!(&after[512..519], b"WRITTEN");
}

#[test]
#[cfg_attr(
    not(crucible_hardware_kvm),
    ignore = "needs hardware KVM (kvm_intel/kvm_amd) to boot a stock kernel; on other hosts `cargo xtask nested` runs it inside a nested-KVM L1"
)]
fn a_guest_whose_init_dies_before_the_agent_is_ready_fails_the_vmm_with_the_reason() {
    assert_host_boots_a_stock_kernel();
    let dir = tempfile::tempdir().unwrap();
    // /init replaced by a program that exits at once: the kernel panics ("Attempted to kill
    // init") and, with panic=1, resets the VM.
    let vmm = boot(dir.path(), "rdinit=/bin/false");
    let (status, report) = finish(vmm, dir.path(), BOOT_LIMIT);
    assert_eq!(status, Some(crucible_vmm::EXIT_GUEST_CRASH), "{report}");
    assert!(
        report.contains("guest crashed: the guest stopped before its agent was ready"),
        "{report}"
    );
    assert!(
        report.contains("Attempted to kill init"),
        "the console shows the panic: {report}"
    );
}
