//! A sandbox's containers, as a Kubernetes pod's: each has its own image under an overlay of
//! its own, in a mount namespace and a PID namespace of its own, and shares everything else of
//! the sandbox — its user namespace (and so its id range), network (`lo`, the egress proxy),
//! IPC (`/dev/shm`), UTS and cgroup namespaces, its cgroups' limits and its scratch. Directories
//! of the scratch named in `--shared` mounts are the pod's `emptyDir`s: every container that
//! mounts one sees the same files.
//!
//! Each container is made by a child the sandbox's PID 1-to-be clones before it pivots (while
//! it still holds `CAP_SYS_ADMIN` in the sandbox's user namespace): PID 1 of the container's
//! PID namespace, it builds the container's root, pivots into it, takes the sandbox PID 1's
//! capabilities (and those the container was granted beyond them) and seccomp filter and executes the agent again as the container's
//! own agent, serving on a socket the supervisor bound on the host (`c<i>.sock` in the
//! sandbox's runtime directory). Nothing of a container can mount afterwards. Containers added
//! to a running sandbox are made the same way by its container factory (`factory`), which
//! keeps what this needs (the scratch, `CAP_SYS_ADMIN` in the sandbox's user namespace) out
//! of every command's reach.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use contract::container_security::ContainerSecurity;
use std::path::{Path, PathBuf};

use crate::container_init::Init;
use crate::mounts;
use crate::sys::{self, cstring, HostSide, SysError};
use crate::{privileges, SandboxSpec, SharedMount};

/// Starts the containers of `spec` that join its root's PID namespace (`share_pids`) or the
/// others, each from its image's mount in `images` (in the spec's order), while the caller is
/// still in the sandbox's first mount namespace with the scratch as its working directory.
/// `argv` is the containers' agent command line. Those joining the root's namespace are made
/// while the caller's children go there; the others each get a PID namespace of their own.
pub(crate) fn start_some(
    spec: &SandboxSpec,
    images: &mut [Option<OwnedFd>],
    share_pids: bool,
    agent: &OwnedFd,
    host_side: &HostSide,
    argv: &[CString],
) -> Result<(), SysError> {
    for (index, (container, image)) in spec.containers.iter().zip(images).enumerate() {
        if container.share_pids != share_pids {
            continue;
        }
        let Some(image) = image.take() else {
            continue;
        };
        let argv = agent_argv(argv, &container.security);
        match sys::clone_container(share_pids)? {
            sys::Forked::Parent(_) => drop(image),
            sys::Forked::Child => {
                let shared = spec.shared.iter().filter(|s| s.owner == container.name);
                let layout = Layout {
                    name: container.name.clone(),
                    dir: Path::new("c").join(&container.name),
                    shared: shared.cloned().collect(),
                    security: container.security.clone(),
                    host_paths: Vec::new(),
                    command_is_pid1: container.command_is_pid1,
                };
                let hand = |init: &[(RawFd, RawFd)]| host_side.hand_to_container(index, init);
                let e = become_container(&layout, image, agent, hand, &argv);
                eprintln!(
                    "guest-init: making container {} failed: {}",
                    container.name,
                    report::chain(&e)
                );
                sys::exit_now(125)
            }
        }
    }
    Ok(())
}

/// A container's agent command line: `base`, and the bounding set its commands get when the
/// container has one of its own (`--command-capabilities HEX`). Its agent keeps the sandbox's
/// set (it starts commands as their user), and drops to the container's in each command
/// before it executes, so that nothing it runs, as root or through a setuid binary, has more.
/// Made before the fork.
pub(crate) fn agent_argv(base: &[CString], security: &ContainerSecurity) -> Vec<CString> {
    let mut argv = base.to_vec();
    if let Some(mask) = security.capabilities {
        argv.push(c"--command-capabilities".to_owned());
        // Hex digits: never a NUL.
        argv.extend(CString::new(format!("{mask:x}")).ok());
    }
    argv
}

/// Where a container is built on the scratch, and what it mounts of it.
#[derive(Debug)]
pub(crate) struct Layout {
    /// Its name, for messages.
    pub(crate) name: String,
    /// Its directory, relative to the scratch: two components of `[a-z0-9.-]`, so that
    /// `../..` from it is the scratch again.
    pub(crate) dir: PathBuf,
    /// The shared directories it mounts (their owner is the container).
    pub(crate) shared: Vec<SharedMount>,
    /// What its processes may do, within the sandbox's rules.
    pub(crate) security: ContainerSecurity,
    /// The host's mounts of its host paths (detached, idmapped), each with where it goes.
    pub(crate) host_paths: Vec<(OwnedFd, String)>,
    /// Its first command is PID 1 of its own PID namespace ([`crate::container_init`]).
    pub(crate) command_is_pid1: bool,
}

/// Attaches each host path's mount (made by the host) at its place under `root`, the
/// directories on the way made; no component may be a symlink of the image
/// ([`mounts::mount_point`]).
fn attach_host_paths(root: &Path, host_paths: &[(OwnedFd, String)]) -> Result<(), SysError> {
    if host_paths.is_empty() {
        return Ok(());
    }
    let root_dir = sys::open_file(root, libc::O_PATH | libc::O_DIRECTORY)?;
    for (mount, target) in host_paths {
        let what = format!("host path {target}");
        let at = mounts::mount_point(&root_dir, Path::new(target), &what)?;
        crate::mount_api::attach(mount, std::os::fd::AsFd::as_fd(&at), &what)?;
    }
    Ok(())
}

/// The container's side, with the scratch as the working directory: builds its root, pivots,
/// drops what PID 1 drops, has `hand_listener` put its agent's socket in place and executes
/// its agent. Returns only with the reason it failed.
pub(crate) fn become_container(
    layout: &Layout,
    image: OwnedFd,
    agent: &OwnedFd,
    hand_listener: impl FnOnce(&[(RawFd, RawFd)]) -> Result<(), SysError>,
    argv: &[CString],
) -> SysError {
    let step = || -> Result<std::convert::Infallible, SysError> {
        let base = &layout.dir;
        let name = &layout.name;
        let (lower, upper, work, root, tmp) = (
            base.join("lower"),
            base.join("upper"),
            base.join("work"),
            base.join("root"),
            base.join("tmp"),
        );
        for dir in [&lower, &upper, &work, &root, &tmp] {
            mounts::mkdir(dir)?;
        }
        mounts::chmod(&tmp, 0o1777)?;
        crate::mount_api::attach_at(
            &image,
            &cstring(&lower)?,
            &format!("container {name}'s image"),
        )?;
        drop(image);
        // Overlay's options show in the container's mount table: named from the container's
        // own directory, as the sandbox's root's are from the scratch's, they say nothing of
        // where it is. `c/NAME` is two plain components ([a-z0-9-]) made just above, so `../..`
        // is the scratch again.
        std::env::set_current_dir(base)
            .map_err(|e| SysError::io(format!("chdir {}", base.display()), e))?;
        mounts::mount(
            "overlay",
            Path::new("root"),
            Some("overlay"),
            0,
            Some("lowerdir=lower,upperdir=upper,workdir=work,userxattr"),
        )?;
        std::env::set_current_dir("../..").map_err(|e| SysError::io("chdir ../..", e))?;
        // Its agent holds what its commands may: the sandbox's set and any capability the
        // container was granted beyond it (each command then drops to the container's own).
        let held = privileges::kept_mask() | layout.security.capabilities.unwrap_or(0);
        let argv0 = argv.first().cloned().unwrap_or_default();
        let init = if layout.command_is_pid1 {
            mounts::mkdir(&root.join("proc"))?;
            Some(Init::start(
                &root.join("proc"),
                held,
                &layout.security,
                agent,
                &argv0,
            )?)
        } else {
            None
        };
        mounts::finish_root(&root, &tmp, init.is_some())?;
        mounts::attach_shared_mounts(layout.shared.iter(), &root)?;
        attach_host_paths(&root, &layout.host_paths)?;
        crate::writable_files::mount(&root, &layout.security.writable_files)?;
        crate::path_rules::apply(&root, &layout.security)?;
        if layout.security.read_only_root {
            // The root's own mount alone: its `/tmp`, `/dev`, `/proc` and shared directories
            // are mounts of their own and stay as they are, as Kubernetes' volumes do.
            mounts::make_read_only(&root)?;
        }
        mounts::pivot_into(&root)?;
        let mut argv = argv.to_vec();
        let mut handed = Vec::new();
        let spawner = match &init {
            Some(init) => Some(init.start_spawner(held, &layout.security, agent, &argv0)?),
            None => None,
        };
        if let (Some(init), Some(spawner)) = (&init, &spawner) {
            handed.push((init.connection.as_raw_fd(), crate::CONTAINER_INIT_FD));
            handed.push((spawner.as_raw_fd(), crate::CONTAINER_SPAWNER_FD));
            argv.push(c"--container-init".to_owned());
            // Digits: never a NUL.
            argv.extend(CString::new(init.pid.to_string()).ok());
        }
        crate::container_init::drop_privileges(held, &layout.security)?;
        hand_listener(&handed)?;
        Err(sys::exec_pid1(agent, &argv))
    };
    match step() {
        Ok(never) => match never {},
        Err(e) => e,
    }
}
