//! What the engine is configured with: where state lives, the image, the VMM, backends,
//! limits, storage, egress rules and pools. The HTTP edge's own settings (listeners, keys,
//! timeouts of a request) are `api::config`.

pub mod pool_spec;

use std::path::PathBuf;

use api_types::BackendKind;

/// Limits and defaults applied to every sandbox.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most sandboxes alive at once (429 past it).
    pub max_sandboxes: usize,
    /// Most concurrent execs per sandbox (429 past it).
    pub max_execs_per_sandbox: usize,
    /// Memory when the create request gives none.
    pub(crate) default_memory_mib: u64,
    /// Largest memory a create request may ask for.
    pub max_memory_mib: u64,
    /// vCPUs when the create request gives none.
    pub(crate) default_vcpus: u32,
    /// Most vCPUs a create request may ask for.
    pub max_vcpus: u32,
    /// Lifetime when the create request gives none.
    pub(crate) default_ttl_s: u64,
    /// Longest lifetime a create request may ask for.
    pub max_ttl_s: u64,
    /// A sandbox with no exec or file transfer for this long is deleted (a command running
    /// with no client attached counts as one).
    pub idle_timeout_s: u64,
    /// Most processes in one sandbox (pids cgroup).
    pub(crate) max_pids: u64,
    /// Size of a namespace sandbox's writable layer: one tmpfs holding every write to `/`,
    /// `/tmp` and `/dev/shm`, capped at three quarters of the sandbox's memory limit (its pages
    /// are charged to it), so that a full disk is `ENOSPC`, not an OOM kill.
    pub scratch_mib: u64,
    /// How long to wait for a new sandbox's agent to say hello.
    pub ready_timeout_s: u64,
    /// Output bytes the agent keeps per command for a client that re-attaches after its
    /// connection dropped (at most `wire::agent::MAX_TAIL_BYTES`).
    pub exec_tail_bytes: u64,
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
            exec_tail_bytes: wire::agent::DEFAULT_TAIL_BYTES,
        }
    }
}

/// The engine's configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Where sandbox runtime directories live (`/run/crucible` for root).
    pub state_dir: PathBuf,
    /// The image: `rootfs/` (namespace backend) and `vmlinux` + `initramfs.cpio` (microVM).
    pub image_dir: PathBuf,
    /// The `crucible-vmm` binary the microVM backend runs (the VMM, and under QEMU its
    /// vhost-user vsock device).
    pub vmm_binary: PathBuf,
    /// What runs microVM guests: `crucible-vmm` (hardware KVM) or QEMU TCG.
    pub hypervisor: api_types::Hypervisor,
    /// The cgroup (under each controller's root) that holds this daemon's sandbox groups.
    pub cgroup_parent: String,
    /// The host uid (and gid) of the first namespace sandbox's root: sandbox `k` (a slot
    /// reused once its sandbox is gone) maps its ids 0–65535 to `uid_base + k * 65536 …`.
    pub uid_base: u32,
    /// The backend for requests that do not name one; `None` picks the best the host offers.
    pub default_backend: Option<BackendKind>,
    /// Limits and defaults.
    pub limits: Limits,
    /// Caches, disk-backed layers, volumes and the disk budget.
    pub storage: crate::storage::StorageConfig,
    /// Warm pools (`--pool`): ready sandboxes kept per shape, checked when the daemon binds.
    pub pools: Vec<pool_spec::PoolSpec>,
    /// Live restore (`--live-restore`): sandboxes outlive the daemon (a crash, a SIGTERM), and
    /// the next daemon takes back those it can verify (`crate::restore`).
    pub live_restore: bool,
}

impl EngineConfig {
    /// Defaults for the given image.
    pub fn new(image_dir: PathBuf) -> Self {
        EngineConfig {
            state_dir: default_state_dir(),
            image_dir,
            vmm_binary: default_vmm_binary(),
            hypervisor: api_types::Hypervisor::CrucibleVmm,
            cgroup_parent: "crucible".into(),
            uid_base: DEFAULT_UID_BASE,
            default_backend: None,
            limits: Limits::default(),
            storage: crate::storage::StorageConfig::new(crate::storage::default_data_dir()),
            pools: Vec::new(),
            live_restore: false,
        }
    }
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

/// `crucible-vmm` beside the running binary, else whatever `crucible-vmm` is on `PATH`.
pub(crate) fn default_vmm_binary() -> PathBuf {
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
