//! Servers the end-to-end tests start on the host's 127.0.0.1 for sandboxes to reach through
//! their egress proxy (never any other address), and what they serve; and a network namespace
//! linked to the host, as CNI makes a pod's.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::Command;
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

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A named network namespace joined to the host by a veth pair (host side `.1`, namespace
/// side `.2` of a /30), removed when dropped.
#[derive(Debug)]
pub struct HostLinkedNamespace {
    /// Its name under `/run/netns`.
    pub name: String,
    host_veth: String,
    /// The host's side's address.
    pub host_ip: Ipv4Addr,
    /// The namespace's side's address.
    pub inside_ip: Ipv4Addr,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Default for HostLinkedNamespace {
    fn default() -> Self {
        Self::new()
    }
}

impl HostLinkedNamespace {
    /// Makes one (needs root and `ip`).
    pub fn new() -> Self {
        let n = (std::process::id() as usize * 7 + NEXT.fetch_add(1, Ordering::Relaxed)) % 250;
        let name = format!("crucible-t{}-{n}", std::process::id());
        let (host_veth, inside_veth) = (
            format!("cr{n}h{}", std::process::id() % 1000),
            format!("cr{n}i"),
        );
        let (host_ip, inside_ip) = (
            Ipv4Addr::new(10, 213, n as u8, 1),
            Ipv4Addr::new(10, 213, n as u8, 2),
        );
        ip(&["netns", "add", &name]);
        let made = HostLinkedNamespace {
            name: name.clone(),
            host_veth: host_veth.clone(),
            host_ip,
            inside_ip,
        };
        ip(&[
            "link",
            "add",
            &host_veth,
            "type",
            "veth",
            "peer",
            "name",
            &inside_veth,
        ]);
        ip(&["link", "set", &inside_veth, "netns", &name]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_veth]);
        ip(&["link", "set", &host_veth, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", name.as_str(), "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&[
            "addr",
            "add",
            &format!("{inside_ip}/30"),
            "dev",
            &inside_veth,
        ]);
        inside(&["link", "set", &inside_veth, "up"]);
        inside(&["link", "set", "lo", "up"]);
        made
    }

    /// Its path, for `network_namespace`.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// The rules of the namespace's `nat` table (`iptables -S`).
    pub fn nat_rules(&self) -> String {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &self.name, "iptables", "-w", "5", "-t", "nat", "-S",
            ])
            .output()
            .expect("ip netns exec iptables");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// How long a test's `GET` may take (a microVM under QEMU TCG answers in seconds).
const HTTP_GET_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// `GET /` on `to` from inside the network namespace at `path` (as containerd's port-forward
/// dials): everything that came back, empty when the connection was closed unanswered.
pub fn http_get_in(path: &str, to: std::net::SocketAddr) -> std::io::Result<String> {
    let pod = namespace::netns::PodSockets::open(std::path::Path::new(path))
        .map_err(std::io::Error::other)?;
    let socket = socket2::Socket::from(pod.tcp_socket(false)?);
    socket.set_nonblocking(false)?;
    socket.connect_timeout(&to.into(), HTTP_GET_WITHIN)?;
    http_get_on(TcpStream::from(socket))
}

/// `GET /` on `to` from the host: everything that came back, empty when the connection was
/// closed unanswered.
pub fn http_get(to: std::net::SocketAddr) -> std::io::Result<String> {
    http_get_on(TcpStream::connect_timeout(&to, HTTP_GET_WITHIN)?)
}

fn http_get_on(mut stream: TcpStream) -> std::io::Result<String> {
    stream.set_read_timeout(Some(HTTP_GET_WITHIN))?;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: pod\r\n\r\n")?;
    let mut got = Vec::new();
    match stream.read_to_end(&mut got) {
        Ok(_) => {}
        // Closed unanswered may come as a reset.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => return Err(e),
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

impl Drop for HostLinkedNamespace {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_veth])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
