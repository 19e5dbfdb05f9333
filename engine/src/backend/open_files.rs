//! Which files a process has open, read from the host (`/proc/PID/fd`): live restore checks
//! with it that a microVM taken back still has each disk its record names attached — the VM
//! process (or, under QEMU, its block device process) holds the image open for as long as the
//! guest can reach it. The guest's own mount table is the guest's word, not the host's.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The pid among `pids` that has `file` open (the same file: device and inode, whatever path
/// or link it was opened through), or why none does.
pub(crate) fn held_open_by(pids: &[i32], file: &Path) -> Result<i32, String> {
    let wanted = std::fs::metadata(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let identity = (wanted.dev(), wanted.ino());
    for &pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        // `metadata` follows the descriptor's magic link to the open file itself.
        let holds = fds
            .flatten()
            .any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| (m.dev(), m.ino()) == identity));
        if holds {
            return Ok(pid);
        }
    }
    Err(format!(
        "none of its processes (pids {pids:?}) has {} open",
        file.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_found_open_through_any_path_and_a_closed_one_is_not() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("disk.ext4");
        std::fs::write(&file, b"x").expect("write");
        let link = dir.path().join("crucible-mount-0");
        std::os::unix::fs::symlink(&file, &link).expect("link");
        let me = i32::try_from(std::process::id()).expect("a pid");
        let other = dir.path().join("other.ext4");
        std::fs::write(&other, b"y").expect("write");
        assert!(held_open_by(&[me], &file).is_err(), "not open yet");
        let opened = std::fs::File::open(&link).expect("open through the link");
        assert_eq!(held_open_by(&[i32::MAX, me], &file), Ok(me));
        let refused = held_open_by(&[me], &other).expect_err("never opened");
        assert!(
            refused.contains("has") && refused.contains("other.ext4"),
            "{refused}"
        );
        drop(opened);
        assert!(held_open_by(&[me], &file).is_err(), "closed again");
        assert!(held_open_by(&[me], &dir.path().join("gone")).is_err());
    }
}
