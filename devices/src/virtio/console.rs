//! virtio-console (`hvc0`): the guest's console output goes to a log file, a pipe or the VMM's
//! stdout. Input is off unless the host hands the device a [`ConsoleInput`] (debugging a
//! guest): bytes read from it fill the receive buffers the guest posted, in order. With no
//! buffer posted nothing is read, so a writer that outruns the guest blocks on its own side
//! (the FIFO or pipe fills up) instead of the VMM dropping or queueing input.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use virtio_queue::{Queue, QueueOwnedT, QueueT, Reader, Writer};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::block::read_config_bytes;
use super::{ids, ActivateError, GuestMemory, Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};

/// The queue size we offer.
pub const QUEUE_SIZE: u16 = 256;
/// The receive queue (host → guest).
const RXQ: usize = 0;
/// The transmit queue (guest → host).
const TXQ: usize = 1;
/// Most input bytes placed in one receive buffer per read (Linux's `hvc` posts page-sized
/// buffers); a larger buffer is returned with what one read gave.
const INPUT_CHUNK: usize = 4096;

struct Active {
    mem: GuestMemory,
    interrupt: Arc<Interrupt>,
    queues: Vec<Queue>,
}

/// The host side of the guest's console input: a non-blocking descriptor read only when the
/// guest has a receive buffer waiting. Reading stops for good at end of file (or on a read
/// error).
pub struct ConsoleInput {
    file: File,
    /// Whether epoll can watch it (a FIFO, pipe, socket or tty); a regular file cannot, and is
    /// read whenever the guest posts buffers instead (it is always ready).
    pollable: bool,
    ended: bool,
}

impl std::fmt::Debug for ConsoleInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleInput")
            .field("fd", &self.file.as_raw_fd())
            .field("pollable", &self.pollable)
            .field("ended", &self.ended)
            .finish()
    }
}

impl ConsoleInput {
    /// Opens `path` (a FIFO, a file, `/proc/self/fd/N` for an inherited descriptor) for
    /// reading without blocking: opening a FIFO does not wait for a writer.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        Self::from_file(file)
    }

    /// Input from an open descriptor, switched to non-blocking (reads happen on the event loop,
    /// which must never wait on the host's writer).
    pub fn from_file(file: File) -> io::Result<Self> {
        let fd = file.as_raw_fd();
        // SAFETY: F_GETFL on a descriptor `file` owns; no memory is passed.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: F_SETFL on a descriptor `file` owns, adding O_NONBLOCK to its own flags.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let probe = Epoll::new()?;
        let pollable = match probe.ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, 0))
        {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => false,
            Err(e) => return Err(e),
        };
        Ok(ConsoleInput {
            file,
            pollable,
            ended: false,
        })
    }

    /// Whether end of file (or a read error) stopped the input.
    pub fn ended(&self) -> bool {
        self.ended
    }
}

/// A virtio-console device writing to `out`, and reading the guest's input from a
/// [`ConsoleInput`] if it has one.
pub struct Console {
    out: Box<dyn Write + Send>,
    input: Option<ConsoleInput>,
    queue_evts: [EventFd; 2],
    active: Option<Active>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("input", &self.input)
            .finish_non_exhaustive()
    }
}

impl Console {
    /// A console whose output goes to `out`, without input.
    pub fn new(out: Box<dyn Write + Send>) -> io::Result<Self> {
        Self::with_input(out, None)
    }

    /// A console whose output goes to `out` and whose input, if any, comes from `input`.
    pub fn with_input(out: Box<dyn Write + Send>, input: Option<ConsoleInput>) -> io::Result<Self> {
        Ok(Console {
            out,
            input,
            queue_evts: [
                EventFd::new(libc::EFD_NONBLOCK)?,
                EventFd::new(libc::EFD_NONBLOCK)?,
            ],
            active: None,
        })
    }

    /// The input, if any (its end-of-file state).
    pub fn input(&self) -> Option<&ConsoleInput> {
        self.input.as_ref()
    }

    /// Moves input into the receive buffers the guest posted, one read per buffer, until the
    /// input has nothing more for now, ends, or the buffers run out; a buffer popped for a read
    /// that brought nothing goes back to the queue untouched.
    fn receive_input(&mut self) {
        let (Some(a), Some(input)) = (self.active.as_mut(), self.input.as_mut()) else {
            return;
        };
        if input.ended {
            return;
        }
        let q = &mut a.queues[RXQ];
        let mut chunk = [0u8; INPUT_CHUNK];
        let mut used = false;
        while let Some(chain) = q.pop_descriptor_chain(&a.mem) {
            let head = chain.head_index();
            // A chain with no writable byte in guest memory cannot take input: returned empty,
            // so the guest is not stuck waiting on it.
            let mut writer = match Writer::<()>::new(&a.mem, chain) {
                Ok(w) if w.available_bytes() > 0 => w,
                _ => {
                    let _ = q.add_used(&a.mem, head, 0);
                    used = true;
                    continue;
                }
            };
            let want = writer.available_bytes().min(INPUT_CHUNK);
            let read = loop {
                match input.file.read(&mut chunk[..want]) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => break r,
                }
            };
            match read {
                Ok(n) if n > 0 => {
                    let placed = match writer.write_all(&chunk[..n]) {
                        Ok(()) => n,
                        // Guest memory that cannot be written loses the input, never the chain.
                        Err(_) => writer.bytes_written(),
                    };
                    let _ = q.add_used(&a.mem, head, placed as u32);
                    used = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    q.go_to_previous_position();
                    break;
                }
                end_or_error => {
                    if let Err(e) = end_or_error {
                        eprintln!("crucible-vmm: console input stops: {e}");
                    }
                    input.ended = true;
                    q.go_to_previous_position();
                    break;
                }
            }
        }
        if used && q.needs_notification(&a.mem).unwrap_or(true) {
            let _ = a.interrupt.signal_used_queue();
        }
    }

    /// Whether the guest has a receive buffer the device has not taken yet.
    fn receive_buffer_waiting(&self) -> bool {
        let Some(a) = &self.active else {
            return false;
        };
        let q = &a.queues[RXQ];
        q.avail_idx(&a.mem, Ordering::Acquire)
            .is_ok_and(|idx| idx.0 != q.next_avail())
    }

    fn write_output(&mut self) {
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
        match index {
            RXQ => self.receive_input(),
            TXQ => self.write_output(),
            _ => {}
        }
    }

    fn backend_fd(&self) -> Option<RawFd> {
        self.input
            .as_ref()
            .filter(|i| i.pollable)
            .map(|i| i.file.as_raw_fd())
    }

    fn backend_wants_events(&self) -> bool {
        self.input.as_ref().is_some_and(|i| !i.ended) && self.receive_buffer_waiting()
    }

    fn process_backend(&mut self) {
        self.receive_input();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
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

    /// A pipe whose read end feeds a [`ConsoleInput`]; returns the input, a second handle on
    /// the same read end (to see what the device left in the pipe) and the write end.
    fn piped_input() -> (ConsoleInput, File, std::io::PipeWriter) {
        let (reader, writer) = std::io::pipe().unwrap();
        let read_end = File::from(std::os::fd::OwnedFd::from(reader));
        let input = ConsoleInput::from_file(read_end.try_clone().unwrap()).unwrap();
        (input, read_end, writer)
    }

    fn console_with_input<'m>(
        mem: &'m GuestMemory,
        input: ConsoleInput,
    ) -> (Console, TestQueue<'m>, Arc<Interrupt>) {
        let rxq = TestQueue::new(mem, 0, 16);
        let txq = TestQueue::new(mem, 1, 16);
        let irq = interrupt();
        let mut c = Console::with_input(Box::new(Sink::default()), Some(input)).unwrap();
        c.activate(mem.clone(), irq.clone(), vec![rxq.queue(), txq.queue()])
            .unwrap();
        (c, rxq, irq)
    }

    /// What is left to read in the pipe behind `read_end` (non-blocking).
    fn left_in_pipe(mut read_end: &File) -> Vec<u8> {
        let mut left = vec![0u8; 4096];
        match read_end.read(&mut left) {
            Ok(n) => left.truncate(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => left.clear(),
            Err(e) => panic!("{e}"),
        }
        left
    }

    #[test]
    fn console_input_lands_in_posted_buffers_in_order_and_partly_filled_ones_go_back_at_once() {
        let mem = default_mem();
        let (input, _read_end, mut writer) = piped_input();
        let (mut c, mut rxq, irq) = console_with_input(&mem, input);
        assert!(
            c.backend_fd().is_some(),
            "a pipe is watched by the event loop"
        );
        let first = rxq.add(&[Buf::W(5)]);
        let second = rxq.add(&[Buf::W(3), Buf::W(61)]);
        let third = rxq.add(&[Buf::W(64)]);
        writer.write_all(b"hello world\n").unwrap();
        c.process_backend();
        assert_eq!(rxq.used(), Some((0, 5)));
        assert_eq!(rxq.read(first[0], 5), b"hello");
        assert_eq!(
            rxq.used(),
            Some((1, 7)),
            "one read per buffer, returned partly filled"
        );
        assert_eq!(rxq.read(second[0], 3), b" wo");
        assert_eq!(rxq.read(second[1], 4), b"rld\n");
        assert_eq!(
            rxq.used(),
            None,
            "nothing more to read: the third buffer stays posted"
        );
        assert_eq!(irq.status(), INT_VRING);
        assert_eq!(
            irq.irqfd().read().unwrap(),
            1,
            "one interrupt for the batch"
        );
        assert!(
            c.backend_wants_events(),
            "a buffer is still waiting for input"
        );

        writer.write_all(b"more").unwrap();
        c.process_backend();
        assert_eq!(rxq.used(), Some((3, 4)));
        assert_eq!(rxq.read(third[0], 4), b"more");
        assert!(
            !c.backend_wants_events(),
            "no buffer left: stop watching the input"
        );
    }

    #[test]
    fn console_input_is_left_in_the_pipe_while_the_guest_has_no_buffer_posted() {
        let mem = default_mem();
        let (input, read_end, mut writer) = piped_input();
        let (mut c, mut rxq, irq) = console_with_input(&mem, input);
        writer.write_all(b"typed ahead").unwrap();
        assert!(
            !c.backend_wants_events(),
            "no buffer: the loop must not watch the pipe"
        );
        c.process_backend();
        c.process_queue(RXQ);
        assert_eq!(irq.status(), 0);
        assert_eq!(left_in_pipe(&read_end), b"typed ahead", "nothing consumed");

        // Once a buffer arrives, the guest's notification alone brings the input in.
        writer.write_all(b"late").unwrap();
        let buf = rxq.add(&[Buf::W(16)]);
        assert!(c.backend_wants_events());
        c.process_queue(RXQ);
        assert_eq!(rxq.used(), Some((0, 4)));
        assert_eq!(rxq.read(buf[0], 4), b"late");
    }

    #[test]
    fn console_input_stops_at_end_of_file_and_leaves_the_remaining_buffers_posted() {
        let mem = default_mem();
        let (input, _read_end, mut writer) = piped_input();
        let (mut c, mut rxq, _) = console_with_input(&mem, input);
        rxq.add(&[Buf::W(64)]);
        rxq.add(&[Buf::W(64)]);
        writer.write_all(b"last line\n").unwrap();
        drop(writer);
        c.process_backend();
        assert_eq!(rxq.used(), Some((0, 10)));
        assert_eq!(rxq.used(), None, "end of file fills nothing");
        assert!(c.input().unwrap().ended());
        assert!(
            !c.backend_wants_events(),
            "an ended input is never watched again, buffers or not"
        );
        c.process_queue(RXQ);
        assert_eq!(rxq.used(), None);
    }

    #[test]
    fn console_input_from_a_regular_file_is_read_when_the_guest_posts_buffers() {
        let mem = default_mem();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"from a file").unwrap();
        io::Seek::rewind(&mut f).unwrap();
        let input = ConsoleInput::from_file(f).unwrap();
        let (mut c, mut rxq, _) = console_with_input(&mem, input);
        assert_eq!(c.backend_fd(), None, "epoll cannot watch a regular file");
        let a = rxq.add(&[Buf::W(4)]);
        let b = rxq.add(&[Buf::W(64)]);
        rxq.add(&[Buf::W(64)]);
        c.process_queue(RXQ);
        assert_eq!(rxq.used(), Some((0, 4)));
        assert_eq!(rxq.used(), Some((1, 7)));
        assert_eq!(rxq.read(a[0], 4), b"from");
        assert_eq!(rxq.read(b[0], 7), b" a file");
        assert_eq!(rxq.used(), None);
        assert!(c.input().unwrap().ended());
    }

    #[test]
    fn console_input_refuses_hostile_receive_chains_without_reading_for_them() {
        let mem = default_mem();
        let (input, read_end, mut writer) = piped_input();
        let (mut c, mut rxq, _) = console_with_input(&mem, input);
        writer.write_all(b"secret").unwrap();
        // A device-readable buffer only, then a writable one 64 GiB up, outside guest memory.
        rxq.add(&[Buf::R(b"not writable")]);
        let outside = Descriptor::new(0x10_0000_0000, 16, VRING_DESC_F_WRITE as u16, 0);
        rxq.mock
            .add_desc_chains(&[RawDescriptor::from(outside)], 1)
            .unwrap();
        c.process_backend();
        assert_eq!(
            rxq.used(),
            Some((0, 0)),
            "returned empty, so the guest is not stuck"
        );
        assert_eq!(rxq.used(), Some((1, 0)));
        assert_eq!(left_in_pipe(&read_end), b"secret", "nothing read for them");
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
