//! The sandbox's user namespace: which host ids its ids map to, and the image mounted so that
//! its files keep their owners inside.
//!
//! The parent (host root, outside) writes the child's `uid_map`/`gid_map` — a process cannot
//! map ids other than its own from inside — then clones the image directory into a detached
//! mount, idmaps it through the child's user namespace (on-disk uid 0 appears as the
//! sandbox's root, and so on) and passes it over a socket. Nothing is copied or chowned: one
//! image on disk serves every sandbox, each in its own id range.

use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};
use std::str::FromStr;

use crate::sys::{self, check, cstring, Socket, SysError};
use crate::{EnterError, SandboxSpec};

/// How many ids a sandbox gets: 0–65535, what images and package managers expect.
pub const SANDBOX_IDS: u32 = 65_536;

/// Sandbox ids `0..count` are host ids `host_base..host_base + count`, for users and groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    /// The host id of the sandbox's root. Never 0.
    pub host_base: u32,
    /// How many ids are mapped.
    pub count: u32,
}

impl Default for IdMap {
    fn default() -> Self {
        IdMap {
            host_base: 0,
            count: SANDBOX_IDS,
        }
    }
}

impl IdMap {
    /// A map of `count` ids from `host_base`; refuses host root and ranges past the last
    /// valid id (`u32::MAX` is the kernel's "no id").
    pub fn new(host_base: u32, count: u32) -> Result<Self, String> {
        if host_base == 0 {
            return Err("the host base must not be 0: sandbox root is never host root".into());
        }
        if count == 0 {
            return Err("the map must hold at least one id".into());
        }
        if u64::from(host_base) + u64::from(count) > u64::from(u32::MAX) {
            return Err(format!(
                "{count} ids from {host_base} run past the last host id {}",
                u32::MAX - 1
            ));
        }
        Ok(IdMap { host_base, count })
    }

    /// The `/proc/PID/uid_map` line.
    fn map_line(&self) -> String {
        format!("0 {} {}\n", self.host_base, self.count)
    }
}

impl fmt::Display for IdMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host_base, self.count)
    }
}

impl FromStr for IdMap {
    type Err = String;

    /// `HOST_BASE:COUNT`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (base, count) = s
            .split_once(':')
            .ok_or_else(|| "must be HOST_BASE:COUNT".to_string())?;
        let number = |t: &str| t.parse::<u32>().map_err(|_| format!("{t:?} is not an id"));
        IdMap::new(number(base)?, number(count)?)
    }
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// The parent's side: maps the child's ids, then sends it the idmapped image.
pub(crate) fn prepare_child(
    child: libc::pid_t,
    spec: &SandboxSpec,
    to_child: &Socket,
) -> Result<(), EnterError> {
    let line = spec.id_map.map_line();
    for file in ["uid_map", "gid_map"] {
        let path = format!("/proc/{child}/{file}");
        std::fs::write(&path, &line)
            .map_err(|e| SysError::io(format!("write {:?} to {path}", line.trim_end()), e))?;
    }
    let userns = sys::open_file(
        std::path::Path::new(&format!("/proc/{child}/ns/user")),
        libc::O_RDONLY,
    )?;
    let image = idmapped_tree(&spec.rootfs, &userns)?;
    to_child
        .send_fd(&image)
        .map_err(|e| SysError::io("hand the image mount to the sandbox", e))?;
    Ok(())
}

/// A detached, read-only clone of the mount at `dir`, idmapped through `userns`.
fn idmapped_tree(dir: &std::path::Path, userns: &OwnedFd) -> Result<OwnedFd, SysError> {
    let path = cstring(dir)?;
    // SAFETY: open_tree reads the NUL-terminated path and returns a new descriptor or -1.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    let tree = sys::owned_fd(tree, || {
        format!("open_tree({}) for the image", dir.display())
    })?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: the empty path is NUL-terminated and `attr` is a valid mount_attr whose size is
    // passed; the kernel only reads both.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(ret as libc::c_int, || {
        format!(
            "idmap the image {} (its filesystem must support idmapped mounts: ext4, xfs, \
             btrfs, tmpfs on Linux 6.3+; not overlayfs or NFS)",
            dir.display()
        )
    })?;
    Ok(tree)
}

/// The child's side: waits until its ids are mapped and receives the image mount.
pub(crate) fn await_parent(from_parent: &Socket) -> Result<OwnedFd, EnterError> {
    match from_parent.recv_fd() {
        Ok(Some(fd)) => Ok(fd),
        Ok(None) => Err(EnterError::Orphaned),
        Err(e) => Err(SysError::io("receive the image mount from the supervisor", e).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_refuse_host_root_and_overflow() {
        assert!(IdMap::new(0, 65_536).is_err());
        assert!(IdMap::new(1, 0).is_err());
        // The last id a map may use is u32::MAX - 1.
        assert!(IdMap::new(u32::MAX - 65_535, 65_536).is_err());
        let last = IdMap::new(u32::MAX - 65_536, 65_536).expect("fits");
        assert_eq!(last.to_string().parse::<IdMap>(), Ok(last));
        assert_eq!(
            IdMap::new(100_000, 65_536).expect("map").map_line(),
            "0 100000 65536\n"
        );
        assert!("100000".parse::<IdMap>().is_err());
        assert!("x:1".parse::<IdMap>().is_err());
    }
}
