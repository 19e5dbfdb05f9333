//! The daemon's shared state (the composition root: configuration, backends, registry,
//! metrics); creating a sandbox is `create`, taking sandboxes back at startup `live_restore`.

mod container_plan;
mod create;
mod lifecycle;
mod live_restore;
pub mod request_bounds;

pub use create::MIN_DISK_MIB;
pub use lifecycle::{Claimed, ShutdownMode, StartError, Stopped};

use std::sync::Arc;
use std::time::Duration;

use api_types::{BackendKind, SandboxInfo};

use crate::backend::microvm::MicrovmBackend;
use crate::backend::namespace::{IdRanges, NamespaceBackend};
use crate::backend::{Backend, BackendError, Backends, ImagePaths};
use crate::egress::{EgressProxy, NoEgress};
use crate::host;
use crate::metrics::Metrics;
use crate::pool::{PoolSpecError, Shape, ShapeBounds, ShapeDefaults, WarmPool};
use crate::sandbox::{ExecAccounts, Registry, SandboxError};
use crate::settings::EngineConfig;
use crate::storage::{Storage, StorageError, DEFAULT_IMAGE};

/// Why a sandbox was not created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The request asks for something invalid; the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// The registry refused (at capacity, shutting down).
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The backend cannot run on this host.
    #[error(transparent)]
    Unavailable(BackendError),
    /// Storage for it could not be had.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Its egress rules are not within the operator's.
    #[error("network.allow: {0}")]
    EgressForbidden(String),
    /// One of its containers could not be started or did not become ready; the sandbox
    /// was deleted again.
    #[error("sandbox {id}: {reason}")]
    ContainerNotReady {
        /// The id it had.
        id: String,
        /// Which container, why, and the end of its log.
        reason: String,
    },
    /// A microVM pod's inbound connections could not be set up in its network namespace;
    /// the sandbox was deleted again.
    #[error("sandbox {id}: the pod's inbound connections")]
    PodNetwork {
        /// The id it had.
        id: String,
        /// What failed.
        #[source]
        source: crate::pod_inbound::InboundError,
    },
    /// The backend failed to make it.
    #[error("creating sandbox {id}")]
    Failed {
        /// The id it would have had.
        id: String,
        /// What failed.
        #[source]
        source: BackendError,
    },
}

/// Everything the handlers share.
pub struct Engine {
    /// The configuration the daemon started with.
    pub config: EngineConfig,
    /// The sandboxes.
    pub registry: Arc<Registry>,
    /// Counters, shared with the exec sessions that record into them.
    pub metrics: Arc<Metrics>,
    /// Ready sandboxes per declared shape (empty unless `--pool` declared some).
    pub pool: Arc<WarmPool>,
    backends: Backends,
    host: host::HostReport,
    storage: Option<Storage>,
    /// The egress proxy a sandbox's network goes through (none: every request for network
    /// is refused).
    egress: Arc<dyn EgressProxy>,
    /// The cgroup parent's lock, from [`Engine::claim`] until [`Engine::shutdown`].
    parent_lock: std::sync::Mutex<Option<crate::backend::cgroup::ParentLock>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("backends", &self.backends)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// State for `config`, with the backends it describes: microVMs where the host can boot
    /// them, else namespaces.
    pub fn new(config: EngineConfig) -> Self {
        let backends = Self::default_backends(&config);
        Self::with_backends(config, backends)
    }

    /// State for `config` with the given backends (tests inject the host-process backend).
    pub fn with_backends(config: EngineConfig, backends: Backends) -> Self {
        Engine {
            registry: Arc::new(Registry::new(
                config.live_restore.then(|| config.state_dir.clone()),
            )),
            metrics: Arc::new(Metrics::default()),
            pool: Arc::new(WarmPool::default()),
            backends,
            host: host::inspect(),
            storage: None,
            egress: Arc::new(NoEgress),
            parent_lock: std::sync::Mutex::new(None),
            config,
        }
    }

    /// With the egress proxy sandboxes' network goes through (the daemon's `egress::Proxy`).
    pub fn with_egress(mut self, egress: Arc<dyn EgressProxy>) -> Self {
        self.egress = egress;
        self
    }

    /// With its storage opened (the daemon does this at startup; without it, requests for
    /// caches, volumes or disk-backed layers are refused).
    pub fn with_storage(mut self, storage: Storage) -> Self {
        self.storage = Some(storage);
        self
    }

    /// With the warm pools `config.pools` declares, checked against the limits, the known
    /// images and the backends (the daemon does this at startup; [`Engine::start_pool`]
    /// then fills them).
    pub fn with_pools(mut self) -> Result<Self, PoolSpecError> {
        let shapes = pool_shapes(&self.config, &self.backends)?;
        self.pool = Arc::new(WarmPool::new(shapes));
        Ok(self)
    }

    /// Starts refilling the warm pools (on the current runtime); a no-op without pools.
    pub fn start_pool(&self) {
        self.pool.start(
            &self.registry,
            &self.backends,
            self.config.limits.max_sandboxes,
        );
    }

    /// Stops under live restore: refuses new sandboxes, waits for creations under way and
    /// destroys the warm pools' sandboxes (nobody's yet, with no record), but leaves every
    /// client's sandbox running for the next daemon to take back.
    pub async fn leave_all(&self) {
        self.registry.leave_all().await;
        self.pool.drain(&self.registry).await;
        if let Ok(storage) = self.storage() {
            storage.leave();
        }
    }

    /// Destroys every sandbox and every pooled one (daemon shutdown), and waits until they are
    /// gone.
    pub async fn remove_all(&self) {
        self.registry.remove_all().await;
        self.pool.drain(&self.registry).await;
        if let Ok(storage) = self.storage() {
            // Their caches' copies are saved before the daemon goes (a copy still unsaved
            // is saved by the next daemon).
            storage.caches.await_all_settled().await;
        }
    }

    /// The daemon's storage.
    pub fn storage(&self) -> Result<&Storage, StorageError> {
        self.storage
            .as_ref()
            .ok_or_else(|| StorageError::Invalid("this daemon was started without storage".into()))
    }

    /// The microVM and namespace backends `config` describes, in that order of preference.
    pub fn default_backends(config: &EngineConfig) -> Backends {
        let ready_timeout = Duration::from_secs(config.limits.ready_timeout_s);
        let namespace = NamespaceBackend::new(
            ImagePaths::in_dir(&config.image_dir),
            config.state_dir.clone(),
            config.cgroup_parent.clone(),
            config.limits.max_pids,
            config.limits.scratch_mib,
            ready_timeout,
            IdRanges::new(config.uid_base, config.limits.max_sandboxes),
        )
        .with_live_restore(config.live_restore);
        let microvm = MicrovmBackend::new(
            config.vmm_binary.clone(),
            &config.image_dir,
            config.state_dir.clone(),
            microvm_ready_timeout(config),
            host::kvm_unavailable_reason(&host::inspect()),
            config.hypervisor,
        )
        .with_live_restore(config.live_restore);
        Backends::new(vec![Arc::new(microvm), Arc::new(namespace)])
    }

    /// The host inspection made at startup.
    pub fn host(&self) -> &host::HostReport {
        &self.host
    }

    /// Why `kind` cannot run here, or `None` when it can.
    pub fn unavailable_reason(&self, kind: BackendKind) -> Option<String> {
        self.backends.unavailable_reason(kind)
    }

    /// The backend used when a request names none: the configured one, else the most
    /// preferred one the host can run.
    pub fn default_backend(&self) -> BackendKind {
        default_backend(&self.config, &self.backends)
    }

    /// What backend `kind` can give a sandbox (nothing, for one this daemon does not offer).
    pub(crate) fn capabilities(&self, kind: BackendKind) -> crate::backend::Capabilities {
        self.backends
            .get(kind)
            .map_or(crate::backend::Capabilities::NONE, |b| b.capabilities())
    }

    fn backend(&self, kind: BackendKind) -> Result<&dyn Backend, CreateError> {
        let unavailable = |reason| {
            CreateError::Unavailable(BackendError::Unavailable {
                backend: kind,
                reason,
            })
        };
        let backend = self
            .backends
            .get(kind)
            .ok_or_else(|| unavailable(format!("this daemon does not offer the {kind} backend")))?;
        match backend.unavailable_reason() {
            Some(reason) => Err(unavailable(reason)),
            None => Ok(backend.as_ref()),
        }
    }

    /// Gives running sandbox `sandbox` the limits `request` asks for (`PATCH
    /// /sandboxes/{id}`), within a create request's bounds. A restarted daemon could not know
    /// them, so the sandbox is not taken back by live restore from then on.
    pub async fn update_sandbox(
        &self,
        sandbox: &Arc<crate::sandbox::Sandbox>,
        request: &api_types::UpdateSandbox,
    ) -> Result<SandboxInfo, crate::sandbox::UpdateError> {
        use crate::sandbox::UpdateError;
        let limits = &self.config.limits;
        if let Some(memory_mib) = request.memory_mib {
            if !(16..=limits.max_memory_mib).contains(&memory_mib) {
                return Err(UpdateError::Invalid(format!(
                    "memory_mib: must be between 16 and {}, got {memory_mib}",
                    limits.max_memory_mib
                )));
            }
        }
        if let Some(vcpus) = request.vcpus {
            if !(1..=limits.max_vcpus).contains(&vcpus) {
                return Err(UpdateError::Invalid(format!(
                    "vcpus: must be between 1 and {}, got {vcpus}",
                    limits.max_vcpus
                )));
            }
        }
        if request.memory_mib.is_none() && request.vcpus.is_none() {
            return Ok(sandbox.info());
        }
        sandbox
            .set_limits(request.memory_mib, request.vcpus)
            .await
            .map_err(|why| UpdateError::Refused {
                id: sandbox.id.clone(),
                why,
            })?;
        self.registry.forget_record(&sandbox.id);
        Ok(sandbox.info())
    }
}

/// The backend for requests that name none: the configured one, else the most preferred one
/// the host can run.
fn default_backend(config: &EngineConfig, backends: &Backends) -> BackendKind {
    config
        .default_backend
        .or_else(|| backends.preferred())
        .unwrap_or(BackendKind::Namespace)
}

/// `config.pools`, resolved against the daemon's defaults (as a request leaving the fields out
/// would be) and checked: against the limits, the known images and the backends this host
/// can run.
pub fn pool_shapes(
    config: &EngineConfig,
    backends: &Backends,
) -> Result<Vec<(Shape, usize)>, PoolSpecError> {
    let limits = &config.limits;
    let defaults = ShapeDefaults {
        backend: default_backend(config, backends),
        memory_mib: limits.default_memory_mib,
        vcpus: limits.default_vcpus,
    };
    let bounds = ShapeBounds {
        max_memory_mib: limits.max_memory_mib,
        max_vcpus: limits.max_vcpus,
        max_sandboxes: limits.max_sandboxes,
    };
    let shapes = crate::pool::resolve_all(&config.pools, &defaults, &bounds, |image| {
        image == DEFAULT_IMAGE
    })?;
    for (shape, _) in &shapes {
        if let Some(reason) = backends.unavailable_reason(shape.backend) {
            return Err(PoolSpecError::Invalid {
                shape: shape.to_string(),
                reason,
            });
        }
    }
    Ok(shapes)
}

/// A cache's or volume's path as a mount target: validated already (absolute, normalised, not
/// `/`), with the trailing slash a user may write (`/cache/`, as `docker run -v` takes it)
/// dropped, since the sandbox's side refuses it.
/// A mount point as the backends take it: without a trailing `/`.
fn mount_target(path: &str) -> String {
    path.trim_end_matches('/').to_string()
}

/// Checks a create request's environment (`field`: where it is in the request).
pub(crate) fn check_env(
    env: &std::collections::BTreeMap<String, String>,
    field: &str,
) -> Result<(), CreateError> {
    for (name, value) in env {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return Err(CreateError::Invalid(format!(
                "{field}.{}: names must be non-empty without '=' or NUL, values without NUL",
                name.escape_debug()
            )));
        }
    }
    Ok(())
}

/// How long a microVM's agent may take to say hello: the configured readiness timeout, but
/// at least a minute under QEMU TCG, whose emulated boot takes seconds on an idle machine and
/// much longer on a loaded one.
fn microvm_ready_timeout(config: &EngineConfig) -> Duration {
    let configured = Duration::from_secs(config.limits.ready_timeout_s);
    match config.hypervisor {
        api_types::Hypervisor::QemuTcg => configured.max(Duration::from_secs(60)),
        api_types::Hypervisor::CrucibleVmm => configured,
    }
}

/// What every command of a new sandbox starts with: its imported image's config, with the
/// request's `user` (resolved against the image's account files) over the image's `User`.
/// `None` for the built-in image run as root.
pub(crate) fn sandbox_defaults(
    record: Option<&oci::ImageRecord>,
    user: Option<&str>,
    accounts: &ExecAccounts,
) -> Result<Option<Arc<oci::defaults::Defaults>>, CreateError> {
    let base = record.map(|r| r.defaults.clone());
    let Some(spec) = user else {
        return Ok(base.map(Arc::new));
    };
    if spec.is_empty() || spec.len() > 256 || spec.contains(['\0', '\n']) {
        return Err(CreateError::Invalid(format!(
            "user: {:?} is not uid, uid:gid, name or name:group",
            spec.escape_debug().to_string()
        )));
    }
    let resolved = accounts
        .resolve(spec)
        .map_err(|e| CreateError::Invalid(format!("user: {e}")))?;
    Ok(Some(Arc::new(
        base.unwrap_or_default()
            .with_user(resolved, accounts.image_sets_home),
    )))
}
