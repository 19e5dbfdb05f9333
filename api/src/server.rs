//! Listeners, the accept loops and graceful shutdown.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};

use crate::backend::cgroup;
use crate::config::ServeConfig;
use crate::hijack::{serve_connection, Transport};
use crate::state::AppState;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// TCP without keys would let anyone on the network run commands.
    #[error("listening on TCP ({0}) requires API keys (CRUCIBLE_API_KEYS or a keys file)")]
    TcpWithoutKeys(SocketAddr),
    /// Neither a socket nor a TCP address was given.
    #[error("nothing to listen on: give a Unix socket path or a TCP address")]
    NoListener,
    /// The sandboxes' host id ranges do not fit below the last valid id, or start at 0.
    #[error(
        "--uid-base {base} with --max-sandboxes {sandboxes} needs host ids up to {last}, past \
         the last valid id {}; lower either",
        u32::MAX - 1
    )]
    IdRangeOverflow {
        /// The configured base.
        base: u32,
        /// The configured sandbox count.
        sandboxes: usize,
        /// The last id the ranges would need.
        last: u64,
    },
    /// Sandbox root would be host root.
    #[error("--uid-base must not be 0: a sandbox's root is never the host's")]
    UidBaseZero,
    /// Another daemon owns the socket.
    #[error("another daemon is already listening on {0}")]
    SocketInUse(PathBuf),
    /// A filesystem or socket operation failed.
    #[error("{step}")]
    Io {
        /// What was being done, with its input.
        step: String,
        /// The failure.
        #[source]
        source: io::Error,
    },
}

fn io_error(step: impl Into<String>) -> impl FnOnce(io::Error) -> ServeError {
    let step = step.into();
    move |source| ServeError::Io { step, source }
}

/// A bound daemon, ready to run.
#[derive(Debug)]
pub struct Server {
    state: Arc<AppState>,
    unix: Option<(UnixListener, PathBuf)>,
    tcp: Option<TcpListener>,
}

impl Server {
    /// Validates the configuration, cleans up after a previous daemon, and binds the listeners.
    pub async fn bind(config: ServeConfig) -> Result<Self, ServeError> {
        crate::backend::namespace::IdRanges::check(config.uid_base, config.limits.max_sandboxes)?;
        if let Some(addr) = config.tcp {
            if config.api_keys.is_empty() {
                return Err(ServeError::TcpWithoutKeys(addr));
            }
        }
        if config.unix_socket.is_none() && config.tcp.is_none() {
            return Err(ServeError::NoListener);
        }
        create_dir(&config.state_dir)?;
        let unix = match &config.unix_socket {
            Some(path) => Some((bind_unix(path).await?, path.clone())),
            None => None,
        };
        let tcp = match config.tcp {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(io_error(format!("listen on {addr}")))?,
            ),
            None => None,
        };
        clean_stale_sandboxes(&config.state_dir, &config.cgroup_parent).await;
        Ok(Server {
            state: Arc::new(AppState::new(config)),
            unix,
            tcp,
        })
    }

    /// The shared state (tests use it to inspect the daemon).
    pub fn state(&self) -> Arc<AppState> {
        self.state.clone()
    }

    /// The TCP address, when listening on TCP.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` resolves, then deletes every sandbox and the socket.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let state = self.state.clone();
        let unix_path = self.unix.as_ref().map(|(_, p)| p.clone());
        let accept_unix = async {
            let Some((listener, _)) = &self.unix else {
                return std::future::pending().await;
            };
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        tokio::spawn(serve_connection(state.clone(), stream, Transport::Unix));
                    }
                    Err(e) => tracing::warn!("accept on the Unix socket failed: {e}"),
                }
            }
        };
        let accept_tcp = async {
            let Some(listener) = &self.tcp else {
                return std::future::pending().await;
            };
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(serve_connection(state.clone(), stream, Transport::Tcp));
                    }
                    Err(e) => tracing::warn!("accept on TCP failed: {e}"),
                }
            }
        };
        tokio::select! {
            () = accept_unix => {}
            () = accept_tcp => {}
            () = shutdown => {}
        }
        tracing::info!("shutting down: deleting every sandbox");
        state.registry.remove_all().await;
        cgroup::remove_parent(Path::new(CGROUP_ROOT), &state.config.cgroup_parent);
        if let Some(path) = unix_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn create_dir(path: &Path) -> Result<(), ServeError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(io_error(format!("create {}", path.display())))
}

async fn bind_unix(path: &Path) -> Result<UnixListener, ServeError> {
    if let Some(dir) = path.parent() {
        create_dir(dir)?;
    }
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(ServeError::SocketInUse(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(io_error(format!("remove stale {}", path.display())))?;
    }
    let listener =
        UnixListener::bind(path).map_err(io_error(format!("listen on {}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io_error(format!("chmod 0600 {}", path.display())))?;
    Ok(listener)
}

/// A daemon that died leaves sandboxes behind; their init processes died with it (they are
/// tied to the daemon), so what remains is cgroups and directories. Remove them.
async fn clean_stale_sandboxes(state_dir: &Path, cgroup_parent: &str) {
    let removed = cgroup::remove_stale(Path::new(CGROUP_ROOT), cgroup_parent).await;
    let mut dirs = 0;
    for sub in ["sandboxes", "logs"] {
        let dir = state_dir.join(sub);
        if dir.exists() && std::fs::remove_dir_all(&dir).is_ok() {
            dirs += 1;
        }
    }
    if removed > 0 || dirs > 0 {
        tracing::info!("cleaned up {removed} stale sandbox cgroups and leftover state");
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
