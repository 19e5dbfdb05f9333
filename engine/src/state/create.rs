//! Creating a sandbox, in named steps, each taking what the one before it made:
//!
//! 1. **validate**: the request's sizes, fields and kernel settings against the limits;
//! 2. **image**: the image it runs (held for it), the accounts its users resolve against;
//! 3. **network**: where its network lives (the host's, a pod's, its own);
//! 4. **plan**: its containers, storage targets and egress policy, and what its backend can
//!    do of them;
//! 5. **source**: a warm pool's ready instance when the request is one a pool can serve (it
//!    is then registered at once), else a reservation under the sandbox cap;
//! 6. **storage**: its caches, disk-backed layer, volumes and image disks, claimed;
//! 7. **spec**: what the backend is asked to make;
//! 8. **launch**: the backend makes it and waits for its agent;
//! 9. **register**: listed, reached (a microVM pod's inbound connections), its containers up.
//!
//! A new way to make a sandbox (a snapshot, a fork) is another source feeding the same steps.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_types::{BackendKind, CreateSandbox, SandboxInfo};
use namespace::netns::PodSockets;
use namespace::sysctl::Sysctl;

use super::container_plan::{self, ContainersPlan};
use super::request_bounds;
use super::{check_env, mount_target, sandbox_defaults, CreateError, Engine};
use crate::backend::microvm_disks;
use crate::backend::{
    Backend, BackendError, Capabilities, ImagePaths, ImageRoot, Instance, InstanceSpec,
    MountSource, MountSpec,
};
use crate::egress::{EgressCounters, EgressPlan, EgressRefused};
use crate::owner::Owner;
use crate::pool::{Pooled, Shape, Take};
use crate::sandbox::containers::Container;
use crate::sandbox::{
    new_id, ExecAccounts, Reservation, Sandbox, SandboxError, SandboxNetwork, SandboxSettings,
};
use crate::settings::Limits;
use crate::storage::DEFAULT_IMAGE;
use crate::storage::{check_in_image, validate_targets, SandboxStorage, StorageError};

/// Most kernel settings one create request may ask for.
const MAX_SYSCTLS: usize = 64;

/// The smallest disk-backed layer: an ext4 needs a few MiB for itself.
pub const MIN_DISK_MIB: u64 = 64;

/// What the sandbox is given, the request's or the daemon's defaults, within the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sizes {
    pub(crate) memory_mib: u64,
    pub(crate) vcpus: u32,
    pub(crate) ttl_s: u64,
}

/// The image step's choice.
struct ChosenImage {
    /// Its name (`default`: the daemon's own).
    name: String,
    /// An imported image's record and the lease that keeps it while the sandbox lives.
    imported: Option<(oci::ImageRecord, oci::ImageLease)>,
    /// Where the users its commands ask for are looked up.
    accounts: Arc<ExecAccounts>,
    /// What every command starts with (the image's config and the request's `user`).
    defaults: Option<Arc<oci::defaults::Defaults>>,
}

/// Where the sandbox's network lives (the network step).
#[derive(Debug, Default)]
pub(crate) struct NetworkPlacement {
    /// The host network namespace it joins (the namespace backend).
    pub(crate) joins: Option<PathBuf>,
    /// A microVM pod's namespace: its connections leave from there, and it is reached there.
    pub(crate) pod: Option<Arc<PodSockets>>,
}

/// The plan step's result.
struct Plan {
    containers: ContainersPlan,
    /// Containers a microVM can take once it runs (its disks are fixed at boot).
    container_slots: usize,
    /// How its egress is made once it has an id.
    policy: Option<EgressPlan>,
}

/// What the storage step claimed.
struct Provided {
    held: SandboxStorage,
    disk: Option<PathBuf>,
    mounts: Vec<MountSpec>,
    root: Option<ImageRoot>,
    container_disks: Vec<PathBuf>,
}

/// Where the source step found the sandbox.
enum Source {
    /// Ready in a warm pool.
    Pool(Pooled),
    /// To be made: its place under the cap.
    Cold(Reservation),
}

impl Engine {
    /// Validates a create request, starts the sandbox for `owner` and waits for its agent.
    pub async fn create_sandbox(
        &self,
        mut request: CreateSandbox,
        owner: Owner,
    ) -> Result<SandboxInfo, CreateError> {
        let started = Instant::now();
        let sizes = validate(&self.config.limits, &request)?;
        let kind = request.backend.unwrap_or_else(|| self.default_backend());
        let backend = self.backend(kind)?;
        let caps = backend.capabilities();
        let sysctls = check_sysctls(&request, kind, caps)?;
        let image = self.choose_image(&request, &owner)?;
        let placement = place_network(kind, caps, &request, &sysctls)?;
        let plan = self.plan(&request, &owner, (kind, caps), &image, &placement)?;
        let poolable = is_poolable(&request, &plan, &image, &placement, &sysctls);
        let settings = self.settings(&mut request, kind, sizes, owner, &image);
        let reservation = match self.source(poolable, kind, sizes, &image.name)? {
            Source::Pool(pooled) => return Ok(self.insert_pooled(pooled, settings, started)),
            Source::Cold(reservation) => reservation,
        };
        let id = new_id();
        let network = plan.policy.map(|plan| {
            let counters = Arc::new(EgressCounters::for_sandbox(self.metrics.egress.clone()));
            let sink = plan(&id, counters.clone());
            (counters, sink)
        });
        if network.is_some() {
            for (name, value) in contract::egress::proxy_env() {
                request.env.entry(name.to_string()).or_insert(value);
            }
        }
        let mut provided = self
            .provide_storage(
                &request,
                &settings.owner,
                &id,
                (kind, caps),
                image.imported,
                &plan.containers,
            )
            .await?;
        let ContainersPlan {
            containers,
            roots,
            shared,
            leases,
            images: _,
        } = plan.containers;
        provided.held.container_images = leases;
        let spec = InstanceSpec {
            containers: roots,
            shared,
            container_slots: plan.container_slots,
            network_namespace: placement.joins,
            sysctls,
            egress: network.as_ref().map(|(_, sink)| sink.clone()),
            ..instance_spec(&id, &request, sizes, &mut provided)
        };
        let instance = self.launch(backend, spec, &id).await?;
        let mut settings = settings;
        settings.env = request.env;
        settings.network = network.map(|(counters, _)| SandboxNetwork {
            allow: request.network.map(|n| n.allow).unwrap_or_default(),
            in_pod: placement.pod.is_some(),
            counters,
        });
        let sandbox = Arc::new(
            Sandbox::new(id, settings, instance, started.elapsed(), provided.held).with_containers(
                containers
                    .into_iter()
                    .enumerate()
                    .map(|(index, plan)| Arc::new(Container::new(index, plan)))
                    .collect(),
            ),
        );
        self.register(sandbox, reservation, placement.pod).await
    }

    /// The image step: the image the request names (held for the sandbox), the accounts its
    /// users resolve against, and what its commands start with.
    fn choose_image(
        &self,
        request: &CreateSandbox,
        owner: &Owner,
    ) -> Result<ChosenImage, CreateError> {
        let name = request
            .image
            .clone()
            .unwrap_or_else(|| DEFAULT_IMAGE.to_string());
        let imported = self.lease_image(&name, owner)?;
        let record = imported.as_ref().map(|(r, _)| r);
        let accounts = self.accounts(record)?;
        let defaults = sandbox_defaults(record, request.user.as_deref(), &accounts)?;
        Ok(ChosenImage {
            name,
            imported,
            accounts,
            defaults,
        })
    }

    /// The plan step: the request's containers, storage targets and egress, each checked
    /// against what backend `kind` can do.
    fn plan(
        &self,
        request: &CreateSandbox,
        owner: &Owner,
        (kind, caps): (BackendKind, Capabilities),
        image: &ChosenImage,
        placement: &NetworkPlacement,
    ) -> Result<Plan, CreateError> {
        check_backend_features(kind, caps, request, image.imported.is_some())?;
        // Mount points made in the image's tree are made without following a link of it.
        let main_root = caps
            .mounts_in_image_tree
            .then_some(image.accounts.root.as_path());
        let containers = self.plan_containers(request, owner, main_root)?;
        for (i, root) in containers.roots.iter().enumerate() {
            container_plan::refuse_security_on(
                kind,
                caps,
                root,
                &format!("containers[{i}]."),
                false,
            )?;
        }
        // Only disks fixed at boot need slots for the containers added later.
        let container_slots = match caps.disks_fixed_at_boot {
            true => request.container_slots.unwrap_or(0) as usize,
            false => 0,
        };
        check_storage_targets(request, main_root, &image.name)?;
        if caps.disks_fixed_at_boot {
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
        let refused = |e| match e {
            EgressRefused::Invalid(why) => CreateError::Invalid(why),
            EgressRefused::Forbidden(why) => CreateError::EgressForbidden(why),
        };
        let policy = match (&request.network, &placement.pod) {
            (Some(network), _) if !network.allow.is_empty() => {
                Some(self.egress.plan(&network.allow).map_err(refused)?)
            }
            (_, Some(pod)) => Some(self.egress.plan_in_pod(pod.clone()).map_err(refused)?),
            _ => None,
        };
        Ok(Plan {
            containers,
            container_slots,
            policy,
        })
    }

    /// What the sandbox will be, whichever way it is made; a pool hit takes it as it is (a
    /// poolable request has no network, storage or image of its own), a cold create adds its
    /// environment and network once they are known.
    fn settings(
        &self,
        request: &mut CreateSandbox,
        kind: BackendKind,
        sizes: Sizes,
        owner: Owner,
        image: &ChosenImage,
    ) -> SandboxSettings {
        let limits = &self.config.limits;
        SandboxSettings {
            backend: kind,
            image: image.name.clone(),
            image_root: image
                .imported
                .as_ref()
                .map(|(r, _)| r.root.hex().to_string()),
            memory_mib: sizes.memory_mib,
            vcpus: sizes.vcpus,
            ttl: Duration::from_secs(sizes.ttl_s),
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
            image_defaults: image.defaults.clone(),
            accounts: image.accounts.clone(),
        }
    }

    /// The source step: a pooled instance of exactly this shape, or a place under the cap.
    fn source(
        &self,
        poolable: bool,
        kind: BackendKind,
        sizes: Sizes,
        image: &str,
    ) -> Result<Source, CreateError> {
        if poolable {
            // A hit takes no reservation, where the refusal would otherwise come from; a
            // creation under way when shutdown begins is waited for, so this is the last word.
            if self.registry.is_shutting_down() {
                return Err(SandboxError::ShuttingDown.into());
            }
            let shape = Shape {
                image: image.to_string(),
                backend: kind,
                memory_mib: sizes.memory_mib,
                vcpus: sizes.vcpus,
            };
            if let Take::Hit(pooled) = self.pool.take(&shape) {
                return Ok(Source::Pool(pooled));
            }
        } else {
            self.pool.count_unpooled();
        }
        Ok(Source::Cold(
            self.registry.reserve(self.config.limits.max_sandboxes)?,
        ))
    }

    /// The storage step: what the request asks of the storage, and each image as the backend
    /// takes it (a microVM reaches each as a read-only ext4 snapshot of its tree).
    async fn provide_storage(
        &self,
        request: &CreateSandbox,
        owner: &Owner,
        id: &str,
        (kind, caps): (BackendKind, Capabilities),
        imported: Option<(oci::ImageRecord, oci::ImageLease)>,
        containers: &ContainersPlan,
    ) -> Result<Provided, CreateError> {
        let (mut held, disk, mounts) = self.claim_storage(request, owner, id, (kind, caps)).await?;
        let mut container_disks = Vec::new();
        if caps.disks_fixed_at_boot {
            let images = &self.storage()?.images;
            for (root, image) in containers.roots.iter().zip(&containers.images) {
                container_disks.push(match image {
                    Some(record) => images.root_disk(record).await?,
                    None => images.tree_disk(&root.rootfs).await?,
                });
            }
        }
        let root = match imported {
            Some((record, lease)) => {
                let images = &self.storage()?.images;
                let disk = match caps.disks_fixed_at_boot {
                    true => Some(images.root_disk(&record).await?),
                    false => None,
                };
                held.image = Some(lease);
                Some(ImageRoot {
                    dir: images.root_dir(&record),
                    disk,
                })
            }
            None => None,
        };
        Ok(Provided {
            held,
            disk,
            mounts,
            root,
            container_disks,
        })
    }

    /// The launch step: the backend makes the instance and waits for its agent.
    async fn launch(
        &self,
        backend: &dyn Backend,
        spec: InstanceSpec,
        id: &str,
    ) -> Result<Box<dyn Instance>, CreateError> {
        backend.create(spec).await.map_err(|e| {
            self.metrics
                .sandboxes_failed
                .fetch_add(1, Ordering::Relaxed);
            match e {
                BackendError::Unavailable { .. } => CreateError::Unavailable(e),
                e => CreateError::Failed {
                    id: id.to_string(),
                    source: e,
                },
            }
        })
    }

    /// The register step: listed under its reservation, reached on its pod's network, its
    /// containers up; taken out again if one of the last two fails.
    async fn register(
        &self,
        sandbox: Arc<Sandbox>,
        reservation: Reservation,
        pod: Option<Arc<PodSockets>>,
    ) -> Result<SandboxInfo, CreateError> {
        let id = sandbox.id.clone();
        self.registry.insert(sandbox.clone(), reservation);
        // A microVM pod is reached on its pod IP and through port-forward before its
        // containers are (their readiness is the agent's to check).
        if let Some(pod) = pod {
            let dialer: std::sync::Weak<dyn crate::pod_inbound::AgentDialer> =
                Arc::downgrade(&sandbox) as std::sync::Weak<Sandbox>;
            match crate::pod_inbound::PodInbound::start(pod, dialer).await {
                Ok(inbound) => sandbox.set_inbound(inbound),
                Err(e) => {
                    self.unregister_failed(&id).await;
                    return Err(CreateError::PodNetwork { id, source: e });
                }
            }
        }
        // Listed while its containers come up (it runs); gone again if one cannot.
        if let Err(reason) = crate::sandbox::containers::start_all(&sandbox).await {
            self.unregister_failed(&id).await;
            return Err(CreateError::ContainerNotReady { id, reason });
        }
        self.metrics
            .sandboxes_created
            .fetch_add(1, Ordering::Relaxed);
        Ok(sandbox.info())
    }

    async fn unregister_failed(&self, id: &str) {
        self.registry.remove(id).await;
        self.metrics
            .sandboxes_failed
            .fetch_add(1, Ordering::Relaxed);
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

    /// Takes what the request asks of the storage, for sandbox `id` on `backend`: its
    /// caches (made if new) and its disk-backed layer, with the volumes it names (for a
    /// microVM, each as its read-only snapshot image, built on the first request); all of it
    /// is released if any part is refused.
    async fn claim_storage(
        &self,
        request: &CreateSandbox,
        owner: &Owner,
        id: &str,
        (backend, caps): (BackendKind, Capabilities),
    ) -> Result<(SandboxStorage, Option<PathBuf>, Vec<MountSpec>), CreateError> {
        let mut held = SandboxStorage::default();
        let mut mounts = Vec::new();
        if request.caches.is_empty() && request.volumes.is_empty() && request.disk_mib.is_none() {
            return Ok((held, None, mounts));
        }
        let storage = self.storage()?;
        for volume in &request.volumes {
            let dir = storage.volumes.get(&volume.name)?;
            let source = match caps.disks_fixed_at_boot {
                // A VM can only be given block devices.
                true => {
                    MountSource::Ext4Image(storage.volume_snapshots.image(&volume.name, dir).await?)
                }
                false => MountSource::Directory(dir.to_path_buf()),
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

/// The validate step: the request's bounds, sizes (the daemon's defaults where it gives
/// none), environment and hostname.
pub(crate) fn validate(limits: &Limits, request: &CreateSandbox) -> Result<Sizes, CreateError> {
    request_bounds::check_create(request).map_err(CreateError::Invalid)?;
    let within = |field: &str, value: u64, low: u64, high: u64| {
        if (low..=high).contains(&value) {
            Ok(())
        } else {
            Err(CreateError::Invalid(format!(
                "{field}: must be between {low} and {high}, got {value}"
            )))
        }
    };
    let sizes = Sizes {
        memory_mib: request.memory_mib.unwrap_or(limits.default_memory_mib),
        vcpus: request.vcpus.unwrap_or(limits.default_vcpus),
        ttl_s: request.ttl_s.unwrap_or(limits.default_ttl_s),
    };
    within("memory_mib", sizes.memory_mib, 16, limits.max_memory_mib)?;
    within(
        "vcpus",
        u64::from(sizes.vcpus),
        1,
        u64::from(limits.max_vcpus),
    )?;
    within("ttl_s", sizes.ttl_s, 1, limits.max_ttl_s)?;
    check_env(&request.env, "env")?;
    if let Some(hostname) = &request.hostname {
        contract::hostname::check(hostname)
            .map_err(|why| CreateError::Invalid(format!("hostname: {why}")))?;
    }
    if let Some(disk_mib) = request.disk_mib {
        if disk_mib < MIN_DISK_MIB {
            return Err(CreateError::Invalid(format!(
                "disk_mib: must be at least {MIN_DISK_MIB}, got {disk_mib}"
            )));
        }
    }
    Ok(sizes)
}

/// A create request's `sysctls`, checked: namespaced settings only, on the namespace backend.
fn check_sysctls(
    request: &CreateSandbox,
    kind: BackendKind,
    caps: Capabilities,
) -> Result<Vec<Sysctl>, CreateError> {
    if request.sysctls.is_empty() {
        return Ok(Vec::new());
    }
    if !caps.sysctls {
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
            let sysctl = Sysctl {
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

/// The network step: the host network namespace a namespace sandbox joins, or the pod's a
/// microVM's connections leave from (the VM has no network device to link to it); neither
/// for a sandbox with a network of its own.
pub(crate) fn place_network(
    kind: BackendKind,
    caps: Capabilities,
    request: &CreateSandbox,
    sysctls: &[Sysctl],
) -> Result<NetworkPlacement, CreateError> {
    let Some(path) = &request.network_namespace else {
        return Ok(NetworkPlacement::default());
    };
    if request.network.is_some() {
        return Err(CreateError::Invalid(
            "network_namespace: a sandbox in a host network namespace reaches the network \
             through it, not through the egress proxy: leave out `network`"
                .into(),
        ));
    }
    let host = path == api_types::HOST_NETWORK_NAMESPACE;
    if !host && caps.pod_network_through_proxy {
        let sockets = PodSockets::open(std::path::Path::new(path))
            .map_err(|e| CreateError::Invalid(report::chain(&e)))?;
        return Ok(NetworkPlacement {
            joins: None,
            pod: Some(Arc::new(sockets)),
        });
    }
    if !caps.host_network_namespace {
        return Err(CreateError::Invalid(format!(
            "network_namespace: the {kind} backend joins no host network namespace (the \
             namespace backend does; a microVM takes a pod's, never the host's)"
        )));
    }
    if host {
        if let Some(sysctl) = sysctls.iter().find(|s| s.is_network()) {
            return Err(CreateError::Invalid(format!(
                "sysctls: {} would set the host's own network settings: a sandbox on the \
                 host's network (network_namespace \"host\") takes no net.* sysctl",
                sysctl.name
            )));
        }
        return Ok(NetworkPlacement {
            joins: Some(PathBuf::from(::namespace::netns::HOST)),
            pod: None,
        });
    }
    let path = PathBuf::from(path);
    // Checked here for a clear 400; the supervisor checks what it opens again.
    ::namespace::netns::open_checked(&path).map_err(|e| CreateError::Invalid(report::chain(&e)))?;
    Ok(NetworkPlacement {
        joins: Some(path),
        pod: None,
    })
}

/// What of a request backend `kind` cannot give, refused naming it (the process backend runs
/// a command and nothing more: no containers, storage, network or imported image).
pub(crate) fn check_backend_features(
    kind: BackendKind,
    caps: Capabilities,
    request: &CreateSandbox,
    imported_image: bool,
) -> Result<(), CreateError> {
    if !caps.containers && (!request.containers.is_empty() || !request.shared.is_empty()) {
        return Err(CreateError::Invalid(format!(
            "containers: the {kind} backend runs no containers (ask for \"backend\": \
             \"namespace\" or \"microvm\")"
        )));
    }
    let storage: Vec<&str> = [
        (request.disk_mib.is_some(), "disk_mib"),
        (!request.caches.is_empty(), "caches"),
        (!request.volumes.is_empty(), "volumes"),
    ]
    .into_iter()
    .filter_map(|(asked, name)| (asked && !caps.storage).then_some(name))
    .collect();
    if !storage.is_empty() {
        return Err(CreateError::Invalid(format!(
            "{} {} not available on the {kind} backend yet (use the namespace backend)",
            storage.join(", "),
            if storage.len() == 1 { "is" } else { "are" },
        )));
    }
    if !caps.egress
        && request
            .network
            .as_ref()
            .is_some_and(|n| !n.allow.is_empty())
    {
        return Err(CreateError::Invalid(format!(
            "network is not available on the {kind} backend yet (use the namespace backend)"
        )));
    }
    if imported_image && !caps.imported_images {
        return Err(CreateError::Invalid(format!(
            "image: imported images are not available on the {kind} backend (use the \
             namespace or microvm backend)"
        )));
    }
    Ok(())
}

/// Every cache and volume mount point, checked as a set, and inside the image where the
/// backend makes them there (`main_root`).
fn check_storage_targets(
    request: &CreateSandbox,
    main_root: Option<&std::path::Path>,
    image: &str,
) -> Result<(), CreateError> {
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
            check_in_image(root, image, what, path.trim_end_matches('/'))?;
        }
    }
    Ok(())
}

/// Whether a warm pool may serve the request: only one asking for nothing of its own beyond
/// an image, a backend and sizes (a pooled instance was made before anyone asked).
fn is_poolable(
    request: &CreateSandbox,
    plan: &Plan,
    image: &ChosenImage,
    placement: &NetworkPlacement,
    sysctls: &[Sysctl],
) -> bool {
    plan.policy.is_none()
        && request.containers.is_empty()
        && request.shared.is_empty()
        && plan.container_slots == 0
        && image.imported.is_none()
        && request.user.is_none()
        && request.caches.is_empty()
        && request.volumes.is_empty()
        && request.disk_mib.is_none()
        && !request.share_process_namespace
        && request.hostname.is_none()
        && placement.joins.is_none()
        && placement.pod.is_none()
        && sysctls.is_empty()
}

/// The spec step: what the backend is asked to make, from the request and what the storage
/// step provided (taken out of `provided`: its disks and mounts go to the instance).
fn instance_spec(
    id: &str,
    request: &CreateSandbox,
    sizes: Sizes,
    provided: &mut Provided,
) -> InstanceSpec {
    InstanceSpec {
        id: id.to_string(),
        hostname: request.hostname.clone().unwrap_or_else(|| id.to_string()),
        memory_mib: sizes.memory_mib,
        vcpus: sizes.vcpus,
        env: request.env.clone(),
        disk: provided.disk.take(),
        mounts: std::mem::take(&mut provided.mounts),
        egress: None,
        root: provided.root.take(),
        containers: Vec::new(),
        container_disks: std::mem::take(&mut provided.container_disks),
        shared: Vec::new(),
        container_slots: 0,
        network_namespace: None,
        sysctls: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backends, BoxFuture};

    const NAMESPACE: (BackendKind, Capabilities) = (
        BackendKind::Namespace,
        crate::backend::namespace::CAPABILITIES,
    );
    const MICROVM: (BackendKind, Capabilities) =
        (BackendKind::Microvm, crate::backend::microvm::CAPABILITIES);
    const PROCESS: (BackendKind, Capabilities) = (BackendKind::Process, Capabilities::NONE);
    use crate::settings::EngineConfig;
    use std::sync::atomic::AtomicUsize;
    use tokio::sync::watch;

    fn request() -> CreateSandbox {
        CreateSandbox::default()
    }

    fn invalid(result: Result<impl std::fmt::Debug, CreateError>) -> String {
        match result {
            Err(CreateError::Invalid(why)) => why,
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn validate_fills_the_defaults_and_names_each_field_out_of_bounds() {
        let limits = Limits::default();
        let sizes = validate(&limits, &request()).expect("the defaults fit");
        assert_eq!(
            sizes,
            Sizes {
                memory_mib: limits.default_memory_mib,
                vcpus: limits.default_vcpus,
                ttl_s: limits.default_ttl_s,
            }
        );
        for (bad, field) in [
            (
                CreateSandbox {
                    memory_mib: Some(8),
                    ..request()
                },
                "memory_mib: must be between 16",
            ),
            (
                CreateSandbox {
                    vcpus: Some(0),
                    ..request()
                },
                "vcpus: must be between 1",
            ),
            (
                CreateSandbox {
                    ttl_s: Some(limits.max_ttl_s + 1),
                    ..request()
                },
                "ttl_s: must be between 1",
            ),
            (
                CreateSandbox {
                    disk_mib: Some(MIN_DISK_MIB - 1),
                    ..request()
                },
                "disk_mib: must be at least",
            ),
            (
                CreateSandbox {
                    hostname: Some("-no".into()),
                    ..request()
                },
                "hostname:",
            ),
            (
                CreateSandbox {
                    env: [("A=B".to_string(), "x".to_string())].into(),
                    ..request()
                },
                "env.",
            ),
        ] {
            let why = invalid(validate(&limits, &bad));
            assert!(why.starts_with(field), "{field}: {why}");
        }
    }

    #[test]
    fn sysctls_are_the_namespace_backends_only_and_bounded() {
        let mut asked = request();
        asked.sysctls = [("net.ipv4.ip_forward".to_string(), "1".to_string())].into();
        assert_eq!(
            check_sysctls(&asked, NAMESPACE.0, NAMESPACE.1)
                .expect("namespaced")
                .len(),
            1
        );
        assert!(invalid(check_sysctls(&asked, MICROVM.0, MICROVM.1)).contains("microvm"));
        asked.sysctls = (0..=MAX_SYSCTLS)
            .map(|i| (format!("net.ipv4.conf.eth{i}.forwarding"), "1".to_string()))
            .collect();
        assert!(invalid(check_sysctls(&asked, NAMESPACE.0, NAMESPACE.1)).contains("at most 64"));
    }

    #[test]
    fn the_network_step_places_each_backend_or_says_why_not() {
        let none = place_network(MICROVM.0, MICROVM.1, &request(), &[]).expect("no namespace");
        assert!(none.joins.is_none() && none.pod.is_none());
        let host = CreateSandbox {
            network_namespace: Some(api_types::HOST_NETWORK_NAMESPACE.into()),
            ..request()
        };
        let joined = place_network(NAMESPACE.0, NAMESPACE.1, &host, &[]).expect("host");
        assert_eq!(
            joined.joins.as_deref(),
            Some(std::path::Path::new(::namespace::netns::HOST))
        );
        let net_sysctl = Sysctl {
            name: "net.ipv4.ip_forward".into(),
            value: "1".into(),
        };
        assert!(invalid(place_network(
            NAMESPACE.0,
            NAMESPACE.1,
            &host,
            std::slice::from_ref(&net_sysctl)
        ))
        .contains("the host's own network settings"));
        for (kind, caps) in [MICROVM, PROCESS] {
            assert!(invalid(place_network(kind, caps, &host, &[]))
                .contains("joins no host network namespace"));
        }
        let both = CreateSandbox {
            network: Some(api_types::NetworkRequest {
                allow: vec!["example.com:443".into()],
            }),
            ..host.clone()
        };
        assert!(invalid(place_network(NAMESPACE.0, NAMESPACE.1, &both, &[]))
            .contains("leave out `network`"));
        let missing = CreateSandbox {
            network_namespace: Some("/no/such/netns".into()),
            ..request()
        };
        invalid(place_network(MICROVM.0, MICROVM.1, &missing, &[]));
        invalid(place_network(NAMESPACE.0, NAMESPACE.1, &missing, &[]));
    }

    #[test]
    fn the_process_backend_refuses_what_it_cannot_give_naming_it() {
        let storage = CreateSandbox {
            disk_mib: Some(128),
            caches: vec![api_types::CacheMount {
                name: "cargo".into(),
                path: "/cache".into(),
                size_mib: None,
                save: Default::default(),
            }],
            ..request()
        };
        let why = invalid(check_backend_features(
            PROCESS.0, PROCESS.1, &storage, false,
        ));
        assert!(
            why.starts_with("disk_mib, caches are not available"),
            "{why}"
        );
        let network = CreateSandbox {
            network: Some(api_types::NetworkRequest {
                allow: vec!["example.com:443".into()],
            }),
            ..request()
        };
        assert!(invalid(check_backend_features(
            PROCESS.0, PROCESS.1, &network, false
        ))
        .starts_with("network"));
        assert!(invalid(check_backend_features(
            PROCESS.0,
            PROCESS.1,
            &request(),
            true
        ))
        .starts_with("image:"));
        for (kind, caps) in [NAMESPACE, MICROVM] {
            check_backend_features(kind, caps, &storage, true).expect("the others give it");
        }
    }

    /// The built-in image (an imported one needs a store).
    fn chosen() -> ChosenImage {
        ChosenImage {
            name: DEFAULT_IMAGE.into(),
            imported: None,
            accounts: Arc::new(ExecAccounts {
                root: PathBuf::from("/nonexistent"),
                image_sets_home: false,
            }),
            defaults: None,
        }
    }

    #[test]
    fn only_a_request_for_nothing_of_its_own_is_poolable() {
        let plan = || Plan {
            containers: ContainersPlan::default(),
            container_slots: 0,
            policy: None,
        };
        let bare = request();
        let image = chosen();
        let placed = NetworkPlacement::default();
        assert!(is_poolable(&bare, &plan(), &image, &placed, &[]));
        let sized = CreateSandbox {
            memory_mib: Some(256),
            vcpus: Some(2),
            ..request()
        };
        assert!(
            is_poolable(&sized, &plan(), &image, &placed, &[]),
            "sizes are a shape"
        );
        for own in [
            CreateSandbox {
                hostname: Some("ci".into()),
                ..request()
            },
            CreateSandbox {
                user: Some("1000".into()),
                ..request()
            },
            CreateSandbox {
                disk_mib: Some(128),
                ..request()
            },
            CreateSandbox {
                share_process_namespace: true,
                ..request()
            },
        ] {
            assert!(!is_poolable(&own, &plan(), &image, &placed, &[]), "{own:?}");
        }
        let with_slots = Plan {
            container_slots: 1,
            ..plan()
        };
        assert!(!is_poolable(&bare, &with_slots, &image, &placed, &[]));
        let joined = NetworkPlacement {
            joins: Some(PathBuf::from(::namespace::netns::HOST)),
            pod: None,
        };
        assert!(!is_poolable(&bare, &plan(), &image, &joined, &[]));
    }

    #[test]
    fn the_spec_takes_what_storage_claimed_and_names_the_host_after_the_id() {
        let mut provided = Provided {
            held: SandboxStorage::default(),
            disk: Some(PathBuf::from("/var/scratch.ext4")),
            mounts: vec![MountSpec {
                source: MountSource::Directory(PathBuf::from("/vol")),
                target: "/data".into(),
                read_only: true,
            }],
            root: None,
            container_disks: vec![PathBuf::from("/c0.ext4")],
        };
        let sizes = Sizes {
            memory_mib: 256,
            vcpus: 2,
            ttl_s: 60,
        };
        let spec = instance_spec("sb-0123456789abcdef", &request(), sizes, &mut provided);
        assert_eq!(spec.hostname, "sb-0123456789abcdef");
        assert_eq!((spec.memory_mib, spec.vcpus), (256, 2));
        assert_eq!(
            spec.disk.as_deref(),
            Some(std::path::Path::new("/var/scratch.ext4"))
        );
        assert_eq!(spec.mounts.len(), 1);
        assert_eq!(spec.container_disks.len(), 1);
        assert!(provided.disk.is_none() && provided.mounts.is_empty());
        let named = CreateSandbox {
            hostname: Some("builder".into()),
            ..request()
        };
        assert_eq!(
            instance_spec("sb-1", &named, sizes, &mut provided).hostname,
            "builder"
        );
    }

    /// A backend made for these tests: an instance is a value, no process at all. It claims
    /// the process backend's kind, the only thing it shares with it.
    struct ToyBackend {
        fail: bool,
        caps: Capabilities,
        made: AtomicUsize,
        /// The kernel settings of each spec it was asked to make.
        sysctls_seen: std::sync::Mutex<Vec<String>>,
    }

    struct ToyInstance {
        hello: wire::agent::Hello,
        exited: watch::Receiver<Option<String>>,
        _exit: watch::Sender<Option<String>>,
    }

    impl Instance for ToyInstance {
        fn hello(&self) -> &wire::agent::Hello {
            &self.hello
        }
        fn connect(&self) -> BoxFuture<'_, std::io::Result<tokio::net::UnixStream>> {
            Box::pin(async { Err(std::io::Error::other("a toy has no agent")) })
        }
        fn exited(&self) -> watch::Receiver<Option<String>> {
            self.exited.clone()
        }
        fn destroy(&self) -> BoxFuture<'_, ()> {
            Box::pin(async {})
        }
    }

    impl Backend for ToyBackend {
        fn kind(&self) -> BackendKind {
            BackendKind::Process
        }
        fn capabilities(&self) -> Capabilities {
            self.caps
        }
        fn unavailable_reason(&self) -> Option<String> {
            None
        }
        fn create(
            &self,
            spec: InstanceSpec,
        ) -> BoxFuture<'_, Result<Box<dyn Instance>, BackendError>> {
            self.made.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut seen) = self.sysctls_seen.lock() {
                seen.extend(
                    spec.sysctls
                        .iter()
                        .map(|s| format!("{}={}", s.name, s.value)),
                );
            }
            let fail = self.fail;
            Box::pin(async move {
                if fail {
                    return Err(BackendError::NotReady(format!(
                        "{} never said hello",
                        spec.id
                    )));
                }
                let (exit, exited) = watch::channel(None);
                Ok(Box::new(ToyInstance {
                    hello: wire::agent::Hello {
                        agent_version: "toy".into(),
                        protocol: wire::agent::PROTOCOL_VERSION,
                        kernel_release: String::new(),
                        uptime_ms: 0,
                        pid: 1,
                    },
                    exited,
                    _exit: exit,
                }) as Box<dyn Instance>)
            })
        }
    }

    fn engine(fail: bool) -> (Engine, tempfile::TempDir) {
        let (engine, _, dir) = engine_with(fail, Capabilities::NONE);
        (engine, dir)
    }

    fn engine_with(fail: bool, caps: Capabilities) -> (Engine, Arc<ToyBackend>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = EngineConfig::new(dir.path().join("image"));
        config.state_dir = dir.path().join("state");
        config.live_restore = false;
        config.limits.max_sandboxes = 1;
        let toy = Arc::new(ToyBackend {
            fail,
            caps,
            made: AtomicUsize::new(0),
            sysctls_seen: Default::default(),
        });
        let backend: Arc<dyn Backend> = toy.clone();
        (
            Engine::with_backends(config, Backends::new(vec![backend])),
            toy,
            dir,
        )
    }

    #[tokio::test]
    async fn the_steps_follow_what_a_backend_can_do_never_its_kind() {
        let asking = || CreateSandbox {
            sysctls: [("net.ipv4.ip_forward".to_string(), "1".to_string())].into(),
            ..request()
        };
        // The same kind, first without kernel settings, then declaring them.
        let (plain, plain_toy, _a) = engine_with(false, Capabilities::NONE);
        let why = invalid(plain.create_sandbox(asking(), Owner::Unix).await);
        assert!(
            why.contains("the process backend sets no kernel settings"),
            "{why}"
        );
        assert_eq!(
            plain_toy.made.load(Ordering::Relaxed),
            0,
            "refused before launch"
        );
        let caps = Capabilities {
            sysctls: true,
            ..Capabilities::NONE
        };
        let (able, able_toy, _b) = engine_with(false, caps);
        able.create_sandbox(asking(), Owner::Unix)
            .await
            .expect("a backend that sets them is given them");
        assert_eq!(
            *able_toy.sysctls_seen.lock().expect("lock"),
            ["net.ipv4.ip_forward=1"]
        );
    }

    #[tokio::test]
    async fn a_create_runs_every_step_and_lists_the_sandbox_under_the_cap() {
        let (engine, _dir) = engine(false);
        let info = engine
            .create_sandbox(
                CreateSandbox {
                    labels: [("job".to_string(), "42".to_string())].into(),
                    ..request()
                },
                Owner::Unix,
            )
            .await
            .expect("created");
        assert_eq!(info.backend, BackendKind::Process);
        assert_eq!(info.labels.get("job").map(String::as_str), Some("42"));
        assert_eq!(engine.registry.list().len(), 1);
        assert_eq!(engine.metrics.sandboxes_created.load(Ordering::Relaxed), 1);
        // The cap is 1: the next one is refused before its backend is asked.
        let refused = engine.create_sandbox(request(), Owner::Unix).await;
        assert!(
            matches!(
                refused,
                Err(CreateError::Sandbox(SandboxError::AtCapacity(1)))
            ),
            "{refused:?}"
        );
        assert!(engine.registry.remove(&info.id).await);
        engine
            .create_sandbox(request(), Owner::Unix)
            .await
            .expect("its place is free again");
    }

    #[tokio::test]
    async fn a_backend_that_fails_is_counted_and_gives_its_place_back() {
        let (engine, _dir) = engine(true);
        let failed = engine.create_sandbox(request(), Owner::Unix).await;
        match failed {
            Err(CreateError::Failed { id, source }) => {
                assert!(id.starts_with("sb-"), "{id}");
                assert!(source.to_string().contains("never said hello"), "{source}");
            }
            other => panic!("{other:?}"),
        }
        assert!(engine.registry.list().is_empty());
        assert_eq!(engine.metrics.sandboxes_failed.load(Ordering::Relaxed), 1);
        // The reservation was dropped with the failure: the cap of 1 still admits one.
        let again = engine.create_sandbox(request(), Owner::Unix).await;
        assert!(
            matches!(again, Err(CreateError::Failed { .. })),
            "{again:?}"
        );
    }
}
