//! Exec: opening the agent request, the one-shot response stream, and the interactive session
//! over any full-duplex byte stream (a hijacked connection or an upgraded one).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use wire::agent::AgentRequest;
use wire::ExecRequest;

use crate::relay::{failure_frame, RelayEnd, ResponseRelay};
use crate::sandbox::ActivityGuard;
use crate::state::AppState;

/// Test hook, not a tuning knob: `CRUCIBLE_DEBUG_EXEC_DELAY_US=N` makes every exec wait N µs
/// before it reaches the agent, a deliberately slowed build without rebuilding. `cargo xtask
/// bench --check-slowed` uses it to show that the benchmark gate catches an exec-path
/// regression. Read once; unset, empty or unparsable means no delay.
pub const DEBUG_EXEC_DELAY_ENV: &str = "CRUCIBLE_DEBUG_EXEC_DELAY_US";

fn debug_exec_delay() -> Option<Duration> {
    static DELAY: OnceLock<Option<Duration>> = OnceLock::new();
    *DELAY.get_or_init(|| {
        std::env::var(DEBUG_EXEC_DELAY_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&us| us > 0)
            .map(Duration::from_micros)
    })
}

/// Connects to the sandbox's agent and sends the exec request. The error is the reason to put
/// in the synthesized exit frame.
pub async fn open(
    guard: &ActivityGuard,
    request: &ExecRequest,
    interactive: bool,
) -> Result<UnixStream, String> {
    if let Some(delay) = debug_exec_delay() {
        tokio::time::sleep(delay).await;
    }
    let sandbox = guard.sandbox();
    let mut agent = match sandbox.connect_agent().await {
        Ok(agent) => agent,
        Err(e) => {
            return Err(sandbox
                .lost_reason(format!("cannot connect to the agent: {e}"))
                .await)
        }
    };
    let message = AgentRequest::Exec {
        request: sandbox.with_sandbox_env(request),
        interactive,
    };
    if let Err(e) = wire::write_message_async(&mut agent, &message).await {
        return Err(sandbox
            .lost_reason(format!("sending the request to the agent failed: {e}"))
            .await);
    }
    Ok(agent)
}

enum OneShot {
    Start(ActivityGuard, ExecRequest),
    Relay(ActivityGuard, Box<ResponseRelay<UnixStream>>),
    Done,
}

/// The body of a one-shot exec: the agent's frames, relayed, ending with exactly one exit
/// frame whatever happens to the agent. Pulled by the HTTP layer, so a slow client slows the
/// agent (backpressure) and a client that goes away drops the agent connection (which kills the
/// command).
pub fn one_shot(
    state: Arc<AppState>,
    guard: ActivityGuard,
    request: ExecRequest,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    state.metrics.execs_started.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    futures_util::stream::unfold(OneShot::Start(guard, request), move |step| {
        let state = state.clone();
        async move {
            let (guard, mut relay) = match step {
                OneShot::Done => return None,
                OneShot::Start(guard, request) => match open(&guard, &request, false).await {
                    Ok(agent) => (guard, Box::new(ResponseRelay::new(agent))),
                    Err(reason) => {
                        state.metrics.execs_lost.fetch_add(1, Ordering::Relaxed);
                        return Some((Ok(failure_frame(reason)), OneShot::Done));
                    }
                },
                OneShot::Relay(guard, relay) => (guard, relay),
            };
            match relay.next_chunk().await {
                None => None,
                Some(Ok(frames)) => {
                    state
                        .metrics
                        .bytes_streamed
                        .fetch_add(frames.len() as u64, Ordering::Relaxed);
                    if relay.end() == Some(&RelayEnd::Exited) {
                        state.metrics.observe_exec(started.elapsed());
                    }
                    Some((Ok(frames), OneShot::Relay(guard, relay)))
                }
                Some(Err(detail)) => {
                    state.metrics.execs_lost.fetch_add(1, Ordering::Relaxed);
                    let reason = guard.sandbox().lost_reason(detail).await;
                    Some((Ok(failure_frame(reason)), OneShot::Done))
                }
            }
        }
    })
}

/// Runs an interactive session over `client`: its bytes (stdin/stdin_close frames) go to the
/// agent unchanged, the agent's frames come back relayed, and the session ends after the exit
/// frame. The client closing its side (even only its write half) ends the session and so kills
/// the command: input ends with a `stdin_close` frame, not a half-close.
pub async fn interactive<S>(
    state: Arc<AppState>,
    guard: ActivityGuard,
    request: ExecRequest,
    client: S,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    state.metrics.execs_started.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let agent = match open(&guard, &request, true).await {
        Ok(agent) => agent,
        Err(reason) => {
            state.metrics.execs_lost.fetch_add(1, Ordering::Relaxed);
            let _ = client_write.write_all(&failure_frame(reason)).await;
            let _ = client_write.shutdown().await;
            return;
        }
    };
    let (agent_read, mut agent_write) = agent.into_split();
    let mut relay = ResponseRelay::new(agent_read);

    let input = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if agent_write.write_all(&buf[..n]).await.is_err() {
                        // The agent is gone; the output side reports why.
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    };
    let output = async {
        while let Some(chunk) = relay.next_chunk().await {
            let bytes = match chunk {
                Ok(frames) => frames,
                Err(detail) => {
                    state.metrics.execs_lost.fetch_add(1, Ordering::Relaxed);
                    failure_frame(guard.sandbox().lost_reason(detail).await)
                }
            };
            state
                .metrics
                .bytes_streamed
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            if client_write.write_all(&bytes).await.is_err() {
                return;
            }
        }
        if relay.end() == Some(&RelayEnd::Exited) {
            state.metrics.observe_exec(started.elapsed());
        }
        let _ = client_write.flush().await;
        let _ = client_write.shutdown().await;
    };
    tokio::select! {
        () = input => {}
        () = output => {}
    }
}
