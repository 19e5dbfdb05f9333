//! The block device's request processing, driven through both of its callers: the MMIO device
//! ([`Block::process_queue`]) and the vhost-user backend (`VhostUserBlock::handle_event` on a
//! vring). Every scenario runs once per caller, on a queue built in plain guest memory, and
//! must give the same answers.

#![allow(clippy::unwrap_used)]

use std::fs::File;
use std::io::Write as _;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use vhost_user_backend::{VhostUserBackendMut, VringRwLock, VringT};
use vm_memory::GuestMemoryAtomic;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag};

use super::*;
use crate::vhost_user::block::VhostUserBlock;
use crate::virtio::test_utils::{default_mem, interrupt, Buf, TestQueue};
use crate::virtio::{GuestMemory, Interrupt, VirtioDevice, INT_CONFIG, INT_VRING};

const Q_SIZE: u16 = 16;

/// Who runs the queue.
#[derive(Debug, Clone, Copy)]
enum Caller {
    Mmio,
    VhostUser,
}

const CALLERS: [Caller; 2] = [Caller::Mmio, Caller::VhostUser];

/// A device on one queue, driven the way its caller drives it.
enum Harness {
    Mmio {
        dev: Block,
        irq: Arc<Interrupt>,
    },
    VhostUser {
        backend: VhostUserBlock,
        vring: VringRwLock<GuestMemoryAtomic<GuestMemory>>,
        call: EventConsumer,
    },
}

impl Harness {
    fn new(caller: Caller, mem: &GuestMemory, img: &tempfile::NamedTempFile, ro: bool) -> Self {
        let q = TestQueue::new(mem, 0, Q_SIZE);
        match caller {
            Caller::Mmio => {
                let mut dev = Block::new(img.path(), ro).unwrap();
                let irq = interrupt();
                dev.activate(mem.clone(), irq.clone(), vec![q.queue()])
                    .unwrap();
                Harness::Mmio { dev, irq }
            }
            Caller::VhostUser => {
                // What the vhost-user-backend handler does on SET_MEM_TABLE, SET_VRING_NUM,
                // SET_VRING_ADDR, SET_VRING_CALL and SET_VRING_ENABLE.
                let atomic = GuestMemoryAtomic::new(mem.clone());
                let mut backend = VhostUserBlock::new(img.path(), ro).unwrap();
                backend.update_memory(atomic.clone()).unwrap();
                let vring = VringRwLock::new(atomic, Q_SIZE).unwrap();
                vring.set_queue_size(Q_SIZE);
                vring
                    .set_queue_info(
                        q.mock.desc_table_addr().0,
                        q.mock.avail_addr().0,
                        q.mock.used_addr().0,
                    )
                    .unwrap();
                vring.set_queue_ready(true);
                vring.set_enabled(true);
                let (call, notifier) =
                    new_event_consumer_and_notifier(EventFlag::NONBLOCK).unwrap();
                // SAFETY: into_raw_fd hands over a valid eventfd that nothing else owns, and
                // the File becomes its only owner.
                let call_file = unsafe { File::from_raw_fd(notifier.into_raw_fd()) };
                vring.set_call(Some(call_file));
                Harness::VhostUser {
                    backend,
                    vring,
                    call,
                }
            }
        }
    }

    /// The driver's kick: processes the queue; returns whether the driver was notified.
    fn kick(&mut self) -> bool {
        match self {
            Harness::Mmio { dev, irq } => {
                dev.process_queue(0);
                let raised = irq.irqfd().read().is_ok();
                assert_eq!(raised, irq.status() & INT_VRING != 0);
                irq.ack(INT_VRING);
                raised
            }
            Harness::VhostUser {
                backend,
                vring,
                call,
            } => {
                backend
                    .handle_event(0, EventSet::IN, std::slice::from_ref(vring), 0)
                    .unwrap();
                call.consume().is_ok()
            }
        }
    }

    /// Gives the disk `file`, as the disk control does; the new capacity, or why not.
    fn replace(&mut self, file: File) -> Result<u64, String> {
        match self {
            Harness::Mmio { dev, irq } => {
                let generation = dev.config_generation();
                let sectors = dev.replace_image(file).map_err(|e| e.to_string())?;
                assert_ne!(dev.config_generation(), generation);
                assert!(irq.irqfd().read().is_ok(), "the driver is interrupted");
                assert_ne!(irq.status() & INT_CONFIG, 0, "for a configuration change");
                irq.ack(INT_CONFIG);
                Ok(sectors)
            }
            Harness::VhostUser { backend, .. } => {
                let serial = backend.disk().serial();
                backend.replace_image(&serial, file)
            }
        }
    }

    fn features(&self) -> u64 {
        match self {
            Harness::Mmio { dev, .. } => dev.avail_features(),
            Harness::VhostUser { backend, .. } => backend.features(),
        }
    }

    fn config(&self, offset: u32, len: u32) -> Vec<u8> {
        match self {
            Harness::Mmio { dev, .. } => {
                let mut data = vec![0xffu8; len as usize];
                dev.read_config(u64::from(offset), &mut data);
                data
            }
            Harness::VhostUser { backend, .. } => backend.get_config(offset, len),
        }
    }
}

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

#[test]
fn block_reads_in_range_sectors_and_signals_the_guest() {
    for caller in CALLERS {
        let mem = default_mem();
        let img = image(8);
        let mut dev = Harness::new(caller, &mem, &img, false);
        let mut q = TestQueue::new(&mem, 0, Q_SIZE);
        let a = q.add(&[Buf::R(&header(req::IN, 3)), Buf::W(1024), Buf::W(1)]);
        assert!(dev.kick(), "{caller:?}: the driver is notified");
        assert_eq!(q.used(), Some((0, 1025)), "{caller:?}");
        let data = q.read(a[1], 1024);
        assert!(data[..512].iter().all(|&b| b == 3), "{caller:?}");
        assert!(data[512..].iter().all(|&b| b == 4), "{caller:?}");
        assert_eq!(q.read(a[2], 1), [status::OK], "{caller:?}");
        assert!(!dev.kick(), "{caller:?}: nothing new, no notification");
    }
}

#[test]
fn block_out_of_range_request_is_an_io_error_not_a_panic() {
    for caller in CALLERS {
        let mem = default_mem();
        let img = image(8);
        let mut dev = Harness::new(caller, &mem, &img, false);
        let mut q = TestQueue::new(&mem, 0, Q_SIZE);
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
        dev.kick();
        assert_eq!(q.read(a[2], 1), [status::IOERR], "{caller:?}");
        assert_eq!(q.read(b[2], 1), [status::IOERR], "{caller:?}");
        assert_eq!(q.read(c[2], 1), [status::IOERR], "{caller:?}");
        assert_eq!(q.read(d[1], 1), [status::IOERR], "{caller:?}");
        let used: Vec<_> = std::iter::from_fn(|| q.used()).collect();
        assert_eq!(used.len(), 5, "{caller:?}: every chain is returned");
        assert_eq!(used[4].1, 0, "{caller:?}");
        // Sector 7 was not touched.
        let mut sector = [0u8; 512];
        File::open(img.path())
            .unwrap()
            .read_exact_at(&mut sector, 7 * 512)
            .unwrap();
        assert!(sector.iter().all(|&b| b == 7), "{caller:?}");
    }
}

#[test]
fn block_writes_then_flush_reach_the_image() {
    for caller in CALLERS {
        let mem = default_mem();
        let img = image(4);
        let mut dev = Harness::new(caller, &mem, &img, false);
        let mut q = TestQueue::new(&mem, 0, Q_SIZE);
        let a = q.add(&[
            Buf::R(&header(req::OUT, 1)),
            Buf::R(&[0xab; 512]),
            Buf::W(1),
        ]);
        let f = q.add(&[Buf::R(&header(req::FLUSH, 0)), Buf::W(1)]);
        let id = q.add(&[Buf::R(&header(req::GET_ID, 0)), Buf::W(20), Buf::W(1)]);
        let u = q.add(&[Buf::R(&header(99, 0)), Buf::W(1)]);
        dev.kick();
        assert_eq!(q.read(a[2], 1), [status::OK], "{caller:?}");
        assert_eq!(q.read(f[1], 1), [status::OK], "{caller:?}");
        assert_eq!(q.read(id[2], 1), [status::OK], "{caller:?}");
        assert_eq!(q.read(u[1], 1), [status::UNSUPP], "{caller:?}");
        let name = img
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let n = name.len().min(ID_BYTES);
        assert_eq!(q.read(id[1], n), name.as_bytes()[..n], "{caller:?}");
        let on_disk = std::fs::read(img.path()).unwrap();
        assert!(on_disk[512..1024].iter().all(|&b| b == 0xab), "{caller:?}");
        assert!(on_disk[..512].iter().all(|&b| b == 0), "{caller:?}");
    }
}

#[test]
fn block_read_only_rejects_writes_and_advertises_ro() {
    for caller in CALLERS {
        let mem = default_mem();
        let img = image(4);
        let mut dev = Harness::new(caller, &mem, &img, true);
        let mut q = TestQueue::new(&mem, 0, Q_SIZE);
        assert_ne!(dev.features() & (1 << VIRTIO_BLK_F_RO), 0, "{caller:?}");
        let a = q.add(&[Buf::R(&header(req::OUT, 0)), Buf::R(&[1u8; 512]), Buf::W(1)]);
        let f = q.add(&[Buf::R(&header(req::FLUSH, 0)), Buf::W(1)]);
        dev.kick();
        assert_eq!(q.read(a[2], 1), [status::IOERR], "{caller:?}");
        assert_eq!(q.read(f[1], 1), [status::OK], "{caller:?}");
        assert!(
            std::fs::read(img.path()).unwrap()[..512]
                .iter()
                .all(|&b| b == 0),
            "{caller:?}"
        );
    }
}

#[test]
fn block_offers_the_same_virtio_features_on_both_transports() {
    for ro in [false, true] {
        let mem = default_mem();
        let img = image(4);
        let mmio = Harness::new(Caller::Mmio, &mem, &img, ro).features();
        let vhost = Harness::new(Caller::VhostUser, &mem, &img, ro).features();
        // Bit 30 is vhost-user's own (VHOST_USER_F_PROTOCOL_FEATURES), not the device's.
        assert_eq!(vhost & !(1 << 30), mmio, "read_only={ro}");
        assert_eq!(mmio & (1 << VIRTIO_BLK_F_RO) != 0, ro);
        assert_ne!(mmio & (1 << VIRTIO_BLK_F_FLUSH), 0);
        assert_ne!(mmio & (1 << crate::virtio::VIRTIO_F_VERSION_1), 0);
    }
}

#[test]
fn block_config_space_holds_the_capacity() {
    for caller in CALLERS {
        let mem = default_mem();
        let img = image(5);
        let dev = Harness::new(caller, &mem, &img, false);
        assert_eq!(dev.config(0, 8), 5u64.to_le_bytes(), "{caller:?}");
        // The rest of `struct virtio_blk_config`, and past it, reads as zero.
        assert_eq!(dev.config(8, 52), [0u8; 52], "{caller:?}");
        assert_eq!(dev.config(4096, 4), [0u8; 4], "{caller:?}");
    }
}

#[test]
fn an_empty_read_only_disk_takes_an_image_and_keeps_its_serial() {
    for caller in CALLERS {
        let mem = default_mem();
        let empty = image(0);
        let mut dev = Harness::new(caller, &mem, &empty, true);
        assert_eq!(dev.config(0, 8), 0u64.to_le_bytes(), "{caller:?}");
        let mut q = TestQueue::new(&mem, 0, Q_SIZE);
        let early = q.add(&[Buf::R(&header(req::IN, 0)), Buf::W(512), Buf::W(1)]);
        dev.kick();
        assert_eq!(
            q.read(early[2], 1),
            [status::IOERR],
            "{caller:?}: nothing yet"
        );

        let full = image(3);
        assert_eq!(
            dev.replace(File::open(full.path()).unwrap()),
            Ok(3),
            "{caller:?}"
        );
        assert_eq!(dev.config(0, 8), 3u64.to_le_bytes(), "{caller:?}");
        let read = q.add(&[Buf::R(&header(req::IN, 2)), Buf::W(512), Buf::W(1)]);
        let id = q.add(&[Buf::R(&header(req::GET_ID, 0)), Buf::W(20), Buf::W(1)]);
        let write = q.add(&[Buf::R(&header(req::OUT, 0)), Buf::R(&[9u8; 512]), Buf::W(1)]);
        dev.kick();
        assert_eq!(q.read(read[2], 1), [status::OK], "{caller:?}");
        assert_eq!(q.read(read[1], 512), [2u8; 512], "{caller:?}");
        let serial = empty
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let n = serial.len().min(ID_BYTES);
        assert_eq!(
            q.read(id[1], n),
            serial.as_bytes()[..n],
            "{caller:?}: the serial stays"
        );
        assert_eq!(
            q.read(write[2], 1),
            [status::IOERR],
            "{caller:?}: still read-only"
        );
        assert_eq!(std::fs::read(full.path()).unwrap()[..512], [0u8; 512]);
        // A directory is no image.
        let dir = tempfile::tempdir().unwrap();
        let err = dev.replace(File::open(dir.path()).unwrap()).unwrap_err();
        assert!(err.contains("not a regular file"), "{caller:?}: {err}");
    }
}

#[test]
fn a_writable_disk_keeps_its_image() {
    for caller in CALLERS {
        let mem = default_mem();
        let img = image(2);
        let mut dev = Harness::new(caller, &mem, &img, false);
        let other = image(5);
        let err = dev.replace(File::open(other.path()).unwrap()).unwrap_err();
        assert!(err.contains("writable"), "{caller:?}: {err}");
        assert_eq!(dev.config(0, 8), 2u64.to_le_bytes(), "{caller:?}");
    }
}
