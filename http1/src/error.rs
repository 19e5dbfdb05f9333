//! Why a head was refused. Every message names the line, header or value at fault; text from
//! the peer is quoted and cut short, as it goes into answers and logs.

/// Why a head (or what was read of one) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// `limit` bytes arrived without the empty line that ends a head.
    #[error("the head is larger than {limit} bytes")]
    TooLarge {
        /// [`crate::Limits::max_head_bytes`].
        limit: usize,
    },
    /// The head has more header fields than allowed.
    #[error("the head has more than {limit} header fields")]
    TooManyHeaders {
        /// [`crate::Limits::max_headers`].
        limit: usize,
    },
    /// The bytes given to a parser do not end with the empty line that ends a head.
    #[error("the head is incomplete: it does not end with an empty line")]
    Incomplete,
    /// The bytes given to a parser go on past the head's empty line.
    #[error("{extra} bytes follow the head's empty line: parse only the head, up to head_end")]
    BytesAfterHead {
        /// How many bytes follow the head.
        extra: usize,
    },
    /// A line ends with LF alone while only CRLF is accepted.
    #[error("line {line} of the head ends with a bare LF, not CRLF")]
    BareLf {
        /// The line (1-based).
        line: usize,
    },
    /// A CR that is not part of a line's CRLF (RFC 9112 §2.2 makes it invalid).
    #[error("line {line} of the head holds a CR that does not end it")]
    BareCr {
        /// The line (1-based).
        line: usize,
    },
    /// The request line is not `METHOD SP TARGET SP VERSION`.
    #[error("the request line {line} {why}")]
    BadRequestLine {
        /// The line, quoted.
        line: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The method is not a token (RFC 9110 §9.1).
    #[error("the method {method} is not a token (letters, digits and !#$%&'*+-.^_`|~)")]
    BadMethod {
        /// The method, quoted.
        method: String,
    },
    /// The request target fits none of its four forms, or its host or port is invalid.
    #[error("the request target {target} {why}")]
    BadTarget {
        /// The target, quoted.
        target: String,
        /// What is wrong with it.
        why: String,
    },
    /// A version other than HTTP/1.0 and HTTP/1.1.
    #[error("the version {version} is not HTTP/1.0 or HTTP/1.1")]
    UnsupportedVersion {
        /// The version, quoted.
        version: String,
    },
    /// The status line is not `VERSION SP 3DIGIT [SP REASON]`.
    #[error("the status line {line} {why}")]
    BadStatusLine {
        /// The line, quoted.
        line: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A header line starts with whitespace: obsolete line folding, which a proxy and the
    /// server behind it may join differently.
    #[error(
        "line {line} of the head starts with whitespace: obsolete line folding \
         (RFC 9112 §5.2) is refused"
    )]
    ObsFold {
        /// The line (1-based).
        line: usize,
    },
    /// A header line without a colon.
    #[error("line {line} of the head has no colon: a header field is NAME: VALUE")]
    MissingColon {
        /// The line (1-based).
        line: usize,
    },
    /// Whitespace between a header name and its colon (RFC 9112 §5.1: a server must refuse
    /// it, as others strip it and see another header).
    #[error("line {line} of the head has whitespace between the header name {name} and its colon")]
    WhitespaceBeforeColon {
        /// The line (1-based).
        line: usize,
        /// The name, quoted.
        name: String,
    },
    /// A header name that is empty or not a token.
    #[error("line {line} of the head: the header name {name} is not a token")]
    BadHeaderName {
        /// The line (1-based).
        line: usize,
        /// The name, quoted.
        name: String,
    },
    /// A header value with a control character (NUL, say) other than a tab.
    #[error(
        "line {line} of the head: the value of {name} holds the control character {byte:#04x}"
    )]
    ControlInValue {
        /// The line (1-based).
        line: usize,
        /// The header name, quoted.
        name: String,
        /// The control character.
        byte: u8,
    },
    /// More than one of a header that may appear once ([`crate::SINGLETON_HEADERS`]).
    #[error("the head has more than one {name} header")]
    DuplicateHeader {
        /// The header's name.
        name: &'static str,
    },
    /// A Content-Length that is not a plain decimal number that fits in 64 bits.
    #[error("Content-Length {value} is not a decimal number of bytes below 2^64")]
    BadContentLength {
        /// The value, quoted.
        value: String,
    },
    /// Content-Length and Transfer-Encoding together: the framing is ambiguous (RFC 9112
    /// §6.1), the request-smuggling shape.
    #[error(
        "the head has both Content-Length and Transfer-Encoding, which frame the body \
         differently (RFC 9112 §6.1): send one"
    )]
    LengthAndTransferEncoding,
    /// A Transfer-Encoding this crate cannot frame a body by.
    #[error("Transfer-Encoding {value} {why}")]
    BadTransferEncoding {
        /// The values of every Transfer-Encoding header, joined and quoted.
        value: String,
        /// What is wrong with them.
        why: &'static str,
    },
    /// Transfer-Encoding in an HTTP/1.0 message, whose recipients do not know it (RFC 9112
    /// §6.1 says to treat the framing as faulty).
    #[error(
        "an HTTP/1.0 head has Transfer-Encoding, which HTTP/1.0 does not know (RFC 9112 §6.1)"
    )]
    TransferEncodingInHttp10,
}

impl HeadError {
    /// The status a server answers this error with: 431 for a head over a limit, 505 for a
    /// version it does not speak, 400 for everything else.
    pub fn status(&self) -> u16 {
        match self {
            HeadError::TooLarge { .. } | HeadError::TooManyHeaders { .. } => 431,
            HeadError::UnsupportedVersion { .. } => 505,
            _ => 400,
        }
    }
}

/// The most characters of peer text an error message quotes.
const QUOTE_MAX: usize = 100;

/// `bytes` quoted for an error message (invalid UTF-8 replaced, escapes shown), cut short.
pub(crate) fn quoted(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    match text.char_indices().nth(QUOTE_MAX) {
        Some((cut, _)) => format!("{:?}…", &text[..cut]),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_escape_control_characters_and_cut_long_text() {
        assert_eq!(quoted(b"a\0b"), "\"a\\0b\"");
        let long = quoted(&[b'x'; 1000]);
        assert!(long.len() < QUOTE_MAX + 10, "{long}");
        assert!(long.ends_with('…'));
        assert_eq!(quoted(b"\xff"), "\"\u{fffd}\"");
    }

    #[test]
    fn limits_map_to_431_versions_to_505_the_rest_to_400() {
        assert_eq!(HeadError::TooLarge { limit: 1 }.status(), 431);
        assert_eq!(HeadError::TooManyHeaders { limit: 1 }.status(), 431);
        let version = HeadError::UnsupportedVersion {
            version: "\"HTTP/2.0\"".into(),
        };
        assert_eq!(version.status(), 505);
        assert_eq!(HeadError::LengthAndTransferEncoding.status(), 400);
    }
}
