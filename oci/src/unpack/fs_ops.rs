//! File-descriptor primitives for writing inside a root that may hold hostile symlinks.
//!
//! Every path below the root is resolved by the kernel with `RESOLVE_IN_ROOT` (a symlink to
//! `/etc` or `../../etc` stays inside the root) and every final component is handled with calls
//! that never follow it (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`, `unlinkat`).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags, CWD};
use rustix::io::Errno;

/// How often an in-root resolution is retried when the kernel reports a concurrent rename
/// somewhere on the system (`openat2` answers `EAGAIN` rather than risk a wrong `..`).
const RESOLVE_RETRIES: usize = 64;

/// Opens the directory the tree is written into (a path our own caller chose).
pub(super) fn open_root(root: &Path) -> io::Result<OwnedFd> {
    Ok(rfs::openat(
        CWD,
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// `openat2(root, path, flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: `path` (relative,
/// no NUL) is resolved as if `root` were `/`, symlinks included.
pub(super) fn open_in_root(
    root: BorrowedFd<'_>,
    path: &[u8],
    flags: OFlags,
) -> io::Result<OwnedFd> {
    let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
    let mut attempts = 0;
    loop {
        match rfs::openat2(root, path, flags | OFlags::CLOEXEC, Mode::empty(), resolve) {
            Err(Errno::AGAIN) if attempts < RESOLVE_RETRIES => attempts += 1,
            result => return Ok(result?),
        }
    }
}

/// Opens the directory at `path` below `root` (resolved in root), for use as a dirfd.
pub(super) fn open_dir_in_root(root: BorrowedFd<'_>, path: &[u8]) -> io::Result<OwnedFd> {
    open_in_root(root, path, OFlags::RDONLY | OFlags::DIRECTORY)
}

/// Opens the directory `name` inside `dir`, refusing to follow a symlink there.
pub(super) fn open_child_dir(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    Ok(rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The type of `name` inside `dir` without following it, or `None` if nothing is there.
pub(super) fn entry_type(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<rfs::Stat>> {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(stat)),
        Err(Errno::NOENT) => Ok(None),
        Err(errno) => Err(errno.into()),
    }
}

pub(super) fn is_dir(stat: &rfs::Stat) -> bool {
    FileType::from_raw_mode(stat.st_mode) == FileType::Directory
}

/// Removes `name` from `dir` whatever it is (a directory with everything below it), never
/// following a symlink. Returns whether something was there.
pub(super) fn remove_entry(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
    let Some(stat) = entry_type(dir, name)? else {
        return Ok(false);
    };
    if is_dir(&stat) {
        let child = open_child_dir(dir, name)?;
        remove_children(child.as_fd())?;
        rfs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    } else {
        rfs::unlinkat(dir, name, AtFlags::empty())?;
    }
    Ok(true)
}

/// One directory on the way down while a tree is removed.
struct Ancestor {
    /// Identity of this directory, checked when we climb back into it through `..`.
    dev: u64,
    ino: u64,
    /// The name (in this directory) of the child being emptied below.
    child: CString,
    /// Subdirectories of this directory still to be removed.
    pending: Vec<CString>,
}

/// Empties the directory `top` (keeps `top` itself). Depth-first with two descriptors open at
/// a time: a tree may be deeper than the process's descriptor limit, so the walk climbs back
/// through `..` and checks it reached the directory it came from.
pub(super) fn remove_children(top: BorrowedFd<'_>) -> io::Result<()> {
    let mut current = rfs::openat(
        top,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut pending = unlink_non_directories(current.as_fd())?;
    let mut ancestors: Vec<Ancestor> = Vec::new();
    loop {
        if let Some(child) = pending.pop() {
            let child_fd = open_child_dir(current.as_fd(), &child)?;
            let here = rfs::fstat(&current)?;
            ancestors.push(Ancestor {
                dev: here.st_dev,
                ino: here.st_ino,
                child,
                pending,
            });
            current = child_fd;
            pending = unlink_non_directories(current.as_fd())?;
            continue;
        }
        let Some(ancestor) = ancestors.pop() else {
            return Ok(());
        };
        let parent = rfs::openat(
            &current,
            c"..",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let reached = rfs::fstat(&parent)?;
        if (reached.st_dev, reached.st_ino) != (ancestor.dev, ancestor.ino) {
            return Err(io::Error::other(
                "a directory moved while its tree was being removed",
            ));
        }
        rfs::unlinkat(&parent, &ancestor.child, AtFlags::REMOVEDIR)?;
        current = parent;
        pending = ancestor.pending;
    }
}

/// Unlinks every entry of `dir` that is not a directory; returns the subdirectories' names.
fn unlink_non_directories(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    // Listed in full before anything is unlinked: removing entries during a `getdents` walk
    // may make it skip some.
    let mut listing = Vec::new();
    let mut reader = rfs::Dir::read_from(dir)?;
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        listing.push((name.to_owned(), entry.file_type()));
    }
    let mut subdirectories = Vec::new();
    for (name, listed_type) in listing {
        let file_type = match listed_type {
            FileType::Unknown => match entry_type(dir, &name)? {
                Some(stat) => FileType::from_raw_mode(stat.st_mode),
                None => continue,
            },
            known => known,
        };
        if file_type == FileType::Directory {
            subdirectories.push(name);
        } else {
            rfs::unlinkat(dir, &name, AtFlags::empty())?;
        }
    }
    Ok(subdirectories)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    #[test]
    fn remove_children_keeps_the_directory_and_never_follows_symlinks() {
        let temp = tempfile::tempdir().expect("tempdir");
        let top = temp.path().join("top");
        let outside = temp.path().join("outside");
        fs::create_dir_all(top.join("a/b/c")).expect("mkdir");
        fs::create_dir_all(&outside).expect("mkdir");
        fs::write(outside.join("keep"), b"x").expect("write");
        fs::write(top.join("a/b/c/f"), b"x").expect("write");
        fs::write(top.join("a/f"), b"x").expect("write");
        symlink(&outside, top.join("a/b/link-to-outside")).expect("symlink");
        symlink(&outside, top.join("link-to-outside")).expect("symlink");

        let top_fd = open_root(&top).expect("open");
        remove_children(top_fd.as_fd()).expect("remove");

        assert_eq!(fs::read_dir(&top).expect("read_dir").count(), 0);
        assert_eq!(fs::read(outside.join("keep")).expect("outside file"), b"x");
    }

    #[test]
    fn remove_entry_removes_a_tree_deeper_than_the_descriptor_limit() {
        let temp = tempfile::tempdir().expect("tempdir");
        let top = open_root(temp.path()).expect("open");
        // 1500 levels: more descriptors than the usual soft limit of 1024 if each were kept.
        let mut dir = rfs::openat(
            &top,
            c".",
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .expect("dup");
        for _ in 0..1500 {
            rfs::mkdirat(&dir, c"d", Mode::from_raw_mode(0o755)).expect("mkdir");
            rfs::openat(
                &dir,
                c"f",
                OFlags::CREATE | OFlags::WRONLY,
                Mode::from_raw_mode(0o644),
            )
            .expect("file");
            dir = open_child_dir(dir.as_fd(), c"d").expect("open");
        }
        drop(dir);
        assert!(remove_entry(top.as_fd(), c"d").expect("remove"));
        assert!(entry_type(top.as_fd(), c"d").expect("stat").is_none());
        assert!(!remove_entry(top.as_fd(), c"d").expect("second remove"));
    }
}
