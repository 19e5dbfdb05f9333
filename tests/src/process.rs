//! The daemon in a process of its own (the `crucible-test-daemon` binary), so that its fds and
//! memory are measured alone, and so that it can be killed and restarted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Where a daemon process keeps its socket and state; outlives any one daemon, so that a
/// restarted daemon finds what the previous one left.
#[derive(Debug)]
pub struct DaemonHome {
    dir: tempfile::TempDir,
    /// The cgroup parent every daemon of this home uses.
    pub cgroup_parent: String,
}

impl DaemonHome {
    /// A fresh home with a cgroup parent of its own.
    pub fn new() -> Self {
        crate::require_root();
        let dir = tempfile::Builder::new()
            .prefix("crucible-proc-")
            .tempdir()
            .expect("temp dir");
        DaemonHome {
            dir,
            cgroup_parent: format!(
                "crucible-test-proc-{}-{}",
                std::process::id(),
                crate::NEXT.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }

    /// The daemon's Unix socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("d.sock")
    }

    /// The daemon's state directory.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
}

impl Default for DaemonHome {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for DaemonHome {
    /// Kills whatever still runs from this home: under `--live-restore` a sandbox's processes
    /// (a namespace supervisor, a VM and its devices, each started with a path under the
    /// home) outlive their daemon, and a test that fails half-way would leave them running —
    /// emulated VMs, each a CPU's worth, for the rest of the run.
    fn drop(&mut self) {
        for pid in crate::leaks::processes_mentioning(self.dir.path()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// A running `crucible-test-daemon`; SIGTERMed (then SIGKILLed if it hangs) when dropped.
#[derive(Debug)]
pub struct DaemonProcess {
    child: Child,
    socket: PathBuf,
    home: Option<DaemonHome>,
}

fn daemon_binary() -> PathBuf {
    // Integration tests run from target/<profile>/deps; cargo builds the package's binaries
    // into target/<profile> for them.
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps");
    profile_dir.join("crucible-test-daemon")
}

impl DaemonProcess {
    /// A daemon with a home of its own (removed with it).
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// A daemon with a home of its own and extra options (`--disk-mib N`).
    pub async fn start_with(options: &[&str]) -> Self {
        let home = DaemonHome::new();
        let mut daemon = Self::start_in(&home, options).await;
        daemon.home = Some(home);
        daemon
    }

    /// A daemon in `home`, which may hold what an earlier daemon left.
    pub async fn start_in(home: &DaemonHome, options: &[&str]) -> Self {
        Self::start_logging(home, options, None).await
    }

    /// [`DaemonProcess::start_in`], its log (stderr, `info` and up) appended to `log` when given.
    pub async fn start_logging(home: &DaemonHome, options: &[&str], log: Option<&Path>) -> Self {
        let socket = home.socket();
        let mut command = Command::new(daemon_binary());
        command
            .arg(&socket)
            .arg(home.state_dir())
            .arg(&home.cgroup_parent)
            .args(options)
            .env("CRUCIBLE_LOG", "warn");
        if let Some(log) = log {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .expect("the daemon's log");
            command.stderr(file).env("CRUCIBLE_LOG", "info");
        }
        let child = command.spawn().expect("start crucible-test-daemon");
        let daemon = DaemonProcess {
            child,
            socket: socket.clone(),
            home: None,
        };
        // The socket file may be a dead daemon's: wait until it answers.
        let c = daemon.client();
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.health().await.is_err() {
            assert!(Instant::now() < deadline, "the daemon never answered");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        daemon
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A client on its socket.
    pub fn client(&self) -> client::Client {
        client::Client::new(client::Endpoint::Unix(self.socket.clone()))
    }

    /// Its state directory and cgroup parent, when it owns its home.
    pub fn home(&self) -> &DaemonHome {
        self.home
            .as_ref()
            .expect("a daemon started with a home of its own")
    }

    /// Sends `signal` and waits (bounded) for the daemon to exit.
    pub fn stop_with(&mut self, signal: Signal) -> ExitStatus {
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the daemon did not exit within 60 s of {signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(60);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
