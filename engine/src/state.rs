//! The daemon's shared state (the composition root: configuration, backends, registry,
//! metrics) and the sandbox creation path.

mod container_plan;
pub mod request_bounds;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_types::{BackendKind, CreateSandbox, SandboxInfo};

use crate::backend::microvm::MicrovmBackend;
use crate::backend::microvm_disks;
use crate::backend::namespace::{IdRanges, NamespaceBackend};
use crate::backend::{
    Backend, BackendError, Backends, ImagePaths, ImageRoot, InstanceSpec, MountSource, MountSpec,
};
use crate::egress::{EgressCounters, EgressProxy, EgressRefused, NoEgress};
use crate::host;
use crate::metrics::Metrics;
use crate::owner::Owner;
use crate::pool::{PoolSpecError, Pooled, Shape, ShapeBounds, ShapeDefaults, Take, WarmPool};
use crate::restore::RestoreError;
use crate::sandbox::containers::Container;
use crate::sandbox::{
    new_id, ExecAccounts, Registry, Sandbox, SandboxError, SandboxNetwork, SandboxSettings,
};
use crate::settings::EngineConfig;
use crate::storage::{
    check_in_image, validate_targets, SandboxStorage, Storage, StorageError, DEFAULT_IMAGE,
};

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
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("backends", &self.backends)
            .finish_non_exhaustive()
    }
}

/// How many sandboxes live restore checks at once.
const RESTORE_CONCURRENCY: usize = 16;

/// Most kernel settings one create request may ask for.
const MAX_SYSCTLS: usize = 64;

/// A create request's `sysctls`, checked: namespaced settings only, on the namespace backend.
fn check_sysctls(
    request: &CreateSandbox,
    kind: BackendKind,
) -> Result<Vec<::namespace::sysctl::Sysctl>, CreateError> {
    if request.sysctls.is_empty() {
        return Ok(Vec::new());
    }
    if kind != BackendKind::Namespace {
        return Err(CreateError::Invalid(format!(
            "sysctls: the {kind} backend sets no kernel settings (the namespace backend does)"
        )));
    }
    if request.sysctls.len() > MAX_SYSCTLS {
        return Err(CreateError::Invalid(format!(
            "sysctls: {} given, a sandbox takes at most {MAX_SYSCTLS}",
            request.sysctls.len()
        )));
    }
    request
        .sysctls
        .iter()
        .map(|(name, value)| {
            let sysctl = ::namespace::sysctl::Sysctl {
                name: name.clone(),
                value: value.clone(),
            };
            sysctl
                .check()
                .map(|()| sysctl)
                .map_err(|why| CreateError::Invalid(format!("sysctls: {why}")))
        })
        .collect()
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

    /// Live restore at startup: takes back every sandbox a record describes and its backend
    /// verifies, and says (in the log) why it does not take back each of the others. Returns
    /// the ids taken back; the caller cleans up everything else an earlier daemon left.
    /// Sandboxes are checked [`RESTORE_CONCURRENCY`] at a time: a silent agent costs its ping's
    /// deadline, not the whole restore's. `keys` names the API keys this daemon has: a sandbox
    /// of a key no longer among them (revoked) is not taken back but deleted, so that it is
    /// never anyone's.
    pub async fn restore(&self, keys: &[String]) -> Vec<String> {
        use futures_util::StreamExt;
        let state_dir = &self.config.state_dir;
        let outcomes: Vec<(String, Result<(), RestoreError>, Duration)> =
            futures_util::stream::iter(crate::restore::read_all(state_dir))
                .map(|(id, record)| async move {
                    let started = Instant::now();
                    let outcome = match record {
                        Ok(record) => match revoked_owner(&record.owner, keys) {
                            Some(why) => Err(RestoreError::Unsupported(why)),
                            None => self.adopt(record).await,
                        },
                        Err(e) => Err(e),
                    };
                    (id, outcome, started.elapsed())
                })
                .buffer_unordered(RESTORE_CONCURRENCY)
                .collect()
                .await;
        let mut adopted = Vec::new();
        for (id, outcome, took) in outcomes {
            match outcome {
                Ok(()) => {
                    tracing::info!("live restore: took back sandbox {id} in {took:.1?}");
                    adopted.push(id);
                }
                Err(e) => {
                    tracing::warn!(
                        "live restore: not taking back sandbox {id}: {}; cleaning it up",
                        report::chain(&e)
                    );
                    crate::restore::remove(state_dir, &id);
                }
            }
        }
        adopted.sort();
        if let Ok(storage) = self.storage() {
            storage.finish_restore(&adopted);
        }
        adopted
    }

    /// Takes back the sandbox `record` describes, or says why not.
    async fn adopt(&self, record: crate::restore::SandboxRecord) -> Result<(), RestoreError> {
        record
            .instance
            .hello
            .check_protocol()
            .map_err(RestoreError::Unsupported)?;
        let refused = |e: CreateError| RestoreError::Unsupported(report::chain(&e));
        let backend = self.backend(record.backend).map_err(refused)?;
        let reservation = self
            .registry
            .reserve(self.config.limits.max_sandboxes)
            .map_err(|e| RestoreError::Unsupported(report::chain(&e)))?;
        let owner: Owner = record.owner.clone().into();
        // Before any process is touched: what is refused here is the stale cleanup's.
        let imported = self.relet_image(&record, &owner)?;
        let accounts = self
            .accounts(imported.as_ref().map(|(r, _)| r))
            .map_err(refused)?;
        let network = match record.network.is_empty() {
            true => None,
            false => {
                // Its rules must still be within the operator's: a restart may narrow them.
                let plan = self.egress.plan(&record.network).map_err(|e| {
                    RestoreError::Unsupported(format!(
                        "its network.allow {:?}: {e}",
                        record.network
                    ))
                })?;
                let counters = Arc::new(EgressCounters::for_sandbox(self.metrics.egress.clone()));
                let sink = plan(&record.id, counters.clone());
                Some((counters, sink))
            }
        };
        let spec = crate::backend::AdoptSpec {
            egress: network.as_ref().map(|(_, sink)| sink.clone()),
            shut_down_first: !record.caches.is_empty(),
        };
        let instance = backend.adopt(&record.id, &record.instance, spec).await?;
        // From here the instance is the recorded sandbox: a refusal destroys it.
        let held = match self.reclaim_storage(&record, &owner, &*instance).await {
            Ok(mut held) => {
                held.image = imported.map(|(_, lease)| lease);
                held
            }
            Err(e) => {
                instance.destroy().await;
                return Err(e);
            }
        };
        let settings = SandboxSettings {
            backend: record.backend,
            image: record.image,
            image_root: record.image_root,
            memory_mib: record.memory_mib,
            vcpus: record.vcpus,
            ttl: Duration::from_secs(record.ttl_s),
            idle: Duration::from_secs(record.idle_s),
            labels: record.labels,
            env: record.env,
            max_execs: record.max_execs,
            exec_tail_bytes: record.exec_tail_bytes,
            owner,
            caches: record.caches,
            volumes: record.volumes,
            disk_mib: record.disk_mib,
            share_process_namespace: record.share_process_namespace,
            hostname: record.hostname,
            network: network.map(|(counters, _)| SandboxNetwork {
                allow: record.network,
                in_pod: false,
                counters,
            }),
            image_defaults: record.defaults.map(Arc::new),
            accounts,
        };
        let sandbox = Arc::new(Sandbox::restored(
            record.id,
            settings,
            instance,
            record.created_at_ms,
            record.create_to_ready_ms,
            held,
        ));
        self.registry.insert(sandbox, reservation);
        Ok(())
    }

    /// Holds the imported image a sandbox taken back runs, which must still be the very tree
    /// it was made from; `None` for the built-in image.
    fn relet_image(
        &self,
        record: &crate::restore::SandboxRecord,
        owner: &Owner,
    ) -> Result<Option<(oci::ImageRecord, oci::ImageLease)>, RestoreError> {
        if record.image == DEFAULT_IMAGE {
            return Ok(None);
        }
        let why = |e: &dyn std::error::Error| {
            RestoreError::Mismatch(format!(
                "its image {:?}: {}",
                record.image,
                report::chain(e)
            ))
        };
        let leased = self
            .lease_image(&record.image, owner)
            .map_err(|e| why(&e))?;
        let Some((image, lease)) = leased else {
            return Ok(None);
        };
        let root = image.root.hex();
        if record.image_root.as_deref() != Some(root) {
            return Err(RestoreError::Mismatch(format!(
                "its image {:?} is another image now (tree {root}, recorded {:?})",
                record.image, record.image_root
            )));
        }
        Ok(Some((image, lease)))
    }

    /// Takes back what a sandbox holds of the storage, each part checked from the host to be
    /// held by that very sandbox (`instance`): its caches (free here, mounted where recorded),
    /// its volumes (a microVM's snapshots, a namespace sandbox's binds), its disk-backed
    /// layer, and a microVM's imported root disk.
    async fn reclaim_storage(
        &self,
        record: &crate::restore::SandboxRecord,
        owner: &Owner,
        instance: &dyn crate::backend::Instance,
    ) -> Result<SandboxStorage, RestoreError> {
        use crate::backend::Held;
        let mut held = SandboxStorage::default();
        let needs_storage = !record.caches.is_empty()
            || !record.volumes.is_empty()
            || record.disk_mib.is_some()
            || (record.image != DEFAULT_IMAGE && record.backend == BackendKind::Microvm);
        if !needs_storage {
            return Ok(held);
        }
        let storage = self
            .storage()
            .map_err(|e| RestoreError::Unsupported(report::chain(&e)))?;
        let check = |what: Held<'_>| {
            instance
                .check_holds(what)
                .map_err(|why| RestoreError::Mismatch(format!("{}: {why}", what.describe())))
        };
        let microvm = record.backend == BackendKind::Microvm;
        for volume in &record.volumes {
            let mismatch = |why: String| {
                RestoreError::Mismatch(format!("its volume {:?}: {why}", volume.name))
            };
            let dir = storage
                .volumes
                .get(&volume.name)
                .map_err(|e| mismatch(report::chain(&e)))?;
            let target = mount_target(&volume.path);
            if microvm {
                let image = storage
                    .volume_snapshots
                    .reclaim(&volume.name)
                    .await
                    .map_err(|e| mismatch(report::chain(&e)))?;
                check(Held::Mounted {
                    image: &image,
                    target: &target,
                })?;
            } else {
                check(Held::Bound {
                    dir,
                    target: &target,
                })?;
            }
        }
        for cache in &record.caches {
            let mismatch =
                |why: String| RestoreError::Mismatch(format!("its cache {:?}: {why}", cache.name));
            let lease = storage
                .caches
                .reclaim(owner, &cache.name, &record.id, record.backend, cache.save)
                .map_err(|e| mismatch(report::chain(&e)))?;
            instance
                .check_holds(Held::Mounted {
                    image: lease.path(),
                    target: &mount_target(&cache.path),
                })
                .map_err(mismatch)?;
            held.caches.push(lease);
        }
        if record.disk_mib.is_some() {
            let scratch = storage.scratch.reclaim(&record.id).map_err(|e| {
                RestoreError::Mismatch(format!("its writable layer: {}", report::chain(&e)))
            })?;
            check(Held::WritableLayer {
                image: scratch.path(),
            })?;
            held.scratch = Some(scratch);
        }
        if microvm && record.image != DEFAULT_IMAGE {
            let image = storage
                .images
                .get(owner, &record.image)
                .map_err(|e| RestoreError::Mismatch(report::chain(&e)))?;
            let disk = storage
                .images
                .reclaim_root_disk(&image)
                .await
                .map_err(|e| {
                    RestoreError::Mismatch(format!("its root disk: {}", report::chain(&e)))
                })?;
            check(Held::RootImage { image: &disk })?;
        }
        Ok(held)
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

    /// Validates a create request, starts the sandbox for `owner` and waits for its agent.
    pub async fn create_sandbox(
        &self,
        mut request: CreateSandbox,
        owner: Owner,
    ) -> Result<SandboxInfo, CreateError> {
        let started = Instant::now();
        request_bounds::check_create(&request).map_err(CreateError::Invalid)?;
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
        let image = request
            .image
            .clone()
            .unwrap_or_else(|| DEFAULT_IMAGE.to_string());
        let imported = self.lease_image(&image, &owner)?;
        let accounts = self.accounts(imported.as_ref().map(|(r, _)| r))?;
        let image_defaults = sandbox_defaults(
            imported.as_ref().map(|(r, _)| r),
            request.user.as_deref(),
            &accounts,
        )?;
        check_env(&request.env, "env")?;
        if let Some(hostname) = &request.hostname {
            contract::hostname::check(hostname)
                .map_err(|why| CreateError::Invalid(format!("hostname: {why}")))?;
        }
        let kind = request.backend.unwrap_or_else(|| self.default_backend());
        let backend = self.backend(kind)?;
        let sysctls = check_sysctls(&request, kind)?;
        // A microVM pod's connections leave from the pod's namespace through the egress
        // proxy: the VM has no network device to link to it.
        let mut pod_sockets = None;
        let network_namespace = match &request.network_namespace {
            None => None,
            Some(_) if request.network.is_some() => {
                return Err(CreateError::Invalid(
                    "network_namespace: a sandbox in a host network namespace reaches the \
                     network through it, not through the egress proxy: leave out `network`"
                        .into(),
                ))
            }
            Some(path)
                if kind == BackendKind::Microvm && path != api_types::HOST_NETWORK_NAMESPACE =>
            {
                let path = std::path::Path::new(path);
                let sockets = ::namespace::netns::PodSockets::open(path)
                    .map_err(|e| CreateError::Invalid(report::chain(&e)))?;
                pod_sockets = Some(Arc::new(sockets));
                None
            }
            Some(_) if kind != BackendKind::Namespace => {
                return Err(CreateError::Invalid(format!(
                    "network_namespace: the {kind} backend joins no host network namespace \
                     (the namespace backend does; a microVM takes a pod's, never the host's)"
                )))
            }
            Some(path) if path == api_types::HOST_NETWORK_NAMESPACE => {
                if let Some(sysctl) = sysctls.iter().find(|s| s.is_network()) {
                    return Err(CreateError::Invalid(format!(
                        "sysctls: {} would set the host's own network settings: a sandbox on \
                         the host's network (network_namespace \"host\") takes no net.* sysctl",
                        sysctl.name
                    )));
                }
                Some(std::path::PathBuf::from(::namespace::netns::HOST))
            }
            Some(path) => {
                let path = std::path::PathBuf::from(path);
                // Checked here for a clear 400; the supervisor checks what it opens again.
                ::namespace::netns::open_checked(&path)
                    .map_err(|e| CreateError::Invalid(report::chain(&e)))?;
                Some(path)
            }
        };
        let has_containers = !request.containers.is_empty() || !request.shared.is_empty();
        if has_containers && kind == BackendKind::Process {
            return Err(CreateError::Invalid(format!(
                "containers: the {kind} backend runs no containers (ask for \"backend\": \
                 \"namespace\" or \"microvm\")"
            )));
        }
        // A namespace sandbox makes its mount points without following a link of its image.
        let main_root = (kind == BackendKind::Namespace).then_some(accounts.root.as_path());
        let containers = self.plan_containers(&request, &owner, main_root)?;
        for (i, root) in containers.roots.iter().enumerate() {
            container_plan::refuse_security_on(kind, root, &format!("containers[{i}]."), false)?;
        }
        // Only a microVM's disks are fixed at boot; the other backends need no slots.
        let container_slots = match kind {
            BackendKind::Microvm => request.container_slots.unwrap_or(0) as usize,
            BackendKind::Namespace | BackendKind::Process => 0,
        };
        let targets: Vec<(String, &str)> = request
            .caches
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("caches[{i}] ({})", c.name), c.path.as_str()))
            .chain(
                request
                    .volumes
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (format!("volumes[{i}] ({})", v.name), v.path.as_str())),
            )
            .collect();
        validate_targets(&targets)?;
        if let Some(root) = main_root {
            for (what, path) in &targets {
                check_in_image(root, &image, what, path.trim_end_matches('/'))?;
            }
        }
        let unsupported = unsupported_storage(kind, &request);
        if !unsupported.is_empty() {
            return Err(CreateError::Invalid(format!(
                "{} {} not available on the {kind} backend yet (use the namespace backend)",
                unsupported.join(", "),
                if unsupported.len() == 1 { "is" } else { "are" },
            )));
        }
        if kind == BackendKind::Microvm {
            let targets: Vec<&str> = request
                .volumes
                .iter()
                .map(|v| v.path.as_str())
                .chain(request.caches.iter().map(|c| c.path.as_str()))
                .collect();
            let names: Vec<&str> = request.containers.iter().map(|c| c.name.as_str()).collect();
            microvm_disks::check_request(
                &request.hostname.clone().unwrap_or_else(new_id),
                request.disk_mib.is_some(),
                &targets,
                &names,
                container_slots,
                &crate::backend::microvm::vm_shared(&containers.shared),
            )
            .map_err(CreateError::Invalid)?;
        }
        if let Some(disk_mib) = request.disk_mib {
            if disk_mib < MIN_DISK_MIB {
                return Err(CreateError::Invalid(format!(
                    "disk_mib: must be at least {MIN_DISK_MIB}, got {disk_mib}"
                )));
            }
        }
        let policy = match &request.network {
            Some(network) if !network.allow.is_empty() => {
                if kind == BackendKind::Process {
                    return Err(CreateError::Invalid(format!(
                        "network is not available on the {kind} backend yet (use the namespace \
                         backend)"
                    )));
                }
                let plan = self.egress.plan(&network.allow).map_err(|e| match e {
                    EgressRefused::Invalid(why) => CreateError::Invalid(why),
                    EgressRefused::Forbidden(why) => CreateError::EgressForbidden(why),
                })?;
                Some(plan)
            }
            _ => match pod_sockets.clone() {
                Some(pod) => Some(self.egress.plan_in_pod(pod).map_err(|e| match e {
                    EgressRefused::Invalid(why) => CreateError::Invalid(why),
                    EgressRefused::Forbidden(why) => CreateError::EgressForbidden(why),
                })?),
                None => None,
            },
        };
        if imported.is_some() && kind == BackendKind::Process {
            return Err(CreateError::Invalid(format!(
                "image: imported images are not available on the {kind} backend (use the \
                 namespace or microvm backend)"
            )));
        }
        // What the sandbox will be, whichever way it is made; a pool hit takes it as it is (a
        // poolable request has no network, storage or image of its own), a cold create adds
        // its network below.
        let mut settings = SandboxSettings {
            backend: kind,
            image: image.clone(),
            image_root: imported.as_ref().map(|(r, _)| r.root.hex().to_string()),
            memory_mib,
            vcpus,
            ttl: Duration::from_secs(ttl_s),
            idle: Duration::from_secs(limits.idle_timeout_s),
            labels: std::mem::take(&mut request.labels),
            env: request.env.clone(),
            max_execs: limits.max_execs_per_sandbox,
            exec_tail_bytes: limits.exec_tail_bytes,
            owner,
            caches: request.caches.clone(),
            volumes: request.volumes.clone(),
            disk_mib: request.disk_mib,
            share_process_namespace: request.share_process_namespace,
            hostname: request.hostname.clone(),
            network: None,
            image_defaults,
            accounts,
        };
        let poolable = policy.is_none()
            && !has_containers
            && container_slots == 0
            && imported.is_none()
            && request.user.is_none()
            && request.caches.is_empty()
            && request.volumes.is_empty()
            && request.disk_mib.is_none()
            && !request.share_process_namespace
            && request.hostname.is_none()
            && network_namespace.is_none()
            && sysctls.is_empty();
        if poolable {
            // A hit takes no reservation, where the refusal would otherwise come from; a
            // creation under way when shutdown begins is waited for, so this is the last word.
            if self.registry.is_shutting_down() {
                return Err(SandboxError::ShuttingDown.into());
            }
            let shape = Shape {
                image: image.clone(),
                backend: kind,
                memory_mib,
                vcpus,
            };
            if let Take::Hit(pooled) = self.pool.take(&shape) {
                return Ok(self.insert_pooled(pooled, settings, started));
            }
        } else {
            self.pool.count_unpooled();
        }
        let reservation = self.registry.reserve(limits.max_sandboxes)?;

        let id = new_id();
        let network = policy.map(|plan| {
            let counters = Arc::new(EgressCounters::for_sandbox(self.metrics.egress.clone()));
            let sink = plan(&id, counters.clone());
            (counters, sink)
        });
        if network.is_some() {
            for (name, value) in contract::egress::proxy_env() {
                request.env.entry(name.to_string()).or_insert(value);
            }
        }
        let (mut held, disk, mounts) = self
            .claim_storage(&request, &settings.owner, &id, kind)
            .await?;
        let container_plan::ContainersPlan {
            containers,
            roots: container_roots,
            shared,
            leases,
            images: container_images,
        } = containers;
        held.container_images = leases;
        // A microVM reaches each container's image as a read-only ext4 snapshot of its tree.
        let mut container_disks = Vec::new();
        if kind == BackendKind::Microvm {
            let images = &self.storage()?.images;
            for (root, image) in container_roots.iter().zip(&container_images) {
                container_disks.push(match image {
                    Some(record) => images.root_disk(record).await?,
                    None => images.tree_disk(&root.rootfs).await?,
                });
            }
        }
        let root = match imported {
            Some((record, lease)) => {
                let images = &self.storage()?.images;
                let disk = match kind {
                    BackendKind::Microvm => Some(images.root_disk(&record).await?),
                    BackendKind::Namespace | BackendKind::Process => None,
                };
                held.image = Some(lease);
                Some(ImageRoot {
                    dir: images.root_dir(&record),
                    disk,
                })
            }
            None => None,
        };
        let spec_env = request.env.clone();
        let spec = InstanceSpec {
            id: id.clone(),
            hostname: request.hostname.clone().unwrap_or_else(|| id.clone()),
            memory_mib,
            vcpus,
            env: request.env,
            disk,
            mounts,
            egress: network.as_ref().map(|(_, sink)| sink.clone()),
            root,
            containers: container_roots,
            container_disks,
            shared,
            container_slots,
            network_namespace,
            sysctls,
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
        settings.env = spec_env;
        let in_pod = request.network.is_none() && request.network_namespace.is_some();
        settings.network = network.map(|(counters, _)| SandboxNetwork {
            allow: request.network.map(|n| n.allow).unwrap_or_default(),
            in_pod,
            counters,
        });
        let containers = containers
            .into_iter()
            .enumerate()
            .map(|(index, plan)| Arc::new(Container::new(index, plan)))
            .collect();
        let sandbox = Arc::new(
            Sandbox::new(id.clone(), settings, instance, started.elapsed(), held)
                .with_containers(containers),
        );
        self.registry.insert(sandbox.clone(), reservation);
        // A microVM pod is reached on its pod IP and through port-forward before its
        // containers are (their readiness is the agent's to check).
        if let Some(pod) = pod_sockets {
            let dialer: std::sync::Weak<dyn crate::pod_inbound::AgentDialer> =
                Arc::downgrade(&sandbox) as std::sync::Weak<Sandbox>;
            match crate::pod_inbound::PodInbound::start(pod, dialer).await {
                Ok(inbound) => sandbox.set_inbound(inbound),
                Err(e) => {
                    self.registry.remove(&id).await;
                    self.metrics
                        .sandboxes_failed
                        .fetch_add(1, Ordering::Relaxed);
                    return Err(CreateError::PodNetwork { id, source: e });
                }
            }
        }
        // Listed while its containers come up (it runs); gone again if one cannot.
        if let Err(reason) = crate::sandbox::containers::start_all(&sandbox).await {
            self.registry.remove(&id).await;
            self.metrics
                .sandboxes_failed
                .fetch_add(1, Ordering::Relaxed);
            return Err(CreateError::ContainerNotReady { id, reason });
        }
        let info = sandbox.info();
        self.metrics
            .sandboxes_created
            .fetch_add(1, Ordering::Relaxed);
        Ok(info)
    }
}

impl Engine {
    /// Holds `owner`'s imported image `image` for a new sandbox; `None` for the built-in one.
    pub(crate) fn lease_image(
        &self,
        image: &str,
        owner: &Owner,
    ) -> Result<Option<(oci::ImageRecord, oci::ImageLease)>, CreateError> {
        if image == DEFAULT_IMAGE {
            return Ok(None);
        }
        let unknown = |why: &str| {
            CreateError::Invalid(format!(
                "image: unknown image {image:?}{why} (GET /images lists yours; `crucible \
                 image import` adds one)"
            ))
        };
        let storage = self
            .storage()
            .map_err(|_| unknown(": this daemon has no image store"))?;
        match storage.images.lease(owner, image) {
            Ok(leased) => Ok(Some(leased)),
            Err(StorageError::Image(oci::StoreError::NotFound(_))) => Err(unknown("")),
            Err(e) => Err(e.into()),
        }
    }

    /// Where the users its commands ask for are looked up: its image's tree.
    pub(crate) fn accounts(
        &self,
        record: Option<&oci::ImageRecord>,
    ) -> Result<Arc<ExecAccounts>, CreateError> {
        Ok(Arc::new(match record {
            Some(record) => ExecAccounts {
                root: self.storage()?.images.root_dir(record),
                image_sets_home: record
                    .run_config
                    .env
                    .iter()
                    .flatten()
                    .any(|entry| entry.starts_with("HOME=")),
            },
            None => ExecAccounts {
                root: ImagePaths::in_dir(&self.config.image_dir).rootfs,
                image_sets_home: false,
            },
        }))
    }

    /// Registers a sandbox around a pooled instance with the request's `settings`: it keeps
    /// the id it was made with (its hostname) and takes over its place under the cap. Its env
    /// reaches every command the way a cold sandbox's does: the daemon merges it into each
    /// exec request, under the request's own (`Sandbox::merge_env_into`).
    fn insert_pooled(
        &self,
        pooled: Pooled,
        settings: SandboxSettings,
        started: Instant,
    ) -> SandboxInfo {
        let Pooled {
            id,
            instance,
            reservation,
        } = pooled;
        let sandbox = Arc::new(Sandbox::new(
            id,
            settings,
            instance,
            started.elapsed(),
            SandboxStorage::default(),
        ));
        let info = sandbox.info();
        self.registry.insert(sandbox, reservation);
        self.metrics
            .sandboxes_created
            .fetch_add(1, Ordering::Relaxed);
        info
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
fn mount_target(path: &str) -> String {
    path.trim_end_matches('/').to_string()
}

/// What of a request backend `kind` cannot provide, named for an error message: the process
/// backend has no storage at all.
fn unsupported_storage(kind: BackendKind, request: &CreateSandbox) -> Vec<&'static str> {
    let mut features = Vec::new();
    if kind != BackendKind::Process {
        return features;
    }
    if request.disk_mib.is_some() {
        features.push("disk_mib");
    }
    if !request.caches.is_empty() {
        features.push("caches");
    }
    if !request.volumes.is_empty() {
        features.push("volumes");
    }
    features
}

/// The smallest disk-backed layer: an ext4 needs a few MiB for itself.
pub const MIN_DISK_MIB: u64 = 64;

/// Why a recorded sandbox's owner no longer owns anything on this daemon: its key is not
/// among `keys` (revoked). `None` for a configured key and for the Unix socket.
fn revoked_owner(owner: &crate::restore::RecordedOwner, keys: &[String]) -> Option<String> {
    match owner {
        crate::restore::RecordedOwner::Key(name) if !keys.iter().any(|k| k == name) => {
            Some(format!(
                "its owner, key {name:?}, is no longer configured: a revoked key's sandboxes \
                 are deleted, never handed to another key"
            ))
        }
        _ => None,
    }
}

impl Engine {
    /// Takes what the request asks of the storage, for sandbox `id` on `backend`: its
    /// caches (made if new) and its disk-backed layer, with the volumes it names (for a
    /// microVM, each as its read-only snapshot image, built on the first request); all of it
    /// is released if any part is refused.
    async fn claim_storage(
        &self,
        request: &CreateSandbox,
        owner: &Owner,
        id: &str,
        backend: BackendKind,
    ) -> Result<(SandboxStorage, Option<std::path::PathBuf>, Vec<MountSpec>), CreateError> {
        let mut held = SandboxStorage::default();
        let mut mounts = Vec::new();
        if request.caches.is_empty() && request.volumes.is_empty() && request.disk_mib.is_none() {
            return Ok((held, None, mounts));
        }
        let storage = self.storage()?;
        for volume in &request.volumes {
            let dir = storage.volumes.get(&volume.name)?;
            let source = match backend {
                // A VM can only be given block devices.
                BackendKind::Microvm => {
                    MountSource::Ext4Image(storage.volume_snapshots.image(&volume.name, dir).await?)
                }
                BackendKind::Namespace | BackendKind::Process => {
                    MountSource::Directory(dir.to_path_buf())
                }
            };
            mounts.push(MountSpec {
                source,
                target: mount_target(&volume.path),
                read_only: true,
            });
        }
        let mut names = std::collections::BTreeSet::new();
        for cache in &request.caches {
            if !names.insert(cache.name.as_str()) {
                return Err(CreateError::Invalid(format!(
                    "caches: {:?} is asked for twice",
                    cache.name
                )));
            }
            let lease = storage
                .caches
                .acquire(owner, &cache.name, cache.size_mib, id, backend, cache.save)
                .await?;
            mounts.push(MountSpec {
                source: MountSource::Ext4Image(lease.path().to_path_buf()),
                target: mount_target(&cache.path),
                read_only: false,
            });
            held.caches.push(lease);
        }
        let disk = match request.disk_mib {
            Some(mib) => {
                let scratch = storage.scratch.create(id, mib).await?;
                let path = scratch.path().to_path_buf();
                held.scratch = Some(scratch);
                Some(path)
            }
            None => None,
        };
        Ok((held, disk, mounts))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore::RecordedOwner;

    #[test]
    fn a_sandbox_of_a_key_no_longer_configured_is_revoked_and_the_sockets_never_is() {
        let keys = ["ci".to_string(), "key-0123456789abcdef".to_string()];
        assert_eq!(revoked_owner(&RecordedOwner::Key("ci".into()), &keys), None);
        assert_eq!(revoked_owner(&RecordedOwner::Unix, &keys), None);
        assert_eq!(revoked_owner(&RecordedOwner::Unix, &[]), None);
        let why = revoked_owner(&RecordedOwner::Key("dev".into()), &keys).expect("revoked");
        assert!(
            why.contains("key \"dev\", is no longer configured"),
            "{why}"
        );
        assert!(revoked_owner(&RecordedOwner::Key("ci".into()), &[]).is_some());
    }
}
