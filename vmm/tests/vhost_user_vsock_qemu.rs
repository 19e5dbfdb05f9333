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
//! Then, on the same VM: the negotiated features in the guest's sysfs (VERSION_1 and nothing
//! else); 200 host connections open at once, each holding unread data, then 6 waves of 200
//! pings (more than the backend's connection limit: a leak would refuse some); a reader that
//! stops (the guest's writer blocks, other connections are served) and resumes (every byte,
//! in order); host clients that never finish their `CONNECT` line, closed after the handshake
//! timeout; guest-initiated connections from more agents started in the guest, and one to an
//! unlistened port refused; finally the agent's `shutdown`: QEMU exits, the backend exits 0
//! and removes its sockets.
//!
//! Needs QEMU (`apt-get install qemu-system-x86`) and the image (`cargo xtask build-image`,
//! which CI runs before the tests): fails, never skips, without them.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;

use common::{image_files, qemu_binary, Backend};
use contract::cmdline::BootConfig;
use contract::vsock::{host_port_path, DEFAULT_AGENT_PORT, DEFAULT_READY_PORT};
use wire::agent::{AgentReply, AgentRequest, Hello};
use wire::{Direction, ExecRequest, ExecResult, FrameReader, FrameType, FrameWriter};

const MEMORY_MIB: u32 = 256;
const GUEST_CID: u32 = 3;
/// The boot to the agent's hello takes ~3 s here under TCG.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a single read of an exec's output may wait.
const READ_TIMEOUT: Duration = Duration::from_secs(20);
/// The streamed stdout: past every buffer on the path (the device's per-connection credit,
/// the guest's socket buffer), so it only completes if credit keeps flowing.
const STREAM_BYTES: usize = 16 * 1024 * 1024;
/// The backend's handshake timeout: a host client that has not finished its `CONNECT` line by
/// then is closed. Shorter than the default (2 s), so the test shows the flag is honoured.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(500);
/// Host-initiated connections open at once, and how many such waves: 6 × 200 is more than the
/// backend's 1024-connection limit, so a leaked connection per exchange would refuse a wave.
const CONCURRENT_CONNECTIONS: usize = 200;
const CONNECTION_WAVES: usize = 6;
/// The slow reader's stream: far past every buffer on the path (host socket, the device's
/// per-connection buffer, the guest's socket buffer, the pipe), so the guest's writer blocks.
const SLOW_READER_BYTES: usize = 4 * 1024 * 1024;
/// What the slow reader takes before it stops reading.
const SLOW_READER_FIRST_BYTES: usize = 64 * 1024;
/// How long the host socket's unread byte count must hold still to call the guest blocked.
const BLOCKED_FOR: Duration = Duration::from_millis(500);
/// How long QEMU may take to end after the agent is asked to shut down.
const POWEROFF_TIMEOUT: Duration = Duration::from_secs(30);
/// The host port the extra guest agents send their hellos to, and the guest ports they serve.
const GUEST_HELLO_PORT: u32 = 5000;
const GUEST_AGENT_PORTS: [u32; 4] = [2001, 2002, 2003, 2004];
/// A host port nobody listens on.
const UNLISTENED_PORT: u32 = 5999;
/// `VIRTIO_F_VERSION_1`, the only device feature bit we offer.
const VIRTIO_F_VERSION_1: usize = 32;
/// The uploaded file: more than the device's per-connection buffer.
const UPLOAD_BYTES: usize = 1024 * 1024 + 3;
/// The line `yes` repeats for the stream: 63 bytes, so a lost, repeated or reordered 64 KiB
/// packet shifts the pattern and shows.
const STREAM_LINE: &str = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

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
            .args(contract::qemu::shared_memory_machine_args(u64::from(
                MEMORY_MIB,
            )))
            .args(["-accel", "tcg", "-cpu", "max"])
            .args(["-m", &MEMORY_MIB.to_string()])
            .arg("-chardev")
            .arg(chardev)
            .args(["-device", "vhost-user-vsock-device,chardev=vsock"])
            // QEMU's virtio-mmio is legacy (version 1) unless told otherwise: the guest could
            // not see feature bits 32 and up, so VERSION_1 (and the virtio 1.x rules our own
            // MMIO transport runs under) was never negotiated.
            .args(contract::qemu::MODERN_VIRTIO_MMIO)
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

    /// Waits for QEMU to end by itself within `timeout`.
    fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "QEMU still runs {timeout:?} after the agent was asked to shut down\n\
                 --- console ---\n{}",
                self.console()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
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
    connect_port(uds, DEFAULT_AGENT_PORT)
}

/// A connection to guest port `port` through the hybrid socket.
fn connect_port(uds: &Path, port: u32) -> UnixStream {
    let mut stream = UnixStream::connect(uds).unwrap();
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    stream
        .write_all(format!("CONNECT {port}\n").as_bytes())
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
        tail_bytes: None,
        request: ExecRequest::new(cmd.iter().copied()),
        interactive: stdin.is_some(),
        user: None,
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
        AgentReply::File { size, .. } => size,
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

/// The guest's virtio devices as sysfs shows them: `device id, driver, negotiated features`
/// per line (the features file has one '0'/'1' character per bit, bit 0 first).
fn guest_virtio_devices(uds: &Path) -> Vec<(String, String, String)> {
    let script = "for d in /sys/bus/virtio/devices/*; do \
                  echo \"$(cat $d/device) $(basename $(readlink $d/driver)) $(cat $d/features)\"; \
                  done";
    let out = exec(uds, &["sh", "-c", script], None);
    assert_eq!(
        out.result.exit_code,
        0,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields.len(), 3, "{line:?}");
            (fields[0].into(), fields[1].into(), fields[2].into())
        })
        .collect()
}

/// At most this many host connections not yet known to be accepted by the agent. The agent
/// listens with a backlog of 128 and Linux resets a connection request that finds the accept
/// queue full (`sk_acceptq_is_full`): under TCG the agent accepts slower than a burst of
/// connects arrives, so an unthrottled burst of 200 had ~65 reset (the host saw EOF instead of
/// `OK`). That is the guest's rule, not the device's; the throttle keeps the test about ours.
const MAX_UNACCEPTED: usize = 64;

/// The file every one of the connections open at once reads, and its size: more than one
/// packet, so each connection holds unread data while the others open.
const MANY_FILE: &str = "/tmp/many.bin";
const MANY_FILE_BYTES: usize = 16 * 1024;

/// A counting semaphore.
struct Permits {
    free: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
}

impl Permits {
    fn new(n: usize) -> Permits {
        Permits {
            free: std::sync::Mutex::new(n),
            freed: std::sync::Condvar::new(),
        }
    }

    fn acquire(&self) {
        let mut free = self
            .freed
            .wait_while(self.free.lock().unwrap(), |free| *free == 0)
            .unwrap();
        *free -= 1;
    }

    fn release(&self) {
        *self.free.lock().unwrap() += 1;
        self.freed.notify_one();
    }
}

/// A connection to the agent through the hybrid socket, or why there is none.
fn try_connect_agent(uds: &Path) -> Result<UnixStream, String> {
    let mut stream = UnixStream::connect(uds).map_err(|e| format!("connect: {e}"))?;
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    stream
        .write_all(format!("CONNECT {DEFAULT_AGENT_PORT}\n").as_bytes())
        .map_err(|e| format!("writing CONNECT: {e}"))?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.last() != Some(&b'\n') {
        match stream.read(&mut byte) {
            Ok(1) => line.push(byte[0]),
            other => return Err(format!("after {line:?}: {other:?}")),
        }
    }
    if !line.starts_with(b"OK ") {
        return Err(format!("CONNECT answered {line:?}"));
    }
    Ok(stream)
}

/// One of many connections open at once: a `get_file` of `path` whose size header has
/// arrived (so the agent has accepted it: `accepted` is released), left unread until all are
/// open (`all_open`), then read to the end and compared with `content`.
fn get_file_when_all_open(
    uds: &Path,
    path: &str,
    content: &[u8],
    accepted: &Permits,
    all_open: &std::sync::Barrier,
) -> Result<(), String> {
    accepted.acquire();
    let opened = try_connect_agent(uds).and_then(|mut stream| {
        let request = AgentRequest::GetFile { path: path.into() };
        wire::write_message(&mut stream, &request).map_err(|e| format!("get_file: {e}"))?;
        match wire::read_message(&mut stream) {
            Ok(AgentReply::File { size, .. }) if size == content.len() as u64 => Ok(stream),
            other => Err(format!("get_file answered {other:?}")),
        }
    });
    accepted.release();
    // Every thread reaches the barrier, even one whose connection failed.
    all_open.wait();
    let mut received = Vec::new();
    opened?
        .read_to_end(&mut received)
        .map_err(|e| format!("reading the file after {} bytes: {e}", received.len()))?;
    match first_difference(&received, content) {
        None => Ok(()),
        Some(at) => Err(format!(
            "{} bytes, first difference at {at}",
            received.len()
        )),
    }
}

/// One `ping` on its own connection: `Ok` once the pong and then EOF arrived.
fn ping(uds: &Path, accepted: &Permits) -> Result<(), String> {
    accepted.acquire();
    let pong = try_connect_agent(uds).and_then(|mut stream| {
        wire::write_message(&mut stream, &AgentRequest::Ping).map_err(|e| format!("ping: {e}"))?;
        match wire::read_message(&mut stream) {
            Ok(AgentReply::Pong(hello)) if hello.pid == 1 => Ok(stream),
            other => Err(format!("ping answered {other:?}")),
        }
    });
    accepted.release();
    let mut rest = Vec::new();
    match pong?.read_to_end(&mut rest) {
        Ok(0) => Ok(()),
        other => Err(format!("after the pong: {other:?} instead of EOF")),
    }
}

/// Panics with the first failures of `what`, if any.
fn assert_all_succeeded(what: &str, results: Vec<Result<(), String>>, qemu: &Qemu) {
    let failures: Vec<(usize, String)> = results
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| r.err().map(|e| (i, e)))
        .collect();
    assert!(
        failures.is_empty(),
        "{what}: {} failed, first {:?}\n--- console ---\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        qemu.console()
    );
}

/// `CONCURRENT_CONNECTIONS` host-initiated connections open at the same time, each then
/// used; then `CONNECTION_WAVES` waves of as many pings, more connections in all than the
/// backend's limit, so a connection the device failed to forget would refuse a later one.
fn many_host_connections(uds: &Path, qemu: &Qemu) {
    let accepted = Permits::new(MAX_UNACCEPTED);
    let all_open = std::sync::Barrier::new(CONCURRENT_CONNECTIONS);
    let content = expected_stream()[..MANY_FILE_BYTES].to_vec();
    let script = format!("yes {STREAM_LINE} | head -c {MANY_FILE_BYTES} > {MANY_FILE}");
    let made = exec(uds, &["sh", "-c", &script], None);
    assert_eq!(made.result.exit_code, 0, "{:?}", made.result);
    let results = std::thread::scope(|scope| {
        let gets: Vec<_> = (0..CONCURRENT_CONNECTIONS)
            .map(|_| {
                scope.spawn(|| {
                    get_file_when_all_open(uds, MANY_FILE, &content, &accepted, &all_open)
                })
            })
            .collect();
        gets.into_iter().map(|g| g.join().unwrap()).collect()
    });
    assert_all_succeeded("connections open at once", results, qemu);

    for wave in 0..CONNECTION_WAVES {
        let results = std::thread::scope(|scope| {
            let pings: Vec<_> = (0..CONCURRENT_CONNECTIONS)
                .map(|_| scope.spawn(|| ping(uds, &accepted)))
                .collect();
            pings.into_iter().map(|p| p.join().unwrap()).collect()
        });
        assert_all_succeeded(&format!("ping wave {wave}"), results, qemu);
    }
}

/// Bytes queued on `stream` and not yet read (`FIONREAD`).
fn unread_bytes(stream: &UnixStream) -> usize {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which points at `queued`; the fd is
    // open for the duration of the call (borrowed from `stream`).
    let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::FIONREAD, &mut queued) };
    assert_eq!(rc, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    usize::try_from(queued).unwrap()
}

/// Waits until nothing more arrives on `stream` for [`BLOCKED_FOR`]; returns the unread count.
fn wait_until_sender_blocks(stream: &UnixStream) -> usize {
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut last = unread_bytes(stream);
    let mut still_since = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = unread_bytes(stream);
        if now != last {
            (last, still_since) = (now, Instant::now());
        } else if still_since.elapsed() >= BLOCKED_FOR {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the guest kept sending for {READ_TIMEOUT:?} to a reader that stopped ({now} bytes \
             queued): nothing bounds it"
        );
    }
}

/// A host reader that stops reading a large stdout stream: the guest runs out of credit and
/// its writer blocks (the output stops growing while `head` still runs), other connections
/// keep working meanwhile, and once reading resumes every byte arrives, in order.
fn slow_reader(uds: &Path) {
    let script = format!("yes {STREAM_LINE} | head -c {SLOW_READER_BYTES}");
    let cmd = ["sh", "-c", script.as_str()];
    let mut stream = connect_agent(uds);
    let request = AgentRequest::Exec {
        tail_bytes: None,
        request: ExecRequest::new(cmd.iter().copied()),
        interactive: false,
        user: None,
    };
    wire::write_message(&mut stream, &request).unwrap();
    let socket = stream.try_clone().unwrap();
    let mut reader = FrameReader::new(stream, Direction::GuestToHost);
    let mut stdout = Vec::new();
    let mut next_frame = |stdout: &mut Vec<u8>| -> Option<ExecResult> {
        let frame = reader
            .read_frame()
            .unwrap()
            .expect("the stream ended without an exit frame");
        match frame.frame_type {
            FrameType::Stdout => stdout.extend_from_slice(frame.payload),
            FrameType::Exit => return Some(serde_json::from_slice(frame.payload).unwrap()),
            other => panic!("slow reader: unexpected {other:?} frame"),
        }
        None
    };
    while stdout.len() < SLOW_READER_FIRST_BYTES {
        assert!(next_frame(&mut stdout).is_none(), "ended early");
    }

    let queued = wait_until_sender_blocks(&socket);
    assert!(
        stdout.len() + queued < SLOW_READER_BYTES,
        "the whole stream was buffered ({} read, {queued} queued): nothing blocked",
        stdout.len()
    );
    eprintln!(
        "slow reader: the guest stopped with {} bytes read and {queued} queued on the host \
         socket, of {SLOW_READER_BYTES}",
        stdout.len()
    );
    // The writer is blocked, not done: `head` still runs, and another connection is served.
    let alive = exec(uds, &["pidof", "head"], None);
    assert_eq!(
        alive.result.exit_code, 0,
        "head ended while nobody read its output"
    );
    assert_eq!(
        unread_bytes(&socket),
        queued,
        "the guest sent more while the reader was stopped"
    );

    let result = loop {
        if let Some(result) = next_frame(&mut stdout) {
            break result;
        }
    };
    assert_eq!(result.exit_code, 0, "{result:?}");
    assert_eq!(stdout.len(), SLOW_READER_BYTES);
    assert_eq!(
        first_difference(&stdout, &expected_stream()[..SLOW_READER_BYTES]),
        None,
        "bytes lost, repeated or reordered across the stall"
    );
}

/// How long until the backend closes `stream`, which never completes its `CONNECT` line, and
/// what it said before closing (it must say nothing).
fn time_to_close(mut stream: UnixStream, opened: Instant) -> (Duration, Vec<u8>) {
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let mut said = Vec::new();
    match stream.read_to_end(&mut said) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("waiting for the backend to close a stalled handshake: {e}"),
    }
    (opened.elapsed(), said)
}

/// Host clients that connect and send no `CONNECT` line, or half of one, are closed after the
/// handshake timeout, and an exec meanwhile is served.
fn stalled_handshakes_are_closed(uds: &Path) {
    let opened = Instant::now();
    let silent = UnixStream::connect(uds).unwrap();
    let mut half = UnixStream::connect(uds).unwrap();
    half.write_all(b"CONNECT 10").unwrap();
    let waiters = [silent, half].map(|s| std::thread::spawn(move || time_to_close(s, opened)));
    let echo = exec(uds, &["echo", "still served"], None);
    assert_eq!(echo.stdout, b"still served\n");
    for (what, waiter) in ["no CONNECT line", "half a CONNECT line"]
        .into_iter()
        .zip(waiters)
    {
        let (after, said) = waiter.join().unwrap();
        assert_eq!(said, b"", "{what}: the backend answered");
        // The default timeout is 2 s: closing well before it shows the flag is honoured.
        assert!(
            after >= HANDSHAKE_TIMEOUT && after < Duration::from_millis(1900),
            "{what}: closed after {after:?}, the handshake timeout is {HANDSHAKE_TIMEOUT:?}"
        );
    }
}

/// Guest-initiated connections beyond the boot's hello: more agents started in the guest
/// (`/init --listen vsock:P --ready vsock:5000`, i.e. `connect(2)` to the host's CID and port
/// 5000) send their hellos to `<uds>_5000` at once; each is then reached on its own port and
/// told to shut down. A guest connect to a host port nobody listens on is refused.
fn guest_initiated_connections(uds: &Path) {
    let hellos = UnixListener::bind(host_port_path(uds, GUEST_HELLO_PORT)).unwrap();
    let ports = GUEST_AGENT_PORTS.map(|p| p.to_string()).join(" ");
    let script = format!(
        "pids=; for p in {ports}; do /init --listen vsock:$p --ready vsock:{GUEST_HELLO_PORT} \
         --log quiet & pids=\"$pids $!\"; done; rc=0; \
         for pid in $pids; do wait $pid || rc=1; done; exit $rc"
    );
    let agents = {
        let uds = uds.to_owned();
        std::thread::spawn(move || exec(&uds, &["sh", "-c", &script], None))
    };
    let mut pids = Vec::new();
    for _ in GUEST_AGENT_PORTS {
        let (mut s, _) = hellos.accept().unwrap();
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        let hello: Hello = wire::read_message(&mut s).unwrap();
        pids.push(hello.pid);
    }
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(
        pids.len(),
        GUEST_AGENT_PORTS.len(),
        "one hello per agent: {pids:?}"
    );
    assert!(!pids.contains(&1), "{pids:?}");
    for port in GUEST_AGENT_PORTS {
        let mut stream = connect_port(uds, port);
        wire::write_message(&mut stream, &AgentRequest::Shutdown).unwrap();
        let reply: AgentReply = wire::read_message(&mut stream).unwrap();
        assert_eq!(reply, AgentReply::ShuttingDown, "agent on port {port}");
    }
    let agents = agents.join().unwrap();
    assert_eq!(
        agents.result.exit_code,
        0,
        "an agent failed: {}",
        String::from_utf8_lossy(&agents.stderr)
    );

    let refused = exec(
        uds,
        &[
            "/init",
            "--listen",
            "vsock:2010",
            "--ready",
            &format!("vsock:{UNLISTENED_PORT}"),
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.result.exit_code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!("vsock:2:{UNLISTENED_PORT}")) && stderr.contains("reset by peer"),
        "{stderr}"
    );
}

#[test]
fn vhost_user_vsock_serves_a_real_linux_virtio_vsock_driver_under_qemu() {
    let started = Instant::now();
    let (kernel, initramfs) = image_files();
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vsock.sock");
    // Listening before the guest boots, as the daemon does: the agent sends its hello once.
    let hello_listener = UnixListener::bind(host_port_path(&uds, DEFAULT_READY_PORT)).unwrap();
    let handshake_ms = HANDSHAKE_TIMEOUT.as_millis().to_string();
    let cid = GUEST_CID.to_string();
    let backend = Backend::start(
        "vsock",
        dir.path().join("vhost-user.sock"),
        &[
            "--guest-cid".as_ref(),
            cid.as_ref(),
            "--uds".as_ref(),
            uds.as_os_str(),
            "--vsock-handshake-timeout-ms".as_ref(),
            handshake_ms.as_ref(),
        ],
    );
    let qemu = Qemu::boot(
        &kernel,
        &initramfs,
        backend.socket(),
        dir.path().join("console.log"),
    );

    let hello = accept_hello(hello_listener, &qemu);
    assert_eq!(hello.pid, 1, "{hello:?}");
    let booted = started.elapsed();

    // The driver bound to our device and accepted exactly what we offer: VERSION_1 and no
    // other device bit (sysfs shows the negotiated set).
    let devices = guest_virtio_devices(&uds);
    assert_eq!(devices.len(), 1, "{devices:?}");
    let (device_id, driver, features) = &devices[0];
    assert_eq!(device_id, "0x0013", "virtio-vsock's device id");
    assert_eq!(driver, "vmw_vsock_virtio_transport");
    let negotiated: Vec<usize> = features
        .char_indices()
        .filter(|&(_, bit)| bit == '1')
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        negotiated,
        [VIRTIO_F_VERSION_1],
        "negotiated features {features}"
    );

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

    let waves = Instant::now();
    many_host_connections(&uds, &qemu);
    let waves_in = waves.elapsed();
    slow_reader(&uds);
    stalled_handshakes_are_closed(&uds);
    guest_initiated_connections(&uds);
    // Nothing above left the device unable to serve.
    let after = exec(&uds, &["echo", "after"], None);
    assert_eq!(after.stdout, b"after\n");

    eprintln!(
        "hello after {booted:?}; {STREAM_BYTES} bytes out in {streamed_in:?}, \
         echoed in {echoed_in:?}; {CONCURRENT_CONNECTIONS} connections at once and \
         {CONNECTION_WAVES} x {CONCURRENT_CONNECTIONS} pings in {waves_in:?} (TCG)"
    );

    // Power-off from inside: the agent syncs and resets the machine, QEMU (-no-reboot) exits,
    // and the backend, its frontend gone, exits 0 and removes both its sockets.
    let mut stream = connect_agent(&uds);
    wire::write_message(&mut stream, &AgentRequest::Shutdown).unwrap();
    let reply: AgentReply = wire::read_message(&mut stream).unwrap();
    assert_eq!(reply, AgentReply::ShuttingDown);
    let mut qemu = qemu;
    let qemu_status = qemu.wait_exit(POWEROFF_TIMEOUT);
    assert!(qemu_status.success(), "QEMU: {qemu_status}");
    let socket = backend.expect_clean_exit();
    assert!(
        !socket.exists(),
        "the backend removes its vhost-user socket when it ends"
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
