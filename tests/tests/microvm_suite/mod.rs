//! The daemon's microVM backend, one suite for both hypervisors: `microvm_qemu_tcg.rs` runs it
//! on QEMU TCG (every host), `microvm_api.rs` on `crucible-vmm` (hardware KVM, or inside the
//! nested tier's L1 on any host: `cargo xtask nested`). A real guest kernel with our agent as
//! PID 1, driven through the public API exactly as a namespace sandbox is: exec (one-shot,
//! interactive, WebSocket), timeouts, files both ways, 64 MiB of stdout by hash, OOM, stats and
//! signals; storage and egress (an ext4 root, a disk-backed layer, a cache, a volume, an
//! imported image, downloads and uploads through the agent's proxy to servers on the host's
//! 127.0.0.1); the warm pool; a VM that cannot boot (the create says why, in the VM's own
//! words); a dead VM process, a stopped daemon and a killed one (nothing left behind).
//!
//! Each test file includes this module and instantiates the suite with [`microvm_suite!`],
//! which gives every case its `#[tokio::test]` (and the file's own attributes, such as the
//! KVM gate's `#[ignore]`).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_types::{
    BackendKind, CacheMount, ContainerInfo, ContainerState, CreateSandbox, Hypervisor,
    NetworkRequest, SandboxState, VolumeMount,
};
use client::{ClientError, ExecEvent};
use futures_util::{SinkExt, StreamExt};
use harness::host_net::{random_bytes, read_head, HostLinkedNamespace, HostServer};
use harness::process::{DaemonHome, DaemonProcess};
use harness::TestDaemon;
use nix::sys::signal::Signal;
use sha2::{Digest, Sha256};
use tokio_tungstenite::tungstenite::Message;
use wire::{ExecRequest, FrameType};

/// Instantiates the suite for a hypervisor: `microvm_suite!(Hypervisor::QemuTcg);`, with any
/// attributes to put on every test after it.
macro_rules! microvm_suite {
    ($hv:expr $(, #[$attr:meta])*) => {
        microvm_suite::microvm_suite!(@cases $hv, [$(#[$attr])*],
            sandbox_serves_the_api_with_a_real_guest_kernel,
            a_sandbox_whose_vm_process_dies_is_dead_and_delete_leaves_nothing,
            a_sandbox_boots_into_the_images_ext4_root,
            stopping_the_daemon_takes_its_sandboxes_down,
            a_killed_daemon_takes_its_vms_with_it_and_the_next_one_cleans_up,
            a_sandbox_with_network_and_a_disk_layer_moves_mibs_through_its_proxy_and_writes_past_its_memory,
            a_cache_written_by_one_sandbox_is_read_by_the_next_and_filling_it_is_enospc,
            a_volume_reaches_a_sandbox_as_its_read_only_snapshot_byte_for_byte,
            an_imported_two_layer_image_is_a_sandboxs_ext4_root,
            a_service_container_is_reached_on_localhost_and_keeps_its_logs,
            a_sandbox_reports_its_guests_stats_and_takes_signals,
            a_command_past_the_sandboxs_memory_is_oom_killed_and_the_agent_answers,
            a_matching_create_is_served_from_the_warm_pool,
            a_vm_that_cannot_boot_fails_the_create_with_its_own_words,
            sandboxes_and_their_commands_survive_a_killed_daemon_and_an_upgrade_restart,
            a_pods_connections_leave_from_its_network_namespace,
        );
    };
    // The attributes travel as one token tree, so that each case can repeat them.
    (@cases $hv:expr, $attrs:tt, $($case:ident,)*) => {
        $( microvm_suite::microvm_suite!(@case $hv, $attrs, $case); )*
    };
    (@case $hv:expr, [$(#[$attr:meta])*], $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $(#[$attr])*
        async fn $case() {
            microvm_suite::within_case_limit(stringify!($case), microvm_suite::$case($hv)).await
        }
    };
}
pub(crate) use microvm_suite;

/// How long one case may take: minutes under QEMU TCG or nested, where a boot takes seconds.
/// A case that waits on a VM that never answers fails here, saying so, instead of hanging.
pub(crate) const CASE_LIMIT: Duration = Duration::from_secs(600);

/// Runs a case under [`CASE_LIMIT`]; the stages it printed (`stage`) say where it stopped.
pub(crate) async fn within_case_limit(name: &str, case: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(CASE_LIMIT, case).await.is_err() {
        panic!("{name} did not finish within {CASE_LIMIT:?}: see its last stage above");
    }
}

/// Says which part of a long case runs now (shown with the case's output when it fails).
fn stage(hv: Hypervisor, what: &str) {
    eprintln!("[{hv}] {what}");
}

/// A daemon whose sandboxes are microVMs on `hv`, adjusted by `configure`.
pub(crate) fn microvm_daemon(
    hv: Hypervisor,
    configure: impl FnOnce(&mut api::ServeConfig),
) -> TestDaemon {
    TestDaemon::start_microvm(hv, configure)
}

fn sh(script: &str) -> ExecRequest {
    ExecRequest::new(["sh", "-c", script])
}

/// The host processes one sandbox's VM takes: QEMU and its vsock device under `qemu-tcg`
/// (plus one per disk), our VMM alone.
fn vm_processes(hv: Hypervisor) -> usize {
    match hv {
        Hypervisor::QemuTcg => 2,
        Hypervisor::CrucibleVmm => 1,
    }
}

/// The host processes whose command line names sandbox `id` (the VM and its devices carry its
/// runtime directory in their arguments), as (pid, command line).
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
    found.sort();
    found
}

/// The block devices the host gives sandbox `id`'s VM, in attach order, as `SERIAL:ro|rw`
/// (each disk is reached through a link named by its serial): from the device processes'
/// arguments under `qemu-tcg`, from the VM's configuration under `crucible-vmm`.
fn block_devices(hv: Hypervisor, daemon: &TestDaemon, id: &str) -> Vec<String> {
    let serial = |path: &str, read_only: bool| {
        let name = Path::new(path.trim_end_matches(":ro"))
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!("{name}:{}", if read_only { "ro" } else { "rw" })
    };
    match hv {
        Hypervisor::QemuTcg => sandbox_processes(id)
            .into_iter()
            .filter(|(_, cmdline)| cmdline.contains("vhost-user block"))
            .map(|(_, cmdline)| {
                let path = cmdline
                    .split(' ')
                    .skip_while(|w| *w != "--path")
                    .nth(1)
                    .unwrap_or_default()
                    .to_string();
                serial(&path, path.ends_with(":ro"))
            })
            .collect(),
        Hypervisor::CrucibleVmm => {
            let config = daemon
                .state
                .config
                .state_dir
                .join("sandboxes")
                .join(id)
                .join("vm.json");
            let vm: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&config).expect("vm.json"))
                    .expect("the VM config");
            vm["block"]
                .as_array()
                .expect("block devices")
                .iter()
                .map(|b| {
                    serial(
                        b["path"].as_str().unwrap_or_default(),
                        b["read_only"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        }
    }
}

/// Waits (at most a minute) until nothing on the host names sandbox `id`.
async fn assert_no_processes_left(id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = sandbox_processes(id);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "still running: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An image directory like the built one plus a `rootfs.ext4` made from its root tree with a
/// marker file only the disk has.
fn image_with_ext4_root(dir: &Path) -> PathBuf {
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

/// An image directory like the built one with `vmlinux` or `initramfs.cpio` replaced by
/// `bytes`.
fn image_with_broken(dir: &Path, broken: &str, bytes: &[u8]) -> PathBuf {
    let built = harness::image_dir();
    let image = dir.join(format!("broken-{broken}"));
    std::fs::create_dir_all(&image).expect("image dir");
    for name in ["vmlinux", "initramfs.cpio", "rootfs"] {
        if name == broken {
            std::fs::write(image.join(name), bytes).expect("write");
        } else {
            std::os::unix::fs::symlink(built.join(name), image.join(name)).expect("link");
        }
    }
    image
}

/// Fails if a message says the same thing twice in a row (`X: X`, an error whose text
/// repeats its cause).
fn assert_no_repeats(message: &str) {
    let parts: Vec<&str> = message.split(": ").collect();
    for pair in parts.windows(2) {
        assert!(pair[0] != pair[1], "{:?} repeated in {message}", pair[0]);
    }
}

async fn counter(c: &client::Client, name: &str) -> u64 {
    let metrics = c.metrics().await.expect("metrics");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
        .unwrap_or(0)
}

pub(crate) async fn sandbox_serves_the_api_with_a_real_guest_kernel(hv: Hypervisor) {
    let daemon = microvm_daemon(hv, |_| {});
    assert_eq!(
        daemon.state.unavailable_reason(BackendKind::Microvm),
        None,
        "the {hv} microVM backend must be available here"
    );
    let c = daemon.client();
    let started = Instant::now();
    let sandbox = c
        .create(&CreateSandbox {
            env: [("FROM_SANDBOX".into(), "tcg".into())].into(),
            ..Default::default()
        })
        .await
        .expect("a microVM sandbox boots");
    eprintln!("create → ready on {hv}: {:?}", started.elapsed());
    assert_eq!(sandbox.state, SandboxState::Running);
    assert_eq!(sandbox.backend, BackendKind::Microvm);
    assert_eq!(sandbox.hypervisor, Some(hv));
    let got = c.get(&sandbox.id).await.expect("get");
    assert_eq!(got.hypervisor, Some(hv));
    let id = &sandbox.id;

    stage(hv, "exec");
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

    // A command's environment is the agent's own (PATH, HOME, HOSTNAME) plus the sandbox's,
    // nothing the kernel handed init: no `TERM=linux`, `HOME=/`, nor a boot word such as
    // `pci=off` that the kernel did not consume. The same base a namespace sandbox gives.
    let out = c
        .exec_collect(id, &ExecRequest::new(["cat", "/proc/self/environ"]))
        .await
        .expect("environ");
    let environ = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut got: Vec<&str> = environ.split('\0').filter(|v| !v.is_empty()).collect();
    got.sort_unstable();
    let path = format!("PATH={}", contract::DEFAULT_PATH);
    let home = format!("HOME={}", contract::AGENT_HOME);
    let hostname = format!("HOSTNAME={id}");
    let mut want = vec![
        "FROM_SANDBOX=tcg",
        home.as_str(),
        hostname.as_str(),
        path.as_str(),
    ];
    want.sort_unstable();
    assert_eq!(got, want, "a command's environment in a {hv} VM");

    // The modern virtio-mmio transport: VIRTIO_F_VERSION_1 (bit 32) was negotiated by every
    // device (vsock; and the console under crucible-vmm).
    let out = c
        .exec_collect(id, &sh("cut -c33 /sys/bus/virtio/devices/*/features"))
        .await
        .expect("features");
    let bits = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !bits.is_empty() && bits.lines().all(|b| b == "1"),
        "{bits:?}"
    );

    stage(hv, "50 execs");
    // 50 sequential execs on the same VM.
    for i in 0..50 {
        let out = c
            .exec_collect(id, &ExecRequest::new(["echo", &i.to_string()]))
            .await
            .unwrap_or_else(|e| panic!("exec {i}: {e}"));
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{i}\n"));
        assert_eq!(out.result.exit_code, 0);
    }

    stage(hv, "a command outlives its connection");
    // The client goes away after the first line; the command runs on in the guest, and an
    // attach over a new vsock connection gets the rest and the exit status.
    let mut stream = c
        .exec(
            id,
            &sh("echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second; exit 6"),
        )
        .await
        .expect("exec");
    let exec_id = stream.exec_id().expect("named").to_string();
    match stream.next_event().await {
        Some(Ok(ExecEvent::Stdout(bytes))) => assert_eq!(&bytes[..], b"first\n"),
        other => panic!("the first line: {other:?}"),
    }
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(c.exec_status(id, &exec_id).await, Ok(s) if !s.attached) {
        assert!(Instant::now() < deadline, "{exec_id} never detached");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.exec_collect(id, &ExecRequest::new(["touch", "/tmp/go"]))
        .await
        .expect("touch");
    let rest = c
        .attach(id, &exec_id, 6)
        .await
        .expect("attach")
        .collect()
        .await
        .expect("the rest");
    assert_eq!(
        (rest.stdout.as_slice(), rest.result.exit_code),
        (&b"second\n"[..], 6),
        "{:?}",
        rest.result
    );

    stage(hv, "interactive");
    // An interactive session over vsock: stdin in, the same bytes out, EOF ends it.
    let mut session = c
        .interactive(id, &ExecRequest::new(["cat"]))
        .await
        .expect("session");
    session.send_stdin(b"over vsock\n").await.expect("stdin");
    session.close_stdin().await.expect("close");
    let mut echoed = Vec::new();
    while let Some(event) = session.next_event().await {
        if let ExecEvent::Stdout(b) = event.expect("event") {
            echoed.extend_from_slice(&b);
        }
    }
    assert_eq!(echoed, b"over vsock\n");

    stage(hv, "websocket");
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

    stage(hv, "timeout");
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

    stage(hv, "files");
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
    // The same directory as the agent's tar stream, over vsock.
    let mut archive = Vec::new();
    c.download_tree(id, "/tmp/in", &mut archive)
        .await
        .expect("download the directory as a tar");
    let mut names = Vec::new();
    for entry in tar::Archive::new(archive.as_slice())
        .entries()
        .expect("an archive")
    {
        let mut entry = entry.expect("an entry");
        let name = entry.path().expect("a name").to_string_lossy().into_owned();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).expect("its data");
        if name == "data.bin" {
            assert!(data == payload, "the archived file came back different");
        }
        names.push(name);
    }
    assert_eq!(names, [".", "data.bin"], "{names:?}");

    stage(hv, "64 MiB of stdout");
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

    stage(hv, "delete");
    // Delete: the VM's processes are gone, and so is the sandbox's directory.
    let dir = daemon.state.config.state_dir.join("sandboxes").join(id);
    assert_eq!(sandbox_processes(id).len(), vm_processes(hv), "{hv}");
    c.delete(id).await.expect("delete");
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert_eq!(sandbox_processes(id), Vec::<(i32, String)>::new());
}

pub(crate) async fn a_sandbox_whose_vm_process_dies_is_dead_and_delete_leaves_nothing(
    hv: Hypervisor,
) {
    let daemon = microvm_daemon(hv, |_| {});
    let c = daemon.client();
    let sandbox = c
        .create(&CreateSandbox::default())
        .await
        .expect("a microVM sandbox boots");
    let id = &sandbox.id;
    // The process the guest's vsock lives in: its device under QEMU, our VMM itself.
    let (victim, says) = match hv {
        Hypervisor::QemuTcg => ("vhost-user vsock", "vsock device"),
        Hypervisor::CrucibleVmm => ("--config", "the VM exited"),
    };
    let process = sandbox_processes(id)
        .into_iter()
        .find(|(_, cmdline)| cmdline.contains(victim))
        .expect("the process the guest's vsock lives in");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(process.0), Signal::SIGKILL)
        .expect("kill it");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = c.get(id).await.expect("get");
        if info.state == SandboxState::Dead {
            assert!(info.error.contains(says), "{}", info.error);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {:?} 30 s after its VM process died",
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
    assert_no_processes_left(id).await;
}

pub(crate) async fn a_sandbox_boots_into_the_images_ext4_root(hv: Hypervisor) {
    let scratch = tempfile::tempdir().expect("tempdir");
    let image = image_with_ext4_root(scratch.path());
    let daemon = microvm_daemon(hv, |c| c.engine.image_dir = image);
    let c = daemon.client();
    let sandbox = c
        .create(&CreateSandbox::default())
        .await
        .expect("a microVM sandbox boots from the ext4 root");
    let id = &sandbox.id;
    assert_eq!(block_devices(hv, &daemon, id), ["crucible-root:ro"]);
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
    assert_no_processes_left(id).await;
}

pub(crate) async fn stopping_the_daemon_takes_its_sandboxes_down(hv: Hypervisor) {
    let daemon = microvm_daemon(hv, |_| {});
    let sandbox = daemon
        .client()
        .create(&CreateSandbox::default())
        .await
        .expect("a microVM sandbox boots");
    assert_eq!(sandbox_processes(&sandbox.id).len(), vm_processes(hv));
    // Dropping the test daemon stops it as SIGTERM does: every sandbox deleted.
    drop(daemon);
    assert_eq!(sandbox_processes(&sandbox.id), Vec::<(i32, String)>::new());
}

pub(crate) async fn a_killed_daemon_takes_its_vms_with_it_and_the_next_one_cleans_up(
    hv: Hypervisor,
) {
    let home = DaemonHome::new();
    let hv_flag = hv.to_string();
    let mut first = DaemonProcess::start_in(&home, &["--microvm", &hv_flag]).await;
    let c = first.client();
    let sandbox = c
        .create(&CreateSandbox::default())
        .await
        .expect("a microVM sandbox boots");
    assert_eq!(sandbox.hypervisor, Some(hv));
    let (out, _, code) = harness::sh(&c, &sandbox.id, "echo up").await;
    assert_eq!((out.as_str(), code), ("up\n", 0));
    assert_eq!(sandbox_processes(&sandbox.id).len(), vm_processes(hv));
    // No goodbye: the daemon is killed outright. Its VMs die with it rather than run on,
    // unowned.
    first.stop_with(Signal::SIGKILL);
    assert_no_processes_left(&sandbox.id).await;
    // The next daemon on the same state directory removes what the dead one left, knows
    // nothing of its sandboxes, and makes new ones.
    let second = DaemonProcess::start_in(&home, &["--microvm", &hv_flag]).await;
    let c = second.client();
    match c.get(&sandbox.id).await {
        Err(ClientError::Api { status: 404, .. }) => {}
        other => panic!("the dead daemon's sandbox: {other:?}"),
    }
    let left: Vec<_> = std::fs::read_dir(home.state_dir().join("sandboxes"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in the state directory: {left:?}");
    let fresh = harness::leaks::assert_a_new_sandbox_works(&c).await;
    c.delete(&fresh).await.expect("delete");
}

pub(crate) async fn a_sandbox_with_network_and_a_disk_layer_moves_mibs_through_its_proxy_and_writes_past_its_memory(
    hv: Hypervisor,
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
    let daemon = microvm_daemon(hv, |c| c.egress_allow = operator.clone());
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
        .expect("a microVM sandbox with network and a disk-backed layer boots");
    let id = &sandbox.id;
    assert_eq!(sandbox.hypervisor, Some(hv));
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
    assert_no_processes_left(id).await;
}

pub(crate) async fn a_cache_written_by_one_sandbox_is_read_by_the_next_and_filling_it_is_enospc(
    hv: Hypervisor,
) {
    // On the image's ext4 root: the cache is mounted over the read-only root disk's overlay.
    let scratch = tempfile::tempdir().expect("tempdir");
    let image = image_with_ext4_root(scratch.path());
    let daemon = microvm_daemon(hv, |c| c.engine.image_dir = image);
    let data_dir = daemon.state.config.storage.data_dir.clone();
    let c = daemon.client();
    let with_cache = |size_mib| CreateSandbox {
        caches: vec![CacheMount {
            name: "cargo".into(),
            path: "/root/.cargo/registry".into(),
            size_mib,
            save: true,
        }],
        ..CreateSandbox::default()
    };

    let first = c.create(&with_cache(Some(64))).await.expect("create").id;
    assert_eq!(
        block_devices(hv, &daemon, &first),
        ["crucible-root:ro", "crucible-mount-0:rw"],
        "the root disk and the cache"
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
    assert_no_processes_left(&first).await;

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
    // the host's image (the sandbox's own copy of the cache) never grows past the limit.
    let copy = data_dir.join(format!("caches/microvm/unix/.in-use/cargo@{second}.ext4"));
    harness::assert_cache_limit_holds(
        &c,
        &second,
        "/root/.cargo/registry",
        "serde 1.0.0",
        &copy,
        (64, 100),
    )
    .await;
    let cache = data_dir.join("caches/microvm/unix/cargo.ext4");

    c.delete(&second).await.expect("delete");
    assert_no_processes_left(&second).await;
    c.delete_cache("cargo").await.expect("delete the cache");
    assert!(!cache.exists());
}

/// A shell command that reads what a container's `while true; do … | nc -l -p PORT; done`
/// service says, trying again for up to 5 s: its listener serves one connection (a ready
/// check's, say) and is gone until the loop starts it again, a gap that emulation makes long.
fn reach(port: u16) -> String {
    format!(
        "(for i in $(seq 50); do nc -w 2 localhost {port} </dev/null 2>/dev/null && exit 0; \
         sleep 0.1; done; exit 1)"
    )
}

pub(crate) async fn a_volume_reaches_a_sandbox_as_its_read_only_snapshot_byte_for_byte(
    hv: Hypervisor,
) {
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

    let daemon = microvm_daemon(hv, |c| {
        c.engine
            .storage
            .volumes
            .declare(&declared)
            .expect("declare");
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
        .expect("a microVM sandbox with a volume boots")
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
    assert_eq!(block_devices(hv, &daemon, &id), ["crucible-mount-0:ro"]);

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
    assert_no_processes_left(&id).await;
}

pub(crate) async fn an_imported_two_layer_image_is_a_sandboxs_ext4_root(hv: Hypervisor) {
    let daemon = microvm_daemon(hv, |_| {});
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
        .expect("a microVM sandbox of the imported image boots")
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

/// Waits until container `name` of sandbox `id` has exited.
async fn until_container_exited(c: &client::Client, id: &str, name: &str) -> ContainerInfo {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let info = c
            .containers(id)
            .await
            .expect("containers")
            .into_iter()
            .find(|info| info.name == name)
            .expect("the container is listed");
        if info.state == ContainerState::Exited {
            return info;
        }
        assert!(Instant::now() < deadline, "{name} never exited: {info:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `sh -c script` in container `container` of `id`: stdout and stderr, exit code.
async fn sh_in(c: &client::Client, id: &str, container: &str, script: &str) -> (String, i32) {
    let out = c
        .exec_in(id, container, &sh(script))
        .await
        .expect("exec in a container")
        .collect()
        .await
        .expect("its output");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (text, out.result.exit_code)
}

/// A CI job's service as containers of a microVM sandbox: an imported image's service on a
/// loopback port, a helper of the daemon's own image writing to a shared directory; the job
/// in the sandbox's root reaches both. Each container has its own root (its image, read-only
/// on a disk of its own) and PID namespace, its own exit status and log.
pub(crate) async fn a_service_container_is_reached_on_localhost_and_keeps_its_logs(hv: Hypervisor) {
    let daemon = microvm_daemon(hv, |_| {});
    let c = daemon.client();
    stage(hv, "import the service's image");
    harness::images::import_two_layer(&c, "svc")
        .await
        .expect("import");
    let request: CreateSandbox = serde_json::from_value(serde_json::json!({
        "shared": [{"name": "work", "path": "/work"}],
        "container_slots": 1,
        "containers": [
            {"name": "db", "image": "svc",
             "env": {"DB_PASSWORD": "db-s3cret"},
             "command": ["/bin/sh", "-c",
                         "echo db up; while true; do echo hello-from-db | nc -l -p 5432; done"],
             "ready": {"tcp_port": 5432},
             "shared": [{"name": "work", "path": "/data", "read_only": true}]},
            {"name": "helper",
             "command": ["/bin/sh", "-c", "echo written-by-helper > /data/note; exit 3"],
             "depends_on": ["db"],
             "shared": [{"name": "work", "path": "/data"}]}
        ]
    }))
    .expect("a valid request");
    stage(hv, "create a sandbox with two containers");
    let asked = Instant::now();
    let created = c.create(&request).await.expect("create");
    // Timings are not asserted (hosts differ); the figure is for the record.
    stage(hv, &format!("created and ready in {:?}", asked.elapsed()));
    let id = created.id.clone();
    assert_eq!(created.backend, BackendKind::Microvm);
    let names: Vec<&str> = created.containers.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["db", "helper"]);
    assert_eq!(created.containers[0].state, ContainerState::Ready);

    stage(
        hv,
        "the job reaches the service and reads the helper's file",
    );
    let helper = until_container_exited(&c, &id, "helper").await;
    assert_eq!(helper.exit_code, Some(3), "{helper:?}");
    let (out, err, code) = harness::sh(&c, &id, &format!("{}; cat /work/note", reach(5432))).await;
    assert_eq!(
        (out.as_str(), code),
        ("hello-from-db\nwritten-by-helper\n", 0),
        "{err}"
    );

    stage(
        hv,
        "the job sees none of the service's processes, roots or environments",
    );
    let (out, err, code) = harness::sh(
        &c,
        &id,
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done; \
         cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c db-s3cret; \
         umount -l /proc && ls /proc | grep -c '^[0-9]'; mount -t proc proc /proc; \
         ls /proc | grep -c '^[0-9]'",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    // db's shell (its command line, unlike this one's, holds `hello-from-db`).
    assert!(
        !out.contains("hello-from-db"),
        "main sees db's shell:\n{out}"
    );
    assert!(
        !out.contains("sandbox-container"),
        "main sees an agent:\n{out}"
    );
    let lines: Vec<&str> = out.lines().collect();
    let [secrets, uncovered, processes] = lines[lines.len() - 3..] else {
        panic!("three counts last:\n{out}");
    };
    assert_eq!(secrets, "0", "main reads db's environment:\n{out}");
    // Root in `main` unmounting its /proc finds no other beneath.
    assert_eq!(uncovered, "0", "main's /proc covered the guest's:\n{out}");
    // Its namespace's init and this command's few.
    let processes: usize = processes.parse().expect("a count");
    assert!(processes <= 5, "main sees {processes} processes:\n{out}");

    stage(
        hv,
        "the service's container: its image, its user, its own processes",
    );
    let (out, code) = sh_in(
        &c,
        &id,
        "db",
        "pwd; id -u; ls /opt/app; cat /proc/1/comm; ls /proc | grep -c '^[0-9]'; \
         test ! -e /work && cat /data/note; touch /data/x 2>&1 | grep -c 'Read-only'",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..4], ["/opt/app", "1000", "new", "init"], "{out}");
    let processes: usize = lines[4].parse().expect("a count");
    // Its agent, its service's shell and nc, and this command's three.
    assert!(processes <= 8, "db sees {processes} processes: {out}");
    assert_eq!(lines[5..], ["written-by-helper", "1"], "{out}");
    // The helper's root (the daemon's image, as root) takes writes in a layer of its own.
    let (out, code) = sh_in(&c, &id, "helper", "id -u; touch /new-file && ls /new-file").await;
    assert_eq!((out.as_str(), code), ("0\n/new-file\n", 0));
    let (root_sees, _, _) = harness::sh(&c, &id, "test -e /new-file && echo leaked").await;
    assert_eq!(root_sees, "", "a container's writes stay in its own layer");

    stage(
        hv,
        "a container's root cannot write the image disks other sandboxes share",
    );
    let disks_dir = daemon.state.config.storage.data_dir.join("image-disks");
    let digest = || -> Vec<(std::ffi::OsString, Vec<u8>)> {
        let mut all: Vec<_> = std::fs::read_dir(&disks_dir)
            .expect("image disks")
            .map(|e| {
                let path = e.expect("entry").path();
                let bytes = std::fs::read(&path).expect("read a snapshot");
                (
                    path.file_name().expect("name").to_owned(),
                    Sha256::digest(bytes).to_vec(),
                )
            })
            .collect();
        all.sort();
        all
    };
    let before = digest();
    assert_eq!(
        before.len(),
        2,
        "the service's and the helper's image: {before:?}"
    );
    let write_every_disk = "ls -d /dev/vd* | wc -l; for d in /dev/vd*; do \
           printf x | dd of=$d bs=1 count=1 seek=1024 conv=notrunc 2>/dev/null && echo wrote $d; \
           blockdev --setrw $d 2>/dev/null; \
           printf x | dd of=$d bs=1 count=1 seek=1024 conv=notrunc 2>/dev/null && echo wrote $d; \
         done; sync; echo tried";
    let (out, code) = sh_in(&c, &id, "helper", write_every_disk).await;
    // The two containers' image disks and the empty slot are all the VM has.
    assert_eq!(
        (out.as_str(), code),
        ("3\ntried\n", 0),
        "a disk took a write"
    );
    assert_eq!(digest(), before, "an image snapshot changed on the host");

    stage(hv, "a container added while it runs fills the empty slot");
    // The slots' control sockets are the daemon's alone: in a directory no one else enters.
    {
        use std::os::unix::fs::PermissionsExt;
        let dir = daemon.state.config.state_dir.join("sandboxes").join(&id);
        let mode = std::fs::metadata(&dir)
            .expect("its directory")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
    }
    let late: api_types::ContainerRequest = serde_json::from_value(serde_json::json!({
        "name": "late", "image": "svc",
        "command": ["/bin/sh", "-c",
                    "while true; do echo hello-from-late | nc -l -p 6379; done"],
        "ready": {"tcp_port": 6379},
        "shared": [{"name": "work", "path": "/data", "read_only": true}]
    }))
    .expect("request");
    let asked = Instant::now();
    let added = c.add_container(&id, &late).await.expect("add a container");
    stage(hv, &format!("added and ready in {:?}", asked.elapsed()));
    assert_eq!(added.state, ContainerState::Ready, "{added:?}");
    let (out, err, code) = harness::sh(&c, &id, &reach(6379)).await;
    assert_eq!((out.as_str(), code), ("hello-from-late\n", 0), "{err}");
    let (out, code) = sh_in(
        &c,
        &id,
        "late",
        "id -u; ls /opt/app; cat /data/note; touch /data/y 2>&1 | grep -c 'Read-only'",
    )
    .await;
    assert_eq!(
        (out.as_str(), code),
        ("1000\nnew\nwritten-by-helper\n1\n", 0)
    );
    let (out, code) = sh_in(&c, &id, "helper", write_every_disk).await;
    assert_eq!(
        (out.as_str(), code),
        ("3\ntried\n", 0),
        "the filled slot took a write"
    );
    assert_eq!(digest(), before, "an image snapshot changed on the host");

    stage(
        hv,
        "what a microVM cannot take: a container beyond its slots, a seventh disk",
    );
    // With a seccomp profile of its own (critest's, denying chmod): the one security setting
    // a microVM's added container takes; its guest agent installs it.
    let later: api_types::ContainerRequest = serde_json::from_value(serde_json::json!({
        "name": "later",
        "command": ["/bin/sh", "-c",
                    "while true; do echo hello-from-later | nc -l -p 6380; done"],
        "ready": {"tcp_port": 6380},
        "security": {"seccomp": {"default_action": "SCMP_ACT_ALLOW", "syscalls": [
            {"names": ["chmod", "fchmodat", "fchmodat2"], "action": "SCMP_ACT_ERRNO"}]}}
    }))
    .expect("request");
    match c.add_container(&id, &later).await {
        Err(ClientError::Api {
            status: 409,
            message,
            ..
        }) => assert!(message.contains("container_slots"), "{message}"),
        other => panic!("adding a container beyond the slots: {other:?}"),
    }
    stage(hv, "a removed container's disk serves the next one");
    c.remove_container(&id, "late").await.expect("remove late");
    let added = c
        .add_container(&id, &later)
        .await
        .expect("add into the freed slot");
    assert_eq!(added.state, ContainerState::Ready, "{added:?}");
    let (out, err, code) = harness::sh(
        &c,
        &id,
        &format!(
            "{}; nc -w 1 localhost 6379 </dev/null || echo late-gone",
            reach(6380)
        ),
    )
    .await;
    assert_eq!(
        (out.as_str(), code),
        ("hello-from-later\nlate-gone\n", 0),
        "{err}"
    );
    // Its root is the daemon's image, not what the slot held before.
    let (out, code) = sh_in(&c, &id, "later", "test -e /opt/app || echo own-image").await;
    assert_eq!((out.as_str(), code), ("own-image\n", 0));
    let chmod = "touch /tmp/f && chmod 600 /tmp/f 2>&1 | grep -c 'not permitted'";
    assert_eq!(sh_in(&c, &id, "later", chmod).await, ("1\n".to_string(), 0));
    assert_eq!(
        harness::sh(&c, &id, chmod).await.0,
        "0\n",
        "main has no profile"
    );
    let at_creation: CreateSandbox = serde_json::from_value(serde_json::json!({
        "containers": [{"name": "early", "security": {"seccomp": {
            "default_action": "SCMP_ACT_ALLOW"}}}]
    }))
    .expect("request");
    match c.create(&at_creation).await {
        Err(ClientError::Api {
            status: 400,
            message,
            ..
        }) => assert!(message.contains("security"), "{message}"),
        other => panic!("a seccomp profile at a microVM's creation: {other:?}"),
    }
    let seven: Vec<serde_json::Value> = (0..7)
        .map(|i| serde_json::json!({"name": format!("c{i}")}))
        .collect();
    let too_many: CreateSandbox =
        serde_json::from_value(serde_json::json!({"containers": seven})).expect("request");
    match c.create(&too_many).await {
        Err(ClientError::Api {
            status: 400,
            message,
            ..
        }) => assert!(message.contains("at most 6"), "{message}"),
        other => panic!("seven containers in a microVM: {other:?}"),
    }

    stage(
        hv,
        "a signal to the sandbox reaches main's commands, not its init or the services",
    );
    let sleeper = harness::spawn_exec(&c, &id, &["sleep", "1000"]);
    harness::wait_for_process(&c, &id, "sleep 1000").await;
    c.signal(&id, 9).await.expect("signal");
    let out = sleeper.await.expect("join");
    assert_eq!(out.result.signal, "SIGKILL", "{:?}", out.result);
    let (out, err, code) = harness::sh(&c, &id, &reach(5432)).await;
    assert_eq!((out.as_str(), code), ("hello-from-db\n", 0), "{err}");

    stage(hv, "logs, stats, removal");
    let logs = c.container_logs(&id, "db").await.expect("db's log");
    assert!(
        String::from_utf8_lossy(&logs).contains("db up"),
        "{}",
        String::from_utf8_lossy(&logs)
    );
    let stats = c.container_stats(&id, "db").await.expect("db's stats");
    assert!(stats.pids.current >= 2, "{stats:?}");
    c.remove_container(&id, "db").await.expect("remove db");
    let (out, _, code) = harness::sh(&c, &id, "nc -w 1 localhost 5432 </dev/null").await;
    assert!(out.is_empty() || code != 0, "db still answers: {out}");
    c.delete(&id).await.expect("delete");
    assert_no_processes_left(&id).await;
}

pub(crate) async fn a_sandbox_reports_its_guests_stats_and_takes_signals(hv: Hypervisor) {
    let daemon = microvm_daemon(hv, |_| {});
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

pub(crate) async fn a_command_past_the_sandboxs_memory_is_oom_killed_and_the_agent_answers(
    hv: Hypervisor,
) {
    let daemon = microvm_daemon(hv, |_| {});
    let c = daemon.client();
    let id = c
        .create(&CreateSandbox {
            memory_mib: Some(128),
            ..CreateSandbox::default()
        })
        .await
        .expect("create")
        .id;
    let out = c
        .exec_collect(&id, &sh("x=a; while true; do x=$x$x; done"))
        .await
        .expect("exec");
    assert_eq!(out.result.signal, "SIGKILL", "{:?}", out.result);
    assert!(out.result.oom_killed, "{:?}", out.result);
    // The guest's OOM killer took the command, never the agent.
    let (after, _, code) = harness::sh(&c, &id, "echo still here").await;
    assert_eq!((after.as_str(), code), ("still here\n", 0));
    let stats = c.stats(&id).await.expect("stats");
    assert!(stats.memory.oom_kills >= 1, "{stats:?}");
    c.delete(&id).await.expect("delete");
}

pub(crate) async fn a_matching_create_is_served_from_the_warm_pool(hv: Hypervisor) {
    let daemon = microvm_daemon(hv, |c| {
        c.engine.pools = vec!["default=1".parse().expect("a pool")];
    });
    let pool = daemon.state.pool.clone();
    harness::leaks::eventually_within("a ready pooled microVM", Duration::from_secs(120), || {
        pool.ready_ids().len() == 1
    })
    .await;
    let waiting = pool.ready_ids();
    let c = daemon.client();
    let started = Instant::now();
    let sandbox = c
        .create(&CreateSandbox {
            env: [("FROM".into(), "pool".into())].into(),
            ..CreateSandbox::default()
        })
        .await
        .expect("create");
    eprintln!("pool hit on {hv}: {:?}", started.elapsed());
    assert!(
        waiting.contains(&sandbox.id),
        "{} not from {waiting:?}",
        sandbox.id
    );
    assert_eq!(sandbox.backend, BackendKind::Microvm);
    assert_eq!(counter(&c, "crucible_pool_hits_total").await, 1);
    let (out, _, code) = harness::sh(&c, &sandbox.id, "echo $FROM; cat /proc/1/comm").await;
    assert_eq!((out.as_str(), code), ("pool\ninit\n", 0));
    c.delete(&sandbox.id).await.expect("delete");
    // The pool refills.
    harness::leaks::eventually_within("the pool refilled", Duration::from_secs(120), || {
        pool.ready_ids().len() == 1
    })
    .await;
}

pub(crate) async fn a_vm_that_cannot_boot_fails_the_create_with_its_own_words(hv: Hypervisor) {
    let scratch = tempfile::tempdir().expect("tempdir");
    // A kernel that is not one: the hypervisor refuses it, and says so on its stderr.
    let image = image_with_broken(scratch.path(), "vmlinux", b"not a kernel");
    let daemon = microvm_daemon(hv, |c| c.engine.image_dir = image);
    let err = daemon
        .client()
        .create(&CreateSandbox::default())
        .await
        .expect_err("no kernel, no sandbox");
    let message = err.to_string();
    eprintln!("{message}");
    let words = match hv {
        Hypervisor::CrucibleVmm => "cannot load the kernel",
        Hypervisor::QemuTcg => "qemu: ",
    };
    assert!(
        message.contains("exited before its agent was ready") && message.contains(words),
        "{message}"
    );
    assert_no_repeats(&message);
    drop(daemon);

    // An initramfs that is not one: the guest kernel finds no init and panics; the reason
    // quotes the console.
    let image = image_with_broken(scratch.path(), "initramfs.cpio", b"not an archive");
    let daemon = microvm_daemon(hv, |c| c.engine.image_dir = image);
    let err = daemon
        .client()
        .create(&CreateSandbox::default())
        .await
        .expect_err("no init, no sandbox");
    let message = err.to_string();
    eprintln!("{message}");
    assert!(message.contains("Kernel panic"), "{message}");
    if hv == Hypervisor::CrucibleVmm {
        assert!(
            message.contains("guest crashed: the guest stopped before its agent was ready"),
            "{message}"
        );
    }
    assert_no_repeats(&message);
    let left: Vec<_> = std::fs::read_dir(daemon.state.config.state_dir.join("sandboxes"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "a failed create leaves nothing: {left:?}");
}

/// Live restore (`--live-restore`) on microVMs: a daemon killed with SIGKILL leaves its VMs
/// running; the next takes back every one it can verify (same ids, owners, creation times, TTL
/// ends, labels), the commands that were streaming are re-attached and complete with their exit
/// status, new execs and files work; a sandbox whose record is cut short is cleaned up, its VM
/// processes killed. Then the same across a SIGTERM (upgrade) restart. Five VMs, two of them
/// streaming, rather than the namespace test's twenty: under TCG, and nested in a 4 GiB L1,
/// twenty guests would measure the emulator.
pub(crate) async fn sandboxes_and_their_commands_survive_a_killed_daemon_and_an_upgrade_restart(
    hv: Hypervisor,
) {
    use harness::restart::{
        edit_record, finish_burst, finish_commands, identities, start_burst, start_long,
        truncate_record, Kinds,
    };
    let home = DaemonHome::new();
    let kinds = Kinds::prepare();
    let hv_flag = hv.to_string();
    let mut options: Vec<String> = ["--microvm", hv_flag.as_str(), "--live-restore"]
        .map(String::from)
        .into();
    // A small tail, so that the burst command outgrows it while the daemon is down.
    options.extend(["--exec-tail-bytes".into(), "65536".into()]);
    options.extend(kinds.daemon_options());
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("daemon.log");
    let mut daemon = DaemonProcess::start_logging(&home, &options, Some(&log)).await;
    let c = daemon.client();
    let mut ids = Vec::new();
    for i in 0..6u64 {
        stage(hv, &format!("create sandbox {i}"));
        let info = c
            .create(&CreateSandbox {
                memory_mib: Some(256),
                ttl_s: Some(900 + i),
                labels: std::collections::BTreeMap::from([("n".to_string(), i.to_string())]),
                // One keeps room for a container added after the restarts.
                container_slots: (i == 3).then_some(1),
                ..CreateSandbox::default()
            })
            .await
            .expect("a microVM sandbox boots");
        ids.push(info.id);
    }
    stage(
        hv,
        "create one VM of each kind: egress, cache, volume, disk layer, image",
    );
    let kind_ids = kinds
        .create(
            &c,
            &CreateSandbox {
                memory_mib: Some(256),
                ttl_s: Some(600),
                ..CreateSandbox::default()
            },
        )
        .await;
    let mut started = Vec::new();
    let mut streams = Vec::new();
    for id in &ids[..2] {
        let (stream, head) = start_long(&c, id).await;
        let exec_id = stream.exec_id().expect("named").to_string();
        started.push((id.clone(), exec_id, head));
        streams.push(stream);
    }
    let (burst_stream, burst_head) = start_burst(&c, &ids[2]).await;
    let burst = (
        ids[2].clone(),
        burst_stream.exec_id().expect("named").to_string(),
    );
    streams.push(burst_stream);
    let mut before = identities(&c.list().await.expect("list"));
    assert_eq!(before.len(), 11);

    stage(hv, "SIGKILL the daemon");
    daemon.stop_with(Signal::SIGKILL);
    drop(streams);
    for (i, id) in ids.iter().enumerate() {
        // Under QEMU the slot's disk is a device process of its own.
        let slot_device = usize::from(i == 3 && hv == Hypervisor::QemuTcg);
        assert_eq!(
            sandbox_processes(id).len(),
            vm_processes(hv) + slot_device,
            "{id}'s VM runs on without its daemon"
        );
    }
    // Long enough for the burst command to write past its tail with nobody attached.
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Two records that lie: one cut in half, one naming another agent (its hello's uptime).
    let impostor = ids.pop().expect("six");
    edit_record(&home, &impostor, |record| {
        let uptime = &mut record["instance"]["hello"]["uptime_ms"];
        *uptime = (uptime.as_u64().expect("an uptime") + 1).into();
    });
    before.remove(&impostor);
    let refused = ids.pop().expect("five");
    truncate_record(&home, &refused);
    before.remove(&refused);

    stage(hv, "start a new daemon");
    let restarted_at = Instant::now();
    let daemon = DaemonProcess::start_logging(&home, &options, Some(&log)).await;
    stage(
        hv,
        &format!(
            "a new daemon took back 9 VMs and answered in {:.1?}",
            restarted_at.elapsed()
        ),
    );
    let c = daemon.client();
    assert_eq!(
        identities(&c.list().await.expect("list")),
        before,
        "the same ids, owners, creation times, TTLs and labels"
    );
    let text = std::fs::read_to_string(&log).expect("the log");
    assert!(
        text.lines().any(
            |l| l.contains(&format!("not taking back sandbox {refused}"))
                && l.contains("not a record")
        ),
        "no log line for {refused}:\n{text}"
    );
    assert_no_processes_left(&refused).await;
    assert!(
        text.lines().any(
            |l| l.contains(&format!("not taking back sandbox {impostor}"))
                && l.contains("its agent is not the recorded one")
        ),
        "no log line for {impostor}:\n{text}"
    );
    // Its processes were the recorded ones: killed, through their pidfds.
    assert_no_processes_left(&impostor).await;
    let infos = c.list().await.expect("list");
    assert!(infos.iter().all(|s| s.hypervisor == Some(hv)), "{infos:?}");

    stage(hv, "new work in the adopted VMs");
    let (out, _, code) = harness::sh(&c, &ids[2], "echo again").await;
    assert_eq!((out.as_str(), code), ("again\n", 0));
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(5);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append_data(&mut header, "kept.txt", &b"hello"[..])
        .expect("tar");
    let archive = tar.into_inner().expect("tar");
    c.put_tar(&ids[3], "/tmp", std::io::Cursor::new(archive))
        .await
        .expect("upload");
    let mut back = Vec::new();
    c.get_file(&ids[3], "/tmp/kept.txt", &mut back)
        .await
        .expect("download");
    assert_eq!(back, b"hello");
    stage(
        hv,
        "each kind's own work: egress, cache, volume, disk layer, image",
    );
    kinds.check(&c, &kind_ids).await;
    finish_burst(&c, &burst.0, &burst.1, &burst_head).await;
    let rest = started.split_off(1);
    finish_commands(&c, started).await;

    stage(hv, "SIGTERM restart");
    let mut daemon = daemon;
    assert!(daemon.stop_with(Signal::SIGTERM).success());
    let daemon = DaemonProcess::start_logging(&home, &options, Some(&log)).await;
    let c = daemon.client();
    assert_eq!(
        identities(&c.list().await.expect("list")),
        before,
        "a SIGTERM restart keeps them too"
    );
    finish_commands(&c, rest).await;
    kinds.check(&c, &kind_ids).await;
    stage(
        hv,
        "a container added to a VM two daemons ago created with a slot",
    );
    let late: api_types::ContainerRequest = serde_json::from_value(serde_json::json!({
        "name": "late",
        "command": ["/bin/sh", "-c", "echo late-up; exec sleep 600"]
    }))
    .expect("request");
    let added = c
        .add_container(&ids[3], &late)
        .await
        .expect("the adopted VM's slot takes a container");
    assert_eq!(added.state, ContainerState::Ready, "{added:?}");
    let (out, code) = sh_in(&c, &ids[3], "late", "cat /proc/1/comm").await;
    assert_eq!((out.as_str(), code), ("init\n", 0));
    for id in ids.iter().map(String::as_str).chain(kind_ids.all()) {
        c.delete(id).await.expect("delete");
        assert_no_processes_left(id).await;
    }
    let left: Vec<_> = std::fs::read_dir(home.state_dir().join("sandboxes"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in the state directory: {left:?}");
}

/// A microVM in a Kubernetes pod (`network_namespace`, as the shim passes the one CNI made):
/// its connections through the agent's proxy leave from that namespace, with the pod's address,
/// to what the pod's network reaches, with no allowlist of the daemon's; the host's own
/// loopback is not among it.
pub(crate) async fn a_pods_connections_leave_from_its_network_namespace(hv: Hypervisor) {
    let netns = HostLinkedNamespace::new();
    let server = std::net::TcpListener::bind((netns.host_ip, 0)).expect("bind on the host's side");
    let port = server.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for mut stream in server.incoming().flatten() {
            let _ = read_head(&mut stream);
            let peer = stream
                .peer_addr()
                .map(|a| a.ip().to_string())
                .unwrap_or_default();
            let body = format!("hello {peer}\n");
            let _ = stream.write_all(&harness::host_net::http_response(body.as_bytes()));
        }
    });
    let on_host_loopback = HostServer::responding(|_| harness::host_net::http_response(b"host\n"));
    // No `--egress-allow`: a pod's egress is its network's, not the operator's allowlist.
    let daemon = microvm_daemon(hv, |c| c.engine.live_restore = true);
    let c = daemon.client();
    let id = c
        .create(&CreateSandbox {
            memory_mib: Some(128),
            network_namespace: Some(netns.path()),
            ..CreateSandbox::default()
        })
        .await
        .expect("a microVM in a pod's network namespace boots")
        .id;
    let (out, err, code) = harness::sh(
        &c,
        &id,
        &format!(
            "wget -q -O - http://{}:{port}/file; \
             wget -q -O - http://127.0.0.1:{}/ 2>&1 || echo host-loopback-unreached",
            netns.host_ip, on_host_loopback.port
        ),
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        (lines.first().copied(), lines.last().copied()),
        (
            Some(format!("hello {}", netns.inside_ip).as_str()),
            Some("host-loopback-unreached")
        ),
        "{out}{err} (exit {code})"
    );
    assert_eq!(on_host_loopback.connections(), 0);
    // Inbound: a server on every address answers at the pod's IP, from the node; one on the
    // loopback alone only through the pod's 127.0.0.1 (containerd's port-forward); the
    // agent's egress proxy port at neither.
    let (out, err, code) = harness::sh(
        &c,
        &id,
        "mkdir -p /tmp/www && echo served-by-the-pod > /tmp/www/index.html && \
         httpd -p 8080 -h /tmp/www && httpd -p 127.0.0.1:8081 -h /tmp/www && echo up",
    )
    .await;
    assert_eq!((out.trim(), code), ("up", 0), "{out}{err}");
    let inside_ip = netns.inside_ip;
    let pod_ip = move |port: u16| std::net::SocketAddr::from((inside_ip, port));
    let pod_loopback = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (everywhere, loopback_only, proxy) = (8080, 8081, contract::egress::PROXY_PORT);
    let answered = tokio::task::spawn_blocking({
        let netns_path = netns.path();
        move || {
            let inside = |to| harness::host_net::http_get_in(&netns_path, to);
            [
                harness::host_net::http_get(pod_ip(everywhere)),
                harness::host_net::http_get(pod_ip(loopback_only)),
                harness::host_net::http_get(pod_ip(proxy)),
                inside(pod_loopback(everywhere)),
                inside(pod_loopback(loopback_only)),
                inside(pod_loopback(proxy)),
            ]
            .map(|got| {
                got.map(|text| text.contains("served-by-the-pod"))
                    .map_err(|e| e.to_string())
            })
        }
    })
    .await
    .expect("join");
    assert_eq!(
        answered,
        [
            Ok(true),
            Ok(false),
            Ok(false),
            Ok(true),
            Ok(true),
            Ok(false)
        ],
        "pod IP :8080, :8081, :3128; pod 127.0.0.1 :8080, :8081, :3128"
    );
    // A restarted daemon could not open the pod's namespace for it again: no record is kept
    // (a plain sandbox beside it has one).
    let plain = c
        .create(&CreateSandbox {
            memory_mib: Some(128),
            ..CreateSandbox::default()
        })
        .await
        .expect("a plain microVM")
        .id;
    let records = engine::restore::records_dir(&daemon.state.config.state_dir);
    let recorded = |id: &str| records.join(format!("{id}.json")).exists();
    assert!(recorded(&plain), "the plain sandbox's record");
    assert!(!recorded(&id), "a pod-network sandbox has no record");
    for id in [id, plain] {
        c.delete(&id).await.expect("delete");
    }
    // Its redirect left with it: the pod's port is closed again, as with nothing behind it.
    let rules = netns.nat_rules();
    assert!(!rules.contains("REDIRECT"), "{rules}");
    let after =
        tokio::task::spawn_blocking(move || harness::host_net::http_get(pod_ip(everywhere)))
            .await
            .expect("join");
    assert!(after.is_err(), "{after:?}");
}
