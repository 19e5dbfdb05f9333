//! Small helpers the suite's parts share.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The workspace root (the bench crate lives one level below it).
pub(crate) fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}

/// Runs `cmd` (in the workspace root unless it names a directory), echoing it and its
/// duration; fails naming the command.
pub(crate) fn run_step(name: &str, cmd: &mut Command) -> Result<()> {
    if cmd.get_current_dir().is_none() {
        cmd.current_dir(workspace_root());
    }
    eprintln!("==> {name}: {}", describe(cmd));
    let started = Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{}`", describe(cmd)))?;
    let elapsed = started.elapsed();
    if !status.success() {
        bail!(
            "{name} failed ({status}) after {elapsed:.1?}: `{}`",
            describe(cmd)
        );
    }
    eprintln!("    {name} ok in {elapsed:.1?}");
    Ok(())
}

/// The command line of `cmd`, for messages.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// `cmd.output()`, but killed (and an error naming it) once it has run for `limit`: a bench
/// script that hangs must fail the run, not hold it. Output goes through files, so a chatty
/// child cannot block on a full pipe while this waits.
pub(crate) fn output_within(cmd: &mut Command, limit: Duration) -> Result<Output> {
    let mut stdout = tempfile::tempfile().context("a file for the child's stdout")?;
    let mut stderr = tempfile::tempfile().context("a file for the child's stderr")?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(stdout.try_clone().context("sharing the stdout file")?)
        .stderr(stderr.try_clone().context("sharing the stderr file")?)
        .spawn()
        .with_context(|| format!("could not start `{}`", describe(cmd)))?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the child")? {
            break status;
        }
        if started.elapsed() > limit {
            // Best effort: it may have ended just now, and wait() reaps it either way.
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "`{}` was still running after {limit:?}: killed",
                describe(cmd)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |file: &mut std::fs::File| -> Result<Vec<u8>> {
        use std::io::{Read, Seek};
        let mut bytes = Vec::new();
        file.rewind().context("rewinding the child's output")?;
        file.read_to_end(&mut bytes)
            .context("reading the child's output")?;
        Ok(bytes)
    };
    Ok(Output {
        status,
        stdout: read(&mut stdout)?,
        stderr: read(&mut stderr)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_within_returns_what_the_child_wrote_and_kills_one_past_its_limit() {
        let mut quick = Command::new("sh");
        quick.args(["-c", "echo out; echo err >&2; exit 3"]);
        let done = output_within(&mut quick, Duration::from_secs(30)).expect("sh runs");
        assert_eq!(done.status.code(), Some(3));
        assert_eq!(
            (done.stdout.as_slice(), done.stderr.as_slice()),
            (&b"out\n"[..], &b"err\n"[..])
        );

        let mut stuck = Command::new("sleep");
        stuck.arg("30");
        let started = Instant::now();
        let err = output_within(&mut stuck, Duration::from_millis(200))
            .expect_err("a sleep past its limit is an error");
        assert!(err.to_string().contains("still running"), "{err:#}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
