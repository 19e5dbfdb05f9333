//! Thin, checked wrappers over the system calls the sandbox needs.

use std::ffi::{CString, NulError};
use std::io;
use std::path::Path;

/// A failed system call, with the step and the input it was given.
#[derive(Debug, thiserror::Error)]
#[error("{step} failed")]
pub struct SysError {
    /// What was being done, with its arguments (`mount overlay on /run/…/root`).
    pub step: String,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

impl SysError {
    pub(crate) fn last(step: impl Into<String>) -> Self {
        SysError {
            step: step.into(),
            source: io::Error::last_os_error(),
        }
    }

    pub(crate) fn io(step: impl Into<String>, source: io::Error) -> Self {
        SysError {
            step: step.into(),
            source,
        }
    }
}

/// Checks a libc return value.
pub(crate) fn check(ret: libc::c_int, step: impl FnOnce() -> String) -> Result<(), SysError> {
    if ret < 0 {
        Err(SysError::last(step()))
    } else {
        Ok(())
    }
}

pub(crate) fn cstring(path: &Path) -> Result<CString, SysError> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|e: NulError| {
        SysError::io(
            format!("path {}", path.display()),
            io::Error::new(io::ErrorKind::InvalidInput, e),
        )
    })
}

pub(crate) fn unshare_namespaces() -> Result<(), SysError> {
    let flags = libc::CLONE_NEWNS
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWCGROUP;
    // SAFETY: unshare takes plain flags and touches no memory of ours.
    let ret = unsafe { libc::unshare(flags) };
    check(ret, || {
        "unshare(pid, mount, uts, ipc, net, cgroup namespaces)".into()
    })
}

pub(crate) enum Forked {
    Parent(libc::pid_t),
    Child,
}

pub(crate) fn fork() -> Result<Forked, SysError> {
    // SAFETY: the caller guarantees the process is single-threaded (documented on `enter`), so
    // the child may run arbitrary code.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(SysError::last("fork into the new PID namespace")),
        0 => Ok(Forked::Child),
        child => Ok(Forked::Parent(child)),
    }
}

/// The outer process: waits for the sandbox's PID 1 and exits with its status.
pub(crate) fn supervise(child: libc::pid_t) -> ! {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer for the duration of the call.
        let ret = unsafe { libc::waitpid(child, &mut status, 0) };
        if ret == child {
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else if libc::WIFSIGNALED(status) {
                128 + libc::WTERMSIG(status)
            } else {
                continue;
            };
            std::process::exit(code);
        }
        if ret < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            std::process::exit(125);
        }
    }
}

/// PID 1 is SIGKILLed when the supervisor dies, which takes the whole namespace with it.
pub(crate) fn die_with_parent() -> Result<(), SysError> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) reads only its integer arguments.
    let ret = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    check(ret, || "prctl(PR_SET_PDEATHSIG)".into())
}

pub(crate) fn parent_pid() -> libc::pid_t {
    // SAFETY: getppid takes no arguments and cannot fail.
    unsafe { libc::getppid() }
}

pub(crate) fn set_hostname(name: &str) -> Result<(), SysError> {
    // SAFETY: the pointer and length describe `name`'s bytes, valid for the call.
    let ret = unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    check(ret, || format!("sethostname({name:?})"))
}

/// Sets `IFF_UP` on `lo`, the only interface of the new network namespace.
pub(crate) fn bring_up_loopback() -> Result<(), SysError> {
    // SAFETY: socket() takes plain integers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(SysError::last("socket(AF_INET) to configure lo"));
    }
    // SAFETY: an all-zero ifreq is a valid value of this plain C struct.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq for SIOCGIFFLAGS, which writes its flags union member.
    let got = unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req) };
    let result = if got < 0 {
        Err(SysError::last("ioctl(SIOCGIFFLAGS, lo)"))
    } else {
        // SAFETY: SIOCGIFFLAGS initialised the flags member of the union.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
        // SAFETY: `req` is a valid ifreq for SIOCSIFFLAGS, which only reads it.
        let set = unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &req) };
        check(set, || "ioctl(SIOCSIFFLAGS, lo up)".into())
    };
    // SAFETY: `fd` is ours and closed exactly once.
    unsafe { libc::close(fd) };
    result
}
