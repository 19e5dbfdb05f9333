//! A response head: what the client reads from the daemon before an exec's body, a hijacked
//! stream, or an error.

use crate::error::{quoted, HeadError};
use crate::headers::Headers;
use crate::syntax::{is_field_byte, parse_field, parse_version, split_lines};
use crate::{Limits, Version};

/// A parsed response head, borrowing the bytes it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead<'h> {
    version: Version,
    status: u16,
    reason: &'h [u8],
    headers: Headers<'h>,
}

impl<'h> ResponseHead<'h> {
    /// Parses `head`: exactly one response head, through its empty line, as
    /// [`crate::head_end`] delimits it. The status line is `VERSION SP 3DIGIT SP REASON`; the
    /// reason (and the space before it) may be missing, as servers do send
    /// `HTTP/1.1 200\r\n`. The header rules are [`Headers`]'; unlike a request, a response
    /// may end its codings with one other than chunked (its body then runs to the end of the
    /// connection).
    pub fn parse(head: &'h [u8], limits: &Limits) -> Result<ResponseHead<'h>, HeadError> {
        let lines = split_lines(head, limits)?;
        let line = lines.start.text;
        let bad_line = |why| HeadError::BadStatusLine {
            line: quoted(line),
            why,
        };
        let (version, rest) = match line.iter().position(|&b| b == b' ') {
            Some(space) => (&line[..space], &line[space + 1..]),
            None => (line, &b""[..]),
        };
        let version = match parse_version(version) {
            Some(version) => version?,
            None => return Err(bad_line("does not start with a version (HTTP/1.1)")),
        };
        let (code, reason) = match rest.iter().position(|&b| b == b' ') {
            Some(space) => (&rest[..space], &rest[space + 1..]),
            None => (rest, &b""[..]),
        };
        let status = match code {
            [a @ b'1'..=b'9', b, c] if b.is_ascii_digit() && c.is_ascii_digit() => {
                u16::from(a - b'0') * 100 + u16::from(b - b'0') * 10 + u16::from(c - b'0')
            }
            _ => return Err(bad_line("has no three-digit status code in 100..=999")),
        };
        if !reason.iter().all(|&b| is_field_byte(b)) {
            return Err(bad_line("has a control character in its reason phrase"));
        }
        let fields = lines
            .fields
            .into_iter()
            .map(parse_field)
            .collect::<Result<Vec<_>, _>>()?;
        let headers = Headers::new(fields, version)?;
        Ok(ResponseHead {
            version,
            status,
            reason,
            headers,
        })
    }

    /// The version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The status code, 100..=999.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The reason phrase, as sent (possibly empty; a client should not act on it).
    pub fn reason(&self) -> &'h [u8] {
        self.reason
    }

    /// The header fields.
    pub fn headers(&self) -> &Headers<'h> {
        &self.headers
    }

    /// Whether the connection stays open after this response (RFC 9112 §9.3).
    pub fn keep_alive(&self) -> bool {
        self.headers.keep_alive(self.version)
    }

    /// Whether this is `101 Switching Protocols` to `protocol` (Upgrade lists it): after this
    /// head the connection speaks `protocol`.
    pub fn switches_to(&self, protocol: &str) -> bool {
        self.status == 101 && self.headers.upgrade_lists(protocol)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &[u8]) -> Result<ResponseHead<'_>, HeadError> {
        ResponseHead::parse(head, &Limits::default())
    }

    #[test]
    fn parses_status_reason_and_headers() {
        let head = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n\
                     Transfer-Encoding: chunked\r\n\r\n";
        let response = parse(head).expect("valid");
        assert_eq!((response.status(), response.reason()), (200, &b"OK"[..]));
        assert_eq!(response.version(), Version::Http11);
        assert!(response.headers().is_chunked());
        assert_eq!(response.headers().content_length(), None);
        let error = parse(b"HTTP/1.1 404 Not Found\r\nContent-Length: 12\r\n\r\n").expect("valid");
        assert_eq!(
            (error.status(), error.headers().content_length()),
            (404, Some(12))
        );
        assert_eq!(error.reason(), b"Not Found");
    }

    #[test]
    fn the_reason_may_be_missing_or_empty() {
        assert_eq!(parse(b"HTTP/1.1 204\r\n\r\n").expect("valid").reason(), b"");
        assert_eq!(
            parse(b"HTTP/1.0 200 \r\n\r\n").expect("valid").reason(),
            b""
        );
        let odd = parse(b"HTTP/1.1 200 All \t good\xff\r\n\r\n").expect("valid");
        assert_eq!(odd.reason(), b"All \t good\xff");
    }

    #[test]
    fn status_codes_are_three_digits_from_100() {
        for head in [
            &b"HTTP/1.1 99 Low\r\n\r\n"[..],
            b"HTTP/1.1 1000 High\r\n\r\n",
            b"HTTP/1.1 099 Zero\r\n\r\n",
            b"HTTP/1.1 2x0 Hex\r\n\r\n",
            b"HTTP/1.1  200 Two spaces\r\n\r\n",
            b"HTTP/1.1\r\n\r\n",
            b"HTTP/1.1 200 Bad\x01\r\n\r\n",
            b"garbage\r\n\r\n",
            b"ICY 200 OK\r\n\r\n",
        ] {
            assert!(
                matches!(parse(head), Err(HeadError::BadStatusLine { .. })),
                "{head:?}: {:?}",
                parse(head)
            );
        }
        assert!(matches!(
            parse(b"HTTP/2.0 200 OK\r\n\r\n"),
            Err(HeadError::UnsupportedVersion { .. })
        ));
        assert_eq!(
            parse(b"HTTP/1.1 999 Max\r\n\r\n").map(|r| r.status()),
            Ok(999)
        );
    }

    #[test]
    fn a_101_says_which_protocol_the_connection_switches_to() {
        let head =
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: tcp\r\nConnection: Upgrade\r\n\r\n";
        let response = parse(head).expect("valid");
        assert!(response.switches_to("tcp"));
        assert!(!response.switches_to("websocket"));
        let not_101 = parse(b"HTTP/1.1 200 OK\r\nUpgrade: tcp\r\n\r\n").expect("valid");
        assert!(!not_101.switches_to("tcp"));
    }

    #[test]
    fn a_response_may_end_its_codings_without_chunked() {
        let response = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n").expect("valid");
        assert!(!response.headers().is_chunked());
        assert!(response.headers().has_transfer_encoding());
    }

    #[test]
    fn responses_obey_the_same_header_rules_as_requests() {
        for (head, expected) in [
            (
                &b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n"[..],
                HeadError::DuplicateHeader {
                    name: "Content-Length",
                },
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                HeadError::LengthAndTransferEncoding,
            ),
            (
                b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n",
                HeadError::ObsFold { line: 3 },
            ),
            (b"HTTP/1.1 200 OK\nX: a\n\n", HeadError::BareLf { line: 1 }),
            (
                b"HTTP/1.1 200 OK\r\n\r\nbody",
                HeadError::BytesAfterHead { extra: 4 },
            ),
        ] {
            assert_eq!(
                parse(head),
                Err(expected),
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection() {
        assert!(!parse(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            .expect("valid")
            .keep_alive());
        assert!(parse(b"HTTP/1.1 200 OK\r\n\r\n")
            .expect("valid")
            .keep_alive());
        assert!(!parse(b"HTTP/1.0 200 OK\r\n\r\n")
            .expect("valid")
            .keep_alive());
    }
}
