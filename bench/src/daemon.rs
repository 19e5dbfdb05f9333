//! The daemon under test: in this process on its own runtime thread (as `tests/src/lib.rs`
//! runs it), or, for footprint, as a child process (this binary's hidden `bench-daemon`
//! command) so its RSS is the daemon's alone.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use api::server::BackgroundDaemon;
use api::ServeConfig;

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A fresh configuration: private socket and state directory, a cgroup parent of its own.
pub(crate) fn config(image: &Path, dir: &Path) -> ServeConfig {
    let mut config = ServeConfig::new(image.to_path_buf());
    config.unix_socket = Some(dir.join("crucible.sock"));
    config.engine.state_dir = dir.join("state");
    config.engine.storage.data_dir = dir.join("data");
    config.engine.cgroup_parent = format!(
        "crucible-bench-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    config.engine.limits.max_sandboxes = 512;
    config.engine.limits.max_memory_mib = 4096;
    config
}

/// A daemon on its own runtime thread in this process (`api::server::BackgroundDaemon`, the
/// starter the end-to-end tests use too).
#[derive(Debug)]
pub(crate) struct InProcess {
    /// Its socket.
    pub socket: PathBuf,
    /// Its state directory (sandboxes' agent sockets live under it).
    pub state_dir: PathBuf,
    /// Its cgroup parent.
    pub cgroup_parent: String,
    daemon: BackgroundDaemon,
    _dir: tempfile::TempDir,
}

impl InProcess {
    /// Starts a daemon serving `image`.
    pub(crate) fn start(image: &Path) -> Result<Self> {
        Self::start_with(image, |_| {})
    }

    /// Starts a daemon serving `image`, its configuration adjusted by `configure`.
    pub(crate) fn start_with(
        image: &Path,
        configure: impl FnOnce(&mut ServeConfig),
    ) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("crucible-bench-")
            .tempdir()
            .context("creating the daemon's temporary directory")?;
        let mut config = config(image, dir.path());
        configure(&mut config);
        let socket = config.unix_socket.clone().context("no socket configured")?;
        let state_dir = config.engine.state_dir.clone();
        let cgroup_parent = config.engine.cgroup_parent.clone();
        let daemon = BackgroundDaemon::start(config, None).context("the daemon did not start")?;
        Ok(InProcess {
            socket,
            state_dir,
            cgroup_parent,
            daemon,
            _dir: dir,
        })
    }

    /// A client on its socket.
    pub(crate) fn client(&self) -> client::Client {
        client::Client::new(client::Endpoint::Unix(self.socket.clone()))
    }

    /// The agent socket of a namespace sandbox (the backend's runtime directory).
    pub(crate) fn agent_socket(&self, id: &str) -> PathBuf {
        self.state_dir.join("sandboxes").join(id).join("agent.sock")
    }

    /// Stops the daemon, deleting every sandbox.
    pub(crate) fn stop(self) {
        self.daemon.stop();
    }

    /// Waits (polling, bounded) until its warm pools hold `n` ready sandboxes.
    pub(crate) async fn wait_pool_ready(&self, n: usize) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.daemon.state.pool.ready_ids().len() < n {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the warm pool did not refill to {n} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }
}

/// A daemon in a child process (this binary, `bench-daemon`), for measuring its memory alone.
#[derive(Debug)]
pub(crate) struct ChildDaemon {
    /// Its socket.
    pub socket: PathBuf,
    /// Its cgroup parent.
    pub cgroup_parent: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl ChildDaemon {
    /// Starts `bench-daemon` and waits for its socket to answer.
    pub(crate) async fn start(image: &Path) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("crucible-bench-child-")
            .tempdir()
            .context("creating the daemon's temporary directory")?;
        let config = config(image, dir.path());
        let socket = config.unix_socket.clone().context("no socket configured")?;
        let exe = std::env::current_exe().context("locating this executable")?;
        let child = Command::new(exe)
            .arg("daemon")
            .arg("--image")
            .arg(image)
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(&config.engine.state_dir)
            .arg("--cgroup-parent")
            .arg(&config.engine.cgroup_parent)
            .stdin(Stdio::null())
            .spawn()
            .context("starting the child daemon")?;
        let daemon = ChildDaemon {
            socket,
            cgroup_parent: config.engine.cgroup_parent,
            child,
            _dir: dir,
        };
        let client = daemon.client();
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.health().await.is_err() {
            if Instant::now() > deadline {
                bail!(
                    "the child daemon did not answer on {} within 10 s",
                    daemon.socket.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(daemon)
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A client on its socket.
    pub(crate) fn client(&self) -> client::Client {
        client::Client::new(client::Endpoint::Unix(self.socket.clone()))
    }

    /// SIGTERM (it deletes every sandbox), then waits.
    pub(crate) fn stop(mut self) -> Result<()> {
        let pid = i32::try_from(self.child.id()).context("pid out of range")?;
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        self.child.wait().context("waiting for the child daemon")?;
        Ok(())
    }
}

impl Drop for ChildDaemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `bench-daemon`: serves until SIGTERM.
#[derive(clap::Args, Debug)]
pub(crate) struct ChildArgs {
    #[arg(long)]
    image: PathBuf,
    #[arg(long)]
    socket: PathBuf,
    #[arg(long)]
    state_dir: PathBuf,
    #[arg(long)]
    cgroup_parent: String,
}

/// Runs the child daemon.
pub(crate) fn run_child(args: ChildArgs) -> Result<()> {
    let mut config = config(&args.image, Path::new("/nonexistent"));
    config.unix_socket = Some(args.socket);
    config.engine.state_dir = args.state_dir;
    config.engine.cgroup_parent = args.cgroup_parent;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the runtime")?;
    runtime
        .block_on(api::serve(config))
        .context("the daemon failed")
}

/// Resident memory of a process, from `/proc/PID/status` (`VmRSS`, or `VmHWM` for the peak), in
/// MiB.
pub(crate) fn rss_mib(pid: u32, field: &str) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    kib_field(&status, field)
        .map(|kib| kib / 1024.0)
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// A `Name:  123 kB` field of a `/proc` file, in KiB.
pub(crate) fn kib_field(text: &str, field: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
}

/// The processes of a namespace sandbox (its cgroup's `cgroup.procs`, memory controller).
pub(crate) fn sandbox_pids(cgroup_parent: &str, id: &str) -> Result<Vec<u32>> {
    let path = Path::new("/sys/fs/cgroup/memory")
        .join(cgroup_parent)
        .join(id)
        .join("cgroup.procs");
    let path = if path.exists() {
        path
    } else {
        Path::new("/sys/fs/cgroup")
            .join(cgroup_parent)
            .join(id)
            .join("cgroup.procs")
    };
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// The sandbox's agent as seen from the host: the process in its cgroup that runs as
/// `sandbox-pid1` and whose innermost PID (the last `NSpid` entry) is 1 (PID 1 of `main`'s
/// PID namespace; the pod init above it is PID 1 of the sandbox's first one).
pub(crate) fn sandbox_init_pid(cgroup_parent: &str, id: &str) -> Result<u32> {
    for pid in sandbox_pids(cgroup_parent, id)? {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let inner = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|v| v.split_whitespace().last());
        let is_agent = std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|line| line.split(|b| *b == 0).any(|arg| arg == b"sandbox-pid1"));
        if inner == Some("1") && is_agent {
            return Ok(pid);
        }
    }
    bail!("sandbox {id} has no agent in its cgroup under {cgroup_parent}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_fields_parse_in_kib() {
        let status = "Name:\tx\nVmHWM:\t   2048 kB\nVmRSS:\t    1024 kB\n";
        assert_eq!(kib_field(status, "VmRSS"), Some(1024.0));
        assert_eq!(kib_field(status, "VmHWM"), Some(2048.0));
        assert_eq!(kib_field(status, "Pss"), None);
    }
}
