//! `cargo xtask ci`: the whole CI gate, in the order that fails fastest.

use std::process::Command;

use anyhow::{bail, Result};

use crate::util::{run_step, workspace_root};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run_step(
        "fmt",
        Command::new(&cargo).args(["fmt", "--all", "--", "--check"]),
    )?;
    run_step(
        "clippy",
        Command::new(&cargo).args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    run_step(
        "test",
        Command::new(&cargo).args(["test", "--workspace", "--all-features"]),
    )?;
    check_generated("fixtures", "gen-fixtures", &["fixtures"])?;
    eprintln!("==> ci: all checks passed");
    Ok(())
}

/// Regenerates files with `cargo xtask <task>` and fails if `paths` then differ from git.
fn check_generated(name: &str, task: &str, paths: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run_step(task, Command::new(&cargo).args(["xtask", task]))?;
    let output = Command::new("git")
        .current_dir(workspace_root())
        .args(["status", "--porcelain", "--"])
        .args(paths)
        .output()?;
    let changed = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!("git status failed while checking {name}");
    }
    if !changed.trim().is_empty() {
        bail!(
            "{name} are out of date with the code: `cargo xtask {task}` changed\n{changed}\
             Commit the regenerated files (or fix the code that changed them)."
        );
    }
    eprintln!("    {name} up to date");
    Ok(())
}
