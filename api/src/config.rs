//! What `crucible serve` is configured with.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use wire::BackendKind;

use crate::auth::ApiKeys;

/// How long a client may take to send a request head, by default.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a WebSocket exec client has to send its ExecRequest after the upgrade, by default.
pub const DEFAULT_FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most headers accepted.
pub const MAX_HEADERS: usize = 64;
/// Largest JSON body accepted (an ExecRequest is at most 1 MiB of strings).
pub const JSON_BODY_LIMIT: usize = 2 * 1024 * 1024;
/// Largest WebSocket message (and frame) accepted.
pub const WS_MESSAGE_LIMIT: usize = 8 * 1024 * 1024;

/// Limits and defaults applied to every sandbox.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most sandboxes alive at once (429 past it).
    pub max_sandboxes: usize,
    /// Most concurrent execs per sandbox (429 past it).
    pub max_execs_per_sandbox: usize,
    /// Memory when the create request gives none.
    pub default_memory_mib: u64,
    /// Largest memory a create request may ask for.
    pub max_memory_mib: u64,
    /// vCPUs when the create request gives none.
    pub default_vcpus: u32,
    /// Most vCPUs a create request may ask for.
    pub max_vcpus: u32,
    /// Lifetime when the create request gives none.
    pub default_ttl_s: u64,
    /// Longest lifetime a create request may ask for.
    pub max_ttl_s: u64,
    /// A sandbox with no exec or file transfer for this long is deleted.
    pub idle_timeout_s: u64,
    /// Most processes in one sandbox (pids cgroup).
    pub max_pids: u64,
    /// Size of a namespace sandbox's writable layer: one tmpfs holding every write to `/`,
    /// `/tmp` and `/dev/shm`, capped at three quarters of the sandbox's memory limit (its pages
    /// are charged to it), so that a full disk is `ENOSPC`, not an OOM kill.
    pub scratch_mib: u64,
    /// How long to wait for a new sandbox's agent to say hello.
    pub ready_timeout_s: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sandboxes: 256,
            max_execs_per_sandbox: 128,
            default_memory_mib: 512,
            max_memory_mib: 16 * 1024,
            default_vcpus: 1,
            max_vcpus: 16,
            default_ttl_s: 3600,
            max_ttl_s: 7 * 24 * 3600,
            idle_timeout_s: 1800,
            max_pids: 1024,
            scratch_mib: 1024,
            ready_timeout_s: 10,
        }
    }
}

/// The daemon's configuration.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The Unix socket to listen on (mode 0600); `None` for TCP only.
    pub unix_socket: Option<PathBuf>,
    /// A TCP address to listen on; requires API keys.
    pub tcp: Option<SocketAddr>,
    /// Accepted API keys, each named; a sandbox belongs to the key that created it. With any
    /// set, a TCP request must carry one; a Unix-socket request without one sees everything.
    pub api_keys: ApiKeys,
    /// Where sandbox runtime directories live (`/run/crucible` for root).
    pub state_dir: PathBuf,
    /// The image: `rootfs/` (namespace backend) and `vmlinux` + `initramfs.cpio` (microVM).
    pub image_dir: PathBuf,
    /// The `crucible-vmm` binary the microVM backend runs (the VMM, and under QEMU its
    /// vhost-user vsock device).
    pub vmm_binary: PathBuf,
    /// What runs microVM guests: `crucible-vmm` (hardware KVM) or QEMU TCG.
    pub hypervisor: wire::Hypervisor,
    /// The cgroup (under each controller's root) that holds this daemon's sandbox groups.
    pub cgroup_parent: String,
    /// The host uid (and gid) of the first namespace sandbox's root: sandbox `k` (a slot
    /// reused once its sandbox is gone) maps its ids 0–65535 to `uid_base + k * 65536 …`.
    pub uid_base: u32,
    /// The backend for requests that do not name one; `None` picks the best the host offers.
    pub default_backend: Option<BackendKind>,
    /// Limits and defaults.
    pub limits: Limits,
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
    /// Caches, disk-backed layers, volumes and the disk budget.
    pub storage: crate::storage::StorageConfig,
    /// The operator's egress allowlist (`--egress-allow`): what sandboxes may ask to reach.
    /// Empty: no sandbox gets network.
    pub egress_allow: Vec<String>,
    /// Warm pools (`--pool`): ready sandboxes kept per shape, checked when the daemon binds.
    pub pools: Vec<crate::pool::PoolSpec>,
}

/// The default `uid_base`: above the ranges `/etc/subuid` hands out (100000 up) and directory
/// services use, outside systemd's container range (524288–1879048191), and low enough that
/// the default 256 sandboxes stay below 2^31 (some tools misread larger ids as negative).
pub const DEFAULT_UID_BASE: u32 = 2_000_000_000;

/// Whether the process runs as root (state under `/run`), else under `$XDG_RUNTIME_DIR`.
fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// `/run/crucible` for root, `$XDG_RUNTIME_DIR/crucible` (or `/tmp/crucible-<user>`) otherwise.
pub fn default_state_dir() -> PathBuf {
    if is_root() {
        return PathBuf::from("/run/crucible");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) => PathBuf::from(dir).join("crucible"),
        None => {
            let user = std::env::var("USER").unwrap_or_else(|_| "user".into());
            std::env::temp_dir().join(format!("crucible-{user}"))
        }
    }
}

/// The daemon's default socket: `<state dir>/crucible.sock`.
pub fn default_socket() -> PathBuf {
    default_state_dir().join("crucible.sock")
}

/// `crucible-vmm` beside the running binary, else whatever `crucible-vmm` is on `PATH`.
pub fn default_vmm_binary() -> PathBuf {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("crucible-vmm")));
    match beside {
        Some(path) if path.is_file() => path,
        _ => std::env::var_os("PATH")
            .and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join("crucible-vmm"))
                    .find(|p| p.is_file())
            })
            .unwrap_or_else(|| PathBuf::from("crucible-vmm")),
    }
}

impl ServeConfig {
    /// Defaults: the default socket, no TCP, no keys, the given image.
    pub fn new(image_dir: PathBuf) -> Self {
        ServeConfig {
            unix_socket: Some(default_socket()),
            tcp: None,
            api_keys: ApiKeys::default(),
            state_dir: default_state_dir(),
            image_dir,
            vmm_binary: default_vmm_binary(),
            hypervisor: wire::Hypervisor::CrucibleVmm,
            cgroup_parent: "crucible".into(),
            uid_base: DEFAULT_UID_BASE,
            default_backend: None,
            limits: Limits::default(),
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            first_message_timeout: DEFAULT_FIRST_MESSAGE_TIMEOUT,
            max_connections: None,
            storage: crate::storage::StorageConfig::new(crate::storage::default_data_dir()),
            egress_allow: Vec::new(),
            pools: Vec::new(),
        }
    }
}
