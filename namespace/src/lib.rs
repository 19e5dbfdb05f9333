//! Turns the calling process into the supervisor of a fresh namespace sandbox whose PID 1 is the
//! guest agent.
//!
//! The daemon's namespace backend starts the agent as `guest-init sandbox …` (as host root);
//! the agent calls [`enter`] first thing. The sandbox is:
//! - a new **user namespace** whose uids and gids 0–65535 are an unprivileged host range of its
//!   own ([`IdMap`]): root inside is never root outside, and no two sandboxes share a host uid;
//! - new PID, mount, UTS, IPC, network (only `lo`) and cgroup namespaces, all owned by that user
//!   namespace;
//! - a root made of the image, mounted read-only and **idmapped** into the sandbox's range (so
//!   the image's root-owned files are root's inside), under an overlay whose upper layer is a
//!   size-limited tmpfs, entered with `pivot_root` (the host's tree is unmounted, not hidden);
//!   every byte the sandbox can write lands in that tmpfs: memory, charged to its cgroup —
//!   or, given a scratch disk ([`SandboxSpec::scratch_disk`]), on an ext4 image on disk;
//! - extra mounts ([`ExtraMount`]): ext4 images through self-detaching loop devices and
//!   read-only host directories, idmapped like the image, `nosuid` and `nodev`;
//! - `/proc` with runc's masked and read-only paths, a minimal `/dev`, no `/sys`;
//! - membership in the cgroups the daemon prepared;
//! - a Docker-like set of capabilities scoped to the user namespace ([`privileges::KEPT`]), and
//!   an allowlist seccomp filter modelled on Docker's default profile ([`seccomp`]).
//!
//! The agent's sockets are opened on the host side before entering (the sandbox never sees
//! their host paths) and handed to PID 1 as descriptors [`PID1_LISTEN_FD`],
//! [`PID1_READY_FD`] and, if asked for, [`PID1_EGRESS_FD`]. PID 1 is a fresh `execve` of the agent inside the sandbox, so that its
//! memory belongs to the sandbox's user namespace and it can make itself undumpable
//! ([`harden_pid1`]): commands, root or not, cannot ptrace it or read its memory.

mod bpf;
mod container;
mod container_init;
mod extra_mount;
mod factory;
mod host_mounts;
mod idmap;
mod loop_device;
mod mount_api;
mod mounts;
pub mod netns;
mod path_rules;
pub mod pod;
pub mod pod_link;
pub mod pod_redirect;
pub mod privileges;
pub mod propagation;
pub mod seccomp;
pub mod seccomp_profile;
mod spec;
mod sys;
mod syscall_table;
pub mod sysctl;
mod writable_files;

use std::ffi::CString;

pub use extra_mount::{ExtraMount, MountKind};
pub use factory::{
    check_host_path_target, AddRequest, ContainerFactory, FactoryError, MAX_HOST_PATHS,
};
pub use host_mounts::{host_path_tree, HostMountError, HostPathMount, Propagation};
pub use idmap::{IdMap, SANDBOX_IDS};
pub use loop_device::LoopError;
pub use pod::{ContainerRoot, SharedMount};
pub use spec::{container_socket, SandboxSpec, SpecError};
pub use sys::{
    current_env, null_terminated, recv_stream, recv_streams, send_stream, send_streams, SysError,
};

pub use contract::namespace_fds::{
    COMMANDS_CGROUP_FD, CONTAINER_INIT_FD, CONTAINER_SPAWNER_FD, PID1_EGRESS_FD, PID1_FACTORY_FD,
    PID1_LISTEN_FD, PID1_READY_FD,
};

/// Why the sandbox could not be entered.
#[derive(Debug, thiserror::Error)]
pub enum EnterError {
    /// A system call failed; the message names the step and its input.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// Joining a cgroup failed.
    #[error("joining cgroup {path}")]
    Cgroup {
        /// The `cgroup.procs` file.
        path: std::path::PathBuf,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// A spec value is unusable.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A mount the supervisor makes for the sandbox (an image, a disk, a host directory)
    /// could not be made.
    #[error(transparent)]
    Mount(#[from] HostMountError),
    /// The pod's network namespace cannot be used.
    #[error(transparent)]
    Netns(#[from] netns::NetnsError),
    /// The sandbox's network namespace could not be linked to the pod's.
    #[error(transparent)]
    PodLink(#[from] pod_link::PodLinkError),
    /// The process that started the sandbox died before it was made.
    #[error("the process that started the sandbox is gone")]
    Orphaned,
}

/// The command lines the agent binary is executed again with inside the sandbox.
#[derive(Debug, Clone, Default)]
pub struct AgentArgv {
    /// The sandbox's PID 1 (of `main`'s PID namespace); `--container-factory` is added: its
    /// connection to the container factory (`factory`) is at [`PID1_FACTORY_FD`]. Neither the
    /// factory nor a container's agent is in its PID namespace, so a signal to every process
    /// reaches none of them.
    pub pid1: Vec<CString>,
    /// Each container's agent, serving on descriptor [`PID1_LISTEN_FD`].
    pub container: Vec<CString>,
}

/// Makes the sandbox and starts `argv.pid1` (the agent, executed again from the same binary)
/// as its PID 1, and `argv.container` as each container's agent. Must be called while the process is single-threaded (it clones).
///
/// Returns only on failure. On success the calling process becomes the sandbox's supervisor
/// outside it: it waits for PID 1 and exits with its status, and when it is killed PID 1 (and
/// with it the whole sandbox) is killed too.
pub fn enter(spec: &SandboxSpec, argv: &AgentArgv) -> Result<std::convert::Infallible, EnterError> {
    spec.validate()?;
    if spec.die_with_parent {
        sys::die_with_parent()?;
        // The daemon may have died before the line above took effect.
        if sys::parent_pid() == 1 {
            return Err(EnterError::Orphaned);
        }
    }
    // Both inherited through the clone below.
    sys::run_on_cpus(&spec.cpus)?;
    privileges::protect_from_oom_killer()?;
    let pid = std::process::id().to_string();
    for path in &spec.cgroup_procs {
        std::fs::write(path, &pid).map_err(|source| EnterError::Cgroup {
            path: path.clone(),
            source,
        })?;
    }
    let host_network = spec
        .network_namespace
        .as_deref()
        .is_some_and(netns::is_host);
    if host_network && spec.sysctls.iter().any(|s| s.is_network()) {
        // The daemon refuses them first; never written into the host's own settings.
        return Err(netns::NetnsError::Refused {
            path: netns::HOST.into(),
            why: "a net.* sysctl there would be the host's own setting".into(),
        }
        .into());
    }
    // Opened with the host's privileges, which the sandbox's user namespace will not have; the
    // sandbox gets a namespace of its own, linked to the pod's once it exists.
    let pod_network = match spec.network_namespace.as_ref().filter(|_| !host_network) {
        Some(path) => Some((netns::open_checked(path)?, path)),
        None => None,
    };
    // Opened with the host's view and privileges; PID 1 receives them as descriptors.
    let host_side = sys::HostSide::open(spec)?;
    let (parent_end, child_end) = sys::socketpair()?;
    match sys::clone_into_namespaces(!host_network)? {
        sys::Forked::Parent(child) => {
            drop(child_end);
            drop(host_side);
            let linked = match &pod_network {
                Some((pod, path)) => pod_link::link(pod, path, child).map_err(EnterError::from),
                None => Ok(()),
            };
            if let Err(e) = linked.and_then(|()| idmap::prepare_child(child, spec, &parent_end)) {
                sys::kill(child);
                return Err(e);
            }
            // Kept open for as long as the supervisor lives: the child checks it to know that
            // its parent-death signal is armed while the parent is alive.
            let _alive = parent_end;
            sys::supervise(child)
        }
        sys::Forked::Child => {
            drop(parent_end);
            let e = inside(spec, &host_side, &child_end, argv);
            eprintln!(
                "guest-init: making the sandbox failed: {}",
                report::chain(&e)
            );
            sys::exit_now(125)
        }
    }
}

/// The child's side: runs in the new namespaces, returns only with the reason it failed.
fn inside(
    spec: &SandboxSpec,
    host_side: &sys::HostSide,
    from_parent: &sys::Socket,
    argv: &AgentArgv,
) -> EnterError {
    let step = || -> Result<std::convert::Infallible, EnterError> {
        // Until the parent has written our id maps we are nobody; it then sends the image's
        // idmapped mount and the others. A closed socket means it died.
        let handed = idmap::await_parent(spec, from_parent)?;
        // Still host uid 0 for permission checks (only the user namespace's capabilities): the
        // one moment we may traverse the daemon's root-only state directory.
        let stage = mounts::open_stage(&spec.runtime_dir)?;
        sys::become_root_inside()?;
        // Root of the namespaces just made, which own these settings; the host's `/proc`
        // still shows them as this process's.
        let host_network = spec
            .network_namespace
            .as_deref()
            .is_some_and(netns::is_host);
        for sysctl in &spec.sysctls {
            sysctl.apply()?;
        }
        if spec.network_namespace.is_some() && !host_network {
            // A pod's: its ports below 1024 are for every user, as containerd's
            // `enable_unprivileged_ports` makes them under runc.
            netns::allow_low_ports()?;
        }
        // Opened with the credentials it is executed with: a descriptor opened by host root
        // before the clone is refused by execveat (EACCES) once we are the sandbox's root.
        let agent = sys::open_file(std::path::Path::new("/proc/self/exe"), libc::O_PATH)?;
        // Changing credentials cleared the parent-death signal.
        sys::die_with_parent()?;
        if !from_parent.peer_alive() {
            return Err(EnterError::Orphaned);
        }
        let host_mounts::SandboxMounts {
            image,
            scratch_disk,
            extra,
            containers,
        } = handed;
        mounts::prepare_scratch(spec, &stage, scratch_disk, !host_network)?;
        // The sandbox's own root (`main`) first, as PID 1 of a PID namespace of its own: its
        // agent must be that namespace's init, whether the containers join it (a shared PID
        // namespace) or each get theirs beside it (the default: a pod's members then see none
        // of each other's processes, roots, environments or agents). This process stays
        // outside as the init of the sandbox's first PID namespace (the pod init), where the
        // container factory lives out of every member's sight.
        let first_pids = sys::new_pid_namespace_for_children()?;
        let (to_main, from_pod_init) = sys::socketpair()?;
        if let sys::Forked::Parent(main) = sys::fork_main_root()? {
            drop(from_pod_init);
            let namespaces = PidNamespaces {
                first: first_pids,
                main: sys::pid_namespace_for_children()?,
            };
            let factory = start_members(spec, namespaces, containers, &agent, host_side, argv)?;
            to_main
                .send_fd(&factory)
                .map_err(|e| sys::SysError::io("hand the container factory to PID 1", e))?;
            sys::be_pod_init(main)
        }
        drop(first_pids);
        drop((to_main, containers));
        // The mount namespace is still the pod init's until the containers are made from the
        // scratch: only then may the root be built over it.
        let factory = from_pod_init
            .recv_fd()
            .map_err(|e| sys::SysError::io("receive the container factory", e))?
            .ok_or_else(|| {
                sys::SysError::io(
                    "receive the container factory (the pod init ended first)",
                    std::io::ErrorKind::UnexpectedEof.into(),
                )
            })?;
        drop(from_pod_init);
        // Mounted from inside that namespace, `/proc` shows it alone.
        mounts::build_root(spec, image, extra)?;
        sys::set_hostname(&spec.hostname)?;
        if !host_network {
            sys::bring_up_loopback()?;
        }
        privileges::limit_bounding_set()?;
        // Installed while we still hold CAP_SYS_ADMIN in our namespace, so without
        // no_new_privs: setuid tools of the image keep working, within the bounding set.
        seccomp::install(seccomp::Mounting::Refused)?;
        privileges::keep_only_kept()?;
        host_side.hand_to_pid1(std::os::fd::AsRawFd::as_raw_fd(&factory))?;
        let mut pid1_argv = argv.pid1.clone();
        pid1_argv.push(c"--container-factory".into());
        Err(sys::exec_pid1(&agent, &pid1_argv).into())
    };
    match step() {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

/// The PID namespaces of a sandbox: its first one (the pod init's, the factory's) and its
/// root's (`main`'s), below it.
pub(crate) struct PidNamespaces {
    /// The sandbox's first.
    pub(crate) first: std::os::fd::OwnedFd,
    /// Its own root's.
    pub(crate) main: std::os::fd::OwnedFd,
}

/// The pod init's part, with `main` (the sandbox's own root) forked and waiting: starts the
/// sandbox's containers from the scratch, those that share `main`'s PID namespace in it and
/// the others each in one of their own, and the container factory in the sandbox's first
/// PID namespace. Returns PID 1's end of the connection to the factory.
fn start_members(
    spec: &SandboxSpec,
    namespaces: PidNamespaces,
    containers: Vec<std::os::fd::OwnedFd>,
    agent: &std::os::fd::OwnedFd,
    host_side: &sys::HostSide,
    argv: &AgentArgv,
) -> Result<std::os::fd::OwnedFd, EnterError> {
    use std::os::fd::AsFd;
    let mut images: Vec<_> = containers.into_iter().map(Some).collect();
    // Until changed, this process's children go to `main`'s namespace.
    container::start_some(spec, &mut images, true, agent, host_side, &argv.container)?;
    sys::enter_pid_namespace_for_children(namespaces.first.as_fd())?;
    container::start_some(spec, &mut images, false, agent, host_side, &argv.container)?;
    let factory = factory::start(
        agent,
        &argv.container,
        host_side.commands_cgroup(),
        namespaces,
    )?;
    Ok(factory)
}

/// Called by PID 1 after the `execve` into the sandbox: nothing inside may ptrace it, read its
/// memory or its descriptors, root or not (it holds the sockets to the daemon). Its memory now
/// belongs to the sandbox's user namespace, where no process has `CAP_SYS_PTRACE`. The egress
/// connection ([`PID1_EGRESS_FD`]), if it was handed over, and the container factory's
/// ([`PID1_FACTORY_FD`]) are made close-on-exec at once, so no command ever inherits them,
/// whether or not the agent uses them.
pub fn harden_pid1() -> Result<(), SysError> {
    sys::set_undumpable()?;
    sys::keep_from_commands(PID1_EGRESS_FD)?;
    sys::keep_from_commands(PID1_FACTORY_FD)?;
    sys::keep_from_commands(COMMANDS_CGROUP_FD)
}

/// The commands' cgroup handed at [`COMMANDS_CGROUP_FD`] (to PID 1 and to each container's
/// agent), if there is one: the first call takes it, later ones get nothing.
pub fn take_commands_cgroup() -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    static TAKEN: AtomicBool = AtomicBool::new(false);
    if TAKEN.swap(true, Ordering::AcqRel) || !sys::is_open(COMMANDS_CGROUP_FD) {
        return None;
    }
    // SAFETY: the descriptor is open, and only the `sandbox` half that executed this process
    // put anything there (it marked every other descriptor close-on-exec); the flag above makes
    // this the one owner.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(COMMANDS_CGROUP_FD) })
}

/// The image tree `dir` as a detached, read-only mount idmapped through the user namespace
/// `userns` (a sandbox's): what a container added to a running sandbox is made of, made by
/// the host (it needs host root) and handed to the sandbox's agent.
pub fn idmapped_image(
    dir: &std::path::Path,
    userns: std::os::fd::BorrowedFd<'_>,
) -> Result<std::os::fd::OwnedFd, SysError> {
    host_mounts::image_tree(dir, userns)
}
