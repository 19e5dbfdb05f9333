//! The HTTP API as an axum `Router`, separate from the listeners so tests can drive it. Built
//! once per daemon (`Server::bind`), cloned per connection.

use std::sync::Arc;

use api_types::{CreateSandbox, SandboxList};
use axum::body::Body;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;

use crate::auth::Transport;
use crate::body;
use crate::config::{MAX_HEAD, MAX_HEADERS, WS_MESSAGE_LIMIT};
use crate::edge::Edge;
use crate::error::ApiError;
use crate::extract::{Authenticated, Path, Query};
use crate::json::parse_json;
use crate::{containers, execs, files, oci_images, ws};
use engine::exec;

/// The router of every endpoint.
pub(crate) fn app(state: Arc<Edge>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/sandboxes", post(create_sandbox).get(list_sandboxes))
        .route(
            "/sandboxes/{id}",
            get(get_sandbox)
                .delete(delete_sandbox)
                .patch(update_sandbox),
        )
        .route("/sandboxes/{id}/exec", post(exec_post).get(exec_websocket))
        .route("/sandboxes/{id}/files", post(files_put).get(files_get))
        .route("/sandboxes/{id}/signal", post(signal_sandbox))
        .route("/sandboxes/{id}/execs", get(execs::list))
        .route(
            "/sandboxes/{id}/execs/{exec_id}",
            get(execs::status).delete(execs::remove),
        )
        .route(
            "/sandboxes/{id}/execs/{exec_id}/attach",
            post(execs::attach),
        )
        .route("/sandboxes/{id}/stats", get(sandbox_stats))
        .route(
            "/sandboxes/{id}/containers",
            get(containers::list).post(containers::add),
        )
        .route(
            "/sandboxes/{id}/containers/{name}",
            delete(containers::remove),
        )
        .route(
            "/sandboxes/{id}/containers/{name}/logs",
            get(containers::logs),
        )
        .route("/caches", get(list_caches).delete(clear_caches))
        .route("/caches/{name}", axum::routing::delete(delete_cache))
        .route(
            "/images",
            get(list_images).post(import_image).delete(prune_images),
        )
        .route("/images/{*name}", get(get_image).delete(delete_image))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(middleware::from_fn_with_state(state.clone(), limit_head))
        .layer(middleware::from_fn(crate::linger::linger_on_refusal))
        .with_state(state)
}

/// Holds every request to the head limits. The first request on a connection was already
/// held to them while it was read (`front_door`); later ones on a kept-alive connection are read
/// by hyper, which checks a head's size only while it is still incomplete.
async fn limit_head(State(state): State<Arc<Edge>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let size = request.uri().to_string().len()
        + headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>();
    if size > MAX_HEAD || headers.len() > MAX_HEADERS {
        state.metrics.observe_error(431);
        return ApiError::head_too_large().into_response();
    }
    next.run(request).await
}

/// Finds who sent the request (`ApiKeys::identify`) and hands it to the handlers as a
/// [`Caller`]; rejects requests it does not admit. Counts errors.
async fn authenticate(
    State(state): State<Arc<Edge>>,
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
        match state.keys.identify(transport, presented) {
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

async fn healthz(State(state): State<Arc<Edge>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "status": "ok",
        "sandboxes": state.registry.list().len(),
        "default_backend": state.default_backend(),
    }))
}

async fn metrics(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], {
        let mut text = state.metrics.render(&state.registry, &caller);
        state.pool.render_metrics(&mut text);
        text
    })
}

async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::document_text(),
    )
}

async fn create_sandbox(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    body: Body,
) -> Result<Response, ApiError> {
    let body = body::read(body, state.http.header_timeout).await?;
    let request: CreateSandbox = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSandbox::default()
    } else {
        parse_json(&body, "sandbox request")?
    };
    if request.network_namespace.is_some() && !caller.sees_all() {
        // A path on the host: another tenant's pod's namespace would be one to name.
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "network_namespace: only the admin key or the daemon's Unix socket may have a \
             sandbox join a host network namespace",
        ));
    }
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

async fn list_sandboxes(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
) -> Json<SandboxList> {
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
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
) -> Result<Json<api_types::SandboxInfo>, ApiError> {
    Ok(Json(state.registry.get(&id, &caller)?.info()))
}

/// `PATCH /sandboxes/{id}`: new memory and CPU limits for a running sandbox.
async fn update_sandbox(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
    body: Body,
) -> Result<Json<api_types::SandboxInfo>, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    let body = body::read(body, state.http.header_timeout).await?;
    let request: api_types::UpdateSandbox = parse_json(&body, "update request")?;
    Ok(Json(state.update_sandbox(&sandbox, &request).await?))
}

async fn delete_sandbox(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.registry.get(&id, &caller)?;
    if state.registry.remove(&id).await {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(engine::sandbox::SandboxError::NotFound(id).into())
    }
}

/// `POST /sandboxes/{id}/signal {"signal": N}`: signal N to every process of the sandbox but
/// its agents (what `docker kill -s` and containerd's task kill need), or with `"exec_id"` to
/// that running command's process group only; with `?container=NAME`, within that container
/// (every process of it but its agent, or its command `exec_id`: `main` is its main process).
async fn signal_sandbox(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
    Query(query): Query<containers::ContainerQuery>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    let container = sandbox.container_named(query.container.as_deref())?;
    let body = body::read(body, state.http.header_timeout).await?;
    let request: api_types::SignalRequest = parse_json(&body, "signal request")?;
    if !(1..=64).contains(&request.signal) {
        return Err(ApiError::invalid(format!(
            "signal: must be 1 to 64, got {}",
            request.signal
        )));
    }
    if let Some(exec_id) = &request.exec_id {
        if !wire::valid_exec_id(exec_id) {
            return Err(ApiError::invalid(format!(
                "exec_id: {:?} is not 1 to {} letters, digits, '.', '_' or '-'",
                exec_id.escape_debug().to_string(),
                wire::MAX_EXEC_ID
            )));
        }
    }
    let _guard = sandbox.begin(false)?;
    let message = wire::agent::AgentRequest::Signal {
        signal: request.signal,
        exec_id: request.exec_id.clone(),
    };
    let (reply, _) = sandbox
        .ask_agent_in(container.as_deref(), &message)
        .await
        .map_err(|e| ApiError::agent(format!("sandbox {id}: {}", report::chain(&e))))?;
    match reply {
        wire::agent::AgentReply::Signaled => Ok(StatusCode::NO_CONTENT),
        // The sandbox exists: what is missing is the command, as the exec endpoints say it.
        wire::agent::AgentReply::Error(e) if e.code == "not_found" => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "exec_not_found",
            format!("sandbox {id}: {}", e.message),
        )),
        wire::agent::AgentReply::Error(e) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_supported",
            format!("sandbox {id}: {}", e.message),
        )),
        other => Err(ApiError::agent(format!(
            "sandbox {id}: unexpected agent reply {other:?}"
        ))),
    }
}

/// `GET /sandboxes/{id}/stats[?container=NAME]`: memory, CPU and processes, from the
/// sandbox's cgroups, or one container's share from its processes.
async fn sandbox_stats(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
    Query(query): Query<containers::ContainerQuery>,
) -> Result<Json<wire::SandboxStats>, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    let stats = match sandbox.container_named(query.container.as_deref())? {
        Some(container) => sandbox.container_stats(&container).await,
        None => sandbox.stats().await,
    };
    match stats {
        Some(stats) => Ok(Json(stats)),
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_supported",
            format!(
                "sandbox {id}: no stats: the {} backend does not report them, or its agent did \
                 not answer",
                sandbox.backend()
            ),
        )),
    }
}

async fn list_caches(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
) -> Result<Json<api_types::CacheList>, ApiError> {
    let owner = (!caller.sees_all()).then(|| caller.owner());
    let caches = state.storage()?.caches.list(owner.as_ref())?;
    Ok(Json(api_types::CacheList { caches }))
}

/// Removes every cache of the caller's that no sandbox uses; answers with those it kept.
async fn clear_caches(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
) -> Result<Json<api_types::CacheList>, ApiError> {
    let owner = caller.owner();
    let store = &state.storage()?.caches;
    let mut kept = Vec::new();
    for cache in store.list(Some(&owner))? {
        match store.remove(&owner, &cache.name).await {
            Ok(()) => {}
            Err(engine::storage::StorageError::CacheBusy { by, .. }) => {
                kept.push(api_types::CacheInfo {
                    in_use_by: Some(by),
                    ..cache
                })
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Json(api_types::CacheList { caches: kept }))
}

async fn delete_cache(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    state
        .storage()?
        .caches
        .remove(&caller.owner(), &name)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_images(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
) -> Result<Json<api_types::ImageList>, ApiError> {
    let owner = (!caller.sees_all()).then(|| caller.owner());
    let records = state.storage()?.images.list(owner.as_ref())?;
    let images = std::iter::once(oci_images::builtin())
        .chain(records.iter().map(oci_images::info))
        .collect();
    Ok(Json(api_types::ImageList { images }))
}

#[derive(Debug, Deserialize)]
struct ImportQuery {
    name: Option<String>,
}

async fn import_image(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Query(query): Query<ImportQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let name = query
        .name
        .ok_or_else(|| ApiError::invalid("name: missing (POST /images?name=NAME)"))?;
    let info = oci_images::import(state, caller.owner(), name, body).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

/// Longest idle time a prune may ask for: ten years (anything longer prunes nothing).
const MAX_PRUNE_IDLE_S: u64 = 10 * 365 * 86_400;
/// Longest name prefix a prune may give: an image name's longest.
const MAX_PRUNE_PREFIX: usize = 128;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PruneQuery {
    /// Only images not taken or released by a sandbox (nor imported) for this long.
    #[serde(default)]
    unused_for_s: u64,
    /// Only images whose name starts with this (`containerd-` for the shim's).
    #[serde(default)]
    prefix: String,
}

/// `DELETE /images`: removes the caller's images that no sandbox uses (`docker image prune
/// -a`), narrowed by `unused_for_s` and `prefix`; says which, and what that gave back.
async fn prune_images(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Query(query): Query<PruneQuery>,
) -> Result<Json<api_types::ImagesPruned>, ApiError> {
    if query.unused_for_s > MAX_PRUNE_IDLE_S {
        return Err(ApiError::invalid(format!(
            "unused_for_s: at most {MAX_PRUNE_IDLE_S} (ten years), got {}",
            query.unused_for_s
        )));
    }
    if query.prefix.len() > MAX_PRUNE_PREFIX {
        return Err(ApiError::invalid(format!(
            "prefix: at most {MAX_PRUNE_PREFIX} bytes (an image name's length), got {}",
            query.prefix.len()
        )));
    }
    let unused_for = std::time::Duration::from_secs(query.unused_for_s);
    let pruned = state
        .storage()?
        .images
        .prune(&caller.owner(), &query.prefix, unused_for)
        .await?;
    Ok(Json(pruned))
}

async fn get_image(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(name): Path<String>,
) -> Result<Json<api_types::ImageInfo>, ApiError> {
    if name == engine::storage::DEFAULT_IMAGE {
        return Ok(Json(oci_images::builtin()));
    }
    let record = state.storage()?.images.get(&caller.owner(), &name)?;
    Ok(Json(oci_images::info(&record)))
}

async fn delete_image(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    if name == engine::storage::DEFAULT_IMAGE {
        return Err(ApiError::conflict("the built-in image cannot be removed"));
    }
    state.storage()?.images.remove(&caller.owner(), &name)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct ExecQuery {
    stdin: Option<String>,
    container: Option<String>,
}

async fn exec_post(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
    Query(query): Query<ExecQuery>,
    mut request: Request,
) -> Result<Response, ApiError> {
    let interactive = exec::wants_stdin(query.stdin.as_deref())?;
    let sandbox = state.registry.get(&id, &caller)?;
    let upgrade = interactive && crate::raw_stream::asks_tcp_upgrade(request.headers());
    let on_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
    if interactive && on_upgrade.is_none() {
        return Err(ApiError::invalid(
            "an interactive exec (?stdin=1) must be the first request on its connection, or \
             send `Connection: Upgrade` and `Upgrade: tcp`",
        ));
    }
    let body = body::read(request.into_body(), state.http.header_timeout).await?;
    let request = crate::json::parse_exec_request(&body)?;
    let session = exec::admit(
        &state.metrics,
        &sandbox,
        request,
        interactive,
        query.container.as_deref(),
    )
    .await?;
    if let Some(on_upgrade) = on_upgrade {
        return Ok(execs::upgraded_session(on_upgrade, session, &[]));
    }
    // Pulled by hyper: a slow client slows the agent (backpressure), and a client that goes
    // away drops the session (the command runs on detached, or is killed with
    // `on_disconnect: kill`).
    Ok(execs::frame_stream_response(session, &[]))
}

async fn exec_websocket(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
    Query(query): Query<containers::ContainerQuery>,
    request: Request,
) -> Result<Response, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    // Refused before the upgrade, as an HTTP error, rather than as a close code after it.
    sandbox.container_named(query.container.as_deref())?;
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
        .on_upgrade(move |socket| ws::session(state, sandbox, query.container, socket))
        .into_response())
}

#[derive(Debug, Deserialize)]
struct FilesQuery {
    path: Option<String>,
    container: Option<String>,
}

async fn files_put(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
    Query(query): Query<FilesQuery>,
    body: Body,
) -> Result<Json<wire::FilesPutResult>, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    let path = files::validate_path(query.path.as_deref(), "directory")?;
    let container = sandbox.container_named(query.container.as_deref())?;
    let guard = sandbox.begin_in(false, container)?;
    Ok(Json(files::put(state, guard, path, body).await?))
}

async fn files_get(
    State(state): State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
    Query(query): Query<FilesQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    let path = files::validate_path(query.path.as_deref(), "file")?;
    let container = sandbox.container_named(query.container.as_deref())?;
    let guard = sandbox.begin_in(false, container)?;
    if files::wants_tar(headers.get(header::ACCEPT)) {
        return files::get_tree(state, guard, path).await;
    }
    files::get(state, guard, path).await
}
