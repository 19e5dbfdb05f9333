//! A seccomp filter for everything in the sandbox: system calls that only serve to attack the
//! kernel or escape fail with EPERM. The capabilities are already gone (so most of these would
//! fail anyway); the filter is the second wall, and it also covers calls that need no
//! capability at all (`unshare` of a user namespace, `ptrace`, `bpf`, `userfaultfd`, …).

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

use crate::sys::SysError;

/// Denied system calls, by name and number (x86_64).
pub const DENIED: &[(&str, i64)] = &[
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("syslog", libc::SYS_syslog),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("adjtimex", libc::SYS_adjtimex),
    ("fsopen", libc::SYS_fsopen),
    ("fsmount", libc::SYS_fsmount),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
];

fn program() -> Result<BpfProgram, String> {
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        DENIED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| e.to_string())?;
    BpfProgram::try_from(filter).map_err(|e| e.to_string())
}

/// Installs the filter on the calling thread; it is inherited by every child. Requires
/// `no_new_privs` (set just before).
pub(crate) fn install() -> Result<(), SysError> {
    let program = program().map_err(|e| {
        SysError::io(
            "build the seccomp filter",
            std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
        )
    })?;
    seccompiler::apply_filter(&program).map_err(|e| {
        SysError::io(
            "install the seccomp filter",
            std::io::Error::other(e.to_string()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles() {
        let program = program().expect("filter");
        assert!(program.len() > DENIED.len());
    }
}
