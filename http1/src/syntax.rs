//! The grammar both heads share: lines and header field lines (characters: `chars`).

pub(crate) use crate::chars::{is_field_byte, is_ows, is_token, trim_ows};
use crate::end::head_end;
use crate::error::{quoted, HeadError};
use crate::headers::Header;
use crate::{Limits, LineEnds};

/// One line of a head, its line end removed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Line<'h> {
    /// 1-based, counting any empty lines before the start line.
    pub number: usize,
    pub text: &'h [u8],
}

/// A head split into its start line and its header field lines.
#[derive(Debug)]
pub(crate) struct Lines<'h> {
    pub start: Line<'h>,
    pub fields: Vec<Line<'h>>,
}

/// Checks that `head` is exactly one head within `limits` and splits it into lines: the start
/// line (empty lines before it skipped) and the field lines up to the empty line.
pub(crate) fn split_lines<'h>(head: &'h [u8], limits: &Limits) -> Result<Lines<'h>, HeadError> {
    if head.len() > limits.max_head_bytes {
        return Err(HeadError::TooLarge {
            limit: limits.max_head_bytes,
        });
    }
    match head_end(head, limits.max_head_bytes)? {
        None => return Err(HeadError::Incomplete),
        Some(end) if end < head.len() => {
            return Err(HeadError::BytesAfterHead {
                extra: head.len() - end,
            })
        }
        Some(_) => {}
    }
    // `head` ends with LF: the piece after it is empty and no line.
    let pieces = head.split(|&b| b == b'\n');
    let line_count = head.iter().filter(|&&b| b == b'\n').count();
    let mut start = None;
    let mut fields = Vec::new();
    for (index, piece) in pieces.take(line_count).enumerate() {
        let number = index + 1;
        let text = match piece.strip_suffix(b"\r") {
            Some(text) => text,
            None if limits.line_ends == LineEnds::CrlfOrBareLf => piece,
            None => return Err(HeadError::BareLf { line: number }),
        };
        if text.contains(&b'\r') {
            return Err(HeadError::BareCr { line: number });
        }
        let line = Line { number, text };
        match start {
            None if text.is_empty() => {}
            None => start = Some(line),
            // The empty line that ends the head: `head_end` said it is the last.
            Some(_) if text.is_empty() => break,
            Some(_) => {
                if fields.len() == limits.max_headers {
                    return Err(HeadError::TooManyHeaders {
                        limit: limits.max_headers,
                    });
                }
                fields.push(line);
            }
        }
    }
    // `head_end` found an end, which only comes after a start line.
    let start = start.ok_or(HeadError::Incomplete)?;
    Ok(Lines { start, fields })
}

/// Parses one header field line: `NAME ":" OWS VALUE OWS`.
pub(crate) fn parse_field(line: Line<'_>) -> Result<Header<'_>, HeadError> {
    let Line { number, text } = line;
    if text.first().copied().is_some_and(is_ows) {
        return Err(HeadError::ObsFold { line: number });
    }
    let colon = text
        .iter()
        .position(|&b| b == b':')
        .ok_or(HeadError::MissingColon { line: number })?;
    let name = &text[..colon];
    if name.last().copied().is_some_and(is_ows) {
        return Err(HeadError::WhitespaceBeforeColon {
            line: number,
            name: quoted(trim_ows(name)),
        });
    }
    let bad_name = || HeadError::BadHeaderName {
        line: number,
        name: quoted(name),
    };
    if !is_token(name) {
        return Err(bad_name());
    }
    let name = std::str::from_utf8(name).map_err(|_| bad_name())?;
    let value = trim_ows(&text[colon + 1..]);
    if let Some(&byte) = value.iter().find(|&&b| !is_field_byte(b)) {
        return Err(HeadError::ControlInValue {
            line: number,
            name: quoted(name.as_bytes()),
            byte,
        });
    }
    Ok(Header { name, value })
}

/// Parses the version of a start line: `HTTP/1.0` or `HTTP/1.1`; `None` if it is not of the
/// shape `HTTP/DIGIT.DIGIT` at all.
pub(crate) fn parse_version(text: &[u8]) -> Option<Result<crate::Version, HeadError>> {
    match text {
        b"HTTP/1.1" => Some(Ok(crate::Version::Http11)),
        b"HTTP/1.0" => Some(Ok(crate::Version::Http10)),
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            Some(Err(HeadError::UnsupportedVersion {
                version: quoted(text),
            }))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(text: &[u8]) -> Result<Header<'_>, HeadError> {
        parse_field(Line { number: 2, text })
    }

    #[test]
    fn tokens_are_the_rfc_9110_characters_only() {
        assert!(is_token(b"X-Custom_Header.1!#$%&'*+^`|~"));
        for bad in [
            &b""[..],
            b"a b",
            b"a:b",
            b"a\0",
            b"a\"",
            b"(a)",
            b"\xc3\xa9",
            b"a/b",
        ] {
            assert!(!is_token(bad), "{bad:?}");
        }
    }

    #[test]
    fn values_are_trimmed_of_surrounding_whitespace_only() {
        let header = field(b"X-A:\t  a \t b  \t").expect("valid");
        assert_eq!((header.name, header.value), ("X-A", &b"a \t b"[..]));
        assert_eq!(field(b"X-Empty:").expect("valid").value, b"");
        assert_eq!(field(b"X-Empty:   ").expect("valid").value, b"");
    }

    #[test]
    fn obs_text_and_tabs_are_values_but_control_characters_are_not() {
        assert_eq!(
            field(b"X: caf\xc3\xa9\x80").expect("obs-text").value,
            b"caf\xc3\xa9\x80"
        );
        for byte in (0u8..0x20).filter(|&b| b != b'\t').chain([0x7f]) {
            let text = [b"X: a".as_slice(), &[byte], b"b"].concat();
            assert_eq!(
                field(&text),
                Err(HeadError::ControlInValue {
                    line: 2,
                    name: "\"X\"".into(),
                    byte
                })
            );
        }
    }

    #[test]
    fn a_line_starting_with_whitespace_is_obs_fold() {
        assert_eq!(field(b" folded"), Err(HeadError::ObsFold { line: 2 }));
        assert_eq!(field(b"\tfolded: x"), Err(HeadError::ObsFold { line: 2 }));
    }

    #[test]
    fn whitespace_before_the_colon_is_refused() {
        assert_eq!(
            field(b"Content-Length : 5"),
            Err(HeadError::WhitespaceBeforeColon {
                line: 2,
                name: "\"Content-Length\"".into()
            })
        );
        assert!(matches!(
            field(b"Content-Length\t: 5"),
            Err(HeadError::WhitespaceBeforeColon { .. })
        ));
    }

    #[test]
    fn names_must_be_tokens_and_lines_need_a_colon() {
        assert_eq!(field(b"no colon"), Err(HeadError::MissingColon { line: 2 }));
        for bad in [
            &b": empty name"[..],
            b"X\0Y: v",
            b"X Y: v",
            b"\xc3\xa9: v",
            b"X\"Y: v",
        ] {
            assert!(
                matches!(field(bad), Err(HeadError::BadHeaderName { .. })),
                "{bad:?}"
            );
        }
        // The first colon ends the name: later ones are the value's.
        let header = field(b"Host: [::1]:8080").expect("valid");
        assert_eq!((header.name, header.value), ("Host", &b"[::1]:8080"[..]));
    }

    #[test]
    fn versions_are_1_0_and_1_1_and_others_are_named() {
        assert_eq!(parse_version(b"HTTP/1.1"), Some(Ok(crate::Version::Http11)));
        assert_eq!(parse_version(b"HTTP/1.0"), Some(Ok(crate::Version::Http10)));
        for other in [&b"HTTP/2.0"[..], b"HTTP/1.2", b"HTTP/0.9"] {
            assert!(matches!(
                parse_version(other),
                Some(Err(HeadError::UnsupportedVersion { .. }))
            ));
        }
        for garbage in [&b"http/1.1"[..], b"HTTP/1", b"HTTP/1.1 ", b"HTTP/11.1", b""] {
            assert_eq!(parse_version(garbage), None, "{garbage:?}");
        }
    }
}
