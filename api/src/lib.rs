//! `crucible serve`'s HTTP edge: the front door, routes, WebSocket, OpenAPI, authentication
//! and the mapping of errors to statuses, over the engine (`engine`, which knows no HTTP) and
//! the egress proxy (`egress`). [`server`] is the composition root that builds all three from
//! a [`ServeConfig`]. See `docs/api.md` and `docs/architecture.md`.

#![forbid(unsafe_code)]

mod auth;
mod body;
pub mod config;
mod containers;
mod edge;
mod error;
mod execs;
mod extract;
mod files;
pub mod front_door;
pub mod json;
mod linger;
mod oci_images;
pub mod openapi;
mod raw_stream;
mod rewind;
mod routes;
pub mod server;
mod ws;

pub use auth::{ApiKeys, Caller, KeysError, Owner};
pub use config::{Limits, ServeConfig};
pub use edge::Edge;
pub use engine::DEBUG_EXEC_DELAY_ENV;
pub use server::{shutdown_signal, ServeError, Server};

/// Binds and serves until SIGTERM/SIGINT, then deletes every sandbox.
pub async fn serve(config: ServeConfig) -> Result<(), ServeError> {
    let server = Server::bind(config).await?;
    server.run(shutdown_signal()).await;
    Ok(())
}
