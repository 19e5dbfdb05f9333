//! virtio-vsock over vhost-user (`crucible-vmm vhost-user vsock`): [`VhostUserVsock`] is the
//! `vhost-user-backend` side of a [`VsockBackend`] (the hybrid Unix-socket [`Muxer`]), with the
//! queues processed by the same [`queues`](crate::virtio::vsock::queues) code as our MMIO device; [`serve`] listens on a Unix
//! socket and serves one frontend (QEMU's `vhost-user-vsock-device`) until it hangs up.
//!
//! Events on the vring worker's epoll: the rx and tx kicks (ids 0 and 1); the event queue's
//! kick (id 2, never used: we post no events); the library's own id 3; and the backend's poll fd
//! as [`BACKEND_EVENT`], so sockets and deadlines are served on the same thread as the queues.
//!
//! Offered: `VIRTIO_F_VERSION_1` (the bits of our MMIO transport), plus
//! `VHOST_USER_F_PROTOCOL_FEATURES` with the `CONFIG` protocol feature, which QEMU needs to
//! read the guest CID. Not offered: `VIRTIO_RING_F_EVENT_IDX` (the shared queue processing does
//! not do the event-index dance).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackendMut, VhostUserDaemon, VringRwLock, VringT};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::{
    config_buffer, listen, serve_until_hang_up, AtomicGuestMemory, ListenError, MAX_QUEUE_SIZE,
};
use crate::virtio::block::read_config_bytes;
use crate::virtio::vsock::queues::{process_rx, process_tx};
use crate::virtio::vsock::{Muxer, MuxerConfig, VsockBackend};
use crate::virtio::{GuestMemory, VIRTIO_F_VERSION_1};

/// rx, tx, event: the device's queues. QEMU's vhost-user-vsock keeps the event queue to itself
/// (it posts the transport-reset event after migration), so only rx and tx are ever set up;
/// counting three keeps a frontend that does hand us the event queue working.
pub const NUM_QUEUES: usize = 3;
const RX_QUEUE: u16 = 0;
const TX_QUEUE: u16 = 1;
const EVENT_QUEUE: u16 = 2;
/// The event id of the backend's poll fd: ids `0..=NUM_QUEUES` belong to the library (the
/// queues, then its exit and vring-enable event).
pub const BACKEND_EVENT: u16 = NUM_QUEUES as u16 + 1;

/// Why the vhost-user vsock backend failed.
#[derive(Debug, thiserror::Error)]
pub enum VhostUserVsockError {
    /// The hybrid vsock's Unix socket or its epoll could not be set up.
    #[error("vsock host socket")]
    Muxer(#[from] crate::virtio::vsock::muxer::MuxerError),
    /// The worker thread's exit eventfd could not be created.
    #[error("cannot create the vhost-user worker's exit event")]
    ExitEvent(#[source] io::Error),
    /// The vhost-user socket could not be claimed.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// The backend's poll fd could not be added to the vring worker's epoll.
    #[error("cannot watch the vsock backend's events on the vring worker")]
    WatchBackend(#[source] io::Error),
    /// The daemon failed to start or its connection failed. `vhost_user_backend::Error` does
    /// not implement `std::error::Error`, so its text is kept instead of a source.
    #[error("vhost-user vsock on {}: {reason}", path.display())]
    Daemon {
        /// The socket path.
        path: PathBuf,
        /// The daemon's own description of the failure.
        reason: String,
    },
}

/// The vhost-user backend of a virtio-vsock device: the connections are the [`VsockBackend`]'s,
/// the transport is the frontend's.
pub struct VhostUserVsock<B: VsockBackend = Muxer> {
    cid: u64,
    backend: B,
    mem: Option<AtomicGuestMemory>,
    exit: (EventConsumer, EventNotifier),
}

impl<B: VsockBackend> std::fmt::Debug for VhostUserVsock<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostUserVsock")
            .field("cid", &self.cid)
            .field("has_memory", &self.mem.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: VsockBackend> VhostUserVsock<B> {
    /// A backend for guest `cid` whose connections `backend` serves.
    pub fn new(cid: u64, backend: B) -> Result<Self, VhostUserVsockError> {
        let exit = new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)
            .map_err(VhostUserVsockError::ExitEvent)?;
        Ok(VhostUserVsock {
            cid,
            backend,
            mem: None,
            exit,
        })
    }

    /// The connections' backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The connections' backend, mutably (tests drive its clock or script it).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Runs `process` (rx or tx processing) on vring `index` if it runs, and signals the guest
    /// if told to.
    fn process_vring(
        &mut self,
        mem: &GuestMemory,
        vrings: &[VringRwLock<AtomicGuestMemory>],
        index: u16,
        process: fn(&GuestMemory, &mut Queue, &mut B) -> bool,
    ) -> io::Result<()> {
        let Some(vring) = vrings.get(usize::from(index)) else {
            return Ok(());
        };
        let mut state = vring.get_mut();
        if !runs(state.is_enabled(), state.get_queue().ready()) {
            return Ok(());
        }
        if process(mem, state.get_queue_mut(), &mut self.backend) {
            state.signal_used_queue()?;
        }
        Ok(())
    }
}

/// Whether a vring may carry data: started (kick and addresses set) and enabled by the
/// frontend. Before both, the vhost-user spec forbids touching it.
fn runs(enabled: bool, ready: bool) -> bool {
    enabled && ready
}

impl<B: VsockBackend + Sync> VhostUserBackendMut for VhostUserVsock<B> {
    type Bitmap = ();
    type Vring = VringRwLock<AtomicGuestMemory>;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        usize::from(MAX_QUEUE_SIZE)
    }

    fn features(&self) -> u64 {
        (1u64 << VIRTIO_F_VERSION_1) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
    }

    fn set_event_idx(&mut self, _enabled: bool) {
        // EVENT_IDX is never offered, so the frontend cannot enable it.
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let mut config = config_buffer(size);
        read_config_bytes(&self.cid.to_le_bytes(), u64::from(offset), &mut config);
        config
    }

    fn update_memory(&mut self, mem: AtomicGuestMemory) -> io::Result<()> {
        self.mem = Some(mem);
        Ok(())
    }

    fn reset_device(&mut self) {
        self.backend.reset();
    }

    /// The frontend stops the rings when the driver resets the device (QEMU 7.2 sends no
    /// `RESET_DEVICE`): the connections die with the driver's state, as on our MMIO transport.
    fn stop_vring(&mut self, queue_index: u32) -> io::Result<()> {
        if queue_index == u32::from(RX_QUEUE) || queue_index == u32::from(TX_QUEUE) {
            self.backend.reset();
        }
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        Some((self.exit.0.try_clone().ok()?, self.exit.1.try_clone().ok()?))
    }

    fn handle_event(
        &mut self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[Self::Vring],
        _thread_id: usize,
    ) -> io::Result<()> {
        match device_event {
            BACKEND_EVENT => {
                // Sockets and timers are served even before the guest's memory is known (a host
                // client may connect before the driver is up): the poll fd is level-triggered,
                // so leaving it unserved would spin the worker.
                self.backend.process_events();
                let Some(mem) = self.mem.as_ref().map(|m| m.memory()) else {
                    return Ok(());
                };
                self.process_vring(&mem, vrings, RX_QUEUE, process_rx)
            }
            RX_QUEUE | TX_QUEUE => {
                let Some(mem) = self.mem.as_ref().map(|m| m.memory()) else {
                    return Err(io::Error::other(
                        "vhost-user vsock: a queue was kicked before the frontend sent its \
                         memory table",
                    ));
                };
                if device_event == TX_QUEUE {
                    self.process_vring(&mem, vrings, TX_QUEUE, process_tx)?;
                }
                // A tx packet may have produced an answer (RESPONSE, credit update), and an rx
                // kick means new buffers: either way, fill what can be filled.
                self.process_vring(&mem, vrings, RX_QUEUE, process_rx)
            }
            // We never post an event, so buffers there just wait.
            EVENT_QUEUE => Ok(()),
            other => Err(io::Error::other(format!(
                "vhost-user vsock: event {other} is none of the device's"
            ))),
        }
    }
}

/// Serves a vsock device for guest `cid` over vhost-user on the Unix socket `socket`, with its
/// host side on the hybrid Unix socket `uds` (`CONNECT <port>\n` in, `<uds>_<port>` out), to
/// one frontend until it disconnects. `listening` runs once `socket` accepts connections. A
/// stale socket at `socket` is replaced; any other file there is an error. `uds` is removed at
/// the end.
pub fn serve(
    socket: &Path,
    cid: u64,
    uds: &Path,
    config: MuxerConfig,
    listening: impl FnOnce(),
) -> Result<(), VhostUserVsockError> {
    let daemon_err = |e: vhost_user_backend::Error| VhostUserVsockError::Daemon {
        path: socket.to_owned(),
        reason: e.to_string(),
    };
    // Claimed first, so a refused socket path leaves the hybrid socket untouched; a later
    // failure drops the listener, which removes the socket again.
    let mut listener = listen(socket)?;
    let muxer = Muxer::new(cid, uds, config)?;
    // Held to the end: the worker threads may keep the backend alive past this function.
    let _uds_file = muxer.socket_file();
    let backend_fd = muxer.poll_fd();
    let backend = Arc::new(RwLock::new(VhostUserVsock::new(cid, muxer)?));
    let mut daemon = VhostUserDaemon::new(
        "crucible-vhost-user-vsock".to_string(),
        backend,
        GuestMemoryAtomic::new(GuestMemory::new()),
    )
    .map_err(daemon_err)?;
    if let Some(fd) = backend_fd {
        for worker in daemon.get_epoll_handlers() {
            worker
                .register_listener(fd, EventSet::IN, u64::from(BACKEND_EVENT))
                .map_err(VhostUserVsockError::WatchBackend)?;
        }
    }
    listening();
    serve_until_hang_up(&mut daemon, &mut listener).map_err(daemon_err)
}

#[cfg(test)]
mod tests;
