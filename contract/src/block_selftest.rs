//! The block self-test's data (`crucible.selftest_block=`): the host fills each disk with the
//! [`HOST_SALT`] pattern before the boot; the guest checks it through its virtio-blk driver,
//! writes the [`GUEST_SALT`] pattern over a writable disk and reads it back; the host checks the
//! image afterwards. One definition, so the two sides cannot disagree on a byte.
//!
//! The guest prints, per device, `crucible-selftest: block_<name> ok serial=<s> sectors=<n>
//! ro=<0|1>` (what its driver saw: the `GET_ID` answer, the capacity, the read-only flag) or
//! `crucible-selftest: block_<name> FAIL <why>`.

/// The pattern the host writes before the boot.
pub const HOST_SALT: u8 = 0x3c;
/// The pattern the guest writes over a writable disk.
pub const GUEST_SALT: u8 = 0xc3;
/// Bytes per sector of the pattern (the virtio-blk sector).
const SECTOR: u64 = 512;

/// The byte at `offset` of a disk filled with `salt`'s pattern. Each 512-byte sector starts
/// with its sector number (little-endian `u64`) and continues with a ramp, all XORed with
/// `salt`: a misplaced, stale, zeroed or other-pattern sector differs.
pub fn pattern_byte(salt: u8, offset: u64) -> u8 {
    let sector = offset / SECTOR;
    let within = offset % SECTOR;
    let byte = match within {
        0..8 => sector.to_le_bytes()[within as usize],
        _ => (within as u8).wrapping_mul(37).wrapping_add(11),
    };
    byte ^ salt
}

/// Fills `buf`, which sits at `offset` on the disk, with `salt`'s pattern.
pub fn fill(salt: u8, offset: u64, buf: &mut [u8]) {
    for (at, b) in (offset..).zip(buf.iter_mut()) {
        *b = pattern_byte(salt, at);
    }
}

/// The disk offset of the first byte of `buf` (at `offset`) that is not `salt`'s pattern.
pub fn first_mismatch(salt: u8, offset: u64, buf: &[u8]) -> Option<u64> {
    (offset..)
        .zip(buf)
        .find(|&(at, &b)| b != pattern_byte(salt, at))
        .map(|(at, _)| at)
}

/// The console name of the test of `device` (`/dev/vda` → `block_vda`).
pub fn test_name(device: &str) -> String {
    let name = device.rsplit('/').next().unwrap_or(device);
    format!("block_{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_between_sides_and_between_sectors() {
        let mut host = vec![0u8; 4 * 512];
        fill(HOST_SALT, 0, &mut host);
        assert_eq!(first_mismatch(HOST_SALT, 0, &host), None);
        assert_eq!(first_mismatch(GUEST_SALT, 0, &host), Some(0));
        assert_eq!(first_mismatch(HOST_SALT, 0, &[0u8; 512]), Some(0));
        // Sector 1's bytes where sector 2 should be: caught at the sector number.
        let misplaced = host[512..1024].to_vec();
        assert_eq!(first_mismatch(HOST_SALT, 1024, &misplaced), Some(1024));
        // Sectors far apart still differ (the number is the whole u64).
        let mut far = vec![0u8; 512];
        fill(HOST_SALT, 256 * 512, &mut far);
        assert_eq!(first_mismatch(HOST_SALT, 0, &far), Some(1));
    }

    #[test]
    fn test_name_is_the_device_name() {
        assert_eq!(test_name("/dev/vda"), "block_vda");
        assert_eq!(test_name("vdb"), "block_vdb");
    }
}
