//! The HTTP API as an axum `Router`, separate from the listeners so tests can drive it.

use std::sync::Arc;

use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use wire::{CreateSandbox, ExecRequest, SandboxList};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::hijack::Transport;
use crate::state::AppState;
use crate::{exec, files, ws};

/// Largest JSON body accepted (an ExecRequest is at most 1 MiB of strings).
pub const JSON_BODY_LIMIT: usize = 2 * 1024 * 1024;
/// Largest WebSocket message (and frame) accepted.
pub const WS_MESSAGE_LIMIT: usize = 8 * 1024 * 1024;

/// `axum::extract::Path`, rejecting with the JSON error envelope (a path segment that is not
/// UTF-8, say) instead of axum's plain-text answer.
struct Path<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Path(value))
            .map_err(|e| ApiError::invalid(format!("the request path {:?}: {e}", parts.uri.path())))
    }
}

/// `axum::extract::Query`, rejecting with the JSON error envelope.
struct Query<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|axum::extract::Query(value)| Query(value))
            .map_err(|e| {
                ApiError::invalid(format!(
                    "the query string {:?}: {}",
                    parts.uri.query().unwrap_or_default(),
                    e.body_text()
                ))
            })
    }
}

/// Who sent the request, as `authenticate` found it. Without it (a route outside the
/// middleware, which there is none) the request is refused rather than trusted.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(ApiError::unauthorized)
    }
}

/// The router of every endpoint.
pub fn app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/sandboxes", post(create_sandbox).get(list_sandboxes))
        .route("/sandboxes/{id}", get(get_sandbox).delete(delete_sandbox))
        .route("/sandboxes/{id}/exec", post(exec_post).get(exec_websocket))
        .route("/sandboxes/{id}/files", post(files_put).get(files_get))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(middleware::from_fn_with_state(state.clone(), limit_head))
        .with_state(state)
}

/// Holds every request to the head limits. The first request on a connection was already
/// held to them while it was read (`hijack`); later ones on a kept-alive connection are read
/// by hyper, which checks a head's size only while it is still incomplete.
async fn limit_head(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let size = request.uri().to_string().len()
        + headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>();
    if size > crate::hijack::MAX_HEAD || headers.len() > crate::hijack::MAX_HEADERS {
        state.metrics.observe_error(431);
        return crate::hijack::too_large_head().into_response();
    }
    next.run(request).await
}

/// Finds who sent the request (`ApiKeys::identify`) and hands it to the handlers as a
/// [`Caller`]; rejects requests it does not admit. Counts errors.
async fn authenticate(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    if request.uri().path() != "/healthz" {
        // The listener tags each request; one without a tag is held to TCP's rules.
        let transport = request
            .extensions()
            .get::<Transport>()
            .copied()
            .unwrap_or(Transport::Tcp);
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        match state.config.api_keys.identify(transport, presented) {
            Some(caller) => {
                request.extensions_mut().insert(caller);
            }
            None => {
                state.metrics.observe_error(401);
                return ApiError::unauthorized().into_response();
            }
        }
    }
    let response = next.run(request).await;
    if response.status().as_u16() >= 400 {
        state.metrics.observe_error(response.status().as_u16());
    }
    response
}

async fn not_found(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no endpoint {} {}", request.method(), request.uri().path()),
    )
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}

/// Parses a JSON object into `T`, answering 400 with the parser's reason. Only an object will
/// do: serde would otherwise take an array as the struct's fields in order (`[null, null]`).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    let Some(&first) = body.iter().find(|b| !b.is_ascii_whitespace()) else {
        return Err(ApiError::invalid(format!(
            "the request body must be a JSON {what}, got nothing"
        )));
    };
    if first != b'{' {
        return Err(ApiError::invalid(format!(
            "the request body must be a JSON object (a {what}), got {:?}…",
            String::from_utf8_lossy(&body[..body.len().min(16)])
        )));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the request body is not a valid {what}: {e}")))
}

/// Reads a JSON body whole: at most `JSON_BODY_LIMIT` bytes (a larger declared
/// Content-Length is refused before any of it is read), all of it within `timeout`.
async fn read_body(body: Body, timeout: Duration) -> Result<Bytes, ApiError> {
    let declared = body.size_hint().lower();
    if declared > JSON_BODY_LIMIT as u64 {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the request body declares {declared} bytes, more than the {JSON_BODY_LIMIT} \
                 byte limit"
            ),
        ));
    }
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, JSON_BODY_LIMIT)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            let e = e.into_inner();
            if e.is::<http_body_util::LengthLimitError>() {
                Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    format!("the request body is over the {JSON_BODY_LIMIT} byte limit"),
                ))
            } else {
                // Malformed chunked framing, or a client that went away mid-body.
                Err(ApiError::invalid(format!(
                    "the request body could not be read: {e}"
                )))
            }
        }
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!("the request body did not arrive within {timeout:?}"),
        )),
    }
}

async fn healthz(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "status": "ok",
        "sandboxes": state.registry.list().len(),
        "default_backend": state.default_backend(),
    }))
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(&state.registry),
    )
}

async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::document_text(),
    )
}

async fn create_sandbox(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(body, state.config.header_timeout).await?;
    let request: CreateSandbox = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSandbox::default()
    } else {
        parse_json(&body, "sandbox request")?
    };
    let creation = {
        let state = state.clone();
        async move { state.create_sandbox(request, caller.owner()).await }
    };
    let info = state
        .registry
        .spawn_creation(creation)
        .await
        .map_err(|e| ApiError::internal(format!("creating the sandbox failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

async fn list_sandboxes(State(state): State<Arc<AppState>>, caller: Caller) -> Json<SandboxList> {
    Json(SandboxList {
        sandboxes: state
            .registry
            .list_for(&caller)
            .iter()
            .map(|s| s.info())
            .collect(),
    })
}

async fn get_sandbox(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<wire::SandboxInfo>, ApiError> {
    Ok(Json(state.registry.get(&id, &caller)?.info()))
}

async fn delete_sandbox(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.registry.get(&id, &caller)?;
    if state.registry.remove(&id).await {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::no_sandbox(&id))
    }
}

#[derive(Debug, Deserialize)]
struct ExecQuery {
    stdin: Option<String>,
}

/// Whether `?stdin=` asks for an interactive session.
pub fn wants_stdin(value: Option<&str>) -> Result<bool, ApiError> {
    match value {
        None | Some("0") | Some("false") | Some("") => Ok(false),
        Some("1") | Some("true") => Ok(true),
        Some(other) => Err(ApiError::invalid(format!(
            "stdin: expected 1 or 0, got {other:?}"
        ))),
    }
}

/// Whether the client asked for Docker's `Connection: Upgrade` + `Upgrade: tcp` hijack.
fn asks_tcp_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("tcp"))
}

async fn exec_post(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<ExecQuery>,
    mut request: Request,
) -> Result<Response, ApiError> {
    let interactive = wants_stdin(query.stdin.as_deref())?;
    let sandbox = state.registry.get(&id, &caller)?;
    let upgrade = interactive && asks_tcp_upgrade(request.headers());
    let on_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
    let body = read_body(request.into_body(), state.config.header_timeout).await?;
    let exec_request: ExecRequest = parse_json(&body, "ExecRequest")?;
    exec_request
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    if interactive && on_upgrade.is_none() {
        return Err(ApiError::invalid(
            "an interactive exec (?stdin=1) must be the first request on its connection, or \
             send `Connection: Upgrade` and `Upgrade: tcp`",
        ));
    }
    let guard = sandbox.begin(true)?;
    if let Some(on_upgrade) = on_upgrade {
        tokio::spawn(async move {
            match on_upgrade.await {
                Ok(upgraded) => {
                    exec::interactive(state, guard, exec_request, TokioIo::new(upgraded)).await
                }
                Err(e) => tracing::debug!("exec upgrade failed: {e}"),
            }
        });
        return Ok((
            StatusCode::SWITCHING_PROTOCOLS,
            [
                (header::CONNECTION, "Upgrade"),
                (header::UPGRADE, "tcp"),
                (header::CONTENT_TYPE, "application/octet-stream"),
            ],
        )
            .into_response());
    }
    let stream = exec::one_shot(state, guard, exec_request);
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response())
}

async fn exec_websocket(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    let (mut parts, _body) = request.into_parts();
    let upgrade = WebSocketUpgrade::from_request_parts(&mut parts, &state)
        .await
        .map_err(|rejection| {
            let wants_websocket = parts
                .headers
                .get(header::UPGRADE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
            if wants_websocket {
                ApiError::invalid(format!("bad WebSocket handshake: {rejection}"))
            } else {
                ApiError::new(
                    StatusCode::UPGRADE_REQUIRED,
                    "upgrade_required",
                    "GET on /exec is the WebSocket transport: send a WebSocket upgrade \
                     handshake, or POST an ExecRequest for a one-shot exec",
                )
            }
        })?;
    Ok(upgrade
        .max_message_size(WS_MESSAGE_LIMIT)
        .max_frame_size(WS_MESSAGE_LIMIT)
        .on_upgrade(move |socket| ws::session(state, sandbox, socket))
        .into_response())
}

#[derive(Debug, Deserialize)]
struct FilesQuery {
    path: Option<String>,
}

async fn files_put(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<FilesQuery>,
    body: Body,
) -> Result<Json<wire::FilesPutResult>, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    let path = files::validate_path(query.path.as_deref(), "directory")?;
    let guard = sandbox.begin(false)?;
    Ok(Json(files::put(state, guard, path, body).await?))
}

async fn files_get(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<FilesQuery>,
) -> Result<Response, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    let path = files::validate_path(query.path.as_deref(), "file")?;
    let guard = sandbox.begin(false)?;
    files::get(state, guard, path).await
}
