//! The request extractors every handler shares: path and query parameters rejected with the
//! JSON error envelope, and the authenticated caller.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::auth::Caller;
use crate::error::ApiError;

/// `axum::extract::Path`, rejecting with the JSON error envelope (a path segment that is not
/// UTF-8, say) instead of axum's plain-text answer.
pub(crate) struct Path<T>(pub(crate) T);

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
pub(crate) struct Query<T>(pub(crate) T);

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

/// Who sent the request, as `authenticate` found it: the extractor of a handler's caller.
/// Without it (a route outside the middleware, which there is none) the request is refused
/// rather than trusted.
#[derive(Debug, Clone)]
pub(crate) struct Authenticated(pub(crate) Caller);

impl<S: Send + Sync> FromRequestParts<S> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .map(Authenticated)
            .ok_or_else(ApiError::unauthorized)
    }
}
