//! What a microVM uses, from its own kernel (`/proc`): the VM is the sandbox, so its memory in
//! use, CPU time and processes are the sandbox's. A namespace sandbox's come from its cgroups on
//! the host instead.

use std::fs;
use std::io;
use std::path::Path;

use wire::{CpuStats, MemoryStats, PidsStats, SandboxStats};

/// Clock ticks per second of `/proc/stat`'s CPU times (`USER_HZ`, 100 on Linux).
const USER_HZ: u64 = 100;

/// The commands cgroup's `memory.events` in a microVM (`init::commands_cgroup`).
pub const COMMANDS_MEMORY_EVENTS: &str = "/sys/fs/cgroup/commands/memory.events";

/// The guest's stats from the `/proc` at `proc`. OOM kills are the larger of the kernel's own
/// count (`/proc/vmstat`, which our minimal guest kernel may not keep) and the commands
/// cgroup's (`memory_events`, where every command runs).
pub fn read(proc: &Path, memory_events: &Path) -> io::Result<SandboxStats> {
    let meminfo = fs::read_to_string(proc.join("meminfo"))?;
    let kib = |key: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|line| {
                let rest = line.strip_prefix(key)?.strip_prefix(':')?;
                rest.split_whitespace().next()?.parse::<u64>().ok()
            })
            .unwrap_or(0)
            * 1024
    };
    let total = kib("MemTotal");
    let available = kib("MemAvailable");
    let oom_kill_in = |path: &Path| -> u64 {
        fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .find_map(|line| line.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    };
    let oom_kills = oom_kill_in(&proc.join("vmstat")).max(oom_kill_in(memory_events));
    let memory = MemoryStats {
        usage_bytes: total.saturating_sub(available),
        limit_bytes: total,
        // The guest kernel keeps no high-water mark of its own use.
        max_usage_bytes: 0,
        cache_bytes: kib("Cached"),
        oom_kills,
    };
    let stat = fs::read_to_string(proc.join("stat"))?;
    // cpu  user nice system idle iowait irq softirq steal guest guest_nice
    let busy_ticks: u64 = stat
        .lines()
        .find(|line| line.starts_with("cpu "))
        .map(|line| {
            line.split_whitespace()
                .skip(1)
                .enumerate()
                // user, nice, system, irq, softirq, steal (guest time is within user).
                .filter(|(i, _)| matches!(i, 0 | 1 | 2 | 5 | 6 | 7))
                .filter_map(|(_, v)| v.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    let cpu = CpuStats {
        usage_ns: busy_ticks * (1_000_000_000 / USER_HZ),
    };
    let processes = fs::read_dir(proc)?
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count() as u64;
    let pids = PidsStats {
        current: processes,
        limit: 0,
    };
    Ok(SandboxStats { memory, cpu, pids })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_come_from_meminfo_stat_and_the_process_directories() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(
            dir.path().join("meminfo"),
            "MemTotal:         512000 kB\nMemFree:          100000 kB\nMemAvailable:     312000 kB\nCached:            50000 kB\n",
        )
        .expect("meminfo");
        fs::write(
            dir.path().join("stat"),
            "cpu  100 5 50 9000 30 1 2 0 0 0\ncpu0 100 5 50 9000 30 1 2 0 0 0\n",
        )
        .expect("stat");
        fs::write(dir.path().join("vmstat"), "nr_free_pages 1\noom_kill 2\n").expect("vmstat");
        for pid in ["1", "42", "self"] {
            fs::create_dir(dir.path().join(pid)).expect("pid dir");
        }
        let events = dir.path().join("memory.events");
        let stats = read(dir.path(), &events).expect("stats");
        assert_eq!(stats.memory.limit_bytes, 512_000 * 1024);
        assert_eq!(stats.memory.usage_bytes, 200_000 * 1024);
        assert_eq!(stats.memory.cache_bytes, 50_000 * 1024);
        assert_eq!(stats.memory.oom_kills, 2);
        // user + nice + system + irq + softirq + steal = 158 ticks of 10 ms.
        assert_eq!(stats.cpu.usage_ns, 158 * 10_000_000);
        assert_eq!(stats.pids.current, 2);
        // A kernel without vmstat's counter: the commands cgroup's count.
        fs::write(dir.path().join("vmstat"), "nr_free_pages 1\n").expect("vmstat");
        fs::write(&events, "low 0\nhigh 0\nmax 9\noom 3\noom_kill 3\n").expect("events");
        assert_eq!(
            read(dir.path(), &events).expect("stats").memory.oom_kills,
            3
        );
    }
}
