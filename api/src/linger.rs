//! A refused request's unread body is read and dropped after the answer (nginx's lingering
//! close).
//!
//! A client uploading a tar to a sandbox that does not exist, or with a bad key, is answered
//! before its body has been read. Were the body then dropped, the connection would close under
//! a client still sending: it would see a broken pipe or a reset mid-send, not the 404 or 401
//! the daemon wrote. So every request body goes to its handler through [`linger_on_refusal`],
//! which keeps hold of it: when the answer is an error and the handler let go of a body it had
//! not read to its end, the rest is read and dropped in the background for up to [`LINGER`]
//! and [`LINGER_BYTES`] while the answer goes out, and the connection may even serve the
//! client's next request.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};

/// How long the rest of a refused body is read.
pub(crate) const LINGER: Duration = Duration::from_secs(2);
/// How much of it, at most: a client that declared more will not finish sending anyway.
pub(crate) const LINGER_BYTES: u64 = 64 * 1024 * 1024;

/// The request body, shared by the handler's view of it and this layer.
struct Shared {
    body: Mutex<Option<Body>>,
}

/// What the handler reads: the body, frame by frame, through the shared slot.
struct HandlerBody(Arc<Shared>);

impl HttpBody for HandlerBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let Ok(mut slot) = self.0.body.lock() else {
            return Poll::Ready(Some(Err(axum::Error::new(
                "the request body's lock was poisoned",
            ))));
        };
        match slot.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0
            .body
            .lock()
            .map(|slot| slot.as_ref().is_none_or(HttpBody::is_end_stream))
            .unwrap_or(true)
    }

    fn size_hint(&self) -> SizeHint {
        self.0
            .body
            .lock()
            .ok()
            .and_then(|slot| slot.as_ref().map(HttpBody::size_hint))
            .unwrap_or_default()
    }
}

/// The layer: hands the handler the body through a shared slot, and drains what is left of it
/// after an error answer (see the module's documentation).
pub(crate) async fn linger_on_refusal(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    if body.is_end_stream() {
        // No body (every GET): nothing to linger over, nothing to wrap.
        return next.run(Request::from_parts(parts, body)).await;
    }
    let shared = Arc::new(Shared {
        body: Mutex::new(Some(body)),
    });
    let handler_body = Body::new(HandlerBody(Arc::clone(&shared)));
    let response = next.run(Request::from_parts(parts, handler_body)).await;
    let refused = response.status().is_client_error() || response.status().is_server_error();
    // Only a body nobody else holds: taking it from under a reader would end its stream early.
    if refused {
        if let Ok(shared) = Arc::try_unwrap(shared) {
            if let Ok(Some(rest)) = shared.body.into_inner() {
                if !rest.is_end_stream() && rest.size_hint().lower() <= LINGER_BYTES {
                    tokio::spawn(drain(rest));
                }
            }
        }
    }
    response
}

/// Reads and drops `body` for at most [`LINGER`] and [`LINGER_BYTES`].
async fn drain(mut body: Body) {
    let read = async {
        let mut drained = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                drained += data.len() as u64;
                if drained > LINGER_BYTES {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, read).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use axum::routing::post;
    use axum::Router;
    use tower::ServiceExt;

    fn app() -> Router {
        Router::new()
            .route(
                "/read",
                post(|body: Body| async move {
                    let bytes = axum::body::to_bytes(body, usize::MAX)
                        .await
                        .map_err(|_| StatusCode::BAD_REQUEST)?;
                    Ok::<_, StatusCode>(bytes.len().to_string())
                }),
            )
            .route("/refuse", post(|| async { StatusCode::NOT_FOUND }))
            .layer(axum::middleware::from_fn(linger_on_refusal))
    }

    #[tokio::test]
    async fn a_handler_reads_the_whole_body_through_the_layer() {
        let body = Body::from(vec![7u8; 300_000]);
        let response = app()
            .oneshot(Request::post("/read").body(body).expect("a request"))
            .await
            .expect("an answer");
        assert_eq!(response.status(), StatusCode::OK);
        let text = axum::body::to_bytes(response.into_body(), 100)
            .await
            .expect("the answer's body");
        assert_eq!(&text[..], b"300000");
    }

    #[tokio::test]
    async fn a_refused_body_is_read_to_its_end_after_the_answer() {
        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let body = Body::from_stream(tokio_stream_of(receiver));
        let response = app()
            .oneshot(Request::post("/refuse").body(body).expect("a request"))
            .await
            .expect("an answer");
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        // The answer came before the body was sent; the layer still reads it all.
        for _ in 0..8 {
            tokio::time::timeout(
                Duration::from_secs(1),
                sender.send(Ok(Bytes::from(vec![1; 1000]))),
            )
            .await
            .expect("the body is read after the refusal")
            .expect("the reader is there");
        }
    }

    fn tokio_stream_of(
        mut receiver: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    ) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
        futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
    }
}
