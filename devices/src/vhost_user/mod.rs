//! Our devices served over vhost-user, so QEMU (TCG, `-M microvm`) can run them for a guest:
//! the second transport of the same device code, never a second device implementation.
//! QEMU owns the transport (virtio-mmio registers, interrupts); the backend here sees guest
//! memory, the queues and their kick/call eventfds, and runs the device's own queue processing.
//!
//! What every backend shares lives here: the guest-memory handle, the queue and config bounds,
//! and how the vhost-user socket is claimed.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon, VringRwLock};
use vm_memory::GuestMemoryAtomic;

use crate::virtio::GuestMemory;

mod backend_channel;
pub mod block;
pub mod vsock;

/// The guest memory handle vhost-user hands us (replaced on every `SET_MEM_TABLE`).
pub type AtomicGuestMemory = GuestMemoryAtomic<GuestMemory>;

/// The largest queue a backend accepts. Over vhost-user the frontend alone decides the queue
/// size (the protocol has no way to tell it our maximum): QEMU's `vhost-user-blk` offers the
/// guest up to 1024 entries by default (its `VIRTQUEUE_MAX_SIZE`), its vhost-user-vsock 128,
/// and a backend that refuses the `SET_VRING_NUM` loses the connection. The queue processing
/// does not depend on the size.
pub const MAX_QUEUE_SIZE: u16 = 1024;

/// The largest configuration read a backend answers: the vhost-user protocol's own bound on
/// `VHOST_USER_GET_CONFIG`, so a frontend cannot make us allocate more.
pub const MAX_CONFIG_BYTES: u32 = 256;

/// A zeroed buffer for a `GET_CONFIG` of `size` bytes, cut to [`MAX_CONFIG_BYTES`].
pub(crate) fn config_buffer(size: u32) -> Vec<u8> {
    vec![0u8; size.min(MAX_CONFIG_BYTES) as usize]
}

/// Why the vhost-user socket could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Something other than a stale socket is at the socket path.
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket could not be bound.
    #[error("cannot listen on the vhost-user socket {}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: VhostUserError,
    },
}

/// Listens on the vhost-user socket `socket`: a stale socket there (a backend that died) is
/// replaced, any other file is left alone and refused. The socket is removed when the
/// returned listener is dropped.
pub(crate) fn listen(socket: &Path) -> Result<Listener, ListenError> {
    let stale_socket = match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => true,
        Ok(_) => {
            return Err(ListenError::NotASocket {
                path: socket.to_owned(),
            })
        }
        Err(_) => false,
    };
    Listener::new(socket, stale_socket).map_err(|source| ListenError::Bind {
        path: socket.to_owned(),
        source,
    })
}

/// Serves the one frontend that connects to `listener` until it hangs up, then tells the
/// workers to exit. A frontend that goes away between or in the middle of messages (QEMU
/// exiting) is the normal end, not an error.
pub(crate) fn serve_until_hang_up<T>(
    daemon: &mut VhostUserDaemon<T>,
    listener: &mut Listener,
) -> Result<(), vhost_user_backend::Error>
where
    T: VhostUserBackend<Bitmap = (), Vring = VringRwLock<AtomicGuestMemory>> + Clone + 'static,
{
    let served = daemon.start(listener).and_then(|()| daemon.wait());
    for worker in daemon.get_epoll_handlers() {
        worker.send_exit_event();
    }
    match served {
        Err(vhost_user_backend::Error::HandleRequest(
            VhostUserError::Disconnected | VhostUserError::PartialMessage,
        )) => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::net::{UnixListener, UnixStream};

    use super::*;

    #[test]
    fn listen_refuses_a_file_that_is_not_a_socket_and_leaves_it_alone() {
        let dir = tempfile::tempdir().unwrap();
        let precious = dir.path().join("precious");
        std::fs::write(&precious, b"keep me").unwrap();
        let Err(err) = listen(&precious) else {
            panic!("listened on a regular file");
        };
        assert!(matches!(err, ListenError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
    }

    #[test]
    fn listen_replaces_a_stale_socket_and_removes_its_own_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("vhost.sock");
        drop(UnixListener::bind(&socket).unwrap());
        assert!(socket.exists(), "a dead listener leaves its socket file");
        let listener = listen(&socket).unwrap();
        UnixStream::connect(&socket).unwrap();
        drop(listener);
        assert!(!socket.exists());
    }

    #[test]
    fn config_buffers_are_bounded() {
        assert_eq!(config_buffer(8), [0u8; 8]);
        assert_eq!(config_buffer(u32::MAX).len(), MAX_CONFIG_BYTES as usize);
    }
}
