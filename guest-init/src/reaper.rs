//! The one place that waits for children.
//!
//! A dedicated thread blocks in `waitid(P_ALL, WEXITED | WNOWAIT)`; when a child has exited it
//! reads `/proc/<pid>/io` (still there: the zombie is not reaped yet), reaps it with `wait4` for
//! its rusage, and hands the status to the exec that registered the pid. Orphans (re-parented to
//! us as PID 1 or as a subreaper) are reaped and ignored. No polling: when there are no children
//! at all the thread sleeps on a condition variable until the next spawn.
//!
//! Registration happens under the same lock as the fork ([`Reaper::spawn_with`]), so a child
//! that exits before its exec has registered it cannot be mistaken for an orphan.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use crate::sys;

/// How a child ended, as collected by the reaper.
#[derive(Debug, Clone, Copy)]
pub struct ExitInfo {
    /// The raw wait status.
    pub status: libc::c_int,
    /// Its rusage (includes its reaped descendants).
    pub usage: RawUsage,
    /// `read_bytes`/`write_bytes` from `/proc/<pid>/io`, when readable.
    pub io: Option<(u64, u64)>,
    /// When the reaper collected it.
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
}

/// Where the reaper leaves one child's exit: a slot plus an eventfd to wake the exec's poll.
#[derive(Debug)]
pub struct ExitSlot {
    info: Mutex<Option<ExitInfo>>,
    event: OwnedFd,
    /// `/proc/<pid>/io`, opened while the child runs, so that reading it at exit (on the path
    /// to the exit frame) is one `pread` instead of a procfs path lookup.
    io_file: Mutex<Option<std::fs::File>>,
}

impl ExitSlot {
    /// An empty slot.
    pub fn new() -> io::Result<Arc<ExitSlot>> {
        Ok(Arc::new(ExitSlot {
            info: Mutex::new(None),
            event: sys::eventfd()?,
            io_file: Mutex::new(None),
        }))
    }

    /// The descriptor that becomes readable once the exit is in.
    pub fn event_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.event.as_fd()
    }

    /// The exit, if the child has been reaped.
    pub fn get(&self) -> Option<ExitInfo> {
        *lock(&self.info)
    }

    /// Blocks until the child has been reaped.
    pub fn wait(&self) -> ExitInfo {
        loop {
            if let Some(info) = self.get() {
                return info;
            }
            // Errors here mean a broken eventfd; fall back to re-checking, which still ends
            // because the reaper fills the slot.
            let _ = sys::wait_readable(self.event.as_fd(), 1000);
        }
    }

    /// Opens `/proc/<pid>/io` ahead of the exit (best effort).
    pub fn open_io(&self, pid: libc::pid_t) {
        if let Ok(f) = std::fs::File::open(format!("/proc/{pid}/io")) {
            *lock(&self.io_file) = Some(f);
        }
    }

    fn fill(&self, info: ExitInfo) {
        *lock(&self.info) = Some(info);
        sys::eventfd_signal(self.event.as_fd());
    }
}

#[derive(Debug, Default)]
struct State {
    /// Bumped on every spawn; wakes the reaper when it had no children.
    generation: u64,
    /// Children whose exit someone waits for.
    watched: HashMap<libc::pid_t, Arc<ExitSlot>>,
}

/// The process-wide reaper.
#[derive(Debug, Default)]
pub struct Reaper {
    state: Mutex<State>,
    spawned: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave the data inconsistent (plain inserts and
    // removals), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

static REAPER: OnceLock<&'static Reaper> = OnceLock::new();

impl Reaper {
    /// The process's reaper, started on first use.
    pub fn global() -> &'static Reaper {
        REAPER.get_or_init(|| {
            let reaper: &'static Reaper = Box::leak(Box::default());
            let started = std::thread::Builder::new()
                .name("reaper".into())
                .stack_size(64 * 1024)
                .spawn(move || reaper.run());
            if let Err(e) = started {
                crate::log::error(format_args!("cannot start the reaper thread: {e}"));
            }
            reaper
        })
    }

    /// Runs `fork` (which returns the new child's pid) with the registry locked, and registers
    /// the pid with `slot` before the reaper can see its exit.
    pub fn spawn_with<F>(&self, slot: &Arc<ExitSlot>, fork: F) -> io::Result<libc::pid_t>
    where
        F: FnOnce() -> io::Result<libc::pid_t>,
    {
        let mut state = lock(&self.state);
        let pid = fork()?;
        state.watched.insert(pid, Arc::clone(slot));
        state.generation += 1;
        drop(state);
        self.spawned.notify_one();
        Ok(pid)
    }

    /// Sends `signal` to the process group led by `pid`, unless `pid` has already been reaped
    /// (then its number may be reused, and the group is gone anyway). Returns whether it did.
    pub fn signal_group(&self, pid: libc::pid_t, signal: libc::c_int) -> bool {
        let state = lock(&self.state);
        if !state.watched.contains_key(&pid) {
            return false;
        }
        sys::kill_group(pid, signal).is_ok()
    }

    fn run(&self) {
        loop {
            let generation = lock(&self.state).generation;
            match wait_any_nowait() {
                Ok(pid) => self.reap(pid),
                Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
                    let mut state = lock(&self.state);
                    while state.generation == generation {
                        state = self.spawned.wait(state).unwrap_or_else(|p| p.into_inner());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    crate::log::error(format_args!("waitid failed: {e}"));
                    // Should never happen; avoid spinning if it does.
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
        }
    }

    fn reap(&self, pid: libc::pid_t) {
        let mut state = lock(&self.state);
        let slot = state.watched.remove(&pid);
        let io = match &slot {
            Some(slot) => match lock(&slot.io_file).take() {
                Some(file) => read_io_file(&file),
                None => std::fs::File::open(format!("/proc/{pid}/io"))
                    .ok()
                    .and_then(|f| read_io_file(&f)),
            },
            None => None,
        };
        match wait4(pid) {
            Ok((status, usage)) => {
                let at = Instant::now();
                drop(state);
                if let Some(slot) = slot {
                    slot.fill(ExitInfo {
                        status,
                        usage,
                        io,
                        at,
                    });
                }
            }
            Err(e) => {
                crate::log::error(format_args!("wait4({pid}) failed: {e}"));
                if let Some(slot) = slot {
                    state.watched.insert(pid, slot);
                }
            }
        }
    }
}

/// Blocks until some child has exited and returns its pid, leaving it a zombie.
fn wait_any_nowait() -> io::Result<libc::pid_t> {
    // SAFETY: siginfo_t is plain old data; all-zeroes is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes into the live siginfo_t we pass; P_ALL ignores the id.
    sys::cvt(unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) })?;
    // SAFETY: after a successful waitid with WEXITED, si_pid is the field that was set.
    Ok(unsafe { info.si_pid() })
}

/// Reaps `pid`, returning its wait status and rusage.
fn wait4(pid: libc::pid_t) -> io::Result<(libc::c_int, RawUsage)> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; all-zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 writes into the live int and rusage we pass.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        match sys::cvt(r) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WouldBlock)),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let ms = |tv: libc::timeval| {
        u64::try_from(tv.tv_sec).unwrap_or(0) * 1000 + u64::try_from(tv.tv_usec).unwrap_or(0) / 1000
    };
    let usage = RawUsage {
        user_ms: ms(ru.ru_utime),
        sys_ms: ms(ru.ru_stime),
        maxrss_kib: u64::try_from(ru.ru_maxrss).unwrap_or(0),
        majflt: u64::try_from(ru.ru_majflt).unwrap_or(0),
        nivcsw: u64::try_from(ru.ru_nivcsw).unwrap_or(0),
    };
    Ok((status, usage))
}

/// `(read_bytes, write_bytes)` from an open `/proc/<pid>/io` of a (zombie) process: one
/// `pread` (the file is about 150 bytes).
fn read_io_file(file: &std::fs::File) -> Option<(u64, u64)> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 512];
    let len = loop {
        match file.read_at(&mut buf, 0) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    };
    parse_proc_io(std::str::from_utf8(&buf[..len]).ok()?)
}

fn parse_proc_io(text: &str) -> Option<(u64, u64)> {
    let mut read = None;
    let mut write = None;
    for line in text.lines() {
        let (key, value) = line.split_once(':')?;
        let value = value.trim().parse::<u64>().ok();
        match key {
            "read_bytes" => read = value,
            "write_bytes" => write = value,
            _ => {}
        }
    }
    Some((read?, write?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_io_parses_storage_counters() {
        let text = "rchar: 10\nwchar: 20\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\n\
                    write_bytes: 8192\ncancelled_write_bytes: 0\n";
        assert_eq!(parse_proc_io(text), Some((4096, 8192)));
        assert_eq!(parse_proc_io("rchar: 1\n"), None);
    }
}
