//! Egress as the engine sees it: a sandbox has no network; its agent serves an HTTP proxy on
//! the sandbox's loopback and hands each accepted connection to the daemon, which serves the
//! proxy protocol under the sandbox's allowlist. That proxy is the `egress` crate; the engine
//! knows it only through [`EgressProxy`]: a create request's rules are checked once
//! ([`EgressProxy::plan`]), and the plan makes the [`EgressSink`] a backend hands each
//! connection to once the sandbox has its id. The engine keeps the counters a sandbox's
//! connections update ([`EgressCounters`]), shown in its info and the daemon's metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::UnixStream;

/// Takes each connection a sandbox's egress proxy accepts (the daemon then serves the proxy
/// protocol on it).
pub type EgressSink = Arc<dyn Fn(EgressStream) + Send + Sync>;

/// One proxied connection, as a backend receives it.
#[derive(Debug)]
pub enum EgressStream {
    /// The sandbox's own TCP connection to its proxy address, handed over by its agent.
    Tcp(tokio::net::TcpStream),
    /// A stream carrying it (a vsock connection arriving on a Unix socket).
    Unix(UnixStream),
}

/// A sandbox's checked egress rules, waiting for its id: called once, with the sandbox's id
/// and its counters, it gives the sink its connections go to.
pub type EgressPlan = Box<dyn FnOnce(&str, Arc<EgressCounters>) -> EgressSink + Send>;

/// Why a create request's rules were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressRefused {
    /// A rule is malformed; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// A rule reaches beyond the operator's allowlist (or no egress is allowed at all).
    #[error("{0}")]
    Forbidden(String),
}

pub use namespace::netns::PodSockets;

/// The egress proxy the engine calls.
pub trait EgressProxy: Send + Sync + std::fmt::Debug {
    /// Checks a create request's `network.allow` against the operator's rules, once; the plan
    /// makes the sandbox's sink when it has an id.
    fn plan(&self, allow: &[String]) -> Result<EgressPlan, EgressRefused>;

    /// The egress of a microVM pod: every connection leaves from the pod's network namespace
    /// (sockets from `pod`), with no allowlist of crucible's, since the pod's network, as CNI
    /// made it, decides what it reaches (as for a runc pod).
    fn plan_in_pod(&self, pod: Arc<PodSockets>) -> Result<EgressPlan, EgressRefused> {
        Err(EgressRefused::Forbidden(format!(
            "network_namespace {}: this daemon serves no egress proxy to carry a microVM \
             pod's connections",
            pod.path().display()
        )))
    }
}

/// No egress at all: every request for network is refused (a daemon built without the
/// proxy, or a test that needs none).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NoEgress;

impl EgressProxy for NoEgress {
    fn plan(&self, _allow: &[String]) -> Result<EgressPlan, EgressRefused> {
        Err(EgressRefused::Forbidden(
            "this daemon serves no egress proxy".into(),
        ))
    }
}

/// How many distinct refused destinations a sandbox's egress keeps, with their reasons (the
/// first ones refused; later new ones are counted in `denied` alone).
pub const MAX_REFUSED_DESTINATIONS: usize = 32;
/// Longest reason kept for a refused destination, in bytes (cut on a character boundary).
pub const MAX_REFUSAL_REASON: usize = 512;

/// Live counters for one sandbox's egress, shared by all its proxied connections; each count
/// also goes to the daemon-wide counters it was made with, which never go down as sandboxes
/// come and go. A sandbox's also keep which destinations were refused and why, bounded.
#[derive(Debug, Default)]
pub struct EgressCounters {
    connections: AtomicU64,
    denied: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    refused: Mutex<Vec<RefusedDestination>>,
    daemon: Option<std::sync::Arc<EgressCounters>>,
}

/// A destination the sandbox's egress refused, with the latest reason and how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedDestination {
    /// `host:port` as the sandbox asked for it.
    pub destination: String,
    /// Why, as the sandbox's client was told.
    pub reason: String,
    /// How many connections to it were refused.
    pub count: u64,
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
    pub(crate) fn for_sandbox(daemon: std::sync::Arc<EgressCounters>) -> Self {
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

    pub fn add_connection(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
        if let Some(daemon) = &self.daemon {
            daemon.add_connection();
        }
    }

    pub fn add_denied(&self) {
        self.denied.fetch_add(1, Ordering::Relaxed);
        if let Some(daemon) = &self.daemon {
            daemon.add_denied();
        }
    }

    /// Counts a refused connection to `destination` and keeps why (see
    /// [`MAX_REFUSED_DESTINATIONS`]).
    pub fn add_refusal(&self, destination: &str, reason: &str) {
        self.add_denied();
        let reason = cut(reason, MAX_REFUSAL_REASON);
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = refused.iter_mut().find(|r| r.destination == destination) {
            known.count += 1;
            if known.reason != reason {
                known.reason = reason.to_string();
            }
        } else if refused.len() < MAX_REFUSED_DESTINATIONS {
            refused.push(RefusedDestination {
                destination: cut(destination, MAX_REFUSAL_REASON).to_string(),
                reason: reason.to_string(),
                count: 1,
            });
        }
    }

    /// The destinations refused so far, in the order first refused.
    pub fn refused(&self) -> Vec<RefusedDestination> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn add_bytes_out(&self, n: u64) {
        self.bytes_out.fetch_add(n, Ordering::Relaxed);
        if let Some(daemon) = &self.daemon {
            daemon.add_bytes_out(n);
        }
    }

    pub fn add_bytes_in(&self, n: u64) {
        self.bytes_in.fetch_add(n, Ordering::Relaxed);
        if let Some(daemon) = &self.daemon {
            daemon.add_bytes_in(n);
        }
    }
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod refusal_tests {
    use super::*;

    #[test]
    fn refused_destinations_are_kept_once_each_counted_and_bounded() {
        let daemon = Arc::new(EgressCounters::default());
        let sandbox = EgressCounters::for_sandbox(daemon.clone());
        sandbox.add_refusal("a.test:443", "a.test:443 is not allowed");
        sandbox.add_refusal("a.test:443", "a.test:443 is not allowed");
        for i in 0..100 {
            sandbox.add_refusal(&format!("h{i}.test:80"), &"é".repeat(400));
        }
        let refused = sandbox.refused();
        assert_eq!(refused.len(), MAX_REFUSED_DESTINATIONS);
        assert_eq!(refused[0].destination, "a.test:443");
        assert_eq!(refused[0].count, 2);
        assert_eq!(
            refused[1].reason.len(),
            MAX_REFUSAL_REASON,
            "cut on a boundary"
        );
        assert_eq!(sandbox.snapshot().denied, 102, "every refusal is counted");
        assert_eq!(daemon.snapshot().denied, 102);
        assert!(
            daemon.refused().is_empty(),
            "the daemon's counters keep no list"
        );
    }
}
