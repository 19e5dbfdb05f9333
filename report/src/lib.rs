//! The one way crucible prints an error: its message, then each of its causes, `: `-separated,
//! on one line — what a log line, an API error envelope, a CLI's `crucible: error: …`, a ttrpc
//! status or the agent's reply to the host carries. Every error type of the workspace keeps its
//! cause out of its own message (`#[source]`, never `{source}` in `#[error(...)]`), so each
//! cause appears exactly once. A leaf crate with no dependencies: the guest agent, the VMM, the
//! daemon and the clients all use it.

#![forbid(unsafe_code)]

use std::error::Error;

/// `error` and each of its causes, `: `-separated.
pub fn chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn Error + 'static))
        }
    }

    #[test]
    fn each_cause_follows_once_in_order() {
        let e = Layer(
            "creating sandbox sb-1",
            Some(Box::new(Layer(
                "starting the VM",
                Some(Box::new(Layer("No such file or directory", None))),
            ))),
        );
        assert_eq!(
            chain(&e),
            "creating sandbox sb-1: starting the VM: No such file or directory"
        );
        assert_eq!(chain(&Layer("alone", None)), "alone");
    }
}
