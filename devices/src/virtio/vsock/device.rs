//! The virtio side of vsock: the rx, tx and event queues, packets parsed from descriptor chains
//! (header and data in one descriptor, as Linux ≥ 6.2 sends them, or split), handed to the muxer.

use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use virtio_vsock::packet::VsockPacket;
use vmm_sys_util::eventfd::EventFd;

use super::muxer::{Muxer, MuxerError};
use crate::virtio::block::read_config_bytes;
use crate::virtio::{ids, ActivateError, GuestMemory, Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};

/// The queue size we offer.
pub const QUEUE_SIZE: u16 = 256;
/// The largest packet payload accepted from, or offered to, the guest.
pub const MAX_PKT_DATA: u32 = 64 * 1024;

const RXQ: usize = 0;
const TXQ: usize = 1;

struct Active {
    mem: GuestMemory,
    interrupt: Arc<Interrupt>,
    queues: Vec<Queue>,
}

/// A virtio-vsock device backed by a [`Muxer`].
pub struct Vsock {
    cid: u64,
    muxer: Muxer,
    queue_evts: [EventFd; 3],
    active: Option<Active>,
}

impl std::fmt::Debug for Vsock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vsock")
            .field("cid", &self.cid)
            .finish_non_exhaustive()
    }
}

impl Vsock {
    /// A device for guest `cid` whose host side listens on `uds_path`, with at most
    /// `max_conns` connections at once.
    pub fn new(cid: u64, uds_path: &Path, max_conns: usize) -> Result<Self, MuxerError> {
        let evt = || EventFd::new(libc::EFD_NONBLOCK).map_err(MuxerError::Epoll);
        Ok(Vsock {
            cid,
            muxer: Muxer::new(cid, uds_path, max_conns)?,
            queue_evts: [evt()?, evt()?, evt()?],
            active: None,
        })
    }

    /// The backend.
    pub fn muxer(&self) -> &Muxer {
        &self.muxer
    }

    /// Consumes the guest's tx queue, then fills its rx queue.
    fn process_tx(&mut self) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let mut used = false;
        let q = &mut a.queues[TXQ];
        while let Some(mut chain) = q.pop_descriptor_chain(&a.mem) {
            let head = chain.head_index();
            match VsockPacket::from_tx_virtq_chain(&a.mem, &mut chain, MAX_PKT_DATA) {
                Ok(pkt) => self.muxer.send_pkt(&pkt),
                Err(e) => log(format_args!("dropping a malformed tx packet: {e}")),
            }
            let _ = q.add_used(&a.mem, head, 0);
            used = true;
        }
        if used && q.needs_notification(&a.mem).unwrap_or(true) {
            let _ = a.interrupt.signal_used_queue();
        }
    }

    /// Moves what the muxer has for the guest into the rx queue, while it has buffers.
    fn process_rx(&mut self) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let mut used = false;
        let q = &mut a.queues[RXQ];
        while self.muxer.has_pending_rx() {
            let Some(mut chain) = q.pop_descriptor_chain(&a.mem) else {
                break;
            };
            let head = chain.head_index();
            let len = match VsockPacket::from_rx_virtq_chain(&a.mem, &mut chain, MAX_PKT_DATA) {
                Ok(mut pkt) => match self.muxer.recv_pkt(&mut pkt) {
                    Some(len) => len,
                    None => {
                        // Nothing after all (a socket that had no data): give the buffer back.
                        q.go_to_previous_position();
                        break;
                    }
                },
                Err(e) => {
                    log(format_args!("dropping a malformed rx buffer: {e}"));
                    0
                }
            };
            let _ = q.add_used(&a.mem, head, len);
            used = true;
        }
        if used && q.needs_notification(&a.mem).unwrap_or(true) {
            let _ = a.interrupt.signal_used_queue();
        }
    }
}

fn log(args: std::fmt::Arguments<'_>) {
    eprintln!("crucible-vmm: vsock: {args}");
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        ids::VSOCK
    }

    fn avail_features(&self) -> u64 {
        1u64 << VIRTIO_F_VERSION_1
    }

    fn set_acked_features(&mut self, _features: u64) {}

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE, QUEUE_SIZE]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.cid.to_le_bytes(), offset, data);
    }

    fn activate(
        &mut self,
        mem: GuestMemory,
        interrupt: Arc<Interrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if queues.len() != 3 {
            return Err(ActivateError::BadQueue(queues.len()));
        }
        // The event queue is never used (no transport reset events), so it may stay unset.
        if let Some(i) = queues[..2].iter().position(|q| !q.is_valid(&mem)) {
            return Err(ActivateError::BadQueue(i));
        }
        self.active = Some(Active {
            mem,
            interrupt,
            queues,
        });
        Ok(())
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn reset(&mut self) {
        self.active = None;
        self.muxer.reset();
    }

    fn process_queue(&mut self, index: usize) {
        if index == TXQ {
            self.process_tx();
        }
        self.process_rx();
    }

    fn backend_fd(&self) -> Option<RawFd> {
        Some(self.muxer.as_raw_fd())
    }

    fn process_backend(&mut self) {
        self.muxer.process_events();
        self.process_rx();
    }
}
