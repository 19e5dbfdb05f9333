//! Boots tiny test guests through the real boot path (`crucible-vmm` binary, real KVM) and
//! checks what they report. The guests are hand-assembled (`tests/guest/*.S`, bytes in
//! `tests/guest/*.bin`) and wrapped in an ELF by the test: without a PVH note they enter through
//! the 64-bit Linux boot protocol, with one through PVH.
//!
//! These run wherever `/dev/kvm` opens, including kvm_pvm hosts (the guests only do port I/O,
//! MMIO and a reset). Where it does not, `vmm/build.rs` leaves `crucible_kvm` unset and they are
//! compiled `#[ignore]`d with the reason; `CRUCIBLE_REQUIRE_KVM=1` makes them run, and fail,
//! anyway.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::vmm_binary;

use crucible_vmm::test_guest::{build_elf, serve_io_guest_host, GUEST32, GUEST64, IO_GUEST};

/// Fails the test, saying why, where `/dev/kvm` does not open: the test only runs here because
/// `CRUCIBLE_REQUIRE_KVM=1` (or the host changed since the build).
fn assert_kvm_usable() {
    let dev_kvm = Path::new(host_probe::host::DEV_KVM);
    if let Err(e) = host_probe::host::dev_kvm_access(dev_kvm) {
        panic!("this test needs a usable /dev/kvm: {e}");
    }
}

struct Run {
    out: Output,
    stdout: String,
    stderr: String,
}

/// Runs `crucible-vmm` on `kernel` with a console log, a zeroed disk and vsock (so windows 0, 1,
/// 2 are console, block, vsock) unless `block` is false.
fn run_vmm(dir: &Path, kernel: &Path, block: bool, extra: &[&str]) -> Run {
    std::fs::write(dir.join("disk.img"), vec![0u8; 1 << 20]).unwrap();
    run(vmm_command(dir, kernel, block, extra))
}

/// `crucible-vmm` on `kernel` with the console log `console.log`, the disk `disk.img` (unless
/// `block` is false) and vsock at `v.sock`, all in `dir`; serial output on stdout; 64 MiB of
/// guest RAM; timings on stderr unless `extra` sends them elsewhere.
fn vmm_command(dir: &Path, kernel: &Path, block: bool, extra: &[&str]) -> Command {
    let img = dir.join("disk.img");
    let mut cmd = Command::new(vmm_binary());
    if !extra.contains(&"--timings") {
        cmd.arg("--timings");
    }
    cmd.arg("--kernel")
        .arg(kernel)
        .args(["--mem-mib", "64", "--serial"])
        .arg("--console")
        .arg(dir.join("console.log"));
    if block {
        cmd.arg("--block").arg(&img);
    }
    cmd.args(["--vsock-cid", "3", "--vsock-uds"])
        .arg(dir.join("v.sock"))
        .args(extra);
    cmd
}

/// How long one test guest's VM may run: seconds on any KVM, and still well under a minute in
/// the nested tier (`cargo xtask nested`), where L1 itself runs under emulation.
const VM_LIMIT: Duration = Duration::from_secs(120);

fn run(mut cmd: Command) -> Run {
    let out = testkit::output_within(&mut cmd, VM_LIMIT).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("--- stdout\n{stdout}--- stderr\n{stderr}---");
    Run {
        out,
        stdout,
        stderr,
    }
}

fn write_kernel(dir: &Path, name: &str, code: &[u8], pvh: bool) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, build_elf(code, pvh)).unwrap();
    p
}

fn timings(stderr: &str) -> serde_json::Value {
    let line = stderr
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("--timings printed JSON");
    serde_json::from_str(line).unwrap()
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn test_guest_boots_via_64bit_boot_protocol_probes_devices_and_resets_cleanly() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "guest64.elf", GUEST64, false);
    let r = run_vmm(dir.path(), &k, true, &[]);
    assert!(r
        .stdout
        .contains("test-guest: entered (64-bit boot protocol)"));
    assert!(r
        .stdout
        .contains("boot_params, e820, cmdline, long mode ok"));
    assert!(r.stdout.contains("virtio-mmio console/block/vsock ok"));
    assert!(r.stdout.contains("test-guest: resetting"));
    assert_eq!(
        r.out.status.code(),
        Some(0),
        "clean exit after the i8042 reset"
    );
    assert!(
        !dir.path().join("v.sock").exists(),
        "the vsock socket file goes with the VM"
    );
    let t = timings(&r.stderr);
    assert_eq!(t["exit"], "guest_stop");
    let ready = t["kvm_ready_us"].as_u64().unwrap();
    let entry = t["kernel_entry_us"].as_u64().unwrap();
    let marker = t["boot_complete_us"].as_u64().unwrap();
    assert!(0 < ready && ready <= entry && entry <= marker, "{t}");
    // The guest's serial output and marker are port writes, its device probes MMIO reads: the
    // vCPU loop counted them.
    let exits = &t["exits"];
    assert!(exits["io_out"].as_u64().unwrap() > 10, "{t}");
    assert!(exits["mmio_read"].as_u64().unwrap() > 0, "{t}");
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn metrics_file_lists_each_virtio_device_and_a_well_behaved_guest_has_no_violations() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "guest64.elf", GUEST64, false);
    let file = dir.path().join("metrics.json");
    let r = run_vmm(dir.path(), &k, true, &["--metrics", file.to_str().unwrap()]);
    assert_eq!(r.out.status.code(), Some(0));
    assert!(
        r.stderr
            .contains("crucible-vmm: metrics: 0 driver protocol violations, 0 failed activations"),
        "{}",
        r.stderr
    );
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(m["violations"], 0, "{m}");
    let devices = m["devices"].as_array().unwrap();
    let named: Vec<(&str, u64)> = devices
        .iter()
        .map(|d| (d["device"].as_str().unwrap(), d["irq"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        named,
        [
            ("virtio-console@0xd0000000", 5),
            ("virtio-block@0xd0001000", 6),
            ("virtio-vsock@0xd0002000", 7)
        ]
    );
    assert_eq!(devices[0]["invalid_status_transitions"], 0);
}

#[test]
fn vmm_exits_with_the_config_code_when_the_metrics_file_cannot_be_created() {
    let dir = tempfile::tempdir().unwrap();
    let out = testkit::output_within(
        Command::new(vmm_binary())
            .args(["--kernel", "/k", "--metrics"])
            .arg(dir.path().join("no/such/dir/metrics.json")),
        VM_LIMIT,
    )
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(crucible_vmm::EXIT_CONFIG), "{err}");
    assert!(err.contains("cannot create the metrics file"), "{err}");
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn test_guest_boots_via_pvh_when_the_note_is_present() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "guest32.elf", GUEST32, true);
    let r = run_vmm(dir.path(), &k, true, &[]);
    assert!(
        r.stdout.contains("test-guest: entered (PVH)"),
        "{}",
        r.stdout
    );
    assert!(r
        .stdout
        .contains("start info, memory map, cmdline, protected mode ok"));
    assert!(r.stdout.contains("virtio-mmio console/block/vsock ok"));
    assert_eq!(r.out.status.code(), Some(0));
    assert!(timings(&r.stderr)["boot_complete_us"].as_u64().is_some());
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn test_guest_failing_a_check_makes_the_vmm_exit_with_the_guest_crash_code() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "guest64.elf", GUEST64, false);
    // Without the disk, window 1 is vsock: the guest's block check fails.
    let r = run_vmm(dir.path(), &k, false, &[]);
    assert!(r.stdout.contains("test-guest: FAIL M"), "{}", r.stdout);
    assert_eq!(r.out.status.code(), Some(crucible_vmm::EXIT_GUEST_CRASH));
    assert_eq!(timings(&r.stderr)["exit"], "guest_crash");
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn vmm_exits_with_the_config_code_for_a_missing_kernel() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let out = testkit::output_within(
        Command::new(vmm_binary())
            .arg("--kernel")
            .arg(dir.path().join("nope")),
        VM_LIMIT,
    )
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(crucible_vmm::EXIT_CONFIG), "{err}");
    assert!(err.contains("cannot open the kernel"), "{err}");
}

#[test]
fn vmm_exits_with_the_config_code_for_bad_flags() {
    let out = testkit::output_within(
        Command::new(vmm_binary()).args(["--kernel", "/k", "--vcpus", "nope"]),
        VM_LIMIT,
    )
    .unwrap();
    assert_eq!(out.status.code(), Some(crucible_vmm::EXIT_CONFIG));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--vcpus"));
}

#[test]
fn host_info_needs_no_kernel_and_prints_the_shared_probe() {
    let out =
        testkit::output_within(Command::new(vmm_binary()).arg("--host-info"), VM_LIMIT).unwrap();
    assert_eq!(out.status.code(), Some(crucible_vmm::EXIT_OK));
    let host = crucible_vmm::HostKind::detect();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}: {}\n", host.name(), host.describe())
    );
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn vmm_exits_with_the_config_code_for_a_non_elf_kernel() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = dir.path().join("junk");
    std::fs::write(&k, b"not an elf").unwrap();
    let r = run_vmm(dir.path(), &k, false, &[]);
    assert_eq!(r.out.status.code(), Some(crucible_vmm::EXIT_CONFIG));
    assert!(r.stderr.contains("uncompressed vmlinux ELF"));
}

/// `jmp $`: a guest that never finishes booting.
const SPIN: &[u8] = &[0xeb, 0xfe];

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn guest_that_never_finishes_booting_is_stopped_by_the_boot_timeout() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "spin.elf", SPIN, false);
    let t0 = std::time::Instant::now();
    let r = run_vmm(dir.path(), &k, true, &["--boot-timeout-ms", "300"]);
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(r.out.status.code(), Some(crucible_vmm::EXIT_KVM));
    assert!(
        r.stderr.contains("did not finish booting within 300 ms"),
        "{}",
        r.stderr
    );
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn sigterm_stops_a_running_vm_cleanly_with_vsock_traffic_under_seccomp() {
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "spin.elf", SPIN, false);
    let sock = dir.path().join("v.sock");
    // A stale socket file from a VMM that was killed: replaced, not an error.
    drop(UnixListener::bind(&sock).unwrap());
    let mut child = Command::new(vmm_binary())
        .arg("--kernel")
        .arg(&k)
        .args(["--mem-mib", "64", "--timings", "--boot-timeout-ms", "0"])
        .args(["--console", "off", "--vsock-cid", "3", "--vsock-uds"])
        .arg(&sock)
        .args(["--vsock-handshake-timeout-ms", "200"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let connect = || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match UnixStream::connect(&sock) {
                Ok(c) => break c,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                Err(e) => panic!("vsock socket never appeared: {e}"),
            }
        }
    };
    // The guest spins without a driver, so it never answers: under the seccomp filter, the
    // handshake deadline (the muxer's timer) closes the client's socket rather than leaving it
    // hanging.
    let mut unanswered = connect();
    unanswered.write_all(b"CONNECT 1024\n").unwrap();
    unanswered
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 8];
    assert!(
        matches!(unanswered.read(&mut b), Ok(0)),
        "EOF after the handshake timeout, no OK"
    );
    // A handshake still pending when SIGTERM arrives is closed by the exit.
    let mut pending = connect();
    pending.write_all(b"CONNECT 1024\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = testkit::wait_within(&mut child, VM_LIMIT).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    eprintln!("{err}");
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(timings(&err)["exit"], "signal");
    pending
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    assert!(matches!(pending.read(&mut b), Ok(0) | Err(_)));
    assert!(!sock.exists(), "the vsock socket file is removed at exit");
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn vmm_refuses_to_replace_a_regular_file_at_the_vsock_path() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "guest64.elf", GUEST64, false);
    let sock = dir.path().join("v.sock");
    std::fs::write(&sock, b"not a socket").unwrap();
    let out = testkit::output_within(
        Command::new(vmm_binary())
            .arg("--kernel")
            .arg(&k)
            .args(["--mem-mib", "64", "--console", "off", "--vsock-cid", "3"])
            .arg("--vsock-uds")
            .arg(&sock),
        VM_LIMIT,
    )
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("exists and is not a socket"), "{err}");
    assert_eq!(std::fs::read(&sock).unwrap(), b"not a socket");
}

/// Not a check but a tool, so it is ignored: writes `guest64.elf` and `guest-pvh.elf` for manual
/// runs (`crucible-vmm --kernel <dir>/guest64.elf --serial --timings`) into
/// `$CRUCIBLE_TEST_GUEST_OUT`, else `target/tmp/test-guests`, and prints where:
/// `cargo test -p crucible-vmm --test test_guest -- --ignored write_test_guest_elfs`.
#[test]
#[ignore = "a tool, not a check: writes the test guests for manual runs (run with --ignored)"]
fn write_test_guest_elfs() {
    let dir = std::env::var_os("CRUCIBLE_TEST_GUEST_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-guests"));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, code, pvh) in [
        ("guest64.elf", GUEST64, false),
        ("guest-pvh.elf", GUEST32, true),
    ] {
        let elf = write_kernel(&dir, name, code, pvh);
        assert_eq!(std::fs::read(&elf).unwrap(), build_elf(code, pvh));
        eprintln!("wrote {}", elf.display());
    }
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn test_guest_runs_with_two_vcpus_and_after_dropping_privileges() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "guest64.elf", GUEST64, false);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let drop: &[&str] = if root {
        &["--uid", "65534", "--gid", "65534"]
    } else {
        &[]
    };
    let mut extra = vec!["--vcpus", "2"];
    extra.extend_from_slice(drop);
    let r = run_vmm(dir.path(), &k, true, &extra);
    assert!(r.stdout.contains("test-guest: resetting"), "{}", r.stdout);
    assert_eq!(r.out.status.code(), Some(0));
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn each_attached_device_adds_its_virtio_mmio_window_and_irq_to_the_cmdline() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "guest64.elf", GUEST64, false);
    let img = dir.path().join("disk.img");
    std::fs::write(&img, vec![0u8; 4096]).unwrap();
    let mut cfg = crucible_vmm::VmConfig::new(k);
    cfg.mem_mib = 32;
    cfg.console = crucible_vmm::ConsoleOutput::File(dir.path().join("c.log"));
    cfg.block = vec![crucible_vmm::BlockConfig {
        path: img,
        read_only: true,
    }];
    cfg.vsock = Some(crucible_vmm::VsockConfig::new(3, dir.path().join("v.sock")));
    cfg.cmdline = "crucible.boot_marker=1".into();
    let vmm = crucible_vmm::Vmm::new(&cfg, std::time::Instant::now()).unwrap();
    let line = vmm.cmdline();
    let windows = [
        "virtio_mmio.device=4K@0xd0000000:5",
        "virtio_mmio.device=4K@0xd0001000:6",
        "virtio_mmio.device=4K@0xd0002000:7",
    ];
    let mut pos = 0;
    for w in windows {
        let at = line[pos..]
            .find(w)
            .unwrap_or_else(|| panic!("{w} in order in {line}"))
            + pos;
        pos = at + w.len();
    }
    assert!(line.starts_with("reboot=k"), "{line}");
    assert!(line.ends_with("crucible.boot_marker=1"), "{line}");
    assert!(line.contains("console=hvc0"), "{line}");
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn io_guest_drives_console_block_and_vsock_under_the_per_thread_seccomp_filters() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "io_guest.elf", IO_GUEST, false);
    let host = serve_io_guest_host(dir.path()).unwrap();
    // Default flags: the filters are on (no --no-seccomp).
    let r = run(vmm_command(dir.path(), &k, true, &[]));
    assert_eq!(r.out.status.code(), Some(0), "{}{}", r.stdout, r.stderr);
    for line in [
        "test-guest: virtio-console transmit ok",
        "test-guest: virtio-block write, flush, read back, host data ok",
        "test-guest: virtio-vsock connect, send, receive, shutdown ok",
        "test-guest: resetting",
    ] {
        assert!(r.stdout.contains(line), "{line} in {}", r.stdout);
    }
    let (ping, rest) = host.join().unwrap().unwrap();
    assert_eq!(&ping, b"ping from the guest");
    assert!(rest.is_empty(), "{rest:?}");
    let disk = std::fs::read(dir.path().join("disk.img")).unwrap();
    assert_eq!(&disk[512..535], b"crucible guest sector 1");
    let console = std::fs::read_to_string(dir.path().join("console.log")).unwrap();
    assert_eq!(console, "test-guest: hello on hvc0\n");
    assert!(
        r.stderr
            .contains("crucible-vmm: metrics: 0 driver protocol violations, 0 failed activations"),
        "{}",
        r.stderr
    );
    assert_eq!(timings(&r.stderr)["exit"], "guest_stop");
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn console_input_from_a_fifo_reaches_the_guest_which_echoes_it_under_seccomp() {
    use std::io::Write;
    use std::os::unix::ffi::OsStrExt;
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "io_guest.elf", IO_GUEST, false);
    let fifo = dir.path().join("console.in");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    // Longer than the guest's 64-byte receive buffers, written in two parts, then end of file.
    let line = "a line typed on the host, longer than one receive buffer of the guest\n";
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            // Waits (with a deadline) until the VMM has opened its end.
            let mut w = open_fifo_writer(&fifo, VM_LIMIT);
            w.write_all(&line.as_bytes()[..10]).unwrap();
            w.write_all(&line.as_bytes()[10..]).unwrap();
        })
    };
    let host = serve_io_guest_host(dir.path()).unwrap();
    // The guest waits for the line before block and vsock: everything runs under the filters.
    let r = run(vmm_command(
        dir.path(),
        &k,
        true,
        &[
            "--cmdline",
            "io_guest.echo",
            "--console-input",
            fifo.to_str().unwrap(),
        ],
    ));
    assert_eq!(r.out.status.code(), Some(0), "{}{}", r.stdout, r.stderr);
    writer.join().unwrap();
    assert_eq!(&host.join().unwrap().unwrap().0, b"ping from the guest");
    assert!(
        r.stdout.contains("test-guest: virtio-console receive ok"),
        "{}",
        r.stdout
    );
    let console = std::fs::read_to_string(dir.path().join("console.log")).unwrap();
    assert_eq!(
        console,
        format!("test-guest: hello on hvc0\ntest-guest: echo: {line}")
    );
}

#[test]
fn console_input_with_the_console_off_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "guest64.elf", GUEST64, false);
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "x\n").unwrap();
    let mut cmd = Command::new(vmm_binary());
    cmd.arg("--kernel")
        .arg(&k)
        .args(["--console", "off", "--console-input"])
        .arg(&input);
    let r = run(cmd);
    assert_eq!(r.out.status.code(), Some(2), "{}", r.stderr);
    assert!(
        r.stderr.contains("console_input needs a console"),
        "{}",
        r.stderr
    );
}

/// Each thread's name, `Seccomp` mode and filter count, from `/proc/<pid>/task`. KVM's own
/// worker (`kvm-nx-lpage-recovery`, a kernel task the kernel puts in the VMM's thread group)
/// is not ours and is left out.
fn thread_seccomp(pid: u32) -> Vec<(String, String, String)> {
    let mut threads = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return threads;
    };
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        let name = field("Name:");
        if !name.starts_with("kvm-") {
            threads.push((name, field("Seccomp:"), field("Seccomp_filters:")));
        }
    }
    threads.sort();
    threads
}

/// Starts the spinning guest with two vCPUs, waits until `done` holds for its threads (at most
/// 5 s), stops it with SIGTERM; returns the threads as last seen.
fn spinning_vm_threads(
    extra: &[&str],
    done: impl Fn(&[(String, String, String)]) -> bool,
) -> Vec<(String, String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "spin.elf", SPIN, false);
    let mut child = Command::new(vmm_binary())
        .arg("--kernel")
        .arg(&k)
        .args(["--mem-mib", "32", "--vcpus", "2", "--boot-timeout-ms", "0"])
        .args(["--console", "off"])
        .args(extra)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut seen = thread_seccomp(child.id());
    while !done(&seen) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        seen = thread_seccomp(child.id());
    }
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(
        testkit::wait_within(&mut child, VM_LIMIT).unwrap().code(),
        Some(0)
    );
    seen
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn every_vmm_thread_installs_exactly_one_seccomp_filter_of_its_own() {
    assert_kvm_usable();
    let names = ["crucible-vmm", "vcpu0", "vcpu1"];
    let filtered = |seen: &[(String, String, String)]| {
        seen.len() == 3 && seen.iter().all(|(_, mode, n)| mode == "2" && n == "1")
    };
    let seen = spinning_vm_threads(&[], filtered);
    // One filter each, none inherited: the main thread's goes on after the vCPUs exist.
    assert!(filtered(&seen), "{seen:?}");
    assert_eq!(seen.iter().map(|t| t.0.as_str()).collect::<Vec<_>>(), names);

    // The control: without the filters the same threads report mode 0.
    let unfiltered = |seen: &[(String, String, String)]| seen.len() == 3;
    let seen = spinning_vm_threads(&["--no-seccomp"], unfiltered);
    assert!(unfiltered(&seen), "{seen:?}");
    assert!(
        seen.iter().all(|(_, mode, n)| mode == "0" && n == "0"),
        "{seen:?}"
    );
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn timings_with_a_file_writes_the_json_there_and_not_on_stderr() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "guest64.elf", GUEST64, false);
    let file = dir.path().join("timings.json");
    let r = run_vmm(dir.path(), &k, true, &["--timings", file.to_str().unwrap()]);
    assert_eq!(r.out.status.code(), Some(0), "{}", r.stderr);
    assert!(
        !r.stderr.lines().any(|l| l.starts_with('{')),
        "{}",
        r.stderr
    );
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(t["exit"], "guest_stop", "{t}");
    assert_eq!(t["host"], crucible_vmm::HostKind::detect().name());
    let entry = t["kernel_entry_us"].as_u64().unwrap();
    assert!(t["kvm_ready_us"].as_u64().unwrap() <= entry, "{t}");
    assert!(entry <= t["boot_complete_us"].as_u64().unwrap(), "{t}");
    assert!(t["boot_complete_us"].as_u64().unwrap() <= t["exit_us"].as_u64().unwrap());

    let out = testkit::output_within(
        Command::new(vmm_binary())
            .args(["--kernel", "/k", "--timings"])
            .arg(dir.path().join("no/such/dir/t.json")),
        VM_LIMIT,
    )
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(crucible_vmm::EXIT_CONFIG), "{err}");
    assert!(err.contains("cannot create the timings file"), "{err}");
}

/// The VMM's goal for its own memory beside guest RAM (`docs/vmm.md`, "Overhead").
const OVERHEAD_GOAL_KIB: u64 = 3 * 1024;

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn vmm_private_memory_beside_guest_ram_stays_within_3_mib_with_every_device_in_use() {
    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "io_guest.elf", IO_GUEST, false);
    serve_io_guest_host(dir.path()).unwrap();
    let mut cmd = vmm_command(dir.path(), &k, true, &["--cmdline", "io_guest.stay"]);
    cmd.stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    // Measured once the guest has used every device and stays halted with them live.
    let serial = testkit::Lines::new(child.stdout.take().unwrap());
    loop {
        let line = serial
            .next_within(VM_LIMIT)
            .unwrap()
            .expect("the VMM ended before the guest finished its I/O");
        eprint!("{line}");
        if line.contains("test-guest: staying") {
            break;
        }
    }
    let measured = crucible_vmm::overhead::measure(child.id(), 64 << 20);
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(
        testkit::wait_within(&mut child, VM_LIMIT).unwrap().code(),
        Some(0)
    );
    let m = measured.unwrap();
    eprintln!("overhead: {}", serde_json::to_string(&m).unwrap());
    assert!(m.guest_ram_rss_kib > 0, "the guest touched its RAM: {m:?}");
    assert!(
        m.per_vm_kib() <= OVERHEAD_GOAL_KIB,
        "{} KiB private beside guest RAM (less shared file pages): {m:?}",
        m.per_vm_kib()
    );
}

/// Opens the write end of `fifo` once a reader has its read end, at most `limit` later: a
/// non-blocking open fails with ENXIO until then, where a blocking one would wait forever for
/// a VMM that died first.
fn open_fifo_writer(fifo: &Path, limit: Duration) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    let deadline = std::time::Instant::now() + limit;
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(fifo)
        {
            Ok(f) => return f,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "nobody opened {} for reading within {limit:?}",
                    fifo.display()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("opening {}: {e}", fifo.display()),
        }
    }
}

/// Guest code (64-bit) that writes each of `markers` to the agent's marker port
/// (`contract::boot_marker`), then resets through the i8042 and halts: a stand-in for the
/// agent's ways to end a VM, and for a kernel that panics.
fn marker_guest(markers: &[u8]) -> Vec<u8> {
    let [lo, hi] = contract::boot_marker::PORT.to_le_bytes();
    let mut code = vec![0x66, 0xba, lo, hi]; // mov dx, PORT
    for &m in markers {
        code.extend([0xb0, m, 0xee]); // mov al, m; out dx, al
    }
    code.extend([0xb0, 0xfe, 0xe6, 0x64]); // mov al, 0xfe; out 0x64, al (reset)
    code.extend([0xf4, 0xeb, 0xfd]); // hlt; jmp hlt
    code
}

/// Boots `marker_guest(markers)` with the agent's markers asked for (or not) on the command
/// line; returns the run.
fn run_marker_guest(markers: &[u8], expected: bool) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let k = write_kernel(dir.path(), "markers.elf", &marker_guest(markers), false);
    let mut extra = vec!["--console", "off"];
    if expected {
        extra.extend(["--cmdline", "crucible.boot_marker=1"]);
    }
    let mut cmd = Command::new(vmm_binary());
    cmd.arg("--kernel")
        .arg(&k)
        .args(["--mem-mib", "32", "--timings"])
        .args(&extra);
    run(cmd)
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn a_guest_that_resets_before_its_agent_is_ready_is_a_crash_not_a_clean_stop() {
    assert_kvm_usable();
    // A kernel that panics (or whose /init exits) before the agent's READY: exit 4, saying so.
    let r = run_marker_guest(&[], true);
    assert_eq!(
        r.out.status.code(),
        Some(crucible_vmm::EXIT_GUEST_CRASH),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains("guest crashed: the guest stopped before its agent was ready"),
        "{}",
        r.stderr
    );
    let t = timings(&r.stderr);
    assert_eq!(
        (t["exit"].as_str(), t["boot_complete_us"].is_null()),
        (Some("guest_crash"), true),
        "{t}"
    );
    // The same reset from a guest nobody asked for markers is a clean stop, as before.
    let r = run_marker_guest(&[], false);
    assert_eq!(
        r.out.status.code(),
        Some(crucible_vmm::EXIT_OK),
        "{}",
        r.stderr
    );
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn only_a_stop_the_agent_asked_for_ends_a_ready_vm_cleanly() {
    use contract::boot_marker::{READY, STOP_FAILED, STOP_REQUESTED};
    assert_kvm_usable();
    let r = run_marker_guest(&[READY, STOP_REQUESTED], true);
    assert_eq!(
        r.out.status.code(),
        Some(crucible_vmm::EXIT_OK),
        "{}",
        r.stderr
    );
    let t = timings(&r.stderr);
    assert_eq!(t["exit"], "guest_stop", "{t}");
    assert!(t["boot_complete_us"].as_u64().unwrap() > 0, "{t}");
    assert_eq!(t["markers_expected"], true, "{t}");
    for (markers, says) in [
        (&[READY][..], "although its agent did not end it"),
        (
            &[READY, STOP_FAILED][..],
            "the agent ended the VM after a failure",
        ),
    ] {
        let r = run_marker_guest(markers, true);
        assert_eq!(
            r.out.status.code(),
            Some(crucible_vmm::EXIT_GUEST_CRASH),
            "{markers:?}: {}",
            r.stderr
        );
        assert!(r.stderr.contains(says), "{markers:?}: {}", r.stderr);
    }
}

#[test]
#[cfg_attr(
    not(crucible_kvm),
    ignore = "needs a /dev/kvm this user can open; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
fn an_empty_read_only_disk_takes_an_image_through_the_disk_control_socket_under_seccomp() {
    use std::io::{BufRead, Write};
    use std::os::fd::AsRawFd;
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;

    assert_kvm_usable();
    let dir = tempfile::tempdir().unwrap();
    let kernel = write_kernel(dir.path(), "spin.elf", SPIN, false);
    let (slot, writable, control) = (
        dir.path().join("crucible-ctr-1"),
        dir.path().join("scratch.img"),
        dir.path().join("disk-control.sock"),
    );
    std::fs::write(&slot, b"").unwrap();
    std::fs::write(&writable, vec![0u8; 4096]).unwrap();
    let mut config = crucible_vmm::VmConfig::new(kernel);
    config.mem_mib = 32;
    config.boot_timeout_ms = Some(0);
    config.console = crucible_vmm::ConsoleOutput::Off;
    config.block = vec![
        crucible_vmm::BlockConfig {
            path: writable.clone(),
            read_only: false,
        },
        crucible_vmm::BlockConfig {
            path: slot.clone(),
            read_only: true,
        },
    ];
    config.disk_control = Some(control.clone());
    let config_path = dir.path().join("vm.json");
    std::fs::write(&config_path, serde_json::to_vec(&config).unwrap()).unwrap();
    let mut child = Command::new(vmm_binary())
        .arg("--config")
        .arg(&config_path)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let ask = |serial: &str, image: &Path| -> String {
        let stream = std::os::unix::net::UnixStream::connect(&control).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        (&stream)
            .write_all(format!("replace {serial}\n").as_bytes())
            .unwrap();
        let file = std::fs::File::open(image).unwrap();
        stream.send_with_fd(&[1u8][..], file.as_raw_fd()).unwrap();
        let mut answer = String::new();
        std::io::BufReader::new(&stream)
            .read_line(&mut answer)
            .unwrap();
        answer
    };
    while !control.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let image = dir.path().join("image.ext4");
    std::fs::write(&image, vec![7u8; 8192]).unwrap();
    // The slot takes it (16 sectors); the writable disk and an unknown serial do not.
    assert_eq!(ask("crucible-ctr-1", &image), "ok 16\n");
    let refused = ask("scratch.img", &image);
    assert!(
        refused.starts_with("error ") && refused.contains("no read-only disk"),
        "{refused}"
    );
    let refused = ask("crucible-ctr-9", &image);
    assert!(refused.starts_with("error "), "{refused}");
    // Every thread, the disk control's included, runs under exactly one filter of its own.
    let threads = thread_seccomp(child.id());
    assert!(
        threads
            .iter()
            .any(|(name, mode, n)| name == "disk-control" && mode == "2" && n == "1"),
        "{threads:?}"
    );
    assert!(
        threads.iter().all(|(_, mode, _)| mode == "2"),
        "{threads:?}"
    );
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(
        testkit::wait_within(&mut child, VM_LIMIT).unwrap().code(),
        Some(0)
    );
    assert!(!control.exists(), "the control socket goes with the VM");
}
