//! Connection front: reads each new connection's first request head. A hijacked interactive
//! exec (`POST /sandboxes/{id}/exec?stdin=1` without an `Upgrade` header) is answered here with
//! a bare `HTTP/1.1 200 OK` header block, after which the connection is a raw frame stream —
//! something hyper cannot do after a 200. Everything else goes to hyper, bytes replayed.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tower::ServiceExt;
use wire::ExecRequest;

use crate::error::ApiError;
use crate::exec;
use crate::rewind::Rewind;
use crate::routes::{self, wants_stdin};
use crate::state::AppState;

/// How long a client may take to send a request head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most headers accepted.
const MAX_HEADERS: usize = 64;

/// Which listener a connection came from (TCP requires API keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The Unix socket.
    Unix,
    /// TCP.
    Tcp,
}

/// Where the request head in `buf` ends (just past its empty line), if it is complete. Line
/// ends may be CRLF or a bare LF, as httparse and hyper accept both: looking for CRLFCRLF only
/// left a bare-LF request waiting for the header timeout. Public for the fuzz target.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2).enumerate().find_map(|(i, w)| match w {
        b"\n\n" => Some(i + 2),
        b"\n\r" if buf.get(i + 2) == Some(&b'\n') => Some(i + 3),
        _ => None,
    })
}

/// A parsed hijack request head.
#[derive(Debug)]
pub struct HijackHead {
    /// The sandbox id from the path.
    pub id: String,
    /// The `Authorization` header's value.
    pub authorization: Option<Vec<u8>>,
    /// The `Content-Length` header's value.
    pub content_length: Option<usize>,
    /// Whether `Transfer-Encoding` names `chunked`.
    pub chunked: bool,
}

/// Returns the hijack request in `head`, if that is what it is. Public for the fuzz target.
pub fn parse_hijack(head: &[u8]) -> Result<Option<HijackHead>, ApiError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        // Not ours to judge: hyper answers malformed requests itself.
        _ => return Ok(None),
    }
    if request.method != Some("POST") {
        return Ok(None);
    }
    let Some(target) = request.path else {
        return Ok(None);
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let Some(id) = path
        .strip_prefix("/sandboxes/")
        .and_then(|rest| rest.strip_suffix("/exec"))
    else {
        return Ok(None);
    };
    let stdin = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("stdin="));
    if !wants_stdin(stdin)? {
        return Ok(None);
    }
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    if header("upgrade").is_some() {
        // Docker's `Upgrade: tcp` variant: hyper answers it with a 101.
        return Ok(None);
    }
    let content_length = match header("content-length") {
        None => None,
        Some(v) => Some(
            std::str::from_utf8(v)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| ApiError::invalid("Content-Length is not a number"))?,
        ),
    };
    let chunked = header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().windows(7).any(|w| w == b"chunked"));
    Ok(Some(HijackHead {
        id: id.to_string(),
        authorization: header("authorization").map(<[u8]>::to_vec),
        content_length,
        chunked,
    }))
}

/// Serves one accepted connection.
pub async fn serve_connection<S>(state: Arc<AppState>, mut stream: S, transport: Transport)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut buf = Vec::with_capacity(4096);
    let deadline = tokio::time::Instant::now() + HEADER_TIMEOUT;
    let head_len = loop {
        if let Some(end) = head_end(&buf) {
            break end;
        }
        if buf.len() > MAX_HEAD {
            let error = ApiError::new(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers_too_large",
                format!("the request head exceeds {MAX_HEAD} bytes"),
            );
            return respond_error(&state, &mut stream, &error).await;
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Err(_) => {
                let error = ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    format!("no complete request head within {HEADER_TIMEOUT:?}"),
                );
                return respond_error(&state, &mut stream, &error).await;
            }
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    match parse_hijack(&buf[..head_len]) {
        Ok(Some(head)) => hijack(state, stream, head, buf.split_off(head_len)).await,
        Ok(None) => serve_http(state, Rewind::new(Bytes::from(buf), stream), transport).await,
        Err(error) => respond_error(&state, &mut stream, &error).await,
    }
}

/// Hands the connection to hyper (with upgrades, for WebSocket and `Upgrade: tcp`).
async fn serve_http<S>(state: Arc<AppState>, stream: S, transport: Transport)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let app = routes::app(state);
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(transport);
            app.clone().oneshot(request)
        });
    let result = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD.max(8192))
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
    if let Err(e) = result {
        tracing::debug!("connection ended with an error: {e}");
    }
}

async fn respond_error<S: AsyncWrite + Unpin>(state: &AppState, stream: &mut S, error: &ApiError) {
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
}

/// The hijacked interactive exec.
async fn hijack<S>(state: Arc<AppState>, mut stream: S, head: HijackHead, mut rest: Vec<u8>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let keys = &state.config.api_keys;
    if !keys.is_empty() && !keys.allows(head.authorization.as_deref()) {
        return respond_error(&state, &mut stream, &ApiError::unauthorized()).await;
    }
    let length = match (head.content_length, head.chunked) {
        (Some(n), false) if n <= routes::JSON_BODY_LIMIT => n,
        (Some(n), false) => {
            let error = ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!(
                    "an ExecRequest of {n} bytes exceeds the {} byte limit",
                    routes::JSON_BODY_LIMIT
                ),
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
    let deadline = tokio::time::Instant::now() + HEADER_TIMEOUT;
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
    let early_input = Bytes::from(rest.split_off(length));
    let admitted = (|| {
        let sandbox = state.registry.get(&head.id)?;
        let request: ExecRequest = routes::parse_json(&rest, "ExecRequest")?;
        request
            .validate()
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        Ok::<_, ApiError>((sandbox.begin(true)?, request))
    })();
    let (guard, request) = match admitted {
        Ok(admitted) => admitted,
        Err(error) => return respond_error(&state, &mut stream, &error).await,
    };
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n";
    if stream.write_all(head).await.is_err() {
        return;
    }
    exec::interactive(state, guard, request, Rewind::new(early_input, stream)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_only_first_request_hijacks() {
        let hijack = b"POST /sandboxes/sb-0123456789abcdef/exec?stdin=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n";
        let head = parse_hijack(hijack).expect("valid").expect("a hijack");
        assert_eq!(head.id, "sb-0123456789abcdef");
        assert_eq!(head.content_length, Some(5));
        for other in [
            &b"POST /sandboxes/sb-0123456789abcdef/exec HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"POST /sandboxes/sb-0123456789abcdef/exec?stdin=0 HTTP/1.1\r\n\r\n",
            b"GET /sandboxes/sb-0123456789abcdef/exec?stdin=1 HTTP/1.1\r\n\r\n",
            b"POST /sandboxes/sb-0123456789abcdef/exec?stdin=1 HTTP/1.1\r\nUpgrade: tcp\r\nConnection: Upgrade\r\n\r\n",
            b"POST /sandboxes HTTP/1.1\r\n\r\n",
        ] {
            assert!(parse_hijack(other).expect("valid").is_none());
        }
        assert!(parse_hijack(b"POST /sandboxes/x/exec?stdin=maybe HTTP/1.1\r\n\r\n").is_err());
    }

    #[test]
    fn head_ends_at_the_first_empty_line_with_crlf_or_bare_lf() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody"), Some(27));
        // Found by the http_exec_request fuzz target: httparse accepts bare LF line ends, but
        // the head was only complete at a CRLFCRLF, so such a request hung until the timeout.
        assert_eq!(head_end(b"GET / HTTP/1.1\nHost: x\n\nbody"), Some(24));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\n\r\n"), Some(26));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
        let head = b"POST /sandboxes/sb-1/exec?stdin=1 HTTP/1.1\nContent-Length: 2\n\n{}";
        let end = head_end(head).expect("complete head");
        let parsed = parse_hijack(&head[..end])
            .expect("valid")
            .expect("a hijack");
        assert_eq!(parsed.content_length, Some(2));
        assert_eq!(&head[end..], b"{}");
    }
}
