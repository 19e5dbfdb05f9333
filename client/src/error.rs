//! The client's errors.

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon could not be reached.
    #[error("cannot connect to the crucible daemon at {endpoint}")]
    Connect {
        /// Where it was looked for.
        endpoint: String,
        /// Why the connection failed.
        #[source]
        source: std::io::Error,
    },
    /// The daemon answered with an error.
    #[error("{message} (HTTP {status}, {code})")]
    Api {
        /// HTTP status.
        status: u16,
        /// The envelope's code.
        code: String,
        /// The envelope's message.
        message: String,
    },
    /// The HTTP exchange failed.
    #[error("HTTP error talking to the daemon: {0}")]
    Http(String),
    /// The daemon's answer did not follow the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A local file operation failed.
    #[error("{0}")]
    Local(String),
    /// The endpoint string could not be parsed.
    #[error("invalid daemon address {0:?}: expected a Unix socket path or http://host:port")]
    BadEndpoint(String),
}

impl From<hyper::Error> for ClientError {
    fn from(e: hyper::Error) -> Self {
        ClientError::Http(e.to_string())
    }
}

impl From<wire::ReadError> for ClientError {
    fn from(e: wire::ReadError) -> Self {
        match e {
            wire::ReadError::Io(e) => ClientError::Http(format!("reading the frame stream: {e}")),
            wire::ReadError::Decode(e) => {
                ClientError::Protocol(format!("invalid frame stream: {e}"))
            }
        }
    }
}
