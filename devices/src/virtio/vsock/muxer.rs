//! The vsock backend: multiplexes guest connections onto host Unix stream sockets, one
//! connection state machine each, all polled through one private epoll whose fd the VMM's event
//! loop watches.

use std::collections::{HashMap, VecDeque};
use std::io::{self, ErrorKind, Read, Write};
use std::num::Wrapping;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use virtio_vsock::packet::VsockPacket;
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{Bytes, VolatileMemory};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::{op, HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};

/// The receive buffer each connection advertises to the guest (`buf_alloc`): the most guest
/// data the device will ever hold for one connection.
pub const TX_BUF_SIZE: u32 = 256 * 1024;
/// Send a credit update once this much was forwarded since the last one.
const CREDIT_UPDATE_THRESHOLD: u32 = TX_BUF_SIZE / 4;
/// The longest `CONNECT <port>\n` line accepted.
const MAX_CONNECT_LINE: usize = 32;
/// RSTs for unknown connections waiting for rx buffers; more are dropped (the guest times out).
const MAX_PENDING_RSTS: usize = 256;
/// The first port handed to host-initiated connections.
const FIRST_LOCAL_PORT: u32 = 1 << 30;

/// Why the vsock backend failed.
#[derive(Debug, thiserror::Error)]
pub enum MuxerError {
    /// The Unix socket could not be bound.
    #[error("cannot listen on {}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The private epoll (or an eventfd) could not be set up.
    #[error("epoll")]
    Epoll(#[source] io::Error),
}

/// A connection, named by its two ports: ours (host side) and the guest's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    local: u32,
    peer: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Host-initiated: REQUEST sent or pending, waiting for the guest's RESPONSE.
    LocalInit,
    /// Data flows.
    Established,
    /// We sent or will send RST; removed once it is out.
    Closing,
}

/// Control packets a connection owes the guest, in send order.
mod pending {
    pub const RST: u8 = 1;
    pub const REQUEST: u8 = 2;
    pub const RESPONSE: u8 = 4;
    pub const SHUTDOWN: u8 = 8;
    pub const CREDIT_REQUEST: u8 = 16;
    pub const CREDIT_UPDATE: u8 = 32;
    pub const DATA: u8 = 64;
}

#[derive(Debug)]
struct Conn {
    stream: UnixStream,
    state: State,
    pending: u8,
    queued: bool,
    /// Guest data not yet written to the socket (at most `TX_BUF_SIZE`).
    tx_buf: VecDeque<u8>,
    /// Guest bytes written to the socket.
    fwd_cnt: Wrapping<u32>,
    last_fwd_cnt_sent: Wrapping<u32>,
    /// Bytes sent to the guest.
    rx_cnt: Wrapping<u32>,
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    /// Whether the socket is polled for input (off while the guest has no credit or data waits).
    want_in: bool,
    want_out: bool,
    /// Whether the socket is in the epoll set at all. A socket nobody wants events from is
    /// taken out, so a hung-up peer (HUP is always reported) cannot spin the event loop.
    polled: bool,
    /// The host closed its side; SHUTDOWN goes out, then we wait for the guest's RST.
    host_eof: bool,
    /// The guest said it sends no more: shut the socket's write half once `tx_buf` is empty.
    peer_send_done: bool,
}

impl Conn {
    fn new(stream: UnixStream, state: State) -> Self {
        Conn {
            stream,
            state,
            pending: 0,
            queued: false,
            tx_buf: VecDeque::new(),
            fwd_cnt: Wrapping(0),
            last_fwd_cnt_sent: Wrapping(0),
            rx_cnt: Wrapping(0),
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            want_in: false,
            want_out: false,
            polled: true,
            host_eof: false,
            peer_send_done: false,
        }
    }

    /// How many bytes the guest can take now.
    fn peer_credit(&self) -> u32 {
        let in_flight = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Writes as much of `tx_buf` as the socket takes. `Err` means the socket is broken.
    fn flush(&mut self) -> io::Result<()> {
        while !self.tx_buf.is_empty() {
            let (a, _) = self.tx_buf.as_slices();
            match self.stream.write(a) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.tx_buf.drain(..n);
                    self.fwd_cnt += Wrapping(n as u32);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.tx_buf.is_empty() && self.peer_send_done {
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
        if (self.fwd_cnt - self.last_fwd_cnt_sent).0 >= CREDIT_UPDATE_THRESHOLD {
            self.pending |= pending::CREDIT_UPDATE;
        }
        Ok(())
    }
}

/// What an fd in the private epoll belongs to.
#[derive(Debug, Clone, Copy)]
enum Owner {
    Listener,
    /// An accepted socket that has not finished its `CONNECT <port>\n` line.
    Handshake,
    Conn(Key),
}

#[derive(Debug)]
struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
}

/// The vsock backend.
#[derive(Debug)]
pub struct Muxer {
    cid: u64,
    uds_path: PathBuf,
    listener: UnixListener,
    epoll: Epoll,
    conns: HashMap<Key, Conn>,
    handshakes: HashMap<RawFd, Handshake>,
    owners: HashMap<RawFd, Owner>,
    rx_queue: VecDeque<Key>,
    rsts: VecDeque<Key>,
    next_local_port: u32,
    max_conns: usize,
    scratch: Vec<u8>,
}

impl AsRawFd for Muxer {
    /// The private epoll: readable when some socket needs attention.
    fn as_raw_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }
}

impl Muxer {
    /// A muxer for guest `cid` listening on `uds_path` (replacing a stale socket file).
    pub fn new(cid: u64, uds_path: &Path, max_conns: usize) -> Result<Self, MuxerError> {
        let bind_err = |source| MuxerError::Bind {
            path: uds_path.to_owned(),
            source,
        };
        match std::fs::remove_file(uds_path) {
            Err(e) if e.kind() != ErrorKind::NotFound => return Err(bind_err(e)),
            _ => {}
        }
        let listener = UnixListener::bind(uds_path).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        let mut m = Muxer {
            cid,
            uds_path: uds_path.to_owned(),
            listener,
            epoll: Epoll::new().map_err(MuxerError::Epoll)?,
            conns: HashMap::new(),
            handshakes: HashMap::new(),
            owners: HashMap::new(),
            rx_queue: VecDeque::new(),
            rsts: VecDeque::new(),
            next_local_port: FIRST_LOCAL_PORT,
            max_conns,
            scratch: vec![0u8; super::device::MAX_PKT_DATA as usize],
        };
        let fd = m.listener.as_raw_fd();
        m.poll(fd, Owner::Listener, EventSet::IN, ControlOperation::Add)
            .map_err(MuxerError::Epoll)?;
        Ok(m)
    }

    /// The number of live connections (handshakes included).
    pub fn connection_count(&self) -> usize {
        self.conns.len() + self.handshakes.len()
    }

    fn poll(
        &mut self,
        fd: RawFd,
        owner: Owner,
        ev: EventSet,
        op: ControlOperation,
    ) -> io::Result<()> {
        self.epoll.ctl(op, fd, EpollEvent::new(ev, fd as u64))?;
        self.owners.insert(fd, owner);
        Ok(())
    }

    fn unpoll(&mut self, fd: RawFd) {
        let _ = self
            .epoll
            .ctl(ControlOperation::Delete, fd, EpollEvent::default());
        self.owners.remove(&fd);
    }

    /// Re-arms a connection's socket interest to match `want_in`/`want_out`.
    fn repoll(&mut self, key: Key) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let mut ev = EventSet::empty();
        if c.want_in {
            ev |= EventSet::IN;
        }
        if c.want_out {
            ev |= EventSet::OUT;
        }
        let fd = c.stream.as_raw_fd();
        // A host-initiated connection stays polled (for HUP) until the guest answers.
        let keep = !ev.is_empty() || c.state == State::LocalInit;
        let op = match (keep, c.polled) {
            (true, true) => ControlOperation::Modify,
            (true, false) => ControlOperation::Add,
            (false, true) => {
                c.polled = false;
                self.unpoll(fd);
                return;
            }
            (false, false) => return,
        };
        c.polled = true;
        let _ = self.poll(fd, Owner::Conn(key), ev, op);
    }

    fn queue(&mut self, key: Key, what: u8) {
        if let Some(c) = self.conns.get_mut(&key) {
            c.pending |= what;
            if !c.queued {
                c.queued = true;
                self.rx_queue.push_back(key);
            }
        }
    }

    fn rst_unknown(&mut self, key: Key) {
        if self.rsts.len() < MAX_PENDING_RSTS {
            self.rsts.push_back(key);
        }
    }

    /// Ends a connection: RST to the guest, then the socket closes.
    fn kill(&mut self, key: Key) {
        if let Some(c) = self.conns.get_mut(&key) {
            c.state = State::Closing;
            c.want_in = false;
            c.want_out = false;
            c.pending = pending::RST;
        }
        self.repoll(key);
        self.queue(key, pending::RST);
    }

    fn remove(&mut self, key: Key) {
        if let Some(c) = self.conns.remove(&key) {
            self.unpoll(c.stream.as_raw_fd());
        }
    }

    /// Whether something waits to go to the guest.
    pub fn has_pending_rx(&self) -> bool {
        !self.rsts.is_empty() || !self.rx_queue.is_empty()
    }

    /// Forgets every connection (device reset): their sockets close.
    pub fn reset(&mut self) {
        let keys: Vec<Key> = self.conns.keys().copied().collect();
        for k in keys {
            self.remove(k);
        }
        let fds: Vec<RawFd> = self.handshakes.keys().copied().collect();
        for fd in fds {
            self.unpoll(fd);
            self.handshakes.remove(&fd);
        }
        self.rx_queue.clear();
        self.rsts.clear();
    }

    /// Handles a packet the guest sent (tx queue).
    pub fn send_pkt<B: BitmapSlice>(&mut self, pkt: &VsockPacket<'_, B>) {
        let key = Key {
            local: pkt.dst_port(),
            peer: pkt.src_port(),
        };
        if pkt.dst_cid() != HOST_CID || pkt.src_cid() != self.cid {
            return; // Not for us, or spoofed: nothing sensible to answer.
        }
        if pkt.type_() != TYPE_STREAM {
            if pkt.op() != op::RST {
                self.rst_unknown(key);
            }
            return;
        }
        let Some(c) = self.conns.get_mut(&key) else {
            match pkt.op() {
                op::REQUEST => self.guest_connect(key, pkt),
                op::RST => {}
                _ => self.rst_unknown(key),
            }
            return;
        };
        c.peer_buf_alloc = pkt.buf_alloc();
        c.peer_fwd_cnt = Wrapping(pkt.fwd_cnt());
        match (c.state, pkt.op()) {
            (_, op::RST) => {
                self.remove(key);
            }
            (State::Closing, _) => {}
            (State::LocalInit, op::RESPONSE) => {
                c.state = State::Established;
                let line = format!("OK {}\n", key.local);
                // The socket is fresh and the line tiny: a short write means a broken client.
                if c.stream.write_all(line.as_bytes()).is_err() {
                    self.kill(key);
                    return;
                }
                c.want_in = true;
                self.repoll(key);
            }
            (State::Established, op::RW) => {
                let Some(data) = pkt.data_slice() else {
                    return;
                };
                let len = data.len();
                if c.tx_buf.len() + len > TX_BUF_SIZE as usize || c.peer_send_done {
                    // The guest ignored the credit we gave it.
                    self.kill(key);
                    return;
                }
                let start = c.tx_buf.len();
                c.tx_buf.resize(start + len, 0);
                let (a, b) = c.tx_buf.as_mut_slices();
                // `start + len` fits: the two slices cover the whole buffer.
                let copied = copy_from_volatile(data, a, b, start);
                if copied.is_err() {
                    self.kill(key);
                    return;
                }
                let pending_before = c.pending;
                if c.flush().is_err() {
                    self.kill(key);
                    return;
                }
                c.want_out = !c.tx_buf.is_empty();
                let newly = c.pending & !pending_before;
                self.repoll(key);
                if newly != 0 {
                    self.queue(key, newly);
                }
            }
            (State::Established, op::CREDIT_UPDATE) => {
                if !c.host_eof && !c.want_in && c.pending & pending::DATA == 0 {
                    c.want_in = true;
                    self.repoll(key);
                }
            }
            (State::Established, op::CREDIT_REQUEST) => self.queue(key, pending::CREDIT_UPDATE),
            (State::Established, op::SHUTDOWN) => {
                let flags = pkt.flags();
                if flags & (SHUTDOWN_RCV | SHUTDOWN_SEND) == SHUTDOWN_RCV | SHUTDOWN_SEND {
                    // The guest closed: whatever it sent is flushed best effort, then RST.
                    let _ = c.flush();
                    self.kill(key);
                    return;
                }
                if flags & SHUTDOWN_SEND != 0 {
                    c.peer_send_done = true;
                    if c.flush().is_err() {
                        self.kill(key);
                    }
                }
            }
            _ => self.kill(key),
        }
    }

    /// A guest connection to host port `key.local`: connect `<uds_path>_<port>`
    /// (`contract::vsock::host_port_path`, where the daemon listens).
    fn guest_connect<B: BitmapSlice>(&mut self, key: Key, pkt: &VsockPacket<'_, B>) {
        if self.connection_count() >= self.max_conns {
            self.rst_unknown(key);
            return;
        }
        let path = contract::vsock::host_port_path(&self.uds_path, key.local);
        let stream = match UnixStream::connect(&path) {
            Ok(s) if s.set_nonblocking(true).is_ok() => s,
            _ => {
                self.rst_unknown(key);
                return;
            }
        };
        let fd = stream.as_raw_fd();
        let mut c = Conn::new(stream, State::Established);
        c.peer_buf_alloc = pkt.buf_alloc();
        c.peer_fwd_cnt = Wrapping(pkt.fwd_cnt());
        c.want_in = true;
        self.conns.insert(key, c);
        if self
            .poll(fd, Owner::Conn(key), EventSet::IN, ControlOperation::Add)
            .is_err()
        {
            self.remove(key);
            self.rst_unknown(key);
            return;
        }
        self.queue(key, pending::RESPONSE);
    }

    /// Fills an rx packet with the next thing the guest should get; returns the bytes used
    /// (header + data), or `None` if nothing was ready after all.
    pub fn recv_pkt<B: BitmapSlice>(&mut self, pkt: &mut VsockPacket<'_, B>) -> Option<u32> {
        if let Some(key) = self.rsts.pop_front() {
            self.header(pkt, key, op::RST, Wrapping(0));
            return Some(header_len());
        }
        while let Some(key) = self.rx_queue.pop_front() {
            let Some(c) = self.conns.get_mut(&key) else {
                continue;
            };
            c.queued = false;
            let bit = lowest_bit(c.pending);
            c.pending &= !bit;
            let fwd = c.fwd_cnt;
            let mut len = header_len();
            let mut flags = 0;
            let op = match bit {
                pending::RST => op::RST,
                pending::REQUEST => op::REQUEST,
                pending::RESPONSE => op::RESPONSE,
                pending::SHUTDOWN => {
                    flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
                    op::SHUTDOWN
                }
                pending::CREDIT_REQUEST => op::CREDIT_REQUEST,
                pending::CREDIT_UPDATE => op::CREDIT_UPDATE,
                pending::DATA => match self.read_data(key, pkt) {
                    Some(n) => {
                        len += n;
                        op::RW
                    }
                    None => {
                        self.requeue(key);
                        continue;
                    }
                },
                _ => continue,
            };
            if let Some(c) = self.conns.get_mut(&key) {
                if op != op::RST {
                    c.last_fwd_cnt_sent = fwd;
                }
            }
            self.header(pkt, key, op, fwd);
            pkt.set_flags(flags);
            if op == op::RW {
                pkt.set_len(len - header_len());
            }
            if op == op::RST {
                self.remove(key);
            } else {
                self.requeue(key);
            }
            return Some(len);
        }
        None
    }

    fn requeue(&mut self, key: Key) {
        if let Some(c) = self.conns.get(&key) {
            if c.pending != 0 {
                let p = c.pending;
                self.queue(key, p);
            }
        }
    }

    /// Reads socket data into `pkt` within the guest's credit. `None` if nothing was sent.
    fn read_data<B: BitmapSlice>(&mut self, key: Key, pkt: &mut VsockPacket<'_, B>) -> Option<u32> {
        let room = pkt.data_slice().map_or(0, |d| d.len());
        let c = self.conns.get_mut(&key)?;
        let credit = c.peer_credit() as usize;
        if credit == 0 {
            // Wait for a credit update; ask for one.
            c.want_in = false;
            c.pending |= pending::CREDIT_REQUEST;
            self.repoll(key);
            return None;
        }
        let want = room.min(credit).min(self.scratch.len());
        if want == 0 {
            // A buffer without room for data: poll again, try the next buffer.
            c.want_in = true;
            self.repoll(key);
            return None;
        }
        match c.stream.read(&mut self.scratch[..want]) {
            Ok(0) => {
                c.host_eof = true;
                c.want_in = false;
                c.pending |= pending::SHUTDOWN;
                self.repoll(key);
                None
            }
            Ok(n) => {
                let data = pkt.data_slice()?;
                if data.write_slice(&self.scratch[..n], 0).is_err() {
                    return None;
                }
                c.rx_cnt += Wrapping(n as u32);
                // More may be waiting: poll again.
                c.want_in = true;
                self.repoll(key);
                Some(n as u32)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                c.want_in = true;
                self.repoll(key);
                None
            }
            Err(_) => {
                self.kill(key);
                None
            }
        }
    }

    fn header<B: BitmapSlice>(
        &self,
        pkt: &mut VsockPacket<'_, B>,
        key: Key,
        op: u16,
        fwd: Wrapping<u32>,
    ) {
        pkt.set_src_cid(HOST_CID)
            .set_dst_cid(self.cid)
            .set_src_port(key.local)
            .set_dst_port(key.peer)
            .set_type(TYPE_STREAM)
            .set_op(op)
            .set_len(0)
            .set_flags(0)
            .set_buf_alloc(TX_BUF_SIZE)
            .set_fwd_cnt(fwd.0);
    }

    /// Handles whatever the sockets have (never blocks).
    pub fn process_events(&mut self) {
        let mut events = [EpollEvent::default(); 32];
        loop {
            let n = match self.epoll.wait(0, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            for ev in &events[..n] {
                let fd = ev.fd();
                match self.owners.get(&fd).copied() {
                    Some(Owner::Listener) => self.accept(),
                    Some(Owner::Handshake) => self.handshake(fd),
                    Some(Owner::Conn(key)) => self.conn_event(key, ev.event_set()),
                    None => {}
                }
            }
            if n < events.len() {
                return;
            }
        }
    }

    fn accept(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(_) => return,
            };
            // Over the limit, the client sees its socket close.
            if self.connection_count() >= self.max_conns || stream.set_nonblocking(true).is_err() {
                continue;
            }
            let fd = stream.as_raw_fd();
            self.handshakes.insert(
                fd,
                Handshake {
                    stream,
                    line: Vec::new(),
                },
            );
            if self
                .poll(fd, Owner::Handshake, EventSet::IN, ControlOperation::Add)
                .is_err()
            {
                self.handshakes.remove(&fd);
                continue;
            }
            // The line may already be there.
            self.handshake(fd);
        }
    }

    /// Reads a `CONNECT <port>\n` line byte by byte (so no stream data is consumed).
    fn handshake(&mut self, fd: RawFd) {
        let Some(h) = self.handshakes.get_mut(&fd) else {
            return;
        };
        let mut byte = [0u8; 1];
        let port = loop {
            match h.stream.read(&mut byte) {
                Ok(1) if byte[0] == b'\n' => break parse_connect(&h.line),
                Ok(1) if h.line.len() < MAX_CONNECT_LINE => h.line.push(byte[0]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                _ => break None, // EOF, error or an over-long line.
            }
        };
        self.unpoll(fd);
        let Some(h) = self.handshakes.remove(&fd) else {
            return;
        };
        let Some(peer) = port else {
            return; // Dropping the stream closes it: the client sees the refusal.
        };
        let local = self.alloc_port(peer);
        let key = Key { local, peer };
        self.conns
            .insert(key, Conn::new(h.stream, State::LocalInit));
        // Not polled for input until the guest accepts; HUP still wakes us.
        if self
            .poll(
                fd,
                Owner::Conn(key),
                EventSet::empty(),
                ControlOperation::Add,
            )
            .is_err()
        {
            self.conns.remove(&key);
            return;
        }
        self.queue(key, pending::REQUEST);
    }

    fn alloc_port(&mut self, peer: u32) -> u32 {
        loop {
            let p = self.next_local_port;
            self.next_local_port = p.checked_add(1).unwrap_or(FIRST_LOCAL_PORT);
            if !self.conns.contains_key(&Key { local: p, peer }) {
                return p;
            }
        }
    }

    fn conn_event(&mut self, key: Key, ev: EventSet) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if c.state == State::LocalInit && ev.intersects(EventSet::HANG_UP | EventSet::ERROR) {
            // The client left before the guest answered: tell the guest.
            self.kill(key);
            return;
        }
        if ev.contains(EventSet::OUT) {
            let before = c.pending;
            if c.flush().is_err() {
                self.kill(key);
                return;
            }
            c.want_out = !c.tx_buf.is_empty();
            let newly = c.pending & !before;
            self.repoll(key);
            if newly != 0 {
                self.queue(key, newly);
            }
        }
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if c.state == State::Established
            && ev.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::READ_HANG_UP)
            && c.want_in
        {
            // Read when the guest has a buffer; stop polling until then.
            c.want_in = false;
            self.repoll(key);
            self.queue(key, pending::DATA);
        } else if ev.contains(EventSet::ERROR) {
            self.kill(key);
        }
    }
}

fn header_len() -> u32 {
    virtio_vsock::packet::PKT_HEADER_SIZE as u32
}

fn lowest_bit(v: u8) -> u8 {
    v & v.wrapping_neg()
}

/// Parses `CONNECT <port>` (without the newline).
fn parse_connect(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?;
    let s = s.strip_suffix('\r').unwrap_or(s);
    s.strip_prefix("CONNECT ")?.trim().parse().ok()
}

/// Copies a guest buffer into the tail of a ring buffer's two slices, starting at `start`.
fn copy_from_volatile<B: BitmapSlice>(
    data: &vm_memory::VolatileSlice<'_, B>,
    a: &mut [u8],
    b: &mut [u8],
    start: usize,
) -> Result<(), vm_memory::volatile_memory::Error> {
    let len = data.len();
    let mut done = 0;
    // The destination is (a ++ b)[start..start + len].
    let (a_len, total) = (a.len(), a.len() + b.len());
    if start + len > total {
        return Err(vm_memory::volatile_memory::Error::OutOfBounds { addr: start + len });
    }
    while done < len {
        let pos = start + done;
        let (dst, off) = if pos < a_len {
            (&mut a[..], pos)
        } else {
            (&mut b[..], pos - a_len)
        };
        let n = (dst.len() - off).min(len - done);
        let sub = data.get_slice(done, n)?;
        sub.copy_to(&mut dst[off..off + n]);
        done += n;
    }
    Ok(())
}
