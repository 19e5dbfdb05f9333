//! The daemon's shared state and the sandbox creation path.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wire::{BackendKind, CreateSandbox, SandboxInfo};

use crate::auth::Owner;
use crate::backend::microvm::MicrovmBackend;
use crate::backend::namespace::NamespaceBackend;
use crate::backend::{Backend, BackendError, ImagePaths, InstanceSpec};
use crate::config::ServeConfig;
use crate::error::ApiError;
use crate::host;
use crate::metrics::Metrics;
use crate::sandbox::{new_id, Registry, Sandbox, SandboxSettings};

/// Everything the handlers share.
pub struct AppState {
    /// The configuration the daemon started with.
    pub config: ServeConfig,
    /// The sandboxes.
    pub registry: Arc<Registry>,
    /// Counters.
    pub metrics: Metrics,
    namespace: NamespaceBackend,
    microvm: MicrovmBackend,
    host: host::HostReport,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

/// The only image name there is today.
pub const DEFAULT_IMAGE: &str = "default";

impl AppState {
    /// State for `config`.
    pub fn new(config: ServeConfig) -> Self {
        let namespace = NamespaceBackend::new(
            ImagePaths::in_dir(&config.image_dir),
            config.state_dir.clone(),
            config.cgroup_parent.clone(),
            config.limits.max_pids,
            config.limits.scratch_mib,
            Duration::from_secs(config.limits.ready_timeout_s),
            crate::backend::namespace::IdRanges::new(config.uid_base, config.limits.max_sandboxes),
        );
        let host = host::inspect();
        let microvm = MicrovmBackend::new(
            config.vmm_binary.clone(),
            &config.image_dir,
            config.state_dir.clone(),
            Duration::from_secs(config.limits.ready_timeout_s),
            host::kvm_unavailable_reason(&host),
        );
        AppState {
            config,
            registry: Arc::new(Registry::default()),
            metrics: Metrics::default(),
            namespace,
            microvm,
            host,
        }
    }

    /// The host inspection made at startup.
    pub fn host(&self) -> &host::HostReport {
        &self.host
    }

    /// Why `kind` cannot run here, or `None` when it can.
    pub fn unavailable_reason(&self, kind: BackendKind) -> Option<String> {
        match kind {
            BackendKind::Namespace => self.namespace.unavailable_reason(),
            BackendKind::Microvm => self.microvm.unavailable_reason(),
        }
    }

    /// The backend used when a request names none: the configured one, else a microVM where
    /// the host can boot one, else namespaces.
    pub fn default_backend(&self) -> BackendKind {
        if let Some(kind) = self.config.default_backend {
            return kind;
        }
        if self.unavailable_reason(BackendKind::Microvm).is_none() {
            BackendKind::Microvm
        } else {
            BackendKind::Namespace
        }
    }

    fn backend(&self, kind: BackendKind) -> Result<&dyn Backend, ApiError> {
        if let Some(reason) = self.unavailable_reason(kind) {
            return Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "backend_unavailable",
                format!("the {kind} backend is not available on this host: {reason}"),
            ));
        }
        match kind {
            BackendKind::Namespace => Ok(&self.namespace),
            BackendKind::Microvm => Ok(&self.microvm),
        }
    }

    /// Validates a create request, starts the sandbox for `owner` and waits for its agent.
    pub async fn create_sandbox(
        &self,
        request: CreateSandbox,
        owner: Owner,
    ) -> Result<SandboxInfo, ApiError> {
        let started = Instant::now();
        let limits = &self.config.limits;
        let memory_mib = request.memory_mib.unwrap_or(limits.default_memory_mib);
        if !(16..=limits.max_memory_mib).contains(&memory_mib) {
            return Err(ApiError::invalid(format!(
                "memory_mib: must be between 16 and {}, got {memory_mib}",
                limits.max_memory_mib
            )));
        }
        let vcpus = request.vcpus.unwrap_or(limits.default_vcpus);
        if !(1..=limits.max_vcpus).contains(&vcpus) {
            return Err(ApiError::invalid(format!(
                "vcpus: must be between 1 and {}, got {vcpus}",
                limits.max_vcpus
            )));
        }
        let ttl_s = request.ttl_s.unwrap_or(limits.default_ttl_s);
        if !(1..=limits.max_ttl_s).contains(&ttl_s) {
            return Err(ApiError::invalid(format!(
                "ttl_s: must be between 1 and {}, got {ttl_s}",
                limits.max_ttl_s
            )));
        }
        let image = request.image.unwrap_or_else(|| DEFAULT_IMAGE.to_string());
        if image != DEFAULT_IMAGE {
            return Err(ApiError::invalid(format!(
                "image: unknown image {image:?} (available: {DEFAULT_IMAGE:?})"
            )));
        }
        for (name, value) in &request.env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(ApiError::invalid(format!(
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
                BackendError::Unavailable { .. } => ApiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "backend_unavailable",
                    e.to_string(),
                ),
                BackendError::Setup { step, source } => {
                    ApiError::internal(format!("creating sandbox {id}: {step}: {source}"))
                }
                BackendError::NotReady(reason) => {
                    ApiError::internal(format!("creating sandbox {id}: {reason}"))
                }
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
