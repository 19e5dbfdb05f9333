//! A sandbox's egress counters, updated as bytes are relayed (not when a connection ends), so
//! a long download shows progress.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters for one sandbox's egress, shared by all its proxied connections; each count
/// also goes to the daemon-wide counters it was made with, which never go down as sandboxes
/// come and go.
#[derive(Debug, Default)]
pub struct EgressCounters {
    connections: AtomicU64,
    denied: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    daemon: Option<std::sync::Arc<EgressCounters>>,
}

/// A reading of [`EgressCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EgressStats {
    /// Connections allowed and connected to their target.
    pub connections: u64,
    /// Connections refused by the policy (a target no rule names, or a refused address).
    pub denied: u64,
    /// Bytes sent from the sandbox to remote hosts.
    pub bytes_out: u64,
    /// Bytes received from remote hosts for the sandbox.
    pub bytes_in: u64,
}

impl EgressCounters {
    /// A sandbox's counters, adding to `daemon`'s as well.
    pub fn for_sandbox(daemon: std::sync::Arc<EgressCounters>) -> Self {
        EgressCounters {
            daemon: Some(daemon),
            ..EgressCounters::default()
        }
    }

    /// What was counted so far.
    pub fn snapshot(&self) -> EgressStats {
        EgressStats {
            connections: self.connections.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn add_connection(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
        if let Some(daemon) = &self.daemon {
            daemon.add_connection();
        }
    }

    pub(crate) fn add_denied(&self) {
        self.denied.fetch_add(1, Ordering::Relaxed);
        if let Some(daemon) = &self.daemon {
            daemon.add_denied();
        }
    }

    pub(crate) fn add_bytes_out(&self, n: u64) {
        self.bytes_out.fetch_add(n, Ordering::Relaxed);
        if let Some(daemon) = &self.daemon {
            daemon.add_bytes_out(n);
        }
    }

    pub(crate) fn add_bytes_in(&self, n: u64) {
        self.bytes_in.fetch_add(n, Ordering::Relaxed);
        if let Some(daemon) = &self.daemon {
            daemon.add_bytes_in(n);
        }
    }
}
