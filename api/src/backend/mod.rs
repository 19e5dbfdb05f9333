//! Where sandboxes run. Everything above this module is shared by both backends: each gives a
//! stream connection to the sandbox's agent, which speaks the same protocol either way.

pub mod cgroup;
pub mod microvm;
pub mod namespace;
pub mod process;

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;

use tokio::net::UnixStream;
use tokio::sync::watch;
use wire::agent::Hello;
use wire::BackendKind;

/// A boxed future, so backends can sit behind `dyn`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What to create.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    /// The sandbox id (also its hostname).
    pub id: String,
    /// Memory limit.
    pub memory_mib: u64,
    /// CPUs.
    pub vcpus: u32,
    /// Environment for the agent, and so for every command.
    pub env: BTreeMap<String, String>,
}

/// Why a sandbox could not be created.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// This host cannot run the backend.
    #[error("the {backend} backend is not available on this host: {reason}")]
    Unavailable {
        /// The backend asked for.
        backend: BackendKind,
        /// Why not.
        reason: String,
    },
    /// Preparing the sandbox failed.
    #[error("{step}")]
    Setup {
        /// What was being done, with its input.
        step: String,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },
    /// The agent never became ready.
    #[error("the sandbox's agent did not become ready: {0}")]
    NotReady(String),
}

impl BackendError {
    pub(crate) fn setup(step: impl Into<String>, source: io::Error) -> Self {
        BackendError::Setup {
            step: step.into(),
            source,
        }
    }
}

/// A kind of sandbox.
pub trait Backend: Send + Sync + 'static {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// Creates a sandbox and waits for its agent's hello.
    fn create(&self, spec: InstanceSpec) -> BoxFuture<'_, Result<Box<dyn Instance>, BackendError>>;
}

/// One running sandbox.
pub trait Instance: Send + Sync {
    /// The hello its agent sent when it became ready.
    fn hello(&self) -> &Hello;
    /// A new connection to its agent; one per request.
    fn connect(&self) -> BoxFuture<'_, io::Result<UnixStream>>;
    /// `None` while alive; `Some(reason)` once it died or was destroyed.
    fn exited(&self) -> watch::Receiver<Option<String>>;
    /// Kills it and releases everything it held (processes, cgroups, files).
    fn destroy(&self) -> BoxFuture<'_, ()>;
}

/// Where a backend finds the image.
#[derive(Debug, Clone)]
pub struct ImagePaths {
    /// The unpacked root tree: busybox userland and the agent at `/init`.
    pub rootfs: PathBuf,
}

impl ImagePaths {
    /// The standard layout under an image directory.
    pub fn in_dir(dir: &std::path::Path) -> Self {
        ImagePaths {
            rootfs: dir.join("rootfs"),
        }
    }

    /// The agent binary (static; the same one the image boots as `/init`).
    pub fn agent(&self) -> PathBuf {
        self.rootfs.join("init")
    }
}
