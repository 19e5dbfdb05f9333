//! Running commands by name (`exec_id`), so that one of them can be signalled alone while the
//! others run on: containerd's `task kill --exec-id`, a CI runner cancelling one step.
//!
//! A name maps to its command's pid, which is also its process group id (the child calls
//! `setsid`). The entry goes in with the spawn and out with the reap, both under this module's
//! lock, and a signal is sent under it too: while the lock is held the command cannot be reaped,
//! so its pid (and so its group id) cannot have been reused by another process.

use std::collections::HashMap;
use std::io;
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::sys;

/// Why a named spawn or a signal was refused.
#[derive(Debug, thiserror::Error)]
pub enum ExecIdError {
    /// Another running command has the name.
    #[error("exec_id {0:?} is taken by a running command")]
    Taken(String),
    /// No running command has the name (it never ran, or it has been reaped).
    #[error("no running command has exec_id {0:?}")]
    NotRunning(String),
    /// kill(2) refused.
    #[error("signal {signal} to exec_id {exec_id:?}")]
    Signal {
        /// The name.
        exec_id: String,
        /// The signal.
        signal: libc::c_int,
        /// The cause.
        source: io::Error,
    },
}

type Running = HashMap<String, libc::pid_t>;

static RUNNING: LazyLock<Mutex<Running>> = LazyLock::new(Mutex::default);

fn lock() -> MutexGuard<'static, Running> {
    // Plain inserts and removals cannot leave the map inconsistent, so a poisoned lock is
    // still usable.
    RUNNING.lock().unwrap_or_else(|p| p.into_inner())
}

/// A child that can carry its exec id (the reaper's `Child`, which drops the name when it is
/// reaped, through [`reap_named`]).
pub trait Named {
    /// Its pid, which is also its process group.
    fn pid(&self) -> libc::pid_t;
    /// Records the name it runs under.
    fn set_exec_id(&mut self, exec_id: String);
}

/// Runs `spawn` and records its child under `exec_id` (an empty name records nothing). The
/// name is checked and recorded under the lock, so two commands never get the same one.
pub fn spawn_named<C: Named, E>(
    exec_id: &str,
    spawn: impl FnOnce() -> Result<C, E>,
) -> Result<Result<C, E>, ExecIdError> {
    if exec_id.is_empty() {
        return Ok(spawn());
    }
    let mut running = lock();
    if running.contains_key(exec_id) {
        return Err(ExecIdError::Taken(exec_id.to_string()));
    }
    Ok(spawn().map(|mut child| {
        running.insert(exec_id.to_string(), child.pid());
        child.set_exec_id(exec_id.to_string());
        child
    }))
}

/// Runs `reap` (a non-blocking reap of the child named `exec_id`) under the lock, and forgets
/// the name if it reaped: no signal can reach the pid between its reap and its release.
pub(crate) fn reap_named<T>(
    exec_id: &str,
    pid: libc::pid_t,
    reap: impl FnOnce() -> io::Result<Option<T>>,
) -> io::Result<Option<T>> {
    let mut running = lock();
    let reaped = reap()?;
    if reaped.is_some() && running.get(exec_id) == Some(&pid) {
        running.remove(exec_id);
    }
    Ok(reaped)
}

/// Sends `signal` to the process group of the running command named `exec_id`.
pub fn signal(exec_id: &str, signal: libc::c_int) -> Result<(), ExecIdError> {
    let running = lock();
    let pid = *running
        .get(exec_id)
        .ok_or_else(|| ExecIdError::NotRunning(exec_id.to_string()))?;
    match sys::kill_group(pid, signal) {
        // Only a zombie leader is left (the exec reaps it in a moment): nothing to signal.
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        Err(source) => Err(ExecIdError::Signal {
            exec_id: exec_id.to_string(),
            signal,
            source,
        }),
        Ok(()) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reaper::Child;
    use crate::spawn::{self, ChildStdio, SpawnContext};
    use std::os::fd::AsFd;
    use wire::ExecRequest;

    fn start(exec_id: &str, cmd: &[&str]) -> Result<Child, ExecIdError> {
        let devnull = std::fs::File::open("/dev/null").expect("/dev/null");
        let (_r, w) = sys::pipe().expect("pipe");
        let stdio = ChildStdio {
            stdin: devnull.as_fd(),
            stdout: w.as_fd(),
            stderr: w.as_fd(),
            controlling_terminal: false,
        };
        let ctx = SpawnContext {
            devnull: devnull.as_fd(),
            cgroup_procs: None,
            reset_oom_score: false,
            namespaces: None,
        };
        let request = ExecRequest::new(cmd.iter().copied());
        spawn_named(exec_id, || spawn::spawn(&request, None, stdio, &ctx))
            .map(|spawned| spawned.expect("spawn"))
    }

    #[test]
    fn a_named_command_is_signalled_alone_and_its_name_is_freed_by_the_reap() {
        let mut target = start("exec-ids-target", &["sleep", "30"]).expect("first");
        let mut bystander = start("exec-ids-bystander", &["sleep", "30"]).expect("second");
        assert!(matches!(
            start("exec-ids-target", &["true"]),
            Err(ExecIdError::Taken(_))
        ));
        signal("exec-ids-target", libc::SIGTERM).expect("signal");
        let exit = target.wait().expect("reap");
        assert!(libc::WIFSIGNALED(exit.status));
        assert_eq!(libc::WTERMSIG(exit.status), libc::SIGTERM);
        assert!(bystander.try_reap().expect("poll").is_none(), "still runs");
        assert!(matches!(
            signal("exec-ids-target", libc::SIGTERM),
            Err(ExecIdError::NotRunning(_))
        ));
        // The name is free again.
        let mut again = start("exec-ids-target", &["true"]).expect("reused name");
        again.wait().expect("reap");
        signal("exec-ids-bystander", libc::SIGKILL).expect("signal");
        bystander.wait().expect("reap");
        assert!(matches!(
            signal("never-ran", libc::SIGTERM),
            Err(ExecIdError::NotRunning(_))
        ));
    }
}
