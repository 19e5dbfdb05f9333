//! The client commands.

pub(crate) mod builtin_image;
pub(crate) mod cache;
pub(crate) mod cp;
pub(crate) mod cp_dir;
pub(crate) mod exec;
pub(crate) mod images;
pub(crate) mod run;
pub(crate) mod sandbox;
pub(crate) mod services;

/// Parses `K=V`.
pub(crate) fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}
