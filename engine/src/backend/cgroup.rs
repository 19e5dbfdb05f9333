//! Per-sandbox cgroups: a memory limit, a process limit and a CPU quota, on cgroup v2 where it
//! is mounted and on the v1 hierarchies otherwise (this project's CI host has only v1).

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use api_types::BackendKind;

use super::supervised::{pidfd_kill, pidfd_open};

/// The limits to apply.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CgroupLimits {
    /// Memory limit in bytes (swap is not allowed on top).
    pub(crate) memory_bytes: u64,
    /// Most processes.
    pub(crate) pids: u64,
    /// CPU quota in whole CPUs.
    pub(crate) cpus: u32,
}

/// The cgroups of one sandbox.
#[derive(Debug)]
pub(crate) struct SandboxCgroups {
    /// The sandbox's groups, one per hierarchy: its limits, and what it uses in all.
    dirs: Vec<PathBuf>,
    /// The groups its supervisor joins (and with it the agents): `dirs`, but on cgroup v2 the
    /// agents' leaf when the commands have one beside it.
    members: Vec<PathBuf>,
    /// The commands' own group inside the sandbox's process-limit group, if there is one.
    commands: Option<PathBuf>,
}

/// The name of the commands' group inside a sandbox's process-limit group.
const COMMANDS_GROUP: &str = "commands";

/// On cgroup v2, the agents' group beside the commands': a v2 group that hands a controller
/// to its children may hold no process itself.
const AGENT_GROUP: &str = "agent";

/// How many of a sandbox's processes the commands may use: all but a reserve (at most 64, at
/// most a quarter) that keeps the agent able to answer (a connection thread, the next
/// command's first process) when the commands have used up theirs — a fork bomb, or `sleep &`
/// left behind by thousands. A microVM's agent has the same headroom from its own cgroup.
fn commands_pids(total: u64) -> u64 {
    total - (total / 4).min(64)
}

const CFS_PERIOD_US: u64 = 100_000;

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("write {value:?} to {}: {e}", path.display()),
        )
    })
}

fn mkdir(path: &Path) -> io::Result<()> {
    fs::create_dir_all(path)
        .map_err(|e| io::Error::new(e.kind(), format!("create cgroup {}: {e}", path.display())))
}

impl SandboxCgroups {
    /// Creates the sandbox's cgroups under `root` (normally `/sys/fs/cgroup`), in the `parent`
    /// group of each controller.
    pub(crate) fn create(
        root: &Path,
        parent: &str,
        id: &str,
        limits: CgroupLimits,
    ) -> io::Result<Self> {
        if root.join("cgroup.controllers").exists() {
            Self::create_v2(root, parent, id, limits)
        } else {
            Self::create_v1(root, parent, id, limits)
        }
    }

    fn create_v2(root: &Path, parent: &str, id: &str, limits: CgroupLimits) -> io::Result<Self> {
        let parent = root.join(parent);
        mkdir(&parent)?;
        // Delegate the controllers to our children; missing ones are simply not limited.
        for controller in ["+memory", "+pids", "+cpu"] {
            let _ = write(&root.join("cgroup.subtree_control"), controller);
            let _ = write(&parent.join("cgroup.subtree_control"), controller);
        }
        let dir = parent.join(id);
        mkdir(&dir)?;
        let mut group = SandboxCgroups {
            dirs: vec![dir.clone()],
            members: vec![dir.clone()],
            commands: None,
        };
        write(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
        let _ = write(&dir.join("memory.swap.max"), "0");
        write(&dir.join("pids.max"), &limits.pids.to_string())?;
        let _ = write(
            &dir.join("cpu.max"),
            &format!("{} {CFS_PERIOD_US}", u64::from(limits.cpus) * CFS_PERIOD_US),
        );
        // The commands' process limit needs the pids controller handed down; where it cannot
        // be, they share the sandbox's group as they did before.
        match write(&dir.join("cgroup.subtree_control"), "+pids") {
            Ok(()) => {
                let (agent, commands) = (dir.join(AGENT_GROUP), dir.join(COMMANDS_GROUP));
                mkdir(&agent)?;
                mkdir(&commands)?;
                write(
                    &commands.join("pids.max"),
                    &commands_pids(limits.pids).to_string(),
                )?;
                group.members = vec![agent];
                group.commands = Some(commands);
            }
            Err(e) => tracing::info!("commands share their sandbox's process limit: {e}"),
        }
        Ok(group)
    }

    fn create_v1(root: &Path, parent: &str, id: &str, limits: CgroupLimits) -> io::Result<Self> {
        let mut group = SandboxCgroups {
            dirs: Vec::new(),
            members: Vec::new(),
            commands: None,
        };
        let memory = root.join("memory");
        if !memory.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no cgroup memory controller under {} (neither v2 nor v1 is mounted)",
                    root.display()
                ),
            ));
        }
        let dir = memory.join(parent).join(id);
        mkdir(&dir)?;
        group.dirs.push(dir.clone());
        write(
            &dir.join("memory.limit_in_bytes"),
            &limits.memory_bytes.to_string(),
        )?;
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write(&memsw, &limits.memory_bytes.to_string())?;
        }
        let pids = root.join("pids");
        if pids.is_dir() {
            let dir = pids.join(parent).join(id);
            mkdir(&dir)?;
            group.dirs.push(dir.clone());
            write(&dir.join("pids.max"), &limits.pids.to_string())?;
            let commands = dir.join(COMMANDS_GROUP);
            mkdir(&commands)?;
            write(
                &commands.join("pids.max"),
                &commands_pids(limits.pids).to_string(),
            )?;
            group.commands = Some(commands);
        }
        let cpu = root.join("cpu");
        if cpu.is_dir() {
            let dir = cpu.join(parent).join(id);
            mkdir(&dir)?;
            group.dirs.push(dir.clone());
            write(&dir.join("cpu.cfs_period_us"), &CFS_PERIOD_US.to_string())?;
            write(
                &dir.join("cpu.cfs_quota_us"),
                &(u64::from(limits.cpus) * CFS_PERIOD_US).to_string(),
            )?;
        }
        // Accounting only, for `GET /sandboxes/{id}/stats`: where cpuacct is a hierarchy of
        // its own (not mounted with cpu, which made the group above already).
        let cpuacct = root.join("cpuacct");
        if cpuacct.is_dir() && !same_hierarchy(&cpuacct, &cpu) {
            let dir = cpuacct.join(parent).join(id);
            mkdir(&dir)?;
            group.dirs.push(dir);
        }
        group.members = group.dirs.clone();
        Ok(group)
    }

    /// The groups an earlier daemon made for sandbox `id` (live restore), found where
    /// [`SandboxCgroups::create`] makes them, never created: each must exist and hold `pid`
    /// (the sandbox's supervisor), or the sandbox is not as it was left.
    pub(crate) fn adopt(root: &Path, parent: &str, id: &str, pid: i32) -> io::Result<Self> {
        let v2 = root.join("cgroup.controllers").exists();
        let dirs: Vec<PathBuf> = if v2 {
            vec![root.join(parent).join(id)]
        } else {
            ["memory", "pids", "cpu", "cpuacct"]
                .iter()
                .map(|c| root.join(c))
                .filter(|c| c.is_dir())
                .filter(|c| !(c.ends_with("cpuacct") && same_hierarchy(c, &root.join("cpu"))))
                .map(|c| c.join(parent).join(id))
                .collect()
        };
        let members: Vec<PathBuf> = dirs
            .iter()
            .map(|dir| match dir.join(AGENT_GROUP) {
                agent if v2 && agent.is_dir() => agent,
                _ => dir.clone(),
            })
            .collect();
        for dir in &members {
            let procs = fs::read_to_string(dir.join("cgroup.procs"))
                .map_err(|e| io::Error::new(e.kind(), format!("cgroup {}: {e}", dir.display())))?;
            if !procs.split_whitespace().any(|p| p == pid.to_string()) {
                return Err(io::Error::other(format!(
                    "cgroup {} does not hold its supervisor (pid {pid})",
                    dir.display()
                )));
            }
        }
        let commands = dirs
            .iter()
            .map(|dir| dir.join(COMMANDS_GROUP))
            .find(|commands| commands.is_dir());
        Ok(SandboxCgroups {
            dirs,
            members,
            commands,
        })
    }

    /// Sets new limits on the running sandbox's groups (either may be left as it is), as
    /// [`SandboxCgroups::create`] set them: memory (and v1's memory+swap, in the order the
    /// kernel takes), CPU quota.
    pub(crate) fn set_limits(
        &self,
        memory_bytes: Option<u64>,
        cpus: Option<u32>,
    ) -> io::Result<()> {
        for dir in &self.dirs {
            if let Some(bytes) = memory_bytes {
                let bytes = bytes.to_string();
                if dir.join("memory.max").exists() {
                    write(&dir.join("memory.max"), &bytes)?;
                }
                let (memory, memsw) = (
                    dir.join("memory.limit_in_bytes"),
                    dir.join("memory.memsw.limit_in_bytes"),
                );
                if memory.exists() {
                    // memory+swap may never be below memory: raised first when growing.
                    if write(&memory, &bytes).is_err() && memsw.exists() {
                        write(&memsw, &bytes)?;
                        write(&memory, &bytes)?;
                    } else if memsw.exists() {
                        write(&memsw, &bytes)?;
                    }
                }
            }
            if let Some(cpus) = cpus {
                let quota = u64::from(cpus) * CFS_PERIOD_US;
                if dir.join("cpu.max").exists() {
                    write(&dir.join("cpu.max"), &format!("{quota} {CFS_PERIOD_US}"))?;
                }
                if dir.join("cpu.cfs_quota_us").exists() {
                    write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// What the sandbox uses now (fields the kernel does not report are 0).
    pub(crate) fn stats(&self) -> wire::SandboxStats {
        let value = |file: &str| -> Option<String> {
            self.dirs
                .iter()
                .find_map(|dir| fs::read_to_string(dir.join(file)).ok())
        };
        let number =
            |file: &str| -> u64 { value(file).and_then(|v| v.trim().parse().ok()).unwrap_or(0) };
        let keyed = |file: &str, key: &str| -> u64 {
            value(file)
                .and_then(|text| {
                    text.lines().find_map(|line| {
                        let (k, v) = line.split_once(' ')?;
                        (k == key).then(|| v.trim().parse().ok()).flatten()
                    })
                })
                .unwrap_or(0)
        };
        let v2 = value("memory.current").is_some();
        let memory = if v2 {
            wire::MemoryStats {
                usage_bytes: number("memory.current"),
                limit_bytes: number("memory.max"),
                max_usage_bytes: number("memory.peak"),
                cache_bytes: keyed("memory.stat", "file"),
                oom_kills: keyed("memory.events", "oom_kill"),
            }
        } else {
            wire::MemoryStats {
                usage_bytes: number("memory.usage_in_bytes"),
                limit_bytes: number("memory.limit_in_bytes"),
                max_usage_bytes: number("memory.max_usage_in_bytes"),
                cache_bytes: keyed("memory.stat", "total_cache"),
                oom_kills: keyed("memory.oom_control", "oom_kill"),
            }
        };
        let cpu = wire::CpuStats {
            usage_ns: if v2 {
                keyed("cpu.stat", "usage_usec") * 1000
            } else {
                number("cpuacct.usage")
            },
        };
        let pids = wire::PidsStats {
            current: number("pids.current"),
            // "max" (no limit) parses as nothing: 0.
            limit: number("pids.max"),
        };
        wire::SandboxStats {
            memory,
            cpu,
            pids,
            // Not the cgroups' to know: the backend fills it in.
            disk: wire::DiskStats::default(),
        }
    }

    /// The `cgroup.procs` files the sandbox's supervisor writes its pid into to join every
    /// group.
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        self.members
            .iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    /// The `cgroup.procs` file that moves a command into the commands' group, whose process
    /// limit leaves the agents a reserve.
    pub(crate) fn commands_procs_file(&self) -> Option<PathBuf> {
        self.commands.as_ref().map(|d| d.join("cgroup.procs"))
    }

    /// Removes the groups. Their processes must be dying: the daemon has killed the sandbox's
    /// supervisor, but the kernel tears the PID namespace down after that, and on a loaded
    /// host that can take seconds. So an in-use group is retried with a growing pause, for up
    /// to about 15 s in all.
    pub(crate) async fn remove(&self) -> io::Result<()> {
        // A group with a child group cannot go: the commands' and the agents' first.
        let children = self
            .dirs
            .iter()
            .flat_map(|d| [d.join(COMMANDS_GROUP), d.join(AGENT_GROUP)]);
        for dir in children.chain(self.dirs.iter().cloned()) {
            let dir = &dir;
            let mut pause = Duration::from_millis(2);
            let mut waited = Duration::ZERO;
            loop {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) if waited < Duration::from_secs(15) && e.raw_os_error() == Some(16) => {
                        tokio::time::sleep(pause).await;
                        waited += pause;
                        pause = (pause * 2).min(Duration::from_millis(250));
                    }
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("remove cgroup {}: {e}", dir.display()),
                        ))
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether two v1 controller directories are one hierarchy (`cpu` and `cpuacct` are often
/// mounted together and linked under both names).
fn same_hierarchy(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The daemon's parent group in each hierarchy the sandboxes' groups are made in: the root
/// itself on cgroup v2, each controller's on v1 (never both: a v1 controller named like the
/// parent is not the parent).
fn parent_dirs(root: &Path, parent: &str) -> Vec<PathBuf> {
    if root.join("cgroup.controllers").exists() {
        return vec![root.join(parent)];
    }
    ["memory", "pids", "cpu", "cpuacct"]
        .iter()
        .map(|controller| root.join(controller).join(parent))
        .collect()
}

/// The processes (thread-group ids) `group` holds now.
fn members(group: &Path) -> io::Result<Vec<i32>> {
    Ok(fs::read_to_string(group.join("cgroup.procs"))?
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect())
}

/// SIGKILLs `pid` if it is a member of `group`, and only then. A pid read from `cgroup.procs`
/// may have been freed and given to another process since: a pidfd pins the process first,
/// membership is checked again with it held, and the signal goes through the pidfd, so it
/// reaches that process or, if it has exited meanwhile, no one. Whether it was killed.
fn kill_member(group: &Path, pid: i32) -> io::Result<bool> {
    let pidfd = match pidfd_open(pid) {
        Ok(pidfd) => pidfd,
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ESRCH as i32) => return Ok(false),
        Err(e) => return Err(e),
    };
    if !members(group)?.contains(&pid) {
        return Ok(false);
    }
    pidfd_kill(&pidfd)?;
    Ok(true)
}

/// Kills the processes of, and removes, every leftover sandbox cgroup under `parent` (from a
/// daemon that died) but those of the sandboxes in `keep` (taken back by live restore).
/// Only groups named as this project names sandboxes are touched: anything else under the
/// parent (another daemon's nested parent, an operator's group) is not ours to kill. The
/// caller holds the parent ([`ParentLock`]), so no running daemon's sandbox is among them.
/// Returns how many groups were removed.
pub async fn remove_stale(root: &Path, parent: &str, keep: &[String]) -> usize {
    let mut removed = 0;
    for parent in parent_dirs(root, parent) {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            if !dir.is_dir() || keep.iter().any(|id| entry.file_name() == id.as_str()) {
                continue;
            }
            if !entry
                .file_name()
                .to_str()
                .is_some_and(crate::ids::is_valid_id)
            {
                tracing::warn!(
                    "leaving cgroup {} alone: not named as a sandbox's",
                    dir.display()
                );
                continue;
            }
            for group in [dir.clone(), dir.join(COMMANDS_GROUP), dir.join(AGENT_GROUP)] {
                let Ok(pids) = members(&group) else {
                    continue;
                };
                for pid in pids {
                    if let Err(e) = kill_member(&group, pid) {
                        tracing::warn!("killing pid {pid} of {}: {e}", group.display());
                    }
                }
            }
            let group = SandboxCgroups {
                members: vec![dir.clone()],
                dirs: vec![dir],
                commands: None,
            };
            if group.remove().await.is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// Removes the daemon's parent groups when they are empty (daemon shutdown).
pub fn remove_parent(root: &Path, parent: &str) {
    for dir in parent_dirs(root, parent) {
        let _ = fs::remove_dir(dir);
    }
}

impl super::Backends {
    /// Whether one of them makes sandbox cgroups under the cgroup parent (the namespace
    /// backend; microVMs and host processes make none). Only such a daemon holds the parent
    /// ([`ParentLock`]) and cleans up under it: one that makes no cgroups has none to clean.
    pub fn make_cgroups(&self) -> bool {
        self.get(BackendKind::Namespace).is_some()
    }
}

/// Why a daemon cannot have its cgroup parent.
#[derive(Debug, thiserror::Error)]
pub enum ParentLockError {
    /// The name is not a plain relative cgroup path.
    #[error(
        "cgroup parent {0:?} is not a cgroup path: one or more names separated by '/', none \
         empty, \".\" or \"..\""
    )]
    Invalid(String),
    /// A running daemon holds it.
    #[error(
        "cgroup parent {parent:?} is in use by another daemon{holder}: each daemon needs one \
         of its own, since at startup a daemon kills every sandbox it finds under its parent \
         as a dead daemon's leftover (lock {})",
        lock.display()
    )]
    InUse {
        /// The parent.
        parent: String,
        /// Who holds it, as the holder wrote it (` (pid N, state directory DIR)`), or nothing
        /// when it could not be read.
        holder: String,
        /// The lock file.
        lock: PathBuf,
    },
    /// Making, opening, locking or writing the lock file failed.
    #[error("{step}")]
    Io {
        /// What was done, with its input.
        step: String,
        /// The failure.
        #[source]
        source: io::Error,
    },
}

/// Where daemons lock their cgroup parents: one directory for the host (`/run/crucible` for
/// root), whatever each daemon's own state directory, so that every daemon finds every
/// other's lock.
pub fn lock_dir() -> PathBuf {
    crate::settings::default_state_dir()
}

/// A cgroup parent held for the daemon's life: an exclusive `flock` on
/// `<lock_dir>/cgroup-<parent>.lock`, which holds the holder's pid and state directory for the
/// message a refused daemon gives. A daemon that dies lets go with its descriptors; one that
/// stops removes the file while it still holds it.
#[derive(Debug)]
pub struct ParentLock {
    file: nix::fcntl::Flock<fs::File>,
    path: PathBuf,
}

/// The file name of `parent`'s lock: `/` and `%` escaped, so that every parent (nested ones
/// included) has a file of its own.
fn lock_file_name(parent: &str) -> String {
    let escaped = parent.replace('%', "%25").replace('/', "%2F");
    format!("cgroup-{escaped}.lock")
}

/// Refuses a parent that is not one or more plain names separated by `/`: an absolute path or
/// a `..` would reach outside the controllers' trees, and an empty name or `.` would be the
/// hierarchy's root, whose groups cleanup would kill; one spelling per group also gives each
/// group one lock.
fn check_parent(parent: &str) -> Result<(), ParentLockError> {
    let plain = |name: &str| !name.is_empty() && name != "." && name != "..";
    if parent.split('/').all(plain) {
        Ok(())
    } else {
        Err(ParentLockError::Invalid(parent.to_string()))
    }
}

/// Whether `path` names the file `file` is open on.
fn names_file(path: &Path, file: &fs::File) -> bool {
    match (fs::symlink_metadata(path), file.metadata()) {
        (Ok(named), Ok(open)) => named.dev() == open.dev() && named.ino() == open.ino(),
        _ => false,
    }
}

/// What the holder wrote into its lock file, as ` (pid N, state directory DIR)`; nothing when
/// there is nothing to read (it may be between taking the lock and writing).
fn holder_of(file: &fs::File) -> String {
    let mut text = String::new();
    if file.take(8192).read_to_string(&mut text).is_err() {
        return String::new();
    }
    let field = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(' '))
            .filter(|value| !value.is_empty())
    };
    match (field("pid"), field("state_dir")) {
        (Some(pid), Some(dir)) => format!(" (pid {pid}, state directory {dir})"),
        (Some(pid), None) => format!(" (pid {pid})"),
        _ => String::new(),
    }
}

impl ParentLock {
    /// Takes `parent` for a daemon whose state directory is `state_dir`, or says who holds it.
    /// Never waits: a second daemon is refused at once.
    pub fn acquire(
        lock_dir: &Path,
        parent: &str,
        state_dir: &Path,
    ) -> Result<Self, ParentLockError> {
        check_parent(parent)?;
        let io_error = |step: String| move |source| ParentLockError::Io { step, source };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(lock_dir)
            .map_err(io_error(format!("create {}", lock_dir.display())))?;
        let path = lock_dir.join(lock_file_name(parent));
        // A holder that stops removes its file: if that happened between our open and our
        // lock, the lock is on a file no one else will open, so open again.
        for _ in 0..16 {
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&path)
                .map_err(io_error(format!("open {}", path.display())))?;
            let locked =
                match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                    Ok(locked) => locked,
                    Err((file, nix::errno::Errno::EWOULDBLOCK)) => {
                        return Err(ParentLockError::InUse {
                            parent: parent.to_string(),
                            holder: holder_of(&file),
                            lock: path,
                        })
                    }
                    Err((_, errno)) => {
                        return Err(io_error(format!("lock {}", path.display()))(errno.into()))
                    }
                };
            if !names_file(&path, &locked) {
                continue;
            }
            let state_dir = std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.into());
            let holder = format!(
                "pid {}\nstate_dir {}\n",
                std::process::id(),
                state_dir.display()
            );
            locked
                .set_len(0)
                .and_then(|()| locked.write_all_at(holder.as_bytes(), 0))
                .map_err(io_error(format!("write {}", path.display())))?;
            return Ok(ParentLock { file: locked, path });
        }
        Err(io_error(format!("lock {}", path.display()))(
            io::Error::other("it was removed and made again every time it was locked"),
        ))
    }
}

impl Drop for ParentLock {
    /// Removes the file while still holding it (a daemon that opened it meanwhile sees that
    /// its lock is on a removed file and opens again); the lock goes with the descriptor.
    fn drop(&mut self) {
        if names_file(&self.path, &self.file) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: CgroupLimits = CgroupLimits {
        memory_bytes: 64 << 20,
        pids: 1024,
        cpus: 1,
    };

    fn read(path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    // A cgroup filesystem is files and directories: a plain one shows the layout made, and
    // what adopting it finds (the kernel's own rules, such as no processes in a v2 group that
    // hands a controller down, are for the e2e tests).
    #[test]
    fn on_v2_the_supervisor_joins_an_agent_leaf_beside_the_commands_and_is_found_there() {
        let root = tempfile::tempdir().expect("tempdir");
        fs::write(root.path().join("cgroup.controllers"), "memory pids cpu").expect("v2");
        let group = SandboxCgroups::create(root.path(), "crucible", "sb-1", LIMITS).expect("made");
        let dir = root.path().join("crucible/sb-1");
        assert_eq!(read(&dir.join("pids.max")), "1024");
        assert_eq!(read(&dir.join("cgroup.subtree_control")), "+pids");
        assert_eq!(read(&dir.join("commands/pids.max")), "960");
        assert_eq!(group.procs_files(), [dir.join("agent/cgroup.procs")]);
        assert_eq!(
            group.commands_procs_file(),
            Some(dir.join("commands/cgroup.procs"))
        );

        fs::write(dir.join("agent/cgroup.procs"), "41\n42\n").expect("procs");
        let adopted = SandboxCgroups::adopt(root.path(), "crucible", "sb-1", 42).expect("adopt");
        assert_eq!(adopted.procs_files(), group.procs_files());
        assert_eq!(adopted.commands_procs_file(), group.commands_procs_file());
        let err = SandboxCgroups::adopt(root.path(), "crucible", "sb-1", 7).expect_err("not 7");
        assert!(err.to_string().contains("agent"), "{err}");
    }

    #[test]
    fn on_v1_the_supervisor_joins_each_hierarchy_and_the_commands_a_pids_child() {
        let root = tempfile::tempdir().expect("tempdir");
        for controller in ["memory", "pids", "cpu"] {
            fs::create_dir(root.path().join(controller)).expect("hierarchy");
        }
        let group = SandboxCgroups::create(root.path(), "crucible", "sb-1", LIMITS).expect("made");
        let pids = root.path().join("pids/crucible/sb-1");
        assert_eq!(read(&pids.join("pids.max")), "1024");
        assert_eq!(read(&pids.join("commands/pids.max")), "960");
        let expected: Vec<PathBuf> = ["memory", "pids", "cpu"]
            .iter()
            .map(|c| root.path().join(c).join("crucible/sb-1/cgroup.procs"))
            .collect();
        assert_eq!(group.procs_files(), expected);
        assert_eq!(
            group.commands_procs_file(),
            Some(pids.join("commands/cgroup.procs"))
        );
        for file in &expected {
            fs::write(file, "42\n").expect("procs");
        }
        let adopted = SandboxCgroups::adopt(root.path(), "crucible", "sb-1", 42).expect("adopt");
        assert_eq!(adopted.procs_files(), expected);
        assert_eq!(adopted.commands_procs_file(), group.commands_procs_file());
    }

    #[test]
    fn a_parent_is_held_by_one_daemon_and_a_second_is_told_which_holds_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let locks = dir.path().join("run/crucible");
        let first =
            ParentLock::acquire(&locks, "crucible/ci", Path::new("/srv/a/state")).expect("free");
        assert!(locks.join("cgroup-crucible%2Fci.lock").is_file());
        let refused = ParentLock::acquire(&locks, "crucible/ci", Path::new("/srv/b"))
            .expect_err("held")
            .to_string();
        let holder = format!("(pid {}, state directory /srv/a/state)", std::process::id());
        assert!(
            refused.contains("\"crucible/ci\" is in use by another daemon"),
            "{refused}"
        );
        assert!(refused.contains(&holder), "{refused}");
        // Another parent, even one nested in it or spelled like its escaped name, is another
        // lock.
        let nested = ParentLock::acquire(&locks, "crucible", Path::new("/srv/b")).expect("free");
        let lookalike =
            ParentLock::acquire(&locks, "crucible%2Fci", Path::new("/srv/c")).expect("free");

        drop(first);
        assert!(!locks.join("cgroup-crucible%2Fci.lock").exists(), "removed");
        let again = ParentLock::acquire(&locks, "crucible/ci", Path::new("/srv/b")).expect("free");
        let refused = ParentLock::acquire(&locks, "crucible/ci", Path::new("/srv/a/state"))
            .expect_err("held")
            .to_string();
        assert!(refused.contains("state directory /srv/b)"), "{refused}");
        drop((again, nested, lookalike));
        assert_eq!(fs::read_dir(&locks).expect("lock dir").count(), 0);
    }

    #[test]
    fn a_lock_on_a_file_its_holder_removed_is_no_lock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cgroup-x.lock");
        let file = fs::File::create(&path).expect("create");
        assert!(names_file(&path, &file));
        fs::remove_file(&path).expect("remove");
        assert!(!names_file(&path, &file), "removed");
        fs::write(&path, "").expect("made again");
        assert!(!names_file(&path, &file), "another file now");
    }

    #[test]
    fn a_parent_that_is_not_plain_names_under_the_controllers_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        for bad in [
            "",
            "/",
            "/crucible",
            "crucible/",
            "a//b",
            ".",
            "..",
            "a/../b",
            "./a",
        ] {
            match ParentLock::acquire(dir.path(), bad, dir.path()) {
                Err(ParentLockError::Invalid(name)) => assert_eq!(name, bad),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        for good in ["crucible", "ci/runner-1", "..a", "a.b/.c"] {
            ParentLock::acquire(dir.path(), good, dir.path()).expect(good);
        }
    }

    /// Test cgroups under the real hierarchy (v2's root, or v1's `pids`), removed at the end,
    /// and processes of the test's own (its children: never reaped but by it, so their pids
    /// are never another process's), killed at the end.
    struct RealGroups {
        parent: PathBuf,
        children: Vec<std::process::Child>,
    }

    impl RealGroups {
        /// A `sleep 1000` of the test's; its pid.
        fn sleeper(&mut self) -> i32 {
            let child = std::process::Command::new("sleep")
                .arg("1000")
                .spawn()
                .expect("spawn sleep");
            let pid = i32::try_from(child.id()).expect("a pid");
            self.children.push(child);
            pid
        }
    }

    impl Drop for RealGroups {
        fn drop(&mut self) {
            for child in &mut self.children {
                let _ = child.kill();
                let _ = child.wait();
            }
            if let Ok(entries) = fs::read_dir(&self.parent) {
                for entry in entries.flatten().filter(|e| e.path().is_dir()) {
                    let _ = fs::remove_dir(entry.path());
                }
            }
            let _ = fs::remove_dir(&self.parent);
        }
    }

    // Never skipped: CI runs as root, on cgroup v1.
    #[tokio::test]
    async fn a_leftover_sandbox_group_is_killed_through_pidfds_and_nothing_else_is() {
        let root = Path::new("/sys/fs/cgroup");
        let hierarchy = if root.join("cgroup.controllers").exists() {
            root.to_path_buf()
        } else {
            root.join("pids")
        };
        let name = format!("crucible-unit-stale-{}", std::process::id());
        let mut groups = RealGroups {
            parent: hierarchy.join(&name),
            children: Vec::new(),
        };
        let (sandbox, foreign) = (
            groups.parent.join("sb-00000000000000aa"),
            groups.parent.join("not-a-sandbox"),
        );
        for dir in [&sandbox, &foreign] {
            fs::create_dir_all(dir).expect("a cgroup (this test needs root)");
        }
        let (member, other, outside) = (groups.sleeper(), groups.sleeper(), groups.sleeper());
        fs::write(sandbox.join("cgroup.procs"), member.to_string()).expect("join");
        fs::write(foreign.join("cgroup.procs"), other.to_string()).expect("join");
        let running =
            |groups: &mut RealGroups, i: usize| matches!(groups.children[i].try_wait(), Ok(None));

        // A pid that is not (or no longer) the group's is not signalled.
        assert!(!kill_member(&sandbox, outside).expect("checked"));
        assert!(running(&mut groups, 2), "not a member: alive");

        assert_eq!(remove_stale(root, &name, &[]).await, 1);
        let status = groups.children[0].wait().expect("reaped");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "the member was SIGKILLed");
        assert!(!sandbox.exists(), "its group removed");
        assert!(
            running(&mut groups, 1),
            "a group not named as a sandbox's is left alone"
        );
        assert!(foreign.is_dir());
        assert!(running(&mut groups, 2));
    }

    #[test]
    fn the_commands_leave_the_agents_a_reserve_of_at_most_64_and_a_quarter() {
        assert_eq!(commands_pids(1024), 960);
        assert_eq!(commands_pids(100), 75);
        assert_eq!(commands_pids(16), 12);
        assert_eq!(commands_pids(3), 3);
        assert_eq!(commands_pids(1), 1);
    }
}
