//! Dropping root once every privileged open (`/dev/kvm`, images, sockets) is done.

use std::io;

/// Drops to `uid`/`gid` (after every privileged open is done).
pub fn drop_privileges(uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    if let Some(g) = gid {
        // SAFETY: setgroups with an empty list and setgid only change this process's creds.
        if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::setgid(g) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    if let Some(u) = uid {
        // SAFETY: setuid only changes this process's credentials.
        if unsafe { libc::setuid(u) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
