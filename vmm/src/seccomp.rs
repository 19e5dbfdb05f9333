//! Seccomp filters per thread, after Firecracker: each kind of VMM thread gets its own allowlist
//! with argument rules, installed by the thread itself (no TSYNC) once all of its setup is done
//! and before it runs anything the guest can influence. Any other system call kills the process.
//!
//! Every thread exists before any filter goes on, so both filters forbid `clone`/`clone3`
//! outright; files, sockets and KVM objects are all opened before, so neither allows `open*`.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

vmm_sys_util::ioctl_io_nr!(KVM_RUN, kvm_bindings::KVMIO, 0x80);

/// The kinds of thread a running VMM has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmmThread {
    /// The main thread once it enters the event loop: devices, vsock sockets, disk I/O, exit.
    EventLoop,
    /// A vCPU thread: `KVM_RUN` and the bus accesses it routes to the devices.
    Vcpu,
    /// The disk control thread: the daemon's requests giving a read-only disk another image,
    /// which arrives as a descriptor (the only thread that may receive one).
    DiskControl,
}

impl VmmThread {
    /// The name used in messages and `docs/vmm.md`.
    pub fn name(self) -> &'static str {
        match self {
            VmmThread::EventLoop => "event-loop",
            VmmThread::Vcpu => "vcpu",
            VmmThread::DiskControl => "disk-control",
        }
    }
}

/// Why a filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// A rule or the filter did not compile (a bug in the rule table).
    #[error("cannot compile the {thread} seccomp filter")]
    Compile {
        /// The thread kind's name.
        thread: &'static str,
        /// The cause.
        #[source]
        source: seccompiler::BackendError,
    },
    /// The kernel refused the filter.
    #[error("cannot install the {thread} seccomp filter")]
    Install {
        /// The thread kind's name.
        thread: &'static str,
        /// The cause.
        #[source]
        source: seccompiler::Error,
    },
}

/// One argument condition (32-bit: every argument checked is an `int` or is truncated to 32 bits
/// by the kernel, as `ioctl`'s request is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    /// Argument `index` equals the value.
    Eq(u8, u64),
    /// Argument `index` has none of the bits of the mask set.
    NoBits(u8, u64),
}

/// One allowed system call: unconditionally (no rules), or when every condition of at least one
/// rule holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The system call number.
    pub nr: libc::c_long,
    /// Alternatives, each a conjunction of conditions; empty means always.
    pub rules: Vec<Vec<Arg>>,
}

fn always(nr: libc::c_long) -> Allowed {
    Allowed { nr, rules: vec![] }
}

/// `FIONBIO` as a seccomp argument: libc declares it `c_ulong` on glibc and `c_int` on musl,
/// and the static (musl) build must compile too.
#[allow(clippy::unnecessary_cast)] // a no-op on glibc, a widening on musl
const FIONBIO: u64 = libc::FIONBIO as u64;

fn when(nr: libc::c_long, rules: &[&[Arg]]) -> Allowed {
    Allowed {
        nr,
        rules: rules.iter().map(|r| r.to_vec()).collect(),
    }
}

/// What every VMM thread needs: memory (never executable), locks, its own end and signal
/// handling, logging to stderr, and glibc's `abort()` (which raises SIGABRT at itself).
fn common(pid: u32) -> Vec<Allowed> {
    let no_exec = Arg::NoBits(2, libc::PROT_EXEC as u64);
    let sigabrt_to_self = [Arg::Eq(0, u64::from(pid)), Arg::Eq(2, libc::SIGABRT as u64)];
    vec![
        always(libc::SYS_write),
        always(libc::SYS_close),
        // Rust debug builds check that a descriptor is open before closing it.
        when(libc::SYS_fcntl, &[&[Arg::Eq(1, libc::F_GETFD as u64)]]),
        always(libc::SYS_futex),
        when(libc::SYS_mmap, &[&[no_exec]]),
        when(libc::SYS_mprotect, &[&[no_exec]]),
        always(libc::SYS_munmap),
        always(libc::SYS_mremap),
        always(libc::SYS_madvise),
        always(libc::SYS_brk),
        always(libc::SYS_rt_sigreturn),
        always(libc::SYS_rt_sigprocmask),
        always(libc::SYS_sigaltstack),
        when(
            libc::SYS_rt_sigaction,
            &[&[Arg::Eq(0, libc::SIGABRT as u64)]],
        ),
        when(libc::SYS_tgkill, &[&sigabrt_to_self]),
        always(libc::SYS_gettid),
        always(libc::SYS_getpid),
        always(libc::SYS_clock_gettime),
        always(libc::SYS_sched_yield),
        always(libc::SYS_getrandom),
        always(libc::SYS_restart_syscall),
        always(libc::SYS_exit),
        always(libc::SYS_exit_group),
    ]
}

/// The allowlist of one kind of thread in the process `pid` (signals may only go to it).
pub fn allowlist(thread: VmmThread, pid: u32) -> Vec<Allowed> {
    let mut list = common(pid);
    match thread {
        VmmThread::Vcpu => list.extend([
            // The only KVM call a running vCPU makes; everything else was configured before.
            when(libc::SYS_ioctl, &[&[Arg::Eq(1, KVM_RUN())]]),
            // A guest resetting the vsock device closes its connections (and re-arms the
            // muxer's deadline timer) from the vCPU thread.
            always(libc::SYS_epoll_ctl),
            always(libc::SYS_timerfd_settime),
        ]),
        VmmThread::DiskControl => list.extend([
            // The daemon's connections, one at a time, blocking.
            when(
                libc::SYS_accept4,
                &[&[Arg::Eq(3, libc::SOCK_CLOEXEC as u64)]],
            ),
            // The request line, byte by byte (std reads a socket with recv: recvfrom), then the
            // byte carrying the image's descriptor; the answer (write, or send: sendto).
            always(libc::SYS_read),
            always(libc::SYS_recvfrom),
            always(libc::SYS_recvmsg),
            always(libc::SYS_sendto),
            // The new image's size (std's `File::metadata`: statx on glibc; musl's fstat is
            // SYS_fstat or, in some versions, newfstatat with an empty path).
            always(libc::SYS_statx),
            always(libc::SYS_fstat),
            always(libc::SYS_newfstatat),
            // Telling the guest: the block device's interrupt (an eventfd write, in `common`).
        ]),
        VmmThread::EventLoop => list.extend([
            always(libc::SYS_read),
            always(libc::SYS_readv),
            always(libc::SYS_writev),
            always(libc::SYS_epoll_wait),
            always(libc::SYS_epoll_pwait),
            always(libc::SYS_epoll_ctl),
            // vsock: the listener's clients, and the guest's connections to `<uds_path>_<port>`:
            // the only sockets this process can make are Unix stream sockets.
            when(
                libc::SYS_accept4,
                &[&[Arg::Eq(3, libc::SOCK_CLOEXEC as u64)]],
            ),
            // Blocking (std's) or non-blocking (the guest's connections, which must never
            // stall the loop on a full backlog).
            when(
                libc::SYS_socket,
                &[
                    &[
                        Arg::Eq(0, libc::AF_UNIX as u64),
                        Arg::Eq(1, (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64),
                        Arg::Eq(2, 0),
                    ],
                    &[
                        Arg::Eq(0, libc::AF_UNIX as u64),
                        Arg::Eq(
                            1,
                            (libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u64,
                        ),
                        Arg::Eq(2, 0),
                    ],
                ],
            ),
            always(libc::SYS_connect),
            // Whether a host client closed its socket entirely or only its write half.
            always(libc::SYS_poll),
            always(libc::SYS_ppoll),
            // The muxer's deadline timer (handshakes, stalls: the kill queue).
            always(libc::SYS_timerfd_settime),
            always(libc::SYS_timerfd_gettime),
            // The vsock socket file, removed at exit if it is still ours (same device and
            // inode as the one we bound: a stat, then the unlink). Rust's std on glibc stats
            // with statx (newfstatat as a fallback); on musl (the static build) the same call
            // is musl's lstat, which is SYS_lstat on x86_64.
            always(libc::SYS_statx),
            always(libc::SYS_newfstatat),
            always(libc::SYS_lstat),
            always(libc::SYS_stat),
            always(libc::SYS_unlink),
            always(libc::SYS_unlinkat),
            always(libc::SYS_recvfrom),
            always(libc::SYS_sendto),
            always(libc::SYS_shutdown),
            // `set_nonblocking` on a vsock socket; no KVM ioctl at all.
            when(libc::SYS_ioctl, &[&[Arg::Eq(1, FIONBIO)]]),
            // virtio-block.
            always(libc::SYS_pread64),
            always(libc::SYS_pwrite64),
            always(libc::SYS_fdatasync),
        ]),
    }
    list
}

fn condition(arg: Arg) -> Result<SeccompCondition, seccompiler::BackendError> {
    let (index, op, value) = match arg {
        Arg::Eq(i, v) => (i, SeccompCmpOp::Eq, v),
        Arg::NoBits(i, mask) => (i, SeccompCmpOp::MaskedEq(mask), 0),
    };
    SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, value)
}

/// Compiles `thread`'s filter for the process `pid`: allowlisted calls pass, anything else
/// (including another architecture's or the x32 ABI's calls) kills the process.
pub fn compile(thread: VmmThread, pid: u32) -> Result<BpfProgram, SeccompError> {
    let err = |source| SeccompError::Compile {
        thread: thread.name(),
        source,
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for allowed in allowlist(thread, pid) {
        let entry = rules.entry(allowed.nr).or_default();
        for conjunction in allowed.rules {
            let conditions = conjunction
                .into_iter()
                .map(condition)
                .collect::<Result<Vec<_>, _>>()
                .map_err(err)?;
            entry.push(SeccompRule::new(conditions).map_err(err)?);
        }
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(err)?;
    filter.try_into().map_err(err)
}

/// Both filters of this process, compiled before any thread needs one.
#[derive(Debug, Clone)]
pub struct ThreadFilters {
    event_loop: BpfProgram,
    vcpu: BpfProgram,
    disk_control: BpfProgram,
}

impl ThreadFilters {
    /// Compiles the filters for this process.
    pub fn compile() -> Result<Self, SeccompError> {
        let pid = std::process::id();
        Ok(ThreadFilters {
            event_loop: compile(VmmThread::EventLoop, pid)?,
            vcpu: compile(VmmThread::Vcpu, pid)?,
            disk_control: compile(VmmThread::DiskControl, pid)?,
        })
    }

    /// The program for `thread`.
    pub fn program(&self, thread: VmmThread) -> &BpfProgram {
        match thread {
            VmmThread::EventLoop => &self.event_loop,
            VmmThread::Vcpu => &self.vcpu,
            VmmThread::DiskControl => &self.disk_control,
        }
    }

    /// Installs `thread`'s filter on the calling thread only (and `no_new_privs`, which the
    /// kernel requires). It cannot be removed; other threads are not touched.
    pub fn install(&self, thread: VmmThread) -> Result<(), SeccompError> {
        seccompiler::apply_filter(self.program(thread)).map_err(|source| SeccompError::Install {
            thread: thread.name(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seccompiler::sock_filter;

    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const AUDIT_ARCH_I386: u32 = 0x4000_0003;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    const PID: u32 = 4242;

    /// A classic-BPF interpreter for the instructions seccompiler emits, over a `seccomp_data`
    /// (`nr`, `arch`, instruction pointer, six arguments).
    fn eval(program: &[sock_filter], arch: u32, nr: libc::c_long, args: [u64; 6]) -> u32 {
        let mut data = Vec::with_capacity(64);
        data.extend_from_slice(&(nr as i32).to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for a in args {
            data.extend_from_slice(&a.to_ne_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let insn = &program[pc];
            let code = u32::from(insn.code);
            pc += 1;
            match code & 0x07 {
                libc::BPF_LD => {
                    assert_eq!(code, libc::BPF_LD | libc::BPF_W | libc::BPF_ABS);
                    let at = insn.k as usize;
                    acc = u32::from_ne_bytes(data[at..at + 4].try_into().expect("in seccomp_data"));
                }
                libc::BPF_ALU => {
                    assert_eq!(code, libc::BPF_ALU | libc::BPF_AND | libc::BPF_K);
                    acc &= insn.k;
                }
                libc::BPF_RET => return insn.k,
                libc::BPF_JMP => {
                    let taken = match code & 0xf0 {
                        libc::BPF_JA => {
                            pc += insn.k as usize;
                            continue;
                        }
                        libc::BPF_JEQ => acc == insn.k,
                        libc::BPF_JGT => acc > insn.k,
                        libc::BPF_JGE => acc >= insn.k,
                        libc::BPF_JSET => acc & insn.k != 0,
                        op => panic!("unexpected jump {op:#x}"),
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
                class => panic!("unexpected instruction class {class:#x}"),
            }
        }
    }

    struct Filter(BpfProgram);

    impl Filter {
        fn of(thread: VmmThread) -> Self {
            Filter(compile(thread, PID).expect("compiles"))
        }
        fn allows(&self, nr: libc::c_long, args: &[u64]) -> bool {
            let mut all = [0u64; 6];
            all[..args.len()].copy_from_slice(args);
            match eval(&self.0, AUDIT_ARCH_X86_64, nr, all) {
                RET_ALLOW => true,
                RET_KILL_PROCESS => false,
                other => panic!("unexpected action {other:#x}"),
            }
        }
    }

    // KVM ioctl numbers (linux/kvm.h) a compromised thread would want.
    const KVM_CREATE_VM: u64 = 0xae01;
    const KVM_CREATE_VCPU: u64 = 0xae41;
    const KVM_SET_USER_MEMORY_REGION: u64 = 0x4020_ae46;
    const KVM_IRQFD: u64 = 0x4020_ae76;
    const KVM_SET_REGS: u64 = 0x4090_ae82;

    #[test]
    fn kvm_run_is_the_linux_request_number() {
        assert_eq!(KVM_RUN(), 0xae80);
    }

    #[test]
    fn vcpu_threads_may_ioctl_only_kvm_run() {
        let vcpu = Filter::of(VmmThread::Vcpu);
        assert!(vcpu.allows(libc::SYS_ioctl, &[9, KVM_RUN()]));
        for request in [
            KVM_CREATE_VM,
            KVM_CREATE_VCPU,
            KVM_SET_USER_MEMORY_REGION,
            KVM_IRQFD,
            KVM_SET_REGS,
            FIONBIO,
            libc::TIOCSTI,
            0,
        ] {
            assert!(!vcpu.allows(libc::SYS_ioctl, &[9, request]), "{request:#x}");
        }
    }

    #[test]
    fn the_event_loop_may_ioctl_only_fionbio_and_no_kvm_request() {
        let event_loop = Filter::of(VmmThread::EventLoop);
        assert!(event_loop.allows(libc::SYS_ioctl, &[9, FIONBIO]));
        for request in [
            KVM_RUN(),
            KVM_CREATE_VM,
            KVM_SET_USER_MEMORY_REGION,
            KVM_IRQFD,
        ] {
            assert!(
                !event_loop.allows(libc::SYS_ioctl, &[9, request]),
                "{request:#x}"
            );
        }
    }

    #[test]
    fn sockets_are_unix_streams_only_and_only_on_the_event_loop() {
        let event_loop = Filter::of(VmmThread::EventLoop);
        let stream_cloexec = (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64;
        let unix = libc::AF_UNIX as u64;
        assert!(event_loop.allows(libc::SYS_socket, &[unix, stream_cloexec, 0]));
        for (domain, kind) in [
            (libc::AF_INET, stream_cloexec),
            (libc::AF_INET6, stream_cloexec),
            (libc::AF_NETLINK, libc::SOCK_RAW as u64),
            (libc::AF_VSOCK, stream_cloexec),
            (libc::AF_UNIX, libc::SOCK_DGRAM as u64),
            (libc::AF_UNIX, libc::SOCK_STREAM as u64), // without CLOEXEC: would leak on exec
        ] {
            assert!(
                !event_loop.allows(libc::SYS_socket, &[domain as u64, kind, 0]),
                "socket({domain}, {kind:#x})"
            );
        }
        assert!(!event_loop.allows(libc::SYS_socketpair, &[unix, stream_cloexec, 0]));
        assert!(event_loop.allows(libc::SYS_accept4, &[7, 0, 0, libc::SOCK_CLOEXEC as u64]));
        assert!(!event_loop.allows(libc::SYS_accept4, &[7, 0, 0, 0]));
        assert!(!event_loop.allows(libc::SYS_accept, &[7, 0, 0]));

        let vcpu = Filter::of(VmmThread::Vcpu);
        for nr in [
            libc::SYS_socket,
            libc::SYS_connect,
            libc::SYS_accept4,
            libc::SYS_sendto,
            libc::SYS_recvfrom,
        ] {
            assert!(!vcpu.allows(nr, &[unix, stream_cloexec, 0, 0]), "{nr}");
        }
    }

    #[test]
    fn no_thread_may_create_threads_processes_or_open_files() {
        for thread in [
            VmmThread::EventLoop,
            VmmThread::Vcpu,
            VmmThread::DiskControl,
        ] {
            let f = Filter::of(thread);
            let thread_flags = (libc::CLONE_VM
                | libc::CLONE_FS
                | libc::CLONE_FILES
                | libc::CLONE_SIGHAND
                | libc::CLONE_THREAD) as u64;
            for (nr, args) in [
                (libc::SYS_clone, vec![thread_flags]),
                (libc::SYS_clone, vec![libc::SIGCHLD as u64]),
                (libc::SYS_clone3, vec![0, 88]),
                (libc::SYS_fork, vec![]),
                (libc::SYS_vfork, vec![]),
                (libc::SYS_execve, vec![]),
                (libc::SYS_execveat, vec![]),
                (libc::SYS_open, vec![0, libc::O_RDONLY as u64]),
                (libc::SYS_openat, vec![0, 0, libc::O_RDONLY as u64]),
                (libc::SYS_openat2, vec![]),
                (libc::SYS_ptrace, vec![]),
                (libc::SYS_process_vm_writev, vec![]),
                (libc::SYS_kill, vec![1, libc::SIGKILL as u64]),
                (libc::SYS_seccomp, vec![]),
                (libc::SYS_prctl, vec![libc::PR_SET_NAME as u64]),
                (libc::SYS_setuid, vec![0]),
                (libc::SYS_mount, vec![]),
                (libc::SYS_sendmsg, vec![]),
                (libc::SYS_socket, vec![libc::AF_UNIX as u64, 0, 0]),
                (libc::SYS_connect, vec![]),
            ] {
                if thread == VmmThread::EventLoop
                    && (nr == libc::SYS_socket || nr == libc::SYS_connect)
                {
                    continue; // vsock's host side: checked on its own above.
                }
                assert!(!f.allows(nr, &args), "{} allows {nr}", thread.name());
            }
        }
    }

    #[test]
    fn only_the_disk_control_thread_may_receive_a_descriptor() {
        assert!(Filter::of(VmmThread::DiskControl).allows(libc::SYS_recvmsg, &[5, 0, 0]));
        for thread in [VmmThread::EventLoop, VmmThread::Vcpu] {
            assert!(!Filter::of(thread).allows(libc::SYS_recvmsg, &[5, 0, 0]));
        }
        let control = Filter::of(VmmThread::DiskControl);
        // No disk I/O, no KVM, no guest memory tricks: it only swaps a descriptor.
        for nr in [
            libc::SYS_pread64,
            libc::SYS_pwrite64,
            libc::SYS_ioctl,
            libc::SYS_unlink,
            libc::SYS_epoll_ctl,
        ] {
            assert!(!control.allows(nr, &[0, 0, 0]), "{nr}");
        }
        assert!(!control.allows(libc::SYS_accept4, &[3, 0, 0, 0]));
    }

    #[test]
    fn memory_can_never_be_made_executable() {
        let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let rwx = rw | libc::PROT_EXEC as u64;
        let anon = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        for thread in [VmmThread::EventLoop, VmmThread::Vcpu] {
            let f = Filter::of(thread);
            assert!(f.allows(libc::SYS_mmap, &[0, 4096, rw, anon]));
            assert!(f.allows(libc::SYS_mmap, &[0, 4096, libc::PROT_NONE as u64, anon]));
            assert!(!f.allows(libc::SYS_mmap, &[0, 4096, rwx, anon]));
            assert!(!f.allows(libc::SYS_mmap, &[0, 4096, libc::PROT_EXEC as u64, anon]));
            assert!(f.allows(libc::SYS_mprotect, &[0, 4096, rw]));
            assert!(!f.allows(libc::SYS_mprotect, &[0, 4096, rwx]));
            assert!(!f.allows(libc::SYS_pkey_mprotect, &[0, 4096, rwx, 0]));
        }
    }

    #[test]
    fn signals_go_only_to_this_process_and_only_sigabrt() {
        for thread in [VmmThread::EventLoop, VmmThread::Vcpu] {
            let f = Filter::of(thread);
            let abrt = libc::SIGABRT as u64;
            assert!(f.allows(libc::SYS_tgkill, &[u64::from(PID), 7, abrt]));
            assert!(!f.allows(libc::SYS_tgkill, &[1, 1, abrt]));
            assert!(!f.allows(libc::SYS_tgkill, &[u64::from(PID), 7, libc::SIGKILL as u64]));
            assert!(!f.allows(libc::SYS_tkill, &[7, abrt]));
            assert!(f.allows(libc::SYS_rt_sigaction, &[abrt]));
            // Handlers are installed before the filters; nothing may replace them after.
            assert!(!f.allows(libc::SYS_rt_sigaction, &[libc::SIGTERM as u64]));
            assert!(!f.allows(libc::SYS_rt_sigaction, &[libc::SIGSYS as u64]));
        }
    }

    #[test]
    fn other_architectures_and_the_x32_abi_are_refused() {
        let f = Filter::of(VmmThread::Vcpu);
        // `write` is allowed on x86_64, but nr 1 is `exit` on i386 and x32 numbers differ.
        assert_eq!(
            eval(&f.0, AUDIT_ARCH_I386, libc::SYS_write, [0; 6]),
            RET_KILL_PROCESS
        );
        let x32_write = 0x4000_0000 | libc::SYS_write;
        assert_eq!(
            eval(&f.0, AUDIT_ARCH_X86_64, x32_write, [0; 6]),
            RET_KILL_PROCESS
        );
    }

    /// What the threads did under `strace -f` once set up, while the test guests booted, drove
    /// every device (`tests/guest/io_guest.c`) and were stopped by SIGTERM: each must stay
    /// allowed.
    #[test]
    fn each_thread_is_allowed_what_it_was_seen_doing() {
        let vcpu = Filter::of(VmmThread::Vcpu);
        let seen_vcpu: &[(libc::c_long, &[u64])] = &[
            (libc::SYS_ioctl, &[12, KVM_RUN(), 0]),
            (libc::SYS_write, &[1, 0, 1]),
            (libc::SYS_write, &[5, 0, 8]), // an irqfd or queue eventfd
            (
                libc::SYS_futex,
                &[0, (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as u64, 1],
            ),
            (
                libc::SYS_futex,
                &[
                    0,
                    (libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG) as u64,
                    2,
                ],
            ),
            (libc::SYS_epoll_ctl, &[8, libc::EPOLL_CTL_DEL as u64, 19, 0]),
            (libc::SYS_close, &[19]),
            (libc::SYS_fcntl, &[19, libc::F_GETFD as u64]),
        ];
        for (nr, args) in seen_vcpu {
            assert!(vcpu.allows(*nr, args), "vcpu: {nr} {args:?}");
        }
        let event_loop = Filter::of(VmmThread::EventLoop);
        let seen_event_loop: &[(libc::c_long, &[u64])] = &[
            (libc::SYS_epoll_wait, &[16, 0, 256, u64::MAX]),
            (libc::SYS_read, &[17, 0, 8]),
            (libc::SYS_write, &[15, 0, 8]),
            (libc::SYS_accept4, &[7, 0, 0, libc::SOCK_CLOEXEC as u64]),
            (libc::SYS_ioctl, &[19, FIONBIO, 0]),
            (libc::SYS_recvfrom, &[19, 0, 1, 0, 0, 0]),
            (libc::SYS_epoll_ctl, &[8, libc::EPOLL_CTL_ADD as u64, 19, 0]),
            // Console input: read when a receive buffer waits, unwatched when none does.
            (libc::SYS_read, &[11, 0, 4096]),
            (libc::SYS_epoll_ctl, &[8, libc::EPOLL_CTL_DEL as u64, 11, 0]),
            (libc::SYS_pread64, &[13, 0, 512, 0]),
            (libc::SYS_pwrite64, &[13, 0, 512, 0]),
            (libc::SYS_fdatasync, &[13]),
            (
                libc::SYS_socket,
                &[
                    libc::AF_UNIX as u64,
                    (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64,
                    0,
                ],
            ),
            (libc::SYS_connect, &[20, 0, 110]),
            (
                libc::SYS_sendto,
                &[20, 0, 18, libc::MSG_NOSIGNAL as u64, 0, 0],
            ),
            (libc::SYS_shutdown, &[20, libc::SHUT_WR as u64]),
            (libc::SYS_rt_sigreturn, &[]),
            (libc::SYS_sigaltstack, &[0, 0]),
            (libc::SYS_munmap, &[0, 16048]),
            (libc::SYS_exit_group, &[0]),
        ];
        for (nr, args) in seen_event_loop {
            assert!(event_loop.allows(*nr, args), "event loop: {nr} {args:?}");
        }
    }

    /// Runs `call` in a forked child under `thread`'s real filter; returns how the child ended.
    /// Only async-signal-safe calls happen in the child (the test harness has other threads).
    fn in_filtered_child(thread: VmmThread, call: fn() -> libc::c_long) -> libc::c_int {
        let filters = ThreadFilters::compile().expect("compiles");
        // SAFETY: the child only makes raw system calls and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: setrlimit reads the struct; a killed child must not write a core file.
            unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
            let code = match filters.install(thread) {
                Ok(()) => {
                    call();
                    0
                }
                Err(_) => 99,
            };
            // SAFETY: leaves the child at once, running nothing of the parent's.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child; `status` outlives the call.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid);
        status
    }

    fn killed_by_sigsys(status: libc::c_int) -> bool {
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS
    }

    fn exited_cleanly(status: libc::c_int) -> bool {
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }

    #[test]
    fn a_vcpu_thread_making_a_forbidden_kvm_ioctl_kills_the_process_with_sigsys() {
        // SAFETY: an ioctl on fd -1 touches nothing; only the filter's verdict matters.
        let create_vm = || unsafe { libc::ioctl(-1, KVM_CREATE_VM as _, 0) } as libc::c_long;
        let status = in_filtered_child(VmmThread::Vcpu, create_vm);
        assert!(killed_by_sigsys(status), "status {status:#x}");
        // The same child with an allowed request lives (EBADF): the kill was the rule's.
        // SAFETY: as above.
        let run = || unsafe { libc::ioctl(-1, KVM_RUN() as _, 0) } as libc::c_long;
        let status = in_filtered_child(VmmThread::Vcpu, run);
        assert!(exited_cleanly(status), "status {status:#x}");
    }

    #[test]
    fn a_forbidden_socket_or_thread_on_the_event_loop_kills_the_process_with_sigsys() {
        // SAFETY: socket(2) with plain integers; the fd (if any) dies with the child.
        let inet = || unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) } as libc::c_long;
        assert!(killed_by_sigsys(in_filtered_child(
            VmmThread::EventLoop,
            inet
        )));
        // SAFETY: as above.
        let unix =
            || unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) }
                as libc::c_long;
        assert!(exited_cleanly(in_filtered_child(
            VmmThread::EventLoop,
            unix
        )));
        // clone3 with a NULL argument fails with EFAULT if it gets past the filter.
        // SAFETY: a raw clone3 with no arguments creates nothing.
        let clone3 = || unsafe { libc::syscall(libc::SYS_clone3, 0usize, 0usize) };
        assert!(killed_by_sigsys(in_filtered_child(
            VmmThread::EventLoop,
            clone3
        )));
        assert!(killed_by_sigsys(in_filtered_child(VmmThread::Vcpu, clone3)));
    }
}
