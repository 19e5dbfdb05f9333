//! What a benchmark run produces: measurements (ours and the peers'), the table rows that pair
//! them, the goals, and what was skipped. Serialized as `bench-results.json`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::stats::{Runs, Summary};

/// The unit of a measurement's headline value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Unit {
    /// Milliseconds (lower is better).
    Ms,
    /// GiB per second (higher is better).
    GibPerS,
    /// Operations per second (higher is better).
    PerS,
    /// MiB of memory (lower is better).
    Mib,
    /// A count of events, such as VM exits (lower is better).
    Count,
}

impl Unit {
    /// The suffix printed after a value.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Unit::Ms => "ms",
            Unit::GibPerS => "GiB/s",
            Unit::PerS => "/s",
            Unit::Mib => "MiB",
            Unit::Count => "",
        }
    }
}

/// Formats a value in its unit with sensible precision.
pub(crate) fn format_value(value: f64, unit: Unit) -> String {
    let digits = if value.abs() >= 100.0 {
        0
    } else if value.abs() >= 10.0 {
        1
    } else if value.abs() >= 1.0 {
        2
    } else {
        3
    };
    if unit == Unit::Count {
        return format!("{value:.0}");
    }
    format!("{value:.digits$} {}", unit.suffix())
}

/// One measured figure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Measurement {
    /// Stable key (`exec_rtt_api`); the gate and the baseline use it.
    pub key: String,
    /// What was measured, for people.
    pub label: String,
    /// Whether it is ours or which peer's.
    pub who: String,
    /// Unit of `value`.
    pub unit: Unit,
    /// The headline figure: the median over runs of each run's p50 (latencies) or of each run's
    /// rate (throughputs).
    pub value: f64,
    /// Percentiles (median over runs), for distributions.
    pub summary: Option<Summary>,
    /// How many runs the figure is the median of.
    pub runs: usize,
    /// How it was measured.
    pub note: String,
    /// Every sample, for the plots (not serialized).
    #[serde(skip)]
    pub samples: Vec<f64>,
}

impl Measurement {
    /// A latency distribution in milliseconds from repeated runs.
    pub(crate) fn latency(key: &str, label: &str, who: &str, runs: &Runs, note: &str) -> Self {
        let summary = runs.summary();
        Measurement {
            key: key.into(),
            label: label.into(),
            who: who.into(),
            unit: Unit::Ms,
            value: summary.p50,
            summary: Some(summary),
            runs: runs.summaries.len(),
            note: note.into(),
            samples: runs.samples.clone(),
        }
    }

    /// A single figure per run (a rate, a total time, a size): the median over runs.
    pub(crate) fn scalar(
        key: &str,
        label: &str,
        who: &str,
        unit: Unit,
        per_run: &[f64],
        note: &str,
    ) -> Self {
        Measurement {
            key: key.into(),
            label: label.into(),
            who: who.into(),
            unit,
            value: super::stats::median(per_run),
            summary: None,
            runs: per_run.len(),
            note: note.into(),
            samples: per_run.to_vec(),
        }
    }

    /// The cost of one unit of work, comparable between measurements of compatible units:
    /// milliseconds for times and rates, seconds per GiB for throughputs, MiB for memory.
    pub(crate) fn cost(&self) -> Option<(f64, &'static str)> {
        if !(self.value.is_finite() && self.value > 0.0) {
            return None;
        }
        Some(match self.unit {
            Unit::Ms => (self.value, "time"),
            Unit::PerS => (1000.0 / self.value, "time"),
            Unit::GibPerS => (1.0 / self.value, "throughput"),
            Unit::Mib => (self.value, "memory"),
            Unit::Count => (self.value, "count"),
        })
    }
}

/// How much more `ours` costs than `peer` (2.0 = twice as slow; 0.5 = twice as fast); `None`
/// when their units cannot be compared or either is missing a value.
pub(crate) fn cost_ratio(ours: &Measurement, peer: &Measurement) -> Option<f64> {
    let (a, ka) = ours.cost()?;
    let (b, kb) = peer.cost()?;
    (ka == kb).then_some(a / b)
}

/// One line of the results table: our metric, the peers it is compared with, and the floor its
/// gated ratio is taken against.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Row {
    /// Section heading the row is listed under.
    pub section: String,
    /// Key of our measurement.
    pub metric: String,
    /// Keys of the peers' measurements shown beside it.
    pub peers: Vec<String>,
    /// Key of the floor measurement its ratio is taken against.
    pub floor: Option<String>,
    /// Whether CI gates the ratio (only metrics `--quick` measures the same way are).
    pub gated: bool,
}

/// A published goal and whether this run meets it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Goal {
    /// The goal as published.
    pub goal: String,
    /// The figure measured for it.
    pub measured: String,
    /// `Some(true)` met, `Some(false)` missed, `None` not measurable here (with the reason in
    /// `measured`).
    pub met: Option<bool>,
}

/// Something that could not run, and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Skipped {
    /// The metric or peer.
    pub what: String,
    /// Why.
    pub reason: String,
}

/// The machine the run was on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Machine {
    /// CPU model.
    pub cpu: String,
    /// Logical CPUs available.
    pub cores: usize,
    /// `uname -r`.
    pub kernel: String,
    /// Total memory.
    pub memory_mib: u64,
    /// The KVM module in use, if any.
    pub kvm: String,
    /// cgroup version.
    pub cgroup: String,
}

/// A whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Results {
    /// The command line that produced it.
    pub command: String,
    /// `--quick` (small N and sizes).
    pub quick: bool,
    /// When it ran (Unix seconds).
    pub unix_time: u64,
    /// How long the whole run took.
    pub elapsed_s: f64,
    /// The machine.
    pub machine: Machine,
    /// Every measurement, ours and the peers'.
    pub measurements: Vec<Measurement>,
    /// The table.
    pub rows: Vec<Row>,
    /// The goals.
    pub goals: Vec<Goal>,
    /// What did not run.
    pub skipped: Vec<Skipped>,
}

impl Results {
    /// The measurement with this key.
    pub(crate) fn get(&self, key: &str) -> Option<&Measurement> {
        self.measurements.iter().find(|m| m.key == key)
    }

    /// Each gated metric's cost ratio to its floor.
    pub(crate) fn gate_ratios(&self) -> BTreeMap<String, f64> {
        let mut ratios = BTreeMap::new();
        for row in self.rows.iter().filter(|r| r.gated) {
            let Some(floor) = row.floor.as_deref() else {
                continue;
            };
            if let (Some(ours), Some(floor)) = (self.get(&row.metric), self.get(floor)) {
                if let Some(ratio) = cost_ratio(ours, floor) {
                    ratios.insert(row.metric.clone(), ratio);
                }
            }
        }
        ratios
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(unit: Unit, value: f64) -> Measurement {
        Measurement::scalar("k", "l", "ours", unit, &[value], "")
    }

    #[test]
    fn ratios_are_costs_whatever_the_unit() {
        assert_eq!(cost_ratio(&m(Unit::Ms, 2.0), &m(Unit::Ms, 0.5)), Some(4.0));
        // Half the throughput costs twice as much.
        assert_eq!(
            cost_ratio(&m(Unit::GibPerS, 1.0), &m(Unit::GibPerS, 2.0)),
            Some(2.0)
        );
        // 100 creates/s = 10 ms each, against a 1 ms floor.
        assert_eq!(
            cost_ratio(&m(Unit::PerS, 100.0), &m(Unit::Ms, 1.0)),
            Some(10.0)
        );
        assert_eq!(cost_ratio(&m(Unit::GibPerS, 1.0), &m(Unit::Ms, 1.0)), None);
        assert_eq!(cost_ratio(&m(Unit::Ms, 0.0), &m(Unit::Ms, 1.0)), None);
    }

    #[test]
    fn values_format_with_their_units() {
        assert_eq!(format_value(0.4567, Unit::Ms), "0.457 ms");
        assert_eq!(format_value(12.345, Unit::GibPerS), "12.3 GiB/s");
        assert_eq!(format_value(1234.4, Unit::PerS), "1234 /s");
    }
}
