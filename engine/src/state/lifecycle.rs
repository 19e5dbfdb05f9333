//! The engine's own start and shutdown: what an edge (the HTTP daemon, a CRI server) would
//! otherwise have to know about the host. Starting is two steps, because the edge binds its
//! listeners between them:
//!
//! 1. [`Engine::claim`] checks the settings and takes the cgroup parent (a second daemon on
//!    the same parent would take the first one's sandboxes for leftovers and kill them), then
//!    makes the state directory: nothing else on the host is touched before the lock is held;
//! 2. [`Claimed::start`] cleans up after an earlier daemon, opens the storage, declares the
//!    pools and, under live restore, takes back what an earlier daemon left running (what
//!    can be taken back is kept; the rest is cleaned up after).
//!
//! [`Engine::shutdown`] deletes every sandbox, or leaves them for the next daemon, and hands
//! back the cgroup parent's lock for the edge to drop last, once its socket is gone.

use std::path::Path;
use std::sync::Arc;

use crate::backend::leftovers::LeftoverScan;
use crate::backend::namespace::{IdRangeError, IdRanges};
use crate::backend::{cgroup, Backends};
use crate::egress::EgressProxy;
use crate::pool::PoolSpecError;
use crate::settings::EngineConfig;
use crate::storage::{Storage, StorageError};

use super::{pool_shapes, Engine};

/// Where the cgroup file systems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The user-id ranges do not fit the sandbox cap.
    #[error(transparent)]
    IdRanges(#[from] IdRangeError),
    /// Another daemon holds the cgroup parent.
    #[error(transparent)]
    CgroupParent(#[from] cgroup::ParentLockError),
    /// A declared pool is invalid.
    #[error(transparent)]
    Pool(#[from] PoolSpecError),
    /// The state directory could not be made.
    #[error("create {path}")]
    StateDir {
        /// The directory.
        path: std::path::PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// The data directory could not be opened.
    #[error("opening the data directory")]
    Storage(#[from] StorageError),
}

/// How the engine ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Every sandbox is deleted, and the cgroup parent with them.
    RemoveAll,
    /// Client sandboxes keep running for the next daemon to take back (live restore); the
    /// warm pools' sandboxes, nobody's yet, are deleted.
    LeaveRunning,
}

/// An engine's settings checked and its cgroup parent held: step one of starting.
#[derive(Debug)]
pub struct Claimed {
    config: EngineConfig,
    backends: Backends,
    lock: Option<cgroup::ParentLock>,
}

/// What the engine holds until the edge is done: drop it last.
#[must_use = "dropping it lets the next daemon take the cgroup parent"]
#[derive(Debug)]
pub struct Stopped {
    _lock: Option<cgroup::ParentLock>,
}

impl Engine {
    /// Step one of starting: checks `config` against `backends` and takes the cgroup parent
    /// (when the backends make cgroups), then makes the state directory.
    pub fn claim(config: EngineConfig, backends: Backends) -> Result<Claimed, StartError> {
        IdRanges::check(config.uid_base, config.limits.max_sandboxes)?;
        pool_shapes(&config, &backends)?;
        // A daemon that makes no cgroups neither holds a parent nor cleans one.
        let lock = match backends.make_cgroups() {
            true => Some(cgroup::ParentLock::acquire(
                &cgroup::lock_dir(),
                &config.cgroup_parent,
                &config.state_dir,
            )?),
            false => None,
        };
        create_private_dir(&config.state_dir)?;
        Ok(Claimed {
            config,
            backends,
            lock,
        })
    }

    /// Ends the engine as `mode` says; the returned guard holds the cgroup parent until it is
    /// dropped.
    pub async fn shutdown(&self, mode: ShutdownMode) -> Stopped {
        let lock = self
            .parent_lock
            .lock()
            .ok()
            .and_then(|mut held| held.take());
        match mode {
            ShutdownMode::LeaveRunning => {
                tracing::info!(
                    "shutting down with --live-restore: sandboxes keep running for the next \
                     daemon"
                );
                self.leave_all().await;
            }
            ShutdownMode::RemoveAll => {
                tracing::info!("shutting down: deleting every sandbox");
                self.remove_all().await;
                if lock.is_some() {
                    cgroup::remove_parent(Path::new(CGROUP_ROOT), &self.config.cgroup_parent);
                }
            }
        }
        Stopped { _lock: lock }
    }
}

impl Claimed {
    /// Step two: cleans up after an earlier daemon, opens the storage, declares the pools
    /// and, under live restore, takes back the sandboxes an earlier daemon left (`keys`:
    /// the API keys this daemon has; a revoked key's sandboxes are deleted).
    pub async fn start(
        self,
        egress: Arc<dyn EgressProxy>,
        keys: &[String],
    ) -> Result<Engine, StartError> {
        let Claimed {
            config,
            backends,
            lock,
        } = self;
        let live_restore = config.live_restore;
        let state_dir = config.state_dir.clone();
        // Only the daemon holding the parent removes groups under it.
        let cgroup_parent = lock.as_ref().map(|_| config.cgroup_parent.clone());
        let leftovers = LeftoverScan::for_config(&config);
        if !live_restore {
            clean_stale_sandboxes(&state_dir, cgroup_parent.as_deref(), &leftovers, &[]).await;
        }
        let storage = Storage::open(&config.storage, live_restore)?;
        let engine = Engine::with_backends(config, backends)
            .with_storage(storage)
            .with_egress(egress)
            .with_pools()?;
        if let Ok(mut held) = engine.parent_lock.lock() {
            *held = lock;
        }
        if live_restore {
            // Before anything else is cleaned: what can be taken back is kept.
            let started = std::time::Instant::now();
            let adopted = engine.restore(keys).await;
            if !adopted.is_empty() {
                tracing::info!(
                    "live restore: took back {} sandboxes in {:.1?}",
                    adopted.len(),
                    started.elapsed()
                );
            }
            clean_stale_sandboxes(&state_dir, cgroup_parent.as_deref(), &leftovers, &adopted).await;
        }
        Ok(engine)
    }
}

fn create_private_dir(path: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|source| StartError::StateDir {
            path: path.to_path_buf(),
            source,
        })
}

/// Removes what an earlier daemon left of its sandboxes but those in `keep`: their cgroups
/// (under `cgroup_parent`, when this daemon holds it), leftover VM processes, and their
/// runtime directories, logs and records.
async fn clean_stale_sandboxes(
    state_dir: &Path,
    cgroup_parent: Option<&str>,
    leftovers: &LeftoverScan,
    keep: &[String],
) {
    let removed = match cgroup_parent {
        Some(parent) => cgroup::remove_stale(Path::new(CGROUP_ROOT), parent, keep).await,
        None => 0,
    };
    // A microVM left by a daemon under live restore is in no cgroup: found by its executable
    // and arguments, a read of all of /proc kept off the runtime's threads. Awaited, so it is
    // done before the directories go and the daemon serves.
    let (scan, kept_ids) = (leftovers.clone(), keep.to_vec());
    let killed = match tokio::task::spawn_blocking(move || scan.kill(&kept_ids)).await {
        Ok(killed) => killed,
        Err(e) => {
            tracing::warn!("looking for leftover VM processes: {e}");
            0
        }
    };
    let kept = |name: &std::ffi::OsStr| {
        let name = name.to_string_lossy();
        let id = name
            .strip_suffix(".log")
            .or_else(|| name.strip_suffix(".json"))
            .unwrap_or(&name);
        keep.iter().any(|k| k == id)
    };
    let mut entries = 0;
    for sub in ["sandboxes", "logs", "records"] {
        let Ok(dir) = std::fs::read_dir(state_dir.join(sub)) else {
            continue;
        };
        for entry in dir.flatten() {
            if kept(&entry.file_name()) {
                continue;
            }
            let path = entry.path();
            let gone = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if gone.is_ok() {
                entries += 1;
            }
        }
    }
    if removed > 0 || entries > 0 || killed > 0 {
        tracing::info!(
            "cleaned up {removed} stale sandbox cgroups, {killed} leftover VM processes and \
             {entries} leftover files"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::NoEgress;

    fn config(dir: &Path) -> EngineConfig {
        let mut config = EngineConfig::new(dir.join("image"));
        config.state_dir = dir.join("state");
        config.storage = crate::storage::StorageConfig::new(dir.join("data"));
        config.storage.disk_budget_mib = Some(64);
        config.live_restore = false;
        config
    }

    #[test]
    fn a_bad_setting_is_refused_before_the_host_is_touched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut bad = config(dir.path());
        bad.uid_base = 0;
        let refused = Engine::claim(bad, Backends::new(Vec::new()));
        assert!(
            matches!(refused, Err(StartError::IdRanges(_))),
            "{refused:?}"
        );
        assert!(
            !dir.path().join("state").exists(),
            "nothing made before the checks"
        );
    }

    #[tokio::test]
    async fn start_clears_what_an_earlier_daemon_left_and_shutdown_lets_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        for leftover in ["sandboxes/sb-0123456789abcdef", "logs", "records"] {
            std::fs::create_dir_all(state.join(leftover)).expect("mkdir");
        }
        std::fs::write(state.join("logs/sb-0123456789abcdef.log"), b"old").expect("log");
        std::fs::write(state.join("records/sb-0123456789abcdef.json"), b"{}").expect("record");
        let claimed =
            Engine::claim(config(dir.path()), Backends::new(Vec::new())).expect("claimed");
        let engine = claimed
            .start(Arc::new(NoEgress), &[])
            .await
            .expect("started");
        for gone in [
            "sandboxes/sb-0123456789abcdef",
            "logs/sb-0123456789abcdef.log",
            "records/sb-0123456789abcdef.json",
        ] {
            assert!(
                !state.join(gone).exists(),
                "{gone} is an earlier daemon's leftover"
            );
        }
        assert!(engine.storage().is_ok(), "the storage is open");
        let stopped = engine.shutdown(ShutdownMode::RemoveAll).await;
        assert!(
            stopped._lock.is_none(),
            "no backend here makes cgroups: no parent held"
        );
        assert!(engine.registry.is_shutting_down());
    }
}
