//! The virtio-vsock device as the transport sees it: three queues, the guest CID in the config
//! space, and a [`VsockBackend`] behind them. Queue processing itself is in [`super::queues`],
//! which the transport-independent callers (a vhost-user daemon) use directly.

use std::os::fd::RawFd;
use std::path::Path;
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::backend::VsockBackend;
use super::muxer::{Muxer, MuxerConfig, MuxerError};
use super::queues::{process_rx, process_tx};
use crate::virtio::block::read_config_bytes;
use crate::virtio::{ids, ActivateError, GuestMemory, Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};

/// The queue size we offer.
pub const QUEUE_SIZE: u16 = 256;
pub use super::queues::MAX_PKT_DATA;

const RXQ: usize = 0;
const TXQ: usize = 1;

struct Active {
    mem: GuestMemory,
    interrupt: Arc<Interrupt>,
    queues: Vec<Queue>,
}

/// A virtio-vsock device backed by a [`VsockBackend`] (the Unix-socket [`Muxer`] by default).
pub struct Vsock<B: VsockBackend = Muxer> {
    cid: u64,
    backend: B,
    queue_evts: [EventFd; 3],
    active: Option<Active>,
}

impl<B: VsockBackend> std::fmt::Debug for Vsock<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vsock")
            .field("cid", &self.cid)
            .finish_non_exhaustive()
    }
}

impl Vsock<Muxer> {
    /// A device for guest `cid` whose host side listens on `uds_path`, with at most
    /// `max_conns` connections at once and the default timeouts.
    pub fn new(cid: u64, uds_path: &Path, max_conns: usize) -> Result<Self, MuxerError> {
        Self::with_config(cid, uds_path, MuxerConfig::new(max_conns))
    }

    /// A device for guest `cid` whose host side listens on `uds_path`.
    pub fn with_config(cid: u64, uds_path: &Path, config: MuxerConfig) -> Result<Self, MuxerError> {
        let muxer = Muxer::new(cid, uds_path, config)?;
        Self::with_backend(cid, muxer).map_err(MuxerError::Epoll)
    }

    /// The Unix-socket backend.
    pub fn muxer(&self) -> &Muxer {
        &self.backend
    }
}

impl<B: VsockBackend> Vsock<B> {
    /// A device for guest `cid` served by `backend`.
    pub fn with_backend(cid: u64, backend: B) -> std::io::Result<Self> {
        let evt = || EventFd::new(libc::EFD_NONBLOCK);
        Ok(Vsock {
            cid,
            backend,
            queue_evts: [evt()?, evt()?, evt()?],
            active: None,
        })
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably (tests drive its clock or script it).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    fn process_tx(&mut self) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        if process_tx(&a.mem, &mut a.queues[TXQ], &mut self.backend) {
            signal(&a.interrupt);
        }
    }

    fn process_rx(&mut self) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        if process_rx(&a.mem, &mut a.queues[RXQ], &mut self.backend) {
            signal(&a.interrupt);
        }
    }
}

fn signal(interrupt: &Interrupt) {
    if let Err(e) = interrupt.signal_used_queue() {
        eprintln!("crucible-vmm: vsock: cannot interrupt the guest: {e}");
    }
}

impl<B: VsockBackend> VirtioDevice for Vsock<B> {
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
        self.backend.reset();
    }

    fn process_queue(&mut self, index: usize) {
        if index == TXQ {
            self.process_tx();
        }
        self.process_rx();
    }

    fn backend_fd(&self) -> Option<RawFd> {
        self.backend.poll_fd()
    }

    fn process_backend(&mut self) {
        self.backend.process_events();
        self.process_rx();
    }
}
