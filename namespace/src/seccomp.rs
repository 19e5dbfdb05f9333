//! The sandbox's seccomp policy: an allowlist modelled on Docker's default profile
//! (moby/profiles `seccomp/default.json`), for a workload that is root in its own user
//! namespace with the capabilities of [`crate::privileges::KEPT`].
//!
//! - Every system call a CI job needs (compilers, package managers, test runners, `git`,
//!   debuggers and sanitizers through `ptrace`) is allowed; everything else fails with `EPERM`:
//!   the keyring, `bpf`, `perf_event_open`, `userfaultfd`, `io_uring_*`, `unshare`, `setns`,
//!   the mount family, `open_by_handle_at`, `kexec_*`, modules, `swapon`, clock setting, `acct`,
//!   `quotactl`, `reboot`, `pidfd_getfd`, `kcmp`, NUMA policy, …
//! - `clone` only without `CLONE_NEW*` flags; `personality` only with the five harmless
//!   values; `socket` not for `AF_ALG`, `AF_VSOCK` (vsock is not network-namespaced),
//!   `AF_PACKET` or netfilter's netlink (`NETLINK_NETFILTER`): a container granted
//!   `NET_RAW` or `NET_ADMIN` over a network namespace of the sandbox's own does not reach
//!   the packet-socket and `nf_tables` code that user namespaces have so often exploited.
//! - `sethostname` and `setdomainname`, as Docker's profile allows them with `SYS_ADMIN`: the
//!   kernel still asks for `CAP_SYS_ADMIN` in the sandbox's user namespace, which only a
//!   container granted it holds, and the name is the sandbox's own (its UTS namespace).
//! - `clone3` fails with `ENOSYS` (its flags are in memory seccomp cannot read), so libc falls
//!   back to `clone`; so do numbers this table does not know yet (newer kernels), so that libc
//!   falls back to an older call instead of failing on `EPERM`.
//! - Another architecture's calls (i386's `int 0x80`) kill the process; the x32 ABI's are
//!   refused.
//!
//! The filter is one program that finds the number in a binary search over the allowed ranges
//! (nine comparisons or so), not a chain of ~300: the kernel runs it for every uncached call and
//! for every number when it installs the filter (to cache the calls allowed whatever their
//! arguments), and a linear chain made that installation alone cost about a millisecond per
//! sandbox.

use std::ops::RangeInclusive;

use crate::bpf::{Assembler, Cmp, Insn, Label, To};
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
    // The sandbox's own UTS namespace; the kernel asks for CAP_SYS_ADMIN in its user
    // namespace, which a sandbox's root has only when a container is granted it.
    SYS_sethostname,
    SYS_setdomainname,
];

/// The rest of Docker's unconditional group: calls newer than the `libc` crate's table, by
/// name; their numbers come from [`crate::syscall_table`].
const ALWAYS_NEWER: &[&str] = &[
    "io_pgetevents",
    "uretprobe",
    "cachestat",
    "map_shadow_stack",
    "futex_wake",
    "futex_wait",
    "futex_requeue",
    "statmount",
    "listmount",
    "setxattrat",
    "getxattrat",
    "listxattrat",
    "removexattrat",
];

/// [`ALWAYS_NEWER`] with their numbers (each is in the table: a test checks it).
fn always_newer() -> impl Iterator<Item = (&'static str, i64)> {
    ALWAYS_NEWER
        .iter()
        .filter_map(|name| crate::syscall_table::number(name).map(|nr| (*name, i64::from(nr))))
}

/// `CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
/// CLONE_NEWNET`: `clone` is allowed only with none of them.
pub const NAMESPACE_FLAGS: u32 = 0x7E02_0000;

/// `personality` values allowed: PER_LINUX, PER_LINUX32, UNAME26, both, and the query.
const PERSONALITIES: [u32; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// Socket families refused: the kernel's crypto API, vsock (not network-namespaced) and
/// packet sockets.
const REFUSED_FAMILIES: [u32; 3] = [
    38, /* AF_ALG */
    40, /* AF_VSOCK */
    17, /* AF_PACKET */
];
/// `AF_NETLINK`, whose protocol decides.
const AF_NETLINK: u32 = 16;
/// Netfilter's netlink protocol (`nf_tables`, `ipset`, conntrack), refused.
const NETLINK_NETFILTER: u32 = 12;

/// The highest system call number this table knows (Linux 6.18: `file_setattr`).
pub const HIGHEST_KNOWN: u32 = 469;
/// Numbers that were never assigned on x86_64 (between `uprobe` and `pidfd_send_signal`).
const UNASSIGNED: RangeInclusive<u32> = 337..=423;
const SYS_CLONE3: u32 = 435;
/// The x32 ABI's bit in the system call number.
const X32_BIT: u32 = 0x4000_0000;
/// `AUDIT_ARCH_X86_64`.
const ARCH_X86_64: u32 = 0xC000_003E;

/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
/// The low 32 bits of the first argument (little-endian), all the kernel reads of these.
const DATA_ARG0_LOW: u32 = 16;
/// The low 32 bits of the third (`socket`'s protocol).
const DATA_ARG2_LOW: u32 = 32;

const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
const RET_KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;

/// Allowed only with some arguments; checked after the binary search fails to allow them.
const CONDITIONAL: [i64; 3] = [libc::SYS_clone, libc::SYS_socket, libc::SYS_personality];

/// What a container granted `CAP_SYS_ADMIN` (Kubernetes' `privileged`, or `SYS_ADMIN` added)
/// may call beyond the sandbox's policy: `mount` and `umount2`, as Docker's profile allows them
/// with that capability. The kernel still asks for `CAP_SYS_ADMIN` over the mount namespace,
/// which is the container's own (made in the sandbox's user namespace), so such a mount
/// reaches no other container, no host path's source and nothing of the node; mounts made in
/// a less privileged mount namespace never propagate out of it. The newer mount API stays
/// refused: `mount(8)` from util-linux and busybox use these two.
const SYS_ADMIN_MOUNTS: &[(&str, i64)] = numbered![SYS_mount, SYS_umount2];

/// `CAP_SYS_ADMIN`'s number (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;

/// Whether the filter lets its process mount ([`SYS_ADMIN_MOUNTS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mounting {
    /// The sandbox's policy: the mount family is refused.
    Refused,
    /// A container granted `CAP_SYS_ADMIN`.
    Allowed,
}

impl Mounting {
    /// The policy for a process holding the capabilities of `mask` (bit N = capability N).
    pub(crate) fn for_capabilities(mask: u64) -> Self {
        if mask & (1 << CAP_SYS_ADMIN) != 0 {
            Mounting::Allowed
        } else {
            Mounting::Refused
        }
    }
}

/// The numbers allowed whatever their arguments, as sorted, disjoint, maximal ranges.
fn allowed_ranges(mounting: Mounting) -> Vec<RangeInclusive<u32>> {
    let extra: &[(&str, i64)] = match mounting {
        Mounting::Refused => &[],
        Mounting::Allowed => SYS_ADMIN_MOUNTS,
    };
    let mut numbers: Vec<u32> = ALWAYS
        .iter()
        .copied()
        .chain(always_newer())
        .chain(extra.iter().copied())
        .filter_map(|(_, nr)| u32::try_from(nr).ok())
        .collect();
    numbers.sort_unstable();
    numbers.dedup();
    let mut ranges: Vec<RangeInclusive<u32>> = Vec::new();
    for nr in numbers {
        match ranges.last_mut() {
            Some(last) if *last.end() + 1 == nr => *last = *last.start()..=nr,
            _ => ranges.push(nr..=nr),
        }
    }
    ranges
}

/// Emits a binary search over `ranges`: jumps to `allow` when the number is in one, else to
/// `miss`.
fn search(asm: &mut Assembler, ranges: &[RangeInclusive<u32>], allow: Label, miss: Label) {
    match ranges {
        [] => asm.jump(Cmp::Eq, 0, To::Label(miss), To::Label(miss)),
        [only] => {
            asm.jump(Cmp::Ge, *only.start(), To::Next, To::Label(miss));
            asm.jump(Cmp::Gt, *only.end(), To::Label(miss), To::Label(allow));
        }
        _ => {
            let mid = ranges.len() / 2;
            let right = asm.label();
            asm.jump(Cmp::Ge, *ranges[mid].start(), To::Label(right), To::Next);
            search(asm, &ranges[..mid], allow, miss);
            asm.bind(right);
            search(asm, &ranges[mid..], allow, miss);
        }
    }
}

/// The whole filter.
fn program(mounting: Mounting) -> Result<Vec<Insn>, crate::bpf::AsmError> {
    let mut asm = Assembler::default();
    let [allow, eperm, enosys, kill, miss, clone, socket, personality] =
        std::array::from_fn(|_| asm.label());

    asm.load(DATA_ARCH);
    asm.jump(Cmp::Eq, ARCH_X86_64, To::Next, To::Label(kill));
    asm.load(DATA_NR);
    asm.jump(Cmp::Set, X32_BIT, To::Label(eperm), To::Next);
    search(&mut asm, &allowed_ranges(mounting), allow, miss);

    // Not allowed whatever the arguments: maybe with some, else EPERM or ENOSYS.
    asm.bind(miss);
    asm.jump(Cmp::Eq, libc::SYS_clone as u32, To::Label(clone), To::Next);
    asm.jump(
        Cmp::Eq,
        libc::SYS_socket as u32,
        To::Label(socket),
        To::Next,
    );
    asm.jump(
        Cmp::Eq,
        libc::SYS_personality as u32,
        To::Label(personality),
        To::Next,
    );
    asm.jump(Cmp::Eq, SYS_CLONE3, To::Label(enosys), To::Next);
    asm.jump(Cmp::Gt, HIGHEST_KNOWN, To::Label(enosys), To::Next);
    asm.jump(Cmp::Ge, *UNASSIGNED.start(), To::Next, To::Label(eperm));
    asm.jump(
        Cmp::Gt,
        *UNASSIGNED.end(),
        To::Label(eperm),
        To::Label(enosys),
    );

    asm.bind(clone);
    asm.load(DATA_ARG0_LOW);
    asm.jump(
        Cmp::Set,
        NAMESPACE_FLAGS,
        To::Label(eperm),
        To::Label(allow),
    );

    asm.bind(socket);
    asm.load(DATA_ARG0_LOW);
    for family in REFUSED_FAMILIES {
        asm.jump(Cmp::Eq, family, To::Label(eperm), To::Next);
    }
    asm.jump(Cmp::Eq, AF_NETLINK, To::Next, To::Label(allow));
    asm.load(DATA_ARG2_LOW);
    asm.jump(
        Cmp::Eq,
        NETLINK_NETFILTER,
        To::Label(eperm),
        To::Label(allow),
    );

    asm.bind(personality);
    asm.load(DATA_ARG0_LOW);
    for value in PERSONALITIES {
        asm.jump(Cmp::Eq, value, To::Label(allow), To::Next);
    }
    asm.ret(RET_EPERM);

    asm.bind(allow);
    asm.ret(RET_ALLOW);
    asm.bind(eperm);
    asm.ret(RET_EPERM);
    asm.bind(enosys);
    asm.ret(RET_ENOSYS);
    asm.bind(kill);
    asm.ret(RET_KILL);
    asm.finish()
}

/// Installs the filter on the calling thread; every child inherits it. Without
/// `no_new_privs`, which needs `CAP_SYS_ADMIN` in the caller's user namespace (the caller
/// still has it), so that setuid tools of the image keep working, within the bounding set.
pub(crate) fn install(mounting: Mounting) -> Result<(), SysError> {
    let program = program(mounting).map_err(|e| {
        SysError::io(
            "assemble the seccomp filter",
            std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
        )
    })?;
    install_program(&program, "the seccomp filter")
}

/// Installs a container's own profile ([`crate::seccomp_profile`], packed instructions) on
/// top of whatever filter the caller has (the sandbox's; in a microVM, none), without
/// `no_new_privs`: the caller must hold `CAP_SYS_ADMIN` in its user namespace.
pub fn install_profile(packed: &[u64]) -> Result<(), SysError> {
    let program: Vec<Insn> = packed
        .iter()
        .map(|word| crate::seccomp_profile::unpack(*word))
        .collect();
    install_program(&program, "the container's seccomp profile")
}

fn install_program(program: &[Insn], what: &str) -> Result<(), SysError> {
    let len = u16::try_from(program.len()).map_err(|_| {
        SysError::io(
            format!("install {what}"),
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} instructions", program.len()),
            ),
        )
    })?;
    let fprog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `program`'s instructions, alive for the call; the kernel
    // copies them.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &fprog as *const libc::sock_fprog,
        )
    };
    crate::sys::check(ret as libc::c_int, || format!("install {what}"))
}

/// Whether the policy allows `nr`, with any arguments or with some.
pub fn allows(nr: i64) -> bool {
    CONDITIONAL.contains(&nr)
        || u32::try_from(nr).is_ok_and(|nr| {
            allowed_ranges(Mounting::Refused)
                .iter()
                .any(|r| r.contains(&nr))
        })
}

/// Every system call allowed regardless of arguments, by name.
pub fn always_allowed() -> impl Iterator<Item = &'static str> {
    ALWAYS
        .iter()
        .map(|(name, _)| name.strip_prefix("SYS_").unwrap_or(name))
        .chain(ALWAYS_NEWER.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(arch: u32, nr: u32, args: [u64; 3]) -> [u8; 64] {
        let mut d = [0u8; 64];
        d[0..4].copy_from_slice(&nr.to_ne_bytes());
        d[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, arg) in args.iter().enumerate() {
            d[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_ne_bytes());
        }
        d
    }

    fn verdict(nr: i64, arg0: u64) -> u32 {
        verdict_with(nr, [arg0, 0, 0])
    }

    fn verdict_with(nr: i64, args: [u64; 3]) -> u32 {
        let program = program(Mounting::Refused).expect("assembles");
        crate::bpf::run(&program, &data(ARCH_X86_64, nr as u32, args))
    }

    #[test]
    fn the_filter_is_short_and_assembles() {
        let program = program(Mounting::Refused).expect("assembles");
        assert!(program.len() < 256, "{} instructions", program.len());
    }

    #[test]
    fn every_number_gets_the_policy_verdict() {
        let ranges = allowed_ranges(Mounting::Refused);
        for nr in 0..=1100u32 {
            let expected = if ranges.iter().any(|r| r.contains(&nr)) {
                RET_ALLOW
            } else if nr == SYS_CLONE3 || nr > HIGHEST_KNOWN || UNASSIGNED.contains(&nr) {
                RET_ENOSYS
            } else if CONDITIONAL.contains(&i64::from(nr)) {
                continue; // by argument, below
            } else {
                RET_EPERM
            };
            assert_eq!(verdict(i64::from(nr), 0), expected, "syscall {nr}");
        }
        // The x32 ABI is refused, even for numbers allowed on x86_64; i386 kills.
        assert_eq!(verdict(i64::from(X32_BIT | 39), 0), RET_EPERM);
        let program = program(Mounting::Refused).expect("assembles");
        assert_eq!(
            crate::bpf::run(&program, &data(0x4000_0003, 39, [0; 3])),
            RET_KILL
        );
    }

    #[test]
    fn arguments_decide_clone_socket_and_personality() {
        let clone = libc::SYS_clone;
        assert_eq!(verdict(clone, libc::SIGCHLD as u64), RET_ALLOW);
        let threads = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        assert_eq!(verdict(clone, threads), RET_ALLOW);
        for ns in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWCGROUP,
        ] {
            assert_eq!(verdict(clone, ns as u64 | 17), RET_EPERM, "{ns:#x}");
        }
        for family in [
            libc::AF_UNIX,
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
            39,
            41,
        ] {
            assert_eq!(
                verdict(libc::SYS_socket, family as u64),
                RET_ALLOW,
                "{family}"
            );
        }
        for family in [libc::AF_ALG, libc::AF_VSOCK, libc::AF_PACKET] {
            assert_eq!(
                verdict(libc::SYS_socket, family as u64),
                RET_EPERM,
                "{family}"
            );
        }
        let netlink = |protocol: libc::c_int| {
            let args = [
                libc::AF_NETLINK as u64,
                libc::SOCK_RAW as u64,
                protocol as u64,
            ];
            verdict_with(libc::SYS_socket, args)
        };
        assert_eq!(netlink(libc::NETLINK_ROUTE), RET_ALLOW);
        assert_eq!(netlink(libc::NETLINK_NETFILTER), RET_EPERM);
        for p in PERSONALITIES {
            assert_eq!(verdict(libc::SYS_personality, u64::from(p)), RET_ALLOW);
        }
        let read_implies_exec = 0x0040_0000;
        assert_eq!(verdict(libc::SYS_personality, read_implies_exec), RET_EPERM);
    }

    #[test]
    fn escape_calls_are_refused_and_everyday_calls_allowed() {
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
        ] {
            assert!(!allows(nr), "syscall {nr} is allowed");
            assert_eq!(verdict(nr, 0), RET_EPERM, "syscall {nr}");
        }
        assert_eq!(verdict(libc::SYS_clone3, 0), RET_ENOSYS);
        for nr in [
            libc::SYS_read,
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_ptrace,
            libc::SYS_faccessat2,
            libc::SYS_fchmodat2,
            libc::SYS_close_range,
            libc::SYS_pidfd_open,
            libc::SYS_waitid,
            libc::SYS_chroot,
            libc::SYS_seccomp,
            libc::SYS_sethostname,
            libc::SYS_setdomainname,
        ] {
            assert!(allows(nr), "syscall {nr} is refused");
            assert_eq!(verdict(nr, 0), RET_ALLOW, "syscall {nr}");
        }
    }

    #[test]
    fn a_container_granted_sys_admin_may_mount_and_nothing_more() {
        let privileged = program(Mounting::Allowed).expect("assembles");
        let with_mounts =
            |nr: i64| crate::bpf::run(&privileged, &data(ARCH_X86_64, nr as u32, [0; 3]));
        assert_eq!(with_mounts(libc::SYS_mount), RET_ALLOW);
        assert_eq!(with_mounts(libc::SYS_umount2), RET_ALLOW);
        for nr in [
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_pivot_root,
            libc::SYS_fsopen,
            libc::SYS_open_tree,
            libc::SYS_move_mount,
            libc::SYS_mount_setattr,
            libc::SYS_bpf,
        ] {
            assert_eq!(with_mounts(nr), RET_EPERM, "syscall {nr}");
        }
        let new_namespace = (libc::CLONE_NEWNS | libc::SIGCHLD) as u64;
        let clone = crate::bpf::run(
            &privileged,
            &data(ARCH_X86_64, libc::SYS_clone as u32, [new_namespace, 0, 0]),
        );
        assert_eq!(clone, RET_EPERM);
        assert_eq!(
            verdict(libc::SYS_mount, 0),
            RET_EPERM,
            "the sandbox's policy"
        );
        let sys_admin = 1u64 << CAP_SYS_ADMIN;
        assert_eq!(Mounting::for_capabilities(sys_admin), Mounting::Allowed);
        assert_eq!(
            Mounting::for_capabilities(crate::privileges::kept_mask()),
            Mounting::Refused,
            "the sandbox's own set holds no CAP_SYS_ADMIN"
        );
    }

    #[test]
    fn every_newer_call_is_in_the_table() {
        assert_eq!(always_newer().count(), ALWAYS_NEWER.len());
        assert!(always_newer().any(|(name, nr)| name == "cachestat" && nr == 451));
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
