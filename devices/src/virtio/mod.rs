//! The virtio device model: one [`VirtioDevice`] trait behind one transport
//! ([`mmio::MmioTransport`]), interrupts through an irqfd ([`Interrupt`]), queue notifications
//! through one eventfd per queue (an ioeventfd in the VM).

pub mod block;
pub mod console;
pub mod device_status;
pub mod mmio;
pub mod subscriber;
#[cfg(any(test, feature = "test-utils"))]
pub mod test_utils;
pub mod transport_metrics;
pub mod vsock;

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

/// The guest memory type every device uses.
pub type GuestMemory = GuestMemoryMmap<()>;

/// `VIRTIO_F_VERSION_1`: every device here is a modern (virtio 1.x) device.
pub const VIRTIO_F_VERSION_1: u32 = 32;

/// Device ids (virtio spec 5).
pub mod ids {
    /// virtio-block.
    pub const BLOCK: u32 = 2;
    /// virtio-console.
    pub const CONSOLE: u32 = 3;
    /// virtio-vsock.
    pub const VSOCK: u32 = 19;

    /// The device's name in logs and metrics (`block`), or `unknown` for an id not above.
    pub fn name(id: u32) -> &'static str {
        match id {
            BLOCK => "block",
            CONSOLE => "console",
            VSOCK => "vsock",
            _ => "unknown",
        }
    }
}

/// Device status bits (virtio spec 2.1).
pub mod status {
    /// The guest noticed the device.
    pub const ACKNOWLEDGE: u32 = 1;
    /// The guest has a driver for it.
    pub const DRIVER: u32 = 2;
    /// The driver is ready: the device may be used.
    pub const DRIVER_OK: u32 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u32 = 8;
    /// The device hit an error it cannot recover from without a reset.
    pub const DEVICE_NEEDS_RESET: u32 = 64;
    /// The guest gave up on the device.
    pub const FAILED: u32 = 128;
}

/// Interrupt status bit: a used ring changed.
pub const INT_VRING: u32 = 1;
/// Interrupt status bit: the configuration changed.
pub const INT_CONFIG: u32 = 2;

/// A device's interrupt line: the virtio-mmio `InterruptStatus` register plus the irqfd that
/// raises the (edge-triggered) IRQ in the in-kernel irqchip.
#[derive(Debug)]
pub struct Interrupt {
    status: AtomicU32,
    irqfd: EventFd,
}

impl Interrupt {
    /// A line that signals through `irqfd`.
    pub fn new(irqfd: EventFd) -> Self {
        Interrupt {
            status: AtomicU32::new(0),
            irqfd,
        }
    }

    /// The eventfd the VMM registers as the irqfd.
    pub fn irqfd(&self) -> &EventFd {
        &self.irqfd
    }

    /// Tells the guest a used ring changed.
    pub fn signal_used_queue(&self) -> io::Result<()> {
        self.signal(INT_VRING)
    }

    /// Sets `bits` in the status register and raises the IRQ.
    pub fn signal(&self, bits: u32) -> io::Result<()> {
        self.status.fetch_or(bits, Ordering::SeqCst);
        self.irqfd.write(1)
    }

    /// The `InterruptStatus` register.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// `InterruptACK`: clears the acknowledged bits.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }
}

/// Why a device could not be activated.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    /// The driver set up fewer queues than the device needs, or invalid ones.
    #[error("queue {0} is not ready or not valid")]
    BadQueue(usize),
    /// The backend could not start.
    #[error("device backend")]
    Backend(#[source] io::Error),
}

/// A virtio device, as the transport sees it.
pub trait VirtioDevice: Send {
    /// The virtio device id ([`ids`]).
    fn device_type(&self) -> u32;
    /// The features this device offers.
    fn avail_features(&self) -> u64;
    /// The features the driver accepted (always a subset of [`Self::avail_features`]).
    fn set_acked_features(&mut self, features: u64);
    /// The maximum size of each queue; its length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// One eventfd per queue, written when the guest notifies that queue.
    fn queue_events(&self) -> &[EventFd];
    /// Reads the device-specific configuration space; out-of-range bytes read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// How many times the device changed its configuration space on its own (a disk given a
    /// new image); the transport's `ConfigGeneration` register adds it, so a driver reading
    /// the space across a change reads it again.
    fn config_generation(&self) -> u32 {
        0
    }
    /// Writes the device-specific configuration space (ignored by default).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// Starts the device with the queues the driver set up.
    fn activate(
        &mut self,
        mem: GuestMemory,
        interrupt: std::sync::Arc<Interrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError>;
    /// Whether [`Self::activate`] succeeded and no reset happened since.
    fn is_activated(&self) -> bool;
    /// Stops the device and drops its queues (the driver wrote 0 to `Status`).
    fn reset(&mut self);
    /// Handles a notification of queue `index`. Errors are the device's to log; the guest's
    /// mistakes never end the VMM.
    fn process_queue(&mut self, index: usize);
    /// An extra file descriptor the event loop polls for this device (the vsock muxer's epoll).
    fn backend_fd(&self) -> Option<RawFd> {
        None
    }
    /// Whether the event loop should watch [`Self::backend_fd`] now. A device with nowhere to
    /// put what the backend has (the console with no receive buffer posted) says no, so a
    /// level-triggered descriptor neither spins the loop nor gets read into a growing buffer;
    /// the loop asks again after each of the device's events.
    fn backend_wants_events(&self) -> bool {
        true
    }
    /// Handles readiness of [`Self::backend_fd`].
    fn process_backend(&mut self) {}
}
