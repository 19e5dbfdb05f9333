//! Finding a command again: `GET /sandboxes/{id}/execs` (the commands that can be found),
//! `GET …/execs/{exec_id}` (one), `POST …/execs/{exec_id}/attach?offset=N` (its frame
//! stream from output byte N: what the agent kept, then live, then its one exit frame), and
//! `DELETE …/execs/{exec_id}` (ending one and forgetting it). Also the response every frame
//! stream shares, with the `X-Crucible-Exec-Id` header.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use crate::edge::Edge;
use crate::error::ApiError;
use crate::extract::{Authenticated, Path, Query};
use engine::exec::{self, FindError};

/// The response header naming a frame stream's command: its `exec_id`, given or generated.
pub(crate) const EXEC_ID_HEADER: &str = "x-crucible-exec-id";

/// A 200 whose body is `session`'s frame stream, pulled by hyper: a slow client slows the
/// agent (backpressure), and a client that goes away drops the session. `extra` headers go
/// beside the content type and the exec id.
pub(crate) fn frame_stream_response(
    session: exec::Session,
    extra: &[(&'static str, String)],
) -> Response {
    let exec_id = HeaderValue::from_str(session.exec_id()).ok();
    let output = futures_util::stream::unfold(session, |mut session| async move {
        let frames = session.next_output().await?;
        Some((Ok::<_, std::convert::Infallible>(frames), session))
    });
    let mut response = (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(output),
    )
        .into_response();
    let headers = response.headers_mut();
    if let Some(exec_id) = exec_id {
        headers.insert(HeaderName::from_static(EXEC_ID_HEADER), exec_id);
    }
    for (name, value) in extra {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    response
}

impl From<FindError> for ApiError {
    fn from(e: FindError) -> Self {
        let message = report::chain(&e);
        match e {
            FindError::InvalidId(_) | FindError::Invalid { .. } => ApiError::invalid(message),
            FindError::Sandbox(e) => e.into(),
            FindError::NotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "exec_not_found", message)
            }
            FindError::Conflict { .. } => ApiError::conflict(message),
            FindError::Agent { .. } => ApiError::agent(message),
        }
    }
}

/// `GET /sandboxes/{id}/execs`.
pub(crate) async fn list(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
    Query(query): Query<crate::containers::ContainerQuery>,
) -> Result<Json<wire::ExecList>, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    let execs = exec::statuses(&sandbox, None, query.container.as_deref()).await?;
    Ok(Json(wire::ExecList { execs }))
}

/// `GET /sandboxes/{id}/execs/{exec_id}`.
pub(crate) async fn status(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path((id, exec_id)): Path<(String, String)>,
    Query(query): Query<crate::containers::ContainerQuery>,
) -> Result<Json<wire::ExecStatus>, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    let mut found = exec::statuses(&sandbox, Some(&exec_id), query.container.as_deref()).await?;
    found.pop().map(Json).ok_or_else(|| {
        FindError::NotFound {
            sandbox: id,
            message: format!("no command has exec_id {exec_id:?}"),
        }
        .into()
    })
}

/// `DELETE /sandboxes/{id}/execs/{exec_id}`: ends the command (SIGKILL to its process
/// group) and forgets it, or forgets an ended one's uncollected result.
pub(crate) async fn remove(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path((id, exec_id)): Path<(String, String)>,
    Query(query): Query<crate::containers::ContainerQuery>,
) -> Result<StatusCode, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    exec::end(&sandbox, &exec_id, query.container.as_deref()).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
pub(crate) struct AttachQuery {
    /// The output bytes the client already has.
    #[serde(default)]
    offset: u64,
    /// `1`: an interactive re-attach, its stdin carried on (`Upgrade: tcp` here; the
    /// front door hijacks the bare form).
    stdin: Option<String>,
    /// The container the command runs in.
    container: Option<String>,
}

/// The headers that say where a re-attached stream starts: the command's output so far, the
/// oldest byte kept, and an interactive command's stdin bytes taken (and whether it was
/// closed).
pub(crate) fn position_headers(status: &wire::ExecStatus) -> Vec<(&'static str, String)> {
    let mut headers = vec![
        ("x-crucible-output-bytes", status.output_bytes.to_string()),
        (
            "x-crucible-output-kept-from",
            status.output_kept_from.to_string(),
        ),
    ];
    if let Some(taken) = status.stdin_bytes {
        headers.push(("x-crucible-stdin-bytes", taken.to_string()));
        headers.push(("x-crucible-stdin-closed", status.stdin_closed.to_string()));
    }
    headers
}

/// `POST /sandboxes/{id}/execs/{exec_id}/attach?offset=N[&stdin=1]`.
pub(crate) async fn attach(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path((id, exec_id)): Path<(String, String)>,
    Query(query): Query<AttachQuery>,
    mut request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let interactive = exec::wants_stdin(query.stdin.as_deref())?;
    let on_upgrade = (interactive && crate::raw_stream::asks_tcp_upgrade(request.headers()))
        .then(|| hyper::upgrade::on(&mut request));
    if interactive && on_upgrade.is_none() {
        return Err(ApiError::invalid(
            "an interactive attach (?stdin=1) must be the first request on its connection, \
             or send `Connection: Upgrade` and `Upgrade: tcp`",
        ));
    }
    let sandbox = state.registry.get(&id, &caller)?;
    let (status, session) = exec::attach(
        &state.metrics,
        &sandbox,
        &exec_id,
        query.offset,
        interactive,
        query.container.as_deref(),
    )
    .await?;
    let positions = position_headers(&status);
    let Some(on_upgrade) = on_upgrade else {
        return Ok(frame_stream_response(session, &positions));
    };
    Ok(upgraded_session(on_upgrade, session, &positions))
}

/// Docker's `Upgrade: tcp` hijack of an interactive session: the `101 Switching Protocols`,
/// naming the command (and `extra` headers), and the session pumped over the upgraded
/// connection once hyper hands it over.
pub(crate) fn upgraded_session(
    on_upgrade: hyper::upgrade::OnUpgrade,
    session: exec::Session,
    extra: &[(&'static str, String)],
) -> Response {
    let exec_id = session.exec_id().to_string();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let (reader, writer) = tokio::io::split(hyper_util::rt::TokioIo::new(upgraded));
                exec::pump(
                    session,
                    crate::raw_stream::RawReader::new(reader),
                    crate::raw_stream::RawWriter(writer),
                )
                .await;
            }
            Err(e) => tracing::debug!("exec upgrade failed: {e}"),
        }
    });
    let mut response = (
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::CONNECTION, "Upgrade"),
            (header::UPGRADE, "tcp"),
            (header::CONTENT_TYPE, "application/octet-stream"),
        ],
    )
        .into_response();
    let headers = response.headers_mut();
    if let Ok(exec_id) = HeaderValue::from_str(&exec_id) {
        headers.insert(HeaderName::from_static(EXEC_ID_HEADER), exec_id);
    }
    for (name, value) in extra {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    response
}

/// The bare `200` head of a hijacked interactive session (the front door's), naming the
/// command and `extra` headers; the connection carries frames after it.
pub(crate) fn hijack_head(exec_id: &str, extra: &[(&'static str, String)]) -> String {
    // The exec id is `[A-Za-z0-9._-]` only (validated, or generated): safe in a header.
    let mut head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n{EXEC_ID_HEADER}: \
         {exec_id}\r\n"
    );
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head
}
