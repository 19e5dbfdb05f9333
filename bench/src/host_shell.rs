//! The image's busybox on the host, behind a directory of applet links that is the scripts'
//! whole `PATH`: the host runs the very binary the sandbox runs, never the host's own tools
//! (its `sh` runs its own applets first anyway, as it does in the sandbox). The peers that
//! time a script on the host beside the same script in a sandbox use it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

/// The longest a host script may take: every one the peers run ends in milliseconds.
const SCRIPT_LIMIT: Duration = Duration::from_secs(60);

/// SIGKILLs process group `group` (best effort: it may be gone already).
fn kill_group(group: i32) {
    // SAFETY: kill takes two integers; a negative pid names a process group, here the one the
    // script was started as the leader of.
    unsafe { libc::kill(-group, libc::SIGKILL) };
}

#[derive(Clone)]
pub(crate) struct HostShell {
    bin: Arc<tempfile::TempDir>,
}

impl HostShell {
    /// Links `applets` of `busybox` into a directory of their own.
    pub(crate) fn new(busybox: &Path, applets: &[&str]) -> Result<Self> {
        ensure!(
            busybox.is_file(),
            "the image has no busybox at {}",
            busybox.display()
        );
        let busybox = busybox
            .canonicalize()
            .with_context(|| format!("resolving {}", busybox.display()))?;
        let bin = tempfile::Builder::new()
            .prefix("crucible-bench-host-bin-")
            .tempdir()
            .context("a directory for the busybox applet links")?;
        for applet in applets {
            let link = bin.path().join(applet);
            std::os::unix::fs::symlink(&busybox, &link)
                .with_context(|| format!("linking {} to {}", link.display(), busybox.display()))?;
        }
        Ok(HostShell { bin: Arc::new(bin) })
    }

    /// Runs `script` with no environment but `PATH` (no proxy settings: a direct connection),
    /// requiring success within [`SCRIPT_LIMIT`]; the time from spawn to exit. The script
    /// runs in a process group of its own, killed once it has exited: what it left in the
    /// background (a service loop) goes with it.
    pub(crate) fn run(&self, script: &str) -> Result<Duration> {
        self.run_within(script, SCRIPT_LIMIT)
    }

    /// [`HostShell::run`] within `limit`.
    fn run_within(&self, script: &str, limit: Duration) -> Result<Duration> {
        use std::io::Read;
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(self.bin.path().join("sh"));
        cmd.args(["-c", script])
            .env_clear()
            .env("PATH", self.bin.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0);
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting `sh -c {script:?}` on the host"))?;
        let group = i32::try_from(child.id()).context("the script's pid")?;
        let stderr_pipe = child.stderr.take();
        // Waited for on a thread of its own, so that the exit is seen the moment it happens
        // (the figure is this time) and a script that never ends is still bounded.
        let (done, exited) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let status = child.wait();
            let _ = done.send((status, Instant::now()));
        });
        let outcome = exited.recv_timeout(limit);
        kill_group(group);
        let (status, elapsed) = match outcome {
            Ok((status, at)) => (
                Some(
                    status
                        .with_context(|| format!("waiting for `sh -c {script:?}` on the host"))?,
                ),
                at.duration_since(started),
            ),
            Err(_) => (None, started.elapsed()),
        };
        let mut stderr = String::new();
        if let Some(mut pipe) = stderr_pipe {
            let _ = pipe.read_to_string(&mut stderr);
        }
        match status {
            None => bail!(
                "`sh -c {script:?}` on the host did not finish within {limit:?}: killed; {}",
                stderr.trim()
            ),
            Some(status) if !status.success() => bail!(
                "`sh -c {script:?}` on the host failed ({status}): {}",
                stderr.trim()
            ),
            Some(_) => Ok(elapsed),
        }
    }

    pub(crate) fn run_whole_ms(&self, script: &str) -> Result<f64> {
        Ok(self.run(script)?.as_millis() as f64)
    }
}

/// The build host's static busybox, the one the image ships: what the tests run host scripts
/// with.
#[cfg(test)]
pub(crate) fn busybox() -> &'static Path {
    Path::new(guest_image::initramfs::BUSYBOX_PATH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_script_leaves_behind_is_killed_and_one_that_never_ends_is_bounded() -> Result<()> {
        let host = HostShell::new(busybox(), &["sh", "sleep", "cat"])?;
        let marker = tempfile::tempdir()?;
        let pid_file = marker.path().join("pid");
        // The background sleep outlives its script unless its process group is killed.
        host.run(&format!("sleep 30 & echo $! > {}", pid_file.display()))?;
        let pid = std::fs::read_to_string(&pid_file)?.trim().to_string();
        let gone = (0..200).any(|_| {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let done = state.is_empty() || state.contains(") Z ");
            if !done {
                std::thread::sleep(Duration::from_millis(10));
            }
            done
        });
        assert!(gone, "the script's background sleep {pid} still runs");
        let started = Instant::now();
        let err = host
            .run_within("sleep 30", Duration::from_millis(300))
            .expect_err("bounded");
        assert!(err.to_string().contains("did not finish"), "{err:#}");
        assert!(started.elapsed() < Duration::from_secs(10));
        Ok(())
    }
}
