//! Our devices served over vhost-user, so QEMU (TCG, `-M microvm`) can run them for a guest:
//! the second transport of the same device code, never a second device implementation.
//! QEMU owns the transport (virtio-mmio registers, interrupts); the backend here sees guest
//! memory, the queues and their kick/call eventfds, and runs the device's own queue processing.

pub mod block;
pub mod vsock;
