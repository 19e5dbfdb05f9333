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
    /// Its writable layer (absent from older daemons and agents: zeros).
    #[serde(default)]
    pub disk: DiskStats,
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

/// A sandbox's writable layer: what `/` (with `/tmp` and `/dev/shm`, where they share it)
/// holds beyond the image, in memory or on its `disk_mib` disk. Writes past `limit_bytes`
/// fail with `ENOSPC`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DiskStats {
    /// Bytes written (0 when unknown).
    pub used_bytes: u64,
    /// Its size (0 when unknown).
    pub limit_bytes: u64,
}

impl DiskStats {
    /// Whether it is full: less than 1 MiB, or 1 %, left of a known size.
    pub fn is_full(&self) -> bool {
        let left = self.limit_bytes.saturating_sub(self.used_bytes);
        self.limit_bytes > 0 && (left < 1024 * 1024 || left < self.limit_bytes / 100)
    }
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

#[cfg(test)]
mod tests {
    use super::DiskStats;

    #[test]
    fn a_layer_is_full_with_less_than_a_mib_or_a_hundredth_left() {
        let mib = 1024 * 1024;
        let layer = |used: u64, limit: u64| DiskStats {
            used_bytes: used * mib,
            limit_bytes: limit * mib,
        };
        assert!(layer(384, 384).is_full());
        assert!(!layer(380, 384).is_full());
        assert!(
            layer(20_400, 20_480).is_full(),
            "80 MiB of 20 GiB is under 1 %"
        );
        assert!(!layer(0, 0).is_full(), "an unknown size is never full");
    }
}
