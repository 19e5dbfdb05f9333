//! The vsock virtqueues: packets parsed from descriptor chains and moved between the guest and
//! a [`VsockChannel`]. Independent of the transport and the event loop: the caller owns the
//! queues and signals the guest when told to, so the MMIO device and a vhost-user daemon share
//! this code.
//!
//! Tx chains may be laid out any way (virtio 1.x: the device must not assume a descriptor
//! arrangement). The common layouts — header and data in one descriptor (Linux ≥ 6.2), or a
//! header descriptor and one data descriptor — are read in place; any other (Linux 6.12 sends
//! a large write as a header descriptor plus one descriptor per page of data) is gathered into
//! a bounce buffer first. Rx buffers are taken in the two layouts Linux posts: one descriptor,
//! or header plus data.

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use virtio_vsock::packet::{VsockPacket, PKT_HEADER_SIZE};
use vm_memory::{Bytes, GuestAddress};

use super::backend::VsockChannel;
use crate::virtio::GuestMemory;

/// The largest packet payload accepted from, or offered to, the guest.
pub const MAX_PKT_DATA: u32 = 64 * 1024;

/// Offset of the header's little-endian `len` field.
const HDR_LEN_OFFSET: usize = 24;

/// Hands every packet in the guest's tx queue to `backend`; every chain is given back, a
/// malformed one unread. Returns whether the guest should be notified.
pub fn process_tx<C: VsockChannel>(mem: &GuestMemory, queue: &mut Queue, backend: &mut C) -> bool {
    let mut used = false;
    while let Some(chain) = queue.pop_descriptor_chain(mem) {
        let head = chain.head_index();
        match VsockPacket::from_tx_virtq_chain(mem, &mut chain.clone(), MAX_PKT_DATA) {
            Ok(pkt) => backend.send_pkt(&pkt),
            // Not one of the in-place layouts, or malformed: the general reader decides.
            Err(_) => match gather_tx(mem, chain) {
                Ok(mut bytes) => send_gathered(&mut bytes, backend),
                Err(e) => log(format_args!("dropping a malformed tx packet: {e}")),
            },
        }
        if let Err(e) = queue.add_used(mem, head, 0) {
            log(format_args!("cannot return a tx chain: {e}"));
        }
        used = true;
    }
    used && queue.needs_notification(mem).unwrap_or(true)
}

/// Why a tx chain holds no packet.
#[derive(Debug, thiserror::Error)]
enum GatherError {
    #[error("a write-only descriptor in a tx chain")]
    WriteOnly,
    #[error("the chain ends after {got} of the {want} bytes the packet needs")]
    Short { got: usize, want: usize },
    #[error("the header announces {0} bytes of data, more than {MAX_PKT_DATA}")]
    TooLong(u32),
    #[error("a descriptor at {addr:#x} outside guest memory")]
    Memory {
        addr: u64,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
}

/// The header and data of a tx chain of any layout, copied out of guest memory: header first,
/// then exactly the `len` data bytes it announces (at most [`MAX_PKT_DATA`]); bytes past those
/// are ignored, as the in-place parser ignores them.
fn gather_tx(
    mem: &GuestMemory,
    chain: DescriptorChain<&GuestMemory>,
) -> Result<Vec<u8>, GatherError> {
    // The header first; once it is in, `want` grows by the data length it announces.
    let mut want = PKT_HEADER_SIZE;
    let mut bytes = vec![0u8; want];
    let mut got = 0;
    for desc in chain {
        if desc.is_write_only() {
            return Err(GatherError::WriteOnly);
        }
        let mut addr = desc.addr();
        let mut left = desc.len() as usize;
        while left > 0 && got < want {
            let n = left.min(want - got);
            mem.read_slice(&mut bytes[got..got + n], addr)
                .map_err(|source| GatherError::Memory {
                    addr: addr.0,
                    source,
                })?;
            got += n;
            left -= n;
            addr = GuestAddress(addr.0.wrapping_add(n as u64));
            if got == PKT_HEADER_SIZE {
                let len = header_len(&bytes);
                if len > MAX_PKT_DATA {
                    return Err(GatherError::TooLong(len));
                }
                want += len as usize;
                bytes.resize(want, 0);
            }
        }
        if got == want {
            return Ok(bytes);
        }
    }
    Err(GatherError::Short { got, want })
}

/// The `len` field of a packet header.
fn header_len(header: &[u8]) -> u32 {
    let mut field = [0u8; 4];
    field.copy_from_slice(&header[HDR_LEN_OFFSET..HDR_LEN_OFFSET + 4]);
    u32::from_le_bytes(field)
}

/// Hands a gathered packet (`header ‖ data`) to `backend`.
fn send_gathered<C: VsockChannel>(bytes: &mut [u8], backend: &mut C) {
    let (header, data) = bytes.split_at_mut(PKT_HEADER_SIZE);
    let raw_header = header.to_vec();
    let data = (!data.is_empty()).then_some(data);
    // SAFETY: the packet's slices point into `bytes`, which this function borrows mutably for
    // longer than the packet lives (it is dropped before returning), so the memory stays valid
    // and nothing else touches it meanwhile.
    let pkt = unsafe { VsockPacket::new(header, data) };
    match pkt {
        Ok(mut pkt) => match pkt.set_header_from_raw(&raw_header) {
            Ok(()) => backend.send_pkt(&pkt),
            Err(e) => log(format_args!("dropping a gathered tx packet: {e}")),
        },
        Err(e) => log(format_args!("dropping a gathered tx packet: {e}")),
    }
}

/// Fills the guest's rx buffers with what `backend` has, while it has something and the guest
/// has buffers. Returns whether the guest should be notified.
pub fn process_rx<C: VsockChannel>(mem: &GuestMemory, queue: &mut Queue, backend: &mut C) -> bool {
    let mut used = false;
    while backend.has_pending_rx() {
        let Some(mut chain) = queue.pop_descriptor_chain(mem) else {
            break;
        };
        let head = chain.head_index();
        let len = match VsockPacket::from_rx_virtq_chain(mem, &mut chain, MAX_PKT_DATA) {
            Ok(mut pkt) => {
                if !backend.recv_pkt(&mut pkt) {
                    // Nothing after all (a socket that had no data): give the buffer back.
                    queue.go_to_previous_position();
                    break;
                }
                // A backend can only have written as much data as the buffer holds.
                let room = pkt.data_slice().map_or(0, |d| d.len());
                let data = (pkt.len() as usize).min(room);
                (PKT_HEADER_SIZE + data) as u32
            }
            Err(e) => {
                log(format_args!("dropping a malformed rx buffer: {e}"));
                0
            }
        };
        if let Err(e) = queue.add_used(mem, head, len) {
            log(format_args!("cannot return an rx chain: {e}"));
        }
        used = true;
    }
    used && queue.needs_notification(mem).unwrap_or(true)
}

fn log(args: std::fmt::Arguments<'_>) {
    eprintln!("crucible-vmm: vsock: {args}");
}

#[cfg(test)]
mod tests {
    //! The queue code against a fake backend: no sockets, just the packets it was handed and
    //! the packets it was asked for.
    #![allow(clippy::unwrap_used)]

    use std::collections::VecDeque;

    use vm_memory::bitmap::BitmapSlice;
    use vm_memory::Bytes;

    use super::*;
    use crate::virtio::test_utils::{default_mem, Buf, TestQueue};
    use crate::virtio::vsock::op;

    /// What the fake saw of a guest packet.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) struct Seen {
        pub op: u16,
        pub src_port: u32,
        pub dst_port: u32,
        pub data: Vec<u8>,
    }

    /// A packet the fake hands the guest.
    #[derive(Debug, Clone)]
    pub(crate) struct Out {
        pub op: u16,
        pub data: Vec<u8>,
    }

    /// A backend that records tx packets and replays scripted rx packets.
    #[derive(Debug, Default)]
    pub(crate) struct FakeBackend {
        pub sent: Vec<Seen>,
        pub to_guest: VecDeque<Out>,
        /// Claim to have rx this many times while having nothing (a socket that had no data).
        pub phantom_rx: usize,
        pub events: usize,
        pub resets: usize,
    }

    impl VsockChannel for FakeBackend {
        fn send_pkt<B: BitmapSlice>(&mut self, pkt: &VsockPacket<'_, B>) {
            let data = pkt.data_slice().map_or_else(Vec::new, |d| {
                let mut v = vec![0u8; d.len()];
                d.copy_to(&mut v[..]);
                v
            });
            self.sent.push(Seen {
                op: pkt.op(),
                src_port: pkt.src_port(),
                dst_port: pkt.dst_port(),
                data,
            });
        }

        fn recv_pkt<B: BitmapSlice>(&mut self, pkt: &mut VsockPacket<'_, B>) -> bool {
            if self.phantom_rx > 0 {
                self.phantom_rx -= 1;
                return false;
            }
            let Some(out) = self.to_guest.pop_front() else {
                return false;
            };
            pkt.set_op(out.op).set_len(out.data.len() as u32);
            if let Some(d) = pkt.data_slice() {
                d.write_slice(&out.data, 0).unwrap();
            }
            true
        }

        fn has_pending_rx(&self) -> bool {
            self.phantom_rx > 0 || !self.to_guest.is_empty()
        }
    }

    impl crate::virtio::vsock::backend::VsockBackend for FakeBackend {
        fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
            None
        }
        fn process_events(&mut self) {
            self.events += 1;
        }
        fn reset(&mut self) {
            self.resets += 1;
            self.to_guest.clear();
        }
    }

    pub(crate) fn header(op: u16, src: u32, dst: u32, len: u32) -> Vec<u8> {
        let mut h = vec![0u8; PKT_HEADER_SIZE];
        h[0..8].copy_from_slice(&3u64.to_le_bytes());
        h[8..16].copy_from_slice(&2u64.to_le_bytes());
        h[16..20].copy_from_slice(&src.to_le_bytes());
        h[20..24].copy_from_slice(&dst.to_le_bytes());
        h[24..28].copy_from_slice(&len.to_le_bytes());
        h[28..30].copy_from_slice(&1u16.to_le_bytes());
        h[30..32].copy_from_slice(&op.to_le_bytes());
        h
    }

    #[test]
    fn tx_packets_reach_the_backend_in_order_and_every_chain_is_returned() {
        let mem = default_mem();
        let mut tx = TestQueue::new(&mem, 1, 256);
        let mut q = tx.queue();
        let mut backend = FakeBackend::default();
        tx.add(&[Buf::R(&header(op::REQUEST, 10, 20, 0))]);
        tx.add(&[Buf::R(&header(op::RW, 10, 20, 3)), Buf::R(b"abc")]);
        let mut single = header(op::RW, 10, 20, 2);
        single.extend_from_slice(b"de");
        tx.add(&[Buf::R(&single)]);
        tx.add(&[Buf::W(64)]); // Malformed: a write-only tx descriptor.
        tx.add(&[Buf::R(&[0u8; 8])]); // Malformed: shorter than a header.
        assert!(process_tx(&mem, &mut q, &mut backend));
        let ops: Vec<(u16, Vec<u8>)> = backend
            .sent
            .iter()
            .map(|s| (s.op, s.data.clone()))
            .collect();
        assert_eq!(
            ops,
            [
                (op::REQUEST, vec![]),
                (op::RW, b"abc".to_vec()),
                (op::RW, b"de".to_vec())
            ]
        );
        assert_eq!(
            (backend.sent[0].src_port, backend.sent[0].dst_port),
            (10, 20)
        );
        let mut returned = 0;
        while let Some((_, len)) = tx.used() {
            assert_eq!(len, 0);
            returned += 1;
        }
        assert_eq!(returned, 5, "malformed chains are given back too");
        // Nothing new: no notification.
        assert!(!process_tx(&mem, &mut q, &mut backend));
    }

    /// Linux 6.12 sends a large write as a header descriptor plus one descriptor per page of
    /// data (a non-linear skb); the in-place parser takes only one data descriptor, so such
    /// packets were dropped and the exec stream lost data after the first 4 KiB (found by the
    /// first Linux driver against the device, over vhost-user under QEMU).
    #[test]
    fn tx_packet_with_data_over_many_descriptors_reaches_the_backend_whole() {
        let mem = default_mem();
        let mut tx = TestQueue::new(&mem, 1, 256);
        let mut q = tx.queue();
        let mut backend = FakeBackend::default();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        // Linux's layout: the header alone, then page-sized pieces and a tail.
        tx.add(&[
            Buf::R(&header(op::RW, 10, 20, data.len() as u32)),
            Buf::R(&data[..4096]),
            Buf::R(&data[4096..8192]),
            Buf::R(&data[8192..]),
        ]);
        // Any layout is legal: a header split across descriptors, data sharing the second one,
        // and bytes past the announced length (ignored, as the in-place parser ignores them).
        let mut split = header(op::RW, 11, 21, 5);
        split.extend_from_slice(b"abcdeTRAILING");
        tx.add(&[
            Buf::R(&split[..30]),
            Buf::R(&split[30..46]),
            Buf::R(&split[46..]),
        ]);
        // Data in zero-length descriptors and one-byte pieces.
        let short = header(op::RW, 12, 22, 3);
        tx.add(&[
            Buf::R(&short),
            Buf::R(&[]),
            Buf::R(b"x"),
            Buf::R(b"y"),
            Buf::R(b"z"),
        ]);
        assert!(process_tx(&mem, &mut q, &mut backend));
        let seen: Vec<(u32, Vec<u8>)> = backend
            .sent
            .iter()
            .map(|s| (s.src_port, s.data.clone()))
            .collect();
        assert_eq!(
            seen,
            [(10, data), (11, b"abcde".to_vec()), (12, b"xyz".to_vec())]
        );
        assert_eq!(backend.sent[1].op, op::RW);
        assert_eq!(backend.sent[1].dst_port, 21);
        for _ in 0..3 {
            assert_eq!(tx.used().unwrap().1, 0);
        }
    }

    #[test]
    fn tx_chain_of_any_layout_is_still_checked_and_given_back_when_malformed() {
        let mem = default_mem();
        let mut tx = TestQueue::new(&mem, 1, 256);
        let mut q = tx.queue();
        let mut backend = FakeBackend::default();
        // The chain ends before the data its header announces.
        tx.add(&[
            Buf::R(&header(op::RW, 10, 20, 100)),
            Buf::R(&[1; 40]),
            Buf::R(&[2; 40]),
        ]);
        // A header split across descriptors, then nothing.
        tx.add(&[Buf::R(&header(op::RW, 10, 20, 0)[..20]), Buf::R(&[0; 4])]);
        // A write-only descriptor among the data.
        tx.add(&[
            Buf::R(&header(op::RW, 10, 20, 8)),
            Buf::R(&[1; 4]),
            Buf::W(4),
        ]);
        // More data than a packet may carry, however it is laid out.
        let huge = vec![0u8; MAX_PKT_DATA as usize / 2];
        tx.add(&[
            Buf::R(&header(op::RW, 10, 20, MAX_PKT_DATA + 1)),
            Buf::R(&huge),
            Buf::R(&huge),
            Buf::R(&[0]),
        ]);
        assert!(process_tx(&mem, &mut q, &mut backend));
        assert!(backend.sent.is_empty(), "{:?}", backend.sent);
        for _ in 0..4 {
            assert_eq!(tx.used().unwrap().1, 0);
        }
        assert!(tx.used().is_none());
    }

    #[test]
    fn rx_fills_buffers_while_the_backend_has_packets_and_reports_header_plus_data() {
        let mem = default_mem();
        let mut rx = TestQueue::new(&mem, 0, 256);
        let mut q = rx.queue();
        let mut backend = FakeBackend::default();
        let a = rx.add(&[Buf::W(PKT_HEADER_SIZE as u32), Buf::W(4096)]);
        let b = rx.add(&[Buf::W(PKT_HEADER_SIZE as u32 + 4096)]);
        rx.add(&[Buf::W(PKT_HEADER_SIZE as u32 + 4096)]);
        backend.to_guest.push_back(Out {
            op: op::RW,
            data: b"hello".to_vec(),
        });
        backend.to_guest.push_back(Out {
            op: op::CREDIT_UPDATE,
            data: vec![],
        });
        assert!(process_rx(&mem, &mut q, &mut backend));
        assert_eq!(rx.used().unwrap().1, PKT_HEADER_SIZE as u32 + 5);
        assert_eq!(rx.read(a[1], 5), b"hello");
        assert_eq!(
            u16::from_le_bytes(rx.read(a[0], PKT_HEADER_SIZE)[30..32].try_into().unwrap()),
            op::RW
        );
        assert_eq!(rx.used().unwrap().1, PKT_HEADER_SIZE as u32);
        assert_eq!(
            u16::from_le_bytes(rx.read(b[0], PKT_HEADER_SIZE)[30..32].try_into().unwrap()),
            op::CREDIT_UPDATE
        );
        // The third buffer stays with the device: nothing to put in it.
        assert!(rx.used().is_none());
        backend.to_guest.push_back(Out {
            op: op::RST,
            data: vec![],
        });
        assert!(process_rx(&mem, &mut q, &mut backend));
        assert_eq!(rx.used().unwrap().1, PKT_HEADER_SIZE as u32);
    }

    #[test]
    fn rx_buffer_is_given_back_unused_when_the_backend_had_nothing_after_all() {
        let mem = default_mem();
        let mut rx = TestQueue::new(&mem, 0, 256);
        let mut q = rx.queue();
        let mut backend = FakeBackend {
            phantom_rx: 1,
            ..FakeBackend::default()
        };
        rx.add(&[Buf::W(PKT_HEADER_SIZE as u32 + 64)]);
        assert!(
            !process_rx(&mem, &mut q, &mut backend),
            "no used buffer, no interrupt"
        );
        assert!(rx.used().is_none());
        // The same buffer serves the next real packet.
        backend.to_guest.push_back(Out {
            op: op::RW,
            data: b"x".to_vec(),
        });
        assert!(process_rx(&mem, &mut q, &mut backend));
        assert_eq!(rx.used().unwrap().1, PKT_HEADER_SIZE as u32 + 1);
    }

    #[test]
    fn rx_used_length_never_exceeds_the_buffer_even_if_the_backend_claims_more() {
        let mem = default_mem();
        let mut rx = TestQueue::new(&mem, 0, 256);
        let mut q = rx.queue();
        let mut backend = FakeBackend::default();
        rx.add(&[Buf::W(PKT_HEADER_SIZE as u32), Buf::W(16)]);
        backend.to_guest.push_back(Out {
            op: op::RW,
            data: vec![],
        });
        // A lying header length: the guest is told only what fits.
        struct Liar(FakeBackend);
        impl VsockChannel for Liar {
            fn send_pkt<B: BitmapSlice>(&mut self, pkt: &VsockPacket<'_, B>) {
                self.0.send_pkt(pkt)
            }
            fn recv_pkt<B: BitmapSlice>(&mut self, pkt: &mut VsockPacket<'_, B>) -> bool {
                let r = self.0.recv_pkt(pkt);
                pkt.set_len(1 << 20);
                r
            }
            fn has_pending_rx(&self) -> bool {
                self.0.has_pending_rx()
            }
        }
        let mut liar = Liar(backend);
        assert!(process_rx(&mem, &mut q, &mut liar));
        assert_eq!(rx.used().unwrap().1, PKT_HEADER_SIZE as u32 + 16);
    }

    #[test]
    fn malformed_rx_buffer_is_returned_empty_and_the_packet_waits_for_a_good_one() {
        let mem = default_mem();
        let mut rx = TestQueue::new(&mem, 0, 256);
        let mut q = rx.queue();
        let mut backend = FakeBackend::default();
        rx.add(&[Buf::R(&[0u8; PKT_HEADER_SIZE])]); // Read-only: unusable for rx.
        rx.add(&[Buf::W(PKT_HEADER_SIZE as u32 + 8)]);
        backend.to_guest.push_back(Out {
            op: op::RW,
            data: b"kept".to_vec(),
        });
        assert!(process_rx(&mem, &mut q, &mut backend));
        assert_eq!(rx.used().unwrap().1, 0);
        assert_eq!(rx.used().unwrap().1, PKT_HEADER_SIZE as u32 + 4);
        assert!(backend.to_guest.is_empty());
    }

    #[test]
    fn device_over_a_fake_backend_routes_queues_events_and_reset_to_it() {
        use crate::virtio::test_utils::interrupt;
        use crate::virtio::vsock::Vsock;
        use crate::virtio::{VirtioDevice, INT_VRING};

        let mem = default_mem();
        let mut rx = TestQueue::new(&mem, 0, 256);
        let mut tx = TestQueue::new(&mem, 1, 256);
        let ev = TestQueue::new(&mem, 2, 256);
        let mut dev = Vsock::with_backend(7, FakeBackend::default()).unwrap();
        let mut cid = [0u8; 8];
        dev.read_config(0, &mut cid);
        assert_eq!(u64::from_le_bytes(cid), 7);
        let irq = interrupt();
        dev.activate(
            mem.clone(),
            irq.clone(),
            vec![rx.queue(), tx.queue(), ev.queue()],
        )
        .unwrap();

        // A tx notification hands the packet to the backend and interrupts the guest.
        tx.add(&[Buf::R(&header(op::REQUEST, 5, 6, 0))]);
        dev.process_queue(1);
        assert_eq!(dev.backend().sent.len(), 1);
        assert_eq!(dev.backend().sent[0].op, op::REQUEST);
        assert!(tx.used().is_some());
        assert_eq!(irq.status() & INT_VRING, INT_VRING);
        irq.ack(INT_VRING);

        // Backend readiness: the backend runs, then what it has fills the rx queue.
        rx.add(&[Buf::W(PKT_HEADER_SIZE as u32 + 16)]);
        dev.process_queue(0);
        assert!(rx.used().is_none(), "nothing to send yet");
        assert_eq!(irq.status(), 0, "no used buffer, no interrupt");
        dev.backend_mut().to_guest.push_back(Out {
            op: op::RESPONSE,
            data: vec![],
        });
        dev.process_backend();
        assert_eq!(dev.backend().events, 1);
        assert_eq!(rx.used().unwrap().1, PKT_HEADER_SIZE as u32);
        assert_eq!(irq.status() & INT_VRING, INT_VRING);

        // A driver reset reaches the backend; a reset device touches no queue.
        dev.reset();
        assert_eq!(dev.backend().resets, 1);
        assert!(!dev.is_activated());
        tx.add(&[Buf::R(&header(op::RW, 5, 6, 0))]);
        dev.process_queue(1);
        assert_eq!(dev.backend().sent.len(), 1);
    }
}
