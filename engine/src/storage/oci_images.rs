//! Imported images (the `oci` crate's store under `<data_dir>/images`), as the daemon uses
//! them: owned by API keys like caches (one tenant never sees, uses or replaces another's),
//! counted in the disk budget, held by the sandboxes made from them, and carried into
//! microVMs as read-only ext4 snapshots of their trees, built on first use.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use oci::store::{ImageLease, ImageRecord, Store};
use oci::unpack::Limits;

use super::caches::{owner_dir_name, owner_of_dir};
use super::{BudgetLease, DiskBudget, StorageError, VolumeSnapshots};
use crate::owner::Owner;

const MIB: u64 = 1024 * 1024;
/// Most files, directories and links one image may unpack to (a full Debian with a compiler
/// has about 20,000; a large CI image a few hundred thousand).
pub(super) const MAX_ENTRIES: u64 = 2_000_000;

/// The daemon's images.
#[derive(Debug)]
pub struct Images {
    store: Arc<Store>,
    disks: VolumeSnapshots,
    budget: Arc<DiskBudget>,
    /// The share of the budget the store takes now, recomputed after each change.
    usage: Mutex<Option<BudgetLease>>,
    max_mib: u64,
}

impl Images {
    /// The store at `dir` (made if missing; what a crashed import left is removed), with the
    /// microVM snapshots of image roots in `disks_dir` (rebuilt by each daemon) and imports
    /// bounded by `max_mib` (the archive, and the unpacked tree).
    pub(crate) fn open(
        dir: &Path,
        disks_dir: PathBuf,
        budget: Arc<DiskBudget>,
        max_mib: u64,
        keep_disks: bool,
    ) -> Result<Self, StorageError> {
        let store = Store::open(dir)?;
        let disks = VolumeSnapshots::open_for("image root", disks_dir, budget.clone(), keep_disks)?;
        let images = Images {
            store,
            disks,
            budget,
            usage: Mutex::new(None),
            max_mib,
        };
        images.account();
        Ok(images)
    }

    /// The largest archive, and unpacked tree, one import may have.
    pub fn max_mib(&self) -> u64 {
        self.max_mib
    }

    /// Counts what the store takes now in the budget (past it if need be: it is on disk).
    fn account(&self) {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        *usage = None;
        *usage = Some(
            self.budget
                .take_existing(self.store.usage_bytes().div_ceil(MIB)),
        );
    }

    /// A file for an upload to be spooled into, and an empty share of the budget that the
    /// upload grows as it arrives ([`BudgetLease::grow`]) and its unpacking grows again.
    pub fn begin_import(&self, name: &str) -> Result<(PathBuf, BudgetLease), StorageError> {
        oci::store::validate_name(name)?;
        if name == crate::storage::DEFAULT_IMAGE {
            return Err(StorageError::Invalid(format!(
                "image name {name:?} is the built-in image's"
            )));
        }
        let lease = self.budget.take(&format!("importing image {name:?}"), 0)?;
        Ok((self.store.upload_path(), lease))
    }

    /// Imports the spooled `upload` as `owner`'s image `name` (blocking work, on a blocking
    /// thread); `lease` is the budget [`Images::begin_import`] took, returned after.
    pub async fn import(
        &self,
        owner: &Owner,
        name: &str,
        upload: PathBuf,
        mut lease: BudgetLease,
    ) -> Result<ImageRecord, StorageError> {
        let store = self.store.clone();
        let (owner_key, owned_name) = (owner_dir_name(owner), name.to_string());
        // The tree may take up to the import limit, or what is left of the budget if less
        // (the upload's share stays held: its layers are stored before the tree is made).
        let tree_mib = self.max_mib.min(self.budget.left_mib());
        let what = format!("unpacking image {name:?}");
        lease.grow(&what, tree_mib)?;
        let limits = Limits {
            max_bytes: tree_mib * MIB,
            max_entries: MAX_ENTRIES,
        };
        let result = tokio::task::spawn_blocking(move || {
            store.import(&owner_key, &owned_name, &upload, limits)
        })
        .await
        .map_err(|e| {
            StorageError::io(
                format!("importing image {name:?}"),
                std::io::Error::other(e),
            )
        })?;
        drop(lease);
        self.account();
        match result {
            Err(e) if e.is_too_large() && tree_mib < self.max_mib => {
                Err(StorageError::OverBudget {
                    what: format!("{what} (past {tree_mib} MiB)"),
                    asked_mib: tree_mib + 1,
                    left_mib: tree_mib,
                    budget_mib: self.budget.total_mib(),
                })
            }
            result => Ok(result?),
        }
    }

    /// The images `owner` may see (every owner's for `None`).
    pub fn list(&self, owner: Option<&Owner>) -> Result<Vec<ImageRecord>, StorageError> {
        let key = owner.map(owner_dir_name);
        Ok(self.store.list(key.as_deref())?)
    }

    /// `owner`'s image `name`.
    pub fn get(&self, owner: &Owner, name: &str) -> Result<ImageRecord, StorageError> {
        Ok(self.store.get(&owner_dir_name(owner), name)?)
    }

    /// Removes `owner`'s image `name` unless a sandbox uses it.
    pub fn remove(&self, owner: &Owner, name: &str) -> Result<(), StorageError> {
        self.store.remove(&owner_dir_name(owner), name)?;
        self.account();
        Ok(())
    }

    /// Removes `owner`'s images named `prefix…` that no sandbox holds and none has used for
    /// `unused_for` (`docker image prune`); blocking work, on a blocking thread.
    pub async fn prune(
        &self,
        owner: &Owner,
        prefix: &str,
        unused_for: std::time::Duration,
    ) -> Result<api_types::ImagesPruned, StorageError> {
        let store = self.store.clone();
        let (key, prefix) = (owner_dir_name(owner), prefix.to_string());
        let pruned = tokio::task::spawn_blocking(move || {
            let before = store.usage_bytes();
            let removed = store.prune(Some(&key), &prefix, unused_for)?;
            let after = store.usage_bytes();
            Ok::<_, oci::StoreError>(api_types::ImagesPruned {
                removed: removed.into_iter().map(|r| r.name).collect(),
                reclaimed_bytes: before.saturating_sub(after),
            })
        })
        .await
        .map_err(|e| StorageError::io("pruning images", std::io::Error::other(e)))??;
        self.account();
        Ok(pruned)
    }

    /// Holds `owner`'s image `name` for a new sandbox.
    pub(crate) fn lease(
        &self,
        owner: &Owner,
        name: &str,
    ) -> Result<(ImageRecord, ImageLease), StorageError> {
        Ok(self.store.lease(&owner_dir_name(owner), name)?)
    }

    /// The unpacked tree of `record`: a namespace sandbox's read-only lower layer.
    pub fn root_dir(&self, record: &ImageRecord) -> PathBuf {
        self.store.root_dir(&record.root)
    }

    /// The read-only ext4 snapshot of `record`'s tree, for a microVM's root disk: built by
    /// the first microVM that asks (after this daemon started), then shared.
    pub(crate) async fn root_disk(&self, record: &ImageRecord) -> Result<PathBuf, StorageError> {
        let dir = self.root_dir(record);
        // The snapshot code insists on a canonical path (a volume's declaration may go
        // stale); the store's own directory is canonicalised here.
        let dir = dir.canonicalize().map_err(|e| {
            StorageError::io(format!("image {:?}: {}", record.name, dir.display()), e)
        })?;
        // A chain is named by 64 hex digits; 32 of them (128 bits) name its snapshot.
        self.disks.image(&record.root.hex()[..32], &dir).await
    }

    /// The read-only ext4 snapshot of the daemon's own image tree `dir` (a microVM's
    /// container of that image): built by the first that asks, then shared.
    pub(crate) async fn tree_disk(&self, dir: &Path) -> Result<PathBuf, StorageError> {
        let dir = dir
            .canonicalize()
            .map_err(|e| StorageError::io(format!("the image tree {}", dir.display()), e))?;
        self.disks.image("daemon-image", &dir).await
    }

    /// Takes back the root disk of `record` an earlier daemon built, which a microVM taken
    /// back still boots from (live restore).
    pub(crate) async fn reclaim_root_disk(
        &self,
        record: &ImageRecord,
    ) -> Result<PathBuf, StorageError> {
        self.disks.reclaim(&record.root.hex()[..32]).await
    }

    /// Leaves the root disks on disk when dropped (the daemon stops under live restore).
    pub(crate) fn leave_disks(&self) {
        self.disks.leave();
    }

    /// Removes the root disks no microVM taken back boots from (after live restore).
    pub(crate) fn remove_unclaimed_disks(&self) {
        self.disks.remove_unclaimed();
    }

    /// The owner an image record names, for the API (`None` for a record of no known owner).
    pub fn owner_of(record: &ImageRecord) -> Option<Owner> {
        owner_of_dir(&record.owner)
    }
}
