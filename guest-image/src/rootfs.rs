//! The optional root filesystem image: a directory packed into ext4 with `mkfs.ext4 -d`, or a
//! Debian bookworm minbase debootstrapped into the cache first.
//!
//! The agent mounts it read-only under a tmpfs overlay, so many sandboxes share one file.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::cache::{self, Cache, CacheLock};
use crate::deps::{self, DepsError};
use crate::process::{self, CommandError};
use crate::progress::{Origin, Progress};

/// The Debian suite `--rootfs debian` bootstraps.
pub const DEBIAN_SUITE: &str = "bookworm";
pub const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";
/// Bump when the debootstrap recipe changes.
pub const RECIPE_VERSION: u32 = 1;

#[derive(Debug, Error)]
pub enum RootfsError {
    #[error(transparent)]
    Deps(#[from] DepsError),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("{} is not a directory", path.display())]
    NotADir { path: PathBuf },
    #[error("{}: {what}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid package name {name:?}")]
    BadPackage { name: String },
}

fn io_err(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> RootfsError {
    let path = path.to_path_buf();
    move |source| RootfsError::Io { path, what, source }
}

/// What goes into `rootfs.ext4`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootfsSource {
    /// This directory, as is.
    Dir(PathBuf),
    /// `debootstrap --variant=minbase bookworm` plus these packages, cached.
    Debian { packages: Vec<String> },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RootfsInfo {
    /// `dir:/path` or `debian:bookworm minbase`.
    pub source: String,
    pub packages: Vec<String>,
    /// The tree that was packed.
    pub tree: PathBuf,
    /// Whether the tree came from the cache.
    pub tree_origin: Origin,
}

/// Builds `out` (an ext4 image) from `source`.
pub fn build(
    source: &RootfsSource,
    out: &Path,
    cache: &Cache,
    force: bool,
    logs: &Path,
    progress: &dyn Progress,
) -> Result<RootfsInfo, RootfsError> {
    let apt_log = logs.join("apt.log");
    deps::ensure(&["e2fsprogs"], "packing the rootfs", &apt_log, progress)?;
    let info = match source {
        RootfsSource::Dir(dir) => {
            if !dir.is_dir() {
                return Err(RootfsError::NotADir { path: dir.clone() });
            }
            RootfsInfo {
                source: format!("dir:{}", dir.display()),
                packages: Vec::new(),
                tree: dir.clone(),
                tree_origin: Origin::Built,
            }
        }
        RootfsSource::Debian { packages } => {
            debian(packages, cache, force, logs, &apt_log, progress)?
        }
    };
    let size_mib = image_size_mib(&info.tree)?;
    progress.status(&format!(
        "mkfs.ext4 -d {} ({size_mib} MiB)",
        info.tree.display()
    ));
    let tmp = out.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    process::run_logged(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "crucible-root", "-m", "0"])
            .args(["-E", "root_owner=0:0"])
            .arg("-d")
            .arg(&info.tree)
            .arg(&tmp)
            .arg(format!("{size_mib}M")),
        &logs.join("rootfs.log"),
    )?;
    fs::rename(&tmp, out).map_err(io_err(out, "renaming into place"))?;
    Ok(info)
}

/// Packages `apt-get install` would bring with a requested one (its Recommends) that a usable
/// image needs: added to the request, since debootstrap installs dependencies only.
const IMPLIED_PACKAGES: &[(&str, &str)] = &[
    ("gcc", "libc6-dev"),
    ("g++", "libc6-dev"),
    ("clang", "libc6-dev"),
];

/// The packages to install for `requested`: checked, with the implied ones, sorted (the cache
/// key is made from this list).
fn package_list(requested: &[String]) -> Result<Vec<String>, RootfsError> {
    let mut packages = requested.to_vec();
    // debootstrap installs dependencies, never recommendations: `gcc` alone cannot link a
    // program (crt1.o and libc.so are in libc6-dev, which apt would have pulled in).
    for (package, needs) in IMPLIED_PACKAGES {
        if requested.iter().any(|p| p == package) {
            packages.push((*needs).to_string());
        }
    }
    packages.sort();
    packages.dedup();
    for name in &packages {
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c));
        if !ok {
            return Err(RootfsError::BadPackage { name: name.clone() });
        }
    }
    Ok(packages)
}

fn debian(
    packages: &[String],
    cache: &Cache,
    force: bool,
    logs: &Path,
    apt_log: &Path,
    progress: &dyn Progress,
) -> Result<RootfsInfo, RootfsError> {
    let packages = package_list(packages)?;
    let key = cache::key(&[
        &format!("recipe={RECIPE_VERSION}"),
        &format!("suite={DEBIAN_SUITE}"),
        "variant=minbase",
        &format!("packages={}", packages.join(",")),
    ]);
    let tree = cache.rootfs_dir(&format!("debian-{DEBIAN_SUITE}-{key}"));
    let marker = tree.with_extension("done");
    let info = |origin| RootfsInfo {
        source: format!("debian:{DEBIAN_SUITE} minbase"),
        packages: packages.clone(),
        tree: tree.clone(),
        tree_origin: origin,
    };
    let _lock = CacheLock::acquire(&tree, progress).map_err(io_err(&tree, "locking"))?;
    if !force && marker.is_file() && tree.is_dir() {
        return Ok(info(Origin::Cached));
    }
    deps::ensure(&["debootstrap"], "--rootfs debian", apt_log, progress)?;
    if tree.exists() {
        fs::remove_dir_all(&tree).map_err(io_err(&tree, "removing a stale tree"))?;
    }
    let _ = fs::remove_file(&marker);
    fs::create_dir_all(&tree).map_err(io_err(&tree, "creating"))?;
    let log = logs.join("debootstrap.log");
    progress.status(&format!(
        "debootstrap --variant=minbase {DEBIAN_SUITE} (a few minutes); log: {}",
        log.display()
    ));
    let mut cmd = Command::new("debootstrap");
    cmd.arg("--variant=minbase");
    if !packages.is_empty() {
        cmd.arg(format!("--include={}", packages.join(",")));
    }
    cmd.arg(DEBIAN_SUITE).arg(&tree).arg(DEBIAN_MIRROR);
    process::run_logged(&mut cmd, &log)?;
    // Downloaded .debs are not needed in the image.
    let archives = tree.join("var/cache/apt/archives");
    if let Ok(entries) = fs::read_dir(&archives) {
        for entry in entries.flatten() {
            if entry.path().extension().is_some_and(|e| e == "deb") {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
    fs::write(&marker, packages.join("\n")).map_err(io_err(&marker, "writing"))?;
    Ok(info(Origin::Built))
}

/// The image size: the tree's allocated size plus a quarter, plus 64 MiB for metadata and
/// journal (the overlay's writes go to tmpfs, not here).
fn image_size_mib(tree: &Path) -> Result<u64, RootfsError> {
    let bytes = tree_bytes(tree)?;
    Ok((bytes + bytes / 4) / (1024 * 1024) + 64)
}

fn tree_bytes(dir: &Path) -> Result<u64, RootfsError> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).map_err(io_err(&dir, "reading directory"))? {
            let entry = entry.map_err(io_err(&dir, "reading directory"))?;
            let meta = entry
                .metadata()
                .map_err(io_err(&entry.path(), "inspecting"))?;
            // Allocated blocks, at least one 4 KiB block per inode.
            total += (meta.blocks() * 512).max(4096);
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_size_has_headroom_over_the_tree() {
        let dir = std::env::temp_dir().join(format!("crucible-rootfs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("a/b")).unwrap();
        fs::write(dir.join("a/b/f"), vec![1u8; 3 * 1024 * 1024]).unwrap();
        let size = image_size_mib(&dir).unwrap();
        assert!((67..=70).contains(&size), "{size}");
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn bad_package_names_are_rejected_before_debootstrap() {
        let err = debian(
            &["python3; rm -rf /".into()],
            &Cache::at("/nonexistent"),
            false,
            Path::new("/tmp"),
            Path::new("/tmp/apt.log"),
            &crate::progress::Silent,
        )
        .unwrap_err();
        assert!(matches!(err, RootfsError::BadPackage { .. }), "{err}");
    }

    #[test]
    fn a_compiler_brings_the_c_library_headers_apt_would_have() {
        let list = package_list(&["make".into(), "gcc".into()]).expect("valid");
        assert_eq!(list, ["gcc", "libc6-dev", "make"]);
        let list = package_list(&["python3".into()]).expect("valid");
        assert_eq!(list, ["python3"]);
    }
}
