//! Request bodies, read whole within bounds and time.

use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::StatusCode;

use crate::config::JSON_BODY_LIMIT;
use crate::error::ApiError;

/// Reads a JSON body whole: at most [`JSON_BODY_LIMIT`] bytes (a larger declared
/// Content-Length is refused before any of it is read), all of it within `timeout`.
pub(crate) async fn read(body: Body, timeout: Duration) -> Result<Bytes, ApiError> {
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
