//! The agent's log: one line per event on the console (VM) or stderr (host process).
//!
//! The console lines that other tools parse (`crucible-agent: ready …`, `crucible-selftest: …`)
//! go through [`console`], which is never filtered.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

/// How much the agent logs (`crucible.log=` / `--log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// Only the console contract lines.
    Quiet = 0,
    /// Errors.
    Error = 1,
    /// Errors and lifecycle events (default).
    Info = 2,
    /// Every request.
    Debug = 3,
}

impl Level {
    /// Parses `quiet`, `error`, `info` or `debug`.
    pub fn parse(s: &str) -> Option<Level> {
        match s {
            "quiet" | "off" | "0" => Some(Level::Quiet),
            "error" | "1" => Some(Level::Error),
            "info" | "2" => Some(Level::Info),
            "debug" | "3" => Some(Level::Debug),
            _ => None,
        }
    }

    /// The name [`Level::parse`] takes back.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Quiet => "quiet",
            Level::Error => "error",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);
static SINK: OnceLock<Mutex<Box<dyn Write + Send>>> = OnceLock::new();

/// Sets the log level.
pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Sends every line to `sink` (the console in a VM) instead of stderr. First call wins.
pub fn set_sink(sink: Box<dyn Write + Send>) {
    let _ = SINK.set(Mutex::new(sink));
}

fn enabled(level: Level) -> bool {
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
    if enabled(Level::Error) {
        emit(format_args!("crucible-agent: error: {msg}"));
    }
}

/// A lifecycle event.
pub fn info(msg: fmt::Arguments<'_>) {
    if enabled(Level::Info) {
        emit(format_args!("crucible-agent: {msg}"));
    }
}

/// Per-request detail.
pub fn debug(msg: fmt::Arguments<'_>) {
    if enabled(Level::Debug) {
        emit(format_args!("crucible-agent: debug: {msg}"));
    }
}
