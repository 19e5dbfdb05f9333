//! The sandbox's seccomp policy: an allowlist modelled on Docker's default profile
//! (moby/profiles `seccomp/default.json`), for a workload that is root in its own user
//! namespace with the capabilities of [`crate::privileges::KEPT`].
//!
//! - Every system call a CI job needs (compilers, package managers, test runners, `git`,
//!   debuggers and sanitizers through `ptrace`) is allowed; everything else fails with `EPERM`:
//!   the keyring, `bpf`, `perf_event_open`, `userfaultfd`, `io_uring_*`, `unshare`, `setns`,
//!   the mount family, `open_by_handle_at`, `kexec_*`, modules, `swapon`, clock setting, `acct`,
//!   `quotactl`, `reboot`, `sethostname`, `pidfd_getfd`, `kcmp`, NUMA policy, …
//! - `clone` only without `CLONE_NEW*` flags; `personality` only with the five harmless
//!   values; `socket` not for `AF_ALG` or `AF_VSOCK` (vsock is not network-namespaced).
//! - `clone3` fails with `ENOSYS` (its flags are in memory seccomp cannot read), so libc falls
//!   back to `clone`; so do numbers this table does not know yet (newer kernels), so that libc
//!   falls back to an older call instead of failing on `EPERM`.
//!
//! Two filters are stacked: the allowlist, then the `ENOSYS` rules. When both answer with an
//! errno, the kernel takes the later filter's.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::sys::SysError;

macro_rules! numbered {
    ($($sys:ident),* $(,)?) => {
        &[$((stringify!($sys), libc::$sys as i64)),*]
    };
}

/// Allowed with any arguments (Docker's unconditional group, x86_64 64-bit ABI).
const ALWAYS: &[(&str, i64)] = numbered![
    SYS_read,
    SYS_write,
    SYS_open,
    SYS_close,
    SYS_stat,
    SYS_fstat,
    SYS_lstat,
    SYS_poll,
    SYS_lseek,
    SYS_mmap,
    SYS_mprotect,
    SYS_munmap,
    SYS_brk,
    SYS_rt_sigaction,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_ioctl,
    SYS_pread64,
    SYS_pwrite64,
    SYS_readv,
    SYS_writev,
    SYS_access,
    SYS_pipe,
    SYS_select,
    SYS_sched_yield,
    SYS_mremap,
    SYS_msync,
    SYS_mincore,
    SYS_madvise,
    SYS_shmget,
    SYS_shmat,
    SYS_shmctl,
    SYS_dup,
    SYS_dup2,
    SYS_pause,
    SYS_nanosleep,
    SYS_getitimer,
    SYS_alarm,
    SYS_setitimer,
    SYS_getpid,
    SYS_sendfile,
    SYS_connect,
    SYS_accept,
    SYS_sendto,
    SYS_recvfrom,
    SYS_sendmsg,
    SYS_recvmsg,
    SYS_shutdown,
    SYS_bind,
    SYS_listen,
    SYS_getsockname,
    SYS_getpeername,
    SYS_socketpair,
    SYS_setsockopt,
    SYS_getsockopt,
    SYS_fork,
    SYS_vfork,
    SYS_execve,
    SYS_exit,
    SYS_wait4,
    SYS_kill,
    SYS_uname,
    SYS_semget,
    SYS_semop,
    SYS_semctl,
    SYS_shmdt,
    SYS_msgget,
    SYS_msgsnd,
    SYS_msgrcv,
    SYS_msgctl,
    SYS_fcntl,
    SYS_flock,
    SYS_fsync,
    SYS_fdatasync,
    SYS_truncate,
    SYS_ftruncate,
    SYS_getdents,
    SYS_getcwd,
    SYS_chdir,
    SYS_fchdir,
    SYS_rename,
    SYS_mkdir,
    SYS_rmdir,
    SYS_creat,
    SYS_link,
    SYS_unlink,
    SYS_symlink,
    SYS_readlink,
    SYS_chmod,
    SYS_fchmod,
    SYS_chown,
    SYS_fchown,
    SYS_lchown,
    SYS_umask,
    SYS_gettimeofday,
    SYS_getrlimit,
    SYS_getrusage,
    SYS_sysinfo,
    SYS_times,
    SYS_getuid,
    SYS_getgid,
    SYS_setuid,
    SYS_setgid,
    SYS_geteuid,
    SYS_getegid,
    SYS_setpgid,
    SYS_getppid,
    SYS_getpgrp,
    SYS_setsid,
    SYS_setreuid,
    SYS_setregid,
    SYS_getgroups,
    SYS_setgroups,
    SYS_setresuid,
    SYS_getresuid,
    SYS_setresgid,
    SYS_getresgid,
    SYS_getpgid,
    SYS_setfsuid,
    SYS_setfsgid,
    SYS_getsid,
    SYS_capget,
    SYS_capset,
    SYS_rt_sigpending,
    SYS_rt_sigtimedwait,
    SYS_rt_sigqueueinfo,
    SYS_rt_sigsuspend,
    SYS_sigaltstack,
    SYS_utime,
    SYS_mknod,
    SYS_statfs,
    SYS_fstatfs,
    SYS_getpriority,
    SYS_setpriority,
    SYS_sched_setparam,
    SYS_sched_getparam,
    SYS_sched_setscheduler,
    SYS_sched_getscheduler,
    SYS_sched_get_priority_max,
    SYS_sched_get_priority_min,
    SYS_sched_rr_get_interval,
    SYS_mlock,
    SYS_munlock,
    SYS_mlockall,
    SYS_munlockall,
    SYS_prctl,
    SYS_adjtimex,
    SYS_setrlimit,
    SYS_sync,
    SYS_gettid,
    SYS_readahead,
    SYS_setxattr,
    SYS_lsetxattr,
    SYS_fsetxattr,
    SYS_getxattr,
    SYS_lgetxattr,
    SYS_fgetxattr,
    SYS_listxattr,
    SYS_llistxattr,
    SYS_flistxattr,
    SYS_removexattr,
    SYS_lremovexattr,
    SYS_fremovexattr,
    SYS_tkill,
    SYS_time,
    SYS_futex,
    SYS_sched_setaffinity,
    SYS_sched_getaffinity,
    SYS_set_thread_area,
    SYS_io_setup,
    SYS_io_destroy,
    SYS_io_getevents,
    SYS_io_submit,
    SYS_io_cancel,
    SYS_get_thread_area,
    SYS_epoll_create,
    SYS_epoll_ctl_old,
    SYS_epoll_wait_old,
    SYS_remap_file_pages,
    SYS_getdents64,
    SYS_set_tid_address,
    SYS_restart_syscall,
    SYS_semtimedop,
    SYS_fadvise64,
    SYS_timer_create,
    SYS_timer_settime,
    SYS_timer_gettime,
    SYS_timer_getoverrun,
    SYS_timer_delete,
    SYS_clock_gettime,
    SYS_clock_getres,
    SYS_clock_nanosleep,
    SYS_exit_group,
    SYS_epoll_wait,
    SYS_epoll_ctl,
    SYS_tgkill,
    SYS_utimes,
    SYS_mq_open,
    SYS_mq_unlink,
    SYS_mq_timedsend,
    SYS_mq_timedreceive,
    SYS_mq_notify,
    SYS_mq_getsetattr,
    SYS_waitid,
    SYS_ioprio_set,
    SYS_ioprio_get,
    SYS_inotify_init,
    SYS_inotify_add_watch,
    SYS_inotify_rm_watch,
    SYS_openat,
    SYS_mkdirat,
    SYS_mknodat,
    SYS_fchownat,
    SYS_futimesat,
    SYS_newfstatat,
    SYS_unlinkat,
    SYS_renameat,
    SYS_linkat,
    SYS_symlinkat,
    SYS_readlinkat,
    SYS_fchmodat,
    SYS_faccessat,
    SYS_pselect6,
    SYS_ppoll,
    SYS_set_robust_list,
    SYS_get_robust_list,
    SYS_splice,
    SYS_tee,
    SYS_sync_file_range,
    SYS_vmsplice,
    SYS_utimensat,
    SYS_epoll_pwait,
    SYS_signalfd,
    SYS_timerfd_create,
    SYS_eventfd,
    SYS_fallocate,
    SYS_timerfd_settime,
    SYS_timerfd_gettime,
    SYS_accept4,
    SYS_signalfd4,
    SYS_eventfd2,
    SYS_epoll_create1,
    SYS_dup3,
    SYS_pipe2,
    SYS_inotify_init1,
    SYS_preadv,
    SYS_pwritev,
    SYS_rt_tgsigqueueinfo,
    SYS_recvmmsg,
    SYS_fanotify_mark,
    SYS_prlimit64,
    SYS_name_to_handle_at,
    SYS_clock_adjtime,
    SYS_syncfs,
    SYS_sendmmsg,
    SYS_getcpu,
    SYS_sched_setattr,
    SYS_sched_getattr,
    SYS_renameat2,
    SYS_seccomp,
    SYS_getrandom,
    SYS_memfd_create,
    SYS_execveat,
    SYS_membarrier,
    SYS_mlock2,
    SYS_copy_file_range,
    SYS_preadv2,
    SYS_pwritev2,
    SYS_pkey_mprotect,
    SYS_pkey_alloc,
    SYS_pkey_free,
    SYS_statx,
    SYS_rseq,
    SYS_pidfd_send_signal,
    SYS_pidfd_open,
    SYS_close_range,
    SYS_openat2,
    SYS_faccessat2,
    SYS_epoll_pwait2,
    SYS_landlock_create_ruleset,
    SYS_landlock_add_rule,
    SYS_landlock_restrict_self,
    SYS_memfd_secret,
    SYS_process_mrelease,
    SYS_futex_waitv,
    SYS_fchmodat2,
    SYS_mseal,
    // Docker allows these as well, beyond its unconditional group: ptrace since kernel 4.8
    // cannot bypass seccomp (the agent is protected from it by being undumpable), and
    // chroot with CAP_SYS_CHROOT, which the sandbox keeps.
    SYS_modify_ldt,
    SYS_arch_prctl,
    SYS_ptrace,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_chroot,
];

/// The rest of Docker's unconditional group: calls newer than the `libc` crate's table.
const ALWAYS_NEWER: &[(&str, i64)] = &[
    ("io_pgetevents", 333),
    ("uretprobe", 335),
    ("cachestat", 451),
    ("map_shadow_stack", 453),
    ("futex_wake", 454),
    ("futex_wait", 455),
    ("futex_requeue", 456),
    ("statmount", 457),
    ("listmount", 458),
    ("setxattrat", 463),
    ("getxattrat", 464),
    ("listxattrat", 465),
    ("removexattrat", 466),
];

/// `CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
/// CLONE_NEWNET`: `clone` is allowed only with none of them.
pub const NAMESPACE_FLAGS: u64 = 0x7E02_0000;

/// `personality` values allowed: PER_LINUX, PER_LINUX32, UNAME26, both, and the query.
const PERSONALITIES: [u64; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

const AF_ALG: u64 = 38;
const AF_VSOCK: u64 = 40;

/// The highest system call number this table knows (Linux 6.18: `file_setattr`).
pub const HIGHEST_KNOWN: u32 = 469;
/// Numbers that were never assigned on x86_64 (between `uprobe` and `pidfd_send_signal`).
const UNASSIGNED: std::ops::RangeInclusive<u32> = 337..=423;
const SYS_CLONE3: u32 = 435;
/// The x32 ABI's bit in the system call number; such calls are left to the allowlist,
/// which refuses them.
const X32_BIT: u32 = 0x4000_0000;

fn condition(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64) -> SeccompCondition {
    // Only fails for an argument index above 5.
    SeccompCondition::new(arg, len, op, value).unwrap_or_else(|_| unreachable!("arg {arg}"))
}

fn rule(conditions: Vec<SeccompCondition>) -> SeccompRule {
    // Only fails for an empty list.
    SeccompRule::new(conditions).unwrap_or_else(|_| unreachable!("empty rule"))
}

/// The allowlist: its rules, by system call number.
fn allowlist_rules() -> BTreeMap<i64, Vec<SeccompRule>> {
    use SeccompCmpArgLen::{Dword, Qword};
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = ALWAYS
        .iter()
        .chain(ALWAYS_NEWER)
        .map(|(_, nr)| (*nr, Vec::new()))
        .collect();
    rules.insert(
        libc::SYS_clone,
        vec![rule(vec![condition(
            0,
            Qword,
            SeccompCmpOp::MaskedEq(NAMESPACE_FLAGS),
            0,
        )])],
    );
    rules.insert(
        libc::SYS_personality,
        PERSONALITIES
            .iter()
            .map(|p| rule(vec![condition(0, Dword, SeccompCmpOp::Eq, *p)]))
            .collect(),
    );
    rules.insert(
        libc::SYS_socket,
        vec![
            rule(vec![condition(0, Dword, SeccompCmpOp::Lt, AF_ALG)]),
            rule(vec![condition(0, Dword, SeccompCmpOp::Eq, AF_ALG + 1)]),
            rule(vec![condition(0, Dword, SeccompCmpOp::Gt, AF_VSOCK)]),
        ],
    );
    rules
}

fn allowlist() -> Result<BpfProgram, seccompiler::BackendError> {
    let filter = SeccompFilter::new(
        allowlist_rules(),
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        TargetArch::x86_64,
    )?;
    BpfProgram::try_from(filter)
}

/// `clone3` and unknown numbers: `ENOSYS`. A few instructions of classic BPF (seccompiler
/// has no ranges); the architecture was checked by the allowlist, which runs too.
fn enosys_program() -> BpfProgram {
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    const LOAD_NR: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
    const JGT: u16 = (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16;
    const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
    let op = |code: u16, jt: u8, jf: u8, k: u32| seccompiler::sock_filter { code, jt, jf, k };
    let allow = libc::SECCOMP_RET_ALLOW;
    let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    vec![
        /* 0 */ op(LOAD_NR, 0, 0, 0), // seccomp_data.nr
        /* 1 */ op(JSET, 6, 0, X32_BIT), // x32: allow here, refused by the allowlist
        /* 2 */ op(JEQ, 4, 0, SYS_CLONE3), // clone3 -> ENOSYS
        /* 3 */ op(JGT, 3, 0, HIGHEST_KNOWN), // newer than this table -> ENOSYS
        /* 4 */ op(JGE, 0, 3, *UNASSIGNED.start()), // below the gap -> allow
        /* 5 */ op(JGT, 2, 0, *UNASSIGNED.end()), // above the gap -> allow
        /* 6 */ op(RET, 0, 0, enosys),
        /* 7 */ op(RET, 0, 0, enosys),
        /* 8 */ op(RET, 0, 0, allow),
    ]
}

fn install_program(program: &BpfProgram, what: &str) -> Result<(), SysError> {
    let len = u16::try_from(program.len()).map_err(|_| {
        SysError::io(
            format!("the {what} seccomp filter"),
            std::io::Error::other(format!("{} instructions is too long", program.len())),
        )
    })?;
    let fprog = libc::sock_fprog {
        len,
        // Both are the kernel's `struct sock_filter`, #[repr(C)] with the same fields.
        filter: program.as_ptr().cast::<libc::sock_filter>().cast_mut(),
    };
    // SAFETY: `fprog` points at `program`'s instructions, alive for the call; the kernel
    // copies them. Installing without no_new_privs needs CAP_SYS_ADMIN in our user namespace,
    // which the caller still has.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &fprog as *const libc::sock_fprog,
        )
    };
    crate::sys::check(ret as libc::c_int, || {
        format!("install the {what} seccomp filter")
    })
}

/// Installs both filters on the calling thread; every child inherits them.
pub(crate) fn install() -> Result<(), SysError> {
    let allowlist = allowlist().map_err(|e| {
        SysError::io(
            "build the seccomp allowlist",
            std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
        )
    })?;
    install_program(&allowlist, "allowlist")?;
    install_program(&enosys_program(), "ENOSYS")
}

/// Whether the policy allows `nr` with some arguments (for documentation and tests).
pub fn allows(nr: i64) -> bool {
    allowlist_rules().contains_key(&nr)
}

/// Every system call allowed regardless of arguments, by name.
pub fn always_allowed() -> impl Iterator<Item = &'static str> {
    ALWAYS
        .iter()
        .chain(ALWAYS_NEWER)
        .map(|(name, _)| name.strip_prefix("SYS_").unwrap_or(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a classic BPF program over a `seccomp_data` with only `nr` set.
    fn run(program: &[seccompiler::sock_filter], nr: u32) -> u32 {
        let mut pc = 0usize;
        let mut acc = 0u32;
        loop {
            let op = &program[pc];
            let class = u32::from(op.code) & 0x07;
            match class {
                c if c == libc::BPF_LD => acc = if op.k == 0 { nr } else { 0 },
                c if c == libc::BPF_RET => return op.k,
                c if c == libc::BPF_JMP => {
                    let taken = match u32::from(op.code) & 0xf0 {
                        j if j == libc::BPF_JEQ => acc == op.k,
                        j if j == libc::BPF_JGT => acc > op.k,
                        j if j == libc::BPF_JGE => acc >= op.k,
                        j if j == libc::BPF_JSET => acc & op.k != 0,
                        other => panic!("jump {other:#x}"),
                    };
                    pc += usize::from(if taken { op.jt } else { op.jf });
                }
                other => panic!("class {other:#x}"),
            }
            pc += 1;
        }
    }

    #[test]
    fn the_allowlist_compiles() {
        let program = allowlist().expect("filter");
        assert!(program.len() > ALWAYS.len());
        assert!(program.len() < usize::from(u16::MAX));
    }

    #[test]
    fn escape_calls_are_not_allowed() {
        for nr in [
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_keyctl,
            libc::SYS_add_key,
            libc::SYS_request_key,
            libc::SYS_bpf,
            libc::SYS_perf_event_open,
            libc::SYS_userfaultfd,
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
            libc::SYS_open_by_handle_at,
            libc::SYS_kexec_load,
            libc::SYS_kexec_file_load,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_delete_module,
            libc::SYS_swapon,
            libc::SYS_settimeofday,
            libc::SYS_clock_settime,
            libc::SYS_acct,
            libc::SYS_quotactl,
            libc::SYS_reboot,
            libc::SYS_sethostname,
            libc::SYS_fsopen,
            libc::SYS_fsmount,
            libc::SYS_move_mount,
            libc::SYS_open_tree,
            libc::SYS_mount_setattr,
            libc::SYS_pidfd_getfd,
            libc::SYS_kcmp,
            libc::SYS_syslog,
            libc::SYS_iopl,
            libc::SYS_ioperm,
            libc::SYS_clone3,
        ] {
            assert!(!allows(nr), "syscall {nr} is allowed");
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_execve,
            libc::SYS_clone,
            libc::SYS_ptrace,
            libc::SYS_faccessat2,
            libc::SYS_close_range,
            libc::SYS_pidfd_open,
            libc::SYS_waitid,
        ] {
            assert!(allows(nr), "syscall {nr} is refused");
        }
    }

    #[test]
    fn clone3_and_unknown_numbers_get_enosys() {
        let program = enosys_program();
        let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
        assert_eq!(run(&program, SYS_CLONE3), enosys);
        assert_eq!(run(&program, HIGHEST_KNOWN + 1), enosys);
        assert_eq!(run(&program, 1000), enosys);
        assert_eq!(run(&program, 337), enosys);
        assert_eq!(run(&program, 423), enosys);
        for allowed_here in [0, 336, 424, 434, 436, HIGHEST_KNOWN, X32_BIT | 1] {
            assert_eq!(
                run(&program, allowed_here),
                libc::SECCOMP_RET_ALLOW,
                "{allowed_here}"
            );
        }
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = always_allowed().collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
