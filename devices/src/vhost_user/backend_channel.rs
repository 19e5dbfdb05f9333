//! The backend's channel to the frontend (`VHOST_USER_SET_BACKEND_REQ_FD`), for the one
//! message the `vhost` crate's `Backend` cannot send: `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG`,
//! which makes QEMU read the configuration again and interrupt the driver (a disk given a new
//! image has a new capacity).
//!
//! The crate hands the backend the channel wrapped, without its descriptor, so it is found
//! among the process's own when the crate announces it ([`find`]): the one Unix stream socket
//! that is unnamed on our side (a socketpair's end, where the main connection carries the
//! vhost-user socket's name and the control socket's carry theirs), does not listen, and whose
//! peer is another process (the frontend made the pair). Exactly one must match, else the
//! channel is not used and the reason is kept.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use vhost::vhost_user::message::BackendReq;

/// What identifies a descriptor as the backend channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SocketTraits {
    /// An `AF_UNIX` `SOCK_STREAM` socket.
    pub(crate) unix_stream: bool,
    /// Bound to no name on our side.
    pub(crate) unnamed: bool,
    /// A listening socket.
    pub(crate) listening: bool,
    /// The peer's pid (0 when unknown).
    pub(crate) peer_pid: libc::pid_t,
}

impl SocketTraits {
    /// Whether this is the backend channel of a frontend in another process than `own_pid`.
    pub(crate) fn is_backend_channel(&self, own_pid: libc::pid_t) -> bool {
        self.unix_stream
            && self.unnamed
            && !self.listening
            && self.peer_pid != 0
            && self.peer_pid != own_pid
    }
}

/// The backend channel among this process's descriptors, as a stream of its own (a copy of
/// the descriptor), or why it cannot be told apart.
pub(crate) fn find() -> Result<UnixStream, String> {
    // SAFETY: getpid has no preconditions.
    let own_pid = unsafe { libc::getpid() };
    let entries = std::fs::read_dir("/proc/self/fd").map_err(|e| format!("/proc/self/fd: {e}"))?;
    let found: Vec<RawFd> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<RawFd>().ok())
        .filter(|&fd| traits(fd).is_some_and(|t| t.is_backend_channel(own_pid)))
        .collect();
    let [fd] = found[..] else {
        return Err(format!(
            "{} descriptors look like the frontend's backend channel, not one",
            found.len()
        ));
    };
    // SAFETY: `fd` was open a moment ago and this process never closes the channel (the
    // crate's wrapper keeps it); F_DUPFD_CLOEXEC makes a copy we own.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if copy < 0 {
        return Err(format!(
            "copying descriptor {fd}: {}",
            io::Error::last_os_error()
        ));
    }
    // SAFETY: `copy` is a new descriptor that nothing else owns.
    Ok(UnixStream::from(unsafe { OwnedFd::from_raw_fd(copy) }))
}

/// What `fd` is, if it is a socket.
fn traits(fd: RawFd) -> Option<SocketTraits> {
    // SAFETY: borrowed only for the calls below, while the descriptor stays open.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let int_option = |name: libc::c_int| -> Option<libc::c_int> {
        let mut value: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `value` and `len` are valid for writes of an int, as getsockopt needs.
        let ret = unsafe {
            libc::getsockopt(
                borrowed.as_raw_fd(),
                libc::SOL_SOCKET,
                name,
                std::ptr::from_mut(&mut value).cast(),
                &mut len,
            )
        };
        (ret == 0).then_some(value)
    };
    let domain = int_option(libc::SO_DOMAIN)?;
    let kind = int_option(libc::SO_TYPE)?;
    let listening = int_option(libc::SO_ACCEPTCONN)? != 0;
    // SAFETY: an all-zero sockaddr_un is valid; getsockname writes at most `len` bytes.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `address` and `len` are valid for writes of a sockaddr_un.
    let named = unsafe {
        libc::getsockname(
            borrowed.as_raw_fd(),
            std::ptr::from_mut(&mut address).cast(),
            &mut len,
        )
    };
    let unnamed = named == 0 && len as usize <= size_of::<libc::sa_family_t>();
    // SAFETY: an all-zero ucred is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut cred_len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `cred_len` are valid for writes of a ucred.
    let peer = unsafe {
        libc::getsockopt(
            borrowed.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::from_mut(&mut cred).cast(),
            &mut cred_len,
        )
    };
    Some(SocketTraits {
        unix_stream: domain == libc::AF_UNIX && kind == libc::SOCK_STREAM,
        unnamed,
        listening,
        peer_pid: if peer == 0 { cred.pid } else { 0 },
    })
}

/// The vhost-user protocol version every message header carries in its flags.
const VERSION_1: u32 = 0x1;

/// The message telling the frontend the device's configuration changed: a header alone
/// (request, flags, payload size; each a little-endian u32) with no reply asked
/// (`REPLY_ACK` is not offered).
pub(crate) fn config_change_message() -> Vec<u8> {
    let request: u32 = BackendReq::CONFIG_CHANGE_MSG.into();
    [request, VERSION_1, 0]
        .iter()
        .flat_map(|word| word.to_le_bytes())
        .collect()
}

/// Tells the frontend on `channel` that the configuration changed.
pub(crate) fn announce_config_change(mut channel: &UnixStream) -> io::Result<()> {
    channel.write_all(&config_change_message())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn only_an_unnamed_connected_stream_from_another_process_is_the_channel() {
        let channel = SocketTraits {
            unix_stream: true,
            unnamed: true,
            listening: false,
            peer_pid: 4242,
        };
        assert!(channel.is_backend_channel(7));
        for other in [
            SocketTraits {
                unnamed: false,
                ..channel
            },
            SocketTraits {
                listening: true,
                ..channel
            },
            SocketTraits {
                unix_stream: false,
                ..channel
            },
            SocketTraits {
                peer_pid: 7,
                ..channel
            },
            SocketTraits {
                peer_pid: 0,
                ..channel
            },
        ] {
            assert!(!other.is_backend_channel(7), "{other:?}");
        }
    }

    #[test]
    fn this_processs_own_sockets_are_read_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("main.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let client = UnixStream::connect(&path).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let (a, _b) = UnixStream::pair().unwrap();
        let own = std::process::id() as libc::pid_t;
        let of = |fd: RawFd| traits(fd).unwrap();
        assert!(of(listener.as_raw_fd()).listening);
        assert!(
            !of(accepted.as_raw_fd()).unnamed,
            "named after the listener"
        );
        assert!(of(client.as_raw_fd()).unnamed);
        let pair = of(a.as_raw_fd());
        assert!(pair.unix_stream && pair.unnamed && !pair.listening);
        assert_eq!(pair.peer_pid, own);
        assert!(!pair.is_backend_channel(own), "a pair made here is ours");
        assert!(traits(0).is_none_or(|t| !t.unix_stream || t.peer_pid != 0 || !t.unnamed));
    }

    #[test]
    fn the_config_change_message_is_a_bare_version_1_header() {
        // request 2 (CONFIG_CHANGE_MSG), flags: version 1, size 0; little-endian.
        assert_eq!(
            config_change_message(),
            [2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
        );
    }
}
