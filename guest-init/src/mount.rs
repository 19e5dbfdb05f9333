//! mount(2) and umount2(2) for the VM's PID 1, with the failing call named.

use std::ffi::CString;
use std::fs;
use std::io;

use crate::sys;

/// A mount (or unmount) that failed.
#[derive(Debug, thiserror::Error)]
#[error("mount {fstype} on {target}")]
pub struct MountError {
    /// The filesystem type (empty for a move or a bind).
    pub fstype: String,
    /// The mount point.
    pub target: String,
    /// The cause.
    #[source]
    pub source: io::Error,
}

/// mount(2), creating `target` first if it is missing; an already-mounted target (EBUSY)
/// counts as success. An empty `fstype` is passed as null (a move or a bind).
pub fn mount(
    source: &str,
    target: &str,
    fstype: &str,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), MountError> {
    let err = |source| MountError {
        fstype: fstype.to_string(),
        target: target.to_string(),
        source,
    };
    let _ = fs::create_dir_all(target);
    let src = CString::new(source).map_err(|_| err(io::ErrorKind::InvalidInput.into()))?;
    let tgt = CString::new(target).map_err(|_| err(io::ErrorKind::InvalidInput.into()))?;
    let fst = CString::new(fstype).map_err(|_| err(io::ErrorKind::InvalidInput.into()))?;
    let dat = match data {
        Some(d) => Some(CString::new(d).map_err(|_| err(io::ErrorKind::InvalidInput.into()))?),
        None => None,
    };
    // SAFETY: every pointer is a live NUL-terminated string or null (fstype/data may be null for
    // MS_MOVE and MS_BIND, and the kernel reads only what the flags call for).
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            if fstype.is_empty() {
                std::ptr::null()
            } else {
                fst.as_ptr()
            },
            flags,
            dat.as_ref().map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    match sys::cvt(r) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(()),
        Err(e) => Err(err(e)),
    }
}

/// Detaches the mount at `target` (`umount2(MNT_DETACH)`).
pub fn unmount_detached(target: &str) -> Result<(), MountError> {
    let err = |source| MountError {
        fstype: "(unmount)".into(),
        target: target.to_string(),
        source,
    };
    let tgt = CString::new(target).map_err(|_| err(io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: umount2 takes a live NUL-terminated string.
    sys::cvt(unsafe { libc::umount2(tgt.as_ptr(), libc::MNT_DETACH) }).map_err(err)?;
    Ok(())
}
