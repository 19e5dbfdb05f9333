//! virtio-block over vhost-user (`crucible-vmm vhost-user block`): [`VhostUserBlock`] is the
//! `vhost-user-backend` side of [`Disk`]; [`serve`] listens on a Unix socket and serves one
//! frontend (QEMU's `vhost-user-blk-device`) until it hangs up.
//!
//! Offered: `VIRTIO_F_VERSION_1`, `VIRTIO_BLK_F_FLUSH`, `VIRTIO_BLK_F_RO` for read-only
//! images (the same bits as on our MMIO transport), plus `VHOST_USER_F_PROTOCOL_FEATURES`
//! with the `CONFIG` protocol feature, which QEMU needs to read the capacity, and the
//! `BACKEND_REQ` protocol feature, over whose channel a replaced image's new capacity is
//! announced (`--control`, [`crate::virtio::block::control`]). Not offered:
//! `VIRTIO_RING_F_EVENT_IDX` (the shared queue processing does not do the event-index dance)
//! and multiqueue.

use std::fs::File;
use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::Backend;
use vhost_user_backend::{VhostUserBackendMut, VhostUserDaemon, VringRwLock, VringT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::{
    backend_channel, config_buffer, listen, serve_until_hang_up, AtomicGuestMemory, ListenError,
    MAX_QUEUE_SIZE,
};
use crate::virtio::block::{control, BlockError, Disk};
use crate::virtio::GuestMemory;

/// Why the vhost-user block backend failed.
#[derive(Debug, thiserror::Error)]
pub enum VhostUserBlockError {
    /// The image could not be opened.
    #[error(transparent)]
    Disk(#[from] BlockError),
    /// The worker thread's exit eventfd could not be created.
    #[error("cannot create the vhost-user worker's exit event")]
    ExitEvent(#[source] io::Error),
    /// The vhost-user socket could not be claimed.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// The control socket could not be bound.
    #[error("cannot listen on the disk control socket {}", path.display())]
    Control {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The daemon failed to start or its connection failed. `vhost_user_backend::Error` does
    /// not implement `std::error::Error`, so its text is kept instead of a source.
    #[error("vhost-user block on {}: {reason}", path.display())]
    Daemon {
        /// The socket path.
        path: PathBuf,
        /// The daemon's own description of the failure.
        reason: String,
    },
}

/// The vhost-user backend of a virtio-block device: the device is the [`Disk`], the transport
/// is the frontend's.
pub struct VhostUserBlock {
    disk: Disk,
    mem: Option<AtomicGuestMemory>,
    exit: (EventConsumer, EventNotifier),
    /// The channel to the frontend (`BACKEND_REQ`), once it gave one: the crate's wrapper
    /// (which owns the descriptor) and our own copy to send on, or why there is none.
    frontend: Option<(Backend, Result<Arc<UnixStream>, String>)>,
}

impl std::fmt::Debug for VhostUserBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostUserBlock")
            .field("disk", &self.disk)
            .field("backend_channel", &self.frontend.is_some())
            .finish_non_exhaustive()
    }
}

impl VhostUserBlock {
    /// A backend for the raw image at `path` (see [`Disk::open`]).
    pub fn new(path: &Path, read_only: bool) -> Result<Self, VhostUserBlockError> {
        let exit = new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)
            .map_err(VhostUserBlockError::ExitEvent)?;
        Ok(VhostUserBlock {
            disk: Disk::open(path, read_only)?,
            mem: None,
            exit,
            frontend: None,
        })
    }

    /// The device the backend serves.
    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// Gives the disk the image `file` when `serial` is its own ([`Disk::replace`]); the new
    /// capacity in sectors, or why not. Telling the frontend is the caller's.
    pub fn replace_image(&mut self, serial: &str, file: File) -> Result<u64, String> {
        let own = self.disk.serial();
        if serial != own {
            return Err(format!("this device's disk is {own:?}, not {serial:?}"));
        }
        self.disk.replace(file).map_err(|e| report::chain(&e))
    }
}

/// Gives the disk of `backend` the image `file` when `serial` is its own, then tells the
/// frontend its configuration changed (QEMU then reads the new capacity and interrupts the
/// driver); the new capacity in sectors, or why not. The lock is not held while the frontend
/// is told: it reads the configuration back through the backend.
fn replace_image(
    backend: &RwLock<VhostUserBlock>,
    serial: &str,
    file: File,
) -> Result<u64, String> {
    let (sectors, channel) = {
        let mut backend = backend.write().unwrap_or_else(|p| p.into_inner());
        let sectors = backend.replace_image(serial, file)?;
        let channel = backend
            .frontend
            .as_ref()
            .map(|(_, channel)| channel.clone());
        (sectors, channel)
    };
    let channel = channel.ok_or(
        "the frontend gave no backend channel: the driver cannot be told the new capacity",
    )??;
    backend_channel::announce_config_change(&channel)
        .map(|()| sectors)
        .map_err(|e| format!("telling the frontend the capacity changed: {e}"))
}

impl VhostUserBackendMut for VhostUserBlock {
    type Bitmap = ();
    type Vring = VringRwLock<AtomicGuestMemory>;

    fn num_queues(&self) -> usize {
        1
    }

    fn max_queue_size(&self) -> usize {
        usize::from(MAX_QUEUE_SIZE)
    }

    fn features(&self) -> u64 {
        self.disk.features() | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::BACKEND_REQ
    }

    fn set_backend_req_fd(&mut self, frontend: Backend) {
        let channel = backend_channel::find().map(Arc::new);
        if let Err(why) = &channel {
            eprintln!("crucible-vmm: vhost-user block: the backend channel: {why}");
        }
        self.frontend = Some((frontend, channel));
    }

    fn set_event_idx(&mut self, _enabled: bool) {
        // EVENT_IDX is never offered, so the frontend cannot enable it.
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let mut config = config_buffer(size);
        self.disk.read_config(u64::from(offset), &mut config);
        config
    }

    fn update_memory(&mut self, mem: AtomicGuestMemory) -> io::Result<()> {
        self.mem = Some(mem);
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
        let (0, Some(vring)) = (device_event, vrings.first()) else {
            return Err(io::Error::other(format!(
                "vhost-user block: event {device_event} is not the request queue's"
            )));
        };
        let Some(mem) = self.mem.as_ref().map(|m| m.memory()) else {
            return Err(io::Error::other(
                "vhost-user block: the queue was kicked before the frontend sent its memory table",
            ));
        };
        let mut state = vring.get_mut();
        if self.disk.process_queue(state.get_queue_mut(), &mem).notify {
            state.signal_used_queue()?;
        }
        Ok(())
    }
}

/// Serves the raw image at `image` over vhost-user on the Unix socket `socket` to one frontend,
/// until it disconnects. `listening` runs once the socket accepts connections (so a caller can
/// start the frontend without polling for the socket). A stale socket at `socket` is replaced;
/// any other file there is an error. With `control`, a disk control socket there
/// ([`control`]) gives the (read-only) disk another image while it runs.
pub fn serve(
    socket: &Path,
    image: &Path,
    read_only: bool,
    control: Option<&Path>,
    listening: impl FnOnce(),
) -> Result<(), VhostUserBlockError> {
    let daemon_err = |e: vhost_user_backend::Error| VhostUserBlockError::Daemon {
        path: socket.to_owned(),
        reason: e.to_string(),
    };
    let backend = Arc::new(RwLock::new(VhostUserBlock::new(image, read_only)?));
    if let Some(path) = control {
        let listener = UnixListener::bind(path).map_err(|source| VhostUserBlockError::Control {
            path: path.to_owned(),
            source,
        })?;
        let backend = backend.clone();
        let path = path.to_owned();
        // Detached: it serves for as long as the process does.
        std::thread::spawn(move || {
            let failed = control::serve(&listener, |serial, file| {
                replace_image(&backend, serial, file)
            });
            eprintln!(
                "crucible-vmm: vhost-user block: the disk control socket {} stopped: {failed}",
                path.display()
            );
        });
    }
    let mut daemon = VhostUserDaemon::new(
        "crucible-vhost-user-blk".to_string(),
        backend,
        GuestMemoryAtomic::new(GuestMemory::new()),
    )
    .map_err(daemon_err)?;
    let mut listener = listen(socket)?;
    listening();
    serve_until_hang_up(&mut daemon, &mut listener).map_err(daemon_err)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::mpsc;

    use vhost::vhost_user::message::VhostUserConfigFlags;
    use vhost::vhost_user::{Frontend, VhostUserFrontend};
    use vhost::VhostBackend;

    use super::*;
    use crate::virtio::block::VIRTIO_BLK_F_RO;

    fn image(sectors: u64) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(sectors * 512 + 100).unwrap();
        f
    }

    #[test]
    fn vhost_user_block_refuses_events_it_cannot_serve() {
        let img = image(4);
        let mut backend = VhostUserBlock::new(img.path(), false).unwrap();
        let mem = GuestMemoryAtomic::new(crate::virtio::test_utils::default_mem());
        let vring = VringRwLock::new(mem.clone(), 16).unwrap();
        let vrings = [vring];
        // A kick before SET_MEM_TABLE is a frontend bug: an error, not a panic.
        let early = backend.handle_event(0, EventSet::IN, &vrings, 0);
        assert!(early.unwrap_err().to_string().contains("memory table"));
        backend.update_memory(mem).unwrap();
        assert!(backend.handle_event(1, EventSet::IN, &vrings, 0).is_err());
        assert!(backend.handle_event(0, EventSet::IN, &[], 0).is_err());
        // A vring that was never set up (address 0, not ready) completes nothing.
        backend.handle_event(0, EventSet::IN, &vrings, 0).unwrap();
    }

    #[test]
    fn vhost_user_block_config_reads_are_bounded() {
        let img = image(4);
        let backend = VhostUserBlock::new(img.path(), false).unwrap();
        assert_eq!(backend.get_config(0, 8), 4u64.to_le_bytes());
        assert_eq!(
            backend.get_config(0, u32::MAX).len(),
            crate::vhost_user::MAX_CONFIG_BYTES as usize
        );
        assert_eq!(backend.get_config(u32::MAX, 4), [0u8; 4]);
    }

    #[test]
    fn vhost_user_block_serve_refuses_to_replace_a_file_that_is_not_a_socket() {
        let img = image(4);
        let dir = tempfile::tempdir().unwrap();
        let not_a_socket = dir.path().join("precious");
        std::fs::write(&not_a_socket, b"keep me").unwrap();
        let err = serve(&not_a_socket, img.path(), false, None, || {
            panic!("must not listen")
        })
        .unwrap_err();
        assert!(
            matches!(
                err,
                VhostUserBlockError::Listen(ListenError::NotASocket { .. })
            ),
            "{err}"
        );
        assert_eq!(std::fs::read(&not_a_socket).unwrap(), b"keep me");
    }

    #[test]
    fn vhost_user_block_serves_a_frontend_its_features_and_capacity_then_ends_on_hang_up() {
        let img = image(6);
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("blk.sock");
        let (listening_tx, listening_rx) = mpsc::channel();
        let server = {
            let (socket, image) = (socket.clone(), img.path().to_owned());
            std::thread::spawn(move || {
                serve(&socket, &image, true, None, move || {
                    listening_tx.send(()).unwrap()
                })
            })
        };
        listening_rx.recv().unwrap();

        let mut frontend = Frontend::connect(&socket, 1).unwrap();
        frontend.set_owner().unwrap();
        let features = frontend.get_features().unwrap();
        assert_ne!(features & (1 << VIRTIO_BLK_F_RO), 0);
        assert_ne!(
            features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(),
            0
        );
        frontend.set_features(features).unwrap();
        let protocol = frontend.get_protocol_features().unwrap();
        assert!(protocol.contains(VhostUserProtocolFeatures::CONFIG));
        frontend.set_protocol_features(protocol).unwrap();
        let (_, config) = frontend
            .get_config(0, 60, VhostUserConfigFlags::WRITABLE, &[0u8; 60])
            .unwrap();
        assert_eq!(config[..8], 6u64.to_le_bytes());
        assert!(config[8..].iter().all(|&b| b == 0));
        // QEMU 7.2's vhost-user-blk sets the queue to 1024 entries whatever we would offer:
        // refusing it dropped the connection (found booting Linux against the backend).
        frontend.set_vring_num(0, MAX_QUEUE_SIZE).unwrap();

        drop(frontend);
        server.join().unwrap().unwrap();
        assert!(
            !socket.exists(),
            "the socket is removed when the backend ends"
        );
    }
}
