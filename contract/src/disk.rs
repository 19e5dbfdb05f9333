//! How a microVM's guest tells the disks the daemon attaches apart: by their virtio-blk serial
//! (`GET_ID`, `/sys/block/vdX/serial`), never by `vdX` order. Our block device answers
//! `GET_ID` with the file name of the image path it was given (cut to [`MAX_SERIAL_BYTES`]),
//! so the daemon hands each device a path whose file name is one of the serials below (a
//! link in the sandbox's runtime directory to the real image) and the kernel command line
//! names the serials ([`crate::cmdline::keys::SCRATCH`], [`crate::cmdline::keys::MOUNT`]).
//! The order in which a hypervisor's transports probe (QEMU's `microvm` lists its virtio-mmio
//! devices in an order of its own) then does not matter.

/// The most bytes of a virtio-blk serial (`VIRTIO_BLK_ID_BYTES`).
pub const MAX_SERIAL_BYTES: usize = 20;

/// The serial of the image's ext4 root disk (`crucible.root=crucible-root`).
pub const ROOT_SERIAL: &str = "crucible-root";

/// The serial of the disk that holds a sandbox's writable layer.
pub const SCRATCH_SERIAL: &str = "crucible-scratch";

/// The serial of the disk mounted `index`th (a cache or a volume), in request order.
pub fn mount_serial(index: usize) -> String {
    format!("crucible-mount-{index}")
}

/// The serial of the image disk of the sandbox's container `index` (`crucible.container=`).
pub fn container_serial(index: usize) -> String {
    format!("crucible-ctr-{index}")
}

/// Whether `serial` is one the guest can match exactly: 1 to [`MAX_SERIAL_BYTES`] bytes of
/// ASCII letters, digits, `.`, `_` and `-` (no NUL padding to confuse, nothing the kernel
/// command line would mangle).
pub fn is_valid_serial(serial: &str) -> bool {
    (1..=MAX_SERIAL_BYTES).contains(&serial.len())
        && serial
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_serial_the_daemon_uses_fits_a_virtio_blk_id() {
        assert!(is_valid_serial(SCRATCH_SERIAL) && is_valid_serial(ROOT_SERIAL));
        for index in [0, 9, 10, 999] {
            assert!(is_valid_serial(&mount_serial(index)), "{index}");
            assert!(is_valid_serial(&container_serial(index)), "{index}");
        }
        for bad in ["", "a b", "x:y", "a\0", "123456789012345678901"] {
            assert!(!is_valid_serial(bad), "{bad:?}");
        }
    }
}
