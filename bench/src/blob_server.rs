//! The egress benchmark's target: a server on the host's 127.0.0.1 (never any other address)
//! answering each connection, on a thread of its own, with one whole response written as fast
//! as the socket takes it, so that it is never what a download waits for:
//!
//! - `GET /blob`: HTTP 200 with the blob (`Content-Length`, `Connection: close`);
//! - `GET /one`: HTTP 200 with one byte;
//! - anything else that ends its head with a blank line (a raw client's hello, as sent through
//!   a `CONNECT` tunnel): the blob's bytes, no HTTP at all.
//!
//! It counts the responses it wrote whole and their body bytes, so the benchmark can require
//! that every timed request was served in full.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};

/// The blob is this pattern written over and over.
const CHUNK: usize = 1 << 20;
/// The largest request head read.
const HEAD_LIMIT: usize = 16 * 1024;
/// How long a client has to send its head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// What the server has answered in full so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Served {
    /// Responses written whole.
    pub responses: u64,
    /// Their body bytes (HTTP headers not counted).
    pub body_bytes: u64,
}

impl Served {
    /// What was served between `earlier` and `self`.
    pub(crate) fn since(self, earlier: Served) -> Served {
        Served {
            responses: self.responses.saturating_sub(earlier.responses),
            body_bytes: self.body_bytes.saturating_sub(earlier.body_bytes),
        }
    }
}

/// The totals, and a signal for whoever waits on them.
#[derive(Debug, Default)]
struct Counters {
    served: Mutex<Served>,
    changed: Condvar,
}

impl Counters {
    fn add(&self, body_bytes: u64) {
        if let Ok(mut served) = self.served.lock() {
            served.responses += 1;
            served.body_bytes += body_bytes;
            self.changed.notify_all();
        }
    }
}

/// The running server; dropping it stops accepting.
#[derive(Debug)]
pub(crate) struct BlobServer {
    addr: SocketAddr,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl BlobServer {
    /// Listens on an ephemeral port of 127.0.0.1, serving a blob of `blob_bytes`.
    pub(crate) fn start(blob_bytes: u64) -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .context("binding the blob server to 127.0.0.1:0")?;
        let addr = listener.local_addr().context("the blob server's address")?;
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let chunk: Arc<[u8]> = pattern(CHUNK).into();
        let acceptor = {
            let (counters, stop) = (counters.clone(), stop.clone());
            std::thread::Builder::new()
                .name("bench-blob-server".into())
                .spawn(move || accept_loop(listener, blob_bytes, chunk, counters, stop))
                .context("starting the blob server's thread")?
        };
        Ok(BlobServer {
            addr,
            counters,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// Its port on 127.0.0.1.
    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }

    /// What it has answered in full so far.
    pub(crate) fn served(&self) -> Result<Served> {
        self.counters
            .served
            .lock()
            .map(|s| *s)
            .map_err(|_| anyhow!("the blob server's counters are poisoned"))
    }

    /// Waits until it has answered `responses` in all (a client can finish reading before the
    /// server's thread has counted its last write), or `timeout` passes; returns the totals.
    pub(crate) fn wait_for(&self, responses: u64, timeout: Duration) -> Result<Served> {
        let deadline = Instant::now() + timeout;
        let mut served = self
            .counters
            .served
            .lock()
            .map_err(|_| anyhow!("the blob server's counters are poisoned"))?;
        while served.responses < responses {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            served = self
                .counters
                .changed
                .wait_timeout(served, left)
                .map_err(|_| anyhow!("the blob server's counters are poisoned"))?
                .0;
        }
        Ok(*served)
    }
}

impl Drop for BlobServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept so the thread sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// Bytes that are not all one value (xorshift), so nothing on the way can shortcut them.
fn pattern(len: usize) -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn accept_loop(
    listener: TcpListener,
    blob_bytes: u64,
    chunk: Arc<[u8]>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let (chunk, counters) = (chunk.clone(), counters.clone());
        // A connection the server cannot give a thread goes unanswered, and the benchmark
        // fails on the missing response.
        let _ = std::thread::Builder::new()
            .name("bench-blob-conn".into())
            .spawn(move || {
                if let Ok(body_bytes) = serve_one(stream, blob_bytes, &chunk) {
                    counters.add(body_bytes);
                }
            });
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Blob,
    One,
    NotFound,
    Raw,
}

fn route(head: &[u8]) -> Route {
    if head.starts_with(b"GET /blob ") {
        Route::Blob
    } else if head.starts_with(b"GET /one ") {
        Route::One
    } else if head.starts_with(b"GET ") {
        Route::NotFound
    } else {
        Route::Raw
    }
}

fn http_head(status: &str, content_length: u64) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\nContent-Length: \
         {content_length}\r\nConnection: close\r\n\r\n"
    )
}

/// Reads the head, writes the whole response; returns the body bytes written.
fn serve_one(mut stream: TcpStream, blob_bytes: u64, chunk: &[u8]) -> std::io::Result<u64> {
    stream.set_read_timeout(Some(HEAD_TIMEOUT))?;
    stream.set_nodelay(true)?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > HEAD_LIMIT {
            return Err(std::io::Error::other("request head too large"));
        }
        match stream.read(&mut buf)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => head.extend_from_slice(&buf[..n]),
        }
    }
    let body = match route(&head) {
        Route::One => {
            let mut response = http_head("200 OK", 1).into_bytes();
            response.push(b'x');
            stream.write_all(&response)?;
            return Ok(1);
        }
        Route::NotFound => {
            stream.write_all(http_head("404 Not Found", 0).as_bytes())?;
            return Err(std::io::Error::other("a request for an unknown path"));
        }
        Route::Blob => {
            stream.write_all(http_head("200 OK", blob_bytes).as_bytes())?;
            blob_bytes
        }
        Route::Raw => blob_bytes,
    };
    let mut left = body;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        stream.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetch(port: u16, request: &[u8]) -> Result<Vec<u8>> {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
        stream.write_all(request)?;
        let mut out = Vec::new();
        stream.read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn serves_the_blob_one_byte_and_raw_bytes_counting_each_whole_response() -> Result<()> {
        let blob = 3 * CHUNK as u64 + 17;
        let server = BlobServer::start(blob)?;
        let before = server.served()?;

        let out = fetch(server.port(), b"GET /blob HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let head = http_head("200 OK", blob);
        assert!(out.starts_with(head.as_bytes()));
        let body = &out[head.len()..];
        assert_eq!(body.len() as u64, blob);
        assert_eq!(&body[CHUNK..CHUNK + 64], &pattern(64)[..]);

        let out = fetch(server.port(), b"GET /one HTTP/1.1\r\n\r\n")?;
        assert_eq!(out, [http_head("200 OK", 1).as_bytes(), b"x"].concat());

        let out = fetch(server.port(), b"hello\r\n\r\n")?;
        assert_eq!(out.len() as u64, blob);

        let out = fetch(server.port(), b"GET /nothing HTTP/1.1\r\n\r\n")?;
        assert!(out.starts_with(b"HTTP/1.1 404 "));

        let served = server.wait_for(before.responses + 3, Duration::from_secs(5))?;
        assert_eq!(
            served.since(before),
            Served {
                responses: 3,
                body_bytes: 2 * blob + 1
            }
        );
        Ok(())
    }

    #[test]
    fn requests_are_routed_by_their_first_line() {
        assert_eq!(route(b"GET /blob HTTP/1.1\r\n\r\n"), Route::Blob);
        assert_eq!(route(b"GET /one HTTP/1.1\r\n\r\n"), Route::One);
        assert_eq!(route(b"GET /blobs HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"hello\r\n\r\n"), Route::Raw);
    }
}
