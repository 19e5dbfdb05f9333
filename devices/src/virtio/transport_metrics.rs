//! Counters of a guest driver's virtio-mmio protocol violations, one set per transport. A
//! violation is never silent: it is counted here, and the first [`LOG_LIMIT`] of each transport
//! are logged on stderr with what the driver wrote (after that only counted, so a hostile guest
//! cannot flood the log). The VMM reads the counters when the VM ends (`crucible-vmm` prints
//! them and writes them with `--metrics FILE`). Atomics, so reading them never waits on a vCPU
//! that holds the transport.

use std::sync::atomic::{AtomicU64, Ordering};

/// Violations logged per transport; later ones are only counted.
pub const LOG_LIMIT: u64 = 16;

/// One kind of driver protocol violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A `Status` write the state machine does not allow (`super::device_status`); the status
    /// is unchanged.
    InvalidStatusTransition,
    /// A `DriverFeatures` write outside feature negotiation (before `DRIVER`, after
    /// `FEATURES_OK`, or after a failure); ignored.
    FeatureWriteOutOfPhase,
    /// Feature bits the device does not offer; dropped, the rest is kept.
    UnofferedFeatures,
    /// A queue register write outside `FEATURES_OK`..`DRIVER_OK`; ignored.
    QueueWriteOutOfPhase,
    /// A queue register write that cannot apply: no such queue, a size that is not a power of
    /// two up to the maximum, a misaligned ring address, or `QueueReady` with rings outside
    /// guest memory.
    BadQueueConfig,
    /// `QueueNotify` of a queue that does not exist (valid ones never reach the transport under
    /// KVM: their ioeventfd takes them).
    BadNotify,
    /// A config-space write before `DRIVER` or after a failure; ignored.
    ConfigWriteOutOfPhase,
    /// A register access that is not an aligned 32-bit access to a register that exists and
    /// takes that direction (writes to read-only registers, unknown offsets, `InterruptACK` of
    /// undefined bits); reads as 0, writes are ignored.
    BadRegisterAccess,
}

impl Violation {
    /// Every kind, in the order of the metrics output.
    pub const ALL: [Violation; 8] = [
        Violation::InvalidStatusTransition,
        Violation::FeatureWriteOutOfPhase,
        Violation::UnofferedFeatures,
        Violation::QueueWriteOutOfPhase,
        Violation::BadQueueConfig,
        Violation::BadNotify,
        Violation::ConfigWriteOutOfPhase,
        Violation::BadRegisterAccess,
    ];

    /// The counter's name in the metrics output.
    pub fn name(self) -> &'static str {
        match self {
            Violation::InvalidStatusTransition => "invalid_status_transitions",
            Violation::FeatureWriteOutOfPhase => "feature_writes_out_of_phase",
            Violation::UnofferedFeatures => "unoffered_features",
            Violation::QueueWriteOutOfPhase => "queue_writes_out_of_phase",
            Violation::BadQueueConfig => "bad_queue_configs",
            Violation::BadNotify => "bad_notifies",
            Violation::ConfigWriteOutOfPhase => "config_writes_out_of_phase",
            Violation::BadRegisterAccess => "bad_register_accesses",
        }
    }
}

/// The counters of one transport.
#[derive(Debug)]
pub struct TransportMetrics {
    label: String,
    violations: [AtomicU64; Violation::ALL.len()],
    activation_failures: AtomicU64,
    logged: AtomicU64,
}

impl TransportMetrics {
    /// Counters for the transport named `label` in log lines (`virtio-block@0xd0001000`).
    pub fn new(label: impl Into<String>) -> Self {
        TransportMetrics {
            label: label.into(),
            violations: Default::default(),
            activation_failures: AtomicU64::new(0),
            logged: AtomicU64::new(0),
        }
    }

    /// The transport's name.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Counts a violation and logs it while under [`LOG_LIMIT`]. `detail` says what the driver
    /// did, with the values it wrote.
    pub fn record(&self, kind: Violation, detail: std::fmt::Arguments<'_>) {
        self.violations[kind as usize].fetch_add(1, Ordering::Relaxed);
        self.log(format_args!(
            "driver protocol violation ({}): {detail}",
            kind.name()
        ));
    }

    /// Counts a device that could not be activated (it got `DEVICE_NEEDS_RESET`) and logs why.
    pub fn record_activation_failure(&self, why: &dyn std::error::Error) {
        self.activation_failures.fetch_add(1, Ordering::Relaxed);
        self.log(format_args!("cannot activate the device: {why}"));
    }

    fn log(&self, what: std::fmt::Arguments<'_>) {
        let n = self.logged.fetch_add(1, Ordering::Relaxed);
        if n < LOG_LIMIT {
            eprintln!("crucible-vmm: {}: {what}", self.label);
        } else if n == LOG_LIMIT {
            eprintln!(
                "crucible-vmm: {}: more than {LOG_LIMIT} driver errors: further ones are only \
                 counted (see the metrics when the VM ends)",
                self.label
            );
        }
    }

    /// How many violations of `kind` happened.
    pub fn count(&self, kind: Violation) -> u64 {
        self.violations[kind as usize].load(Ordering::Relaxed)
    }

    /// All violations together.
    pub fn violations(&self) -> u64 {
        Violation::ALL.iter().map(|&k| self.count(k)).sum()
    }

    /// How many times activation failed.
    pub fn activation_failures(&self) -> u64 {
        self.activation_failures.load(Ordering::Relaxed)
    }

    /// How many log lines were written (the suppression notice included).
    pub fn logged_lines(&self) -> u64 {
        self.logged.load(Ordering::Relaxed).min(LOG_LIMIT + 1)
    }

    /// Every counter by name: the violations in [`Violation::ALL`] order, then
    /// `activation_failures`.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        Violation::ALL
            .iter()
            .map(|&k| (k.name(), self.count(k)))
            .chain([("activation_failures", self.activation_failures())])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_own_counter_and_a_distinct_name() {
        let m = TransportMetrics::new("virtio-test");
        for (i, &k) in Violation::ALL.iter().enumerate() {
            for _ in 0..=i {
                m.record(k, format_args!("test"));
            }
        }
        for (i, &k) in Violation::ALL.iter().enumerate() {
            assert_eq!(m.count(k), i as u64 + 1, "{}", k.name());
        }
        assert_eq!(m.violations(), (1..=8).sum::<u64>());
        let names: std::collections::HashSet<_> = m.snapshot().iter().map(|p| p.0).collect();
        assert_eq!(names.len(), Violation::ALL.len() + 1);
        assert_eq!(m.snapshot().last(), Some(&("activation_failures", 0)));
    }

    #[test]
    fn logging_stops_at_the_limit_but_counting_does_not() {
        let m = TransportMetrics::new("virtio-test");
        for _ in 0..LOG_LIMIT * 3 {
            m.record(Violation::BadNotify, format_args!("queue 7"));
        }
        assert_eq!(m.count(Violation::BadNotify), LOG_LIMIT * 3);
        // LOG_LIMIT lines, then one notice that the rest are only counted.
        assert_eq!(m.logged_lines(), LOG_LIMIT + 1);
    }

    #[test]
    fn activation_failures_are_counted_apart_from_violations() {
        let m = TransportMetrics::new("virtio-test");
        let why = std::io::Error::other("queue 0 is not ready or not valid");
        m.record_activation_failure(&why);
        assert_eq!(m.activation_failures(), 1);
        assert_eq!(m.violations(), 0);
        assert_eq!(m.logged_lines(), 1);
    }
}
