//! The microVM's root and disks, as the kernel command line describes them
//! (`contract::cmdline`): the image (the initramfs, or an ext4 disk with `crucible.root=`, by
//! path or by serial)
//! read-only under an overlay whose writes go to memory, or to the scratch disk with
//! `crucible.scratch=` (and `/tmp` with them); then each `crucible.mount=` disk at its target.
//! Disks are found by their virtio-blk serial ([`contract::disk`]), never by `vdX` order.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;

use contract::cmdline::BootConfig;

use crate::mount::{mount, unmount_detached, MountError};
use crate::sys;

/// Why the root or a disk could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    /// A mount failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// Another system call failed.
    #[error("{0}")]
    Sys(String, #[source] io::Error),
    /// The command line names a disk that is not attached.
    #[error("no disk has the serial {0:?}")]
    NoDisk(String),
}

/// Where the new root is built.
const BASE: &str = "/.crucible";

/// Sets up the root and mounts the disks `cfg` names. Nothing happens without `root`,
/// `scratch` or `mounts`: the initramfs stays the root, writable in memory.
pub fn prepare(cfg: &BootConfig) -> Result<(), RootError> {
    let root_by_serial = cfg.root.as_deref().filter(|root| !root.starts_with('/'));
    let disks = if root_by_serial.is_some() || cfg.scratch.is_some() || !cfg.mounts.is_empty() {
        disks_by_serial(Path::new("/sys/block"))
    } else {
        BTreeMap::new()
    };
    let device = |serial: &str| {
        disks
            .get(serial)
            .cloned()
            .ok_or_else(|| RootError::NoDisk(serial.to_string()))
    };
    let root = match (root_by_serial, &cfg.root) {
        (Some(serial), _) => Some(device(serial)?),
        (None, root) => root.clone(),
    };
    let scratch = cfg.scratch.as_deref().map(device).transpose()?;
    if root.is_some() || scratch.is_some() {
        switch_root(root.as_deref(), scratch.as_deref())?;
    }
    for disk in &cfg.mounts {
        let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
        if disk.read_only {
            flags |= libc::MS_RDONLY;
        }
        mount(&device(&disk.serial)?, &disk.target, "ext4", flags, None)?;
    }
    Ok(())
}

/// The virtio-blk disks under `sys_block` (`/sys/block`) by serial, as `/dev/vdX` paths.
/// Reading a `serial` attribute asks the device (`GET_ID`); a serial two disks share names
/// neither, so a mix-up cannot pick the wrong one.
pub fn disks_by_serial(sys_block: &Path) -> BTreeMap<String, String> {
    let mut found: BTreeMap<String, Option<String>> = BTreeMap::new();
    let Ok(entries) = fs::read_dir(sys_block) else {
        return BTreeMap::new();
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with("vd")) else {
            continue;
        };
        let Ok(serial) = fs::read_to_string(entry.path().join("serial")) else {
            continue;
        };
        let serial = serial.trim_end_matches(['\n', '\0']).to_string();
        if serial.is_empty() {
            continue;
        }
        let device = format!("/dev/{name}");
        found
            .entry(serial)
            .and_modify(|d| *d = None)
            .or_insert(Some(device));
    }
    found
        .into_iter()
        .filter_map(|(serial, device)| Some((serial, device?)))
        .collect()
}

/// Builds the new root under [`BASE`] and switches to it: `lower` (an ext4 device, mounted
/// read-only; else the initramfs itself, bound there) under an overlay whose upper layer is
/// on `scratch` (an ext4 device; else a tmpfs). With a scratch disk `/tmp` is a directory on
/// it too, so that every byte a command writes lands on the disk rather than in memory.
fn switch_root(lower: Option<&str>, scratch: Option<&str>) -> Result<(), RootError> {
    let (lower_dir, rw, root) = (
        format!("{BASE}/lower"),
        format!("{BASE}/rw"),
        format!("{BASE}/root"),
    );
    match lower {
        Some(device) => mount(device, &lower_dir, "ext4", libc::MS_RDONLY, None)?,
        // Not recursive: the API filesystems mounted on the initramfs stay out of the layer.
        None => mount("/", &lower_dir, "", libc::MS_BIND, None)?,
    }
    match scratch {
        Some(device) => mount(device, &rw, "ext4", libc::MS_NOSUID | libc::MS_NODEV, None)?,
        None => mount("tmpfs", &rw, "tmpfs", 0, Some("mode=0755"))?,
    }
    for d in ["upper", "work", "tmp"] {
        fs::create_dir_all(format!("{rw}/{d}"))
            .map_err(|e| RootError::Sys(format!("mkdir {rw}/{d}"), e))?;
    }
    let opts = format!("lowerdir={lower_dir},upperdir={rw}/upper,workdir={rw}/work");
    mount("overlay", &root, "overlay", 0, Some(&opts))?;
    for m in ["/dev", "/proc", "/sys", "/run"] {
        mount(m, &format!("{root}{m}"), "", libc::MS_MOVE, None)?;
    }
    if scratch.is_some() {
        let tmp = format!("{rw}/tmp");
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777))
            .map_err(|e| RootError::Sys(format!("chmod 1777 {tmp}"), e))?;
        mount(
            &tmp,
            &format!("{root}/tmp"),
            "",
            libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV,
            None,
        )?;
        // A bind ignores the flags on the first call; the remount applies them.
        mount(
            &tmp,
            &format!("{root}/tmp"),
            "",
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV,
            None,
        )?;
        unmount_detached("/tmp")?;
    } else {
        mount("/tmp", &format!("{root}/tmp"), "", libc::MS_MOVE, None)?;
    }
    std::env::set_current_dir(&root).map_err(|e| RootError::Sys(format!("chdir {root}"), e))?;
    mount(".", "/", "", libc::MS_MOVE, None)?;
    let dot = c".";
    // SAFETY: chroot takes a live NUL-terminated string.
    sys::cvt(unsafe { libc::chroot(dot.as_ptr()) })
        .map_err(|e| RootError::Sys("chroot .".into(), e))?;
    std::env::set_current_dir("/").map_err(|e| RootError::Sys("chdir /".into(), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disks_are_found_by_serial_and_a_shared_serial_names_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = |name: &str, serial: Option<&str>| {
            let d = dir.path().join(name);
            fs::create_dir_all(&d).expect("mkdir");
            if let Some(serial) = serial {
                fs::write(d.join("serial"), serial).expect("serial");
            }
        };
        disk("vda", Some("rootfs.ext4\n"));
        disk("vdb", Some("crucible-scratch\n"));
        disk("vdc", Some("crucible-mount-0\0\0\0\n"));
        disk("vdd", Some("twice\n"));
        disk("vde", Some("twice\n"));
        disk("vdf", Some("\n"));
        disk("vdg", None);
        disk("loop0", Some("crucible-mount-1\n"));
        let found = disks_by_serial(dir.path());
        let expected: BTreeMap<String, String> = [
            ("rootfs.ext4", "/dev/vda"),
            ("crucible-scratch", "/dev/vdb"),
            ("crucible-mount-0", "/dev/vdc"),
        ]
        .into_iter()
        .map(|(s, d)| (s.to_string(), d.to_string()))
        .collect();
        assert_eq!(found, expected);
        assert!(disks_by_serial(&dir.path().join("missing")).is_empty());
    }

    #[test]
    fn a_root_named_by_serial_must_be_attached() {
        let cfg = BootConfig {
            root: Some("crucible-root".into()),
            ..BootConfig::default()
        };
        match prepare(&cfg) {
            Err(RootError::NoDisk(serial)) => assert_eq!(serial, "crucible-root"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nothing_asked_nothing_done() {
        // No root, scratch or mounts: the initramfs stays the root, untouched (this runs as
        // an ordinary test process, which could not mount anything).
        prepare(&BootConfig::default()).expect("nothing to do");
    }

    #[test]
    fn a_disk_that_is_not_attached_is_an_error_before_anything_is_mounted() {
        let cfg = BootConfig {
            scratch: Some("crucible-scratch".into()),
            ..BootConfig::default()
        };
        // This test host's /sys/block has no disk with that serial.
        match prepare(&cfg) {
            Err(RootError::NoDisk(serial)) => assert_eq!(serial, "crucible-scratch"),
            other => panic!("{other:?}"),
        }
    }
}
