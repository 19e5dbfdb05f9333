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

use futures_util::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::counters::EgressCounters;
use super::policy::{Denial, EgressPolicy};
use super::request::{parse_head, BadRequest, ProxyRequest};
use super::rules::Host;
use crate::front_door::head_end;

/// The largest request head the proxy reads.
pub const HEAD_LIMIT: usize = 16 * 1024;
/// How long a sandbox has to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long resolving, and then connecting to, a target may take (each).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Relay buffer per direction.
const RELAY_BUFFER: usize = 64 * 1024;

/// Resolves a host name to the addresses to try, in order.
pub trait Resolve: Send + Sync {
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
pub struct EgressContext {
    pub sandbox_id: String,
    pub policy: Arc<EgressPolicy>,
    pub counters: Arc<EgressCounters>,
    pub resolver: Arc<dyn Resolve>,
}

impl fmt::Debug for EgressContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressContext")
            .field("sandbox_id", &self.sandbox_id)
            .field("policy", &self.policy)
            .field("counters", &self.counters)
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
pub async fn serve<S>(client: S, ctx: &EgressContext)
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
        HeadRead::TooLarge => {
            tracing::info!(sandbox, verdict = "head too large", "egress");
            let message = format!("the request head is larger than {} KiB", HEAD_LIMIT / 1024);
            return answer(&mut client, Answer::error(431, message)).await;
        }
        HeadRead::TimedOut => {
            tracing::info!(sandbox, verdict = "head timed out", "egress");
            return;
        }
        HeadRead::Closed => return,
    };
    let request = match parse_head(&buf[..head_len]) {
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
                ctx.counters.add_denied();
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
    Complete { buf: Vec<u8>, head_len: usize },
    TooLarge,
    TimedOut,
    Closed,
}

async fn read_head<S: AsyncRead + Unpin>(client: &mut S, timeout: Duration) -> HeadRead {
    let deadline = Instant::now() + timeout;
    let mut buf = Vec::with_capacity(4096);
    let mut searched = 0;
    loop {
        let end = head_end(&buf, searched);
        searched = buf.len().saturating_sub(3);
        match end {
            Some(head_len) if head_len <= HEAD_LIMIT => {
                return HeadRead::Complete { buf, head_len }
            }
            Some(_) => return HeadRead::TooLarge,
            None if buf.len() >= HEAD_LIMIT => return HeadRead::TooLarge,
            None => {}
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
    let reason = match answer.status {
        400 => "Bad Request",
        403 => "Forbidden",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
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

/// Checks `host:port`, resolves it once, checks every address, and connects to the first
/// that answers: only addresses that passed the check are ever connected to.
async fn open(
    ctx: &EgressContext,
    host: &Host,
    port: u16,
    timeout: Duration,
) -> Result<TcpStream, Answer> {
    // Before resolving: a name no rule allows is not even looked up.
    ctx.policy
        .check_target(host, port)
        .map_err(|denial| Answer::denied(ctx, &denial))?;
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
    for addr in &addrs {
        ctx.policy
            .check_address(host, *addr)
            .map_err(|denial| Answer::denied(ctx, &denial))?;
    }
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    for addr in addrs {
        match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
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
