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

/// Whether `serial` is a container's image disk ([`container_serial`]): a container named at
/// boot, or an empty slot for one added later.
pub fn is_container_serial(serial: &str) -> bool {
    serial
        .strip_prefix("crucible-ctr-")
        .is_some_and(|index| !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()))
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

/// The disk control socket's exchange (`crucible-vmm`'s `disk_control`, `crucible-vmm
/// vhost-user block --control`): how the daemon gives a running VM's empty read-only disk (a
/// spare container slot) an image. One request per connection: the line `replace SERIAL\n`,
/// then one byte carrying the image's open descriptor (`SCM_RIGHTS`). The answer is one line:
/// `ok SECTORS` (the disk's new capacity; the driver was told its configuration changed) or
/// `error WHY`.
pub mod control {
    /// The longest request line, newline excluded.
    pub const MAX_REQUEST_BYTES: usize = 64;

    /// The request line (newline included) giving the disk `serial` a new image.
    pub fn request(serial: &str) -> String {
        format!("replace {serial}\n")
    }

    /// The serial a request line (without its newline) names, or why it is not a request.
    pub fn parse_request(line: &str) -> Result<&str, String> {
        match line.split_once(' ') {
            Some(("replace", serial)) if super::is_valid_serial(serial) => Ok(serial),
            Some(("replace", serial)) => Err(format!("{serial:?} is not a disk serial")),
            _ => Err(format!("{line:?} is not `replace SERIAL`")),
        }
    }

    /// The answer line (newline included) for `result`: the new capacity in sectors, or why
    /// the disk was not given its image.
    pub fn answer(result: &Result<u64, String>) -> String {
        match result {
            Ok(sectors) => format!("ok {sectors}\n"),
            Err(why) => format!("error {}\n", why.replace('\n', " ")),
        }
    }

    /// The capacity an answer line reports, or the device's reason.
    pub fn parse_answer(line: &str) -> Result<u64, String> {
        let line = line.trim_end();
        if let Some(why) = line.strip_prefix("error ") {
            return Err(why.to_string());
        }
        line.strip_prefix("ok ")
            .and_then(|sectors| sectors.parse().ok())
            .ok_or_else(|| format!("the disk control answered {line:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_disks_are_told_from_the_others_by_serial() {
        assert!(is_container_serial(&container_serial(0)));
        assert!(is_container_serial(&container_serial(17)));
        for other in [
            SCRATCH_SERIAL,
            ROOT_SERIAL,
            "crucible-ctr-",
            "crucible-ctr-1x",
        ] {
            assert!(!is_container_serial(other), "{other}");
        }
        assert!(!is_container_serial(&mount_serial(0)));
    }

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

    #[test]
    fn the_disk_control_exchange_round_trips() {
        let line = control::request("crucible-ctr-2");
        assert_eq!(
            control::parse_request(line.trim_end()),
            Ok("crucible-ctr-2")
        );
        assert!(control::parse_request("replace ../x").is_err());
        assert!(control::parse_request("eject crucible-ctr-2").is_err());
        assert_eq!(control::parse_answer(&control::answer(&Ok(16))), Ok(16));
        assert_eq!(
            control::parse_answer(&control::answer(&Err("no\nway".into()))),
            Err("no way".into())
        );
        assert!(control::parse_answer("").is_err());
        assert!(control::parse_answer("ok many").is_err());
    }
}
