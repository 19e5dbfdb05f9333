//! The daemon's microVM backend on the `qemu-tcg` hypervisor: a real guest kernel under QEMU's
//! TCG with our vsock device served over vhost-user, driven through the public API exactly as
//! a namespace sandbox is. Runs on every host (no KVM needed); needs QEMU (the image's smoke
//! test installs it) and the image with its kernel (`cargo xtask build-image`). One VM serves
//! every case that allows it: a boot under emulation takes seconds.

use std::path::Path;
use std::time::{Duration, Instant};

use client::ExecEvent;
use futures_util::{SinkExt, StreamExt};
use harness::TestDaemon;
use sha2::{Digest, Sha256};
use tokio_tungstenite::tungstenite::Message;
use wire::{BackendKind, CreateSandbox, ExecRequest, FrameType, Hypervisor, SandboxState};

fn vmm_binary() -> std::path::PathBuf {
    let binary = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/crucible-vmm");
    assert!(
        binary.is_file(),
        "{} missing: cargo build -p crucible-vmm (cargo test --workspace builds it)",
        binary.display()
    );
    binary
}

fn qemu_daemon() -> TestDaemon {
    let kernel = harness::image_dir().join("vmlinux");
    assert!(
        kernel.is_file(),
        "{} missing: the qemu-tcg tests boot the image's kernel; run `cargo xtask build-image`",
        kernel.display()
    );
    let binary = vmm_binary();
    TestDaemon::start_with(|c| {
        c.vmm_binary = binary;
        c.hypervisor = Hypervisor::QemuTcg;
        c.default_backend = Some(BackendKind::Microvm);
    })
}

fn sh(script: &str) -> ExecRequest {
    ExecRequest::new(["sh", "-c", script])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_tcg_sandbox_serves_the_api_with_a_real_guest_kernel() {
    let daemon = qemu_daemon();
    assert_eq!(
        daemon.state.unavailable_reason(BackendKind::Microvm),
        None,
        "the qemu-tcg microVM backend must be available on every host with QEMU"
    );
    let c = daemon.client();
    let started = Instant::now();
    let sandbox = c
        .create(&CreateSandbox {
            env: [("FROM_SANDBOX".into(), "tcg".into())].into(),
            ..Default::default()
        })
        .await
        .expect("a qemu-tcg sandbox boots");
    eprintln!("create → ready under TCG: {:?}", started.elapsed());
    assert_eq!(sandbox.state, SandboxState::Running);
    assert_eq!(sandbox.backend, BackendKind::Microvm);
    assert_eq!(sandbox.hypervisor, Some(Hypervisor::QemuTcg));
    let got = c.get(&sandbox.id).await.expect("get");
    assert_eq!(got.hypervisor, Some(Hypervisor::QemuTcg));
    let id = &sandbox.id;

    // A real guest kernel, the agent as its PID 1, stdout and stderr apart, the exit code.
    let out = c
        .exec_collect(
            id,
            &sh("echo $FROM_SANDBOX; cat /proc/1/comm; uname -s; echo oops >&2; exit 3"),
        )
        .await
        .expect("exec");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "tcg\ninit\nLinux\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");
    assert_eq!(out.result.exit_code, 3);

    // The modern virtio-mmio transport: VIRTIO_F_VERSION_1 (bit 32) was negotiated.
    let out = c
        .exec_collect(id, &sh("cut -c33 /sys/bus/virtio/devices/*/features"))
        .await
        .expect("features");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n");

    // 50 sequential execs on the same VM.
    for i in 0..50 {
        let out = c
            .exec_collect(id, &ExecRequest::new(["echo", &i.to_string()]))
            .await
            .unwrap_or_else(|e| panic!("exec {i}: {e}"));
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{i}\n"));
        assert_eq!(out.result.exit_code, 0);
    }

    // An interactive session over vsock: stdin in, the same bytes out, EOF ends it.
    let mut session = c
        .interactive(id, &ExecRequest::new(["cat"]))
        .await
        .expect("session");
    session
        .send_stdin(b"over vhost-user vsock\n")
        .await
        .expect("stdin");
    session.close_stdin().await.expect("close");
    let mut echoed = Vec::new();
    while let Some(event) = session.next_event().await {
        if let ExecEvent::Stdout(b) = event.expect("event") {
            echoed.extend_from_slice(&b);
        }
    }
    assert_eq!(echoed, b"over vhost-user vsock\n");

    // The WebSocket transport, as a browser or any spec client speaks it: the same frames.
    let stream = tokio::net::UnixStream::connect(&daemon.socket)
        .await
        .expect("connect");
    let (mut ws, _) =
        tokio_tungstenite::client_async(format!("ws://crucible/sandboxes/{id}/exec"), stream)
            .await
            .expect("upgrade");
    ws.send(Message::text(
        r#"{"cmd":["sh","-c","read l; echo got $l; echo e >&2"]}"#,
    ))
    .await
    .expect("request");
    let mut stdin = Vec::new();
    wire::encode_frames(FrameType::Stdin, b"ws-line\n", &mut stdin);
    wire::encode_frames(FrameType::StdinClose, b"", &mut stdin);
    ws.send(Message::binary(stdin)).await.expect("stdin");
    let mut decoder = wire::Decoder::new(wire::Direction::GuestToHost);
    let (mut out, mut err, mut exit) = (Vec::new(), Vec::new(), None);
    while let Some(message) = tokio::time::timeout(Duration::from_secs(60), ws.next())
        .await
        .expect("the WebSocket session progresses")
    {
        match message.expect("message") {
            Message::Binary(bytes) => {
                decoder.push(&bytes);
                while let Some(frame) = decoder.next_frame().expect("frames") {
                    match frame.frame_type {
                        FrameType::Stdout => out.extend_from_slice(frame.payload),
                        FrameType::Stderr => err.extend_from_slice(frame.payload),
                        FrameType::Exit => {
                            let result: wire::ExecResult =
                                serde_json::from_slice(frame.payload).expect("exit frame");
                            exit = Some(result.exit_code);
                        }
                        _ => {}
                    }
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    assert_eq!(
        (out.as_slice(), err.as_slice(), exit),
        (&b"got ws-line\n"[..], &b"e\n"[..], Some(0))
    );

    // A timeout kills the command's whole process group.
    let mut request = sh("sleep 300 & sleep 300; echo never");
    request.timeout_s = 2;
    let started = Instant::now();
    let out = c.exec_collect(id, &request).await.expect("timed exec");
    assert!(out.result.timed_out, "{:?}", out.result);
    assert!(out.stdout.is_empty());
    assert!(started.elapsed() < Duration::from_secs(60));
    let left = c
        .exec_collect(
            id,
            &sh("cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$' || true"),
        )
        .await
        .expect("ps");
    assert_eq!(
        String::from_utf8_lossy(&left.stdout).trim(),
        "0",
        "the group survived"
    );

    // Files, byte for byte, both ways.
    let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i * 31 + i / 7) as u8).collect();
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(payload.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, "data.bin", &payload[..])
        .expect("tar");
    let archive = builder.into_inner().expect("tar");
    let put = c
        .put_tar(id, "/tmp/in", std::io::Cursor::new(archive))
        .await
        .expect("upload");
    assert_eq!((put.files, put.bytes), (1, payload.len() as u64));
    let mut back = Vec::new();
    c.get_file(id, "/tmp/in/data.bin", &mut back)
        .await
        .expect("download");
    assert!(back == payload, "the file came back different");

    // 64 MiB of stdout through the guest's vsock driver and our device's credit flow,
    // checked by SHA-256 against the same bytes made here.
    let size = 64u64 << 20;
    let out = c
        .exec_collect(id, &sh(&format!("yes crucible-over-tcg | head -c {size}")))
        .await
        .expect("64 MiB stream");
    assert_eq!(out.result.exit_code, 0, "{:?}", out.result);
    assert_eq!(out.stdout.len() as u64, size);
    let expected: Vec<u8> = b"crucible-over-tcg\n"
        .iter()
        .copied()
        .cycle()
        .take(size as usize)
        .collect();
    assert_eq!(
        hex::encode(Sha256::digest(&out.stdout)),
        hex::encode(Sha256::digest(&expected))
    );

    // Delete: QEMU and the device process are gone, and so is the sandbox's directory.
    let dir = daemon.state.config.state_dir.join("sandboxes").join(id);
    assert_eq!(sandbox_processes(id).len(), 2, "QEMU and the vsock device");
    c.delete(id).await.expect("delete");
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert_eq!(sandbox_processes(id), Vec::<(i32, String)>::new());
}

/// The host processes whose command line names sandbox `id` (QEMU and the device process
/// carry its runtime directory in their arguments), as (pid, command line).
fn sandbox_processes(id: &str) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(id) {
            found.push((pid, cmdline));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qemu_tcg_sandbox_whose_vsock_device_dies_is_dead_and_delete_leaves_nothing() {
    let daemon = qemu_daemon();
    let c = daemon.client();
    let sandbox = c
        .create(&CreateSandbox::default())
        .await
        .expect("a qemu-tcg sandbox boots");
    let id = &sandbox.id;
    let device = sandbox_processes(id)
        .into_iter()
        .find(|(_, cmdline)| cmdline.contains("vhost-user vsock"))
        .expect("the vsock device process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(device.0),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the device");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = c.get(id).await.expect("get");
        if info.state == SandboxState::Dead {
            assert!(info.error.contains("vsock device"), "{}", info.error);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {:?} 30 s after its device died",
            info.state
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let err = c
        .exec_collect(id, &ExecRequest::new(["true"]))
        .await
        .expect_err("a dead sandbox runs nothing");
    assert!(
        err.to_string().contains("dead") || err.to_string().contains("409"),
        "{err}"
    );
    c.delete(id).await.expect("delete");
    assert_eq!(sandbox_processes(id), Vec::<(i32, String)>::new());
}

/// An image directory like the built one plus a `rootfs.ext4` made from its root tree with a
/// marker file only the disk has.
fn image_with_ext4_root(dir: &Path) -> std::path::PathBuf {
    let built = harness::image_dir();
    let image = dir.join("image");
    std::fs::create_dir_all(&image).expect("image dir");
    for name in ["vmlinux", "initramfs.cpio", "rootfs"] {
        std::os::unix::fs::symlink(built.join(name), image.join(name)).expect("link");
    }
    let tree = dir.join("tree");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(built.join("rootfs"))
        .arg(&tree)
        .status()
        .expect("cp");
    assert!(status.success(), "copying the root tree");
    std::fs::write(
        tree.join("etc/crucible-root-marker"),
        "from the ext4 disk\n",
    )
    .expect("marker");
    let status = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "crucible-root", "-d"])
        .arg(&tree)
        .arg(image.join("rootfs.ext4"))
        .arg("64M")
        .status()
        .expect("mkfs.ext4 (e2fsprogs) must be installed: build-image --rootfs needs it too");
    assert!(status.success(), "mkfs.ext4 -d");
    image
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qemu_tcg_sandbox_boots_into_the_images_ext4_root_over_vhost_user_block() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let image = image_with_ext4_root(scratch.path());
    let binary = vmm_binary();
    let daemon = TestDaemon::start_with(|c| {
        c.image_dir = image;
        c.vmm_binary = binary;
        c.hypervisor = Hypervisor::QemuTcg;
        c.default_backend = Some(BackendKind::Microvm);
    });
    let c = daemon.client();
    let sandbox = c
        .create(&CreateSandbox::default())
        .await
        .expect("a qemu-tcg sandbox boots from the ext4 root");
    let id = &sandbox.id;
    let processes = sandbox_processes(id);
    assert!(
        processes
            .iter()
            .any(|(_, cmdline)| cmdline.contains("vhost-user block")),
        "no root disk device among {processes:?}"
    );
    let out = c
        .exec_collect(
            id,
            &sh("cat /etc/crucible-root-marker; cat /sys/block/vda/ro"),
        )
        .await
        .expect("exec");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from the ext4 disk\n1\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Writes land in the overlay above the read-only disk and outlive the exec.
    let out = c
        .exec_collect(
            id,
            &sh("mkdir -p /work && echo written > /work/f && sync && echo ok"),
        )
        .await
        .expect("write");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    let out = c
        .exec_collect(id, &ExecRequest::new(["cat", "/work/f"]))
        .await
        .expect("read back");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "written\n");
    c.delete(id).await.expect("delete");
    assert_eq!(sandbox_processes(id), Vec::<(i32, String)>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_daemon_takes_its_qemu_tcg_sandboxes_down() {
    let daemon = qemu_daemon();
    let sandbox = daemon
        .client()
        .create(&CreateSandbox::default())
        .await
        .expect("a qemu-tcg sandbox boots");
    assert_eq!(sandbox_processes(&sandbox.id).len(), 2);
    // Dropping the test daemon stops it as SIGTERM does: every sandbox deleted.
    drop(daemon);
    assert_eq!(sandbox_processes(&sandbox.id), Vec::<(i32, String)>::new());
}
