//! The one exec path. Every transport — the one-shot `POST …/exec`, the hijacked `?stdin=1`
//! stream, the WebSocket — looks the sandbox up for its caller, parses the ExecRequest, then
//! calls [`admit`], which validates it once, reserves the exec slot and opens the agent
//! connection; what comes back is a [`Session`], the one pump that moves the frames and
//! records every metric. The transports only adapt bytes: the one-shot response
//! pulls [`Session::next_output`]; the interactive ones hand a reader and a writer to
//! [`pump`].

mod find;
mod relay;
mod session;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use find::{attach, end, statuses, FindError};
pub use session::{pump, ClientInput, ClientReader, ClientWriter, Ending, Session};
use wire::ExecRequest;

use crate::metrics::Metrics;
use crate::sandbox::{Sandbox, SandboxError};

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

/// Why an exec was not admitted. Before any output: the transport answers with an error
/// (HTTP status, WebSocket close code), never with a frame stream.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The ExecRequest is not valid JSON, or fails validation; the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// The sandbox cannot take it (dead, busy, at its exec limit).
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// Whether `?stdin=` asks for an interactive session.
pub fn wants_stdin(value: Option<&str>) -> Result<bool, AdmitError> {
    match value {
        None | Some("0") | Some("false") | Some("") => Ok(false),
        Some("1") | Some("true") => Ok(true),
        Some(other) => Err(AdmitError::Invalid(format!(
            "stdin: expected 1 or 0, got {other:?}"
        ))),
    }
}

/// The `exec_id` a command gets when its request names none: `ex-` and 16 random hex digits,
/// so that every command can be listed and re-attached to.
pub fn new_exec_id() -> String {
    crate::ids::random_id("ex-")
}

/// Admits one exec into `sandbox`: validates `request` once, names it (a fresh `exec_id` when
/// it has none: [`Session::exec_id`]), applies the sandbox's defaults (env, image config, the
/// user it runs as), reserves an exec slot, and opens the agent connection; the session
/// records into `metrics`. An agent that cannot be reached is not an admission error: the
/// session then yields the synthesized exit frame that says why, as a stream lost later would.
///
/// `container` names the container it runs in (`?container=`); `None` is the sandbox's own
/// root.
pub async fn admit(
    metrics: &Arc<Metrics>,
    sandbox: &Arc<Sandbox>,
    request: ExecRequest,
    interactive: bool,
    container: Option<&str>,
) -> Result<Session, AdmitError> {
    request
        .validate()
        .map_err(|e| AdmitError::Invalid(e.to_string()))?;
    let container = sandbox.container_named(container)?;
    let mut request = request;
    if request.exec_id.is_empty() {
        request.exec_id = new_exec_id();
    }
    let user = sandbox
        .apply_defaults(&mut request, container.as_deref())
        .map_err(AdmitError::Invalid)?;
    let guard = sandbox.begin_in(true, container)?;
    if let Some(delay) = debug_exec_delay() {
        tokio::time::sleep(delay).await;
    }
    Ok(Session::open(metrics.clone(), guard, request, user, interactive).await)
}
