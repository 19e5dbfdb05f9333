//! What the CLI's end-to-end tests share.

/// Whether `bytes` hold a control character a terminal acts on: C0 (but the line ends of the
/// output's own lines), DEL, or C1 in UTF-8.
pub(crate) fn has_control(bytes: &[u8]) -> bool {
    bytes.iter().any(|&b| (b < 0x20 && b != b'\n') || b == 0x7f)
        || bytes
            .windows(2)
            .any(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1]))
}

/// The `crucible` binary this package built, talking to the daemon at `socket` without the
/// caller's key.
pub(crate) fn crucible_at(socket: &std::path::Path) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_crucible"));
    command
        .arg("--host")
        .arg(socket)
        .env_remove("CRUCIBLE_API_KEY");
    command
}

/// Runs `command` to its end.
pub(crate) fn run(command: &mut std::process::Command) -> std::process::Output {
    command.output().expect("crucible runs")
}

/// Output as text, for messages and comparisons.
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
