//! How a command's result becomes `crucible`'s exit status, as `timeout(1)` and shells do.

use wire::ExecResult;

/// Exit status when the command timed out (as `timeout(1)`).
pub(crate) const TIMED_OUT: i32 = 124;
/// Exit status for a failure of crucible itself (daemon unreachable, API error).
pub(crate) const CRUCIBLE_ERROR: i32 = 125;
/// Exit status when the command was found but could not run.
pub(crate) const CANNOT_RUN: i32 = 126;
/// Exit status when the command was not found.
pub(crate) const NOT_FOUND: i32 = 127;

/// The exit status for `result`: the command's own code; 124 on timeout; 128 + the signal
/// number when signalled; 127 / 126 when it could not start; 125 when crucible lost it.
pub(crate) fn code(result: &ExecResult) -> i32 {
    if result.timed_out {
        return TIMED_OUT;
    }
    if !result.signal.is_empty() {
        return 128 + wire::signal_number(&result.signal).unwrap_or(0);
    }
    if result.exit_code >= 0 {
        return result.exit_code;
    }
    let error = result.error.to_ascii_lowercase();
    if error.contains("command not found") {
        NOT_FOUND
    } else if error.contains("permission denied") || error.contains("working directory") {
        CANNOT_RUN
    } else {
        CRUCIBLE_ERROR
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(exit_code: i32, signal: &str, timed_out: bool, error: &str) -> ExecResult {
        ExecResult {
            exit_code,
            signal: signal.into(),
            timed_out,
            error: error.into(),
            ..ExecResult::default()
        }
    }

    #[test]
    fn exit_codes_follow_the_command() {
        assert_eq!(code(&result(0, "", false, "")), 0);
        assert_eq!(code(&result(3, "", false, "")), 3);
        assert_eq!(code(&result(-1, "SIGKILL", false, "")), 137);
        assert_eq!(code(&result(-1, "SIGTERM", false, "")), 143);
        assert_eq!(code(&result(-1, "SIGKILL", true, "")), 124);
        assert_eq!(code(&result(-1, "", false, "command not found: nope")), 127);
        assert_eq!(
            code(&result(-1, "", false, "permission denied: /etc/passwd")),
            126
        );
        assert_eq!(
            code(&result(
                -1,
                "",
                false,
                "sandbox sb-1 died during the request"
            )),
            125
        );
    }
}
