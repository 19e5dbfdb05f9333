//! What `crucible serve` is configured with: the engine's settings (`engine::EngineConfig`)
//! and the HTTP edge's own — listeners, API keys, and how long a client may take.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use engine::settings::{EngineConfig, Limits};

use crate::auth::ApiKeys;

/// How long a client may take to send a request head, by default.
pub(crate) const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a WebSocket exec client has to send its ExecRequest after the upgrade, by default.
pub(crate) const DEFAULT_FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most headers accepted.
pub(crate) const MAX_HEADERS: usize = 64;
/// Largest JSON body accepted (an ExecRequest is at most 1 MiB of strings).
pub const JSON_BODY_LIMIT: usize = 2 * 1024 * 1024;
/// Largest WebSocket message (and frame) accepted.
pub(crate) const WS_MESSAGE_LIMIT: usize = 8 * 1024 * 1024;

/// The daemon's configuration.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Everything below the HTTP edge: state, image, backends, limits, storage, egress, pools.
    pub engine: EngineConfig,
    /// The Unix socket to listen on (mode 0600); `None` for TCP only.
    pub unix_socket: Option<PathBuf>,
    /// A TCP address to listen on; requires API keys.
    pub tcp: Option<SocketAddr>,
    /// Accepted API keys, each named; a sandbox belongs to the key that created it. With any
    /// set, a TCP request must carry one; a Unix-socket request without one sees everything.
    pub api_keys: ApiKeys,
    /// How long a client may take to send a request head (and an interactive exec's
    /// ExecRequest body) before it is answered 408 and disconnected.
    pub header_timeout: Duration,
    /// How long a WebSocket exec client may take, after the upgrade, to send its ExecRequest
    /// before the socket is closed with 1008.
    pub first_message_timeout: Duration,
    /// Most client connections open at once; past it a new connection is answered `503
    /// too_many_connections` and closed. `None`: sized to the file-descriptor limit, which the
    /// daemon raises to its hard limit at start (each connection can hold two descriptors,
    /// its own and its agent's).
    pub max_connections: Option<usize>,
    /// The operator's egress allowlist (`--egress-allow`): what sandboxes may ask to reach,
    /// enforced by the egress proxy (`egress::Proxy`). Empty: no sandbox gets network.
    pub egress_allow: Vec<String>,
    /// What resolves the names sandboxes connect to (behind the proxy's cache); `None`: the
    /// host's `getaddrinfo`. The benchmark gives a slow one.
    pub egress_resolver: Option<std::sync::Arc<dyn egress::Resolve>>,
}

/// The daemon's default socket: `<state dir>/crucible.sock`.
pub fn default_socket() -> PathBuf {
    engine::settings::default_state_dir().join("crucible.sock")
}

impl ServeConfig {
    /// Defaults: the default socket, no TCP, no keys, the given image.
    pub fn new(image_dir: PathBuf) -> Self {
        ServeConfig {
            engine: EngineConfig::new(image_dir),
            unix_socket: Some(default_socket()),
            tcp: None,
            api_keys: ApiKeys::default(),
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            first_message_timeout: DEFAULT_FIRST_MESSAGE_TIMEOUT,
            max_connections: None,
            egress_allow: Vec::new(),
            egress_resolver: None,
        }
    }
}
