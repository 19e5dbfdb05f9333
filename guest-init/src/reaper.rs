//! Waiting for children: each command is reaped by the exec that started it, orphans by one
//! thread.
//!
//! Commands are cloned with a pidfd. The exec's poll loop watches it, and when it turns
//! readable the exec reaps its own child with `waitid(P_PIDFD)`, whose rusage carries
//! everything the exit frame reports. So the exit reaches the exit frame with no hop through
//! another thread and no procfs read.
//!
//! Orphans (re-parented to us as PID 1 or as a subreaper) are reaped by the orphan reaper
//! thread, which sleeps in `sigwaitinfo` for SIGCHLD (blocked in every thread: [`block_sigchld`]
//! runs first in `main`). It looks at each exited child with `WNOWAIT` first and leaves the
//! live commands' pids (a registry, updated under the same lock as the fork, so that a command
//! that exits at once is never taken for an orphan) to their execs.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::sys;

/// How a child ended.
#[derive(Debug, Clone, Copy)]
pub struct ExitInfo {
    /// The raw wait status (as `wait4` reports it: `WIFEXITED` etc. apply).
    pub status: libc::c_int,
    /// Its rusage (includes its reaped descendants).
    pub usage: RawUsage,
    /// When it was reaped.
    pub at: Instant,
}

/// The parts of `struct rusage` the agent reports.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawUsage {
    /// User CPU time in ms.
    pub user_ms: u64,
    /// System CPU time in ms.
    pub sys_ms: u64,
    /// Peak RSS in KiB.
    pub maxrss_kib: u64,
    /// Major page faults.
    pub majflt: u64,
    /// Involuntary context switches.
    pub nivcsw: u64,
    /// Bytes read from storage: `ru_inblock` (the kernel's `read_bytes` I/O accounting, in
    /// 512-byte units).
    pub read_bytes: u64,
    /// Bytes written to storage: `ru_oublock` (`write_bytes` less cancelled writes).
    pub write_bytes: u64,
}

/// The pids of commands whose execs will reap them, each with the token of its [`Child`] (a
/// reaped pid can be reused by the next spawn before the old `Child` has left the registry).
#[derive(Debug, Default)]
struct Registry {
    live: Mutex<HashMap<libc::pid_t, u64>>,
    next_token: AtomicU64,
    /// Signalled when a command has been reaped and left the registry.
    reaped: Condvar,
}

static REGISTRY: std::sync::LazyLock<Registry> = std::sync::LazyLock::new(Registry::default);

fn lock_live() -> MutexGuard<'static, HashMap<libc::pid_t, u64>> {
    // A panic while holding the lock cannot leave the set inconsistent (plain inserts and
    // removals), so a poisoned lock is still usable.
    REGISTRY.live.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `clone` (which returns the new child's pid and pidfd) with the registry locked, and
/// registers the pid before the orphan reaper can see its exit.
pub fn register_spawn<F>(clone: F) -> io::Result<Child>
where
    F: FnOnce() -> io::Result<(libc::pid_t, OwnedFd)>,
{
    let mut live = lock_live();
    let (pid, pidfd) = clone()?;
    let token = REGISTRY.next_token.fetch_add(1, Ordering::Relaxed);
    live.insert(pid, token);
    Ok(Child {
        pid,
        pidfd,
        token,
        exit: None,
        exec_id: None,
    })
}

fn deregister(pid: libc::pid_t, token: u64) {
    let mut live = lock_live();
    if live.get(&pid) == Some(&token) {
        live.remove(&pid);
    }
    drop(live);
    REGISTRY.reaped.notify_all();
}

/// A command this agent started. It is reaped by [`Child::try_reap`] or [`Child::wait`];
/// dropping it unreaped kills its process group and reaps it, so no zombie is left behind.
/// It leaves the registry when dropped, after the exit frame has gone out: the orphan reaper
/// may be waiting for that, but nothing on the way to the exit frame waits for it.
#[derive(Debug)]
pub struct Child {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    /// Its entry in the registry.
    token: u64,
    exit: Option<ExitInfo>,
    /// Its name in [`crate::exec_ids`], if it has one: then it is reaped under that lock.
    exec_id: Option<String>,
}

impl crate::exec_ids::Named for Child {
    fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Names it in [`crate::exec_ids`] (which calls this under its lock).
    fn set_exec_id(&mut self, exec_id: String) {
        self.exec_id = Some(exec_id);
    }
}

impl Child {
    /// The child's pid, which is also its process group and session id.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Becomes readable once the child has exited.
    pub fn exit_fd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// Sends `signal` to the child's process group, unless the child has been reaped (then
    /// its number may be reused). While it is unreaped its pid, and so its group id, stays
    /// ours. Returns whether it did.
    pub fn signal_group(&self, signal: libc::c_int) -> bool {
        self.exit.is_none() && sys::kill_group(self.pid, signal).is_ok()
    }

    /// Reaps the child if it has exited; `None` while it runs.
    pub fn try_reap(&mut self) -> io::Result<Option<ExitInfo>> {
        if let Some(exit) = self.exit {
            return Ok(Some(exit));
        }
        let pidfd = self.pidfd.as_fd();
        let reap = || waitid_pidfd(pidfd, libc::WNOHANG);
        let reaped = match &self.exec_id {
            Some(exec_id) => crate::exec_ids::reap_named(exec_id, self.pid, reap)?,
            None => reap()?,
        };
        let exit = reaped.map(|(status, usage)| ExitInfo {
            status,
            usage,
            at: Instant::now(),
        });
        self.exit = exit;
        Ok(exit)
    }

    /// Blocks until the child has exited, and reaps it.
    pub fn wait(&mut self) -> io::Result<ExitInfo> {
        loop {
            if let Some(exit) = self.try_reap()? {
                return Ok(exit);
            }
            sys::wait_readable(self.pidfd.as_fd(), -1)?;
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.exit.is_none() {
            self.signal_group(libc::SIGKILL);
            if let Err(e) = self.wait() {
                crate::log::error(format_args!("cannot reap command {}: {e}", self.pid));
            }
        }
        deregister(self.pid, self.token);
    }
}

/// Blocks SIGCHLD in the calling thread, and so in every thread it starts later. `main` calls
/// it before anything else, so that the orphan reaper's `sigwaitinfo` receives every SIGCHLD.
pub fn block_sigchld() {
    let set = sigchld_set();
    // SAFETY: pthread_sigmask reads the live set we pass and writes no old set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

fn sigchld_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data; sigemptyset initializes it before sigaddset uses it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        set
    }
}

/// Starts the thread that reaps orphans. Call once, after [`block_sigchld`].
pub fn start_orphan_reaper() -> io::Result<()> {
    std::thread::Builder::new()
        .name("reaper".into())
        .stack_size(64 * 1024)
        .spawn(reap_orphans_forever)?;
    Ok(())
}

fn reap_orphans_forever() {
    let set = sigchld_set();
    loop {
        reap_ready_orphans();
        // SAFETY: sigwaitinfo reads the live set we pass; a null info pointer is allowed.
        let r = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        if r == -1 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            crate::log::error(format_args!(
                "sigwaitinfo failed: {}",
                io::Error::last_os_error()
            ));
            // Should never happen; avoid spinning if it does.
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// How long the orphan reaper leaves an exited command to its exec before looking again.
const COMMAND_REAP_GRACE: std::time::Duration = std::time::Duration::from_millis(2);

/// Reaps every orphan that has exited. Signals coalesce, so one SIGCHLD may stand for many.
fn reap_ready_orphans() {
    loop {
        // SAFETY: siginfo_t is plain old data; all-zeroes is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes into the live siginfo_t we pass. WNOWAIT: only look.
        let r = unsafe {
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: after a successful waitid, si_pid is set (0 when nothing was ready).
        let pid = unsafe { info.si_pid() };
        if r == -1 || pid == 0 {
            return;
        }
        let live = lock_live();
        if live.contains_key(&pid) {
            // A command: its exec reaps it at once (it watches the pidfd), and waitid would
            // keep showing it ahead of any orphan behind it. Look again once the exec has let
            // go of it, or after a moment (the exec reaps before it sends the exit frame, but
            // lets go only after, which a slow host can delay).
            drop(
                REGISTRY
                    .reaped
                    .wait_timeout_while(live, COMMAND_REAP_GRACE, |live| live.contains_key(&pid))
                    .unwrap_or_else(|p| p.into_inner()),
            );
            continue;
        }
        // An orphan. Reaped with the registry locked: no spawn (which could reuse the pid for
        // a command) can happen in between.
        // SAFETY: as above.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes into the live siginfo_t we pass.
        unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG,
            )
        };
        drop(live);
    }
}

/// `waitid(P_PIDFD, …, WEXITED | __WALL | extra, &rusage)`: the raw system call, because the C
/// library's waitid has no rusage argument. Returns the wait status and usage, or `None` when
/// `WNOHANG` was given and the child is still running.
fn waitid_pidfd(
    pidfd: BorrowedFd<'_>,
    extra: libc::c_int,
) -> io::Result<Option<(libc::c_int, RawUsage)>> {
    // SAFETY: siginfo_t and rusage are plain old data; all-zeroes is a valid value of each.
    let (mut info, mut ru): (libc::siginfo_t, libc::rusage) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    loop {
        // SAFETY: the kernel writes into the live siginfo_t and rusage we pass; the other
        // arguments are plain integers.
        let r = unsafe {
            libc::syscall(
                libc::SYS_waitid,
                libc::P_PIDFD,
                pidfd.as_raw_fd(),
                &mut info as *mut libc::siginfo_t,
                libc::WEXITED | libc::__WALL | extra,
                &mut ru as *mut libc::rusage,
            )
        };
        if r == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    // SAFETY: after a successful waitid, si_pid and si_status are set (si_pid 0: not exited).
    let (pid, code) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    // Back to the wait4-style status word the rest of the agent decodes.
    let status = match info.si_code {
        libc::CLD_EXITED => (code & 0xff) << 8,
        libc::CLD_DUMPED => (code & 0x7f) | 0x80,
        _ => code & 0x7f,
    };
    let ms = |tv: libc::timeval| {
        u64::try_from(tv.tv_sec).unwrap_or(0) * 1000 + u64::try_from(tv.tv_usec).unwrap_or(0) / 1000
    };
    let usage = RawUsage {
        user_ms: ms(ru.ru_utime),
        sys_ms: ms(ru.ru_stime),
        maxrss_kib: u64::try_from(ru.ru_maxrss).unwrap_or(0),
        majflt: u64::try_from(ru.ru_majflt).unwrap_or(0),
        nivcsw: u64::try_from(ru.ru_nivcsw).unwrap_or(0),
        read_bytes: u64::try_from(ru.ru_inblock).unwrap_or(0) * 512,
        write_bytes: u64::try_from(ru.ru_oublock).unwrap_or(0) * 512,
    };
    Ok(Some((status, usage)))
}
