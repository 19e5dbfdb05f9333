//! Virtqueues in plain guest memory, driven from the driver's side (Firecracker-style), so
//! device logic is tested without KVM. Public behind the `test-utils` feature for the fuzz
//! targets; test setup, so failures panic.

#![allow(clippy::unwrap_used, missing_debug_implementations)]

use std::sync::{Arc, Mutex};

use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::{GuestMemory, Interrupt};

/// 32 MiB of guest memory at 0.
pub fn default_mem() -> GuestMemory {
    GuestMemory::from_ranges(&[(GuestAddress(0), 32 << 20)]).unwrap()
}

/// A fresh interrupt line.
pub fn interrupt() -> Arc<Interrupt> {
    Arc::new(Interrupt::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()))
}

/// A writer that keeps what it was given, shared with the test (console and serial output).
#[derive(Clone, Default)]
pub struct Sink(pub Arc<Mutex<Vec<u8>>>);

impl Sink {
    /// Everything written so far.
    pub fn contents(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
}

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Where queue `i` lives (descriptor table, rings): 64 KiB apart from 0x10000.
pub fn queue_addr(i: usize) -> GuestAddress {
    GuestAddress(0x1_0000 * (i as u64 + 1))
}

/// Buffers are allocated from 1 MiB up.
pub const BUF_BASE: u64 = 0x10_0000;

/// A driver-side queue: adds chains and reads the used ring.
///
/// Post at most `size / 2` chains: `MockSplitQueue` (virtio-queue 0.18) places the used ring
/// `size` bytes after the avail ring's entries rather than `2 * size`, so avail entries from
/// `size / 2` on overwrite the used ring (a limitation of the mock, not of the devices).
pub struct TestQueue<'a> {
    /// The queue's rings in guest memory.
    pub mock: MockSplitQueue<'a, GuestMemory>,
    mem: &'a GuestMemory,
    next_desc: u16,
    next_used: u16,
    next_buf: u64,
}

/// One buffer of a chain: its bytes (readable) or its size (writable).
pub enum Buf<'b> {
    /// Device-readable, with this content.
    R(&'b [u8]),
    /// Device-writable, this long.
    W(u32),
}

impl<'a> TestQueue<'a> {
    /// Queue `i` (at [`queue_addr`]) with `size` descriptors.
    pub fn new(mem: &'a GuestMemory, i: usize, size: u16) -> Self {
        TestQueue {
            mock: MockSplitQueue::create(mem, queue_addr(i), size),
            mem,
            next_desc: 0,
            next_used: 0,
            next_buf: BUF_BASE + 0x40_0000 * i as u64,
        }
    }

    /// The device-side queue, as the transport would hand it over.
    pub fn queue(&self) -> Queue {
        self.mock.create_queue().unwrap()
    }

    /// Adds one chain; returns the guest address of each buffer.
    pub fn add(&mut self, bufs: &[Buf<'_>]) -> Vec<GuestAddress> {
        let mut descs = Vec::new();
        let mut addrs = Vec::new();
        for (k, b) in bufs.iter().enumerate() {
            let addr = GuestAddress(self.next_buf);
            let (len, flags) = match b {
                Buf::R(data) => {
                    self.mem.write_slice(data, addr).unwrap();
                    (data.len() as u32, 0)
                }
                Buf::W(n) => (*n, VRING_DESC_F_WRITE as u16),
            };
            self.next_buf += u64::from(len).max(1).next_multiple_of(0x1000);
            let next = if k + 1 < bufs.len() {
                self.next_desc + k as u16 + 1
            } else {
                0
            };
            let flags = if k + 1 < bufs.len() { flags | 1 } else { flags };
            descs.push(RawDescriptor::from(Descriptor::new(
                addr.0, len, flags, next,
            )));
            addrs.push(addr);
        }
        self.mock.add_desc_chains(&descs, self.next_desc).unwrap();
        self.next_desc += bufs.len() as u16;
        addrs
    }

    /// The next used element (head index, length), if the device returned one.
    pub fn used(&mut self) -> Option<(u32, u32)> {
        let idx = self.mock.used().idx().load();
        if idx == self.next_used {
            return None;
        }
        let e = self
            .mock
            .used()
            .ring()
            .ref_at(usize::from(self.next_used))
            .unwrap()
            .load();
        self.next_used += 1;
        Some((e.id(), e.len()))
    }

    /// `len` bytes of guest memory at `addr`.
    pub fn read(&self, addr: GuestAddress, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, addr).unwrap();
        v
    }
}
