//! Sandbox egress, the daemon's half: a sandbox has no network; its agent serves an HTTP proxy
//! on the sandbox's loopback and hands each accepted connection, as a raw byte stream, to
//! [`serve`], which checks the request against the sandbox's allowlist (bounded by the
//! operator's), resolves the target once, checks every address, connects and relays.
//! See `docs/egress.md`.

mod address;
mod counters;
mod policy;
mod proxy;
mod request;
mod rules;
mod sink;

pub use address::{special_use, SpecialUse};
pub use counters::{EgressCounters, EgressStats};
pub use policy::{Denial, EgressPolicy, PolicyError};
pub use proxy::{
    serve, EgressContext, Resolve, SystemResolver, CONNECT_TIMEOUT, HEAD_LIMIT, HEAD_TIMEOUT,
};
pub use rules::{Allowlist, Host, IpNetwork, Rule, RuleError, RuleHost};
pub use sink::{sink, MAX_CONNECTIONS_PER_SANDBOX};
