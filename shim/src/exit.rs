//! How a crucible exit frame becomes the exit status containerd reports.

use wire::ExecResult;

/// What containerd itself reports for a process whose end is unknown (`cleanupAfterDeadShim`):
/// the exec was lost (the sandbox died, the daemon restarted) or never started.
pub(crate) const UNKNOWN_EXIT: u32 = 255;

/// The shell convention runc follows: the exit code, or 128 + the signal that killed the
/// process.
pub(crate) fn exit_status(result: &ExecResult) -> u32 {
    if !result.signal.is_empty() {
        return wire::signal_number(&result.signal)
            .and_then(|n| u32::try_from(n).ok())
            .map_or(UNKNOWN_EXIT, |n| 128 + n);
    }
    u32::try_from(result.exit_code).unwrap_or(UNKNOWN_EXIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(exit_code: i32, signal: &str, error: &str) -> ExecResult {
        ExecResult {
            exit_code,
            signal: signal.into(),
            error: error.into(),
            ..ExecResult::default()
        }
    }

    #[test]
    fn exit_codes_pass_through() {
        assert_eq!(exit_status(&result(0, "", "")), 0);
        assert_eq!(exit_status(&result(3, "", "")), 3);
        assert_eq!(exit_status(&result(255, "", "")), 255);
    }

    #[test]
    fn a_signal_death_is_128_plus_the_signal() {
        assert_eq!(exit_status(&result(-1, "SIGKILL", "")), 137);
        assert_eq!(exit_status(&result(-1, "SIGTERM", "")), 143);
        assert_eq!(exit_status(&result(-1, "SIG40", "")), 168);
        assert_eq!(exit_status(&result(-1, "KILL", "")), 137);
        assert_eq!(exit_status(&result(-1, "9", "")), 137);
    }

    #[test]
    fn a_lost_or_unknown_end_is_255() {
        assert_eq!(exit_status(&result(-1, "", "the sandbox died")), 255);
        assert_eq!(exit_status(&result(-1, "SIGNOPE", "")), 255);
        assert_eq!(exit_status(&result(-1, "SIG99", "")), 255);
    }
}
