//! A sandbox's containers, as a Kubernetes pod's: each has its own image under an overlay of
//! its own, in a mount namespace and a PID namespace of its own, and shares everything else of
//! the sandbox — its user namespace (and so its id range), network (`lo`, the egress proxy),
//! IPC (`/dev/shm`), UTS and cgroup namespaces, its cgroups' limits and its scratch. Directories
//! of the scratch named in `--shared` mounts are the pod's `emptyDir`s: every container that
//! mounts one sees the same files.
//!
//! Each container is made by a child the sandbox's PID 1-to-be clones before it pivots (while
//! it still holds `CAP_SYS_ADMIN` in the sandbox's user namespace): PID 1 of the container's
//! PID namespace, it builds the container's root, pivots into it, takes the same capabilities
//! and seccomp filter as the sandbox's PID 1 and executes the agent again as the container's
//! own agent, serving on a socket the supervisor bound on the host (`c<i>.sock` in the
//! sandbox's runtime directory). Nothing of a container can mount afterwards: containers are
//! declared when the sandbox is made.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::Path;

use crate::mounts;
use crate::sys::{self, cstring, HostSide, SysError};
use crate::{privileges, seccomp, SandboxSpec};

/// Starts every container of `spec`, each from its image's mount in `images` (in the spec's
/// order), while the caller is still in the sandbox's first mount namespace with the scratch
/// as its working directory; returns their agents' pids. `argv` is the containers' agent
/// command line.
pub(crate) fn start_all(
    spec: &SandboxSpec,
    images: Vec<OwnedFd>,
    agent: &OwnedFd,
    host_side: &HostSide,
    argv: &[CString],
) -> Result<Vec<libc::pid_t>, SysError> {
    let mut pids = Vec::with_capacity(images.len());
    for (index, (container, image)) in spec.containers.iter().zip(images).enumerate() {
        match sys::clone_container()? {
            sys::Forked::Parent(pid) => {
                drop(image);
                pids.push(pid);
            }
            sys::Forked::Child => {
                let e = become_container(spec, index, image, agent, host_side, argv);
                eprintln!(
                    "guest-init: making container {} failed: {}",
                    container.name,
                    report::chain(&e)
                );
                sys::exit_now(125)
            }
        }
    }
    Ok(pids)
}

/// The container's side: builds its root, pivots, drops what PID 1 drops and executes its
/// agent. Returns only with the reason it failed.
fn become_container(
    spec: &SandboxSpec,
    index: usize,
    image: OwnedFd,
    agent: &OwnedFd,
    host_side: &HostSide,
    argv: &[CString],
) -> SysError {
    let step = || -> Result<std::convert::Infallible, SysError> {
        let name = &spec.containers[index].name;
        let base = Path::new("c").join(name);
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
        std::env::set_current_dir(&base)
            .map_err(|e| SysError::io(format!("chdir {}", base.display()), e))?;
        mounts::mount(
            "overlay",
            Path::new("root"),
            Some("overlay"),
            0,
            Some("lowerdir=lower,upperdir=upper,workdir=work,userxattr"),
        )?;
        std::env::set_current_dir("../..").map_err(|e| SysError::io("chdir ../..", e))?;
        mounts::finish_root(&root, &tmp)?;
        mounts::attach_shared(spec, name, &root)?;
        mounts::pivot_into(&root)?;
        privileges::limit_bounding_set()?;
        seccomp::install()?;
        privileges::keep_only_kept()?;
        host_side.hand_to_container(index)?;
        Err(sys::exec_pid1(agent, argv))
    };
    match step() {
        Ok(never) => match never {},
        Err(e) => e,
    }
}
