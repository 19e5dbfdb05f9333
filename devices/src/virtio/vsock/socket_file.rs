//! The device's listening Unix socket file (`uds_path`): bound over a stale socket left by a
//! VMM that was killed, never over anything else, and removed when the VMM is done with it.
//!
//! Removal is by identity: a [`SocketFile`] remembers the device and inode it bound and removes
//! the path only if it still names that socket, so a file some other process put there since is
//! left alone, and removing twice is harmless.

use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Why the socket could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum SocketFileError {
    /// Something that is not a socket is in the way; it is never deleted.
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket {
        /// The socket path.
        path: PathBuf,
    },
    /// A live socket is in the way: another process listens there.
    #[error("{} is in use: another process is listening on it", path.display())]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The path could not be inspected, cleared or bound.
    #[error("cannot listen on {}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// A socket file this process bound; dropping it removes the file if it is still this socket.
/// Clones are independent guards for the same file (the VMM keeps one to remove the file at
/// exit even though the device itself is never dropped then).
#[derive(Debug, Clone)]
pub struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file if it still is the socket we bound; returns whether it did.
    pub fn remove(&self) -> io::Result<bool> {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if m.dev() == self.dev && m.ino() == self.ino => {
                std::fs::remove_file(&self.path)?;
                Ok(true)
            }
            Ok(_) => Ok(false),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!(
                "crucible-vmm: vsock: cannot remove {}: {e}",
                self.path.display()
            );
        }
    }
}

/// Binds a listening socket at `path`, replacing a stale socket file (one nobody listens on).
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile), SocketFileError> {
    let bind_err = |source| SocketFileError::Bind {
        path: path.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(SocketFileError::NotASocket {
                path: path.to_owned(),
            })
        }
        Ok(_) => {
            if UnixStream::connect(path).is_ok() {
                return Err(SocketFileError::InUse {
                    path: path.to_owned(),
                });
            }
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != ErrorKind::NotFound => return Err(bind_err(e)),
                _ => {}
            }
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(bind_err(e)),
    }
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    let meta = std::fs::symlink_metadata(path).map_err(bind_err)?;
    let file = SocketFile {
        path: path.to_owned(),
        dev: meta.dev(),
        ino: meta.ino(),
    };
    listener.set_nonblocking(true).map_err(bind_err)?;
    Ok((listener, file))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn stale_socket_file_is_replaced_and_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        // A socket nobody listens on any more (its VMM was killed).
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let (listener, file) = bind(&path).unwrap();
        UnixStream::connect(&path).unwrap();
        drop(file);
        assert!(!path.exists(), "the socket file is removed when dropped");
        drop(listener);
    }

    #[test]
    fn regular_file_at_the_socket_path_is_an_error_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        std::fs::write(&path, b"user data").unwrap();
        let err = bind(&path).unwrap_err();
        assert!(matches!(err, SocketFileError::NotASocket { .. }), "{err}");
        assert!(
            err.to_string().contains("exists and is not a socket"),
            "{err}"
        );
        assert!(err.to_string().contains("v.sock"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"user data");

        let sub = dir.path().join("d");
        std::fs::create_dir(&sub).unwrap();
        assert!(matches!(
            bind(&sub).unwrap_err(),
            SocketFileError::NotASocket { .. }
        ));
        assert!(sub.is_dir());
    }

    #[test]
    fn live_socket_at_the_socket_path_is_an_error_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        let other = UnixListener::bind(&path).unwrap();
        let err = bind(&path).unwrap_err();
        assert!(matches!(err, SocketFileError::InUse { .. }), "{err}");
        UnixStream::connect(&path).unwrap();
        drop(other);
    }

    #[test]
    fn socket_file_guard_leaves_a_replacement_alone_and_clones_remove_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        let (_listener, file) = bind(&path).unwrap();
        let guard = file.clone();
        assert!(guard.remove().unwrap());
        assert!(!file.remove().unwrap(), "already gone: nothing to do");
        // Someone else's file now sits at the path: ours must not delete it.
        std::fs::write(&path, b"theirs").unwrap();
        drop(file);
        drop(guard);
        assert_eq!(std::fs::read(&path).unwrap(), b"theirs");
    }
}
