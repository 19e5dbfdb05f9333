//! What a daemon can leak on the host, inspected from outside: processes, cgroups, mounts,
//! state files and sockets, file descriptors and memory. Fault tests snapshot these and assert
//! that nothing is left once a sandbox is gone.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The cgroup controllers the namespace backend uses (v1; v2 is the root itself).
const CONTROLLERS: [&str; 4] = ["", "memory", "pids", "cpu"];

/// Waits (bounded by `timeout`) for `condition`, polling: only tests poll, never the product.
pub async fn eventually_within(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`eventually_within`] 20 s: generous, since a loaded host tears namespaces down slowly.
pub async fn eventually(what: &str, condition: impl FnMut() -> bool) {
    eventually_within(what, Duration::from_secs(20), condition).await;
}

/// The sandbox cgroup directories under `parent` in every controller.
pub fn sandbox_cgroups(parent: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for controller in CONTROLLERS {
        let dir = Path::new("/sys/fs/cgroup").join(controller).join(parent);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            dirs.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir() && p.join("cgroup.procs").exists()),
            );
        }
    }
    dirs.sort();
    dirs
}

/// The parent cgroup directories themselves, where they exist.
pub fn parent_cgroups(parent: &str) -> Vec<PathBuf> {
    CONTROLLERS
        .iter()
        .map(|c| Path::new("/sys/fs/cgroup").join(c).join(parent))
        .filter(|p| p.is_dir())
        .collect()
}

/// The processes in a cgroup directory.
pub fn pids_in(cgroup: &Path) -> Vec<i32> {
    std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// A sandbox's memory cgroup.
pub fn memory_cgroup(parent: &str, id: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup/memory").join(parent).join(id)
}

/// Live (not zombie) processes whose command line mentions `needle` (`<state>/sandboxes`: every
/// sandbox supervisor is started with its runtime directory under it).
pub fn processes_mentioning(needle: &Path) -> Vec<i32> {
    let needle = needle.as_os_str().as_encoded_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| {
                    s.rsplit_once(')')
                        .is_some_and(|(_, rest)| rest.starts_with(" Z"))
                })
                .unwrap_or(true);
            !zombie
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

/// Mount points at or under `dir` in this process's mount namespace (the daemon's, whether it
/// runs in this process or is a child of it).
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4).map(String::from))
        .filter(|point| point.starts_with(&prefix))
        .collect()
}

/// Files left under a daemon's per-sandbox state: runtime directories (with their sockets) and
/// logs.
pub fn state_files(state_dir: &Path) -> Vec<PathBuf> {
    ["sandboxes", "logs", "records"]
        .iter()
        .filter_map(|sub| std::fs::read_dir(state_dir.join(sub)).ok())
        .flat_map(|d| d.flatten().map(|e| e.path()))
        .collect()
}

/// A process's open file descriptors.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// A process's resident memory in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// The processes of an idle namespace sandbox, in its cgroups: its supervisor (outside), the
/// init of its first PID namespace, its agent (PID 1 of `main`'s PID namespace) and its
/// container factory.
pub const IDLE_PROCESSES: usize = 4;

/// The host pid of a namespace sandbox's agent: the process in its memory cgroup that is PID 1
/// of `main`'s PID namespace (two levels below the host's) and runs as `sandbox-pid1`.
pub fn agent_pid(parent: &str, id: &str) -> Option<i32> {
    agents_in(parent, id, "sandbox-pid1").into_iter().next()
}

/// The host pids of a namespace sandbox's containers' agents (each PID 1 of its container's
/// PID namespace, running as `sandbox-container`).
pub fn container_agent_pids(parent: &str, id: &str) -> Vec<i32> {
    agents_in(parent, id, "sandbox-container")
}

fn agents_in(parent: &str, id: &str, mode: &str) -> Vec<i32> {
    pids_in(&memory_cgroup(parent, id))
        .into_iter()
        .filter(|pid| {
            let pid_one_two_levels_down = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .is_ok_and(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("NSpid:"))
                        .is_some_and(|ids| {
                            let ids: Vec<&str> = ids.split_whitespace().collect();
                            ids.len() == 3 && ids[2] == "1"
                        })
                });
            let runs_as = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|line| line.split(|b| *b == 0).any(|arg| arg == mode.as_bytes()));
            pid_one_two_levels_down && runs_as
        })
        .collect()
}

/// Everything a daemon holds on the host for its sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footprint {
    /// Sandbox cgroup directories (every controller).
    pub cgroups: Vec<PathBuf>,
    /// Processes in them.
    pub processes: Vec<i32>,
    /// Live processes started with a runtime directory of the daemon's (supervisors, agents).
    pub sandbox_processes: Vec<i32>,
    /// Mounts under the state directory.
    pub mounts: Vec<String>,
    /// Runtime directories, sockets and logs under the state directory.
    pub state_files: Vec<PathBuf>,
}

impl Footprint {
    /// The footprint of the daemon using `state_dir` and cgroup `parent`.
    pub fn of(state_dir: &Path, parent: &str) -> Self {
        let cgroups = sandbox_cgroups(parent);
        let processes = cgroups.iter().flat_map(|c| pids_in(c)).collect();
        Footprint {
            cgroups,
            processes,
            sandbox_processes: processes_mentioning(&state_dir.join("sandboxes")),
            mounts: mounts_under(state_dir),
            state_files: state_files(state_dir),
        }
    }

    /// Whether nothing at all is held.
    pub fn is_empty(&self) -> bool {
        self.cgroups.is_empty()
            && self.processes.is_empty()
            && self.sandbox_processes.is_empty()
            && self.mounts.is_empty()
            && self.state_files.is_empty()
    }

    /// Whether anything of sandbox `id` is held.
    pub fn mentions(&self, id: &str) -> bool {
        let named = |p: &PathBuf| p.to_string_lossy().contains(id);
        self.cgroups.iter().any(named)
            || self.state_files.iter().any(named)
            || self.mounts.iter().any(|m| m.contains(id))
    }
}

/// Waits until nothing of sandbox `id` is left on the host: its cgroups (and so their
/// processes), runtime directory and socket, log and mounts.
pub async fn assert_sandbox_released(state_dir: &Path, parent: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let footprint = Footprint::of(state_dir, parent);
        if !footprint.mentions(id) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "sandbox {id} was not released: {footprint:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the daemon holds nothing at all for sandboxes.
pub async fn assert_nothing_held(state_dir: &Path, parent: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let footprint = Footprint::of(state_dir, parent);
        if footprint.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon still holds sandbox resources: {footprint:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates a sandbox and runs `echo ok` in it: the daemon still works after a fault. Returns
/// the new sandbox's id.
pub async fn assert_a_new_sandbox_works(c: &client::Client) -> String {
    let fresh = c
        .create(&api_types::CreateSandbox::default())
        .await
        .expect("a new sandbox can be created")
        .id;
    let out = c
        .exec_collect(&fresh, &wire::ExecRequest::new(["echo", "ok"]))
        .await
        .expect("exec in the new sandbox");
    assert_eq!(out.stdout, b"ok\n", "exec in the new sandbox");
    fresh
}

/// Peak RSS (KiB) of the daemon and the agent while a client stalled, against their levels
/// before: neither may have buffered the command's output.
pub fn assert_stall_buffered_nothing(daemon_kib: (u64, u64), agent_kib: (u64, u64), what: &str) {
    let ((daemon_before, daemon_peak), (agent_before, agent_peak)) = (daemon_kib, agent_kib);
    eprintln!(
        "{what}: daemon RSS {daemon_before} -> {daemon_peak} KiB, \
         agent RSS {agent_before} -> {agent_peak} KiB"
    );
    assert!(
        daemon_peak <= daemon_before + 16 * 1024,
        "{what}: the daemon buffered: RSS {daemon_before} -> {daemon_peak} KiB"
    );
    assert!(
        agent_peak <= agent_before + 8 * 1024,
        "{what}: the agent buffered: RSS {agent_before} -> {agent_peak} KiB"
    );
}
