//! Named caches: an ext4 image per cache and owner, kept between sandboxes, shared by the
//! sandboxes that run at once.
//!
//! A CI system restores a cache into every job and saves one back. So each sandbox that asks
//! for a cache mounts a copy of it of its own (a reflink where the host filesystem has them,
//! else a sparse copy of the blocks in use): it sees the cache as it was when it started, with
//! its own writes on top, and no other sandbox's. When it ends, its copy *becomes* the cache
//! (one `rename`, so a cache is always one sandbox's whole result, never a mix of two) unless
//! another sandbox's copy was saved since it started: the first to end wins, the others'
//! writes are dropped (and logged). Sandboxes one after another each save theirs. A copy its
//! sandbox never changed (its create failed before it was mounted) is dropped.
//!
//! The image a cache is made of is never mounted itself, so copying it needs no lock on the
//! sandboxes using it. Caches are per owner (API key): one tenant can never read or poison
//! another's.
//!
//! Caches are also per backend. A namespace sandbox's cache is written by the host kernel's
//! ext4 on the sandbox's behalf; a microVM's is written block by block by its guest, which
//! can shape the bytes any way it likes. Mounting such an image in the host kernel would hand a
//! hostile guest the host's ext4 parser, so a microVM's caches are only ever given to microVMs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use api_types::{BackendKind, CacheInfo};

use super::ext4::{create_private_dir, is_attached, make_image, Journal};
use super::{BudgetLease, DiskBudget, StorageError};
use crate::owner::Owner;

/// How long a copy's save waits for its sandbox's mount to be gone, and an acquire for the
/// saves before it.
const DETACH_WAIT: Duration = Duration::from_secs(10);
/// How long a sandbox waits for a spare copy being made before it makes its own.
const SPARE_WAIT: Duration = Duration::from_secs(60);
/// Largest cache name.
const MAX_NAME: usize = 64;
/// The directory, beside an owner's caches, of the copies sandboxes use now. Its name starts
/// with `.`, which no cache name may.
const COPIES_DIR: &str = ".in-use";
/// What the name of a copy never to be saved ends with, before `.ext4` (sandbox ids have no
/// `.`).
const NOSAVE: &str = ".nosave";

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
    /// The sandboxes using each cache now, in the order they came.
    users: HashMap<Key, Vec<String>>,
    /// Each cache's share of the disk budget, for as long as it exists.
    leases: HashMap<Key, BudgetLease>,
    /// How many copies have become each cache since the daemon started.
    generation: HashMap<Key, u64>,
    /// Copies of each cache being saved (or dropped) now, their sandbox ended.
    settling: HashMap<Key, usize>,
    /// The sandbox whose copy each cache last became.
    saved_by: HashMap<Key, String>,
    /// A copy of each cache made ahead, after a save, for the next sandbox to take at once.
    spares: HashMap<Key, Spare>,
    /// The caches whose spare is being made now.
    sparing: std::collections::HashSet<Key>,
}

/// A copy of a cache nobody uses yet, made in the background after its generation was saved,
/// so that the next sandbox does not wait for a copy: sandboxes one after another, the way CI
/// jobs mostly come, then start as fast as with no copy at all.
#[derive(Debug)]
struct Spare {
    /// The generation it is a copy of (it is of no use once the cache moves on).
    generation: u64,
    path: PathBuf,
    budget: BudgetLease,
}

/// Every cache, on disk under one directory.
#[derive(Debug)]
pub struct CacheStore {
    dir: PathBuf,
    default_size_mib: u64,
    budget: Arc<DiskBudget>,
    held: Mutex<Held>,
    /// Held while a cache's image is made, so two first users make it once.
    making: tokio::sync::Mutex<()>,
}

/// A sandbox's copy of a cache; dropped when the sandbox is gone, it becomes the cache (or is
/// dropped, when another copy was saved since it was made).
#[derive(Debug)]
pub(crate) struct CacheLease {
    /// What becomes of the copy once its sandbox has ended; taken when it is dropped.
    copy: Option<Settle>,
    /// Left on disk for the next daemon (live restore): neither saved nor removed.
    left: bool,
}

impl CacheLease {
    /// The image its sandbox mounts: its own copy.
    pub(crate) fn path(&self) -> &Path {
        self.copy
            .as_ref()
            .map_or(Path::new(""), |c| c.copy.as_path())
    }

    /// Lets go of it, leaving the copy on disk (live restore: its sandbox runs on).
    pub(crate) fn leave(mut self) {
        self.left = true;
    }

    /// What waits, once this is dropped, until its copy is saved or dropped.
    pub(crate) fn settled(&self) -> Option<Settled> {
        self.copy.as_ref().map(|copy| Settled {
            store: copy.store.clone(),
            key: copy.key.clone(),
        })
    }
}

/// Waits until the copies of one cache whose sandboxes ended are saved or dropped.
#[derive(Debug)]
pub(crate) struct Settled {
    store: Arc<CacheStore>,
    key: Key,
}

impl Settled {
    /// Waits, for a bounded time (a failure to wait is the store's to log, not the caller's).
    pub(crate) async fn wait(self) {
        if let Err(e) = self.store.await_settled(&self.key).await {
            tracing::warn!("{}", report::chain(&e));
        }
    }
}

impl Drop for CacheLease {
    fn drop(&mut self) {
        let Some(copy) = self.copy.take() else {
            return;
        };
        let store = copy.store.clone();
        let mut held = store.held();
        if let Some(users) = held.users.get_mut(&copy.key) {
            users.retain(|s| *s != copy.sandbox);
            if users.is_empty() {
                held.users.remove(&copy.key);
            }
        }
        if self.left {
            return;
        }
        let key = copy.key.clone();
        *held.settling.entry(key.clone()).or_default() += 1;
        drop(held);
        // Waiting for the sandbox's mount to go cannot block the caller (a sandbox's teardown).
        let spawned = std::thread::Builder::new()
            .name("cache-save".into())
            .spawn(move || copy.run());
        if let Err(e) = spawned {
            tracing::warn!("cache {:?}: cannot save a sandbox's copy: {e}", key.2);
            if let Some(n) = store.held().settling.get_mut(&key) {
                *n -= 1;
            }
        }
    }
}

/// A sandbox's copy of a cache, and what decides whether it becomes the cache.
#[derive(Debug)]
struct Settle {
    store: Arc<CacheStore>,
    key: Key,
    sandbox: String,
    copy: PathBuf,
    /// The cache's generation the copy was made from.
    base: u64,
    /// The copy's length and time when it was made: a copy that still has them was never
    /// mounted, and is not saved. `None`: never saved (not made, or its sandbox only reads).
    made: Option<(u64, SystemTime)>,
    /// The copy's share of the disk budget (it may grow to the cache's size).
    budget: Option<BudgetLease>,
}

impl Settle {
    fn run(self) {
        let name = &self.key.2;
        let deadline = Instant::now() + DETACH_WAIT;
        let mut detached = true;
        while is_attached(&self.copy) {
            if Instant::now() >= deadline {
                tracing::warn!(
                    "cache {name:?}: sandbox {}'s copy {} is still attached to a loop device \
                     after {DETACH_WAIT:?}; its writes are not kept",
                    self.sandbox,
                    self.copy.display()
                );
                detached = false;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let changed = detached
            && match (std::fs::metadata(&self.copy), self.made) {
                (Ok(meta), Some(made)) => {
                    meta.modified().ok() != Some(made.1) || meta.len() != made.0
                }
                _ => false,
            };
        let store = self.store.clone();
        let mut held = store.held();
        let generation = held.generation.get(&self.key).copied().unwrap_or(0);
        let mut kept = false;
        if changed && generation == self.base {
            let image = store.image_path(&self.key);
            match std::fs::rename(&self.copy, &image) {
                Ok(()) => {
                    kept = true;
                    held.generation.insert(self.key.clone(), generation + 1);
                    held.saved_by.insert(self.key.clone(), self.sandbox.clone());
                    if let Some(budget) = self.budget {
                        // The copy's share is now the cache's; the old image's goes back.
                        held.leases.insert(self.key.clone(), budget);
                    }
                    tracing::info!("cache {name:?}: now what sandbox {} left", self.sandbox);
                }
                Err(e) => tracing::warn!(
                    "cache {name:?}: saving sandbox {}'s copy: rename {} to {}: {e}",
                    self.sandbox,
                    self.copy.display(),
                    image.display()
                ),
            }
        } else if changed {
            tracing::info!(
                "cache {name:?}: sandbox {}'s writes are not kept: {} ended first with its own",
                self.sandbox,
                held.saved_by
                    .get(&self.key)
                    .map_or("another sandbox", |s| s.as_str())
            );
        }
        if !kept {
            remove_quietly(&self.copy);
        }
        if let Some(n) = held.settling.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.settling.remove(&self.key);
            }
        }
        drop(held);
        if kept {
            store.make_spare(&self.key);
        }
    }
}

/// The time a copy has until its sandbox writes it: one no write can give it, so its mount's
/// first write shows.
fn never_written() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1)
}

/// Makes `to` a copy of `from` dated [`never_written`]: under a name of its own until it is
/// whole, so that no half copy ever bears a copy's name. Its length.
fn make_copy(from: &Path, to: &Path) -> std::io::Result<u64> {
    let mut part = to.as_os_str().to_owned();
    part.push(".part");
    let part = PathBuf::from(part);
    let made = copy_sparse(from, &part).and_then(|()| {
        let file = std::fs::File::options().write(true).open(&part)?;
        file.set_modified(never_written())?;
        // Attaching a loop device syncs its file first: written back here, the copy costs its
        // writes where it is made (for a spare, in the background), not in a sandbox's create.
        file.sync_all()?;
        let len = file.metadata()?.len();
        std::fs::rename(&part, to)?;
        Ok(len)
    });
    if made.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    made
}

/// Copies `from` to the new file `to`, holes kept: a reflink where the filesystem has them,
/// else the ranges holding data, copied in the kernel.
fn copy_sparse(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let source = std::fs::File::open(from)?;
    let target = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    if rustix::fs::ioctl_ficlone(&target, &source).is_ok() {
        return Ok(());
    }
    let len = source.metadata()?.len();
    target.set_len(len)?;
    let mut at = 0;
    while at < len {
        let data = match rustix::fs::seek(&source, rustix::fs::SeekFrom::Data(at)) {
            Ok(data) => data,
            // Nothing but a hole from here on.
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = rustix::fs::seek(&source, rustix::fs::SeekFrom::Hole(data))?;
        let (mut read_at, mut write_at) = (data, data);
        while read_at < hole {
            let left = usize::try_from(hole - read_at).unwrap_or(usize::MAX);
            let copied = rustix::fs::copy_file_range(
                &source,
                Some(&mut read_at),
                &target,
                Some(&mut write_at),
                left,
            )?;
            if copied == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("{} ended at {read_at} of {len} bytes", from.display()),
                ));
            }
        }
        at = hole;
    }
    Ok(())
}

/// Removes `path`, which may be gone already.
fn remove_quietly(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!("remove {}: {e}", path.display());
        }
    }
}

/// Whether `name` can be part of a file name as it is.
fn is_plain(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Saves what a previous daemon's sandboxes left under `dir` (a caches directory): they
/// ended with it, all at once, so each cache becomes the copy written last of those no loop
/// device holds any more (a copy never written, or half made, is never taken), and the other
/// copies go. Before the free disk is measured, as
/// they are not the new daemon's.
pub(crate) fn recover_stale_copies(dir: &Path) -> Result<(), StorageError> {
    for copies in copy_dirs(dir) {
        let mut newest: HashMap<String, (SystemTime, PathBuf)> = HashMap::new();
        for entry in std::fs::read_dir(&copies).into_iter().flatten().flatten() {
            let path = entry.path();
            let file = entry.file_name().to_string_lossy().into_owned();
            let Some((name, _sandbox)) = file
                .strip_suffix(".ext4")
                .filter(|stem| !stem.ends_with(NOSAVE))
                .and_then(|stem| stem.split_once('@'))
            else {
                continue;
            };
            if validate_name(name).is_err() || is_attached(&path) {
                continue;
            }
            let written = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(UNIX_EPOCH);
            if written <= never_written() {
                // Its sandbox never mounted it (or never started): the cache as it was.
                continue;
            }
            if newest.get(name).is_none_or(|(time, _)| written > *time) {
                newest.insert(name.to_string(), (written, path));
            }
        }
        for (name, (_, copy)) in newest {
            let Some(owner_dir) = copies.parent() else {
                continue;
            };
            let image = owner_dir.join(format!("{name}.ext4"));
            match std::fs::rename(&copy, &image) {
                Ok(()) => tracing::info!(
                    "cache {name:?}: now what {} left when the previous daemon stopped",
                    copy.display()
                ),
                Err(e) => tracing::warn!("rename {} to {}: {e}", copy.display(), image.display()),
            }
        }
        std::fs::remove_dir_all(&copies)
            .map_err(|e| StorageError::io(format!("remove {}", copies.display()), e))?;
    }
    Ok(())
}

/// Every directory of copies under `dir`.
fn copy_dirs(dir: &Path) -> Vec<PathBuf> {
    let entries = |dir: &Path| {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect::<Vec<_>>()
    };
    entries(dir)
        .iter()
        .flat_map(|backend| entries(backend))
        .map(|owner| owner.join(COPIES_DIR))
        .filter(|copies| copies.is_dir())
        .collect()
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
            making: tokio::sync::Mutex::new(()),
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

    /// Where `sandbox`'s copy of the cache `key` is; one never to be saved says so in its
    /// name, so a daemon recovering copies leaves it out.
    fn copy_path(&self, key: &Key, sandbox: &str, save: bool) -> PathBuf {
        let kind = if save { "" } else { NOSAVE };
        self.dir
            .join(&key.0)
            .join(&key.1)
            .join(COPIES_DIR)
            .join(format!("{}@{sandbox}{kind}.ext4", key.2))
    }

    fn key(owner: &Owner, name: &str, backend: BackendKind) -> Key {
        (
            backend_dir(backend).to_string(),
            owner_dir_name(owner),
            name.to_string(),
        )
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

    /// Waits until no copy of cache `key` is being saved, so a sandbox that starts after
    /// another ended sees what that one left.
    async fn await_settled(&self, key: &Key) -> Result<(), StorageError> {
        let deadline = Instant::now() + DETACH_WAIT * 2;
        while self.held().settling.contains_key(key) {
            if Instant::now() >= deadline {
                return Err(StorageError::io(
                    format!(
                        "cache {:?}: an ended sandbox's copy is still being saved after {:?}",
                        key.2,
                        DETACH_WAIT * 2
                    ),
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Makes a [`Spare`] of cache `key` as it is now, unless it has one already or the disk
    /// budget has no room for one (then the next sandbox copies the cache itself).
    fn make_spare(&self, key: &Key) {
        let generation = {
            let mut held = self.held();
            let generation = held.generation.get(key).copied().unwrap_or(0);
            if held
                .spares
                .get(key)
                .is_some_and(|s| s.generation == generation)
                || !held.sparing.insert(key.clone())
            {
                return;
            }
            generation
        };
        self.make_spare_of(key, generation);
        self.held().sparing.remove(key);
    }

    fn make_spare_of(&self, key: &Key, generation: u64) {
        let image = self.image_path(key);
        let Ok(size) = std::fs::metadata(&image).map(|m| m.len()) else {
            return;
        };
        let what = format!("a spare copy of cache {:?}", key.2);
        let Ok(budget) = self.budget.take(&what, size.div_ceil(1024 * 1024)) else {
            return;
        };
        let path = self.copy_path(key, &format!(".spare{generation}"), true);
        if let Err(e) = make_copy(&image, &path) {
            tracing::warn!("cache {:?}: making {what}: {e}", key.2);
            return;
        }
        let mut held = self.held();
        let current = held.generation.get(key).copied().unwrap_or(0);
        if current != generation || !held.leases.contains_key(key) {
            drop(held);
            remove_quietly(&path);
            return;
        }
        let spare = Spare {
            generation,
            path,
            budget,
        };
        if let Some(old) = held.spares.insert(key.clone(), spare) {
            remove_quietly(&old.path);
        }
    }

    /// Takes cache `key`'s spare when it is a copy of the cache as it is now; one of an older
    /// generation goes.
    fn take_spare(held: &mut Held, key: &Key) -> Option<Spare> {
        let spare = held.spares.remove(key)?;
        if Some(&spare.generation) == held.generation.get(key).or(Some(&0)) {
            return Some(spare);
        }
        remove_quietly(&spare.path);
        None
    }

    /// Waits (for a bounded time) until the copies of every ended sandbox are saved or
    /// dropped: the daemon stops.
    pub(crate) async fn await_all_settled(&self) {
        let deadline = Instant::now() + DETACH_WAIT * 2;
        while !self.held().settling.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Makes cache `key` at `image` (of `size_mib`, else the default size) unless it exists.
    async fn make_if_missing(
        &self,
        key: &Key,
        image: &Path,
        name: &str,
        size_mib: Option<u64>,
    ) -> Result<(), StorageError> {
        let _making = self.making.lock().await;
        if self.held().leases.contains_key(key) {
            return Ok(());
        }
        let size = size_mib.unwrap_or(self.default_size_mib);
        let lease = self.budget.take(&format!("cache {name:?}"), size)?;
        if let Some(dir) = image.parent() {
            create_private_dir(dir)?;
        }
        make_image(image, size, Journal::Yes).await?;
        self.held().leases.insert(key.clone(), lease);
        Ok(())
    }

    /// A spare copy made ahead, of the cache as it is now, taken as sandbox `sandbox`'s own
    /// `copy`, when one is ready: the sandbox need not wait for a copy.
    async fn spare_copy(
        self: &Arc<Self>,
        key: &Key,
        sandbox: &str,
        copy: &Path,
        save: bool,
    ) -> Result<Option<CacheLease>, StorageError> {
        // A spare under way is worth its wait: it is the same copy, already begun.
        let deadline = Instant::now() + SPARE_WAIT;
        while self.held().sparing.contains(key) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let spare = {
            let mut held = self.held();
            let spare = Self::take_spare(&mut held, key);
            if spare.is_some() {
                held.users
                    .entry(key.clone())
                    .or_default()
                    .push(sandbox.to_string());
            }
            spare
        };
        if let Some(spare) = spare {
            // Made ahead, of the cache as it is now: the sandbox need not wait for a copy.
            let mut lease = CacheLease {
                copy: Some(Settle {
                    store: self.clone(),
                    key: key.clone(),
                    sandbox: sandbox.to_string(),
                    copy: copy.to_path_buf(),
                    base: spare.generation,
                    made: None,
                    budget: Some(spare.budget),
                }),
                left: false,
            };
            let taken = std::fs::rename(&spare.path, copy).and_then(|()| std::fs::metadata(copy));
            let meta = taken.map_err(|e| {
                remove_quietly(&spare.path);
                StorageError::io(
                    format!("take {} as {}", spare.path.display(), copy.display()),
                    e,
                )
            })?;
            if let Some(settle) = lease.copy.as_mut().filter(|_| save) {
                settle.made = Some((meta.len(), never_written()));
            }
            return Ok(Some(lease));
        }
        Ok(None)
    }

    /// Gives sandbox `sandbox` on `backend` a copy of cache `name` of `owner`, as it is now,
    /// making the cache (of `size_mib`, else the default size) if it does not exist yet. The
    /// copy takes the cache's size of the disk budget until its sandbox ends.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        owner: &Owner,
        name: &str,
        size_mib: Option<u64>,
        sandbox: &str,
        backend: BackendKind,
        save: bool,
    ) -> Result<CacheLease, StorageError> {
        validate_name(name)?;
        if size_mib == Some(0) {
            return Err(StorageError::Invalid(format!(
                "cache {name:?}: size_mib must be at least 1"
            )));
        }
        if !is_plain(sandbox) {
            return Err(StorageError::Invalid(format!(
                "cache {name:?}: sandbox id {sandbox:?} cannot name a file"
            )));
        }
        let key = Self::key(owner, name, backend);
        let image = self.image_path(&key);
        self.await_settled(&key).await?;
        self.make_if_missing(&key, &image, name, size_mib).await?;
        let copy = self.copy_path(&key, sandbox, save);
        if let Some(dir) = copy.parent() {
            create_private_dir(dir)?;
        }
        if let Some(lease) = self.spare_copy(&key, sandbox, &copy, save).await? {
            return Ok(lease);
        }
        let size_mib = std::fs::metadata(&image)
            .map_err(|e| StorageError::io(format!("stat {}", image.display()), e))?
            .len()
            .div_ceil(1024 * 1024);
        let budget = self.budget.take(
            &format!("a copy of cache {name:?} for sandbox {sandbox}"),
            size_mib,
        )?;
        let base = {
            let mut held = self.held();
            held.users
                .entry(key.clone())
                .or_default()
                .push(sandbox.to_string());
            held.generation.get(&key).copied().unwrap_or(0)
        };
        // From here on, dropping the lease gives everything back.
        let mut lease = CacheLease {
            copy: Some(Settle {
                store: self.clone(),
                key,
                sandbox: sandbox.to_string(),
                copy: copy.clone(),
                base,
                made: None,
                budget: Some(budget),
            }),
            left: false,
        };
        let (from, to) = (image.clone(), copy.clone());
        // Not cancelled with this future: a create given up meanwhile leaves a whole copy,
        // never written, which the next daemon removes.
        let len = tokio::task::spawn_blocking(move || make_copy(&from, &to))
            .await
            .map_err(|e| StorageError::io("copy a cache", std::io::Error::other(e)))?
            .map_err(|e| {
                StorageError::io(format!("copy {} to {}", image.display(), copy.display()), e)
            })?;
        if let Some(settle) = lease.copy.as_mut().filter(|_| save) {
            settle.made = Some((len, never_written()));
        }
        Ok(lease)
    }

    /// Takes back sandbox `sandbox`'s copy of cache `name` of `owner` on `backend`, which an
    /// earlier daemon gave it (live restore). When it ends, it is saved unless another copy
    /// was saved since this daemon started. The caller checks, through the sandbox's backend,
    /// that it really holds it.
    pub(crate) fn reclaim(
        self: &Arc<Self>,
        owner: &Owner,
        name: &str,
        sandbox: &str,
        backend: BackendKind,
        save: bool,
    ) -> Result<CacheLease, StorageError> {
        validate_name(name)?;
        let key = Self::key(owner, name, backend);
        let copy = self.copy_path(&key, sandbox, save);
        let mut held = self.held();
        if !held.leases.contains_key(&key) {
            return Err(StorageError::NoCache(name.to_string()));
        }
        if held
            .users
            .get(&key)
            .is_some_and(|u| u.iter().any(|s| s == sandbox))
        {
            return Err(StorageError::Invalid(format!(
                "cache {name:?}: sandbox {sandbox} holds it already"
            )));
        }
        let size = std::fs::metadata(&copy)
            .map_err(|e| StorageError::io(format!("find {}", copy.display()), e))?
            .len();
        held.users
            .entry(key.clone())
            .or_default()
            .push(sandbox.to_string());
        let base = held.generation.get(&key).copied().unwrap_or(0);
        drop(held);
        Ok(CacheLease {
            copy: Some(Settle {
                store: self.clone(),
                key,
                sandbox: sandbox.to_string(),
                copy,
                base,
                // Its sandbox ran: whatever it wrote is a candidate, unless it only reads.
                made: save.then_some((u64::MAX, UNIX_EPOCH)),
                budget: Some(self.budget.take_existing(size.div_ceil(1024 * 1024))),
            }),
            left: false,
        })
    }

    /// After live restore: removes the copies no sandbox taken back uses.
    pub(crate) fn remove_unclaimed(&self) {
        let held = self.held();
        for copies in copy_dirs(&self.dir) {
            for entry in std::fs::read_dir(&copies).into_iter().flatten().flatten() {
                let path = entry.path();
                let used = held.users.iter().any(|(key, sandboxes)| {
                    sandboxes.iter().any(|s| {
                        self.copy_path(key, s, true) == path
                            || self.copy_path(key, s, false) == path
                    })
                });
                if !used {
                    if let Err(e) = std::fs::remove_file(&path) {
                        tracing::warn!("remove {}: {e}", path.display());
                    }
                }
            }
        }
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
            let users = held.users.get(&key).cloned().unwrap_or_default();
            caches.push(CacheInfo {
                name: key.2.clone(),
                owner: owner_of_dir(&key.1).map_or(key.1.clone(), |o| o.to_string()),
                backend: backend_of_dir(&key.0).unwrap_or(BackendKind::Namespace),
                size_mib: meta.len().div_ceil(1024 * 1024),
                used_mib: (meta.blocks() * 512).div_ceil(1024 * 1024),
                in_use_by: users.first().cloned(),
                users,
                saved_by: held.saved_by.get(&key).cloned(),
                created_at_ms: created,
            });
        }
        Ok(caches)
    }

    /// Deletes cache `name` of `owner` (of every backend), unless a sandbox uses it; the
    /// copies of sandboxes that have ended are saved (or dropped) first.
    pub async fn remove(&self, owner: &Owner, name: &str) -> Result<(), StorageError> {
        validate_name(name)?;
        let keys: Vec<Key> = [
            BackendKind::Namespace,
            BackendKind::Microvm,
            BackendKind::Process,
        ]
        .into_iter()
        .map(|b| Self::key(owner, name, b))
        .collect();
        for key in &keys {
            if !self.held().users.contains_key(key) {
                self.await_settled(key).await?;
            }
        }
        let mut held = self.held();
        for key in &keys {
            let by = held
                .users
                .get(key)
                .and_then(|u| u.first())
                .cloned()
                .or_else(|| {
                    held.settling
                        .contains_key(key)
                        .then(|| "(one that has ended; its copy is being saved)".to_string())
                });
            if let Some(by) = by {
                return Err(StorageError::CacheBusy {
                    name: name.to_string(),
                    by,
                });
            }
        }
        let mut removed = false;
        for key in keys {
            let path = self.image_path(&key);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    held.leases.remove(&key);
                    held.generation.remove(&key);
                    held.saved_by.remove(&key);
                    if let Some(spare) = held.spares.remove(&key) {
                        remove_quietly(&spare.path);
                    }
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
    use std::io::{Read, Seek, SeekFrom, Write};

    use super::*;

    const NS: BackendKind = BackendKind::Namespace;

    fn store(budget_mib: u64) -> (tempfile::TempDir, Arc<CacheStore>, Arc<DiskBudget>) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let budget = DiskBudget::new(budget_mib);
        let store = CacheStore::open(tmp.path().join("caches"), 64, budget.clone()).expect("open");
        (tmp, store, budget)
    }

    /// What a sandbox writing `what` to its copy does to the image's last bytes.
    fn write_mark(image: &Path, what: &str) {
        let mut file = std::fs::File::options()
            .write(true)
            .open(image)
            .expect("open");
        file.seek(SeekFrom::End(-4096)).expect("seek");
        file.write_all(format!("{what:<16}").as_bytes())
            .expect("write");
    }

    fn mark_of(image: &Path) -> String {
        let mut file = std::fs::File::open(image).expect("open");
        file.seek(SeekFrom::End(-4096)).expect("seek");
        let mut mark = [0u8; 16];
        file.read_exact(&mut mark).expect("read");
        String::from_utf8_lossy(&mark)
            .trim_end_matches([' ', '\0'])
            .to_string()
    }

    /// Waits until every ended sandbox's copy is saved or dropped.
    async fn settled(store: &CacheStore) {
        for _ in 0..1000 {
            let idle = {
                let held = store.held();
                held.settling.is_empty() && held.sparing.is_empty()
            };
            if idle {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("copies still settling");
    }

    #[tokio::test]
    async fn sandboxes_at_once_each_get_a_copy_and_the_first_to_end_saves_it() {
        let (_tmp, store, budget) = store(1000);
        let alice = Owner::Key("alice".into());
        let image = store.image_path(&CacheStore::key(&alice, "cargo", NS));
        let first = store
            .acquire(&alice, "cargo", None, "sb-1", NS, true)
            .await
            .expect("made");
        let second = store
            .acquire(&alice, "cargo", None, "sb-2", NS, true)
            .await
            .expect("shared, not busy");
        assert_ne!(first.path(), second.path());
        assert_ne!(
            first.path(),
            image.as_path(),
            "the cache itself is never mounted"
        );
        assert_eq!(budget.taken_mib(), 64 * 3, "the cache and two copies");
        let listed = store.list(Some(&alice)).expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].in_use_by.as_deref(), Some("sb-1"));
        assert_eq!(listed[0].users, ["sb-1", "sb-2"]);
        assert!(matches!(
            store.remove(&alice, "cargo").await,
            Err(StorageError::CacheBusy { .. })
        ));
        write_mark(first.path(), "from sb-1");
        write_mark(second.path(), "from sb-2");
        let (first_copy, second_copy) = (first.path().to_path_buf(), second.path().to_path_buf());

        // The second ends first: its copy becomes the cache, whole.
        drop(second);
        settled(&store).await;
        assert_eq!(mark_of(&image), "from sb-2");
        assert!(!second_copy.exists());
        // The first ends: its writes are dropped, as the cache moved on since it started.
        drop(first);
        settled(&store).await;
        assert_eq!(mark_of(&image), "from sb-2");
        assert!(!first_copy.exists());
        assert_eq!(
            budget.taken_mib(),
            64 * 2,
            "the copies' shares are back; the cache and its spare copy, made ahead, hold theirs"
        );
        let spare = store.copy_path(&CacheStore::key(&alice, "cargo", NS), ".spare1", true);
        assert_eq!(mark_of(&spare), "from sb-2");
        let listed = store.list(Some(&alice)).expect("list");
        assert_eq!(listed[0].saved_by.as_deref(), Some("sb-2"));
        assert!(listed[0].users.is_empty() && listed[0].in_use_by.is_none());

        // One after another, each sandbox starts from the last one's and saves its own. The
        // next takes the spare (no copy to wait for); the one after it the copy made ahead
        // of sb-3's save, or one of its own.
        let third = store
            .acquire(&alice, "cargo", None, "sb-3", NS, true)
            .await
            .expect("again");
        assert!(!spare.exists(), "taken");
        assert_eq!(
            budget.taken_mib(),
            64 * 2,
            "the spare's share is the copy's"
        );
        assert_eq!(mark_of(third.path()), "from sb-2");
        write_mark(third.path(), "from sb-3");
        drop(third);
        let fourth = store
            .acquire(&alice, "cargo", Some(999), "sb-4", NS, true)
            .await
            .expect("waits for sb-3's save");
        assert_eq!(mark_of(fourth.path()), "from sb-3");
        assert_eq!(
            std::fs::metadata(fourth.path()).expect("stat").len(),
            64 << 20,
            "an existing cache keeps its size"
        );
        // A copy nobody wrote (a sandbox that never started) is not saved; nor is one whose
        // sandbox only reads the cache, whatever it writes.
        let reader = store
            .acquire(&alice, "cargo", None, "sb-6", NS, false)
            .await
            .expect("a reader");
        write_mark(reader.path(), "from sb-6");
        drop((fourth, reader));
        settled(&store).await;
        let listed = store.list(Some(&alice)).expect("list");
        assert_eq!(listed[0].saved_by.as_deref(), Some("sb-3"));
        assert_eq!(mark_of(&image), "from sb-3");

        // Another owner's cache of the same name is another cache.
        let bob = store
            .acquire(
                &Owner::Key("bob".into()),
                "cargo",
                Some(32),
                "sb-5",
                NS,
                true,
            )
            .await
            .expect("bob's own");
        assert_ne!(mark_of(bob.path()), "from sb-3");
        assert_eq!(store.list(None).expect("all").len(), 2);
        store.remove(&alice, "cargo").await.expect("removed");
        assert_eq!(budget.taken_mib(), 64, "bob's cache and copy");
        assert!(matches!(
            store.remove(&alice, "cargo").await,
            Err(StorageError::NoCache(_))
        ));
    }

    #[tokio::test]
    async fn a_sparse_copy_keeps_the_holes_and_the_bytes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (from, to) = (tmp.path().join("from"), tmp.path().join("to"));
        let mut file = std::fs::File::create(&from).expect("create");
        file.set_len(64 << 20).expect("size");
        for at in [0u64, 10 << 20, (64 << 20) - 5] {
            file.seek(SeekFrom::Start(at)).expect("seek");
            file.write_all(b"hello").expect("write");
        }
        drop(file);
        copy_sparse(&from, &to).expect("copy");
        assert_eq!(
            std::fs::read(&from).expect("read"),
            std::fs::read(&to).expect("read")
        );
        use std::os::unix::fs::MetadataExt;
        let allocated = std::fs::metadata(&to).expect("stat").blocks() * 512;
        assert!(allocated < 1 << 20, "{allocated} bytes allocated");
        assert!(
            copy_sparse(&from, &to).is_err(),
            "an existing file is never written over"
        );
    }

    #[tokio::test]
    async fn bad_names_and_sizes_past_the_budget_are_refused_and_leave_nothing_held() {
        let (_tmp, store, budget) = store(200);
        for bad in ["", ".hidden", "a/b", "..", &"x".repeat(65), "sp ace"] {
            assert!(
                matches!(
                    store
                        .acquire(&Owner::Unix, bad, None, "sb-1", NS, true)
                        .await,
                    Err(StorageError::Invalid(_))
                ),
                "{bad:?}"
            );
        }
        for sandbox in ["../x", "", ".x", "a/b"] {
            assert!(
                matches!(
                    store
                        .acquire(&Owner::Unix, "ok", None, sandbox, NS, true)
                        .await,
                    Err(StorageError::Invalid(_))
                ),
                "{sandbox:?}"
            );
        }
        assert!(matches!(
            store
                .acquire(&Owner::Unix, "big", Some(201), "sb-1", NS, true)
                .await,
            Err(StorageError::OverBudget { .. })
        ));
        assert_eq!(budget.taken_mib(), 0);
        // The cache fits, with one copy; a second copy does not.
        let lease = store
            .acquire(&Owner::Unix, "big", Some(100), "sb-1", NS, true)
            .await
            .expect("not held by the refusal");
        assert!(matches!(
            store
                .acquire(&Owner::Unix, "big", None, "sb-2", NS, true)
                .await,
            Err(StorageError::OverBudget { .. })
        ));
        assert_eq!(store.list(None).expect("list")[0].users, ["sb-1"]);
        drop(lease);
        settled(&store).await;
        assert_eq!(budget.taken_mib(), 100);
    }

    #[tokio::test]
    async fn caches_on_disk_are_found_again_and_count_against_the_budget() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("caches");
        {
            let store = CacheStore::open(dir.clone(), 40, DiskBudget::new(100)).expect("open");
            drop(
                store
                    .acquire(&Owner::Unix, "npm", None, "sb-1", NS, true)
                    .await,
            );
            settled(&store).await;
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
    async fn a_copy_left_for_live_restore_is_taken_back_and_saved_and_strays_go() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("caches");
        let (kept, stray) = {
            let store = CacheStore::open(dir.clone(), 40, DiskBudget::new(1000)).expect("open");
            let kept = store
                .acquire(&Owner::Unix, "npm", None, "sb-1", NS, true)
                .await
                .expect("copy");
            let stray = store
                .acquire(&Owner::Unix, "npm", None, "sb-2", NS, true)
                .await
                .expect("copy");
            write_mark(kept.path(), "from sb-1");
            let paths = (kept.path().to_path_buf(), stray.path().to_path_buf());
            kept.leave();
            stray.leave();
            paths
        };
        let budget = DiskBudget::new(1000);
        let store = CacheStore::open(dir.clone(), 40, budget.clone()).expect("reopen");
        let lease = store
            .reclaim(&Owner::Unix, "npm", "sb-1", NS, true)
            .expect("taken back");
        assert_eq!(lease.path(), kept.as_path());
        assert!(matches!(
            store.reclaim(&Owner::Unix, "npm", "sb-9", NS, true),
            Err(StorageError::Io { .. })
        ));
        store.remove_unclaimed();
        assert!(kept.exists() && !stray.exists());
        assert_eq!(budget.taken_mib(), 80);
        drop(lease);
        settled(&store).await;
        assert_eq!(mark_of(&dir.join("namespace/unix/npm.ext4")), "from sb-1");
        assert_eq!(budget.taken_mib(), 40 * 2, "the cache and its spare copy");

        // Without live restore, what a previous daemon's sandboxes wrote is saved: the copy
        // written last of those that may be saved.
        let mut left = Vec::new();
        for (sandbox, mark, save) in [
            ("sb-3", "from sb-3", true),
            ("sb-4", "from sb-4", true),
            ("sb-5", "from sb-5", false),
        ] {
            let lease = store
                .acquire(&Owner::Unix, "npm", None, sandbox, NS, save)
                .await
                .expect("copy");
            std::thread::sleep(Duration::from_millis(20));
            write_mark(lease.path(), mark);
            left.push(lease.path().to_path_buf());
            lease.leave();
        }
        // Copied after those, but never written (its sandbox never started), and half a copy.
        let unwritten = store
            .acquire(&Owner::Unix, "npm", None, "sb-6", NS, true)
            .await
            .expect("copy");
        left.push(unwritten.path().to_path_buf());
        let half = dir
            .join("namespace/unix")
            .join(COPIES_DIR)
            .join("npm@sb-7.ext4.part");
        std::fs::write(&half, "half").expect("half a copy");
        left.push(half);
        unwritten.leave();
        recover_stale_copies(&dir).expect("recover");
        assert!(left.iter().all(|path| !path.exists()));
        assert!(!dir.join("namespace/unix").join(COPIES_DIR).exists());
        assert_eq!(mark_of(&dir.join("namespace/unix/npm.ext4")), "from sb-4");
    }

    #[tokio::test]
    async fn a_microvm_cache_is_never_given_to_a_namespace_sandbox() {
        let (_tmp, store, _budget) = store(1000);
        let vm = store
            .acquire(
                &Owner::Unix,
                "pip",
                None,
                "sb-1",
                BackendKind::Microvm,
                true,
            )
            .await
            .expect("a VM's cache");
        let host = store
            .acquire(&Owner::Unix, "pip", None, "sb-2", NS, true)
            .await
            .expect("another cache of the same name");
        write_mark(vm.path(), "guest");
        assert_ne!(
            mark_of(host.path()),
            "guest",
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
        settled(&store).await;
        store.remove(&Owner::Unix, "pip").await.expect("both go");
        assert!(store.list(None).expect("list").is_empty());
    }
}
