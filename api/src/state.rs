//! The daemon's shared state (the composition root: configuration, backends, registry,
//! metrics) and the sandbox creation path.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wire::{BackendKind, CreateSandbox, SandboxInfo};

use crate::auth::Owner;
use crate::backend::microvm::MicrovmBackend;
use crate::backend::namespace::{IdRanges, NamespaceBackend};
use crate::backend::{Backend, BackendError, Backends, ImagePaths, InstanceSpec};
use crate::config::ServeConfig;
use crate::host;
use crate::metrics::Metrics;
use crate::sandbox::{new_id, Registry, Sandbox, SandboxError, SandboxSettings};

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
    /// The backend failed to make it.
    #[error("creating sandbox {id}: {source}")]
    Failed {
        /// The id it would have had.
        id: String,
        /// What failed.
        #[source]
        source: BackendError,
    },
}

/// Everything the handlers share.
pub struct AppState {
    /// The configuration the daemon started with.
    pub config: ServeConfig,
    /// The sandboxes.
    pub registry: Arc<Registry>,
    /// Counters.
    pub metrics: Metrics,
    backends: Backends,
    host: host::HostReport,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("backends", &self.backends)
            .finish_non_exhaustive()
    }
}

/// The only image name there is today.
pub const DEFAULT_IMAGE: &str = "default";

impl AppState {
    /// State for `config`, with the backends it describes: microVMs where the host can boot
    /// them, else namespaces.
    pub fn new(config: ServeConfig) -> Self {
        let backends = Self::default_backends(&config);
        Self::with_backends(config, backends)
    }

    /// State for `config` with the given backends (tests inject the host-process backend).
    pub fn with_backends(config: ServeConfig, backends: Backends) -> Self {
        AppState {
            config,
            registry: Arc::new(Registry::default()),
            metrics: Metrics::default(),
            backends,
            host: host::inspect(),
        }
    }

    /// The microVM and namespace backends `config` describes, in that order of preference.
    pub fn default_backends(config: &ServeConfig) -> Backends {
        let ready_timeout = Duration::from_secs(config.limits.ready_timeout_s);
        let namespace = NamespaceBackend::new(
            ImagePaths::in_dir(&config.image_dir),
            config.state_dir.clone(),
            config.cgroup_parent.clone(),
            config.limits.max_pids,
            config.limits.scratch_mib,
            ready_timeout,
            IdRanges::new(config.uid_base, config.limits.max_sandboxes),
        );
        let microvm = MicrovmBackend::new(
            config.vmm_binary.clone(),
            &config.image_dir,
            config.state_dir.clone(),
            microvm_ready_timeout(config),
            host::kvm_unavailable_reason(&host::inspect()),
            config.hypervisor,
        );
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
        self.config
            .default_backend
            .or_else(|| self.backends.preferred())
            .unwrap_or(BackendKind::Namespace)
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

    /// Validates a create request, starts the sandbox for `owner` and waits for its agent.
    pub async fn create_sandbox(
        &self,
        request: CreateSandbox,
        owner: Owner,
    ) -> Result<SandboxInfo, CreateError> {
        let started = Instant::now();
        let limits = &self.config.limits;
        let memory_mib = request.memory_mib.unwrap_or(limits.default_memory_mib);
        if !(16..=limits.max_memory_mib).contains(&memory_mib) {
            return Err(CreateError::Invalid(format!(
                "memory_mib: must be between 16 and {}, got {memory_mib}",
                limits.max_memory_mib
            )));
        }
        let vcpus = request.vcpus.unwrap_or(limits.default_vcpus);
        if !(1..=limits.max_vcpus).contains(&vcpus) {
            return Err(CreateError::Invalid(format!(
                "vcpus: must be between 1 and {}, got {vcpus}",
                limits.max_vcpus
            )));
        }
        let ttl_s = request.ttl_s.unwrap_or(limits.default_ttl_s);
        if !(1..=limits.max_ttl_s).contains(&ttl_s) {
            return Err(CreateError::Invalid(format!(
                "ttl_s: must be between 1 and {}, got {ttl_s}",
                limits.max_ttl_s
            )));
        }
        let image = request.image.unwrap_or_else(|| DEFAULT_IMAGE.to_string());
        if image != DEFAULT_IMAGE {
            return Err(CreateError::Invalid(format!(
                "image: unknown image {image:?} (available: {DEFAULT_IMAGE:?})"
            )));
        }
        for (name, value) in &request.env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(CreateError::Invalid(format!(
                    "env.{}: names must be non-empty without '=' or NUL, values without NUL",
                    name.escape_debug()
                )));
            }
        }
        let kind = request.backend.unwrap_or_else(|| self.default_backend());
        let backend = self.backend(kind)?;
        let reservation = self.registry.reserve(limits.max_sandboxes)?;

        let id = new_id();
        let spec_env = request.env.clone();
        let spec = InstanceSpec {
            id: id.clone(),
            memory_mib,
            vcpus,
            env: request.env,
        };
        let instance = backend.create(spec).await.map_err(|e| {
            self.metrics
                .sandboxes_failed
                .fetch_add(1, Ordering::Relaxed);
            match e {
                BackendError::Unavailable { .. } => CreateError::Unavailable(e),
                e => CreateError::Failed {
                    id: id.clone(),
                    source: e,
                },
            }
        })?;
        let settings = SandboxSettings {
            backend: kind,
            image,
            memory_mib,
            vcpus,
            ttl: Duration::from_secs(ttl_s),
            idle: Duration::from_secs(limits.idle_timeout_s),
            labels: request.labels,
            env: spec_env,
            max_execs: limits.max_execs_per_sandbox,
            owner,
        };
        let sandbox = Arc::new(Sandbox::new(id, settings, instance, started.elapsed()));
        let info = sandbox.info();
        self.registry.insert(sandbox, reservation);
        self.metrics
            .sandboxes_created
            .fetch_add(1, Ordering::Relaxed);
        Ok(info)
    }
}

/// How long a microVM's agent may take to say hello: the configured readiness timeout, but
/// at least a minute under QEMU TCG, whose emulated boot takes seconds on an idle machine and
/// much longer on a loaded one.
fn microvm_ready_timeout(config: &ServeConfig) -> Duration {
    let configured = Duration::from_secs(config.limits.ready_timeout_s);
    match config.hypervisor {
        wire::Hypervisor::QemuTcg => configured.max(Duration::from_secs(60)),
        wire::Hypervisor::CrucibleVmm => configured,
    }
}
