//! End to end with a real Linux guest: our kernel + guest-init as PID 1, booted by
//! `crucible-vmm`; the agent says hello over vsock, answers ping, runs a command that reads and
//! writes the block device, and powers the VM off.
//!
//! Needs a host that can boot a stock kernel (hardware KVM: `kvm_intel`/`kvm_amd`) and the
//! image: `CRUCIBLE_KERNEL` (uncompressed vmlinux) and `CRUCIBLE_INITRAMFS` (cpio with
//! guest-init as `/init` and a shell with `dd`). Elsewhere it is skipped with the reason printed
//! (on kvm_pvm a stock kernel would crawl through KVM's instruction emulator and die).

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use contract::cmdline::BootConfig;
use contract::vsock::{host_port_path, DEFAULT_AGENT_PORT, DEFAULT_READY_PORT};
use crucible_vmm::HostKind;
use wire::agent::{AgentReply, AgentRequest, Hello};
use wire::{Direction, ExecRequest, ExecResult, FrameReader, FrameType};

fn skip_reason() -> Option<(PathBuf, PathBuf)> {
    let host = HostKind::detect();
    if !host.boots_stock_kernel() {
        eprintln!("SKIPPED: host is {}: {}", host.name(), host.describe());
        return None;
    }
    match (
        std::env::var_os("CRUCIBLE_KERNEL"),
        std::env::var_os("CRUCIBLE_INITRAMFS"),
    ) {
        (Some(k), Some(i)) => Some((k.into(), i.into())),
        _ => {
            eprintln!("SKIPPED: set CRUCIBLE_KERNEL and CRUCIBLE_INITRAMFS to the guest image");
            None
        }
    }
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
fn e2e_linux_guest_boots_answers_over_vsock_uses_the_disk_and_powers_off() {
    let Some((kernel, initramfs)) = skip_reason() else {
        return;
    };
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
