//! Listeners, the accept loops and graceful shutdown.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::auth::Transport;
use crate::config::ServeConfig;
use crate::edge::{Edge, HttpSettings};
use crate::error::ApiError;
use crate::front_door::serve_connection;
use engine::backend::Backends;
use engine::state::{ShutdownMode, StartError};
use engine::Engine;

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// TCP without keys would let anyone on the network run commands.
    #[error("listening on TCP ({0}) requires API keys (CRUCIBLE_API_KEYS or a keys file)")]
    TcpWithoutKeys(SocketAddr),
    /// Neither a socket nor a TCP address was given.
    #[error("nothing to listen on: give a Unix socket path or a TCP address")]
    NoListener,
    /// Another daemon owns the socket.
    #[error("another daemon is already listening on {0}")]
    SocketInUse(PathBuf),
    /// An --egress-allow rule is malformed.
    #[error("--egress-allow")]
    Egress(#[from] egress::RuleError),
    /// The engine could not start: its settings (id ranges, pools), its cgroup parent (held
    /// by another daemon), its state or data directory.
    #[error(transparent)]
    Engine(#[from] StartError),
    /// `--max-connections 0` would refuse every client.
    #[error("--max-connections must be at least 1")]
    NoConnections,
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
    state: Arc<Edge>,
    router: Router,
    connections: Arc<Semaphore>,
    max_connections: usize,
    unix: Option<(UnixListener, PathBuf)>,
    tcp: Option<TcpListener>,
}

/// Raises the soft limit on open files to the hard one and returns it: every connection holds
/// a descriptor or two, every sandbox a few.
fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        tracing::info!("raised the open-file limit from {soft} to {hard}");
        return hard;
    }
    soft
}

/// The default connection cap for `fd_limit` descriptors: half of what is left after a
/// reserve for sandboxes and the daemon itself (a connection can hold two: its own and its
/// agent's).
fn default_max_connections(fd_limit: u64) -> usize {
    let usable = fd_limit.saturating_sub(256) / 2;
    usize::try_from(usable).unwrap_or(usize::MAX).max(16)
}

impl Server {
    /// Validates the configuration, cleans up after a previous daemon, and binds the listeners.
    pub async fn bind(config: ServeConfig) -> Result<Self, ServeError> {
        let backends = Engine::default_backends(&config.engine);
        Self::bind_with(config, backends).await
    }

    /// [`Server::bind`] with the given backends (tests inject the host-process backend).
    pub(crate) async fn bind_with(
        config: ServeConfig,
        backends: Backends,
    ) -> Result<Self, ServeError> {
        if config.max_connections == Some(0) {
            return Err(ServeError::NoConnections);
        }
        let egress = match &config.egress_resolver {
            Some(resolver) => egress::Proxy::with_resolver(&config.egress_allow, resolver.clone())?,
            None => egress::Proxy::new(&config.egress_allow)?,
        };
        if let Some(addr) = config.tcp {
            if config.api_keys.is_empty() {
                return Err(ServeError::TcpWithoutKeys(addr));
            }
        }
        if config.unix_socket.is_none() && config.tcp.is_none() {
            return Err(ServeError::NoListener);
        }
        // Before anything on the host is touched (socket, state, leftovers): the engine's
        // settings are checked and its cgroup parent taken.
        let claimed = Engine::claim(config.engine, backends)?;
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
        let fd_limit = raise_fd_limit();
        let max_connections = config
            .max_connections
            .unwrap_or_else(|| default_max_connections(fd_limit));
        let keys: Vec<String> = config.api_keys.names().map(str::to_string).collect();
        let engine = claimed.start(Arc::new(egress), &keys).await?;
        let state = Arc::new(Edge {
            engine: Arc::new(engine),
            http: HttpSettings {
                header_timeout: config.header_timeout,
                first_message_timeout: config.first_message_timeout,
            },
            keys: config.api_keys,
        });
        Ok(Server {
            router: crate::routes::app(state.clone()),
            connections: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            state,
            unix,
            tcp,
        })
    }

    /// How many connections it holds at most.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// The shared state (tests use it to inspect the daemon).
    pub fn state(&self) -> Arc<Edge> {
        self.state.clone()
    }

    /// The TCP address, when listening on TCP.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` resolves, then deletes every sandbox and the socket.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server {
            state,
            router,
            connections,
            max_connections,
            unix,
            tcp,
        } = self;
        let unix_path = unix.as_ref().map(|(_, p)| p.clone());
        let front = Arc::new(Front {
            state: state.clone(),
            router,
            connections,
            max_connections,
        });
        // The accept loops run as tasks on the runtime's workers, not on the thread that waits
        // for `shutdown`: a connection's task is then spawned on the worker that accepted it
        // and polled there at once, without waking another thread.
        let mut accepting = tokio::task::JoinSet::new();
        if let Some((listener, _)) = unix {
            accepting.spawn(accept_unix(front.clone(), listener));
        }
        if let Some(listener) = tcp {
            accepting.spawn(accept_tcp(front, listener));
        }
        state.start_pool();
        shutdown.await;
        accepting.abort_all();
        let mode = match state.config.live_restore {
            true => ShutdownMode::LeaveRunning,
            false => ShutdownMode::RemoveAll,
        };
        let stopped = state.shutdown(mode).await;
        if let Some(path) = unix_path {
            let _ = std::fs::remove_file(path);
        }
        // Last: the next daemon on this parent may start now.
        drop(stopped);
    }
}

/// What the accept loops share: where connections go, and the cap on them.
struct Front {
    state: Arc<Edge>,
    router: Router,
    connections: Arc<Semaphore>,
    max_connections: usize,
}

async fn accept_unix(front: Arc<Front>, listener: UnixListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => match front.admit() {
                Some(permit) => front.spawn(stream, Transport::Unix, permit),
                None => front.refuse(|answer| stream.try_write(answer)),
            },
            Err(e) => accept_failed("the Unix socket", e).await,
        }
    }
}

async fn accept_tcp(front: Arc<Front>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => match front.admit() {
                Some(permit) => {
                    let _ = stream.set_nodelay(true);
                    front.spawn(stream, Transport::Tcp, permit)
                }
                None => front.refuse(|answer| stream.try_write(answer)),
            },
            Err(e) => accept_failed("TCP", e).await,
        }
    }
}

impl Front {
    /// A place under the connection cap, held until the connection ends.
    fn admit(&self) -> Option<OwnedSemaphorePermit> {
        self.connections.clone().try_acquire_owned().ok()
    }

    fn spawn<S>(&self, stream: S, transport: Transport, permit: OwnedSemaphorePermit)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let connection =
            serve_connection(self.state.clone(), self.router.clone(), stream, transport);
        tokio::spawn(async move {
            connection.await;
            drop(permit);
        });
    }

    /// Answers a connection past the cap with `503 too_many_connections` and closes it. The
    /// answer is written only if the socket takes it at once: a refused client gets no task,
    /// no buffer and no time, or a flood of them would hold what the cap protects.
    fn refuse(&self, try_write: impl FnOnce(&[u8]) -> io::Result<usize>) {
        self.state
            .metrics
            .connections_refused
            .fetch_add(1, Ordering::Relaxed);
        self.state.metrics.observe_error(503);
        let error = ApiError::too_many_connections(self.max_connections);
        let body = serde_json::to_vec(&error.body()).unwrap_or_default();
        let mut answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        answer.extend_from_slice(&body);
        let _ = try_write(&answer);
    }
}

/// Logs a failed accept and pauses briefly: the usual cause, no descriptor left, does not go
/// away by retrying at once.
async fn accept_failed(listener: &str, error: io::Error) {
    tracing::warn!("accept on {listener} failed: {error}");
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// A daemon on a runtime of its own, on a thread of its own: how the end-to-end tests and the
/// benchmark run one in their process, as it runs in production.
#[derive(Debug)]
pub struct BackgroundDaemon {
    /// Its Unix socket, when it listens on one.
    pub socket: Option<PathBuf>,
    /// Its TCP address, when it listens on TCP.
    pub tcp: Option<SocketAddr>,
    /// Its state, for inspection.
    pub state: Arc<Edge>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundDaemon {
    /// Binds and starts a daemon with `backends` (the configured ones when `None`) on a
    /// two-worker runtime.
    pub fn start(config: ServeConfig, backends: Option<Backends>) -> Result<Self, ServeError> {
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("crucible-daemon".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("crucible-daemon")
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = started_tx.send(Err(io_error("start the daemon's runtime")(e)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let bound = match backends {
                        Some(backends) => Server::bind_with(config, backends).await,
                        None => Server::bind(config).await,
                    };
                    let server = match bound {
                        Ok(server) => server,
                        Err(e) => {
                            let _ = started_tx.send(Err(e));
                            return;
                        }
                    };
                    let socket = server.unix.as_ref().map(|(_, path)| path.clone());
                    let _ = started_tx.send(Ok((socket, server.tcp_addr(), server.state())));
                    server
                        .run(async {
                            let _ = shutdown_rx.await;
                        })
                        .await;
                });
            })
            .map_err(io_error("spawn the daemon's thread"))?;
        let (socket, tcp, state) = match started_rx.recv() {
            Ok(Ok(started)) => started,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(io_error("start the daemon")(io::Error::other(
                    "its thread ended before it started",
                )));
            }
        };
        Ok(BackgroundDaemon {
            socket,
            tcp,
            state,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        })
    }

    /// Stops it (deleting every sandbox) and waits until it has.
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for BackgroundDaemon {
    fn drop(&mut self) {
        self.stop_now();
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
