//! The one error type of the HTTP layer: a status, a stable code and a message, always sent as
//! the JSON envelope `{"code": …, "message": …}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use wire::ErrorBody;

/// An API failure as the client sees it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// What failed, and on which input.
    pub message: String,
}

impl ApiError {
    /// An error with an explicit status and code.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400: the request is malformed or fails validation.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// 404: no sandbox with this id.
    pub fn no_sandbox(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no sandbox with id {id:?}"),
        )
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or invalid API key: send `Authorization: Bearer <key>`",
        )
    }

    /// 409: the sandbox cannot take this request in its current state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// 429: a limit was reached.
    pub fn too_many(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "too_many_requests", message)
    }

    /// 500: the daemon failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// 503: the daemon is stopping and creates no more sandboxes.
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the daemon is shutting down",
        )
    }

    /// 502: the sandbox's agent failed or could not be reached.
    pub fn agent(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "agent_error", message)
    }

    /// The JSON envelope.
    pub fn body(&self) -> ErrorBody {
        ErrorBody::new(self.code, self.message.clone())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}
