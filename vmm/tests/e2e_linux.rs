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

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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

fn connect(uds: &std::path::Path, port: u32) -> UnixStream {
    let mut s = UnixStream::connect(uds).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(&mut s).read_line(&mut line).unwrap();
    assert!(line.starts_with("OK "), "handshake answer: {line:?}");
    s
}

#[test]
#[cfg_attr(
    not(crucible_hardware_kvm),
    ignore = "needs hardware KVM (kvm_intel/kvm_amd) to boot a stock kernel; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn e2e_linux_guest_boots_answers_over_vsock_uses_the_disk_and_powers_off() {
    assert_host_boots_a_stock_kernel();
    let (kernel, initramfs) = guest_image();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let mut image = vec![0u8; 1 << 20];
    image[..5].copy_from_slice(b"DISK0");
    std::fs::write(&disk, &image).unwrap();
    let uds = dir.path().join("v.sock");
    let ready = UnixListener::bind(host_port_path(&uds, DEFAULT_READY_PORT)).unwrap();

    let boot_args = BootConfig {
        boot_marker: true,
        ..BootConfig::default()
    }
    .to_cmdline()
    .unwrap();
    let mut vmm = Command::new(env!("CARGO_BIN_EXE_crucible-vmm"))
        .arg("--kernel")
        .arg(&kernel)
        .arg("--initramfs")
        .arg(&initramfs)
        .arg("--block")
        .arg(&disk)
        .args(["--vsock-cid", "3", "--vsock-uds"])
        .arg(&uds)
        .arg("--console")
        .arg(dir.path().join("console.log"))
        .arg("--cmdline")
        .arg(boot_args)
        .arg("--timings")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    // Readiness: the agent connects to host port 1025 and sends its hello.
    let (mut hello_conn, _) = ready.accept().unwrap();
    hello_conn
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let hello: Hello = wire::read_message(&mut hello_conn).unwrap();
    assert_eq!(hello.pid, 1);

    let mut c = connect(&uds, DEFAULT_AGENT_PORT);
    wire::write_message(&mut c, &AgentRequest::Ping).unwrap();
    let pong: AgentReply = wire::read_message(&mut c).unwrap();
    assert!(matches!(pong, AgentReply::Pong(_)), "{pong:?}");

    let mut c = connect(&uds, DEFAULT_AGENT_PORT);
    let script = "head -c 5 /dev/vda; printf WRITTEN | dd of=/dev/vda bs=512 seek=1 conv=fsync \
                  2>/dev/null";
    wire::write_message(
        &mut c,
        &AgentRequest::Exec {
            request: ExecRequest::new(["sh", "-c", script]),
            interactive: false,
            user: None,
        },
    )
    .unwrap();
    let mut reader = FrameReader::new(c, Direction::GuestToHost);
    let mut stdout = Vec::new();
    let result: ExecResult = loop {
        let f = reader.read_frame().unwrap().expect("an exit frame");
        match f.frame_type {
            FrameType::Stdout => stdout.extend_from_slice(f.payload),
            FrameType::Exit => break serde_json::from_slice(f.payload).unwrap(),
            _ => {}
        }
    };
    assert_eq!(result.exit_code, 0);
    assert_eq!(stdout, b"DISK0");

    let mut c = connect(&uds, DEFAULT_AGENT_PORT);
    wire::write_message(&mut c, &AgentRequest::Shutdown).unwrap();
    let bye: AgentReply = wire::read_message(&mut c).unwrap();
    assert_eq!(bye, AgentReply::ShuttingDown);

    let status = vmm.wait().unwrap();
    let mut err = String::new();
    vmm.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    eprintln!("{err}");
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains("\"boot_complete_us\":"), "{err}");
    let after = std::fs::read(&disk).unwrap();
    assert_eq!(&after[512..519], b"WRITTEN");
}
