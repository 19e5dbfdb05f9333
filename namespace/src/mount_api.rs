//! Checked wrappers over the kernel's descriptor-based mount API (`fsopen`, `fsconfig`,
//! `fsmount`, `open_tree`, `mount_setattr`, `move_mount`): mounts made without a path, changed
//! while detached, and attached by descriptor, so that no step resolves a path twice.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::sys::{check, owned_fd, SysError};

pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x4;
pub(crate) const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub(crate) const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A filesystem being configured (an `fsopen` context).
#[derive(Debug)]
pub(crate) struct FsContext {
    fd: OwnedFd,
    /// The filesystem and what it is for, for error messages (`ext4 for /img/data.ext4`).
    what: String,
}

impl FsContext {
    /// Starts configuring a new filesystem of type `fstype`.
    pub(crate) fn open(fstype: &CStr, what: impl Into<String>) -> Result<Self, SysError> {
        const FSOPEN_CLOEXEC: libc::c_uint = 1;
        let what = what.into();
        // SAFETY: fsopen reads the NUL-terminated filesystem name.
        let fd = unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) };
        let fd = owned_fd(fd, || format!("fsopen({fstype:?}) for {what}"))?;
        Ok(FsContext { fd, what })
    }

    /// Sets the option `key` to `value`.
    pub(crate) fn set_string(&self, key: &CStr, value: &CStr) -> Result<(), SysError> {
        const FSCONFIG_SET_STRING: libc::c_uint = 1;
        // SAFETY: fsconfig reads the NUL-terminated key and value.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.fd.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        };
        check(ret as libc::c_int, || {
            format!("set {key:?} to {value:?} on {}", self.what)
        })
    }

    /// Sets the flag option `key` (such as `ro`).
    pub(crate) fn set_flag(&self, key: &CStr) -> Result<(), SysError> {
        const FSCONFIG_SET_FLAG: libc::c_uint = 0;
        // SAFETY: fsconfig reads the NUL-terminated key; a flag takes no value.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.fd.as_raw_fd(),
                FSCONFIG_SET_FLAG,
                key.as_ptr(),
                std::ptr::null::<libc::c_void>(),
                0,
            )
        };
        check(ret as libc::c_int, || {
            format!("set {key:?} on {}", self.what)
        })
    }

    /// Creates the filesystem and returns a detached mount of it with `attrs`
    /// (`MOUNT_ATTR_*`).
    pub(crate) fn mount(self, attrs: u64) -> Result<OwnedFd, SysError> {
        const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
        const FSMOUNT_CLOEXEC: libc::c_uint = 1;
        // SAFETY: FSCONFIG_CMD_CREATE takes no key or value.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.fd.as_raw_fd(),
                FSCONFIG_CMD_CREATE,
                std::ptr::null::<libc::c_char>(),
                std::ptr::null::<libc::c_void>(),
                0,
            )
        };
        check(ret as libc::c_int, || format!("create {}", self.what))?;
        // SAFETY: fsmount takes a descriptor and integers.
        let mnt = unsafe {
            libc::syscall(
                libc::SYS_fsmount,
                self.fd.as_raw_fd(),
                FSMOUNT_CLOEXEC,
                attrs as libc::c_uint,
            )
        };
        owned_fd(mnt, || format!("fsmount {}", self.what))
    }
}

/// A detached copy of the mount at `path` (not of the mounts below it).
pub(crate) fn clone_tree(path: &CStr, what: &str) -> Result<OwnedFd, SysError> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    // SAFETY: open_tree reads the NUL-terminated path and returns a new descriptor or -1.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    owned_fd(tree, || format!("open_tree({path:?}) for {what}"))
}

/// A detached copy of the mount tree at the open path `at` (an `O_PATH` descriptor), the
/// mounts below it included, as `mount --rbind` would make it.
pub(crate) fn clone_tree_below(at: BorrowedFd<'_>, what: &str) -> Result<OwnedFd, SysError> {
    let flags = libc::OPEN_TREE_CLONE
        | libc::OPEN_TREE_CLOEXEC
        | libc::AT_EMPTY_PATH as libc::c_uint
        | libc::AT_RECURSIVE as libc::c_uint;
    // SAFETY: open_tree reads the empty NUL-terminated path relative to our descriptor and
    // returns a new descriptor or -1.
    let tree = unsafe { libc::syscall(libc::SYS_open_tree, at.as_raw_fd(), c"".as_ptr(), flags) };
    owned_fd(tree, || format!("open_tree for {what}"))
}

/// Sets `attrs` (`MOUNT_ATTR_*`) on the mount `mnt`; `userns` is the user namespace of
/// `MOUNT_ATTR_IDMAP`. The error is the bare OS error, for callers that react to it.
pub(crate) fn set_attrs(
    mnt: BorrowedFd<'_>,
    attrs: u64,
    userns: Option<BorrowedFd<'_>>,
) -> std::io::Result<()> {
    mount_setattr(mnt, 0, attrs, 0, userns)
}

/// Sets `attrs` and the propagation `propagation` (`MS_PRIVATE`, `MS_SLAVE`, …) on the mount
/// tree `mnt` and every mount below it; `userns` as for [`set_attrs`]. The error is the bare
/// OS error.
pub(crate) fn set_tree_attrs(
    mnt: BorrowedFd<'_>,
    attrs: u64,
    propagation: u64,
    userns: Option<BorrowedFd<'_>>,
) -> std::io::Result<()> {
    mount_setattr(mnt, libc::AT_RECURSIVE, attrs, propagation, userns)
}

fn mount_setattr(
    mnt: BorrowedFd<'_>,
    flags: libc::c_int,
    attrs: u64,
    propagation: u64,
    userns: Option<BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation,
        userns_fd: userns.map_or(0, |fd| fd.as_raw_fd() as u64),
    };
    // SAFETY: the empty path is NUL-terminated and `attr` is a valid mount_attr whose size is
    // passed; the kernel only reads both.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mnt.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// Attaches the detached mount `mnt` on the directory `target` (a descriptor).
pub(crate) fn attach(mnt: &OwnedFd, target: BorrowedFd<'_>, what: &str) -> Result<(), SysError> {
    // SAFETY: both paths are the empty NUL-terminated string; the descriptors are ours.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    check(ret as libc::c_int, || format!("attach {what}"))
}

/// Attaches the detached mount `mnt` on `target`, relative to the working directory.
pub(crate) fn attach_at(mnt: &OwnedFd, target: &CStr, what: &str) -> Result<(), SysError> {
    // SAFETY: both paths are NUL-terminated strings alive for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(ret as libc::c_int, || {
        format!("attach {what} on {target:?}")
    })
}
