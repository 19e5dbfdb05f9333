//! Thin, safe wrappers over the few system calls std does not offer. Every `unsafe` block in
//! the agent outside `spawn.rs` and `init.rs` lives here, each as small as it can be.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Turns a `-1` return into the thread's `errno`.
pub fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A pipe `(read end, write end)`, both close-on-exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1 as libc::c_int; 2];
    // SAFETY: `fds` is a valid, writable array of two ints, as pipe2 requires.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Moves up to `count` bytes from `file` (at its offset, which advances) to `out` inside the
/// kernel: the bytes never enter the agent's memory. `Ok(0)` at the end of the file.
pub fn sendfile(out: BorrowedFd<'_>, file: BorrowedFd<'_>, count: usize) -> io::Result<usize> {
    // SAFETY: a null offset pointer means "use and advance the file's offset"; both descriptors
    // are borrowed and open for the call.
    let n = unsafe {
        libc::sendfile(
            out.as_raw_fd(),
            file.as_raw_fd(),
            std::ptr::null_mut(),
            count,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// The agent's own descriptors: each exec holds about six (its connection, three pipes'
/// ends, a pidfd), so the usual 1,024 would refuse new execs from about 170 at once.
const AGENT_FD_LIMIT: libc::rlim_t = 65_536;

/// Raises this process's open-file limit to [`AGENT_FD_LIMIT`] (the hard limit too, where it
/// may: PID 1 of a VM can; otherwise up to the hard limit) and returns the limit it had, which
/// commands get back. `None` when nothing changed (or the limit cannot be read): commands then
/// inherit the limit as it is, with no call per exec.
pub fn raise_fd_limit() -> Option<libc::rlimit> {
    let mut original = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut original) } != 0 {
        return None;
    }
    if original.rlim_cur >= AGENT_FD_LIMIT {
        return None;
    }
    let wanted = libc::rlimit {
        rlim_cur: AGENT_FD_LIMIT,
        rlim_max: original.rlim_max.max(AGENT_FD_LIMIT),
    };
    // SAFETY: setrlimit reads one live rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } != 0 {
        // Without the privilege to raise the hard limit: as far as it goes.
        let within = libc::rlimit {
            rlim_cur: original.rlim_max.min(AGENT_FD_LIMIT),
            rlim_max: original.rlim_max,
        };
        if within.rlim_cur <= original.rlim_cur {
            return None;
        }
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &within) } != 0 {
            return None;
        }
    }
    Some(original)
}

/// A non-blocking, close-on-exec eventfd.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: the descriptor was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to an eventfd's counter (wakes its pollers).
pub fn eventfd_signal(fd: BorrowedFd<'_>) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to a descriptor we borrow. An eventfd write only
    // fails on counter overflow, which a handful of signals cannot reach.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Resets a non-blocking eventfd's counter (after its pollers woke).
pub fn eventfd_drain(fd: BorrowedFd<'_>) {
    let mut count: u64 = 0;
    // SAFETY: reads at most 8 bytes into a live u64; a non-blocking eventfd at zero answers
    // EAGAIN, which leaves it as it is.
    unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
}

/// Sets or clears `O_NONBLOCK` (one ioctl rather than fcntl's get-then-set).
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    let mut on = libc::c_int::from(on);
    // SAFETY: FIONBIO reads one int through the pointer, which points at a live int.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONBIO as _, &mut on) })?;
    Ok(())
}

/// send(2) with `MSG_DONTWAIT`: a non-blocking write on a blocking socket, no `fcntl` needed.
pub fn send_nowait(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: the pointer and length describe a live, readable slice.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.unsigned_abs())
}

/// recv(2) with `MSG_DONTWAIT`.
pub fn recv_nowait(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the pointer and length describe a live, writable slice.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.unsigned_abs())
}

/// Sets a pipe's capacity (`F_SETPIPE_SZ`); the kernel rounds it up to a power of two pages.
pub fn set_pipe_size(fd: BorrowedFd<'_>, bytes: libc::c_int) -> io::Result<()> {
    // SAFETY: F_SETPIPE_SZ takes an integer argument, no pointer.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, bytes) })?;
    Ok(())
}

/// Bytes waiting to be read on a pipe or socket.
pub fn bytes_available(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which points at a live int.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD as _, &mut n) })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// poll(2); an interrupted call counts as "nothing ready".
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> io::Result<usize> {
    // SAFETY: the pointer and length describe a live, writable slice of pollfd.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    match cvt(n) {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

/// Sends `signal` to the process group `pgid`.
pub fn kill_group(pgid: libc::pid_t, signal: libc::c_int) -> io::Result<()> {
    if pgid <= 1 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill takes no pointers; pgid > 1 so this never targets every process.
    cvt(unsafe { libc::kill(-pgid, signal) })?;
    Ok(())
}

/// This process's id.
pub fn getpid() -> u32 {
    std::process::id()
}

/// `uname -r`.
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain old data; all-zeroes is a valid value.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname writes into the live struct we pass.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return String::from("unknown");
    }
    // SAFETY: on success `release` holds a NUL-terminated string within the array.
    let release = unsafe { CStr::from_ptr(uts.release.as_ptr()) };
    release.to_string_lossy().into_owned()
}

/// Milliseconds since boot (`CLOCK_BOOTTIME`, what `/proc/uptime` reports).
pub fn uptime_ms() -> u64 {
    // SAFETY: timespec is plain old data; all-zeroes is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime writes into the live struct we pass.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1000
        + u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000
}

/// Flushes every filesystem.
pub fn sync() {
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Resets the machine (the VMM turns a reset into a clean exit). Returns only on failure.
pub fn reboot() -> io::Error {
    // SAFETY: reboot takes no pointers; RB_AUTOBOOT restarts the machine.
    unsafe { libc::reboot(libc::RB_AUTOBOOT) };
    io::Error::last_os_error()
}

/// Drops the clean cached pages of the file behind `fd` (after an fsync: all of them), so the
/// next read goes to the device.
pub fn drop_cached_pages(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: posix_fadvise takes no pointers; offset 0 and length 0 mean the whole file.
    match unsafe { libc::posix_fadvise(fd.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) } {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// Makes this process the reaper of its orphaned descendants (for host-process mode).
pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer argument.
    cvt(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) })?;
    Ok(())
}

/// Whether `fd` is an open descriptor.
pub fn fd_is_open(fd: libc::c_int) -> bool {
    // SAFETY: F_GETFD takes no pointer; it only asks whether `fd` is open.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Makes sure descriptors 0, 1 and 2 are open (on `/dev/null` if nothing else), so pipes
/// created later never land on them and `dup2` in the child always clears close-on-exec.
pub fn ensure_stdio_open() {
    for fd in 0..3 {
        if fd_is_open(fd) {
            continue;
        }
        // SAFETY: the path is a NUL-terminated literal; open returns the lowest free fd, which is
        // `fd` since all lower ones are open.
        unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
    }
}

/// Block until `fd` is readable or `timeout_ms` passes (`-1`: forever).
pub fn wait_readable(fd: BorrowedFd<'_>, timeout_ms: libc::c_int) -> io::Result<bool> {
    let mut fds = [libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    Ok(poll(&mut fds, timeout_ms)? > 0)
}

/// The name of a signal number (`"SIGKILL"`), or `"SIG<n>"` for one without a name.
pub fn signal_name(signal: libc::c_int) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTKFLT => "SIGSTKFLT",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSYS => "SIGSYS",
        other => return format!("SIG{other}"),
    };
    name.to_string()
}

static SPARED: std::sync::Mutex<Vec<libc::pid_t>> = std::sync::Mutex::new(Vec::new());

/// Set once by a sandbox agent whose PID namespace the sandbox's root and its containers share.
static SHARED_PIDS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Processes [`signal_all_but_self`] spares besides the caller, from now on: a namespace
/// sandbox's containers' agents (the sandbox's PID 1 sees them, PID 1s of nested PID
/// namespaces) and its container factory.
pub fn spare_from_signals(pids: impl IntoIterator<Item = libc::pid_t>) {
    SPARED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend(pids);
}

/// Says that this agent serves one member of a pod sharing one PID namespace (the root's
/// agent is its PID 1; a container's agent is not PID 1 of anything): [`signal_all_but_self`]
/// then signals this member's processes alone (those in its mount namespace), never another
/// member's or their agents.
pub fn share_pid_namespace() {
    SHARED_PIDS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Set once this agent's commands run in a PID namespace below its own, the one its `/proc`
/// shows (a container whose first command is PID 1).
static COMMANDS_PID_NAMESPACE_BELOW: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Says that this agent's commands run in a PID namespace below its own, whose `/proc` it sees
/// ([`signal_all_but_self`] then signals each process listed there).
pub fn commands_in_pid_namespace_below() {
    COMMANDS_PID_NAMESPACE_BELOW.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`share_pid_namespace`] was called.
pub fn shares_pid_namespace() -> bool {
    SHARED_PIDS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sends `signal` to every process of this agent's own root except itself (and those
/// [`spare_from_signals`] named): from PID 1 alone in its PID namespace, every process of it
/// (`kill(2)` with pid -1); otherwise each process of `/proc` in its PID and mount namespaces
/// in turn. Refused unless this process is PID 1 or serves a member of a shared PID namespace:
/// elsewhere (the agent as a plain process, in tests) it would reach the host's processes.
pub fn signal_all_but_self(signal: libc::c_int) -> io::Result<()> {
    let shared = SHARED_PIDS.load(std::sync::atomic::Ordering::Relaxed);
    if std::process::id() != 1 && !shared {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "signalling every process needs the agent to be PID 1",
        ));
    }
    if !(1..=64).contains(&signal) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("signal {signal} is not 1 to 64"),
        ));
    }
    if COMMANDS_PID_NAMESPACE_BELOW.load(std::sync::atomic::Ordering::Relaxed) {
        // Its `/proc` is its command's PID namespace, below ours: every process there, the
        // container's own and nothing else (never its spawner, beside us).
        return signal_each_of_proc(signal);
    }
    let spared = SPARED.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if let Some(main) = crate::main_ns::get() {
        // A microVM pod: the sandbox's own root is `main`, in namespaces of its own.
        return signal_each_but(signal, &spared, main.pids_link(), main.mounts_link());
    }
    if !spared.is_empty() || shared {
        let own_pids = std::fs::read_link("/proc/self/ns/pid")?;
        let own_mounts = std::fs::read_link("/proc/self/ns/mnt")?;
        return signal_each_but(signal, &spared, &own_pids, &own_mounts);
    }
    // SAFETY: kill takes no pointers. With pid -1 from PID 1 it reaches every process of the
    // namespace but the caller; ESRCH (none left) is not an error here.
    match cvt(unsafe { libc::kill(-1, signal) }) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        Err(e) => Err(e),
    }
}

/// [`signal_all_but_self`] with processes to spare: every process of `/proc` in the PID
/// namespace `own_pids` and the mount namespace `own_mounts` (their `readlink`s: this agent's own, or
/// `main`'s in a microVM pod) but PID 1, the caller and `spared`, a few times over
/// while new ones appear (a process forked between the listing and the signals is caught by
/// the next pass). The sandbox's signal is for its own root: a container's processes (in PID
/// namespaces of their own, or, when the pod shares one, in mount namespaces of their own)
/// are spared; each container's agent signals its own. Processes that exit meanwhile are no
/// error.
fn signal_each_but(
    signal: libc::c_int,
    spared: &[libc::pid_t],
    own_pids: &std::path::Path,
    own_mounts: &std::path::Path,
) -> io::Result<()> {
    let me = std::process::id() as libc::pid_t;
    signal_each_listed(|pid| {
        if pid == 1 || pid == me || spared.contains(&pid) {
            return Ok(false);
        }
        // A process that is gone has no namespace links; it needs no signal either.
        let same = |kind: &str, own: &std::path::Path| {
            std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).is_ok_and(|ns| ns == own)
        };
        if !same("pid", own_pids) || !same("mnt", own_mounts) {
            return Ok(false);
        }
        // SAFETY: kill takes no pointers.
        cvt(unsafe { libc::kill(pid, signal) }).map(|_| true)
    })
}

/// Walks `/proc` a few times over while new processes appear (one forked between a listing
/// and the signals is caught by the next pass), giving each pid once to `signal_one`, which
/// says whether it signalled it. A process gone meanwhile (`ESRCH`) is no error.
fn signal_each_listed(
    mut signal_one: impl FnMut(libc::pid_t) -> io::Result<bool>,
) -> io::Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let mut new = 0;
        for entry in std::fs::read_dir("/proc")? {
            let Some(pid) = entry?
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            if !seen.insert(pid) {
                continue;
            }
            match signal_one(pid) {
                Ok(true) => new += 1,
                Ok(false) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(e),
            }
        }
        if new == 0 {
            break;
        }
    }
    Ok(())
}

/// [`signal_all_but_self`] for a container whose command is PID 1 of a PID namespace below
/// this agent's, the one its `/proc` shows: each process listed there, through its `/proc`
/// directory (whose numbers are that namespace's, not ours, so no `kill(2)`), a few times
/// over while new ones appear. Its PID 1 receives the signal as a PID 1 does.
fn signal_each_of_proc(signal: libc::c_int) -> io::Result<()> {
    signal_each_listed(|pid| {
        let Ok(dir) = std::fs::File::open(format!("/proc/{pid}")) else {
            return Ok(false); // gone meanwhile
        };
        // SAFETY: pidfd_send_signal takes a live descriptor (a /proc/PID directory serves as
        // a pidfd), a signal number and null info.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                std::os::fd::AsRawFd::as_raw_fd(&dir),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        cvt(ret as libc::c_int).map(|_| true)
    })
}

/// Whether `path` (not followed if a symlink) is the root of a mount of its own: a file
/// bound there (kubelet's `/etc/hosts`), which can be written but not replaced.
pub fn is_mount_root(path: &std::path::Path) -> io::Result<bool> {
    /// `STATX_ATTR_MOUNT_ROOT` (Linux 5.8).
    const MOUNT_ROOT: u64 = 0x2000;
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: statx is plain old data; all-zeroes is valid and statx overwrites it.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `stx` a valid out-pointer, both alive for the call.
    cvt(unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS,
            &mut stx,
        )
    })?;
    Ok(stx.stx_attributes_mask & MOUNT_ROOT != 0 && stx.stx_attributes & MOUNT_ROOT != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_are_the_conventional_ones() {
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_name(40), "SIG40");
    }

    #[test]
    fn kill_group_refuses_to_signal_everything() {
        assert!(kill_group(0, 0).is_err());
        assert!(kill_group(1, 0).is_err());
        assert!(kill_group(-5, 0).is_err());
    }
}
