//! A sandbox's containers: their list, and each one's log (its main process's output, kept
//! by the daemon, readable after the process has exited).

use std::sync::Arc;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use crate::edge::Edge;
use crate::error::ApiError;
use crate::extract::{Authenticated, Path};

/// `?container=NAME` on the routes that act in one of a sandbox's containers.
#[derive(Debug, Deserialize)]
pub(crate) struct ContainerQuery {
    pub(crate) container: Option<String>,
}

/// `GET /sandboxes/{id}/containers`.
pub(crate) async fn list(
    axum::extract::State(state): axum::extract::State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
) -> Result<Json<api_types::ContainerList>, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    Ok(Json(api_types::ContainerList {
        containers: sandbox.containers().iter().map(|c| c.info()).collect(),
    }))
}

/// `POST /sandboxes/{id}/containers`: a container added to the running sandbox, answered
/// once it is ready (201, its view).
pub(crate) async fn add(
    axum::extract::State(state): axum::extract::State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    let body = crate::body::read(body, state.http.header_timeout).await?;
    let request: api_types::ContainerRequest = crate::json::parse_json(&body, "container")?;
    if !request.host_paths.is_empty() && !caller.sees_all() {
        // A host directory is the host's, whoever owns the sandbox.
        return Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "forbidden",
            "host_paths: only the admin key or the daemon's Unix socket may mount a host \
             directory into a container",
        ));
    }
    // Carried to its end even if the client goes: a container half made would be lost.
    let addition = {
        let state = state.clone();
        async move { state.add_container(&sandbox, &request).await }
    };
    let info = state
        .registry
        .spawn_creation(addition)
        .await
        .map_err(|e| ApiError::internal(format!("adding the container failed: {e}")))??;
    Ok((axum::http::StatusCode::CREATED, Json(info)).into_response())
}

/// `DELETE /sandboxes/{id}/containers/{name}`: the container ends, with every process in it.
pub(crate) async fn remove(
    axum::extract::State(state): axum::extract::State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path((id, name)): Path<(String, String)>,
) -> Result<axum::http::StatusCode, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    sandbox.remove_container(&name).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// `GET /sandboxes/{id}/containers/{name}/logs`: the kept output of the container's main
/// process as an exec frame stream (stdout and stderr frames; its exit frame once it has
/// exited for good).
pub(crate) async fn logs(
    axum::extract::State(state): axum::extract::State<Arc<Edge>>,
    Authenticated(caller): Authenticated,
    Path((id, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let sandbox = state.registry.get(&id, &caller)?;
    let container = sandbox
        .container_named(Some(&name))?
        .ok_or_else(|| ApiError::invalid("the sandbox's own root (main) has no main process, so no log: run commands with POST …/exec"))?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from(container.log_frames()),
    )
        .into_response())
}
