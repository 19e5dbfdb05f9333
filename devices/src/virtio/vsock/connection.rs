//! One vsock connection: a host Unix stream socket on one side, a guest (port, credit) on the
//! other, and the state machine between them (Firecracker's `csm`). It knows nothing of epoll or
//! of other connections: the muxer asks it what it wants polled ([`Connection::poll_interest`]),
//! when it must be killed ([`Connection::deadline`]), whether it owes the guest a packet
//! ([`Connection::has_pending_rx`]), and feeds it guest packets, socket readiness and rx buffers.
//!
//! ```text
//!   host CONNECT ──▶ LocalInit ──RESPONSE──▶ Established ◀──RESPONSE sent── PeerInit ◀── guest REQUEST
//!                        │                     │     │
//!                        │        host close ──┘     └── guest SHUTDOWN
//!                        │              ▼                    ▼
//!                        │         LocalClosed          PeerClosed{rcv,send}
//!                        ▼              ▼                    ▼
//!      (timeout, error, violation) ──▶ Killed ──RST sent──▶ Closed ◀── guest RST (from any state)
//! ```
//!
//! Every time bound is a deadline read by the muxer's kill queue: `LocalInit` and `LocalClosed`
//! wait at most the handshake timeout for the guest; any other live state is killed when it has
//! work pending (data or a packet for the guest, guest data for the host socket, host data held
//! back for lack of guest credit) and nothing moved for the stall timeout.
//!
//! A host that shuts only its write half stays `Established` (the guest hears "the host sends
//! no more" and may still answer); closing the socket entirely is what leads to `LocalClosed`.

use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};
use std::num::Wrapping;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use virtio_vsock::packet::VsockPacket;
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{Bytes, VolatileMemory, VolatileSlice};
use vmm_sys_util::epoll::EventSet;

use super::{op, HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};

/// The receive buffer each connection advertises to the guest (`buf_alloc`): the most guest
/// data the device will ever hold for one connection.
pub const TX_BUF_SIZE: u32 = 256 * 1024;
/// Send a credit update once this much was forwarded since the last one.
const CREDIT_UPDATE_THRESHOLD: u32 = TX_BUF_SIZE / 4;

/// A connection, named by its two ports: ours (host side) and the guest's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnKey {
    /// The host-side port (the guest's destination port for guest-initiated connections).
    pub local: u32,
    /// The guest's port.
    pub peer: u32,
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// A host client asked for a guest port: REQUEST queued or sent, waiting for the guest's
    /// RESPONSE (bounded by the handshake timeout, counted from the client's connect).
    LocalInit,
    /// The guest asked for a host port and the host socket is connected: RESPONSE queued.
    PeerInit,
    /// Data flows both ways.
    Established,
    /// The host closed its socket (not just its write half): SHUTDOWN queued or sent, waiting
    /// for the guest's RST (bounded by the handshake timeout).
    LocalClosed,
    /// The guest sent SHUTDOWN: it receives no more (`rcv`), sends no more (`send`). With both,
    /// guest data still buffered is written to the host socket, then the connection is reset.
    PeerClosed {
        /// The guest will receive no more: the host socket is no longer read.
        rcv: bool,
        /// The guest will send no more: the socket's write half is shut once buffered data is out.
        send: bool,
    },
    /// RST queued for the guest; the host socket is already shut down both ways.
    Killed,
    /// Nothing more is owed to either side: the muxer drops the connection.
    Closed,
}

/// Reading the host socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostRead {
    /// Not read (waiting for the handshake, EOF seen, the guest receives no more, killed).
    Stopped,
    /// Polled for input.
    Polling,
    /// Readable: a data packet is queued for the next rx buffer.
    Ready,
    /// Readable, but the guest has no credit: CREDIT_REQUEST sent, waiting for its update.
    NoCredit,
}

/// Packets a connection owes the guest, in send order (lowest bit first).
mod pending {
    pub(super) const RST: u8 = 1;
    pub(super) const REQUEST: u8 = 2;
    pub(super) const RESPONSE: u8 = 4;
    pub(super) const SHUTDOWN: u8 = 8;
    pub(super) const CREDIT_REQUEST: u8 = 16;
    pub(super) const CREDIT_UPDATE: u8 = 32;
    pub(super) const DATA: u8 = 64;
}

/// The time bounds a connection lives under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// The most a handshake step may take: the client's `CONNECT` line, the guest's answer to
    /// REQUEST, the guest's RST after our SHUTDOWN.
    pub handshake: Duration,
    /// The most a connection may have work pending without any progress; `None`: no bound.
    pub stall: Option<Duration>,
}

/// One vsock connection.
#[derive(Debug)]
pub struct Connection {
    key: ConnKey,
    guest_cid: u64,
    stream: UnixStream,
    state: ConnState,
    /// When `LocalInit` or `LocalClosed` started (the handshake deadline counts from there).
    state_since: Instant,
    pending: u8,
    host_read: HostRead,
    /// Guest data not yet written to the socket (at most `TX_BUF_SIZE`).
    tx_buf: VecDeque<u8>,
    /// Guest bytes written to the socket.
    fwd_cnt: Wrapping<u32>,
    last_fwd_cnt_sent: Wrapping<u32>,
    /// Bytes sent to the guest.
    rx_cnt: Wrapping<u32>,
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    /// Since when work has been pending with no progress (`None`: nothing pending).
    stalled_since: Option<Instant>,
    /// The host shut only its write half (`shutdown(SHUT_WR)`): it sends no more but still
    /// reads, so the guest's data keeps flowing to it.
    host_done_sending: bool,
}

impl Connection {
    /// A host-initiated connection whose client connected at `connected_at` and asked for guest
    /// port `key.peer`: a REQUEST is owed to the guest.
    pub fn new_local_init(
        key: ConnKey,
        guest_cid: u64,
        stream: UnixStream,
        connected_at: Instant,
    ) -> Self {
        let mut c = Self::new(key, guest_cid, stream, ConnState::LocalInit, connected_at);
        c.pending = pending::REQUEST;
        c
    }

    /// A guest-initiated connection whose host socket is connected: a RESPONSE is owed to the
    /// guest, and the host socket is read from now on.
    pub fn new_peer_init<B: BitmapSlice>(
        key: ConnKey,
        guest_cid: u64,
        stream: UnixStream,
        request: &VsockPacket<'_, B>,
        now: Instant,
    ) -> Self {
        let mut c = Self::new(key, guest_cid, stream, ConnState::PeerInit, now);
        c.peer_buf_alloc = request.buf_alloc();
        c.peer_fwd_cnt = Wrapping(request.fwd_cnt());
        c.pending = pending::RESPONSE;
        c.host_read = HostRead::Polling;
        c.settle(now, false);
        c
    }

    fn new(
        key: ConnKey,
        guest_cid: u64,
        stream: UnixStream,
        state: ConnState,
        now: Instant,
    ) -> Self {
        Connection {
            key,
            guest_cid,
            stream,
            state,
            state_since: now,
            pending: 0,
            host_read: HostRead::Stopped,
            tx_buf: VecDeque::new(),
            fwd_cnt: Wrapping(0),
            last_fwd_cnt_sent: Wrapping(0),
            rx_cnt: Wrapping(0),
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            stalled_since: None,
            host_done_sending: false,
        }
    }

    /// The connection's ports.
    pub fn key(&self) -> ConnKey {
        self.key
    }

    /// Its state.
    pub fn state(&self) -> ConnState {
        self.state
    }

    /// Whether it owes the guest a packet.
    pub fn has_pending_rx(&self) -> bool {
        self.pending != 0
    }

    /// What to poll the host socket for: `None` to leave it out of the poll set entirely (so a
    /// hung-up peer, whose HUP is always reported, cannot spin the event loop); `Some(empty)`
    /// to hear only about hang-ups and errors.
    pub fn poll_interest(&self) -> Option<EventSet> {
        match self.state {
            // The client may leave before the guest answers: hear its hang-up.
            ConnState::LocalInit => Some(EventSet::empty()),
            ConnState::Killed | ConnState::Closed => None,
            _ => {
                let mut ev = EventSet::empty();
                if self.host_read == HostRead::Polling {
                    ev |= EventSet::IN;
                }
                if !self.tx_buf.is_empty() {
                    ev |= EventSet::OUT;
                }
                // After a half-close the socket is not read any more, but the host closing it
                // entirely must still be heard (hang-ups are always reported).
                (!ev.is_empty() || self.host_done_sending).then_some(ev)
            }
        }
    }

    /// When the connection must be killed unless something changes first.
    pub fn deadline(&self, timeouts: &Timeouts) -> Option<Instant> {
        match self.state {
            ConnState::LocalInit | ConnState::LocalClosed => {
                self.state_since.checked_add(timeouts.handshake)
            }
            ConnState::Killed | ConnState::Closed => None,
            ConnState::PeerInit | ConnState::Established | ConnState::PeerClosed { .. } => {
                let stall = timeouts.stall?;
                self.stalled_since?.checked_add(stall)
            }
        }
    }

    /// The host socket's fd (its key in the muxer's poll set).
    pub fn stream_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// How many bytes the guest can take now.
    fn peer_credit(&self) -> u32 {
        let in_flight = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Ends the connection: the host socket is shut down both ways at once (its client sees EOF
    /// even if the guest never takes the RST), and an RST is owed to the guest.
    pub fn kill(&mut self) {
        if matches!(self.state, ConnState::Killed | ConnState::Closed) {
            return;
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        self.state = ConnState::Killed;
        self.pending = pending::RST;
        self.host_read = HostRead::Stopped;
        self.tx_buf.clear();
        self.stalled_since = None;
    }

    /// Handles a packet the guest sent on this connection (addressing already checked).
    pub fn send_pkt<B: BitmapSlice>(&mut self, pkt: &VsockPacket<'_, B>, now: Instant) {
        if pkt.op() == op::RST {
            // The guest forgot the connection: nothing more is owed to it.
            self.state = ConnState::Closed;
            self.pending = 0;
            return;
        }
        if matches!(self.state, ConnState::Killed | ConnState::Closed) {
            return;
        }
        let credit_before = self.peer_credit();
        self.peer_buf_alloc = pkt.buf_alloc();
        self.peer_fwd_cnt = Wrapping(pkt.fwd_cnt());
        let mut progressed = self.peer_credit() > credit_before;
        if self.host_read == HostRead::NoCredit && self.peer_credit() > 0 {
            self.host_read = HostRead::Polling;
        }
        match (self.state, pkt.op()) {
            (ConnState::LocalInit, op::RESPONSE) => {
                let line = format!("OK {}\n", self.key.local);
                // The socket is fresh and the line tiny: a short write means a broken client.
                if self.stream.write_all(line.as_bytes()).is_err() {
                    self.kill();
                    return;
                }
                self.state = ConnState::Established;
                self.host_read = HostRead::Polling;
                progressed = true;
            }
            (
                ConnState::Established
                | ConnState::LocalClosed
                | ConnState::PeerClosed { send: false, .. },
                op::RW,
            ) => match self.take_guest_data(pkt) {
                Ok(moved) => progressed |= moved,
                Err(()) => {
                    self.kill();
                    return;
                }
            },
            (
                ConnState::Established | ConnState::LocalClosed | ConnState::PeerClosed { .. },
                op::CREDIT_UPDATE,
            ) => {}
            (
                ConnState::Established | ConnState::LocalClosed | ConnState::PeerClosed { .. },
                op::CREDIT_REQUEST,
            ) => self.pending |= pending::CREDIT_UPDATE,
            (ConnState::Established | ConnState::PeerClosed { .. }, op::SHUTDOWN) => {
                self.guest_shutdown(pkt.flags());
            }
            // Anything else (data before the handshake finished, data after the guest said it
            // sends no more, a second REQUEST, SHUTDOWN after ours, unknown ops) is a protocol
            // violation.
            _ => {
                self.kill();
                return;
            }
        }
        self.settle(now, progressed);
    }

    /// Copies an RW payload into `tx_buf` and writes what the socket takes. `Ok(true)` if bytes
    /// reached the socket; `Err` if the guest overran its credit or the socket is broken.
    fn take_guest_data<B: BitmapSlice>(&mut self, pkt: &VsockPacket<'_, B>) -> Result<bool, ()> {
        let Some(data) = pkt.data_slice() else {
            return Ok(false);
        };
        let len = data.len();
        if self.tx_buf.len() + len > TX_BUF_SIZE as usize {
            return Err(()); // The guest ignored the credit we gave it.
        }
        let start = self.tx_buf.len();
        self.tx_buf.resize(start + len, 0);
        let (a, b) = self.tx_buf.as_mut_slices();
        copy_from_volatile(data, a, b, start).map_err(|_| ())?;
        self.flush().map_err(|_| ())
    }

    fn guest_shutdown(&mut self, flags: u32) {
        let (mut rcv, mut send) = match self.state {
            ConnState::PeerClosed { rcv, send } => (rcv, send),
            _ => (false, false),
        };
        rcv |= flags & SHUTDOWN_RCV != 0;
        send |= flags & SHUTDOWN_SEND != 0;
        if !rcv && !send {
            return;
        }
        self.state = ConnState::PeerClosed { rcv, send };
        if rcv {
            self.host_read = HostRead::Stopped;
            self.pending &= !pending::DATA;
        }
        // Whatever the guest sent before closing still goes to the host; the RST (or the write
        // half's shutdown) waits until it is out.
        if self.flush().is_err() {
            self.kill();
        }
    }

    /// Writes as much of `tx_buf` as the socket takes; `Ok(true)` if any byte went. When it is
    /// empty, a guest that sends no more gets the write half shut, and one that closed both
    /// ways gets its RST.
    fn flush(&mut self) -> io::Result<bool> {
        let mut moved = false;
        while !self.tx_buf.is_empty() {
            let (a, _) = self.tx_buf.as_slices();
            match self.stream.write(a) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.tx_buf.drain(..n);
                    self.fwd_cnt += Wrapping(n as u32);
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.tx_buf.is_empty() {
            match self.state {
                ConnState::PeerClosed {
                    rcv: true,
                    send: true,
                } => self.kill(),
                // Neither side sends any more and the guest's data is out: done.
                ConnState::PeerClosed { send: true, .. } if self.host_done_sending => self.kill(),
                ConnState::PeerClosed { send: true, .. } => {
                    let _ = self.stream.shutdown(std::net::Shutdown::Write);
                }
                _ => {}
            }
        }
        if (self.fwd_cnt - self.last_fwd_cnt_sent).0 >= CREDIT_UPDATE_THRESHOLD
            && !matches!(self.state, ConnState::Killed | ConnState::Closed)
        {
            self.pending |= pending::CREDIT_UPDATE;
        }
        Ok(moved)
    }

    /// Handles readiness of the host socket.
    pub fn notify(&mut self, ev: EventSet, now: Instant) {
        if matches!(self.state, ConnState::Killed | ConnState::Closed) {
            return;
        }
        if self.state == ConnState::LocalInit && ev.intersects(EventSet::HANG_UP | EventSet::ERROR)
        {
            // The client left before the guest answered: tell the guest.
            self.kill();
            return;
        }
        if self.host_done_sending && ev.intersects(EventSet::HANG_UP | EventSet::ERROR) {
            // The host closed what it had kept open for the guest's answer: nobody reads.
            self.kill();
            return;
        }
        let mut progressed = false;
        if ev.contains(EventSet::OUT) {
            match self.flush() {
                Ok(moved) => progressed = moved,
                Err(_) => {
                    self.kill();
                    return;
                }
            }
        }
        if self.host_read == HostRead::Polling
            && ev.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::READ_HANG_UP)
        {
            // Read when the guest has a buffer; stop polling until then.
            self.host_read = HostRead::Ready;
            self.pending |= pending::DATA;
        } else if ev.contains(EventSet::ERROR) {
            self.kill();
            return;
        }
        self.settle(now, progressed);
    }

    /// Fills an rx packet with the next thing the guest should get (reading host data through
    /// `scratch`). Returns whether `pkt` was filled.
    pub fn recv_pkt<B: BitmapSlice>(
        &mut self,
        pkt: &mut VsockPacket<'_, B>,
        scratch: &mut [u8],
        now: Instant,
    ) -> bool {
        let mut progressed = false;
        let mut filled = false;
        while self.pending != 0 {
            let bit = self.pending & self.pending.wrapping_neg();
            self.pending &= !bit;
            let fwd = self.fwd_cnt;
            let op = match bit {
                pending::RST => {
                    fill_header(pkt, self.guest_cid, self.key, op::RST, Wrapping(0));
                    self.state = ConnState::Closed;
                    self.pending = 0;
                    return true;
                }
                pending::REQUEST => op::REQUEST,
                pending::RESPONSE => {
                    if self.state == ConnState::PeerInit {
                        self.state = ConnState::Established;
                    }
                    op::RESPONSE
                }
                pending::SHUTDOWN => op::SHUTDOWN,
                pending::CREDIT_REQUEST => op::CREDIT_REQUEST,
                pending::CREDIT_UPDATE => op::CREDIT_UPDATE,
                pending::DATA => match self.read_host_data(pkt, scratch, now) {
                    HostData::Read(n) => {
                        fill_header(pkt, self.guest_cid, self.key, op::RW, fwd);
                        pkt.set_len(n);
                        self.last_fwd_cnt_sent = fwd;
                        progressed = true;
                        filled = true;
                        break;
                    }
                    HostData::NoRoom => {
                        // A buffer with no room for data still carries our counters.
                        op::CREDIT_UPDATE
                    }
                    HostData::Nothing => continue,
                },
                _ => continue,
            };
            fill_header(pkt, self.guest_cid, self.key, op, fwd);
            if op == op::SHUTDOWN {
                // A host that only shut its write half still receives: saying "receives no
                // more" too makes Linux reset the connection, and the guest's answer is lost.
                pkt.set_flags(if self.host_done_sending {
                    SHUTDOWN_SEND
                } else {
                    SHUTDOWN_RCV | SHUTDOWN_SEND
                });
            }
            self.last_fwd_cnt_sent = fwd;
            filled = true;
            break;
        }
        self.settle(now, progressed);
        filled
    }

    /// Reads host data into `pkt` within the guest's credit.
    fn read_host_data<B: BitmapSlice>(
        &mut self,
        pkt: &mut VsockPacket<'_, B>,
        scratch: &mut [u8],
        now: Instant,
    ) -> HostData {
        let room = pkt.data_slice().map_or(0, |d| d.len());
        let credit = self.peer_credit() as usize;
        if credit == 0 {
            self.host_read = HostRead::NoCredit;
            self.pending |= pending::CREDIT_REQUEST;
            return HostData::Nothing;
        }
        let want = room.min(credit).min(scratch.len());
        if want == 0 {
            self.pending |= pending::DATA;
            return HostData::NoRoom;
        }
        match self.stream.read(&mut scratch[..want]) {
            Ok(0) => {
                self.host_eof(now);
                HostData::Nothing
            }
            Ok(n) => {
                let Some(data) = pkt.data_slice() else {
                    return HostData::Nothing;
                };
                if data.write_slice(&scratch[..n], 0).is_err() {
                    // Cannot happen (n ≤ room); the bytes would be lost, so end the connection.
                    self.kill();
                    return HostData::Nothing;
                }
                self.rx_cnt += Wrapping(n as u32);
                // More may be waiting: poll again.
                self.host_read = HostRead::Polling;
                HostData::Read(n as u32)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                self.host_read = HostRead::Polling;
                HostData::Nothing
            }
            Err(_) => {
                self.kill();
                HostData::Nothing
            }
        }
    }

    /// The host socket reached EOF. If the host closed it entirely: SHUTDOWN to the guest,
    /// which should answer with RST. If it shut only its write half (as the daemon does after an
    /// upload, then reads the agent's answer): SHUTDOWN "sends no more" to the guest, and the
    /// connection carries the guest's data until the guest closes too. A guest that already
    /// said it sends no more is done both ways: reset once its data is out.
    fn host_eof(&mut self, now: Instant) {
        self.host_read = HostRead::Stopped;
        let hung_up = peer_hung_up(&self.stream);
        match self.state {
            ConnState::PeerClosed { send: true, .. } if hung_up || self.tx_buf.is_empty() => {
                self.kill()
            }
            ConnState::PeerClosed { send: true, .. } => self.host_done_sending = true,
            _ if !hung_up => {
                self.host_done_sending = true;
                self.pending |= pending::SHUTDOWN;
            }
            _ => {
                self.state = ConnState::LocalClosed;
                self.state_since = now;
                self.pending |= pending::SHUTDOWN;
            }
        }
    }

    /// Tracks stalls after every event: work is pending when a packet is owed to the guest,
    /// guest data waits for the host socket, or host data waits for guest credit. Progress is a
    /// byte moved either way or more credit from the guest; while work stays pending without
    /// progress, `stalled_since` stays put and the stall deadline approaches.
    fn settle(&mut self, now: Instant, progressed: bool) {
        if matches!(self.state, ConnState::Killed | ConnState::Closed) {
            self.stalled_since = None;
            return;
        }
        let waiting =
            self.pending != 0 || !self.tx_buf.is_empty() || self.host_read == HostRead::NoCredit;
        self.stalled_since = match self.stalled_since {
            _ if !waiting => None,
            Some(_) if progressed => Some(now),
            Some(since) => Some(since),
            None => Some(now),
        };
    }
}

/// Whether the other end of `stream` closed it entirely rather than shutting only its write
/// half: a Unix stream socket reports `POLLHUP` only once both directions are shut.
fn peer_hung_up(stream: &UnixStream) -> bool {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd for an fd `stream` owns, zero timeout; nothing is retained.
    let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
    ready > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

enum HostData {
    Read(u32),
    NoRoom,
    Nothing,
}

/// Writes a host → guest header for connection `key`.
pub fn fill_header<B: BitmapSlice>(
    pkt: &mut VsockPacket<'_, B>,
    guest_cid: u64,
    key: ConnKey,
    op: u16,
    fwd_cnt: Wrapping<u32>,
) {
    pkt.set_src_cid(HOST_CID)
        .set_dst_cid(guest_cid)
        .set_src_port(key.local)
        .set_dst_port(key.peer)
        .set_type(TYPE_STREAM)
        .set_op(op)
        .set_len(0)
        .set_flags(0)
        .set_buf_alloc(TX_BUF_SIZE)
        .set_fwd_cnt(fwd_cnt.0);
}

/// Copies a guest buffer into the tail of a ring buffer's two slices, starting at `start`.
fn copy_from_volatile<B: BitmapSlice>(
    data: &VolatileSlice<'_, B>,
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

#[cfg(test)]
mod tests {
    //! The state machine alone: a socket pair for the host side, packets in plain buffers.
    #![allow(clippy::unwrap_used)]

    use virtio_vsock::packet::PKT_HEADER_SIZE;

    use super::*;

    const KEY: ConnKey = ConnKey {
        local: 1 << 30,
        peer: 1024,
    };
    const TIMEOUTS: Timeouts = Timeouts {
        handshake: Duration::from_secs(2),
        stall: Some(Duration::from_secs(60)),
    };

    /// Calls `f` with a guest packet in plain memory.
    fn with_pkt<R>(
        op: u16,
        buf_alloc: u32,
        data: &[u8],
        f: impl FnOnce(&VsockPacket<'_, ()>) -> R,
    ) -> R {
        let mut hdr = [0u8; PKT_HEADER_SIZE];
        let mut body = data.to_vec();
        let body = (!body.is_empty()).then_some(&mut body[..]);
        // SAFETY: both buffers outlive the packet, which is only used inside this function.
        let mut pkt = unsafe { VsockPacket::new(&mut hdr, body) }.unwrap();
        pkt.set_op(op)
            .set_type(TYPE_STREAM)
            .set_buf_alloc(buf_alloc)
            .set_len(data.len() as u32);
        f(&pkt)
    }

    /// Asks the connection for its next rx packet; returns its op and data.
    fn next_rx(c: &mut Connection, now: Instant) -> Option<(u16, Vec<u8>)> {
        let mut hdr = [0u8; PKT_HEADER_SIZE];
        let mut data = vec![0u8; 4096];
        let mut scratch = vec![0u8; 4096];
        // SAFETY: both buffers outlive the packet, which is only used inside this function.
        let mut pkt = unsafe { VsockPacket::new(&mut hdr, Some(&mut data[..])) }.unwrap();
        if !c.recv_pkt(&mut pkt, &mut scratch, now) {
            return None;
        }
        let (op, len) = (pkt.op(), pkt.len() as usize);
        Some((op, data[..len].to_vec()))
    }

    /// An established connection whose host side has read its `OK` line.
    fn established(now: Instant) -> (Connection, UnixStream) {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let mut c = Connection::new_local_init(KEY, 3, ours, now);
        assert_eq!(next_rx(&mut c, now).unwrap().0, op::REQUEST);
        with_pkt(op::RESPONSE, 64 * 1024, &[], |p| c.send_pkt(p, now));
        let ok = format!("OK {}\n", KEY.local);
        let mut line = vec![0u8; ok.len()];
        theirs.read_exact(&mut line).unwrap();
        assert_eq!(line, ok.as_bytes());
        (c, theirs)
    }

    #[test]
    fn local_init_waits_the_handshake_timeout_then_answers_ok_on_response() {
        let t0 = Instant::now();
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let mut c = Connection::new_local_init(KEY, 3, ours, t0);
        assert_eq!(c.state(), ConnState::LocalInit);
        assert_eq!(c.deadline(&TIMEOUTS), Some(t0 + Duration::from_secs(2)));
        assert_eq!(c.poll_interest(), Some(EventSet::empty()), "hang-ups only");
        assert_eq!(next_rx(&mut c, t0).unwrap().0, op::REQUEST);
        with_pkt(op::RESPONSE, 4096, &[], |p| c.send_pkt(p, t0));
        assert_eq!(c.state(), ConnState::Established);
        assert_eq!(c.deadline(&TIMEOUTS), None, "established and idle");
        assert_eq!(c.poll_interest(), Some(EventSet::IN));
        let mut line = [0u8; 32];
        let n = theirs.read(&mut line).unwrap();
        assert_eq!(&line[..n], format!("OK {}\n", KEY.local).as_bytes());
    }

    #[test]
    fn data_before_the_guest_answered_is_a_violation_that_resets_once() {
        let t0 = Instant::now();
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let mut c = Connection::new_local_init(KEY, 3, ours, t0);
        with_pkt(op::RW, 4096, b"early", |p| c.send_pkt(p, t0));
        assert_eq!(c.state(), ConnState::Killed);
        assert_eq!(c.poll_interest(), None);
        assert_eq!(c.deadline(&TIMEOUTS), None);
        // The host side sees EOF at once, whatever the guest does next.
        let mut b = [0u8; 8];
        assert_eq!(theirs.read(&mut b).unwrap(), 0);
        assert_eq!(next_rx(&mut c, t0).unwrap().0, op::RST);
        assert_eq!(c.state(), ConnState::Closed);
        assert!(next_rx(&mut c, t0).is_none(), "exactly one RST");
    }

    #[test]
    fn stall_deadline_counts_from_the_last_progress_and_clears_when_nothing_is_pending() {
        let t0 = Instant::now();
        let (mut c, mut theirs) = established(t0);
        // Fill the host socket (its reader is away) so guest data has to wait in the device.
        let junk = vec![0u8; 4096];
        let mut filled = 0;
        while let Ok(n) = c.stream.write(&junk) {
            filled += n;
        }
        let chunk = vec![9u8; 64 * 1024];
        for _ in 0..3 {
            with_pkt(op::RW, 4096, &chunk, |p| c.send_pkt(p, t0));
        }
        let sent = 3 * chunk.len();
        assert_eq!(
            c.tx_buf.len(),
            sent,
            "precondition: the host socket was full"
        );
        let stall = Duration::from_secs(60);
        assert_eq!(c.deadline(&TIMEOUTS), Some(t0 + stall));
        assert_eq!(c.poll_interest(), Some(EventSet::IN | EventSet::OUT));

        // Writable again but nothing moved (a spurious wake-up): no progress.
        let t1 = t0 + Duration::from_secs(30);
        c.notify(EventSet::OUT, t1);
        assert_eq!(c.deadline(&TIMEOUTS), Some(t0 + stall));
        // A zero-credit update is no progress either.
        with_pkt(op::CREDIT_UPDATE, 4096, &[], |p| c.send_pkt(p, t1));
        assert_eq!(c.deadline(&TIMEOUTS), Some(t0 + stall));

        // The host reads a little: bytes move, the deadline moves with them.
        let mut buf = vec![0u8; 8192];
        theirs.read_exact(&mut buf[..4096]).unwrap();
        let t2 = t0 + Duration::from_secs(50);
        c.notify(EventSet::OUT, t2);
        assert!(c.tx_buf.len() < sent, "some guest data moved");
        assert!(!c.tx_buf.is_empty(), "precondition: not all of it");
        assert_eq!(c.deadline(&TIMEOUTS), Some(t2 + stall));

        // The host drains everything: nothing pending, no deadline.
        let mut left = filled + sent - 4096;
        theirs.set_nonblocking(true).unwrap();
        let t3 = t0 + Duration::from_secs(55);
        while left > 0 {
            match theirs.read(&mut buf) {
                Ok(n) => left -= n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => c.notify(EventSet::OUT, t3),
                Err(e) => panic!("{e}"),
            }
        }
        c.notify(EventSet::OUT, t3);
        // A credit update is owed (over 64 KiB may have been forwarded): delivering it is the
        // last pending thing.
        while next_rx(&mut c, t3).is_some() {}
        assert_eq!(c.deadline(&TIMEOUTS), None);
        assert_eq!(c.poll_interest(), Some(EventSet::IN));
    }

    #[test]
    fn host_data_waiting_for_guest_credit_is_a_stall_until_credit_arrives() {
        let t0 = Instant::now();
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let mut c = Connection::new_local_init(KEY, 3, ours, t0);
        next_rx(&mut c, t0);
        with_pkt(op::RESPONSE, 4, &[], |p| c.send_pkt(p, t0));
        theirs.write_all(b"0123456789").unwrap();
        c.notify(EventSet::IN, t0);
        assert_eq!(next_rx(&mut c, t0), Some((op::RW, b"0123".to_vec())));
        c.notify(EventSet::IN, t0);
        assert_eq!(next_rx(&mut c, t0).unwrap().0, op::CREDIT_REQUEST);
        assert_eq!(
            c.poll_interest(),
            None,
            "not polled while the guest has no credit"
        );
        assert_eq!(c.deadline(&TIMEOUTS), Some(t0 + Duration::from_secs(60)));
        // The guest consumed the 4 bytes: credit again, reading resumes, the stall is over.
        let t1 = t0 + Duration::from_secs(10);
        let mut hdr = [0u8; PKT_HEADER_SIZE];
        // SAFETY: `hdr` outlives the packet, which is only used in this block.
        let mut upd = unsafe { VsockPacket::new(&mut hdr, None) }.unwrap();
        upd.set_op(op::CREDIT_UPDATE)
            .set_type(TYPE_STREAM)
            .set_buf_alloc(4)
            .set_fwd_cnt(4);
        c.send_pkt(&upd, t1);
        assert_eq!(c.poll_interest(), Some(EventSet::IN));
        assert_eq!(c.deadline(&TIMEOUTS), None);
    }

    #[test]
    fn host_eof_sends_shutdown_and_waits_the_handshake_timeout_for_the_guest_rst() {
        let t0 = Instant::now();
        let (mut c, theirs) = established(t0);
        drop(theirs);
        let t1 = t0 + Duration::from_secs(5);
        c.notify(EventSet::IN | EventSet::HANG_UP, t1);
        let (op, _) = next_rx(&mut c, t1).unwrap();
        assert_eq!(op, op::SHUTDOWN);
        assert_eq!(c.state(), ConnState::LocalClosed);
        assert_eq!(c.deadline(&TIMEOUTS), Some(t1 + Duration::from_secs(2)));
        assert_eq!(c.poll_interest(), None, "a hung-up socket is not polled");
        with_pkt(op::RST, 0, &[], |p| c.send_pkt(p, t1));
        assert_eq!(c.state(), ConnState::Closed);
        assert!(!c.has_pending_rx());
    }

    /// The daemon uploads a tar, shuts its write half and reads the agent's answer. Telling
    /// Linux the host "receives no more" as well made it reset the connection at once, so the
    /// answer was lost (found by the first Linux driver against the device, over vhost-user).
    #[test]
    fn host_half_close_tells_the_guest_only_that_the_host_sends_no_more_and_carries_its_answer() {
        let t0 = Instant::now();
        let (mut c, mut theirs) = established(t0);
        theirs.shutdown(std::net::Shutdown::Write).unwrap();
        c.notify(EventSet::IN | EventSet::READ_HANG_UP, t0);
        let mut hdr = [0u8; PKT_HEADER_SIZE];
        let mut data = vec![0u8; 4096];
        let mut scratch = vec![0u8; 4096];
        // SAFETY: both buffers outlive the packet, which is only used inside this test.
        let mut pkt = unsafe { VsockPacket::new(&mut hdr, Some(&mut data[..])) }.unwrap();
        assert!(c.recv_pkt(&mut pkt, &mut scratch, t0));
        assert_eq!(pkt.op(), op::SHUTDOWN);
        assert_eq!(pkt.flags(), SHUTDOWN_SEND, "the host still receives");
        assert_eq!(c.state(), ConnState::Established);
        assert_eq!(c.deadline(&TIMEOUTS), None, "no RST is awaited");
        assert_eq!(
            c.poll_interest(),
            Some(EventSet::empty()),
            "not read, but a later full close is heard"
        );

        let t1 = t0 + Duration::from_secs(30);
        with_pkt(op::RW, 64 * 1024, b"answer", |p| c.send_pkt(p, t1));
        let mut got = [0u8; 6];
        theirs.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"answer");
        // The guest closes: the connection is done both ways, RST, and the host sees EOF.
        let mut hdr = [0u8; PKT_HEADER_SIZE];
        // SAFETY: the header buffer outlives the packet, which is only used inside this test.
        let mut shut = unsafe { VsockPacket::new(&mut hdr, None) }.unwrap();
        shut.set_op(op::SHUTDOWN)
            .set_type(TYPE_STREAM)
            .set_buf_alloc(64 * 1024)
            .set_flags(SHUTDOWN_RCV | SHUTDOWN_SEND);
        c.send_pkt(&shut, t1);
        assert_eq!(c.state(), ConnState::Killed);
        assert_eq!(next_rx(&mut c, t1).unwrap().0, op::RST);
        let mut rest = Vec::new();
        assert_eq!(theirs.read_to_end(&mut rest).unwrap(), 0);
    }

    #[test]
    fn host_full_close_after_a_half_close_resets_the_connection() {
        let t0 = Instant::now();
        let (mut c, theirs) = established(t0);
        theirs.shutdown(std::net::Shutdown::Write).unwrap();
        c.notify(EventSet::IN | EventSet::READ_HANG_UP, t0);
        assert_eq!(next_rx(&mut c, t0).unwrap().0, op::SHUTDOWN);
        drop(theirs);
        c.notify(EventSet::HANG_UP, t0);
        assert_eq!(c.state(), ConnState::Killed);
        assert_eq!(next_rx(&mut c, t0).unwrap().0, op::RST);
    }
}
