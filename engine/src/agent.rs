//! What can go wrong talking to a sandbox's agent (one connection per request), and what it
//! means when the agent is lost on the way.

use std::fmt;
use std::io;

use wire::MessageError;

/// How the agent was lost.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Its socket refused the connection (or it is gone).
    #[error("cannot connect to the agent")]
    Connect(#[source] io::Error),
    /// The request could not be written.
    #[error("sending the request to the agent failed")]
    Send(#[source] MessageError),
    /// The response broke off or was malformed (see `exec::ResponseRelay`).
    #[error("{0}")]
    Stream(String),
    /// A reply could not be read.
    #[error("reading the agent's reply failed")]
    Reply(#[source] MessageError),
}

/// An agent lost mid-request, with what the sandbox knew: whether it died, and why.
#[derive(Debug)]
pub(crate) struct AgentLoss {
    /// The sandbox.
    pub(crate) sandbox: String,
    /// Why it died, when it did (the backend's account).
    pub(crate) died: Option<String>,
    /// What the request saw.
    pub(crate) error: AgentError,
}

impl fmt::Display for AgentLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.died {
            Some(reason) => write!(
                f,
                "sandbox {} died during the request: {reason}",
                self.sandbox
            ),
            None => write!(
                f,
                "lost the agent of sandbox {}: {}",
                self.sandbox,
                report::chain(&self.error)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_agent_names_the_cause_once() {
        let loss = AgentLoss {
            sandbox: "sb-1".into(),
            died: None,
            error: AgentError::Connect(io::Error::new(io::ErrorKind::NotFound, "no socket")),
        };
        assert_eq!(
            loss.to_string(),
            "lost the agent of sandbox sb-1: cannot connect to the agent: no socket"
        );
    }
}
