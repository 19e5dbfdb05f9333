//! Our virtio-vsock device against a real Linux driver: `crucible-vmm vhost-user vsock` serves
//! the device to QEMU (TCG, `-M microvm`, shared guest memory), which boots our kernel with
//! guest-init as PID 1 on the agent's default vsock ports. The host side is what the daemon
//! uses: the agent's hello arrives on `<uds>_<ready port>`, and execs go over
//! `CONNECT <agent port>` on the hybrid socket. Checked: the hello; `echo hi` (stdout and exit
//! frames, then EOF: the guest's shutdown reaches the host socket); a 16 MiB stdout stream
//! compared byte for byte (guest→host credit flow, and the large writes Linux 6.12 sends as one
//! descriptor per page); and 16 MiB through an interactive `cat`, host→guest and back at once
//! (both credit flows together); an upload the way the daemon sends one (`put_files`, then
//! the host shuts its write half and reads the answer) and the file read back (`get_file`).
//!
//! Needs QEMU (`apt-get install qemu-system-x86`) and the image (`cargo xtask build-image`,
//! which CI runs before the tests): fails, never skips, without them.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use contract::cmdline::BootConfig;
use contract::vsock::{host_port_path, DEFAULT_AGENT_PORT, DEFAULT_READY_PORT};
use wire::agent::{AgentReply, AgentRequest, Hello};
use wire::{Direction, ExecRequest, ExecResult, FrameReader, FrameType, FrameWriter};

const QEMU: &str = "qemu-system-x86_64";
const QEMU_PACKAGE: &str = "qemu-system-x86";
/// The microvm machine of the image smoke test, with guest memory in a shareable memfd: the
/// backend maps it.
const MACHINE: &str =
    "microvm,x-option-roms=off,isa-serial=on,rtc=off,pit=on,pic=on,acpi=off,memory-backend=mem";
const MEMORY_MIB: u32 = 256;
const GUEST_CID: u32 = 3;
/// The boot to the agent's hello takes ~3 s here under TCG.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a single read of an exec's output may wait.
const READ_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a backend may take to notice QEMU is gone.
const BACKEND_EXIT_TIMEOUT: Duration = Duration::from_secs(5);
/// The streamed stdout: past every buffer on the path (the device's per-connection credit,
/// the guest's socket buffer), so it only completes if credit keeps flowing.
const STREAM_BYTES: usize = 16 * 1024 * 1024;
/// The uploaded file: more than the device's per-connection buffer.
const UPLOAD_BYTES: usize = 1024 * 1024 + 3;
/// The line `yes` repeats for the stream: 63 bytes, so a lost, repeated or reordered 64 KiB
/// packet shifts the pattern and shows.
const STREAM_LINE: &str = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// The image: `$CRUCIBLE_IMAGE`, else `target/crucible/image` in the workspace.
fn image_files() -> (PathBuf, PathBuf) {
    let dir = std::env::var_os("CRUCIBLE_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/crucible/image"));
    let (kernel, initramfs) = (dir.join("vmlinux"), dir.join("initramfs.cpio"));
    for file in [&kernel, &initramfs] {
        assert!(
            file.is_file(),
            "this test boots our kernel and initramfs under QEMU, and {} is missing: run \
             `cargo xtask build-image` (or `cargo xtask ci`, which does) first",
            file.display()
        );
    }
    (kernel, initramfs)
}

fn qemu_binary() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(QEMU))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "this test boots Linux under QEMU and {QEMU} is not on PATH: install it with \
                 `apt-get install {QEMU_PACKAGE}`"
            )
        })
}

/// A running `crucible-vmm vhost-user vsock`, listening.
struct Backend {
    child: Option<Child>,
    socket: PathBuf,
}

impl Backend {
    fn start(socket: PathBuf, uds: &Path) -> Backend {
        let mut child = Command::new(env!("CARGO_BIN_EXE_crucible-vmm"))
            .args(["vhost-user", "vsock", "--socket"])
            .arg(&socket)
            .args(["--guest-cid", &GUEST_CID.to_string(), "--uds"])
            .arg(uds)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // The backend says when the socket accepts connections; EOF means it died.
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim_end(),
            format!(
                "crucible-vmm: vhost-user vsock listening on {}",
                socket.display()
            ),
            "the vsock backend did not come up: {:?}",
            child.try_wait()
        );
        Backend {
            child: Some(child),
            socket,
        }
    }

    /// Waits for the backend to end by itself once its frontend is gone.
    fn wait(mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        let pid = child.id();
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let status = child.wait();
            let _ = tx.send(());
            status
        });
        if rx.recv_timeout(BACKEND_EXIT_TIMEOUT).is_err() {
            // The child is with the waiting thread: end it by its pid, so the test does not hang.
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!(
                "the backend on {} still runs {BACKEND_EXIT_TIMEOUT:?} after QEMU exited",
                self.socket.display()
            );
        }
        waiter.join().unwrap().unwrap()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// QEMU, killed when dropped (a failing test must not leave a VM running); its console goes to
/// a file the failure messages quote.
struct Qemu {
    child: Child,
    console: PathBuf,
}

impl Qemu {
    fn boot(kernel: &Path, initramfs: &Path, vhost_socket: &Path, console: PathBuf) -> Qemu {
        let append = format!(
            "console=ttyS0 reboot=t panic=-1 {}",
            BootConfig::default().to_cmdline().unwrap()
        );
        let mut chardev = std::ffi::OsString::from("socket,id=vsock,path=");
        chardev.push(vhost_socket);
        let log = std::fs::File::create(&console).unwrap();
        let child = Command::new(qemu_binary())
            .args(["-M", MACHINE, "-accel", "tcg", "-cpu", "max"])
            .args(["-m", &MEMORY_MIB.to_string()])
            .args([
                "-object",
                &format!("memory-backend-memfd,id=mem,size={MEMORY_MIB}M,share=on"),
            ])
            .arg("-chardev")
            .arg(chardev)
            .args(["-device", "vhost-user-vsock-device,chardev=vsock"])
            .args(["-nodefaults", "-no-reboot", "-display", "none"])
            .args(["-serial", "stdio"])
            .arg("-kernel")
            .arg(kernel)
            .arg("-initrd")
            .arg(initramfs)
            .args(["-append", &append])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Qemu { child, console }
    }

    fn console(&self) -> String {
        std::fs::read_to_string(&self.console).unwrap_or_default()
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent's hello on `listener`, within [`HELLO_TIMEOUT`].
fn accept_hello(listener: UnixListener, qemu: &Qemu) -> Hello {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let hello = listener
            .accept()
            .map_err(|e| e.to_string())
            .and_then(|(mut s, _)| {
                s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
                wire::read_message::<_, Hello>(&mut s).map_err(|e| e.to_string())
            });
        let _ = tx.send(hello);
    });
    match rx.recv_timeout(HELLO_TIMEOUT) {
        Ok(Ok(hello)) => hello,
        Ok(Err(e)) => panic!(
            "reading the agent's hello: {e}\n--- console ---\n{}",
            qemu.console()
        ),
        Err(_) => panic!(
            "no hello from the agent within {HELLO_TIMEOUT:?}\n--- console ---\n{}",
            qemu.console()
        ),
    }
}

/// A connection to the agent through the hybrid socket: `CONNECT <port>` answered `OK <p>`.
fn connect_agent(uds: &Path) -> UnixStream {
    let mut stream = UnixStream::connect(uds).unwrap();
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    stream
        .write_all(format!("CONNECT {DEFAULT_AGENT_PORT}\n").as_bytes())
        .unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.last() != Some(&b'\n') {
        let n = stream.read(&mut byte).unwrap();
        assert_eq!(n, 1, "the device closed the connection after {line:?}");
        line.push(byte[0]);
    }
    assert!(line.starts_with(b"OK "), "CONNECT answered {line:?}");
    stream
}

/// What one exec sent back.
struct ExecOutput {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    result: ExecResult,
}

/// Runs `cmd` in the guest; with `stdin`, interactively, writing it (then `stdin_close`) from
/// another thread while the output is read, so both directions flow at once.
fn exec(uds: &Path, cmd: &[&str], stdin: Option<Vec<u8>>) -> ExecOutput {
    let mut stream = connect_agent(uds);
    let request = AgentRequest::Exec {
        request: ExecRequest::new(cmd.iter().copied()),
        interactive: stdin.is_some(),
    };
    wire::write_message(&mut stream, &request).unwrap();
    let writer = stdin.map(|input| {
        let mut frames = FrameWriter::new(stream.try_clone().unwrap());
        std::thread::spawn(move || {
            frames.write_data(FrameType::Stdin, &input)?;
            frames.write_data(FrameType::StdinClose, &[])?;
            frames.flush()
        })
    });
    let mut reader = FrameReader::new(stream, Direction::GuestToHost);
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    loop {
        let frame = reader
            .read_frame()
            .unwrap_or_else(|e| {
                panic!(
                    "{cmd:?}: reading frames after {} stdout bytes: {e}",
                    stdout.len()
                )
            })
            .unwrap_or_else(|| panic!("{cmd:?}: the stream ended without an exit frame"));
        match frame.frame_type {
            FrameType::Stdout => stdout.extend_from_slice(frame.payload),
            FrameType::Stderr => stderr.extend_from_slice(frame.payload),
            FrameType::Exit => {
                let result = serde_json::from_slice(frame.payload).unwrap();
                if let Some(writer) = writer {
                    writer.join().unwrap().unwrap();
                }
                // The agent closes its end after the exit frame: the host must see EOF.
                let mut rest = Vec::new();
                let eof = reader.get_mut().read_to_end(&mut rest);
                assert!(
                    matches!(eof, Ok(0)),
                    "{cmd:?}: after the exit frame, {eof:?} with {} more bytes instead of EOF",
                    rest.len()
                );
                return ExecOutput {
                    stdout,
                    stderr,
                    result,
                };
            }
            other => panic!("{cmd:?}: unexpected {other:?} frame from the agent"),
        }
    }
}

/// What `yes STREAM_LINE | head -c STREAM_BYTES` prints.
fn expected_stream() -> Vec<u8> {
    let line = format!("{STREAM_LINE}\n");
    let mut out = line.repeat(STREAM_BYTES / line.len() + 1).into_bytes();
    out.truncate(STREAM_BYTES);
    out
}

/// [`STREAM_BYTES`] bytes without a short period (a xorshift sequence), for the echo.
fn unpatterned_bytes() -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..STREAM_BYTES)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 56) as u8
        })
        .collect()
}

/// A ustar archive holding one regular file `name` with `content`.
fn tar_with_one_file(name: &str, content: &[u8]) -> Vec<u8> {
    let mut header = [0u8; 512];
    let mut field = |offset: usize, value: &[u8]| {
        header[offset..offset + value.len()].copy_from_slice(value);
    };
    field(0, name.as_bytes());
    field(100, b"0000644\0");
    field(108, b"0000000\0");
    field(116, b"0000000\0");
    field(124, format!("{:011o}\0", content.len()).as_bytes());
    field(136, b"00000000000\0");
    field(148, b"        ");
    field(156, b"0");
    field(257, b"ustar\0");
    field(263, b"00");
    let checksum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    header[148..156].copy_from_slice(format!("{checksum:06o}\0 ").as_bytes());
    let mut archive = header.to_vec();
    archive.extend_from_slice(content);
    archive.resize(archive.len().next_multiple_of(512) + 1024, 0);
    archive
}

/// Uploads `archive` beneath `dir` as the daemon does: the request, the archive, the write half
/// shut, then the agent's answer.
fn put_files(uds: &Path, dir: &str, archive: &[u8]) -> AgentReply {
    let mut stream = connect_agent(uds);
    let request = AgentRequest::PutFiles { path: dir.into() };
    wire::write_message(&mut stream, &request).unwrap();
    stream.write_all(archive).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    wire::read_message(&mut stream).unwrap_or_else(|e| {
        panic!("no answer to put_files after the host shut its write half: {e}")
    })
}

/// A guest file's bytes (`get_file`).
fn get_file(uds: &Path, path: &str) -> Vec<u8> {
    let mut stream = connect_agent(uds);
    let request = AgentRequest::GetFile { path: path.into() };
    wire::write_message(&mut stream, &request).unwrap();
    let size = match wire::read_message(&mut stream).unwrap() {
        AgentReply::File { size } => size,
        other => panic!("get_file {path}: {other:?}"),
    };
    let mut content = vec![0u8; usize::try_from(size).unwrap()];
    stream.read_exact(&mut content).unwrap();
    content
}

/// Where two byte strings first differ (for a readable failure instead of 16 MiB of bytes).
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

#[test]
fn vhost_user_vsock_serves_a_real_linux_virtio_vsock_driver_under_qemu() {
    let started = Instant::now();
    let (kernel, initramfs) = image_files();
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vsock.sock");
    // Listening before the guest boots, as the daemon does: the agent sends its hello once.
    let hello_listener = UnixListener::bind(host_port_path(&uds, DEFAULT_READY_PORT)).unwrap();
    let backend = Backend::start(dir.path().join("vhost-user.sock"), &uds);
    let qemu = Qemu::boot(
        &kernel,
        &initramfs,
        &backend.socket,
        dir.path().join("console.log"),
    );

    let hello = accept_hello(hello_listener, &qemu);
    assert_eq!(hello.pid, 1, "{hello:?}");
    let booted = started.elapsed();

    let echo = exec(&uds, &["echo", "hi"], None);
    assert_eq!(echo.stdout, b"hi\n");
    assert_eq!(echo.stderr, b"");
    assert_eq!(echo.result.exit_code, 0, "{:?}", echo.result);

    let streaming = Instant::now();
    let script = format!("yes {STREAM_LINE} | head -c {STREAM_BYTES}");
    let stream = exec(&uds, &["sh", "-c", &script], None);
    let streamed_in = streaming.elapsed();
    assert_eq!(stream.result.exit_code, 0, "{:?}", stream.result);
    assert_eq!(
        stream.stdout.len(),
        STREAM_BYTES,
        "stderr: {}",
        String::from_utf8_lossy(&stream.stderr)
    );
    assert_eq!(
        first_difference(&stream.stdout, &expected_stream()),
        None,
        "the stream's bytes differ from what the guest printed"
    );

    let echoing = Instant::now();
    let input = unpatterned_bytes();
    let echoed = exec(&uds, &["cat"], Some(input.clone()));
    let echoed_in = echoing.elapsed();
    assert_eq!(echoed.result.exit_code, 0, "{:?}", echoed.result);
    assert_eq!(echoed.stdout.len(), input.len());
    assert_eq!(
        first_difference(&echoed.stdout, &input),
        None,
        "cat's output differs from its input"
    );
    let upload = &input[..UPLOAD_BYTES];
    match put_files(&uds, "/tmp/upload", &tar_with_one_file("blob", upload)) {
        AgentReply::Files(result) => {
            assert_eq!(result.written, ["blob"], "{result:?}");
            assert_eq!(result.bytes, UPLOAD_BYTES as u64, "{result:?}");
        }
        other => panic!("put_files answered {other:?}"),
    }
    let read_back = get_file(&uds, "/tmp/upload/blob");
    assert_eq!(read_back.len(), UPLOAD_BYTES);
    assert_eq!(first_difference(&read_back, upload), None);

    eprintln!(
        "hello after {booted:?}; {STREAM_BYTES} bytes out in {streamed_in:?}, \
         echoed in {echoed_in:?} (TCG)"
    );

    qemu.stop();
    let socket = backend.socket.clone();
    let status = backend.wait();
    assert!(
        status.success(),
        "backend on {}: {status}",
        socket.display()
    );
    assert!(
        !uds.exists(),
        "the backend removes its hybrid socket when it ends"
    );
}

/// The subcommand's refusals, without QEMU: they are configuration errors (exit 2) that name
/// the problem, and they leave what they refused alone.
#[test]
fn vhost_user_vsock_refuses_bad_arguments_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let precious = dir.path().join("precious");
    std::fs::write(&precious, b"keep me").unwrap();
    let uds = dir.path().join("vsock.sock");
    let run = |socket: &Path, cid: &str| {
        Command::new(env!("CARGO_BIN_EXE_crucible-vmm"))
            .args(["vhost-user", "vsock", "--socket"])
            .arg(socket)
            .args(["--guest-cid", cid, "--uds"])
            .arg(&uds)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };

    let out = run(&precious, "3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is not a socket"), "{stderr}");
    assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
    assert!(out.stdout.is_empty(), "no ready line");

    // CIDs 0–2 are the hypervisor's, the loopback's and the host's.
    let out = run(&dir.path().join("vhost.sock"), "2");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--guest-cid"));
    assert!(!uds.exists());
}
