//! The sandbox's capabilities: Docker's default set minus what has no use in a sandbox without
//! a network device (`NET_RAW`, `MKNOD`, `AUDIT_WRITE`), all scoped to the sandbox's user
//! namespace. They act only on what that namespace owns — its own files in the overlay and
//! tmpfs, its own processes — never on host objects, whose owners are not mapped in it.
//!
//! They are what lets root inside behave as users expect (`chown`, writing any file of the
//! image through the overlay, `su`/`setpriv` and package managers that drop to another user),
//! and every process's capabilities are bounded by them for good: the bounding set holds only
//! these, so a setuid binary of the image cannot gain more.

use crate::sys::{check, SysError};

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// The capabilities root keeps inside the sandbox (within its user namespace), by name and
/// number.
pub use contract::container_security::SANDBOX_CAPABILITIES as KEPT;

/// The kept set as a capability mask (`CapBnd` in `/proc/PID/status`).
pub fn kept_mask() -> u64 {
    KEPT.iter().fold(0, |mask, (_, cap)| mask | (1u64 << cap))
}

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

/// Drops every capability outside [`KEPT`] from the bounding set, for good (for this process
/// and everything it starts), and clears the ambient set.
pub(crate) fn limit_bounding_set() -> Result<(), SysError> {
    limit_bounding_set_to(kept_mask())
}

/// Drops every capability outside `keep` from the bounding set, for good, and clears the
/// ambient set.
pub(crate) fn limit_bounding_set_to(keep: u64) -> Result<(), SysError> {
    let kept = keep;
    // Capabilities the running kernel does not know yet are refused with EINVAL: stop there.
    for cap in 0..64u64 {
        if kept & (1 << cap) != 0 {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes an integer capability number.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if ret < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(SysError::last(format!("prctl(PR_CAPBSET_DROP, {cap})")));
        }
    }
    prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        "PR_CAP_AMBIENT_CLEAR_ALL",
    )
}

/// Sets the effective and permitted sets to [`KEPT`] and clears the inheritable set. (PID 1 is
/// started with `execve` as root right after this, which grants root the bounding set anew;
/// this closes the window in between.)
pub(crate) fn keep_only_kept() -> Result<(), SysError> {
    keep_only(kept_mask())
}

/// Sets the effective and permitted sets to `mask` (within the bounding set) and clears the
/// inheritable set.
pub(crate) fn keep_only(mask: u64) -> Result<(), SysError> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let word = |i: usize| (mask >> (32 * i)) as u32;
    let data = [0, 1].map(|i| CapData {
        effective: word(i),
        permitted: word(i),
        inheritable: 0,
    });
    // SAFETY: `header` and `data` are valid v3 capability structures for the duration of the
    // call; capset only reads `data`.
    let ret = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    check(ret as libc::c_int, || format!("capset({mask:#x})"))
}

/// `PR_SET_NO_NEW_PRIVS`: nothing this process executes from now on gains a privilege (a
/// setuid or setgid bit, file capabilities), for good.
pub(crate) fn no_new_privileges() -> Result<(), SysError> {
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_set_has_no_administrative_capability() {
        let mask = kept_mask();
        for (name, cap) in [
            ("CAP_SYS_ADMIN", 21),
            ("CAP_SYS_PTRACE", 19),
            ("CAP_SYS_MODULE", 16),
            ("CAP_NET_ADMIN", 12),
            ("CAP_NET_RAW", 13),
            ("CAP_SYS_RAWIO", 17),
            ("CAP_DAC_READ_SEARCH", 2),
            ("CAP_SYS_TIME", 25),
            ("CAP_SYS_BOOT", 22),
            ("CAP_MKNOD", 27),
            ("CAP_BPF", 39),
            ("CAP_PERFMON", 38),
        ] {
            assert_eq!(mask & (1 << cap), 0, "{name} is kept");
        }
        assert_eq!(mask, 0x0000_0000_8004_05fb);
    }
}
