//! Sandboxes and their registry: lifecycle state, exec admission, TTL and idle expiry.

pub mod containers;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use api_types::{BackendKind, SandboxInfo, SandboxState, SandboxTimings};
use tokio::net::UnixStream;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::agent::AgentError;
use crate::backend::Instance;
use crate::owner::{Caller, Owner};
use crate::storage::SandboxStorage;
use containers::Container;

/// Why a sandbox (or the registry) refused a request. The HTTP edge maps each to a status
/// (`error.rs`), the WebSocket to a close code (`ws.rs`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    /// Not the shape of a sandbox id.
    #[error("{0:?} is not a sandbox id (expected sb- and 16 hex digits)")]
    InvalidId(String),
    /// No such sandbox, or not the caller's (the two are indistinguishable on purpose).
    #[error("no sandbox with id {0:?}")]
    NotFound(String),
    /// It died; the reason is the backend's.
    #[error("sandbox {id} is dead: {reason}")]
    Dead {
        /// The sandbox.
        id: String,
        /// Why it died.
        reason: String,
    },
    /// It is being created or deleted.
    #[error("sandbox {id} is {state}")]
    NotRunning {
        /// The sandbox.
        id: String,
        /// Its state, as the API names it.
        state: String,
    },
    /// It already runs as many commands as it may.
    #[error("sandbox {id} already runs {limit} commands, its limit")]
    ExecLimit {
        /// The sandbox.
        id: String,
        /// The limit.
        limit: usize,
    },
    /// The daemon runs as many sandboxes as it may.
    #[error("the daemon already runs {0} sandboxes, its limit")]
    AtCapacity(usize),
    /// The daemon is stopping.
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// It has no container of that name.
    #[error("sandbox {id} has no container {name:?}")]
    NoContainer {
        /// The sandbox.
        id: String,
        /// The name asked for.
        name: String,
    },
    /// Removing `main`, the sandbox's own root, as if it were a container.
    #[error(
        "\"main\" is the sandbox's own root, not a container that can be removed: delete the \
         sandbox instead"
    )]
    OwnRootNotRemovable,
}

/// Why a running sandbox's limits were not changed.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// A value is out of its bounds; the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// Its backend (or its state) cannot take the change.
    #[error("sandbox {id}: {why}")]
    Refused {
        /// The sandbox.
        id: String,
        /// Why not.
        why: String,
    },
}

/// Why a container was not added to a running sandbox.
#[derive(Debug, thiserror::Error)]
pub enum AddContainerError {
    /// The request asks for something invalid; the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// The sandbox cannot be used (not found, …).
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// Its image cannot be had (not imported, not the owner's).
    #[error(transparent)]
    Storage(#[from] crate::storage::StorageError),
    /// The sandbox is stopping or dead.
    #[error("sandbox {0} is not running")]
    NotRunning(String),
    /// A container of that name runs in it.
    #[error("sandbox {id} already has a container {name:?}: remove it first")]
    Exists {
        /// The sandbox.
        id: String,
        /// The name.
        name: String,
    },
    /// It holds as many containers as a sandbox may.
    #[error(
        "sandbox {id} already has {} containers, the most a sandbox may hold (remove one \
         first)",
        containers::MAX_CONTAINERS
    )]
    Full {
        /// The sandbox.
        id: String,
    },
    /// A microVM sandbox has no empty disk left for another container.
    #[error(
        "sandbox {id} has no room for another container: a microVM's disks are fixed when it \
         boots, and the {slots} it was created with for added containers (\"container_slots\") \
         are all in use (remove a container to free one)"
    )]
    NoSlot {
        /// The sandbox.
        id: String,
        /// How many slots it was created with.
        slots: usize,
    },
    /// The backend could not make it.
    #[error("adding container {name:?} to sandbox {id}: {reason}")]
    Failed {
        /// The sandbox.
        id: String,
        /// The container.
        name: String,
        /// What failed.
        reason: String,
    },
    /// It was made but did not become ready; it stays (failed or exited) until it is removed.
    #[error("sandbox {id}: {reason}")]
    NotReady {
        /// The sandbox.
        id: String,
        /// Which container, why, and the end of its log.
        reason: String,
    },
}

pub(crate) use crate::ids::{is_valid_id, new_id, unix_ms};

/// Settings a sandbox was created with.
#[derive(Debug, Clone)]
pub(crate) struct SandboxSettings {
    /// Backend running it.
    pub(crate) backend: BackendKind,
    /// Image name.
    pub(crate) image: String,
    /// An imported image's tree (its chain digest's hex), which a restarted daemon checks
    /// the image of that name still is; `None` for the built-in image.
    pub(crate) image_root: Option<String>,
    /// Memory limit.
    pub(crate) memory_mib: u64,
    /// vCPUs.
    pub(crate) vcpus: u32,
    /// Lifetime.
    pub(crate) ttl: Duration,
    /// Idle timeout.
    pub(crate) idle: Duration,
    /// Labels.
    pub(crate) labels: BTreeMap<String, String>,
    /// Environment for every command (under each request's own `env`).
    pub(crate) env: BTreeMap<String, String>,
    /// Most concurrent execs.
    pub(crate) max_execs: usize,
    /// Output bytes the agent keeps per command for a re-attach.
    pub(crate) exec_tail_bytes: u64,
    /// The key that created it (or the Unix socket); only it, the admin key and the Unix
    /// socket can see or use it.
    pub(crate) owner: Owner,
    /// Its caches, as asked for.
    pub caches: Vec<api_types::CacheMount>,
    /// Its volumes, as asked for.
    pub volumes: Vec<api_types::VolumeMount>,
    /// The size of its disk-backed writable layer.
    pub(crate) disk_mib: Option<u64>,
    /// Whether its root and its containers share one PID namespace.
    pub(crate) share_process_namespace: bool,
    /// Its hostname, when the request gave one.
    pub(crate) hostname: Option<String>,
    /// Its egress, when it has any.
    pub(crate) network: Option<SandboxNetwork>,
    /// Its imported image's config (`Env`, `WorkingDir`, `User`), the defaults of every
    /// command; `None` for the built-in image.
    pub(crate) image_defaults: Option<Arc<oci::defaults::Defaults>>,
    /// Where a command's own `user` is looked up.
    pub(crate) accounts: Arc<ExecAccounts>,
}

/// The account files a sandbox's users are resolved against: its image's tree, as it was
/// imported (an account added inside the sandbox later is not seen; a numeric `uid:gid`
/// always works).
#[derive(Debug, Clone)]
pub(crate) struct ExecAccounts {
    /// The image's root tree.
    pub root: std::path::PathBuf,
    /// Whether the image's `Env` sets `HOME` (then a user's home does not replace it).
    pub(crate) image_sets_home: bool,
}

impl ExecAccounts {
    /// Resolves `spec` (`uid`, `uid:gid`, `name`, `name:group`) as `docker --user` does.
    pub(crate) fn resolve(
        &self,
        spec: &str,
    ) -> Result<oci::defaults::User, oci::defaults::DefaultsError> {
        oci::defaults::user(spec, &self.root)
    }

    /// The gids of `groups` (numbers or the image's group names), as `docker --group-add`.
    pub(crate) fn group_ids(
        &self,
        groups: &[String],
    ) -> Result<Vec<u32>, oci::defaults::DefaultsError> {
        oci::defaults::group_ids(groups, &self.root)
    }
}

/// A sandbox's egress: what it may reach and what went through its proxy.
#[derive(Debug, Clone)]
pub(crate) struct SandboxNetwork {
    /// Its allowlist as asked for.
    pub(crate) allow: Vec<String>,
    /// Whether its connections leave from a pod's network namespace, with no allowlist (a
    /// microVM given `network_namespace`).
    pub(crate) in_pod: bool,
    /// Its proxy's counters.
    pub(crate) counters: Arc<crate::egress::EgressCounters>,
}

impl SandboxNetwork {
    /// The API's view of it.
    pub(crate) fn info(&self) -> api_types::NetworkInfo {
        let stats = self.counters.snapshot();
        api_types::NetworkInfo {
            allow: self.allow.clone(),
            proxy: contract::egress::proxy_url(),
            connections: stats.connections,
            denied: stats.denied,
            bytes_out: stats.bytes_out,
            bytes_in: stats.bytes_in,
            refused: self
                .counters
                .refused()
                .into_iter()
                .map(|r| api_types::EgressRefusal {
                    destination: r.destination,
                    reason: r.reason,
                    count: r.count,
                })
                .collect(),
        }
    }
}

#[derive(Debug)]
struct Status {
    state: SandboxState,
    error: String,
    last_activity: Instant,
}

/// One sandbox.
pub struct Sandbox {
    /// Its id.
    pub id: String,
    settings: SandboxSettings,
    created: Instant,
    created_at_ms: u64,
    timings: SandboxTimings,
    instance: Box<dyn Instance>,
    status: Mutex<Status>,
    exec_slots: Arc<Semaphore>,
    active_execs: AtomicU32,
    activity: Notify,
    /// Its caches and disk-backed layer, released once it is destroyed.
    storage: Mutex<Option<SandboxStorage>>,
    /// Its containers besides its own root, in the order they were made; a removed one
    /// leaves the list (and with it its log) once its agent has ended.
    containers: std::sync::RwLock<Vec<Arc<Container>>>,
    /// Whether it ever had a container: a removed one leaves its layer in the scratch and
    /// its index used, which a restarted daemon could not know.
    had_containers: AtomicBool,
    /// The index the next container added gets: one lock makes additions one at a time.
    next_container: tokio::sync::Mutex<usize>,
    /// Its limits now (`settings` has them as created; `PATCH` changes these), one lock
    /// making changes one at a time.
    limits: tokio::sync::Mutex<(u64, u32)>,
    /// The same, for readers that must not wait.
    limits_now: std::sync::Mutex<(u64, u32)>,
    /// A microVM pod's inbound connections, closed before it is destroyed.
    inbound: Mutex<Option<crate::pod_inbound::PodInbound>>,
}

impl crate::pod_inbound::AgentDialer for Sandbox {
    fn ask(&self, request: wire::agent::AgentRequest) -> crate::pod_inbound::AgentAnswer<'_> {
        Box::pin(async move {
            self.ask_agent(&request)
                .await
                .map_err(|e| report::chain(&e))
        })
    }
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Held for the duration of one exec or file transfer.
#[derive(Debug)]
pub struct ActivityGuard {
    sandbox: Arc<Sandbox>,
    /// The container it runs in; `None`: the sandbox's own root.
    container: Option<Arc<Container>>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        self.sandbox.active_execs.fetch_sub(1, Ordering::Relaxed);
        self.sandbox.touch();
    }
}

impl ActivityGuard {
    /// The sandbox this activity runs in.
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    /// The container it runs in; `None`: the sandbox's own root.
    pub fn container(&self) -> Option<&Arc<Container>> {
        self.container.as_ref()
    }

    /// A new connection to the agent of the root it runs in, with `message` sent on it.
    pub async fn send_to_agent(
        &self,
        message: &wire::agent::AgentRequest,
    ) -> Result<UnixStream, AgentError> {
        match &self.container {
            Some(container) => {
                // The sandbox's own root can stop a container's agent (its PID namespace is a
                // child of root's), and a stopped agent still has its connections accepted by
                // the kernel: an exec sent to it would wait for ever. It must answer a ping
                // within the agent deadline first; the request follows at once.
                match self
                    .sandbox
                    .ask_agent_in(Some(container), &wire::agent::AgentRequest::Ping)
                    .await?
                {
                    (wire::agent::AgentReply::Pong(_), _) => {}
                    (other, _) => {
                        return Err(AgentError::Stream(format!(
                            "container {}'s agent answered a ping with {other:?}",
                            container.name
                        )))
                    }
                }
                self.sandbox.send_to_container(container, message).await
            }
            None => self.sandbox.send_to_agent(message).await,
        }
    }
}

impl Sandbox {
    /// A running sandbox around a ready instance.
    pub(crate) fn new(
        id: String,
        settings: SandboxSettings,
        instance: Box<dyn Instance>,
        create_to_ready: Duration,
        storage: SandboxStorage,
    ) -> Self {
        let timings = SandboxTimings {
            create_to_ready_ms: create_to_ready.as_secs_f64() * 1000.0,
            agent_uptime_ms: instance.hello().uptime_ms,
        };
        let settings_limits = (settings.memory_mib, settings.vcpus);
        Sandbox {
            id,
            exec_slots: Arc::new(Semaphore::new(settings.max_execs)),
            settings,
            created: Instant::now(),
            created_at_ms: unix_ms(),
            timings,
            instance,
            status: Mutex::new(Status {
                state: SandboxState::Running,
                error: String::new(),
                last_activity: Instant::now(),
            }),
            active_execs: AtomicU32::new(0),
            activity: Notify::new(),
            storage: Mutex::new(Some(storage)),
            containers: std::sync::RwLock::default(),
            had_containers: AtomicBool::new(false),
            next_container: tokio::sync::Mutex::new(0),
            limits: tokio::sync::Mutex::new((settings_limits.0, settings_limits.1)),
            limits_now: std::sync::Mutex::new(settings_limits),
            inbound: Mutex::new(None),
        }
    }

    /// Makes `inbound` its pod's inbound connections, closed when it is destroyed.
    pub(crate) fn set_inbound(&self, inbound: crate::pod_inbound::PodInbound) {
        *self.inbound.lock().unwrap_or_else(|p| p.into_inner()) = Some(inbound);
    }

    /// Its memory (MiB) and CPU limits now.
    pub fn limits_now(&self) -> (u64, u32) {
        *self.limits_now.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives it new limits while it runs (`None` keeps one), one change at a time; why not,
    /// where its backend cannot.
    pub(crate) async fn set_limits(
        &self,
        memory_mib: Option<u64>,
        vcpus: Option<u32>,
    ) -> Result<(), String> {
        let mut limits = self.limits.lock().await;
        if !self.is_running() {
            return Err(format!("sandbox {} is not running", self.id));
        }
        self.instance.set_limits(memory_mib, vcpus).await?;
        *limits = (memory_mib.unwrap_or(limits.0), vcpus.unwrap_or(limits.1));
        *self.limits_now.lock().unwrap_or_else(|p| p.into_inner()) = *limits;
        Ok(())
    }

    /// This sandbox with its containers.
    pub(crate) fn with_containers(mut self, containers: Vec<Arc<Container>>) -> Self {
        self.next_container = tokio::sync::Mutex::new(containers.len());
        self.had_containers = AtomicBool::new(!containers.is_empty());
        self.containers = std::sync::RwLock::new(containers);
        self
    }

    fn all_containers(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Container>>> {
        self.containers.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Its containers besides its own root, removed ones left out.
    pub fn containers(&self) -> Vec<Arc<Container>> {
        self.all_containers()
            .iter()
            .filter(|c| !c.is_removed())
            .cloned()
            .collect()
    }

    /// Its container `name`, unless it was removed.
    pub fn container(&self, name: &str) -> Option<Arc<Container>> {
        self.all_containers()
            .iter()
            .find(|c| c.name == name && !c.is_removed())
            .cloned()
    }

    /// Adds container `plan` to it, running, made as `root` says (its image tree: a microVM
    /// takes its ext4 snapshot, `disk`; `lease` holds an imported one while the sandbox
    /// lives), with `shared` mounted; returns it once it is ready. One that does not become ready stays
    /// (failed, its log readable) until removed.
    /// Whether every container joins its own root's PID namespace (`share_process_namespace`
    /// at creation).
    pub(crate) fn shares_process_namespace(&self) -> bool {
        self.settings.share_process_namespace
    }

    pub(crate) async fn add_container(
        self: &Arc<Self>,
        plan: containers::ContainerPlan,
        root: &namespace::ContainerRoot,
        disk: Option<&std::path::Path>,
        shared: &[wire::agent::SharedDir],
        host_paths: &[namespace::HostPathMount],
        lease: Option<oci::ImageLease>,
    ) -> Result<Arc<Container>, AddContainerError> {
        let mut next = self.next_container.lock().await;
        if !self.is_running() {
            return Err(AddContainerError::NotRunning(self.id.clone()));
        }
        if self.container(&plan.name).is_some() {
            return Err(AddContainerError::Exists {
                id: self.id.clone(),
                name: plan.name,
            });
        }
        if self.containers().len() >= containers::MAX_CONTAINERS {
            return Err(AddContainerError::Full {
                id: self.id.clone(),
            });
        }
        let index = *next;
        if let Some((0, slots)) = self.instance.container_room() {
            return Err(AddContainerError::NoSlot {
                id: self.id.clone(),
                slots,
            });
        }
        *next += 1;
        self.had_containers.store(true, Ordering::Release);
        self.instance
            .add_container(index, root, disk, shared, host_paths)
            .await
            .map_err(|reason| AddContainerError::Failed {
                id: self.id.clone(),
                name: plan.name.clone(),
                reason,
            })?;
        if let Some(lease) = lease {
            if let Some(storage) = self
                .storage
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
            {
                // One lease per image is enough: a container added and removed in a loop
                // must not grow the list.
                let held = &storage.container_images;
                if !held.iter().any(|h| h.holds_the_same_as(&lease)) {
                    storage.container_images.push(lease);
                }
            }
        }
        let container = Arc::new(Container::new(index, plan));
        self.containers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(container.clone());
        drop(next);
        containers::start_one(self, &container)
            .await
            .map_err(|reason| AddContainerError::NotReady {
                id: self.id.clone(),
                reason,
            })?;
        Ok(container)
    }

    /// Removes its container `name`, as `kubectl` removes a pod's container: its agent, PID 1
    /// of the container's PID namespace, ends, so the kernel kills every process of the
    /// container with it, and its mount namespace goes; its name answers 404 from then on.
    /// Its writable layer stays in the sandbox's scratch until the sandbox is deleted; the
    /// daemon forgets it (its log, its agent's socket), so that adding and removing containers
    /// in a loop holds nothing more than one container would.
    pub async fn remove_container(&self, name: &str) -> Result<(), SandboxError> {
        let container = self
            .container_named(Some(name))?
            .ok_or(SandboxError::OwnRootNotRemovable)?;
        if !container.mark_removed() {
            return Err(SandboxError::NoContainer {
                id: self.id.clone(),
                name: name.to_string(),
            });
        }
        match self
            .ask_agent_in(Some(&container), &wire::agent::AgentRequest::Shutdown)
            .await
        {
            Ok((wire::agent::AgentReply::ShuttingDown, _)) => {}
            Ok((other, _)) => tracing::warn!(
                sandbox = %self.id,
                container = name,
                "removing the container: its agent answered a shutdown with {other:?}"
            ),
            // Already gone (its agent died): there is nothing left to end.
            Err(e) => tracing::debug!(
                sandbox = %self.id,
                container = name,
                "removing the container: {}",
                report::chain(&e)
            ),
        }
        self.instance.container_removed(container.index).await;
        self.containers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|c| !Arc::ptr_eq(c, &container));
        Ok(())
    }

    /// Its container `name` (`None`: its own root), or the error that it has none.
    pub fn container_named(
        &self,
        name: Option<&str>,
    ) -> Result<Option<Arc<Container>>, SandboxError> {
        match name {
            None | Some(containers::MAIN_CONTAINER) => Ok(None),
            Some(name) => self
                .container(name)
                .map(Some)
                .ok_or_else(|| SandboxError::NoContainer {
                    id: self.id.clone(),
                    name: name.to_string(),
                }),
        }
    }

    /// Whether it is running (neither stopping nor dead).
    pub(crate) fn is_running(&self) -> bool {
        self.state() == SandboxState::Running
    }

    /// A sandbox an earlier daemon created, taken back around its adopted instance (live
    /// restore): its creation time, and so its TTL, are the recorded ones; its idle timeout
    /// starts again.
    pub(crate) fn restored(
        id: String,
        settings: SandboxSettings,
        instance: Box<dyn Instance>,
        created_at_ms: u64,
        create_to_ready_ms: f64,
        storage: SandboxStorage,
    ) -> Self {
        let age = Duration::from_millis(unix_ms().saturating_sub(created_at_ms));
        let now = Instant::now();
        let mut sandbox = Sandbox::new(id, settings, instance, Duration::ZERO, storage);
        sandbox.created = now.checked_sub(age).unwrap_or(now);
        sandbox.created_at_ms = created_at_ms;
        sandbox.timings.create_to_ready_ms = create_to_ready_ms;
        sandbox
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Its current state.
    pub fn state(&self) -> SandboxState {
        self.status().state
    }

    /// The backend running it.
    pub fn backend(&self) -> BackendKind {
        self.settings.backend
    }

    /// Its egress, when it has any.
    pub(crate) fn network(&self) -> Option<&SandboxNetwork> {
        self.settings.network.as_ref()
    }

    /// Who it belongs to.
    pub(crate) fn owner(&self) -> &Owner {
        &self.settings.owner
    }

    fn touch(&self) {
        self.status().last_activity = Instant::now();
        self.activity.notify_one();
    }

    /// Whether a command runs in it that no client is attached to (one that outlived its
    /// connection): that is activity too, which its idle timeout must not cut short. An agent
    /// that does not answer runs nothing we know of.
    async fn runs_a_detached_command(&self) -> bool {
        match self
            .ask_agent(&wire::agent::AgentRequest::Execs { exec_id: None })
            .await
        {
            Ok((wire::agent::AgentReply::Execs(list), _)) => list
                .execs
                .iter()
                .any(|e| e.state == wire::ExecState::Running && !e.attached),
            _ => false,
        }
    }

    /// Whether its TTL, not its idle timeout, has passed.
    fn ttl_passed(&self) -> bool {
        Instant::now() >= self.created + self.settings.ttl
    }

    /// When it expires: its TTL, or its idle timeout when nothing runs in it.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline_locked(&self.status())
    }

    /// Admits one exec or file transfer in its own root: the sandbox must be running and below
    /// its exec cap.
    pub fn begin(self: &Arc<Self>, counts_as_exec: bool) -> Result<ActivityGuard, SandboxError> {
        self.begin_in(counts_as_exec, None)
    }

    /// Admits one exec or file transfer in `container` (`None`: its own root).
    pub fn begin_in(
        self: &Arc<Self>,
        counts_as_exec: bool,
        container: Option<Arc<Container>>,
    ) -> Result<ActivityGuard, SandboxError> {
        match self.state() {
            SandboxState::Running => {}
            SandboxState::Dead => {
                return Err(SandboxError::Dead {
                    id: self.id.clone(),
                    reason: self.status().error.clone(),
                })
            }
            state => {
                return Err(SandboxError::NotRunning {
                    id: self.id.clone(),
                    state: serde_json::to_value(state)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default(),
                })
            }
        }
        let permit = if counts_as_exec {
            Some(self.exec_slots.clone().try_acquire_owned().map_err(|_| {
                SandboxError::ExecLimit {
                    id: self.id.clone(),
                    limit: self.settings.max_execs,
                }
            })?)
        } else {
            None
        };
        self.active_execs.fetch_add(1, Ordering::Relaxed);
        self.touch();
        Ok(ActivityGuard {
            sandbox: self.clone(),
            container,
            _permit: permit,
        })
    }

    /// Puts the sandbox's environment under `request`'s own (the request's values win), so
    /// both backends apply it the same way; in place, on the request on its way to the agent.
    pub(crate) fn merge_env_into(&self, request: &mut wire::ExecRequest) {
        for (name, value) in &self.settings.env {
            if !request.env.contains_key(name) {
                request.env.insert(name.clone(), value.clone());
            }
        }
    }

    /// Applies every default a command of this sandbox gets, in place, and says who it runs
    /// as: the sandbox's env ([`Sandbox::merge_env_into`]), then its image's config — `Env`
    /// under both, `WorkingDir` when the request gives no `cwd`, `User` (Docker's order:
    /// what the caller says wins over what the image says). A request's own `user` wins over
    /// all of them, and brings its `HOME` unless the request, the sandbox or the image set
    /// one; it is resolved here and taken off the request (the agent gets ids), as is its
    /// `group_add` (gids added to whoever it runs as, root included). Fails, with the reason,
    /// only for a `user` or a group that cannot be resolved.
    ///
    /// In a `container`, its own env comes over the sandbox's, and its image's config (with
    /// its request's `cwd` and `user`) and accounts take the place of the sandbox image's.
    pub(crate) fn apply_defaults(
        &self,
        request: &mut wire::ExecRequest,
        container: Option<&Container>,
    ) -> Result<Option<wire::agent::RunAs>, String> {
        let accounts = container.map_or(&self.settings.accounts, |c| &c.accounts);
        let container_env = container.map(|c| &c.env);
        let own_user = match std::mem::take(&mut request.user) {
            spec if spec.is_empty() => None,
            spec => {
                let user = accounts.resolve(&spec).map_err(|e| format!("user: {e}"))?;
                let home_given = request.env.contains_key("HOME")
                    || container_env.is_some_and(|env| env.contains_key("HOME"))
                    || self.settings.env.contains_key("HOME")
                    || accounts.image_sets_home;
                if !home_given {
                    request.env.insert("HOME".into(), user.home.clone());
                }
                Some(user)
            }
        };
        for (name, value) in container_env.into_iter().flatten() {
            if !request.env.contains_key(name) {
                request.env.insert(name.clone(), value.clone());
            }
        }
        self.merge_env_into(request);
        let defaults = match container {
            Some(container) => container.defaults.as_deref(),
            None => self.settings.image_defaults.as_deref(),
        };
        if let Some(defaults) = defaults {
            for (name, value) in &defaults.env {
                if !request.env.contains_key(name) {
                    request.env.insert(name.clone(), value.clone());
                }
            }
            if request.cwd.is_empty() {
                if let Some(dir) = &defaults.working_dir {
                    request.cwd = dir.clone();
                }
            }
        }
        let user = own_user
            .as_ref()
            .or_else(|| defaults.and_then(|d| d.user.as_ref()));
        let mut run_as = user.map(|user| wire::agent::RunAs {
            uid: user.uid,
            gid: user.gid,
            groups: user.groups.clone(),
        });
        let added = std::mem::take(&mut request.group_add);
        if !added.is_empty() {
            let gids = accounts
                .group_ids(&added)
                .map_err(|e| format!("group_add: {e}"))?;
            let run_as = run_as.get_or_insert(wire::agent::RunAs {
                uid: 0,
                gid: 0,
                groups: Vec::new(),
            });
            run_as.groups.extend(gids);
            let primary = run_as.gid;
            run_as.groups.retain(|g| *g != primary);
            run_as.groups.sort_unstable();
            run_as.groups.dedup();
        }
        Ok(run_as)
    }

    /// What a restarted daemon needs to take it back (live restore); `None` where its backend
    /// cannot.
    pub(crate) fn record(&self) -> Option<crate::restore::SandboxRecord> {
        // Its containers' life is the daemon's (their main processes, logs and restarts):
        // a restarted daemon could not take it over.
        if self.had_containers.load(Ordering::Acquire) {
            return None;
        }
        // Its egress leaves from a pod's network namespace, which a restarted daemon could
        // not open again for it (the namespace's file may be gone or reused by then).
        if self.settings.network.as_ref().is_some_and(|n| n.in_pod) {
            return None;
        }
        let instance = self.instance.record()?;
        let s = &self.settings;
        Some(crate::restore::SandboxRecord {
            version: crate::restore::RECORD_VERSION,
            id: self.id.clone(),
            owner: (&s.owner).into(),
            backend: s.backend,
            image: s.image.clone(),
            image_root: s.image_root.clone(),
            memory_mib: s.memory_mib,
            vcpus: s.vcpus,
            ttl_s: s.ttl.as_secs(),
            idle_s: s.idle.as_secs(),
            labels: s.labels.clone(),
            env: s.env.clone(),
            max_execs: s.max_execs,
            exec_tail_bytes: s.exec_tail_bytes,
            created_at_ms: self.created_at_ms,
            create_to_ready_ms: self.timings.create_to_ready_ms,
            defaults: s.image_defaults.as_deref().cloned(),
            network: s
                .network
                .as_ref()
                .map(|n| n.allow.clone())
                .unwrap_or_default(),
            caches: s.caches.clone(),
            volumes: s.volumes.clone(),
            disk_mib: s.disk_mib,
            share_process_namespace: s.share_process_namespace,
            hostname: s.hostname.clone(),
            boot_id: crate::restore::boot_id()
                .inspect_err(|e| tracing::warn!("sandbox {}: its record: boot id: {e}", self.id))
                .ok()?,
            instance,
        })
    }

    /// Output bytes its agent keeps per command for a client that re-attaches.
    pub(crate) fn exec_tail_bytes(&self) -> u64 {
        self.settings.exec_tail_bytes
    }

    /// What it uses now; `None` where its backend does not measure it.
    pub async fn stats(&self) -> Option<wire::SandboxStats> {
        self.instance.stats().await
    }

    /// What its container `container` uses: the share of its processes (its agent's
    /// `process_stats`), with the limits of the sandbox, which its containers share; `None`
    /// as for [`Sandbox::stats`], or when the container's agent does not answer.
    pub async fn container_stats(&self, container: &Container) -> Option<wire::SandboxStats> {
        let sandbox = self.instance.stats().await?;
        let request = wire::agent::AgentRequest::ProcessStats;
        match self.ask_agent_in(Some(container), &request).await {
            Ok((wire::agent::AgentReply::Stats(mut own), _)) => {
                own.memory.limit_bytes = sandbox.memory.limit_bytes;
                own.pids.limit = sandbox.pids.limit;
                Some(own)
            }
            Ok((other, _)) => {
                tracing::warn!(
                    sandbox = %self.id,
                    container = %container.name,
                    "process stats: its agent answered {other:?}"
                );
                None
            }
            Err(e) => {
                tracing::warn!(
                    sandbox = %self.id,
                    container = %container.name,
                    "process stats: {}",
                    report::chain(&e)
                );
                None
            }
        }
    }

    /// A new connection to its agent, with `message` sent on it.
    pub async fn send_to_agent(
        &self,
        message: &wire::agent::AgentRequest,
    ) -> Result<UnixStream, AgentError> {
        let mut agent = self.instance.connect().await.map_err(AgentError::Connect)?;
        wire::write_message_async(&mut agent, message)
            .await
            .map_err(AgentError::Send)?;
        Ok(agent)
    }

    /// A new connection to `container`'s agent, with `message` sent on it.
    pub(crate) async fn send_to_container(
        &self,
        container: &Container,
        message: &wire::agent::AgentRequest,
    ) -> Result<UnixStream, AgentError> {
        let mut agent = self
            .instance
            .connect_container(container.index)
            .await
            .map_err(AgentError::Connect)?;
        wire::write_message_async(&mut agent, message)
            .await
            .map_err(AgentError::Send)?;
        Ok(agent)
    }

    /// Asks its agent one question on a new connection and reads the one reply, all within
    /// `AGENT_REPLY_TIMEOUT`; the connection is returned for a reply that starts a stream.
    pub async fn ask_agent(
        &self,
        message: &wire::agent::AgentRequest,
    ) -> Result<(wire::agent::AgentReply, UnixStream), AgentError> {
        self.ask_agent_in(None, message).await
    }

    /// [`Sandbox::ask_agent`] of `container`'s agent (`None`: its own root's).
    pub async fn ask_agent_in(
        &self,
        container: Option<&Container>,
        message: &wire::agent::AgentRequest,
    ) -> Result<(wire::agent::AgentReply, UnixStream), AgentError> {
        let within = crate::agent::AGENT_REPLY_TIMEOUT;
        let connect = async {
            match container {
                Some(container) => self.instance.connect_container(container.index).await,
                None => self.instance.connect().await,
            }
        };
        let agent = tokio::time::timeout(within, connect)
            .await
            .map_err(|_| AgentError::Timeout(within))?
            .map_err(AgentError::Connect)?;
        crate::agent::exchange(agent, message, within).await
    }

    /// Checks that `container`'s agent answers, and speaks this daemon's protocol.
    pub(crate) async fn ping_container(&self, container: &Container) -> Result<(), String> {
        match self
            .ask_agent_in(Some(container), &wire::agent::AgentRequest::Ping)
            .await
        {
            Ok((wire::agent::AgentReply::Pong(hello), _)) => hello.check_protocol(),
            Ok((other, _)) => Err(format!("it answered a ping with {other:?}")),
            Err(e) => Err(report::chain(&e)),
        }
    }

    /// Whether something accepts connections on `port` of its loopback.
    pub(crate) async fn probe_tcp(&self, port: u16) -> Result<bool, String> {
        match self
            .ask_agent(&wire::agent::AgentRequest::ProbeTcp { port })
            .await
        {
            Ok((wire::agent::AgentReply::Probed { open }, _)) => Ok(open),
            Ok((other, _)) => Err(format!(
                "its agent answered a TCP probe with {other:?} (rebuild the guest image: \
                 cargo xtask build-image)"
            )),
            Err(e) => Err(report::chain(&e)),
        }
    }

    /// Why it died, if it did (or does within a moment: when its agent is lost, the
    /// connection usually breaks a moment before the death is noticed).
    pub(crate) async fn death(&self) -> Option<String> {
        let mut exited = self.instance.exited();
        tokio::time::timeout(Duration::from_millis(200), exited.wait_for(Option::is_some))
            .await
            .ok()
            .and_then(|r| r.ok().and_then(|reason| reason.clone()))
    }

    /// The API's view of it.
    pub fn info(&self) -> SandboxInfo {
        let status = self.status();
        let deadline = self.deadline_locked(&status);
        let ttl_end = self.created + self.settings.ttl;
        // The TTL's end is exact (its creation time plus its TTL), so that every answer, and a
        // restarted daemon's after live restore, says the same; an idle deadline is counted
        // from now.
        let expires_at_ms = if deadline >= ttl_end {
            self.created_at_ms + u64::try_from(self.settings.ttl.as_millis()).unwrap_or(u64::MAX)
        } else {
            unix_ms()
                + deadline
                    .saturating_duration_since(Instant::now())
                    .as_millis() as u64
        };
        SandboxInfo {
            id: self.id.clone(),
            state: status.state,
            backend: self.settings.backend,
            hypervisor: self.instance.hypervisor(),
            image: self.settings.image.clone(),
            memory_mib: self.limits_now().0,
            vcpus: self.limits_now().1,
            created_at_ms: self.created_at_ms,
            expires_at_ms,
            labels: self.settings.labels.clone(),
            timings: self.timings.clone(),
            active_execs: self.active_execs.load(Ordering::Relaxed),
            error: status.error.clone(),
            owner: Some(self.settings.owner.to_string()),
            network: self.settings.network.as_ref().map(SandboxNetwork::info),
            caches: self.settings.caches.clone(),
            volumes: self.settings.volumes.clone(),
            disk_mib: self.settings.disk_mib,
            user: self
                .settings
                .image_defaults
                .as_ref()
                .and_then(|d| d.user.as_ref())
                .map(|u| format!("{}:{}", u.uid, u.gid)),
            containers: self.containers().iter().map(|c| c.info()).collect(),
            share_process_namespace: self.settings.share_process_namespace,
            hostname: self.settings.hostname.clone(),
        }
    }

    fn deadline_locked(&self, status: &Status) -> Instant {
        let ttl_end = self.created + self.settings.ttl;
        if self.active_execs.load(Ordering::Relaxed) > 0 {
            return ttl_end;
        }
        ttl_end.min(status.last_activity + self.settings.idle)
    }

    /// Moves it to `state` if the lifecycle allows it from where it is ([`may_become`]);
    /// says whether it did. `error` is kept with a move to `Dead`.
    fn set_state(&self, state: SandboxState, error: Option<String>) -> bool {
        let mut status = self.status();
        if !may_become(status.state, state) {
            tracing::warn!(
                "sandbox {}: no move from {:?} to {state:?}; staying {:?}",
                self.id,
                status.state,
                status.state
            );
            return false;
        }
        status.state = state;
        if let Some(error) = error {
            status.error = error;
        }
        true
    }
}

/// The sandbox lifecycle, one table. A sandbox is registered once its agent is ready
/// (`Running`); a DELETE, an expiry or shutdown makes it `Stopping` while it is destroyed; a VM
/// or namespace init that dies makes it `Dead` (kept, with the reason, until a DELETE or its
/// TTL). A dead sandbox deleted stays `Dead`; nothing comes back to `Running`.
///
/// | from | to | when |
/// | --- | --- | --- |
/// | `Running` | `Stopping` | deleted (DELETE, TTL or idle expiry, shutdown) |
/// | `Running` | `Dead` | its VM or init exited by itself |
pub(crate) fn may_become(from: SandboxState, to: SandboxState) -> bool {
    matches!(
        (from, to),
        (SandboxState::Running, SandboxState::Stopping)
            | (SandboxState::Running, SandboxState::Dead)
    )
}

/// Counts tasks under way, so that shutdown can wait for them.
#[derive(Debug)]
struct Tracker(watch::Sender<usize>);

impl Default for Tracker {
    fn default() -> Self {
        Tracker(watch::Sender::new(0))
    }
}

/// Held by a tracked task; counts it done when dropped, even if the task was cancelled.
struct Tracked(watch::Sender<usize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Tracker {
    fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.0.send_modify(|n| *n += 1);
        let tracked = Tracked(self.0.clone());
        tokio::spawn(async move {
            let _tracked = tracked;
            task.await
        })
    }

    /// Waits until no tracked task runs.
    async fn wait(&self) {
        let mut count = self.0.subscribe();
        let _ = count.wait_for(|n| *n == 0).await;
    }
}

/// Every sandbox of the daemon.
#[derive(Debug, Default)]
pub struct Registry {
    /// Sandboxes that died unexpectedly.
    pub(crate) died: std::sync::atomic::AtomicU64,
    sandboxes: RwLock<HashMap<String, Arc<Sandbox>>>,
    reserved: Mutex<usize>,
    /// Creations under way; shutdown waits for them.
    creating: Tracker,
    /// Destructions under way; shutdown waits for them.
    destroying: Tracker,
    /// Set when shutdown begins: no sandbox may be created after it.
    shutting_down: AtomicBool,
    /// Under live restore: the state directory whose records say what to take back.
    records: Option<std::path::PathBuf>,
}

/// A reserved place under the sandbox cap, released on drop unless the sandbox was added. A
/// warm pool's ready instances each hold one, so they count toward the cap.
#[derive(Debug)]
pub(crate) struct Reservation {
    registry: Arc<Registry>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut reserved = self
            .registry
            .reserved
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *reserved = reserved.saturating_sub(1);
    }
}

impl Registry {
    /// An empty registry; with `records` (live restore), each sandbox handed to a client gets a
    /// record there, removed as it is destroyed.
    pub(crate) fn new(records: Option<std::path::PathBuf>) -> Self {
        Registry {
            records,
            ..Registry::default()
        }
    }

    fn map(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Sandbox>>> {
        self.sandboxes.read().unwrap_or_else(|p| p.into_inner())
    }

    fn map_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<Sandbox>>> {
        self.sandboxes.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves room for one more sandbox, or fails when `max` exist or are being created.
    pub(crate) fn reserve(self: &Arc<Self>, max: usize) -> Result<Reservation, SandboxError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(SandboxError::ShuttingDown);
        }
        let mut reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        if self.map().len() + *reserved >= max {
            return Err(SandboxError::AtCapacity(max));
        }
        *reserved += 1;
        Ok(Reservation {
            registry: self.clone(),
        })
    }

    /// Looks a sandbox up for `caller`; a malformed id is a 400, an unknown one a 404. A
    /// sandbox `caller` may not use is unknown to it: the same 404, built by the same code
    /// after the same map lookup, so that neither the answer nor its timing tells "exists but
    /// not yours" from "does not exist".
    pub fn get(&self, id: &str, caller: &Caller) -> Result<Arc<Sandbox>, SandboxError> {
        if !is_valid_id(id) {
            return Err(SandboxError::InvalidId(id.to_string()));
        }
        self.map()
            .get(id)
            .filter(|sandbox| caller.may_use(&sandbox.settings.owner))
            .cloned()
            .ok_or_else(|| SandboxError::NotFound(id.to_string()))
    }

    /// Every sandbox, oldest first.
    pub fn list(&self) -> Vec<Arc<Sandbox>> {
        let mut all: Vec<_> = self.map().values().cloned().collect();
        all.sort_by_key(|s| s.created);
        all
    }

    /// The sandboxes `caller` may see, oldest first.
    pub fn list_for(&self, caller: &Caller) -> Vec<Arc<Sandbox>> {
        let mut visible: Vec<_> = self
            .map()
            .values()
            .filter(|sandbox| caller.may_use(&sandbox.settings.owner))
            .cloned()
            .collect();
        visible.sort_by_key(|s| s.created);
        visible
    }

    /// Counts by state, for metrics.
    pub(crate) fn count_by_state(&self) -> Vec<(SandboxState, usize)> {
        let mut counts = Vec::new();
        for state in [
            SandboxState::Running,
            SandboxState::Stopping,
            SandboxState::Dead,
        ] {
            let n = self.map().values().filter(|s| s.state() == state).count();
            counts.push((state, n));
        }
        counts
    }

    /// Deletes sandbox `id`'s live-restore record: what it holds changed in a way a restarted
    /// daemon could not take back (a container was added), so one stopping under live
    /// restore deletes it, and one that crashed leaves nothing to adopt.
    pub(crate) fn forget_record(&self, id: &str) {
        if let Some(dir) = &self.records {
            crate::restore::remove(dir, id);
        }
    }

    /// Adds a ready sandbox and starts watching its lifetime and health.
    pub(crate) fn insert(self: &Arc<Self>, sandbox: Arc<Sandbox>, _reservation: Reservation) {
        if let Some(dir) = &self.records {
            match sandbox.record() {
                Some(record) => {
                    if let Err(e) = crate::restore::write(dir, &record) {
                        tracing::warn!(
                            "sandbox {}: {}; a restarted daemon will not take it back",
                            sandbox.id,
                            report::chain(&e)
                        );
                    }
                }
                None => tracing::debug!(
                    "sandbox {}: its backend keeps no record; it will not be taken back",
                    sandbox.id
                ),
            }
        }
        self.map_mut().insert(sandbox.id.clone(), sandbox.clone());
        tokio::spawn(watch_lifecycle(self.clone(), sandbox));
    }

    /// Removes a sandbox and destroys it. Returns false when it was not there.
    pub async fn remove(&self, id: &str) -> bool {
        let Some(sandbox) = self.map_mut().remove(id) else {
            return false;
        };
        if sandbox.state() != SandboxState::Dead {
            sandbox.set_state(SandboxState::Stopping, None);
        }
        self.destroy(sandbox).await;
        true
    }

    /// Destroys `sandbox` in a task of its own and waits for it. Done in the caller's task,
    /// a destruction could be cut short halfway — by a client that goes away mid-DELETE, or
    /// by the runtime ending at shutdown while an expiry was under way — leaving its cgroups
    /// and runtime directory behind with nothing left to remove them. Shutdown waits for every
    /// destruction under way ([`Registry::remove_all`]).
    async fn destroy(&self, sandbox: Arc<Sandbox>) {
        // First: a daemon that dies halfway must not take back a sandbox half destroyed.
        if let Some(dir) = &self.records {
            crate::restore::remove(dir, &sandbox.id);
        }
        let task = self.destroying.spawn(async move {
            let inbound = sandbox
                .inbound
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(inbound) = inbound {
                inbound.close().await;
            }
            sandbox.instance.destroy().await;
            // Its processes are gone: its caches' copies are saved or dropped (once the
            // kernel has dropped their mounts) and its layer goes.
            let storage = sandbox
                .storage
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            let caches: Vec<_> = storage
                .iter()
                .flat_map(|s| s.caches.iter().filter_map(|c| c.settled()))
                .collect();
            drop(storage);
            // A client that deletes a sandbox then lists the caches sees what became of its
            // copies (bounded: the store waits at most for the mounts to go).
            for cache in caches {
                cache.wait().await;
            }
        });
        if let Err(e) = task.await {
            tracing::warn!("destroying a sandbox failed: {e}");
        }
    }

    /// Destroys an instance that never became a sandbox (a warm pool's), in a task of its own
    /// that shutdown waits for, as [`Registry::destroy`] does for sandboxes.
    pub(crate) async fn destroy_instance(&self, instance: Box<dyn Instance>) {
        let task = self
            .destroying
            .spawn(async move { instance.destroy().await });
        if let Err(e) = task.await {
            tracing::warn!("destroying a pooled instance failed: {e}");
        }
    }

    /// Whether shutdown has begun (no sandbox may be created any more).
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Runs a sandbox creation in a task of its own, for the same reason as destructions (a
    /// client hanging up mid-create would otherwise leave the half-made sandbox's cgroups and
    /// runtime directory behind); shutdown waits for it. The sandbox may then be created for a
    /// client that is gone: it is listed, like any other, until deleted or expired.
    pub fn spawn_creation<F>(&self, creation: F) -> JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.creating.spawn(creation)
    }

    /// Stops without destroying (live restore): refuses new sandboxes, lets creations and
    /// destructions under way finish, and leaves the rest running.
    pub(crate) async fn leave_all(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.creating.wait().await;
        // A sandbox with no record (one with containers) would run on unsupervised with
        // nobody to take it back: it goes now, as without live restore.
        let unrecorded: Vec<String> = self
            .map()
            .values()
            .filter(|sandbox| sandbox.record().is_none())
            .map(|sandbox| sandbox.id.clone())
            .collect();
        if !unrecorded.is_empty() {
            tracing::info!(
                "deleting {} sandbox(es) a restarted daemon could not take back: {}",
                unrecorded.len(),
                unrecorded.join(", ")
            );
        }
        futures_util::future::join_all(unrecorded.iter().map(|id| self.remove(id))).await;
        self.destroying.wait().await;
        // What they hold on the host stays theirs for the next daemon (a writable layer's
        // image, dropped, would be removed under a running sandbox).
        for sandbox in self.map().values() {
            let held = sandbox
                .storage
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(held) = held {
                held.leave();
            }
        }
    }

    /// Destroys every sandbox (daemon shutdown): refuses new ones, lets creations under way
    /// finish, removes everything, and waits for destructions already under way too.
    pub(crate) async fn remove_all(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.creating.wait().await;
        let ids: Vec<String> = self.map().keys().cloned().collect();
        let removals = ids.iter().map(|id| self.remove(id));
        futures_util::future::join_all(removals).await;
        self.destroying.wait().await;
    }
}

/// Expires the sandbox at its deadline and notices when it dies.
async fn watch_lifecycle(registry: Arc<Registry>, sandbox: Arc<Sandbox>) {
    let mut exited = sandbox.instance.exited();
    let mut alive = true;
    loop {
        let deadline = tokio::time::Instant::from_std(sandbox.deadline());
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {
                if Instant::now() >= sandbox.deadline() {
                    if alive && !sandbox.ttl_passed() && sandbox.runs_a_detached_command().await {
                        sandbox.touch();
                        continue;
                    }
                    registry.remove(&sandbox.id).await;
                    return;
                }
            }
            () = sandbox.activity.notified() => {}
            reason = async {
                exited.wait_for(Option::is_some).await.ok().and_then(|r| r.clone())
            }, if alive => {
                alive = false;
                let reason = reason.unwrap_or_default();
                if sandbox.state() == SandboxState::Stopping {
                    return;
                }
                tracing::warn!("sandbox {} died: {reason}", sandbox.id);
                registry.died.fetch_add(1, Ordering::Relaxed);
                sandbox.set_state(SandboxState::Dead, Some(reason));
                // Release its processes, cgroups and files now; the entry stays until DELETE
                // or its TTL so clients can see why it died.
                registry.destroy(sandbox.clone()).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [SandboxState; 3] = [
        SandboxState::Running,
        SandboxState::Stopping,
        SandboxState::Dead,
    ];

    #[test]
    fn the_lifecycle_only_moves_forward_from_running() {
        let allowed: Vec<(SandboxState, SandboxState)> = ALL
            .iter()
            .flat_map(|&from| ALL.iter().map(move |&to| (from, to)))
            .filter(|&(from, to)| may_become(from, to))
            .collect();
        assert_eq!(
            allowed,
            [
                (SandboxState::Running, SandboxState::Stopping),
                (SandboxState::Running, SandboxState::Dead),
            ]
        );
    }
}
