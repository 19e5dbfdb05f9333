//! The connection front door: every accepted connection starts here. It reads the first
//! request head (bounded in size and time) and parses it once with `http1`, the head parser
//! the egress proxy and the client share, answering a malformed one itself, with the JSON
//! envelope (hyper would send a bare 400). Framing a proxy and hyper could read differently
//! (two Content-Lengths, one beside Transfer-Encoding, ...) is refused here, for every route. An exec — the hot path — is
//! served right here from that parse:
//! - the hijacked interactive exec (`POST /sandboxes/{id}/exec?stdin=1` without an `Upgrade`
//!   header): a bare `HTTP/1.1 200 OK` header block, after which the connection is a raw frame
//!   stream — something hyper cannot do after a 200;
//! - the one-shot exec with a `Content-Length` body: its chunked frame stream, the response
//!   head written with the first frames (for `true`, the whole response is one write).
//!
//! Everything else (and anything after that first request on a kept-alive connection) goes to
//! hyper and the router, the unread bytes replayed: hyper parses those heads, once.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use bytes::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tower::ServiceExt;

use crate::auth::Transport;
use crate::config::{JSON_BODY_LIMIT, MAX_HEAD, MAX_HEADERS};
use crate::edge::Edge;
use crate::error::ApiError;
use crate::raw_stream::{RawReader, RawWriter};
use crate::rewind::Rewind;
use engine::exec;
use http1::{HeadError, HeadScanner, Limits, LineEnds, RequestHead, RequestTarget, Version};

/// A first request the front door serves itself: an exec.
#[derive(Debug)]
pub struct ExecHead {
    /// The sandbox id from the path.
    pub id: String,
    /// `POST /sandboxes/{id}/execs/{exec_id}/attach?stdin=1`: a hijacked re-attach to an
    /// interactive command (no body), rather than a new exec.
    pub attach: Option<AttachTarget>,
    /// `?stdin=1`: the hijacked interactive transport; else a one-shot exec.
    pub interactive: bool,
    /// `?container=NAME`: the container it runs in.
    pub container: Option<String>,
    /// Whether the connection stays open after a one-shot exec's response (a one-shot served
    /// here is HTTP/1.1: without `Connection: close`).
    pub(crate) keep_alive: bool,
    /// The `Authorization` header's value.
    pub authorization: Option<Vec<u8>>,
    /// The `Content-Length` header's value (there is at most one).
    pub content_length: Option<usize>,
    /// Whether `chunked` is the final transfer coding.
    pub chunked: bool,
}

/// The command a hijacked re-attach names, and the output bytes its client already has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachTarget {
    /// Its `exec_id`.
    pub exec_id: String,
    /// `?offset=`.
    pub offset: u64,
}

/// The value of `name` in a query string (`a=1&b=2`).
fn query_value<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
}

/// The limits the first request head is read under: bare LF line ends are accepted, as hyper
/// (httparse) accepts them, so that the front door and hyper read every head alike.
const HEAD_LIMITS: Limits = Limits {
    max_head_bytes: MAX_HEAD,
    max_headers: MAX_HEADERS,
    line_ends: LineEnds::CrlfOrBareLf,
};

/// The answer to a head `http1` refuses: 431 over a limit, 505 for a version other than
/// HTTP/1.0 and 1.1 (as hyper answers), 400 for the rest, each saying what is wrong.
fn head_error(error: &HeadError) -> ApiError {
    match error.status() {
        431 => ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!("the request head is refused: {error}"),
        ),
        505 => ApiError::new(
            StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            "http_version_not_supported",
            format!("the request is refused: {error}"),
        ),
        _ => ApiError::invalid(format!("the request head is not valid HTTP/1.1: {error}")),
    }
}

/// Returns the exec in `head` (exactly one request head, as [`http1::head_end`] delimits it)
/// if it is one the front door serves itself (a hijack, or a one-shot with a `Content-Length`
/// body over HTTP/1.1, without `Expect` or `Upgrade`); `None` for everything hyper serves. A
/// head that does not parse is answered here, with the JSON envelope (hyper would answer a
/// bare 400). Public for the fuzz target.
pub fn parse_first_head(head: &[u8]) -> Result<Option<ExecHead>, ApiError> {
    let request = RequestHead::parse(head, &HEAD_LIMITS).map_err(|e| head_error(&e))?;
    let target = request.target();
    // hyper's URI parser refuses some visible ASCII that `http1` lets through (`<`, `>` and
    // a backtick in a path, say): refused here too, with the envelope.
    if let Err(e) = target.parse::<axum::http::Uri>() {
        return Err(ApiError::invalid(format!(
            "the request target {target:?} is not a valid URI: {e}"
        )));
    }
    if request.method() != "POST" {
        return Ok(None);
    }
    let RequestTarget::Origin { path, query } = request.target_form() else {
        return Ok(None);
    };
    let Some(rest) = path.strip_prefix("/sandboxes/") else {
        return Ok(None);
    };
    // Parsed only on the routes served here: another route's bad `stdin` is its own answer.
    let wants_stdin = || exec::wants_stdin(query_value(query, "stdin"));
    let (id, attach, interactive) = match rest.strip_suffix("/exec") {
        Some(id) => (id, None, wants_stdin()?),
        None => {
            // Only an interactive re-attach is hijacked; a one-shot one is hyper's.
            let Some((id, exec_id)) = rest
                .strip_suffix("/attach")
                .and_then(|r| r.split_once("/execs/"))
                .filter(|(id, exec_id)| !id.contains('/') && !exec_id.contains('/'))
            else {
                return Ok(None);
            };
            if !wants_stdin()? {
                return Ok(None);
            }
            let offset = match query_value(query, "offset") {
                None | Some("") => 0,
                Some(n) => n.parse().map_err(|_| {
                    ApiError::invalid(format!("offset: expected a byte count, got {n:?}"))
                })?,
            };
            let target = AttachTarget {
                exec_id: exec_id.to_string(),
                offset,
            };
            (id, Some(target), true)
        }
    };
    let headers = request.headers();
    if headers.contains("upgrade") {
        // Docker's `Upgrade: tcp` variant: hyper answers it with a 101. Any Upgrade header,
        // not only a complete upgrade request, goes to hyper: no such request is hijacked.
        return Ok(None);
    }
    if !interactive
        && (request.version() != Version::Http11
            || headers.contains("expect")
            || headers.content_length().is_none()
            || headers.has_transfer_encoding())
    {
        // Rarer shapes of a one-shot exec (HTTP/1.0, `Expect: 100-continue`, a chunked body):
        // hyper knows them all.
        return Ok(None);
    }
    Ok(Some(ExecHead {
        id: id.to_string(),
        attach,
        interactive,
        container: query_value(query, "container").map(str::to_string),
        keep_alive: request.keep_alive(),
        authorization: headers.get("authorization").map(<[u8]>::to_vec),
        // Beyond the address space is beyond every limit.
        content_length: headers
            .content_length()
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        chunked: headers.is_chunked(),
    }))
}

/// Serves one accepted connection; `router` is the daemon's, built once.
pub(crate) async fn serve_connection<S>(
    state: Arc<Edge>,
    router: Router,
    mut stream: S,
    transport: Transport,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut buf = Vec::with_capacity(4096);
    let header_timeout = state.http.header_timeout;
    let deadline = tokio::time::Instant::now() + header_timeout;
    let mut scanner = HeadScanner::new(MAX_HEAD);
    let head_len = loop {
        match scanner.scan(&buf) {
            Ok(Some(end)) => break end,
            Ok(None) => {}
            Err(e) => return respond_error(&state, &mut stream, &head_error(&e)).await,
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Err(_) => {
                let error = ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    format!("no complete request head within {header_timeout:?}"),
                );
                return respond_error(&state, &mut stream, &error).await;
            }
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    match parse_first_head(&buf[..head_len]) {
        Ok(Some(head)) => {
            let rest = buf.split_off(head_len);
            serve_exec(state, router, stream, head, rest, transport).await
        }
        Ok(None) => {
            let header_timeout = state.http.header_timeout;
            let stream = Rewind::new(Bytes::from(buf), stream);
            serve_http(router, header_timeout, stream, transport).await
        }
        Err(error) => respond_error(&state, &mut stream, &error).await,
    }
}

/// Hands the connection to hyper (with upgrades, for WebSocket and `Upgrade: tcp`).
async fn serve_http<S>(app: Router, header_timeout: Duration, stream: S, transport: Transport)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(transport);
            app.clone().oneshot(request)
        });
    let result = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(MAX_HEAD.max(8192))
        // Room past our limit, so that `routes::limit_head` answers with the envelope rather
        // than hyper with a bare 431.
        .max_headers(MAX_HEADERS * 4)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
    if let Err(e) = result {
        tracing::debug!("connection ended with an error: {e}");
    }
}

/// How long, and how much, a refused client's unread bytes are drained after the answer.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 1024 * 1024;

/// Answers `error` and closes the connection. A client still sending (the rest of an oversized
/// head, say) would otherwise get a reset instead of the answer: its unread bytes are drained
/// for a moment first (nginx's lingering close).
async fn respond_error<S: AsyncRead + AsyncWrite + Unpin>(
    state: &Edge,
    stream: &mut S,
    error: &ApiError,
) {
    state.metrics.observe_error(error.status.as_u16());
    let body = serde_json::to_vec(&error.body()).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        error.status.as_u16(),
        error.status.canonical_reason().unwrap_or(""),
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(&body).await;
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = vec![0u8; 64 * 1024];
        let mut drained = 0;
        while drained < LINGER_BYTES {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// An exec served from the first head. It never reaches axum, so it identifies its caller
/// itself, by the same rules as `routes::authenticate`, and looks the sandbox up for that
/// caller: one that is not the caller's is the same 404 as a missing one.
async fn serve_exec<S>(
    state: Arc<Edge>,
    router: Router,
    mut stream: S,
    head: ExecHead,
    mut rest: Vec<u8>,
    transport: Transport,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let caller = match state
        .keys
        .identify(transport, head.authorization.as_deref())
    {
        Some(caller) => caller,
        None => return respond_error(&state, &mut stream, &ApiError::unauthorized()).await,
    };
    if let Some(target) = &head.attach {
        return serve_attach(state, stream, &head, target, rest, &caller).await;
    }
    let length = match (head.content_length, head.chunked) {
        (Some(n), false) if n <= JSON_BODY_LIMIT => n,
        (Some(n), false) => {
            let error = ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("an ExecRequest of {n} bytes exceeds the {JSON_BODY_LIMIT} byte limit"),
            );
            return respond_error(&state, &mut stream, &error).await;
        }
        _ => {
            let error = ApiError::new(
                StatusCode::LENGTH_REQUIRED,
                "length_required",
                "an interactive exec needs a Content-Length body (the ExecRequest JSON)",
            );
            return respond_error(&state, &mut stream, &error).await;
        }
    };
    let deadline = tokio::time::Instant::now() + state.http.header_timeout;
    while rest.len() < length {
        let mut chunk = vec![0u8; (length - rest.len()).min(64 * 1024)];
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => rest.extend_from_slice(&chunk[..n]),
            Err(_) => {
                let error = ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    "the ExecRequest body did not arrive in time",
                );
                return respond_error(&state, &mut stream, &error).await;
            }
        }
    }
    // Bytes past the body: a hijack's first stdin frames, or a kept-alive client's next request.
    let after_body = Bytes::from(rest.split_off(length));
    let sandbox = match state.registry.get(&head.id, &caller) {
        Ok(sandbox) => sandbox,
        Err(e) => return respond_error(&state, &mut stream, &e.into()).await,
    };
    let request = match crate::json::parse_exec_request(&rest) {
        Ok(request) => request,
        Err(e) => return respond_error(&state, &mut stream, &e.into()).await,
    };
    let admitted = exec::admit(
        &state.metrics,
        &sandbox,
        request,
        head.interactive,
        head.container.as_deref(),
    )
    .await;
    let session = match admitted {
        Ok(session) => session,
        Err(e) => return respond_error(&state, &mut stream, &e.into()).await,
    };
    if head.interactive {
        let head = crate::execs::hijack_head(session.exec_id(), &[]);
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let (reader, writer) = tokio::io::split(Rewind::new(after_body, stream));
        exec::pump(session, RawReader::new(reader), RawWriter(writer)).await;
        return;
    }
    if write_one_shot(session, &mut stream).await.is_err() {
        // The client went away: dropping the session killed the command.
        return;
    }
    if head.keep_alive {
        let header_timeout = state.http.header_timeout;
        serve_http(
            router,
            header_timeout,
            Rewind::new(after_body, stream),
            transport,
        )
        .await;
    } else {
        let _ = stream.shutdown().await;
    }
}

/// A hijacked re-attach to an interactive command: no body; after a bare `200` head (with the
/// command's output and stdin positions) the connection carries stdin frames in and the
/// rest of the frame stream out, as the exec that started it did.
async fn serve_attach<S>(
    state: Arc<Edge>,
    mut stream: S,
    head: &ExecHead,
    target: &AttachTarget,
    rest: Vec<u8>,
    caller: &crate::auth::Caller,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    if head.chunked || head.content_length.is_some_and(|n| n > 0) {
        let error = ApiError::invalid("an attach takes no body");
        return respond_error(&state, &mut stream, &error).await;
    }
    let sandbox = match state.registry.get(&head.id, caller) {
        Ok(sandbox) => sandbox,
        Err(e) => return respond_error(&state, &mut stream, &e.into()).await,
    };
    let attached = exec::attach(
        &state.metrics,
        &sandbox,
        &target.exec_id,
        target.offset,
        true,
        head.container.as_deref(),
    )
    .await;
    let (status, session) = match attached {
        Ok(attached) => attached,
        Err(e) => return respond_error(&state, &mut stream, &e.into()).await,
    };
    let head =
        crate::execs::hijack_head(session.exec_id(), &crate::execs::position_headers(&status));
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let (reader, writer) = tokio::io::split(Rewind::new(Bytes::from(rest), stream));
    exec::pump(session, RawReader::new(reader), RawWriter(writer)).await;
}

/// How long a one-shot exec's response head waits for the first frames to go out with them.
const HEAD_GRACE: Duration = Duration::from_millis(1);

/// Writes a one-shot exec's response: the head, then the frames as HTTP chunks as they come,
/// the head going out with the first frames (if they come within [`HEAD_GRACE`]) and the last
/// chunk with the terminator, so that a short command's whole response is one write. Meanwhile the connection is watched: a client
/// that hangs up (while the command is silent, say) ends the session, which kills the
/// command (unless it outlives its connection). Returns what the client sent meanwhile (a kept-alive client's next request).
async fn write_one_shot<S: AsyncRead + AsyncWrite + Unpin>(
    mut session: exec::Session,
    stream: &mut S,
) -> std::io::Result<Vec<u8>> {
    // The exec id is `[A-Za-z0-9._-]` only (validated, or generated): safe in a header.
    let head_bytes = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n{}: {}\r\n\
         transfer-encoding: chunked\r\n\r\n",
        crate::execs::EXEC_ID_HEADER,
        session.exec_id()
    );
    let mut head: &[u8] = head_bytes.as_bytes();
    let mut early = Vec::new();
    let mut peek = [0u8; 4096];
    let head_deadline = tokio::time::Instant::now() + HEAD_GRACE;
    loop {
        let output = tokio::select! {
            output = session.next_output() => output,
            () = tokio::time::sleep_until(head_deadline), if !head.is_empty() => {
                // A command silent for now: its client gets the head, as hyper would send it.
                stream.write_all(head).await?;
                stream.flush().await?;
                head = b"";
                continue;
            }
            read = stream.read(&mut peek) => match read {
                Ok(0) | Err(_) => return Err(std::io::ErrorKind::ConnectionAborted.into()),
                Ok(n) if early.len() + n <= crate::config::MAX_HEAD => {
                    early.extend_from_slice(&peek[..n]);
                    continue;
                }
                // More than a request head ahead of its answer: not a client we keep.
                Ok(_) => return Err(std::io::ErrorKind::InvalidData.into()),
            },
        };
        let Some(frames) = output else {
            // The session always ends with an exit frame, sent with the terminator below;
            // close the body regardless.
            write_all_vectored(stream, &[head, b"0\r\n\r\n"]).await?;
            stream.flush().await?;
            return Ok(early);
        };
        let size = format!("{:x}\r\n", frames.len());
        let last = session.ending().is_some();
        let tail: &[u8] = if last { b"\r\n0\r\n\r\n" } else { b"\r\n" };
        write_all_vectored(stream, &[head, size.as_bytes(), &frames, tail]).await?;
        head = b"";
        if last {
            stream.flush().await?;
            return Ok(early);
        }
    }
}

/// Writes every byte of `parts`, gathered (one `writev` when the socket takes it all).
async fn write_all_vectored<S: AsyncWrite + Unpin>(
    stream: &mut S,
    parts: &[&[u8]],
) -> std::io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut written = 0;
    while written < total {
        let mut skip = written;
        let slices: Vec<std::io::IoSlice<'_>> = parts
            .iter()
            .filter_map(|part| {
                if skip >= part.len() {
                    skip -= part.len();
                    return None;
                }
                let slice = std::io::IoSlice::new(&part[skip..]);
                skip = 0;
                Some(slice)
            })
            .collect();
        let n = stream.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        written += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the head ends in `buf`, as `serve_connection` finds it.
    fn end_of(buf: &[u8]) -> Option<usize> {
        HeadScanner::new(MAX_HEAD)
            .scan(buf)
            .expect("within the limit")
    }

    #[test]
    fn recognises_the_execs_it_serves_itself() {
        let hijack = b"POST /sandboxes/sb-0123456789abcdef/exec?stdin=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n";
        let head = parse_first_head(hijack).expect("valid").expect("a hijack");
        assert_eq!(head.id, "sb-0123456789abcdef");
        assert_eq!(head.content_length, Some(5));
        assert!(head.interactive && head.keep_alive);
        let one_shot = b"POST /sandboxes/sb-0123456789abcdef/exec HTTP/1.1\r\nContent-Length: 2\r\nConnection: keep-alive, close\r\nAuthorization: Bearer k\r\n\r\n";
        let head = parse_first_head(one_shot)
            .expect("valid")
            .expect("a one-shot");
        assert!(!head.interactive && !head.keep_alive);
        assert_eq!(head.authorization.as_deref(), Some(&b"Bearer k"[..]));
        // A fragment is no part of the path or the query, as hyper's URI parser reads them.
        let fragment = b"POST /sandboxes/sb-1/exec?stdin=1#x HTTP/1.1\r\nContent-Length: 2\r\n\r\n";
        let head = parse_first_head(fragment)
            .expect("valid")
            .expect("a hijack");
        assert!(head.interactive && head.id == "sb-1");
        for other in [
            // A one-shot exec hyper serves: no length, HTTP/1.0, Expect, a chunked body.
            &b"POST /sandboxes/sb-0123456789abcdef/exec HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"POST /sandboxes/sb-0123456789abcdef/exec?stdin=0 HTTP/1.1\r\n\r\n",
            b"POST /sandboxes/sb-0123456789abcdef/exec HTTP/1.0\r\nContent-Length: 2\r\n\r\n",
            b"POST /sandboxes/sb-0123456789abcdef/exec HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n",
            b"POST /sandboxes/sb-0123456789abcdef/exec HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET /sandboxes/sb-0123456789abcdef/exec?stdin=1 HTTP/1.1\r\n\r\n",
            b"POST /sandboxes/sb-0123456789abcdef/exec?stdin=1 HTTP/1.1\r\nUpgrade: tcp\r\nConnection: Upgrade\r\n\r\n",
            // Any Upgrade header, even one RFC 9110 says to ignore, goes to hyper.
            b"POST /sandboxes/sb-0123456789abcdef/exec?stdin=1 HTTP/1.1\r\nUpgrade: tcp\r\nContent-Length: 2\r\n\r\n",
            b"POST /sandboxes/sb-0123456789abcdef/exec?stdin=1 HTTP/1.0\r\nUpgrade: tcp\r\nContent-Length: 2\r\n\r\n",
            b"POST http://x/sandboxes/sb-0123456789abcdef/exec?stdin=1 HTTP/1.1\r\nContent-Length: 2\r\n\r\n",
            b"POST /sandboxes HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                parse_first_head(other).expect("valid").is_none(),
                "{:?}",
                String::from_utf8_lossy(other)
            );
        }
        assert!(parse_first_head(b"POST /sandboxes/x/exec?stdin=maybe HTTP/1.1\r\n\r\n").is_err());
    }

    #[test]
    fn malformed_heads_are_answered_with_the_status_that_fits() {
        let malformed = parse_first_head(b"GET /\x00 HTTP/1.1\r\n\r\n").expect_err("malformed");
        assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
        assert!(malformed.message.contains("0x00"), "{}", malformed.message);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: y\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        let too_many = parse_first_head(many.as_bytes()).expect_err("too many headers");
        assert_eq!(too_many.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        assert_eq!(too_many.code, "headers_too_large");
        assert!(
            too_many.message.contains("header fields"),
            "{}",
            too_many.message
        );
        let http2 = parse_first_head(b"PRI * HTTP/2.0\r\n\r\n").expect_err("HTTP/2");
        assert_eq!(http2.status, StatusCode::HTTP_VERSION_NOT_SUPPORTED);
        assert!(http2.message.contains("HTTP/2.0"), "{}", http2.message);
        // Visible ASCII `http1` lets through but hyper's URI parser refuses.
        let uri = parse_first_head(b"GET /a<b HTTP/1.1\r\n\r\n").expect_err("not a URI");
        assert_eq!(uri.status, StatusCode::BAD_REQUEST);
        assert!(uri.message.contains("not a valid URI"), "{}", uri.message);
    }

    #[test]
    fn framing_a_proxy_and_hyper_could_read_differently_is_refused_on_every_route() {
        for (head, says) in [
            (
                &b"POST /sandboxes HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
                "both Content-Length and Transfer-Encoding",
            ),
            (
                b"POST /sandboxes/sb-1/exec HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
                "more than one Content-Length",
            ),
            // Even two that agree: nobody legitimate sends them.
            (
                b"POST /sandboxes/sb-1/exec?stdin=1 HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\n",
                "more than one Content-Length",
            ),
            (
                b"GET /sandboxes HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                "more than one Host",
            ),
            (
                b"GET /sandboxes HTTP/1.1\r\nAuthorization: Bearer a\r\nAuthorization: Bearer b\r\n\r\n",
                "more than one Authorization",
            ),
            (
                b"POST /sandboxes HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                "HTTP/1.0",
            ),
            (
                b"POST /sandboxes HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                "after chunked",
            ),
            (
                b"POST /sandboxes HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
                "does not end with chunked",
            ),
            (
                b"POST /sandboxes/sb-1/exec?stdin=1 HTTP/1.1\r\nContent-Length: 12abc\r\n\r\n",
                "Content-Length",
            ),
            (
                b"POST /sandboxes HTTP/1.1\r\nContent-Length: 2\r\n X: folded\r\n\r\n",
                "folding",
            ),
        ] {
            let error = parse_first_head(head).expect_err("ambiguous framing");
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{}", error.message);
            assert!(
                error.message.contains(says),
                "{:?}: {}",
                String::from_utf8_lossy(head),
                error.message
            );
        }
    }

    #[test]
    fn the_scanner_finds_the_end_however_the_head_is_split() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody";
        let end = head.len() - 4;
        assert_eq!(end_of(head), Some(end));
        // Each byte arriving alone.
        let mut scanner = HeadScanner::new(MAX_HEAD);
        let found = (1..=head.len()).find_map(|n| scanner.scan(&head[..n]).expect("small"));
        assert_eq!(found, Some(end));
        assert_eq!(end_of(b"GET / HTTP/1.1\r\n"), None);
        // A head that has not ended within the limit is over it.
        let big = vec![b'a'; MAX_HEAD];
        let error = HeadScanner::new(MAX_HEAD)
            .scan(&big)
            .expect_err("too large");
        assert_eq!(
            head_error(&error).status,
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
    }

    #[test]
    fn head_ends_at_the_first_empty_line_with_crlf_or_bare_lf() {
        assert_eq!(end_of(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody"), Some(27));
        // Found by the http_exec_request fuzz target: httparse accepts bare LF line ends, but
        // the head was only complete at a CRLFCRLF, so such a request hung until the timeout.
        assert_eq!(end_of(b"GET / HTTP/1.1\nHost: x\n\nbody"), Some(24));
        assert_eq!(end_of(b"GET / HTTP/1.1\r\nHost: x\n\r\n"), Some(26));
        assert_eq!(end_of(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
        let head = b"POST /sandboxes/sb-1/exec?stdin=1 HTTP/1.1\nContent-Length: 2\n\n{}";
        let end = end_of(head).expect("complete head");
        let parsed = parse_first_head(&head[..end])
            .expect("valid")
            .expect("a hijack");
        assert_eq!(parsed.content_length, Some(2));
        assert_eq!(&head[end..], b"{}");
    }
}
