//! Test harness: a real daemon on a real socket, in this process, with its own state
//! directory and cgroup parent, torn down (every sandbox deleted) when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use api::state::AppState;
use api::{ApiKeys, ServeConfig, Server};
use tokio::sync::oneshot;

pub mod leaks;
pub mod process;

/// The image the tests run: `$CRUCIBLE_IMAGE`, else `target/crucible/image` in the workspace.
/// Fails (never skips) when it has not been built, saying how to build it.
pub fn image_dir() -> PathBuf {
    let dir = std::env::var_os("CRUCIBLE_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/crucible/image"));
    let agent = dir.join("rootfs/init");
    assert!(
        agent.is_file(),
        "end-to-end tests need the image's root tree with the agent at {}: run \
         `cargo xtask build-image` (or `cargo xtask ci`, which does) first",
        agent.display()
    );
    dir
}

/// Whether this host can run namespace sandboxes; the tests require it and fail otherwise.
pub fn require_root() {
    let uid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(u32::MAX);
    assert_eq!(uid, 0, "namespace sandboxes (and so these tests) need root");
}

pub(crate) static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A daemon running on its own runtime thread.
#[derive(Debug)]
pub struct TestDaemon {
    /// The daemon's Unix socket.
    pub socket: PathBuf,
    /// The TCP address, when configured.
    pub tcp: Option<SocketAddr>,
    /// The daemon's state, for inspection.
    pub state: Arc<AppState>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl TestDaemon {
    /// A daemon with the defaults.
    pub fn start() -> Self {
        Self::start_with(|_| {})
    }

    /// A daemon whose configuration `configure` adjusts.
    pub fn start_with(configure: impl FnOnce(&mut ServeConfig)) -> Self {
        require_root();
        let dir = tempfile::Builder::new()
            .prefix("crucible-test-")
            .tempdir()
            .expect("temp dir");
        let mut config = ServeConfig::new(image_dir());
        config.unix_socket = Some(dir.path().join("crucible.sock"));
        config.state_dir = dir.path().join("state");
        config.cgroup_parent = format!(
            "crucible-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        configure(&mut config);
        let socket = config.unix_socket.clone().expect("socket");
        let (tx, rx) = oneshot::channel::<()>();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        // The daemon gets its own runtime on its own thread, as in production, so tests on
        // any runtime can drive it.
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let server = Server::bind(config).await.expect("the daemon starts");
                let _ = started_tx.send((server.state(), server.tcp_addr()));
                server
                    .run(async {
                        let _ = rx.await;
                    })
                    .await;
            });
        });
        let (state, tcp) = started_rx.recv().expect("the daemon started");
        TestDaemon {
            socket,
            tcp,
            state,
            shutdown: Some(tx),
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// A client on the Unix socket.
    pub fn client(&self) -> client::Client {
        client::Client::new(client::Endpoint::Unix(self.socket.clone()))
    }

    /// Creates a sandbox with the defaults and returns its id.
    pub async fn sandbox(&self) -> String {
        self.client()
            .create(&wire::CreateSandbox::default())
            .await
            .expect("creating a sandbox")
            .id
    }

    /// The daemon's cgroup parent.
    pub fn cgroup_parent(&self) -> &str {
        &self.state.config.cgroup_parent
    }

    /// Stops the daemon (deleting every sandbox) and waits for it.
    pub fn stop(mut self) {
        self.shutdown_now();
    }

    fn shutdown_now(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.shutdown_now();
    }
}

/// API keys from a list of entries (`name:key`, or bare keys named `key1`, `key2`, …).
pub fn keys(list: &[&str]) -> ApiKeys {
    ApiKeys::parse(&list.join(",")).expect("valid API keys")
}
