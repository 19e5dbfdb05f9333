//! virtio-block behind our virtio-mmio transport: the [`VirtioDevice`] side (features, config
//! space, activation, the queue eventfd); requests are [`Disk::process_queue`]'s.

use std::path::Path;
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::{BlockError, Disk, ReplaceError, QUEUE_SIZE};
use crate::virtio::{ids, ActivateError, GuestMemory, Interrupt, VirtioDevice, INT_CONFIG};

struct Active {
    mem: GuestMemory,
    interrupt: Arc<Interrupt>,
    queue: Queue,
}

/// A virtio-block device on the MMIO transport.
pub struct Block {
    disk: Disk,
    acked_features: u64,
    /// Bumped on every image replacement (the transport adds it to its own generation).
    config_generation: u32,
    queue_evts: [EventFd; 1],
    active: Option<Active>,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("disk", &self.disk)
            .finish_non_exhaustive()
    }
}

impl Block {
    /// A device for the raw image at `path` (see [`Disk::open`]).
    pub fn new(path: &Path, read_only: bool) -> Result<Self, BlockError> {
        Ok(Block {
            disk: Disk::open(path, read_only)?,
            acked_features: 0,
            config_generation: 0,
            queue_evts: [EventFd::new(libc::EFD_NONBLOCK).map_err(BlockError::EventFd)?],
            active: None,
        })
    }

    /// The capacity in sectors (the config space's `capacity`).
    pub fn capacity_sectors(&self) -> u64 {
        self.disk.capacity_sectors()
    }

    /// The serial the guest reads.
    pub fn serial(&self) -> String {
        self.disk.serial()
    }

    /// Gives the (read-only) disk the image `file` ([`Disk::replace`]) and tells a driver
    /// that runs it that its configuration (the capacity) changed; returns the new capacity
    /// in sectors. A driver that has not started yet reads the new capacity when it does.
    pub fn replace_image(&mut self, file: std::fs::File) -> Result<u64, ReplaceError> {
        let sectors = self.disk.replace(file)?;
        self.config_generation = self.config_generation.wrapping_add(1);
        if let Some(a) = &self.active {
            // A full eventfd counter still leaves the interrupt pending: nothing to undo.
            let _ = a.interrupt.signal(INT_CONFIG);
        }
        Ok(sectors)
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        ids::BLOCK
    }

    fn avail_features(&self) -> u64 {
        self.disk.features()
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features;
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.disk.read_config(offset, data);
    }

    fn config_generation(&self) -> u32 {
        self.config_generation
    }

    fn activate(
        &mut self,
        mem: GuestMemory,
        interrupt: Arc<Interrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        let Some(queue) = queues.into_iter().next().filter(|q| q.is_valid(&mem)) else {
            return Err(ActivateError::BadQueue(0));
        };
        self.active = Some(Active {
            mem,
            interrupt,
            queue,
        });
        Ok(())
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn reset(&mut self) {
        self.active = None;
        self.acked_features = 0;
    }

    fn process_queue(&mut self, _index: usize) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        if self.disk.process_queue(&mut a.queue, &a.mem).notify {
            let _ = a.interrupt.signal_used_queue();
        }
    }
}
