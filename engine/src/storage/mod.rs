//! The host disk that sandboxes use: named caches and disk-backed writable layers (ext4
//! images, sparse on the host, each with a hard size limit), operator-declared read-only
//! volumes (and the read-only images that carry them into microVMs), and one budget that
//! bounds how much of the host's disk all of it may ever take.

mod budget;
mod caches;
mod ext4;
mod oci_images;
mod targets;
mod volume_snapshots;
mod volumes;

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

pub use budget::{BudgetLease, DiskBudget};
pub(crate) use caches::CacheLease;
pub use caches::CacheStore;
pub(crate) use ext4::{loop_device_of, mkfs_binary};
pub(crate) use ext4::{ScratchDisk, ScratchDisks};
pub use oci_images::Images;
pub(crate) use targets::{check_in_image, validate_targets};
pub(crate) use volume_snapshots::VolumeSnapshots;
pub use volumes::Volumes;

/// Why storage for a sandbox could not be had.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The request is malformed (a bad cache name, mount path, size).
    #[error("{0}")]
    Invalid(String),
    /// An image operation failed (bad or hostile input, a limit, a missing image).
    #[error(transparent)]
    Image(#[from] oci::StoreError),
    /// Granting it would take the daemon past its disk budget.
    #[error(
        "{what} needs {asked_mib} MiB of host disk, but only {left_mib} MiB of the daemon's \
         {budget_mib} MiB disk budget (crucible serve --disk-budget-mib) is left"
    )]
    OverBudget {
        /// What asked.
        what: String,
        /// How much it asked for.
        asked_mib: u64,
        /// What was left.
        left_mib: u64,
        /// The whole budget.
        budget_mib: u64,
    },
    /// A sandbox uses the cache (it cannot be removed).
    #[error("cache {name:?} is in use by sandbox {by}: remove it once no sandbox uses it")]
    CacheBusy {
        /// The cache.
        name: String,
        /// The sandbox holding it.
        by: String,
    },
    /// No such cache (of the caller's).
    #[error("no cache named {0:?}")]
    NoCache(String),
    /// No such volume.
    #[error("no volume named {name:?}; this daemon declares: {declared}")]
    NoVolume {
        /// The name asked for.
        name: String,
        /// The names the operator declared.
        declared: String,
    },
    /// A host operation failed.
    #[error("{step}")]
    Io {
        /// What was done, with its input.
        step: String,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },
}

impl StorageError {
    fn io(step: impl Into<String>, source: io::Error) -> Self {
        StorageError::Io {
            step: step.into(),
            source,
        }
    }
}

/// The built-in image's name: the image the daemon was started with, never stored here.
pub const DEFAULT_IMAGE: &str = "default";

/// The default of `crucible serve --image-max-mib`.
pub const DEFAULT_IMAGE_MAX_MIB: u64 = 4096;

/// Where `crucible serve` keeps what must outlive a sandbox (caches) or must not sit in
/// memory (disk-backed layers): `/var/lib/crucible` for root, else under `$XDG_DATA_HOME`
/// (or `~/.local/share`).
pub fn default_data_dir() -> PathBuf {
    let is_root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    if is_root {
        return PathBuf::from("/var/lib/crucible");
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("crucible")
}

/// What caches and disk-backed layers need of the host, as `crucible doctor` reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostSupport {
    /// `mkfs.ext4`, which makes their images.
    pub mkfs_ext4: Option<PathBuf>,
    /// `/dev/loop-control`, through which namespace sandboxes attach them.
    pub(crate) loop_devices: bool,
}

impl HostSupport {
    /// Looks.
    pub fn inspect() -> Self {
        HostSupport {
            mkfs_ext4: mkfs_binary(),
            loop_devices: std::path::Path::new("/dev/loop-control").exists(),
        }
    }

    /// Why caches and disk-backed layers cannot work here, if they cannot.
    pub fn problem(&self) -> Option<String> {
        match (&self.mkfs_ext4, self.loop_devices) {
            (None, _) => Some("no mkfs.ext4 (install e2fsprogs)".into()),
            (_, false) => Some("no /dev/loop-control (modprobe loop)".into()),
            _ => None,
        }
    }
}

/// How the daemon's storage is set up (`crucible serve` flags).
#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// Where caches and disk-backed layers live.
    pub data_dir: PathBuf,
    /// The most host disk, in MiB, that caches, disk-backed layers and microVM volume
    /// snapshots may take together;
    /// `None`: three quarters of the data directory's free space at startup, plus the caches
    /// already there.
    pub disk_budget_mib: Option<u64>,
    /// A new cache's size limit when its request gives none.
    pub default_cache_mib: u64,
    /// The declared read-only volumes.
    pub volumes: Volumes,
    /// The largest image archive, and unpacked tree, one import may have.
    pub image_max_mib: u64,
}

impl StorageConfig {
    /// Defaults under `data_dir`: a 4 GiB default cache size, no volumes.
    pub(crate) fn new(data_dir: PathBuf) -> Self {
        StorageConfig {
            data_dir,
            disk_budget_mib: None,
            default_cache_mib: 4096,
            volumes: Volumes::default(),
            image_max_mib: DEFAULT_IMAGE_MAX_MIB,
        }
    }
}

/// The daemon's storage: the budget and what draws on it.
#[derive(Debug)]
pub struct Storage {
    /// The disk budget.
    pub budget: Arc<DiskBudget>,
    /// Named caches.
    pub caches: Arc<CacheStore>,
    /// Disk-backed writable layers.
    pub(crate) scratch: ScratchDisks,
    /// Declared volumes.
    pub volumes: Volumes,
    /// The images that carry volumes into microVMs.
    pub(crate) volume_snapshots: VolumeSnapshots,
    /// Imported images.
    pub images: Images,
    /// Held for the daemon's lifetime: one daemon per data directory (two would each think
    /// they alone hand out its caches, and each clean the other's layers away).
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// What a sandbox holds of the storage: released once it is destroyed.
#[derive(Debug, Default)]
pub(crate) struct SandboxStorage {
    /// Its disk-backed writable layer.
    pub(crate) scratch: Option<ScratchDisk>,
    /// Its caches.
    pub caches: Vec<CacheLease>,
    /// Its image, when imported (kept, with its tree, while the sandbox lives).
    pub(crate) image: Option<oci::ImageLease>,
    /// Its containers' imported images, likewise.
    pub(crate) container_images: Vec<oci::ImageLease>,
}

impl Storage {
    /// Opens (or makes) the data directory, removes layers and volume snapshots a previous
    /// daemon left there, and finds the caches. Under live restore (`keep`) the layers and
    /// snapshots stay until [`Storage::finish_restore`]: the sandboxes taken back use theirs.
    pub fn open(config: &StorageConfig, keep: bool) -> Result<Self, StorageError> {
        let dir = &config.data_dir;
        ext4::create_private_dir(dir)?;
        let lock_path = dir.join("lock");
        let lock_file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| StorageError::io(format!("open {}", lock_path.display()), e))?;
        let lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, errno)| {
                StorageError::io(
                    format!(
                        "lock {}: another daemon uses the data directory {} (give each its \
                         own --data-dir)",
                        lock_path.display(),
                        dir.display()
                    ),
                    errno.into(),
                )
            })?;
        let caches_dir = dir.join("caches");
        let snapshots_dir = dir.join("volumes");
        let (scratch_dir, image_disks_dir) = (dir.join("scratch"), dir.join("image-disks"));
        if !keep {
            // Before the free space is measured: they are not the new daemon's.
            volume_snapshots::remove_stale(&snapshots_dir)?;
            caches::recover_stale_copies(&caches_dir)?;
        }
        let budget_mib = match config.disk_budget_mib {
            Some(mib) => mib,
            None => {
                let stat = nix::sys::statvfs::statvfs(dir).map_err(|e| {
                    StorageError::io(format!("statvfs {}", dir.display()), e.into())
                })?;
                let free = stat.blocks_available() as u64 * stat.fragment_size() as u64;
                // What is kept is counted whole, as when it was made: it takes its share again.
                let mut existing = existing_bytes(&caches_dir);
                if keep {
                    for kept in [&scratch_dir, &snapshots_dir, &image_disks_dir] {
                        existing += existing_bytes(kept);
                    }
                }
                (free / 4 * 3 + existing) / (1024 * 1024)
            }
        };
        let budget = DiskBudget::new(budget_mib);
        let caches = CacheStore::open(caches_dir, config.default_cache_mib, budget.clone())?;
        let scratch = ScratchDisks::open(scratch_dir, budget.clone(), keep)?;
        let volume_snapshots = VolumeSnapshots::open(snapshots_dir, budget.clone(), keep)?;
        let images = Images::open(
            &dir.join("images"),
            image_disks_dir,
            budget.clone(),
            config.image_max_mib,
            keep,
        )?;
        Ok(Storage {
            images,
            budget,
            caches,
            scratch,
            volumes: config.volumes.clone(),
            volume_snapshots,
            _lock: lock,
        })
    }
}

impl SandboxStorage {
    /// Lets go of it without removing anything on disk: the daemon stops under live restore
    /// and its sandbox runs on, for the next daemon to take back.
    pub(crate) fn leave(self) {
        if let Some(scratch) = self.scratch {
            scratch.leave();
        }
        for cache in self.caches {
            cache.leave();
        }
    }
}

impl Storage {
    /// Stops under live restore: the snapshots microVMs still use stay on disk for the next
    /// daemon.
    pub fn leave(&self) {
        self.volume_snapshots.leave();
        self.images.leave_disks();
    }

    /// After live restore: removes the writable layers and snapshots that no sandbox taken
    /// back (`adopted`) uses.
    pub fn finish_restore(&self, adopted: &[String]) {
        self.scratch.remove_unclaimed(adopted);
        self.caches.remove_unclaimed();
        self.volume_snapshots.remove_unclaimed();
        self.images.remove_unclaimed_disks();
    }
}

/// The full size of every image under `dir` (they are counted whole).
fn existing_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(t) if t.is_dir() => existing_bytes(&entry.path()),
            Ok(t) if t.is_file() => entry.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}
