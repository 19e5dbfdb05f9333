//! Egress as the engine sees it: a sandbox has no network; its agent serves an HTTP proxy on
//! the sandbox's loopback and hands each accepted connection to the daemon, which serves the
//! proxy protocol under the sandbox's allowlist. That proxy is the `egress` crate; the engine
//! knows it only through [`EgressProxy`]: a create request's rules are checked once
//! ([`EgressProxy::plan`]), and the plan makes the [`EgressSink`] a backend hands each
//! connection to once the sandbox has its id. The engine keeps the counters a sandbox's
//! connections update ([`EgressCounters`]), shown in its info and the daemon's metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

/// The egress proxy the engine calls.
pub trait EgressProxy: Send + Sync + std::fmt::Debug {
    /// Checks a create request's `network.allow` against the operator's rules, once; the plan
    /// makes the sandbox's sink when it has an id.
    fn plan(&self, allow: &[String]) -> Result<EgressPlan, EgressRefused>;
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
