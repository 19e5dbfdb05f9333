//! The daemon's microVM backend on the `qemu-tcg` hypervisor: a real guest kernel under QEMU's
//! TCG with our vsock device served over vhost-user, driven through the public API exactly as
//! a namespace sandbox is. Runs on every host (no KVM needed); needs QEMU (the image's smoke
//! test installs it) and the image with its kernel (`cargo xtask build-image`). One VM serves
//! every case that allows it: a boot under emulation takes seconds.
//!
//! Storage and egress on a microVM: a sandbox with `network` fetches from (and uploads to)
//! servers this test starts on the host's 127.0.0.1 through its agent's proxy, carried over
//! vsock to the daemon; its disk-backed layer holds more than its memory; a cache written by
//! one sandbox is read by the next, whose writes past its size get ENOSPC; a volume arrives as
//! its read-only snapshot, byte for byte, and nothing root inside does writes to it.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use client::ExecEvent;
use futures_util::{SinkExt, StreamExt};
use harness::host_net::{random_bytes, read_head, HostServer};
use harness::TestDaemon;

use sha2::{Digest, Sha256};
use tokio_tungstenite::tungstenite::Message;
use wire::{
    BackendKind, CacheMount, CreateSandbox, ExecRequest, FrameType, Hypervisor, NetworkRequest,
    SandboxState, VolumeMount,
};

fn qemu_daemon() -> TestDaemon {
    TestDaemon::start_qemu_tcg(|_| {})
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
    let daemon = TestDaemon::start_qemu_tcg(|c| c.image_dir = image);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qemu_tcg_sandbox_with_network_and_a_disk_layer_moves_mibs_through_its_proxy_and_writes_past_its_memory(
) {
    // Downloads: an HTTP server with a multi-MiB blob.
    let blob = Arc::new(random_bytes(3 * 1024 * 1024 + 17));
    let served = blob.clone();
    let http = HostServer::start(move |mut stream| {
        let head = read_head(&mut stream);
        let response = if head.starts_with("GET /blob HTTP/1.1\r\n") {
            let mut r = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                served.len()
            )
            .into_bytes();
            r.extend_from_slice(&served);
            r
        } else {
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n".to_vec()
        };
        let _ = stream.write_all(&response);
    });
    // Uploads: a CONNECT target that reads UPLOAD bytes and answers their SHA-256.
    const UPLOAD: usize = 4 * 1024 * 1024;
    let upload = HostServer::start(|mut stream| {
        let mut got = vec![0u8; UPLOAD];
        if stream.read_exact(&mut got).is_ok() {
            let _ = stream.write_all(hex::encode(Sha256::digest(&got)).as_bytes());
        }
    });
    let operator = vec![
        format!("127.0.0.1:{}", http.port),
        format!("127.0.0.1:{}", upload.port),
    ];
    let kernel = harness::image_dir().join("vmlinux");
    assert!(
        kernel.is_file(),
        "{} missing: cargo xtask build-image",
        kernel.display()
    );
    let daemon = TestDaemon::start_qemu_tcg(|c| c.egress_allow = operator.clone());
    let data_dir = daemon.state.config.storage.data_dir.clone();
    let c = daemon.client();
    let sandbox = c
        .create(&CreateSandbox {
            memory_mib: Some(128),
            disk_mib: Some(256),
            network: Some(NetworkRequest {
                allow: operator.clone(),
            }),
            ..CreateSandbox::default()
        })
        .await
        .expect("a qemu-tcg sandbox with network and a disk-backed layer boots");
    let id = &sandbox.id;
    assert_eq!(sandbox.hypervisor, Some(Hypervisor::QemuTcg));
    assert_eq!(sandbox.disk_mib, Some(256));

    // HTTP through HTTP_PROXY, byte for byte: four downloads at once, each its own vsock
    // connection from the guest.
    let (out, err, code) = harness::sh(
        &c,
        id,
        &format!(
            "set -e; echo $http_proxy; for i in 1 2 3 4; do \
             wget -q -O /tmp/blob$i http://127.0.0.1:{}/blob & done; wait; \
             sha256sum /tmp/blob1 /tmp/blob2 /tmp/blob3 /tmp/blob4 | cut -d' ' -f1",
            http.port
        ),
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let expected = hex::encode(Sha256::digest(&*blob));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "http://127.0.0.1:3128",
            &expected,
            &expected,
            &expected,
            &expected
        ],
        "{err}"
    );

    // The other way: 4 MiB up a CONNECT tunnel, hashed by the host server.
    let (out, err, code) = harness::sh(
        &c,
        id,
        &format!(
            "set -e; head -c {UPLOAD} /dev/urandom > /tmp/up; sha256sum /tmp/up | cut -d' ' -f1; \
             (printf 'CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n\\r\\n'; \
             cat /tmp/up) | nc 127.0.0.1 3128 | tail -c 64; echo",
            port = upload.port
        ),
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0].len(), 64, "{out}");
    assert_eq!(lines[0], lines[1], "the host received other bytes: {out}");

    // A name outside the rules: 403, and nothing connected.
    let (out, _, _) = harness::sh(
        &c,
        id,
        "wget -S -O- http://denied.example.com/ 2>&1; echo exit=$?",
    )
    .await;
    assert!(out.contains("403") && !out.contains("exit=0"), "{out}");
    let network = c.get(id).await.expect("get").network.expect("network");
    assert_eq!(network.connections, 5, "{network:?}");
    assert!(network.denied >= 1, "{network:?}");
    assert!(network.bytes_in >= 4 * blob.len() as u64, "{network:?}");
    assert!(network.bytes_out >= UPLOAD as u64, "{network:?}");
    assert_eq!(http.connections(), 4);
    assert_eq!(upload.connections(), 1);

    // The writable layer and /tmp are on the sandbox's disk: more than its 128 MiB of memory
    // fits, the host's image holds the blocks, and a full disk is ENOSPC for the writer only.
    let (out, err, code) = harness::sh(
        &c,
        id,
        "set -e; dd if=/dev/zero of=/root/big bs=1M count=160 2>/dev/null; \
         dd if=/dev/zero of=/tmp/big bs=1M count=16 2>/dev/null; \
         stat -c '%s %n' /root/big /tmp/big; sync; \
         dd if=/dev/zero of=/root/more bs=1M count=200 2>&1 || echo enospc; \
         rm /root/more; echo fine > /root/after; cat /root/after",
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("167772160 /root/big") && out.contains("16777216 /tmp/big"),
        "{out}"
    );
    assert!(
        out.contains("No space left on device") && out.contains("enospc"),
        "{out}"
    );
    assert!(out.trim_end().ends_with("fine"), "{out}");
    let layer = data_dir.join(format!("scratch/{id}.ext4"));
    let meta = std::fs::metadata(&layer).expect("the layer's image");
    assert_eq!(meta.len(), 256 << 20);
    assert!(
        meta.blocks() * 512 >= 176 << 20,
        "the written blocks are in the host's image: {} bytes",
        meta.blocks() * 512
    );

    c.delete(id).await.expect("delete");
    assert!(!layer.exists(), "the layer goes with its sandbox");
    assert_eq!(sandbox_processes(id), Vec::<(i32, String)>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_written_by_one_qemu_tcg_sandbox_is_read_by_the_next_and_filling_it_is_enospc() {
    // On the image's ext4 root: the cache is mounted over the read-only root disk's overlay.
    let scratch = tempfile::tempdir().expect("tempdir");
    let image = image_with_ext4_root(scratch.path());
    let daemon = TestDaemon::start_qemu_tcg(|c| c.image_dir = image);
    let data_dir = daemon.state.config.storage.data_dir.clone();
    let c = daemon.client();
    let with_cache = |size_mib| CreateSandbox {
        caches: vec![CacheMount {
            name: "cargo".into(),
            path: "/root/.cargo/registry".into(),
            size_mib,
        }],
        ..CreateSandbox::default()
    };

    let first = c.create(&with_cache(Some(64))).await.expect("create").id;
    let processes = sandbox_processes(&first);
    assert_eq!(
        processes
            .iter()
            .filter(|(_, cmdline)| cmdline.contains("vhost-user block"))
            .count(),
        2,
        "the root disk and the cache: {processes:?}"
    );
    let (out, err, code) = harness::sh(
        &c,
        &first,
        "set -e; cd /root/.cargo/registry; echo 'serde 1.0.0' > index; mkdir -p src/serde; \
         echo built > src/serde/lib.rs; stat -c '%u:%g' .; \
         grep ' /root/.cargo/registry ' /proc/mounts",
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "0:0", "the sandbox's root owns its cache: {out}");
    let mount: Vec<&str> = lines[1].split(' ').collect();
    assert_eq!(mount[2], "ext4", "{out}");
    let options: Vec<&str> = mount[3].split(',').collect();
    assert!(
        options.contains(&"rw") && options.contains(&"nosuid") && options.contains(&"nodev"),
        "{out}"
    );
    // No flush asked for: the daemon's delete makes the guest sync before it goes.
    c.delete(&first).await.expect("delete");
    assert_eq!(sandbox_processes(&first), Vec::<(i32, String)>::new());

    let second = c.create(&with_cache(None)).await.expect("create").id;
    let (out, err, code) = harness::sh(
        &c,
        &second,
        "set -e; cd /root/.cargo/registry; cat index src/serde/lib.rs; stat -c '%u:%g' index",
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out, "serde 1.0.0\nbuilt\n0:0\n");

    // The limit: the writer gets ENOSPC; the sandbox and the cache's earlier contents are fine;
    // the host's image never grows past the limit.
    let cache = data_dir.join("caches/microvm/unix/cargo.ext4");
    harness::assert_cache_limit_holds(
        &c,
        &second,
        "/root/.cargo/registry",
        "serde 1.0.0",
        &cache,
        (64, 100),
    )
    .await;

    c.delete(&second).await.expect("delete");
    assert_eq!(sandbox_processes(&second), Vec::<(i32, String)>::new());
    c.delete_cache("cargo").await.expect("delete the cache");
    assert!(!cache.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_reaches_a_qemu_tcg_sandbox_as_its_read_only_snapshot_byte_for_byte() {
    let host = tempfile::tempdir().expect("tempdir");
    let volume = host.path().join("tools");
    std::fs::create_dir_all(volume.join("bin")).expect("mkdir");
    std::fs::create_dir_all(volume.join("share/owned")).expect("mkdir");
    let tool = random_bytes(300 * 1024 + 5);
    let blob: Vec<u8> = random_bytes(2 * 1024 * 1024 + 3)
        .iter()
        .map(|b| b ^ 0x5a)
        .collect();
    std::fs::write(volume.join("bin/tool"), &tool).expect("write");
    std::fs::write(volume.join("share/blob"), &blob).expect("write");
    std::fs::write(volume.join("share/empty"), b"").expect("write");
    std::os::unix::fs::chown(volume.join("share/owned"), Some(1000), Some(1001)).expect("chown");
    let outside = host.path().join("outside-secret");
    std::fs::write(&outside, "host only\n").expect("write");
    std::os::unix::fs::symlink(&outside, volume.join("escape")).expect("ln -s");
    let declared = format!("tools={}:ro", volume.display());

    let daemon = TestDaemon::start_qemu_tcg(|c| {
        c.storage.volumes.declare(&declared).expect("declare");
    });
    let data_dir = daemon.state.config.storage.data_dir.clone();
    let c = daemon.client();
    let id = c
        .create(&CreateSandbox {
            volumes: vec![VolumeMount {
                name: "tools".into(),
                path: "/opt/tools".into(),
            }],
            ..CreateSandbox::default()
        })
        .await
        .expect("a qemu-tcg sandbox with a volume boots")
        .id;

    // The snapshot: one image, counted in the budget, served read-only by its device.
    let image = data_dir.join("volumes/tools.ext4");
    let image_hash = || hex::encode(Sha256::digest(std::fs::read(&image).expect("the image")));
    let before = image_hash();
    let storage = daemon.state.storage().expect("storage");
    assert_eq!(
        storage.budget.taken_mib(),
        std::fs::metadata(&image).expect("stat").len() >> 20
    );
    let devices: Vec<String> = sandbox_processes(&id)
        .into_iter()
        .map(|(_, cmdline)| cmdline)
        .filter(|cmdline| cmdline.contains("vhost-user block"))
        .collect();
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert!(
        devices[0].trim_end().ends_with("crucible-mount-0:ro"),
        "{devices:?}"
    );

    // Byte for byte, owned as on the host, the link still a link (to a path that is not
    // there inside), mounted read-only, nosuid, nodev on a read-only disk.
    let (out, err, code) = harness::sh(
        &c,
        &id,
        "set -e; cd /opt/tools; sha256sum bin/tool share/blob share/empty | cut -d' ' -f1; \
         stat -c '%u:%g' share/owned; readlink escape; cat escape 2>/dev/null || echo dangling; \
         find . | sort | tr '\\n' ' '; echo; grep ' /opt/tools ' /proc/mounts; \
         for d in /sys/block/vd*; do \
           [ \"$(cat $d/serial)\" = crucible-mount-0 ] && echo ${d##*/} $(cat $d/ro); done",
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    let hash = |bytes: &[u8]| hex::encode(Sha256::digest(bytes));
    assert_eq!(
        &lines[..6],
        [
            hash(&tool).as_str(),
            &hash(&blob),
            &hash(b""),
            "1000:1001",
            &outside.display().to_string(),
            "dangling"
        ],
        "{out}"
    );
    assert_eq!(
        lines[6].trim_end(),
        ". ./bin ./bin/tool ./escape ./share ./share/blob ./share/empty ./share/owned",
        "the tree and nothing else: {out}"
    );
    let mount: Vec<&str> = lines[7].split(' ').collect();
    let options: Vec<&str> = mount[3].split(',').collect();
    assert!(
        mount[2] == "ext4"
            && options.contains(&"ro")
            && options.contains(&"nosuid")
            && options.contains(&"nodev"),
        "{out}"
    );
    let (disk, ro) = lines[8].split_once(' ').expect("the volume's disk");
    assert_eq!(ro, "1", "the disk itself is read-only: {out}");

    // Root inside tries to write: to the files, by remounting, then to the disk itself once
    // unmounted, after asking the kernel to make it writable, and through a new mount.
    let (out, err, code) = harness::sh(
        &c,
        &id,
        &format!(
            "echo x > /opt/tools/new; echo write=$?; \
             rm /opt/tools/bin/tool; echo rm=$?; \
             mount -o remount,rw /opt/tools; echo remount=$?; \
             sha256sum /opt/tools/bin/tool | cut -d' ' -f1; \
             umount /opt/tools; echo umount=$?; \
             blockdev --setrw /dev/{disk}; echo setrw=$?; \
             dd if=/dev/zero of=/dev/{disk} bs=4096 count=16 conv=fsync; echo dd=$?; \
             mkdir /mnt/again; mount -t ext4 -o rw /dev/{disk} /mnt/again; \
             grep ' /mnt/again ' /proc/mounts | cut -d' ' -f4 | cut -d, -f1; \
             touch /mnt/again/bin/new; echo write-again=$?"
        ),
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let failed = |step: &str| {
        out.lines()
            .any(|l| l.starts_with(&format!("{step}=")) && l != format!("{step}=0"))
    };
    for step in ["write", "rm", "remount", "dd", "write-again"] {
        assert!(failed(step), "{step} must fail: {out}{err}");
    }
    assert!(out.contains(&format!("\n{}\n", hash(&tool))), "{out}");
    assert!(out.contains("umount=0"), "{out}{err}");
    assert!(
        !out.lines().any(|l| l == "rw"),
        "mounted writable again: {out}{err}"
    );

    // The host's image and directory are as they were; the image outlives the sandbox for
    // the next microVM of this daemon.
    c.delete(&id).await.expect("delete");
    assert_eq!(image_hash(), before, "the snapshot was written to");
    assert_eq!(std::fs::read(volume.join("bin/tool")).expect("read"), tool);
    assert!(!volume.join("new").exists());
    assert_eq!(sandbox_processes(&id), Vec::<(i32, String)>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_two_layer_image_is_a_qemu_tcg_sandboxs_ext4_root() {
    let daemon = qemu_daemon();
    let data_dir = daemon.state.config.storage.data_dir.clone();
    let c = daemon.client();
    harness::images::import_two_layer(&c, "ci")
        .await
        .expect("import");
    let request = CreateSandbox {
        image: Some("ci".into()),
        ..CreateSandbox::default()
    };
    let id = c
        .create(&request)
        .await
        .expect("a qemu-tcg sandbox of the imported image boots")
        .id;
    let probe = format!(
        "{}; for d in /sys/block/vd*; do cat $d/serial; echo; cat $d/ro; done",
        harness::images::TWO_LAYER_PROBE
    );
    let (out, err, code) = harness::sh(&c, &id, &probe).await;
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    let mut expected = harness::images::TWO_LAYER_EXPECTED.to_vec();
    expected.extend(["crucible-root", "1"]);
    assert_eq!(lines, expected, "{out}{err}");
    // One read-only snapshot of the image's tree, built on this first use and shared.
    let disks: Vec<_> = std::fs::read_dir(data_dir.join("image-disks"))
        .expect("image disks")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(disks.len(), 1, "{disks:?}");
    c.delete(&id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qemu_tcg_sandbox_reports_its_guests_stats_and_takes_signals() {
    let daemon = qemu_daemon();
    let c = daemon.client();
    let id = c
        .create(&CreateSandbox {
            memory_mib: Some(256),
            ..CreateSandbox::default()
        })
        .await
        .expect("create")
        .id;
    let before = c.stats(&id).await.expect("stats");
    // The guest's RAM less what its kernel keeps for itself.
    assert!(
        (128 << 20..=256 << 20).contains(&before.memory.limit_bytes),
        "{before:?}"
    );
    assert!(
        before.memory.usage_bytes > 0 && before.pids.current >= 1,
        "{before:?}"
    );
    let (_, err, code) = harness::sh(
        &c,
        &id,
        "head -c 33554432 /dev/zero > /tmp/held; end=$(($(date +%s) + 1)); \
         while [ $(date +%s) -le $end ]; do :; done",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let after = c.stats(&id).await.expect("stats");
    assert!(
        after.memory.usage_bytes >= before.memory.usage_bytes + (16 << 20),
        "{before:?} → {after:?}"
    );
    assert!(
        after.cpu.usage_ns > before.cpu.usage_ns,
        "{before:?} → {after:?}"
    );

    // A signal from the host reaches the guest's commands, never its agent.
    let sleeper = harness::spawn_exec(&c, &id, &["sleep", "1000"]);
    harness::wait_for_process(&c, &id, "sleep 1000").await;
    c.signal(&id, 15).await.expect("signal");
    let out = sleeper.await.expect("join");
    assert_eq!(out.result.signal, "SIGTERM", "{:?}", out.result);
    let (out, _, code) = harness::sh(&c, &id, "echo alive").await;
    assert_eq!((out.as_str(), code), ("alive\n", 0));
}
