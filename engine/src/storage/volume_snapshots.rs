//! Volumes for microVMs. A VM can only be given block devices, so a volume reaches one as a
//! read-only ext4 image of its directory, `<data_dir>/volumes/NAME.ext4`, made with
//! `mkfs.ext4 -d` the first time a microVM asks for the volume after the daemon started and
//! shared by every later one. A microVM therefore sees the volume as it was when this daemon
//! first snapshotted it (restart the daemon to refresh); a namespace sandbox sees the live
//! directory. The images are this daemon's alone: a start removes those a previous one left
//! (they may be out of date), except under live restore, where a microVM taken back (or being
//! checked) reclaims the one it uses, which later microVMs then share, and the rest go.
//!
//! What the image holds is what a namespace sandbox would see through its bind: the
//! directory's tree, not the filesystems mounted below it (such a volume is refused rather
//! than silently differing), with owners, modes and the root's ownership as on the host.
//! `mkfs.ext4 -d` reads with `lstat`, so a symbolic link is copied as a link and never
//! followed out of the volume. Device nodes, FIFOs and sockets are copied as they are: the
//! guest mounts the volume `nodev`, and its root could make any device node of its own kernel
//! anyway; the host never mounts these images.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;

use super::ext4::{create_private_dir, mkfs_binary};
use super::{BudgetLease, DiskBudget, StorageError};

/// The image's block size.
const BLOCK: u64 = 4096;
/// The image's inode size (room for nanosecond times and small extended attributes).
const INODE: u64 = 256;
const MIB: u64 = 1024 * 1024;
/// What an image needs beyond its files' blocks and inode table: superblocks, group
/// descriptors, bitmaps.
const FIXED_MIB: u64 = 8;

/// One volume's snapshot.
#[derive(Debug)]
struct Snapshot {
    image: PathBuf,
    size: u64,
    _lease: BudgetLease,
    /// Left on disk when dropped ([`VolumeSnapshots::leave`]).
    left: bool,
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        match std::fs::remove_file(&self.image) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("remove {}: {e}", self.image.display()),
        }
    }
}

impl Snapshot {
    /// Whether its image is still the file this daemon built (someone may have removed it).
    fn intact(&self) -> bool {
        std::fs::symlink_metadata(&self.image).is_ok_and(|m| m.is_file() && m.len() == self.size)
    }
}

/// One volume's slot: held while its snapshot is built, so concurrent first requests build
/// it once.
type Slot = Arc<tokio::sync::Mutex<Option<Snapshot>>>;

/// The microVM snapshots of the declared volumes, built on first use.
#[derive(Debug)]
pub(crate) struct VolumeSnapshots {
    /// What the snapshots are of, for messages: `volume`, or `image` for image roots.
    kind: &'static str,
    dir: PathBuf,
    budget: Arc<DiskBudget>,
    slots: Mutex<HashMap<String, Slot>>,
    builds: AtomicU64,
    attempts: AtomicU64,
}

impl VolumeSnapshots {
    /// Snapshots kept in `dir`, first removing any a previous daemon left there (unless
    /// `keep`: see [`VolumeSnapshots::open_for`]).
    pub(crate) fn open(
        dir: PathBuf,
        budget: Arc<DiskBudget>,
        keep: bool,
    ) -> Result<Self, StorageError> {
        Self::open_for("volume", dir, budget, keep)
    }

    /// Snapshots of directories of `kind` (named so in messages), kept in `dir`. A previous
    /// daemon's are removed, unless `keep` (live restore): then the microVMs taken back
    /// [`reclaim`](Self::reclaim) those they still use, and
    /// [`remove_unclaimed`](Self::remove_unclaimed) removes the rest.
    pub(crate) fn open_for(
        kind: &'static str,
        dir: PathBuf,
        budget: Arc<DiskBudget>,
        keep: bool,
    ) -> Result<Self, StorageError> {
        if !keep {
            remove_stale(&dir)?;
        }
        create_private_dir(&dir)?;
        Ok(VolumeSnapshots {
            kind,
            dir,
            budget,
            slots: Mutex::new(HashMap::new()),
            builds: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
        })
    }

    /// How many images this store has built.
    #[cfg(test)]
    pub(crate) fn builds(&self) -> u64 {
        self.builds.load(Ordering::Relaxed)
    }

    /// The image of volume `name`, whose directory is `source`: built now if this daemon has
    /// none yet (or its image was removed), else the one built before.
    pub(crate) async fn image(&self, name: &str, source: &Path) -> Result<PathBuf, StorageError> {
        let slot = self.slot(name)?;
        let mut snapshot = slot.lock().await;
        if let Some(built) = snapshot.as_ref().filter(|s| s.intact()) {
            return Ok(built.image.clone());
        }
        // Gone from under us: its share of the budget comes back before the rebuild asks.
        *snapshot = None;
        let built = self.build(name, source).await?;
        let image = built.image.clone();
        *snapshot = Some(built);
        Ok(image)
    }

    /// Takes back the snapshot of `name` an earlier daemon built, which a microVM taken back
    /// still uses (live restore): later microVMs share it as if this daemon had built it.
    pub(crate) async fn reclaim(&self, name: &str) -> Result<PathBuf, StorageError> {
        let slot = self.slot(name)?;
        let mut snapshot = slot.lock().await;
        if let Some(held) = snapshot.as_ref().filter(|s| s.intact()) {
            return Ok(held.image.clone());
        }
        let image = self.dir.join(format!("{name}.ext4"));
        let (size, lease) = super::ext4::retake(
            &image,
            &self.budget,
            &format!("the microVM snapshot of {} {name:?}", self.kind),
        )?;
        *snapshot = Some(Snapshot {
            image: image.clone(),
            size,
            _lease: lease,
            left: false,
        });
        Ok(image)
    }

    /// The slot of `name`, made if new.
    fn slot(&self, name: &str) -> Result<Slot, StorageError> {
        // Declared names are checked already; this one becomes a file name.
        super::caches::validate_name(name).map_err(|_| {
            StorageError::Invalid(format!("{} name {name:?} is not valid", self.kind))
        })?;
        Ok(self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_string())
            .or_default()
            .clone())
    }

    /// Leaves every snapshot's image on disk when the store is dropped (the daemon stops
    /// under live restore: microVMs that run on use them, and the next daemon reclaims them).
    pub(crate) fn leave(&self) {
        for slot in self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            if let Ok(mut snapshot) = slot.try_lock() {
                if let Some(snapshot) = snapshot.as_mut() {
                    snapshot.left = true;
                }
            }
        }
    }

    /// Removes the images in its directory that no snapshot of this daemon's is (after live
    /// restore has reclaimed what the microVMs taken back use).
    pub(crate) fn remove_unclaimed(&self) {
        let held: HashSet<PathBuf> = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter_map(|slot| {
                slot.try_lock()
                    .ok()
                    .and_then(|s| s.as_ref().map(|s| s.image.clone()))
            })
            .collect();
        super::ext4::remove_files_but(&self.dir, |path| held.contains(path));
    }

    async fn build(&self, name: &str, source: &Path) -> Result<Snapshot, StorageError> {
        let tree = {
            let (label, owned_source) = (format!("{} {name:?}", self.kind), source.to_path_buf());
            tokio::task::spawn_blocking(move || survey(&label, &owned_source))
                .await
                .map_err(|e| {
                    StorageError::io(
                        format!("survey {} {name:?}", self.kind),
                        io::Error::other(e),
                    )
                })??
        };
        let image = self.dir.join(format!("{name}.ext4"));
        let partial = Partial(self.dir.join(format!(
            // Volume names never start with '.', so this is no volume's image; the count keeps
            // a build apart from the remains of one cancelled (a mkfs killed a moment ago).
            ".{name}.ext4.{}.partial",
            self.attempts.fetch_add(1, Ordering::Relaxed)
        )));
        // The estimate is generous, but ext4's layout is not ours to predict exactly: a tree
        // that does not fit gets one more try at twice the size.
        let mut size_mib = tree.image_mib();
        let mut retried = false;
        let lease = loop {
            let lease = self.budget.take(
                &format!("the microVM snapshot of {} {name:?}", self.kind),
                size_mib,
            )?;
            match make_snapshot(&partial.0, size_mib, source, &tree).await {
                Ok(()) => break lease,
                Err(BuildError::TooSmall(_)) if !retried => {
                    retried = true;
                    size_mib *= 2;
                }
                Err(BuildError::TooSmall(e) | BuildError::Failed(e)) => return Err(e),
            }
        };
        std::fs::rename(&partial.0, &image).map_err(|e| {
            StorageError::io(
                format!("rename {} to {}", partial.0.display(), image.display()),
                e,
            )
        })?;
        self.builds.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            "{} {name:?}: built its microVM snapshot {} ({size_mib} MiB, {} inodes) from {}",
            self.kind,
            image.display(),
            tree.inodes,
            source.display()
        );
        Ok(Snapshot {
            image,
            size: size_mib * MIB,
            _lease: lease,
            left: false,
        })
    }
}

/// An image being built: removed unless it was renamed into place (a failed or cancelled
/// build leaves nothing behind).
struct Partial(PathBuf);

impl Drop for Partial {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.0) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("remove {}: {e}", self.0.display()),
        }
    }
}

/// Removes the snapshots a previous daemon left in `dir`.
pub(crate) fn remove_stale(dir: &Path) -> Result<(), StorageError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::io(
            format!("remove the stale volume snapshots in {}", dir.display()),
            e,
        )),
    }
}

/// What a volume's tree needs of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tree {
    /// Inodes, the root's included (hard links counted once).
    inodes: u64,
    /// Blocks of file data, directory entries, long link targets and extent indexes.
    blocks: u64,
    /// The root directory's owner, group and mode (with its type bits).
    root: (u32, u32, u32),
    /// Whether the root holds a `lost+found` directory (else the image's is removed).
    lost_found: bool,
}

impl Tree {
    /// The inode count asked of `mkfs.ext4`: the tree's, a tenth more, and some.
    fn inodes_wanted(&self) -> u64 {
        self.inodes + self.inodes / 10 + 64
    }

    /// The image's size: the blocks and the inode table, a twentieth more, and the fixed
    /// overhead.
    fn image_mib(&self) -> u64 {
        let bytes = self.blocks * BLOCK + self.inodes_wanted() * INODE;
        (bytes + bytes / 20).div_ceil(MIB) + FIXED_MIB
    }
}

/// Walks volume `name`'s directory `source` without following links: what its image needs,
/// after checking it is still the directory declared and has nothing mounted below it.
/// `label` names it in messages (`volume "tools"`).
fn survey(label: &str, source: &Path) -> Result<Tree, StorageError> {
    let invalid = |why: String| StorageError::Invalid(format!("{label}: {why}"));
    let canonical = source
        .canonicalize()
        .map_err(|e| StorageError::io(format!("{label}: {}", source.display()), e))?;
    if canonical != source {
        return Err(invalid(format!(
            "{} now resolves to {}; its declaration is stale (restart the daemon)",
            source.display(),
            canonical.display()
        )));
    }
    if let Some(below) = mounts_below(source)?.first() {
        return Err(invalid(format!(
            "{} is a mount point inside {}: a microVM's snapshot of the volume would copy it, \
             while a namespace sandbox sees only the directory (declare the mount as a volume \
             of its own)",
            below.display(),
            source.display()
        )));
    }
    let io_at = |path: &Path| {
        let step = format!("read {label} at {}", path.display());
        move |e| StorageError::io(step, e)
    };
    let root = std::fs::symlink_metadata(source).map_err(io_at(source))?;
    if !root.is_dir() {
        return Err(invalid(format!("{} is not a directory", source.display())));
    }
    let mut tree = Tree {
        inodes: 1,
        blocks: 0,
        root: (root.uid(), root.gid(), root.mode()),
        lost_found: std::fs::symlink_metadata(source.join("lost+found")).is_ok_and(|m| m.is_dir()),
    };
    let mut linked = HashSet::new();
    let mut dirs = vec![source.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        // "." and "..", then each entry: its 8-byte header and its name, 4-byte aligned.
        let mut entry_bytes = 24u64;
        for entry in std::fs::read_dir(&dir).map_err(io_at(&dir))? {
            let entry = entry.map_err(io_at(&dir))?;
            entry_bytes += 8 + (entry.file_name().len() as u64).next_multiple_of(4);
            // Not following a link: DirEntry::metadata is an lstat.
            let meta = entry.metadata().map_err(io_at(&entry.path()))?;
            let kind = meta.file_type();
            if !kind.is_dir() && meta.nlink() > 1 && !linked.insert((meta.dev(), meta.ino())) {
                continue;
            }
            tree.inodes += 1;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                // Its data, and an extent index block per 512 MiB (an inode holds four
                // extents of at most 128 MiB each).
                tree.blocks += meta.len().div_ceil(BLOCK) + meta.len() / (512 * MIB);
            } else if kind.is_symlink() && meta.len() >= 60 {
                // Shorter targets live in the inode.
                tree.blocks += 1;
            }
        }
        // Directory blocks are not filled to the last byte.
        tree.blocks += 1 + entry_bytes.div_ceil(BLOCK * 3 / 4);
    }
    Ok(tree)
}

/// The mount points strictly inside `dir`, from `/proc/self/mountinfo`.
fn mounts_below(dir: &Path) -> Result<Vec<PathBuf>, StorageError> {
    let info = std::fs::read("/proc/self/mountinfo")
        .map_err(|e| StorageError::io("read /proc/self/mountinfo", e))?;
    Ok(info
        .split(|b| *b == b'\n')
        .filter_map(|line| line.split(|b| *b == b' ').nth(4))
        .map(|field| PathBuf::from(std::ffi::OsString::from_vec(unescape_mountinfo(field))))
        .filter(|point| point != dir && point.starts_with(dir))
        .collect())
}

/// A mountinfo path with its octal escapes (`\040` for a space, …) decoded.
fn unescape_mountinfo(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|_| field[i] == b'\\')
            .and_then(|digits| std::str::from_utf8(digits).ok())
            .and_then(|digits| u8::from_str_radix(digits, 8).ok());
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

enum BuildError {
    /// The tree did not fit the image.
    TooSmall(StorageError),
    /// Anything else.
    Failed(StorageError),
}

/// Makes `image` a `size_mib` ext4 holding the tree at `source` as it is now: no journal
/// (nothing will ever write it), the root directory owned and moded as `source`'s, and no
/// `lost+found` the directory does not have.
async fn make_snapshot(
    image: &Path,
    size_mib: u64,
    source: &Path,
    tree: &Tree,
) -> Result<(), BuildError> {
    let failed = |step: String, e: io::Error| BuildError::Failed(StorageError::io(step, e));
    let mkfs = mkfs_binary().ok_or_else(|| {
        failed(
            "finding mkfs.ext4 (install e2fsprogs)".into(),
            io::ErrorKind::NotFound.into(),
        )
    })?;
    let file = std::fs::File::create(image)
        .map_err(|e| failed(format!("create {}", image.display()), e))?;
    file.set_len(size_mib * MIB)
        .map_err(|e| failed(format!("size {} to {size_mib} MiB", image.display()), e))?;
    drop(file);
    let output = tokio::process::Command::new(&mkfs)
        .args(["-q", "-F", "-m", "0", "-b", "4096", "-I", "256", "-N"])
        .arg(tree.inodes_wanted().to_string())
        .args(["-O", "^has_journal,^resize_inode", "-E", "nodiscard", "-d"])
        .arg(source)
        .arg(image)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| failed(format!("run {}", mkfs.display()), e))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        let error = StorageError::io(
            format!(
                "mkfs.ext4 -d {} {} ({size_mib} MiB)",
                source.display(),
                image.display()
            ),
            io::Error::other(format!("{}: {stderr}", output.status)),
        );
        return Err(if stderr.contains("Could not allocate") {
            BuildError::TooSmall(error)
        } else {
            BuildError::Failed(error)
        });
    }
    let (uid, gid, mode) = tree.root;
    let mut commands = format!("sif <2> uid {uid}\nsif <2> gid {gid}\nsif <2> mode 0{mode:o}\n");
    if !tree.lost_found {
        commands.push_str("rmdir /lost+found\n");
    }
    debugfs(image, &commands).await.map_err(BuildError::Failed)
}

/// Runs `commands` through `debugfs -w` on `image`. It exits 0 whatever its commands did, so
/// anything on its stderr but its banner is the failure.
async fn debugfs(image: &Path, commands: &str) -> Result<(), StorageError> {
    let step = || format!("debugfs -w {} ({})", image.display(), commands.trim_end());
    let mut child = tokio::process::Command::new(debugfs_binary())
        .args(["-w", "-f", "-"])
        .arg(image)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| StorageError::io(format!("{} (install e2fsprogs)", step()), e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(commands.as_bytes())
            .await
            .map_err(|e| StorageError::io(step(), e))?;
    }
    let output = child
        .wait_with_output()
        .await
        .map_err(|e| StorageError::io(step(), e))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with("debugfs "))
        .collect();
    if !output.status.success() || !complaints.is_empty() {
        return Err(StorageError::io(
            step(),
            io::Error::other(format!("{}: {}", output.status, complaints.join("; "))),
        ));
    }
    Ok(())
}

/// `debugfs`, beside `mkfs.ext4` (both are e2fsprogs).
fn debugfs_binary() -> PathBuf {
    mkfs_binary()
        .and_then(|mkfs| Some(mkfs.parent()?.join("debugfs")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("debugfs"))
}

/// These build real images with `mkfs.ext4 -d` and read them back with `debugfs`; making
/// files of other owners and mounting need root, and fail without it.
#[cfg(test)]
mod tests {
    use std::os::unix::fs::{symlink, PermissionsExt};

    use super::*;

    /// What `debugfs -R request` prints about `image`.
    fn debugfs_says(image: &Path, request: &str) -> String {
        let output = std::process::Command::new(debugfs_binary())
            .args(["-R", request])
            .arg(image)
            .output()
            .expect("run debugfs");
        assert!(output.status.success(), "debugfs {request}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn store(budget_mib: u64) -> (tempfile::TempDir, VolumeSnapshots, Arc<DiskBudget>) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let budget = DiskBudget::new(budget_mib);
        let store =
            VolumeSnapshots::open(tmp.path().join("volumes"), budget.clone(), false).expect("open");
        (tmp, store, budget)
    }

    /// A volume directory under `parent`, canonical as a declaration makes it.
    fn volume_dir(parent: &Path) -> PathBuf {
        let dir = parent.join("tools");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::write(dir.join("VERSION"), "gcc 12\n").expect("write");
        dir.canonicalize().expect("canonical")
    }

    fn image_mib(image: &Path) -> u64 {
        std::fs::metadata(image).expect("stat").len() / MIB
    }

    #[tokio::test]
    async fn a_snapshot_holds_the_tree_as_it_was_with_host_owners_and_is_reused_after_changes() {
        let (tmp, store, _budget) = store(1024);
        let source = volume_dir(tmp.path());
        let secret = "the contents of a file outside the volume".to_string();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, &secret).expect("write");
        symlink(&outside, source.join("escape")).expect("ln -s");
        std::fs::hard_link(source.join("VERSION"), source.join("VERSION.again")).expect("ln");
        std::fs::create_dir(source.join("lib")).expect("mkdir");
        std::os::unix::fs::chown(source.join("lib"), Some(1000), Some(1001)).expect("chown");
        std::os::unix::fs::chown(&source, Some(100_000), Some(100_001)).expect("chown");
        std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o750)).expect("chmod");
        nix::unistd::mkfifo(&source.join("fifo"), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");

        let image = store.image("tools", &source).await.expect("built");
        assert_eq!(image, tmp.path().join("volumes/tools.ext4"));
        assert_eq!(store.builds(), 1);
        assert_eq!(debugfs_says(&image, "cat /VERSION"), "gcc 12\n");
        let listing = debugfs_says(&image, "ls /");
        for name in ["VERSION", "VERSION.again", "escape", "lib", "fifo"] {
            assert!(listing.contains(name), "{name} in {listing}");
        }
        assert!(
            !listing.contains("lost+found"),
            "nothing the directory lacks: {listing}"
        );
        let root = debugfs_says(&image, "stat <2>");
        assert!(
            root.contains("Mode:  0750") && root.contains("User: 100000   Group: 100001"),
            "{root}"
        );
        let lib = debugfs_says(&image, "stat /lib");
        assert!(lib.contains("User:  1000   Group:  1001"), "{lib}");
        let link = debugfs_says(&image, "stat /escape");
        assert!(
            link.contains("Type: symlink") && link.contains(&outside.display().to_string()),
            "{link}"
        );
        let hard = debugfs_says(&image, "stat /VERSION.again");
        assert!(
            hard.contains("Links: 2"),
            "one inode for both names: {hard}"
        );
        let bytes = std::fs::read(&image).expect("read the image");
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the link was followed out of the volume"
        );
        let fsck = std::process::Command::new("e2fsck")
            .arg("-fn")
            .arg(&image)
            .output()
            .expect("e2fsck");
        assert!(fsck.status.success(), "{fsck:?}");

        // Changes to the directory are not seen by this daemon's snapshot.
        std::fs::write(source.join("VERSION"), "gcc 13\n").expect("write");
        std::fs::write(source.join("new"), "new\n").expect("write");
        let again = store.image("tools", &source).await.expect("reused");
        assert_eq!(again, image);
        assert_eq!(store.builds(), 1);
        assert_eq!(debugfs_says(&image, "cat /VERSION"), "gcc 12\n");
    }

    #[tokio::test]
    async fn concurrent_first_requests_build_one_snapshot() {
        let (tmp, store, budget) = store(1024);
        let source = volume_dir(tmp.path());
        let requests = (0..8).map(|_| store.image("tools", &source));
        let images = futures_util::future::join_all(requests).await;
        let first = images[0].as_ref().expect("built").clone();
        for image in &images {
            assert_eq!(image.as_ref().expect("built"), &first);
        }
        assert_eq!(store.builds(), 1);
        assert_eq!(budget.taken_mib(), image_mib(&first));
        let names: Vec<_> = std::fs::read_dir(tmp.path().join("volumes"))
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["tools.ext4"], "no partial image left");
    }

    #[tokio::test]
    async fn a_snapshot_takes_its_size_of_the_budget_and_gives_it_back_when_rebuilt_or_gone() {
        let (tmp, store, budget) = store(1024);
        let source = volume_dir(tmp.path());
        std::fs::write(source.join("data"), vec![7u8; 3 << 20]).expect("write");
        let image = store.image("tools", &source).await.expect("built");
        let size = image_mib(&image);
        assert!(size >= 3 + FIXED_MIB, "{size} MiB");
        assert_eq!(budget.taken_mib(), size);

        // Removed from under the daemon: rebuilt (from the directory as it is now), counted
        // once.
        std::fs::remove_file(&image).expect("rm");
        std::fs::write(source.join("VERSION"), "gcc 13\n").expect("write");
        let rebuilt = store.image("tools", &source).await.expect("rebuilt");
        assert_eq!(rebuilt, image);
        assert_eq!(store.builds(), 2);
        assert_eq!(budget.taken_mib(), image_mib(&rebuilt));
        assert_eq!(debugfs_says(&rebuilt, "cat /VERSION"), "gcc 13\n");

        drop(store);
        assert!(!image.exists(), "a daemon's snapshots go with it");
        assert_eq!(budget.taken_mib(), 0);

        // Past the budget: refused, nothing held, nothing left.
        let tight = DiskBudget::new(size - 1);
        let store =
            VolumeSnapshots::open(tmp.path().join("volumes"), tight.clone(), false).expect("open");
        let e = store
            .image("tools", &source)
            .await
            .expect_err("over budget");
        assert!(matches!(e, StorageError::OverBudget { .. }), "{e}");
        assert!(e.to_string().contains("volume \"tools\""), "{e}");
        assert_eq!(tight.taken_mib(), 0);
        assert_eq!(
            std::fs::read_dir(tmp.path().join("volumes"))
                .expect("ls")
                .count(),
            0
        );
    }

    #[test]
    fn a_daemon_start_removes_stale_snapshots() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("volumes");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::write(dir.join("tools.ext4"), "old").expect("write");
        std::fs::write(dir.join(".tools.ext4.3.partial"), "half").expect("write");
        let budget = DiskBudget::new(10);
        let _store = VolumeSnapshots::open(dir.clone(), budget.clone(), false).expect("open");
        assert_eq!(std::fs::read_dir(&dir).expect("ls").count(), 0);
        assert_eq!(budget.taken_mib(), 0);
    }

    /// Unmounts on drop, so a failing test leaves no mount behind.
    struct Mounted(PathBuf);

    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }

    #[tokio::test]
    async fn a_volume_with_a_mount_below_it_or_no_longer_where_declared_is_refused() {
        let (tmp, store, budget) = store(1024);
        let source = volume_dir(tmp.path());
        let below = source.join("mnt with space");
        std::fs::create_dir(&below).expect("mkdir");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(&below)
            .status()
            .expect("mount");
        assert!(status.success(), "mounting a tmpfs needs root");
        let mounted = Mounted(below.clone());
        let e = store
            .image("tools", &source)
            .await
            .expect_err("a mount below");
        assert!(
            matches!(e, StorageError::Invalid(_)) && e.to_string().contains("mnt with space"),
            "{e}"
        );
        drop(mounted);
        store.image("tools", &source).await.expect("unmounted");

        let link = tmp.path().join("link");
        symlink(&source, &link).expect("ln -s");
        let e = store.image("other", &link).await.expect_err("a link");
        assert!(e.to_string().contains("now resolves to"), "{e}");
        assert_eq!(store.builds(), 1);
        assert_eq!(
            budget.taken_mib(),
            image_mib(&tmp.path().join("volumes/tools.ext4"))
        );
    }

    #[tokio::test]
    async fn the_estimate_fits_a_tree_of_many_small_files_and_a_too_small_image_says_so() {
        let (tmp, store, _budget) = store(4096);
        let source = volume_dir(tmp.path());
        let mut content = 0u64;
        for d in 0..20 {
            let dir = source.join(format!("pkg-{d:02}-{}", "n".repeat(40)));
            std::fs::create_dir(&dir).expect("mkdir");
            for f in 0..150 {
                let body = vec![b'x'; (d * 150 + f) % 5000];
                content += body.len() as u64;
                std::fs::write(
                    dir.join(format!("module_{f:03}_{}.py", "m".repeat(30))),
                    body,
                )
                .expect("write");
            }
            symlink("x".repeat(100), dir.join("long-link")).expect("ln -s");
        }
        std::fs::write(source.join("big"), vec![1u8; 20 << 20]).expect("write");
        content += 20 << 20;
        let tree = survey("volume \"tools\"", &source).expect("survey");
        assert_eq!(tree.inodes, 1 + 1 + 20 * (1 + 150 + 1) + 1);
        let image = store.image("tools", &source).await.expect("built");
        assert_eq!(image_mib(&image), tree.image_mib(), "fits at the first try");
        assert!(
            tree.image_mib() < 2 * content / MIB + 32,
            "{} MiB for {content} bytes",
            tree.image_mib()
        );

        let small = tmp.path().join("small.ext4");
        let result = make_snapshot(&small, 12, &source, &tree).await;
        assert!(
            matches!(result, Err(BuildError::TooSmall(_))),
            "20 MiB of file in 12 MiB"
        );
    }

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mountinfo(b"/a\\040b\\134c\\"), b"/a b\\c\\");
        assert_eq!(unescape_mountinfo(b"/plain"), b"/plain");
    }
}
