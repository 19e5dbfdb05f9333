//! What can go wrong talking to a sandbox's agent (one connection per request), and what it
//! means when the agent is lost on the way.

use std::fmt;
use std::io;
use std::time::Duration;

use tokio::net::UnixStream;
use wire::agent::{AgentReply, AgentRequest};
use wire::MessageError;

/// How long one question to an agent may take, from the connection to the end of its one reply
/// (status, list, signal, attach's first answer, the idle check). Our agent answers these at
/// once; the code that stands in its place may be root's own in the sandbox, and must not hold
/// a request, a client or the idle check for ever.
pub const AGENT_REPLY_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// No reply came in time.
    #[error("the agent did not answer within {} s", .0.as_secs_f64())]
    Timeout(Duration),
}

/// Sends `request` on `agent` and reads its one reply, all within `within`; returns the
/// connection too, for a request whose reply starts a stream (attach).
pub(crate) async fn exchange(
    mut agent: UnixStream,
    request: &AgentRequest,
    within: Duration,
) -> Result<(AgentReply, UnixStream), AgentError> {
    let talk = async {
        wire::write_message_async(&mut agent, request)
            .await
            .map_err(AgentError::Send)?;
        let reply = wire::read_message_async(&mut agent)
            .await
            .map_err(AgentError::Reply)?;
        Ok(reply)
    };
    match tokio::time::timeout(within, talk).await {
        Ok(Ok(reply)) => Ok((reply, agent)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(AgentError::Timeout(within)),
    }
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

    #[tokio::test]
    async fn an_agent_that_never_answers_times_out() {
        let (ours, _silent) = UnixStream::pair().expect("a socket pair");
        let within = Duration::from_millis(50);
        let err = exchange(ours, &AgentRequest::Ping, within)
            .await
            .expect_err("a silent agent must time out");
        assert!(
            matches!(err, AgentError::Timeout(d) if d == within),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "the agent did not answer within 0.05 s");
    }

    #[tokio::test]
    async fn an_agent_that_answers_is_heard_and_its_connection_kept() {
        let (ours, mut theirs) = UnixStream::pair().expect("a socket pair");
        let agent = tokio::spawn(async move {
            let asked: AgentRequest = wire::read_message_async(&mut theirs).await?;
            assert!(matches!(asked, AgentRequest::Ping));
            wire::write_message_async(&mut theirs, &AgentReply::Signaled).await?;
            wire::write_message_async(&mut theirs, &AgentReply::Signaled).await?;
            Ok::<_, MessageError>(())
        });
        let (reply, mut connection) = exchange(ours, &AgentRequest::Ping, AGENT_REPLY_TIMEOUT)
            .await
            .expect("an answer");
        assert!(matches!(reply, AgentReply::Signaled), "{reply:?}");
        let more: AgentReply = wire::read_message_async(&mut connection)
            .await
            .expect("the stream goes on");
        assert!(matches!(more, AgentReply::Signaled), "{more:?}");
        agent
            .await
            .expect("the agent task")
            .expect("the agent's side");
    }

    #[tokio::test]
    async fn an_agent_that_hangs_up_is_a_reply_error() {
        let (ours, theirs) = UnixStream::pair().expect("a socket pair");
        drop(theirs);
        let err = exchange(ours, &AgentRequest::Ping, AGENT_REPLY_TIMEOUT)
            .await
            .expect_err("no agent");
        assert!(
            matches!(err, AgentError::Send(_) | AgentError::Reply(_)),
            "{err:?}"
        );
    }

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
