//! Finding a command again by `exec_id`: its status, the list of a sandbox's commands, and
//! re-attaching to one whose connection dropped (the agent replays what it kept from the
//! client's offset, then the stream goes on live and ends with the one exit frame).

use std::sync::Arc;
use std::time::{Duration, Instant};

use wire::agent::{AgentReply, AgentRequest};
use wire::ExecStatus;

use super::Session;
use crate::agent::AgentError;
use crate::metrics::Metrics;
use crate::sandbox::{Sandbox, SandboxError};

/// Why a command could not be found or attached to.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    /// The exec id is not one (1 to 128 letters, digits, `.`, `_`, `-`).
    #[error("exec_id {0:?} is not 1 to 128 letters, digits, '.', '_' or '-'")]
    InvalidId(String),
    /// The sandbox cannot take the request.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// No command of that name runs, and none ended with a result still to collect.
    #[error("sandbox {sandbox}: {message}")]
    NotFound {
        /// The sandbox.
        sandbox: String,
        /// The agent's words.
        message: String,
    },
    /// Another client is attached, or the command dies with its connection.
    #[error("sandbox {sandbox}: {message}")]
    Conflict {
        /// The sandbox.
        sandbox: String,
        /// The agent's words.
        message: String,
    },
    /// The request is not valid (an offset past the command's output).
    #[error("sandbox {sandbox}: {message}")]
    Invalid {
        /// The sandbox.
        sandbox: String,
        /// The agent's words.
        message: String,
    },
    /// The agent could not be asked, or answered nonsense.
    #[error("sandbox {sandbox}: {error}")]
    Agent {
        /// The sandbox.
        sandbox: String,
        /// What went wrong.
        error: String,
    },
}

fn check_id(exec_id: &str) -> Result<(), FindError> {
    if wire::valid_exec_id(exec_id) {
        Ok(())
    } else {
        Err(FindError::InvalidId(exec_id.escape_debug().to_string()))
    }
}

fn agent_failed(sandbox: &Sandbox, error: &AgentError) -> FindError {
    FindError::Agent {
        sandbox: sandbox.id.clone(),
        error: report::chain(error),
    }
}

/// The agent's refusal, as the error it means.
fn refused(sandbox: &Sandbox, reply: AgentReply) -> FindError {
    let sandbox = sandbox.id.clone();
    match reply {
        AgentReply::Error(e) => match e.code.as_str() {
            "not_found" => FindError::NotFound {
                sandbox,
                message: e.message,
            },
            "conflict" => FindError::Conflict {
                sandbox,
                message: e.message,
            },
            "invalid_request" => FindError::Invalid {
                sandbox,
                message: e.message,
            },
            _ => FindError::Agent {
                sandbox,
                error: e.message,
            },
        },
        other => FindError::Agent {
            sandbox,
            error: format!("unexpected agent reply {other:?}"),
        },
    }
}

/// The status of `sandbox`'s commands that can be found (running, or ended with a result not
/// yet collected), oldest first; with `exec_id`, that one (`NotFound` if there is none).
pub async fn statuses(
    sandbox: &Arc<Sandbox>,
    exec_id: Option<&str>,
    container: Option<&str>,
) -> Result<Vec<ExecStatus>, FindError> {
    if let Some(id) = exec_id {
        check_id(id)?;
    }
    let container = sandbox.container_named(container)?;
    let _guard = sandbox.begin(false)?;
    let message = AgentRequest::Execs {
        exec_id: exec_id.map(str::to_string),
    };
    let (reply, _) = sandbox
        .ask_agent_in(container.as_deref(), &message)
        .await
        .map_err(|e| agent_failed(sandbox, &e))?;
    match reply {
        AgentReply::Execs(list) => Ok(list.execs),
        other => Err(refused(sandbox, other)),
    }
}

/// How long [`end`] waits for a killed command's end (a process in uninterruptible sleep
/// outlives SIGKILL until it wakes).
const END_WAIT: Duration = Duration::from_secs(10);

/// Ends `exec_id` in `sandbox` and forgets it (`DELETE …/execs/{exec_id}`): a running
/// command's process group gets SIGKILL, and its end is then collected here, so that no
/// result is kept for it; an ended command's kept result is collected and dropped. A client
/// still attached gets the end itself, which forgets it too. `NotFound` when there is no such
/// command; `Conflict` when it has not ended [`END_WAIT`] after the kill.
pub async fn end(
    sandbox: &Arc<Sandbox>,
    exec_id: &str,
    container: Option<&str>,
) -> Result<(), FindError> {
    check_id(exec_id)?;
    let deadline = Instant::now() + END_WAIT;
    let (mut seen, mut killed) = (false, false);
    loop {
        let found = match statuses(sandbox, Some(exec_id), container).await {
            Ok(mut found) => found.pop(),
            // Gone since the first look: ended and collected.
            Err(FindError::NotFound { .. }) if seen => None,
            Err(e) => return Err(e),
        };
        let Some(status) = found else {
            return match seen {
                true => Ok(()),
                false => Err(FindError::NotFound {
                    sandbox: sandbox.id.clone(),
                    message: format!("no command has exec_id {exec_id:?}"),
                }),
            };
        };
        seen = true;
        if status.state == wire::ExecState::Running && !killed {
            kill(sandbox, exec_id, container).await?;
            killed = true;
        }
        // From the end of its output: what it wrote is nobody's now.
        match collect(sandbox, exec_id, status.output_bytes, container, deadline).await {
            // Collected by another attach or delivered to its client meanwhile.
            Err(FindError::NotFound { .. }) => return Ok(()),
            // The agent forgets it once it has written the exit frame, a moment after this
            // read it: the answer waits for that, so that the exec is gone when it comes.
            Ok(()) => return forgotten(sandbox, exec_id, container, deadline).await,
            // A client is attached (it gets the end), or the command dies with its
            // connection: it is forgotten once it has ended.
            Err(FindError::Conflict { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(FindError::Conflict { .. }) => {
                return Err(FindError::Conflict {
                    sandbox: sandbox.id.clone(),
                    message: format!(
                        "exec {exec_id:?} got SIGKILL but has not ended after {}s",
                        END_WAIT.as_secs()
                    ),
                })
            }
            Err(e) => return Err(e),
        }
    }
}

/// Waits until the agent no longer knows `exec_id` (collected), until `deadline`.
async fn forgotten(
    sandbox: &Arc<Sandbox>,
    exec_id: &str,
    container: Option<&str>,
    deadline: Instant,
) -> Result<(), FindError> {
    loop {
        match statuses(sandbox, Some(exec_id), container).await {
            Err(FindError::NotFound { .. }) => return Ok(()),
            Ok(found) if found.is_empty() => return Ok(()),
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            Ok(_) => {
                return Err(FindError::Conflict {
                    sandbox: sandbox.id.clone(),
                    message: format!(
                        "exec {exec_id:?} ended but its agent still had it after {}s",
                        END_WAIT.as_secs()
                    ),
                })
            }
            Err(e) => return Err(e),
        }
    }
}

/// SIGKILL to the process group of the running command `exec_id` (one that has just ended
/// is fine).
async fn kill(
    sandbox: &Arc<Sandbox>,
    exec_id: &str,
    container: Option<&str>,
) -> Result<(), FindError> {
    let container = sandbox.container_named(container)?;
    let _guard = sandbox.begin(false)?;
    let message = AgentRequest::Signal {
        signal: nix::sys::signal::Signal::SIGKILL as i32,
        exec_id: Some(exec_id.to_string()),
    };
    let (reply, _) = sandbox
        .ask_agent_in(container.as_deref(), &message)
        .await
        .map_err(|e| agent_failed(sandbox, &e))?;
    match reply {
        AgentReply::Signaled => Ok(()),
        AgentReply::Error(e) if e.code == "not_found" => Ok(()),
        other => Err(refused(sandbox, other)),
    }
}

/// Attaches to `exec_id` from output byte `offset` and reads its stream to its exit frame,
/// which collects it; gives up at `deadline` (detached again, it is kept).
async fn collect(
    sandbox: &Arc<Sandbox>,
    exec_id: &str,
    offset: u64,
    container: Option<&str>,
    deadline: Instant,
) -> Result<(), FindError> {
    let container = sandbox.container_named(container)?;
    // Not an exec of its own: ending one must work at the exec cap too.
    let guard = sandbox.begin_in(false, container.clone())?;
    let message = AgentRequest::Attach {
        exec_id: exec_id.to_string(),
        offset,
        stdin: false,
    };
    let (reply, agent) = sandbox
        .ask_agent_in(container.as_deref(), &message)
        .await
        .map_err(|e| agent_failed(sandbox, &e))?;
    if !matches!(reply, AgentReply::Attached(_)) {
        return Err(refused(sandbox, reply));
    }
    // Counted nowhere: this is no command's stream, and reading it is no exec.
    let mut session = Session::relay(
        Arc::new(Metrics::default()),
        guard,
        exec_id.to_string(),
        Instant::now(),
        Ok(agent),
    );
    let drained = tokio::time::timeout_at(deadline.into(), async {
        while session.next_output().await.is_some() {}
    })
    .await;
    drained.map_err(|_| FindError::Conflict {
        sandbox: sandbox.id.clone(),
        message: format!(
            "exec {exec_id:?} got SIGKILL but has not ended after {}s",
            END_WAIT.as_secs()
        ),
    })
}

/// Re-attaches to `exec_id` in `sandbox` from output byte `offset` (with `stdin`, an
/// interactive command's, whose input the session then carries): its status as the stream
/// starts, and the session that carries the rest of its frames and its one exit frame (whose
/// `output_dropped_bytes` counts what was no longer kept). The session holds an exec slot,
/// as any exec does; dropping it detaches again.
pub async fn attach(
    metrics: &Arc<Metrics>,
    sandbox: &Arc<Sandbox>,
    exec_id: &str,
    offset: u64,
    stdin: bool,
    container: Option<&str>,
) -> Result<(ExecStatus, Session), FindError> {
    check_id(exec_id)?;
    let container = sandbox.container_named(container)?;
    let guard = sandbox.begin_in(true, container.clone())?;
    let message = AgentRequest::Attach {
        exec_id: exec_id.to_string(),
        offset,
        stdin,
    };
    let (reply, agent) = sandbox
        .ask_agent_in(container.as_deref(), &message)
        .await
        .map_err(|e| agent_failed(sandbox, &e))?;
    let status = match reply {
        AgentReply::Attached(status) => status,
        other => return Err(refused(sandbox, other)),
    };
    let session = Session::relay(
        metrics.clone(),
        guard,
        exec_id.to_string(),
        Instant::now(),
        Ok(agent),
    );
    Ok((status, session))
}
