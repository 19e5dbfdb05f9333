//! The sandbox's user namespace: which host ids its ids map to, and the image mounted so that
//! its files keep their owners inside.
//!
//! The parent (host root, outside) writes the child's `uid_map`/`gid_map` — a process cannot
//! map ids other than its own from inside — then makes the image and every other mount the
//! sandbox gets as detached mounts idmapped through the child's user namespace (on-disk uid 0
//! appears as the sandbox's root, and so on; see [`crate::host_mounts`]) and passes them over
//! a socket. Nothing is copied or chowned: one image on disk serves every sandbox, each in its
//! own id range.

use std::fmt;
use std::os::fd::AsFd;
use std::str::FromStr;

use crate::host_mounts::SandboxMounts;
use crate::sys::{self, Socket, SysError};
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

/// The parent's side: maps the child's ids, then makes every mount of `spec` idmapped through
/// the child's user namespace and sends them to it.
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
    SandboxMounts::make(spec, userns.as_fd())?.send(to_child)?;
    Ok(())
}

/// The child's side: waits until its ids are mapped and receives its mounts.
pub(crate) fn await_parent(
    spec: &SandboxSpec,
    from_parent: &Socket,
) -> Result<SandboxMounts, EnterError> {
    SandboxMounts::receive(spec, from_parent)?.ok_or(EnterError::Orphaned)
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
