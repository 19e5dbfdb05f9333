//! Attaches an image file to a free loop device that detaches itself once nothing holds it
//! open any more (`LO_FLAGS_AUTOCLEAR`): when its filesystem's last mount is gone, whether
//! the sandbox ended, was killed, or the daemon crashed.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::sys::{self, SysError};

/// Why an image could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// A system call failed; the message names the step and its input.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// The image already backs a loop device: its filesystem would be mounted twice through
    /// two block devices that know nothing of each other, and corrupted.
    #[error("{} is already attached to {device}; an image can back one loop device at a time", image.display())]
    InUse {
        /// The image.
        image: PathBuf,
        /// The loop device it backs (`/dev/loop3`).
        device: String,
    },
    /// The image is not a regular file.
    #[error("{} is not a regular file", image.display())]
    NotAFile {
        /// The image.
        image: PathBuf,
    },
    /// Other processes took every free loop device offered to us.
    #[error("no loop device for {} after {tries} tries: each free one was taken first", image.display())]
    Contended {
        /// The image.
        image: PathBuf,
        /// How many free devices were tried.
        tries: u32,
    },
}

/// A loop device bound to an image, detached by the kernel once its last user closes it.
#[derive(Debug)]
pub(crate) struct LoopDevice {
    /// Held until the filesystem on it is mounted, which then keeps it open.
    _device: OwnedFd,
    number: u32,
}

impl LoopDevice {
    /// The device node, `/dev/loopN`.
    pub(crate) fn path(&self) -> PathBuf {
        PathBuf::from(format!("/dev/loop{}", self.number))
    }
}

const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64` of `<linux/loop.h>`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` of `<linux/loop.h>`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// How many free devices to try when others keep taking the one we were offered.
const TRIES: u32 = 16;

/// Attaches `image` to a free loop device, read-only (the device refuses writes) if asked.
/// Refuses an image that already backs a loop device.
pub(crate) fn attach(image: &Path, read_only: bool) -> Result<LoopDevice, LoopError> {
    let mode = if read_only {
        libc::O_RDONLY
    } else {
        libc::O_RDWR
    };
    let file = sys::open_file(image, mode)?;
    let meta = sys::fstat(&file, || format!("stat the image {}", image.display()))?;
    if meta.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(LoopError::NotAFile {
            image: image.to_path_buf(),
        });
    }
    if let Some(device) = attached_device(&file, meta.st_dev, meta.st_ino) {
        return Err(LoopError::InUse {
            image: image.to_path_buf(),
            device,
        });
    }
    let control = sys::open_file(Path::new("/dev/loop-control"), libc::O_RDWR)?;
    for _ in 0..TRIES {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let number = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        sys::check(number, || {
            "find a free loop device (LOOP_CTL_GET_FREE)".into()
        })?;
        let number = number as u32;
        let path = PathBuf::from(format!("/dev/loop{number}"));
        // Opened read-only, the device is read-only whatever its flags say.
        let device = sys::open_file(&path, mode)?;
        match configure(&device, &file, read_only) {
            Ok(()) => {
                return Ok(LoopDevice {
                    _device: device,
                    number,
                })
            }
            // Another process bound it between LOOP_CTL_GET_FREE and here: ask again.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => continue,
            Err(e) => {
                return Err(SysError::io(
                    format!("bind {} to {}", image.display(), path.display()),
                    e,
                )
                .into())
            }
        }
    }
    Err(LoopError::Contended {
        image: image.to_path_buf(),
        tries: TRIES,
    })
}

/// Binds `file` to the unbound loop `device`, with autoclear (and read-only if asked): one
/// LOOP_CONFIGURE, or LOOP_SET_FD and LOOP_SET_STATUS64 on kernels before 5.8.
fn configure(device: &OwnedFd, file: &OwnedFd, read_only: bool) -> std::io::Result<()> {
    let mut flags = LO_FLAGS_AUTOCLEAR;
    if read_only {
        flags |= LO_FLAGS_READ_ONLY;
    }
    let info = LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: flags,
        lo_file_name: [0; 64],
        lo_crypt_name: [0; 64],
        lo_encrypt_key: [0; 32],
        lo_init: [0; 2],
    };
    let config = LoopConfig {
        fd: file.as_raw_fd() as u32,
        // The device's default (512): an ext4 of 1 KiB blocks cannot sit on a 4 KiB device.
        block_size: 0,
        info,
        reserved: [0; 8],
    };
    // SAFETY: `config` is a valid loop_config the kernel only reads during the call.
    let ret = unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_CONFIGURE as _,
            &config as *const LoopConfig,
        )
    };
    if ret == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ENOTTY) && e.raw_os_error() != Some(libc::EINVAL) {
        return Err(e);
    }
    // SAFETY: LOOP_SET_FD takes the backing file's descriptor as its integer argument; a
    // read-only descriptor makes a read-only device.
    let ret = unsafe { libc::ioctl(device.as_raw_fd(), LOOP_SET_FD as _, file.as_raw_fd()) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `config.info` is a valid loop_info64 the kernel only reads during the call.
    let ret = unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_SET_STATUS64 as _,
            &config.info as *const LoopInfo64,
        )
    };
    if ret < 0 {
        let e = std::io::Error::last_os_error();
        // Without autoclear nothing would ever detach it.
        // SAFETY: LOOP_CLR_FD takes no argument.
        unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CLR_FD as _, 0) };
        return Err(e);
    }
    Ok(())
}

/// The loop device (`/dev/loopN`) whose backing file is `file` (device `dev`, inode `ino`),
/// if any, found through `/sys/block/loop*/loop/backing_file`: the same path, or a path to the
/// same inode.
fn attached_device(file: &OwnedFd, dev: u64, ino: u64) -> Option<String> {
    let own_path = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok();
    let entries = std::fs::read_dir("/sys/block").ok()?;
    entries.flatten().find_map(|entry| {
        let name = entry.file_name().into_string().ok()?;
        if !name.starts_with("loop") {
            return None;
        }
        let backing = std::fs::read_to_string(entry.path().join("loop/backing_file")).ok()?;
        let backing = Path::new(backing.trim_end_matches('\n'));
        let same = own_path.as_deref() == Some(backing)
            || std::fs::metadata(backing).is_ok_and(|m| m.dev() == dev && m.ino() == ino);
        same.then(|| format!("/dev/{name}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ioctl_structs_match_the_kernel_abi() {
        assert_eq!(size_of::<LoopInfo64>(), 232);
        assert_eq!(size_of::<LoopConfig>(), 304);
    }
}
