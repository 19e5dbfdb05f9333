//! Test harness: a real daemon on a real socket, in this process, with its own state
//! directory and cgroup parent, torn down (every sandbox deleted) when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use api::server::BackgroundDaemon;
use api::Edge;
use api::{ApiKeys, ServeConfig};

pub mod host_net;
pub mod images;
pub mod leaks;
pub mod process;
pub mod restart;

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

/// The `crucible-vmm` the microVM tests run: `$CRUCIBLE_VMM` when set (the nested tier may
/// point it at the static build), else the one `cargo test --workspace` built. Fails, saying
/// how to build it, when it is missing.
pub fn vmm_binary() -> PathBuf {
    let vmm = std::env::var_os("CRUCIBLE_VMM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/crucible-vmm")
        });
    assert!(
        vmm.is_file(),
        "{} missing: cargo build -p crucible-vmm (cargo test --workspace builds it)",
        vmm.display()
    );
    vmm
}

/// Whether this host can run namespace sandboxes; the tests require it and fail otherwise.
pub fn require_root() {
    let uid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(u32::MAX);
    assert_eq!(uid, 0, "namespace sandboxes (and so these tests) need root");
}

pub(crate) static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A daemon running on its own runtime thread (`api::server::BackgroundDaemon`, the starter the
/// benchmark uses too), with a private socket, state directory and cgroup parent. Dropping it
/// stops the daemon, deleting every sandbox.
#[derive(Debug)]
pub struct TestDaemon {
    /// The daemon's Unix socket.
    pub socket: PathBuf,
    /// The TCP address, when configured.
    pub tcp: Option<SocketAddr>,
    /// The daemon's state, for inspection.
    pub state: Arc<Edge>,
    daemon: BackgroundDaemon,
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
        config.engine.state_dir = dir.path().join("state");
        config.engine.storage.data_dir = dir.path().join("data");
        config.engine.cgroup_parent = format!(
            "crucible-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        // A cache's default size counts whole against a budget taken from the host's free
        // disk: a small one keeps the tests from depending on how full the machine is.
        config.engine.storage.default_cache_mib = 256;
        configure(&mut config);
        let daemon = BackgroundDaemon::start(config, None).expect("the daemon starts");
        TestDaemon {
            socket: daemon.socket.clone().expect("a Unix socket"),
            tcp: daemon.tcp,
            state: daemon.state.clone(),
            daemon,
            _dir: dir,
        }
    }

    /// A daemon whose sandboxes are microVMs under QEMU TCG (our kernel, our vsock and block
    /// devices over vhost-user), as on hosts where KVM cannot boot them, adjusted by
    /// `configure`. Fails, saying how to build them, without the image's kernel or
    /// `crucible-vmm`.
    pub fn start_qemu_tcg(configure: impl FnOnce(&mut ServeConfig)) -> Self {
        Self::start_microvm(api_types::Hypervisor::QemuTcg, configure)
    }

    /// A daemon whose sandboxes are microVMs on `hypervisor` (our own `crucible-vmm` needs
    /// hardware KVM, or the nested tier), adjusted by `configure`. Fails, saying how to build
    /// them, without the image's kernel or `crucible-vmm`.
    pub fn start_microvm(
        hypervisor: api_types::Hypervisor,
        configure: impl FnOnce(&mut ServeConfig),
    ) -> Self {
        let kernel = image_dir().join("vmlinux");
        assert!(
            kernel.is_file(),
            "{} missing: the microVM tests boot the image's kernel; run `cargo xtask build-image`",
            kernel.display()
        );
        let vmm = vmm_binary();
        Self::start_with(|c| {
            c.engine.vmm_binary = vmm;
            c.engine.hypervisor = hypervisor;
            c.engine.default_backend = Some(api_types::BackendKind::Microvm);
            configure(c);
        })
    }

    /// A client on the Unix socket.
    pub fn client(&self) -> client::Client {
        client::Client::new(client::Endpoint::Unix(self.socket.clone()))
    }

    /// Creates a sandbox with the defaults and returns its id.
    pub async fn sandbox(&self) -> String {
        self.client()
            .create(&api_types::CreateSandbox::default())
            .await
            .expect("creating a sandbox")
            .id
    }

    /// The daemon's cgroup parent.
    pub fn cgroup_parent(&self) -> &str {
        &self.state.config.cgroup_parent
    }

    /// Stops the daemon (deleting every sandbox) and waits for it.
    pub fn stop(self) {
        self.daemon.stop();
    }
}

/// API keys from a list of entries (`name:key`, or bare keys, named after the key's SHA-256).
pub fn keys(list: &[&str]) -> ApiKeys {
    ApiKeys::parse(&list.join(",")).expect("valid API keys")
}

/// Sends raw bytes on a new connection to `daemon`'s socket and returns everything it sent
/// back (within 20 s).
pub async fn raw_exchange(daemon: &TestDaemon, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::UnixStream::connect(&daemon.socket)
        .await
        .expect("connect");
    stream.write_all(request).await.expect("send");
    let mut out = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        stream.read_to_end(&mut out),
    )
    .await
    .expect("the daemon answers")
    .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

/// Runs `sh -c script` in sandbox `id`: its stdout, stderr and exit code.
pub async fn sh(c: &client::Client, id: &str, script: &str) -> (String, String, i32) {
    let out = c
        .exec_collect(id, &wire::ExecRequest::new(["sh", "-c", script]))
        .await
        .expect("exec");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.result.exit_code,
    )
}

/// Runs `cmd` in sandbox `id` in the background; the task ends with its output.
pub fn spawn_exec(
    c: &client::Client,
    id: &str,
    cmd: &[&str],
) -> tokio::task::JoinHandle<client::ExecOutput> {
    spawn_request(c, id, wire::ExecRequest::new(cmd.iter().copied()))
}

/// [`spawn_exec`] of a whole request.
pub fn spawn_request(
    c: &client::Client,
    id: &str,
    request: wire::ExecRequest,
) -> tokio::task::JoinHandle<client::ExecOutput> {
    let (c, id) = (c.clone(), id.to_string());
    tokio::spawn(async move { c.exec_collect(&id, &request).await.expect("exec") })
}

/// Waits until a process whose command line contains `pattern` runs in sandbox `id`.
pub async fn wait_for_process(c: &client::Client, id: &str, pattern: &str) {
    for _ in 0..400 {
        let (out, _, _) = sh(c, id, "ps -o args").await;
        if out
            .lines()
            .any(|l| l.contains(pattern) && !l.contains("ps -o"))
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("{pattern} never started in {id}");
}

/// The loop devices whose backing file is under `dir` (caches and disk-backed layers still
/// attached).
pub fn loops_backed_under(dir: &Path) -> Vec<String> {
    let Ok(dir) = dir.canonicalize() else {
        return Vec::new();
    };
    std::fs::read_dir("/sys/block")
        .expect("/sys/block")
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .filter(|backing| Path::new(backing.trim_end()).starts_with(&dir))
        .collect()
}

/// Fills the cache mounted at `inside` in sandbox `id` with `write_mib` MiB, more than its
/// `limit_mib`: the writer must get ENOSPC while the cache's `index` file (which must hold
/// `kept`) and the rest of the sandbox stay usable, and the host's image at `image` must
/// never take more than the limit.
pub async fn assert_cache_limit_holds(
    c: &client::Client,
    id: &str,
    inside: &str,
    kept: &str,
    image: &Path,
    (limit_mib, write_mib): (u64, u64),
) {
    let script = format!(
        "dd if=/dev/zero of={inside}/big bs=1M count={write_mib} 2>&1; echo dd=$?; \
         cat {inside}/index; echo rest > /tmp/ok && cat /tmp/ok"
    );
    let (out, err, code) = sh(c, id, &script).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("No space left on device"), "{out}");
    assert!(!out.contains("dd=0"), "{out}");
    assert!(out.contains(kept) && out.contains("rest"), "{out}");
    let meta = std::fs::metadata(image).expect("the cache's image");
    assert_eq!(meta.len(), limit_mib << 20);
    let allocated = std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
    assert!(allocated <= limit_mib << 20, "{allocated} bytes");
}
