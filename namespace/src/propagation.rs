//! The host's later mounts below a `HostToContainer` (`rslave`) host path, carried into the
//! container idmapped.
//!
//! A host path's mount in a container is idmapped into the sandbox's ids and a slave of the
//! host's, so the host's later mounts below it do arrive; but the kernel copies each as the
//! host made it, not idmapped, so what host root owns (a `0700` directory) is nobody's inside
//! and does not read (Kubernetes' `mountPropagation: HostToContainer`, critest's `rslave`
//! spec). [`sync`] puts that right, with the host's privileges: each host mount below the
//! source is cloned, idmapped like the host path, and put in place of the kernel's copy in the
//! container's mount namespace; a clone whose host mount is gone is taken away. The daemon
//! runs it (in a process of its own: entering a mount namespace needs a single thread) before
//! each connection to the agent of a container with such a host path, so a command sees what
//! the host had mounted when it was started.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use crate::mount_api::{self, MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID};
use crate::sys::{self, check, SysError};

/// A `HostToContainer` host path of a container: the host directory and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FromHostPath {
    /// The host directory.
    pub source: PathBuf,
    /// Its mount point in the container.
    pub target: PathBuf,
    /// Mounted read-only (so is everything carried below it).
    pub read_only: bool,
}

/// One line of a `mountinfo`: the mount point and whether it is idmapped.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mounted {
    point: PathBuf,
    idmapped: bool,
}

fn read_table(file: &str) -> Result<Vec<Mounted>, SysError> {
    let text =
        std::fs::read_to_string(file).map_err(|e| SysError::io(format!("read {file}"), e))?;
    Ok(parse_table(&text))
}

fn parse_table(text: &str) -> Vec<Mounted> {
    text.lines()
        .filter_map(|line| {
            // `ID PARENT MAJOR:MINOR ROOT MOUNT-POINT OPTIONS …`
            let mut fields = line.split(' ');
            let point = fields.nth(4)?;
            let options = fields.next()?;
            Some(Mounted {
                point: PathBuf::from(contract::mountinfo::unescape(point)),
                idmapped: options.split(',').any(|o| o == "idmapped"),
            })
        })
        .collect()
}

/// The mount points strictly below `dir` in `table`, relative to it, in the table's order
/// (a mount before those on it).
fn below(table: &[Mounted], dir: &Path) -> Vec<PathBuf> {
    let mut seen = Vec::new();
    for mounted in table {
        if let Ok(rel) = mounted.point.strip_prefix(dir) {
            if !rel.as_os_str().is_empty() && !seen.contains(&rel.to_path_buf()) {
                seen.push(rel.to_path_buf());
            }
        }
    }
    seen
}

/// Carries the host's mounts below each of `paths` into the mount namespace of `container`
/// (the host pid of a process in it, the container's agent), idmapped into its user
/// namespace, and takes away those whose host mount is gone. Returns how many it changed.
/// The caller must be single-threaded, with the host's privileges, in the host's mount
/// namespace; it is left in the container's.
pub fn sync(container: libc::pid_t, paths: &[FromHostPath]) -> Result<usize, SysError> {
    let userns = sys::open_file(
        Path::new(&format!("/proc/{container}/ns/user")),
        libc::O_RDONLY,
    )?;
    let mntns = sys::open_file(
        Path::new(&format!("/proc/{container}/ns/mnt")),
        libc::O_RDONLY,
    )?;
    let host = read_table("/proc/self/mountinfo")?;
    let mut wanted = Vec::new();
    for path in paths {
        let source = match path.source.canonicalize() {
            Ok(source) => source,
            // Removed from the host since: nothing is mounted below it any more.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(SysError::io(
                    format!("resolve {}", path.source.display()),
                    e,
                ))
            }
        };
        for rel in below(&host, &source) {
            let at = source.join(&rel);
            let what = format!("the host's mount {}", at.display());
            let clone = mount_api::clone_tree(&cstring(&at)?, &what)?;
            let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_IDMAP;
            if path.read_only {
                attrs |= mount_api::MOUNT_ATTR_RDONLY;
            }
            if let Err(e) = mount_api::set_attrs(clone.as_fd(), attrs, Some(userns.as_fd())) {
                // Its filesystem takes no idmapped mount (overlayfs, NFS): the kernel's copy
                // stays as the host made it.
                eprintln!("guest-init: {what} cannot be idmapped into the container: {e}");
                continue;
            }
            wanted.push((path.target.join(&rel), clone));
        }
    }
    // Read from the host's /proc: the container's own does not show this process.
    let inside = read_table(&format!("/proc/{container}/mountinfo"))?;
    // SAFETY: setns takes a live descriptor and a flag; the caller is single-threaded.
    let entered = unsafe { libc::setns(mntns.as_raw_fd(), libc::CLONE_NEWNS) };
    check(entered, || {
        format!("enter the mount namespace of pid {container}")
    })?;
    let mut changed = 0;
    for (point, clone) in &wanted {
        let top = inside.iter().rev().find(|m| &m.point == point);
        if top.is_some_and(|m| m.idmapped) {
            continue;
        }
        if top.is_some() {
            // The kernel's copy (and what it carried below it): replaced as a whole.
            umount_detached(point)?;
        }
        mount_api::attach_at(
            clone,
            &cstring(point)?,
            &format!("{} idmapped", point.display()),
        )?;
        changed += 1;
    }
    // Deepest first: a clone whose host mount is gone.
    for path in paths {
        let mut gone: Vec<PathBuf> = below(&inside, &path.target)
            .into_iter()
            .map(|rel| path.target.join(rel))
            .filter(|point| !wanted.iter().any(|(w, _)| w == point))
            .filter(|point| {
                inside
                    .iter()
                    .rev()
                    .find(|m| &m.point == point)
                    .is_some_and(|m| m.idmapped)
            })
            .collect();
        gone.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for point in gone {
            umount_detached(&point)?;
            changed += 1;
        }
    }
    Ok(changed)
}

/// The host pid of the agent listening on `socket` (a container's agent socket, bound by the
/// daemon in the host's network namespace), among the processes below `supervisor` (the
/// sandbox's supervisor): the one holding the socket's listener as its descriptor
/// [`crate::PID1_LISTEN_FD`].
pub fn agent_of(socket: &Path, supervisor: libc::pid_t) -> Result<libc::pid_t, SysError> {
    let table = std::fs::read_to_string("/proc/self/net/unix")
        .map_err(|e| SysError::io("read /proc/self/net/unix", e))?;
    let inode = listener_inode(&table, socket).ok_or_else(|| {
        SysError::io(
            format!(
                "find the listener of {} in /proc/self/net/unix",
                socket.display()
            ),
            std::io::ErrorKind::NotFound.into(),
        )
    })?;
    let wanted = format!("socket:[{inode}]");
    let mut queue = vec![supervisor];
    let mut visited = 0;
    while let Some(pid) = queue.pop() {
        visited += 1;
        // A sandbox holds at most a few hundred processes; a bound in case of a loop.
        if visited > 100_000 {
            break;
        }
        let fd = format!("/proc/{pid}/fd/{}", crate::PID1_LISTEN_FD);
        if std::fs::read_link(&fd).is_ok_and(|link| link.as_os_str() == wanted.as_str()) {
            return Ok(pid);
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            queue.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<libc::pid_t>().ok()),
            );
        }
    }
    Err(SysError::io(
        format!(
            "find the process below pid {supervisor} listening on {}",
            socket.display()
        ),
        std::io::ErrorKind::NotFound.into(),
    ))
}

/// The inode of the listening socket bound at `path` in a `/proc/net/unix` table.
fn listener_inode(table: &str, path: &Path) -> Option<u64> {
    // `Num RefCount Protocol Flags Type St Inode Path`; a listener has `__SO_ACCEPTCON`
    // (0x10000) in its flags.
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flags = u32::from_str_radix(fields.get(3)?, 16).ok()?;
        (flags & 0x10000 != 0 && fields.get(7).map(Path::new) == Some(path))
            .then(|| fields.get(6)?.parse().ok())
            .flatten()
    })
}

fn umount_detached(point: &Path) -> Result<(), SysError> {
    let c = cstring(point)?;
    // Never through a symlink the container made: only the mount at that very path.
    let flags = libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW;
    // SAFETY: umount2 reads the NUL-terminated path.
    check(unsafe { libc::umount2(c.as_ptr(), flags) }, || {
        format!("umount {}", point.display())
    })
}

fn cstring(path: &Path) -> Result<CString, SysError> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
        SysError::io(
            format!("{} has a NUL byte", path.display()),
            std::io::ErrorKind::InvalidInput.into(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listeners_inode_is_found_by_its_path() {
        let table = "\
Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000003 00000000 00000000 0001 03 41 /run/x/c1.sock
0000000000000000: 00000002 00000000 00010000 0001 01 40 /run/x/c1.sock
0000000000000000: 00000002 00000000 00010000 0001 01 42 /run/x/c10.sock
0000000000000000: 00000002 00000000 00000000 0002 01 43
";
        assert_eq!(listener_inode(table, Path::new("/run/x/c1.sock")), Some(40));
        assert_eq!(
            listener_inode(table, Path::new("/run/x/c10.sock")),
            Some(42)
        );
        assert_eq!(listener_inode(table, Path::new("/run/x/c2.sock")), None);
    }

    #[test]
    fn the_mounts_below_a_directory_are_read_in_order_with_their_idmapping() {
        let table = "\
22 1 0:21 / /proc rw,nosuid - proc proc rw
30 1 8:1 / /srv/vol rw,relatime,idmapped - ext4 /dev/sda1 rw
31 30 0:40 / /srv/vol/later rw,relatime - tmpfs tmpfs rw
32 31 0:41 / /srv/vol/later/deeper rw - tmpfs tmpfs rw
33 1 0:42 / /srv/volume2 rw - tmpfs tmpfs rw
34 30 0:43 / /srv/vol/with\\040space rw,idmapped - tmpfs tmpfs rw
";
        let parsed = parse_table(table);
        assert_eq!(
            parsed[1],
            Mounted {
                point: "/srv/vol".into(),
                idmapped: true
            }
        );
        assert!(!parsed[2].idmapped);
        assert_eq!(
            below(&parsed, Path::new("/srv/vol")),
            [
                PathBuf::from("later"),
                "later/deeper".into(),
                "with space".into()
            ]
        );
        assert!(below(&parsed, Path::new("/srv/vol/later/deeper")).is_empty());
    }
}
