//! virtio-vsock with Firecracker's hybrid backend: the host side of every guest connection is a
//! Unix stream socket.
//!
//! - Host-initiated: a client connects to the device's Unix socket and writes
//!   `CONNECT <port>\n`; once the guest accepts, the device answers `OK <host_port>\n` and the
//!   socket carries the stream. If nothing listens in the guest (it answers RST), or the guest
//!   does not answer within the handshake timeout, the socket is closed: a client always sees
//!   `OK` or EOF, never a hang.
//! - Guest-initiated: a guest connection to CID 2 port `P` is connected to `<uds_path>_P`.
//!
//! Flow control is virtio-vsock's credit scheme both ways: the device never buffers more than
//! the credit it advertised ([`connection::TX_BUF_SIZE`] per connection), and reads a host socket
//! only when the guest has credit for it. Protocol violations get an RST; so do connections whose
//! deadline passes (the kill queue).
//!
//! Layers, each its own file: [`queues`] moves packets between descriptor chains and a
//! [`backend::VsockBackend`]; [`device::Vsock`] is that plus the virtio device model;
//! [`muxer::Muxer`] is the Unix-socket backend (listener, handshakes via [`handshake`],
//! deadlines via [`killq`], the socket file via [`socket_file`]); [`connection::Connection`]
//! is one connection's state machine.

pub mod backend;
pub mod connection;
pub mod device;
pub mod handshake;
pub mod killq;
pub mod muxer;
pub mod queues;
pub mod socket_file;
#[cfg(test)]
mod tests;

pub use backend::{VsockBackend, VsockChannel};
pub use device::Vsock;
pub use muxer::{Muxer, MuxerConfig};

/// The host's CID.
pub const HOST_CID: u64 = 2;

/// Packet operations (virtio spec 5.10.6).
pub mod op {
    #![allow(missing_docs)]
    pub const REQUEST: u16 = 1;
    pub const RESPONSE: u16 = 2;
    pub const RST: u16 = 3;
    pub const SHUTDOWN: u16 = 4;
    pub const RW: u16 = 5;
    pub const CREDIT_UPDATE: u16 = 6;
    pub const CREDIT_REQUEST: u16 = 7;
}

/// `VIRTIO_VSOCK_TYPE_STREAM`.
pub const TYPE_STREAM: u16 = 1;
/// `SHUTDOWN` flag: the peer will receive no more.
pub const SHUTDOWN_RCV: u32 = 1;
/// `SHUTDOWN` flag: the peer will send no more.
pub const SHUTDOWN_SEND: u32 = 2;
