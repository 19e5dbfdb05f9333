//! JSON request documents: objects only, and errors that say what is wrong.

/// A body that is not the JSON object it should be; the message says what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidJson(String);

/// Parses a JSON object into `T`. Only an object will do: serde would otherwise take an array
/// as the struct's fields in order (`[null, null]`).
pub fn parse_json<T: serde::de::DeserializeOwned>(
    body: &[u8],
    what: &str,
) -> Result<T, InvalidJson> {
    let Some(&first) = body.iter().find(|b| !b.is_ascii_whitespace()) else {
        return Err(InvalidJson(format!(
            "the request body must be a JSON {what}, got nothing"
        )));
    };
    if first != b'{' {
        return Err(InvalidJson(format!(
            "the request body must be a JSON object (a {what}), got {:?}…",
            String::from_utf8_lossy(&body[..body.len().min(16)])
        )));
    }
    serde_json::from_slice(body)
        .map_err(|e| InvalidJson(format!("the request body is not a valid {what}: {e}")))
}

/// The ExecRequest in a request body, or why it is not one (refused before admission, as an
/// invalid request).
pub(crate) fn parse_exec_request(
    body: &[u8],
) -> Result<wire::ExecRequest, engine::exec::AdmitError> {
    parse_json(body, "ExecRequest").map_err(|e| engine::exec::AdmitError::Invalid(e.to_string()))
}
