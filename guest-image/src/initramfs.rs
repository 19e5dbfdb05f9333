//! The guest's root tree (agent at `/init`, busybox userland) and its deterministic newc cpio.
//!
//! The same [`Tree`] is written as `initramfs.cpio` for the microVM and, by [`write_dir`], as a
//! plain directory for the namespace backend, so both backends run the same userland.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::deps::{self, DepsError};
use crate::elf::{self, ElfError};
use crate::process::{self, CommandError};
use crate::progress::Progress;

/// Debian's static busybox and where it installs.
pub const BUSYBOX_PACKAGE: &str = "busybox-static";
pub const BUSYBOX_PATH: &str = "/bin/busybox";
/// Every entry's mtime: fixed so the same inputs give the same bytes.
pub const MTIME: u32 = 0;

#[derive(Debug, Error)]
pub enum InitramfsError {
    #[error(transparent)]
    Deps(#[from] DepsError),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error("{} is not a static binary; is {BUSYBOX_PACKAGE} (not busybox) installed?", path.display())]
    BusyboxNotStatic { path: PathBuf },
    #[error("{}: {what}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{path}: too large for a newc cpio entry ({size} bytes)")]
    TooLarge { path: String, size: u64 },
    #[error("invalid path in tree: {path:?}")]
    BadPath { path: String },
}

fn io_err(path: &Path, what: &'static str) -> impl FnOnce(io::Error) -> InitramfsError {
    let path = path.to_path_buf();
    move |source| InitramfsError::Io { path, what, source }
}

/// File contents: bytes in memory or a file read when written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contents {
    Bytes(Vec<u8>),
    Path(PathBuf),
}

/// One entry of the tree; paths are relative, without a leading `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir { mode: u32 },
    File { mode: u32, contents: Contents },
    Symlink { target: String },
    CharDev { mode: u32, major: u32, minor: u32 },
}

/// A file tree, kept sorted by path so it is written in the same order every time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tree {
    entries: BTreeMap<String, Node>,
}

impl Tree {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `node` at `path` (leading `/` optional), creating missing parent directories (0755).
    pub fn insert(&mut self, path: &str, node: Node) -> Result<(), InitramfsError> {
        let path = path.trim_start_matches('/');
        let bad = path.is_empty()
            || path
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..");
        if bad {
            return Err(InitramfsError::BadPath { path: path.into() });
        }
        let mut parent = String::new();
        let components: Vec<&str> = path.split('/').collect();
        for component in &components[..components.len() - 1] {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(component);
            self.entries
                .entry(parent.clone())
                .or_insert(Node::Dir { mode: 0o755 });
        }
        self.entries.insert(path.to_string(), node);
        Ok(())
    }

    pub fn entries(&self) -> impl Iterator<Item = (&str, &Node)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, path: &str) -> Option<&Node> {
        self.entries.get(path.trim_start_matches('/'))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Debian's static busybox: the binary, its package version and applet paths.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Busybox {
    pub path: PathBuf,
    pub version: String,
    /// Install paths of the applets, relative (`bin/sh`, `usr/bin/env`, …).
    pub applets: Vec<String>,
}

/// Finds busybox-static (installing it with apt when missing) and lists its applets.
pub fn busybox(logs: &Path, progress: &dyn Progress) -> Result<Busybox, InitramfsError> {
    deps::ensure(
        &[BUSYBOX_PACKAGE],
        "the guest userland",
        &logs.join("apt.log"),
        progress,
    )?;
    let path = PathBuf::from(BUSYBOX_PATH);
    if !elf::inspect_file(&path)?.is_static() {
        return Err(InitramfsError::BusyboxNotStatic { path });
    }
    let list = process::output(Command::new(&path).arg("--list-full"))?;
    Ok(Busybox {
        version: deps::installed_version(BUSYBOX_PACKAGE).unwrap_or_else(|| "unknown".into()),
        applets: applet_paths(&list),
        path,
    })
}

/// Applet install paths from `busybox --list-full`, minus those that would shadow our own
/// entries (`/init`, `/linuxrc`, the busybox binary itself).
fn applet_paths(list: &str) -> Vec<String> {
    let mut paths: Vec<String> = list
        .lines()
        .map(|l| l.trim().trim_start_matches('/'))
        .filter(|l| l.contains('/') && !l.contains(".."))
        .filter(|l| *l != "bin/busybox" && *l != "sbin/init")
        .map(String::from)
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// The guest root: `/init` (the agent), `/dev/console`, the mount points, a minimal `/etc`,
/// and busybox at `/bin/busybox` with a symlink per applet.
pub fn userland(agent: &Path, busybox: &Busybox) -> Result<Tree, InitramfsError> {
    let mut tree = Tree::new();
    for dir in [
        "bin", "dev", "etc", "mnt", "proc", "run", "sbin", "sys", "usr/bin", "usr/sbin",
    ] {
        tree.insert(dir, Node::Dir { mode: 0o755 })?;
    }
    tree.insert("root", Node::Dir { mode: 0o700 })?;
    tree.insert("tmp", Node::Dir { mode: 0o1777 })?;
    tree.insert(
        "dev/console",
        Node::CharDev {
            mode: 0o600,
            major: 5,
            minor: 1,
        },
    )?;
    tree.insert(
        "etc/passwd",
        Node::File {
            mode: 0o644,
            contents: Contents::Bytes(b"root:x:0:0:root:/root:/bin/sh\n".to_vec()),
        },
    )?;
    tree.insert(
        "etc/group",
        Node::File {
            mode: 0o644,
            contents: Contents::Bytes(b"root:x:0:\n".to_vec()),
        },
    )?;
    // Services of a sandbox are reached on `localhost`, as in a CI job's `services:`; the
    // image has no resolver beyond this file.
    tree.insert(
        "etc/hosts",
        Node::File {
            mode: 0o644,
            contents: Contents::Bytes(
                b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n".to_vec(),
            ),
        },
    )?;
    tree.insert(
        "init",
        Node::File {
            mode: 0o755,
            contents: Contents::Path(agent.to_path_buf()),
        },
    )?;
    tree.insert(
        "bin/busybox",
        Node::File {
            mode: 0o755,
            contents: Contents::Path(busybox.path.clone()),
        },
    )?;
    for applet in &busybox.applets {
        tree.insert(
            applet,
            Node::Symlink {
                target: "/bin/busybox".into(),
            },
        )?;
    }
    Ok(tree)
}

fn read_contents(path: &str, contents: &Contents) -> Result<Vec<u8>, InitramfsError> {
    match contents {
        Contents::Bytes(b) => Ok(b.clone()),
        Contents::Path(p) => fs::read(p).map_err(io_err(p, "reading (for the initramfs)")),
    }
    .and_then(|b| {
        if u32::try_from(b.len()).is_err() {
            Err(InitramfsError::TooLarge {
                path: path.into(),
                size: b.len() as u64,
            })
        } else {
            Ok(b)
        }
    })
}

/// Writes `tree` as a newc cpio archive: entries in path order, inode numbers by position,
/// uid/gid 0, mtime [`MTIME`]. The same tree and file contents always give the same bytes.
pub fn write_cpio<W: Write>(tree: &Tree, mut out: W) -> Result<W, InitramfsError> {
    use cpio::newc::{Builder, ModeFileType};
    let write_err = |source| InitramfsError::Io {
        path: PathBuf::from("<cpio output>"),
        what: "writing",
        source,
    };
    for (index, (path, node)) in tree.entries().enumerate() {
        let (file_type, mode, data, nlink, rdev) = match node {
            Node::Dir { mode } => (ModeFileType::Directory, *mode, Vec::new(), 2, (0, 0)),
            Node::File { mode, contents } => (
                ModeFileType::Regular,
                *mode,
                read_contents(path, contents)?,
                1,
                (0, 0),
            ),
            Node::Symlink { target } => (
                ModeFileType::Symlink,
                0o777,
                target.as_bytes().to_vec(),
                1,
                (0, 0),
            ),
            Node::CharDev { mode, major, minor } => {
                (ModeFileType::Char, *mode, Vec::new(), 1, (*major, *minor))
            }
        };
        let builder = Builder::new(path)
            .ino(index as u32 + 1)
            .mode(mode & 0o7777)
            .set_mode_file_type(file_type)
            .uid(0)
            .gid(0)
            .nlink(nlink)
            .mtime(MTIME)
            .rdev_major(rdev.0)
            .rdev_minor(rdev.1);
        let len = u32::try_from(data.len()).map_err(|_| InitramfsError::TooLarge {
            path: path.into(),
            size: data.len() as u64,
        })?;
        let mut writer = builder.write(out, len);
        writer.write_all(&data).map_err(write_err)?;
        out = writer.finish().map_err(write_err)?;
    }
    cpio::newc::trailer(out).map_err(write_err)
}

/// Compression of the written initramfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    Gzip,
}

/// Writes `tree` to `path` as a cpio (gzip-compressed with a fixed header when asked), via a
/// temporary file renamed into place.
pub fn write_cpio_file(
    tree: &Tree,
    path: &Path,
    compression: Compression,
) -> Result<(), InitramfsError> {
    let tmp = path.with_extension("tmp");
    let file = fs::File::create(&tmp).map_err(io_err(&tmp, "creating"))?;
    let buffered = io::BufWriter::new(file);
    let finish_err = |e: io::Error| InitramfsError::Io {
        path: tmp.clone(),
        what: "writing",
        source: e,
    };
    match compression {
        Compression::None => {
            let mut w = write_cpio(tree, buffered)?;
            w.flush().map_err(finish_err)?;
        }
        Compression::Gzip => {
            // GzBuilder writes mtime 0 and no file name unless told: deterministic.
            let gz = flate2::GzBuilder::new().write(buffered, flate2::Compression::best());
            let gz = write_cpio(tree, gz)?;
            gz.finish()
                .map_err(finish_err)?
                .flush()
                .map_err(finish_err)?;
        }
    }
    fs::rename(&tmp, path).map_err(io_err(path, "renaming into place"))
}

/// Writes `tree` into the directory `root` (created if missing) for the namespace backend:
/// directories, files (with their modes) and symlinks. Device nodes are skipped: creating them
/// needs privileges, and a namespace sandbox mounts its own `/dev`. Existing files are replaced.
pub fn write_dir(tree: &Tree, root: &Path) -> Result<(), InitramfsError> {
    fs::create_dir_all(root).map_err(io_err(root, "creating"))?;
    for (path, node) in tree.entries() {
        let dest = root.join(path);
        match node {
            Node::Dir { mode } => {
                fs::create_dir_all(&dest).map_err(io_err(&dest, "creating"))?;
                fs::set_permissions(&dest, fs::Permissions::from_mode(*mode))
                    .map_err(io_err(&dest, "setting permissions"))?;
            }
            Node::File { mode, contents } => {
                remove_existing(&dest)?;
                match contents {
                    Contents::Bytes(b) => fs::write(&dest, b).map_err(io_err(&dest, "writing"))?,
                    Contents::Path(p) => {
                        fs::copy(p, &dest).map_err(io_err(p, "copying"))?;
                    }
                }
                fs::set_permissions(&dest, fs::Permissions::from_mode(*mode))
                    .map_err(io_err(&dest, "setting permissions"))?;
            }
            Node::Symlink { target } => {
                remove_existing(&dest)?;
                std::os::unix::fs::symlink(target, &dest)
                    .map_err(io_err(&dest, "creating symlink"))?;
            }
            Node::CharDev { .. } => {}
        }
    }
    Ok(())
}

fn remove_existing(path: &Path) -> Result<(), InitramfsError> {
    match fs::symlink_metadata(path) {
        Ok(_) => fs::remove_file(path).map_err(io_err(path, "replacing")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(path, "inspecting")(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn temp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("crucible-image-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn fake_busybox(dir: &Path) -> Busybox {
        let path = dir.join("busybox");
        fs::write(&path, b"\x7fELF fake busybox").unwrap();
        Busybox {
            path,
            version: "1:1.35.0-test".into(),
            applets: applet_paths("bin/sh\nbin/ls\nusr/bin/env\nlinuxrc\nsbin/init\nbin/cat\n"),
        }
    }

    #[test]
    fn applet_list_skips_init_and_top_level_names() {
        assert_eq!(
            applet_paths("/bin/sh\nlinuxrc\nsbin/init\nusr/bin/env\nbin/busybox\nbin/sh\n"),
            vec!["bin/sh", "usr/bin/env"]
        );
    }

    #[test]
    fn userland_has_init_console_mountpoints_and_applet_links() {
        let dir = temp("userland");
        let agent = dir.join("agent");
        fs::write(&agent, b"agent").unwrap();
        let tree = userland(&agent, &fake_busybox(&dir)).unwrap();
        assert_eq!(
            tree.get("/init"),
            Some(&Node::File {
                mode: 0o755,
                contents: Contents::Path(agent)
            })
        );
        assert_eq!(
            tree.get("dev/console"),
            Some(&Node::CharDev {
                mode: 0o600,
                major: 5,
                minor: 1
            })
        );
        for dir in ["proc", "sys", "dev", "tmp", "run", "mnt"] {
            assert!(matches!(tree.get(dir), Some(Node::Dir { .. })), "{dir}");
        }
        assert_eq!(tree.get("tmp"), Some(&Node::Dir { mode: 0o1777 }));
        assert_eq!(
            tree.get("bin/sh"),
            Some(&Node::Symlink {
                target: "/bin/busybox".into()
            })
        );
        assert!(tree.get("linuxrc").is_none());
        assert!(tree.get("sbin/init").is_none());
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn initramfs_is_deterministic_same_inputs_same_sha256() {
        let dir = temp("determinism");
        let agent = dir.join("agent");
        fs::write(&agent, vec![7u8; 10_001]).unwrap();
        let busybox = fake_busybox(&dir);
        let build = |name: &str, compression| {
            let tree = userland(&agent, &busybox).unwrap();
            let path = dir.join(name);
            write_cpio_file(&tree, &path, compression).unwrap();
            hex::encode(Sha256::digest(fs::read(path).unwrap()))
        };
        let first = build("a.cpio", Compression::None);
        // Touch the inputs: mtimes must not leak into the archive.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        fs::write(&agent, vec![7u8; 10_001]).unwrap();
        assert_eq!(first, build("b.cpio", Compression::None));
        assert_eq!(
            build("a.cpio.gz", Compression::Gzip),
            build("b.cpio.gz", Compression::Gzip)
        );
        // A different input does change it.
        fs::write(&agent, vec![8u8; 10_001]).unwrap();
        assert_ne!(first, build("c.cpio", Compression::None));
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn cpio_lists_sorted_entries_with_fixed_metadata() {
        let dir = temp("cpio-read");
        let agent = dir.join("agent");
        fs::write(&agent, b"#!agent").unwrap();
        let tree = userland(&agent, &fake_busybox(&dir)).unwrap();
        let bytes = write_cpio(&tree, Vec::new()).unwrap();
        assert_eq!(bytes.len() % 4, 0);

        let mut reader = io::Cursor::new(bytes);
        let mut names = Vec::new();
        loop {
            let entry = cpio::NewcReader::new(reader).unwrap();
            if entry.entry().is_trailer() {
                break;
            }
            let e = entry.entry();
            assert_eq!((e.mtime(), e.uid(), e.gid()), (0, 0, 0), "{}", e.name());
            names.push(e.name().to_string());
            if e.name() == "dev/console" {
                assert_eq!(e.mode(), 0o020600);
                assert_eq!((e.rdev_major(), e.rdev_minor()), (5, 1));
            }
            if e.name() == "init" {
                assert_eq!(e.mode(), 0o100755);
                assert_eq!(e.file_size(), 7);
            }
            if e.name() == "bin/sh" {
                assert_eq!(e.mode(), 0o120777);
            }
            reader = entry.finish().unwrap();
        }
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert!(names.contains(&"init".to_string()));
        assert!(names.contains(&"usr/bin/env".to_string()));
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn write_dir_lays_out_the_same_tree_twice() {
        let dir = temp("write-dir");
        let agent = dir.join("agent");
        fs::write(&agent, b"agent").unwrap();
        let tree = userland(&agent, &fake_busybox(&dir)).unwrap();
        let root = dir.join("root");
        write_dir(&tree, &root).unwrap();
        write_dir(&tree, &root).unwrap();
        assert_eq!(fs::read(root.join("init")).unwrap(), b"agent");
        let mode = fs::metadata(root.join("init"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            fs::read_link(root.join("usr/bin/env")).unwrap(),
            PathBuf::from("/bin/busybox")
        );
        let tmp_mode = fs::metadata(root.join("tmp")).unwrap().permissions().mode();
        assert_eq!(tmp_mode & 0o7777, 0o1777);
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn bad_paths_are_rejected() {
        let mut tree = Tree::new();
        for bad in ["", "/", "a/../b", "a//b", "./x"] {
            assert!(
                tree.insert(bad, Node::Dir { mode: 0o755 }).is_err(),
                "{bad:?}"
            );
        }
    }
}
