//! A container's writable files: files of its root that are each a mount of their own, so
//! that they stay writable when the root is read-only, as kubelet's `/etc/hosts`,
//! `/etc/hostname` and `/etc/resolv.conf` bind mounts are under runc. Each holds the image's
//! file (or nothing, when the image has none) on a small tmpfs of the container's, put in
//! place on the root before the pivot.
//!
//! The image is the tenant's: each file is opened within the root ([`mounts::open_in_root`]),
//! non-blocking and checked to be a regular file on that descriptor (a FIFO planted in a
//! shared directory must not hang the container's creation), and the mount goes on it.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use crate::mount_api::{self, FsContext, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID};
use crate::mounts;
use crate::sys::{self, cstring, owned_fd, SysError};

/// The most the files of one container may hold together, in bytes (the tmpfs's size):
/// kubelet's are a few hundred bytes each.
pub(crate) const TOTAL_BYTES: u64 = 1 << 20;

/// Puts each of `files` (absolute paths as the container sees them) in place under `root`,
/// while the root is still writable (a missing file is made, empty, with its directories).
pub(crate) fn mount(root: &Path, files: &[String]) -> Result<(), SysError> {
    if files.is_empty() {
        return Ok(());
    }
    let root_dir = sys::open_file(root, libc::O_PATH | libc::O_DIRECTORY)?;
    let store = FsContext::open(c"tmpfs", "the container's writable files")?;
    // Room for TOTAL_BYTES of files, each rounded up to whole pages.
    store.set_string(c"size", c"2m")?;
    store.set_string(c"mode", c"0755")?;
    let store = store.mount(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)?;
    let mut left = TOTAL_BYTES;
    for (index, path) in files.iter().enumerate() {
        let what = format!("writable file {path}");
        let original = match open_regular(&root_dir, path, &what)? {
            Some(file) => file,
            None => {
                create_empty(&root_dir, path, &what)?;
                open_regular(&root_dir, path, &what)?.ok_or_else(|| {
                    SysError::io(
                        format!("open {what} just made"),
                        std::io::Error::from(std::io::ErrorKind::NotFound),
                    )
                })?
            }
        };
        let copy = copy_to_store(&store, index, &original, &mut left, &what)?;
        let tree = mount_api::clone_tree_below(copy.as_fd(), &what)?;
        mount_api::attach(&tree, original.as_fd(), &what)?;
    }
    Ok(())
}

/// `path` under the root, opened for reading without blocking; `None` when it is missing,
/// an error when it is not a regular file.
fn open_regular(root: &OwnedFd, path: &str, what: &str) -> Result<Option<File>, SysError> {
    let Some(fd) = mounts::open_in_root_with(root, path, libc::O_RDONLY | libc::O_NONBLOCK)? else {
        return Ok(None);
    };
    let stat = sys::fstat(&fd, || format!("stat {what}"))?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(SysError::io(
            format!("{what}: the container's root has something else than a regular file there"),
            std::io::Error::from(std::io::ErrorKind::InvalidInput),
        ));
    }
    Ok(Some(File::from(fd)))
}

/// Makes `path` an empty file of mode 0644, its missing directories too (none of them may be
/// a symlink: they are made where the image's links cannot lead).
fn create_empty(root: &OwnedFd, path: &str, what: &str) -> Result<(), SysError> {
    let path = Path::new(path);
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(SysError::io(
            format!("{what}: no file name"),
            std::io::Error::from(std::io::ErrorKind::InvalidInput),
        ));
    };
    let dir = match parent == Path::new("/") {
        true => None,
        false => Some(mounts::mount_point(root, parent, what)?),
    };
    let name = cstring(Path::new(name))?;
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: openat reads the NUL-terminated name relative to our descriptor.
    let fd = unsafe {
        libc::openat(
            dir.as_ref().unwrap_or(root).as_raw_fd(),
            name.as_ptr(),
            flags,
            0o644 as libc::c_uint,
        )
    };
    owned_fd(fd.into(), || format!("create {what}")).map(drop)
}

/// Copies `original` into file `index` of the store, with its mode, taking its size from
/// `left`; the copy, opened `O_PATH` for its mount.
fn copy_to_store(
    store: &OwnedFd,
    index: usize,
    original: &File,
    left: &mut u64,
    what: &str,
) -> Result<OwnedFd, SysError> {
    let name = cstring(Path::new(&index.to_string()))?;
    let meta = original
        .metadata()
        .map_err(|e| SysError::io(format!("stat {what}"), e))?;
    let too_large = || {
        SysError::io(
            format!("{what}: the writable files hold more than {TOTAL_BYTES} bytes together"),
            std::io::Error::from(std::io::ErrorKind::FileTooLarge),
        )
    };
    // Said before the tmpfs fills up; the copy below is bounded too, as the file may grow.
    if meta.len() > *left {
        return Err(too_large());
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC;
    // SAFETY: openat reads the NUL-terminated name relative to our descriptor.
    let fd = unsafe { libc::openat(store.as_raw_fd(), name.as_ptr(), flags, mode) };
    let fd = owned_fd(fd.into(), || format!("create the copy of {what}"))?;
    let mut copy = File::from(fd);
    // One byte more than is left tells a file too large from one that just fits.
    let mut limited = original.take(*left + 1);
    let copied = std::io::copy(&mut limited, &mut copy)
        .map_err(|e| SysError::io(format!("copy {what}"), e))?;
    if copied > *left {
        return Err(too_large());
    }
    *left -= copied;
    copy.flush()
        .map_err(|e| SysError::io(format!("copy {what}"), e))?;
    // The umask took bits off the mode: set it exactly.
    copy.set_permissions(meta.permissions())
        .map_err(|e| SysError::io(format!("chmod the copy of {what}"), e))?;
    // SAFETY: openat reads the NUL-terminated name relative to our descriptor.
    let fd = unsafe {
        libc::openat(
            store.as_raw_fd(),
            name.as_ptr(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    owned_fd(fd.into(), || format!("open the copy of {what}"))
}
