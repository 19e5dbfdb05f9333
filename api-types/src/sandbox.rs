//! The JSON types of the sandbox lifecycle endpoints (`/sandboxes`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a sandbox's agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// A KVM microVM run by `crucible-vmm`: a hardware boundary.
    Microvm,
    /// Linux namespaces + cgroups + no capabilities, for hosts whose KVM cannot boot the image.
    Namespace,
    /// The agent as a plain host process, with no isolation at all: for testing the daemon
    /// without root and for development. A daemon offers it only when configured to.
    Process,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Microvm => "microvm",
            BackendKind::Namespace => "namespace",
            BackendKind::Process => "process",
        })
    }
}

/// What runs a microVM sandbox's guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Hypervisor {
    /// crucible's own VMM under hardware KVM: its devices, its MMIO transport, millisecond boots.
    CrucibleVmm,
    /// QEMU's `microvm` machine under TCG (instruction translation, no KVM) with crucible's
    /// devices served over vhost-user: a VM boundary on hosts without hardware virtualization,
    /// at emulation speed (boots in seconds, commands run many times slower).
    QemuTcg,
}

impl fmt::Display for Hypervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hypervisor::CrucibleVmm => "crucible-vmm",
            Hypervisor::QemuTcg => "qemu-tcg",
        })
    }
}

/// The body of `POST /sandboxes`; every field is optional and `{}` gives a working sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Memory limit (guest RAM for a microVM, cgroup limit for a namespace sandbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// vCPUs (microVM) or CPU quota in whole CPUs (namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// Image name: `"default"` (the built-in image, also when absent) or one imported with
    /// `POST /images`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Backend; default: the best one this host offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendKind>,
    /// Lifetime in seconds, after which the sandbox is deleted; default from the daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// Environment added to every command run in the sandbox: at most 1,024 variables and
    /// 64 KiB of names and values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Free-form labels, returned as given: at most 64, keys of 1 to 128 bytes, 16 KiB of
    /// keys and values in all.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Egress through the daemon's proxy; absent: the sandbox reaches no network at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkRequest>,
    /// Named caches to mount: persistent, daemon-managed, size-limited; sandboxes at once each
    /// mount a copy as last saved, and the first to end saves its copy back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches: Vec<CacheMount>,
    /// Read-only volumes the operator declared (`crucible serve --volume NAME=DIR:ro`): the
    /// live directory in a namespace sandbox; in a microVM a read-only snapshot of it, taken
    /// the first time a microVM asks for it after the daemon started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// A disk-backed writable layer of this many MiB (a sparse file on the host's disk)
    /// instead of the default memory-backed one; for builds and checkouts bigger than memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mib: Option<u64>,
    /// Who every command runs as, as `docker run --user` takes it: `uid`, `uid:gid`, `name` or
    /// `name:group`, resolved against the image's `/etc/passwd` and `/etc/group` (a bare uid
    /// need not be there: its group is then 0). Overrides the image's `User`; `HOME` follows
    /// the user unless the image's `Env` sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Containers besides the sandbox's own root (its `main`, made of `image`): each its own
    /// image, root, main process and log, all sharing the sandbox's network (`localhost`),
    /// IPC, limits and the shared directories they mount. Both backends (the process backend
    /// of the tests runs none). At most 16, with those added later.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<crate::ContainerRequest>,
    /// Shared directories mounted in the sandbox's own root (see a container's `shared`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<crate::SharedMount>,
    /// A microVM's room for containers added once it runs (`POST
    /// /sandboxes/{id}/containers`): this many empty read-only disks are attached at boot,
    /// and each added container's image fills one (a microVM's disks are fixed when it
    /// boots). They count toward its 6 disks beside the root, with caches, volumes,
    /// `disk_mib` and the containers given here. Default 0. A namespace sandbox takes added
    /// containers without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_slots: Option<u32>,
    /// One PID namespace for the sandbox's own root and every container, as Kubernetes'
    /// `shareProcessNamespace`: each member then sees, and may signal, the others' processes
    /// (their `/proc/PID/root` and environment too), the sandbox's agent being PID 1. Default
    /// `false`: each member has a PID namespace of its own and sees none of the others'.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share_process_namespace: bool,
    /// Its hostname (what `hostname` prints and `$HOSTNAME` holds in it and its containers):
    /// 1 to 64 bytes, dot-separated labels of letters, digits and `-`, each 1 to 63 bytes and
    /// neither starting nor ending with `-`. Default: the sandbox's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// A network namespace on the host whose network the sandbox uses: the path of a
    /// namespace file (a bind mount of `/proc/PID/ns/net`), such as the one CNI configured for
    /// a Kubernetes pod. Its IPv4 addresses become the sandbox's (on an `eth0` linked to it),
    /// it routes them to the sandbox, and the sandbox can change nothing of it; ports below
    /// 1024 may be bound. A microVM instead gets egress through its agent's proxy, each
    /// connection opened from that namespace, with no allowlist. `"host"`: the daemon's own
    /// network namespace (a Kubernetes `hostNetwork` pod; namespace backend): it listens and
    /// connects as a host process does, changes nothing of the host's network, may not bind
    /// ports below 1024 and takes no `net.*` sysctl (a `400`); the host's namespace named by
    /// its file is refused. Never with `network`; only the admin key and the daemon's Unix
    /// socket may ask (`403` otherwise): the host's network, or a host path, is theirs to give.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_namespace: Option<String>,
    /// Kernel settings of the sandbox's own namespaces, written before anything runs in it,
    /// as a Kubernetes pod's `sysctls`: only namespaced ones (`kernel.shm*`, `kernel.msg*`,
    /// `kernel.sem`, `fs.mqueue.*`, `net.*`), at most 64, each value one line of at most 256
    /// bytes; anything else is a `400` naming it. Namespace backend only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctls: BTreeMap<String, String>,
}

/// `network_namespace` naming the daemon's own network namespace (a `hostNetwork` pod's).
pub const HOST_NETWORK_NAMESPACE: &str = "host";

/// `"network"` in a create request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    /// Hosts the sandbox may reach through the proxy: names (`crates.io`), wildcards
    /// (`*.pypi.org`: subdomains only), IP literals, each with an optional `:port`. Each must
    /// be within the operator's `--egress-allow` rules.
    #[serde(default)]
    pub allow: Vec<String>,
}

/// A named cache mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CacheMount {
    /// The cache's name: 1 to 64 of `[A-Za-z0-9._-]`, not starting with `.`; caches belong to
    /// the API key that made them.
    pub name: String,
    /// Where it appears inside the sandbox (absolute).
    pub path: String,
    /// Its size limit when this request creates it; default from the daemon. An existing
    /// cache keeps the size it was made with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_mib: Option<u64>,
    /// Whether this sandbox's copy may become the cache when it ends (default `true`; the
    /// first of the sandboxes using the cache at once to end wins). `false` for a job that
    /// only reads it:
    /// its writes stay its own, and it never stands in the way of the jobs that fill it.
    #[serde(default = "save_by_default", skip_serializing_if = "is_saved")]
    pub save: bool,
}

fn save_by_default() -> bool {
    true
}

fn is_saved(save: &bool) -> bool {
    *save
}

/// An operator-declared volume mounted (read-only) into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The volume's name as the operator declared it.
    pub name: String,
    /// Where it appears inside the sandbox (absolute).
    pub path: String,
}

/// A sandbox's egress: its allowlist, where its proxy listens, and what went through it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NetworkInfo {
    /// The sandbox's allowlist, as asked for.
    pub allow: Vec<String>,
    /// The proxy URL set as `HTTP_PROXY`/`HTTPS_PROXY` inside.
    pub proxy: String,
    /// Connections allowed and made.
    pub connections: u64,
    /// Connections refused (not allowed, or a private address the operator did not allow).
    pub denied: u64,
    /// Bytes sent by the sandbox to remote hosts.
    pub bytes_out: u64,
    /// Bytes received by the sandbox from remote hosts.
    pub bytes_in: u64,
    /// The destinations refused, each with the reason its client was given (the first 32
    /// destinations; `denied` counts every refusal).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(length(max = 32)))]
    pub refused: Vec<EgressRefusal>,
}

/// A destination a sandbox's egress refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EgressRefusal {
    /// `host:port`, as the sandbox asked for it.
    pub destination: String,
    /// Why it was refused, as the sandbox's client was told (at most 512 bytes).
    pub reason: String,
    /// How many connections to it were refused.
    pub count: u64,
}

/// A named cache, as `GET /caches` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CacheInfo {
    /// Its name.
    pub name: String,
    /// The API key it belongs to (`"unix"` for the Unix socket without a key).
    pub owner: String,
    /// The backend whose sandboxes use it: a microVM's cache is written block by block by its
    /// guest, so it is never mounted by the host kernel for a namespace sandbox (the same name
    /// on the two backends is two caches).
    pub backend: BackendKind,
    /// Its size limit.
    pub size_mib: u64,
    /// Host disk it takes now (its image is sparse), in MiB, rounded up.
    pub used_mib: u64,
    /// The first of the sandboxes using it now, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use_by: Option<String>,
    /// Every sandbox using it now, each on a copy of its own made when it started.
    #[serde(default)]
    pub users: Vec<String>,
    /// The sandbox whose copy it last became (since the daemon started): the first of those
    /// running at once to end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_by: Option<String>,
    /// When it was made, Unix milliseconds.
    pub created_at_ms: u64,
}

/// The body of `GET /caches`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CacheList {
    /// The caller's caches (every cache for the admin key and the Unix socket), by name.
    pub caches: Vec<CacheInfo>,
}

/// The body of `PATCH /sandboxes/{id}`: new limits for a running sandbox (`docker update
/// --memory --cpus`; the Kubernetes shim's pod limits). A field left out keeps its value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct UpdateSandbox {
    /// Its memory limit, within the bounds a create request has. Lower than what its
    /// processes use, the kernel reclaims and then kills within it, as it would at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// Its CPU limit in whole CPUs, within the bounds a create request has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
}

/// The body of `POST /sandboxes/{id}/signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// The signal number (1 to 64).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 64)))]
    pub signal: i32,
    /// The running command to signal (its ExecRequest's `exec_id`): the signal goes to its
    /// process group only. Absent: to every process in the sandbox but its agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^[A-Za-z0-9._-]{1,128}$"))
    )]
    pub exec_id: Option<String>,
}

/// A sandbox's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// The agent is ready for requests (a sandbox is listed once it is: a create answers when
    /// its agent has said hello).
    Running,
    /// Being deleted.
    Stopping,
    /// Its VM or namespace init died unexpectedly; only `DELETE` is useful now.
    Dead,
}

/// How long creation took.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxTimings {
    /// From the create request to the agent's hello, in milliseconds (fractional).
    pub create_to_ready_ms: f64,
    /// The guest's uptime when its agent became ready: a microVM's kernel's since its boot. A
    /// namespace sandbox runs on the host's kernel, so there it is the host's uptime.
    pub agent_uptime_ms: u64,
}

/// A sandbox, as `GET /sandboxes/{id}` and `POST /sandboxes` return it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxInfo {
    /// `sb-` followed by 16 hex digits.
    pub id: String,
    /// Lifecycle state.
    pub state: SandboxState,
    /// Which backend runs it.
    pub backend: BackendKind,
    /// What runs a `microvm` sandbox's guest; absent for other backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor: Option<Hypervisor>,
    /// The image it runs.
    pub image: String,
    /// Memory limit.
    pub memory_mib: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// Creation time, Unix milliseconds.
    pub created_at_ms: u64,
    /// When it will be deleted, Unix milliseconds (TTL or idle timeout, whichever is sooner).
    pub expires_at_ms: u64,
    /// Labels as given at creation.
    pub labels: BTreeMap<String, String>,
    /// Creation timings.
    pub timings: SandboxTimings,
    /// Commands running right now.
    pub active_execs: u32,
    /// Why the sandbox is dead, when it is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// The name of the API key that created it (never the key itself), or `"unix"` when it was
    /// created over the Unix socket without a key. Only that key, the admin key and the Unix
    /// socket see the sandbox. Absent from daemons older than ownership.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Its egress, when it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkInfo>,
    /// Its caches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches: Vec<CacheMount>,
    /// Its volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// The size of its disk-backed writable layer, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mib: Option<u64>,
    /// Who its commands run as (`uid:gid`), when not root: from the request's `user` or its
    /// image's `User`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Its containers besides its own root, when it has any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<crate::ContainerInfo>,
    /// Whether its root and its containers share one PID namespace (absent: they do not).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share_process_namespace: bool,
    /// Its hostname, when the create request gave one (else it is the id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// The body of `GET /sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxList {
    /// Every sandbox the caller may see (its own; all of them for the admin key and the Unix
    /// socket), oldest first.
    pub sandboxes: Vec<SandboxInfo>,
}
