//! The build cache outside the checkout: `$XDG_CACHE_HOME/crucible` (default
//! `~/.cache/crucible`), so fresh CI clones reuse kernels and debootstrapped roots.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::progress::Progress;

/// Where cached kernels, extracted sources and rootfs trees live.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

impl Cache {
    /// A cache rooted at `root`.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Cache { root: root.into() }
    }

    /// The default location: `$XDG_CACHE_HOME/crucible`, else `$HOME/.cache/crucible`, else
    /// `/tmp/crucible-cache`.
    pub fn default_location() -> Self {
        Self::at(default_root(
            std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from),
            std::env::var_os("HOME").map(PathBuf::from),
        ))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `kernel/<key>/`: one finished kernel (vmlinux, config, kernel.json).
    pub fn kernel_dir(&self, key: &str) -> PathBuf {
        self.root.join("kernel").join(key)
    }

    /// `kernel/build/<key>/`: the out-of-tree build directory while building.
    pub fn kernel_build_dir(&self, key: &str) -> PathBuf {
        self.root.join("kernel").join("build").join(key)
    }

    /// `kernel/src/<name>/`: an extracted source tarball.
    pub fn kernel_src_dir(&self, name: &str) -> PathBuf {
        self.root.join("kernel").join("src").join(name)
    }

    /// `rootfs/<name>/`: a debootstrapped tree.
    pub fn rootfs_dir(&self, name: &str) -> PathBuf {
        self.root.join("rootfs").join(name)
    }
}

/// An exclusive lock on one cache entry, held until dropped, so two `build-image` runs sharing
/// the cache never build into the same directory at once: the second waits, then finds the
/// first one's result.
#[derive(Debug)]
pub struct CacheLock {
    _file: File,
    path: PathBuf,
}

impl CacheLock {
    /// Locks `<entry>.lock` beside `entry` (creating parents), saying so when it has to wait.
    pub fn acquire(entry: &Path, progress: &dyn Progress) -> std::io::Result<CacheLock> {
        let mut name = entry.file_name().unwrap_or_default().to_os_string();
        name.push(".lock");
        let path = entry.with_file_name(name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                progress.note(&format!(
                    "waiting for another build using {} (lock {})",
                    entry.display(),
                    path.display()
                ));
                file.lock()?;
            }
            Err(TryLockError::Error(e)) => return Err(e),
        }
        Ok(CacheLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn default_root(xdg: Option<PathBuf>, home: Option<PathBuf>) -> PathBuf {
    match (xdg, home) {
        (Some(xdg), _) if xdg.is_absolute() => xdg.join("crucible"),
        (_, Some(home)) if home.is_absolute() => home.join(".cache").join("crucible"),
        _ => std::env::temp_dir().join("crucible-cache"),
    }
}

/// A short, stable key: the first 16 hex digits of the sha256 of `parts`, one per line.
pub fn key(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())[..16].to_string()
}

/// Makes a string safe as one path component (`6.12.117-1~deb12u1` stays readable).
pub fn path_component(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '~' | '+') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_root_follows_xdg_then_home() {
        assert_eq!(
            default_root(Some("/x".into()), Some("/home/u".into())),
            PathBuf::from("/x/crucible")
        );
        assert_eq!(
            default_root(Some("relative".into()), Some("/home/u".into())),
            PathBuf::from("/home/u/.cache/crucible")
        );
        assert_eq!(
            default_root(None, Some("/root".into())),
            PathBuf::from("/root/.cache/crucible")
        );
    }

    #[test]
    fn cache_lock_is_exclusive_until_dropped() {
        let root = std::env::temp_dir().join(format!("crucible-lock-{}", std::process::id()));
        let entry = root.join("kernel").join("abc");
        let lock = CacheLock::acquire(&entry, &crate::progress::Silent).unwrap();
        assert_eq!(lock.path(), root.join("kernel/abc.lock"));
        let other = File::options().write(true).open(lock.path()).unwrap();
        assert!(matches!(other.try_lock(), Err(TryLockError::WouldBlock)));
        drop(lock);
        other.try_lock().unwrap();
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn key_changes_with_any_part() {
        let a = key(&["recipe=1", "fragment=abc"]);
        assert_eq!(a.len(), 16);
        assert_eq!(a, key(&["recipe=1", "fragment=abc"]));
        assert_ne!(a, key(&["recipe=2", "fragment=abc"]));
        assert_ne!(a, key(&["recipe=1fragment=abc"]));
        assert_eq!(path_component("a/b c~1"), "a_b_c~1");
    }
}
