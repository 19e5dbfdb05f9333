//! vsock sockets, as a microVM's agent uses them: listening for the host's requests,
//! connecting to the host (the hello, the egress relay).

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::sys;

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: socket takes no pointers.
    let fd = sys::cvt(unsafe {
        libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)
    })?;
    // SAFETY: socket returned a fresh descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn addr(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain old data; all-zeroes is a valid value.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_cid = cid;
    addr.svm_port = port;
    addr
}

pub(crate) fn listen(port: u32, backlog: libc::c_int) -> io::Result<OwnedFd> {
    let fd = socket()?;
    let addr = addr(libc::VMADDR_CID_ANY, port);
    // SAFETY: the pointer and length describe the live sockaddr_vm above.
    sys::cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_vm).cast(),
            size_of::<libc::sockaddr_vm>() as libc::socklen_t,
        )
    })?;
    // SAFETY: listen takes no pointers.
    sys::cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
    Ok(fd)
}

/// Connects to `cid:port` over vsock, giving up after `timeout`.
pub(crate) fn connect(cid: u32, port: u32, timeout: Duration) -> io::Result<UnixStream> {
    use std::os::fd::AsFd;
    let fd = socket()?;
    sys::set_nonblocking(fd.as_fd(), true)?;
    let addr = addr(cid, port);
    // SAFETY: the pointer and length describe the live sockaddr_vm above.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_vm).cast(),
            size_of::<libc::sockaddr_vm>() as libc::socklen_t,
        )
    };
    if let Err(e) = sys::cvt(r) {
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
        let mut fds = [libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        }];
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        if sys::poll(&mut fds, ms)? == 0 {
            return Err(io::Error::from(io::ErrorKind::TimedOut));
        }
        let stream = UnixStream::from(fd);
        if let Some(e) = stream.take_error()? {
            return Err(e);
        }
        stream.set_nonblocking(false)?;
        return Ok(stream);
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}
