//! The one process behind a sandbox (the namespace supervisor, `crucible-vmm`, or the agent
//! itself): started and awaited until its agent says hello, then watched until it exits,
//! killed on request. Shared by every backend.

use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};
use wire::agent::Hello;

use super::BackendError;

/// Where a sandbox's processes leave their own words: their stderr logs, the guest's console.
/// These files live in the sandbox's directory and go with it, so when a process fails, the
/// last lines of each are copied into the reason a user is given (a failed create's error, a
/// dead sandbox's `exit_reason`), never pointed at.
#[derive(Debug, Clone, Default)]
pub(super) struct Diagnostics {
    logs: Vec<(String, PathBuf)>,
}

/// At most this many of a log's last lines go into a reason...
const TAIL_LINES: usize = 12;
/// ...and at most this many bytes of them.
const TAIL_BYTES: u64 = 2048;

impl Diagnostics {
    /// No logs yet.
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// Adds the log at `path`, named `label` in reasons (`"the VMM's stderr"`).
    pub(super) fn with(mut self, label: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        self.logs.push((label.into(), path.into()));
        self
    }

    /// `"; <label> ended: «line | line»"` for each log with something in it; empty if none.
    pub(super) fn tails(&self) -> String {
        self.logs
            .iter()
            .filter_map(|(label, path)| {
                let tail = last_lines(path)?;
                Some(format!("; {label} ended: «{tail}»"))
            })
            .collect()
    }
}

/// The last [`TAIL_LINES`] non-empty lines of `path` (at most [`TAIL_BYTES`] from its end),
/// joined by ` | `; `None` for a missing or empty file.
fn last_lines(path: &Path) -> Option<String> {
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))
        .ok()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    // The first line may be cut; keep it only when the file was read whole.
    if len > TAIL_BYTES && !lines.is_empty() {
        lines.remove(0);
    }
    let tail = &lines[lines.len().saturating_sub(TAIL_LINES)..];
    (!tail.is_empty()).then(|| tail.join(" | "))
}

/// Starts `command` and waits for its agent's hello on `ready` (no polling), racing the
/// process's exit and `timeout`. `what` names the process; when it fails, the last lines of
/// `diagnostics` go into the reason. On failure the process is killed. Whether it is killed
/// when the daemon drops it (`kill_on_drop`) is the caller's to set on `command`: a sandbox
/// that must outlive its daemon (live restore) is not.
pub(super) async fn spawn_and_await_hello(
    command: &mut Command,
    ready: &UnixListener,
    timeout: Duration,
    what: &str,
    diagnostics: &Diagnostics,
) -> Result<(Child, Hello), BackendError> {
    let mut child = command
        .spawn()
        .map_err(|e| BackendError::setup(format!("start {what}"), e))?;
    let hello = tokio::select! {
        hello = accept_hello(ready) => hello,
        status = child.wait() => Err(format!(
            "{what} exited before its agent was ready ({})",
            status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()),
        )),
        () = tokio::time::sleep(timeout) => Err(format!(
            "no hello from the agent within {timeout:?}"
        )),
    };
    match hello {
        Ok(hello) => Ok((child, hello)),
        Err(reason) => {
            let _ = child.kill().await;
            // After the kill: the process has written all it will.
            Err(BackendError::NotReady(format!(
                "{reason}{}",
                diagnostics.tails()
            )))
        }
    }
}

/// Makes `command`'s process outlive the daemon (live restore): a process group of its own, so
/// that nothing aimed at the daemon's group reaches it — Ctrl-C in the daemon's terminal, a
/// `kill` of the group, the SIGHUP a closed terminal sends its foreground group. (A service
/// manager that kills a whole cgroup is told not to: `KillMode=process`, docs/api.md.)
pub(super) fn outlive_the_daemon(command: &mut Command) {
    command.process_group(0);
}

/// Accepts the agent's connection on `listener` and reads its hello.
async fn accept_hello(listener: &UnixListener) -> Result<Hello, String> {
    let (mut stream, _) = listener
        .accept()
        .await
        .map_err(|e| format!("accepting the agent's hello: {e}"))?;
    let hello: Hello = wire::read_message_async(&mut stream)
        .await
        .map_err(|e| format!("reading the agent's hello: {e}"))?;
    hello.check_protocol()?;
    Ok(hello)
}

/// A receiver that ends with whichever of `a` and `b` ends first: a sandbox made of two
/// processes is dead when either is.
pub(super) fn first_exit(
    mut a: watch::Receiver<Option<String>>,
    mut b: watch::Receiver<Option<String>>,
) -> watch::Receiver<Option<String>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let reason = tokio::select! {
            r = a.wait_for(Option::is_some) => r.ok().and_then(|r| r.clone()),
            r = b.wait_for(Option::is_some) => r.ok().and_then(|r| r.clone()),
        };
        let _ = tx.send(Some(reason.unwrap_or_else(|| "its watcher ended".into())));
    });
    rx
}

/// A watched sandbox process.
#[derive(Debug)]
pub(super) struct SandboxProcess {
    exited: watch::Receiver<Option<String>>,
    kill: Mutex<Option<oneshot::Sender<()>>>,
}

impl SandboxProcess {
    /// Watches `child`; `what` names it in the exit reason (`"the VM"`), which also carries
    /// the last lines of `diagnostics` when it exits by itself.
    pub(super) fn watch(mut child: Child, what: String, diagnostics: Diagnostics) -> Self {
        let (exited_tx, exited_rx) = watch::channel(None);
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let reason = tokio::select! {
                status = child.wait() => match status {
                    Ok(s) => format!("{what} exited ({s}){}", diagnostics.tails()),
                    Err(e) => format!("waiting for {what} failed: {e}"),
                },
                _ = kill_rx => {
                    let _ = child.kill().await;
                    "deleted".to_string()
                }
            };
            let _ = exited_tx.send(Some(reason));
        });
        SandboxProcess {
            exited: exited_rx,
            kill: Mutex::new(Some(kill_tx)),
        }
    }

    /// Watches `pid`, a process of a sandbox an earlier daemon started (not our child: its
    /// exit is seen through a pidfd). Refused unless it is still the process that started at
    /// `start_ticks` (checked after the pidfd pins it, so a pid reused in between is caught).
    pub(super) fn adopt(
        pid: i32,
        start_ticks: u64,
        what: String,
        diagnostics: Diagnostics,
    ) -> io::Result<Self> {
        let pidfd = pidfd_open(pid).map_err(|e| {
            if e.raw_os_error() == Some(3) {
                io::Error::other("it is gone")
            } else {
                e
            }
        })?;
        let now = crate::restore::process_start_ticks(pid)?;
        if now != start_ticks {
            return Err(io::Error::other(format!(
                "pid {pid} is another process now (started at tick {now}, not {start_ticks})"
            )));
        }
        let pidfd = std::sync::Arc::new(pidfd);
        // A plain thread waits for the exit: tokio could only register the pidfd unsafely, and
        // its blocking pool would hold the daemon's exit until the sandbox ends, which under
        // live restore is the point of not waiting.
        let (gone_tx, gone_rx) = oneshot::channel::<()>();
        let waited = pidfd.clone();
        std::thread::Builder::new()
            .name(format!("watch-{pid}"))
            .spawn(move || {
                wait_readable(&waited);
                let _ = gone_tx.send(());
            })?;
        let (exited_tx, exited_rx) = watch::channel(None);
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let mut gone_rx = gone_rx;
            let reason = tokio::select! {
                _ = &mut gone_rx => format!("{what} exited{}", diagnostics.tails()),
                _ = kill_rx => {
                    if let Err(e) = pidfd_kill(&pidfd) {
                        tracing::warn!("killing {what} (pid {pid}): {e}");
                    }
                    let _ = gone_rx.await;
                    "deleted".to_string()
                }
            };
            let _ = exited_tx.send(Some(reason));
        });
        Ok(SandboxProcess {
            exited: exited_rx,
            kill: Mutex::new(Some(kill_tx)),
        })
    }

    /// `None` while it runs; why it ended, once it has.
    pub(super) fn exited(&self) -> watch::Receiver<Option<String>> {
        self.exited.clone()
    }

    /// Kills it (once; later calls do nothing) and waits until it is gone.
    pub(super) async fn kill_and_wait(&self) {
        if let Some(kill) = self.kill.lock().ok().and_then(|mut k| k.take()) {
            let _ = kill.send(());
        }
        let mut exited = self.exited.clone();
        let _ = exited.wait_for(Option::is_some).await;
    }
}

/// How long a refused adoption waits for the processes it killed: a process stuck in the
/// kernel (uninterruptible sleep) must not hold the daemon's start for ever.
pub(super) const REFUSAL_KILL_WAIT: Duration = Duration::from_secs(10);

impl SandboxProcess {
    /// Kills it and waits, within [`REFUSAL_KILL_WAIT`], until it is gone (a refused
    /// adoption: nothing else waits for its resources); whether it is.
    pub(super) async fn kill_refused(&self, what: &str) -> bool {
        let gone = tokio::time::timeout(REFUSAL_KILL_WAIT, self.kill_and_wait())
            .await
            .is_ok();
        if !gone {
            tracing::warn!("{what} was killed but is not gone after {REFUSAL_KILL_WAIT:?}");
        }
        gone
    }
}

/// A pidfd for `pid` (readable once it has exited; Linux 5.3+).
pub(super) fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)
        .ok_or_else(|| io::Error::other(format!("{pid} is not a pid")))?;
    Ok(rustix::process::pidfd_open(
        pid,
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// Blocks until the process behind `pidfd` has exited.
fn wait_readable(pidfd: &OwnedFd) {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    while let Err(rustix::io::Errno::INTR) = poll(&mut fds, None) {}
}

/// SIGKILL to the process behind `pidfd` (never to whoever has its pid later).
pub(super) fn pidfd_kill(pidfd: &OwnedFd) -> io::Result<()> {
    match rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL) {
        // Already gone: what we wanted.
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn tails_quote_the_last_lines_of_each_log_that_has_any() {
        let dir = tempfile::tempdir().unwrap();
        let vmm = dir.path().join("vmm.log");
        let console = dir.path().join("console.log");
        std::fs::write(&vmm, "crucible-vmm: guest crashed: vCPU 0: triple fault\n").unwrap();
        let lines: String = (1..=40).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&console, lines).unwrap();
        let d = Diagnostics::new()
            .with("the VMM's stderr", &vmm)
            .with("the console", &console)
            .with("a missing log", dir.path().join("nope"));
        let tails = d.tails();
        assert!(
            tails.starts_with(
                "; the VMM's stderr ended: «crucible-vmm: guest crashed: vCPU 0: triple fault»"
            ),
            "{tails}"
        );
        assert!(tails.contains("line 29 | line 30"), "{tails}");
        assert!(tails.ends_with("line 40»"), "{tails}");
        assert!(!tails.contains("line 28 "), "{tails}");
        assert!(!tails.contains("missing"), "{tails}");
    }

    #[tokio::test]
    async fn an_adopted_process_must_have_its_recorded_start_time_and_dies_by_its_pidfd() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let ticks = crate::restore::process_start_ticks(pid).unwrap();
        let refused = SandboxProcess::adopt(pid, ticks + 1, "the VM".into(), Diagnostics::new())
            .expect_err("another start time is another process");
        assert!(
            refused.to_string().contains("is another process now"),
            "{refused}"
        );
        let adopted =
            SandboxProcess::adopt(pid, ticks, "the VM".into(), Diagnostics::new()).unwrap();
        assert!(adopted.exited().borrow().is_none(), "it runs");
        tokio::time::timeout(Duration::from_secs(10), adopted.kill_refused("the VM"))
            .await
            .expect("killed within its bound");
        assert_eq!(adopted.exited().borrow().as_deref(), Some("deleted"));
        // Ours to reap (the test is its parent): killed by the pidfd, SIGKILL.
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(9));
        let gone = SandboxProcess::adopt(pid, ticks, "the VM".into(), Diagnostics::new())
            .expect_err("reaped: gone");
        // (Or, should the kernel have given the pid to another process already, that one.)
        let gone = gone.to_string();
        assert!(
            gone.contains("gone") || gone.contains("another process"),
            "{gone}"
        );
    }

    #[test]
    fn a_huge_log_contributes_only_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("big.log");
        std::fs::write(&log, format!("{}\nthe end\n", "x".repeat(1 << 20))).unwrap();
        let tails = Diagnostics::new().with("big", &log).tails();
        assert!(tails.len() < 4096, "{}", tails.len());
        assert!(tails.ends_with("the end»"), "{tails}");
    }
}
