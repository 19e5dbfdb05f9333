//! The shim's errors, and the ttrpc status code each becomes for containerd.

use containerd_shim::protos::ttrpc::{self, Code};

/// Why a task call failed.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// No container with this id lives in this shim.
    #[error("no task {0:?} in this shim")]
    NoTask(String),
    /// The container has no process with this exec id.
    #[error("task {id:?} has no process {exec_id:?}")]
    NoProcess {
        /// The container.
        id: String,
        /// The exec id asked for.
        exec_id: String,
    },
    /// The process already exited (containerd treats NOT_FOUND here as "nothing to signal").
    #[error("process already finished")]
    Finished,
    /// A request containerd may send but crucible cannot honour.
    #[error("crucible: {0} not supported")]
    Unsupported(&'static str),
    /// A malformed request or spec.
    #[error("{0}")]
    Invalid(String),
    /// An id already in use.
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// The process is not in a state that allows the call.
    #[error("{0}")]
    Precondition(String),
    /// The crucible daemon refused or failed a call.
    #[error("crucible daemon")]
    Daemon(#[from] client::ClientError),
    /// A local file or mount operation failed.
    #[error("{context}")]
    Io {
        /// What was being done, and on which path.
        context: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A containerd-shim helper (spec reading, mounting) failed.
    #[error("{context}")]
    Shim {
        /// What was being done.
        context: String,
        /// Why it failed.
        #[source]
        source: containerd_shim::Error,
    },
}

impl ShimError {
    /// An [`ShimError::Io`] saying what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ShimError::Io {
            context: context.into(),
            source,
        }
    }

    /// A [`ShimError::Shim`] saying what was being done.
    pub fn shim(context: impl Into<String>, source: containerd_shim::Error) -> Self {
        ShimError::Shim {
            context: context.into(),
            source,
        }
    }

    /// The gRPC code containerd maps back to its own error kinds (`errdefs.FromGRPC`).
    pub fn code(&self) -> Code {
        match self {
            ShimError::NoTask(_) | ShimError::NoProcess { .. } | ShimError::Finished => {
                Code::NOT_FOUND
            }
            ShimError::Unsupported(_) => Code::UNIMPLEMENTED,
            ShimError::Invalid(_) => Code::INVALID_ARGUMENT,
            ShimError::AlreadyExists(_) => Code::ALREADY_EXISTS,
            ShimError::Precondition(_) => Code::FAILED_PRECONDITION,
            ShimError::Daemon(client::ClientError::Api { status: 404, .. }) => Code::NOT_FOUND,
            ShimError::Daemon(client::ClientError::Api { status: 400, .. }) => {
                Code::INVALID_ARGUMENT
            }
            ShimError::Daemon(_) | ShimError::Io { .. } | ShimError::Shim { .. } => Code::UNKNOWN,
        }
    }
}

impl From<ShimError> for ttrpc::Error {
    fn from(error: ShimError) -> Self {
        ttrpc::Error::RpcStatus(ttrpc::get_status(error.code(), report::chain(&error)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_ones_containerd_understands() {
        assert_eq!(ShimError::Finished.code(), Code::NOT_FOUND);
        assert_eq!(ShimError::NoTask("c".into()).code(), Code::NOT_FOUND);
        assert_eq!(
            ShimError::Unsupported("pause is").code(),
            Code::UNIMPLEMENTED
        );
        assert_eq!(
            ShimError::Invalid("x".into()).code(),
            Code::INVALID_ARGUMENT
        );
        let gone = ShimError::Daemon(client::ClientError::Api {
            status: 404,
            code: "not_found".into(),
            message: "no sandbox".into(),
        });
        assert_eq!(gone.code(), Code::NOT_FOUND);
    }

    #[test]
    fn the_status_message_keeps_the_cause() {
        let error = ShimError::io(
            "opening /b/config.json",
            std::io::Error::from_raw_os_error(libc::ENOENT),
        );
        let message = report::chain(&error);
        assert!(message.starts_with("opening /b/config.json: "), "{message}");
        assert!(message.contains("No such file"), "{message}");
    }

    #[test]
    fn the_status_message_names_each_cause_once() {
        let error = ShimError::Daemon(client::ClientError::Connect {
            endpoint: "unix:/run/crucible.sock".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such socket"),
        });
        assert_eq!(error.to_string(), "crucible daemon");
        assert_eq!(
            report::chain(&error),
            "crucible daemon: cannot connect to the crucible daemon at unix:/run/crucible.sock: \
             no such socket"
        );
    }
}
