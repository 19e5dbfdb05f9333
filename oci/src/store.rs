//! The store on disk, under the daemon's data directory (`images/`, mode 0700: unpacked roots
//! hold the images' setuid files, which no host user may reach):
//!
//! ```text
//! blobs/sha256/<hex>     layer blobs as uploaded (compressed or not), by digest: stored once
//! roots/<chain>/         the unpacked tree of one layer chain (shared by images with the same layers)
//! roots/<chain>.json     what unpacking it wrote (bytes, entries, whiteouts, dropped nodes)
//! disks/<chain>.ext4     the chain as an ext4 root disk, for microVMs (built on first use)
//! refs/<key>.json        one image: its owner, name, layers, chain, config and defaults
//! tmp/                   uploads and unpacking in progress; emptied at startup
//! ```
//!
//! `<chain>` is the sha256 of the layer digests, bottom first, one per line: the same layers
//! in the same order give the same tree. Records are replaced atomically (write, rename); what
//! no record names and no sandbox or import in progress holds is removed by [`Store::gc`].

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::archive::{ArchiveError, ArchiveIndex};
use crate::compression::{self, Compression};
use crate::defaults::{self, Defaults, DefaultsError};
use crate::digest::{copy_hashing, Digest};
use crate::manifest::RunConfig;
use crate::source::{self, Format, LayerBlob, Plan, SourceError};
use crate::unpack::{self, Budget, Limits, UnpackError};

/// Longest image name.
pub const MAX_NAME: usize = 128;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file operation on the store failed.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which file.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
    /// The name cannot be an image name.
    #[error("image name {0:?} is not valid: 1 to {MAX_NAME} characters of letters, digits and ._:/-, starting with a letter or digit, no \"..\"")]
    BadName(String),
    /// No such image for this owner.
    #[error("no image named {0:?}")]
    NotFound(String),
    /// Sandboxes use it.
    #[error("image {name:?} is in use by {sandboxes} sandbox(es); delete them first")]
    InUse {
        /// The image.
        name: String,
        /// How many sandboxes hold it.
        sandboxes: usize,
    },
    /// The upload is not an image crucible can use.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A compressed image archive is larger than the image limit once decompressed.
    #[error("the archive is larger than the image limit of {max_bytes} bytes once decompressed")]
    ArchiveTooLarge {
        /// The limit.
        max_bytes: u64,
    },
    /// A layer could not be applied (hostile or malformed content, or a limit reached).
    #[error("layer {index} of {total} ({digest})")]
    Layer {
        /// Its position, from 1.
        index: usize,
        /// How many there are.
        total: usize,
        /// Its digest.
        digest: Digest,
        /// Why.
        source: UnpackError,
    },
    /// The image's config cannot be applied.
    #[error(transparent)]
    Defaults(#[from] DefaultsError),
    /// The archive unpacks to nothing: no file, directory or link a sandbox could run.
    #[error(
        "the archive holds no files (an empty tar, or an image whose layers are all empty): a \
         sandbox would have nothing to run"
    )]
    Empty,
}

impl StoreError {
    fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
        move |source| StoreError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    /// Whether the failure is the upload's fault (bad or hostile input, a limit), not the
    /// host's.
    pub fn is_bad_input(&self) -> bool {
        match self {
            StoreError::BadName(_)
            | StoreError::Source(_)
            | StoreError::Defaults(_)
            | StoreError::Empty => true,
            StoreError::Layer { source, .. } => !is_host_failure(source),
            _ => false,
        }
    }

    /// Whether the failure is a size or count limit (the API's 413).
    pub fn is_too_large(&self) -> bool {
        matches!(
            self,
            StoreError::Layer {
                source: UnpackError::LimitExceeded { .. },
                ..
            } | StoreError::ArchiveTooLarge { .. }
        )
    }
}

/// Whether an unpacking failure is the host's (its disk, its files), not the layer's.
fn is_host_failure(error: &UnpackError) -> bool {
    use rustix::io::Errno;
    let host_errno = |e: &io::Error| {
        [
            Errno::NOSPC,
            Errno::DQUOT,
            Errno::IO,
            Errno::ROFS,
            Errno::NOMEM,
        ]
        .iter()
        .any(|errno| e.raw_os_error() == Some(errno.raw_os_error()))
    };
    match error {
        UnpackError::OpenRoot { .. } | UnpackError::OpenLayer { .. } => true,
        UnpackError::Io { source, .. } => host_errno(source),
        _ => false,
    }
}

/// One layer of an image, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredLayer {
    /// The blob's digest (of the bytes as uploaded).
    pub digest: Digest,
    /// The blob's size in bytes.
    pub size: u64,
}

/// What unpacking a chain wrote and left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootSummary {
    /// File content bytes.
    pub bytes: u64,
    /// Entries (files, directories, links, FIFOs).
    pub entries: u64,
    /// Whiteouts applied.
    pub whiteouts: u64,
    /// Opaque directories applied.
    pub opaque_dirs: u64,
    /// Device nodes not created (a sandbox gets its own `/dev`).
    pub dropped_devices: u64,
    /// Other entries not created (sockets, unknown types).
    pub dropped_other: u64,
}

/// One image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// Its name, unique per owner.
    pub name: String,
    /// Who imported it (an API key's name).
    pub owner: String,
    /// What it was imported from.
    pub format: Format,
    /// Its name inside the archive, if it had one.
    pub reference: Option<String>,
    /// Its config's digest (Docker's image id), if it had a config.
    pub config_digest: Option<Digest>,
    /// Its layers, bottom first.
    pub layers: Vec<StoredLayer>,
    /// The chain: its unpacked tree is `roots/<chain>/`.
    pub root: Digest,
    /// Its config's run defaults, as in the archive.
    pub run_config: RunConfig,
    /// What sandboxes made from it start with.
    pub defaults: Defaults,
    /// What unpacking wrote.
    pub summary: RootSummary,
    /// When it was imported (seconds since the epoch).
    pub imported_at: u64,
}

/// Checks an image name.
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b))
        && !name.contains("..")
        && !name.contains("//")
        && !name.ends_with('/');
    if ok {
        Ok(())
    } else {
        Err(StoreError::BadName(name.to_string()))
    }
}

/// The image store. Imports run on blocking threads; the store is shared behind an `Arc`.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    /// Held to write or remove records and to collect garbage.
    commit: Mutex<()>,
    /// What imports in progress and live sandboxes hold, so [`Store::gc`] keeps it:
    /// `layer:<hex>`, `root:<hex>` and `image:<key>`, each with a count.
    pins: Mutex<HashMap<String, usize>>,
}

/// An image held by a sandbox: its tree is kept and the image cannot be removed while held.
#[derive(Debug)]
pub struct ImageLease {
    store: Arc<Store>,
    keys: Vec<String>,
}

impl ImageLease {
    /// Whether `other` holds exactly what this lease holds (the same image, or the same
    /// set of images): one of the two is then enough.
    pub fn holds_the_same_as(&self, other: &ImageLease) -> bool {
        Arc::ptr_eq(&self.store, &other.store) && self.keys == other.keys
    }
}

impl Drop for ImageLease {
    fn drop(&mut self) {
        self.store.unpin(&self.keys);
        for key in &self.keys {
            if let Some(record) = key.strip_prefix("image:") {
                mark_used(Path::new(record));
            }
        }
    }
}

/// Records that a sandbox took or released the image whose record is at `record`: its
/// modification time is the image's last use, which [`Store::prune`] reads (and which survives
/// a daemon restart). Best effort: a record that cannot be touched only looks older.
fn mark_used(record: &Path) {
    let touched = fs::OpenOptions::new()
        .write(true)
        .open(record)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
    if let Err(e) = touched {
        tracing::debug!("cannot mark {} as used: {e}", record.display());
    }
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    )
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Removes `path` whatever it is (never following symlinks); missing is fine.
fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

impl Store {
    /// Opens (creating) the store at `dir` and empties its `tmp/`.
    pub fn open(dir: &Path) -> Result<Arc<Store>, StoreError> {
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true).mode(0o700);
        for sub in ["", "blobs/sha256", "roots", "disks", "refs", "tmp"] {
            let path = dir.join(sub);
            builder
                .create(&path)
                .map_err(StoreError::io("create", &path))?;
        }
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(StoreError::io("restrict", dir))?;
        let tmp = dir.join("tmp");
        for entry in fs::read_dir(&tmp).map_err(StoreError::io("list", &tmp))? {
            let path = entry.map_err(StoreError::io("list", &tmp))?.path();
            remove_any(&path).map_err(StoreError::io("remove the leftover", &path))?;
        }
        let store = Arc::new(Store {
            dir: dir.to_path_buf(),
            commit: Mutex::new(()),
            pins: Mutex::new(HashMap::new()),
        });
        store.gc()?;
        Ok(store)
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new file for an upload to be written into (removed at the next startup if left).
    pub fn upload_path(&self) -> PathBuf {
        self.dir.join("tmp").join(unique("upload"))
    }

    /// The unpacked tree of a chain.
    pub fn root_dir(&self, root: &Digest) -> PathBuf {
        self.dir.join("roots").join(root.hex())
    }

    /// Where a chain's ext4 root disk is (built by the daemon on a microVM's first use).
    pub fn root_disk(&self, root: &Digest) -> PathBuf {
        self.dir.join("disks").join(format!("{}.ext4", root.hex()))
    }

    /// A path in `tmp/` for building something (a root disk) before renaming it into place.
    pub fn temp_path(&self, what: &str) -> PathBuf {
        self.dir.join("tmp").join(unique(what))
    }

    fn record_path(&self, owner: &str, name: &str) -> PathBuf {
        let key = Digest::of(format!("{owner}\0{name}").as_bytes());
        self.dir.join("refs").join(format!("{}.json", key.hex()))
    }

    fn commit_lock(&self) -> MutexGuard<'_, ()> {
        self.commit.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pins(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.pins.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pin(&self, key: String) -> String {
        *self.pins().entry(key.clone()).or_insert(0) += 1;
        key
    }

    fn unpin(&self, keys: &[String]) {
        let mut pins = self.pins();
        for key in keys {
            if let Some(count) = pins.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    pins.remove(key);
                }
            }
        }
    }

    fn pinned(&self, key: &str) -> usize {
        self.pins().get(key).copied().unwrap_or(0)
    }

    /// Imports the archive at `upload` (which it removes) as `owner`'s image `name`, replacing
    /// any image of that name (sandboxes already using the old one keep it until they end).
    /// Blocking: run it off the async runtime.
    pub fn import(
        self: &Arc<Self>,
        owner: &str,
        name: &str,
        upload: &Path,
        limits: Limits,
    ) -> Result<ImageRecord, StoreError> {
        validate_name(name)?;
        let mut pins = Vec::new();
        let mut temps = vec![upload.to_path_buf()];
        let result = self.import_pinned(owner, name, upload, limits, &mut pins, &mut temps);
        for temp in &temps {
            let _ = remove_any(temp);
        }
        let committed = {
            let _commit = self.commit_lock();
            self.unpin(&pins);
            self.gc_locked()
        };
        let record = result?;
        committed?;
        Ok(record)
    }

    fn import_pinned(
        self: &Arc<Self>,
        owner: &str,
        name: &str,
        upload: &Path,
        limits: Limits,
        pins: &mut Vec<String>,
        temps: &mut Vec<PathBuf>,
    ) -> Result<ImageRecord, StoreError> {
        let mut file = File::open(upload).map_err(StoreError::io("open", upload))?;
        let compressed = Compression::of_file(&mut file).map_err(StoreError::io("read", upload))?;
        let (archive, plan) = if compressed == Compression::None {
            let index = ArchiveIndex::read(upload).map_err(SourceError::from)?;
            let plan = source::plan(&index)?;
            (Some(index), plan)
        } else if compressed_image_archive(upload, scan_limit(limits))? {
            // `docker save | gzip`: unpacked once into tmp/ to be read in any order, at most
            // the image limit of it, as an uncompressed upload is (a bomb stops there).
            let plain = self.temp_path("archive");
            temps.push(plain.clone());
            let mut out = File::create(&plain).map_err(StoreError::io("create", &plain))?;
            let mut reader = compression::Bounded::new(
                compression::decompressed(file)
                    .map_err(|e| SourceError::from(ArchiveError::Io(e)))?,
                limits.max_bytes,
            );
            if let Err(e) = io::copy(&mut reader, &mut out) {
                return Err(if reader.exceeded() {
                    StoreError::ArchiveTooLarge {
                        max_bytes: limits.max_bytes,
                    }
                } else {
                    SourceError::from(ArchiveError::Io(e)).into()
                });
            }
            let index = ArchiveIndex::read(&plain).map_err(SourceError::from)?;
            let plan = source::plan(&index)?;
            (Some(index), plan)
        } else {
            (None, Plan::rootfs())
        };

        let mut layers = Vec::with_capacity(plan.layers.len());
        for blob in &plan.layers {
            layers.push(self.store_blob(upload, archive.as_ref(), blob, pins)?);
        }
        let chain = Digest::of(
            layers
                .iter()
                .map(|l| format!("{}\n", l.digest.hex()))
                .collect::<String>()
                .as_bytes(),
        );
        pins.push(self.pin(format!("root:{}", chain.hex())));
        let root_dir = self.root_dir(&chain);
        let summary = match self.read_summary(&chain) {
            Some(summary) if root_dir.is_dir() => summary,
            _ => self.unpack_chain(&chain, &layers, limits, temps)?,
        };
        if summary.entries == 0 {
            return Err(StoreError::Empty);
        }
        let defaults = defaults::resolve(&plan.run_config, &root_dir)?;
        let record = ImageRecord {
            name: name.to_string(),
            owner: owner.to_string(),
            format: plan.format,
            reference: plan.reference.clone(),
            config_digest: plan.config_digest.clone(),
            layers,
            root: chain,
            run_config: plan.run_config.clone(),
            defaults,
            summary,
            imported_at: now_s(),
        };
        let path = self.record_path(owner, name);
        let temp = self.temp_path("record");
        temps.push(temp.clone());
        let json = serde_json::to_vec_pretty(&record).map_err(|e| StoreError::Io {
            what: "encode",
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        fs::write(&temp, json).map_err(StoreError::io("write", &temp))?;
        let _commit = self.commit_lock();
        fs::rename(&temp, &path).map_err(StoreError::io("write", &path))?;
        Ok(record)
    }

    /// Copies one layer's blob into `blobs/`, checking its digest; pins it.
    fn store_blob(
        &self,
        upload: &Path,
        archive: Option<&ArchiveIndex>,
        blob: &LayerBlob,
        pins: &mut Vec<String>,
    ) -> Result<StoredLayer, StoreError> {
        let expected = match blob {
            LayerBlob::Member { digest, .. } => digest.clone(),
            LayerBlob::Whole => None,
        };
        // Pinned before anything is written, so a collection meanwhile keeps it. The bytes are
        // hashed even when the store has the blob: an archive naming another image's layer
        // without holding its bytes must not get that layer.
        if let Some(digest) = &expected {
            pins.push(self.pin(format!("layer:{}", digest.hex())));
        }
        let mut reader: Box<dyn Read> = match (blob, archive) {
            (LayerBlob::Member { path, .. }, Some(archive)) => {
                Box::new(archive.open(path).map_err(SourceError::from)?)
            }
            _ => Box::new(File::open(upload).map_err(StoreError::io("open", upload))?),
        };
        let temp = self.temp_path("blob");
        let copied = File::create(&temp).and_then(|mut out| copy_hashing(&mut reader, &mut out));
        let (digest, size) = match copied {
            Ok(copied) => copied,
            Err(e) => {
                let _ = fs::remove_file(&temp);
                return Err(StoreError::Io {
                    what: "store a layer in",
                    path: temp,
                    source: e,
                });
            }
        };
        if let Some(expected) = expected {
            if expected != digest {
                let _ = fs::remove_file(&temp);
                return Err(SourceError::DigestMismatch {
                    expected,
                    actual: digest,
                }
                .into());
            }
        } else {
            pins.push(self.pin(format!("layer:{}", digest.hex())));
        }
        let stored = self.dir.join("blobs/sha256").join(digest.hex());
        if stored.is_file() {
            let _ = fs::remove_file(&temp);
        } else {
            fs::rename(&temp, &stored).map_err(StoreError::io("store", &stored))?;
        }
        Ok(StoredLayer { digest, size })
    }

    /// Unpacks `layers` into `roots/<chain>/` (through a directory in `tmp/`).
    fn unpack_chain(
        &self,
        chain: &Digest,
        layers: &[StoredLayer],
        limits: Limits,
        temps: &mut Vec<PathBuf>,
    ) -> Result<RootSummary, StoreError> {
        let building = self.temp_path("root");
        temps.push(building.clone());
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&building)
            .map_err(StoreError::io("create", &building))?;
        let mut budget = Budget::new(limits);
        let mut summary = RootSummary::default();
        for (i, layer) in layers.iter().enumerate() {
            let blob = self.dir.join("blobs/sha256").join(layer.digest.hex());
            let open = || compression::decompressed(File::open(&blob)?);
            let stats = unpack::apply_layer(&building, open, &mut budget).map_err(|source| {
                StoreError::Layer {
                    index: i + 1,
                    total: layers.len(),
                    digest: layer.digest.clone(),
                    source,
                }
            })?;
            summary.whiteouts += stats.whiteouts;
            summary.opaque_dirs += stats.opaque_dirs;
            summary.dropped_devices += stats.dropped_devices;
            summary.dropped_other += stats.dropped_other;
        }
        summary.bytes = budget.bytes_used();
        summary.entries = budget.entries_used();
        let meta = self.dir.join("roots").join(format!("{}.json", chain.hex()));
        let json = serde_json::to_vec(&summary).map_err(|e| StoreError::Io {
            what: "encode",
            path: meta.clone(),
            source: io::Error::other(e),
        })?;
        fs::write(&meta, json).map_err(StoreError::io("write", &meta))?;
        let root = self.root_dir(chain);
        match fs::rename(&building, &root) {
            Ok(()) => {}
            // Another import of the same layers finished first: its tree is the same.
            Err(_) if root.is_dir() => {}
            Err(e) => return Err(StoreError::io("move into place", &root)(e)),
        }
        Ok(summary)
    }

    fn read_summary(&self, chain: &Digest) -> Option<RootSummary> {
        let meta = self.dir.join("roots").join(format!("{}.json", chain.hex()));
        serde_json::from_slice(&fs::read(meta).ok()?).ok()
    }

    /// `owner`'s images (every owner's with `None`), by name.
    pub fn list(&self, owner: Option<&str>) -> Result<Vec<ImageRecord>, StoreError> {
        let refs = self.dir.join("refs");
        let mut images = BTreeMap::new();
        for entry in fs::read_dir(&refs).map_err(StoreError::io("list", &refs))? {
            let path = entry.map_err(StoreError::io("list", &refs))?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let Some(record) = fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<ImageRecord>(&b).ok())
            else {
                // One corrupt record must not hide every other image.
                tracing::warn!("skipping unreadable image record {}", path.display());
                continue;
            };
            if owner.is_none_or(|o| o == record.owner) {
                images.insert((record.owner.clone(), record.name.clone()), record);
            }
        }
        Ok(images.into_values().collect())
    }

    /// `owner`'s image `name`.
    pub fn get(&self, owner: &str, name: &str) -> Result<ImageRecord, StoreError> {
        let path = self.record_path(owner, name);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(name.to_string()))
            }
            Err(e) => return Err(StoreError::io("read", &path)(e)),
        };
        serde_json::from_slice(&bytes).map_err(|e| StoreError::Io {
            what: "decode",
            path,
            source: io::Error::other(e),
        })
    }

    /// Holds `owner`'s image `name` for a sandbox.
    pub fn lease(
        self: &Arc<Self>,
        owner: &str,
        name: &str,
    ) -> Result<(ImageRecord, ImageLease), StoreError> {
        let _commit = self.commit_lock();
        let record = self.get(owner, name)?;
        let key = self.record_path(owner, name);
        mark_used(&key);
        let keys = vec![
            self.pin(format!("image:{}", key.display())),
            self.pin(format!("root:{}", record.root.hex())),
        ];
        Ok((
            record,
            ImageLease {
                store: self.clone(),
                keys,
            },
        ))
    }

    /// Removes `owner`'s image `name`, unless a sandbox uses it; its layers and tree go too
    /// when no other image has them.
    pub fn remove(&self, owner: &str, name: &str) -> Result<ImageRecord, StoreError> {
        let _commit = self.commit_lock();
        let record = self.get(owner, name)?;
        let path = self.record_path(owner, name);
        let holders = self.pinned(&format!("image:{}", path.display()));
        if holders > 0 {
            return Err(StoreError::InUse {
                name: name.to_string(),
                sandboxes: holders,
            });
        }
        fs::remove_file(&path).map_err(StoreError::io("remove", &path))?;
        self.gc_locked()?;
        Ok(record)
    }

    /// Removes `owner`'s images (every owner's with `None`) whose name starts with `prefix`,
    /// that no sandbox holds, and that no sandbox has taken or released (and nobody imported)
    /// within `unused_for`; then their layers and trees, where no other image has them.
    /// Returns the removed images, by name.
    pub fn prune(
        &self,
        owner: Option<&str>,
        prefix: &str,
        unused_for: std::time::Duration,
    ) -> Result<Vec<ImageRecord>, StoreError> {
        let _commit = self.commit_lock();
        let now = std::time::SystemTime::now();
        let mut removed = Vec::new();
        for record in self.list(owner)? {
            if !record.name.starts_with(prefix) {
                continue;
            }
            let path = self.record_path(&record.owner, &record.name);
            if self.pinned(&format!("image:{}", path.display())) > 0 {
                continue;
            }
            let idle = fs::metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|used| now.duration_since(used).ok())
                .unwrap_or_default();
            if idle < unused_for {
                continue;
            }
            fs::remove_file(&path).map_err(StoreError::io("remove", &path))?;
            removed.push(record);
        }
        if !removed.is_empty() {
            self.gc_locked()?;
        }
        Ok(removed)
    }

    /// Removes the blobs, trees and disks that no image names and nothing holds.
    pub fn gc(&self) -> Result<(), StoreError> {
        let _commit = self.commit_lock();
        self.gc_locked()
    }

    fn gc_locked(&self) -> Result<(), StoreError> {
        let images = self.list(None)?;
        let mut keep: std::collections::HashSet<String> = images
            .iter()
            .flat_map(|i| {
                i.layers
                    .iter()
                    .map(|l| format!("layer:{}", l.digest.hex()))
                    .chain(std::iter::once(format!("root:{}", i.root.hex())))
            })
            .collect();
        keep.extend(self.pins().keys().cloned());
        let sweep = |sub: &str, kind: &str| -> Result<(), StoreError> {
            let dir = self.dir.join(sub);
            for entry in fs::read_dir(&dir).map_err(StoreError::io("list", &dir))? {
                let path = entry.map_err(StoreError::io("list", &dir))?.path();
                let Some(file) = path.file_name().and_then(|n| n.to_str()) else {
                    continue;
                };
                let hex = file.split('.').next().unwrap_or(file);
                if !keep.contains(&format!("{kind}:{hex}")) {
                    remove_any(&path).map_err(StoreError::io("remove", &path))?;
                }
            }
            Ok(())
        };
        sweep("blobs/sha256", "layer")?;
        sweep("roots", "root")?;
        sweep("disks", "root")?;
        Ok(())
    }

    /// Bytes the store takes on disk (blobs, trees as unpacked, disks as allocated).
    pub fn usage_bytes(&self) -> u64 {
        let mut total = 0;
        for sub in ["blobs/sha256", "disks"] {
            if let Ok(entries) = fs::read_dir(self.dir.join(sub)) {
                for entry in entries.flatten() {
                    if let Ok(meta) = entry.metadata() {
                        total += meta.blocks() * 512;
                    }
                }
            }
        }
        if let Ok(entries) = fs::read_dir(self.dir.join("roots")) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "json") {
                    let summary: Option<RootSummary> = fs::read(&path)
                        .ok()
                        .and_then(|b| serde_json::from_slice(&b).ok());
                    // Each entry takes at least a block or an inode.
                    total += summary.map_or(0, |s| s.bytes + s.entries * 4096);
                }
            }
        }
        total
    }
}

/// How much of a compressed upload is read to tell a rootfs from an image archive (read, never
/// written): a rootfs within the limits is at most the image limit plus a tar header and
/// padding for each entry it may hold.
fn scan_limit(limits: Limits) -> u64 {
    limits
        .max_bytes
        .saturating_add(limits.max_entries.saturating_mul(1024))
}

/// Whether the compressed upload is a compressed image archive (`docker save | gzip`) rather
/// than a compressed rootfs: one pass over its member names, through at most `max_bytes` of
/// it decompressed (past them it could be neither).
fn compressed_image_archive(upload: &Path, max_bytes: u64) -> Result<bool, StoreError> {
    let file = File::open(upload).map_err(StoreError::io("open", upload))?;
    let reader = compression::Bounded::new(
        compression::decompressed(file).map_err(|e| SourceError::from(ArchiveError::Io(e)))?,
        max_bytes,
    );
    let mut archive = tar::Archive::new(reader);
    let mut names = std::collections::HashSet::new();
    let scanned = (|| -> io::Result<()> {
        for (n, entry) in archive.entries()?.enumerate() {
            if n >= crate::archive::MAX_MEMBERS {
                break;
            }
            let entry = entry?;
            let name = crate::archive::normalise(&String::from_utf8_lossy(&entry.path_bytes()));
            if ["oci-layout", "index.json", "manifest.json"].contains(&name.as_str()) {
                names.insert(name);
            }
        }
        Ok(())
    })();
    if let Err(e) = scanned {
        return Err(if archive.into_inner().exceeded() {
            StoreError::ArchiveTooLarge { max_bytes }
        } else {
            SourceError::from(ArchiveError::Io(e)).into()
        });
    }
    Ok(names.contains("manifest.json")
        || (names.contains("oci-layout") && names.contains("index.json")))
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
