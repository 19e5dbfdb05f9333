//! The sandbox's end of egress: a proxy address on the sandbox's own loopback whose every
//! connection goes, unread, to the daemon, which speaks HTTP proxy to it and decides what it
//! may reach. The agent parses nothing and decides nothing: a command that talks to the uplink
//! directly gets exactly what it would get through here.
//!
//! In a namespace sandbox the accepted socket itself is handed to the daemon over a Unix
//! socket with `SCM_RIGHTS`, so its bytes never pass through the agent. That socket is the
//! daemon's: when the daemon goes (a restart under live restore), connections wait, accepted
//! or in the listen backlog, until the next daemon hands the agent a new one
//! (`egress_uplink`, [`replace_uplink`]). In a microVM each connection is relayed over a
//! vsock connection to the host, which the next daemon answers as the last did.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::log;

/// Where proxied connections go.
#[derive(Debug)]
pub enum Uplink {
    /// A Unix socket to the daemon that takes each connection as a descriptor.
    Descriptors(OwnedFd),
    /// The host's vsock port, one connection per proxied connection.
    Vsock(u32),
}

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The proxy address is taken or cannot be bound.
    #[error("listen on {addr} for the egress proxy")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The serving thread could not start.
    #[error("start the egress proxy thread")]
    Thread(#[source] io::Error),
}

/// A namespace sandbox's uplink to the daemon, when its proxy hands descriptors over: `None`
/// between a daemon's end and the next one's hand-over.
static DESCRIPTOR_UPLINK: Mutex<Option<Option<OwnedFd>>> = Mutex::new(None);
/// Wakes the proxy thread waiting for an uplink.
static UPLINK_REPLACED: Condvar = Condvar::new();

/// Why a new uplink was refused.
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// This agent's proxy hands no descriptors over (no egress, or a microVM's).
    #[error("this sandbox has no egress proxy that hands connections to the daemon")]
    NoProxy,
}

/// Makes `uplink` (a connected Unix stream socket to the daemon) the one the proxy hands its
/// connections over from now on; connections waiting for an uplink go to it.
pub fn replace_uplink(uplink: OwnedFd) -> Result<(), UplinkError> {
    let mut slot = DESCRIPTOR_UPLINK.lock().unwrap_or_else(|p| p.into_inner());
    let Some(current) = slot.as_mut() else {
        return Err(UplinkError::NoProxy);
    };
    *current = Some(uplink);
    UPLINK_REPLACED.notify_all();
    Ok(())
}

/// How long a connection waits for a daemon's uplink (a restart takes a second or two); past
/// it the connection is closed, as it was refused before the daemon could come back.
const UPLINK_WAIT: Duration = Duration::from_secs(30);

/// Hands `client` to the daemon over the current uplink, waiting for one while there is none
/// (a daemon gone), for up to [`UPLINK_WAIT`]; a send that fails means the daemon is gone, and
/// `client` waits for the next one rather than being dropped at once.
fn hand_over(client: &OwnedFd) {
    let deadline = std::time::Instant::now() + UPLINK_WAIT;
    let mut slot = DESCRIPTOR_UPLINK.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        match slot.as_mut() {
            Some(Some(daemon)) => match namespace::send_stream(daemon.as_fd(), client) {
                Ok(()) => return,
                Err(e) => {
                    log::info(format_args!(
                        "egress: handing a connection to the daemon: {e}; waiting for its \
                         next uplink"
                    ));
                    *slot = Some(None);
                }
            },
            _ => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    log::info(format_args!(
                        "egress: no daemon took the connection within {UPLINK_WAIT:?}; closing it"
                    ));
                    return;
                }
                slot = UPLINK_REPLACED
                    .wait_timeout(slot, left)
                    .map(|(slot, _)| slot)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        }
    }
}

/// Listens on the proxy address and serves it from a thread of its own. Called before any
/// command runs, so no command can take the address first.
pub fn start(uplink: Uplink) -> Result<(), EgressError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, contract::egress::PROXY_PORT));
    let listener =
        TcpListener::bind(addr).map_err(|source| EgressError::Listen { addr, source })?;
    let port = match uplink {
        Uplink::Descriptors(daemon) => {
            *DESCRIPTOR_UPLINK.lock().unwrap_or_else(|p| p.into_inner()) = Some(Some(daemon));
            None
        }
        Uplink::Vsock(port) => Some(port),
    };
    std::thread::Builder::new()
        .name("egress".into())
        .spawn(move || serve(listener, port))
        .map_err(EgressError::Thread)?;
    Ok(())
}

/// Serves the proxy: each connection to the daemon's host `port` over vsock, or without one
/// over the descriptor uplink.
fn serve(listener: TcpListener, port: Option<u32>) {
    loop {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors, say: back off rather than spin, and keep serving.
                log::info(format_args!("egress: accept: {e}"));
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        match port {
            None => hand_over(&OwnedFd::from(client)),
            Some(port) => {
                let spawned = std::thread::Builder::new()
                    .name("egress-relay".into())
                    .spawn(move || relay_over_vsock(client, port));
                if let Err(e) = spawned {
                    log::info(format_args!("egress: starting a relay: {e}"));
                }
            }
        }
    }
}

/// Relays one connection over its own vsock connection to the host, both ways, passing each
/// side's end of stream on as a half-close.
fn relay_over_vsock(client: TcpStream, port: u32) {
    let host = match crate::vsock::connect(libc::VMADDR_CID_HOST, port, Duration::from_secs(5)) {
        Ok(host) => host,
        Err(e) => {
            log::info(format_args!(
                "egress: connecting to the host's port {port}: {e}"
            ));
            return;
        }
    };
    crate::relay::both_ways(client, host, "egress");
}
