//! A container whose first command is PID 1 of its PID namespace, as under runc (Kubernetes'
//! default: each container in a PID namespace of its own, its process PID 1 there), with the
//! container's agent outside that namespace, as runc's shim is:
//!
//! - The *init*, forked while the container's root is built, is PID 1 of a new PID namespace
//!   below the agent's. It mounts that namespace's `/proc` (with the masks) in the container's
//!   mount namespace, drops to what the agent keeps, and executes the agent binary as
//!   `container-init`, which waits for the container's first command and executes it in its
//!   own place: that command is PID 1, the agent's child.
//! - The *spawner*, forked after the pivot, has its children made in that PID namespace (a
//!   `setns` for its children only) and executes the agent binary as `container-spawner`:
//!   every later command is cloned there with `CLONE_PARENT`, so that the agent is its parent
//!   too, and reaps it.
//! - The agent, PID 1 of the outer namespace, holds a connection to each
//!   ([`crate::CONTAINER_INIT_FD`], [`crate::CONTAINER_SPAWNER_FD`]). Nothing in the inner
//!   namespace can see it or the spawner.
//!
//! When the init exits, the kernel ends every process of its namespace and makes no new one
//! there: the container is over, as under runc.

use std::convert::Infallible;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use contract::container_security::ContainerSecurity;

use crate::sys::{self, SysError};
use crate::{privileges, seccomp};

/// The init, forked and waiting for the container's first command.
#[derive(Debug)]
pub(crate) struct Init {
    /// Its pid, in the caller's PID namespace.
    pub(crate) pid: libc::pid_t,
    /// The agent's end of the connection to it.
    pub(crate) connection: sys::Socket,
    /// Its PID namespace, which the spawner's children go to.
    pid_namespace: OwnedFd,
}

/// A forked child's whole life: `turn_into` executes, or says why it could not and exits 125.
fn run_child(what: &str, turn_into: impl FnOnce() -> Result<Infallible, SysError>) -> ! {
    let e = match turn_into() {
        Ok(never) => match never {},
        Err(e) => e,
    };
    eprintln!(
        "guest-init: the container's {what} failed: {}",
        report::chain(&e)
    );
    sys::exit_now(125)
}

/// The agent binary's command line in `mode` (`container-init`, `container-spawner`).
fn argv_of(argv0: &CString, mode: &str) -> Vec<CString> {
    let mut argv = vec![argv0.clone()];
    // A literal without NUL.
    argv.extend(CString::new(mode).ok());
    argv
}

impl Init {
    /// Forks the init as PID 1 of a new PID namespace. It mounts that namespace's `/proc` at
    /// `proc_dir` (relative to the working directory, which it shares with the caller) and
    /// says so, then drops to `held` with `security` ([`drop_privileges`])
    /// and executes `agent` as `container-init`. Returns once `/proc` is mounted; the caller's
    /// children go to its own PID namespace again.
    pub(crate) fn start(
        proc_dir: &Path,
        held: u64,
        security: &ContainerSecurity,
        agent: &OwnedFd,
        argv0: &CString,
    ) -> Result<Init, SysError> {
        let argv = argv_of(argv0, "container-init");
        let (agent_end, init_end) = sys::socketpair()?;
        let own = sys::new_pid_namespace_for_children()?;
        let forked = sys::fork();
        match forked {
            Ok(sys::Forked::Child) => {
                drop(agent_end);
                run_child("init", || {
                    crate::mounts::mount_proc(proc_dir)?;
                    init_end
                        .send_byte()
                        .map_err(|e| SysError::io("tell the container that /proc is up", e))?;
                    drop_privileges(held, security)?;
                    sys::hand_alone(init_end.as_raw_fd(), crate::CONTAINER_INIT_FD)?;
                    Err(sys::exec_pid1(agent, &argv))
                })
            }
            Ok(sys::Forked::Parent(pid)) => {
                drop(init_end);
                let pid_namespace = sys::pid_namespace_for_children();
                sys::enter_pid_namespace_for_children(std::os::fd::AsFd::as_fd(&own))?;
                let pid_namespace = pid_namespace?;
                match agent_end.recv_byte() {
                    Ok(true) => Ok(Init {
                        pid,
                        connection: agent_end,
                        pid_namespace,
                    }),
                    Ok(false) => Err(SysError::io(
                        "mount the container's /proc (its init ended first)",
                        std::io::ErrorKind::UnexpectedEof.into(),
                    )),
                    Err(e) => Err(SysError::io("wait for the container's /proc", e)),
                }
            }
            Err(e) => {
                let _ = sys::enter_pid_namespace_for_children(std::os::fd::AsFd::as_fd(&own));
                Err(e)
            }
        }
    }

    /// Forks the spawner (after the pivot: it works in the container's root), whose children
    /// go to the init's PID namespace; it drops as the init does and executes `agent` as
    /// `container-spawner`. Returns the agent's end of the connection to it.
    pub(crate) fn start_spawner(
        &self,
        held: u64,
        security: &ContainerSecurity,
        agent: &OwnedFd,
        argv0: &CString,
    ) -> Result<sys::Socket, SysError> {
        let argv = argv_of(argv0, "container-spawner");
        let (agent_end, spawner_end) = sys::socketpair()?;
        match sys::fork()? {
            sys::Forked::Child => {
                drop(agent_end);
                run_child("spawner", || {
                    sys::enter_pid_namespace_for_children(std::os::fd::AsFd::as_fd(
                        &self.pid_namespace,
                    ))?;
                    drop_privileges(held, security)?;
                    sys::hand_alone(spawner_end.as_raw_fd(), crate::CONTAINER_SPAWNER_FD)?;
                    Err(sys::exec_pid1(agent, &argv))
                })
            }
            sys::Forked::Parent(_) => Ok(agent_end),
        }
    }
}

/// Drops to what a container's agent holds (`held`: the sandbox's set and the capabilities
/// granted beyond it) under the sandbox's filter and the container's own profile, with
/// `no_new_privs` if asked: its agent, and its init and spawner
/// ([`crate::container_init`]) alike.
pub(crate) fn drop_privileges(held: u64, security: &ContainerSecurity) -> Result<(), SysError> {
    privileges::limit_bounding_set_to(held)?;
    seccomp::install(seccomp::Mounting::for_capabilities(held))?;
    if !security.seccomp_filter.is_empty() {
        // Its own profile, stacked: it binds its agent as well as its commands, as runc's
        // binds the container's init (installed here, while CAP_SYS_ADMIN spares the
        // container no_new_privs).
        seccomp::install_profile(&security.seccomp_filter)?;
    }
    privileges::keep_only(held)?;
    if security.no_new_privileges {
        privileges::no_new_privileges()?;
    }
    Ok(())
}
