//! File transfer: a tar stream extracted in the guest (push), one file's bytes (pull). Both
//! streamed: nothing is buffered whole.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::io::ReaderStream;
use wire::agent::{AgentReply, AgentRequest};
use wire::{ErrorBody, FilesPutResult};

use crate::edge::Edge;
use crate::error::ApiError;
use engine::agent::AgentError;
use engine::sandbox::ActivityGuard;

/// Bytes per read from the agent during a download: each chunk is one wakeup of each hop
/// (agent socket → daemon → client), so bigger chunks keep the three moving together.
const DOWNLOAD_CHUNK: usize = 256 * 1024;

/// Checks a guest path from `?path=`.
pub(crate) fn validate_path(path: Option<&str>, what: &str) -> Result<String, ApiError> {
    let path = path.ok_or_else(|| {
        ApiError::invalid(format!("path: missing; pass ?path=<absolute guest {what}>"))
    })?;
    if !path.starts_with('/') || path.contains('\0') {
        return Err(ApiError::invalid(format!(
            "path: must be an absolute guest path without NUL, got {path:?}"
        )));
    }
    Ok(path.to_string())
}

/// Maps an agent error reply to an HTTP error.
fn agent_error(body: ErrorBody) -> ApiError {
    let (status, code) = match body.code.as_str() {
        "invalid_request" => (StatusCode::BAD_REQUEST, "invalid_request"),
        "not_found" => (StatusCode::NOT_FOUND, "not_found"),
        "is_a_directory" => (StatusCode::BAD_REQUEST, "is_a_directory"),
        "permission_denied" => (StatusCode::FORBIDDEN, "permission_denied"),
        // The sandbox's disk (or inode table) is full: a limit the request ran into, as a
        // too-large upload does, not a daemon failure.
        "no_space" => (StatusCode::PAYLOAD_TOO_LARGE, "no_space"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "io_error"),
    };
    ApiError::new(status, code, body.message)
}

async fn request(
    guard: &ActivityGuard,
    message: &AgentRequest,
) -> Result<tokio::net::UnixStream, ApiError> {
    guard.send_to_agent(message).await.map_err(|e| {
        ApiError::agent(format!(
            "sandbox {}: {}",
            guard.sandbox().id,
            report::chain(&e)
        ))
    })
}

/// `POST /sandboxes/{id}/files?path=DIR`: streams the tar body to the agent.
pub(crate) async fn put(
    state: Arc<Edge>,
    guard: ActivityGuard,
    path: String,
    body: Body,
) -> Result<FilesPutResult, ApiError> {
    let mut body = body.into_data_stream();
    let idle = state.http.header_timeout;
    let stalled = || {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!("the upload stalled: no data for {idle:?}"),
        )
    };
    // Even an archive of nothing is 1 KiB of end-of-archive blocks: an empty body is a mistake
    // (a forgotten body, a client that sent none), answered before the agent is bothered.
    let first = loop {
        match tokio::time::timeout(idle, body.next()).await {
            Err(_) => return Err(stalled()),
            Ok(None) => {
                return Err(ApiError::invalid(
                    "the request body is empty: send a tar archive (even an empty archive is \
                     1024 bytes of end-of-archive blocks)",
                ))
            }
            Ok(Some(Ok(chunk))) if chunk.is_empty() => {}
            Ok(Some(chunk)) => break chunk,
        }
    };
    let mut agent = request(&guard, &AgentRequest::PutFiles { path }).await?;
    let mut first = Some(first);
    loop {
        let next = match first.take() {
            Some(chunk) => Ok(Some(chunk)),
            None => tokio::time::timeout(idle, body.next()).await,
        };
        let chunk = match next {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(_) => return Err(stalled()),
        };
        let chunk =
            chunk.map_err(|e| ApiError::invalid(format!("reading the upload failed: {e}")))?;
        state
            .metrics
            .bytes_uploaded
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        if let Err(e) = agent.write_all(&chunk).await {
            // The agent may have stopped reading because it refused an entry (its reply says),
            // or died. Either way the client is still sending: the rest of its body is read
            // and dropped after the answer (`linger`), so that it gets the answer rather than
            // a broken pipe mid-send.
            tracing::debug!("upload to agent stopped early: {e}");
            break;
        }
    }
    let _ = agent.shutdown().await;
    let reply: AgentReply = wire::read_message_async(&mut agent)
        .await
        .map_err(|e| ApiError::agent(report::chain(&AgentError::Reply(e))))?;
    match reply {
        AgentReply::Files(result) => match &result.refused {
            Some(refused) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "refused_entry",
                format!(
                    "tar entry {:?} refused: {} ({} entries before it were extracted)",
                    refused.path,
                    refused.reason,
                    result.written.len()
                ),
            )),
            None => Ok(result),
        },
        AgentReply::Error(body) => Err(agent_error(body)),
        other => Err(ApiError::agent(format!("unexpected agent reply {other:?}"))),
    }
}

/// `GET /sandboxes/{id}/files?path=FILE`: the file's bytes, streamed with their length.
pub(crate) async fn get(
    state: Arc<Edge>,
    guard: ActivityGuard,
    path: String,
) -> Result<Response, ApiError> {
    let mut agent = request(&guard, &AgentRequest::GetFile { path }).await?;
    let reply: AgentReply = wire::read_message_async(&mut agent)
        .await
        .map_err(|e| ApiError::agent(report::chain(&AgentError::Reply(e))))?;
    let (size, mode, modified) = match reply {
        AgentReply::File {
            size,
            mode,
            modified,
        } => (size, mode, modified),
        AgentReply::Error(body) => return Err(agent_error(body)),
        other => return Err(ApiError::agent(format!("unexpected agent reply {other:?}"))),
    };
    state
        .metrics
        .bytes_downloaded
        .fetch_add(size, Ordering::Relaxed);
    // The guard rides along with the body so the sandbox counts as busy until it is sent.
    let stream = ReaderStream::with_capacity(agent.take(size), DOWNLOAD_CHUNK).map(move |chunk| {
        let _busy = &guard;
        chunk
    });
    let mut response = (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response();
    let headers = response.headers_mut();
    if let Some(mode) =
        mode.and_then(|m| HeaderValue::from_str(&format!("{:04o}", m & 0o7777)).ok())
    {
        headers.insert(HeaderName::from_static("x-crucible-mode"), mode);
    }
    // `curl -R` (and any HTTP client that keeps remote times) sets the file's time from it.
    if let Some(modified) = modified
        .and_then(|s| u64::try_from(s).ok())
        .map(|s| httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s)))
        .and_then(|date| HeaderValue::from_str(&date).ok())
    {
        headers.insert(header::LAST_MODIFIED, modified);
    }
    Ok(response)
}
