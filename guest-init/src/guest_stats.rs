//! What a microVM uses, from its own kernel (`/proc`): the VM is the sandbox, so its memory in
//! use, CPU time and processes are the sandbox's. A namespace sandbox's come from its cgroups on
//! the host instead; one of its containers', from the processes of the container's PID
//! namespace ([`read_processes`]), which its agent's `/proc` shows and nothing else.

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
    Ok(SandboxStats {
        memory,
        cpu,
        pids,
        disk: writable_layer(Path::new("/")),
    })
}

/// What the filesystem of `root` holds and can hold: the guest's root, whose writes go to its
/// writable layer. Unknown (zeros) if it cannot be asked.
pub fn writable_layer(root: &Path) -> wire::DiskStats {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(root.as_os_str().as_bytes()) else {
        return wire::DiskStats::default();
    };
    // SAFETY: statvfs is plain integers; all zeroes is a valid value to overwrite.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `fs` a live statvfs, both for the call.
    if unsafe { libc::statvfs(path.as_ptr(), &mut fs) } != 0 {
        return wire::DiskStats::default();
    }
    let block = fs.f_frsize;
    wire::DiskStats {
        used_bytes: fs.f_blocks.saturating_sub(fs.f_bfree).saturating_mul(block),
        limit_bytes: fs.f_blocks.saturating_mul(block),
    }
}

/// What the processes of the `/proc` at `proc` (a container's PID namespace) use: resident
/// memory summed over them (`VmRSS`: a page two of them share counts twice), CPU time of the
/// live ones and of every descendant they reaped (`utime + stime + cutime + cstime`: a reaped
/// process's times are folded into its parent's, so each counts once), and how many there are.
/// Limits, the high-water mark, cache and OOM kills are the sandbox's, not kept per container:
/// 0 here. A process that exits while it is read is left out. With `mounts` (the caller's
/// mount namespace, when its PID namespace is shared with other containers) only the processes
/// in that mount namespace count: this container's own.
pub fn read_processes(proc: &Path, mounts: Option<&Path>) -> io::Result<SandboxStats> {
    let mut resident_bytes = 0u64;
    let mut ticks = 0u64;
    let mut processes = 0u64;
    for entry in fs::read_dir(proc)?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let dir = proc.join(pid);
        if let Some(own) = mounts {
            if fs::read_link(dir.join("ns/mnt")).ok().as_deref() != Some(own) {
                continue;
            }
        }
        let Ok(stat) = fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        let Some(times) = cpu_ticks(&stat) else {
            continue;
        };
        processes += 1;
        ticks = ticks.saturating_add(times);
        let status = fs::read_to_string(dir.join("status")).unwrap_or_default();
        resident_bytes = resident_bytes.saturating_add(resident_kib(&status) * 1024);
    }
    Ok(SandboxStats {
        disk: wire::DiskStats::default(),
        memory: MemoryStats {
            usage_bytes: resident_bytes,
            ..MemoryStats::default()
        },
        cpu: CpuStats {
            usage_ns: ticks.saturating_mul(1_000_000_000 / USER_HZ),
        },
        pids: PidsStats {
            current: processes,
            limit: 0,
        },
    })
}

/// `utime + stime + cutime + cstime` of a `/proc/PID/stat` line, in clock ticks. The command
/// name in parentheses is the process's own to choose (spaces and `)` included), so the
/// fields are counted from the last `)`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    // After the name: state (field 3) first; utime..cstime are fields 14..17.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let times = fields.get(11..15)?;
    times.iter().try_fold(0u64, |sum, field| {
        // cutime and cstime are signed in the kernel's format; never negative in practice.
        let value = field.parse::<i64>().ok()?.max(0) as u64;
        Some(sum.saturating_add(value))
    })
}

/// `VmRSS` of a `/proc/PID/status`, in KiB (0 for a kernel thread or a zombie, which have
/// none).
fn resident_kib(status: &str) -> u64 {
    status
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix("VmRSS:")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or(0)
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

    #[test]
    fn a_containers_processes_are_summed_and_a_hostile_name_cannot_shift_the_fields() {
        let dir = tempfile::tempdir().expect("tempdir");
        let process = |pid: &str, stat: &str, status: &str| {
            let p = dir.path().join(pid);
            fs::create_dir(&p).expect("pid dir");
            fs::write(p.join("stat"), stat).expect("stat");
            fs::write(p.join("status"), status).expect("status");
        };
        // utime 10, stime 5, cutime 100, cstime 20.
        process(
            "1",
            "1 (crucible-agent) S 0 1 1 0 -1 4194560 500 0 0 0 10 5 100 20 20 0 1 0 5 1000 250",
            "Name:\tcrucible-agent\nVmRSS:\t    2048 kB\n",
        );
        // A name made to look like fields: `) R 1 1 1 0 0 0 0 0 0 0 999999 999999 0 0 (`.
        process(
            "7",
            "7 (x) R 1 1 1 0 0 0 0 0 0 0 999999 999999 0 0 () S 1 7 7 0 -1 0 0 0 0 0 3 2 0 0 20 0 1 0 9 500 100",
            "Name:\tx\nVmRSS:\t     512 kB\n",
        );
        // A zombie: no VmRSS, still a process.
        process(
            "9",
            "9 (sh) Z 1 9 9 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 9 0 0",
            "Name:\tsh\n",
        );
        // Not a process, and a process whose stat is unreadable (it exited meanwhile).
        fs::create_dir(dir.path().join("self")).expect("self");
        fs::create_dir(dir.path().join("12")).expect("gone");
        let stats = read_processes(dir.path(), None).expect("stats");
        assert_eq!(stats.pids.current, 3);
        assert_eq!(stats.memory.usage_bytes, (2048 + 512) * 1024);
        assert_eq!(stats.cpu.usage_ns, (135 + 5 + 2) * 10_000_000);
        assert_eq!(stats.memory.limit_bytes, 0);

        // In a shared PID namespace: only the processes of the caller's mount namespace.
        for (pid, mounts) in [("1", "mnt:[4026531841]"), ("7", "mnt:[4026531999]")] {
            let ns = dir.path().join(pid).join("ns");
            fs::create_dir_all(&ns).expect("ns");
            std::os::unix::fs::symlink(mounts, ns.join("mnt")).expect("mnt link");
        }
        let own = read_processes(dir.path(), Some(Path::new("mnt:[4026531841]"))).expect("own");
        assert_eq!(own.pids.current, 1, "{own:?}");
        assert_eq!(own.memory.usage_bytes, 2048 * 1024);
    }
}
