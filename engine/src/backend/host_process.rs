//! The host-process backend: the agent as a plain process of the daemon's user
//! (`guest-init --listen unix:…`), with **no isolation at all** — commands run on the host, as
//! that user, in the sandbox's runtime directory. It exists so that the daemon's whole HTTP →
//! agent path runs without root (`cargo test -p crucible-api`) and for development; a daemon
//! offers it only when it is configured in (`Backends`), never by default.

use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use api_types::BackendKind;
use tokio::net::{UnixListener, UnixStream};
use tokio::process::Command;
use tokio::sync::watch;
use wire::agent::Hello;

use super::supervised::{spawn_and_await_hello, Diagnostics, SandboxProcess};
use super::{Backend, BackendError, BoxFuture, Capabilities, Instance, InstanceSpec};

/// Runs each sandbox's agent as a host process.
#[derive(Debug)]
pub struct HostProcessBackend {
    agent: PathBuf,
    state_dir: PathBuf,
    ready_timeout: Duration,
}

impl HostProcessBackend {
    /// Sandboxes of the agent binary `agent`, their runtime directories under `state_dir`.
    pub fn new(agent: PathBuf, state_dir: PathBuf, ready_timeout: Duration) -> Self {
        HostProcessBackend {
            agent,
            state_dir,
            ready_timeout,
        }
    }

    async fn create_instance(
        &self,
        spec: InstanceSpec,
    ) -> Result<HostProcessInstance, BackendError> {
        if let Some(reason) = self.unavailable_reason() {
            return Err(BackendError::Unavailable {
                backend: BackendKind::Process,
                reason,
            });
        }
        let dir = self.state_dir.join("sandboxes").join(&spec.id);
        std::fs::create_dir_all(&dir)
            .map_err(|e| BackendError::setup(format!("create {}", dir.display()), e))?;
        let socket = dir.join("agent.sock");
        let ready_path = dir.join("ready.sock");
        let ready = UnixListener::bind(&ready_path)
            .map_err(|e| BackendError::setup(format!("bind {}", ready_path.display()), e))?;
        // The agent says why it failed on stderr: kept, and quoted in the reason.
        let log = dir.join("agent.log");
        let stderr = std::fs::File::create(&log)
            .map_err(|e| BackendError::setup(format!("create {}", log.display()), e))?;
        let mut command = Command::new(&self.agent);
        command
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .arg("--ready")
            .arg(format!("unix:{}", ready_path.display()))
            .current_dir(&dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &dir)
            .env("HOSTNAME", &spec.hostname)
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true);
        let what = self.agent.display().to_string();
        let diagnostics = Diagnostics::new().with("its stderr", log);
        let spawned = spawn_and_await_hello(
            &mut command,
            &ready,
            self.ready_timeout,
            &what,
            &diagnostics,
        )
        .await;
        drop(ready);
        let _ = std::fs::remove_file(&ready_path);
        let (child, hello) = match spawned {
            Ok(spawned) => spawned,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        Ok(HostProcessInstance {
            hello,
            socket,
            dir,
            process: SandboxProcess::watch(child, "the agent".into(), diagnostics),
        })
    }
}

impl Backend for HostProcessBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Process
    }

    fn capabilities(&self) -> Capabilities {
        // A host process: a command, and nothing more.
        Capabilities::NONE
    }

    fn unavailable_reason(&self) -> Option<String> {
        (!self.agent.is_file()).then(|| format!("no agent binary at {}", self.agent.display()))
    }

    fn create(&self, spec: InstanceSpec) -> BoxFuture<'_, Result<Box<dyn Instance>, BackendError>> {
        Box::pin(async move {
            let instance = self.create_instance(spec).await?;
            Ok(Box::new(instance) as Box<dyn Instance>)
        })
    }
}

/// A running host-process sandbox.
#[derive(Debug)]
pub(crate) struct HostProcessInstance {
    hello: Hello,
    socket: PathBuf,
    dir: PathBuf,
    process: SandboxProcess,
}

impl Instance for HostProcessInstance {
    fn hello(&self) -> &Hello {
        &self.hello
    }

    fn connect(&self) -> BoxFuture<'_, io::Result<UnixStream>> {
        Box::pin(super::connect_unix(&self.socket))
    }

    fn exited(&self) -> watch::Receiver<Option<String>> {
        self.process.exited()
    }

    fn destroy(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.process.kill_and_wait().await;
            if let Err(e) = std::fs::remove_dir_all(&self.dir) {
                tracing::warn!("remove {}: {e}", self.dir.display());
            }
        })
    }
}
