//! The image's busybox on the host, behind a directory of applet links that is the scripts'
//! whole `PATH`: the host runs the very binary the sandbox runs, never the host's own tools
//! (its `sh` runs its own applets first anyway, as it does in the sandbox). The peers that
//! time a script on the host beside the same script in a sandbox use it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

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
    /// requiring success; the time from spawn to exit.
    pub(crate) fn run(&self, script: &str) -> Result<Duration> {
        let mut cmd = Command::new(self.bin.path().join("sh"));
        cmd.args(["-c", script])
            .env_clear()
            .env("PATH", self.bin.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let child = cmd
            .spawn()
            .with_context(|| format!("starting `sh -c {script:?}` on the host"))?;
        let output = child
            .wait_with_output()
            .with_context(|| format!("waiting for `sh -c {script:?}` on the host"))?;
        let elapsed = started.elapsed();
        if !output.status.success() {
            bail!(
                "`sh -c {script:?}` on the host failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(elapsed)
    }

    /// [`HostShell::run`] in whole milliseconds, as the agent reports a sandboxed command's.
    pub(crate) fn run_whole_ms(&self, script: &str) -> Result<f64> {
        Ok(self.run(script)?.as_millis() as f64)
    }
}
