//! The Unix-socket backend (Firecracker's muxer): accepts host clients on `uds_path`, reads
//! their `CONNECT` lines, connects guest connections to `<uds_path>_<port>`, routes packets to
//! each [`Connection`]'s state machine, and enforces every deadline through the kill queue and
//! one timerfd. Everything (listener, handshakes, connections, timer) is polled through one
//! private epoll whose fd the VMM's event loop watches.
//!
//! Each entry point takes the current time from its caller (`*_at`) so tests move time forward
//! without sleeping; the [`VsockChannel`]/[`VsockBackend`] methods pass `Instant::now()`.

use std::collections::{HashMap, VecDeque};
use std::io::{self, ErrorKind, Read};
use std::num::Wrapping;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use virtio_vsock::packet::VsockPacket;
use vm_memory::bitmap::BitmapSlice;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

use super::backend::{VsockBackend, VsockChannel};
pub use super::connection::TX_BUF_SIZE;
use super::connection::{fill_header, ConnKey, ConnState, Connection, Timeouts};
use super::handshake::{ConnectLine, LineStatus};
use super::killq::{KillQueue, KillTarget};
use super::socket_file::{self, SocketFile, SocketFileError};
use super::{op, HOST_CID, TYPE_STREAM};

/// RSTs for unknown connections waiting for rx buffers; more are dropped (the guest times out).
const MAX_PENDING_RSTS: usize = 256;
/// The first port handed to host-initiated connections.
const FIRST_LOCAL_PORT: u32 = 1 << 30;

/// Why the vsock backend failed.
#[derive(Debug, thiserror::Error)]
pub enum MuxerError {
    /// The Unix socket could not be bound.
    #[error(transparent)]
    Socket(#[from] SocketFileError),
    /// The private epoll, its timer (or an eventfd) could not be set up.
    #[error("epoll")]
    Epoll(#[source] io::Error),
}

/// The muxer's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MuxerConfig {
    /// Connections at once, handshakes included.
    pub max_conns: usize,
    /// See [`Timeouts`].
    pub timeouts: Timeouts,
}

impl MuxerConfig {
    /// `max_conns` connections with the default timeouts
    /// ([`contract::vsock::DEFAULT_HANDSHAKE_TIMEOUT_MS`],
    /// [`contract::vsock::DEFAULT_STALL_TIMEOUT_MS`]).
    pub fn new(max_conns: usize) -> Self {
        MuxerConfig {
            max_conns,
            timeouts: Timeouts {
                handshake: Duration::from_millis(contract::vsock::DEFAULT_HANDSHAKE_TIMEOUT_MS),
                stall: Some(Duration::from_millis(
                    contract::vsock::DEFAULT_STALL_TIMEOUT_MS,
                )),
            },
        }
    }
}

/// What an fd in the private epoll belongs to.
#[derive(Debug, Clone, Copy)]
enum Owner {
    Listener,
    Timer,
    /// An accepted socket that has not finished its `CONNECT <port>\n` line.
    Handshake,
    Conn(ConnKey),
}

#[derive(Debug)]
struct Handshake {
    stream: UnixStream,
    line: ConnectLine,
    accepted_at: Instant,
    deadline: Option<Instant>,
}

/// A connection and the muxer's bookkeeping about it.
#[derive(Debug)]
struct Slot {
    conn: Connection,
    /// In `rx_queue`.
    rx_queued: bool,
    /// The earliest kill-queue entry for it (later ones are stale).
    kill_scheduled: Option<Instant>,
    /// What its socket is registered for in the epoll (`None`: not registered).
    polled: Option<EventSet>,
}

/// The vsock backend.
#[derive(Debug)]
pub struct Muxer {
    cid: u64,
    uds_path: PathBuf,
    socket_file: SocketFile,
    listener: UnixListener,
    epoll: Epoll,
    timer: TimerFd,
    timer_armed_for: Option<Instant>,
    slots: HashMap<ConnKey, Slot>,
    handshakes: HashMap<RawFd, Handshake>,
    owners: HashMap<RawFd, Owner>,
    rx_queue: VecDeque<ConnKey>,
    rsts: VecDeque<ConnKey>,
    killq: KillQueue,
    next_local_port: u32,
    config: MuxerConfig,
    scratch: Vec<u8>,
}

impl AsRawFd for Muxer {
    /// The private epoll: readable when some socket or the timer needs attention.
    fn as_raw_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }
}

impl Muxer {
    /// A muxer for guest `cid` listening on `uds_path` (replacing a stale socket file; a path
    /// that is not a socket, or one another process listens on, is an error).
    pub fn new(cid: u64, uds_path: &Path, config: MuxerConfig) -> Result<Self, MuxerError> {
        let (listener, socket_file) = socket_file::bind(uds_path)?;
        let timer = TimerFd::new().map_err(|e| MuxerError::Epoll(e.into()))?;
        set_nonblocking(timer.as_raw_fd()).map_err(MuxerError::Epoll)?;
        let mut m = Muxer {
            cid,
            uds_path: uds_path.to_owned(),
            socket_file,
            listener,
            epoll: Epoll::new().map_err(MuxerError::Epoll)?,
            timer,
            timer_armed_for: None,
            slots: HashMap::new(),
            handshakes: HashMap::new(),
            owners: HashMap::new(),
            rx_queue: VecDeque::new(),
            rsts: VecDeque::new(),
            killq: KillQueue::new(),
            next_local_port: FIRST_LOCAL_PORT,
            config,
            scratch: vec![0u8; super::queues::MAX_PKT_DATA as usize],
        };
        let fd = m.listener.as_raw_fd();
        m.register(fd, Owner::Listener, EventSet::IN, ControlOperation::Add)
            .map_err(MuxerError::Epoll)?;
        let fd = m.timer.as_raw_fd();
        m.register(fd, Owner::Timer, EventSet::IN, ControlOperation::Add)
            .map_err(MuxerError::Epoll)?;
        Ok(m)
    }

    /// A guard that removes the socket file when dropped, if it is still ours (for the VMM to
    /// hold until exit: the device itself may outlive `main`'s last statement).
    pub fn socket_file(&self) -> SocketFile {
        self.socket_file.clone()
    }

    /// The number of live connections (handshakes included).
    pub fn connection_count(&self) -> usize {
        self.slots.len() + self.handshakes.len()
    }

    /// The state of connection (`local`, `peer`), if it exists.
    pub fn connection_state(&self, local: u32, peer: u32) -> Option<ConnState> {
        self.slots
            .get(&ConnKey { local, peer })
            .map(|s| s.conn.state())
    }

    /// When connection (`local`, `peer`) will be killed unless something changes first.
    pub fn connection_deadline(&self, local: u32, peer: u32) -> Option<Instant> {
        self.slots
            .get(&ConnKey { local, peer })
            .and_then(|s| s.conn.deadline(&self.config.timeouts))
    }

    /// The earliest entry in the kill queue (possibly stale: the timer is armed for it).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.killq.next_deadline()
    }

    fn register(
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

    fn unregister(&mut self, fd: RawFd) {
        let _ = self
            .epoll
            .ctl(ControlOperation::Delete, fd, EpollEvent::default());
        self.owners.remove(&fd);
    }

    /// Brings the muxer's bookkeeping in line with a connection that may have changed: drops it
    /// when closed, queues it for rx, schedules its deadline, re-registers its socket.
    fn sync(&mut self, key: ConnKey) {
        let Some(slot) = self.slots.get_mut(&key) else {
            return;
        };
        if slot.conn.state() == ConnState::Closed {
            self.remove(key);
            return;
        }
        if slot.conn.has_pending_rx() && !slot.rx_queued {
            slot.rx_queued = true;
            self.rx_queue.push_back(key);
        }
        if let Some(at) = slot.conn.deadline(&self.config.timeouts) {
            if slot.kill_scheduled.is_none_or(|s| at < s) {
                slot.kill_scheduled = Some(at);
                self.killq.schedule(at, KillTarget::Conn(key));
            }
        }
        let want = slot.conn.poll_interest();
        if want == slot.polled {
            return;
        }
        let fd = slot.conn.stream_fd();
        let result = match (slot.polled, want) {
            (_, None) => {
                slot.polled = None;
                self.unregister(fd);
                return;
            }
            (None, Some(ev)) => self.register(fd, Owner::Conn(key), ev, ControlOperation::Add),
            (Some(_), Some(ev)) => {
                self.register(fd, Owner::Conn(key), ev, ControlOperation::Modify)
            }
        };
        let Some(slot) = self.slots.get_mut(&key) else {
            return;
        };
        match result {
            Ok(()) => slot.polled = want,
            Err(e) => {
                log(format_args!("cannot poll a connection socket: {e}"));
                // Killed connections are never polled, so this ends.
                slot.conn.kill();
                self.sync(key);
            }
        }
    }

    fn remove(&mut self, key: ConnKey) {
        if let Some(slot) = self.slots.remove(&key) {
            if slot.polled.is_some() {
                self.unregister(slot.conn.stream_fd());
            }
        }
    }

    fn rst_unknown(&mut self, key: ConnKey) {
        if self.rsts.len() < MAX_PENDING_RSTS {
            self.rsts.push_back(key);
        }
    }

    /// Handles a packet the guest sent (tx queue), at `now`.
    pub fn send_pkt_at<B: BitmapSlice>(&mut self, pkt: &VsockPacket<'_, B>, now: Instant) {
        let key = ConnKey {
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
        match self.slots.get_mut(&key) {
            Some(slot) => {
                slot.conn.send_pkt(pkt, now);
                self.sync(key);
            }
            None => match pkt.op() {
                op::REQUEST => self.guest_connect(key, pkt, now),
                op::RST => {}
                _ => self.rst_unknown(key),
            },
        }
        self.after(now);
    }

    /// A guest connection to host port `key.local`: connect `<uds_path>_<port>`
    /// (`contract::vsock::host_port_path`, where the daemon listens).
    fn guest_connect<B: BitmapSlice>(
        &mut self,
        key: ConnKey,
        pkt: &VsockPacket<'_, B>,
        now: Instant,
    ) {
        if self.connection_count() >= self.config.max_conns {
            self.rst_unknown(key);
            return;
        }
        let path = contract::vsock::host_port_path(&self.uds_path, key.local);
        // Never a blocking connect: the event loop serves every connection and the queues, so
        // a host listener whose backlog is full (a stalled daemon, or a guest flooding one
        // port) gets the guest an RST instead of freezing the VM's devices.
        let stream = match connect_without_blocking(&path) {
            Ok(s) => s,
            Err(_) => {
                self.rst_unknown(key);
                return;
            }
        };
        let conn = Connection::new_peer_init(key, self.cid, stream, pkt, now);
        self.insert(conn);
    }

    fn insert(&mut self, conn: Connection) {
        let key = conn.key();
        self.slots.insert(
            key,
            Slot {
                conn,
                rx_queued: false,
                kill_scheduled: None,
                polled: None,
            },
        );
        self.sync(key);
    }

    /// Fills an rx packet with the next thing the guest should get, at `now`; returns whether
    /// it did.
    pub fn recv_pkt_at<B: BitmapSlice>(
        &mut self,
        pkt: &mut VsockPacket<'_, B>,
        now: Instant,
    ) -> bool {
        if let Some(key) = self.rsts.pop_front() {
            fill_header(pkt, self.cid, key, op::RST, Wrapping(0));
            return true;
        }
        let mut filled = false;
        while let Some(key) = self.rx_queue.pop_front() {
            let Some(slot) = self.slots.get_mut(&key) else {
                continue;
            };
            slot.rx_queued = false;
            filled = slot.conn.recv_pkt(pkt, &mut self.scratch, now);
            // Still owing something: back of the queue, so connections take turns.
            self.sync(key);
            if filled {
                break;
            }
        }
        self.after(now);
        filled
    }

    /// Whether something waits to go to the guest.
    pub fn has_pending_rx(&self) -> bool {
        !self.rsts.is_empty() || !self.rx_queue.is_empty()
    }

    /// Forgets every connection and handshake (device reset): their sockets close.
    pub fn reset(&mut self) {
        let keys: Vec<ConnKey> = self.slots.keys().copied().collect();
        for k in keys {
            self.remove(k);
        }
        let fds: Vec<RawFd> = self.handshakes.keys().copied().collect();
        for fd in fds {
            self.unregister(fd);
            self.handshakes.remove(&fd);
        }
        self.rx_queue.clear();
        self.rsts.clear();
        self.killq.clear();
        self.rearm_timer();
    }

    /// Handles whatever the sockets and the timer have (never blocks), at `now`.
    pub fn process_events_at(&mut self, now: Instant) {
        let mut events = [EpollEvent::default(); 32];
        loop {
            let n = match self.epoll.wait(0, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    log(format_args!("epoll: {e}"));
                    break;
                }
            };
            for ev in &events[..n] {
                let fd = ev.fd();
                match self.owners.get(&fd).copied() {
                    Some(Owner::Listener) => self.accept(now),
                    Some(Owner::Timer) => {
                        // Only clears readiness (the fd is non-blocking); the kill queue says
                        // what is due.
                        let _ = self.timer.wait();
                        self.timer_armed_for = None;
                    }
                    Some(Owner::Handshake) => self.read_handshake(fd),
                    Some(Owner::Conn(key)) => {
                        if let Some(slot) = self.slots.get_mut(&key) {
                            slot.conn.notify(ev.event_set(), now);
                            self.sync(key);
                        }
                    }
                    None => {}
                }
            }
            if n < events.len() {
                break;
            }
        }
        self.after(now);
    }

    /// After every entry point: kill what is due, keep the kill queue compact, arm the timer
    /// for the next deadline.
    fn after(&mut self, now: Instant) {
        self.sweep(now);
        let live = self.connection_count();
        if self.killq.needs_compaction(live) {
            self.compact_killq();
        }
        self.rearm_timer();
    }

    /// Kills every connection and handshake whose deadline has passed at `now`: a connection
    /// gets RST (its host socket is shut at once), a handshake's socket is closed.
    pub fn sweep(&mut self, now: Instant) {
        while let Some((at, target)) = self.killq.pop_due(now) {
            match target {
                KillTarget::Handshake(fd) => {
                    let due = self
                        .handshakes
                        .get(&fd)
                        .is_some_and(|h| h.deadline.is_some_and(|d| d <= now));
                    if due {
                        self.unregister(fd);
                        self.handshakes.remove(&fd);
                    }
                }
                KillTarget::Conn(key) => {
                    let Some(slot) = self.slots.get_mut(&key) else {
                        continue;
                    };
                    if slot.kill_scheduled != Some(at) {
                        continue; // Stale: a later entry is the live one.
                    }
                    slot.kill_scheduled = None;
                    if slot
                        .conn
                        .deadline(&self.config.timeouts)
                        .is_some_and(|d| d <= now)
                    {
                        log(format_args!(
                            "resetting connection {}:{} ({:?}): deadline passed",
                            key.local,
                            key.peer,
                            slot.conn.state()
                        ));
                        slot.conn.kill();
                    }
                    // Reschedules a deadline that moved, queues the RST.
                    self.sync(key);
                }
            }
        }
    }

    fn compact_killq(&mut self) {
        let timeouts = self.config.timeouts;
        let mut entries = Vec::with_capacity(self.connection_count());
        for (key, slot) in &mut self.slots {
            slot.kill_scheduled = slot.conn.deadline(&timeouts);
            if let Some(at) = slot.kill_scheduled {
                entries.push((at, KillTarget::Conn(*key)));
            }
        }
        for (fd, h) in &self.handshakes {
            if let Some(at) = h.deadline {
                entries.push((at, KillTarget::Handshake(*fd)));
            }
        }
        self.killq.rebuild(entries);
    }

    /// Arms the timerfd for the earliest deadline (or disarms it).
    fn rearm_timer(&mut self) {
        let next = self.killq.next_deadline();
        if next == self.timer_armed_for {
            return;
        }
        // A zero duration would disarm the timer: a due deadline fires as soon as possible.
        let dur = next.map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
                .max(Duration::from_micros(1))
        });
        match self.timer.reset(dur, None) {
            Ok(()) => self.timer_armed_for = next,
            Err(e) => log(format_args!("cannot arm the deadline timer: {e}")),
        }
    }

    fn accept(&mut self, now: Instant) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            // Over the limit, the client sees its socket close.
            if self.connection_count() >= self.config.max_conns
                || stream.set_nonblocking(true).is_err()
            {
                continue;
            }
            let fd = stream.as_raw_fd();
            let deadline = now.checked_add(self.config.timeouts.handshake);
            self.handshakes.insert(
                fd,
                Handshake {
                    stream,
                    line: ConnectLine::new(),
                    accepted_at: now,
                    deadline,
                },
            );
            if self
                .register(fd, Owner::Handshake, EventSet::IN, ControlOperation::Add)
                .is_err()
            {
                self.handshakes.remove(&fd);
                continue;
            }
            if let Some(at) = deadline {
                self.killq.schedule(at, KillTarget::Handshake(fd));
            }
            // The line may already be there.
            self.read_handshake(fd);
        }
    }

    /// Reads the `CONNECT <port>\n` line byte by byte (so no stream data is consumed); a line
    /// that cannot become valid is refused at its first wrong byte.
    fn read_handshake(&mut self, fd: RawFd) {
        let Some(h) = self.handshakes.get_mut(&fd) else {
            return;
        };
        let mut byte = [0u8; 1];
        let port = loop {
            match h.stream.read(&mut byte) {
                Ok(0) => break None,
                Ok(_) => match h.line.push(byte[0]) {
                    LineStatus::Incomplete => {}
                    LineStatus::Port(p) => break Some(p),
                    LineStatus::Refused(_) => break None,
                },
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break None,
            }
        };
        self.unregister(fd);
        let Some(h) = self.handshakes.remove(&fd) else {
            return;
        };
        let Some(peer) = port else {
            return; // Dropping the stream closes it: the client sees the refusal.
        };
        let local = self.alloc_port(peer);
        let key = ConnKey { local, peer };
        // The guest has what is left of the handshake timeout to answer.
        let conn = Connection::new_local_init(key, self.cid, h.stream, h.accepted_at);
        self.insert(conn);
    }

    fn alloc_port(&mut self, peer: u32) -> u32 {
        loop {
            let p = self.next_local_port;
            self.next_local_port = p.checked_add(1).unwrap_or(FIRST_LOCAL_PORT);
            if !self.slots.contains_key(&ConnKey { local: p, peer }) {
                return p;
            }
        }
    }
}

impl VsockChannel for Muxer {
    fn send_pkt<B: BitmapSlice>(&mut self, pkt: &VsockPacket<'_, B>) {
        self.send_pkt_at(pkt, Instant::now());
    }

    fn recv_pkt<B: BitmapSlice>(&mut self, pkt: &mut VsockPacket<'_, B>) -> bool {
        self.recv_pkt_at(pkt, Instant::now())
    }

    fn has_pending_rx(&self) -> bool {
        Muxer::has_pending_rx(self)
    }
}

impl VsockBackend for Muxer {
    fn poll_fd(&self) -> Option<RawFd> {
        Some(self.as_raw_fd())
    }

    fn process_events(&mut self) {
        self.process_events_at(Instant::now());
    }

    fn reset(&mut self) {
        Muxer::reset(self);
    }
}

/// Connects a non-blocking Unix stream socket to `path`. A Unix-domain connect completes or
/// fails at once; with the socket non-blocking, a listener whose backlog is full answers
/// `EAGAIN` (`WouldBlock`) instead of making the caller wait for room.
pub(super) fn connect_without_blocking(path: &Path) -> io::Result<UnixStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;

    // SAFETY: sockaddr_un is plain old data; all-zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    // One byte stays zero: the path is NUL-terminated.
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            format!("{} cannot be a Unix socket address", path.display()),
        ));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: socket(2) takes no pointers.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socket(2) just returned this descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `addr` is a live, initialised sockaddr_un and `len` covers its family and the
    // NUL-terminated path, within the struct.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
            len as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(fd))
}

/// Makes `fd` non-blocking, so reading the timer when it has not fired cannot block.
fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL on an fd we own; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_SETFL with integer flags on an fd we own.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn log(args: std::fmt::Arguments<'_>) {
    eprintln!("crucible-vmm: vsock: {args}");
}
