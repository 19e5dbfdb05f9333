//! The virtio-vsock device and its muxer driven by a fuzzer-scripted guest and host: the guest
//! sends packets (arbitrary headers, split or single-descriptor) and posts rx buffers of
//! arbitrary sizes through virtqueues in plain guest memory (the unit tests' `TestQueue`); host
//! clients connect to the device's Unix socket, write handshake lines and data, and close; a
//! host service accepts guest-initiated connections.
//!
//! Checked, for every packet the device puts in an rx buffer:
//! - it is well formed: from the host CID to the guest's, a stream packet with a known op, the
//!   used length exactly header + payload, a payload only on `RW` and never larger than the
//!   buffer, `buf_alloc` the advertised `TX_BUF_SIZE`;
//! - flow control holds: an `RW` payload never exceeds the credit the guest last advertised on
//!   that connection (`buf_alloc - (sent - fwd_cnt)`);
//! - no data is invented: the payload bytes the guest received never exceed what host clients
//!   wrote;
//! - the connection limit holds.

#![no_main]

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::num::Wrapping;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::OnceLock;

use crucible_devices::virtio::test_utils::{default_mem, interrupt, Buf, TestQueue};
use crucible_devices::virtio::vsock::muxer::TX_BUF_SIZE;
use crucible_devices::virtio::vsock::{op, Vsock, HOST_CID, TYPE_STREAM};
use crucible_devices::virtio::VirtioDevice;
use libfuzzer_sys::fuzz_target;
use vm_memory::GuestAddress;

const CID: u64 = 3;
const HDR: usize = 44;
const MAX_CONNS: usize = 4;
/// The host service port guest-initiated connections reach.
const SERVICE_PORT: u32 = 1024;
/// Descriptors per queue the script may use (the test queues have 256 and never wrap).
const DESC_BUDGET: usize = 240;
/// Chains per queue the script may post: `MockSplitQueue` lays the used ring out right after
/// the first half of the avail ring, so avail entries from size/2 on would overwrite it.
const CHAIN_BUDGET: usize = 127;

/// `CRUCIBLE_FUZZ_TRACE=1` prints every step and packet (for triaging a crash input).
fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("CRUCIBLE_FUZZ_TRACE").is_some())
}

fn socket_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("crucible-fuzz-vsock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir.join("v.sock")
    })
}

/// Reads script bytes; zeros once the input runs out.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head.to_vec()
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// The connection as the guest has told the device about it (the muxer keys by ports).
#[derive(Debug, Clone, Copy)]
struct Credit {
    buf_alloc: u32,
    fwd_cnt: Wrapping<u32>,
    sent: Wrapping<u32>,
}

/// (host port, guest port).
type Key = (u32, u32);

struct Harness<'a> {
    dev: Vsock,
    rx: TestQueue<'a>,
    tx: TestQueue<'a>,
    rx_descs: usize,
    tx_descs: usize,
    tx_chains: usize,
    rx_posted: usize,
    /// Rx chains given to the device by head index: (header address, header room, data
    /// address, data room).
    rx_chains: HashMap<u32, (GuestAddress, u32, GuestAddress, u32)>,
    credit: HashMap<Key, Credit>,
    /// Host-initiated connections whose REQUEST the guest got but has not answered yet.
    awaiting_guest: HashSet<Key>,
    clients: Vec<UnixStream>,
    service: UnixListener,
    written_by_host: u64,
    received_by_guest: u64,
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().expect("2 bytes"))
}

impl Harness<'_> {
    /// Checks every packet the device has returned since the last call.
    fn check_rx(&mut self) {
        assert!(self.dev.muxer().connection_count() <= MAX_CONNS);
        while let Some((head, used_len)) = self.rx.used() {
            let (hdr_addr, hdr_room, data_addr, data_room) = self
                .rx_chains
                .remove(&head)
                .expect("used head was never posted");
            if used_len == 0 {
                continue; // A buffer the device could not use (too small for a header).
            }
            assert!(
                hdr_room as usize >= HDR,
                "a packet in a buffer too small for its header"
            );
            let h = self.rx.read(hdr_addr, HDR);
            let (src_cid, dst_cid) = (u64_at(&h, 0), u64_at(&h, 8));
            let (src_port, dst_port, len) = (u32_at(&h, 16), u32_at(&h, 20), u32_at(&h, 24));
            let (kind, op_code) = (u16_at(&h, 28), u16_at(&h, 30));
            let (buf_alloc, _fwd_cnt) = (u32_at(&h, 36), u32_at(&h, 40));
            assert_eq!(
                (src_cid, dst_cid),
                (HOST_CID, CID),
                "packet between the wrong CIDs"
            );
            assert_eq!(kind, TYPE_STREAM);
            assert!(
                (op::REQUEST..=op::CREDIT_REQUEST).contains(&op_code),
                "op {op_code}"
            );
            assert_eq!(
                used_len as usize,
                HDR + len as usize,
                "used length disagrees"
            );
            assert!(
                len <= data_room,
                "payload of {len} bytes in a {data_room}-byte buffer"
            );
            assert_eq!(buf_alloc, TX_BUF_SIZE);
            assert!(len == 0 || op_code == op::RW, "payload on op {op_code}");
            let key = (src_port, dst_port);
            if trace() {
                eprintln!(
                    "device -> guest: op {op_code} {key:?} len {len} (credit {:?})",
                    self.credit.get(&key)
                );
            }
            match op_code {
                op::REQUEST => {
                    // Host-initiated: the guest's next packet on it (its RESPONSE) tells the
                    // credit. (A guest may also have answered before this REQUEST reached it,
                    // guessing the port: then what the device already sent is unknown.)
                    self.credit.remove(&key);
                    self.awaiting_guest.insert(key);
                }
                op::RST => {
                    self.credit.remove(&key);
                    self.awaiting_guest.remove(&key);
                }
                op::RW => {
                    self.received_by_guest += u64::from(len);
                    assert!(
                        self.received_by_guest <= self.written_by_host,
                        "the guest got more data than the host wrote"
                    );
                    if let Some(c) = self.credit.get_mut(&key) {
                        let in_flight = (c.sent - c.fwd_cnt).0;
                        let credit = c.buf_alloc.saturating_sub(in_flight);
                        assert!(
                            len <= credit,
                            "{len} bytes sent with {credit} bytes of credit"
                        );
                        c.sent += Wrapping(len);
                    }
                    let _ = self.rx.read(data_addr, len as usize);
                }
                _ => {}
            }
        }
    }

    fn guest_send(&mut self, s: &mut Script<'_>) {
        let shape = s.u8();
        let src_cid = if shape & 1 == 0 {
            CID
        } else {
            u64::from(s.u8())
        };
        let dst_cid = if shape & 2 == 0 {
            HOST_CID
        } else {
            u64::from(s.u8())
        };
        // Guest ports 1-4, the ones host clients ask for in `CONNECT <port>`.
        let guest_port = u32::from(s.u8() % 4) + 1;
        let host_port = match s.u8() % 4 {
            0 => SERVICE_PORT,
            1 => (1 << 30) + u32::from(s.u8() % 4), // Host-initiated connections' ports.
            2 => SERVICE_PORT + 1,                  // Nobody listens there.
            _ => s.u32(),
        };
        let op_code = u16::from(s.u8() % 9);
        let kind = if shape & 4 == 0 { TYPE_STREAM } else { s.u16() };
        let flags = u32::from(s.u8() % 4);
        let buf_alloc = if shape & 8 == 0 { 64 * 1024 } else { s.u32() };
        let fwd_cnt = if shape & 16 == 0 { 0 } else { s.u32() };
        let n = usize::from(s.u8());
        let data = s.bytes(n);
        let honest_len = shape & 32 == 0;
        let len = if honest_len {
            data.len() as u32
        } else {
            s.u32()
        };
        let split = shape & 64 != 0;

        let mut h = Vec::with_capacity(HDR);
        h.extend_from_slice(&src_cid.to_le_bytes());
        h.extend_from_slice(&dst_cid.to_le_bytes());
        h.extend_from_slice(&guest_port.to_le_bytes());
        h.extend_from_slice(&host_port.to_le_bytes());
        h.extend_from_slice(&len.to_le_bytes());
        h.extend_from_slice(&kind.to_le_bytes());
        h.extend_from_slice(&op_code.to_le_bytes());
        h.extend_from_slice(&flags.to_le_bytes());
        h.extend_from_slice(&buf_alloc.to_le_bytes());
        h.extend_from_slice(&fwd_cnt.to_le_bytes());

        let descs = if split && !data.is_empty() { 2 } else { 1 };
        if self.tx_descs + descs > DESC_BUDGET || self.tx_chains == CHAIN_BUDGET {
            return;
        }
        self.tx_descs += descs;
        self.tx_chains += 1;
        if descs == 2 {
            self.tx.add(&[Buf::R(&h), Buf::R(&data)]);
        } else {
            let mut packet = h;
            packet.extend_from_slice(&data);
            self.tx.add(&[Buf::R(&packet)]);
        }

        // Mirror what the muxer learns from this packet about the connection's credit.
        let key = (host_port, guest_port);
        if trace() {
            eprintln!(
                "guest -> device: op {op_code} {key:?} cids {src_cid}->{dst_cid} type {kind} \
                 len {len} (honest {honest_len}) buf_alloc {buf_alloc} fwd_cnt {fwd_cnt}"
            );
        }
        let addressed = src_cid == CID && dst_cid == HOST_CID && kind == TYPE_STREAM;
        if !honest_len {
            // The device may drop it as malformed, or take it: we cannot tell which.
            self.credit.remove(&key);
        } else if addressed {
            let awaited = self.awaiting_guest.remove(&key);
            if op_code == op::RST {
                self.credit.remove(&key);
            } else if let Some(c) = self.credit.get_mut(&key) {
                c.buf_alloc = buf_alloc;
                c.fwd_cnt = Wrapping(fwd_cnt);
            } else if op_code == op::REQUEST || awaited {
                self.credit.insert(
                    key,
                    Credit {
                        buf_alloc,
                        fwd_cnt: Wrapping(fwd_cnt),
                        sent: Wrapping(0),
                    },
                );
            }
        }
        self.dev.process_queue(1);
        while self.tx.used().is_some() {}
    }

    fn give_rx(&mut self, s: &mut Script<'_>) {
        let shape = s.u8();
        let count = usize::from(shape % 4) + 1;
        for _ in 0..count {
            let split = shape & 4 != 0;
            let descs = if split { 2 } else { 1 };
            if self.rx_descs + descs > DESC_BUDGET || self.rx_posted == CHAIN_BUDGET {
                break;
            }
            self.rx_posted += 1;
            let head = self.rx_descs as u32;
            self.rx_descs += descs;
            let odd_sizes = shape & 8 != 0;
            if split {
                let hdr_room = if odd_sizes {
                    u32::from(s.u8() % 64)
                } else {
                    HDR as u32
                };
                let data_room = u32::from(s.u16() % 8192);
                let a = self.rx.add(&[Buf::W(hdr_room), Buf::W(data_room)]);
                self.rx_chains
                    .insert(head, (a[0], hdr_room, a[1], data_room));
            } else {
                let room = if odd_sizes {
                    u32::from(s.u16() % 8192)
                } else {
                    HDR as u32 + 4096
                };
                let a = self.rx.add(&[Buf::W(room)]);
                let data_room = room.saturating_sub(HDR as u32);
                self.rx_chains.insert(
                    head,
                    (a[0], room, GuestAddress(a[0].0 + HDR as u64), data_room),
                );
            }
        }
        self.dev.process_queue(0);
    }

    fn host_connect(&mut self, s: &mut Script<'_>) {
        let Ok(mut client) = UnixStream::connect(socket_path()) else {
            return;
        };
        let line = match s.u8() % 4 {
            0 => format!("CONNECT {}\n", s.u8() % 4 + 1).into_bytes(),
            1 => format!("CONNECT {}\n", s.u32()).into_bytes(),
            _ => {
                let n = usize::from(s.u8() % 48);
                s.bytes(n)
            }
        };
        if client.set_nonblocking(true).is_ok() {
            if let Ok(n) = client.write(&line) {
                self.written_by_host += n as u64;
            }
            self.clients.push(client);
        }
    }

    fn host_write(&mut self, s: &mut Script<'_>) {
        let which = usize::from(s.u8());
        let n = usize::from(s.u16() % 4096);
        let data = s.bytes(n);
        if self.clients.is_empty() {
            return;
        }
        let i = which % self.clients.len();
        if let Ok(n) = self.clients[i].write(&data) {
            self.written_by_host += n as u64;
        }
    }

    fn host_close(&mut self, s: &mut Script<'_>) {
        let which = usize::from(s.u8());
        if !self.clients.is_empty() {
            let i = which % self.clients.len();
            self.clients.swap_remove(i);
        }
    }

    fn service_accept(&mut self) {
        while let Ok((conn, _)) = self.service.accept() {
            if conn.set_nonblocking(true).is_ok() {
                self.clients.push(conn);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let path = socket_path();
    let mut service_path = path.clone().into_os_string();
    service_path.push(format!("_{SERVICE_PORT}"));
    let _ = std::fs::remove_file(&service_path);
    let service = UnixListener::bind(&service_path).expect("service socket");
    service.set_nonblocking(true).expect("non-blocking service");

    let mem = default_mem();
    let mut dev = Vsock::new(CID, path, MAX_CONNS).expect("vsock device");
    let rx = TestQueue::new(&mem, 0, 256);
    let tx = TestQueue::new(&mem, 1, 256);
    let ev = TestQueue::new(&mem, 2, 256);
    dev.activate(
        mem.clone(),
        interrupt(),
        vec![rx.queue(), tx.queue(), ev.queue()],
    )
    .expect("activation");
    let mut h = Harness {
        dev,
        rx,
        tx,
        rx_descs: 0,
        tx_descs: 0,
        tx_chains: 0,
        rx_posted: 0,
        rx_chains: HashMap::new(),
        credit: HashMap::new(),
        awaiting_guest: HashSet::new(),
        clients: Vec::new(),
        service,
        written_by_host: 0,
        received_by_guest: 0,
    };

    let mut script = Script(data);
    let mut steps = 0;
    while !script.done() && steps < 64 {
        steps += 1;
        match script.u8() % 7 {
            0 | 1 => h.guest_send(&mut script),
            2 => h.give_rx(&mut script),
            3 => h.host_connect(&mut script),
            4 => h.host_write(&mut script),
            5 => h.host_close(&mut script),
            _ => {
                h.service_accept();
                h.dev.process_backend();
            }
        }
        h.check_rx();
    }
    h.service_accept();
    h.dev.process_backend();
    h.check_rx();
});
