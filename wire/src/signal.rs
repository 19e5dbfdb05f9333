//! Signal names as the exit frame's `signal` spells them (`SIGTERM`), and their Linux numbers,
//! for clients that turn a name into an exit status or a `kill` request.

/// Linux's signals by name (x86_64 numbering, the same on aarch64 for these).
const SIGNALS: [(&str, i32); 31] = [
    ("SIGHUP", 1),
    ("SIGINT", 2),
    ("SIGQUIT", 3),
    ("SIGILL", 4),
    ("SIGTRAP", 5),
    ("SIGABRT", 6),
    ("SIGBUS", 7),
    ("SIGFPE", 8),
    ("SIGKILL", 9),
    ("SIGUSR1", 10),
    ("SIGSEGV", 11),
    ("SIGUSR2", 12),
    ("SIGPIPE", 13),
    ("SIGALRM", 14),
    ("SIGTERM", 15),
    ("SIGSTKFLT", 16),
    ("SIGCHLD", 17),
    ("SIGCONT", 18),
    ("SIGSTOP", 19),
    ("SIGTSTP", 20),
    ("SIGTTIN", 21),
    ("SIGTTOU", 22),
    ("SIGURG", 23),
    ("SIGXCPU", 24),
    ("SIGXFSZ", 25),
    ("SIGVTALRM", 26),
    ("SIGPROF", 27),
    ("SIGWINCH", 28),
    ("SIGIO", 29),
    ("SIGPWR", 30),
    ("SIGSYS", 31),
];

/// `"SIGKILL"`, `"KILL"`, `"kill"`, `"SIG40"` or `"9"` → the signal's number (1 to 64), as
/// `kill -s` and `docker kill -s` take them. `IOT` and `POLL` are the aliases of `ABRT` and `IO`.
pub fn signal_number(name: &str) -> Option<i32> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    if let Ok(number) = bare.parse::<i32>() {
        return (1..=64).contains(&number).then_some(number);
    }
    let bare = match bare {
        "IOT" => "ABRT",
        "POLL" => "IO",
        other => other,
    };
    SIGNALS
        .iter()
        .find(|(full, _)| full.strip_prefix("SIG") == Some(bare))
        .map(|(_, number)| *number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_parse_like_kill_s() {
        assert_eq!(signal_number("SIGHUP"), Some(1));
        assert_eq!(signal_number("TERM"), Some(15));
        assert_eq!(signal_number("kill"), Some(9));
        assert_eq!(signal_number("SIGSYS"), Some(31));
        assert_eq!(signal_number("IOT"), Some(6));
        assert_eq!(signal_number("SIG40"), Some(40));
        assert_eq!(signal_number("64"), Some(64));
        assert_eq!(signal_number("65"), None);
        assert_eq!(signal_number("0"), None);
        assert_eq!(signal_number(""), None);
        assert_eq!(signal_number("SIG"), None);
        assert_eq!(signal_number("NOPE"), None);
    }
}
