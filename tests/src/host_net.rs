//! Servers the end-to-end tests start on the host's 127.0.0.1 for sandboxes to reach through
//! their egress proxy (never any other address), and what they serve.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A server on the host's 127.0.0.1 that runs `serve` on each connection in a thread of its
/// own, counting connections.
#[derive(Debug)]
pub struct HostServer {
    /// Its port.
    pub port: u16,
    /// Connections accepted so far.
    pub connections: Arc<AtomicUsize>,
}

impl HostServer {
    /// Starts serving.
    pub fn start(serve: impl Fn(TcpStream) + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("its address").port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        let serve = Arc::new(serve);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                counted.fetch_add(1, Ordering::SeqCst);
                let serve = serve.clone();
                std::thread::spawn(move || serve(stream));
            }
        });
        HostServer { port, connections }
    }

    /// A server that reads a request head (or whatever a raw client sends up to a blank line)
    /// and writes `respond(head)`.
    pub fn responding(respond: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static) -> Self {
        Self::start(move |mut stream| {
            let head = read_head(&mut stream);
            let _ = stream.write_all(&respond(&head));
        })
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Reads up to and including the first blank line (an HTTP request head), byte by byte so
/// nothing after it is consumed.
pub fn read_head(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => got.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// A `200 OK` with `body`, closing the connection.
pub fn http_response(body: &[u8]) -> Vec<u8> {
    let mut response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(body);
    response
}

/// `len` bytes no two test runs share.
pub fn random_bytes(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}
