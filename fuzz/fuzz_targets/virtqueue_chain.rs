//! Virtqueues entirely under the guest's control: descriptor table, avail ring and used ring
//! addresses, queue size and every byte of guest memory come from the input, and the
//! virtio-block device (on a small scratch image) processes whatever chains that describes —
//! loops, out-of-memory addresses, indirect tables, overlapping rings and all.
//!
//! Input layout: `[flags][size][desc:4][avail:4][used:4][guest memory…]`; guest memory is a
//! 64 KiB region at 0 plus a 4 KiB region at 0x20000 (the gap between is unmapped). Checked:
//! - activation succeeds exactly for a queue the transport would accept (`Queue::is_valid`);
//! - the device writes guest memory only where the guest allowed it: inside a device-writable
//!   descriptor (direct or in an indirect table) or inside the used ring (checked when the
//!   descriptor tables cannot change under the device, i.e. overlap neither);
//! - the image never changes size, and a read-only image never changes at all;
//! - processing the same queue again without new buffers completes nothing new.

#![no_main]

use std::fs::{self, File};
use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use crucible_devices::virtio::block::Block;
use crucible_devices::virtio::test_utils::interrupt;
use crucible_devices::virtio::{GuestMemory, VirtioDevice};
use libfuzzer_sys::fuzz_target;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

const LOW: (u64, usize) = (0, 0x1_0000);
const HIGH: (u64, usize) = (0x2_0000, 0x1000);
const IMAGE_SECTORS: usize = 16;
const DESC_F_WRITE: u16 = 2;
const DESC_F_INDIRECT: u16 = 4;

fn image_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        // tmpfs when there is one: FLUSH requests fdatasync the image, which costs milliseconds
        // on a disk.
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("crucible-fuzz-blk-{}.img", std::process::id()))
    })
}

/// The image content: each sector filled with its number, so misplaced reads show.
fn image_content() -> Vec<u8> {
    (0..IMAGE_SECTORS * 512).map(|i| (i / 512) as u8).collect()
}

fn snapshot(mem: &GuestMemory) -> Vec<(u64, Vec<u8>)> {
    [LOW, HIGH]
        .iter()
        .map(|&(base, len)| {
            let mut bytes = vec![0u8; len];
            mem.read_slice(&mut bytes, GuestAddress(base))
                .expect("mapped region");
            (base, bytes)
        })
        .collect()
}

fn read_bytes(memory: &[(u64, Vec<u8>)], addr: u64, len: usize) -> Option<&[u8]> {
    memory.iter().find_map(|(base, bytes)| {
        let off = usize::try_from(addr.checked_sub(*base)?).ok()?;
        bytes.get(off..off.checked_add(len)?)
    })
}

/// Every device-writable range the descriptor table (and the indirect tables it points to)
/// describes, read from `memory`.
fn writable_ranges(
    memory: &[(u64, Vec<u8>)],
    table: u64,
    size: u16,
) -> (Vec<(u64, u64)>, Vec<(u64, u64)>) {
    let mut ranges = Vec::new();
    let mut table_spans = Vec::new();
    let mut tables = vec![(table, u32::from(size), true)];
    while let Some((table, entries, direct)) = tables.pop() {
        table_spans.push((table, table.saturating_add(16 * u64::from(entries))));
        for i in 0..u64::from(entries) {
            // Tables are contiguous: past the end of guest memory, the rest is too.
            let Some(d) = read_bytes(memory, table.saturating_add(16 * i), 16) else {
                break;
            };
            let addr = u64::from_le_bytes(d[0..8].try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(d[8..12].try_into().expect("4 bytes"));
            let flags = u16::from_le_bytes(d[12..14].try_into().expect("2 bytes"));
            if flags & DESC_F_INDIRECT != 0 && direct {
                // The queue refuses indirect tables of more than u16::MAX entries.
                tables.push((addr, (len / 16).min(u32::from(u16::MAX)), false));
            } else if flags & DESC_F_WRITE != 0 {
                ranges.push((addr, addr.saturating_add(u64::from(len))));
            }
        }
    }
    (ranges, table_spans)
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

fuzz_target!(|data: &[u8]| {
    let [flags, size_byte, rest @ ..] = data else {
        return;
    };
    let Some((addrs, memory)) = rest.split_first_chunk::<12>() else {
        return;
    };
    let word = |i: usize| u32::from_le_bytes(addrs[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    // Mostly addresses in and around guest memory, sometimes anything at all.
    let mask = if flags & 0x80 != 0 {
        u32::MAX
    } else {
        0x3_ffff
    };
    let (desc, avail, used) = (word(0) & mask, word(1) & mask, word(2) & mask);
    let size = if size_byte & 0x80 != 0 {
        u16::from(size_byte & 0x7f) // Possibly not a power of two: must be ignored.
    } else {
        1 << (size_byte % 9)
    };
    let read_only = flags & 1 != 0;

    let mem =
        GuestMemory::from_ranges(&[(GuestAddress(LOW.0), LOW.1), (GuestAddress(HIGH.0), HIGH.1)])
            .expect("guest memory");
    let n = memory.len().min(LOW.1);
    mem.write_slice(&memory[..n], GuestAddress(0))
        .expect("in range");

    let image = image_content();
    File::create(image_path())
        .and_then(|mut f| f.write_all(&image))
        .expect("scratch image");
    let mut block = Block::new(image_path(), read_only).expect("block device");

    let mut queue = Queue::new(256).expect("queue");
    queue.set_size(size);
    queue.set_desc_table_address(Some(desc), Some(0));
    queue.set_avail_ring_address(Some(avail), Some(0));
    queue.set_used_ring_address(Some(used), Some(0));
    queue.set_ready(true);
    // The queue ignores a bad size or a misaligned address (as the transport's registers
    // would): what counts is what it holds now.
    let (size, desc, avail, used) = (
        queue.size(),
        queue.desc_table(),
        queue.avail_ring(),
        queue.used_ring(),
    );
    let valid = queue.is_valid(&mem);
    let activated = block
        .activate(mem.clone(), interrupt(), vec![queue])
        .is_ok();
    assert_eq!(
        activated, valid,
        "activation disagrees with the queue's validity"
    );
    if !activated {
        return;
    }

    let before = snapshot(&mem);
    block.process_queue(0);
    let after = snapshot(&mem);

    // Where the device was allowed to write: the writable buffers and the used ring. That is
    // exact only while the descriptor tables stay as they were: when the used ring or a
    // writable buffer overlaps a table, the device legitimately rewrites the chains it then
    // follows, and this check is skipped.
    let (mut allowed, table_spans) = writable_ranges(&before, desc, size);
    let used_ring = (used, used + 6 + 8 * u64::from(size));
    let tables_fixed = table_spans
        .iter()
        .all(|&t| !overlaps(t, used_ring) && allowed.iter().all(|&w| !overlaps(t, w)));
    allowed.push(used_ring);
    // A mask per region and block-wise comparison keep this linear (the harness's own loops
    // are instrumented too, and a quadratic check cost most of the time).
    for ((base, old), (_, new)) in before.iter().zip(&after).filter(|_| tables_fixed) {
        let end_of_region = base + old.len() as u64;
        let mut writable = vec![false; old.len()];
        for &(start, end) in &allowed {
            let (start, end) = (start.max(*base), end.min(end_of_region));
            if start < end {
                writable[(start - base) as usize..(end - base) as usize].fill(true);
            }
        }
        const BLOCK: usize = 64;
        for (k, (old_block, new_block)) in old.chunks(BLOCK).zip(new.chunks(BLOCK)).enumerate() {
            if old_block == new_block {
                continue;
            }
            for (i, (a, b)) in old_block.iter().zip(new_block).enumerate() {
                let offset = k * BLOCK + i;
                assert!(
                    a == b || writable[offset],
                    "the device wrote guest memory at {:#x}, which no writable descriptor or \
                     the used ring covers",
                    base + offset as u64
                );
            }
        }
    }

    let on_disk = fs::read(image_path()).expect("image");
    assert_eq!(on_disk.len(), image.len(), "the image changed size");
    if read_only {
        assert!(on_disk == image, "a read-only image was written");
    }

    // Nothing new was made available: a second pass completes nothing, unless the first pass
    // itself rewrote the avail ring (a writable buffer overlapping it).
    let avail_ring = (avail, avail + 4 + 2 * u64::from(size));
    let avail_untouched =
        read_bytes(
            &before,
            avail_ring.0,
            (avail_ring.1 - avail_ring.0) as usize,
        ) == read_bytes(&after, avail_ring.0, (avail_ring.1 - avail_ring.0) as usize);
    let used_idx_before = read_bytes(&after, used + 2, 2);
    block.process_queue(0);
    if avail_untouched {
        let again = snapshot(&mem);
        assert_eq!(
            read_bytes(&again, used + 2, 2),
            used_idx_before,
            "a second pass completed buffers nobody made available"
        );
    }
});
