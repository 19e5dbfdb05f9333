//! clone(CLONE_VM | CLONE_VFORK) + exec of one command, by hand.
//!
//! std's `Command` reaps its own children when exec fails, while ours are reaped through their
//! pidfd (see `reaper`), so the agent forks itself. Everything the child needs (argv, envp, the
//! candidate program paths, the cwd) is prepared before the fork; after it the child
//! only makes async-signal-safe system calls (it shares our memory until it execs, like
//! posix_spawn's child): `setsid`, cgroup and OOM-score writes, `prlimit64`, `dup2`,
//! signal resets, the id switch, `chdir`, `execve`. Like `execvp`, the child tries each `PATH` candidate in
//! turn (one failed `execve` per miss costs no more than the `stat` a search in the parent
//! would). A failure is left for the parent as `stage << 48 | candidate << 32 | errno` in
//! shared memory; the parent, suspended until the child execs or exits, reads it on waking.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use contract::DEFAULT_PATH;
use wire::agent::RunAs;
use wire::ExecRequest;

use crate::reaper::{self, Child};

/// Why a command could not be started. The messages are what the host sees in `error`.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// `cmd[0]` is not on `PATH` (or the named file does not exist).
    #[error("command not found: {0}")]
    NotFound(String),
    /// The program exists but may not be executed.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// `cwd` could not be entered.
    #[error("bad cwd {cwd:?}")]
    BadCwd {
        /// The requested directory.
        cwd: String,
        /// Why chdir failed.
        source: io::Error,
    },
    /// execve failed for another reason (bad format, too many files, …).
    #[error("cannot execute {program}")]
    Exec {
        /// The resolved program.
        program: String,
        /// Why execve failed.
        source: io::Error,
    },
    /// A requested resource limit could not be set (raising a hard limit needs a privilege
    /// the namespace backend's root does not have).
    #[error("cannot set the {resource} limit to soft {soft} hard {hard}")]
    Rlimit {
        /// The resource's short name (`nofile`).
        resource: String,
        /// The soft limit asked for.
        soft: u64,
        /// The hard limit asked for.
        hard: u64,
        /// Why setrlimit failed.
        source: io::Error,
    },
    /// Switching to the image's user failed.
    #[error("cannot run the command as uid {uid} gid {gid}")]
    User {
        /// The user id asked for.
        uid: u32,
        /// The group id asked for.
        gid: u32,
        /// Why the switch failed.
        source: io::Error,
    },
    /// Setting the child up or forking failed.
    #[error("cannot start the command")]
    Io(#[from] io::Error),
    /// An argument or variable held a NUL byte (validation should have caught it).
    #[error("argument or variable contains a NUL byte")]
    Nul,
}

/// Process-wide settings for every spawn.
#[derive(Debug, Clone, Copy)]
pub struct SpawnContext<'a> {
    /// `/dev/null`, for non-interactive stdin.
    pub devnull: BorrowedFd<'a>,
    /// `cgroup.procs` of the commands cgroup, to move the child into.
    pub cgroup_procs: Option<BorrowedFd<'a>>,
    /// Whether the child must reset `oom_score_adj` to 0 (the agent runs at -1000).
    pub reset_oom_score: bool,
    /// `main`'s own namespaces in a microVM pod, which the child is cloned into.
    pub namespaces: Option<&'a crate::main_ns::MainNamespaces>,
}

/// The three descriptors the child gets as 0, 1, 2. None of them may be 0, 1 or 2 already.
#[derive(Debug, Clone, Copy)]
pub struct ChildStdio<'a> {
    /// Becomes the child's stdin.
    pub stdin: BorrowedFd<'a>,
    /// Becomes the child's stdout.
    pub stdout: BorrowedFd<'a>,
    /// Becomes the child's stderr.
    pub stderr: BorrowedFd<'a>,
    /// Whether `stdin` is a terminal that becomes the child's controlling terminal (the child
    /// leads a session of its own, so its process group is the terminal's foreground one).
    pub controlling_terminal: bool,
}

/// Stages of the child's setup, as reported through the error pipe.
const STAGE_SETUP: u8 = 1;
const STAGE_CHDIR: u8 = 2;
const STAGE_EXEC: u8 = 3;
const STAGE_USER: u8 = 4;
const STAGE_RLIMIT: u8 = 5;

/// One limit for the child: the kernel's `struct rlimit64`, and the resource's number.
#[derive(Clone, Copy)]
#[repr(C)]
struct KernelRlimit {
    cur: u64,
    max: u64,
}

#[derive(Clone, Copy)]
struct ChildLimit {
    resource: libc::c_long,
    value: KernelRlimit,
}

/// The `RLIMIT_*` number of a resource's short name (see [`wire::RLIMIT_RESOURCES`]).
fn resource_number(short: &str) -> Option<libc::c_long> {
    let number = match short {
        "as" => libc::RLIMIT_AS,
        "core" => libc::RLIMIT_CORE,
        "cpu" => libc::RLIMIT_CPU,
        "data" => libc::RLIMIT_DATA,
        "fsize" => libc::RLIMIT_FSIZE,
        "locks" => libc::RLIMIT_LOCKS,
        "memlock" => libc::RLIMIT_MEMLOCK,
        "msgqueue" => libc::RLIMIT_MSGQUEUE,
        "nice" => libc::RLIMIT_NICE,
        "nofile" => libc::RLIMIT_NOFILE,
        "nproc" => libc::RLIMIT_NPROC,
        "rss" => libc::RLIMIT_RSS,
        "rtprio" => libc::RLIMIT_RTPRIO,
        "rttime" => libc::RLIMIT_RTTIME,
        "sigpending" => libc::RLIMIT_SIGPENDING,
        "stack" => libc::RLIMIT_STACK,
        _ => return None,
    };
    Some(libc::c_long::from(number))
}

/// The request's limits, numbered for the child; `None` names one the agent does not know
/// (validation refuses those first).
fn child_limits(req: &ExecRequest) -> Option<Vec<ChildLimit>> {
    req.rlimits
        .iter()
        .map(|limit| {
            Some(ChildLimit {
                resource: resource_number(limit.resource()?)?,
                value: KernelRlimit {
                    cur: limit.soft,
                    max: limit.hard,
                },
            })
        })
        .collect()
}

/// The ids the child switches to before `chdir` and exec.
#[derive(Clone, Copy)]
struct ChildIds {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: *const libc::gid_t,
    group_count: usize,
}

/// Everything the child touches after fork: raw pointers into buffers the parent keeps alive.
struct ChildPlan {
    /// NULL-terminated: the paths to try, in order.
    programs: *const *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: Option<*const libc::c_char>,
    /// Who the command runs as; `None` keeps the agent's ids.
    ids: Option<ChildIds>,
    stdio: [RawFd; 3],
    controlling_terminal: bool,
    cgroup_procs: Option<RawFd>,
    reset_oom_score: bool,
    /// The mount namespace to enter first (`main`'s in a microVM pod).
    mount_namespace: Option<RawFd>,
    /// The capabilities to keep in the bounding set ([`bound_commands_to`]).
    bounding_set: Option<u64>,
    /// The open-file limit commands get (the one the agent had before raising its own).
    nofile: Option<libc::rlimit>,
    /// The request's own limits, set after `nofile`.
    limits: *const ChildLimit,
    limit_count: usize,
    /// Written by the child on failure: `stage << 48 | candidate << 32 | errno`; 0 means the
    /// exec happened.
    report: AtomicU64,
    /// Where the report is also written, by a process that executes in place (a container's
    /// init, whose agent is another process).
    report_fd: Option<RawFd>,
}

/// The open-file limit commands run with: the agent's own before [`raise_agent_fd_limit`]
/// raised it, so a command sees the limit it would have seen without the agent in between.
static COMMAND_FD_LIMIT: std::sync::OnceLock<Option<libc::rlimit>> = std::sync::OnceLock::new();

/// Raises the agent's open-file limit for its connections and pipes, and remembers the old
/// one for the commands it starts. Called once, before serving.
pub fn raise_agent_fd_limit() {
    let _ = COMMAND_FD_LIMIT.set(crate::sys::raise_fd_limit());
}

/// The capability bounding set of every command, when the container has one of its own
/// (`--command-capabilities`): the agent keeps its own set to start commands as their user.
static COMMAND_BOUNDING_SET: OnceLock<u64> = OnceLock::new();

/// From now on every command drops every capability outside `mask` from its bounding set
/// before it executes (before it switches user, while it may): as root, or through a setuid
/// binary, it never has more.
pub fn bound_commands_to(mask: u64) {
    let _ = COMMAND_BOUNDING_SET.set(mask);
}

/// The bounding set [`bound_commands_to`] set, if any.
pub(crate) fn commands_bounding_set() -> Option<u64> {
    COMMAND_BOUNDING_SET.get().copied()
}

/// The child's stack: it only makes a few system calls before exec.
const CHILD_STACK: usize = 64 * 1024;

thread_local! {
    /// The stack our vfork children run on, one per spawning thread and reused: the thread is
    /// suspended while its child uses it, so it is never in use twice at once, and reusing it
    /// spares an allocation, a memset and fresh page faults per exec.
    static CHILD_STACKS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

extern "C" fn child_entry(plan: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `spawn` passes a pointer to a live ChildPlan and is suspended until we exec or
    // exit, so the reference is valid for the whole call.
    let plan = unsafe { &*(plan as *const ChildPlan) };
    child_after_fork(plan)
}

/// Starts `req` with `stdio`. The child's pid is also its process group and session id; the
/// caller reaps it (see [`crate::reaper`]). On error no output was produced, and a child that
/// failed to exec has been reaped. (In a container whose first command is PID 1 the caller
/// asks `crate::container_init` instead.)
pub fn spawn(
    req: &ExecRequest,
    user: Option<&RunAs>,
    stdio: ChildStdio<'_>,
    ctx: &SpawnContext<'_>,
) -> Result<Child, SpawnError> {
    let prepared = Prepared::new(req, user)?;
    let plan = prepared.plan(user, stdio, ctx, None);
    let clone_child = || reaper::register_spawn(|| clone_with(&plan, 0));
    let mut child = match ctx.namespaces {
        Some(namespaces) => namespaces.spawn_inside(clone_child)?,
        None => clone_child()?,
    };
    let report = plan.report.load(Ordering::Acquire);
    if report == 0 {
        drop(prepared);
        return Ok(child);
    }
    // The child has _exit'ed (or is about to): reap it before reporting why.
    let _ = child.wait();
    Err(error_of_report(report, req, user))
}

/// Makes `req`'s process as a child of this process's parent (`CLONE_PARENT`): the
/// container's spawner, for its agent. Its pid and pidfd, or the child's failure report
/// ([`error_of_report`]; the child has exited, and is its parent's to reap).
pub(crate) fn spawn_sibling(
    req: &ExecRequest,
    user: Option<&RunAs>,
    stdio: ChildStdio<'_>,
    ctx: &SpawnContext<'_>,
) -> Result<Result<(libc::pid_t, OwnedFd), u64>, SpawnError> {
    let prepared = Prepared::new(req, user)?;
    let plan = prepared.plan(user, stdio, ctx, None);
    let (pid, pidfd) = clone_with(&plan, libc::CLONE_PARENT)?;
    match plan.report.load(Ordering::Acquire) {
        0 => Ok(Ok((pid, pidfd))),
        report => Ok(Err(report)),
    }
}

/// Becomes `req`'s process, in place: the container's init, which is PID 1. Returns only if
/// it could not even be prepared; a failure after that is written to `report_fd` (the word
/// of [`error_of_report`]) and ends this process.
pub(crate) fn exec_in_place(
    req: &ExecRequest,
    user: Option<&RunAs>,
    stdio: ChildStdio<'_>,
    ctx: &SpawnContext<'_>,
    report_fd: RawFd,
) -> SpawnError {
    match Prepared::new(req, user) {
        Ok(prepared) => child_after_fork(&prepared.plan(user, stdio, ctx, Some(report_fd))),
        Err(e) => e,
    }
}

/// The clone of a vfork-style child running `plan`, with `extra` flags (`CLONE_PARENT`).
fn clone_with(plan: &ChildPlan, extra: libc::c_int) -> io::Result<(libc::pid_t, OwnedFd)> {
    CHILD_STACKS.with(|stack| {
        let mut stack = stack.borrow_mut();
        if stack.len() < CHILD_STACK {
            stack.resize(CHILD_STACK, 0);
        }
        // The stack grows down: pass its (16-byte aligned) top.
        let top = stack.as_mut_ptr_range().end as usize & !0xf;
        let mut pidfd: libc::c_int = -1;
        // The child runs on its own small stack in our address space (CLONE_VM |
        // CLONE_VFORK, as posix_spawn does): no page tables are copied, and this thread is
        // suspended until the child has exec'd or exited, so the plan stays alive and
        // unchanged meanwhile.
        // SAFETY: `child_entry` only makes async-signal-safe system calls using `plan`,
        // which outlives the call (CLONE_VFORK suspends us until the child execs or exits),
        // and runs on `stack`, which nothing else uses meanwhile. CLONE_PIDFD writes the
        // pidfd into the live int passed as the parent-tid argument.
        let pid = unsafe {
            libc::clone(
                child_entry,
                top as *mut libc::c_void,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD | extra,
                (plan as *const ChildPlan).cast_mut().cast(),
                &mut pidfd as *mut libc::c_int,
            )
        };
        if pid == -1 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: clone succeeded with CLONE_PIDFD, so `pidfd` is a new descriptor that
        // nothing else owns.
        Ok((pid, unsafe { OwnedFd::from_raw_fd(pidfd) }))
    })
}

/// Why `req` did not start, from its child's report (`stage << 48 | candidate << 32 |
/// errno`).
pub(crate) fn error_of_report(report: u64, req: &ExecRequest, user: Option<&RunAs>) -> SpawnError {
    let errno = (report & 0xffff_ffff) as i32;
    let source = io::Error::from_raw_os_error(errno);
    let search_path = match req.env.get("PATH") {
        Some(p) => OsString::from(p),
        None => BaseEnv::get().path.clone(),
    };
    let program = req.cmd.first().cloned().unwrap_or_default();
    let candidates = program_candidates(&program, &search_path);
    let named = candidates
        .get(((report >> 32) & 0xffff) as usize)
        .map_or_else(|| program.clone(), |p| p.display().to_string());
    let searched = !program.contains('/');
    match (report >> 48) as u8 {
        STAGE_USER => SpawnError::User {
            uid: user.map_or(0, |u| u.uid),
            gid: user.map_or(0, |u| u.gid),
            source,
        },
        STAGE_RLIMIT => {
            let limit = req.rlimits.get(((report >> 32) & 0xffff) as usize);
            SpawnError::Rlimit {
                resource: limit.and_then(|l| l.resource()).unwrap_or("?").to_string(),
                soft: limit.map_or(0, |l| l.soft),
                hard: limit.map_or(0, |l| l.hard),
                source,
            }
        }
        STAGE_CHDIR => SpawnError::BadCwd {
            cwd: req.cwd.clone(),
            source,
        },
        STAGE_EXEC => match errno {
            libc::ENOENT if searched => SpawnError::NotFound(program),
            libc::ENOENT => SpawnError::NotFound(named),
            libc::EACCES => SpawnError::PermissionDenied(named),
            _ => SpawnError::Exec {
                program: named,
                source,
            },
        },
        _ => SpawnError::Io(source),
    }
}

/// Everything a child's plan points into, built before the fork.
struct Prepared {
    programs: Vec<*const libc::c_char>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    groups: Vec<libc::gid_t>,
    limits: Vec<ChildLimit>,
    // What the pointers above point into: kept alive, never read.
    _strings: (Vec<CString>, Vec<CString>, Vec<CString>, Option<CString>),
}

impl Prepared {
    fn new(req: &ExecRequest, user: Option<&RunAs>) -> Result<Prepared, SpawnError> {
        let base = BaseEnv::get();
        let search_path = match req.env.get("PATH") {
            Some(p) => OsStr::new(p.as_str()),
            None => base.path.as_os_str(),
        };
        let program = req.cmd.first().ok_or_else(|| {
            SpawnError::Io(io::Error::new(io::ErrorKind::InvalidInput, "no command"))
        })?;
        let candidates_c = program_candidates(program, search_path)
            .iter()
            .map(|p| CString::new(p.as_os_str().as_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| SpawnError::Nul)?;
        let mut programs: Vec<*const libc::c_char> =
            candidates_c.iter().map(|p| p.as_ptr()).collect();
        programs.push(std::ptr::null());
        let args_c = req
            .cmd
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| SpawnError::Nul)?;
        let added_c = req
            .env
            .iter()
            .map(|(k, v)| CString::new(format!("{k}={v}")))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| SpawnError::Nul)?;
        let cwd_c = match req.cwd.is_empty() {
            true => None,
            false => Some(CString::new(req.cwd.as_bytes()).map_err(|_| SpawnError::Nul)?),
        };
        let mut argv: Vec<*const libc::c_char> = args_c.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        // The agent's variables that the request does not override, then the request's.
        let mut envp: Vec<*const libc::c_char> = base
            .vars
            .iter()
            .filter(|(k, _)| !std::str::from_utf8(k).is_ok_and(|k| req.env.contains_key(k)))
            .map(|(_, kv)| kv.as_ptr())
            .chain(added_c.iter().map(|e| e.as_ptr()))
            .collect();
        envp.push(std::ptr::null());
        let limits = child_limits(req).ok_or_else(|| {
            SpawnError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "unknown resource limit type",
            ))
        })?;
        Ok(Prepared {
            programs,
            argv,
            envp,
            groups: user.map(|u| u.groups.clone()).unwrap_or_default(),
            limits,
            _strings: (candidates_c, args_c, added_c, cwd_c),
        })
    }

    /// The child's plan: pointers into `self`, which must outlive it.
    fn plan(
        &self,
        user: Option<&RunAs>,
        stdio: ChildStdio<'_>,
        ctx: &SpawnContext<'_>,
        report_fd: Option<RawFd>,
    ) -> ChildPlan {
        ChildPlan {
            programs: self.programs.as_ptr(),
            argv: self.argv.as_ptr(),
            envp: self.envp.as_ptr(),
            cwd: self._strings.3.as_ref().map(|c| c.as_ptr()),
            ids: user.map(|u| ChildIds {
                uid: u.uid,
                gid: u.gid,
                groups: self.groups.as_ptr(),
                group_count: self.groups.len(),
            }),
            stdio: [
                stdio.stdin.as_raw_fd(),
                stdio.stdout.as_raw_fd(),
                stdio.stderr.as_raw_fd(),
            ],
            controlling_terminal: stdio.controlling_terminal,
            cgroup_procs: ctx.cgroup_procs.map(|fd| fd.as_raw_fd()),
            reset_oom_score: ctx.reset_oom_score,
            mount_namespace: ctx.namespaces.map(|ns| ns.mounts().as_raw_fd()),
            bounding_set: COMMAND_BOUNDING_SET.get().copied(),
            nofile: COMMAND_FD_LIMIT.get().copied().flatten(),
            limits: self.limits.as_ptr(),
            limit_count: self.limits.len(),
            report: AtomicU64::new(0),
            report_fd,
        }
    }
}

/// The agent's own environment, encoded once: the agent never changes it after startup, so
/// each exec only adds the request's variables.
#[derive(Debug)]
struct BaseEnv {
    /// `(name, "NAME=value")`.
    vars: Vec<(Vec<u8>, CString)>,
    /// The agent's `PATH`, or [`DEFAULT_PATH`].
    path: OsString,
}

static BASE_ENV: OnceLock<BaseEnv> = OnceLock::new();

impl BaseEnv {
    fn get() -> &'static BaseEnv {
        BASE_ENV.get_or_init(|| {
            let mut path = OsString::from(DEFAULT_PATH);
            let vars = std::env::vars_os()
                .filter_map(|(k, v)| {
                    if k == "PATH" {
                        path = v.clone();
                    }
                    let mut kv = k.as_bytes().to_vec();
                    kv.push(b'=');
                    kv.extend_from_slice(v.as_bytes());
                    Some((k.into_vec(), CString::new(kv).ok()?))
                })
                .collect();
            BaseEnv { vars, path }
        })
    }
}

/// Where the child looks for `name`, in order, the way `execvp` does: as given when it
/// contains a slash, else `name` in each `PATH` directory (an empty entry means the current
/// directory, which is the command's `cwd` by the time it execs).
fn program_candidates(name: &str, path: &OsStr) -> Vec<PathBuf> {
    if name.contains('/') {
        return vec![PathBuf::from(name)];
    }
    path.as_bytes()
        .split(|&b| b == b':')
        .map(|dir| {
            let dir = if dir.is_empty() {
                Path::new(".")
            } else {
                Path::new(OsStr::from_bytes(dir))
            };
            dir.join(name)
        })
        .collect()
}

/// The child's side of the fork. Only async-signal-safe calls; never returns.
fn child_after_fork(plan: &ChildPlan) -> ! {
    if let Some(fd) = plan.mount_namespace {
        // First: every path below (`/proc/self/…`, the cwd, the program) is `main`'s view.
        // SAFETY: setns takes a live descriptor (the parent's, shared by CLONE_VM) and a flag.
        if unsafe { libc::setns(fd, libc::CLONE_NEWNS) } != 0 {
            fail(plan, STAGE_SETUP);
        }
    }
    // SAFETY: setsid takes no arguments; the child is not a group leader, so it succeeds.
    unsafe { libc::setsid() };
    if let Some(keep) = plan.bounding_set {
        // Before the id switch, while CAP_SETPCAP is still held.
        for cap in 0..64u32 {
            if keep & (1 << cap) != 0 {
                continue;
            }
            // SAFETY: PR_CAPBSET_DROP takes an integer capability number.
            let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
            if ret < 0 {
                if errno() == libc::EINVAL {
                    break; // past the last capability this kernel knows
                }
                fail(plan, STAGE_SETUP);
            }
        }
    }
    if let Some(fd) = plan.cgroup_procs {
        // SAFETY: writes one byte from a static buffer; "0" means "this process". Best effort.
        unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
    }
    if plan.reset_oom_score {
        // SAFETY: open of a NUL-terminated literal path.
        let fd = unsafe {
            libc::open(
                c"/proc/self/oom_score_adj".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            )
        };
        if fd >= 0 {
            // SAFETY: writes one byte from a static buffer to the fd just opened, then closes it.
            unsafe {
                libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
            }
        }
    }
    if let Some(limit) = &plan.nofile {
        // SAFETY: setrlimit reads one rlimit the parent keeps alive. Lowering always succeeds.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, limit) };
    }
    // Before the id switch: root may raise a hard limit (as far as its capabilities allow),
    // the user after it may not.
    for index in 0..plan.limit_count {
        // SAFETY: `limits` points at `limit_count` entries the parent keeps alive.
        let limit = unsafe { &*plan.limits.add(index) };
        // SAFETY: prlimit64(0, …) sets this process's limit from the live struct; the old
        // value pointer is null.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_prlimit64,
                0,
                limit.resource,
                &limit.value as *const KernelRlimit,
                std::ptr::null_mut::<KernelRlimit>(),
            )
        };
        if ret == -1 {
            fail_with(plan, STAGE_RLIMIT, index as u64, errno());
        }
    }
    for (target, &fd) in plan.stdio.iter().enumerate() {
        // SAFETY: dup2 takes no pointers; `fd` is open in the parent and so in the child.
        if unsafe { libc::dup2(fd, target as libc::c_int) } == -1 {
            fail(plan, STAGE_SETUP);
        }
    }
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal another session's).
    if plan.controlling_terminal && unsafe { libc::ioctl(0, libc::TIOCSCTTY as _, 0) } == -1 {
        fail(plan, STAGE_SETUP);
    }
    // SAFETY: sigset_t is plain old data; sigemptyset initializes it before use, and
    // sigprocmask/signal take pointers to live values or none.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        // An ignored signal stays ignored across exec: the Rust runtime ignores SIGPIPE, and
        // whatever started the agent may have ignored others (a shell's background job
        // ignores SIGINT and SIGQUIT). A command starts with every disposition at its default,
        // as under runc. (SIGKILL and SIGSTOP refuse, harmlessly.)
        for signal in 1..=64 {
            libc::signal(signal, libc::SIG_DFL);
        }
    }
    if let Some(ids) = plan.ids {
        // Raw system calls, not libc's setuid family: glibc and musl broadcast those to every
        // thread of the process, and this child shares the agent's memory and thread list.
        // Groups first, then the group, then the user (after which nothing else may change);
        // switching the user away from 0 drops every capability. Before chdir, so the
        // directory is entered with the user's permissions.
        // SAFETY: setgroups reads `group_count` gids from a buffer the parent keeps alive;
        // setresgid and setresuid take plain integers.
        let failed = unsafe {
            libc::syscall(libc::SYS_setgroups, ids.group_count, ids.groups) == -1
                || libc::syscall(libc::SYS_setresgid, ids.gid, ids.gid, ids.gid) == -1
                || libc::syscall(libc::SYS_setresuid, ids.uid, ids.uid, ids.uid) == -1
        };
        if failed {
            fail(plan, STAGE_USER);
        }
    }
    if let Some(cwd) = plan.cwd {
        // SAFETY: `cwd` points at a NUL-terminated string the parent keeps alive.
        if unsafe { libc::chdir(cwd) } == -1 {
            fail(plan, STAGE_CHDIR);
        }
    }
    // The first candidate refused with EACCES, reported if no later one runs (as execvp does).
    let mut denied: Option<(u64, libc::c_int)> = None;
    let mut last = (0u64, libc::ENOENT);
    let mut index = 0u64;
    loop {
        // SAFETY: `programs` is a NULL-terminated array of pointers the parent keeps alive,
        // and `index` never passes its terminator.
        let program = unsafe { *plan.programs.add(index as usize) };
        if program.is_null() {
            break;
        }
        // SAFETY: program, argv and envp point at NUL-terminated strings and NULL-terminated
        // pointer arrays that the parent keeps alive until this exec has happened.
        unsafe { libc::execve(program, plan.argv, plan.envp) };
        let errno = errno();
        match errno {
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            libc::EACCES => {
                denied.get_or_insert((index, errno));
            }
            _ => fail_with(plan, STAGE_EXEC, index, errno),
        }
        last = (index, errno);
        index += 1;
    }
    let (index, errno) = denied.unwrap_or(last);
    fail_with(plan, STAGE_EXEC, index, errno)
}

fn errno() -> libc::c_int {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Reports `stage` and errno to the parent (shared memory) and exits the child.
fn fail(plan: &ChildPlan, stage: u8) -> ! {
    fail_with(plan, stage, 0, errno())
}

/// Reports `stage`, the candidate it concerns and `errno` to the parent (and to the plan's
/// report descriptor), and exits the child.
fn fail_with(plan: &ChildPlan, stage: u8, candidate: u64, errno: libc::c_int) -> ! {
    let word = (u64::from(stage) << 48) | ((candidate & 0xffff) << 32) | u64::from(errno as u32);
    plan.report.store(word, Ordering::Release);
    if let Some(fd) = plan.report_fd {
        let bytes = word.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local buffer; best effort.
        unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    }
    // SAFETY: _exit ends the child without running destructors or atexit handlers, which a
    // child sharing its parent's memory must not run.
    unsafe { libc::_exit(127) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_path_like_execvp() {
        assert_eq!(
            program_candidates("sh", OsStr::new("/nonexistent::/bin")),
            [
                PathBuf::from("/nonexistent/sh"),
                PathBuf::from("./sh"),
                PathBuf::from("/bin/sh")
            ]
        );
        assert_eq!(
            program_candidates("./x", OsStr::new("/bin")),
            [PathBuf::from("./x")]
        );
    }

    #[test]
    fn a_spawn_error_names_its_cause_once() {
        let error = SpawnError::BadCwd {
            cwd: "/x".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        };
        assert_eq!(
            report::chain(&error),
            "bad cwd \"/x\": No such file or directory (os error 2)"
        );
    }
}
