//! File transfer: a tar stream extracted in the guest (push), one file's bytes or a
//! directory's tar stream (pull). All streamed: nothing is buffered whole.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::io::ReaderStream;
use wire::agent::{AgentReply, AgentRequest};
use wire::{AsyncFrameReader, Direction, ErrorBody, FilesPutResult, FrameType};

use crate::edge::Edge;
use crate::error::ApiError;
use engine::agent::AgentError;
use engine::sandbox::ActivityGuard;

/// Bytes per read from the agent during a download: each chunk is one wakeup of each hop
/// (agent socket → daemon → client), so bigger chunks keep the three moving together.
const DOWNLOAD_CHUNK: usize = 256 * 1024;

/// Longest the agent may go without sending a frame of a directory's archive: a stalled
/// agent must not hold a download (and its sandbox's activity) open for ever.
const TREE_STALL: Duration = Duration::from_secs(60);

/// The media type that asks `GET …/files` for a tar stream (a directory, or one file).
pub(crate) const TAR: &str = "application/x-tar";

/// Whether an `Accept` header asks for [`TAR`].
pub(crate) fn wants_tar(accept: Option<&HeaderValue>) -> bool {
    accept.and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(',').any(|range| {
            range
                .split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case(TAR))
        })
    })
}

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
        "is_a_directory" => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "is_a_directory",
                format!(
                    "{}: ask with `Accept: {TAR}` to download it as a tar stream",
                    body.message
                ),
            )
        }
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

/// `GET /sandboxes/{id}/files?path=DIR` with `Accept: application/x-tar`: the directory (or
/// file) as a tar stream the agent writes, relayed frame by frame. The length is not known
/// ahead, so the response is chunked; when the agent cannot finish the archive (a file it
/// cannot read, a file that shrank) the response is cut short without its last chunk, which
/// every HTTP client reports as an incomplete transfer, never as a whole archive.
pub(crate) async fn get_tree(
    state: Arc<Edge>,
    guard: ActivityGuard,
    path: String,
) -> Result<Response, ApiError> {
    let mut agent = request(&guard, &AgentRequest::GetTree { path: path.clone() }).await?;
    let reply: AgentReply = wire::read_message_async(&mut agent)
        .await
        .map_err(|e| ApiError::agent(report::chain(&AgentError::Reply(e))))?;
    match reply {
        AgentReply::Tree => {}
        AgentReply::Error(body) => return Err(agent_error(body)),
        other => return Err(ApiError::agent(format!("unexpected agent reply {other:?}"))),
    }
    let relay = TreeRelay {
        frames: AsyncFrameReader::new(agent, Direction::GuestToHost),
        state,
        guard,
        path,
        done: false,
    };
    let stream = futures_util::stream::unfold(relay, |mut relay| async move {
        let next = relay.next_chunk().await.transpose()?;
        Some((next, relay))
    });
    Ok(([(header::CONTENT_TYPE, TAR)], Body::from_stream(stream)).into_response())
}

/// Reads a `get_tree` archive's frames for the response body.
struct TreeRelay {
    frames: AsyncFrameReader<tokio::net::UnixStream>,
    state: Arc<Edge>,
    /// Keeps the sandbox busy until the archive is sent.
    guard: ActivityGuard,
    path: String,
    done: bool,
}

impl TreeRelay {
    /// The archive's next bytes; `None` once it ended whole; an error ends the body.
    async fn next_chunk(&mut self) -> Result<Option<axum::body::Bytes>, std::io::Error> {
        if self.done {
            return Ok(None);
        }
        let cut = |why: String| {
            std::io::Error::other(format!(
                "sandbox {}: the archive of {} was cut short: {why}",
                self.guard.sandbox().id,
                self.path
            ))
        };
        let frame = match tokio::time::timeout(TREE_STALL, self.frames.read_frame()).await {
            Err(_) => {
                return Err(cut(format!(
                    "the agent sent nothing for {} s",
                    TREE_STALL.as_secs()
                )))
            }
            Ok(Err(e)) => return Err(cut(report::chain(&e))),
            Ok(Ok(None)) => return Err(cut("the agent closed the stream".into())),
            Ok(Ok(Some(frame))) => frame,
        };
        match frame.frame_type {
            FrameType::Stdout => {
                self.state
                    .metrics
                    .bytes_downloaded
                    .fetch_add(frame.payload.len() as u64, Ordering::Relaxed);
                Ok(Some(axum::body::Bytes::copy_from_slice(frame.payload)))
            }
            FrameType::Exit => {
                self.done = true;
                match serde_json::from_slice::<AgentReply>(frame.payload) {
                    Ok(AgentReply::TreeSent(_)) => Ok(None),
                    Ok(AgentReply::Error(body)) => Err(cut(body.message)),
                    Ok(other) => Err(cut(format!("unexpected agent reply {other:?}"))),
                    Err(e) => Err(cut(format!("an unreadable exit frame: {e}"))),
                }
            }
            other => Err(cut(format!("an unexpected {other} frame"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_accept_naming_tar_asks_for_the_archive() {
        let asks = |v: &str| wants_tar(Some(&HeaderValue::from_str(v).expect("a header")));
        assert!(asks("application/x-tar"));
        assert!(asks("text/plain, Application/X-Tar;q=0.9"));
        assert!(!asks("*/*"));
        assert!(!asks("application/octet-stream"));
        assert!(!asks("application/x-tarball"));
        assert!(!wants_tar(None));
    }
}
