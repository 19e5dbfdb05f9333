//! Samples, percentiles, and the median of repeated runs.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Percentiles of one set of samples (nearest-rank).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Summary {
    /// Samples per run.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

/// The `q`-quantile (0..=1) of sorted samples, nearest-rank; 0 for no samples.
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarizes samples (in any order).
pub(crate) fn summarize(samples: &[f64]) -> Summary {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    Summary {
        n: sorted.len(),
        p50: quantile(&sorted, 0.5),
        p99: quantile(&sorted, 0.99),
        max: sorted.last().copied().unwrap_or(0.0),
    }
}

/// The median of values (the lower middle for an even count); 0 for none.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    quantile(&sorted, 0.5)
}

/// Combines the summaries of repeated runs: each statistic is the median over the runs.
pub(crate) fn median_of_runs(runs: &[Summary]) -> Summary {
    let pick = |f: fn(&Summary) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    Summary {
        n: runs.first().map_or(0, |r| r.n),
        p50: pick(|s| s.p50),
        p99: pick(|s| s.p99),
        max: pick(|s| s.max),
    }
}

/// A duration in milliseconds.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Repeated runs of one measurement: the per-run summaries and every sample (for plots).
#[derive(Debug, Clone, Default)]
pub(crate) struct Runs {
    /// One summary per run.
    pub summaries: Vec<Summary>,
    /// Every sample of every run.
    pub samples: Vec<f64>,
}

impl Runs {
    /// Adds one run's samples.
    pub(crate) fn push(&mut self, samples: Vec<f64>) {
        self.summaries.push(summarize(&samples));
        self.samples.extend(samples);
    }

    /// The median over the runs.
    pub(crate) fn summary(&self) -> Summary {
        median_of_runs(&self.summaries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = summarize(&samples);
        assert_eq!((s.n, s.p50, s.p99, s.max), (100, 50.0, 99.0, 100.0));
        let s = summarize(&[3.0, 1.0, 2.0]);
        assert_eq!((s.p50, s.p99, s.max), (2.0, 3.0, 3.0));
        assert_eq!(summarize(&[]).p50, 0.0);
    }

    #[test]
    fn runs_combine_by_median() {
        let mut runs = Runs::default();
        runs.push(vec![1.0, 1.0, 10.0]);
        runs.push(vec![2.0, 2.0, 2.0]);
        runs.push(vec![3.0, 3.0, 3.0]);
        let s = runs.summary();
        assert_eq!((s.n, s.p50, s.max), (3, 2.0, 3.0));
        assert_eq!(runs.samples.len(), 9);
    }
}
