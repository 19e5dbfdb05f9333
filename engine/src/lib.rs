//! crucible's engine: the daemon below its HTTP edge. It owns sandboxes and their lifecycle
//! (an explicit state table), starts each on a backend (a microVM, Linux namespaces, or a plain
//! process), claims its storage, keeps the warm pool, and runs exec sessions between a client's
//! frames and a sandbox's agent. It knows no HTTP: the edge (`api`) parses requests, maps
//! errors to statuses and calls in; the egress proxy (`egress`) is reached through
//! [`egress::EgressProxy`]. See `docs/architecture.md`.

#![forbid(unsafe_code)]

pub mod agent;
pub mod backend;
pub mod egress;
pub mod exec;
pub mod host;
mod ids;
mod metrics;
pub mod owner;
pub mod pod_inbound;
pub mod pool;
pub mod restore;
pub mod sandbox;
pub mod settings;
pub mod state;
pub mod storage;

pub use exec::DEBUG_EXEC_DELAY_ENV;
pub use owner::{Caller, Owner};
pub use settings::{EngineConfig, Limits};
pub use state::Engine;
