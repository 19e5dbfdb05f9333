//! Ids and clocks every part of the engine shares: sandbox and exec ids, Unix milliseconds.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix milliseconds now.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A fresh sandbox id: `sb-` and 16 random hex digits.
pub(crate) fn new_id() -> String {
    random_id("sb-")
}

/// `prefix` and 16 random hex digits.
pub(crate) fn random_id(prefix: &str) -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        // The kernel's RNG is always there on Linux; fall back to time-based bits regardless.
        bytes = (unix_ms() ^ u64::from(std::process::id()).rotate_left(32)).to_be_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{hex}")
}

/// Whether `id` has the shape of a sandbox id (so a bad id is a 400, an unknown one a 404).
pub(crate) fn is_valid_id(id: &str) -> bool {
    id.strip_prefix("sb-")
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}
