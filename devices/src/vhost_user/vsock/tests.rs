//! The vhost-user vsock backend on vrings in plain guest memory with the real Unix-socket muxer,
//! and `serve` against the `vhost` crate's frontend: what a frontend sees (features, config,
//! hang-up) and what the vring worker does with each event.

#![allow(clippy::unwrap_used)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc;

use vhost::vhost_user::message::VhostUserConfigFlags;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;
use virtio_bindings::bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_vsock::packet::PKT_HEADER_SIZE;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

use super::*;
use crate::virtio::test_utils::{default_mem, Buf, TestQueue};
use crate::virtio::vsock::{op, HOST_CID, TYPE_STREAM};

const CID: u64 = 3;
const QUEUE_SIZE: u16 = 256;

/// A guest → host packet header.
fn header(op: u16, guest_port: u32, host_port: u32, len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(PKT_HEADER_SIZE);
    h.extend_from_slice(&CID.to_le_bytes());
    h.extend_from_slice(&HOST_CID.to_le_bytes());
    h.extend_from_slice(&guest_port.to_le_bytes());
    h.extend_from_slice(&host_port.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&TYPE_STREAM.to_le_bytes());
    h.extend_from_slice(&op.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes()); // flags
    h.extend_from_slice(&(64 * 1024u32).to_le_bytes()); // buf_alloc
    h.extend_from_slice(&0u32.to_le_bytes()); // fwd_cnt
    h
}

fn op_of(header: &[u8]) -> u16 {
    u16::from_le_bytes([header[30], header[31]])
}

/// A vring over `queue` as a frontend would set it up (started, and enabled if `enabled`),
/// and the eventfd behind its call fd.
fn vring(
    mem: &AtomicGuestMemory,
    queue: &TestQueue<'_>,
    enabled: bool,
) -> (VringRwLock<AtomicGuestMemory>, EventFd) {
    let vring = VringRwLock::new(mem.clone(), QUEUE_SIZE).unwrap();
    vring
        .set_queue_info(
            queue.mock.desc_table_addr().0,
            queue.mock.avail_addr().0,
            queue.mock.used_addr().0,
        )
        .unwrap();
    vring.set_queue_size(QUEUE_SIZE);
    vring.set_queue_ready(true);
    vring.set_enabled(enabled);
    let call = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    // SAFETY: the fd is a fresh duplicate that nothing else owns; the File takes it over.
    let file = unsafe { File::from_raw_fd(call.try_clone().unwrap().into_raw_fd()) };
    vring.set_call(Some(file));
    (vring, call)
}

fn signalled(call: &EventFd) -> bool {
    call.read().is_ok()
}

/// A backend with a muxer on a fresh socket in `dir`, its memory set.
fn backend(dir: &Path, mem: &AtomicGuestMemory) -> VhostUserVsock {
    let muxer = Muxer::new(CID, &dir.join("vsock.sock"), MuxerConfig::new(16)).unwrap();
    let mut backend = VhostUserVsock::new(CID, muxer).unwrap();
    backend.update_memory(mem.clone()).unwrap();
    backend
}

#[test]
fn vhost_user_vsock_offers_version_1_and_config_and_reads_the_cid_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mem = GuestMemoryAtomic::new(default_mem());
    let backend = backend(dir.path(), &mem);
    let features = backend.features();
    assert_ne!(features & (1 << VIRTIO_F_VERSION_1), 0);
    assert_ne!(
        features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(),
        0
    );
    assert_eq!(
        features & (1 << VIRTIO_RING_F_EVENT_IDX),
        0,
        "the shared queue code does not do EVENT_IDX"
    );
    assert!(backend
        .protocol_features()
        .contains(VhostUserProtocolFeatures::CONFIG));
    assert_eq!(backend.num_queues(), 3);
    assert_eq!(backend.get_config(0, 8), CID.to_le_bytes());
    assert_eq!(backend.get_config(4, 8), [0u8; 8], "past the CID: zeros");
    assert_eq!(
        backend.get_config(0, u32::MAX).len(),
        crate::vhost_user::MAX_CONFIG_BYTES as usize
    );
    assert_eq!(backend.get_config(u32::MAX, 4), [0u8; 4]);
}

#[test]
fn vhost_user_vsock_refuses_events_it_cannot_serve() {
    let dir = tempfile::tempdir().unwrap();
    let raw = default_mem();
    let mem = GuestMemoryAtomic::new(raw.clone());
    let muxer = Muxer::new(CID, &dir.path().join("vsock.sock"), MuxerConfig::new(16)).unwrap();
    let mut backend = VhostUserVsock::new(CID, muxer).unwrap();
    let (rx, tx) = (
        TestQueue::new(&raw, 0, QUEUE_SIZE),
        TestQueue::new(&raw, 1, QUEUE_SIZE),
    );
    let vrings = [vring(&mem, &rx, true).0, vring(&mem, &tx, true).0];
    // A kick before SET_MEM_TABLE is a frontend bug: an error, not a panic.
    let early = backend.handle_event(TX_QUEUE, EventSet::IN, &vrings, 0);
    assert!(early.unwrap_err().to_string().contains("memory table"));
    // The host side runs before the memory table arrives (a client may connect first).
    backend
        .handle_event(BACKEND_EVENT, EventSet::IN, &vrings, 0)
        .unwrap();
    backend.update_memory(mem).unwrap();
    assert!(backend
        .handle_event(BACKEND_EVENT + 1, EventSet::IN, &vrings, 0)
        .is_err());
    backend
        .handle_event(EVENT_QUEUE, EventSet::IN, &vrings, 0)
        .unwrap();
    // Fewer vrings than queues (QEMU sets up rx and tx only): nothing to do, no panic.
    backend
        .handle_event(TX_QUEUE, EventSet::IN, &[], 0)
        .unwrap();
}

#[test]
fn vhost_user_vsock_connects_a_guest_to_the_host_and_carries_data_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let raw = default_mem();
    let mem = GuestMemoryAtomic::new(raw.clone());
    let mut backend = backend(dir.path(), &mem);
    let host = UnixListener::bind(dir.path().join("vsock.sock_5000")).unwrap();
    let (mut rx, mut tx) = (
        TestQueue::new(&raw, 0, QUEUE_SIZE),
        TestQueue::new(&raw, 1, QUEUE_SIZE),
    );
    let (rx_vring, rx_call) = vring(&mem, &rx, true);
    let (tx_vring, tx_call) = vring(&mem, &tx, true);
    let vrings = [rx_vring, tx_vring];
    let rx_bufs: Vec<_> = (0..4)
        .map(|_| rx.add(&[Buf::W(PKT_HEADER_SIZE as u32 + 4096)])[0])
        .collect();

    // The guest connects to host port 5000: the tx chain is consumed, the host socket at
    // `<uds>_5000` is connected, and the RESPONSE lands in rx — all on one tx kick.
    tx.add(&[Buf::R(&header(op::REQUEST, 1234, 5000, 0))]);
    backend
        .handle_event(TX_QUEUE, EventSet::IN, &vrings, 0)
        .unwrap();
    assert_eq!(tx.used().unwrap().1, 0);
    assert!(signalled(&tx_call));
    let (mut peer, _) = host.accept().unwrap();
    assert_eq!(rx.used().unwrap().1, PKT_HEADER_SIZE as u32);
    assert_eq!(op_of(&rx.read(rx_bufs[0], PKT_HEADER_SIZE)), op::RESPONSE);
    assert!(signalled(&rx_call));

    // Guest → host.
    let mut rw = header(op::RW, 1234, 5000, 5);
    rw.extend_from_slice(b"hello");
    tx.add(&[Buf::R(&rw)]);
    backend
        .handle_event(TX_QUEUE, EventSet::IN, &vrings, 0)
        .unwrap();
    let mut got = [0u8; 5];
    peer.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello");

    // Host → guest: the muxer's fd is the worker's BACKEND_EVENT.
    peer.write_all(b"world").unwrap();
    backend
        .handle_event(BACKEND_EVENT, EventSet::IN, &vrings, 0)
        .unwrap();
    let (_, len) = rx.used().unwrap();
    assert_eq!(len, PKT_HEADER_SIZE as u32 + 5);
    assert_eq!(op_of(&rx.read(rx_bufs[1], PKT_HEADER_SIZE)), op::RW);
    assert_eq!(
        rx.read(GuestAddress(rx_bufs[1].0 + PKT_HEADER_SIZE as u64), 5),
        b"world"
    );
    assert!(signalled(&rx_call));
    assert_eq!(backend.backend().connection_count(), 1);

    // The driver resets the device: QEMU stops the rings, the connections go.
    backend.stop_vring(u32::from(RX_QUEUE)).unwrap();
    assert_eq!(backend.backend().connection_count(), 0);
    let mut rest = Vec::new();
    assert_eq!(
        peer.read_to_end(&mut rest).unwrap(),
        0,
        "host socket closed"
    );
}

#[test]
fn vhost_user_vsock_leaves_a_vring_alone_until_the_frontend_enables_it() {
    let dir = tempfile::tempdir().unwrap();
    let raw = default_mem();
    let mem = GuestMemoryAtomic::new(raw.clone());
    let mut backend = backend(dir.path(), &mem);
    let host = UnixListener::bind(dir.path().join("vsock.sock_5000")).unwrap();
    host.set_nonblocking(true).unwrap();
    let (mut rx, mut tx) = (
        TestQueue::new(&raw, 0, QUEUE_SIZE),
        TestQueue::new(&raw, 1, QUEUE_SIZE),
    );
    let (rx_vring, _) = vring(&mem, &rx, false);
    let (tx_vring, _) = vring(&mem, &tx, false);
    let vrings = [rx_vring, tx_vring];
    rx.add(&[Buf::W(PKT_HEADER_SIZE as u32 + 64)]);
    tx.add(&[Buf::R(&header(op::REQUEST, 1234, 5000, 0))]);
    backend
        .handle_event(TX_QUEUE, EventSet::IN, &vrings, 0)
        .unwrap();
    assert!(tx.used().is_none(), "a disabled tx ring is not read");
    assert!(host.accept().is_err(), "nothing reached the host");

    vrings[1].set_enabled(true);
    backend
        .handle_event(TX_QUEUE, EventSet::IN, &vrings, 0)
        .unwrap();
    assert!(tx.used().is_some());
    host.accept().unwrap();
    assert!(rx.used().is_none(), "the RESPONSE waits for the rx ring");
    vrings[0].set_enabled(true);
    backend
        .handle_event(RX_QUEUE, EventSet::IN, &vrings, 0)
        .unwrap();
    assert_eq!(rx.used().unwrap().1, PKT_HEADER_SIZE as u32);
}

#[test]
fn vhost_user_vsock_serve_refuses_to_replace_a_file_that_is_not_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_socket = dir.path().join("precious");
    std::fs::write(&not_a_socket, b"keep me").unwrap();
    let uds = dir.path().join("vsock.sock");
    let err = serve(&not_a_socket, CID, &uds, MuxerConfig::new(16), || {
        panic!("must not listen")
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            VhostUserVsockError::Listen(ListenError::NotASocket { .. })
        ),
        "{err}"
    );
    assert_eq!(std::fs::read(&not_a_socket).unwrap(), b"keep me");
    assert!(!uds.exists(), "refused before binding the host socket");
}

/// The vhost-user socket is claimed before the hybrid socket: when the hybrid socket's path is
/// refused, the claimed socket goes away again and the refused file stays.
#[test]
fn vhost_user_vsock_serve_removes_its_socket_when_the_host_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vhost.sock");
    let not_a_socket = dir.path().join("precious");
    std::fs::write(&not_a_socket, b"keep me").unwrap();
    let err = serve(&socket, CID, &not_a_socket, MuxerConfig::new(16), || {
        panic!("must not listen")
    })
    .unwrap_err();
    assert!(matches!(err, VhostUserVsockError::Muxer(_)), "{err}");
    assert_eq!(std::fs::read(&not_a_socket).unwrap(), b"keep me");
    assert!(
        !socket.exists(),
        "the claimed vhost-user socket is removed again"
    );
}

#[test]
fn vhost_user_vsock_serves_a_frontend_and_host_clients_then_ends_on_hang_up() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vhost.sock");
    let uds = dir.path().join("vsock.sock");
    let (listening_tx, listening_rx) = mpsc::channel();
    let server = {
        let (socket, uds) = (socket.clone(), uds.clone());
        std::thread::spawn(move || {
            serve(&socket, CID, &uds, MuxerConfig::new(16), move || {
                listening_tx.send(()).unwrap()
            })
        })
    };
    listening_rx.recv().unwrap();

    let mut frontend = Frontend::connect(&socket, 1).unwrap();
    frontend.set_owner().unwrap();
    let features = frontend.get_features().unwrap();
    assert_ne!(features & (1 << VIRTIO_F_VERSION_1), 0);
    frontend.set_features(features).unwrap();
    let protocol = frontend.get_protocol_features().unwrap();
    assert!(protocol.contains(VhostUserProtocolFeatures::CONFIG));
    frontend.set_protocol_features(protocol).unwrap();
    let (_, config) = frontend
        .get_config(0, 8, VhostUserConfigFlags::WRITABLE, &[0u8; 8])
        .unwrap();
    assert_eq!(config, CID.to_le_bytes());
    frontend.set_vring_num(0, 128).unwrap();

    // The muxer runs on the vring worker before any guest memory exists: a malformed CONNECT
    // line is refused at once (EOF), not left waiting for a guest.
    let mut client = UnixStream::connect(&uds).unwrap();
    client
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    client.write_all(b"HELLO\n").unwrap();
    let mut answer = Vec::new();
    // Closed with part of the line unread, the socket may report a reset rather than EOF.
    match client.read_to_end(&mut answer) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the malformed CONNECT got {other:?}, {answer:?}"),
    }

    drop(frontend);
    server.join().unwrap().unwrap();
    assert!(
        !socket.exists(),
        "the vhost-user socket is removed at the end"
    );
    assert!(!uds.exists(), "the host socket is removed at the end");
}
