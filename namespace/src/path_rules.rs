//! A container's masked and read-only paths (OCI's `maskedPaths` and `readonlyPaths`), put
//! in place on its root before the pivot. The root's image is the tenant's: each path is
//! opened within the root ([`mounts::open_in_root`]), so that no symlink of the image takes a
//! mount outside it, and the mount goes on the descriptor, never on a path looked up again.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use contract::container_security::ContainerSecurity;

use crate::mount_api::{
    self, FsContext, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};
use crate::mounts;
use crate::sys::{self, SysError};

/// Makes `security`'s read-only paths read-only, then hides its masked paths (runc's order:
/// a path both masked and read-only ends up masked), under `root` (its `/dev` already made).
/// A path missing from the root is left alone, as runc leaves it.
pub(crate) fn apply(root: &Path, security: &ContainerSecurity) -> Result<(), SysError> {
    if security.read_only_paths.is_empty() && security.masked_paths.is_empty() {
        return Ok(());
    }
    let root_dir = sys::open_file(root, libc::O_PATH | libc::O_DIRECTORY)?;
    for path in &security.read_only_paths {
        if let Some(target) = mounts::open_in_root(&root_dir, path)? {
            make_read_only(&target, path)?;
        }
    }
    for path in &security.masked_paths {
        if let Some(target) = mounts::open_in_root(&root_dir, path)? {
            mask(&root_dir, &target, path)?;
        }
    }
    Ok(())
}

/// Binds `target` on itself, the mounts below it included, and makes the new top mount
/// read-only (as runc's `MS_BIND|MS_REC` then `MS_RDONLY` remount does).
fn make_read_only(target: &OwnedFd, path: &str) -> Result<(), SysError> {
    let what = format!("read-only path {path}");
    let tree = mount_api::clone_tree_below(target.as_fd(), &what)?;
    mount_api::set_attrs(tree.as_fd(), MOUNT_ATTR_RDONLY, None)
        .map_err(|e| SysError::io(format!("make {what} read-only"), e))?;
    mount_api::attach(&tree, target.as_fd(), &what)
}

/// Covers `target`: a directory with an empty read-only tmpfs, anything else with the
/// container's `/dev/null`.
fn mask(root: &OwnedFd, target: &OwnedFd, path: &str) -> Result<(), SysError> {
    let what = format!("masked path {path}");
    let stat = sys::fstat(target, || format!("stat {what}"))?;
    let cover = if stat.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let fs = FsContext::open(c"tmpfs", what.clone())?;
        fs.set_string(c"size", c"4k")?;
        fs.set_string(c"mode", c"0555")?;
        fs.mount(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)?
    } else {
        let null = mounts::open_in_root(root, "/dev/null")?.ok_or_else(|| {
            SysError::io(
                format!("find /dev/null for {what}"),
                std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        })?;
        mount_api::clone_tree_below(null.as_fd(), &what)?
    };
    mount_api::attach(&cover, target.as_fd(), &what)
}
