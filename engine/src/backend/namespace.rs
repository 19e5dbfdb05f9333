//! The namespace backend: the agent as PID 1 of a new user namespace (its own host id range)
//! and new PID/mount/UTS/IPC/net/cgroup namespaces, rooted in the idmapped image under a tmpfs
//! overlay, limited by cgroups, seccomp and a small set of namespaced capabilities. The agent
//! does the entering itself (`guest-init sandbox …`, see the `namespace` crate); this side
//! gives each sandbox its id range, prepares the directories and cgroups, starts it, and waits
//! for its hello on a Unix socket.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use namespace::{IdMap, SandboxSpec};

use api_types::BackendKind;
use tokio::net::{UnixListener, UnixStream};
use tokio::process::Command;
use tokio::sync::{watch, Notify};
use wire::agent::Hello;

use super::cgroup::{CgroupLimits, SandboxCgroups};
use super::supervised::{spawn_and_await_hello, Diagnostics, SandboxProcess};
use super::{
    AdoptSpec, Backend, BackendError, BoxFuture, Capabilities, ContainerHost, ContainerSecurity,
    EgressSink, EgressStream, Held, ImagePaths, Instance, InstanceSpec, MountSource, MountSpec,
    Resizable, Restorable,
};
use crate::restore::RestoreError;

// The PATH commands see unless the sandbox's env overrides it: the agent's own default too.
use contract::DEFAULT_PATH;

/// Creates namespace sandboxes.
#[derive(Debug)]
pub(crate) struct NamespaceBackend {
    image: ImagePaths,
    state_dir: PathBuf,
    cgroup_root: PathBuf,
    cgroup_parent: String,
    max_pids: u64,
    scratch_mib: u64,
    ready_timeout: Duration,
    id_ranges: IdRanges,
    /// The CPUs each sandbox runs on, as many as its vCPUs.
    cpus: super::cpu_rotation::CpuRotation,
    /// Whether sandboxes outlive the daemon (`--live-restore`): their supervisors are then not
    /// tied to it.
    live_restore: bool,
}

/// The host id ranges of namespace sandboxes: one of 65,536 ids per live sandbox, never
/// shared. Sandboxes sharing host ids would share what the kernel accounts per user (pipe
/// buffers, message queues, signal queues) and the owner of anything one of them ever leaves
/// on a host filesystem; distinct ranges cost nothing, since the image is idmapped into each.
#[derive(Debug, Clone)]
pub struct IdRanges {
    base: u32,
    free: Arc<FreeRanges>,
}

/// The free slots, and a wake-up for a create waiting for one.
#[derive(Debug, Default)]
struct FreeRanges {
    slots: Mutex<BTreeSet<u32>>,
    returned: Notify,
}

/// How long a create waits for a range still held by a sandbox being torn down. The registry
/// counts a deleted sandbox out as its deletion starts, but its range comes back only once
/// its processes are gone, a few milliseconds later.
const RANGE_WAIT: Duration = Duration::from_secs(5);

/// A sandbox's id range, returned to the pool when dropped (after its processes are gone).
#[derive(Debug)]
struct IdRange {
    slot: u32,
    map: IdMap,
    free: Arc<FreeRanges>,
}

impl Drop for IdRange {
    fn drop(&mut self) {
        self.free
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(self.slot);
        self.free.returned.notify_waiters();
    }
}

/// Why the sandboxes' host id ranges cannot be used (checked when the daemon starts).
#[derive(Debug, thiserror::Error)]
pub enum IdRangeError {
    /// The ranges do not fit below the last valid id.
    #[error(
        "--uid-base {base} with --max-sandboxes {sandboxes} needs host ids up to {last}, past \
         the last valid id {}; lower either",
        u32::MAX - 1
    )]
    Overflow {
        /// The configured base.
        base: u32,
        /// The configured sandbox count.
        sandboxes: usize,
        /// The last id the ranges would need.
        last: u64,
    },
    /// Sandbox root would be host root.
    #[error("--uid-base must not be 0: a sandbox's root is never the host's")]
    BaseZero,
}

impl IdRanges {
    /// Checks that `slots` ranges from `base` fit below the last valid host id.
    pub fn check(base: u32, slots: usize) -> Result<(), IdRangeError> {
        if base == 0 {
            return Err(IdRangeError::BaseZero);
        }
        let last = u64::from(base) + slots as u64 * u64::from(namespace::SANDBOX_IDS);
        if last > u64::from(u32::MAX) {
            return Err(IdRangeError::Overflow {
                base,
                sandboxes: slots,
                last: last - 1,
            });
        }
        Ok(())
    }

    /// `slots` ranges from `base` (checked by [`IdRanges::check`] at startup).
    pub(crate) fn new(base: u32, slots: usize) -> Self {
        let slots = u32::try_from(slots).unwrap_or(u32::MAX);
        IdRanges {
            base,
            free: Arc::new(FreeRanges {
                slots: Mutex::new((0..slots).collect()),
                returned: Notify::new(),
            }),
        }
    }

    /// Range `slot`, which a sandbox an earlier daemon made holds (live restore); refused when
    /// it is not free here.
    fn claim(&self, slot: u32) -> Result<IdRange, String> {
        if !self
            .free
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&slot)
        {
            return Err(format!("host id range {slot} is not free"));
        }
        let mut range = IdRange {
            slot,
            map: IdMap::default(),
            free: self.free.clone(),
        };
        let host_base = u64::from(self.base) + u64::from(slot) * u64::from(namespace::SANDBOX_IDS);
        range.map = u32::try_from(host_base)
            .map_err(|_| format!("host id {host_base} is out of range"))
            .and_then(|b| IdMap::new(b, namespace::SANDBOX_IDS))?;
        Ok(range)
    }

    /// The lowest free range, waiting up to `wait` for one to be returned when every range is
    /// held (by sandboxes whose teardown is still under way).
    async fn take(&self, wait: Duration) -> Result<IdRange, BackendError> {
        let deadline = tokio::time::Instant::now() + wait;
        let slot = loop {
            // Registered before looking, so a range returned in between still wakes us.
            let returned = self.free.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            let slot = self
                .free
                .slots
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_first();
            if let Some(slot) = slot {
                break slot;
            }
            if tokio::time::timeout_at(deadline, returned).await.is_err() {
                return Err(BackendError::Exhausted(format!(
                    "every host id range is held by a sandbox still being torn down (waited \
                     {wait:?}); retry"
                )));
            }
        };
        let no_range = |reason: String| {
            BackendError::setup(
                "allocating the sandbox's host id range",
                io::Error::other(reason),
            )
        };
        let host_base = u64::from(self.base) + u64::from(slot) * u64::from(namespace::SANDBOX_IDS);
        // Returned to the pool even if the map below is refused.
        let mut range = IdRange {
            slot,
            map: IdMap::default(),
            free: self.free.clone(),
        };
        range.map = u32::try_from(host_base)
            .map_err(|_| no_range(format!("host id {host_base} is out of range")))
            .and_then(|b| IdMap::new(b, namespace::SANDBOX_IDS).map_err(no_range))?;
        Ok(range)
    }
}

impl NamespaceBackend {
    /// A backend using the image's root tree, keeping per-sandbox state under `state_dir`.
    pub(crate) fn new(
        image: ImagePaths,
        state_dir: PathBuf,
        cgroup_parent: String,
        max_pids: u64,
        scratch_mib: u64,
        ready_timeout: Duration,
        id_ranges: IdRanges,
    ) -> Self {
        NamespaceBackend {
            image,
            state_dir,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            cgroup_parent,
            max_pids,
            scratch_mib,
            ready_timeout,
            id_ranges,
            cpus: super::cpu_rotation::CpuRotation::of_this_process(),
            live_restore: false,
        }
    }

    /// With sandboxes that outlive the daemon (`--live-restore`).
    pub(crate) fn with_live_restore(mut self, live_restore: bool) -> Self {
        self.live_restore = live_restore;
        self
    }

    /// Why this host cannot run namespace sandboxes, if it cannot.
    fn why_unavailable(&self) -> Option<String> {
        if !self.image.agent().is_file() {
            return Some(format!(
                "no agent at {} (build the image: cargo xtask build-image)",
                self.image.agent().display()
            ));
        }
        let is_root = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
            .unwrap_or(false);
        if !is_root {
            return Some("creating namespaces, mounts and cgroups needs root".into());
        }
        None
    }

    fn runtime_dir(&self, id: &str) -> PathBuf {
        self.state_dir.join("sandboxes").join(id)
    }

    fn log_path(&self, id: &str) -> PathBuf {
        self.state_dir.join("logs").join(format!("{id}.log"))
    }

    async fn create_instance(&self, spec: InstanceSpec) -> Result<NamespaceInstance, BackendError> {
        if let Some(reason) = self.why_unavailable() {
            return Err(BackendError::Unavailable {
                backend: BackendKind::Namespace,
                reason,
            });
        }
        let (mut cleanup, id_map) = self.claim_host_resources(&spec).await?;
        // From here on, whatever fails gives back what was claimed: nothing runs yet.
        let started = match self.start_supervisor(spec, id_map, &mut cleanup).await {
            Ok(started) => started,
            Err(e) => {
                cleanup.run().await;
                return Err(e);
            }
        };
        Ok(NamespaceInstance {
            hello: started.hello,
            socket: started.agent_socket,
            container_sockets: std::sync::Mutex::new(
                started.container_sockets.into_iter().enumerate().collect(),
            ),
            process: SandboxProcess::watch(
                started.child,
                "the sandbox's init".into(),
                started.diagnostics,
            ),
            cleanup: tokio::sync::Mutex::new(Some(cleanup)),
            log_path: started.log_path,
            egress_task: started.egress_task,
            record: started.record,
            agent: self.image.agent(),
            from_host_paths: std::sync::Mutex::default(),
        })
    }

    /// What a sandbox holds of the host before anything runs: its runtime directory, its
    /// cgroups and a range of user ids; given back by [`Cleanup::run`].
    async fn claim_host_resources(
        &self,
        spec: &InstanceSpec,
    ) -> Result<(Cleanup, IdMap), BackendError> {
        let runtime_dir = self.runtime_dir(&spec.id);
        create_private_dir(&runtime_dir)?;
        if let Some(dir) = self.log_path(&spec.id).parent() {
            create_private_dir(dir)?;
        }
        let cgroups = SandboxCgroups::create(
            &self.cgroup_root,
            &self.cgroup_parent,
            &spec.id,
            CgroupLimits {
                memory_bytes: spec.memory_mib * 1024 * 1024,
                pids: self.max_pids,
                cpus: spec.vcpus,
            },
        )
        .map_err(|e| BackendError::setup("creating the sandbox's cgroups", e))?;
        let mut cleanup = Cleanup {
            runtime_dir: Some(runtime_dir),
            cgroups: Some(cgroups),
            ids: None,
            cpus: None,
        };
        match self.id_ranges.take(RANGE_WAIT).await {
            Ok(ids) => {
                let map = ids.map;
                cleanup.ids = Some(ids);
                Ok((cleanup, map))
            }
            Err(e) => {
                cleanup.run().await;
                Err(e)
            }
        }
    }

    /// Starts the sandbox's supervisor (`guest-init sandbox …`) and waits for its agent's
    /// hello; its CPUs go into `cleanup`.
    async fn start_supervisor(
        &self,
        spec: InstanceSpec,
        id_map: IdMap,
        cleanup: &mut Cleanup,
    ) -> Result<Started, BackendError> {
        let runtime_dir = self.runtime_dir(&spec.id);
        let log_path = self.log_path(&spec.id);
        let ready_path = runtime_dir.join("ready.sock");
        let ready = UnixListener::bind(&ready_path)
            .map_err(|e| BackendError::setup(format!("bind {}", ready_path.display()), e))?;
        let log = std::fs::File::create(&log_path)
            .map_err(|e| BackendError::setup(format!("create {}", log_path.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| BackendError::setup("duplicate the log file", e))?;
        let egress_path = runtime_dir.join("egress.sock");
        let egress = match &spec.egress {
            Some(sink) => Some((
                UnixListener::bind(&egress_path).map_err(|e| {
                    BackendError::setup(format!("bind {}", egress_path.display()), e)
                })?,
                sink.clone(),
            )),
            None => None,
        };
        let agent_socket = runtime_dir.join("agent.sock");
        let (id, hostname, memory_mib) = (spec.id.clone(), spec.hostname.clone(), spec.memory_mib);
        let container_sockets: Vec<PathBuf> = (0..spec.containers.len())
            .map(|i| namespace::container_socket(&runtime_dir, i))
            .collect();
        let cpus = self.cpus.take(spec.vcpus);
        let args = SandboxSpec {
            rootfs: spec
                .root
                .as_ref()
                .map_or_else(|| self.image.rootfs.clone(), |root| root.dir.clone()),
            runtime_dir,
            agent_socket: agent_socket.clone(),
            ready_socket: ready_path.clone(),
            hostname: hostname.clone(),
            scratch_mib: disk_mib(self.scratch_mib, spec.memory_mib),
            scratch_disk: spec.disk.clone(),
            mounts: spec.mounts.iter().map(extra_mount).collect(),
            egress_socket: egress.as_ref().map(|_| egress_path.clone()),
            id_map,
            // Under live restore the sandbox outlives the daemon; otherwise it dies with it.
            die_with_parent: !self.live_restore,
            cgroup_procs: cleanup
                .cgroups
                .iter()
                .flat_map(|c| c.procs_files())
                .collect(),
            commands_cgroup: cleanup.cgroups.iter().find_map(|c| c.commands_procs_file()),
            containers: spec.containers,
            shared: spec.shared,
            network_namespace: spec.network_namespace,
            sysctls: spec.sysctls,
            cpus: cpus.cpus().to_vec(),
        }
        .to_args();
        cleanup.cpus = Some(cpus);
        let mut command = self.supervisor_command(args, memory_mib, &hostname, log, log_err);
        let what = format!("the sandbox's init {}", self.image.agent().display());
        let diagnostics = Diagnostics::new().with("its log", &log_path);
        let (child, hello) = spawn_and_await_hello(
            &mut command,
            &ready,
            self.ready_timeout,
            &what,
            &diagnostics,
        )
        .await?;
        drop(ready);
        let _ = std::fs::remove_file(&ready_path);
        let record = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .and_then(|pid| {
                let ticks = crate::restore::process_start_ticks(pid).ok()?;
                Some(crate::restore::InstanceRecord {
                    supervisor_pid: pid,
                    supervisor_start_ticks: ticks,
                    id_slot: cleanup.ids.as_ref()?.slot,
                    hello: hello.clone(),
                    hypervisor: None,
                    devices: Vec::new(),
                    container_slots: Vec::new(),
                })
            });
        // The sandbox connected before entering; the path is of no more use.
        let egress_task = egress.map(|(listener, sink)| {
            let _ = std::fs::remove_file(&egress_path);
            tokio::spawn(receive_egress(listener, sink, id))
        });
        Ok(Started {
            hello,
            agent_socket,
            container_sockets,
            child,
            diagnostics,
            log_path,
            egress_task,
            record,
        })
    }

    /// The supervisor's command line and environment: none of the daemon's (API keys among
    /// it) and none of the sandbox's own (the daemon adds it to every exec request, so an
    /// agent started before it was known, a warm pool's, is the same as one started after).
    fn supervisor_command(
        &self,
        args: Vec<std::ffi::OsString>,
        memory_mib: u64,
        hostname: &str,
        log: std::fs::File,
        log_err: std::fs::File,
    ) -> Command {
        let mut command = Command::new(self.image.agent());
        command
            .arg("sandbox")
            .args(args)
            .arg("--memory-bytes")
            .arg((memory_mib * 1024 * 1024).to_string())
            .env_clear()
            .env("PATH", DEFAULT_PATH)
            .env("HOME", contract::AGENT_HOME)
            .env("HOSTNAME", hostname)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .kill_on_drop(!self.live_restore);
        if self.live_restore {
            super::supervised::outlive_the_daemon(&mut command);
        }
        command
    }

    /// Takes back sandbox `id` as `record` describes it (live restore): its supervisor the
    /// recorded process, its cgroups holding it, its id range free here, its agent answering
    /// with the recorded hello on the sandbox's socket.
    async fn adopt_instance(
        &self,
        id: &str,
        record: &crate::restore::InstanceRecord,
        spec: AdoptSpec,
    ) -> Result<NamespaceInstance, RestoreError> {
        let mismatch = |why: String| RestoreError::Mismatch(why);
        let runtime_dir = self.runtime_dir(id);
        let log_path = self.log_path(id);
        let diagnostics = Diagnostics::new().with("its log", &log_path);
        let pid = record.supervisor_pid;
        let process = SandboxProcess::adopt(
            pid,
            record.supervisor_start_ticks,
            "the sandbox's init".into(),
            diagnostics,
        )
        .map_err(|e| mismatch(format!("its supervisor (pid {pid}): {e}")))?;
        // From here the process is the recorded one: a refusal kills it. Its id range is
        // held until it is gone (released last, as for any sandbox).
        let ids = self.id_ranges.claim(record.id_slot).map_err(mismatch);
        let checked = async {
            let cgroups = SandboxCgroups::adopt(&self.cgroup_root, &self.cgroup_parent, id, pid)
                .map_err(|e| mismatch(report::chain(&e)))?;
            let socket = runtime_dir.join("agent.sock");
            let hello = super::ping_agent(super::connect_unix(&socket))
                .await
                .map_err(|e| mismatch(format!("its agent ({}): {e}", socket.display())))?;
            if hello != record.hello {
                return Err(mismatch(format!(
                    "its agent is not the recorded one: it says {hello:?}, the record {:?}",
                    record.hello
                )));
            }
            let egress_task = match spec.egress {
                Some(sink) => Some(
                    hand_over_egress_uplink(&socket, sink, id.to_string())
                        .await
                        .map_err(|e| mismatch(format!("its egress uplink: {e}")))?,
                ),
                None => None,
            };
            Ok((cgroups, socket, hello, egress_task))
        }
        .await;
        let (ids, (cgroups, socket, hello, egress_task)) = match (ids, checked) {
            (Ok(ids), Ok(found)) => (ids, found),
            (ids, checked) => {
                let gone = process
                    .kill_refused(&format!("the supervisor of refused sandbox {id}"))
                    .await;
                let why = match (ids, checked) {
                    (Err(e), _) => e,
                    (Ok(ids), Err(e)) => {
                        if !gone {
                            // Its processes may still hold the range's ids: never hand it out
                            // again.
                            std::mem::forget(ids);
                        }
                        e
                    }
                    (Ok(_), Ok(_)) => unreachable!("matched above"),
                };
                return Err(why);
            }
        };
        Ok(NamespaceInstance {
            hello,
            socket,
            // A sandbox with containers leaves no record (`Sandbox::record`).
            container_sockets: std::sync::Mutex::default(),
            process,
            cleanup: tokio::sync::Mutex::new(Some(Cleanup {
                runtime_dir: Some(runtime_dir),
                cgroups: Some(cgroups),
                ids: Some(ids),
                // The CPUs an earlier daemon gave it, counted again.
                cpus: Some(self.cpus.adopt(record.supervisor_pid)),
            })),
            log_path,
            egress_task,
            record: Some(record.clone()),
            agent: self.image.agent(),
            from_host_paths: std::sync::Mutex::default(),
        })
    }
}

/// How long the agent may take to take a new egress uplink.
const UPLINK_TIMEOUT: Duration = Duration::from_secs(5);

/// Gives a taken-back sandbox's agent a new egress uplink (the old one was a connection to the
/// daemon that died): one end of a fresh socket pair goes to the agent, over a connection of
/// its own, with `SCM_RIGHTS`; the agent sends its proxy's listening socket over it, and the
/// connections accepted on that go to `sink` as before.
async fn hand_over_egress_uplink(
    agent_socket: &Path,
    sink: EgressSink,
    id: String,
) -> io::Result<tokio::task::JoinHandle<()>> {
    use std::os::fd::AsFd;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let handed = async {
        let mut agent = super::connect_unix(agent_socket).await?;
        wire::write_message_async(&mut agent, &wire::agent::AgentRequest::EgressUplink)
            .await
            .map_err(|e| io::Error::other(e.to_string()))?;
        // In a message of its own, after the request: the agent's read of the request takes
        // exactly its bytes, so it cannot swallow (and so close) the descriptor.
        let theirs = std::os::fd::OwnedFd::from(theirs);
        loop {
            agent.writable().await?;
            match agent.try_io(tokio::io::Interest::WRITABLE, || {
                namespace::send_stream(agent.as_fd(), &theirs)
            }) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        match wire::read_message_async(&mut agent).await {
            Ok(wire::agent::AgentReply::EgressUplinked) => Ok(()),
            Ok(other) => Err(io::Error::other(format!("it answered {other:?}"))),
            Err(e) => Err(io::Error::other(e.to_string())),
        }
    };
    tokio::time::timeout(UPLINK_TIMEOUT, handed)
        .await
        .map_err(|_| io::Error::other(format!("no answer within {UPLINK_TIMEOUT:?}")))??;
    ours.set_nonblocking(true)?;
    let control = UnixStream::from_std(ours)?;
    Ok(tokio::spawn(receive_egress_on(control, sink, id)))
}

fn extra_mount(mount: &MountSpec) -> namespace::ExtraMount {
    let (kind, source) = match &mount.source {
        MountSource::Ext4Image(path) => (namespace::MountKind::Ext4Image, path.clone()),
        MountSource::Directory(path) => (namespace::MountKind::HostDir, path.clone()),
    };
    namespace::ExtraMount {
        kind,
        source,
        target: PathBuf::from(&mount.target),
        read_only: mount.read_only,
    }
}

/// Serves a sandbox's egress proxy on what its agent hands over on the one connection the
/// sandbox made before entering: the proxy's listening socket, on which the daemon accepts
/// each connection and gives it to `sink`, for as long as that connection stays open (the
/// agent holds it until the sandbox ends). Whatever arrives is checked first: the agent is
/// the sandbox's PID 1, but a sandbox is hostile by assumption.
async fn receive_egress(listener: UnixListener, sink: EgressSink, id: String) {
    let control = match listener.accept().await {
        Ok((control, _)) => control,
        Err(e) => {
            tracing::warn!(sandbox = %id, "egress: accepting the agent's connection: {e}");
            return;
        }
    };
    drop(listener);
    receive_egress_on(control, sink, id).await;
}

/// What happened next on a sandbox's egress.
enum EgressEvent {
    /// The agent's connection has something to read (or failed).
    Control(io::Result<()>),
    /// The proxy's listening socket gave a connection (or failed).
    Accepted(io::Result<tokio::net::TcpStream>),
}

/// [`receive_egress`] on the agent's connection `control`.
async fn receive_egress_on(control: UnixStream, sink: EgressSink, id: String) {
    use std::os::fd::AsFd;
    let mut proxy: Option<tokio::net::TcpListener> = None;
    loop {
        let event = tokio::select! {
            ready = control.readable() => EgressEvent::Control(ready),
            accepted = accept_on(proxy.as_ref()) => EgressEvent::Accepted(accepted),
        };
        match event {
            EgressEvent::Accepted(Ok(tcp)) => {
                // The relay's writes are the remote's own segments: no added latency.
                let _ = tcp.set_nodelay(true);
                sink(EgressStream::Tcp(tcp))
            }
            EgressEvent::Accepted(Err(e)) => {
                // Out of descriptors, say: back off rather than spin, and keep serving.
                tracing::debug!(sandbox = %id, "egress: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            EgressEvent::Control(Err(_)) => return,
            EgressEvent::Control(Ok(())) => {
                let received = control.try_io(tokio::io::Interest::READABLE, || {
                    namespace::recv_stream(control.as_fd())
                });
                let fd = match received {
                    Ok(Some(fd)) => fd,
                    // The agent is gone, and with it the sandbox: so is its proxy.
                    Ok(None) => return,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => {
                        tracing::warn!(sandbox = %id, "egress: receiving a descriptor: {e}");
                        return;
                    }
                };
                match egress_descriptor(fd) {
                    Ok(EgressDescriptor::Listener(listener)) => proxy = Some(listener),
                    Ok(EgressDescriptor::Stream(stream)) => sink(stream),
                    Err(e) => tracing::warn!(
                        sandbox = %id,
                        "egress: refused a handed-over descriptor: {e}"
                    ),
                }
            }
        }
    }
}

/// The next connection on `proxy`; never, without one.
async fn accept_on(proxy: Option<&tokio::net::TcpListener>) -> io::Result<tokio::net::TcpStream> {
    match proxy {
        Some(listener) => listener.accept().await.map(|(tcp, _)| tcp),
        None => std::future::pending().await,
    }
}

/// A descriptor an agent handed over.
enum EgressDescriptor {
    /// Its proxy's listening TCP socket (one at a time: a later one replaces it).
    Listener(tokio::net::TcpListener),
    /// One connection to its proxy.
    Stream(EgressStream),
}

/// The received descriptor as a listening TCP socket or a connected stream, if it is either.
fn egress_descriptor(fd: std::os::fd::OwnedFd) -> io::Result<EgressDescriptor> {
    let socket = socket2::Socket::from(fd);
    if socket.r#type()? != socket2::Type::STREAM {
        return Err(io::Error::other("not a stream socket"));
    }
    socket.set_nonblocking(true)?;
    let local = socket.local_addr()?;
    if local.as_socket().is_some() {
        if socket.is_listener()? {
            let listener = std::net::TcpListener::from(socket);
            return tokio::net::TcpListener::from_std(listener).map(EgressDescriptor::Listener);
        }
        let tcp = std::net::TcpStream::from(socket);
        return tokio::net::TcpStream::from_std(tcp)
            .map(|tcp| EgressDescriptor::Stream(EgressStream::Tcp(tcp)));
    }
    if local.is_unix() && !socket.is_listener()? {
        let unix = std::os::unix::net::UnixStream::from(socket);
        return UnixStream::from_std(unix)
            .map(|unix| EgressDescriptor::Stream(EgressStream::Unix(unix)));
    }
    Err(io::Error::other(
        "neither a listening TCP socket nor a connected TCP or Unix socket",
    ))
}

/// The size of a sandbox's writable layer: the configured size, but at most three quarters of
/// its memory limit. The layer is a tmpfs, whose pages are charged to the sandbox's memory
/// cgroup and cannot be swapped out; were it as large as the limit, filling it would end in an
/// OOM kill (of whichever command is largest, possibly one that never wrote) instead of
/// `ENOSPC` for the writer, with memory to spare for the commands.
pub(crate) fn disk_mib(configured_mib: u64, memory_mib: u64) -> u64 {
    configured_mib.min(memory_mib.saturating_mul(3) / 4).max(1)
}

fn create_private_dir(path: &Path) -> Result<(), BackendError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| BackendError::setup(format!("create {}", path.display()), e))
}

/// A started supervisor, before it becomes a [`NamespaceInstance`].
struct Started {
    hello: Hello,
    agent_socket: PathBuf,
    container_sockets: Vec<PathBuf>,
    child: tokio::process::Child,
    diagnostics: Diagnostics,
    log_path: PathBuf,
    egress_task: Option<tokio::task::JoinHandle<()>>,
    record: Option<crate::restore::InstanceRecord>,
}

/// What to release when a sandbox goes away.
#[derive(Debug)]
struct Cleanup {
    runtime_dir: Option<PathBuf>,
    cgroups: Option<SandboxCgroups>,
    /// Released last, once no process of the sandbox can be left.
    ids: Option<IdRange>,
    /// The CPUs it runs on, counted as taken while it lives (none for a sandbox an earlier
    /// daemon made: its CPUs are not counted).
    cpus: Option<super::cpu_rotation::CpuLease>,
}

impl Cleanup {
    async fn run(&mut self) {
        if let Some(cgroups) = self.cgroups.take() {
            if let Err(e) = cgroups.remove().await {
                tracing::warn!("{e}");
            }
        }
        if let Some(dir) = self.runtime_dir.take() {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!("remove {}: {e}", dir.display());
            }
        }
        self.ids.take();
        self.cpus.take();
    }
}

/// A running namespace sandbox.
#[derive(Debug)]
pub(crate) struct NamespaceInstance {
    hello: Hello,
    socket: PathBuf,
    /// Its containers' agents' sockets, by index: the spec's, then those added.
    container_sockets: std::sync::Mutex<BTreeMap<usize, PathBuf>>,
    process: SandboxProcess,
    cleanup: tokio::sync::Mutex<Option<Cleanup>>,
    log_path: PathBuf,
    /// Takes the sandbox's proxied connections from its agent.
    egress_task: Option<tokio::task::JoinHandle<()>>,
    /// What a restarted daemon needs to take it back.
    record: Option<crate::restore::InstanceRecord>,
    /// The agent binary, which also carries the host's later mounts into a container
    /// (`sync-host-mounts`).
    agent: PathBuf,
    /// The `HostToContainer` host paths of its containers, by index: carried in again before
    /// each connection to the container's agent (`namespace::propagation`).
    from_host_paths: std::sync::Mutex<BTreeMap<usize, Vec<namespace::HostPathMount>>>,
}

/// How long carrying the host's later mounts into a container may take.
const CARRY_MOUNTS_TIMEOUT: Duration = Duration::from_secs(10);

impl NamespaceInstance {
    /// Carries the host's mounts made below the container's `HostToContainer` host paths
    /// since they were mounted into it, idmapped (`namespace::propagation`), through the
    /// agent binary's single-threaded `sync-host-mounts` (entering a mount namespace takes
    /// one thread). `socket` is the container's agent's.
    async fn carry_host_mounts(
        &self,
        socket: &Path,
        paths: &[namespace::HostPathMount],
    ) -> io::Result<()> {
        let supervisor = self
            .record
            .as_ref()
            .map(|r| r.supervisor_pid)
            .ok_or_else(|| {
                io::Error::other("the daemon has no record of the sandbox's supervisor")
            })?;
        let mut command = tokio::process::Command::new(&self.agent);
        command
            .arg("sync-host-mounts")
            .arg(socket)
            .arg(supervisor.to_string());
        for path in paths {
            command
                .arg(&path.source)
                .arg(&path.target)
                .arg(if path.read_only { "ro" } else { "rw" });
        }
        command
            .kill_on_drop(true)
            .stdin(std::process::Stdio::null());
        let out = tokio::time::timeout(CARRY_MOUNTS_TIMEOUT, command.output())
            .await
            .map_err(|_| {
                io::Error::other(format!(
                    "carrying the host's later mounts into the container took over {} s",
                    CARRY_MOUNTS_TIMEOUT.as_secs()
                ))
            })??;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "carrying the host's later mounts into the container: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Whether its PID 1's mount table (the kernel's) has the filesystem of `device`
    /// (`major:minor`) mounted at `target`.
    fn check_mount(&self, device: &str, target: &str) -> Result<(), String> {
        let supervisor = self
            .record
            .as_ref()
            .map(|r| r.supervisor_pid)
            .ok_or("it has no record of its supervisor")?;
        let init = super::mount_table::sandbox_init(supervisor)
            .map_err(|e| format!("its PID 1 (the child of pid {supervisor}): {e}"))?;
        let table = std::fs::read_to_string(format!("/proc/{init}/mountinfo"))
            .map_err(|e| format!("the mount table of its PID 1 (pid {init}): {e}"))?;
        if super::mount_table::mounted_at(&table, device, target) {
            Ok(())
        } else {
            Err(format!(
                "device {device} is not mounted at {target} in its PID 1's mount table (pid {init})"
            ))
        }
    }
}

impl NamespaceInstance {
    /// What its writable layer holds and can hold: the filesystem under its PID 1's root
    /// (an overlay reports its upper layer's: the in-memory scratch, or the disk image).
    fn writable_layer(&self) -> Option<wire::DiskStats> {
        let supervisor = self.record.as_ref()?.supervisor_pid;
        let init = super::mount_table::sandbox_init(supervisor).ok()?;
        let fs = nix::sys::statvfs::statvfs(format!("/proc/{init}/root/").as_str()).ok()?;
        let block = fs.fragment_size();
        Some(wire::DiskStats {
            used_bytes: fs
                .blocks()
                .saturating_sub(fs.blocks_free())
                .saturating_mul(block),
            limit_bytes: fs.blocks().saturating_mul(block),
        })
    }
}

/// The device number of the loop device `image` backs now, as a mount table shows it.
fn loop_device(image: &Path) -> Result<String, String> {
    crate::storage::loop_device_of(image)
        .ok_or_else(|| format!("{} backs no loop device", image.display()))
}

impl Instance for NamespaceInstance {
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
            if let Some(task) = &self.egress_task {
                task.abort();
            }
            if let Some(mut cleanup) = self.cleanup.lock().await.take() {
                cleanup.run().await;
            }
            let _ = std::fs::remove_file(&self.log_path);
        })
    }

    fn stats(&self) -> BoxFuture<'_, Option<wire::SandboxStats>> {
        Box::pin(async move {
            let cleanup = self.cleanup.lock().await;
            let cgroups = cleanup.as_ref()?.cgroups.as_ref()?;
            let mut stats = cgroups.stats();
            stats.disk = self.writable_layer().unwrap_or_default();
            Some(stats)
        })
    }

    fn containers(&self) -> Option<&dyn ContainerHost> {
        Some(self)
    }

    fn restorable(&self) -> Option<&dyn Restorable> {
        Some(self)
    }

    fn resizable(&self) -> Option<&dyn Resizable> {
        Some(self)
    }
}

impl ContainerHost for NamespaceInstance {
    fn connect_container(&self, index: usize) -> BoxFuture<'_, io::Result<UnixStream>> {
        Box::pin(async move {
            let socket = self
                .container_sockets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&index)
                .cloned();
            let Some(socket) = socket else {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("the sandbox has no container {index}"),
                ));
            };
            let from_host = self
                .from_host_paths
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&index)
                .cloned();
            if let Some(paths) = from_host {
                // Never in the way of the container's agent (a stop, a kill): the command
                // then sees the host's later mounts as the kernel propagated them.
                if let Err(e) = self.carry_host_mounts(&socket, &paths).await {
                    tracing::warn!(container = index, "{e}");
                }
            }
            super::connect_unix(&socket).await
        })
    }

    fn add_container<'a>(
        &'a self,
        index: usize,
        root: &'a namespace::ContainerRoot,
        _disk: Option<&'a Path>,
        shared: &'a [wire::agent::SharedDir],
        host_paths: &'a [namespace::HostPathMount],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let supervisor = self
                .record
                .as_ref()
                .map(|r| r.supervisor_pid)
                .ok_or("the daemon has no record of the sandbox's supervisor")?;
            let runtime_dir = self
                .socket
                .parent()
                .ok_or("the agent's socket has no directory")?
                .to_path_buf();
            let socket = namespace::container_socket(&runtime_dir, index);
            let agent_socket = self.socket.clone();
            let request = wire::agent::AgentRequest::AddContainer {
                name: root.name.clone(),
                index,
                shared: shared.to_vec(),
                share_pids: root.share_pids,
                command_is_pid1: root.command_is_pid1,
                disk: None,
                security: match root.security.is_default() {
                    true => String::new(),
                    false => root.security.to_string(),
                },
                host_paths: host_paths.iter().map(|h| h.target.clone()).collect(),
            };
            let rootfs = root.rootfs.clone();
            let made = socket.clone();
            let from_host: Vec<_> = host_paths
                .iter()
                .filter(|h| h.propagation == namespace::Propagation::FromHost)
                .cloned()
                .collect();
            let host_paths = host_paths.to_vec();
            // Mounts, binds and a blocking exchange with the agent: off the runtime's threads.
            tokio::task::spawn_blocking(move || {
                let mounts = super::container_add::Mounts {
                    rootfs: &rootfs,
                    host_paths: &host_paths,
                };
                super::container_add::ask_agent(supervisor, mounts, &made, &agent_socket, &request)
            })
            .await
            .map_err(|e| format!("adding the container stopped: {e}"))??;
            self.container_sockets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(index, socket);
            if !from_host.is_empty() {
                self.from_host_paths
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(index, from_host);
            }
            Ok(())
        })
    }

    fn container_removed(&self, index: usize) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let socket = self
                .container_sockets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&index);
            self.from_host_paths
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&index);
            // The daemon bound it; its agent has ended, so nothing listens on it any more.
            if let Some(socket) = socket {
                if let Err(e) = std::fs::remove_file(&socket) {
                    if e.kind() != io::ErrorKind::NotFound {
                        tracing::warn!("removing {}: {e}", socket.display());
                    }
                }
            }
        })
    }
}

impl Restorable for NamespaceInstance {
    fn record(&self) -> Option<crate::restore::InstanceRecord> {
        self.record.clone()
    }

    fn check_holds(&self, what: Held<'_>) -> Result<(), String> {
        match what {
            Held::Mounted { image, target } => self.check_mount(&loop_device(image)?, target),
            // The writable layer also holds `/tmp`, bound from it (namespace::mounts).
            Held::WritableLayer { image } => self.check_mount(&loop_device(image)?, "/tmp"),
            Held::Bound { dir, target } => {
                use std::os::unix::fs::MetadataExt;
                let dev = std::fs::metadata(dir)
                    .map_err(|e| format!("{}: {e}", dir.display()))?
                    .dev();
                let device = format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev));
                self.check_mount(&device, target)
            }
            Held::RootImage { .. } => Err("a namespace sandbox boots no root image".into()),
        }
    }
}

impl Resizable for NamespaceInstance {
    fn set_limits(
        &self,
        memory_mib: Option<u64>,
        vcpus: Option<u32>,
    ) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let cleanup = self.cleanup.lock().await;
            let cgroups = cleanup
                .as_ref()
                .and_then(|c| c.cgroups.as_ref())
                .ok_or("it is being destroyed")?;
            cgroups
                .set_limits(memory_mib.map(|m| m * 1024 * 1024), vcpus)
                .map_err(|e| format!("its cgroups: {e}"))
        })
    }
}

/// What the backend gives a sandbox. A namespace sandbox shares the host's kernel: it takes everything a container runtime gives.
pub(crate) const CAPABILITIES: Capabilities = Capabilities {
    containers: true,
    container_pid1: true,
    container_security: ContainerSecurity::All,
    host_paths: true,
    storage: true,
    imported_images: true,
    egress: true,
    sysctls: true,
    host_network_namespace: true,
    pod_network_through_proxy: false,
    disks_fixed_at_boot: false,
    mounts_in_image_tree: true,
    restore: true,
};

impl Backend for NamespaceBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Namespace
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn unavailable_reason(&self) -> Option<String> {
        self.why_unavailable()
    }

    fn create(&self, spec: InstanceSpec) -> BoxFuture<'_, Result<Box<dyn Instance>, BackendError>> {
        Box::pin(async move {
            let instance = self.create_instance(spec).await?;
            Ok(Box::new(instance) as Box<dyn Instance>)
        })
    }

    fn adopt<'a>(
        &'a self,
        id: &'a str,
        record: &'a crate::restore::InstanceRecord,
        spec: AdoptSpec,
    ) -> BoxFuture<'a, Result<Box<dyn Instance>, RestoreError>> {
        Box::pin(async move {
            let instance = self.adopt_instance(id, record, spec).await?;
            Ok(Box::new(instance) as Box<dyn Instance>)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{disk_mib, BackendError, IdRanges};
    use std::time::Duration;

    #[tokio::test]
    async fn a_create_waits_for_a_range_still_being_returned_and_is_told_to_retry_after() {
        let ranges = IdRanges::new(2_000_000_000, 1);
        let held = ranges.take(Duration::ZERO).await.expect("the one range");
        assert_eq!(held.map.to_string(), "2000000000:65536");
        // Every range held past the wait: a retryable answer, not an internal error.
        match ranges.take(Duration::from_millis(50)).await {
            Err(BackendError::Exhausted(reason)) => assert!(reason.contains("retry"), "{reason}"),
            other => panic!("expected Exhausted, got {other:?}"),
        }
        // A range returned while a create waits goes to that create.
        let waiting = tokio::spawn({
            let ranges = ranges.clone();
            async move { ranges.take(Duration::from_secs(10)).await.map(|r| r.slot) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
        let slot = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting create is woken")
            .expect("task")
            .expect("the returned range");
        assert_eq!(slot, 0);
    }

    #[test]
    fn the_writable_layer_leaves_a_quarter_of_memory_to_the_commands() {
        assert_eq!(disk_mib(1024, 512), 384);
        assert_eq!(disk_mib(100, 512), 100);
        assert_eq!(disk_mib(1024, 16), 12);
        assert_eq!(disk_mib(1024, 1), 1, "never a zero-sized (unlimited) tmpfs");
    }
}
