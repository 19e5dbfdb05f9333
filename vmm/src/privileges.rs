//! Dropping root once every privileged open (`/dev/kvm`, images, sockets) is done, and tying
//! the VMM's life to its parent's.

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

/// Has the kernel SIGKILL this process when its parent dies (`PR_SET_PDEATHSIG`); `parent` is
/// the parent's pid as read at start. If the parent is already gone (this process was
/// re-parented before the call), fails: the VM must not start unowned.
pub fn die_with_parent(parent: u32) -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and changes only this process's setting.
    if unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    let now = std::os::unix::process::parent_id();
    if now != parent {
        return Err(io::Error::other(format!(
            "the process that started the VMM ({parent}) is gone (parent now {now}); not starting \
             the VM"
        )));
    }
    Ok(())
}
