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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use virtio_queue::desc::{split::Descriptor, RawDescriptor};

    use super::*;
    use crate::virtio::test_utils::{default_mem, interrupt, Buf, Sink, TestQueue};
    use crate::virtio::INT_VRING;

    /// A console whose output lands in the returned sink, activated on queues 0 and 1 of `mem`.
    fn active_console<'m>(
        mem: &'m GuestMemory,
        out: Box<dyn Write + Send>,
    ) -> (Console, TestQueue<'m>, TestQueue<'m>, Arc<Interrupt>) {
        let rxq = TestQueue::new(mem, 0, 16);
        let txq = TestQueue::new(mem, 1, 16);
        let irq = interrupt();
        let mut c = Console::new(out).unwrap();
        c.activate(mem.clone(), irq.clone(), vec![rxq.queue(), txq.queue()])
            .unwrap();
        (c, rxq, txq, irq)
    }

    #[test]
    fn console_writes_every_transmit_chain_in_order_and_returns_each_one() {
        let mem = default_mem();
        let sink = Sink::default();
        let (mut c, _, mut txq, irq) = active_console(&mem, Box::new(sink.clone()));
        txq.add(&[Buf::R(b"one "), Buf::R(b"chain, two buffers; ")]);
        txq.add(&[Buf::R(b"then another\n")]);
        c.process_queue(TXQ);
        assert_eq!(sink.contents(), b"one chain, two buffers; then another\n");
        assert_eq!(txq.used(), Some((0, 0)));
        assert_eq!(txq.used(), Some((2, 0)));
        assert_eq!(txq.used(), None);
        assert_eq!(irq.status(), INT_VRING);
        assert_eq!(
            irq.irqfd().read().unwrap(),
            1,
            "one interrupt for the batch"
        );
    }

    #[test]
    fn console_leaves_receive_buffers_to_the_guest() {
        let mem = default_mem();
        let sink = Sink::default();
        let (mut c, mut rxq, _, irq) = active_console(&mem, Box::new(sink.clone()));
        rxq.add(&[Buf::W(64)]);
        c.process_queue(0);
        assert_eq!(
            rxq.used(),
            None,
            "no input: the buffer stays with the device, unused"
        );
        assert_eq!(irq.status(), 0);
        assert!(sink.contents().is_empty());
    }

    #[test]
    fn console_returns_chains_it_cannot_read_without_writing_anything() {
        let mem = default_mem();
        let sink = Sink::default();
        let (mut c, _, txq, _) = active_console(&mem, Box::new(sink.clone()));
        // A hostile chain: a buffer 64 GiB up, outside guest memory.
        let outside = Descriptor::new(0x10_0000_0000, 16, 0, 0);
        txq.mock
            .add_desc_chains(&[RawDescriptor::from(outside)], 0)
            .unwrap();
        let mut txq = txq;
        c.process_queue(TXQ);
        assert!(sink.contents().is_empty());
        assert_eq!(
            txq.used(),
            Some((0, 0)),
            "returned, so the guest is not stuck"
        );
    }

    #[test]
    fn console_output_errors_lose_the_bytes_but_never_the_chain() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::other("disk full"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Err(io::Error::other("disk full"))
            }
        }
        let mem = default_mem();
        let (mut c, _, mut txq, irq) = active_console(&mem, Box::new(Broken));
        txq.add(&[Buf::R(b"lost")]);
        c.process_queue(TXQ);
        assert_eq!(txq.used(), Some((0, 0)));
        assert_eq!(irq.status(), INT_VRING);
    }

    #[test]
    fn console_activation_needs_both_queues_valid_and_a_reset_stops_it() {
        let mem = default_mem();
        let mut c = Console::new(Box::new(Sink::default())).unwrap();
        let rxq = TestQueue::new(&mem, 0, 16);
        let txq = TestQueue::new(&mem, 1, 16);
        let err = c
            .activate(mem.clone(), interrupt(), vec![rxq.queue()])
            .unwrap_err();
        assert!(matches!(err, ActivateError::BadQueue(1)), "{err}");
        let mut not_ready = txq.queue();
        not_ready.set_ready(false);
        let err = c
            .activate(mem.clone(), interrupt(), vec![rxq.queue(), not_ready])
            .unwrap_err();
        assert!(matches!(err, ActivateError::BadQueue(1)), "{err}");
        assert!(!c.is_activated());

        let sink = Sink::default();
        let (mut c, _, mut txq, _) = active_console(&mem, Box::new(sink.clone()));
        c.reset();
        assert!(!c.is_activated());
        txq.add(&[Buf::R(b"after reset")]);
        c.process_queue(TXQ);
        assert!(sink.contents().is_empty());
        assert_eq!(txq.used(), None);
    }
}
