//! crucible's microVM devices.
//!
//! The VMM's bus decodes addresses, [`virtio::mmio::MmioTransport`] decodes the virtio-mmio
//! registers, and the devices ([`virtio::block`], [`virtio::vsock`], [`virtio::console`])
//! decode neither: they see queues, guest memory and an interrupt. The legacy devices
//! ([`legacy`]) are the few port-I/O devices a boot needs: the 8250 serial (early-boot debugging
//! only), the i8042 reset line and the boot-complete marker. [`vhost_user`] serves the same
//! device code to QEMU over vhost-user.
//!
//! Everything here is testable without KVM: queues are built in plain guest memory
//! (`virtio_queue::mock`), interrupts are eventfds.

pub mod bus;
pub mod legacy;
pub mod vhost_user;
pub mod virtio;

pub use bus::BusDevice;
