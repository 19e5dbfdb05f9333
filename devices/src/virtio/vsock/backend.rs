//! The seam between the virtio side and whatever serves the connections (Firecracker's
//! `VsockChannel` / `VsockBackend`): the queue code hands the backend every packet the guest
//! sends and asks it for packets to fill the guest's rx buffers. The queue code knows nothing of
//! sockets; the backend knows nothing of queues, transports or event loops — it only offers one
//! fd to poll, so the MMIO device under our event loop and a vhost-user daemon can both drive it.

use std::os::fd::RawFd;

use virtio_vsock::packet::VsockPacket;
use vm_memory::bitmap::BitmapSlice;

/// Packets in both directions.
pub trait VsockChannel {
    /// Takes a packet the guest sent. It is always consumed (its buffers go back to the guest);
    /// what the backend cannot honour it answers with RST, never with an error here.
    fn send_pkt<B: BitmapSlice>(&mut self, pkt: &VsockPacket<'_, B>);

    /// Fills `pkt` (header, and data up to its data buffer) with the next packet for the
    /// guest, setting the header's `len` to the data written. Returns false if nothing was
    /// ready after all (the buffer goes back unused).
    fn recv_pkt<B: BitmapSlice>(&mut self, pkt: &mut VsockPacket<'_, B>) -> bool;

    /// Whether [`Self::recv_pkt`] may have something: worth popping an rx buffer for.
    fn has_pending_rx(&self) -> bool;
}

/// A backend: a channel plus the events that drive it.
pub trait VsockBackend: VsockChannel + Send {
    /// A file descriptor that becomes readable when [`Self::process_events`] has work (sockets,
    /// timers); `None` if the backend never has work of its own.
    fn poll_fd(&self) -> Option<RawFd>;

    /// Handles whatever is ready, without blocking.
    fn process_events(&mut self);

    /// Forgets every connection (the driver reset the device); the backend stays usable.
    fn reset(&mut self);
}
