//! Drops every privilege of the sandbox's PID 1 (and so of everything it runs).

use crate::sys::{check, SysError};

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED:
/// uid 0 gains no capabilities at execve, for good.
const SECURE_BITS: libc::c_ulong = 0x0f;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn prctl(option: libc::c_int, arg: libc::c_ulong, what: &str) -> Result<(), SysError> {
    // SAFETY: these prctl options take only integer arguments.
    let ret = unsafe { libc::prctl(option, arg, 0 as libc::c_ulong, 0 as libc::c_ulong, 0) };
    check(ret, || format!("prctl({what})"))
}

fn last_capability() -> libc::c_ulong {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// Lowers the OOM score of the caller so that the kernel kills commands, not the agent. Commands
/// reset their own score to 0 (raising needs no privilege). Best effort: a daemon without
/// CAP_SYS_RESOURCE (some container hosts) cannot lower it, and the sandbox still works.
pub(crate) fn protect_from_oom_killer() -> Result<(), SysError> {
    match std::fs::write("/proc/self/oom_score_adj", "-1000") {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) => {
            eprintln!(
                "guest-init: cannot lower oom_score_adj ({e}); the agent is not OOM-protected"
            );
            Ok(())
        }
        Err(e) => Err(SysError::io("write /proc/self/oom_score_adj", e)),
    }
}

pub(crate) fn drop_all() -> Result<(), SysError> {
    prctl(libc::PR_SET_SECUREBITS, SECURE_BITS, "PR_SET_SECUREBITS")?;
    for cap in 0..=last_capability() {
        // SAFETY: PR_CAPBSET_DROP takes an integer capability number.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if ret < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(SysError::last(format!("prctl(PR_CAPBSET_DROP, {cap})")));
        }
    }
    prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        "PR_CAP_AMBIENT_CLEAR_ALL",
    )?;
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: `header` and `data` are valid v3 capability structures for the duration of the
    // call; capset only reads `data`.
    let ret = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    check(ret as libc::c_int, || "capset(no capabilities)".into())?;
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS")
}
