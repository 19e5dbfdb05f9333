//! The session of one admitted exec: the agent's frames out (relayed whole, never re-encoded,
//! ending with exactly one exit frame whatever happens to the agent), the client's stdin
//! frames in, and every metric of the exec recorded here and nowhere else.

use std::future::Future;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use wire::agent::{AgentRequest, RunAs};
use wire::ExecRequest;

use super::relay::{failure_frame, RelayEnd, ResponseRelay};
use crate::agent::{AgentError, AgentLoss};
use crate::metrics::Metrics;
use crate::sandbox::ActivityGuard;

/// One admitted exec.
#[derive(Debug)]
pub struct Session {
    metrics: Arc<Metrics>,
    exec_id: String,
    guard: ActivityGuard,
    started: Instant,
    output: Output,
    /// The agent connection's write half: stdin frames go there. Held for the whole session
    /// even when nothing is written (a one-shot exec): dropping it would half-close the
    /// connection, which the agent takes for a client that went away.
    input: Option<OwnedWriteHalf>,
}

#[derive(Debug)]
enum Output {
    Relay(Box<ResponseRelay<OwnedReadHalf>>),
    /// The agent could not be reached, or was lost: the next output is the exit frame saying
    /// why.
    Lost(AgentError),
    /// The exit frame (the agent's or ours) was sent.
    Done(RelayEnd),
}

/// How a session ended, for the transport to close the client accordingly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The agent's exit frame reached the client.
    Exited,
    /// The agent was lost; a synthesized exit frame with this reason reached the client.
    Lost(String),
    /// The client went away (or stopped reading) first: the command is killed, unless it
    /// outlives its connection (`on_disconnect: keep`, a one-shot exec's default).
    ClientGone,
    /// The client broke the transport's rules (a WebSocket close code and reason).
    ClientViolation(u16, String),
}

impl Session {
    /// Opens the agent connection and sends the request; counts the exec as started.
    pub(super) async fn open(
        metrics: Arc<Metrics>,
        guard: ActivityGuard,
        request: ExecRequest,
        user: Option<RunAs>,
        interactive: bool,
    ) -> Session {
        metrics.execs_started.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let sandbox = guard.sandbox().clone();
        let exec_id = request.exec_id.clone();
        let message = AgentRequest::Exec {
            tail_bytes: Some(sandbox.exec_tail_bytes()),
            request,
            interactive,
            user,
        };
        let connection = guard.send_to_agent(&message).await;
        Session::relay(metrics, guard, exec_id, started, connection)
    }

    /// A session over an agent connection whose frame stream comes next (or over the error
    /// that kept it from opening).
    pub(super) fn relay(
        metrics: Arc<Metrics>,
        guard: ActivityGuard,
        exec_id: String,
        started: Instant,
        connection: Result<tokio::net::UnixStream, AgentError>,
    ) -> Session {
        let (output, input) = match connection {
            Ok(stream) => {
                let (read, write) = stream.into_split();
                (
                    Output::Relay(Box::new(ResponseRelay::new(read))),
                    Some(write),
                )
            }
            Err(e) => (Output::Lost(e), None),
        };
        Session {
            metrics,
            exec_id,
            guard,
            started,
            output,
            input,
        }
    }

    /// The command's name: the request's `exec_id`, or the one the daemon gave it.
    pub fn exec_id(&self) -> &str {
        &self.exec_id
    }

    /// The next bytes for the client: whole frames, or the synthesized exit frame when the
    /// agent is lost; `None` once the exit frame was sent. Cancel-safe: a transport may drop it
    /// to watch its client meanwhile, and the next call goes on where this one stopped.
    pub async fn next_output(&mut self) -> Option<Bytes> {
        if let Output::Relay(relay) = &mut self.output {
            match relay.next_chunk().await {
                Some(Ok(frames)) => {
                    self.metrics
                        .bytes_streamed
                        .fetch_add(frames.len() as u64, Ordering::Relaxed);
                    if relay.end() == Some(&RelayEnd::Exited) {
                        self.metrics.observe_exec(self.started.elapsed());
                        self.output = Output::Done(RelayEnd::Exited);
                    }
                    return Some(frames);
                }
                // Kept until its exit frame is built, below: that part awaits.
                Some(Err(error)) => self.output = Output::Lost(error),
                // The relay has ended (after its exit frame or its loss, both handled here).
                None => {
                    self.output = Output::Done(RelayEnd::Exited);
                    return None;
                }
            }
        }
        if !matches!(self.output, Output::Lost(_)) {
            return None;
        }
        let died = self.guard.sandbox().death().await;
        let Output::Lost(error) =
            std::mem::replace(&mut self.output, Output::Done(RelayEnd::Exited))
        else {
            return None;
        };
        let loss = AgentLoss {
            sandbox: self.guard.sandbox().id.clone(),
            died,
            error,
        };
        self.metrics.execs_lost.fetch_add(1, Ordering::Relaxed);
        let reason = loss.to_string();
        let frame = failure_frame(reason.clone());
        self.metrics
            .bytes_streamed
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        self.output = Output::Done(RelayEnd::Lost(reason));
        Some(frame)
    }

    /// How the output ended, once it has.
    pub fn ending(&self) -> Option<Ending> {
        match &self.output {
            Output::Done(RelayEnd::Exited) => Some(Ending::Exited),
            Output::Done(RelayEnd::Lost(reason)) => Some(Ending::Lost(reason.clone())),
            _ => None,
        }
    }
}

/// What an interactive client sent.
#[derive(Debug)]
pub enum ClientInput {
    /// Bytes of the stdin frame stream.
    Data(Bytes),
    /// It closed its side (or its connection broke): the session ends.
    Closed,
    /// It broke the transport's rules (a WebSocket close code and reason).
    Violation(u16, String),
}

/// The reading side of an interactive client.
pub trait ClientReader: Send {
    /// The next input.
    fn recv(&mut self) -> impl Future<Output = ClientInput> + Send;
    /// After the session's end was sent: waits (briefly, the transport's to bound) for the
    /// client to end its side too, so that closing the connection loses nothing it has not
    /// read yet. By default nothing to wait for.
    fn linger(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// The writing side of an interactive client.
pub trait ClientWriter: Send {
    /// Sends frames to the client.
    fn send(&mut self, frames: Bytes) -> impl Future<Output = io::Result<()>> + Send;
    /// Closes the client's side as `ending` requires (flush and shut down the stream, a
    /// WebSocket close frame).
    fn finish(&mut self, ending: &Ending) -> impl Future<Output = ()> + Send;
}

/// Runs an interactive session: the client's bytes go to the agent unchanged, the agent's
/// frames come back relayed, until the exit frame or either side's end. The client closing its
/// side (even only its write half) ends the session and so kills the command: input ends with
/// a `stdin_close` frame, not a half-close.
pub async fn pump<R: ClientReader, W: ClientWriter>(
    mut session: Session,
    mut reader: R,
    mut writer: W,
) -> Ending {
    let mut input = session.input.take();
    let metrics = session.metrics.clone();
    let input_side = async {
        loop {
            match reader.recv().await {
                ClientInput::Data(bytes) => {
                    let sent = match &mut input {
                        Some(agent) => agent.write_all(&bytes).await.is_ok(),
                        None => false,
                    };
                    if sent {
                        metrics
                            .bytes_stdin
                            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    } else {
                        // The agent is gone; the output side reports why.
                        std::future::pending::<()>().await;
                    }
                }
                ClientInput::Closed => return Ending::ClientGone,
                ClientInput::Violation(code, reason) => {
                    return Ending::ClientViolation(code, reason)
                }
            }
        }
    };
    let output_side = async {
        while let Some(frames) = session.next_output().await {
            if writer.send(frames).await.is_err() {
                return Ending::ClientGone;
            }
        }
        session.ending().unwrap_or(Ending::ClientGone)
    };
    let ending = tokio::select! {
        ending = input_side => ending,
        ending = output_side => ending,
    };
    // The exec is over: its slot and the agent connection go now, not after the linger.
    drop(input);
    drop(session);
    writer.finish(&ending).await;
    if ending != Ending::ClientGone {
        reader.linger().await;
    }
    ending
}
