//! virtio-console (`hvc0`): the guest's console output goes to a log file, a pipe or the VMM's
//! stdout. No input: the receive queue's buffers are left to the guest.

use std::io::{self, Write};
use std::sync::Arc;

use virtio_queue::{Queue, QueueT, Reader};
use vmm_sys_util::eventfd::EventFd;

use super::block::read_config_bytes;
use super::{ids, ActivateError, GuestMemory, Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};

/// The queue size we offer.
pub const QUEUE_SIZE: u16 = 256;
/// The transmit queue (guest → host).
const TXQ: usize = 1;

struct Active {
    mem: GuestMemory,
    interrupt: Arc<Interrupt>,
    queues: Vec<Queue>,
}

/// A virtio-console device writing to `out`.
pub struct Console {
    out: Box<dyn Write + Send>,
    queue_evts: [EventFd; 2],
    active: Option<Active>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

impl Console {
    /// A console whose output goes to `out`.
    pub fn new(out: Box<dyn Write + Send>) -> io::Result<Self> {
        Ok(Console {
            out,
            queue_evts: [
                EventFd::new(libc::EFD_NONBLOCK)?,
                EventFd::new(libc::EFD_NONBLOCK)?,
            ],
            active: None,
        })
    }
}

impl VirtioDevice for Console {
    fn device_type(&self) -> u32 {
        ids::CONSOLE
    }

    fn avail_features(&self) -> u64 {
        1u64 << VIRTIO_F_VERSION_1
    }

    fn set_acked_features(&mut self, _features: u64) {}

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // cols, rows, max_nr_ports, emerg_wr: all zero (no features offered).
        read_config_bytes(&[0u8; 12], offset, data);
    }

    fn activate(
        &mut self,
        mem: GuestMemory,
        interrupt: Arc<Interrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if queues.len() != 2 {
            return Err(ActivateError::BadQueue(queues.len()));
        }
        if let Some(i) = queues.iter().position(|q| !q.is_valid(&mem)) {
            return Err(ActivateError::BadQueue(i));
        }
        self.active = Some(Active {
            mem,
            interrupt,
            queues,
        });
        Ok(())
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn reset(&mut self) {
        self.active = None;
    }

    fn process_queue(&mut self, index: usize) {
        if index != TXQ {
            return;
        }
        let Some(a) = self.active.as_mut() else {
            return;
        };
        let mut used = false;
        let q = &mut a.queues[TXQ];
        while let Some(chain) = q.pop_descriptor_chain(&a.mem) {
            let head = chain.head_index();
            if let Ok(mut r) = Reader::<()>::new(&a.mem, chain) {
                // A console that cannot be written loses output; the guest must go on.
                let _ = io::copy(&mut r, &mut self.out);
            }
            let _ = q.add_used(&a.mem, head, 0);
            used = true;
        }
        let _ = self.out.flush();
        if used && q.needs_notification(&a.mem).unwrap_or(true) {
            let _ = a.interrupt.signal_used_queue();
        }
    }
}
