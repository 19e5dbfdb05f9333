//! The one error type of the HTTP layer: a status, a stable code and a message, always sent as
//! the JSON envelope `{"code": …, "message": …}`. The domain's errors become it here, at the
//! edge, and nowhere else.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use wire::ErrorBody;

use crate::config::{MAX_HEAD, MAX_HEADERS};
use crate::json::InvalidJson;
use engine::backend::BackendError;
use engine::exec::AdmitError;
use engine::sandbox::{AddContainerError, SandboxError, UpdateError};
use engine::state::CreateError;
use engine::storage::StorageError;

/// An API failure as the client sees it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub(crate) code: &'static str,
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
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// 431: the request head is over the limits.
    pub(crate) fn head_too_large() -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!("the request head exceeds {MAX_HEAD} bytes or {MAX_HEADERS} headers"),
        )
    }

    /// 503: the daemon holds as many connections as it may.
    pub(crate) fn too_many_connections(limit: usize) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_connections",
            format!("the daemon holds {limit} connections, its limit; retry later"),
        )
    }

    /// 401: missing or wrong API key.
    pub(crate) fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or invalid API key: send `Authorization: Bearer <key>`",
        )
    }

    /// 409: the sandbox cannot take this request in its current state.
    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// 429: a limit was reached.
    pub(crate) fn too_many(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "too_many_requests", message)
    }

    /// 500: the daemon failed.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
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

impl From<InvalidJson> for ApiError {
    fn from(e: InvalidJson) -> Self {
        ApiError::invalid(e.to_string())
    }
}

impl From<SandboxError> for ApiError {
    fn from(e: SandboxError) -> Self {
        let message = e.to_string();
        match e {
            SandboxError::InvalidId(_) => ApiError::invalid(message),
            SandboxError::NotFound(_) => Self::new(StatusCode::NOT_FOUND, "not_found", message),
            SandboxError::Dead { .. } | SandboxError::NotRunning { .. } => {
                ApiError::conflict(message)
            }
            SandboxError::ExecLimit { .. } | SandboxError::AtCapacity(_) => {
                ApiError::too_many(message)
            }
            SandboxError::ShuttingDown => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", message)
            }
            SandboxError::NoContainer { .. } => {
                Self::new(StatusCode::NOT_FOUND, "container_not_found", message)
            }
            SandboxError::OwnRootNotRemovable => Self::invalid(message),
        }
    }
}

impl From<UpdateError> for ApiError {
    fn from(e: UpdateError) -> Self {
        let message = report::chain(&e);
        match e {
            UpdateError::Invalid(_) => ApiError::invalid(message),
            UpdateError::Refused { .. } => ApiError::conflict(message),
        }
    }
}

impl From<AddContainerError> for ApiError {
    fn from(e: AddContainerError) -> Self {
        let message = report::chain(&e);
        match e {
            AddContainerError::Invalid(_) => ApiError::invalid(message),
            AddContainerError::Sandbox(e) => e.into(),
            AddContainerError::Storage(e) => e.into(),
            AddContainerError::NotRunning(_)
            | AddContainerError::Exists { .. }
            | AddContainerError::Full { .. }
            | AddContainerError::NoSlot { .. } => ApiError::conflict(message),
            AddContainerError::NotReady { .. } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "container_not_ready",
                message,
            ),
            AddContainerError::Failed { .. } => ApiError::internal(message),
        }
    }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> Self {
        let message = report::chain(&e);
        match e {
            StorageError::Invalid(_) | StorageError::NoVolume { .. } => ApiError::invalid(message),
            StorageError::NoCache(_) => Self::new(StatusCode::NOT_FOUND, "not_found", message),
            StorageError::CacheBusy { .. } => ApiError::conflict(message),
            StorageError::OverBudget { .. } => Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                message,
            ),
            StorageError::Io { .. } => ApiError::internal(message),
            StorageError::Image(e) => image_error(&e, message),
        }
    }
}

/// An image store failure: 404 for a missing image, 409 for one in use, 413 past a limit, 400
/// for an archive that is not a usable image (malformed, hostile, another platform).
fn image_error(e: &oci::StoreError, message: String) -> ApiError {
    match e {
        oci::StoreError::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, "not_found", message),
        oci::StoreError::InUse { .. } => ApiError::conflict(message),
        e if e.is_too_large() => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "image_too_large",
            format!("{message} (crucible serve --image-max-mib raises the limit)"),
        ),
        e if e.is_bad_input() => ApiError::new(StatusCode::BAD_REQUEST, "invalid_image", message),
        _ => ApiError::internal(message),
    }
}

impl From<AdmitError> for ApiError {
    fn from(e: AdmitError) -> Self {
        match e {
            AdmitError::Invalid(message) => ApiError::invalid(message),
            AdmitError::Sandbox(e) => e.into(),
        }
    }
}

impl From<CreateError> for ApiError {
    fn from(e: CreateError) -> Self {
        match e {
            CreateError::Invalid(message) => ApiError::invalid(message),
            CreateError::Sandbox(e) => e.into(),
            CreateError::Storage(e) => e.into(),
            CreateError::EgressForbidden(_) => {
                Self::new(StatusCode::FORBIDDEN, "egress_not_allowed", e.to_string())
            }
            CreateError::Unavailable(e) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "backend_unavailable",
                e.to_string(),
            ),
            CreateError::ContainerNotReady { .. } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "container_not_ready",
                e.to_string(),
            ),
            CreateError::PodNetwork { .. } => ApiError::internal(report::chain(&e)),
            CreateError::Failed {
                source: BackendError::Exhausted(_),
                ..
            } => ApiError::too_many(report::chain(&e)),
            CreateError::Failed { .. } => ApiError::internal(report::chain(&e)),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}
