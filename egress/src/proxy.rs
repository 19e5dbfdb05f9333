//! One proxied connection from a sandbox: read the proxy request head, check the target,
//! resolve it once, check every address, connect, and relay bytes both ways.
//!
//! Plain HTTP is one request per connection: the forwarded head says `Connection: close`,
//! and everything after it is relayed raw to the same, already-checked host. Keeping the
//! connection alive would let the next request on it name another host, which the proxy
//! would then have to find and check inside a raw stream it no longer parses.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use engine::egress::PodSockets;
use futures_util::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use http1::{HeadError, HeadScanner};

use crate::policy::{Denial, EgressPolicy};
use crate::request::{parse_head, BadRequest, ProxyRequest};
use crate::rules::Host;
use engine::egress::EgressCounters;

/// The largest request head the proxy reads.
pub(crate) const HEAD_LIMIT: usize = 16 * 1024;
/// How long a sandbox has to send its request head.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long resolving, and then connecting to, a target may take (each).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Relay buffer per direction.
const RELAY_BUFFER: usize = 64 * 1024;

/// Resolves a host name to the addresses to try, in order. The daemon's is the host's
/// `getaddrinfo` behind a cache of answers; a benchmark or an embedder may give another
/// ([`crate::Proxy::with_resolver`]).
pub trait Resolve: Send + Sync + fmt::Debug {
    /// The addresses of `host`, each with `port`.
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, io::Result<Vec<SocketAddr>>>;
}

/// The host's resolver (`getaddrinfo` through `tokio::net::lookup_host`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// What one sandbox's proxied connections share.
pub(crate) struct EgressContext {
    pub(crate) sandbox_id: String,
    pub(crate) policy: Arc<EgressPolicy>,
    pub(crate) counters: Arc<EgressCounters>,
    pub(crate) resolver: Arc<dyn Resolve>,
    /// A microVM pod's network namespace: connections leave from there, and neither the
    /// policy's rules nor its address checks apply (the pod's network decides, as for any
    /// pod). `None`: the host's network, under the policy.
    pub(crate) pod: Option<Arc<PodSockets>>,
}

impl fmt::Debug for EgressContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressContext")
            .field("sandbox_id", &self.sandbox_id)
            .field("policy", &self.policy)
            .field("counters", &self.counters)
            .field("pod", &self.pod.as_ref().map(|p| p.path().to_path_buf()))
            .finish_non_exhaustive()
    }
}

/// The proxy's time limits (tests shorten them).
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    head: Duration,
    connect: Duration,
}

const DEFAULT_TIMEOUTS: Timeouts = Timeouts {
    head: HEAD_TIMEOUT,
    connect: CONNECT_TIMEOUT,
};

/// Serves one connection the sandbox's agent accepted on its proxy port, until both
/// directions are done. Every refusal is answered with an HTTP status and a plain-text reason.
pub(crate) async fn serve<S>(client: S, ctx: &EgressContext)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    serve_with(client, ctx, DEFAULT_TIMEOUTS).await;
}

async fn serve_with<S>(mut client: S, ctx: &EgressContext, timeouts: Timeouts)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let sandbox = ctx.sandbox_id.as_str();
    let (buf, head_len) = match read_head(&mut client, timeouts.head).await {
        HeadRead::Complete { buf, head_len } => (buf, head_len),
        HeadRead::Refused(e) => {
            tracing::info!(sandbox, verdict = "head too large", "egress");
            let message = format!(
                "the request head is refused: {e} ({} KiB)",
                HEAD_LIMIT / 1024
            );
            return answer(&mut client, Answer::error(e.status(), message)).await;
        }
        HeadRead::TimedOut => {
            tracing::info!(sandbox, verdict = "head timed out", "egress");
            return;
        }
        HeadRead::Closed => return,
    };
    let request = match parse_head(&buf[..head_len], HEAD_LIMIT) {
        Ok(request) => request,
        Err(BadRequest { status, message }) => {
            tracing::info!(sandbox, verdict = "bad request", %message, "egress");
            return answer(&mut client, Answer::error(status, message)).await;
        }
    };
    let (host, port) = request.target();
    let remote = match open(ctx, host, port, timeouts.connect).await {
        Ok(remote) => remote,
        Err(refusal) => {
            if refusal.denied {
                ctx.counters
                    .add_refusal(&format!("{host}:{port}"), &refusal.message);
            }
            tracing::info!(sandbox, %host, port, verdict = refusal.verdict, reason = %refusal.message, "egress");
            return answer(&mut client, refusal).await;
        }
    };
    ctx.counters.add_connection();
    let addr = remote.peer_addr().ok();
    let mut remote = Counted {
        inner: remote,
        counters: &ctx.counters,
        bytes_out: 0,
        bytes_in: 0,
    };
    let early = &buf[head_len..];
    let result = relay(&mut client, &mut remote, &request, early).await;
    let (bytes_out, bytes_in) = (remote.bytes_out, remote.bytes_in);
    match result {
        Ok(()) => tracing::info!(
            sandbox, %host, port, addr = ?addr, verdict = "allowed", bytes_out, bytes_in, "egress"
        ),
        Err(e) => tracing::info!(
            sandbox, %host, port, addr = ?addr, verdict = "allowed", bytes_out, bytes_in,
            error = %e, "egress (ended with an error)"
        ),
    }
}

/// Answers a CONNECT or forwards a plain-HTTP head, sends `early` (bytes the sandbox sent past
/// its head) on, then relays both ways until each side has closed its direction.
async fn relay<S, R>(
    client: &mut S,
    remote: &mut R,
    request: &ProxyRequest,
    early: &[u8],
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    R: AsyncRead + AsyncWrite + Unpin + Send,
{
    match request {
        ProxyRequest::Connect { .. } => {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await?;
            client.flush().await?;
        }
        ProxyRequest::Forward { head, .. } => remote.write_all(head).await?,
    }
    remote.write_all(early).await?;
    tokio::io::copy_bidirectional_with_sizes(client, remote, RELAY_BUFFER, RELAY_BUFFER).await?;
    Ok(())
}

enum HeadRead {
    Complete {
        buf: Vec<u8>,
        head_len: usize,
    },
    /// [`HEAD_LIMIT`] bytes arrived without the head's end.
    Refused(HeadError),
    TimedOut,
    Closed,
}

async fn read_head<S: AsyncRead + Unpin>(client: &mut S, timeout: Duration) -> HeadRead {
    let deadline = Instant::now() + timeout;
    let mut buf = Vec::with_capacity(4096);
    let mut scanner = HeadScanner::new(HEAD_LIMIT);
    loop {
        match scanner.scan(&buf) {
            Ok(Some(head_len)) => return HeadRead::Complete { buf, head_len },
            Ok(None) => {}
            Err(e) => return HeadRead::Refused(e),
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(deadline, client.read(&mut chunk)).await {
            Err(_) => return HeadRead::TimedOut,
            Ok(Ok(0)) | Ok(Err(_)) => return HeadRead::Closed,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A response the proxy gives itself instead of a connection.
#[derive(Debug)]
struct Answer {
    status: u16,
    message: String,
    /// Refused by the policy (counted, and marked `X-Crucible-Egress: denied`).
    denied: bool,
    /// A word for the log.
    verdict: &'static str,
}

impl Answer {
    fn error(status: u16, message: impl fmt::Display) -> Answer {
        Answer {
            status,
            message: format!("crucible egress: {message}"),
            denied: false,
            verdict: "error",
        }
    }

    fn denied(ctx: &EgressContext, denial: &Denial) -> Answer {
        let id = &ctx.sandbox_id;
        let message = match denial {
            Denial::NotAllowed { .. } if !ctx.policy.has_network() => {
                format!("crucible egress: {denial} for sandbox {id}: this sandbox has no network")
            }
            Denial::NotAllowed { .. } => format!(
                "crucible egress: {denial} for sandbox {id}; allowed: {}",
                ctx.policy.sandbox
            ),
            Denial::Address { .. } => format!("crucible egress: {denial} (sandbox {id})"),
        };
        Answer {
            status: 403,
            message,
            denied: true,
            verdict: "denied",
        }
    }
}

async fn answer<S: AsyncWrite + Unpin>(client: &mut S, answer: Answer) {
    // A refusal's reason goes in the status line too: pip, apt and `curl -v` show a failed
    // CONNECT's status line, never its body.
    let refused;
    let reason = match answer.status {
        400 => "Bad Request",
        403 if answer.denied => {
            refused = status_line_text(&format!("Forbidden: {}", answer.message));
            refused.as_str()
        }
        403 => "Forbidden",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    };
    let marker = if answer.denied {
        "X-Crucible-Egress: denied\r\n"
    } else {
        ""
    };
    let response = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n{marker}\r\n{}\n",
        answer.status,
        answer.message.len() + 1,
        answer.message,
    );
    // The sandbox may already be gone; there is nobody else to tell.
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

/// `text` as a status line's reason phrase can carry it: visible ASCII and spaces only (the
/// host names in a reason are the sandbox's), at most [`MAX_REASON_PHRASE`] bytes.
fn status_line_text(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .take(MAX_REASON_PHRASE)
        .collect()
}

/// Longest reason phrase in a refusal's status line.
const MAX_REASON_PHRASE: usize = 300;

/// Checks `host:port`, resolves it once, checks every address, and connects to the first
/// that answers: only addresses that passed the check are ever connected to.
async fn open(
    ctx: &EgressContext,
    host: &Host,
    port: u16,
    timeout: Duration,
) -> Result<TcpStream, Answer> {
    // Before resolving: a name no rule allows is not even looked up.
    if ctx.pod.is_none() {
        ctx.policy
            .check_target(host, port)
            .map_err(|denial| Answer::denied(ctx, &denial))?;
    }
    let addrs = match host {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
        Host::Name(name) => {
            let resolved = tokio::time::timeout(timeout, ctx.resolver.resolve(name, port))
                .await
                .map_err(|_| {
                    Answer::error(504, format!("resolving {name} timed out after {timeout:?}"))
                })?
                .map_err(|e| Answer::error(502, format!("could not resolve {name}: {e}")))?;
            // The port is the request's, whatever the resolver says.
            resolved
                .into_iter()
                .map(|addr| SocketAddr::new(addr.ip(), port))
                .collect()
        }
    };
    if addrs.is_empty() {
        return Err(Answer::error(502, format!("{host} has no addresses")));
    }
    for addr in addrs.iter().filter(|_| ctx.pod.is_none()) {
        ctx.policy
            .check_address(host, *addr)
            .map_err(|denial| Answer::denied(ctx, &denial))?;
    }
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    for addr in addrs {
        match tokio::time::timeout_at(deadline, connect(ctx.pod.as_ref(), addr)).await {
            Err(_) => {
                return Err(Answer::error(
                    504,
                    format!("connecting to {host}:{port} ({addr}) timed out after {timeout:?}"),
                ))
            }
            Ok(Ok(stream)) => {
                // Relayed bytes are the sandbox's own writes: no added latency.
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last_error = Some((addr, e)),
        }
    }
    let reason = match last_error {
        Some((addr, e)) => format!("could not connect to {host}:{port} ({addr}): {e}"),
        None => format!("could not connect to {host}:{port}"),
    };
    Err(Answer::error(502, reason))
}

/// A connection to `addr`: from the host's network, or from the pod's namespace.
async fn connect(pod: Option<&Arc<PodSockets>>, addr: SocketAddr) -> io::Result<TcpStream> {
    let Some(pod) = pod else {
        return TcpStream::connect(addr).await;
    };
    let pod = pod.clone();
    let socket = tokio::task::spawn_blocking(move || pod.tcp_socket(addr.is_ipv6()))
        .await
        .map_err(|e| io::Error::other(format!("making a socket in the pod's namespace: {e}")))??;
    tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(socket))
        .connect(addr)
        .await
}

/// The remote side of a relay, counting bytes into the sandbox's counters as they pass.
struct Counted<'a, S> {
    inner: S,
    counters: &'a EgressCounters,
    bytes_out: u64,
    bytes_in: u64,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let n = (buf.filled().len() - before) as u64;
        this.bytes_in += n;
        this.counters.add_bytes_in(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.bytes_out += n as u64;
        this.counters.add_bytes_out(n as u64);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Mutex;

    use tokio::io::DuplexStream;
    use tokio::net::TcpListener;
    use tokio::sync::oneshot;

    use super::*;
    use crate::rules::Allowlist;
    use engine::egress::EgressStats;

    /// A resolver with a fixed table that records every name it was asked for.
    #[derive(Debug, Default)]
    struct FakeResolver {
        table: HashMap<String, Vec<IpAddr>>,
        asked: Mutex<Vec<String>>,
    }

    impl FakeResolver {
        fn asked(&self) -> Vec<String> {
            self.asked.lock().expect("resolver log").clone()
        }
    }

    impl Resolve for FakeResolver {
        fn resolve<'a>(
            &'a self,
            host: &'a str,
            port: u16,
        ) -> BoxFuture<'a, io::Result<Vec<SocketAddr>>> {
            self.asked
                .lock()
                .expect("resolver log")
                .push(host.to_string());
            let found = self.table.get(host).cloned();
            Box::pin(async move {
                let ips = found.ok_or_else(|| {
                    io::Error::new(io::ErrorKind::NotFound, format!("no such host {host}"))
                })?;
                Ok(ips
                    .into_iter()
                    .map(|ip| SocketAddr::new(ip, port))
                    .collect())
            })
        }
    }

    const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    struct Setup {
        ctx: EgressContext,
        resolver: Arc<FakeResolver>,
    }

    fn setup(requested: &[&str], operator: &str, names: &[(&str, &[IpAddr])]) -> Setup {
        let operator: Allowlist = operator.parse().expect("operator rules");
        let requested: Vec<String> = requested.iter().map(|r| r.to_string()).collect();
        let policy = EgressPolicy::new(&requested, &operator).expect("policy");
        let resolver = Arc::new(FakeResolver {
            table: names
                .iter()
                .map(|(name, ips)| (name.to_string(), ips.to_vec()))
                .collect(),
            ..FakeResolver::default()
        });
        let ctx = EgressContext {
            sandbox_id: "sb-test".to_string(),
            policy: Arc::new(policy),
            counters: Arc::default(),
            resolver: resolver.clone(),
            pod: None,
        };
        Setup { ctx, resolver }
    }

    /// Deterministic bytes no relay bug (a dropped, repeated or reordered chunk) survives.
    fn payload(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    fn pair() -> (DuplexStream, DuplexStream) {
        tokio::io::duplex(64 * 1024)
    }

    /// Sends `request` as the sandbox, closes the sandbox's write side, and returns all it
    /// got back, with the proxy serving the other end.
    async fn exchange(ctx: &EgressContext, request: &[u8]) -> String {
        exchange_with(ctx, request, DEFAULT_TIMEOUTS).await
    }

    async fn exchange_with(ctx: &EgressContext, request: &[u8], timeouts: Timeouts) -> String {
        let (mut sandbox, proxy_end) = pair();
        let client = async {
            // The proxy may stop reading early (a head too large): a failed write is fine.
            let _ = sandbox.write_all(request).await;
            let mut response = Vec::new();
            sandbox
                .read_to_end(&mut response)
                .await
                .expect("read the answer");
            String::from_utf8(response).expect("a text answer")
        };
        let ((), response) = tokio::join!(serve_with(proxy_end, ctx, timeouts), client);
        response
    }

    fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
        let head = response.split("\r\n\r\n").next()?;
        head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn body(response: &str) -> &str {
        response.split_once("\r\n\r\n").map_or("", |(_, body)| body)
    }

    /// A one-request HTTP server on 127.0.0.1: reports the head it got, answers `body`.
    async fn http_server(body: Vec<u8>) -> (u16, oneshot::Receiver<Vec<u8>>) {
        let listener = TcpListener::bind((LOCALHOST, 0)).await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let (head_tx, head_rx) = oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                stream.read_exact(&mut byte).await.expect("read the head");
                head.push(byte[0]);
            }
            let _ = head_tx.send(head);
            let response_head =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
            stream
                .write_all(response_head.as_bytes())
                .await
                .expect("write the head");
            stream.write_all(&body).await.expect("write the body");
            stream.shutdown().await.expect("close");
        });
        (port, head_rx)
    }

    #[tokio::test]
    async fn plain_http_is_forwarded_in_origin_form_and_downloads_byte_for_byte() {
        let download = payload(3 * 1024 * 1024 + 7, 1);
        let (port, head_rx) = http_server(download.clone()).await;
        let Setup { ctx, .. } = setup(
            &["mirror.test"],
            &format!("mirror.test, 127.0.0.1:{port}"),
            &[("mirror.test", &[LOCALHOST])],
        );
        let request = format!(
            "GET http://mirror.test:{port}/crates/x.crate?v=1 HTTP/1.1\r\nHost: elsewhere.test\r\n\
             Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eDp5\r\n\
             Accept: */*\r\n\r\n"
        );
        let (mut sandbox, proxy_end) = pair();
        // An HTTP client: it sends no half-close, and closes when the response has ended.
        let client = async move {
            sandbox.write_all(request.as_bytes()).await.expect("send");
            let mut response = Vec::new();
            sandbox.read_to_end(&mut response).await.expect("receive");
            response
        };
        let ((), response) = tokio::join!(serve(proxy_end, &ctx), client);
        let forwarded = head_rx.await.expect("the server got a head");
        assert_eq!(
            String::from_utf8_lossy(&forwarded),
            format!(
                "GET /crates/x.crate?v=1 HTTP/1.1\r\nHost: mirror.test:{port}\r\nAccept: */*\r\n\
                 Connection: close\r\n\r\n"
            )
        );
        let expected_head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            download.len()
        );
        assert_eq!(
            String::from_utf8_lossy(&response[..expected_head.len()]),
            expected_head
        );
        assert!(
            response[expected_head.len()..] == download[..],
            "the body differs"
        );
        assert_eq!(
            ctx.counters.snapshot(),
            EgressStats {
                connections: 1,
                denied: 0,
                bytes_out: forwarded.len() as u64,
                bytes_in: response.len() as u64,
            }
        );
    }

    #[tokio::test]
    async fn connect_tunnels_megabytes_both_ways_across_a_half_close_counting_as_it_goes() {
        let upload = payload(2 * 1024 * 1024 + 3, 2);
        let download = payload(4 * 1024 * 1024 + 5, 3);
        let listener = TcpListener::bind((LOCALHOST, 0)).await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let (uploaded_tx, uploaded_rx) = oneshot::channel();
        let (close_tx, close_rx) = oneshot::channel::<()>();
        let server_download = download.clone();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            // Reading to the end needs the sandbox's half-close passed on; answering after it
            // needs the other direction still open.
            let mut uploaded = Vec::new();
            stream
                .read_to_end(&mut uploaded)
                .await
                .expect("read the upload");
            let _ = uploaded_tx.send(uploaded);
            stream
                .write_all(&server_download)
                .await
                .expect("send the download");
            let _ = close_rx.await;
        });
        let Setup { ctx, .. } = setup(
            &[&format!("127.0.0.1:{port}")],
            &format!("127.0.0.1:{port}"),
            &[],
        );
        let (sandbox, proxy_end) = pair();
        let (mut from_proxy, mut to_proxy) = tokio::io::split(sandbox);
        let head = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
        let early = b"sent with the head";
        let sender = async {
            let mut first = head.into_bytes();
            first.extend_from_slice(early);
            to_proxy.write_all(&first).await.expect("send the head");
            to_proxy.write_all(&upload).await.expect("upload");
            to_proxy.shutdown().await.expect("half-close");
        };
        let counters = ctx.counters.clone();
        let receiver = async {
            let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
            let mut answer = vec![0u8; established.len()];
            from_proxy
                .read_exact(&mut answer)
                .await
                .expect("the answer");
            assert_eq!(answer, established);
            let mut received = vec![0u8; download.len()];
            from_proxy
                .read_exact(&mut received)
                .await
                .expect("the download");
            assert!(received == download, "the download differs");
            // Still open: the counters show what has passed so far.
            let live = counters.snapshot();
            assert_eq!(live.bytes_in, download.len() as u64);
            assert_eq!(live.connections, 1);
            let _ = close_tx.send(());
            let mut rest = Vec::new();
            from_proxy.read_to_end(&mut rest).await.expect("the end");
            assert!(rest.is_empty());
        };
        tokio::join!(serve(proxy_end, &ctx), sender, receiver);
        let uploaded = uploaded_rx.await.expect("the server got the upload");
        assert_eq!(&uploaded[..early.len()], early);
        assert!(uploaded[early.len()..] == upload[..], "the upload differs");
        assert_eq!(
            ctx.counters.snapshot(),
            EgressStats {
                connections: 1,
                denied: 0,
                bytes_out: (early.len() + upload.len()) as u64,
                bytes_in: download.len() as u64,
            }
        );
    }

    #[tokio::test]
    async fn a_name_no_rule_allows_gets_a_403_naming_it_and_the_rules_without_a_lookup() {
        let Setup { ctx, resolver } = setup(
            &["crates.io", "*.pypi.org"],
            "crates.io, *.pypi.org",
            &[("example.com", &[LOCALHOST])],
        );
        for request in [
            "CONNECT example.com:443 HTTP/1.1\r\n\r\n",
            "GET http://pypi.org:443/simple HTTP/1.1\r\n\r\n",
        ] {
            let response = exchange(&ctx, request.as_bytes()).await;
            // The reason is in the status line too (what pip, apt and `curl -v` show) and in
            // the body, and the sandbox's refusals list it.
            let status_line = response.lines().next().unwrap_or_default();
            assert_eq!(
                format!("{status_line}\n"),
                format!("HTTP/1.1 403 Forbidden: {}", body(&response)),
                "{response}"
            );
            assert_eq!(header(&response, "X-Crucible-Egress"), Some("denied"));
            assert_eq!(header(&response, "Connection"), Some("close"));
            assert!(header(&response, "Content-Type").is_some_and(|v| v.starts_with("text/plain")));
            assert_eq!(
                header(&response, "Content-Length"),
                Some(body(&response).len().to_string().as_str())
            );
        }
        let response = exchange(&ctx, b"CONNECT example.com:443 HTTP/1.1\r\n\r\n").await;
        assert_eq!(
            body(&response),
            "crucible egress: example.com:443 is not allowed for sandbox sb-test; allowed: \
             crates.io, *.pypi.org\n"
        );
        assert!(
            resolver.asked().is_empty(),
            "looked up {:?}",
            resolver.asked()
        );
        assert_eq!(ctx.counters.snapshot().denied, 3);
        assert_eq!(ctx.counters.snapshot().connections, 0);
    }

    #[tokio::test]
    async fn a_sandbox_without_rules_is_told_it_has_no_network() {
        let Setup { ctx, .. } = setup(&[], "*", &[]);
        let response = exchange(&ctx, b"CONNECT crates.io:443 HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 403 "), "{response}");
        assert_eq!(
            body(&response),
            "crucible egress: crates.io:443 is not allowed for sandbox sb-test: this sandbox \
             has no network\n"
        );
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_without_an_operator_address_rule() {
        let listener = std::net::TcpListener::bind((LOCALHOST, 0)).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("address").port();
        let Setup { ctx, resolver } = setup(
            &["rebound.test"],
            "*.test",
            &[("rebound.test", &[LOCALHOST])],
        );
        let request = format!("CONNECT rebound.test:{port} HTTP/1.1\r\n\r\n");
        let response = exchange(&ctx, request.as_bytes()).await;
        assert!(
            response.starts_with("HTTP/1.1 403 Forbidden: crucible egress: rebound.test:"),
            "{response}"
        );
        assert_eq!(header(&response, "X-Crucible-Egress"), Some("denied"));
        let refused = ctx.counters.refused();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].destination, format!("rebound.test:{port}"));
        assert_eq!(format!("{}\n", refused[0].reason), body(&response));
        assert_eq!(
            body(&response),
            format!(
                "crucible egress: rebound.test:{port} resolves to 127.0.0.1, a loopback \
                 address, which the operator has not allowed (sandbox sb-test)\n"
            )
        );
        assert_eq!(resolver.asked(), ["rebound.test"]);
        // Nothing connected.
        let accepted = listener.accept();
        assert!(
            matches!(&accepted, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "{accepted:?}"
        );
        assert_eq!(ctx.counters.snapshot().denied, 1);
    }

    #[tokio::test]
    async fn one_refused_address_among_those_resolved_refuses_the_name() {
        let listener = std::net::TcpListener::bind((LOCALHOST, 0)).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("address").port();
        let private: IpAddr = "10.0.0.1".parse().expect("address");
        let Setup { ctx, .. } = setup(
            &["mixed.test"],
            &format!("mixed.test, 127.0.0.1:{port}"),
            &[("mixed.test", &[LOCALHOST, private])],
        );
        let request = format!("GET http://mixed.test:{port}/ HTTP/1.1\r\n\r\n");
        let response = exchange(&ctx, request.as_bytes()).await;
        assert!(response.starts_with("HTTP/1.1 403 "), "{response}");
        assert!(
            body(&response).contains("resolves to 10.0.0.1, a private address"),
            "{response}"
        );
        let accepted = listener.accept();
        assert!(
            matches!(&accepted, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "{accepted:?}"
        );
    }

    #[tokio::test]
    async fn loopback_spelled_as_mapped_or_nat64_ipv6_is_refused_under_a_wide_operator_network() {
        // The sandbox may ask for these literals (the operator's networks cover them), but
        // networks that also hold public addresses open no special-use address.
        let targets = [
            "[::ffff:127.0.0.1]:22",
            "[64:ff9b::7f00:1]:22",
            "[::1]:22",
            "127.0.0.1:22",
        ];
        let Setup { ctx, .. } = setup(&targets, "0.0.0.0/0, ::/0", &[]);
        for target in targets {
            let request = format!("CONNECT {target} HTTP/1.1\r\n\r\n");
            let response = exchange(&ctx, request.as_bytes()).await;
            assert!(
                response.starts_with("HTTP/1.1 403 "),
                "{target}: {response}"
            );
            assert!(
                body(&response)
                    .contains("is a loopback address, which the operator has not allowed"),
                "{target}: {response}"
            );
        }
        assert_eq!(ctx.counters.snapshot().denied, targets.len() as u64);
    }

    #[tokio::test]
    async fn a_head_larger_than_the_limit_gets_a_431() {
        let Setup { ctx, .. } = setup(&["crates.io:443"], "crates.io:443", &[]);
        let filler = "a".repeat(HEAD_LIMIT);
        let request = format!("GET http://crates.io/ HTTP/1.1\r\nX-Filler: {filler}\r\n\r\n");
        let response = exchange(&ctx, request.as_bytes()).await;
        assert!(
            response.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{response}"
        );
        assert_eq!(header(&response, "X-Crucible-Egress"), None);
        assert!(body(&response).contains("16 KiB"), "{response}");
        // Just under the limit is read and judged.
        let filler = "a".repeat(HEAD_LIMIT - 100);
        let request = format!("GET http://crates.io:1/ HTTP/1.1\r\nX-Filler: {filler}\r\n\r\n");
        let response = exchange(&ctx, request.as_bytes()).await;
        assert!(response.starts_with("HTTP/1.1 403 "), "{response}");
    }

    #[tokio::test]
    async fn malformed_and_origin_form_requests_get_a_400_saying_why() {
        let Setup { ctx, .. } = setup(&["crates.io"], "crates.io", &[]);
        for (request, says) in [
            (
                "GET /index.html HTTP/1.1\r\nHost: crates.io\r\n\r\n",
                "absolute URI",
            ),
            ("GET https://crates.io/ HTTP/1.1\r\n\r\n", "CONNECT"),
            ("CONNECT crates.io HTTP/1.1\r\n\r\n", "no port"),
            (
                "GET http://crates.io/\x01 HTTP/1.1\r\n\r\n",
                "not valid HTTP",
            ),
            // Empty lines before a request line are skipped (RFC 9112 §2.2): what follows
            // them is the request, judged as any other.
            ("\r\n\r\nnot a request\r\n\r\n", "not valid HTTP"),
            (
                "GET http://crates.io/ HTTP/1.1\r\nContent-Length: 1\r\n\
                 Transfer-Encoding: chunked\r\n\r\n",
                "both Content-Length and Transfer-Encoding",
            ),
        ] {
            let response = exchange(&ctx, request.as_bytes()).await;
            assert!(
                response.starts_with("HTTP/1.1 400 Bad Request\r\n"),
                "{response}"
            );
            assert!(body(&response).contains(says), "{request:?}: {response}");
        }
        assert_eq!(ctx.counters.snapshot(), EgressStats::default());
    }

    #[tokio::test]
    async fn empty_lines_alone_are_no_request_and_nothing_is_forwarded() {
        // They are what may precede a request line, so the proxy waits for one; a sandbox that
        // then closes its side gets no answer and no connection, at once (not after the head
        // timeout).
        let Setup { ctx, .. } = setup(&["crates.io"], "crates.io", &[]);
        let (mut sandbox, proxy_end) = pair();
        let client = async {
            sandbox.write_all(b"\r\n\r\n\n\r\n").await.expect("send");
            sandbox.shutdown().await.expect("half-close");
            let mut response = Vec::new();
            sandbox.read_to_end(&mut response).await.expect("read");
            response
        };
        let ((), response) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(serve(proxy_end, &ctx), client)
        })
        .await
        .expect("the proxy gives up when the sandbox closes, not at the head timeout");
        assert!(
            response.is_empty(),
            "{}",
            String::from_utf8_lossy(&response)
        );
        assert_eq!(ctx.counters.snapshot(), EgressStats::default());
    }

    #[tokio::test]
    async fn a_head_not_sent_in_time_closes_the_connection_without_an_answer() {
        let Setup { ctx, .. } = setup(&["crates.io"], "crates.io", &[]);
        let (mut sandbox, proxy_end) = pair();
        let timeouts = Timeouts {
            head: Duration::from_millis(100),
            ..DEFAULT_TIMEOUTS
        };
        let client = async {
            sandbox
                .write_all(b"CONNECT crates.io:443 HTTP/1.1\r\n")
                .await
                .expect("send a partial head");
            let mut response = Vec::new();
            sandbox.read_to_end(&mut response).await.expect("read");
            response
        };
        let ((), response) = tokio::join!(serve_with(proxy_end, &ctx, timeouts), client);
        assert!(
            response.is_empty(),
            "{}",
            String::from_utf8_lossy(&response)
        );
    }

    #[tokio::test]
    async fn a_connection_not_accepted_in_time_gets_a_504() {
        // A listener whose accept queue is full: Linux drops further SYNs, so a connect hangs.
        let listener = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        listener
            .bind(&SocketAddr::new(LOCALHOST, 0).into())
            .expect("bind");
        listener.listen(0).expect("listen");
        let addr = listener
            .local_addr()
            .expect("address")
            .as_socket()
            .expect("an IP address");
        let mut queued = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
                Ok(stream) => queued.push(stream.expect("connect while the queue has room")),
                Err(_) => break,
            }
            assert!(queued.len() < 64, "the accept queue never filled");
        }
        let port = addr.port();
        let Setup { ctx, .. } = setup(
            &[&format!("127.0.0.1:{port}")],
            &format!("127.0.0.1:{port}"),
            &[],
        );
        let timeouts = Timeouts {
            connect: Duration::from_millis(200),
            ..DEFAULT_TIMEOUTS
        };
        let request = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n");
        let response = exchange_with(&ctx, request.as_bytes(), timeouts).await;
        assert!(
            response.starts_with("HTTP/1.1 504 Gateway Timeout\r\n"),
            "{response}"
        );
        assert!(body(&response).contains("timed out"), "{response}");
        assert_eq!(ctx.counters.snapshot().connections, 0);
    }

    #[tokio::test]
    async fn resolution_and_connection_failures_get_a_502() {
        let closed_port = {
            let listener = std::net::TcpListener::bind((LOCALHOST, 0)).expect("bind");
            listener.local_addr().expect("address").port()
        };
        let Setup { ctx, .. } = setup(
            &["unknown.test", "refused.test"],
            &format!("*.test, 127.0.0.1:{closed_port}"),
            &[("refused.test", &[LOCALHOST])],
        );
        let response = exchange(&ctx, b"CONNECT unknown.test:443 HTTP/1.1\r\n\r\n").await;
        assert!(
            response.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
            "{response}"
        );
        assert!(
            body(&response).contains("could not resolve unknown.test"),
            "{response}"
        );
        let request = format!("CONNECT refused.test:{closed_port} HTTP/1.1\r\n\r\n");
        let response = exchange(&ctx, request.as_bytes()).await;
        assert!(
            response.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
            "{response}"
        );
        assert!(
            body(&response).contains(&format!(
                "could not connect to refused.test:{closed_port} (127.0.0.1:{closed_port})"
            )),
            "{response}"
        );
        assert_eq!(ctx.counters.snapshot(), EgressStats::default());
    }
}
