//! Where sandboxes run. Everything above this module is shared by every backend: each gives a
//! stream connection to the sandbox's agent, which speaks the same protocol either way. The
//! daemon holds its backends by kind ([`Backends`]), injected at startup, so that tests can
//! run the whole daemon on the host-process backend without root.

mod capabilities;
pub mod cgroup;
mod container_add;
mod cpu_rotation;
pub mod host_process;
pub mod leftovers;
pub(crate) mod microvm;
pub(crate) mod microvm_disks;
mod microvm_slots;
mod mount_table;
pub mod namespace;
mod open_files;
pub mod qemu;
mod supervised;

pub use capabilities::{Capabilities, ContainerSecurity};

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use api_types::BackendKind;
use tokio::net::UnixStream;
use tokio::sync::watch;
use wire::agent::Hello;

/// A boxed future, so backends can sit behind `dyn`.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What to create.
#[derive(Clone)]
pub struct InstanceSpec {
    /// The sandbox id.
    pub id: String,
    /// Its hostname: the request's, else the id.
    pub(crate) hostname: String,
    /// Memory limit.
    pub(crate) memory_mib: u64,
    /// CPUs.
    pub(crate) vcpus: u32,
    /// The sandbox's environment. The daemon applies it to every command itself (merged
    /// under each exec request's own, `Sandbox::merge_env_into`), so the namespace and
    /// microVM backends start their agent without it, and a warm pool's instance, made
    /// before its env is known, is the same as a cold one; the host-process backend (tests)
    /// passes it to its agent's environment.
    pub(crate) env: BTreeMap<String, String>,
    /// An ext4 image to hold the sandbox's writable layer instead of memory.
    pub(crate) disk: Option<PathBuf>,
    /// Caches and volumes to mount inside.
    pub(crate) mounts: Vec<MountSpec>,
    /// Where the sandbox's proxied connections go, when it has egress.
    pub(crate) egress: Option<EgressSink>,
    /// Its imported image's root; `None` runs the backend's built-in image.
    pub root: Option<ImageRoot>,
    /// Its containers besides its own root, each with its image's tree.
    pub(crate) containers: Vec<::namespace::ContainerRoot>,
    /// A microVM's containers' images as read-only ext4 snapshots, in the order of
    /// `containers` (empty on the other backends).
    pub(crate) container_disks: Vec<PathBuf>,
    /// The shared directories its root and its containers mount.
    pub(crate) shared: Vec<::namespace::SharedMount>,
    /// A microVM's empty read-only disks for containers added once it runs (the request's
    /// `container_slots`; 0 on the other backends).
    pub(crate) container_slots: usize,
    /// A host network namespace to join instead of making one (namespace backend).
    pub(crate) network_namespace: Option<PathBuf>,
    /// Namespaced kernel settings (namespace backend).
    pub(crate) sysctls: Vec<::namespace::sysctl::Sysctl>,
}

/// An imported image's root, as the backends take it. The agent stays the daemon's own
/// (`ImagePaths::agent`): it is never taken from an image.
#[derive(Debug, Clone)]
pub struct ImageRoot {
    /// The unpacked tree (a namespace sandbox's read-only lower layer).
    pub(crate) dir: PathBuf,
    /// Its read-only ext4 snapshot, for a microVM's root disk.
    pub(crate) disk: Option<PathBuf>,
}

pub use crate::egress::{EgressSink, EgressStream};

impl std::fmt::Debug for InstanceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceSpec")
            .field("id", &self.id)
            .field("memory_mib", &self.memory_mib)
            .field("vcpus", &self.vcpus)
            .field("disk", &self.disk)
            .field("mounts", &self.mounts)
            .field("egress", &self.egress.is_some())
            .finish_non_exhaustive()
    }
}

/// Something mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountSpec {
    /// What is mounted.
    pub(crate) source: MountSource,
    /// Where inside (absolute, validated).
    pub(crate) target: String,
    /// Whether the sandbox may only read it.
    pub(crate) read_only: bool,
}

/// What a [`MountSpec`] mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MountSource {
    /// An ext4 image file (a cache).
    Ext4Image(PathBuf),
    /// A host directory (a volume).
    Directory(PathBuf),
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
    /// A per-sandbox resource of the backend stayed taken, by sandboxes still being torn
    /// down: the same answer as a full registry, to retry.
    #[error("{0}")]
    Exhausted(String),
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
    /// Which backend this is (its name in the API and in messages).
    fn kind(&self) -> BackendKind;
    /// What it can give a sandbox: the create steps ask this, never [`Backend::kind`].
    fn capabilities(&self) -> Capabilities;
    /// Why this host cannot run it, or `None` when it can.
    fn unavailable_reason(&self) -> Option<String>;
    /// Creates a sandbox and waits for its agent's hello.
    fn create(&self, spec: InstanceSpec) -> BoxFuture<'_, Result<Box<dyn Instance>, BackendError>>;
    /// Takes back sandbox `id`, which an earlier daemon started and `record` describes (live
    /// restore), with what `spec` gives it again. Refused, saying why, unless everything is
    /// exactly as recorded; a refused sandbox's processes are killed if they are still the
    /// recorded ones, and what is left is the stale cleanup's.
    fn adopt<'a>(
        &'a self,
        id: &'a str,
        record: &'a crate::restore::InstanceRecord,
        spec: AdoptSpec,
    ) -> BoxFuture<'a, Result<Box<dyn Instance>, crate::restore::RestoreError>> {
        let kind = self.kind();
        let _ = (id, record, spec);
        Box::pin(async move {
            Err(crate::restore::RestoreError::Unsupported(format!(
                "the {kind} backend does not take sandboxes back yet"
            )))
        })
    }
}

/// What a sandbox taken back gets again from the new daemon (live restore).
#[derive(Default)]
pub struct AdoptSpec {
    /// Where its proxied connections go from now on, when it has egress: the old daemon's
    /// uplink died with it.
    pub(crate) egress: Option<EgressSink>,
    /// Whether it holds disks that outlive it (caches): its guest is then asked to shut down,
    /// which syncs them, before it is killed.
    pub(crate) shut_down_first: bool,
}

impl std::fmt::Debug for AdoptSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdoptSpec")
            .field("egress", &self.egress.is_some())
            .field("shut_down_first", &self.shut_down_first)
            .finish()
    }
}

/// Something a sandbox holds on the host, which live restore checks before taking it back:
/// the kernel's view of it, which root inside the sandbox cannot forge.
#[derive(Debug, Clone, Copy)]
pub enum Held<'a> {
    /// An ext4 image mounted at `target` inside: a cache, or a microVM's volume snapshot.
    Mounted {
        /// The image.
        image: &'a std::path::Path,
        /// Where.
        target: &'a str,
    },
    /// A host directory bound read-only at `target` (a namespace sandbox's volume).
    Bound {
        /// The directory.
        dir: &'a std::path::Path,
        /// Where.
        target: &'a str,
    },
    /// The ext4 image that takes its writes (`disk_mib`).
    WritableLayer {
        /// The image.
        image: &'a std::path::Path,
    },
    /// A microVM's root disk: its imported image's snapshot.
    RootImage {
        /// The image.
        image: &'a std::path::Path,
    },
}

impl Held<'_> {
    /// What it is, for a refusal.
    pub(crate) fn describe(&self) -> String {
        match self {
            Held::Mounted { image, target } => format!("{} at {target}", image.display()),
            Held::Bound { dir, target } => format!("{} at {target}", dir.display()),
            Held::WritableLayer { image } => format!("its writable layer {}", image.display()),
            Held::RootImage { image } => format!("its root image {}", image.display()),
        }
    }
}

/// The backends a daemon offers, in order of preference for requests that name none.
#[derive(Clone, Default)]
pub struct Backends {
    list: Vec<Arc<dyn Backend>>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.list.iter().map(|b| b.kind()))
            .finish()
    }
}

impl Backends {
    /// `list`, most preferred first (one of each kind; a later duplicate is ignored).
    pub fn new(list: Vec<Arc<dyn Backend>>) -> Self {
        let mut unique: Vec<Arc<dyn Backend>> = Vec::new();
        for backend in list {
            if !unique.iter().any(|b| b.kind() == backend.kind()) {
                unique.push(backend);
            }
        }
        Backends { list: unique }
    }

    /// The backend of `kind`, if the daemon offers it.
    pub(crate) fn get(&self, kind: BackendKind) -> Option<&Arc<dyn Backend>> {
        self.list.iter().find(|b| b.kind() == kind)
    }

    /// Why `kind` cannot run, or `None` when it can.
    pub(crate) fn unavailable_reason(&self, kind: BackendKind) -> Option<String> {
        match self.get(kind) {
            Some(backend) => backend.unavailable_reason(),
            None => Some(format!("this daemon does not offer the {kind} backend")),
        }
    }

    /// The most preferred backend that can run here, else the most preferred one (whose
    /// creations then say why they fail).
    pub(crate) fn preferred(&self) -> Option<BackendKind> {
        self.list
            .iter()
            .find(|b| b.unavailable_reason().is_none())
            .or_else(|| self.list.first())
            .map(|b| b.kind())
    }
}

/// One running sandbox: what every backend gives. What only some give is a trait of its own,
/// reached through the accessors below (`None` where the backend does not), so a backend
/// implements only what it does, and nothing defaults to "unsupported".
pub trait Instance: Send + Sync {
    /// The hello its agent sent when it became ready.
    fn hello(&self) -> &Hello;
    /// A new connection to its agent; one per request.
    fn connect(&self) -> BoxFuture<'_, io::Result<UnixStream>>;
    /// `None` while alive; `Some(reason)` once it died or was destroyed.
    fn exited(&self) -> watch::Receiver<Option<String>>;
    /// Kills it and releases everything it held (processes, cgroups, files).
    fn destroy(&self) -> BoxFuture<'_, ()>;
    /// What runs its guest, for a microVM.
    fn hypervisor(&self) -> Option<api_types::Hypervisor> {
        None
    }
    /// What it uses now, where its backend can say (`None`: not measured on this backend).
    fn stats(&self) -> BoxFuture<'_, Option<wire::SandboxStats>> {
        Box::pin(async { None })
    }
    /// Its containers, where its backend runs them.
    fn containers(&self) -> Option<&dyn ContainerHost> {
        None
    }
    /// What live restore needs of it, where its backend takes sandboxes back.
    fn restorable(&self) -> Option<&dyn Restorable> {
        None
    }
    /// New limits while it runs, where its backend can give them.
    fn resizable(&self) -> Option<&dyn Resizable> {
        None
    }
}

/// What the engine asks of any instance, answered by its optional parts where it has them
/// and refused, saying so, where it does not.
impl dyn Instance + '_ {
    /// A new connection to the agent of its container `index`.
    pub(crate) async fn connect_container(&self, index: usize) -> io::Result<UnixStream> {
        match self.containers() {
            Some(host) => host.connect_container(index).await,
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this backend runs no containers",
            )),
        }
    }

    /// [`ContainerHost::add_container`], refused where the backend runs no containers.
    pub(crate) async fn add_container(
        &self,
        index: usize,
        root: &::namespace::ContainerRoot,
        disk: Option<&std::path::Path>,
        shared: &[wire::agent::SharedDir],
        host_paths: &[::namespace::HostPathMount],
    ) -> Result<(), String> {
        match self.containers() {
            Some(host) => {
                host.add_container(index, root, disk, shared, host_paths)
                    .await
            }
            None => Err("this backend cannot add containers to a running sandbox".into()),
        }
    }

    /// [`ContainerHost::container_room`]; `None` without containers.
    pub(crate) fn container_room(&self) -> Option<(usize, usize)> {
        self.containers()?.container_room()
    }

    /// [`ContainerHost::container_removed`]; nothing without containers.
    pub(crate) async fn container_removed(&self, index: usize) {
        if let Some(host) = self.containers() {
            host.container_removed(index).await;
        }
    }

    /// [`Restorable::record`]; `None` where its backend cannot take it back.
    pub(crate) fn record(&self) -> Option<crate::restore::InstanceRecord> {
        self.restorable()?.record()
    }

    /// [`Restorable::check_holds`]; refused where its backend cannot tell.
    pub(crate) fn check_holds(&self, what: Held<'_>) -> Result<(), String> {
        match self.restorable() {
            Some(restorable) => restorable.check_holds(what),
            None => Err("its backend cannot tell what it holds".into()),
        }
    }

    /// [`Resizable::set_limits`]; refused where its limits are fixed when it starts.
    pub(crate) async fn set_limits(
        &self,
        memory_mib: Option<u64>,
        vcpus: Option<u32>,
    ) -> Result<(), String> {
        match self.resizable() {
            Some(resizable) => resizable.set_limits(memory_mib, vcpus).await,
            None => Err(
                "its memory and CPUs are fixed when it starts on this backend (a microVM's \
                 guest has them from boot)"
                    .into(),
            ),
        }
    }
}

/// A sandbox that runs containers beside its own root.
pub trait ContainerHost: Send + Sync {
    /// A new connection to the agent of its container `index` (in the order of
    /// [`InstanceSpec::containers`], then of [`ContainerHost::add_container`]).
    fn connect_container(&self, index: usize) -> BoxFuture<'_, io::Result<UnixStream>>;
    /// Makes container `root.name` in it, running: its image tree `root.rootfs` (a microVM
    /// takes its read-only ext4 snapshot, `disk`), in the root's PID namespace if it says so,
    /// with its security settings, `shared` mounted and `host_paths` (namespace sandboxes)
    /// attached, its agent reached afterwards by [`ContainerHost::connect_container`]`(index)`.
    /// `index` is new on every call (a failed one included).
    fn add_container<'a>(
        &'a self,
        index: usize,
        root: &'a ::namespace::ContainerRoot,
        disk: Option<&'a std::path::Path>,
        shared: &'a [wire::agent::SharedDir],
        host_paths: &'a [::namespace::HostPathMount],
    ) -> BoxFuture<'a, Result<(), String>>;
    /// How many more containers [`ContainerHost::add_container`] can take, and how many it
    /// could take at most, when the backend has a fixed number (a microVM's empty disks);
    /// `None`: no such limit.
    fn container_room(&self) -> Option<(usize, usize)> {
        None
    }
    /// Its container `index` was removed (its agent ended): what it held can serve another.
    fn container_removed(&self, index: usize) -> BoxFuture<'_, ()> {
        let _ = index;
        Box::pin(async {})
    }
}

/// A sandbox a restarted daemon can take back (live restore).
pub trait Restorable: Send + Sync {
    /// What a restarted daemon must find to take it back.
    fn record(&self) -> Option<crate::restore::InstanceRecord>;
    /// Whether it holds `what`, as the host's kernel sees it (live restore checks an adopted
    /// sandbox's storage this way); `Err` says why not.
    fn check_holds(&self, what: Held<'_>) -> Result<(), String>;
}

/// A sandbox whose limits can change while it runs.
pub trait Resizable: Send + Sync {
    /// Gives it new limits (either may stay).
    fn set_limits(
        &self,
        memory_mib: Option<u64>,
        vcpus: Option<u32>,
    ) -> BoxFuture<'_, Result<(), String>>;
}

/// Connects to a Unix socket (an agent's) without a trip through the event loop when, as
/// almost always, the connection completes at once; tokio's connect, which waits for
/// writability first, takes over only when the listener's backlog is full.
pub(crate) async fn connect_unix(path: &std::path::Path) -> io::Result<UnixStream> {
    use socket2::{Domain, SockAddr, Socket, Type};
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    socket.set_nonblocking(true)?;
    match socket.connect(&SockAddr::unix(path)?) {
        Ok(()) => UnixStream::from_std(std::os::unix::net::UnixStream::from(socket)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => UnixStream::connect(path).await,
        Err(e) => Err(e),
    }
}

/// The hello of the agent `connect` reaches, asked within 5 s (live restore checks that an
/// adopted sandbox's agent is the recorded one).
pub(crate) async fn ping_agent(
    connect: impl Future<Output = io::Result<UnixStream>>,
) -> io::Result<Hello> {
    let ask = async {
        let mut agent = connect.await?;
        wire::write_message_async(&mut agent, &wire::agent::AgentRequest::Ping)
            .await
            .map_err(|e| io::Error::other(e.to_string()))?;
        match wire::read_message_async(&mut agent).await {
            Ok(wire::agent::AgentReply::Pong(hello)) => Ok(hello),
            Ok(other) => Err(io::Error::other(format!("it answered {other:?}"))),
            Err(e) => Err(io::Error::other(e.to_string())),
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), ask)
        .await
        .map_err(|_| io::Error::other("no answer to a ping within 5 s"))?
}

/// Where a backend finds the image.
#[derive(Debug, Clone)]
pub(crate) struct ImagePaths {
    /// The unpacked root tree: busybox userland and the agent at `/init`.
    pub(crate) rootfs: PathBuf,
}

impl ImagePaths {
    /// The standard layout under an image directory.
    pub(crate) fn in_dir(dir: &std::path::Path) -> Self {
        ImagePaths {
            rootfs: dir.join("rootfs"),
        }
    }

    /// The agent binary (static; the same one the image boots as `/init`).
    pub(crate) fn agent(&self) -> PathBuf {
        self.rootfs.join("init")
    }
}
