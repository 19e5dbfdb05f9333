//! The client commands.

pub mod builtin_image;
pub mod cache;
pub mod cp;
pub mod exec;
pub mod images;
pub mod run;
pub mod sandbox;

/// Parses `K=V`.
pub fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}
