//! The vsock device and muxer driven through virtqueues in plain guest memory and real Unix
//! sockets: handshakes both ways, data both ways, credit, RST, single- and split-descriptor
//! packets, the connection limit, and every deadline (handshake, stall) with the muxer's clock
//! moved forward explicitly rather than slept through.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use vm_memory::GuestAddress;

use super::connection::{ConnState, Timeouts};
use super::muxer::TX_BUF_SIZE;
use super::*;
use crate::virtio::test_utils::{default_mem, interrupt, Buf, TestQueue};
use crate::virtio::{GuestMemory, VirtioDevice};

const CID: u64 = 3;
const HDR: usize = 44;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Hdr {
    src_cid: u64,
    dst_cid: u64,
    src_port: u32,
    dst_port: u32,
    len: u32,
    op: u16,
    flags: u32,
    buf_alloc: u32,
    fwd_cnt: u32,
}

impl Hdr {
    /// A guest → host packet from guest port `gport` to host port `hport`.
    fn guest(op: u16, gport: u32, hport: u32) -> Self {
        Hdr {
            src_cid: CID,
            dst_cid: HOST_CID,
            src_port: gport,
            dst_port: hport,
            op,
            buf_alloc: 64 * 1024,
            ..Hdr::default()
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HDR);
        v.extend_from_slice(&self.src_cid.to_le_bytes());
        v.extend_from_slice(&self.dst_cid.to_le_bytes());
        v.extend_from_slice(&self.src_port.to_le_bytes());
        v.extend_from_slice(&self.dst_port.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v.extend_from_slice(&TYPE_STREAM.to_le_bytes());
        v.extend_from_slice(&self.op.to_le_bytes());
        v.extend_from_slice(&self.flags.to_le_bytes());
        v.extend_from_slice(&self.buf_alloc.to_le_bytes());
        v.extend_from_slice(&self.fwd_cnt.to_le_bytes());
        v
    }

    fn parse(b: &[u8]) -> Self {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap());
        assert_eq!(u16_at(28), TYPE_STREAM);
        Hdr {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }
}

struct Harness<'a> {
    dev: Vsock,
    rx: TestQueue<'a>,
    tx: TestQueue<'a>,
    /// Rx chains given to the device, oldest first: (header addr, data addr).
    rx_bufs: std::collections::VecDeque<(GuestAddress, GuestAddress)>,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl<'a> Harness<'a> {
    fn new(mem: &'a GuestMemory, max_conns: usize) -> Self {
        Self::with_config(mem, MuxerConfig::new(max_conns))
    }

    fn with_config(mem: &'a GuestMemory, config: MuxerConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        let mut dev = Vsock::with_config(CID, &path, config).unwrap();
        let rx = TestQueue::new(mem, 0, 256);
        let tx = TestQueue::new(mem, 1, 256);
        let ev = TestQueue::new(mem, 2, 256);
        dev.activate(
            mem.clone(),
            interrupt(),
            vec![rx.queue(), tx.queue(), ev.queue()],
        )
        .unwrap();
        Harness {
            dev,
            rx,
            tx,
            rx_bufs: Default::default(),
            path,
            _dir: dir,
        }
    }

    /// The guest posts `n` rx buffers of 4 KiB data: split (header + data descriptors) or in one
    /// descriptor.
    fn give_rx(&mut self, n: usize, split: bool) {
        for _ in 0..n {
            if split {
                let a = self.rx.add(&[Buf::W(HDR as u32), Buf::W(4096)]);
                self.rx_bufs.push_back((a[0], a[1]));
            } else {
                let a = self.rx.add(&[Buf::W(HDR as u32 + 4096)]);
                self.rx_bufs
                    .push_back((a[0], GuestAddress(a[0].0 + HDR as u64)));
            }
        }
        self.dev.process_queue(0);
    }

    /// The guest sends a packet: header and data in one descriptor or two.
    fn send(&mut self, mut h: Hdr, data: &[u8], split: bool) {
        h.len = data.len() as u32;
        if data.is_empty() {
            self.tx.add(&[Buf::R(&h.bytes())]);
        } else if split {
            self.tx.add(&[Buf::R(&h.bytes()), Buf::R(data)]);
        } else {
            let mut b = h.bytes();
            b.extend_from_slice(data);
            self.tx.add(&[Buf::R(&b)]);
        }
        self.dev.process_queue(1);
        while self.tx.used().is_some() {}
    }

    /// Lets the backend handle its sockets (as the event loop does).
    fn pump(&mut self) {
        std::thread::sleep(Duration::from_millis(5));
        self.dev.process_backend();
    }

    /// As [`Self::pump`], with the muxer's clock at `now` (deadlines are checked against it).
    fn pump_at(&mut self, now: Instant) {
        std::thread::sleep(Duration::from_millis(5));
        self.dev.backend_mut().process_events_at(now);
        self.dev.process_queue(0);
    }

    /// The next packet the device gave the guest.
    fn recv(&mut self) -> Option<(Hdr, Vec<u8>)> {
        let (_, len) = self.rx.used()?;
        let (ha, da) = self.rx_bufs.pop_front().unwrap();
        let h = Hdr::parse(&self.rx.read(ha, HDR));
        assert_eq!(len as usize, HDR + h.len as usize);
        Some((h, self.rx.read(da, h.len as usize)))
    }

    fn expect(&mut self, op: u16) -> (Hdr, Vec<u8>) {
        let (h, d) = self
            .recv()
            .unwrap_or_else(|| panic!("expected op {op}, got nothing"));
        assert_eq!(h.op, op, "{h:?}");
        assert_eq!((h.src_cid, h.dst_cid), (HOST_CID, CID));
        (h, d)
    }

    /// A host client connects to guest port `port` (which the guest accepts); returns it and the
    /// host port it got.
    fn host_connect(&mut self, port: u32) -> (UnixStream, u32) {
        let mut c = UnixStream::connect(&self.path).unwrap();
        c.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
        self.pump();
        let (req, _) = self.expect(op::REQUEST);
        assert_eq!(req.dst_port, port);
        self.send(Hdr::guest(op::RESPONSE, port, req.src_port), &[], true);
        let mut line = [0u8; 64];
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let n = c.read(&mut line).unwrap();
        assert_eq!(
            std::str::from_utf8(&line[..n]).unwrap(),
            format!("OK {}\n", req.src_port)
        );
        (c, req.src_port)
    }
}

fn read_exact_timeout(c: &mut UnixStream, n: usize) -> Vec<u8> {
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut v = vec![0u8; n];
    c.read_exact(&mut v).unwrap();
    v
}

fn assert_closed(c: &mut UnixStream) {
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = [0u8; 16];
    match c.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the socket closed, got {other:?}"),
    }
}

#[test]
fn vsock_host_connect_handshake_then_data_both_ways_split_and_single_descriptor() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(2, true);
    let (mut c, hport) = h.host_connect(1024);

    // Host → guest, into a split rx buffer.
    c.write_all(b"ping").unwrap();
    h.pump();
    let (pkt, data) = h.expect(op::RW);
    assert_eq!((pkt.src_port, pkt.dst_port), (hport, 1024));
    assert_eq!(data, b"ping");
    assert_eq!(pkt.buf_alloc, TX_BUF_SIZE);

    // Host → guest, into a single-descriptor rx buffer (Linux ≥ 6.2).
    h.give_rx(1, false);
    c.write_all(b"again").unwrap();
    h.pump();
    assert_eq!(h.expect(op::RW).1, b"again");

    // Guest → host, split and single-descriptor tx packets.
    h.send(Hdr::guest(op::RW, 1024, hport), b"pong", true);
    h.send(Hdr::guest(op::RW, 1024, hport), b"-single", false);
    assert_eq!(read_exact_timeout(&mut c, 11), b"pong-single");

    // The guest closes: RST back, the host socket closes.
    h.give_rx(1, true);
    let mut shut = Hdr::guest(op::SHUTDOWN, 1024, hport);
    shut.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
    h.send(shut, &[], true);
    h.expect(op::RST);
    assert_closed(&mut c);
    assert_eq!(h.dev.muxer().connection_count(), 0);
}

#[test]
fn vsock_host_connect_to_a_port_nobody_listens_on_is_closed_not_dropped() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(1, true);
    let mut c = UnixStream::connect(&h.path).unwrap();
    c.write_all(b"CONNECT 4444\n").unwrap();
    h.pump();
    let (req, _) = h.expect(op::REQUEST);
    h.send(Hdr::guest(op::RST, 4444, req.src_port), &[], true);
    assert_closed(&mut c);
    assert_eq!(h.dev.muxer().connection_count(), 0);

    // A malformed handshake line is closed too.
    let mut bad = UnixStream::connect(&h.path).unwrap();
    bad.write_all(b"HELLO\n").unwrap();
    h.pump();
    assert_closed(&mut bad);
}

#[test]
fn vsock_host_eof_becomes_a_guest_shutdown() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(2, true);
    let (c, hport) = h.host_connect(1024);
    drop(c);
    h.pump();
    let (pkt, _) = h.expect(op::SHUTDOWN);
    assert_eq!(pkt.flags, SHUTDOWN_RCV | SHUTDOWN_SEND);
    // Waiting for the guest's RST, the hung-up socket must not keep the muxer readable (that
    // would spin the event loop).
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(h.dev.muxer()),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 0);
    h.send(Hdr::guest(op::RST, 1024, hport), &[], true);
    assert_eq!(h.dev.muxer().connection_count(), 0);
}

#[test]
fn vsock_guest_connect_goes_to_uds_path_port_suffix() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    let ready = UnixListener::bind(format!("{}_1025", h.path.display())).unwrap();
    h.give_rx(3, true);
    h.send(Hdr::guest(op::REQUEST, 6000, 1025), &[], true);
    let (mut s, _) = ready.accept().unwrap();
    let (resp, _) = h.expect(op::RESPONSE);
    assert_eq!((resp.src_port, resp.dst_port), (1025, 6000));
    h.send(Hdr::guest(op::RW, 6000, 1025), b"{\"hello\":1}", false);
    assert_eq!(read_exact_timeout(&mut s, 11), b"{\"hello\":1}");
    s.write_all(b"ack").unwrap();
    h.pump();
    assert_eq!(h.expect(op::RW).1, b"ack");

    // No listener for port 1026: RST.
    h.send(Hdr::guest(op::REQUEST, 6001, 1026), &[], true);
    let (rst, _) = h.expect(op::RST);
    assert_eq!((rst.src_port, rst.dst_port), (1026, 6001));
}

#[test]
fn vsock_host_to_guest_data_respects_guest_credit() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(1, true);
    let mut c = UnixStream::connect(&h.path).unwrap();
    c.write_all(b"CONNECT 1024\n").unwrap();
    h.pump();
    let (req, _) = h.expect(op::REQUEST);
    let hport = req.src_port;
    // The guest has room for 8 bytes only.
    let mut resp = Hdr::guest(op::RESPONSE, 1024, hport);
    resp.buf_alloc = 8;
    h.send(resp, &[], true);
    let mut ok = [0u8; 32];
    let _ = c.read(&mut ok).unwrap();

    c.write_all(&[b'x'; 20]).unwrap();
    h.give_rx(4, true);
    h.pump();
    let (pkt, data) = h.expect(op::RW);
    assert_eq!(data.len(), 8);
    h.pump();
    // Out of credit: the device asks for more rather than overrunning the guest.
    h.expect(op::CREDIT_REQUEST);
    assert!(h.recv().is_none());

    // The guest consumed 8 bytes.
    let mut upd = Hdr::guest(op::CREDIT_UPDATE, 1024, hport);
    upd.buf_alloc = 8;
    upd.fwd_cnt = 8;
    h.send(upd, &[], true);
    h.pump();
    assert_eq!(h.expect(op::RW).1.len(), 8);
    assert_eq!(pkt.dst_port, 1024);

    // A guest credit request is answered with our counters.
    h.send(Hdr::guest(op::CREDIT_REQUEST, 1024, hport), &[], true);
    let (upd, _) = h.expect(op::CREDIT_UPDATE);
    assert_eq!(upd.buf_alloc, TX_BUF_SIZE);
    assert_eq!(upd.fwd_cnt, 0);
}

#[test]
fn vsock_guest_overrunning_its_credit_gets_rst_and_the_device_stays_bounded() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(2, true);
    let (c, hport) = h.host_connect(1024);
    // The host never reads; the guest ignores the credit and keeps sending 64 KiB packets.
    let chunk = vec![7u8; 64 * 1024];
    let mut rst = false;
    for _ in 0..40 {
        h.give_rx(1, true);
        h.send(Hdr::guest(op::RW, 1024, hport), &chunk, true);
        while let Some((pkt, _)) = h.recv() {
            rst |= pkt.op == op::RST;
        }
        if rst {
            break;
        }
    }
    assert!(rst, "an overrun must end in RST");
    assert_eq!(h.dev.muxer().connection_count(), 0);
    drop(c);
}

#[test]
fn vsock_connection_limit_closes_extra_host_clients_and_rsts_extra_guest_connects() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 2);
    h.give_rx(8, true);
    let (_a, _) = h.host_connect(1024);
    let (_b, _) = h.host_connect(1024);
    let mut third = UnixStream::connect(&h.path).unwrap();
    let _ = third.write_all(b"CONNECT 1024\n");
    h.pump();
    assert_closed(&mut third);
    assert!(h.recv().is_none(), "no REQUEST for a refused client");

    let _l = UnixListener::bind(format!("{}_1025", h.path.display())).unwrap();
    h.send(Hdr::guest(op::REQUEST, 3, 1025), &[], true);
    h.expect(op::RST);
    assert_eq!(h.dev.muxer().connection_count(), 2);
}

#[test]
fn vsock_malformed_and_foreign_packets_never_panic() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(4, true);
    // A header descriptor too short to hold a header.
    h.tx.add(&[Buf::R(&[0u8; 10])]);
    // A header that claims more data than its descriptors hold.
    let mut lying = Hdr::guest(op::RW, 1, 2).bytes();
    lying[24..28].copy_from_slice(&1000u32.to_le_bytes());
    h.tx.add(&[Buf::R(&lying), Buf::R(&[0u8; 10])]);
    // A write-only tx descriptor.
    h.tx.add(&[Buf::W(64)]);
    h.dev.process_queue(1);
    let mut n = 0;
    while h.tx.used().is_some() {
        n += 1;
    }
    assert_eq!(n, 3, "every chain is given back");
    // Data for a connection that does not exist: RST. A spoofed source CID: ignored.
    h.send(Hdr::guest(op::RW, 1, 2), b"zz", true);
    h.expect(op::RST);
    let mut spoofed = Hdr::guest(op::REQUEST, 1, 2);
    spoofed.src_cid = 99;
    h.send(spoofed, &[], true);
    assert!(h.recv().is_none());
}

/// Whether the host end has been closed by the device (without waiting: the device is driven
/// only by this thread, so anything it did is already visible).
fn is_closed_now(c: &mut UnixStream) -> bool {
    c.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let closed = match c.read(&mut b) {
        Ok(0) => true,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        other => panic!("unexpected read on a host socket: {other:?}"),
    };
    c.set_nonblocking(false).unwrap();
    closed
}

fn config(handshake: Duration, stall: Option<Duration>) -> MuxerConfig {
    MuxerConfig {
        max_conns: 8,
        timeouts: Timeouts { handshake, stall },
    }
}

#[test]
fn vsock_host_connect_the_guest_never_answers_gets_eof_after_the_default_handshake_timeout() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(3, true);
    let before_connect = Instant::now();
    let mut c = UnixStream::connect(&h.path).unwrap();
    c.write_all(b"CONNECT 1024\n").unwrap();
    h.pump();
    let after_accept = Instant::now();
    let (req, _) = h.expect(op::REQUEST);
    // The guest never answers. Just before 2 s from the connect, nothing happens.
    h.pump_at(before_connect + Duration::from_millis(1990));
    assert!(h.recv().is_none());
    assert!(!is_closed_now(&mut c));
    assert_eq!(
        h.dev.muxer().connection_state(req.src_port, 1024),
        Some(ConnState::LocalInit)
    );
    // Past it: the client sees EOF and the guest is told to forget the half-open connection.
    h.pump_at(after_accept + Duration::from_millis(2001));
    let (rst, _) = h.expect(op::RST);
    assert_eq!((rst.src_port, rst.dst_port), (req.src_port, 1024));
    assert_closed(&mut c);
    assert_eq!(h.dev.muxer().connection_count(), 0);
    // A late RESPONSE finds nothing: RST again, no OK on a closed socket.
    h.send(Hdr::guest(op::RESPONSE, 1024, req.src_port), &[], true);
    h.expect(op::RST);
}

#[test]
fn vsock_handshake_deadline_fires_from_the_timer_with_no_other_event() {
    let mem = default_mem();
    let mut h = Harness::with_config(&mem, config(Duration::from_millis(50), None));
    h.give_rx(2, true);
    let mut c = UnixStream::connect(&h.path).unwrap();
    c.write_all(b"CONNECT 1024\n").unwrap();
    h.pump();
    h.expect(op::REQUEST);
    assert!(h.dev.muxer().next_deadline().is_some());
    // Nothing else happens: only the muxer's timer can make its fd readable.
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(h.dev.muxer()),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; the generous timeout only bounds a failing test.
    let ready = unsafe { libc::poll(&mut pfd, 1, 10_000) };
    assert_eq!(ready, 1, "the timer fired");
    h.dev.process_backend();
    h.expect(op::RST);
    assert_closed(&mut c);
    assert_eq!(h.dev.muxer().next_deadline(), None);
}

#[test]
fn vsock_silent_or_half_sent_connect_line_is_closed_after_the_handshake_timeout() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(2, true);
    let mut silent = UnixStream::connect(&h.path).unwrap();
    let mut partial = UnixStream::connect(&h.path).unwrap();
    partial.write_all(b"CONNECT 10").unwrap();
    h.pump();
    let accepted = Instant::now();
    assert_eq!(h.dev.muxer().connection_count(), 2);
    assert!(!is_closed_now(&mut silent));
    assert!(!is_closed_now(&mut partial));
    h.pump_at(accepted + Duration::from_millis(2001));
    assert_closed(&mut silent);
    assert_closed(&mut partial);
    assert_eq!(h.dev.muxer().connection_count(), 0);
    assert!(h.recv().is_none(), "the guest never heard of them");
}

#[test]
fn vsock_malformed_connect_lines_are_refused_at_once() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(2, true);
    let long = "C".repeat(40);
    for line in [
        "CONNECT 4294967296",
        "CONNECT x",
        "GET / HTTP/1.1\r\n",
        "CONNECT 12 34\n",
        long.as_str(),
    ] {
        let mut c = UnixStream::connect(&h.path).unwrap();
        c.write_all(line.as_bytes()).unwrap();
        // One pass of the event loop at the real time: no deadline can be involved.
        h.pump();
        assert!(is_closed_now(&mut c), "{line:?} was not refused at once");
        assert_eq!(h.dev.muxer().connection_count(), 0, "{line:?}");
    }
    assert!(h.recv().is_none());
}

#[test]
fn vsock_connection_starved_of_guest_credit_is_reset_after_the_stall_timeout() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(1, true);
    let mut c = UnixStream::connect(&h.path).unwrap();
    c.write_all(b"CONNECT 1024\n").unwrap();
    h.pump();
    let (req, _) = h.expect(op::REQUEST);
    let hport = req.src_port;
    let mut resp = Hdr::guest(op::RESPONSE, 1024, hport);
    resp.buf_alloc = 8;
    h.send(resp, &[], true);
    let mut ok = [0u8; 32];
    let _ = c.read(&mut ok).unwrap();
    c.write_all(&[b'x'; 20]).unwrap();
    h.give_rx(4, true);
    h.pump();
    assert_eq!(h.expect(op::RW).1.len(), 8);
    h.pump();
    h.expect(op::CREDIT_REQUEST);
    let stalled = Instant::now();
    // The guest never grants more credit; a zero-credit update is no progress.
    let mut upd = Hdr::guest(op::CREDIT_UPDATE, 1024, hport);
    upd.buf_alloc = 8;
    h.send(upd, &[], true);
    h.pump_at(stalled + Duration::from_secs(59));
    assert!(h.recv().is_none());
    assert_eq!(h.dev.muxer().connection_count(), 1);
    h.pump_at(stalled + Duration::from_secs(60));
    let (rst, _) = h.expect(op::RST);
    assert_eq!((rst.src_port, rst.dst_port), (hport, 1024));
    assert_closed(&mut c);
    assert_eq!(h.dev.muxer().connection_count(), 0);
}

/// The guest sends `TX_BUF_SIZE` (its whole credit) to a host that reads nothing: more than a
/// Unix socket buffers, so the rest waits in the device.
fn fill_until_the_host_socket_is_full(h: &mut Harness<'_>, hport: u32) {
    let chunk = vec![7u8; 64 * 1024];
    for _ in 0..TX_BUF_SIZE as usize / chunk.len() {
        h.send(Hdr::guest(op::RW, 1024, hport), &chunk, true);
    }
    while h.recv().is_some() {} // Credit updates.
    assert!(
        h.dev.muxer().connection_deadline(hport, 1024).is_some(),
        "precondition: the host socket took all {TX_BUF_SIZE} bytes; data must be waiting"
    );
}

#[test]
fn vsock_connection_whose_host_stops_reading_is_reset_after_the_stall_timeout() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(8, true);
    let (mut c, hport) = h.host_connect(1024);
    let before = Instant::now();
    fill_until_the_host_socket_is_full(&mut h, hport);
    h.pump_at(before + Duration::from_secs(59));
    assert!(h.recv().is_none());
    let later = Instant::now();
    h.pump_at(later + Duration::from_secs(60));
    h.expect(op::RST);
    assert_eq!(h.dev.muxer().connection_count(), 0);
    // The host sees what reached its socket, then EOF.
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut sink = Vec::new();
    let _ = c.read_to_end(&mut sink);
    assert!(!sink.is_empty() && sink.len() < TX_BUF_SIZE as usize);
}

#[test]
fn vsock_stall_timeout_none_never_resets_a_stalled_connection() {
    let mem = default_mem();
    let mut h = Harness::with_config(&mem, config(Duration::from_secs(2), None));
    h.give_rx(8, true);
    let (_c, hport) = h.host_connect(1024);
    let chunk = vec![7u8; 64 * 1024];
    for _ in 0..4 {
        h.send(Hdr::guest(op::RW, 1024, hport), &chunk, true);
    }
    h.pump_at(Instant::now() + Duration::from_secs(86_400));
    while let Some((p, _)) = h.recv() {
        assert_ne!(p.op, op::RST);
    }
    assert_eq!(h.dev.muxer().connection_count(), 1);
}

#[test]
fn vsock_idle_connection_is_never_reset() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(4, true);
    let (mut c, hport) = h.host_connect(1024);
    assert_eq!(
        h.dev.muxer().connection_deadline(hport, 1024),
        None,
        "nothing pending: no deadline"
    );
    h.pump_at(Instant::now() + Duration::from_secs(86_400));
    assert!(h.recv().is_none());
    c.write_all(b"still here").unwrap();
    h.pump();
    assert_eq!(h.expect(op::RW).1, b"still here");
}

/// The daemon's upload: the host shuts its write half and waits for the agent's answer. The
/// guest must be told only that the host sends no more (Linux resets on "receives no more"), and
/// its answer must still reach the host, long after the handshake timeout.
#[test]
fn vsock_host_half_close_still_carries_the_guest_answer() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(4, true);
    let (mut c, hport) = h.host_connect(1024);
    c.shutdown(std::net::Shutdown::Write).unwrap();
    h.pump();
    let (shut, _) = h.expect(op::SHUTDOWN);
    assert_eq!(shut.flags, SHUTDOWN_SEND);
    let later = Instant::now() + Duration::from_secs(10);
    h.pump_at(later);
    assert!(h.recv().is_none(), "no RST: the host still reads");
    h.send(Hdr::guest(op::RW, 1024, hport), b"files: 1", true);
    let mut shut = Hdr::guest(op::SHUTDOWN, 1024, hport);
    shut.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
    h.send(shut, &[], false);
    let mut answer = Vec::new();
    c.read_to_end(&mut answer).unwrap();
    assert_eq!(answer, b"files: 1");
    h.expect(op::RST);
    h.pump();
    assert_eq!(h.dev.muxer().connection_count(), 0);
}

#[test]
fn vsock_host_eof_then_guest_silence_is_reset_after_the_handshake_timeout() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(4, true);
    let (c, hport) = h.host_connect(1024);
    drop(c);
    h.pump();
    let eof_seen = Instant::now();
    h.expect(op::SHUTDOWN);
    h.pump_at(eof_seen + Duration::from_millis(2001));
    let (rst, _) = h.expect(op::RST);
    assert_eq!(rst.src_port, hport);
    assert_eq!(h.dev.muxer().connection_count(), 0);
}

#[test]
fn vsock_guest_shutdown_delivers_buffered_data_to_a_slow_host_before_rst() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    h.give_rx(8, true);
    let (mut c, hport) = h.host_connect(1024);
    fill_until_the_host_socket_is_full(&mut h, hport);
    let mut shut = Hdr::guest(op::SHUTDOWN, 1024, hport);
    shut.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
    h.send(shut, &[], true);
    assert!(
        h.recv().is_none(),
        "no RST while guest data is still on its way"
    );
    // The host reads slowly; every byte arrives, then EOF, then the guest gets its RST.
    c.set_nonblocking(true).unwrap();
    let mut got = 0;
    let mut rst = false;
    let mut buf = vec![0u8; 16 * 1024];
    for _ in 0..10_000 {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => h.pump(),
            Err(e) => panic!("host read: {e}"),
        }
        while let Some((p, _)) = h.recv() {
            rst |= p.op == op::RST;
        }
    }
    assert_eq!(got, TX_BUF_SIZE as usize);
    h.pump();
    while let Some((p, _)) = h.recv() {
        rst |= p.op == op::RST;
    }
    assert!(rst);
    assert_eq!(h.dev.muxer().connection_count(), 0);
}

#[test]
fn vsock_guest_connect_to_a_listener_with_a_full_backlog_is_reset_without_blocking() {
    let mem = default_mem();
    let mut h = Harness::new(&mem, 8);
    let port_path = std::path::PathBuf::from(format!("{}_1025", h.path.display()));
    // A daemon that stopped accepting: its backlog fills, and a blocking connect would wait
    // (freezing every device of the VM) until it accepts.
    let _listener = UnixListener::bind(&port_path).unwrap();
    let mut queued = Vec::new();
    loop {
        match super::muxer::connect_without_blocking(&port_path) {
            Ok(s) => queued.push(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the backlog: {e}"),
        }
        assert!(queued.len() < 100_000, "the backlog never filled");
    }
    // A regression would block below forever: fail loudly instead of hanging the suite.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if done_rx.recv_timeout(Duration::from_secs(20)).is_err() {
            eprintln!("the guest connect blocked on a full listener backlog");
            std::process::abort();
        }
    });
    h.give_rx(2, true);
    h.send(Hdr::guest(op::REQUEST, 7000, 1025), &[], true);
    let (rst, _) = h.expect(op::RST);
    assert_eq!((rst.src_port, rst.dst_port), (1025, 7000));
    done_tx.send(()).unwrap();
    assert_eq!(h.dev.muxer().connection_count(), 0);
}
