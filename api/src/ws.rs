//! Interactive exec over WebSocket (`GET /sandboxes/{id}/exec` + upgrade): the first client
//! message is the JSON ExecRequest; after it, binary message payloads in each direction,
//! concatenated, are exactly the frame stream of the hijacked transport.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};

use crate::edge::Edge;
use engine::exec::{self, AdmitError, ClientInput, ClientReader, ClientWriter, Ending};
use engine::sandbox::{Sandbox, SandboxError};

/// Close codes used by the session.
mod close {
    pub(super) const NORMAL: u16 = 1000;
    pub(super) const PROTOCOL: u16 = 1002;
    pub(super) const INVALID_PAYLOAD: u16 = 1007;
    pub(super) const POLICY: u16 = 1008;
    pub(super) const TOO_BIG: u16 = 1009;
    pub(super) const GOING_AWAY: u16 = 1001;
    pub(super) const INTERNAL: u16 = 1011;
    pub(super) const TRY_AGAIN_LATER: u16 = 1013;
}

/// The close code for an exec the sandbox would not admit: a limit is "try again later", a
/// daemon going away "going away", a sandbox that cannot run it an internal condition.
fn close_code(error: &SandboxError) -> u16 {
    match error {
        SandboxError::ExecLimit { .. } | SandboxError::AtCapacity(_) => close::TRY_AGAIN_LATER,
        SandboxError::ShuttingDown => close::GOING_AWAY,
        SandboxError::InvalidId(_)
        | SandboxError::NoContainer { .. }
        | SandboxError::OwnRootNotRemovable => close::POLICY,
        SandboxError::NotFound(_) | SandboxError::Dead { .. } | SandboxError::NotRunning { .. } => {
            close::INTERNAL
        }
    }
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

/// Reads the first message: the ExecRequest's bytes, as text or binary. The error is the
/// close frame to answer with, if any.
async fn first_request(
    socket: &mut WebSocket,
    timeout: Duration,
) -> Result<Bytes, Option<(u16, String)>> {
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
        return match message {
            Message::Text(text) => Ok(Bytes::from(text)),
            Message::Binary(bytes) => Ok(bytes),
            Message::Close(_) => Err(None),
            Message::Ping(_) | Message::Pong(_) => continue,
        };
    }
}

/// Runs one WebSocket exec session.
pub(crate) async fn session(
    state: Arc<Edge>,
    sandbox: Arc<Sandbox>,
    container: Option<String>,
    mut socket: WebSocket,
) {
    let request = match first_request(&mut socket, state.http.first_message_timeout).await {
        Ok(request) => request,
        Err(Some((code, reason))) => return close_with(socket, code, &reason).await,
        Err(None) => return,
    };
    let admitted = match crate::json::parse_exec_request(&request) {
        Ok(request) => {
            exec::admit(
                &state.metrics,
                &sandbox,
                request,
                true,
                container.as_deref(),
            )
            .await
        }
        Err(e) => Err(e),
    };
    let session = match admitted {
        Ok(session) => session,
        Err(AdmitError::Invalid(reason)) => {
            return close_with(socket, close::POLICY, &reason).await
        }
        Err(AdmitError::Sandbox(e)) => {
            return close_with(socket, close_code(&e), &e.to_string()).await
        }
    };
    let (sink, stream) = socket.split();
    exec::pump(session, WsReader(stream), WsWriter(sink)).await;
}

/// The WebSocket's reading side: binary messages carry the stdin frame stream.
struct WsReader(SplitStream<WebSocket>);

impl ClientReader for WsReader {
    async fn recv(&mut self) -> ClientInput {
        loop {
            let message = match self.0.next().await {
                None => return ClientInput::Closed,
                Some(Err(e)) => {
                    return match receive_error(e) {
                        Some((code, reason)) => ClientInput::Violation(code, reason),
                        None => ClientInput::Closed,
                    }
                }
                Some(Ok(message)) => message,
            };
            match message {
                Message::Binary(bytes) => return ClientInput::Data(bytes),
                Message::Text(_) => {
                    return ClientInput::Violation(
                        close::POLICY,
                        "only binary messages may follow the ExecRequest".to_string(),
                    )
                }
                Message::Close(_) => return ClientInput::Closed,
                Message::Ping(_) | Message::Pong(_) => {}
            }
        }
    }

    /// RFC 6455's closing handshake: after our close frame, the client's is awaited (what it
    /// still sends is dropped), so that the TCP connection is not closed under data the client
    /// has not read — its exit frame among it — which a reset would destroy.
    async fn linger(&mut self) {
        let drain = async {
            while let Some(Ok(message)) = self.0.next().await {
                if matches!(message, Message::Close(_)) {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(CLOSE_LINGER, drain).await;
    }
}

/// How long the daemon waits for a client's close frame after sending its own.
const CLOSE_LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// The WebSocket's writing side: each chunk of whole frames is one binary message.
struct WsWriter(SplitSink<WebSocket, Message>);

impl ClientWriter for WsWriter {
    async fn send(&mut self, frames: Bytes) -> std::io::Result<()> {
        self.0
            .send(Message::Binary(frames))
            .await
            .map_err(std::io::Error::other)
    }

    async fn finish(&mut self, ending: &Ending) {
        let closing = match ending {
            Ending::Exited => Some((close::NORMAL, "")),
            Ending::Lost(reason) => Some((close::INTERNAL, reason.as_str())),
            Ending::ClientViolation(code, reason) => Some((*code, reason.as_str())),
            Ending::ClientGone => None,
        };
        if let Some((code, reason)) = closing {
            let _ = self.0.send(close_frame(code, reason)).await;
        }
    }
}
