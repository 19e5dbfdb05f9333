//! `cargo xtask ci`: the whole CI gate, in the order that fails fastest.

use std::process::Command;

use anyhow::{bail, Result};
use contract::kvm_tests::KvmTestGate;

use crate::util::{run_step, workspace_root};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Checked first: a bad value would otherwise fail the test crates' build scripts minutes in.
    // The variable itself reaches those build scripts through the inherited environment.
    let kvm_gate = KvmTestGate::detect()?;
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
    // The image the end-to-end tests and the smoke test run (kernel from ~/.cache/crucible).
    run_step(
        "build-image",
        Command::new(&cargo).args(["xtask", "build-image"]),
    )?;
    // A Debian root with a C toolchain (the tree cached in ~/.cache/crucible, debootstrapped
    // once), which the image tests import and compile in (tests/tests/namespace_debian.rs).
    run_step(
        "build-image (debian)",
        Command::new(&cargo).args([
            "xtask",
            "build-image",
            "--no-kernel",
            "--rootfs",
            "debian",
            "--packages",
            "gcc,make",
            "--out",
            "target/crucible/debian",
        ]),
    )?;
    run_step(
        "smoke-image",
        Command::new(&cargo).args(["xtask", "smoke-image"]),
    )?;
    // The containerd shim's tests drive a real containerd (Debian's package; apt when missing).
    ensure_containerd()?;
    // Tests this host cannot run are compiled ignored (counted as such, never as passed);
    // CRUCIBLE_REQUIRE_KVM=1 makes them mandatory (`contract::kvm_tests`).
    eprintln!("==> KVM tests: {}", kvm_gate.summary());
    run_step(
        "test",
        Command::new(&cargo).args(["test", "--workspace", "--all-features"]),
    )?;
    // A few seconds per fuzz target: proves they build and that the seed corpora still pass.
    run_step(
        "fuzz (short)",
        Command::new(&cargo).args(["xtask", "fuzz", "--seconds", "5"]),
    )?;
    // Benchmark-driven CI: the quick suite's ratios to the floor against bench-baseline.json,
    // then the gate's self-test (a build slowed through the exec-path test hook must fail it).
    run_step(
        "bench gate",
        Command::new(&cargo).args(["xtask", "bench", "--quick", "--gate"]),
    )?;
    run_step(
        "bench gate self-test",
        Command::new(&cargo).args(["xtask", "bench", "--check-slowed"]),
    )?;
    check_generated("fixtures", "gen-fixtures", &["fixtures"])?;
    check_generated("docs/openapi.json", "gen-openapi", &["docs/openapi.json"])?;
    ensure_pytest()?;
    // Exactly the README's command, from the repository root.
    run_step(
        "python sdk",
        Command::new("python3")
            .args(["-m", "pytest", "-q", "sdks/python"])
            .current_dir(workspace_root()),
    )?;
    // Hostile input: schemathesis against a live daemon, short form (docs/reliability.md).
    run_step(
        "hostile (schemathesis)",
        Command::new(&cargo).args(["xtask", "hostile"]),
    )?;
    eprintln!("==> ci: all checks passed ({})", kvm_gate.summary());
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

/// Installs containerd (and runc, which Debian's containerd package recommends and its tests
/// of our shim do not need) with apt when the machine lacks it, saying so first.
fn ensure_containerd() -> Result<()> {
    let log = workspace_root().join("target/crucible/logs/apt-containerd.log");
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    crucible_image::deps::ensure(
        &["containerd"],
        "the containerd shim's tests (shim/tests/containerd.rs)",
        &log,
        &crucible_image::progress::Plain,
    )
    .map_err(|e| anyhow::anyhow!("installing containerd: {e} (log: {})", log.display()))?;
    Ok(())
}

/// Installs pytest with pip when the machine lacks it (a fresh CI machine does).
fn ensure_pytest() -> Result<()> {
    let have = Command::new("python3")
        .args(["-c", "import pytest"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !have {
        eprintln!(
            "==> pytest is missing: installing it with pip (needed for the Python SDK tests)"
        );
        run_step(
            "pip install pytest",
            Command::new("python3").args(["-m", "pip", "install", "--quiet", "pytest"]),
        )?;
    }
    Ok(())
}
