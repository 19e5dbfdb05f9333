//! The characters of HTTP/1 syntax (RFC 9110 §5.6): tokens, field bytes, whitespace.

/// A token character (RFC 9110 §5.6.2): what methods, header names and codings are made of.
pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A non-empty run of token characters.
pub(crate) fn is_token(bytes: &[u8]) -> bool {
    !bytes.is_empty() && bytes.iter().all(|&b| is_tchar(b))
}

/// A byte a header value or reason phrase may hold: HTAB, SP, visible ASCII, or obs-text
/// (RFC 9110 §5.5); never NUL, CR, LF, DEL or another control character.
pub(crate) fn is_field_byte(b: u8) -> bool {
    b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80
}

/// Optional whitespace (RFC 9110 §5.6.3).
pub(crate) fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// `bytes` without optional whitespace at either end.
pub(crate) fn trim_ows(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|&b| !is_ows(b))
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|&b| !is_ows(b))
        .map_or(start, |i| i + 1);
    &bytes[start..end]
}
