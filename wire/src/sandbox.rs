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
    /// Image name; only `"default"` exists today.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Backend; default: the best one this host offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendKind>,
    /// Lifetime in seconds, after which the sandbox is deleted; default from the daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// Environment added to every command run in the sandbox.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Free-form labels, returned as given.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A sandbox's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Booting; the agent has not said hello yet.
    Creating,
    /// The agent is ready for requests.
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
    /// The guest's uptime when its agent became ready.
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
}

/// The body of `GET /sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxList {
    /// Every sandbox the caller may see (its own; all of them for the admin key and the Unix
    /// socket), oldest first.
    pub sandboxes: Vec<SandboxInfo>,
}
