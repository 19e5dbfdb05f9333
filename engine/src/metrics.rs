//! Prometheus metrics, kept in atomics so the hot paths pay one relaxed add.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::sandbox::Registry;

/// Upper bounds (seconds) of the exec latency histogram buckets.
const LATENCY_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// A latency histogram over [`LATENCY_BUCKETS`], in atomics.
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one duration.
    pub(crate) fn observe(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            if secs <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }

    /// Appends its exposition as `name` (in seconds), with `help`.
    pub(crate) fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// The daemon's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Sandboxes created.
    pub(crate) sandboxes_created: AtomicU64,
    /// Sandbox creations that failed.
    pub(crate) sandboxes_failed: AtomicU64,
    /// Execs started (all transports).
    pub(crate) execs_started: AtomicU64,
    /// Execs whose agent was lost (synthesized exit frame).
    pub(crate) execs_lost: AtomicU64,
    /// Frame bytes relayed from agents to clients.
    pub(crate) bytes_streamed: AtomicU64,
    /// Stdin frame bytes relayed from interactive clients to agents.
    pub(crate) bytes_stdin: AtomicU64,
    /// Connections refused at the connection cap.
    pub connections_refused: AtomicU64,
    /// Bytes uploaded into sandboxes.
    pub bytes_uploaded: AtomicU64,
    /// Bytes downloaded from sandboxes.
    pub bytes_downloaded: AtomicU64,
    /// Egress through every sandbox's proxy (each sandbox's counters add to these).
    pub(crate) egress: std::sync::Arc<crate::egress::EgressCounters>,
    exec_latency: Histogram,
    errors: Mutex<BTreeMap<u16, u64>>,
}

impl Metrics {
    /// Records one finished exec's duration (request to exit frame).
    pub(crate) fn observe_exec(&self, elapsed: Duration) {
        self.exec_latency.observe(elapsed);
    }

    /// Records an error response.
    pub fn observe_error(&self, status: u16) {
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        *errors.entry(status).or_default() += 1;
    }

    /// The Prometheus text exposition.
    pub fn render(&self, registry: &Registry, caller: &crate::owner::Caller) -> String {
        let mut out = String::new();
        render_states(&mut out, registry);
        self.render_egress(&mut out, registry, caller);
        let counters: [(&str, &str, &AtomicU64); 10] = [
            (
                "crucible_sandboxes_created_total",
                "Sandboxes created.",
                &self.sandboxes_created,
            ),
            (
                "crucible_sandbox_create_failures_total",
                "Sandbox creations that failed.",
                &self.sandboxes_failed,
            ),
            (
                "crucible_sandboxes_died_total",
                "Sandboxes that died unexpectedly.",
                &registry.died,
            ),
            (
                "crucible_execs_total",
                "Execs started.",
                &self.execs_started,
            ),
            (
                "crucible_execs_lost_total",
                "Execs whose agent was lost mid-stream.",
                &self.execs_lost,
            ),
            (
                "crucible_stream_bytes_total",
                "Frame bytes relayed to clients.",
                &self.bytes_streamed,
            ),
            (
                "crucible_stdin_bytes_total",
                "Stdin frame bytes relayed from interactive clients to agents.",
                &self.bytes_stdin,
            ),
            (
                "crucible_connections_refused_total",
                "Connections answered 503 at the --max-connections cap.",
                &self.connections_refused,
            ),
            (
                "crucible_upload_bytes_total",
                "Bytes uploaded into sandboxes.",
                &self.bytes_uploaded,
            ),
            (
                "crucible_download_bytes_total",
                "Bytes downloaded from sandboxes.",
                &self.bytes_downloaded,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
        self.exec_latency.render(
            &mut out,
            "crucible_exec_duration_seconds",
            "Exec duration, request to exit frame.",
        );
        let _ = writeln!(
            out,
            "# HELP crucible_http_errors_total Error responses by status.\n# TYPE crucible_http_errors_total counter"
        );
        let errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        for (status, n) in errors.iter() {
            let _ = writeln!(out, "crucible_http_errors_total{{status=\"{status}\"}} {n}");
        }
        out
    }

    /// The egress counters: the daemon's totals, and each live sandbox's of the caller's only
    /// (a label naming another key's sandbox would tell this key it exists).
    fn render_egress(&self, out: &mut String, registry: &Registry, caller: &crate::owner::Caller) {
        let sandboxes = registry.list();
        let egress: Vec<_> = sandboxes
            .iter()
            .filter(|s| caller.may_use(s.owner()))
            .filter_map(|s| s.network().map(|n| (s, n.counters.snapshot())))
            .collect();
        let daemon = self.egress.snapshot();
        type Pick = fn(&crate::egress::EgressStats) -> u64;
        let series: [(&str, &str, Pick); 4] = [
            ("connections", "Egress connections made", |s| s.connections),
            ("denied", "Egress connections refused", |s| s.denied),
            (
                "bytes_out",
                "Bytes sandboxes sent through the egress proxy",
                |s| s.bytes_out,
            ),
            (
                "bytes_in",
                "Bytes sandboxes received through the egress proxy",
                |s| s.bytes_in,
            ),
        ];
        for (what, help, pick) in series {
            let name = format!("crucible_egress_{what}_total");
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", pick(&daemon));
            let name = format!("crucible_sandbox_egress_{what}_total");
            let _ = writeln!(
                out,
                "# HELP {name} {help}, per live sandbox of the caller's.\n# TYPE {name} counter"
            );
            for (sandbox, stats) in &egress {
                let _ = writeln!(out, "{name}{{sandbox=\"{}\"}} {}", sandbox.id, pick(stats));
            }
        }
    }
}

/// Sandboxes by state.
fn render_states(out: &mut String, registry: &Registry) {
    let _ = writeln!(
        out,
        "# HELP crucible_sandboxes Sandboxes by state.\n# TYPE crucible_sandboxes gauge"
    );
    for (state, n) in registry.count_by_state() {
        let state = serde_json::to_value(state)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let _ = writeln!(out, "crucible_sandboxes{{state=\"{state}\"}} {n}");
    }
}
