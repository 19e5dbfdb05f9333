//! The exec round trip of `true` through the Python and TypeScript SDKs. Each SDK's own bench
//! script (`sdks/python/bench/roundtrip.py`, `sdks/typescript/bench/roundtrip.ts`) alternates
//! an SDK call with the same request written by hand on a kept-alive socket, in one process and
//! against one sandbox, so that both halves see the same machine load and the same language
//! runtime; the difference of their medians is what the SDK adds.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::metrics::Plan;
use super::model::{Measurement, Row, Skipped, Unit};
use super::stats::{summarize, Runs};
use crate::util::{describe, output_within, run_step, workspace_root};

/// What an SDK's published goal allows it to add to a round trip, p50 (ms).
pub(crate) const OVERHEAD_GOAL_MS: f64 = 0.1;

/// One SDK and how its bench script runs.
#[derive(Clone, Copy)]
struct Sdk {
    /// The key's part: `sdk_<key>_…`.
    key: &'static str,
    /// For people.
    name: &'static str,
}

const PYTHON: Sdk = Sdk {
    key: "python",
    name: "Python SDK (sync client)",
};
const TYPESCRIPT: Sdk = Sdk {
    key: "typescript",
    name: "TypeScript SDK",
};

/// One run's samples, as the bench scripts write them.
#[derive(Deserialize)]
struct Samples {
    sdk: Vec<f64>,
    raw: Vec<f64>,
}

/// The rows of the SDK section.
pub(crate) fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for sdk in [PYTHON, TYPESCRIPT] {
        rows.push(Row {
            section: "SDKs".into(),
            metric: format!("sdk_{}_exec_rtt", sdk.key),
            peers: vec![format!("sdk_{}_raw_exec_rtt", sdk.key)],
            floor: None,
            // An interpreter's timings swing with the machine more than the suite's gated
            // figures do; the goal below judges the difference instead.
            gated: false,
        });
        rows.push(Row {
            section: "SDKs".into(),
            metric: format!("sdk_{}_overhead", sdk.key),
            peers: Vec::new(),
            floor: None,
            gated: false,
        });
    }
    rows
}

/// The goal's key and text for each SDK.
pub(crate) fn goals() -> Vec<(String, String)> {
    [PYTHON, TYPESCRIPT]
        .iter()
        .map(|sdk| {
            (
                format!("sdk_{}_overhead", sdk.key),
                format!(
                    "the {} adds ≤ {} ms p50 to an exec round trip (next to raw HTTP in the \
                     same process)",
                    sdk.name, OVERHEAD_GOAL_MS
                ),
            )
        })
        .collect()
}

/// Runs both SDKs' round trips against the daemon listening on `socket`.
pub(crate) fn measure(
    plan: &Plan,
    socket: &Path,
    measurements: &mut Vec<Measurement>,
    skipped: &mut Vec<Skipped>,
) -> Result<()> {
    let scratch = tempfile::tempdir().context("a scratch directory for the SDK samples")?;
    let root = workspace_root();
    let rounds = plan.execs.to_string();
    let warmup = (plan.execs / 10).max(20).to_string();

    let script = root.join("sdks/python/bench/roundtrip.py");
    let runs = repeat(plan.runs, plan.execs, scratch.path(), "python", |out| {
        let mut cmd = Command::new("python3");
        cmd.arg(&script)
            .arg("--host")
            .arg(socket)
            .args(["-n", &rounds, "--warmup", &warmup, "--samples-json"])
            .arg(out);
        cmd
    })?;
    push(
        measurements,
        PYTHON,
        runs,
        "python3 sdks/python/bench/roundtrip.py",
    );

    match typescript_bench(&root) {
        Ok(script) => {
            let runs = repeat(plan.runs, plan.execs, scratch.path(), "typescript", |out| {
                let mut cmd = Command::new("node");
                cmd.arg(&script)
                    .env("CRUCIBLE_HOST", socket)
                    .env("BENCH_ROUNDS", &rounds)
                    .env("BENCH_SAMPLES_JSON", out);
                cmd
            })?;
            push(
                measurements,
                TYPESCRIPT,
                runs,
                "node sdks/typescript/build/bench/roundtrip.js (`npm run bench`)",
            );
        }
        Err(reason) => skipped.push(Skipped {
            what: "TypeScript SDK round trip".into(),
            reason,
        }),
    }
    Ok(())
}

/// The compiled TypeScript bench, built (with its dependencies installed) when missing;
/// `Err` says why it cannot run here.
fn typescript_bench(root: &Path) -> Result<PathBuf, String> {
    let dir = root.join("sdks/typescript");
    let node = Command::new("node").arg("--version").output();
    let version = match node {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        _ => return Err("`node` is not on PATH (the TypeScript SDK needs Node ≥ 20)".into()),
    };
    let major = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    if major.is_none_or(|m| m < 20) {
        return Err(format!(
            "node {version} is too old (the TypeScript SDK needs ≥ 20)"
        ));
    }
    let build = |name: &str, args: &[&str]| -> Result<(), String> {
        let mut cmd = Command::new("npm");
        cmd.args(args).current_dir(&dir);
        run_step(name, &mut cmd).map_err(|e| format!("{e:#}"))
    };
    if !dir.join("node_modules").is_dir() {
        eprintln!("    the TypeScript SDK's dependencies are missing: installing them (npm ci)");
        build(
            "npm ci (sdks/typescript)",
            &["ci", "--no-audit", "--no-fund"],
        )?;
    }
    // Always rebuilt: a stale build would measure older code.
    build(
        "build the TypeScript bench",
        &["run", "--silent", "build:test"],
    )?;
    let script = dir.join("build/bench/roundtrip.js");
    if !script.is_file() {
        return Err(format!("the build wrote no {}", script.display()));
    }
    Ok(script)
}

/// `runs` runs of one bench script, each writing its samples to a file it is given.
fn repeat(
    runs: usize,
    rounds: usize,
    scratch: &Path,
    name: &str,
    command: impl Fn(&Path) -> Command,
) -> Result<Vec<Samples>> {
    // Two execs a round at a few ms each, plus the script's own start and sandbox: far more
    // than a run takes, and a bound on one that hangs.
    let limit = Duration::from_secs(120) + Duration::from_millis(20) * rounds as u32;
    let mut all = Vec::with_capacity(runs);
    for run in 0..runs {
        let out = scratch.join(format!("{name}-{run}.json"));
        let mut cmd = command(&out);
        let output = output_within(&mut cmd, limit)?;
        if !output.status.success() {
            bail!(
                "the {name} SDK's round-trip bench failed ({}): `{}`\n{}{}",
                output.status,
                describe(&cmd),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let text = std::fs::read_to_string(&out)
            .with_context(|| format!("`{}` wrote no {}", describe(&cmd), out.display()))?;
        let samples: Samples = serde_json::from_str(&text).with_context(|| {
            format!("the samples in {} are not what was expected", out.display())
        })?;
        if samples.sdk.is_empty() || samples.sdk.len() != samples.raw.len() {
            bail!(
                "{}: {} SDK samples and {} raw ones (they come in pairs)",
                out.display(),
                samples.sdk.len(),
                samples.raw.len()
            );
        }
        all.push(samples);
    }
    Ok(all)
}

/// The SDK's round trip, the raw one beside it, and the difference of their medians per run.
fn push(measurements: &mut Vec<Measurement>, sdk: Sdk, runs: Vec<Samples>, how: &str) {
    let mut ours = Runs::default();
    let mut raw = Runs::default();
    let mut overhead = Vec::with_capacity(runs.len());
    for run in runs {
        overhead.push(summarize(&run.sdk).p50 - summarize(&run.raw).p50);
        ours.push(run.sdk);
        raw.push(run.raw);
    }
    measurements.push(Measurement::latency(
        &format!("sdk_{}_exec_rtt", sdk.key),
        &format!("exec round trip of `true`, {}", sdk.name),
        "ours",
        &ours,
        &format!(
            "`sb.run([\"true\"])` on a warm sandbox over the daemon's Unix socket, its \
             connection kept alive; alternating with the raw request below ({how})"
        ),
    ));
    measurements.push(Measurement::latency(
        &format!("sdk_{}_raw_exec_rtt", sdk.key),
        &format!(
            "exec round trip of `true`, raw HTTP beside the {}",
            sdk.name
        ),
        &format!("raw HTTP ({})", sdk.key),
        &raw,
        "a prepared POST …/exec written by hand on a kept-alive socket of the same sandbox, \
         read to the chunked body's last chunk, in the same process: what any client must do",
    ));
    measurements.push(Measurement::scalar(
        &format!("sdk_{}_overhead", sdk.key),
        &format!("what the {} adds (p50 SDK − p50 raw)", sdk.name),
        "ours",
        Unit::Ms,
        &overhead,
        "per run, the SDK's median round trip minus the raw one's; the median over runs",
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sdk_has_a_row_pair_and_a_goal() {
        let rows = rows();
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().all(|r| !r.gated));
        let goals = goals();
        assert_eq!(goals.len(), 2);
        for (key, _) in &goals {
            assert!(rows.iter().any(|r| &r.metric == key), "{key} has no row");
        }
    }

    #[test]
    fn the_overhead_is_the_difference_of_medians() {
        let mut measurements = Vec::new();
        let runs = vec![
            Samples {
                sdk: vec![1.2, 1.3, 1.4],
                raw: vec![1.0, 1.1, 1.2],
            },
            Samples {
                sdk: vec![2.0, 2.0, 2.0],
                raw: vec![1.5, 1.5, 1.5],
            },
            Samples {
                sdk: vec![1.0, 1.0, 1.0],
                raw: vec![0.9, 0.9, 0.9],
            },
        ];
        push(&mut measurements, PYTHON, runs, "test");
        let overhead = measurements
            .iter()
            .find(|m| m.key == "sdk_python_overhead")
            .expect("an overhead measurement");
        // Per run: 0.2, 0.5, 0.1; the median is 0.2.
        assert!((overhead.value - 0.2).abs() < 1e-9, "{}", overhead.value);
        assert_eq!(measurements.len(), 3);
    }
}
