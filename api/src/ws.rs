//! Interactive exec over WebSocket (`GET /sandboxes/{id}/exec` + upgrade): the first client
//! message is the JSON ExecRequest; after it, binary message payloads in each direction,
//! concatenated, are exactly the frame stream of the hijacked transport.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use wire::ExecRequest;

use crate::exec;
use crate::relay::{failure_frame, RelayEnd, ResponseRelay};
use crate::sandbox::Sandbox;
use crate::state::AppState;

/// How long a client has to send its ExecRequest after the upgrade, by default
/// (`ServeConfig::first_message_timeout`).
pub const FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Close codes used by the session.
mod close {
    pub const NORMAL: u16 = 1000;
    pub const PROTOCOL: u16 = 1002;
    pub const INVALID_PAYLOAD: u16 = 1007;
    pub const POLICY: u16 = 1008;
    pub const TOO_BIG: u16 = 1009;
    pub const INTERNAL: u16 = 1011;
    pub const TRY_AGAIN_LATER: u16 = 1013;
}

/// A close frame; the reason is cut to the 123 bytes a close frame can carry.
fn close_frame(code: u16, reason: &str) -> Message {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    Message::Close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from(&reason[..end]),
    }))
}

async fn close_with(mut socket: WebSocket, code: u16, reason: &str) {
    let _ = socket.send(close_frame(code, reason)).await;
}

/// The close code and reason for a receive error that the client caused (RFC 6455 §7.4.1):
/// 1002 for a protocol violation (bad opcode, unmasked or fragmented control frame, …), 1007
/// for a text message that is not UTF-8, 1009 for a message over the size limit. `None` when
/// the connection itself is gone, and there is nobody to tell.
fn receive_error(error: axum::Error) -> Option<(u16, String)> {
    use tungstenite::error::ProtocolError;
    let inner = error.into_inner();
    let error = inner.downcast_ref::<tungstenite::Error>()?;
    let code = match error {
        tungstenite::Error::Protocol(ProtocolError::ResetWithoutClosingHandshake) => return None,
        tungstenite::Error::Protocol(_) => close::PROTOCOL,
        tungstenite::Error::Utf8(_) => close::INVALID_PAYLOAD,
        tungstenite::Error::Capacity(_) => close::TOO_BIG,
        _ => return None,
    };
    Some((code, error.to_string()))
}

/// Reads the first message: the ExecRequest, as text or binary. The error is the close frame
/// to answer with, if any.
async fn first_request(
    socket: &mut WebSocket,
    timeout: Duration,
) -> Result<ExecRequest, Option<(u16, String)>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let message = match tokio::time::timeout_at(deadline, socket.recv()).await {
            Err(_) => {
                return Err(Some((
                    close::POLICY,
                    format!("no ExecRequest within {timeout:?}"),
                )))
            }
            Ok(None) => return Err(None),
            Ok(Some(Err(e))) => return Err(receive_error(e)),
            Ok(Some(Ok(message))) => message,
        };
        let bytes = match message {
            Message::Text(text) => text.as_bytes().to_vec(),
            Message::Binary(bytes) => bytes.to_vec(),
            Message::Close(_) => return Err(None),
            Message::Ping(_) | Message::Pong(_) => continue,
        };
        let request: ExecRequest = crate::routes::parse_json(&bytes, "ExecRequest")
            .map_err(|e| Some((close::POLICY, format!("the first message: {}", e.message))))?;
        request
            .validate()
            .map_err(|e| Some((close::POLICY, e.to_string())))?;
        return Ok(request);
    }
}

/// Runs one WebSocket exec session.
pub async fn session(state: Arc<AppState>, sandbox: Arc<Sandbox>, mut socket: WebSocket) {
    let request = match first_request(&mut socket, state.config.first_message_timeout).await {
        Ok(request) => request,
        Err(Some((code, reason))) => return close_with(socket, code, &reason).await,
        Err(None) => return,
    };
    let guard = match sandbox.begin(true) {
        Ok(guard) => guard,
        Err(e) if e.status == axum::http::StatusCode::TOO_MANY_REQUESTS => {
            return close_with(socket, close::TRY_AGAIN_LATER, &e.message).await
        }
        Err(e) => return close_with(socket, close::INTERNAL, &e.message).await,
    };
    state
        .metrics
        .execs_started
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let agent = match exec::open(&guard, &request, true).await {
        Ok(agent) => agent,
        Err(reason) => return close_with(socket, close::INTERNAL, &reason).await,
    };
    let (agent_read, mut agent_write) = agent.into_split();
    let mut relay = ResponseRelay::new(agent_read);
    let (mut sink, mut stream) = socket.split();

    let input = async {
        while let Some(message) = stream.next().await {
            let message = match message {
                Ok(message) => message,
                Err(e) => return receive_error(e),
            };
            match message {
                Message::Binary(bytes) => {
                    if agent_write.write_all(&bytes).await.is_err() {
                        // The agent is gone; the output side reports why.
                        std::future::pending::<()>().await;
                    }
                }
                Message::Text(_) => {
                    return Some((
                        close::POLICY,
                        "only binary messages may follow the ExecRequest".to_string(),
                    ));
                }
                Message::Close(_) => return None,
                Message::Ping(_) | Message::Pong(_) => {}
            }
        }
        None
    };
    let output = async {
        while let Some(chunk) = relay.next_chunk().await {
            let (bytes, lost) = match chunk {
                Ok(frames) => (frames, None),
                Err(detail) => {
                    let reason = guard.sandbox().lost_reason(detail).await;
                    (failure_frame(reason.clone()), Some(reason))
                }
            };
            if sink.send(Message::Binary(bytes)).await.is_err() {
                return None;
            }
            if let Some(reason) = lost {
                return Some((close::INTERNAL, reason));
            }
        }
        match relay.end() {
            Some(RelayEnd::Exited) => Some((close::NORMAL, String::new())),
            _ => None,
        }
    };
    let closing = tokio::select! {
        violation = input => violation,
        done = output => done,
    };
    if let Some((code, reason)) = closing {
        let _ = sink.send(close_frame(code, &reason)).await;
    }
}
