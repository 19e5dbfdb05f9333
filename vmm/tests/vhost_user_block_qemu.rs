//! Our virtio-block device against a real Linux driver: `crucible-vmm vhost-user block` serves
//! two raw images (one read-write, one `:ro`) to QEMU (TCG, `-M microvm`, the image smoke
//! test's machine), which boots our kernel with guest-init as PID 1 and
//! `crucible.selftest_block=`. The guest's virtio-blk driver reads the host's pattern from each
//! disk, writes its own over the writable one, flushes, and reads it back; it reports the serial
//! (`GET_ID`), capacity and read-only flag it saw. After QEMU exits, the host checks every byte of
//! both images and that both backends ended cleanly.
//!
//! Needs QEMU (installed with apt when missing, as `cargo xtask smoke-image` does) and the
//! image (`cargo xtask build-image`, which CI runs before the tests): fails, never skips,
//! without them.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

mod common;

use common::{image_files, Backend};
use contract::block_selftest::{self, GUEST_SALT, HOST_SALT};
use guest_image::progress::Plain;
use guest_image::smoke::{self, SmokeOptions};

/// The QEMU boot's limit (it takes ~5 s here); the whole test stays under a minute.
const BOOT_TIMEOUT: Duration = Duration::from_secs(45);
/// A raw image of `len` bytes filled with the host's pattern.
fn host_image(path: &Path, len: u64) {
    let mut bytes = vec![0u8; len as usize];
    block_selftest::fill(HOST_SALT, 0, &mut bytes);
    std::fs::write(path, bytes).unwrap();
}

/// `crucible-selftest: block_<dev> ok serial=… sectors=… ro=…` lines, by serial.
fn block_reports(console: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    console
        .lines()
        .filter_map(|line| {
            line.split_once("crucible-selftest: block_")?
                .1
                .split_once(" ok ")
        })
        .map(|(_, facts)| {
            facts
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        })
        .filter_map(|facts| Some((facts.get("serial")?.clone(), facts)))
        .collect()
}

#[test]
fn vhost_user_block_serves_a_real_linux_virtio_blk_driver_under_qemu() {
    let (kernel, initramfs) = image_files();
    let dir = tempfile::tempdir().unwrap();
    // Not a whole number of sectors: the tail is outside the capacity and must stay as it is.
    let (rw_len, ro_len) = (3 * 1024 * 1024 + 7 * 512 + 100, 1024 * 1024 + 3 * 512);
    let (rw_name, ro_name) = ("crucible-rw.img", "crucible-ro.img");
    let (rw_image, ro_image) = (dir.path().join(rw_name), dir.path().join(ro_name));
    host_image(&rw_image, rw_len);
    host_image(&ro_image, ro_len);

    let backends = [
        Backend::start(
            "block",
            dir.path().join("rw.sock"),
            &["--path".as_ref(), rw_image.as_os_str()],
        ),
        Backend::start(
            "block",
            dir.path().join("ro.sock"),
            &[
                "--path".as_ref(),
                format!("{}:ro", ro_image.display()).as_ref(),
            ],
        ),
    ];
    let mut opts = SmokeOptions::new(kernel, initramfs);
    opts.timeout = BOOT_TIMEOUT;
    opts.vhost_user_blk = backends.iter().map(|b| b.socket().to_path_buf()).collect();
    let run = smoke::boot(&opts, dir.path(), &Plain).unwrap();
    let problems = smoke::problems(&run, &smoke::parse_console(&run.console), opts.timeout);
    assert!(
        problems.is_empty(),
        "{problems:#?}\n{}\n--- console ---\n{}",
        run.command,
        run.console
    );
    for backend in backends {
        backend.expect_clean_exit();
    }

    // What the guest's driver saw: GET_ID (the file name), the capacity, the read-only flag.
    let reports = block_reports(&run.console);
    let expect = [(rw_name, rw_len / 512, "0"), (ro_name, ro_len / 512, "1")];
    for (serial, sectors, ro) in expect {
        let facts = reports.get(serial).unwrap_or_else(|| {
            panic!(
                "no block report for {serial} (an agent older than crucible.selftest_block? \
                     rebuild the image with `cargo xtask build-image`):\n{}",
                run.console
            )
        });
        assert_eq!(facts["sectors"], sectors.to_string(), "{serial}");
        assert_eq!(facts["ro"], ro, "{serial}");
    }
    assert_eq!(reports.len(), 2, "{reports:?}");

    // What reached the images: the guest's pattern over the whole capacity of the writable one,
    // the tail past the capacity untouched, the read-only one unchanged.
    let rw = std::fs::read(&rw_image).unwrap();
    let capacity = (rw_len - rw_len % 512) as usize;
    assert_eq!(rw.len() as u64, rw_len);
    assert_eq!(
        block_selftest::first_mismatch(GUEST_SALT, 0, &rw[..capacity]),
        None
    );
    assert_eq!(
        block_selftest::first_mismatch(HOST_SALT, capacity as u64, &rw[capacity..]),
        None
    );
    let ro = std::fs::read(&ro_image).unwrap();
    assert_eq!(ro.len() as u64, ro_len);
    assert_eq!(block_selftest::first_mismatch(HOST_SALT, 0, &ro), None);
}
