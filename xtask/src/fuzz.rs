//! `cargo xtask fuzz`: builds the cargo-fuzz targets in `fuzz/` (nightly, AddressSanitizer)
//! and runs each for a fixed time, installing cargo-fuzz and the nightly toolchain when they
//! are missing.
//!
//! The instrumented build goes to `~/.cache/crucible/fuzz-target` (the image cache's root).
//! Each target runs on a scratch corpus in `target/fuzz/corpus/<target>` (kept between runs,
//! never committed) seeded from the committed `fuzz/corpus/<target>`: libFuzzer adds new inputs
//! to the first corpus directory it is given, so the committed seeds stay as they are. The full
//! libFuzzer output goes to `target/fuzz/logs/<target>.log`; a crash fails the command with the
//! artifact's path and the command that reproduces it.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use guest_image::cache::Cache;
use xshell::{cmd, Shell};

use crate::util::{describe, run_step, workspace_root};

/// Every fuzz target, in the order they run (cheapest first, so a short run fails fast).
pub(crate) const TARGETS: &[&str] = &[
    "frame_decoder",
    "agent_request",
    "http_exec_request",
    "http1_head",
    "tar_extract",
    "virtqueue_chain",
    "vsock_packet",
];

/// How often a running target's latest libFuzzer status line is echoed.
const PROGRESS_EVERY: Duration = Duration::from_secs(15);

/// Seconds without progress after which libFuzzer reports a single input as a hang.
const INPUT_TIMEOUT_S: u32 = 20;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// How long to run each target, in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u32,
    /// Run only this target (repeatable); all of them by default.
    #[arg(long = "target", value_name = "NAME")]
    targets: Vec<String>,
    /// Only build the targets.
    #[arg(long)]
    build_only: bool,
}

/// What libFuzzer reported at the end of one run.
#[derive(Debug, Default)]
struct Stats {
    executions: u64,
    execs_per_sec: u64,
    new_units: u64,
    corpus_units: u64,
    corpus_size: String,
    peak_rss_mb: u64,
}

pub(crate) fn run(sh: &Shell, args: Args) -> Result<()> {
    let targets: Vec<&str> = if args.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        for t in &args.targets {
            if !TARGETS.contains(&t.as_str()) {
                bail!(
                    "no fuzz target named {t:?}; the targets are {}",
                    TARGETS.join(", ")
                );
            }
        }
        args.targets.iter().map(String::as_str).collect()
    };
    ensure_tools(sh)?;

    let root = workspace_root();
    // Outside the checkout, beside the kernel cache, so that fresh CI clones only rebuild
    // crucible's own crates, not every instrumented dependency.
    let build_dir = Cache::default_location().root().join("fuzz-target");
    eprintln!("==> fuzz: building in {}", build_dir.display());
    run_step(
        "fuzz build",
        cmd!(sh, "cargo +nightly fuzz build --target-dir {build_dir}"),
    )?;
    if args.build_only {
        return Ok(());
    }

    let scratch = root.join("target/fuzz");
    let mut results = Vec::new();
    for target in &targets {
        let stats = run_target(&root, &build_dir, &scratch, target, args.seconds)?;
        results.push((*target, stats));
    }

    eprintln!("==> fuzz: {} s per target, no crashes", args.seconds);
    eprintln!(
        "    {:<18} {:>12} {:>9} {:>8} {:>12} {:>8}",
        "target", "executions", "execs/s", "new", "corpus", "rss MB"
    );
    for (target, s) in &results {
        eprintln!(
            "    {:<18} {:>12} {:>9} {:>8} {:>12} {:>8}",
            target,
            s.executions,
            s.execs_per_sec,
            s.new_units,
            format!("{}/{}", s.corpus_units, s.corpus_size),
            s.peak_rss_mb
        );
    }
    Ok(())
}

/// Runs one target for `seconds`; fails with the crash artifact if it crashes.
fn run_target(
    root: &Path,
    build_dir: &Path,
    scratch: &Path,
    target: &str,
    seconds: u32,
) -> Result<Stats> {
    let corpus = scratch.join("corpus").join(target);
    let logs = scratch.join("logs");
    fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let log_path = logs.join(format!("{target}.log"));
    let mut log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;

    let seeds = root.join("fuzz/corpus").join(target);
    // why std::process::Command: libFuzzer's stderr is read line by line while it runs (the
    // log, the progress echo, the crash artifact), which xshell cannot do.
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root)
        .args(["+nightly", "fuzz", "run", "--target-dir"])
        .arg(build_dir)
        .arg(target)
        .arg(&corpus)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_S}"))
        .arg("-print_final_stats=1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    eprintln!(
        "==> fuzz {target}: {seconds} s (log: {})",
        log_path.display()
    );
    eprintln!("    {}", describe(&cmd));
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting `{}`", describe(&cmd)))?;
    let stderr = child.stderr.take().context("libFuzzer's stderr")?;

    let mut stats = Stats::default();
    let mut crash_artifact = None;
    let mut last_status = String::new();
    let mut last_echo = Instant::now();
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap_or_default();
        writeln!(log, "{line}").ok();
        parse_line(&line, &mut stats);
        if let Some(path) = line.split("Test unit written to ").nth(1) {
            crash_artifact = Some(path.trim().to_string());
        }
        if line.starts_with('#') && line.contains("exec/s") {
            last_status = line;
        }
        if last_echo.elapsed() >= PROGRESS_EVERY && !last_status.is_empty() {
            eprintln!("    [{:>4} s] {last_status}", started.elapsed().as_secs());
            last_echo = Instant::now();
        }
    }
    let status = child.wait().context("waiting for cargo fuzz")?;
    if !status.success() || crash_artifact.is_some() {
        let artifact = crash_artifact.unwrap_or_else(|| "(none written; see the log)".into());
        bail!(
            "fuzz target {target} failed ({status}) after {:.0?}\n    crash artifact: {artifact}\n    \
             log: {}\n    reproduce: cargo +nightly fuzz run {target} {artifact}",
            started.elapsed(),
            log_path.display()
        );
    }
    eprintln!(
        "    {target}: {} executions, {} execs/s, {} new inputs, corpus {}/{} in {:.0?}",
        stats.executions,
        stats.execs_per_sec,
        stats.new_units,
        stats.corpus_units,
        stats.corpus_size,
        started.elapsed()
    );
    Ok(stats)
}

/// Picks the figures out of libFuzzer's `-print_final_stats=1` block and its `DONE` line.
fn parse_line(line: &str, stats: &mut Stats) {
    let stat = |name: &str| {
        line.strip_prefix(name)
            .and_then(|rest| rest.trim().parse::<u64>().ok())
    };
    if let Some(n) = stat("stat::number_of_executed_units:") {
        stats.executions = n;
    } else if let Some(n) = stat("stat::average_exec_per_sec:") {
        stats.execs_per_sec = n;
    } else if let Some(n) = stat("stat::new_units_added:") {
        stats.new_units = n;
    } else if let Some(n) = stat("stat::peak_rss_mb:") {
        stats.peak_rss_mb = n;
    } else if line.starts_with('#') && line.contains("DONE") {
        // `#123456 DONE   cov: 812 ft: 2301 corp: 345/67Kb lim: 4096 exec/s: 2057 rss: 51Mb`
        if let Some(n) = line[1..]
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
        {
            stats.executions = stats.executions.max(n);
        }
        if let Some(corp) = line
            .split("corp: ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
        {
            if let Some((units, size)) = corp.split_once('/') {
                stats.corpus_units = units.parse().unwrap_or(0);
                stats.corpus_size = size.to_string();
            }
        }
    }
}

/// The nightly toolchain and cargo-fuzz, installed when missing (the provisioning step calls
/// it too).
pub(crate) fn ensure_tools(sh: &Shell) -> Result<()> {
    ensure_nightly(sh)?;
    ensure_cargo_fuzz(sh)
}

fn ensure_nightly(sh: &Shell) -> Result<()> {
    let have = succeeds_silently(cmd!(sh, "rustup run nightly rustc --version"));
    if !have {
        eprintln!(
            "==> the nightly toolchain is missing: installing it with rustup (cargo-fuzz needs it)"
        );
        run_step(
            "rustup toolchain install nightly",
            cmd!(sh, "rustup toolchain install nightly --profile minimal"),
        )?;
    }
    Ok(())
}

fn ensure_cargo_fuzz(sh: &Shell) -> Result<()> {
    let have = succeeds_silently(cmd!(sh, "cargo fuzz --version"));
    if !have {
        eprintln!("==> cargo-fuzz is missing: installing it (cargo install cargo-fuzz --locked)");
        run_step(
            "cargo install cargo-fuzz",
            cmd!(sh, "cargo install cargo-fuzz --locked"),
        )?;
    }
    Ok(())
}

/// Whether `cmd` starts and exits 0, its output thrown away.
fn succeeds_silently(cmd: xshell::Cmd<'_>) -> bool {
    cmd.quiet().ignore_stdout().ignore_stderr().run().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_libfuzzer_final_stats_and_done_line() {
        let mut stats = Stats::default();
        for line in [
            "#1048576\tpulse  cov: 700 ft: 2000 corp: 300/60Kb exec/s: 2000 rss: 50Mb",
            "#1234567\tDONE   cov: 812 ft: 2301 corp: 345/67Kb lim: 4096 exec/s: 2057 rss: 51Mb",
            "Done 1234567 runs in 601 second(s)",
            "stat::number_of_executed_units: 1234567",
            "stat::average_exec_per_sec:     2054",
            "stat::new_units_added:          45",
            "stat::slowest_unit_time_sec:    0",
            "stat::peak_rss_mb:              51",
        ] {
            parse_line(line, &mut stats);
        }
        assert_eq!(stats.executions, 1_234_567);
        assert_eq!(stats.execs_per_sec, 2054);
        assert_eq!(stats.new_units, 45);
        assert_eq!(stats.corpus_units, 345);
        assert_eq!(stats.corpus_size, "67Kb");
        assert_eq!(stats.peak_rss_mb, 51);
    }

    #[test]
    fn every_target_has_a_committed_seed_corpus() {
        let root = workspace_root();
        let manifest = fs::read_to_string(root.join("fuzz/Cargo.toml")).expect("fuzz/Cargo.toml");
        for target in TARGETS {
            assert!(
                manifest.contains(&format!("name = \"{target}\"")),
                "{target} not in fuzz/Cargo.toml"
            );
            let seeds = root.join("fuzz/corpus").join(target);
            let count = fs::read_dir(&seeds).map(|d| d.count()).unwrap_or(0);
            assert!(count > 0, "no seeds in {}", seeds.display());
        }
    }
}
