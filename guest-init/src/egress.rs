//! The sandbox's end of egress: a proxy address on the sandbox's own loopback whose every
//! connection goes, unread, to the daemon, which speaks HTTP proxy to it and decides what it
//! may reach. The agent parses nothing and decides nothing: a command that talks to the uplink
//! directly gets exactly what it would get through here.
//!
//! In a namespace sandbox the proxy's listening socket itself is handed to the daemon, once,
//! over a Unix socket with `SCM_RIGHTS`: the daemon accepts each connection on it, so no
//! connection passes through the agent at all (neither its bytes nor its descriptor). The
//! agent keeps its own copy of the listening socket and the uplink open: the daemon serves the
//! proxy for as long as the uplink stays open (until the sandbox ends). When the daemon goes
//! (a restart under live restore), connections wait in the listen backlog until the next
//! daemon gets the listening socket over a new uplink (`egress_uplink`, [`replace_uplink`]).
//! In a microVM each connection is relayed over a vsock connection to the host, which the next
//! daemon answers as the last did.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

use crate::log;

/// Where proxied connections go.
#[derive(Debug)]
pub enum Uplink {
    /// A Unix socket to the daemon, which is handed the proxy's listening socket and accepts
    /// its connections itself.
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
    /// The listening socket could not be handed to the daemon.
    #[error("hand the egress proxy's listening socket to the daemon")]
    HandOver(#[source] io::Error),
}

/// A namespace sandbox's proxy: its listening socket (for the next daemon's uplink) and the
/// uplink in use (held open: the daemon serves the proxy while it is).
struct HandedOver {
    listener: OwnedFd,
    _uplink: OwnedFd,
}

/// The proxy whose listening socket the daemon accepts on; `None` without one (no egress, or
/// a microVM's).
static HANDED_OVER: Mutex<Option<HandedOver>> = Mutex::new(None);

/// Why a new uplink was refused.
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// This agent's proxy hands no descriptors over (no egress, or a microVM's).
    #[error("this sandbox has no egress proxy that hands connections to the daemon")]
    NoProxy,
    /// The listening socket could not be sent over the new uplink.
    #[error("sending the proxy's listening socket")]
    Send(#[source] io::Error),
}

/// Hands the proxy's listening socket to the daemon at the other end of `uplink` (a connected
/// Unix stream socket), which accepts its connections from now on; connections waiting in the
/// backlog since the last daemon went are its first.
pub fn replace_uplink(uplink: OwnedFd) -> Result<(), UplinkError> {
    let mut slot = HANDED_OVER.lock().unwrap_or_else(|p| p.into_inner());
    let Some(proxy) = slot.as_mut() else {
        return Err(UplinkError::NoProxy);
    };
    namespace::send_stream(uplink.as_fd(), &proxy.listener).map_err(UplinkError::Send)?;
    proxy._uplink = uplink;
    Ok(())
}

/// Listens on the proxy address and serves it: in a microVM from a thread of its own, in a
/// namespace sandbox by handing the listening socket to the daemon. Called before any command
/// runs, so no command can take the address first.
pub fn start(uplink: Uplink) -> Result<(), EgressError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, contract::egress::PROXY_PORT));
    let listener =
        TcpListener::bind(addr).map_err(|source| EgressError::Listen { addr, source })?;
    match uplink {
        Uplink::Descriptors(daemon) => {
            let listener = OwnedFd::from(listener);
            namespace::send_stream(daemon.as_fd(), &listener).map_err(EgressError::HandOver)?;
            *HANDED_OVER.lock().unwrap_or_else(|p| p.into_inner()) = Some(HandedOver {
                listener,
                _uplink: daemon,
            });
            Ok(())
        }
        Uplink::Vsock(port) => {
            std::thread::Builder::new()
                .name("egress".into())
                .spawn(move || serve(listener, port))
                .map_err(EgressError::Thread)?;
            Ok(())
        }
    }
}

/// Serves the proxy in a microVM: each connection relayed over a vsock connection of its own
/// to the daemon's host `port`.
fn serve(listener: TcpListener, port: u32) {
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
        let spawned = std::thread::Builder::new()
            .name("egress-relay".into())
            .spawn(move || relay_over_vsock(client, port));
        if let Err(e) = spawned {
            log::info(format_args!("egress: starting a relay: {e}"));
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
