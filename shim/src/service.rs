//! The task service containerd calls: a container alone per shim, its sandbox made at
//! `Create`; or, one shim per Kubernetes pod, the pod's `pause` container's sandbox with
//! each app container of the pod added to it (`pod`). Each process (a container's init, then
//! its execs) is an interactive exec in its container's root.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use api_types::CreateSandbox;
use async_trait::async_trait;
use containerd_shim::api::{
    CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse,
    DeleteRequest, DeleteResponse, Empty, ExecProcessRequest, KillRequest, PauseRequest,
    PidsRequest, PidsResponse, ResizePtyRequest, ResumeRequest, ShutdownRequest, StartRequest,
    StartResponse, StateRequest, StateResponse, StatsRequest, StatsResponse, Status,
    UpdateTaskRequest, WaitRequest, WaitResponse,
};
use containerd_shim::protos::api::CheckpointTaskRequest;
use containerd_shim::protos::api::ProcessInfo;
use containerd_shim::protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskOOM, TaskStart,
};
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::protos::shim_async::Task;
use containerd_shim::{ExitSignal, TtrpcContext, TtrpcResult};
use tokio::sync::{watch, Mutex};
use wire::ExecRequest;

use crate::bundle_state::{self, BundleState};
use crate::error::ShimError;
use crate::events::Events;
use crate::exit::exit_status;
use crate::process::{self, Exited, Io, Process, Reattach, StdioPaths};
use crate::{pod, pod_volumes, rootfs, spec, stdio};

/// How long a sandbox may live: the daemon's most. A container that runs longer is ended by
/// the daemon; containerd then sees its processes exit.
const SANDBOX_TTL_S: u64 = 7 * 24 * 3600;

/// The room a pod's sandbox keeps for the containers kubelet adds to it one by one: on a
/// microVM each takes one of its 6 disks, reserved empty at boot (a writer container for a
/// member's kubelet volumes takes one too, and a restarted container a new one); the
/// namespace backend needs none and ignores it.
const POD_CONTAINER_SLOTS: u32 = 6;
/// Labels the shim puts on its sandboxes, so an operator (and `delete`) can find them.
pub(crate) const LABEL_ID: &str = "containerd.id";
/// The containerd namespace.
pub(crate) const LABEL_NAMESPACE: &str = "containerd.namespace";
/// The bundle: unique per containerd state directory and container.
pub(crate) const LABEL_BUNDLE: &str = "containerd.bundle";

/// A container of this shim.
#[derive(Debug)]
struct Container {
    id: String,
    bundle: PathBuf,
    sandbox: String,
    /// Its container in the sandbox (a pod's app container); `None`: the sandbox's own root.
    root: Option<String>,
    /// What to release at `Delete` (also in the bundle, for `<shim> delete`).
    held: BundleState,
    init: Process,
    execs: HashMap<String, Process>,
    /// The sandbox's OOM kill count last seen: a rise is reported as `TaskOOM`.
    oom_kills_seen: u64,
    /// A pod member's limits (`memory_mib`, `vcpus`) from its spec, which its pod's sandbox
    /// is sized by ([`pod_limits`]).
    limits: (Option<u64>, Option<u32>),
}

impl Container {
    fn process(&self, exec_id: &str) -> Result<&Process, ShimError> {
        if exec_id.is_empty() {
            return Ok(&self.init);
        }
        self.execs.get(exec_id).ok_or_else(|| ShimError::NoProcess {
            id: self.id.clone(),
            exec_id: exec_id.into(),
        })
    }

    fn process_mut(&mut self, exec_id: &str) -> Result<&mut Process, ShimError> {
        if exec_id.is_empty() {
            return Ok(&mut self.init);
        }
        let id = &self.id;
        self.execs
            .get_mut(exec_id)
            .ok_or_else(|| ShimError::NoProcess {
                id: id.clone(),
                exec_id: exec_id.into(),
            })
    }
}

/// A pod's limits from its members' (`memory_mib`, `vcpus`): the sum of each, as kubelet's pod
/// cgroup has it, when every member has that limit (one without any means the pod has none,
/// and the sandbox keeps what it has); `None` too with no member.
fn pod_limits(
    members: impl Iterator<Item = (Option<u64>, Option<u32>)>,
) -> (Option<u64>, Option<u32>) {
    let mut sums = (Some(0u64), Some(0u32));
    let mut any = false;
    for (memory, cpus) in members {
        any = true;
        sums.0 = sums.0.zip(memory).map(|(sum, m)| sum.saturating_add(m));
        sums.1 = sums.1.zip(cpus).map(|(sum, c)| sum.saturating_add(c));
    }
    if any {
        sums
    } else {
        (None, None)
    }
}

/// The shim's task service.
#[derive(Debug, Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

struct Inner {
    client: Result<client::Client, String>,
    events: Events,
    namespace: String,
    exit: Arc<ExitSignal>,
    /// Its containers by task id: one, or a pod's.
    containers: Mutex<BTreeMap<String, Container>>,
    /// How long a process whose session broke off waits for the daemon to take it up again.
    reconnect: std::time::Duration,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("client", &self.client)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// A service talking to the daemon through `client` (or failing every call with its
    /// configuration error), publishing through `events`, signalling `exit` at `Shutdown`.
    pub fn new(
        client: Result<client::Client, String>,
        events: Events,
        namespace: String,
        exit: Arc<ExitSignal>,
    ) -> Self {
        let reconnect = crate::daemon::reconnect_from_env().unwrap_or_else(|e| {
            log::warn!("{e}; waiting the default");
            crate::daemon::reconnect_from_env_default()
        });
        Service {
            inner: Arc::new(Inner {
                client,
                events,
                namespace,
                exit,
                containers: Mutex::new(BTreeMap::new()),
                reconnect,
            }),
        }
    }
}

/// How long a kill keeps trying to reach a started process its agent does not know yet.
const KILL_LANDS_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// The pid containerd is given for every process: crucible reports no host pid for a command,
/// and containerd never signals a v2 task's pid itself.
fn pid() -> u32 {
    std::process::id()
}

fn now() -> containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp {
    containerd_shim::util::timestamp().unwrap_or_default()
}

fn container_of<'a>(
    slot: &'a mut BTreeMap<String, Container>,
    id: &str,
) -> Result<&'a mut Container, ShimError> {
    slot.get_mut(id).ok_or_else(|| ShimError::NoTask(id.into()))
}

impl Inner {
    fn client(&self) -> Result<&client::Client, ShimError> {
        self.client
            .as_ref()
            .map_err(|e| ShimError::Invalid(e.clone()))
    }

    async fn create(&self, req: CreateTaskRequest) -> Result<CreateTaskResponse, ShimError> {
        let mut slot = self.containers.lock().await;
        if slot.contains_key(&req.id) {
            return Err(ShimError::AlreadyExists(format!("task {:?}", req.id)));
        }
        if !req.checkpoint.is_empty() {
            return Err(ShimError::Unsupported("restoring a checkpoint is"));
        }
        let client = self.client()?;
        let bundle = PathBuf::from(&req.bundle);
        let spec = containerd_shim::util::read_spec(&bundle)
            .await
            .map_err(|e| ShimError::shim(format!("reading {}/config.json", req.bundle), e))?;
        let process = spec
            .process()
            .as_ref()
            .ok_or_else(|| ShimError::Invalid("the spec has no process".into()))?;
        let request = spec::exec_request(process, "")?;
        let role = pod::role(spec.annotations().as_ref(), &req.id);
        let pod_sandbox = match &role {
            pod::Role::Member { sandbox_id, .. } => {
                let pause = slot.get(sandbox_id).ok_or_else(|| {
                    ShimError::Precondition(format!(
                        "container {} belongs to pod sandbox {sandbox_id}, which this shim \
                         does not run",
                        req.id
                    ))
                })?;
                Some(pause.sandbox.clone())
            }
            pod::Role::Alone | pod::Role::PodSandbox => None,
        };
        if slot.values().any(|c| c.root.is_none()) && pod_sandbox.is_none() {
            return Err(ShimError::AlreadyExists(format!(
                "task {:?}: this shim runs a sandbox already, and only a pod's containers \
                 share one",
                req.id
            )));
        }
        let mut held = BundleState::default();
        let made = match (&role, &pod_sandbox) {
            (pod::Role::Member { name, .. }, Some(sandbox)) => self
                .add_to_pod(client, &req, &spec, sandbox, name, &mut held)
                .await
                .map(|()| (sandbox.clone(), Some(name.clone()))),
            _ => self
                .make_sandbox(
                    client,
                    &req,
                    &spec,
                    &request,
                    matches!(role, pod::Role::PodSandbox),
                    &mut held,
                )
                .await
                .map(|sandbox| (sandbox, None)),
        };
        let (sandbox, root) = match made {
            Ok(made) => made,
            Err(e) => {
                if let Err(cleanup) = bundle_state::release(client, &bundle, &mut held).await {
                    log::warn!("cleaning up after a failed create: {cleanup}");
                }
                return Err(e);
            }
        };
        let stdio = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
        };
        slot.insert(
            req.id.clone(),
            Container {
                id: req.id.clone(),
                bundle,
                sandbox,
                root,
                held,
                init: Process::new(request, stdio),
                execs: HashMap::new(),
                oom_kills_seen: 0,
                limits: spec::limits(&spec),
            },
        );
        if let Some(member) = slot.get(&req.id).filter(|c| c.root.is_some()) {
            let sandbox = member.sandbox.clone();
            self.size_pod(&slot, &sandbox).await;
        }
        self.events
            .publish(TaskCreate {
                container_id: req.id.clone(),
                bundle: req.bundle.clone(),
                rootfs: req.rootfs.clone(),
                io: MessageField::some(TaskIO {
                    stdin: req.stdin,
                    stdout: req.stdout,
                    stderr: req.stderr,
                    terminal: req.terminal,
                    ..TaskIO::default()
                }),
                pid: pid(),
                ..TaskCreate::default()
            })
            .await;
        Ok(CreateTaskResponse {
            pid: pid(),
            ..CreateTaskResponse::default()
        })
    }

    /// Mounts the rootfs, makes (or finds) its image, unmounts, creates the sandbox (with room
    /// for the pod's containers when it is a pod's, `pod`); records each thing held in `held`
    /// and the bundle before taking it.
    async fn make_sandbox(
        &self,
        client: &client::Client,
        req: &CreateTaskRequest,
        spec: &oci_spec::runtime::Spec,
        request: &ExecRequest,
        pod: bool,
        held: &mut BundleState,
    ) -> Result<String, ShimError> {
        if pod {
            spec::refuse_host_namespaces(spec)?;
        }
        let network_namespace = match pod {
            true => self.pod_network(client, spec).await?,
            false => None,
        };
        let image = self.image_of(client, req, spec, held).await?;
        let bundle = PathBuf::from(&req.bundle);
        let (memory_mib, vcpus) = spec::limits(spec);
        let labels = BTreeMap::from([
            (LABEL_ID.to_string(), req.id.clone()),
            (LABEL_NAMESPACE.to_string(), self.namespace.clone()),
            (LABEL_BUNDLE.to_string(), req.bundle.clone()),
        ]);
        let info = client
            .create(&CreateSandbox {
                image: Some(image.clone()),
                memory_mib,
                vcpus,
                env: request.env.clone(),
                labels,
                ttl_s: Some(SANDBOX_TTL_S),
                user: spec::user(spec),
                container_slots: pod.then_some(POD_CONTAINER_SLOTS),
                // A pod's hostname (its name, or its `hostname`), as runc sets it.
                hostname: spec.hostname().clone().filter(|h| !h.is_empty()),
                network_namespace,
                // A pod's `sysctls`, namespaced ones only (the daemon refuses the others).
                sysctls: spec
                    .linux()
                    .as_ref()
                    .and_then(|l| l.sysctl().clone())
                    .map(|s| s.into_iter().collect())
                    .unwrap_or_default(),
                ..CreateSandbox::default()
            })
            .await?;
        held.sandbox = Some(info.id.clone());
        held.write(&bundle)?;
        log::info!(
            "container {} is sandbox {} (image {}, {} MiB, {} vCPUs)",
            req.id,
            info.id,
            image,
            info.memory_mib,
            info.vcpus
        );
        Ok(info.id)
    }

    /// The network a pod's sandbox joins ([`spec::pod_network_namespace`]): the one CNI made
    /// (its IP, routes and port mappings), or the node's for a `hostNetwork` pod. A microVM
    /// cannot share the node's network namespace: there a `hostNetwork` pod keeps the VM's
    /// own network (loopback and the egress proxy), as Kata Containers does, and says so.
    async fn pod_network(
        &self,
        client: &client::Client,
        spec: &oci_spec::runtime::Spec,
    ) -> Result<Option<String>, ShimError> {
        let network = spec::pod_network_namespace(spec);
        if network.as_deref() != Some(api_types::HOST_NETWORK_NAMESPACE) {
            return Ok(network);
        }
        let health = client.health().await?;
        let backend = health.get("default_backend").cloned();
        let backend = backend.and_then(|b| serde_json::from_value(b).ok());
        if backend == Some(api_types::BackendKind::Microvm) {
            log::warn!(
                "hostNetwork: a microVM pod cannot share the node's network; it keeps the VM's \
                 own (loopback and the egress proxy)"
            );
            return Ok(None);
        }
        Ok(network)
    }

    /// Adds the pod member `req` to its pod's sandbox as container `name`: its image as for
    /// a sandbox, its `emptyDir`s as shared directories, its kubelet volumes read-only and
    /// kept up to date ([`pod_volumes`]), its small host files copied in (files of their own
    /// under a read-only root).
    async fn add_to_pod(
        &self,
        client: &client::Client,
        req: &CreateTaskRequest,
        spec: &oci_spec::runtime::Spec,
        sandbox: &str,
        name: &str,
        held: &mut BundleState,
    ) -> Result<(), ShimError> {
        let bundle = PathBuf::from(&req.bundle);
        let image = self.image_of(client, req, spec, held).await?;
        let mounts = pod::member_mounts(spec)?;
        let mut security = spec::security(spec)?;
        let backend = client.get(sandbox).await?.backend;
        if backend == api_types::BackendKind::Microvm {
            security = spec::for_microvm(security);
        }
        if security.read_only_root {
            // The copies go in after the container is made: under a read-only root they are
            // files of their own, writable, as kubelet's bind mounts are under runc.
            security.writable_files = mounts.copies.iter().map(|(_, at)| at.clone()).collect();
        }
        let copies = pod::copies_tar(&mounts.copies)?;
        // Named after the task, not the member: kubelet's next attempt of a container may
        // come before the dead one's task is deleted.
        let writer = (!mounts.volumes.is_empty()).then(|| pod::writer_name(&req.id));
        held.pod_member = Some(bundle_state::PodMember {
            sandbox: sandbox.to_string(),
            name: name.to_string(),
            writer: writer.clone(),
        });
        held.write(&bundle)?;
        let mut shared = mounts.shared;
        if writer.is_some() {
            let (read_only, writer, put) =
                pod_volumes::fill(client, sandbox, &req.id, &mounts.volumes).await?;
            shared.extend(read_only);
            tokio::spawn(pod_volumes::keep_fresh(
                client.clone(),
                sandbox.to_string(),
                writer,
                mounts.volumes.clone(),
                put,
            ));
        }
        let request = api_types::ContainerRequest {
            name: name.to_string(),
            image: Some(image.clone()),
            user: spec::user(spec),
            shared,
            share_process_namespace: spec::joins_pod_pid_namespace(spec),
            // As under runc: the container's process is PID 1 of its own PID namespace (a
            // microVM's containers keep their agent there).
            command_is_pid1: backend == api_types::BackendKind::Namespace
                && !spec::joins_pod_pid_namespace(spec),
            security,
            host_paths: mounts.host_paths,
            ..api_types::ContainerRequest::default()
        };
        client.add_container(sandbox, &request).await?;
        if !mounts.copies.is_empty() {
            let tar = std::io::Cursor::new(copies);
            client.put_tar_in(sandbox, Some(name), "/", tar).await?;
        }
        log::info!(
            "container {} is container {name} of pod sandbox {sandbox} (image {image})",
            req.id
        );
        Ok(())
    }

    /// The image of `req`'s rootfs at the daemon: found, or imported (mounting the rootfs
    /// meanwhile); each thing held is recorded in `held` and the bundle before it is taken.
    async fn image_of(
        &self,
        client: &client::Client,
        req: &CreateTaskRequest,
        spec: &oci_spec::runtime::Spec,
        held: &mut BundleState,
    ) -> Result<String, ShimError> {
        let bundle = PathBuf::from(&req.bundle);
        let choice = rootfs::choose_image(&req.rootfs, &self.namespace, &req.id)?;
        let reuse = choice.shared
            && match client.image(&choice.name).await {
                Ok(_) => true,
                Err(client::ClientError::Api { status: 404, .. }) => false,
                Err(e) => return Err(e.into()),
            };
        if !reuse {
            if !choice.shared {
                held.private_image = Some(choice.name.clone());
                held.write(&bundle)?;
            }
            let root = if req.rootfs.is_empty() {
                let path = spec.root().as_ref().map(|r| r.path().clone());
                bundle.join(path.unwrap_or_else(|| rootfs::ROOTFS_DIR.into()))
            } else {
                let target = bundle.join(rootfs::ROOTFS_DIR);
                held.rootfs = Some(target.clone());
                held.write(&bundle)?;
                rootfs::mount(&req.rootfs, &target).await?;
                target
            };
            rootfs::import(client, &choice.name, &root).await?;
            if let Some(target) = held.rootfs.take() {
                // The sandbox runs on the daemon's copy: nothing needs the mount any more.
                if let Err(e) = rootfs::unmount(&target).await {
                    held.rootfs = Some(target);
                    return Err(e);
                }
                held.write(&bundle)?;
            }
        }
        Ok(choice.name)
    }

    async fn start(self: &Arc<Self>, id: &str, exec_id: &str) -> Result<u32, ShimError> {
        let client = self.client()?.clone();
        let mut slot = self.containers.lock().await;
        let c = container_of(&mut slot, id)?;
        if !exec_id.is_empty() && c.init.status != Status::RUNNING {
            return Err(ShimError::Precondition(format!(
                "container {id} is not running"
            )));
        }
        let sandbox = c.sandbox.clone();
        let root = c.root.clone();
        let p = c.process_mut(exec_id)?;
        if p.status != Status::CREATED {
            return Err(ShimError::Precondition(format!(
                "process {} of {id} was already started",
                if exec_id.is_empty() { "init" } else { exec_id }
            )));
        }
        let stdout = stdio::open_output(&p.stdio.stdout).await?;
        let stderr = stdio::open_output(&p.stdio.stderr).await?;
        let stdin = stdio::open_stdin(&p.stdio.stdin)?;
        let session = client
            .interactive_in(&sandbox, root.as_deref(), &p.request)
            .await?;
        let (stdin, hold) = match stdin {
            Some(s) => (Some(s.reader), Some(s.hold)),
            None => (None, None),
        };
        p.stdin_hold = hold;
        p.status = Status::RUNNING;
        // Published before the relay starts, so the exit can never come first.
        if exec_id.is_empty() {
            self.events
                .publish(TaskStart {
                    container_id: id.into(),
                    pid: pid(),
                    ..TaskStart::default()
                })
                .await;
        } else {
            self.events
                .publish(TaskExecStarted {
                    container_id: id.into(),
                    exec_id: exec_id.into(),
                    pid: pid(),
                    ..TaskExecStarted::default()
                })
                .await;
        }
        let io = Io {
            session,
            stdout,
            stderr,
            stdin,
            sizes: p.terminal_size.as_ref().map(watch::Sender::subscribe),
        };
        let again = Reattach {
            client,
            sandbox,
            container: root,
            exec_id: spec::daemon_exec_id(exec_id),
            patience: self.reconnect,
        };
        let this = Arc::clone(self);
        let (id, exec_id) = (id.to_string(), exec_id.to_string());
        tokio::spawn(async move { this.supervise(id, exec_id, io, again).await });
        Ok(pid())
    }

    /// Runs a started process to its end, then reports it: `TaskOOM` (before the exit, as
    /// runc's shim does), the process stopped, `TaskExit`. When the init ends, the container's
    /// other processes are killed, as the kernel does to a PID namespace whose init died.
    async fn supervise(self: Arc<Self>, id: String, exec_id: String, io: Io, again: Reattach) {
        let result = process::relay(io, again).await;
        let status = exit_status(&result);
        let oom = self.oom_kills_rose(&id).await || result.oom_killed;
        if oom {
            self.events
                .publish(TaskOOM {
                    container_id: id.clone(),
                    ..TaskOOM::default()
                })
                .await;
        }
        let at = now();
        let mut slot = self.containers.lock().await;
        let Ok(c) = container_of(&mut slot, &id) else {
            return;
        };
        let Ok(p) = c.process_mut(&exec_id) else {
            return;
        };
        self.events
            .publish(TaskExit {
                container_id: id.clone(),
                id: if exec_id.is_empty() {
                    id.clone()
                } else {
                    exec_id.clone()
                },
                pid: pid(),
                exit_status: status,
                exited_at: MessageField::some(at.clone()),
                ..TaskExit::default()
            })
            .await;
        p.set_exited(Exited { status, at });
        let orphans = exec_id.is_empty() && c.execs.values().any(|e| e.status == Status::RUNNING);
        let (sandbox, root) = (c.sandbox.clone(), c.root.clone());
        drop(slot);
        if orphans {
            if let Ok(client) = self.client() {
                let all = api_types::SignalRequest {
                    signal: libc::SIGKILL,
                    exec_id: None,
                };
                if let Err(e) = client.signal_in(&sandbox, root.as_deref(), all).await {
                    log::warn!(
                        "killing the processes left in {sandbox}: {}",
                        report::chain(&e)
                    );
                }
            }
        }
    }

    /// Whether the sandbox's OOM kill count rose since last asked.
    async fn oom_kills_rose(&self, id: &str) -> bool {
        let sandbox = {
            let mut slot = self.containers.lock().await;
            match container_of(&mut slot, id) {
                Ok(c) => c.sandbox.clone(),
                Err(_) => return false,
            }
        };
        let Ok(client) = self.client() else {
            return false;
        };
        let Ok(stats) = client.stats(&sandbox).await else {
            return false;
        };
        let mut slot = self.containers.lock().await;
        let Ok(c) = container_of(&mut slot, id) else {
            return false;
        };
        let rose = stats.memory.oom_kills > c.oom_kills_seen;
        c.oom_kills_seen = c.oom_kills_seen.max(stats.memory.oom_kills);
        rose
    }

    async fn exec(&self, req: ExecProcessRequest) -> Result<(), ShimError> {
        if req.exec_id.is_empty() {
            return Err(ShimError::Invalid("an exec needs an exec id".into()));
        }
        let any = req
            .spec
            .as_ref()
            .ok_or_else(|| ShimError::Invalid("the exec request has no process spec".into()))?;
        let request = spec::exec_request(&spec::exec_process(&any.value)?, &req.exec_id)?;
        let mut slot = self.containers.lock().await;
        let c = container_of(&mut slot, &req.id)?;
        if c.execs.contains_key(&req.exec_id) {
            return Err(ShimError::AlreadyExists(format!(
                "exec {:?} of {}",
                req.exec_id, req.id
            )));
        }
        let stdio = StdioPaths {
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
        };
        c.execs
            .insert(req.exec_id.clone(), Process::new(request, stdio));
        self.events
            .publish(TaskExecAdded {
                container_id: req.id,
                exec_id: req.exec_id,
                ..TaskExecAdded::default()
            })
            .await;
        Ok(())
    }

    async fn state(&self, req: StateRequest) -> Result<StateResponse, ShimError> {
        let mut slot = self.containers.lock().await;
        let c = container_of(&mut slot, &req.id)?;
        let bundle = c.bundle.display().to_string();
        let p = c.process(&req.exec_id)?;
        let exited = p.exited();
        let mut response = StateResponse {
            id: req.id.clone(),
            bundle,
            pid: pid(),
            stdin: p.stdio.stdin.clone(),
            stdout: p.stdio.stdout.clone(),
            stderr: p.stdio.stderr.clone(),
            terminal: p.request.tty,
            exec_id: req.exec_id.clone(),
            ..StateResponse::default()
        };
        response.set_status(p.status);
        if let Some(exited) = exited {
            response.exit_status = exited.status;
            response.exited_at = MessageField::some(exited.at);
        }
        Ok(response)
    }

    async fn wait(&self, req: WaitRequest) -> Result<WaitResponse, ShimError> {
        let mut receiver = {
            let mut slot = self.containers.lock().await;
            container_of(&mut slot, &req.id)?
                .process(&req.exec_id)?
                .subscribe()
        };
        let exited = receiver
            .wait_for(Option::is_some)
            .await
            .map_err(|_| ShimError::NoProcess {
                id: req.id.clone(),
                exec_id: req.exec_id.clone(),
            })?
            .clone();
        let exited = exited.ok_or(ShimError::Finished)?;
        Ok(WaitResponse {
            exit_status: exited.status,
            exited_at: MessageField::some(exited.at),
            ..WaitResponse::default()
        })
    }

    async fn kill(&self, req: KillRequest) -> Result<(), ShimError> {
        let signal = i32::try_from(req.signal)
            .ok()
            .filter(|s| (0..=64).contains(s))
            .ok_or_else(|| ShimError::Invalid(format!("signal {} is not 0 to 64", req.signal)))?;
        let mut slot = self.containers.lock().await;
        let c = container_of(&mut slot, &req.id)?;
        let (sandbox, root) = (c.sandbox.clone(), c.root.clone());
        let p = c.process_mut(&req.exec_id)?;
        match p.status {
            Status::STOPPED => return Err(ShimError::Finished),
            Status::CREATED => {
                // Nothing runs yet: the process ends before it starts, as if killed at once.
                let exited = Exited {
                    status: 128 + req.signal,
                    at: now(),
                };
                self.events
                    .publish(TaskExit {
                        container_id: req.id.clone(),
                        id: if req.exec_id.is_empty() {
                            req.id.clone()
                        } else {
                            req.exec_id.clone()
                        },
                        pid: pid(),
                        exit_status: exited.status,
                        exited_at: MessageField::some(exited.at.clone()),
                        ..TaskExit::default()
                    })
                    .await;
                p.set_exited(exited);
                return Ok(());
            }
            _ => {}
        }
        drop(slot);
        if signal == 0 {
            return Ok(());
        }
        let client = self.client()?;
        // `--all`: every process of the container, as runc's kill --all. Else the one
        // process, as runc signals its pid (when the container's own process dies of it,
        // `supervise` kills what is left, as a PID namespace's end would).
        let exec_id = (!req.all).then(|| spec::daemon_exec_id(&req.exec_id));
        let request = api_types::SignalRequest { signal, exec_id };
        // Start returns once the daemon has passed the command on, a moment before the agent
        // has made it: a kill in that moment finds no such command. While the process still
        // runs here (its relay has not ended), that is not its end: the signal is sent again
        // until it lands, the process ends, or KILL_LANDS_WITHIN has passed.
        let deadline = tokio::time::Instant::now() + KILL_LANDS_WITHIN;
        let mut pause = std::time::Duration::from_millis(1);
        loop {
            match client
                .signal_in(&sandbox, root.as_deref(), request.clone())
                .await
            {
                Err(client::ClientError::Api {
                    status: 404, code, ..
                }) if code == "exec_not_found"
                    && tokio::time::Instant::now() < deadline
                    && self.runs(&req.id, &req.exec_id).await =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_millis(50));
                }
                Err(client::ClientError::Api { status: 404, .. }) => {
                    return Err(ShimError::Finished)
                }
                other => return Ok(other?),
            }
        }
    }

    /// Whether process `exec_id` of container `id` runs as far as this shim knows: started,
    /// and its relay not ended.
    async fn runs(&self, id: &str, exec_id: &str) -> bool {
        let mut slot = self.containers.lock().await;
        container_of(&mut slot, id)
            .and_then(|c| c.process_mut(exec_id).map(|p| p.status == Status::RUNNING))
            .unwrap_or(false)
    }

    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse, ShimError> {
        let mut slot = self.containers.lock().await;
        let c = container_of(&mut slot, &req.id)?;
        if !req.exec_id.is_empty() {
            let p = c.process(&req.exec_id)?;
            if p.status == Status::RUNNING {
                return Err(ShimError::Precondition(format!(
                    "exec {} of {} is still running",
                    req.exec_id, req.id
                )));
            }
            let exited = p.exited();
            c.execs.remove(&req.exec_id);
            return Ok(delete_response(exited));
        }
        if c.init.status == Status::RUNNING {
            return Err(ShimError::Precondition(format!(
                "task {} is still running: kill it first",
                req.id
            )));
        }
        let released = bundle_state::release(self.client()?, &c.bundle, &mut c.held).await;
        let response = delete_response(c.init.exited());
        self.events
            .publish(TaskDelete {
                container_id: req.id.clone(),
                id: req.id.clone(),
                pid: response.pid,
                exit_status: response.exit_status,
                exited_at: response.exited_at.clone(),
                ..TaskDelete::default()
            })
            .await;
        // Forgotten either way: what could not be released is still written in the bundle,
        // and `<shim> delete` tries again once this shim has exited.
        if let Some(gone) = slot.remove(&req.id).filter(|c| c.root.is_some()) {
            self.size_pod(&slot, &gone.sandbox).await;
        }
        drop(slot);
        self.prune_idle_images().await;
        released?;
        Ok(response)
    }

    /// Sizes pod sandbox `sandbox` from its members' limits ([`pod_limits`]), as kubelet sizes
    /// a pod's cgroup: containerd 1.6 gives the pause container none, so the sandbox starts
    /// with the daemon's defaults and follows its members as they come and go. A backend that
    /// cannot change them (a microVM's are fixed at boot) is logged, and the pod runs on.
    async fn size_pod(&self, slot: &BTreeMap<String, Container>, sandbox: &str) {
        let members = slot
            .values()
            .filter(|c| c.root.is_some() && c.sandbox == sandbox)
            .map(|c| c.limits);
        let (memory_mib, vcpus) = spec::clamped(pod_limits(members));
        if memory_mib.is_none() && vcpus.is_none() {
            return;
        }
        let Ok(client) = self.client() else {
            return;
        };
        let request = api_types::UpdateSandbox { memory_mib, vcpus };
        match client.update(sandbox, &request).await {
            Ok(info) => log::info!(
                "pod sandbox {sandbox} sized by its members: {} MiB, {} vCPUs",
                info.memory_mib,
                info.vcpus
            ),
            Err(e) => log::warn!(
                "pod sandbox {sandbox} keeps its limits, not its members' ({memory_mib:?} MiB, \
                 {vcpus:?} vCPUs): {e}"
            ),
        }
    }

    /// Removes this node's `containerd-` images that no sandbox has used for
    /// `CRUCIBLE_SHIM_IMAGE_IDLE` (kubelet's image GC removes containerd's copy, never the
    /// daemon's). Best effort: a failure is logged, the delete stands.
    async fn prune_idle_images(&self) {
        let idle = match crate::daemon::image_idle_from_env() {
            Ok(Some(idle)) => idle,
            Ok(None) => return,
            Err(e) => {
                log::warn!("not pruning images: {e}");
                return;
            }
        };
        let Ok(client) = self.client() else {
            return;
        };
        match client.prune_images(idle, crate::rootfs::IMAGE_PREFIX).await {
            Ok(pruned) if !pruned.removed.is_empty() => log::info!(
                "pruned {} idle image(s), {} bytes: {:?}",
                pruned.removed.len(),
                pruned.reclaimed_bytes,
                pruned.removed
            ),
            Ok(_) => {}
            Err(e) => log::warn!("pruning idle images: {}", report::chain(&e)),
        }
    }

    /// Sets the size of a process's terminal (the relay sends it to the command's session).
    async fn resize_pty(&self, req: ResizePtyRequest) -> Result<(), ShimError> {
        let mut slot = self.containers.lock().await;
        let p = container_of(&mut slot, &req.id)?.process(&req.exec_id)?;
        let sizes = p.terminal_size.as_ref().ok_or_else(|| {
            ShimError::Precondition(format!(
                "process {} of {} has no terminal to resize (it was not started with one)",
                if req.exec_id.is_empty() {
                    "init"
                } else {
                    &req.exec_id
                },
                req.id
            ))
        })?;
        sizes.send_replace(Some(wire::TerminalSize {
            rows: u16::try_from(req.height).unwrap_or(u16::MAX),
            cols: u16::try_from(req.width).unwrap_or(u16::MAX),
        }));
        Ok(())
    }

    async fn close_io(&self, req: CloseIORequest) -> Result<(), ShimError> {
        let mut slot = self.containers.lock().await;
        let p = container_of(&mut slot, &req.id)?.process_mut(&req.exec_id)?;
        if req.stdin {
            p.stdin_hold = None;
        }
        Ok(())
    }

    async fn stats(&self, req: StatsRequest) -> Result<StatsResponse, ShimError> {
        let (sandbox, root) = {
            let mut slot = self.containers.lock().await;
            let c = container_of(&mut slot, &req.id)?;
            (c.sandbox.clone(), c.root.clone())
        };
        let client = self.client()?;
        let stats = match root {
            Some(name) => client.container_stats(&sandbox, &name).await?,
            None => client.stats(&sandbox).await?,
        };
        Ok(StatsResponse {
            stats: MessageField::some(crate::metrics::metrics_any(&stats)?),
            ..StatsResponse::default()
        })
    }

    async fn pids(&self, req: PidsRequest) -> Result<PidsResponse, ShimError> {
        let mut slot = self.containers.lock().await;
        container_of(&mut slot, &req.id)?;
        Ok(PidsResponse {
            processes: vec![ProcessInfo {
                pid: pid(),
                ..ProcessInfo::default()
            }],
            ..PidsResponse::default()
        })
    }
}

fn delete_response(exited: Option<Exited>) -> DeleteResponse {
    let mut response = DeleteResponse {
        pid: pid(),
        ..DeleteResponse::default()
    };
    if let Some(exited) = exited {
        response.exit_status = exited.status;
        response.exited_at = MessageField::some(exited.at);
    }
    response
}

fn unsupported(what: &'static str) -> containerd_shim::protos::ttrpc::Error {
    ShimError::Unsupported(what).into()
}

#[async_trait]
impl Task for Service {
    async fn create(
        &self,
        _ctx: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> TtrpcResult<CreateTaskResponse> {
        Ok(self.inner.create(req).await?)
    }

    async fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> TtrpcResult<StartResponse> {
        let pid = self.inner.start(&req.id, &req.exec_id).await?;
        Ok(StartResponse {
            pid,
            ..StartResponse::default()
        })
    }

    async fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> TtrpcResult<StateResponse> {
        Ok(self.inner.state(req).await?)
    }

    async fn wait(&self, _ctx: &TtrpcContext, req: WaitRequest) -> TtrpcResult<WaitResponse> {
        Ok(self.inner.wait(req).await?)
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: KillRequest) -> TtrpcResult<Empty> {
        self.inner.kill(req).await?;
        Ok(Empty::new())
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: ExecProcessRequest) -> TtrpcResult<Empty> {
        self.inner.exec(req).await?;
        Ok(Empty::new())
    }

    async fn delete(&self, _ctx: &TtrpcContext, req: DeleteRequest) -> TtrpcResult<DeleteResponse> {
        Ok(self.inner.delete(req).await?)
    }

    async fn close_io(&self, _ctx: &TtrpcContext, req: CloseIORequest) -> TtrpcResult<Empty> {
        self.inner.close_io(req).await?;
        Ok(Empty::new())
    }

    async fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> TtrpcResult<StatsResponse> {
        Ok(self.inner.stats(req).await?)
    }

    async fn pids(&self, _ctx: &TtrpcContext, req: PidsRequest) -> TtrpcResult<PidsResponse> {
        Ok(self.inner.pids(req).await?)
    }

    async fn connect(
        &self,
        _ctx: &TtrpcContext,
        _req: ConnectRequest,
    ) -> TtrpcResult<ConnectResponse> {
        Ok(ConnectResponse {
            shim_pid: pid(),
            task_pid: pid(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..ConnectResponse::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: ShutdownRequest) -> TtrpcResult<Empty> {
        // As runc's shim: a shim still holding a container stays (containerd asks again
        // after the task's Delete; a pod's shim, after its last container's).
        if self.inner.containers.lock().await.is_empty() {
            self.inner.exit.signal();
        }
        Ok(Empty::new())
    }

    async fn resize_pty(&self, _ctx: &TtrpcContext, req: ResizePtyRequest) -> TtrpcResult<Empty> {
        self.inner.resize_pty(req).await?;
        Ok(Empty::new())
    }

    async fn pause(&self, _ctx: &TtrpcContext, _req: PauseRequest) -> TtrpcResult<Empty> {
        Err(unsupported("pausing a task is"))
    }

    async fn resume(&self, _ctx: &TtrpcContext, _req: ResumeRequest) -> TtrpcResult<Empty> {
        Err(unsupported("resuming a task is"))
    }

    async fn checkpoint(
        &self,
        _ctx: &TtrpcContext,
        _req: CheckpointTaskRequest,
    ) -> TtrpcResult<Empty> {
        Err(unsupported("checkpointing a task is"))
    }

    async fn update(&self, _ctx: &TtrpcContext, _req: UpdateTaskRequest) -> TtrpcResult<Empty> {
        Err(unsupported("changing a running task's resources is"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_limits_are_its_members_sums_when_every_member_has_one() {
        let pod = |members: &[(Option<u64>, Option<u32>)]| pod_limits(members.iter().copied());
        assert_eq!(pod(&[]), (None, None));
        assert_eq!(pod(&[(Some(1024), Some(1))]), (Some(1024), Some(1)));
        assert_eq!(
            pod(&[(Some(1024), Some(2)), (Some(256), None)]),
            (Some(1280), None)
        );
        assert_eq!(
            pod(&[(None, Some(1)), (Some(64), Some(1))]),
            (None, Some(2))
        );
    }
}
