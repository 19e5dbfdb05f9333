//! What a sandbox uses now: memory, CPU time, processes. The agent answers its `stats` request
//! with these (a microVM's own counters), and `GET /sandboxes/{id}/stats` returns them.

use serde::{Deserialize, Serialize};

/// What a sandbox uses now, from its cgroups: `GET /sandboxes/{id}/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxStats {
    /// Memory.
    pub memory: MemoryStats,
    /// CPU time.
    pub cpu: CpuStats,
    /// Processes.
    pub pids: PidsStats,
}

/// A sandbox's memory: everything its processes and its in-memory writable layer take.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MemoryStats {
    /// Bytes in use now.
    pub usage_bytes: u64,
    /// Its limit.
    pub limit_bytes: u64,
    /// The most it has used.
    pub max_usage_bytes: u64,
    /// Page cache within the usage.
    pub cache_bytes: u64,
    /// Processes the kernel killed for want of memory.
    pub oom_kills: u64,
}

/// A sandbox's CPU time, all its processes together, since it was made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CpuStats {
    /// Nanoseconds of CPU time.
    pub usage_ns: u64,
}

/// A sandbox's processes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PidsStats {
    /// Processes (and threads) now, the agent's included.
    pub current: u64,
    /// Its limit (0: none).
    pub limit: u64,
}
