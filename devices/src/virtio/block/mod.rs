//! virtio-block on a raw image file: read, write, flush and get_id, with an optional read-only
//! flag. Every request is checked against the image size: a bad sector, a short descriptor or a
//! write to a read-only disk is an I/O error for the guest, never a VMM panic.
//!
//! One implementation, two transports: [`Disk`] owns the image and runs a queue's requests
//! ([`Disk::process_queue`]); [`Block`] puts it behind our virtio-mmio transport, and
//! `crate::vhost_user::block` serves the same [`Disk`] over vhost-user (QEMU).

pub mod control;
mod device;
mod disk;
#[cfg(test)]
mod tests;

use std::io;
use std::path::PathBuf;

pub use device::Block;
pub use disk::{Disk, Processed, ReplaceError};

/// Bytes per sector, whatever the image.
pub const SECTOR_SIZE: u64 = 512;
/// The queue size we offer.
pub const QUEUE_SIZE: u16 = 256;
/// `VIRTIO_BLK_F_RO`.
pub const VIRTIO_BLK_F_RO: u32 = 5;
/// `VIRTIO_BLK_F_FLUSH`.
pub const VIRTIO_BLK_F_FLUSH: u32 = 9;

/// Request types.
pub mod req {
    #![allow(missing_docs)]
    pub const IN: u32 = 0;
    pub const OUT: u32 = 1;
    pub const FLUSH: u32 = 4;
    pub const GET_ID: u32 = 8;
}

/// Request status bytes.
pub mod status {
    #![allow(missing_docs)]
    pub const OK: u8 = 0;
    pub const IOERR: u8 = 1;
    pub const UNSUPP: u8 = 2;
}

/// The length of a `GET_ID` answer.
pub const ID_BYTES: usize = 20;

/// Why a block device could not be created.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The image could not be opened.
    #[error("cannot open the disk image {}", path.display())]
    Open {
        /// The image.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// An eventfd could not be created.
    #[error("cannot create an eventfd")]
    EventFd(#[source] io::Error),
}

/// Copies `config[offset..]` into `data`; bytes past the end read as zero.
pub(crate) fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(off) = usize::try_from(offset) else {
        return;
    };
    if let Some(src) = config.get(off..) {
        let n = src.len().min(data.len());
        data[..n].copy_from_slice(&src[..n]);
    }
}
