//! Named caches: an ext4 image per cache and owner, kept between sandboxes, mounted read-write
//! into one sandbox at a time.
//!
//! One writer at a time is the concurrency rule: an ext4 cannot be mounted twice, and merging
//! two sandboxes' changes to a package cache has no right answer. A request for a cache in use
//! is refused (409) at once rather than queued, so a CI system can fall back to running cold
//! or to another cache name. Caches are per owner (API key): one tenant can never read or
//! poison another's.
//!
//! Caches are also per backend. A namespace sandbox's cache is written by the host kernel's
//! ext4 on the sandbox's behalf; a microVM's is written block by block by its guest, which
//! can shape the bytes any way it likes. Mounting such an image in the host kernel would hand a
//! hostile guest the host's ext4 parser, so a microVM's caches are only ever given to microVMs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use api_types::{BackendKind, CacheInfo};

use super::ext4::{create_private_dir, make_image, wait_detached, Journal};
use super::{BudgetLease, DiskBudget, StorageError};
use crate::owner::Owner;

/// How long an acquire waits for the cache's previous sandbox's mount to be gone.
const DETACH_WAIT: Duration = Duration::from_secs(10);
/// Largest cache name.
const MAX_NAME: usize = 64;

/// Where an owner's caches live: `unix` or `key-<name>` (key names are `[A-Za-z0-9_.-]`, so
/// this is always one plain path component).
pub(crate) fn owner_dir_name(owner: &Owner) -> String {
    match owner {
        Owner::Unix => "unix".into(),
        Owner::Key(name) => format!("key-{name}"),
    }
}

pub(crate) fn owner_of_dir(name: &str) -> Option<Owner> {
    if name == "unix" {
        return Some(Owner::Unix);
    }
    name.strip_prefix("key-")
        .filter(|key| crate::owner::is_valid_name(key))
        .map(|key| Owner::Key(key.into()))
}

/// Checks a cache name: 1 to 64 of `[A-Za-z0-9._-]`, not starting with `.`.
pub(crate) fn validate_name(name: &str) -> Result<(), StorageError> {
    let ok = (1..=MAX_NAME).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(StorageError::Invalid(format!(
            "cache name {name:?}: must be 1 to {MAX_NAME} of A-Z a-z 0-9 . _ - and not start \
             with ."
        )))
    }
}

/// (backend directory, owner directory, name).
type Key = (String, String, String);

/// The directory of a backend's caches.
fn backend_dir(backend: BackendKind) -> &'static str {
    match backend {
        BackendKind::Namespace => "namespace",
        BackendKind::Microvm => "microvm",
        BackendKind::Process => "process",
    }
}

fn backend_of_dir(name: &str) -> Option<BackendKind> {
    [
        BackendKind::Namespace,
        BackendKind::Microvm,
        BackendKind::Process,
    ]
    .into_iter()
    .find(|b| backend_dir(*b) == name)
}

#[derive(Debug, Default)]
struct Held {
    /// The sandbox holding each cache in use.
    in_use: HashMap<Key, String>,
    /// Each cache's share of the disk budget, for as long as it exists.
    leases: HashMap<Key, BudgetLease>,
}

/// Every cache, on disk under one directory.
#[derive(Debug)]
pub struct CacheStore {
    dir: PathBuf,
    default_size_mib: u64,
    budget: Arc<DiskBudget>,
    held: Mutex<Held>,
}

/// A cache mounted in one sandbox; it is free for the next once this is dropped (and the
/// next waits for the old mount to be fully gone).
#[derive(Debug)]
pub(crate) struct CacheLease {
    store: Arc<CacheStore>,
    key: Key,
    path: PathBuf,
}

impl CacheLease {
    /// The cache's image.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for CacheLease {
    fn drop(&mut self) {
        self.store.held().in_use.remove(&self.key);
    }
}

impl CacheStore {
    /// The caches under `dir`; those already there take their share of `budget`.
    pub(crate) fn open(
        dir: PathBuf,
        default_size_mib: u64,
        budget: Arc<DiskBudget>,
    ) -> Result<Arc<Self>, StorageError> {
        create_private_dir(&dir)?;
        let store = CacheStore {
            dir,
            default_size_mib,
            budget,
            held: Mutex::new(Held::default()),
        };
        for (key, path) in store.on_disk()? {
            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            let lease = store.budget.take_existing(size.div_ceil(1024 * 1024));
            store.held().leases.insert(key, lease);
        }
        Ok(Arc::new(store))
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn image_path(&self, key: &Key) -> PathBuf {
        self.dir
            .join(&key.0)
            .join(&key.1)
            .join(format!("{}.ext4", key.2))
    }

    /// Every cache image on disk, with its key.
    fn on_disk(&self) -> Result<Vec<(Key, PathBuf)>, StorageError> {
        let read = |dir: &Path| {
            std::fs::read_dir(dir)
                .map_err(|e| StorageError::io(format!("list {}", dir.display()), e))
        };
        let mut found = Vec::new();
        for backend in read(&self.dir)?.flatten() {
            let backend_name = backend.file_name().to_string_lossy().into_owned();
            if backend_of_dir(&backend_name).is_none() {
                continue;
            }
            for owner in read(&backend.path())?.flatten() {
                let owner_name = owner.file_name().to_string_lossy().into_owned();
                if owner_of_dir(&owner_name).is_none() {
                    continue;
                }
                for image in read(&owner.path())?.flatten() {
                    let file = image.file_name().to_string_lossy().into_owned();
                    if let Some(name) = file.strip_suffix(".ext4") {
                        if validate_name(name).is_ok() {
                            let key = (backend_name.clone(), owner_name.clone(), name.to_string());
                            found.push((key, image.path()));
                        }
                    }
                }
            }
        }
        found.sort();
        Ok(found)
    }

    /// Takes cache `name` of `owner` for sandbox `sandbox` on `backend`, making it (of
    /// `size_mib`, else the default size) if it does not exist yet.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        owner: &Owner,
        name: &str,
        size_mib: Option<u64>,
        sandbox: &str,
        backend: BackendKind,
    ) -> Result<CacheLease, StorageError> {
        validate_name(name)?;
        if size_mib == Some(0) {
            return Err(StorageError::Invalid(format!(
                "cache {name:?}: size_mib must be at least 1"
            )));
        }
        let key = (
            backend_dir(backend).to_string(),
            owner_dir_name(owner),
            name.to_string(),
        );
        let path = self.image_path(&key);
        let new_lease = {
            let mut held = self.held();
            if let Some(by) = held.in_use.get(&key) {
                return Err(StorageError::CacheBusy {
                    name: name.to_string(),
                    by: by.clone(),
                });
            }
            held.in_use.insert(key.clone(), sandbox.to_string());
            if held.leases.contains_key(&key) {
                None
            } else {
                let size = size_mib.unwrap_or(self.default_size_mib);
                match self.budget.take(&format!("cache {name:?}"), size) {
                    Ok(lease) => Some((lease, size)),
                    Err(e) => {
                        held.in_use.remove(&key);
                        return Err(e);
                    }
                }
            }
        };
        // From here on the lease releases the cache if anything fails.
        let lease = CacheLease {
            store: self.clone(),
            key: key.clone(),
            path: path.clone(),
        };
        if let Some((budget, size)) = new_lease {
            if let Some(dir) = path.parent() {
                create_private_dir(dir)?;
            }
            make_image(&path, size, Journal::Yes).await?;
            self.held().leases.insert(key, budget);
        }
        wait_detached(&path, DETACH_WAIT).await?;
        Ok(lease)
    }

    /// Takes back cache `name` of `owner` for sandbox `sandbox` on `backend`, which an earlier
    /// daemon gave it (live restore): the cache must be on disk and held by no other sandbox
    /// here. The caller checks, through the sandbox's backend, that it really holds it.
    pub(crate) fn reclaim(
        self: &Arc<Self>,
        owner: &Owner,
        name: &str,
        sandbox: &str,
        backend: BackendKind,
    ) -> Result<CacheLease, StorageError> {
        validate_name(name)?;
        let key = (
            backend_dir(backend).to_string(),
            owner_dir_name(owner),
            name.to_string(),
        );
        let path = self.image_path(&key);
        let mut held = self.held();
        if !held.leases.contains_key(&key) {
            return Err(StorageError::NoCache(name.to_string()));
        }
        if let Some(by) = held.in_use.get(&key) {
            return Err(StorageError::CacheBusy {
                name: name.to_string(),
                by: by.clone(),
            });
        }
        held.in_use.insert(key.clone(), sandbox.to_string());
        drop(held);
        Ok(CacheLease {
            store: self.clone(),
            key,
            path,
        })
    }

    /// The caches `owner` may see (all of them for `None`).
    pub fn list(&self, owner: Option<&Owner>) -> Result<Vec<CacheInfo>, StorageError> {
        let want = owner.map(owner_dir_name);
        let held = self.held();
        let mut caches = Vec::new();
        for (key, path) in self.on_disk()? {
            if want.as_ref().is_some_and(|w| *w != key.1) {
                continue;
            }
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            use std::os::unix::fs::MetadataExt;
            let created = meta
                .created()
                .or_else(|_| meta.modified())
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64);
            caches.push(CacheInfo {
                name: key.2.clone(),
                owner: owner_of_dir(&key.1).map_or(key.1.clone(), |o| o.to_string()),
                backend: backend_of_dir(&key.0).unwrap_or(BackendKind::Namespace),
                size_mib: meta.len().div_ceil(1024 * 1024),
                used_mib: (meta.blocks() * 512).div_ceil(1024 * 1024),
                in_use_by: held.in_use.get(&key).cloned(),
                created_at_ms: created,
            });
        }
        Ok(caches)
    }

    /// Deletes cache `name` of `owner` (of every backend), unless a sandbox uses it.
    pub fn remove(&self, owner: &Owner, name: &str) -> Result<(), StorageError> {
        validate_name(name)?;
        let mut held = self.held();
        let keys: Vec<Key> = [
            BackendKind::Namespace,
            BackendKind::Microvm,
            BackendKind::Process,
        ]
        .into_iter()
        .map(|b| {
            (
                backend_dir(b).to_string(),
                owner_dir_name(owner),
                name.to_string(),
            )
        })
        .collect();
        for key in &keys {
            if let Some(by) = held.in_use.get(key) {
                return Err(StorageError::CacheBusy {
                    name: name.to_string(),
                    by: by.clone(),
                });
            }
        }
        let mut removed = false;
        for key in keys {
            let path = self.image_path(&key);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    held.leases.remove(&key);
                    removed = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io(format!("remove {}", path.display()), e)),
            }
        }
        if removed {
            Ok(())
        } else {
            Err(StorageError::NoCache(name.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: BackendKind = BackendKind::Namespace;

    fn store(budget_mib: u64) -> (tempfile::TempDir, Arc<CacheStore>, Arc<DiskBudget>) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let budget = DiskBudget::new(budget_mib);
        let store = CacheStore::open(tmp.path().join("caches"), 64, budget.clone()).expect("open");
        (tmp, store, budget)
    }

    #[tokio::test]
    async fn one_sandbox_at_a_time_and_each_owner_has_its_own() {
        let (_tmp, store, budget) = store(1000);
        let alice = Owner::Key("alice".into());
        let lease = store
            .acquire(&alice, "cargo", None, "sb-1", NS)
            .await
            .expect("made");
        assert_eq!(budget.taken_mib(), 64);
        match store.acquire(&alice, "cargo", None, "sb-2", NS).await {
            Err(StorageError::CacheBusy { by, .. }) => assert_eq!(by, "sb-1"),
            other => panic!("expected busy, got {other:?}"),
        }
        assert!(matches!(
            store.remove(&alice, "cargo"),
            Err(StorageError::CacheBusy { .. })
        ));
        // Another owner's cache of the same name is another cache.
        let bob = store
            .acquire(&Owner::Key("bob".into()), "cargo", Some(32), "sb-3", NS)
            .await
            .expect("bob's own");
        assert_ne!(bob.path(), lease.path());
        let listed = store.list(Some(&alice)).expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].in_use_by.as_deref(), Some("sb-1"));
        assert_eq!(listed[0].size_mib, 64);
        assert_eq!(store.list(None).expect("all").len(), 2);
        drop(lease);
        let again = store
            .acquire(&alice, "cargo", Some(999), "sb-4", NS)
            .await
            .expect("free again");
        assert_eq!(
            std::fs::metadata(again.path()).expect("stat").len(),
            64 << 20,
            "an existing cache keeps its size"
        );
        drop(again);
        store.remove(&alice, "cargo").expect("removed");
        assert_eq!(budget.taken_mib(), 32);
        assert!(matches!(
            store.remove(&alice, "cargo"),
            Err(StorageError::NoCache(_))
        ));
    }

    #[tokio::test]
    async fn bad_names_and_sizes_past_the_budget_are_refused_and_leave_nothing_held() {
        let (_tmp, store, budget) = store(100);
        for bad in ["", ".hidden", "a/b", "..", &"x".repeat(65), "sp ace"] {
            assert!(
                matches!(
                    store.acquire(&Owner::Unix, bad, None, "sb-1", NS).await,
                    Err(StorageError::Invalid(_))
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            store
                .acquire(&Owner::Unix, "big", Some(101), "sb-1", NS)
                .await,
            Err(StorageError::OverBudget { .. })
        ));
        assert_eq!(budget.taken_mib(), 0);
        store
            .acquire(&Owner::Unix, "big", Some(100), "sb-1", NS)
            .await
            .expect("not held by the refusal");
    }

    #[tokio::test]
    async fn caches_on_disk_are_found_again_and_count_against_the_budget() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("caches");
        {
            let store = CacheStore::open(dir.clone(), 40, DiskBudget::new(100)).expect("open");
            drop(store.acquire(&Owner::Unix, "npm", None, "sb-1", NS).await);
        }
        let budget = DiskBudget::new(100);
        let store = CacheStore::open(dir, 40, budget.clone()).expect("reopen");
        assert_eq!(budget.taken_mib(), 40);
        let listed = store.list(None).expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].name.as_str(), listed[0].owner.as_str()),
            ("npm", "unix")
        );
    }

    #[tokio::test]
    async fn a_microvm_cache_is_never_given_to_a_namespace_sandbox() {
        let (_tmp, store, _budget) = store(1000);
        let vm = store
            .acquire(&Owner::Unix, "pip", None, "sb-1", BackendKind::Microvm)
            .await
            .expect("a VM's cache");
        let host = store
            .acquire(&Owner::Unix, "pip", None, "sb-2", NS)
            .await
            .expect("another cache of the same name");
        assert_ne!(
            vm.path(),
            host.path(),
            "guest-written images stay with guests"
        );
        let backends: Vec<_> = store
            .list(None)
            .expect("list")
            .iter()
            .map(|c| c.backend)
            .collect();
        assert_eq!(backends, [BackendKind::Microvm, NS]);
        drop((vm, host));
        store.remove(&Owner::Unix, "pip").expect("both go");
        assert!(store.list(None).expect("list").is_empty());
    }
}
