//! A sandbox's stats as the cgroup v1 `Metrics` containerd's clients decode.

use containerd_shim::protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryOomControl, MemoryStat, Metrics, PidsStat,
};
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::MessageField;

use crate::error::ShimError;

/// The type URL `ctr task metrics` and the CRI plugin accept (no `type.googleapis.com/`):
/// `convert_to_any` sets it; the test checks it does.
#[cfg(test)]
const METRICS_TYPE_URL: &str = "io.containerd.cgroups.v1.Metrics";

/// The metrics for `stats`. Memory and CPU usage are always set: `ctr task metrics` reads both
/// without checking.
pub(crate) fn metrics(stats: &wire::SandboxStats) -> Metrics {
    Metrics {
        memory: MessageField::some(MemoryStat {
            usage: MessageField::some(MemoryEntry {
                usage: stats.memory.usage_bytes,
                limit: stats.memory.limit_bytes,
                max: stats.memory.max_usage_bytes,
                ..MemoryEntry::default()
            }),
            total_cache: stats.memory.cache_bytes,
            cache: stats.memory.cache_bytes,
            ..MemoryStat::default()
        }),
        cpu: MessageField::some(CPUStat {
            usage: MessageField::some(CPUUsage {
                total: stats.cpu.usage_ns,
                ..CPUUsage::default()
            }),
            ..CPUStat::default()
        }),
        pids: MessageField::some(PidsStat {
            current: stats.pids.current,
            limit: stats.pids.limit,
            ..PidsStat::default()
        }),
        memory_oom_control: MessageField::some(MemoryOomControl {
            oom_kill: stats.memory.oom_kills,
            ..MemoryOomControl::default()
        }),
        ..Metrics::default()
    }
}

/// [`metrics`] packed as the `Any` a `StatsResponse` carries.
pub(crate) fn metrics_any(stats: &wire::SandboxStats) -> Result<Any, ShimError> {
    containerd_shim::util::convert_to_any(Box::new(metrics(stats)))
        .map_err(|e| ShimError::shim("encoding the metrics", e))
}

#[cfg(test)]
mod tests {
    use containerd_shim::protos::protobuf::Message;

    use super::*;

    #[test]
    fn stats_become_cgroup_v1_metrics_with_the_type_url_ctr_decodes() {
        let stats = wire::SandboxStats {
            memory: wire::MemoryStats {
                usage_bytes: 434_176,
                limit_bytes: 67_108_864,
                max_usage_bytes: 500_000,
                cache_bytes: 4096,
                oom_kills: 2,
            },
            cpu: wire::CpuStats {
                usage_ns: 14_820_788,
            },
            pids: wire::PidsStats {
                current: 2,
                limit: 1024,
            },
            disk: wire::DiskStats::default(),
        };
        let any = metrics_any(&stats).expect("encoded");
        assert_eq!(any.type_url, METRICS_TYPE_URL);
        let back = Metrics::parse_from_bytes(&any.value).expect("decodes");
        assert_eq!(back.memory.usage.usage, 434_176);
        assert_eq!(back.memory.usage.limit, 67_108_864);
        assert_eq!(back.memory.usage.max, 500_000);
        assert_eq!(back.memory.total_cache, 4096);
        assert_eq!(back.cpu.usage.total, 14_820_788);
        assert_eq!(back.pids.current, 2);
        assert_eq!(back.pids.limit, 1024);
        assert_eq!(back.memory_oom_control.oom_kill, 2);
        let zero = metrics(&wire::SandboxStats::default());
        assert!(zero.memory.usage.is_some() && zero.cpu.usage.is_some());
    }
}
