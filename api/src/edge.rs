//! What every handler of the edge shares: the engine, the edge's own settings, and the API
//! keys. It derefs to the engine, whose registry, metrics and pool the handlers use.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use engine::Engine;

use crate::auth::ApiKeys;

/// How long a client may take, at the edge.
#[derive(Debug, Clone, Copy)]
pub struct HttpSettings {
    /// To send a request head (and an interactive exec's ExecRequest body), and between the
    /// chunks of a body.
    pub header_timeout: Duration,
    /// After a WebSocket upgrade, to send its ExecRequest.
    pub first_message_timeout: Duration,
}

/// The edge's state: the engine below it, how long clients may take, the keys they present.
#[derive(Debug)]
pub struct Edge {
    /// The engine.
    pub engine: Arc<Engine>,
    /// Client timeouts.
    pub http: HttpSettings,
    /// The accepted API keys.
    pub keys: ApiKeys,
}

impl Deref for Edge {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
}
