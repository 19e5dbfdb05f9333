//! The block device itself, whatever carries it: the raw image and the request processing of
//! one virtqueue. Both transports (virtio-mmio in our VMM, vhost-user for QEMU) call
//! [`Disk::process_queue`]; neither parses a request itself.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use virtio_queue::{DescriptorChain, Queue, QueueT, Reader, Writer};

use super::{
    read_config_bytes, req, status, BlockError, ID_BYTES, SECTOR_SIZE, VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_RO,
};
use crate::virtio::{GuestMemory, VIRTIO_F_VERSION_1};

/// Why a disk's image could not be replaced.
#[derive(Debug, thiserror::Error)]
pub enum ReplaceError {
    /// Only a read-only disk takes another image.
    #[error("the disk is writable; only a read-only disk takes another image")]
    Writable,
    /// The new image could not be inspected.
    #[error("cannot stat the new image")]
    Stat(#[source] std::io::Error),
    /// The new image is not a regular file.
    #[error("the new image is not a regular file")]
    NotAFile,
}

/// How much of a request is copied at once (requests are never buffered whole).
const CHUNK: usize = 64 * 1024;

/// What one pass over a queue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Processed {
    /// Chains returned to the used ring.
    pub completed: usize,
    /// Whether the driver asked to be told (the caller raises its interrupt or call eventfd).
    pub notify: bool,
}

/// A raw disk image and the virtio-block requests on it.
pub struct Disk {
    file: File,
    read_only: bool,
    capacity_bytes: u64,
    id: [u8; ID_BYTES],
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk")
            .field("read_only", &self.read_only)
            .field("capacity_bytes", &self.capacity_bytes)
            .finish_non_exhaustive()
    }
}

impl Disk {
    /// Opens the raw image at `path`. The capacity is the image size rounded down to a whole
    /// sector; the id (`GET_ID`) is the file name, cut to 20 bytes.
    pub fn open(path: &Path, read_only: bool) -> Result<Self, BlockError> {
        let open_err = |source| BlockError::Open {
            path: path.to_owned(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        let mut id = [0u8; ID_BYTES];
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let n = name.len().min(ID_BYTES);
        id[..n].copy_from_slice(&name.as_bytes()[..n]);
        Ok(Disk {
            file,
            read_only,
            capacity_bytes: len - len % SECTOR_SIZE,
            id,
        })
    }

    /// Gives a read-only disk another image, `file` (open for reading), keeping its serial:
    /// how an empty disk reserved at boot (a spare container slot) receives a container's
    /// image once the VM runs. Returns the new capacity in sectors; the caller tells the
    /// driver the configuration changed. A writable disk keeps its image: the guest may have
    /// data in flight to it.
    pub fn replace(&mut self, file: File) -> Result<u64, ReplaceError> {
        if !self.read_only {
            return Err(ReplaceError::Writable);
        }
        let meta = file.metadata().map_err(ReplaceError::Stat)?;
        if !meta.is_file() {
            return Err(ReplaceError::NotAFile);
        }
        let len = meta.len();
        self.file = file;
        self.capacity_bytes = len - len % SECTOR_SIZE;
        Ok(self.capacity_sectors())
    }

    /// The serial the guest reads (`GET_ID`), without its NUL padding.
    pub fn serial(&self) -> String {
        let end = self.id.iter().position(|&b| b == 0).unwrap_or(ID_BYTES);
        String::from_utf8_lossy(&self.id[..end]).into_owned()
    }

    /// Whether writes are refused (and `VIRTIO_BLK_F_RO` offered).
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The capacity in sectors (the config space's `capacity`).
    pub fn capacity_sectors(&self) -> u64 {
        self.capacity_bytes / SECTOR_SIZE
    }

    /// The virtio feature bits the device offers, on any transport.
    pub fn features(&self) -> u64 {
        let mut f = (1u64 << VIRTIO_F_VERSION_1) | (1u64 << VIRTIO_BLK_F_FLUSH);
        if self.read_only {
            f |= 1u64 << VIRTIO_BLK_F_RO;
        }
        f
    }

    /// Reads the device configuration space (`struct virtio_blk_config`): only `capacity` is
    /// set; every other field reads as zero, as no feature that gives it meaning is offered.
    pub fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.capacity_sectors().to_le_bytes(), offset, data);
    }

    /// Runs every request the driver has made available on `queue` and returns the chains to
    /// the used ring. A chain the device cannot make sense of is returned with what could be
    /// said about it (an `IOERR` status when there is room for one): the guest's mistakes never
    /// stop the queue.
    pub fn process_queue(&self, queue: &mut Queue, mem: &GuestMemory) -> Processed {
        let mut done = Processed::default();
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let len = self.handle(mem, chain);
            // A failure here means the used ring is outside guest memory: the guest's problem.
            let _ = queue.add_used(mem, head, len);
            done.completed += 1;
        }
        done.notify = done.completed > 0 && queue.needs_notification(mem).unwrap_or(true);
        done
    }

    /// Runs one request; returns the number of bytes written into the chain.
    fn handle(&self, mem: &GuestMemory, chain: DescriptorChain<&GuestMemory>) -> u32 {
        let (Ok(mut reader), Ok(mut writer)) = (
            Reader::<()>::new(mem, chain.clone()),
            Writer::<()>::new(mem, chain),
        ) else {
            return 0;
        };
        let Some(data_len) = writer.available_bytes().checked_sub(1) else {
            return 0; // No room for the status byte: nothing we can tell the guest.
        };
        let Ok(mut status_w) = writer.split_at(data_len) else {
            return 0;
        };
        let (st, written) = match reader.read_obj::<[u8; 16]>() {
            Ok(h) => {
                let kind = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
                let mut s = [0u8; 8];
                s.copy_from_slice(&h[8..16]);
                self.execute(kind, u64::from_le_bytes(s), &mut reader, &mut writer)
            }
            Err(_) => (status::IOERR, 0),
        };
        if status_w.write_all(&[st]).is_err() {
            return 0;
        }
        u32::try_from(written + 1).unwrap_or(u32::MAX)
    }

    /// The byte offset of `sector` if `[sector, +len)` lies inside the image.
    fn range(&self, sector: u64, len: usize) -> Option<u64> {
        let start = sector.checked_mul(SECTOR_SIZE)?;
        let end = start.checked_add(len as u64)?;
        (end <= self.capacity_bytes).then_some(start)
    }

    fn execute(
        &self,
        kind: u32,
        sector: u64,
        reader: &mut Reader<'_>,
        writer: &mut Writer<'_>,
    ) -> (u8, usize) {
        match kind {
            req::IN => {
                let len = writer.available_bytes();
                let Some(mut off) = self.range(sector, len) else {
                    return (status::IOERR, 0);
                };
                let mut buf = vec![0u8; len.min(CHUNK)];
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(CHUNK);
                    if self.file.read_exact_at(&mut buf[..n], off).is_err()
                        || writer.write_all(&buf[..n]).is_err()
                    {
                        return (status::IOERR, done);
                    }
                    done += n;
                    off += n as u64;
                }
                (status::OK, done)
            }
            req::OUT => {
                if self.read_only {
                    return (status::IOERR, 0);
                }
                let len = reader.available_bytes();
                let Some(mut off) = self.range(sector, len) else {
                    return (status::IOERR, 0);
                };
                let mut buf = vec![0u8; len.min(CHUNK)];
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(CHUNK);
                    if reader.read_exact(&mut buf[..n]).is_err()
                        || self.file.write_all_at(&buf[..n], off).is_err()
                    {
                        return (status::IOERR, 0);
                    }
                    done += n;
                    off += n as u64;
                }
                (status::OK, 0)
            }
            req::FLUSH => match self.read_only || self.file.sync_data().is_ok() {
                true => (status::OK, 0),
                false => (status::IOERR, 0),
            },
            req::GET_ID => {
                let n = writer.available_bytes().min(ID_BYTES);
                match writer.write_all(&self.id[..n]) {
                    Ok(()) => (status::OK, n),
                    Err(_) => (status::IOERR, 0),
                }
            }
            _ => (status::UNSUPP, 0),
        }
    }
}
