//! fork + exec of one command, by hand.
//!
//! std's `Command` waits for its own children when exec fails, which races with (and would be
//! broken by) our single reaper, so the agent forks itself. Everything the child needs (argv,
//! envp, the resolved program path, the cwd) is prepared before the fork; after it the child
//! only makes async-signal-safe system calls: `setsid`, cgroup and OOM-score writes, `dup2`,
//! signal resets, `chdir`, `execve`. A failure is reported to the parent as `[stage, errno]`
//! through a close-on-exec pipe, so the parent knows within one read whether the exec worked.

use std::ffi::{CString, OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use wire::ExecRequest;

use crate::reaper::{ExitSlot, Reaper};
use crate::sys;

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
    report: RawFd,
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
    let env = merged_env(req);
    let search_path = env
        .iter()
        .find_map(|(k, v)| (k.as_os_str() == "PATH").then(|| v.clone()))
        .unwrap_or_else(|| OsString::from(DEFAULT_PATH));
    let cwd = (!req.cwd.is_empty()).then(|| PathBuf::from(&req.cwd));
    let program = resolve_program(&req.cmd[0], &search_path, cwd.as_deref())?;

    let program_c = CString::new(program.as_os_str().as_bytes()).map_err(|_| SpawnError::Nul)?;
    let args_c = req
        .cmd
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| SpawnError::Nul)?;
    let env_c = env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| SpawnError::Nul)?;
    let cwd_c = match &cwd {
        Some(c) => Some(CString::new(c.as_os_str().as_bytes()).map_err(|_| SpawnError::Nul)?),
        None => None,
    };
    let mut argv: Vec<*const libc::c_char> = args_c.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env_c.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());

    let (report_r, report_w) = sys::pipe()?;
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
        report: report_w.as_raw_fd(),
    };

    let pid = Reaper::global().spawn_with(slot, || {
        // SAFETY: fork takes no arguments. The child runs only `child_after_fork`, which makes
        // async-signal-safe calls on memory prepared above and never returns.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => child_after_fork(&plan),
            pid => Ok(pid),
        }
    })?;
    drop(report_w);

    // Read the child's report: EOF without bytes means execve succeeded (the pipe was
    // close-on-exec). The buffers above stay alive until here, past the child's exec.
    let mut report = [0u8; 5];
    let mut got = 0;
    let mut file = std::fs::File::from(report_r);
    while got < report.len() {
        match file.read(&mut report[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    drop((argv, envp, args_c, env_c, cwd_c, program_c));
    if got == 0 {
        return Ok(pid);
    }
    let errno = i32::from_ne_bytes([report[1], report[2], report[3], report[4]]);
    let source = io::Error::from_raw_os_error(errno);
    Err(match report[0] {
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

/// The agent's environment with the request's variables added (the request wins).
fn merged_env(req: &ExecRequest) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| !req.env.contains_key(&*k.to_string_lossy()))
        .collect();
    env.extend(
        req.env
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    env
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
            fail(plan.report, STAGE_SETUP);
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
            fail(plan.report, STAGE_CHDIR);
        }
    }
    // SAFETY: program, argv and envp point at NUL-terminated strings and NULL-terminated
    // pointer arrays that the parent keeps alive until this exec has happened.
    unsafe { libc::execve(plan.program, plan.argv, plan.envp) };
    fail(plan.report, STAGE_EXEC)
}

/// Reports `[stage, errno]` to the parent and exits the child.
fn fail(report: RawFd, stage: u8) -> ! {
    let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let e = errno.to_ne_bytes();
    let msg = [stage, e[0], e[1], e[2], e[3]];
    // SAFETY: writes 5 bytes from a live stack array, then exits without running any
    // destructors or atexit handlers (which a forked child of a threaded process must not run).
    unsafe {
        libc::write(report, msg.as_ptr().cast(), msg.len());
        libc::_exit(127)
    }
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
