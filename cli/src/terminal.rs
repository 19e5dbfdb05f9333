//! This process's terminal, for `sandbox exec -t`: its size, and raw mode while a terminal
//! session lasts.

use anyhow::{Context, Result};
use rustix::termios::{self, OptionalActions, Termios};
use wire::TerminalSize;

/// Whether stdin is a terminal.
pub(crate) fn stdin_is_terminal() -> bool {
    termios::isatty(std::io::stdin())
}

/// The size of the terminal on stdout (else stdin); `None` when neither is one, and the
/// command's terminal keeps the default 24 by 80.
pub(crate) fn size() -> Option<TerminalSize> {
    let size = termios::tcgetwinsize(std::io::stdout())
        .or_else(|_| termios::tcgetwinsize(std::io::stdin()))
        .ok()?;
    (size.ws_row > 0 && size.ws_col > 0).then_some(TerminalSize {
        rows: size.ws_row,
        cols: size.ws_col,
    })
}

/// Stdin's terminal in raw mode (no echo, no line editing, keys such as Ctrl-C passed on as
/// bytes): the command's terminal does all that. Restored when dropped.
#[derive(Debug)]
pub(crate) struct RawMode {
    saved: Termios,
}

impl RawMode {
    pub(crate) fn enter() -> Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin).context("reading stdin's terminal settings")?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(&stdin, OptionalActions::Now, &raw)
            .context("putting stdin's terminal in raw mode")?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &self.saved);
    }
}
