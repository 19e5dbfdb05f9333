//! The virtio-mmio transport (virtio spec 4.2, version 2): one 4 KiB register window per
//! device. The transport decodes the registers, negotiates features, holds the queue
//! configuration until `DRIVER_OK`, then hands the queues to the device.

use std::sync::{Arc, Mutex};

use virtio_queue::{Queue, QueueT};

use super::{status, GuestMemory, Interrupt, VirtioDevice};
use crate::bus::BusDevice;

/// The size of one device's register window.
pub const MMIO_WINDOW_SIZE: u64 = 0x1000;

/// `"virt"` little-endian.
pub const MMIO_MAGIC: u32 = 0x7472_6976;
/// The modern virtio-mmio version.
pub const MMIO_VERSION: u32 = 2;
/// Our vendor id (`"CRUC"`-ish; any value is allowed).
pub const VENDOR_ID: u32 = 0x4352_5543;

/// Register offsets.
pub mod reg {
    #![allow(missing_docs)]
    pub const MAGIC: u64 = 0x000;
    pub const VERSION: u64 = 0x004;
    pub const DEVICE_ID: u64 = 0x008;
    pub const VENDOR_ID: u64 = 0x00c;
    pub const DEVICE_FEATURES: u64 = 0x010;
    pub const DEVICE_FEATURES_SEL: u64 = 0x014;
    pub const DRIVER_FEATURES: u64 = 0x020;
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    pub const QUEUE_SEL: u64 = 0x030;
    pub const QUEUE_NUM_MAX: u64 = 0x034;
    pub const QUEUE_NUM: u64 = 0x038;
    pub const QUEUE_READY: u64 = 0x044;
    pub const QUEUE_NOTIFY: u64 = 0x050;
    pub const INTERRUPT_STATUS: u64 = 0x060;
    pub const INTERRUPT_ACK: u64 = 0x064;
    pub const STATUS: u64 = 0x070;
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    pub const QUEUE_DESC_HIGH: u64 = 0x084;
    pub const QUEUE_AVAIL_LOW: u64 = 0x090;
    pub const QUEUE_AVAIL_HIGH: u64 = 0x094;
    pub const QUEUE_USED_LOW: u64 = 0x0a0;
    pub const QUEUE_USED_HIGH: u64 = 0x0a4;
    pub const CONFIG_GENERATION: u64 = 0x0fc;
    pub const CONFIG: u64 = 0x100;
}

/// One device behind its virtio-mmio register window.
pub struct MmioTransport {
    device: Arc<Mutex<dyn VirtioDevice>>,
    mem: GuestMemory,
    interrupt: Arc<Interrupt>,
    queues: Vec<Queue>,
    device_features_sel: u32,
    driver_features_sel: u32,
    acked_features: u64,
    queue_sel: u32,
    status: u32,
    config_generation: u32,
}

impl std::fmt::Debug for MmioTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmioTransport")
            .field("status", &self.status)
            .field("acked_features", &self.acked_features)
            .finish_non_exhaustive()
    }
}

fn fresh_queues(max_sizes: &[u16]) -> Vec<Queue> {
    max_sizes
        .iter()
        // A max size that is not a power of two is our bug, not the guest's; fall back to 256.
        .map(|&m| Queue::new(m).unwrap_or_else(|_| Queue::new(256).expect("256 is valid")))
        .collect()
}

impl MmioTransport {
    /// A transport for `device`, which raises `interrupt` and accesses `mem`.
    pub fn new(
        device: Arc<Mutex<dyn VirtioDevice>>,
        mem: GuestMemory,
        interrupt: Arc<Interrupt>,
    ) -> Self {
        let queues = fresh_queues(lock(&device).queue_max_sizes());
        MmioTransport {
            device,
            mem,
            interrupt,
            queues,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            queue_sel: 0,
            status: 0,
            config_generation: 0,
        }
    }

    /// The device behind this transport.
    pub fn device(&self) -> &Arc<Mutex<dyn VirtioDevice>> {
        &self.device
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// The features the driver acknowledged.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// Queue registers may change only between `FEATURES_OK` and `DRIVER_OK`.
    fn queue_config_allowed(&self) -> bool {
        self.status & (status::FEATURES_OK | status::DRIVER_OK | status::FAILED)
            == status::FEATURES_OK
    }

    fn update_queue(&mut self, f: impl FnOnce(&mut Queue)) {
        if self.queue_config_allowed() {
            if let Some(q) = self.selected_queue() {
                f(q);
            }
        }
    }

    fn reset(&mut self) {
        let mut dev = lock(&self.device);
        dev.reset();
        self.queues = fresh_queues(dev.queue_max_sizes());
        drop(dev);
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.acked_features = 0;
        self.queue_sel = 0;
        self.status = 0;
        self.interrupt.ack(u32::MAX);
    }

    fn set_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        // Bits may only be added (spec 2.1.1), except by a reset.
        if value & self.status != self.status {
            return;
        }
        let added = value & !self.status;
        if added & status::FEATURES_OK != 0 && self.status & status::DRIVER == 0 {
            return;
        }
        if added & status::DRIVER_OK != 0 {
            if value & status::FEATURES_OK == 0 {
                return;
            }
            self.status = value;
            self.activate();
            return;
        }
        self.status = value;
    }

    fn activate(&mut self) {
        let queues = std::mem::take(&mut self.queues);
        let mut dev = lock(&self.device);
        let result = dev.activate(self.mem.clone(), self.interrupt.clone(), queues);
        self.queues = fresh_queues(dev.queue_max_sizes());
        if result.is_ok() {
            // Let the device look at its queues once: a backend may already hold data.
            if let Some(evt) = dev.queue_events().first() {
                let _ = evt.write(1);
            }
        }
        drop(dev);
        if result.is_err() {
            self.status |= status::DEVICE_NEEDS_RESET;
            // Best effort: the guest learns through the status on its next read.
            let _ = self.interrupt.signal(super::INT_CONFIG);
        }
    }

    fn read_u32(&mut self, offset: u64) -> u32 {
        let dev = lock(&self.device);
        match offset {
            reg::MAGIC => MMIO_MAGIC,
            reg::VERSION => MMIO_VERSION,
            reg::DEVICE_ID => dev.device_type(),
            reg::VENDOR_ID => VENDOR_ID,
            reg::DEVICE_FEATURES => match self.device_features_sel {
                0 => dev.avail_features() as u32,
                1 => (dev.avail_features() >> 32) as u32,
                _ => 0,
            },
            reg::QUEUE_NUM_MAX => dev
                .queue_max_sizes()
                .get(self.queue_sel as usize)
                .map_or(0, |&m| u32::from(m)),
            reg::QUEUE_READY => {
                let active = dev.is_activated();
                drop(dev);
                match self.selected_queue() {
                    Some(q) => u32::from(q.ready() || active),
                    None => 0,
                }
            }
            reg::INTERRUPT_STATUS => self.interrupt.status(),
            reg::STATUS => self.status,
            reg::CONFIG_GENERATION => self.config_generation,
            _ => 0,
        }
    }

    fn write_u32(&mut self, offset: u64, v: u32) {
        match offset {
            reg::DEVICE_FEATURES_SEL => self.device_features_sel = v,
            reg::DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            reg::DRIVER_FEATURES => {
                if self.status & (status::DRIVER | status::FEATURES_OK) != status::DRIVER {
                    return;
                }
                let (shift, mask) = match self.driver_features_sel {
                    0 => (0, 0xffff_ffffu64),
                    1 => (32, 0xffff_ffff_0000_0000u64),
                    _ => return,
                };
                let mut dev = lock(&self.device);
                let offered = dev.avail_features();
                self.acked_features =
                    (self.acked_features & !mask) | ((u64::from(v) << shift) & offered & mask);
                dev.set_acked_features(self.acked_features);
            }
            reg::QUEUE_SEL => self.queue_sel = v,
            reg::QUEUE_NUM => self.update_queue(|q| q.set_size(v as u16)),
            reg::QUEUE_READY => self.update_queue(|q| q.set_ready(v == 1)),
            reg::QUEUE_NOTIFY => {
                let dev = lock(&self.device);
                if let Some(evt) = dev.queue_events().get(v as usize) {
                    let _ = evt.write(1);
                }
            }
            reg::INTERRUPT_ACK => self.interrupt.ack(v),
            reg::STATUS => self.set_status(v),
            reg::QUEUE_DESC_LOW => self.update_queue(|q| q.set_desc_table_address(Some(v), None)),
            reg::QUEUE_DESC_HIGH => self.update_queue(|q| q.set_desc_table_address(None, Some(v))),
            reg::QUEUE_AVAIL_LOW => self.update_queue(|q| q.set_avail_ring_address(Some(v), None)),
            reg::QUEUE_AVAIL_HIGH => self.update_queue(|q| q.set_avail_ring_address(None, Some(v))),
            reg::QUEUE_USED_LOW => self.update_queue(|q| q.set_used_ring_address(Some(v), None)),
            reg::QUEUE_USED_HIGH => self.update_queue(|q| q.set_used_ring_address(None, Some(v))),
            _ => {}
        }
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= reg::CONFIG {
            lock(&self.device).read_config(offset - reg::CONFIG, data);
            return;
        }
        // Registers are 32-bit and aligned; anything else reads as zero.
        let v = if data.len() == 4 && offset.is_multiple_of(4) {
            self.read_u32(offset)
        } else {
            0
        };
        let bytes = v.to_le_bytes();
        let n = data.len().min(4);
        data[..n].copy_from_slice(&bytes[..n]);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= reg::CONFIG {
            lock(&self.device).write_config(offset - reg::CONFIG, data);
            return;
        }
        if let Ok(bytes) = <[u8; 4]>::try_from(data) {
            if offset.is_multiple_of(4) {
                self.write_u32(offset, u32::from_le_bytes(bytes));
            }
        }
    }
}

/// Locks a device, surviving a poisoned lock (a panicked holder cannot leave the register
/// state half-written: every write is a single assignment).
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::virtio::console::Console;
    use crate::virtio::test_utils::{default_mem, interrupt, Buf, TestQueue};
    use crate::virtio::{INT_VRING, VIRTIO_F_VERSION_1};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn r(t: &mut MmioTransport, off: u64) -> u32 {
        let mut b = [0u8; 4];
        t.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    fn w(t: &mut MmioTransport, off: u64, v: u32) {
        t.write(off, &v.to_le_bytes());
    }

    fn console_transport(mem: &GuestMemory) -> (MmioTransport, Sink, Arc<Interrupt>) {
        let sink = Sink::default();
        let dev: Arc<Mutex<dyn VirtioDevice>> =
            Arc::new(Mutex::new(Console::new(Box::new(sink.clone())).unwrap()));
        let irq = interrupt();
        (MmioTransport::new(dev, mem.clone(), irq.clone()), sink, irq)
    }

    fn setup_queue(t: &mut MmioTransport, i: u32, q: &TestQueue<'_>) {
        w(t, reg::QUEUE_SEL, i);
        w(t, reg::QUEUE_NUM, 16);
        let (d, a, u) = (
            q.mock.desc_table_addr().0,
            q.mock.avail_addr().0,
            q.mock.used_addr().0,
        );
        w(t, reg::QUEUE_DESC_LOW, d as u32);
        w(t, reg::QUEUE_DESC_HIGH, (d >> 32) as u32);
        w(t, reg::QUEUE_AVAIL_LOW, a as u32);
        w(t, reg::QUEUE_AVAIL_HIGH, (a >> 32) as u32);
        w(t, reg::QUEUE_USED_LOW, u as u32);
        w(t, reg::QUEUE_USED_HIGH, (u >> 32) as u32);
        w(t, reg::QUEUE_READY, 1);
    }

    #[test]
    fn mmio_identifies_the_device() {
        let mem = default_mem();
        let (mut t, _, _) = console_transport(&mem);
        assert_eq!(r(&mut t, reg::MAGIC), MMIO_MAGIC);
        assert_eq!(r(&mut t, reg::VERSION), 2);
        assert_eq!(r(&mut t, reg::DEVICE_ID), crate::virtio::ids::CONSOLE);
        assert_eq!(r(&mut t, reg::VENDOR_ID), VENDOR_ID);
        w(&mut t, reg::QUEUE_SEL, 1);
        assert_eq!(r(&mut t, reg::QUEUE_NUM_MAX), 256);
        w(&mut t, reg::QUEUE_SEL, 2);
        assert_eq!(r(&mut t, reg::QUEUE_NUM_MAX), 0, "no such queue");
        // Misaligned or narrow register reads are zero, never a panic.
        let mut b = [0xffu8; 2];
        t.read(reg::MAGIC + 1, &mut b);
        assert_eq!(b, [0, 0]);
        t.write(reg::STATUS, &[1, 2, 3]);
        assert_eq!(t.status(), 0);
    }

    #[test]
    fn mmio_feature_negotiation_keeps_only_offered_bits_and_needs_driver_status() {
        let mem = default_mem();
        let (mut t, _, _) = console_transport(&mem);
        w(&mut t, reg::DEVICE_FEATURES_SEL, 1);
        assert_eq!(
            r(&mut t, reg::DEVICE_FEATURES),
            1 << (VIRTIO_F_VERSION_1 - 32)
        );
        // Before DRIVER, feature writes are ignored.
        w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
        w(&mut t, reg::DRIVER_FEATURES, u32::MAX);
        assert_eq!(t.acked_features(), 0);
        w(&mut t, reg::STATUS, status::ACKNOWLEDGE);
        w(&mut t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        w(&mut t, reg::DRIVER_FEATURES, u32::MAX);
        w(&mut t, reg::DRIVER_FEATURES_SEL, 0);
        w(&mut t, reg::DRIVER_FEATURES, u32::MAX);
        assert_eq!(t.acked_features(), 1 << VIRTIO_F_VERSION_1);
        let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        w(&mut t, reg::STATUS, s);
        assert_eq!(r(&mut t, reg::STATUS), s);
        // After FEATURES_OK the features are frozen.
        w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
        w(&mut t, reg::DRIVER_FEATURES, 0);
        assert_eq!(t.acked_features(), 1 << VIRTIO_F_VERSION_1);
        // Status bits cannot be cleared except by a reset.
        w(&mut t, reg::STATUS, status::ACKNOWLEDGE);
        assert_eq!(r(&mut t, reg::STATUS), s);
    }

    #[test]
    fn mmio_queue_setup_activation_notify_and_reset() {
        let mem = default_mem();
        let (mut t, sink, irq) = console_transport(&mem);
        let rxq = TestQueue::new(&mem, 0, 16);
        let mut txq = TestQueue::new(&mem, 1, 16);
        // Queue registers before FEATURES_OK are ignored.
        w(&mut t, reg::QUEUE_SEL, 0);
        w(&mut t, reg::QUEUE_READY, 1);
        assert_eq!(r(&mut t, reg::QUEUE_READY), 0);
        let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        w(&mut t, reg::STATUS, status::ACKNOWLEDGE);
        w(&mut t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        w(&mut t, reg::STATUS, s);
        setup_queue(&mut t, 0, &rxq);
        setup_queue(&mut t, 1, &txq);
        assert_eq!(r(&mut t, reg::QUEUE_READY), 1);
        w(&mut t, reg::STATUS, s | status::DRIVER_OK);
        assert_eq!(r(&mut t, reg::STATUS), s | status::DRIVER_OK);
        assert!(lock(t.device()).is_activated());

        // The guest prints through the transmit queue; a notify write reaches the queue event.
        txq.add(&[Buf::R(b"hello hvc0\n")]);
        w(&mut t, reg::QUEUE_NOTIFY, 1);
        let dev = t.device().clone();
        assert_eq!(lock(&dev).queue_events()[1].read().unwrap(), 1);
        lock(&dev).process_queue(1);
        assert_eq!(sink.0.lock().unwrap().as_slice(), b"hello hvc0\n");
        assert_eq!(txq.used(), Some((0, 0)));
        assert_eq!(r(&mut t, reg::INTERRUPT_STATUS), INT_VRING);
        w(&mut t, reg::INTERRUPT_ACK, INT_VRING);
        assert_eq!(irq.status(), 0);

        // Reset: status 0, device stopped, queues back to unset.
        w(&mut t, reg::STATUS, 0);
        assert_eq!(r(&mut t, reg::STATUS), 0);
        assert!(!lock(&dev).is_activated());
        assert_eq!(r(&mut t, reg::QUEUE_READY), 0);
        assert_eq!(t.acked_features(), 0);
    }

    #[test]
    fn mmio_driver_ok_with_invalid_queues_sets_needs_reset() {
        let mem = default_mem();
        let (mut t, _, _) = console_transport(&mem);
        let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        w(&mut t, reg::STATUS, status::ACKNOWLEDGE);
        w(&mut t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        w(&mut t, reg::STATUS, s);
        // Queue 0 points outside guest memory.
        w(&mut t, reg::QUEUE_SEL, 0);
        w(&mut t, reg::QUEUE_NUM, 16);
        w(&mut t, reg::QUEUE_DESC_HIGH, 0x10);
        w(&mut t, reg::QUEUE_READY, 1);
        w(&mut t, reg::STATUS, s | status::DRIVER_OK);
        assert_ne!(r(&mut t, reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
        assert!(!lock(t.device()).is_activated());
    }
}
