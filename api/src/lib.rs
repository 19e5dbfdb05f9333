//! `crucible serve`: the sandbox daemon. It owns sandbox state, starts each sandbox on a
//! backend (a microVM, or Linux namespaces), and relays exec streams and files between HTTP /
//! WebSocket clients and each sandbox's agent. See `docs/api.md`.

#![forbid(unsafe_code)]

pub mod agent;
pub mod auth;
pub mod backend;
pub mod body;
pub mod config;
pub mod egress;
pub mod error;
pub mod exec;
mod files;
pub mod front_door;
pub mod host;
mod images;
pub mod json;
pub mod metrics;
pub mod openapi;
pub mod pool;
mod raw_stream;
mod rewind;
pub mod routes;
pub mod sandbox;
pub mod server;
pub mod state;
pub mod storage;
mod ws;

pub use auth::{ApiKeys, Caller, KeysError, Owner, Transport};
pub use config::{Limits, ServeConfig};
pub use exec::DEBUG_EXEC_DELAY_ENV;
pub use server::{shutdown_signal, ServeError, Server};

/// Binds and serves until SIGTERM/SIGINT, then deletes every sandbox.
pub async fn serve(config: ServeConfig) -> Result<(), ServeError> {
    let server = Server::bind(config).await?;
    server.run(shutdown_signal()).await;
    Ok(())
}
