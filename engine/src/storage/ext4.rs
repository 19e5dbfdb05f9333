//! ext4 images on the host's disk: made sparse with `mkfs.ext4`, attached to sandboxes through
//! loop devices (namespace sandboxes) or virtio-block (microVMs). The filesystem is what
//! enforces the size: a full image is `ENOSPC` inside, never a full host disk.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use super::{BudgetLease, DiskBudget, StorageError};

/// Whether the filesystem keeps a journal: caches do (they outlive crashes), disposable
/// writable layers do not (nothing to recover, and it saves writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Journal {
    /// With a journal.
    Yes,
    /// Without.
    No,
}

/// Where `mkfs.ext4` is, if anywhere (`PATH`, then `/usr/sbin`, `/sbin`).
pub(crate) fn mkfs_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("mkfs.ext4"))
        .find(|p| p.is_file())
}

/// Makes `path` a sparse file of `size_mib` holding an empty ext4 whose root directory belongs
/// to uid 0 (the sandbox's root, through an idmapped mount or inside a VM), with no blocks
/// reserved for root (so the limit is the size), all of it lazily initialised (so the file
/// stays sparse and making it takes milliseconds).
pub(crate) async fn make_image(
    path: &Path,
    size_mib: u64,
    journal: Journal,
) -> Result<(), StorageError> {
    let mkfs = mkfs_binary().ok_or_else(|| {
        StorageError::io(
            "finding mkfs.ext4 (install e2fsprogs)",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        )
    })?;
    let file = std::fs::File::create(path)
        .map_err(|e| StorageError::io(format!("create {}", path.display()), e))?;
    file.set_len(size_mib * 1024 * 1024)
        .map_err(|e| StorageError::io(format!("size {} to {size_mib} MiB", path.display()), e))?;
    drop(file);
    let mut command = tokio::process::Command::new(&mkfs);
    command.args(["-q", "-F", "-m", "0", "-E"]);
    command.arg("lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0");
    if journal == Journal::No {
        command.args(["-O", "^has_journal"]);
    }
    let output = command
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| StorageError::io(format!("run {}", mkfs.display()), e))?;
    if !output.status.success() {
        let _ = std::fs::remove_file(path);
        return Err(StorageError::io(
            format!("mkfs.ext4 {} ({size_mib} MiB)", path.display()),
            std::io::Error::other(format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )),
        ));
    }
    Ok(())
}

/// Whether `image` backs a loop device now: its last sandbox's mount may outlive the sandbox
/// by a moment (the kernel drops a mount namespace's mounts lazily), and mounting an ext4 a
/// second time through another loop device would corrupt it.
pub(crate) fn is_attached(image: &Path) -> bool {
    loop_device_of(image).is_some()
}

/// The device number (`major:minor`, as `/proc/PID/mountinfo` shows it) of a loop device
/// `image` backs now, if one does.
pub(crate) fn loop_device_of(image: &Path) -> Option<String> {
    let wanted = image.canonicalize().ok()?;
    std::fs::read_dir("/sys/block")
        .ok()?
        .flatten()
        .find(|entry| {
            std::fs::read_to_string(entry.path().join("loop/backing_file"))
                .is_ok_and(|backing| Path::new(backing.trim_end()) == wanted)
        })
        .and_then(|entry| std::fs::read_to_string(entry.path().join("dev")).ok())
        .map(|dev| dev.trim_end().to_string())
}

/// Disk-backed writable layers, one image per sandbox under one directory.
#[derive(Debug)]
pub(crate) struct ScratchDisks {
    dir: PathBuf,
    budget: Arc<DiskBudget>,
}

/// One sandbox's writable layer: its image is removed, and its budget returned, when dropped
/// (after the sandbox is gone; a loop device still attached keeps the blocks until it goes).
#[derive(Debug)]
pub(crate) struct ScratchDisk {
    path: PathBuf,
    _lease: BudgetLease,
    /// Left on disk when dropped ([`ScratchDisk::leave`]).
    left: bool,
}

impl Drop for ScratchDisk {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!("remove {}: {e}", self.path.display());
        }
    }
}

impl ScratchDisk {
    /// The image.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Lets go of it, leaving the image on disk (live restore: its sandbox runs on).
    pub(crate) fn leave(mut self) {
        self.left = true;
    }
}

impl ScratchDisks {
    /// Layers kept in `dir`, removing what a crashed daemon left there (its sandboxes died
    /// with it), unless `keep` (live restore): then the sandboxes taken back
    /// [`reclaim`](Self::reclaim) theirs and [`remove_unclaimed`](Self::remove_unclaimed)
    /// removes the rest.
    pub(crate) fn open(
        dir: PathBuf,
        budget: Arc<DiskBudget>,
        keep: bool,
    ) -> Result<Self, StorageError> {
        if dir.exists() && !keep {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| StorageError::io(format!("clean {}", dir.display()), e))?;
        }
        create_private_dir(&dir)?;
        Ok(ScratchDisks { dir, budget })
    }

    /// A fresh layer of `size_mib` for sandbox `id`.
    pub(crate) async fn create(
        &self,
        id: &str,
        size_mib: u64,
    ) -> Result<ScratchDisk, StorageError> {
        let lease = self
            .budget
            .take(&format!("disk_mib of sandbox {id}"), size_mib)?;
        let path = self.dir.join(format!("{id}.ext4"));
        make_image(&path, size_mib, Journal::No).await?;
        Ok(ScratchDisk {
            path,
            _lease: lease,
            left: false,
        })
    }
}

impl ScratchDisks {
    /// Takes back the layer of sandbox `id`, which an earlier daemon made and which it still
    /// uses (live restore): its share of the budget is taken again.
    pub(crate) fn reclaim(&self, id: &str) -> Result<ScratchDisk, StorageError> {
        let path = self.dir.join(format!("{id}.ext4"));
        let (_, lease) = retake(&path, &self.budget, &format!("disk_mib of sandbox {id}"))?;
        Ok(ScratchDisk {
            path,
            _lease: lease,
            left: false,
        })
    }

    /// Removes the layers of every sandbox but `kept` (after live restore).
    pub(crate) fn remove_unclaimed(&self, kept: &[String]) {
        remove_files_but(&self.dir, |path| {
            path.file_stem()
                .is_some_and(|id| kept.iter().any(|k| k.as_str() == id))
        });
    }
}

/// Removes every file in `dir` for which `keep` is false (after live restore: the images no
/// sandbox taken back uses), saying so.
pub(crate) fn remove_files_but(dir: &Path, keep: impl Fn(&Path) -> bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if keep(&path) {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::info!("removed {}, which no sandbox uses", path.display()),
            Err(e) => tracing::warn!("remove {}: {e}", path.display()),
        }
    }
}

/// Takes `image`'s share of `budget` again for `what`: an image an earlier daemon made, which
/// a sandbox taken back still uses (live restore). Its size, and the lease.
pub(crate) fn retake(
    image: &Path,
    budget: &Arc<DiskBudget>,
    what: &str,
) -> Result<(u64, BudgetLease), StorageError> {
    let meta = std::fs::symlink_metadata(image)
        .map_err(|e| StorageError::io(format!("{what}: {}", image.display()), e))?;
    if !meta.is_file() {
        return Err(StorageError::Invalid(format!(
            "{what}: {} is not a regular file",
            image.display()
        )));
    }
    let lease = budget.take(what, meta.len().div_ceil(1024 * 1024))?;
    Ok((meta.len(), lease))
}

/// Creates `dir` (and its parents) readable by root only.
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), StorageError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| StorageError::io(format!("create {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn images_are_sparse_ext4_and_layers_go_with_their_sandbox() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let budget = DiskBudget::new(1024);
        let disks =
            ScratchDisks::open(tmp.path().join("scratch"), budget.clone(), false).expect("open");
        let disk = disks
            .create("sb-0000000000000001", 512)
            .await
            .expect("create");
        let meta = std::fs::metadata(disk.path()).expect("stat");
        assert_eq!(meta.len(), 512 * 1024 * 1024);
        use std::os::unix::fs::MetadataExt;
        assert!(
            meta.blocks() * 512 < 32 * 1024 * 1024,
            "sparse: {} bytes allocated",
            meta.blocks() * 512
        );
        let mut magic = [0u8; 2];
        std::os::unix::fs::FileExt::read_exact_at(
            &std::fs::File::open(disk.path()).expect("open"),
            &mut magic,
            0x438,
        )
        .expect("read the superblock");
        assert_eq!(magic, [0x53, 0xef], "the ext4 superblock magic");
        assert!(!is_attached(disk.path()));
        assert_eq!(budget.taken_mib(), 512);
        let e = disks
            .create("sb-0000000000000002", 600)
            .await
            .expect_err("over budget");
        assert!(matches!(e, StorageError::OverBudget { .. }), "{e}");
        let path = disk.path().to_path_buf();
        drop(disk);
        assert!(!path.exists());
        assert_eq!(budget.taken_mib(), 0);
    }
}
