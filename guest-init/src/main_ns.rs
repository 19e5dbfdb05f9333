//! `main`'s own PID and mount namespace in a microVM pod.
//!
//! In a microVM, PID 1 (this agent) runs `main`'s commands, and each container's agent is PID 1
//! of a PID namespace below the guest's first. Left there, `main`'s commands would see every
//! container's processes, their `/proc/PID/root` and `/proc/PID/environ`. So a pod's `main`
//! gets a namespace of its own too: at boot PID 1 clones a tiny *main init* into a new PID and
//! mount namespace (it mounts a `/proc` of that PID namespace, then only reaps), and every
//! command `main` runs is cloned into both ([`MainNamespaces::spawn_inside`] for the PID
//! namespace, the child's `setns` for the mount one). A container that shares `main`'s PID
//! namespace (`share_pids`) joins it the same way.
//!
//! The main init is PID 1 of its namespace, so a command in it can neither kill nor stop it
//! (the kernel drops such signals from inside); if it ended, the namespace would end with it,
//! which is why PID 1's own signals to the sandbox spare it.

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::log;

/// How long PID 1 waits for the main init to have mounted its `/proc`.
const READY_WITHIN: Duration = Duration::from_secs(5);

/// Why `main`'s namespaces could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MainNamespaceError {
    /// A system call failed.
    #[error("main's namespaces: {0}")]
    Sys(String, #[source] io::Error),
    /// The main init did not say it was ready.
    #[error("main's namespaces: the main init did not start: {0}")]
    NotReady(String),
}

/// `main`'s PID and mount namespaces, held open by PID 1.
#[derive(Debug)]
pub struct MainNamespaces {
    /// The main init's pid as PID 1 sees it.
    init: libc::pid_t,
    /// `main`'s PID namespace.
    pids: OwnedFd,
    /// `main`'s mount namespace.
    mounts: OwnedFd,
    /// PID 1's own PID namespace, which its threads' new children return to.
    own_pids: OwnedFd,
    /// `readlink /proc/INIT/ns/pid`, to tell `main`'s processes in `/proc`.
    pids_link: PathBuf,
    /// `readlink /proc/INIT/ns/mnt`.
    mounts_link: PathBuf,
}

static MAIN: OnceLock<MainNamespaces> = OnceLock::new();

/// Makes `main`'s namespaces for the rest of the guest's life: every command PID 1 runs from
/// now on runs in them. Called at boot, before any command or container.
pub fn start() -> Result<&'static MainNamespaces, MainNamespaceError> {
    if let Some(made) = MAIN.get() {
        return Ok(made);
    }
    let made = MainNamespaces::start()?;
    Ok(MAIN.get_or_init(|| made))
}

/// `main`'s namespaces, when this agent made them.
pub fn get() -> Option<&'static MainNamespaces> {
    MAIN.get()
}

impl MainNamespaces {
    /// Clones the main init into a new PID and mount namespace and waits until its `/proc`
    /// is mounted.
    pub fn start() -> Result<Self, MainNamespaceError> {
        let sys_err = |what: &str| {
            let what = what.to_string();
            move |e| MainNamespaceError::Sys(what, e)
        };
        let own_pids = open_namespace("/proc/self/ns/pid")?;
        let (ours, theirs) = UnixStream::pair().map_err(sys_err("socketpair"))?;
        let ready_fd = theirs.as_raw_fd();
        // SAFETY: a fork-style clone (no new stack: the child runs on a copy of ours). The
        // child only makes async-signal-safe system calls ([`main_init`]) on integers and
        // literals, so the locks other threads may hold in the copy never matter; it never
        // returns.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::SIGCHLD,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        if pid == 0 {
            main_init(ready_fd);
        }
        if pid < 0 {
            return Err(MainNamespaceError::Sys(
                "clone the main init into new PID and mount namespaces".into(),
                io::Error::last_os_error(),
            ));
        }
        drop(theirs);
        let init = libc::pid_t::try_from(pid)
            .map_err(|_| MainNamespaceError::NotReady(format!("clone returned {pid}")))?;
        let mut ours = ours;
        ours.set_read_timeout(Some(READY_WITHIN))
            .map_err(sys_err("set a timeout on the main init's ready socket"))?;
        let mut byte = [0u8; 1];
        match ours.read(&mut byte) {
            Ok(1) => {}
            Ok(_) => {
                return Err(MainNamespaceError::NotReady(
                    "it ended before its /proc was mounted".into(),
                ))
            }
            Err(e) => {
                return Err(MainNamespaceError::NotReady(format!(
                    "no word within {} s: {e}",
                    READY_WITHIN.as_secs()
                )))
            }
        }
        let link = |kind: &str| {
            let path = format!("/proc/{init}/ns/{kind}");
            std::fs::read_link(&path)
                .map_err(|e| MainNamespaceError::Sys(format!("readlink {path}"), e))
        };
        Ok(MainNamespaces {
            init,
            pids: open_namespace(&format!("/proc/{init}/ns/pid"))?,
            mounts: open_namespace(&format!("/proc/{init}/ns/mnt"))?,
            own_pids,
            pids_link: link("pid")?,
            mounts_link: link("mnt")?,
        })
    }

    /// The main init's pid, as PID 1 sees it.
    pub fn init_pid(&self) -> libc::pid_t {
        self.init
    }

    /// `readlink` of `main`'s PID namespace.
    pub fn pids_link(&self) -> &Path {
        &self.pids_link
    }

    /// `readlink` of `main`'s mount namespace.
    pub fn mounts_link(&self) -> &Path {
        &self.mounts_link
    }

    /// `main`'s mount namespace, which a command's child enters (`setns`) before it execs.
    pub fn mounts(&self) -> BorrowedFd<'_> {
        self.mounts.as_fd()
    }

    /// Runs `clone` with this thread's new children put in `main`'s PID namespace, then puts
    /// them back in PID 1's own. `setns` on a PID namespace only changes where the calling
    /// thread's *children* go, so the agent's other threads are never affected.
    /// `clone` must not return in the child (a vfork-style child that execs or exits).
    pub fn spawn_inside<T>(&self, clone: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        self.children_inside()?;
        let cloned = clone();
        self.children_back();
        cloned
    }

    /// This thread's new children go into `main`'s PID namespace until
    /// [`children_back`](Self::children_back).
    pub fn children_inside(&self) -> io::Result<()> {
        set_children_namespace(self.pids.as_fd())
    }

    /// This thread's new children go into PID 1's own PID namespace again. Only in the
    /// parent: a child already in `main`'s namespace cannot go up.
    pub fn children_back(&self) {
        if let Err(e) = set_children_namespace(self.own_pids.as_fd()) {
            // This thread would clone a container's agent into `main`'s namespace (or fail
            // to, with EINVAL): say so loudly; nothing else can be done about it.
            log::error(format_args!(
                "cannot return a thread's children to PID 1's namespace: {e}"
            ));
        }
    }
}

/// `setns(ns, CLONE_NEWPID)`: this thread's children go into `ns`.
fn set_children_namespace(ns: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: setns takes a live descriptor and a flag.
    match unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWPID) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Opens a namespace file (`/proc/…/ns/…`) to `setns` into.
fn open_namespace(path: &str) -> Result<OwnedFd, MainNamespaceError> {
    std::fs::File::open(path)
        .map(OwnedFd::from)
        .map_err(|e| MainNamespaceError::Sys(format!("open {path}"), e))
}

/// The main init, PID 1 of `main`'s PID namespace: makes its mount namespace send none of its
/// mounts back into the guest's (slave), replaces the guest's `/proc` with one of that PID
/// namespace (detached, not covered, so no `umount` in `main` uncovers it), says so on
/// `ready`, closes everything and reaps whatever is orphaned to it, for ever. Only
/// async-signal-safe system calls: it is a fork of a threaded process.
fn main_init(ready: RawFd) -> ! {
    // SAFETY: mount, umount2, write, close_range, sigprocmask, sigwaitinfo and waitpid take literals,
    // integers and pointers to locals; _exit never returns. A failure before the word
    // leaves the namespace unusable, so the init ends and PID 1 says why it got no word.
    unsafe {
        let root = c"/";
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ) != 0
        {
            libc::_exit(125);
        }
        // Gone, not covered: root in `main` may unmount what covers it.
        if libc::umount2(c"/proc".as_ptr(), libc::MNT_DETACH) != 0 {
            libc::_exit(124);
        }
        if libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ) != 0
        {
            libc::_exit(126);
        }
        if libc::write(ready, b"1".as_ptr().cast(), 1) != 1 {
            libc::_exit(127);
        }
        // Nothing PID 1 had open may stay held by a process that lives as long as the VM.
        libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
        let mut child_ended: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut child_ended);
        libc::sigaddset(&mut child_ended, libc::SIGCHLD);
        loop {
            while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
            // A SIGCHLD that came after the last waitpid is pending: this returns at once.
            libc::sigwaitinfo(&child_ended, std::ptr::null_mut());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this test process may make namespaces (root on Linux; CI runs as root).
    fn privileged() -> bool {
        // SAFETY: geteuid takes no arguments.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn a_command_cloned_inside_sees_only_the_main_init_and_itself() {
        assert!(
            privileged(),
            "this test makes PID and mount namespaces: run it as root (CI does)"
        );
        let ns = MainNamespaces::start().expect("main's namespaces");
        let (mut read, write) = std::io::pipe().expect("pipe");
        let mounts = ns.mounts().as_raw_fd();
        let write_fd = write.as_raw_fd();
        // A fork-style child entering the mount namespace as spawn's child does, listing /proc.
        let pid = ns
            .spawn_inside(|| {
                // SAFETY: fork in a test; the child only makes system calls and _exits.
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    // SAFETY: setns, open, getdents-free listing via a fixed buffer, write and
                    // _exit on live descriptors and literals.
                    unsafe {
                        if libc::setns(mounts, libc::CLONE_NEWNS) != 0 {
                            libc::_exit(2);
                        }
                        let mut link = [0u8; 16];
                        let n = libc::readlink(
                            c"/proc/self".as_ptr(),
                            link.as_mut_ptr().cast(),
                            link.len(),
                        );
                        if n > 0 {
                            libc::write(write_fd, link.as_ptr().cast(), n as usize);
                        }
                        libc::_exit(0);
                    }
                }
                Ok(pid)
            })
            .expect("clone inside");
        drop(write);
        let mut seen = String::new();
        read.read_to_string(&mut seen).expect("read");
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(status, 0, "the child failed: {status:#x}");
        // The child is the second process of its namespace, after the main init.
        assert_eq!(seen, "2", "/proc/self inside main's namespaces");
        // This thread's next children are PID 1's again: a new PID namespace can be made.
        assert_eq!(
            std::fs::read_link("/proc/thread-self/ns/pid_for_children").expect("readlink"),
            std::fs::read_link("/proc/self/ns/pid").expect("readlink")
        );
        assert_ne!(
            ns.pids_link(),
            std::fs::read_link("/proc/self/ns/pid").expect("readlink")
        );
        // SAFETY: kill takes no pointers; the init is our child.
        unsafe {
            libc::kill(ns.init_pid(), libc::SIGKILL);
            libc::waitpid(ns.init_pid(), std::ptr::null_mut(), 0);
        }
    }
}
