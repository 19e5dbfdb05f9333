//! The block part of the self-test (`crucible.selftest_block=/dev/vda,…`): proves, through the
//! guest kernel's own virtio-blk driver, that the disk reads back what the host wrote, that a
//! writable disk keeps what the guest writes (through a flush), and reports what the driver
//! learnt from the device (serial from `GET_ID`, capacity, read-only flag) for the host to
//! compare. The data patterns are the contract's ([`contract::block_selftest`]).

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use contract::block_selftest::{self, GUEST_SALT, HOST_SALT};

use crate::sys;

/// Bytes per read or write.
const CHUNK: usize = 64 * 1024;

/// Checks `device`; on success, the facts the host compares (`serial=… sectors=… ro=…`).
pub(super) fn check(device: &str) -> Result<String, String> {
    let name = Path::new(device)
        .file_name()
        .ok_or_else(|| format!("{device} names no device"))?;
    let sysfs = Path::new("/sys/class/block").join(name);
    let attr = |what: &str| {
        fs::read_to_string(sysfs.join(what))
            .map(|s| s.trim_end().to_string())
            .map_err(|e| format!("{}/{what}: {e}", sysfs.display()))
    };
    let sectors: u64 = attr("size")?
        .parse()
        .map_err(|e| format!("{}/size: {e}", sysfs.display()))?;
    let read_only = attr("ro")? == "1";
    // Reading the attribute sends the device a GET_ID request.
    let serial = attr("serial")?;
    let len = sectors
        .checked_mul(512)
        .ok_or_else(|| format!("{sectors} sectors overflow"))?;

    let disk = File::open(device).map_err(|e| format!("open {device}: {e}"))?;
    verify(&disk, HOST_SALT, len).map_err(|e| format!("the host's pattern: {e}"))?;
    if read_only {
        // Linux opens a read-only disk for writing and refuses the write itself (EPERM).
        let refused = match OpenOptions::new().write(true).open(device) {
            Err(_) => true,
            Ok(disk) => {
                let mut sector = [0u8; 512];
                block_selftest::fill(GUEST_SALT, 0, &mut sector);
                disk.write_all_at(&sector, 0)
                    .and_then(|()| disk.sync_all())
                    .is_err()
            }
        };
        if !refused {
            return Err("a write to the read-only disk was accepted".into());
        }
    } else {
        let disk = OpenOptions::new()
            .read(true)
            .write(true)
            .open(device)
            .map_err(|e| format!("open {device} for writing: {e}"))?;
        write(&disk, GUEST_SALT, len)?;
        // fsync on a disk with a write cache ends in a FLUSH request.
        disk.sync_all().map_err(|e| format!("fsync: {e}"))?;
        sys::drop_cached_pages(disk.as_fd()).map_err(|e| format!("dropping the cache: {e}"))?;
        verify(&disk, GUEST_SALT, len).map_err(|e| format!("reading back our pattern: {e}"))?;
    }
    Ok(format!(
        "serial={serial} sectors={sectors} ro={}",
        u8::from(read_only)
    ))
}

fn verify(disk: &File, salt: u8, len: u64) -> Result<(), String> {
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(CHUNK as u64) as usize;
        disk.read_exact_at(&mut buf[..n], at)
            .map_err(|e| format!("read at byte {at}: {e}"))?;
        if let Some(bad) = block_selftest::first_mismatch(salt, at, &buf[..n]) {
            return Err(format!("byte {bad} differs"));
        }
        at += n as u64;
    }
    Ok(())
}

fn write(disk: &File, salt: u8, len: u64) -> Result<(), String> {
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(CHUNK as u64) as usize;
        block_selftest::fill(salt, at, &mut buf[..n]);
        disk.write_all_at(&buf[..n], at)
            .map_err(|e| format!("write at byte {at}: {e}"))?;
        at += n as u64;
    }
    Ok(())
}
