//! The CI gate: each gated metric's cost ratio to its floor (measured in the same run) against
//! the committed `bench-baseline.json`. Absolute times are too noisy on shared machines to gate
//! on; ratios to a floor measured side by side are not. A ratio worse than `TOLERANCE` × its
//! baseline fails, naming the metric.
//!
//! Ratios are not portable between machines, though: the floors (a pipe, a socket pair, an
//! in-process echo) move with the CPU and the kernel far more than our multi-process paths do
//! (an Intel host's echo floor was 3 µs where an AMD host's was 70 µs, for the same 0.1 ms
//! echo of ours). So the baseline is kept per machine (its CPU model and core count), and a
//! machine with none recorded is gated against the most lenient ratio any recorded machine has.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// How much worse than its baseline a ratio may get before CI fails.
pub(crate) const TOLERANCE: f64 = 2.0;

/// `bench-baseline.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Baseline {
    /// How it is made and used.
    pub note: String,
    /// The command that writes (or adds) a machine's entry.
    pub command: String,
    /// Each machine's ratios, by [`machine_key`].
    pub machines: BTreeMap<String, MachineBaseline>,
}

/// One machine's baseline.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct MachineBaseline {
    /// How it was made: runs, kernel.
    pub note: String,
    /// Metric key → cost ratio to its floor (2.0 = twice the floor's cost), as `--quick`
    /// measures it (what CI runs): the median over several quick runs.
    pub ratios: BTreeMap<String, f64>,
    /// The same ratios from the full run, for reference (not gated: N and sizes differ).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub full_run_ratios: BTreeMap<String, f64>,
}

/// The name a machine's baseline is kept under: its CPU model, core count and kernel. The
/// kernel is part of it because the floors move with it as much as with the CPU (two hosts
/// both "AMD EPYC, 2 cores" had Unix-socket ping-pong floors of 70 and 11 µs on kernels 1045
/// and 1147 of the same series): a ratio recorded under one kernel does not gate another.
pub(crate) fn machine_key(cpu: &str, cores: usize, kernel: &str) -> String {
    format!("{cpu}, {cores} cores, kernel {kernel}")
}

impl Baseline {
    /// The ratios to gate machine `key` against, and a line saying where they come from: its
    /// own when recorded, else each metric's most lenient (largest) ratio over the recorded
    /// machines.
    pub(crate) fn for_machine(&self, key: &str) -> (BTreeMap<String, f64>, String) {
        if let Some(own) = self.machines.get(key) {
            return (own.ratios.clone(), format!("this machine's ({key})"));
        }
        let mut lenient: BTreeMap<String, f64> = BTreeMap::new();
        for machine in self.machines.values() {
            for (metric, &ratio) in &machine.ratios {
                let slot = lenient.entry(metric.clone()).or_insert(ratio);
                *slot = slot.max(ratio);
            }
        }
        let names: Vec<&str> = self.machines.keys().map(String::as_str).collect();
        (
            lenient,
            format!(
                "none recorded for this machine ({key}): each metric's most lenient ratio over \
                 {} (`cargo xtask bench --quick --update-baseline` records this one)",
                names.join("; ")
            ),
        )
    }
}

/// Each metric's median over several runs' ratios (metrics missing from a run are taken over
/// the runs that have them).
pub(crate) fn median_ratios(runs: &[BTreeMap<String, f64>]) -> BTreeMap<String, f64> {
    let mut all: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for run in runs {
        for (k, v) in run {
            all.entry(k.clone()).or_default().push(*v);
        }
    }
    all.into_iter()
        .map(|(k, v)| (k, super::stats::median(&v)))
        .collect()
}

/// One metric's verdict.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verdict {
    /// The metric.
    pub metric: String,
    /// Its baseline ratio.
    pub baseline: f64,
    /// This run's ratio, `None` when it was not measured.
    pub current: Option<f64>,
}

impl Verdict {
    /// How many times worse than the baseline (`None` if not measured).
    pub(crate) fn factor(&self) -> Option<f64> {
        self.current.map(|c| c / self.baseline)
    }

    /// Whether it passes.
    pub(crate) fn ok(&self, tolerance: f64) -> bool {
        self.factor().is_some_and(|f| f <= tolerance)
    }

    /// One line for the log.
    pub(crate) fn describe(&self, tolerance: f64) -> String {
        match self.current {
            None => format!(
                "{}: not measured in this run (baseline ratio {:.2}×)",
                self.metric, self.baseline
            ),
            Some(c) => format!(
                "{}: {:.2}× its floor, baseline {:.2}× → {:.2}× the baseline ({}, limit {tolerance}×)",
                self.metric,
                c,
                self.baseline,
                c / self.baseline,
                if self.ok(tolerance) { "ok" } else { "FAIL" },
            ),
        }
    }
}

/// Compares this run's ratios with the baseline's: one verdict per baseline metric (metrics new
/// in this run are not gated until the baseline is updated).
pub(crate) fn compare(
    baseline: &BTreeMap<String, f64>,
    current: &BTreeMap<String, f64>,
) -> Vec<Verdict> {
    baseline
        .iter()
        .filter(|(_, &b)| b.is_finite() && b > 0.0)
        .map(|(metric, &b)| Verdict {
            metric: metric.clone(),
            baseline: b,
            current: current.get(metric).copied().filter(|c| c.is_finite()),
        })
        .collect()
}

/// Keeps only the baseline metrics `current` has a ratio for (or tried to: a NaN still fails),
/// for a gate over part of the suite; returns how many are left.
pub(crate) fn measured_only(
    baseline: &mut BTreeMap<String, f64>,
    current: &BTreeMap<String, f64>,
) -> usize {
    baseline.retain(|metric, _| current.contains_key(metric));
    baseline.len()
}

/// The failing verdicts.
pub(crate) fn failures(verdicts: &[Verdict], tolerance: f64) -> Vec<&Verdict> {
    verdicts.iter().filter(|v| !v.ok(tolerance)).collect()
}

/// How many times a failing gate re-measures before it fails CI. A real regression fails every
/// measurement; a burst of load on a shared 2-core machine has been seen to hit the same metric
/// twice in a row (`create_concurrent_1`, `echo_rtt`), never three times.
pub(crate) const CONFIRMATIONS: usize = 2;

/// The metrics that fail in every one of `runs` (a run and its confirmation runs), in the
/// order of the first run.
pub(crate) fn confirmed(runs: &[Vec<Verdict>], tolerance: f64) -> Vec<String> {
    let Some((first, rest)) = runs.split_first() else {
        return Vec::new();
    };
    failures(first, tolerance)
        .iter()
        .filter(|v| {
            rest.iter().all(|run| {
                failures(run, tolerance)
                    .iter()
                    .any(|again| again.metric == v.metric)
            })
        })
        .map(|v| v.metric.clone())
        .collect()
}

/// Reads the baseline.
pub(crate) fn read(path: &Path) -> Result<Baseline> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading {} (write one with `cargo xtask bench --update-baseline`)",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Writes the baseline.
pub(crate) fn write(path: &Path, baseline: &Baseline) -> Result<()> {
    let mut text = serde_json::to_string_pretty(baseline).context("serializing the baseline")?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn within_tolerance_passes() {
        let base = map(&[("exec_rtt_api", 2.0), ("stdout_throughput", 1.5)]);
        let now = map(&[("exec_rtt_api", 3.9), ("stdout_throughput", 0.5)]);
        let verdicts = compare(&base, &now);
        assert!(failures(&verdicts, TOLERANCE).is_empty());
    }

    #[test]
    fn a_ratio_past_twice_its_baseline_fails_by_name() {
        let base = map(&[("exec_rtt_api", 2.0), ("create_ready", 10.0)]);
        let now = map(&[("exec_rtt_api", 4.2), ("create_ready", 10.0)]);
        let verdicts = compare(&base, &now);
        let failed = failures(&verdicts, TOLERANCE);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].metric, "exec_rtt_api");
        assert!(failed[0].describe(TOLERANCE).contains("exec_rtt_api"));
        assert!(failed[0].describe(TOLERANCE).contains("FAIL"));
    }

    #[test]
    fn a_gate_over_part_of_the_suite_judges_what_it_measured() {
        let mut baseline: BTreeMap<String, f64> =
            [("exec".to_string(), 2.0), ("create".to_string(), 3.0)].into();
        let current: BTreeMap<String, f64> =
            [("exec".to_string(), f64::NAN), ("new".to_string(), 1.0)].into();
        assert_eq!(measured_only(&mut baseline, &current), 1);
        let verdicts = compare(&baseline, &current);
        assert_eq!(verdicts.len(), 1);
        assert_eq!(verdicts[0].metric, "exec");
        assert!(
            !verdicts[0].ok(TOLERANCE),
            "a metric that came out NaN still fails"
        );
    }

    #[test]
    fn a_metric_missing_from_the_run_fails_and_new_ones_are_not_gated() {
        let base = map(&[("echo_rtt", 3.0)]);
        let now = map(&[("brand_new", 100.0)]);
        let verdicts = compare(&base, &now);
        assert_eq!(verdicts.len(), 1);
        assert_eq!(verdicts[0].current, None);
        assert_eq!(failures(&verdicts, TOLERANCE).len(), 1);
    }

    #[test]
    fn nonsense_baselines_are_ignored_and_nonsense_results_fail() {
        let base = map(&[("a", 0.0), ("b", f64::NAN), ("c", 1.0)]);
        let now = map(&[("a", 5.0), ("b", 5.0), ("c", f64::INFINITY)]);
        let verdicts = compare(&base, &now);
        assert_eq!(verdicts.len(), 1);
        assert!(!verdicts[0].ok(TOLERANCE));
    }

    #[test]
    fn only_failures_that_repeat_are_confirmed() {
        let base = map(&[("a", 1.0), ("b", 1.0), ("c", 1.0)]);
        let first = compare(&base, &map(&[("a", 3.0), ("b", 3.0), ("c", 1.0)]));
        let second = compare(&base, &map(&[("a", 5.0), ("b", 1.5), ("c", 3.0)]));
        let third = compare(&base, &map(&[("a", 2.5), ("b", 9.0), ("c", 1.0)]));
        assert_eq!(
            confirmed(&[first.clone(), second.clone()], TOLERANCE),
            vec!["a".to_string()]
        );
        assert_eq!(
            confirmed(&[first.clone(), second.clone(), third], TOLERANCE),
            vec!["a".to_string()]
        );
        let clean = compare(&base, &base);
        assert!(confirmed(&[second, clean], TOLERANCE).is_empty());
        assert_eq!(confirmed(&[first], TOLERANCE).len(), 2);
        assert!(confirmed(&[], TOLERANCE).is_empty());
    }

    #[test]
    fn baseline_ratios_are_medians_over_runs() {
        let runs = [
            map(&[("a", 1.0), ("b", 9.0)]),
            map(&[("a", 3.0)]),
            map(&[("a", 2.0), ("b", 7.0)]),
        ];
        assert_eq!(median_ratios(&runs), map(&[("a", 2.0), ("b", 7.0)]));
    }

    #[test]
    fn a_machine_is_gated_against_its_own_baseline_else_the_most_lenient() {
        let machine = |ratios: &[(&str, f64)]| MachineBaseline {
            note: String::new(),
            ratios: map(ratios),
            full_run_ratios: BTreeMap::new(),
        };
        let baseline = Baseline {
            note: String::new(),
            command: String::new(),
            machines: BTreeMap::from([
                (
                    machine_key("AMD EPYC", 2, "6.1"),
                    machine(&[("echo_rtt", 2.4), ("upload", 9.0)]),
                ),
                (
                    machine_key("Intel(R) Xeon(R) Processor", 2, "6.2"),
                    machine(&[("echo_rtt", 38.0), ("upload", 5.0), ("new", 1.0)]),
                ),
            ]),
        };
        let (own, why) = baseline.for_machine("AMD EPYC, 2 cores, kernel 6.1");
        assert_eq!(own, map(&[("echo_rtt", 2.4), ("upload", 9.0)]));
        assert!(why.contains("this machine's"), "{why}");
        let (lenient, why) = baseline.for_machine("AMD EPYC, 2 cores, kernel 6.3");
        assert_eq!(
            lenient,
            map(&[("echo_rtt", 38.0), ("new", 1.0), ("upload", 9.0)])
        );
        assert!(
            why.contains("kernel 6.3") && why.contains("AMD EPYC, 2 cores, kernel 6.1"),
            "{why}"
        );
    }

    #[test]
    fn baselines_round_trip() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("b.json");
        let baseline = Baseline {
            note: "n".into(),
            command: "c".into(),
            machines: BTreeMap::from([(
                machine_key("cpu", 2, "6.1"),
                MachineBaseline {
                    note: "m".into(),
                    ratios: map(&[("x", 1.25)]),
                    full_run_ratios: BTreeMap::new(),
                },
            )]),
        };
        write(&path, &baseline)?;
        assert_eq!(read(&path)?, baseline);
        Ok(())
    }
}
