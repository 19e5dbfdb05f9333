//! The mounts the supervisor makes for the sandbox with host privileges (host root, outside):
//! the image, the scratch disk and the extra mounts, each a detached mount idmapped through
//! the sandbox's user namespace (on-disk uid 0 is the sandbox's root, whichever host range it
//! got), handed to the sandbox over their socket in that order. The sandbox can attach them
//! but never make them: it has no privilege over host devices or directories.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::loop_device::{self, LoopError};
use crate::mount_api::{self, FsContext};
use crate::mount_api::{MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};
use crate::sys::{self, cstring, Socket, SysError};
use crate::{ExtraMount, MountKind, SandboxSpec};

/// Why a mount for the sandbox could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HostMountError {
    /// A system call failed; the message names the step and its input.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// An image could not be attached to a loop device.
    #[error(transparent)]
    Loop(#[from] LoopError),
    /// A `dir` mount's source is not a directory.
    #[error("{} is not a directory", path.display())]
    NotADirectory {
        /// The source.
        path: PathBuf,
    },
    /// Making the mount a flag asked for failed.
    #[error("{flag}")]
    For {
        /// The flag and its value (`--mount ext4:/srv/a.ext4:/data:rw`).
        flag: String,
        /// What failed.
        #[source]
        source: Box<HostMountError>,
    },
}

impl HostMountError {
    fn for_flag(flag: String) -> impl FnOnce(HostMountError) -> HostMountError {
        move |source| HostMountError::For {
            flag,
            source: Box::new(source),
        }
    }
}

/// Every mount the sandbox gets from its supervisor.
#[derive(Debug)]
pub(crate) struct SandboxMounts {
    /// The image, read-only: the overlay's lower layer.
    pub(crate) image: OwnedFd,
    /// The scratch disk, if the spec has one: holds every write instead of a tmpfs.
    pub(crate) scratch_disk: Option<OwnedFd>,
    /// The spec's extra mounts, in its order.
    pub(crate) extra: Vec<OwnedFd>,
}

impl SandboxMounts {
    /// Makes every mount of `spec`, idmapped through the user namespace `userns`.
    pub(crate) fn make(spec: &SandboxSpec, userns: BorrowedFd<'_>) -> Result<Self, HostMountError> {
        let image = image_tree(&spec.rootfs, userns)?;
        let scratch_disk = spec
            .scratch_disk
            .as_deref()
            .map(|disk| {
                ext4_image(disk, false, userns).map_err(HostMountError::for_flag(format!(
                    "--scratch-disk {}",
                    disk.display()
                )))
            })
            .transpose()?;
        let extra = spec
            .mounts
            .iter()
            .map(|mount| extra_mount(mount, userns))
            .collect::<Result<_, _>>()?;
        Ok(SandboxMounts {
            image,
            scratch_disk,
            extra,
        })
    }

    /// Sends every mount to the sandbox, in the order [`SandboxMounts::receive`] expects.
    pub(crate) fn send(&self, to_child: &Socket) -> Result<(), SysError> {
        let all = std::iter::once(&self.image)
            .chain(&self.scratch_disk)
            .chain(&self.extra);
        for (i, mnt) in all.enumerate() {
            to_child
                .send_fd(mnt)
                .map_err(|e| SysError::io(format!("hand mount {i} to the sandbox"), e))?;
        }
        Ok(())
    }

    /// The sandbox's side: receives the mounts of `spec` in order; `None` if the supervisor
    /// closed the socket first (it died).
    pub(crate) fn receive(
        spec: &SandboxSpec,
        from_parent: &Socket,
    ) -> Result<Option<Self>, SysError> {
        let receive = |what: &str| {
            from_parent
                .recv_fd()
                .map_err(|e| SysError::io(format!("receive {what} from the supervisor"), e))
        };
        let Some(image) = receive("the image mount")? else {
            return Ok(None);
        };
        let scratch_disk = match &spec.scratch_disk {
            None => None,
            Some(_) => match receive("the scratch disk's mount")? {
                Some(fd) => Some(fd),
                None => return Ok(None),
            },
        };
        let mut extra = Vec::with_capacity(spec.mounts.len());
        for mount in &spec.mounts {
            match receive(&format!("the mount of --mount {mount}"))? {
                Some(fd) => extra.push(fd),
                None => return Ok(None),
            }
        }
        Ok(Some(SandboxMounts {
            image,
            scratch_disk,
            extra,
        }))
    }
}

/// The image directory `dir`: a detached, read-only, idmapped clone of its mount. Not
/// `nosuid`: the image's setuid tools work inside, within the sandbox's capabilities.
pub(crate) fn image_tree(dir: &Path, userns: BorrowedFd<'_>) -> Result<OwnedFd, SysError> {
    let tree = mount_api::clone_tree(&cstring(dir)?, "the image")?;
    mount_api::set_attrs(
        tree.as_fd(),
        MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV,
        Some(userns),
    )
    .map_err(|e| {
        SysError::io(
            format!(
                "idmap the image {} (its filesystem must support idmapped mounts: ext4, xfs, \
                 btrfs, tmpfs on Linux 6.3+; not overlayfs or NFS)",
                dir.display()
            ),
            e,
        )
    })?;
    Ok(tree)
}

fn extra_mount(mount: &ExtraMount, userns: BorrowedFd<'_>) -> Result<OwnedFd, HostMountError> {
    match mount.kind {
        MountKind::Ext4Image => ext4_image(&mount.source, mount.read_only, userns),
        MountKind::HostDir => host_dir(&mount.source, userns),
    }
    .map_err(HostMountError::for_flag(format!("--mount {mount}")))
}

/// The ext4 filesystem in the file `image`, attached through a loop device that detaches
/// itself once this mount (and every copy of it) is gone: a detached `nosuid`, `nodev` mount
/// idmapped through `userns`; with `read_only`, the loop device, the filesystem and the mount
/// are all read-only.
pub(crate) fn ext4_image(
    image: &Path,
    read_only: bool,
    userns: BorrowedFd<'_>,
) -> Result<OwnedFd, HostMountError> {
    let device = loop_device::attach(image, read_only)?;
    let device_path = device.path();
    let what = format!("ext4 {} on {}", image.display(), device_path.display());
    let fs = FsContext::open(c"ext4", what.clone())?;
    fs.set_string(c"source", &cstring(&device_path)?)?;
    let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if read_only {
        fs.set_flag(c"ro")?;
        attrs |= MOUNT_ATTR_RDONLY;
    }
    let mnt = fs.mount(attrs)?;
    // The filesystem holds the device open now; ours would only keep it from detaching.
    drop(device);
    mount_api::set_attrs(mnt.as_fd(), MOUNT_ATTR_IDMAP, Some(userns))
        .map_err(|e| SysError::io(format!("idmap {what} into the sandbox's ids"), e))?;
    Ok(mnt)
}

/// The host directory `dir` (not the mounts below it): a detached read-only, `nosuid`,
/// `nodev` bind, idmapped through `userns` where its filesystem allows; where it does not,
/// bound without idmapping (files keep host owners, shown as `nobody` inside), and said so on
/// stderr.
pub(crate) fn host_dir(dir: &Path, userns: BorrowedFd<'_>) -> Result<OwnedFd, HostMountError> {
    let what = format!("the host directory {}", dir.display());
    let tree = mount_api::clone_tree(&cstring(dir)?, &what)?;
    let meta = sys::fstat(&tree, || format!("stat {what}"))?;
    if meta.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(HostMountError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    let attrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    match mount_api::set_attrs(tree.as_fd(), attrs | MOUNT_ATTR_IDMAP, Some(userns)) {
        Ok(()) => {}
        // The filesystem cannot be idmapped (overlayfs, NFS, …); nothing was changed.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            mount_api::set_attrs(tree.as_fd(), attrs, None)
                .map_err(|e| SysError::io(format!("make {what} read-only"), e))?;
            eprintln!(
                "guest-init: {} cannot be idmapped (its filesystem does not support it); \
                 mounted read-only with host ownership, which shows as nobody inside",
                dir.display()
            );
        }
        Err(e) => {
            return Err(SysError::io(format!("idmap {what} into the sandbox's ids"), e).into())
        }
    }
    Ok(tree)
}
