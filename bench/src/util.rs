//! Small helpers the suite's parts share.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

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
