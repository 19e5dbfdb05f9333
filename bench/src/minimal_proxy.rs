//! The least an HTTP proxy that ends the client's TCP connection can cost: one thread that
//! accepts, reads the head, connects to the target, forwards the head in origin form and copies
//! the answer back, one connection after the other, with blocking calls. No policy, no
//! lookups, no async runtime, no hand-off between threads, no log.
//!
//! The egress section runs the same many-small-requests script on the host through it, so the
//! report shows what the extra hop alone costs beside what the egress proxy costs: a second TCP
//! connection per request (its handshake, its close, its accept) on the same two cores. It
//! forwards only to the benchmark's own server: anything else is answered 403.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

/// The largest request head read.
const HEAD_LIMIT: usize = 16 * 1024;
/// How long either side may keep the proxy waiting.
const IDLE: Duration = Duration::from_secs(10);

/// The running proxy; stopped when dropped.
pub(crate) struct MinimalProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MinimalProxy {
    /// Listens on the host's 127.0.0.1, forwarding to `target` only.
    pub(crate) fn start(target: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .context("binding the minimal proxy on 127.0.0.1")?;
        let addr = listener
            .local_addr()
            .context("the minimal proxy's address")?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bench-min-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if stopping.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Ok(client) = client {
                        // A failed exchange fails its script, which says so.
                        let _ = forward(client, target);
                    }
                }
            })
            .context("starting the minimal proxy's thread")?;
        Ok(MinimalProxy {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// `http_proxy` for a client on this host.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for MinimalProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept so the thread sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One proxied exchange: the head, rewritten to origin form, to `target`; the answer back.
fn forward(mut client: TcpStream, target: SocketAddr) -> io::Result<()> {
    client.set_nodelay(true)?;
    client.set_read_timeout(Some(IDLE))?;
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if head.len() > HEAD_LIMIT {
            return Err(io::Error::other("request head too large"));
        }
        let n = client.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
    };
    let Some(origin_form) = origin_form(&head[..end], target) else {
        client.write_all(
            b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )?;
        return Ok(());
    };
    let mut remote = TcpStream::connect(target)?;
    remote.set_nodelay(true)?;
    remote.set_read_timeout(Some(IDLE))?;
    remote.write_all(&origin_form)?;
    remote.write_all(&head[end..])?;
    loop {
        let n = remote.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        client.write_all(&chunk[..n])?;
    }
    client.shutdown(Shutdown::Write)?;
    // Until the client closes too, as a relay waits for both directions.
    while client.read(&mut chunk)? > 0 {}
    Ok(())
}

/// `METHOD http://TARGET/path VERSION` as `METHOD /path VERSION`, the rest of the head as it
/// came; `None` for any other target.
fn origin_form(head: &[u8], target: SocketAddr) -> Option<Vec<u8>> {
    let line_end = head.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&head[..line_end]).ok()?;
    let mut parts = line.split(' ');
    let (method, uri, version) = (parts.next()?, parts.next()?, parts.next()?);
    let rest = uri.strip_prefix("http://")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority != target.to_string() {
        return None;
    }
    let path = if path.is_empty() { "/" } else { path };
    let mut out = format!("{method} {path} {version}").into_bytes();
    out.extend_from_slice(&head[line_end..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob_server::BlobServer;

    #[test]
    fn the_absolute_target_becomes_origin_form_and_only_the_target_is_forwarded() {
        let target: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        let head = b"GET http://127.0.0.1:8080/one HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(
            origin_form(head, target).expect("forwarded"),
            b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n"
        );
        assert!(origin_form(b"GET http://10.0.0.1:8080/ HTTP/1.1\r\n\r\n", target).is_none());
        assert!(origin_form(b"GET /one HTTP/1.1\r\n\r\n", target).is_none());
    }

    #[test]
    fn a_request_through_it_reaches_the_server_and_comes_back_whole() -> Result<()> {
        let server = BlobServer::start(16)?;
        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, server.port()));
        let proxy = MinimalProxy::start(target)?;
        let mut client = TcpStream::connect(proxy.addr)?;
        write!(
            client,
            "GET http://{target}/one HTTP/1.1\r\nHost: {target}\r\n\r\n"
        )?;
        let mut answer = String::new();
        client.read_to_string(&mut answer)?;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert_eq!(server.wait_for(1, IDLE)?.responses, 1);
        drop(proxy);
        Ok(())
    }
}
