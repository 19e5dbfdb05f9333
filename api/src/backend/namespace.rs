//! The namespace backend: the agent as PID 1 of new PID/mount/UTS/IPC/net/cgroup namespaces,
//! rooted in the image under a tmpfs overlay, limited by cgroups, with no capabilities. The
//! agent does the entering itself (`guest-init sandbox …`, see the `namespace` crate); this side
//! prepares the directories and cgroups, starts it, and waits for its hello on a Unix socket.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::process::Command;
use tokio::sync::watch;
use wire::agent::Hello;
use wire::BackendKind;

use super::cgroup::{CgroupLimits, SandboxCgroups};
use super::process::SandboxProcess;
use super::{Backend, BackendError, BoxFuture, ImagePaths, Instance, InstanceSpec};

/// Where the agent's sockets appear inside the sandbox (`namespace::SANDBOX_RUNTIME_DIR`).
const INSIDE_RUNTIME_DIR: &str = "/run/crucible";

/// The PATH commands see unless the sandbox's env overrides it.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Creates namespace sandboxes.
#[derive(Debug)]
pub struct NamespaceBackend {
    image: ImagePaths,
    state_dir: PathBuf,
    cgroup_root: PathBuf,
    cgroup_parent: String,
    max_pids: u64,
    scratch_mib: u64,
    ready_timeout: Duration,
}

impl NamespaceBackend {
    /// A backend using the image's root tree, keeping per-sandbox state under `state_dir`.
    pub fn new(
        image: ImagePaths,
        state_dir: PathBuf,
        cgroup_parent: String,
        max_pids: u64,
        scratch_mib: u64,
        ready_timeout: Duration,
    ) -> Self {
        NamespaceBackend {
            image,
            state_dir,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            cgroup_parent,
            max_pids,
            scratch_mib,
            ready_timeout,
        }
    }

    /// Why this host cannot run namespace sandboxes, if it cannot.
    pub fn unavailable_reason(&self) -> Option<String> {
        if !self.image.agent().is_file() {
            return Some(format!(
                "no agent at {} (build the image: cargo xtask build-image)",
                self.image.agent().display()
            ));
        }
        let is_root = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
            .unwrap_or(false);
        if !is_root {
            return Some("creating namespaces, mounts and cgroups needs root".into());
        }
        None
    }

    fn runtime_dir(&self, id: &str) -> PathBuf {
        self.state_dir.join("sandboxes").join(id)
    }

    fn log_path(&self, id: &str) -> PathBuf {
        self.state_dir.join("logs").join(format!("{id}.log"))
    }

    async fn create_instance(&self, spec: InstanceSpec) -> Result<NamespaceInstance, BackendError> {
        if let Some(reason) = self.unavailable_reason() {
            return Err(BackendError::Unavailable {
                backend: BackendKind::Namespace,
                reason,
            });
        }
        let runtime_dir = self.runtime_dir(&spec.id);
        create_private_dir(&runtime_dir)?;
        let log_path = self.log_path(&spec.id);
        if let Some(dir) = log_path.parent() {
            create_private_dir(dir)?;
        }
        let cgroups = SandboxCgroups::create(
            &self.cgroup_root,
            &self.cgroup_parent,
            &spec.id,
            CgroupLimits {
                memory_bytes: spec.memory_mib * 1024 * 1024,
                pids: self.max_pids,
                cpus: spec.vcpus,
            },
        )
        .map_err(|e| BackendError::setup("creating the sandbox's cgroups", e))?;
        let mut cleanup = Cleanup {
            runtime_dir: Some(runtime_dir.clone()),
            cgroups: Some(cgroups),
        };

        let ready_path = runtime_dir.join("ready.sock");
        let ready = UnixListener::bind(&ready_path)
            .map_err(|e| BackendError::setup(format!("bind {}", ready_path.display()), e))?;
        let log = std::fs::File::create(&log_path)
            .map_err(|e| BackendError::setup(format!("create {}", log_path.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| BackendError::setup("duplicate the log file", e))?;

        let mut command = Command::new(self.image.agent());
        command
            .arg("sandbox")
            .arg("--rootfs")
            .arg(&self.image.rootfs)
            .arg("--runtime-dir")
            .arg(&runtime_dir)
            .arg("--hostname")
            .arg(&spec.id)
            .arg("--scratch-mib")
            .arg(disk_mib(self.scratch_mib, spec.memory_mib).to_string())
            .arg("--memory-bytes")
            .arg((spec.memory_mib * 1024 * 1024).to_string());
        for procs in cleanup.cgroups.iter().flat_map(|c| c.procs_files()) {
            command.arg("--cgroup").arg(procs);
        }
        command
            .arg("--listen")
            .arg(format!("unix:{INSIDE_RUNTIME_DIR}/agent.sock"))
            .arg("--ready")
            .arg(format!("unix:{INSIDE_RUNTIME_DIR}/ready.sock"))
            // The daemon's environment (API keys among it) must not reach the sandbox.
            .env_clear()
            .env("PATH", DEFAULT_PATH)
            .env("HOME", "/root")
            .env("HOSTNAME", &spec.id)
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|e| {
            BackendError::setup(format!("start {}", self.image.agent().display()), e)
        })?;

        let hello = tokio::select! {
            hello = accept_hello(&ready) => hello,
            status = child.wait() => Err(format!(
                "the sandbox exited during setup ({}); see {}",
                status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()),
                log_path.display()
            )),
            () = tokio::time::sleep(self.ready_timeout) => Err(format!(
                "no hello within {:?}; see {}", self.ready_timeout, log_path.display()
            )),
        };
        let hello = match hello {
            Ok(hello) => hello,
            Err(reason) => {
                let _ = child.kill().await;
                cleanup.run().await;
                return Err(BackendError::NotReady(reason));
            }
        };
        drop(ready);
        let _ = std::fs::remove_file(&ready_path);

        let what = format!("the sandbox's init (log: {})", log_path.display());
        Ok(NamespaceInstance {
            hello,
            socket: runtime_dir.join("agent.sock"),
            process: SandboxProcess::watch(child, what),
            cleanup: tokio::sync::Mutex::new(Some(cleanup)),
            log_path,
        })
    }
}

/// The size of a sandbox's writable layer: the configured size, but at most three quarters of
/// its memory limit. The layer is a tmpfs, whose pages are charged to the sandbox's memory
/// cgroup and cannot be swapped out; were it as large as the limit, filling it would end in an
/// OOM kill (of whichever command is largest, possibly one that never wrote) instead of
/// `ENOSPC` for the writer, with memory to spare for the commands.
pub fn disk_mib(configured_mib: u64, memory_mib: u64) -> u64 {
    configured_mib.min(memory_mib.saturating_mul(3) / 4).max(1)
}

fn create_private_dir(path: &Path) -> Result<(), BackendError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| BackendError::setup(format!("create {}", path.display()), e))
}

/// Accepts the agent's connection on `listener` and reads its hello.
pub(crate) async fn accept_hello(listener: &UnixListener) -> Result<Hello, String> {
    let (mut stream, _) = listener
        .accept()
        .await
        .map_err(|e| format!("accepting the agent's hello: {e}"))?;
    wire::read_message_async(&mut stream)
        .await
        .map_err(|e| format!("reading the agent's hello: {e}"))
}

/// What to release when a sandbox goes away.
#[derive(Debug)]
struct Cleanup {
    runtime_dir: Option<PathBuf>,
    cgroups: Option<SandboxCgroups>,
}

impl Cleanup {
    async fn run(&mut self) {
        if let Some(cgroups) = self.cgroups.take() {
            if let Err(e) = cgroups.remove().await {
                tracing::warn!("{e}");
            }
        }
        if let Some(dir) = self.runtime_dir.take() {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!("remove {}: {e}", dir.display());
            }
        }
    }
}

/// A running namespace sandbox.
#[derive(Debug)]
pub struct NamespaceInstance {
    hello: Hello,
    socket: PathBuf,
    process: SandboxProcess,
    cleanup: tokio::sync::Mutex<Option<Cleanup>>,
    log_path: PathBuf,
}

impl Instance for NamespaceInstance {
    fn hello(&self) -> &Hello {
        &self.hello
    }

    fn connect(&self) -> BoxFuture<'_, io::Result<UnixStream>> {
        Box::pin(UnixStream::connect(&self.socket))
    }

    fn exited(&self) -> watch::Receiver<Option<String>> {
        self.process.exited()
    }

    fn destroy(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.process.kill_and_wait().await;
            if let Some(mut cleanup) = self.cleanup.lock().await.take() {
                cleanup.run().await;
            }
            let _ = std::fs::remove_file(&self.log_path);
        })
    }
}

impl Backend for NamespaceBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Namespace
    }

    fn create(&self, spec: InstanceSpec) -> BoxFuture<'_, Result<Box<dyn Instance>, BackendError>> {
        Box::pin(async move {
            let instance = self.create_instance(spec).await?;
            Ok(Box::new(instance) as Box<dyn Instance>)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::disk_mib;

    #[test]
    fn the_writable_layer_leaves_a_quarter_of_memory_to_the_commands() {
        assert_eq!(disk_mib(1024, 512), 384);
        assert_eq!(disk_mib(100, 512), 100);
        assert_eq!(disk_mib(1024, 16), 12);
        assert_eq!(disk_mib(1024, 1), 1, "never a zero-sized (unlimited) tmpfs");
    }
}
