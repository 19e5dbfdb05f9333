//! clone(CLONE_VM | CLONE_VFORK) + exec of one command, by hand.
//!
//! std's `Command` waits for its own children when exec fails, which races with (and would be
//! broken by) our single reaper, so the agent forks itself. Everything the child needs (argv,
//! envp, the resolved program path, the cwd) is prepared before the fork; after it the child
//! only makes async-signal-safe system calls (it shares our memory until it execs, like
//! posix_spawn's child): `setsid`, cgroup and OOM-score writes, `dup2`,
//! signal resets, `chdir`, `execve`. A failure is left for the parent as `stage << 32 | errno`
//! in shared memory; the parent, suspended until the child execs or exits, reads it on waking.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use wire::ExecRequest;

use crate::reaper::{ExitSlot, Reaper};

/// Used when neither the agent nor the request has a `PATH`.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

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
    #[error("bad cwd {cwd:?}: {source}")]
    BadCwd {
        /// The requested directory.
        cwd: String,
        /// Why chdir failed.
        source: io::Error,
    },
    /// execve failed for another reason (bad format, too many files, …).
    #[error("cannot execute {program}: {source}")]
    Exec {
        /// The resolved program.
        program: String,
        /// Why execve failed.
        source: io::Error,
    },
    /// Setting the child up or forking failed.
    #[error("cannot start the command: {0}")]
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
}

/// Stages of the child's setup, as reported through the error pipe.
const STAGE_SETUP: u8 = 1;
const STAGE_CHDIR: u8 = 2;
const STAGE_EXEC: u8 = 3;

/// Everything the child touches after fork: raw pointers into buffers the parent keeps alive.
struct ChildPlan {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: Option<*const libc::c_char>,
    stdio: [RawFd; 3],
    cgroup_procs: Option<RawFd>,
    reset_oom_score: bool,
    /// Written by the child on failure: `stage << 32 | errno`; 0 means the exec happened.
    report: AtomicU64,
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

/// Starts `req` with `stdio`, registering the child with the reaper under `slot`. Returns the
/// pid, which is also the child's process group and session id. On error no output was
/// produced (a child that failed to exec has already exited).
pub fn spawn(
    req: &ExecRequest,
    stdio: ChildStdio<'_>,
    ctx: &SpawnContext<'_>,
    slot: &Arc<ExitSlot>,
) -> Result<libc::pid_t, SpawnError> {
    let base = BaseEnv::get();
    let search_path = match req.env.get("PATH") {
        Some(p) => OsStr::new(p.as_str()),
        None => base.path.as_os_str(),
    };
    let cwd = (!req.cwd.is_empty()).then(|| PathBuf::from(&req.cwd));
    let program = resolve_program(&req.cmd[0], search_path, cwd.as_deref())?;

    let program_c = CString::new(program.as_os_str().as_bytes()).map_err(|_| SpawnError::Nul)?;
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
    let cwd_c = match &cwd {
        Some(c) => Some(CString::new(c.as_os_str().as_bytes()).map_err(|_| SpawnError::Nul)?),
        None => None,
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

    let plan = ChildPlan {
        program: program_c.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: cwd_c.as_ref().map(|c| c.as_ptr()),
        stdio: [
            stdio.stdin.as_raw_fd(),
            stdio.stdout.as_raw_fd(),
            stdio.stderr.as_raw_fd(),
        ],
        cgroup_procs: ctx.cgroup_procs.map(|fd| fd.as_raw_fd()),
        reset_oom_score: ctx.reset_oom_score,
        report: AtomicU64::new(0),
    };

    // The child runs on its own small stack in our address space (CLONE_VM | CLONE_VFORK, as
    // posix_spawn does): no page tables are copied, and this thread is suspended until the
    // child has exec'd or exited, so everything above stays alive and unchanged meanwhile.
    let pid = CHILD_STACKS.with(|stack| {
        let mut stack = stack.borrow_mut();
        if stack.len() < CHILD_STACK {
            stack.resize(CHILD_STACK, 0);
        }
        Reaper::global().spawn_with(slot, || {
            // The stack grows down: pass its (16-byte aligned) top.
            let top = stack.as_mut_ptr_range().end as usize & !0xf;
            // SAFETY: `child_entry` only makes async-signal-safe system calls using `plan`, which
            // outlives the call (CLONE_VFORK suspends us until the child execs or exits), and runs
            // on `stack`, which nothing else uses meanwhile. SIGCHLD makes it an ordinary child.
            let pid = unsafe {
                libc::clone(
                    child_entry,
                    top as *mut libc::c_void,
                    libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                    (&plan as *const ChildPlan).cast_mut().cast(),
                )
            };
            if pid == -1 {
                Err(io::Error::last_os_error())
            } else {
                Ok(pid)
            }
        })
    })?;

    let report = plan.report.load(Ordering::Acquire);
    if report == 0 {
        drop((argv, envp, args_c, added_c, cwd_c, program_c));
        return Ok(pid);
    }
    let errno = (report & 0xffff_ffff) as i32;
    let source = io::Error::from_raw_os_error(errno);
    Err(match (report >> 32) as u8 {
        STAGE_CHDIR => SpawnError::BadCwd {
            cwd: req.cwd.clone(),
            source,
        },
        STAGE_EXEC => match errno {
            libc::ENOENT => SpawnError::NotFound(program.display().to_string()),
            libc::EACCES => SpawnError::PermissionDenied(program.display().to_string()),
            _ => SpawnError::Exec {
                program: program.display().to_string(),
                source,
            },
        },
        _ => SpawnError::Io(source),
    })
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

/// Finds `name` the way `execvp` would: as given when it contains a slash, else the first
/// executable regular file named `name` in a `PATH` directory.
fn resolve_program(name: &str, path: &OsStr, cwd: Option<&Path>) -> Result<PathBuf, SpawnError> {
    if name.contains('/') {
        return Ok(PathBuf::from(name));
    }
    let mut denied = None;
    for dir in path.as_bytes().split(|&b| b == b':') {
        let dir = if dir.is_empty() {
            Path::new(".")
        } else {
            Path::new(OsStr::from_bytes(dir))
        };
        let mut candidate = dir.join(name);
        if candidate.is_relative() {
            if let Some(cwd) = cwd {
                candidate = cwd.join(candidate);
            }
        }
        let Ok(meta) = std::fs::metadata(&candidate) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        if meta.permissions().mode() & 0o111 != 0 && is_executable(&candidate) {
            return Ok(candidate);
        }
        denied.get_or_insert(candidate);
    }
    match denied {
        Some(p) => Err(SpawnError::PermissionDenied(p.display().to_string())),
        None => Err(SpawnError::NotFound(name.to_string())),
    }
}

fn is_executable(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes().to_vec()) else {
        return false;
    };
    // SAFETY: `c` is a live NUL-terminated string.
    unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 }
}

/// The child's side of the fork. Only async-signal-safe calls; never returns.
fn child_after_fork(plan: &ChildPlan) -> ! {
    // SAFETY: setsid takes no arguments; the child is not a group leader, so it succeeds.
    unsafe { libc::setsid() };
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
    for (target, &fd) in plan.stdio.iter().enumerate() {
        // SAFETY: dup2 takes no pointers; `fd` is open in the parent and so in the child.
        if unsafe { libc::dup2(fd, target as libc::c_int) } == -1 {
            fail(&plan.report, STAGE_SETUP);
        }
    }
    // SAFETY: sigset_t is plain old data; sigemptyset initializes it before use, and
    // sigprocmask/signal take pointers to live values or none.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        // The Rust runtime ignores SIGPIPE, and an ignored signal stays ignored across exec.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    if let Some(cwd) = plan.cwd {
        // SAFETY: `cwd` points at a NUL-terminated string the parent keeps alive.
        if unsafe { libc::chdir(cwd) } == -1 {
            fail(&plan.report, STAGE_CHDIR);
        }
    }
    // SAFETY: program, argv and envp point at NUL-terminated strings and NULL-terminated
    // pointer arrays that the parent keeps alive until this exec has happened.
    unsafe { libc::execve(plan.program, plan.argv, plan.envp) };
    fail(&plan.report, STAGE_EXEC)
}

/// Reports `stage` and errno to the parent (shared memory) and exits the child.
fn fail(report: &AtomicU64, stage: u8) -> ! {
    let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
    report.store(
        (u64::from(stage) << 32) | u64::from(errno as u32),
        Ordering::Release,
    );
    // SAFETY: _exit ends the child without running destructors or atexit handlers, which a
    // child sharing its parent's memory must not run.
    unsafe { libc::_exit(127) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_on_path_and_reports_missing_programs() {
        let found = resolve_program("sh", OsStr::new("/nonexistent:/bin:/usr/bin"), None)
            .expect("sh is on PATH");
        assert!(found.ends_with("sh"));
        assert!(matches!(
            resolve_program("no-such-cmd-xyz", OsStr::new("/bin:/usr/bin"), None),
            Err(SpawnError::NotFound(_))
        ));
        assert_eq!(
            resolve_program("./x", OsStr::new("/bin"), None).expect("as given"),
            PathBuf::from("./x")
        );
    }
}
