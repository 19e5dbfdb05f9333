//! The virtio-mmio transport (virtio spec 4.2, version 2): one 4 KiB register window per
//! device. The transport decodes the registers, negotiates features, holds the queue
//! configuration until `DRIVER_OK`, then hands the queues to the device. The device status
//! follows the table in [`super::device_status`]; every driver protocol violation is counted in
//! the transport's [`TransportMetrics`] and logged, never silently dropped.

use std::sync::{Arc, Mutex};

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;

use super::device_status::{self, StatusWrite};
use super::transport_metrics::{TransportMetrics, Violation};
use super::{status, GuestMemory, Interrupt, VirtioDevice, INT_CONFIG, INT_VRING};
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
    metrics: Arc<TransportMetrics>,
}

impl std::fmt::Debug for MmioTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmioTransport")
            .field("label", &self.metrics.label())
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

/// `addr` with its low 32 bits replaced by `v`.
fn with_low(addr: u64, v: u32) -> GuestAddress {
    GuestAddress((addr & !0xffff_ffff) | u64::from(v))
}

/// `addr` with its high 32 bits replaced by `v`.
fn with_high(addr: u64, v: u32) -> GuestAddress {
    GuestAddress((addr & 0xffff_ffff) | (u64::from(v) << 32))
}

/// One write to a queue register: the register's name, for the log, and what it does to the
/// selected queue (an error says why it could not apply).
type QueueUpdate = fn(&mut Queue, &GuestMemory, u32) -> Result<(), String>;

fn queue_update(offset: u64) -> Option<(&'static str, QueueUpdate)> {
    Some(match offset {
        reg::QUEUE_NUM => ("QueueNum", |q, _, v| {
            let size = u16::try_from(v).map_err(|_| "larger than 65535".to_string())?;
            q.try_set_size(size)
                .map_err(|_| format!("not a power of two up to the maximum {}", q.max_size()))
        }),
        reg::QUEUE_READY => ("QueueReady", |q, mem, v| {
            if v > 1 {
                return Err("QueueReady takes 0 or 1".into());
            }
            q.set_ready(v == 1);
            if v == 1 && !q.is_valid(mem) {
                return Err("the rings do not fit in guest memory".into());
            }
            Ok(())
        }),
        reg::QUEUE_DESC_LOW => ("QueueDescLow", |q, _, v| {
            q.try_set_desc_table_address(with_low(q.desc_table(), v))
                .map_err(|e| e.to_string())
        }),
        reg::QUEUE_DESC_HIGH => ("QueueDescHigh", |q, _, v| {
            q.try_set_desc_table_address(with_high(q.desc_table(), v))
                .map_err(|e| e.to_string())
        }),
        reg::QUEUE_AVAIL_LOW => ("QueueAvailLow", |q, _, v| {
            q.try_set_avail_ring_address(with_low(q.avail_ring(), v))
                .map_err(|e| e.to_string())
        }),
        reg::QUEUE_AVAIL_HIGH => ("QueueAvailHigh", |q, _, v| {
            q.try_set_avail_ring_address(with_high(q.avail_ring(), v))
                .map_err(|e| e.to_string())
        }),
        reg::QUEUE_USED_LOW => ("QueueUsedLow", |q, _, v| {
            q.try_set_used_ring_address(with_low(q.used_ring(), v))
                .map_err(|e| e.to_string())
        }),
        reg::QUEUE_USED_HIGH => ("QueueUsedHigh", |q, _, v| {
            q.try_set_used_ring_address(with_high(q.used_ring(), v))
                .map_err(|e| e.to_string())
        }),
        _ => return None,
    })
}

impl MmioTransport {
    /// A transport for `device`, which raises `interrupt` and accesses `mem`; `label` names it
    /// in logs and metrics (`virtio-block@0xd0001000`).
    pub fn new(
        label: impl Into<String>,
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
            metrics: Arc::new(TransportMetrics::new(label)),
        }
    }

    /// The device behind this transport.
    pub fn device(&self) -> &Arc<Mutex<dyn VirtioDevice>> {
        &self.device
    }

    /// The driver's protocol violations on this transport.
    pub fn metrics(&self) -> &Arc<TransportMetrics> {
        &self.metrics
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// The features the driver acknowledged.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    fn write_queue(&mut self, name: &str, v: u32, update: QueueUpdate) {
        // Linux disables its queues after resetting the device (`vm_del_vq`): a QueueReady of 0
        // in the reset state changes nothing and is no violation.
        if !device_status::queues_writable(self.status) {
            if !(self.status == 0 && name == "QueueReady" && v == 0) {
                self.metrics.record(
                    Violation::QueueWriteOutOfPhase,
                    format_args!("{name} = {v:#x} with status {:#x}", self.status),
                );
            }
            return;
        }
        let sel = self.queue_sel;
        let count = self.queues.len();
        let Some(q) = self.queues.get_mut(sel as usize) else {
            self.metrics.record(
                Violation::BadQueueConfig,
                format_args!("{name} = {v:#x} for queue {sel}, but the device has {count}"),
            );
            return;
        };
        if let Err(why) = update(q, &self.mem, v) {
            self.metrics.record(
                Violation::BadQueueConfig,
                format_args!("{name} = {v:#x} for queue {sel}: {why}"),
            );
        }
    }

    fn write_driver_features(&mut self, v: u32) {
        let sel = self.driver_features_sel;
        if !device_status::features_writable(self.status) {
            self.metrics.record(
                Violation::FeatureWriteOutOfPhase,
                format_args!(
                    "DriverFeatures[{sel}] = {v:#x} with status {:#x}",
                    self.status
                ),
            );
            return;
        }
        let shift = match sel {
            0 => 0,
            1 => 32,
            _ => {
                if v != 0 {
                    self.metrics.record(
                        Violation::UnofferedFeatures,
                        format_args!("DriverFeatures[{sel}] = {v:#x}: no feature is above bit 63"),
                    );
                }
                return;
            }
        };
        let mut dev = lock(&self.device);
        let offered = (dev.avail_features() >> shift) as u32;
        if v & !offered != 0 {
            self.metrics.record(
                Violation::UnofferedFeatures,
                format_args!("DriverFeatures[{sel}] = {v:#x}, but the device offers {offered:#x}"),
            );
        }
        let mask = 0xffff_ffffu64 << shift;
        self.acked_features = (self.acked_features & !mask) | (u64::from(v & offered) << shift);
        dev.set_acked_features(self.acked_features);
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
        match device_status::on_write(self.status, value) {
            StatusWrite::Reset => self.reset(),
            StatusWrite::Fail => self.status |= status::FAILED,
            StatusWrite::Step { to, activate } => {
                self.status = to;
                if activate {
                    self.activate();
                }
            }
            StatusWrite::Invalid => self.metrics.record(
                Violation::InvalidStatusTransition,
                format_args!("status {:#x} -> {value:#x}", self.status),
            ),
        }
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
        if let Err(e) = result {
            self.status |= status::DEVICE_NEEDS_RESET;
            self.metrics.record_activation_failure(&e);
            // Best effort: the guest learns through the status on its next read.
            let _ = self.interrupt.signal(INT_CONFIG);
        }
    }

    /// The register at `offset`, or `None` where no readable register is.
    fn read_u32(&mut self, offset: u64) -> Option<u32> {
        let dev = lock(&self.device);
        Some(match offset {
            reg::MAGIC => MMIO_MAGIC,
            reg::VERSION => MMIO_VERSION,
            reg::DEVICE_ID => dev.device_type(),
            reg::VENDOR_ID => VENDOR_ID,
            reg::DEVICE_FEATURES => match self.device_features_sel {
                0 => dev.avail_features() as u32,
                1 => (dev.avail_features() >> 32) as u32,
                _ => 0,
            },
            // 0 for a queue that does not exist: that is how the driver counts them.
            reg::QUEUE_NUM_MAX => dev
                .queue_max_sizes()
                .get(self.queue_sel as usize)
                .map_or(0, |&m| u32::from(m)),
            reg::QUEUE_READY => {
                let active = dev.is_activated();
                drop(dev);
                self.queues
                    .get(self.queue_sel as usize)
                    .map_or(0, |q| u32::from(q.ready() || active))
            }
            reg::INTERRUPT_STATUS => self.interrupt.status(),
            reg::STATUS => self.status,
            reg::CONFIG_GENERATION => self.config_generation.wrapping_add(dev.config_generation()),
            _ => return None,
        })
    }

    /// Writes the register at `offset`; `false` where no writable register is.
    fn write_u32(&mut self, offset: u64, v: u32) -> bool {
        if let Some((name, update)) = queue_update(offset) {
            self.write_queue(name, v, update);
            return true;
        }
        match offset {
            reg::DEVICE_FEATURES_SEL => self.device_features_sel = v,
            reg::DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            reg::DRIVER_FEATURES => self.write_driver_features(v),
            reg::QUEUE_SEL => self.queue_sel = v,
            reg::QUEUE_NOTIFY => {
                let dev = lock(&self.device);
                let events = dev.queue_events();
                match events.get(v as usize) {
                    Some(evt) => {
                        let _ = evt.write(1);
                    }
                    None => self.metrics.record(
                        Violation::BadNotify,
                        format_args!(
                            "QueueNotify of queue {v}, but the device has {}",
                            events.len()
                        ),
                    ),
                }
            }
            reg::INTERRUPT_ACK => {
                let defined = INT_VRING | INT_CONFIG;
                if v & !defined != 0 {
                    self.metrics.record(
                        Violation::BadRegisterAccess,
                        format_args!("InterruptACK = {v:#x}: only bits {defined:#x} are defined"),
                    );
                }
                self.interrupt.ack(v & defined);
            }
            reg::STATUS => self.set_status(v),
            _ => return false,
        }
        true
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let ok = self.status & (status::DRIVER | status::FAILED | status::DEVICE_NEEDS_RESET)
            == status::DRIVER;
        if !ok {
            self.metrics.record(
                Violation::ConfigWriteOutOfPhase,
                format_args!(
                    "{}-byte config write at {offset:#x} with status {:#x}",
                    data.len(),
                    self.status
                ),
            );
            return;
        }
        lock(&self.device).write_config(offset, data);
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
            None
        };
        let v = v.unwrap_or_else(|| {
            self.metrics.record(
                Violation::BadRegisterAccess,
                format_args!("{}-byte read at {offset:#x}", data.len()),
            );
            0
        });
        let bytes = v.to_le_bytes();
        let n = data.len().min(4);
        data.fill(0);
        data[..n].copy_from_slice(&bytes[..n]);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= reg::CONFIG {
            self.write_config(offset - reg::CONFIG, data);
            return;
        }
        let written = match <[u8; 4]>::try_from(data) {
            Ok(bytes) if offset.is_multiple_of(4) => {
                self.write_u32(offset, u32::from_le_bytes(bytes))
            }
            _ => false,
        };
        if !written {
            self.metrics.record(
                Violation::BadRegisterAccess,
                format_args!(
                    "{}-byte write at {offset:#x}, which is not a writable register",
                    data.len()
                ),
            );
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
    use crate::virtio::status::FEATURES_OK;
    use crate::virtio::status::{ACKNOWLEDGE, DEVICE_NEEDS_RESET, DRIVER, DRIVER_OK, FAILED};
    use crate::virtio::test_utils::{default_mem, interrupt, Buf, Sink, TestQueue};
    use crate::virtio::transport_metrics::LOG_LIMIT;
    use crate::virtio::VIRTIO_F_VERSION_1;

    const AD: u32 = ACKNOWLEDGE | DRIVER;
    const ADF: u32 = ACKNOWLEDGE | DRIVER | FEATURES_OK;
    const LIVE: u32 = ADF | DRIVER_OK;

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
        let t = MmioTransport::new("virtio-console@test", dev, mem.clone(), irq.clone());
        (t, sink, irq)
    }

    /// The violations of `kind` so far.
    fn count(t: &MmioTransport, kind: Violation) -> u64 {
        t.metrics().count(kind)
    }

    /// Walks the status to `FEATURES_OK` one step at a time.
    fn negotiate(t: &mut MmioTransport) {
        for s in [ACKNOWLEDGE, AD, ADF] {
            w(t, reg::STATUS, s);
        }
        assert_eq!(t.status(), ADF);
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

    /// A console transport brought up by the book, its queues in `mem`.
    fn live_console(mem: &GuestMemory) -> (MmioTransport, Sink, Arc<Interrupt>) {
        let (mut t, sink, irq) = console_transport(mem);
        negotiate(&mut t);
        setup_queue(&mut t, 0, &TestQueue::new(mem, 0, 16));
        setup_queue(&mut t, 1, &TestQueue::new(mem, 1, 16));
        w(&mut t, reg::STATUS, LIVE);
        assert!(lock(t.device()).is_activated());
        (t, sink, irq)
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
        // Probing for the number of queues is how a driver works: not a violation.
        assert_eq!(t.metrics().violations(), 0);
    }

    #[test]
    fn mmio_misaligned_odd_sized_unknown_and_read_only_accesses_are_counted_never_a_panic() {
        let mem = default_mem();
        let (mut t, _, _) = console_transport(&mem);
        let mut b = [0xffu8; 2];
        t.read(reg::MAGIC + 1, &mut b);
        assert_eq!(b, [0, 0]);
        let mut b = [0xffu8; 8];
        t.read(reg::CONFIG_GENERATION, &mut b);
        assert_eq!(b, [0; 8], "an 8-byte access to a 32-bit register");
        t.write(reg::STATUS, &[1, 2, 3]);
        t.write(reg::STATUS + 2, &ACKNOWLEDGE.to_le_bytes());
        assert_eq!(t.status(), 0);
        w(&mut t, reg::MAGIC, 0);
        w(&mut t, reg::INTERRUPT_STATUS, u32::MAX);
        w(&mut t, 0x0c0, 1); // past the last register (QueueReset, which we do not offer)
        assert_eq!(r(&mut t, reg::QUEUE_SEL), 0, "QueueSel is write-only");
        assert_eq!(r(&mut t, reg::MAGIC), MMIO_MAGIC);
        assert_eq!(count(&t, Violation::BadRegisterAccess), 8);
        assert_eq!(t.metrics().violations(), 8);
    }

    #[test]
    fn mmio_status_follows_the_table_one_step_at_a_time_and_activates_at_driver_ok() {
        let mem = default_mem();
        let (mut t, _, _) = console_transport(&mem);
        for s in [ACKNOWLEDGE, AD, ADF] {
            w(&mut t, reg::STATUS, s);
            assert_eq!(r(&mut t, reg::STATUS), s);
            assert!(!lock(t.device()).is_activated());
        }
        setup_queue(&mut t, 0, &TestQueue::new(&mem, 0, 16));
        setup_queue(&mut t, 1, &TestQueue::new(&mem, 1, 16));
        w(&mut t, reg::STATUS, LIVE);
        assert_eq!(r(&mut t, reg::STATUS), LIVE);
        assert!(lock(t.device()).is_activated());
        assert_eq!(t.metrics().violations(), 0);
        assert_eq!(t.metrics().activation_failures(), 0);
    }

    #[test]
    fn mmio_invalid_status_writes_are_counted_and_leave_the_status_unchanged() {
        let mem = default_mem();
        let (mut t, _, _) = console_transport(&mem);
        // Two steps at once from reset.
        w(&mut t, reg::STATUS, AD);
        assert_eq!(t.status(), 0);
        w(&mut t, reg::STATUS, ACKNOWLEDGE);
        // FEATURES_OK before DRIVER, a repeated step.
        w(&mut t, reg::STATUS, ACKNOWLEDGE | FEATURES_OK);
        w(&mut t, reg::STATUS, ACKNOWLEDGE);
        assert_eq!(t.status(), ACKNOWLEDGE);
        w(&mut t, reg::STATUS, AD);
        // DRIVER_OK before FEATURES_OK: no activation.
        w(&mut t, reg::STATUS, AD | DRIVER_OK);
        assert_eq!(t.status(), AD);
        assert!(!lock(t.device()).is_activated());
        w(&mut t, reg::STATUS, ADF);
        // Clearing a bit.
        w(&mut t, reg::STATUS, ACKNOWLEDGE);
        assert_eq!(t.status(), ADF);
        assert_eq!(count(&t, Violation::InvalidStatusTransition), 5);
        assert_eq!(t.metrics().violations(), 5);
    }

    #[test]
    fn mmio_failed_is_added_from_any_step_and_blocks_further_configuration_until_reset() {
        let mem = default_mem();
        let (mut t, _, _) = console_transport(&mem);
        w(&mut t, reg::STATUS, ACKNOWLEDGE);
        w(&mut t, reg::STATUS, AD);
        w(&mut t, reg::STATUS, AD | FAILED);
        assert_eq!(t.status(), AD | FAILED);
        // Negotiation and the next steps are closed now.
        w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
        w(&mut t, reg::DRIVER_FEATURES, 1);
        assert_eq!(t.acked_features(), 0);
        w(&mut t, reg::STATUS, ADF);
        assert_eq!(t.status(), AD | FAILED);
        assert_eq!(count(&t, Violation::FeatureWriteOutOfPhase), 1);
        assert_eq!(count(&t, Violation::InvalidStatusTransition), 1);
        // FAILED is not a violation, and a reset starts over.
        w(&mut t, reg::STATUS, 0);
        assert_eq!(t.status(), 0);
        negotiate(&mut t);
        assert_eq!(t.metrics().violations(), 2);
    }

    #[test]
    fn mmio_feature_negotiation_keeps_only_offered_bits_and_counts_the_rest() {
        let mem = default_mem();
        let (mut t, _, _) = console_transport(&mem);
        w(&mut t, reg::DEVICE_FEATURES_SEL, 1);
        assert_eq!(
            r(&mut t, reg::DEVICE_FEATURES),
            1 << (VIRTIO_F_VERSION_1 - 32)
        );
        w(&mut t, reg::DEVICE_FEATURES_SEL, 2);
        assert_eq!(r(&mut t, reg::DEVICE_FEATURES), 0);
        // Before DRIVER, feature writes are ignored.
        w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
        w(&mut t, reg::DRIVER_FEATURES, u32::MAX);
        assert_eq!(t.acked_features(), 0);
        assert_eq!(count(&t, Violation::FeatureWriteOutOfPhase), 1);
        w(&mut t, reg::STATUS, ACKNOWLEDGE);
        w(&mut t, reg::STATUS, AD);
        // Unoffered bits are dropped and counted; the offered one is kept.
        w(&mut t, reg::DRIVER_FEATURES, u32::MAX);
        w(&mut t, reg::DRIVER_FEATURES_SEL, 0);
        w(&mut t, reg::DRIVER_FEATURES, 1 << 3);
        w(&mut t, reg::DRIVER_FEATURES_SEL, 2);
        w(&mut t, reg::DRIVER_FEATURES, 1);
        w(&mut t, reg::DRIVER_FEATURES, 0);
        assert_eq!(t.acked_features(), 1 << VIRTIO_F_VERSION_1);
        assert_eq!(count(&t, Violation::UnofferedFeatures), 3);
        // Acknowledging exactly what is offered is no violation.
        w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
        w(&mut t, reg::DRIVER_FEATURES, 1 << (VIRTIO_F_VERSION_1 - 32));
        assert_eq!(count(&t, Violation::UnofferedFeatures), 3);
        w(&mut t, reg::STATUS, ADF);
        // After FEATURES_OK the features are frozen.
        w(&mut t, reg::DRIVER_FEATURES, 0);
        assert_eq!(t.acked_features(), 1 << VIRTIO_F_VERSION_1);
        assert_eq!(count(&t, Violation::FeatureWriteOutOfPhase), 2);
        assert_eq!(t.metrics().violations(), 5);
    }

    #[test]
    fn mmio_queue_setup_activation_notify_and_reset() {
        let mem = default_mem();
        let (mut t, sink, irq) = console_transport(&mem);
        let rxq = TestQueue::new(&mem, 0, 16);
        let mut txq = TestQueue::new(&mem, 1, 16);
        // Queue registers before FEATURES_OK are ignored, and counted.
        w(&mut t, reg::QUEUE_SEL, 0);
        w(&mut t, reg::QUEUE_READY, 1);
        assert_eq!(r(&mut t, reg::QUEUE_READY), 0);
        assert_eq!(count(&t, Violation::QueueWriteOutOfPhase), 1);
        negotiate(&mut t);
        setup_queue(&mut t, 0, &rxq);
        setup_queue(&mut t, 1, &txq);
        assert_eq!(r(&mut t, reg::QUEUE_READY), 1);
        w(&mut t, reg::STATUS, LIVE);
        assert_eq!(r(&mut t, reg::STATUS), LIVE);
        assert!(lock(t.device()).is_activated());

        // The guest prints through the transmit queue; a notify write reaches the queue event.
        txq.add(&[Buf::R(b"hello hvc0\n")]);
        w(&mut t, reg::QUEUE_NOTIFY, 1);
        let dev = t.device().clone();
        assert_eq!(lock(&dev).queue_events()[1].read().unwrap(), 1);
        lock(&dev).process_queue(1);
        assert_eq!(sink.contents(), b"hello hvc0\n");
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
        assert_eq!(t.metrics().violations(), 1);
    }

    #[test]
    fn mmio_queue_writes_after_driver_ok_are_counted_and_never_reach_the_live_queues() {
        let mem = default_mem();
        let (mut t, sink, _) = live_console(&mem);
        // A hostile driver repoints the live transmit queue at other memory.
        w(&mut t, reg::QUEUE_SEL, 1);
        w(&mut t, reg::QUEUE_DESC_LOW, 0x40_0000);
        w(&mut t, reg::QUEUE_NUM, 2);
        w(&mut t, reg::QUEUE_READY, 0);
        assert_eq!(count(&t, Violation::QueueWriteOutOfPhase), 3);
        assert_eq!(
            r(&mut t, reg::QUEUE_READY),
            1,
            "the live queue is untouched"
        );
        // The device still serves the rings it was activated with.
        let mut txq = TestQueue::new(&mem, 1, 16);
        txq.add(&[Buf::R(b"still here")]);
        lock(t.device()).process_queue(1);
        assert_eq!(sink.contents(), b"still here");
        assert_eq!(txq.used(), Some((0, 0)));
    }

    #[test]
    fn mmio_queue_ready_zero_after_a_reset_is_not_a_violation() {
        // Linux's vm_del_vq writes QueueReady = 0 after it has reset the device.
        let mem = default_mem();
        let (mut t, _, _) = live_console(&mem);
        w(&mut t, reg::STATUS, 0);
        for q in 0..2 {
            w(&mut t, reg::QUEUE_SEL, q);
            w(&mut t, reg::QUEUE_READY, 0);
            assert_eq!(r(&mut t, reg::QUEUE_READY), 0);
        }
        assert_eq!(t.metrics().violations(), 0);
    }

    #[test]
    fn mmio_queue_config_that_cannot_apply_is_counted_and_changes_nothing() {
        let mem = default_mem();
        let (mut t, _, _) = console_transport(&mem);
        negotiate(&mut t);
        // No such queue.
        w(&mut t, reg::QUEUE_SEL, 7);
        w(&mut t, reg::QUEUE_NUM, 16);
        w(&mut t, reg::QUEUE_READY, 1);
        assert_eq!(r(&mut t, reg::QUEUE_READY), 0);
        w(&mut t, reg::QUEUE_SEL, 0);
        // Sizes: not a power of two, above the maximum, zero, beyond 16 bits.
        for size in [3, 512, 0, 0x1_0000] {
            w(&mut t, reg::QUEUE_NUM, size);
        }
        assert_eq!(t.queues[0].size(), 256, "the size is unchanged");
        // Misaligned rings: descriptors on 16 bytes, avail on 2, used on 4.
        w(&mut t, reg::QUEUE_DESC_LOW, 0x1_0008);
        w(&mut t, reg::QUEUE_AVAIL_LOW, 0x1_0001);
        w(&mut t, reg::QUEUE_USED_LOW, 0x1_0002);
        assert_eq!(t.queues[0].desc_table(), 0);
        w(&mut t, reg::QUEUE_READY, 2);
        assert_eq!(count(&t, Violation::BadQueueConfig), 10);
        assert_eq!(t.metrics().violations(), 10);
        // The well-formed setup still works afterwards.
        setup_queue(&mut t, 0, &TestQueue::new(&mem, 0, 16));
        setup_queue(&mut t, 1, &TestQueue::new(&mem, 1, 16));
        w(&mut t, reg::STATUS, LIVE);
        assert!(lock(t.device()).is_activated());
        assert_eq!(count(&t, Violation::BadQueueConfig), 10);
    }

    #[test]
    fn mmio_queue_ready_with_rings_outside_guest_memory_is_counted_and_driver_ok_needs_reset() {
        let mem = default_mem();
        for (low, high) in [
            (reg::QUEUE_DESC_LOW, reg::QUEUE_DESC_HIGH),
            (reg::QUEUE_AVAIL_LOW, reg::QUEUE_AVAIL_HIGH),
            (reg::QUEUE_USED_LOW, reg::QUEUE_USED_HIGH),
        ] {
            let (mut t, _, irq) = console_transport(&mem);
            negotiate(&mut t);
            setup_queue(&mut t, 1, &TestQueue::new(&mem, 1, 16));
            w(&mut t, reg::QUEUE_SEL, 0);
            w(&mut t, reg::QUEUE_NUM, 16);
            // One ring 64 GiB up, or straddling the end of the 32 MiB of RAM; the others fine.
            let q = TestQueue::new(&mem, 0, 16);
            for (l, h, a) in [
                (
                    reg::QUEUE_DESC_LOW,
                    reg::QUEUE_DESC_HIGH,
                    q.mock.desc_table_addr().0,
                ),
                (
                    reg::QUEUE_AVAIL_LOW,
                    reg::QUEUE_AVAIL_HIGH,
                    q.mock.avail_addr().0,
                ),
                (
                    reg::QUEUE_USED_LOW,
                    reg::QUEUE_USED_HIGH,
                    q.mock.used_addr().0,
                ),
            ] {
                w(&mut t, l, a as u32);
                w(&mut t, h, 0);
            }
            if low == reg::QUEUE_USED_LOW {
                w(&mut t, low, (32 << 20) - 16);
            } else {
                w(&mut t, high, 0x10);
            }
            w(&mut t, reg::QUEUE_READY, 1);
            assert_eq!(count(&t, Violation::BadQueueConfig), 1, "at {low:#x}");
            w(&mut t, reg::STATUS, LIVE);
            assert_eq!(t.status(), LIVE | DEVICE_NEEDS_RESET);
            assert!(!lock(t.device()).is_activated());
            assert_eq!(t.metrics().activation_failures(), 1);
            assert_ne!(irq.status() & INT_CONFIG, 0, "the driver is told");
            // Nothing moves on from there but a reset (or FAILED).
            w(&mut t, reg::STATUS, LIVE);
            assert_eq!(count(&t, Violation::InvalidStatusTransition), 1);
            w(&mut t, reg::STATUS, 0);
            assert_eq!(t.status(), 0);
        }
    }

    #[test]
    fn mmio_notify_of_a_queue_that_does_not_exist_is_counted() {
        let mem = default_mem();
        let (mut t, _, _) = live_console(&mem);
        w(&mut t, reg::QUEUE_NOTIFY, 2);
        w(&mut t, reg::QUEUE_NOTIFY, u32::MAX);
        assert_eq!(count(&t, Violation::BadNotify), 2);
        let dev = t.device().clone();
        for evt in lock(&dev).queue_events() {
            // Only the activation's initial kick on queue 0, nothing from the bad notifies.
            let _ = evt.read();
        }
        w(&mut t, reg::QUEUE_NOTIFY, 1);
        assert_eq!(lock(&dev).queue_events()[1].read().unwrap(), 1);
        assert_eq!(t.metrics().violations(), 2);
    }

    #[test]
    fn mmio_interrupt_ack_clears_only_the_acknowledged_bits_and_counts_undefined_ones() {
        let mem = default_mem();
        let (mut t, _, irq) = console_transport(&mem);
        irq.signal(INT_VRING | INT_CONFIG).unwrap();
        assert_eq!(r(&mut t, reg::INTERRUPT_STATUS), INT_VRING | INT_CONFIG);
        w(&mut t, reg::INTERRUPT_ACK, INT_CONFIG);
        assert_eq!(r(&mut t, reg::INTERRUPT_STATUS), INT_VRING);
        assert_eq!(t.metrics().violations(), 0);
        w(&mut t, reg::INTERRUPT_ACK, 0xf0 | INT_VRING);
        assert_eq!(r(&mut t, reg::INTERRUPT_STATUS), 0);
        assert_eq!(count(&t, Violation::BadRegisterAccess), 1);
        // The irqfd was raised once per signal; acknowledging does not raise it.
        assert_eq!(irq.irqfd().read().unwrap(), 1);
    }

    #[test]
    fn mmio_config_reads_beyond_the_config_space_are_zero_whatever_the_width() {
        let mem = default_mem();
        let (mut t, _, _) = console_transport(&mem);
        // The console's config space is 12 bytes, all zero: reads past it are zero too, never
        // stale bytes or a panic, up to the last byte of the window.
        for (off, len) in [
            (0x100, 4),
            (0x10a, 4),
            (0x10c, 8),
            (0x800, 2),
            (0xfff, 1),
            (0xff8, 8),
        ] {
            let mut b = vec![0xa5u8; len];
            t.read(off, &mut b);
            assert!(b.iter().all(|&x| x == 0), "{len} bytes at {off:#x}: {b:?}");
        }
        assert_eq!(t.metrics().violations(), 0);
    }

    #[test]
    fn mmio_config_writes_are_taken_only_once_the_driver_is_there() {
        let mem = default_mem();
        let (mut t, _, _) = console_transport(&mem);
        t.write(0x100, &[1, 0]);
        w(&mut t, reg::STATUS, ACKNOWLEDGE);
        t.write(0x100, &[1, 0]);
        assert_eq!(count(&t, Violation::ConfigWriteOutOfPhase), 2);
        w(&mut t, reg::STATUS, AD);
        t.write(0x100, &[1, 0]);
        assert_eq!(count(&t, Violation::ConfigWriteOutOfPhase), 2);
        w(&mut t, reg::STATUS, AD | FAILED);
        t.write(0x100, &[1, 0]);
        assert_eq!(count(&t, Violation::ConfigWriteOutOfPhase), 3);
    }

    #[test]
    fn mmio_a_reset_device_initialises_again_from_scratch() {
        let mem = default_mem();
        let (mut t, sink, _) = live_console(&mem);
        w(&mut t, reg::STATUS, 0);
        assert!(!lock(t.device()).is_activated());
        // The whole sequence again, on fresh rings elsewhere in memory.
        negotiate(&mut t);
        setup_queue(&mut t, 0, &TestQueue::new(&mem, 2, 16));
        let mut txq = TestQueue::new(&mem, 3, 16);
        setup_queue(&mut t, 1, &txq);
        w(&mut t, reg::STATUS, LIVE);
        assert!(lock(t.device()).is_activated());
        txq.add(&[Buf::R(b"again")]);
        lock(t.device()).process_queue(1);
        assert_eq!(sink.contents(), b"again");
        assert_eq!(t.metrics().violations(), 0);
    }

    #[test]
    fn mmio_a_hostile_driver_is_counted_in_full_but_logged_only_up_to_the_limit() {
        let mem = default_mem();
        let (mut t, _, _) = console_transport(&mem);
        for i in 0..10_000u32 {
            w(&mut t, reg::STATUS, 0x10 | (i & 0x7));
        }
        assert_eq!(t.status(), 0);
        assert_eq!(count(&t, Violation::InvalidStatusTransition), 10_000);
        assert_eq!(t.metrics().logged_lines(), LOG_LIMIT + 1);
    }
}
