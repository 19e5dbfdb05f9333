//! The agent's log: one line per event on the console (VM) or stderr (host process).
//!
//! The console lines that other tools parse (`crucible-agent: ready …`, `crucible-selftest: …`)
//! go through [`console`], which is never filtered.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

/// How much the agent logs (`crucible.log=` / `--log`): the contract's type, as the host
/// writes it on the kernel command line.
pub use contract::cmdline::LogLevel;

static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Info as u8);
static SINK: OnceLock<Mutex<Box<dyn Write + Send>>> = OnceLock::new();

/// Sets the log level.
pub fn set_level(level: LogLevel) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Sends every line to `sink` (the console in a VM) instead of stderr. First call wins.
pub fn set_sink(sink: Box<dyn Write + Send>) {
    let _ = SINK.set(Mutex::new(sink));
}

fn enabled(level: LogLevel) -> bool {
    LEVEL.load(Ordering::Relaxed) >= level as u8
}

fn emit(line: fmt::Arguments<'_>) {
    match SINK.get() {
        Some(sink) => {
            let mut sink = sink.lock().unwrap_or_else(|p| p.into_inner());
            let _ = writeln!(sink, "{line}");
            let _ = sink.flush();
        }
        None => {
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
    }
}

/// A line of the console contract, always printed.
pub fn console(line: fmt::Arguments<'_>) {
    emit(line);
}

/// An error.
pub fn error(msg: fmt::Arguments<'_>) {
    if enabled(LogLevel::Error) {
        emit(format_args!("crucible-agent: error: {msg}"));
    }
}

/// A lifecycle event.
pub fn info(msg: fmt::Arguments<'_>) {
    if enabled(LogLevel::Info) {
        emit(format_args!("crucible-agent: {msg}"));
    }
}

/// Per-request detail.
pub fn debug(msg: fmt::Arguments<'_>) {
    if enabled(LogLevel::Debug) {
        emit(format_args!("crucible-agent: debug: {msg}"));
    }
}
