//! Turns the calling process into PID 1 of a fresh namespace sandbox.
//!
//! The daemon's namespace backend starts the guest agent with `guest-init sandbox …`; the agent
//! calls [`enter`] before anything else and then serves requests exactly as it does in a VM. The
//! sandbox is:
//! - new PID, mount, UTS, IPC, network and cgroup namespaces (the network has only `lo`);
//! - a root made of the image directory, read-only, under a size-limited tmpfs overlay, entered
//!   with `pivot_root` (the host's tree is unmounted, not merely hidden);
//! - a minimal `/dev` (null, zero, full, random, urandom, tty, a private devpts), private `/proc`,
//!   `/tmp`, `/dev/shm` (both on the overlay's tmpfs, under its one size limit), and the
//!   sandbox's runtime directory at `/run/crucible`;
//! - membership in the cgroups the daemon prepared (memory and pids limits);
//! - no capabilities (bounding set emptied, then effective/permitted/inheritable cleared) and
//!   `no_new_privs`, so nothing inside can regain privileges through setuid binaries;
//! - a seccomp filter that makes escape-only system calls (`mount`, `unshare`, `setns`,
//!   `ptrace`, `kexec_load`, module loading, `bpf`, …) fail with EPERM.

mod mounts;
mod privileges;
mod seccomp;
mod sys;

use std::path::PathBuf;

pub use sys::SysError;

/// Where the sandbox's runtime directory appears inside the sandbox.
pub const SANDBOX_RUNTIME_DIR: &str = "/run/crucible";

/// What the sandbox is made of. All paths are host paths.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// The image's root directory: becomes the read-only lower layer of `/`.
    pub rootfs: PathBuf,
    /// A host directory private to this sandbox: mounted at [`SANDBOX_RUNTIME_DIR`] inside (the
    /// agent's socket lives there), and holding the overlay's scratch mount.
    pub runtime_dir: PathBuf,
    /// The sandbox's hostname.
    pub hostname: String,
    /// Size of the one tmpfs that holds every write: to `/` (the overlay's upper layer), `/tmp`
    /// and `/dev/shm`. Its pages are memory, charged to the sandbox's memory cgroup.
    pub scratch_mib: u64,
    /// Kill the sandbox when the process that started it (the daemon) dies, so a crashed
    /// daemon leaves no sandbox running.
    pub die_with_parent: bool,
    /// cgroup membership files (`cgroup.procs`) to join before unsharing, so every process in
    /// the sandbox is accounted and limited.
    pub cgroup_procs: Vec<PathBuf>,
}

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
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// A spec value is unusable.
    #[error("invalid sandbox spec: {0}")]
    Spec(String),
}

/// Enters the sandbox. Must be called while the process is single-threaded (it forks).
///
/// Returns only in the new PID 1, with `/` pivoted into the sandbox and every privilege
/// dropped. The original process stays outside as a tiny supervisor: it waits for PID 1 and
/// exits with its status, and if it is killed, PID 1 (and so the whole sandbox) is killed too.
pub fn enter(spec: &SandboxSpec) -> Result<(), EnterError> {
    if spec.hostname.is_empty() || spec.hostname.len() > 64 {
        return Err(EnterError::Spec(format!(
            "hostname {:?} must be 1 to 64 bytes",
            spec.hostname
        )));
    }
    if spec.die_with_parent {
        sys::die_with_parent()?;
        // The daemon may have died before the line above took effect.
        if sys::parent_pid() == 1 {
            return Err(EnterError::Spec(
                "the process that started the sandbox is gone".into(),
            ));
        }
    }
    // Inherited through the fork below, and done before /proc is replaced.
    privileges::protect_from_oom_killer()?;
    let pid = std::process::id().to_string();
    for path in &spec.cgroup_procs {
        std::fs::write(path, &pid).map_err(|source| EnterError::Cgroup {
            path: path.clone(),
            source,
        })?;
    }
    sys::unshare_namespaces()?;
    match sys::fork()? {
        sys::Forked::Parent(child) => sys::supervise(child),
        sys::Forked::Child => {}
    }
    sys::die_with_parent()?;
    mounts::build_root(spec)?;
    sys::set_hostname(&spec.hostname)?;
    sys::bring_up_loopback()?;
    privileges::drop_all()?;
    seccomp::install()?;
    Ok(())
}
