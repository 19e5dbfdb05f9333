//! How a crucible exit frame becomes the exit status containerd reports.

use wire::ExecResult;

/// What containerd itself reports for a process whose end is unknown (`cleanupAfterDeadShim`):
/// the exec was lost (the sandbox died, the daemon restarted) or never started.
pub const UNKNOWN_EXIT: u32 = 255;

/// The shell convention runc follows: the exit code, or 128 + the signal that killed the
/// process.
pub fn exit_status(result: &ExecResult) -> u32 {
    if !result.signal.is_empty() {
        return signal_number(&result.signal).map_or(UNKNOWN_EXIT, |n| 128 + n);
    }
    u32::try_from(result.exit_code).unwrap_or(UNKNOWN_EXIT)
}

/// `"SIGKILL"`, `"KILL"`, `"SIG40"` or `"9"` → the signal's number (1 to 64).
pub fn signal_number(name: &str) -> Option<u32> {
    let bare = name.strip_prefix("SIG").unwrap_or(name);
    if let Ok(number) = bare.parse::<u32>() {
        return (1..=64).contains(&number).then_some(number);
    }
    let number = match bare {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "ILL" => libc::SIGILL,
        "TRAP" => libc::SIGTRAP,
        "ABRT" | "IOT" => libc::SIGABRT,
        "BUS" => libc::SIGBUS,
        "FPE" => libc::SIGFPE,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "SEGV" => libc::SIGSEGV,
        "USR2" => libc::SIGUSR2,
        "PIPE" => libc::SIGPIPE,
        "ALRM" => libc::SIGALRM,
        "TERM" => libc::SIGTERM,
        "STKFLT" => libc::SIGSTKFLT,
        "CHLD" => libc::SIGCHLD,
        "CONT" => libc::SIGCONT,
        "STOP" => libc::SIGSTOP,
        "TSTP" => libc::SIGTSTP,
        "TTIN" => libc::SIGTTIN,
        "TTOU" => libc::SIGTTOU,
        "URG" => libc::SIGURG,
        "XCPU" => libc::SIGXCPU,
        "XFSZ" => libc::SIGXFSZ,
        "VTALRM" => libc::SIGVTALRM,
        "PROF" => libc::SIGPROF,
        "WINCH" => libc::SIGWINCH,
        "IO" | "POLL" => libc::SIGIO,
        "PWR" => libc::SIGPWR,
        "SYS" => libc::SIGSYS,
        _ => return None,
    };
    u32::try_from(number).ok()
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

    #[test]
    fn signal_names_parse_with_or_without_sig() {
        assert_eq!(signal_number("SIGHUP"), Some(1));
        assert_eq!(signal_number("TERM"), Some(15));
        assert_eq!(signal_number("SIGSYS"), Some(31));
        assert_eq!(signal_number("0"), None);
        assert_eq!(signal_number(""), None);
    }
}
