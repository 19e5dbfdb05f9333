//! L1's root filesystem, packed as one uncompressed initramfs: busybox, the `/init` script,
//! the kernel modules, the plan of steps, and host files *at their own absolute paths* — the
//! test binaries look for the image, `crucible-vmm` and each other where cargo put them on the
//! host (`CARGO_MANIFEST_DIR`, `CARGO_BIN_EXE_*`), so L1 holds them at the same places. The
//! dynamic binaries bring the libraries `ldd` names, and every symlink on the way to a file
//! (Debian's merged `/usr`: `/lib64 -> usr/lib64`) is kept as a symlink. Debug binaries are
//! copied without their debug info (`objcopy --strip-debug`; symbols stay, so backtraces still
//! name functions): the initramfs is unpacked into L1's memory.
//!
//! The archive is deterministic (sorted entries, mtime 0, owner root): the same inputs give
//! the same bytes.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};
use guest_image::initramfs::{self, Contents, Node};
use guest_image::Tree;
use xshell::{cmd, Shell};

/// Where busybox and its applets live in L1 (kept apart from mirrored host paths).
pub(crate) const BUSYBOX_DIR: &str = "busybox";

/// An L1 root in the making.
#[derive(Debug)]
pub(crate) struct L1Root {
    tree: Tree,
    /// Where stripped copies of debug binaries are written.
    strip_dir: PathBuf,
    /// Host files already mirrored (canonical paths).
    mirrored: BTreeSet<PathBuf>,
    /// Where `objcopy` and `ldd` run: this process's directory, so that relative paths
    /// given on the command line still mean what they say.
    sh: Shell,
}

impl L1Root {
    /// An empty root whose stripped binaries go to `strip_dir`.
    pub(crate) fn new(strip_dir: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&strip_dir)
            .with_context(|| format!("creating {}", strip_dir.display()))?;
        Ok(L1Root {
            tree: Tree::new(),
            strip_dir,
            mirrored: BTreeSet::new(),
            sh: Shell::new().context("creating the shell objcopy and ldd run in")?,
        })
    }

    /// Adds `node` at the absolute L1 path `path`.
    pub(crate) fn insert(&mut self, path: &str, node: Node) -> Result<()> {
        self.tree
            .insert(path, node)
            .with_context(|| format!("adding {path} to the L1 root"))
    }

    /// A file with these bytes at `path`.
    pub(crate) fn file(&mut self, path: &str, mode: u32, bytes: impl Into<Vec<u8>>) -> Result<()> {
        self.insert(
            path,
            Node::File {
                mode,
                contents: Contents::Bytes(bytes.into()),
            },
        )
    }

    /// Debian's static busybox in `/busybox`, with a symlink per applet beside it.
    pub(crate) fn busybox(&mut self, busybox: &initramfs::Busybox) -> Result<()> {
        self.insert(
            &format!("{BUSYBOX_DIR}/busybox"),
            Node::File {
                mode: 0o755,
                contents: Contents::Path(busybox.path.clone()),
            },
        )?;
        let names: BTreeSet<&str> = busybox
            .applets
            .iter()
            .filter_map(|a| a.rsplit('/').next())
            .filter(|a| !a.is_empty() && *a != "busybox")
            .collect();
        for name in names {
            self.insert(
                &format!("{BUSYBOX_DIR}/{name}"),
                Node::Symlink {
                    target: "busybox".into(),
                },
            )?;
        }
        Ok(())
    }

    /// The host file or directory `path` at the same place in L1, with every symlink on the
    /// way; files only, never a directory's mtime or owner.
    pub(crate) fn mirror(&mut self, path: &Path) -> Result<()> {
        let real = self.resolve(path)?;
        let meta =
            std::fs::metadata(&real).with_context(|| format!("reading {}", real.display()))?;
        if meta.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(&real)
                .with_context(|| format!("reading {}", real.display()))?
                .map(|e| e.map(|e| e.path()))
                .collect::<Result<_, _>>()?;
            entries.sort();
            self.insert(&l1_path(&real)?, Node::Dir { mode: 0o755 })?;
            for entry in entries {
                self.mirror(&entry)?;
            }
            return Ok(());
        }
        if !self.mirrored.insert(real.clone()) {
            return Ok(());
        }
        self.insert(
            &l1_path(&real)?,
            Node::File {
                mode: meta.permissions().mode() & 0o7777,
                contents: Contents::Path(real.clone()),
            },
        )
    }

    /// An executable at its own path, its debug info stripped when `strip`, and every shared
    /// library it loads (`ldd`).
    pub(crate) fn executable(&mut self, path: &Path, strip: bool) -> Result<()> {
        if strip {
            let real = self.resolve(path)?;
            let stripped = self.strip_dir.join(
                real.to_string_lossy()
                    .trim_start_matches('/')
                    .replace('/', "__"),
            );
            let sh = &self.sh;
            cmd!(sh, "objcopy --strip-debug {real} {stripped}")
                .quiet()
                .run()
                .with_context(|| {
                    format!(
                        "objcopy --strip-debug {} failed (objcopy is in binutils)",
                        real.display()
                    )
                })?;
            if self.mirrored.insert(real.clone()) {
                self.insert(
                    &l1_path(&real)?,
                    Node::File {
                        mode: 0o755,
                        contents: Contents::Path(stripped),
                    },
                )?;
            }
        } else {
            self.mirror(path)?;
        }
        for lib in shared_libraries(&self.sh, path)? {
            self.mirror(&lib)?;
        }
        Ok(())
    }

    /// A directory to exist in L1 (`/work/main/tests`, so that `tests/../target` resolves).
    pub(crate) fn dir(&mut self, path: &Path) -> Result<()> {
        let real = self.resolve(path)?;
        self.insert(&l1_path(&real)?, Node::Dir { mode: 0o755 })
    }

    /// `path` with every symlink resolved, each symlink met on the way added to L1 as it is on
    /// the host.
    fn resolve(&mut self, path: &Path) -> Result<PathBuf> {
        self.resolve_depth(path, 0)
    }

    fn resolve_depth(&mut self, path: &Path, depth: usize) -> Result<PathBuf> {
        if depth > 40 {
            bail!("too many symlinks resolving {}", path.display());
        }
        if !path.is_absolute() {
            bail!("{} is not an absolute path", path.display());
        }
        let mut resolved = PathBuf::from("/");
        for component in path.components().skip(1) {
            match component {
                Component::Normal(name) => {
                    let candidate = resolved.join(name);
                    let meta = std::fs::symlink_metadata(&candidate)
                        .with_context(|| format!("reading {}", candidate.display()))?;
                    if meta.file_type().is_symlink() {
                        let target = std::fs::read_link(&candidate)?;
                        self.insert(
                            &l1_path(&candidate)?,
                            Node::Symlink {
                                target: target.to_string_lossy().into_owned(),
                            },
                        )?;
                        let absolute = resolved.join(&target);
                        resolved = self.resolve_depth(&normalize(&absolute), depth + 1)?;
                    } else {
                        resolved = candidate;
                    }
                }
                Component::ParentDir => {
                    resolved.pop();
                }
                _ => {}
            }
        }
        Ok(resolved)
    }

    /// Writes the root as an uncompressed cpio to `out`; returns its size.
    pub(crate) fn write(&self, out: &Path) -> Result<u64> {
        let file =
            std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
        initramfs::write_cpio(&self.tree, std::io::BufWriter::new(file))
            .with_context(|| format!("writing {}", out.display()))?;
        Ok(std::fs::metadata(out)?.len())
    }

    /// How many entries the root holds.
    pub(crate) fn len(&self) -> usize {
        self.tree.len()
    }
}

/// `path` (absolute) as a tree path.
fn l1_path(path: &Path) -> Result<String> {
    path.to_str()
        .map(|p| p.trim_start_matches('/').to_string())
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

/// `.` and `..` taken out of an absolute path, lexically.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// The shared libraries (and the loader) `ldd` says `binary` loads; none for a static one.
fn shared_libraries(sh: &Shell, binary: &Path) -> Result<Vec<PathBuf>> {
    // A failing ldd means no libraries (a static binary, say): its status is checked below.
    let out = cmd!(sh, "ldd {binary}")
        .ignore_status()
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.contains("not a dynamic executable") {
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        } else if line.contains("not found") {
            bail!("{}: {}", binary.display(), line.trim());
        }
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn normalize_takes_out_dots() {
        assert_eq!(
            normalize(Path::new("/usr/lib64/../lib/./x")),
            PathBuf::from("/usr/lib/x")
        );
        assert_eq!(normalize(Path::new("/../a")), PathBuf::from("/a"));
    }

    #[test]
    fn mirroring_keeps_each_symlink_on_the_way_and_the_file_at_its_real_path() {
        let host = tempfile::tempdir().unwrap();
        let base = host.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("usr/lib")).unwrap();
        std::fs::write(base.join("usr/lib/libx.so"), b"x").unwrap();
        std::os::unix::fs::symlink("usr/lib", base.join("lib")).unwrap();
        std::os::unix::fs::symlink("libx.so", base.join("usr/lib/libx.so.1")).unwrap();
        let strip = tempfile::tempdir().unwrap();
        let mut root = L1Root::new(strip.path().to_path_buf()).unwrap();
        root.mirror(&base.join("lib/libx.so.1")).unwrap();
        let at = |p: &str| {
            root.tree
                .get(&format!("{}/{p}", l1_path(&base).unwrap()))
                .cloned()
        };
        assert_eq!(
            at("lib"),
            Some(Node::Symlink {
                target: "usr/lib".into()
            })
        );
        assert_eq!(
            at("usr/lib/libx.so.1"),
            Some(Node::Symlink {
                target: "libx.so".into()
            })
        );
        assert!(matches!(at("usr/lib/libx.so"), Some(Node::File { .. })));
    }

    #[test]
    fn this_test_binary_needs_libc_and_the_loader() {
        let me = std::env::current_exe().unwrap();
        let libs = shared_libraries(&Shell::new().unwrap(), &me).unwrap();
        assert!(
            libs.iter()
                .any(|l| l.file_name() == Some(std::ffi::OsStr::new("libc.so.6"))),
            "{libs:?}"
        );
        assert!(
            libs.iter()
                .any(|l| l.to_string_lossy().contains("ld-linux-x86-64")),
            "{libs:?}"
        );
    }
}
