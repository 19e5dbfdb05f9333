//! vsock: the ports the agent and the host meet on, and how guest-initiated connections are
//! named on the host side of crucible's hybrid vsock device (Firecracker's design).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The vsock port the agent serves requests on (kernel command line `crucible.port=`).
pub const DEFAULT_AGENT_PORT: u32 = 1024;

/// The host vsock port the agent connects to when ready (`crucible.ready_port=`).
pub const DEFAULT_READY_PORT: u32 = 1025;

/// The vsock port the agent of a microVM sandbox's container `index` serves on: one of its
/// own, since each container's agent is PID 1 of its own namespaces.
pub fn container_agent_port(index: usize) -> u32 {
    CONTAINER_AGENT_PORT_BASE.saturating_add(u32::try_from(index).unwrap_or(u32::MAX))
}

/// The port of container 0's agent ([`container_agent_port`]).
pub const CONTAINER_AGENT_PORT_BASE: u32 = 2048;

/// How long the vsock device waits for each handshake step by default: a host client's
/// `CONNECT <port>\n` line and the guest's answer to it (together, counted from the client's
/// connect), and the guest's RST after the device's SHUTDOWN. Past it the host socket is closed
/// and the guest gets RST.
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 2_000;

/// How long a vsock connection may have work pending with no progress in either direction
/// before the device resets it, by default. Long, because a stalled peer is usually
/// backpressure from a slow reader (which the design keeps end to end), not a dead one.
pub const DEFAULT_STALL_TIMEOUT_MS: u64 = 60_000;

/// Where a guest connection to host port `port` arrives: the Unix socket `<uds_path>_<port>`,
/// next to the device's own socket `uds_path`. The VMM connects there; the daemon listens
/// there (for the agent's hello on [`DEFAULT_READY_PORT`]) before the VM starts.
pub fn host_port_path(uds_path: &Path, port: u32) -> PathBuf {
    let mut path = OsString::from(uds_path.as_os_str());
    path.push(format!("_{port}"));
    PathBuf::from(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_connections_go_to_the_device_socket_with_a_port_suffix() {
        assert_eq!(
            host_port_path(
                Path::new("/run/crucible/sb-1/vsock.sock"),
                DEFAULT_READY_PORT
            ),
            Path::new("/run/crucible/sb-1/vsock.sock_1025")
        );
    }
}
