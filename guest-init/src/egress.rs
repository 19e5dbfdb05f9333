//! The sandbox's end of egress: a proxy address on the sandbox's own loopback whose every
//! connection goes, unread, to the daemon, which speaks HTTP proxy to it and decides what it
//! may reach. The agent parses nothing and decides nothing: a command that talks to the uplink
//! directly gets exactly what it would get through here.
//!
//! In a namespace sandbox the accepted socket itself is handed to the daemon over a Unix
//! socket with `SCM_RIGHTS`, so its bytes never pass through the agent. In a microVM each
//! connection is relayed over a vsock connection to the host.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
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

/// Listens on the proxy address and serves it from a thread of its own. Called before any
/// command runs, so no command can take the address first.
pub fn start(uplink: Uplink) -> Result<(), EgressError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, contract::egress::PROXY_PORT));
    let listener =
        TcpListener::bind(addr).map_err(|source| EgressError::Listen { addr, source })?;
    std::thread::Builder::new()
        .name("egress".into())
        .spawn(move || serve(listener, uplink))
        .map_err(EgressError::Thread)?;
    Ok(())
}

fn serve(listener: TcpListener, uplink: Uplink) {
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
        match &uplink {
            Uplink::Descriptors(daemon) => {
                if let Err(e) = namespace::send_stream(daemon.as_fd(), &OwnedFd::from(client)) {
                    // The daemon is gone: nothing can be proxied any more.
                    log::info(format_args!(
                        "egress: handing a connection to the daemon: {e}"
                    ));
                    return;
                }
            }
            Uplink::Vsock(port) => {
                let port = *port;
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
    let host =
        match crate::server::vsock_connect(libc::VMADDR_CID_HOST, port, Duration::from_secs(5)) {
            Ok(host) => host,
            Err(e) => {
                log::info(format_args!(
                    "egress: connecting to the host's port {port}: {e}"
                ));
                return;
            }
        };
    let (Ok(client_reader), Ok(host_writer)) = (client.try_clone(), host.try_clone()) else {
        return;
    };
    let upstream = std::thread::Builder::new()
        .name("egress-up".into())
        .spawn(move || pump(client_reader, host_writer));
    pump_down(host, client);
    if let Ok(upstream) = upstream {
        let _ = upstream.join();
    }
}

fn pump(mut from: TcpStream, mut to: UnixStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
}

fn pump_down(mut from: UnixStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
}
