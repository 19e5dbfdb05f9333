//! virtio-block on a raw image file: read, write, flush and get_id, with an optional read-only
//! flag. Every request is checked against the image size: a bad sector, a short descriptor or a
//! write to a read-only disk is an I/O error for the guest, never a VMM panic.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use virtio_queue::{DescriptorChain, Queue, QueueT, Reader, Writer};
use vmm_sys_util::eventfd::EventFd;

use super::{ids, ActivateError, GuestMemory, Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};

/// Bytes per sector, whatever the image.
pub const SECTOR_SIZE: u64 = 512;
/// The queue size we offer.
pub const QUEUE_SIZE: u16 = 256;
/// `VIRTIO_BLK_F_RO`.
pub const VIRTIO_BLK_F_RO: u32 = 5;
/// `VIRTIO_BLK_F_FLUSH`.
pub const VIRTIO_BLK_F_FLUSH: u32 = 9;

/// Request types.
pub mod req {
    #![allow(missing_docs)]
    pub const IN: u32 = 0;
    pub const OUT: u32 = 1;
    pub const FLUSH: u32 = 4;
    pub const GET_ID: u32 = 8;
}

/// Request status bytes.
pub mod status {
    #![allow(missing_docs)]
    pub const OK: u8 = 0;
    pub const IOERR: u8 = 1;
    pub const UNSUPP: u8 = 2;
}

/// The length of a `GET_ID` answer.
pub const ID_BYTES: usize = 20;
/// How much of a request is copied at once (requests are never buffered whole).
const CHUNK: usize = 64 * 1024;

/// Why a block device could not be created.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The image could not be opened.
    #[error("cannot open the disk image {}", path.display())]
    Open {
        /// The image.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// An eventfd could not be created.
    #[error("cannot create an eventfd")]
    EventFd(#[source] io::Error),
}

struct Active {
    mem: GuestMemory,
    interrupt: Arc<Interrupt>,
    queue: Queue,
}

/// A virtio-block device.
pub struct Block {
    file: File,
    read_only: bool,
    capacity_bytes: u64,
    id: [u8; ID_BYTES],
    acked_features: u64,
    queue_evts: [EventFd; 1],
    active: Option<Active>,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("read_only", &self.read_only)
            .field("capacity_bytes", &self.capacity_bytes)
            .finish_non_exhaustive()
    }
}

impl Block {
    /// A device for the raw image at `path`. The capacity is the image size rounded down to a
    /// whole sector.
    pub fn new(path: &Path, read_only: bool) -> Result<Self, BlockError> {
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(|source| BlockError::Open {
                path: path.to_owned(),
                source,
            })?;
        let len = file
            .metadata()
            .map_err(|source| BlockError::Open {
                path: path.to_owned(),
                source,
            })?
            .len();
        let mut id = [0u8; ID_BYTES];
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let n = name.len().min(ID_BYTES);
        id[..n].copy_from_slice(&name.as_bytes()[..n]);
        Ok(Block {
            file,
            read_only,
            capacity_bytes: len - len % SECTOR_SIZE,
            id,
            acked_features: 0,
            queue_evts: [EventFd::new(libc::EFD_NONBLOCK).map_err(BlockError::EventFd)?],
            active: None,
        })
    }

    /// The capacity in sectors (the config space's `capacity`).
    pub fn capacity_sectors(&self) -> u64 {
        self.capacity_bytes / SECTOR_SIZE
    }

    /// Runs one request; returns the number of bytes written into the chain.
    fn handle(&self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> u32 {
        let (Ok(mut reader), Ok(mut writer)) = (
            Reader::<()>::new(mem, chain.clone()),
            Writer::<()>::new(mem, chain),
        ) else {
            return 0;
        };
        let Some(data_len) = writer.available_bytes().checked_sub(1) else {
            return 0; // No room for the status byte: nothing we can tell the guest.
        };
        let Ok(mut status_w) = writer.split_at(data_len) else {
            return 0;
        };
        let (st, written) = match reader.read_obj::<[u8; 16]>() {
            Ok(h) => {
                let kind = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
                let mut s = [0u8; 8];
                s.copy_from_slice(&h[8..16]);
                self.execute(kind, u64::from_le_bytes(s), &mut reader, &mut writer)
            }
            Err(_) => (status::IOERR, 0),
        };
        if status_w.write_all(&[st]).is_err() {
            return 0;
        }
        u32::try_from(written + 1).unwrap_or(u32::MAX)
    }

    /// The byte offset of `sector` if `[sector, +len)` lies inside the image.
    fn range(&self, sector: u64, len: usize) -> Option<u64> {
        let start = sector.checked_mul(SECTOR_SIZE)?;
        let end = start.checked_add(len as u64)?;
        (end <= self.capacity_bytes).then_some(start)
    }

    fn execute(
        &self,
        kind: u32,
        sector: u64,
        reader: &mut Reader<'_>,
        writer: &mut Writer<'_>,
    ) -> (u8, usize) {
        match kind {
            req::IN => {
                let len = writer.available_bytes();
                let Some(mut off) = self.range(sector, len) else {
                    return (status::IOERR, 0);
                };
                let mut buf = vec![0u8; len.min(CHUNK)];
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(CHUNK);
                    if self.file.read_exact_at(&mut buf[..n], off).is_err()
                        || writer.write_all(&buf[..n]).is_err()
                    {
                        return (status::IOERR, done);
                    }
                    done += n;
                    off += n as u64;
                }
                (status::OK, done)
            }
            req::OUT => {
                if self.read_only {
                    return (status::IOERR, 0);
                }
                let len = reader.available_bytes();
                let Some(mut off) = self.range(sector, len) else {
                    return (status::IOERR, 0);
                };
                let mut buf = vec![0u8; len.min(CHUNK)];
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(CHUNK);
                    if reader.read_exact(&mut buf[..n]).is_err()
                        || self.file.write_all_at(&buf[..n], off).is_err()
                    {
                        return (status::IOERR, 0);
                    }
                    done += n;
                    off += n as u64;
                }
                (status::OK, 0)
            }
            req::FLUSH => match self.read_only || self.file.sync_data().is_ok() {
                true => (status::OK, 0),
                false => (status::IOERR, 0),
            },
            req::GET_ID => {
                let n = writer.available_bytes().min(ID_BYTES);
                match writer.write_all(&self.id[..n]) {
                    Ok(()) => (status::OK, n),
                    Err(_) => (status::IOERR, 0),
                }
            }
            _ => (status::UNSUPP, 0),
        }
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        ids::BLOCK
    }

    fn avail_features(&self) -> u64 {
        let mut f = (1u64 << VIRTIO_F_VERSION_1) | (1u64 << VIRTIO_BLK_F_FLUSH);
        if self.read_only {
            f |= 1u64 << VIRTIO_BLK_F_RO;
        }
        f
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features;
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.capacity_sectors().to_le_bytes(), offset, data);
    }

    fn activate(
        &mut self,
        mem: GuestMemory,
        interrupt: Arc<Interrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        let Some(queue) = queues.into_iter().next().filter(|q| q.is_valid(&mem)) else {
            return Err(ActivateError::BadQueue(0));
        };
        self.active = Some(Active {
            mem,
            interrupt,
            queue,
        });
        Ok(())
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn reset(&mut self) {
        self.active = None;
        self.acked_features = 0;
    }

    fn process_queue(&mut self, _index: usize) {
        let Some(mut a) = self.active.take() else {
            return;
        };
        let mut used = false;
        while let Some(chain) = a.queue.pop_descriptor_chain(&a.mem) {
            let head = chain.head_index();
            let len = self.handle(&a.mem, chain);
            // A failure here means the used ring is outside guest memory: the guest's problem.
            let _ = a.queue.add_used(&a.mem, head, len);
            used = true;
        }
        if used && a.queue.needs_notification(&a.mem).unwrap_or(true) {
            let _ = a.interrupt.signal_used_queue();
        }
        self.active = Some(a);
    }
}

/// Copies `config[offset..]` into `data`; bytes past the end read as zero.
pub(crate) fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(off) = usize::try_from(offset) else {
        return;
    };
    if let Some(src) = config.get(off..) {
        let n = src.len().min(data.len());
        data[..n].copy_from_slice(&src[..n]);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write as _;

    use super::*;
    use crate::virtio::test_utils::{default_mem, interrupt, Buf, TestQueue};

    fn image(sectors: u64) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for s in 0..sectors {
            f.write_all(&[s as u8; SECTOR_SIZE as usize]).unwrap();
        }
        f
    }

    fn header(kind: u32, sector: u64) -> Vec<u8> {
        let mut h = kind.to_le_bytes().to_vec();
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&sector.to_le_bytes());
        h
    }

    fn setup<'a>(
        mem: &'a GuestMemory,
        img: &tempfile::NamedTempFile,
        ro: bool,
    ) -> (Block, TestQueue<'a>, Arc<Interrupt>) {
        let mut dev = Block::new(img.path(), ro).unwrap();
        let q = TestQueue::new(mem, 0, 16);
        let irq = interrupt();
        dev.activate(mem.clone(), irq.clone(), vec![q.queue()])
            .unwrap();
        (dev, q, irq)
    }

    #[test]
    fn block_reads_in_range_sectors_and_signals_the_guest() {
        let mem = default_mem();
        let img = image(8);
        let (mut dev, mut q, irq) = setup(&mem, &img, false);
        assert_eq!(dev.capacity_sectors(), 8);
        let a = q.add(&[Buf::R(&header(req::IN, 3)), Buf::W(1024), Buf::W(1)]);
        dev.process_queue(0);
        assert_eq!(q.used(), Some((0, 1025)));
        let data = q.read(a[1], 1024);
        assert!(data[..512].iter().all(|&b| b == 3));
        assert!(data[512..].iter().all(|&b| b == 4));
        assert_eq!(q.read(a[2], 1), [status::OK]);
        assert_eq!(irq.status() & crate::virtio::INT_VRING, 1);
        assert_eq!(irq.irqfd().read().unwrap(), 1);
    }

    #[test]
    fn block_out_of_range_request_is_an_io_error_not_a_panic() {
        let mem = default_mem();
        let img = image(8);
        let (mut dev, mut q, _) = setup(&mem, &img, false);
        // Past the end, straddling the end, and a sector whose byte offset overflows.
        let a = q.add(&[Buf::R(&header(req::IN, 8)), Buf::W(512), Buf::W(1)]);
        let b = q.add(&[
            Buf::R(&header(req::OUT, 7)),
            Buf::R(&[9u8; 1024]),
            Buf::W(1),
        ]);
        let c = q.add(&[
            Buf::R(&header(req::IN, u64::MAX / 2)),
            Buf::W(512),
            Buf::W(1),
        ]);
        // A header too short to parse, and a chain without room for the status.
        let d = q.add(&[Buf::R(&[0u8; 7]), Buf::W(1)]);
        q.add(&[Buf::R(&header(req::IN, 0))]);
        dev.process_queue(0);
        assert_eq!(q.read(a[2], 1), [status::IOERR]);
        assert_eq!(q.read(b[2], 1), [status::IOERR]);
        assert_eq!(q.read(c[2], 1), [status::IOERR]);
        assert_eq!(q.read(d[1], 1), [status::IOERR]);
        let used: Vec<_> = std::iter::from_fn(|| q.used()).collect();
        assert_eq!(used.len(), 5, "every chain is returned");
        assert_eq!(used[4].1, 0);
        // Sector 7 was not touched.
        let mut sector = [0u8; 512];
        std::fs::File::open(img.path())
            .unwrap()
            .read_exact_at(&mut sector, 7 * 512)
            .unwrap();
        assert!(sector.iter().all(|&b| b == 7));
    }

    #[test]
    fn block_writes_then_flush_reach_the_image() {
        let mem = default_mem();
        let img = image(4);
        let (mut dev, mut q, _) = setup(&mem, &img, false);
        let a = q.add(&[
            Buf::R(&header(req::OUT, 1)),
            Buf::R(&[0xab; 512]),
            Buf::W(1),
        ]);
        let f = q.add(&[Buf::R(&header(req::FLUSH, 0)), Buf::W(1)]);
        let id = q.add(&[Buf::R(&header(req::GET_ID, 0)), Buf::W(20), Buf::W(1)]);
        let u = q.add(&[Buf::R(&header(99, 0)), Buf::W(1)]);
        dev.process_queue(0);
        assert_eq!(q.read(a[2], 1), [status::OK]);
        assert_eq!(q.read(f[1], 1), [status::OK]);
        assert_eq!(q.read(id[2], 1), [status::OK]);
        assert_eq!(q.read(u[1], 1), [status::UNSUPP]);
        let name = img
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let n = name.len().min(ID_BYTES);
        assert_eq!(q.read(id[1], n), name.as_bytes()[..n]);
        let on_disk = std::fs::read(img.path()).unwrap();
        assert!(on_disk[512..1024].iter().all(|&b| b == 0xab));
        assert!(on_disk[..512].iter().all(|&b| b == 0));
    }

    #[test]
    fn block_read_only_rejects_writes_and_advertises_ro() {
        let mem = default_mem();
        let img = image(4);
        let (mut dev, mut q, _) = setup(&mem, &img, true);
        assert_ne!(dev.avail_features() & (1 << VIRTIO_BLK_F_RO), 0);
        let a = q.add(&[Buf::R(&header(req::OUT, 0)), Buf::R(&[1u8; 512]), Buf::W(1)]);
        dev.process_queue(0);
        assert_eq!(q.read(a[2], 1), [status::IOERR]);
        assert!(std::fs::read(img.path()).unwrap()[..512]
            .iter()
            .all(|&b| b == 0));
    }

    #[test]
    fn block_config_space_holds_the_capacity() {
        let img = image(5);
        let dev = Block::new(img.path(), false).unwrap();
        let mut cap = [0u8; 8];
        dev.read_config(0, &mut cap);
        assert_eq!(u64::from_le_bytes(cap), 5);
        let mut past = [0xffu8; 4];
        dev.read_config(4096, &mut past);
        assert_eq!(past, [0; 4]);
    }
}
