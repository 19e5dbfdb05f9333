//! A test client for the agent: starts the built `guest-init` binary as a host process on a
//! temporary Unix socket (readiness via `--ready`, no polling) and speaks the protocol to it.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use wire::agent::{AgentReply, AgentRequest, Hello};
use wire::{Direction, ExecRequest, ExecResult, FrameReader, FrameType};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A scratch directory removed on drop.
#[derive(Debug)]
pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("gi-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running agent.
#[derive(Debug)]
pub(crate) struct Agent {
    child: Child,
    pub dir: TempDir,
    pub sock: PathBuf,
    pub hello: Hello,
}

/// Everything an exec produced.
#[derive(Debug, Default)]
pub(crate) struct Output {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Frame types in arrival order (consecutive same-type frames kept separate).
    pub frames: Vec<FrameType>,
    pub result: ExecResult,
    pub exit_frames: usize,
}

impl Output {
    pub(crate) fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub(crate) fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

impl Agent {
    pub(crate) fn start() -> Agent {
        Agent::start_with(|_| {})
    }

    /// Starts the agent as user and group 65534, so that the filesystem can refuse it
    /// something. Needs root (as the suite runs in CI): fails, never skips, otherwise.
    pub(crate) fn start_as_nobody() -> Agent {
        require_root("starting the agent as another user");
        Agent::start_with(|c| {
            use std::os::unix::process::CommandExt;
            c.uid(65534).gid(65534);
        })
    }

    /// Starts the agent as PID 1 of a new PID (and mount) namespace, as the namespace backend
    /// will. Needs root and a working `unshare`: fails, never skips, otherwise.
    pub(crate) fn start_in_pid_namespace() -> Agent {
        require_root("a PID namespace");
        let works = Command::new("unshare")
            .args(["-pf", "--mount-proc", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            works,
            "`unshare -pf --mount-proc true` failed: this test needs util-linux's unshare and \
             PID namespaces"
        );
        Agent::launch(&["unshare", "-pf", "--mount-proc", "--kill-child"], |_| {})
    }

    /// Starts the agent, letting `setup` adjust the command (uid, env).
    pub(crate) fn start_with(setup: impl FnOnce(&mut Command)) -> Agent {
        Agent::launch(&[], setup)
    }

    /// Starts the agent with SIGINT, SIGQUIT and SIGTERM ignored, as a shell's background job
    /// (or a careless service manager) would start it: ignored dispositions survive exec.
    pub(crate) fn start_ignoring_signals() -> Agent {
        Agent::launch(
            &["sh", "-c", "trap '' INT QUIT TERM; exec \"$@\"", "sh"],
            |_| {},
        )
    }

    /// Starts the agent behind `wrapper` (a command that runs its arguments).
    fn launch(wrapper: &[&str], setup: impl FnOnce(&mut Command)) -> Agent {
        let dir = TempDir::new("agent");
        let sock = dir.path().join("agent.sock");
        let ready_path = dir.path().join("ready.sock");
        let ready = UnixListener::bind(&ready_path).expect("bind ready socket");
        // Let an agent started as another user (see `start_as_nobody`) use both.
        use std::os::unix::fs::PermissionsExt;
        for p in [dir.path(), ready_path.as_path()] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        }
        let bin = env!("CARGO_BIN_EXE_guest-init");
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--ready")
            .arg(format!("unix:{}", ready_path.display()))
            .arg("--log")
            .arg("error")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        setup(&mut cmd);
        let child = cmd.spawn().expect("spawn guest-init");
        // Readiness: the agent connects to us and sends its hello once it listens.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let hello = ready
                .accept()
                .map_err(|e| e.to_string())
                .and_then(|(mut s, _)| {
                    wire::read_message::<_, Hello>(&mut s).map_err(|e| e.to_string())
                });
            let _ = tx.send(hello);
        });
        let hello = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("agent became ready within 20 s")
            .expect("hello");
        Agent {
            child,
            dir,
            sock,
            hello,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn connect(&self) -> UnixStream {
        UnixStream::connect(&self.sock).expect("connect to agent")
    }

    /// Starts `request` as an interactive session (stdin frames accepted).
    pub(crate) fn interactive(&self, request: ExecRequest) -> UnixStream {
        self.send(&AgentRequest::Exec {
            tail_bytes: None,
            request,
            interactive: true,
            user: None,
        })
    }

    /// Opens a connection and sends `req` as its first message.
    pub(crate) fn send(&self, req: &AgentRequest) -> UnixStream {
        let mut s = self.connect();
        wire::write_message(&mut s, req).expect("send request");
        s
    }

    pub(crate) fn exec(&self, req: ExecRequest) -> Output {
        let s = self.send(&AgentRequest::Exec {
            tail_bytes: None,
            request: req,
            interactive: false,
            user: None,
        });
        read_output(s)
    }

    /// Runs a request that answers with one JSON reply.
    pub(crate) fn reply(&self, req: &AgentRequest) -> AgentReply {
        let mut s = self.send(req);
        wire::read_message(&mut s).expect("reply")
    }

    /// The agent's peak RSS (`VmHWM`) in bytes.
    pub(crate) fn peak_rss(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("status");
        let line = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .expect("VmHWM line");
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .expect("VmHWM value");
        kib * 1024
    }

    /// Waits for the agent to exit (after `shutdown`).
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = std::time::Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads a whole exec response, checking it is a valid frame stream that ends with exactly one
/// exit frame and then EOF.
pub(crate) fn read_output<R: Read>(stream: R) -> Output {
    let mut out = Output::default();
    let mut reader = FrameReader::new(stream, Direction::GuestToHost);
    while let Some(frame) = reader.read_frame().expect("valid frame stream") {
        out.frames.push(frame.frame_type);
        match frame.frame_type {
            FrameType::Stdout => out.stdout.extend_from_slice(frame.payload),
            FrameType::Stderr => out.stderr.extend_from_slice(frame.payload),
            FrameType::Exit => {
                out.exit_frames += 1;
                out.result = serde_json::from_slice(frame.payload).expect("exit payload");
            }
            other => panic!("unexpected {other} frame from the agent"),
        }
    }
    assert_eq!(out.exit_frames, 1, "exactly one exit frame");
    assert_eq!(out.frames.last(), Some(&FrameType::Exit), "exit frame last");
    out
}

/// Writes one frame.
pub(crate) fn write_frame<W: Write>(w: &mut W, t: FrameType, payload: &[u8]) {
    let mut buf = Vec::new();
    wire::encode_frames(t, payload, &mut buf);
    w.write_all(&buf).expect("write frame");
}

pub(crate) fn sh(script: &str) -> ExecRequest {
    ExecRequest::new(["sh", "-c", script])
}

/// Whether `pid` is gone (or a zombie nobody has reaped yet).
pub(crate) fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
    }
}

/// Waits up to `limit` for `pid` to be gone.
pub(crate) fn wait_gone(pid: u32, limit: Duration) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if process_gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Fails the test, saying why, unless it runs as root.
pub(crate) fn require_root(what: &str) {
    assert!(
        is_root(),
        "{what} needs root: run the suite as root (`sudo cargo test`, as CI does)"
    );
}

pub(crate) fn is_root() -> bool {
    // Reading our own uid from /proc avoids a libc dependency in the tests.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}
