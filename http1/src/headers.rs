//! A head's header fields, in order, with the framing rules both requests and responses obey
//! checked once at parse time.

use crate::chars::{is_token, trim_ows};
use crate::error::{quoted, HeadError};
use crate::Version;

/// Headers that may appear at most once (their display names). A second Content-Length or Host
/// is how requests are smuggled past a proxy that reads the first while the server reads the
/// last; a second (Proxy-)Authorization is how one caller is checked and another served.
/// Even two that agree are refused: nobody legitimate sends them.
pub const SINGLETON_HEADERS: [&str; 4] = [
    "Content-Length",
    "Host",
    "Authorization",
    "Proxy-Authorization",
];

/// One header field: its name (a token, as sent) and its value (without surrounding
/// whitespace; never CR, LF, NUL or another control character but a tab).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'h> {
    /// The name, as sent (compare it case-insensitively).
    pub name: &'h str,
    /// The value: visible ASCII, spaces, tabs, and possibly obs-text (bytes >= 0x80).
    pub value: &'h [u8],
}

impl<'h> Header<'h> {
    /// The value as text, if it is UTF-8.
    pub fn value_str(&self) -> Option<&'h str> {
        std::str::from_utf8(self.value).ok()
    }
}

/// A head's header fields, in the order sent, validated: no duplicate
/// [`SINGLETON_HEADERS`], a Content-Length that is a number, no Content-Length beside
/// Transfer-Encoding, Transfer-Encoding only in HTTP/1.1 and with `chunked` at most once and
/// last if at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Headers<'h> {
    fields: Vec<Header<'h>>,
    content_length: Option<u64>,
    chunked: bool,
}

impl<'h> Headers<'h> {
    /// Checks the framing rules every head obeys.
    pub(crate) fn new(fields: Vec<Header<'h>>, version: Version) -> Result<Self, HeadError> {
        for name in SINGLETON_HEADERS {
            if fields
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(name))
                .nth(1)
                .is_some()
            {
                return Err(HeadError::DuplicateHeader { name });
            }
        }
        let mut headers = Headers {
            fields,
            content_length: None,
            chunked: false,
        };
        if let Some(value) = headers.get("content-length") {
            headers.content_length = Some(parse_content_length(value)?);
        }
        if headers.contains("transfer-encoding") {
            if headers.content_length.is_some() {
                return Err(HeadError::LengthAndTransferEncoding);
            }
            if version == Version::Http10 {
                return Err(HeadError::TransferEncodingInHttp10);
            }
            headers.chunked = headers.check_transfer_codings()?;
        }
        Ok(headers)
    }

    /// Whether the final transfer coding is `chunked`, after checking that every coding is a
    /// token and that `chunked` comes at most once, and last.
    fn check_transfer_codings(&self) -> Result<bool, HeadError> {
        let bad = |why| HeadError::BadTransferEncoding {
            value: quoted(
                &self
                    .all("transfer-encoding")
                    .collect::<Vec<_>>()
                    .join(&b", "[..]),
            ),
            why,
        };
        let mut codings = 0;
        let mut chunked_seen = false;
        let mut last_is_chunked = false;
        for element in self.list("transfer-encoding") {
            // A coding may have parameters (`gzip;level=1`): its name comes first.
            let name = element
                .split(|&b| b == b';')
                .next()
                .map_or(&b""[..], trim_ows);
            if !is_token(name) {
                return Err(bad("names a coding that is not a token"));
            }
            let chunked = name.eq_ignore_ascii_case(b"chunked");
            if chunked && chunked_seen {
                return Err(bad("applies chunked twice (RFC 9112 §6.1)"));
            }
            if chunked_seen {
                return Err(bad(
                    "has a coding after chunked, which must be last (RFC 9112 §6.1)",
                ));
            }
            chunked_seen |= chunked;
            last_is_chunked = chunked;
            codings += 1;
        }
        if codings == 0 {
            return Err(bad("names no transfer coding"));
        }
        Ok(last_is_chunked)
    }

    /// Every field, in the order sent.
    pub fn as_slice(&self) -> &[Header<'h>] {
        &self.fields
    }

    /// Every field, in the order sent.
    pub fn iter(&self) -> std::slice::Iter<'_, Header<'h>> {
        self.fields.iter()
    }

    /// How many fields there are.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The value of the first field named `name` (case-insensitive). A
    /// [`SINGLETON_HEADERS`] name has at most one; for a list (`Connection`, say) see
    /// [`Headers::list`].
    pub fn get(&self, name: &str) -> Option<&'h [u8]> {
        self.all(name).next()
    }

    /// [`Headers::get`] as text, if it is UTF-8.
    pub fn get_str(&self, name: &str) -> Option<&'h str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Whether a field named `name` (case-insensitive) is present, even with an empty value.
    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The values of every field named `name` (case-insensitive), in order.
    pub fn all<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'h [u8]> + 's {
        self.fields
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }

    /// The elements of a comma-separated list header across every field named `name`, each
    /// without surrounding whitespace, empty elements skipped (RFC 9110 §5.6.1). Quoted
    /// strings are not unquoted: the list headers read here hold tokens.
    pub fn list<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'h [u8]> + 's {
        self.all(name)
            .flat_map(|value| value.split(|&b| b == b','))
            .map(trim_ows)
            .filter(|element| !element.is_empty())
    }

    /// The body length Content-Length declares (checked at parse time: digits only, one
    /// header, no Transfer-Encoding beside it).
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    /// Whether the body is in chunked transfer coding: `chunked` is the final coding of
    /// Transfer-Encoding (not merely somewhere in it).
    pub fn is_chunked(&self) -> bool {
        self.chunked
    }

    /// Whether Transfer-Encoding is present (the body's framing is then the codings', never a
    /// length).
    pub fn has_transfer_encoding(&self) -> bool {
        self.contains("transfer-encoding")
    }

    /// The transfer codings, in the order applied, parameters included.
    pub fn transfer_codings(&self) -> impl Iterator<Item = &'h [u8]> + '_ {
        self.list("transfer-encoding")
    }

    /// The options of every Connection header (`close`, `keep-alive`, `upgrade`, or the names
    /// of headers meant for this hop only).
    pub fn connection_tokens(&self) -> impl Iterator<Item = &'h [u8]> + '_ {
        self.list("connection")
    }

    /// Whether Connection lists `token` (case-insensitive).
    pub fn connection_has(&self, token: &str) -> bool {
        self.connection_tokens()
            .any(|t| t.eq_ignore_ascii_case(token.as_bytes()))
    }

    /// The protocols Upgrade lists (`websocket`, `tcp`, `HTTP/2.0`), in order of preference.
    pub fn upgrade_protocols(&self) -> impl Iterator<Item = &'h [u8]> + '_ {
        self.list("upgrade")
    }

    /// Whether Upgrade lists `protocol` (case-insensitive): exactly, or, for a `protocol`
    /// without a version, with any version (`websocket` matches `WebSocket/13`).
    pub fn upgrade_lists(&self, protocol: &str) -> bool {
        let wanted = protocol.as_bytes();
        self.upgrade_protocols().any(|listed| {
            listed.eq_ignore_ascii_case(wanted)
                || (!wanted.contains(&b'/')
                    && listed
                        .split(|&b| b == b'/')
                        .next()
                        .is_some_and(|name| name.eq_ignore_ascii_case(wanted)))
        })
    }

    /// Whether the connection stays open after this message under `version`'s rules (RFC
    /// 9112 §9.3): not if Connection says `close`; by default in HTTP/1.1; in HTTP/1.0 only
    /// if Connection says `keep-alive`.
    pub(crate) fn keep_alive(&self, version: Version) -> bool {
        if self.connection_has("close") {
            return false;
        }
        version == Version::Http11 || self.connection_has("keep-alive")
    }
}

impl<'a, 'h> IntoIterator for &'a Headers<'h> {
    type Item = &'a Header<'h>;
    type IntoIter = std::slice::Iter<'a, Header<'h>>;

    fn into_iter(self) -> Self::IntoIter {
        self.fields.iter()
    }
}

/// `1*DIGIT` (RFC 9110 §8.6) that fits in 64 bits. A list (`5, 5`), a sign, spaces inside
/// or hex are refused: recipients that read them differently would frame the body
/// differently.
fn parse_content_length(value: &[u8]) -> Result<u64, HeadError> {
    let bad = || HeadError::BadContentLength {
        value: quoted(value),
    };
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    std::str::from_utf8(value)
        .ok()
        .and_then(|digits| digits.parse().ok())
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers<'a>(fields: &[(&'a str, &'a [u8])]) -> Result<Headers<'a>, HeadError> {
        headers_in(fields, Version::Http11)
    }

    fn headers_in<'a>(
        fields: &[(&'a str, &'a [u8])],
        version: Version,
    ) -> Result<Headers<'a>, HeadError> {
        let fields = fields
            .iter()
            .map(|&(name, value)| Header { name, value })
            .collect();
        Headers::new(fields, version)
    }

    #[test]
    fn lookups_ignore_case_and_keep_order() {
        let h = headers(&[("Host", b"a"), ("X-B", b"1"), ("x-b", b"2")]).expect("valid");
        assert_eq!(h.get("HOST"), Some(&b"a"[..]));
        assert_eq!(h.get_str("host"), Some("a"));
        assert_eq!(h.all("X-b").collect::<Vec<_>>(), [b"1", b"2"]);
        assert_eq!(h.get("x-b"), Some(&b"1"[..]));
        assert!(!h.contains("x-c"));
        let names: Vec<_> = h.iter().map(|f| f.name).collect();
        assert_eq!(names, ["Host", "X-B", "x-b"]);
    }

    #[test]
    fn a_second_singleton_header_is_refused_even_when_it_agrees() {
        for name in SINGLETON_HEADERS {
            let lower = name.to_ascii_lowercase();
            let result = headers(&[(name, b"5"), (&lower, b"5")]);
            assert_eq!(result, Err(HeadError::DuplicateHeader { name }), "{name}");
        }
    }

    #[test]
    fn content_length_is_digits_only_and_fits_64_bits() {
        let h = headers(&[("Content-Length", b"0042")]).expect("valid");
        assert_eq!(h.content_length(), Some(42));
        let max = headers(&[("content-length", b"18446744073709551615")]).expect("u64::MAX");
        assert_eq!(max.content_length(), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"-1",
            b"+5",
            b"0x10",
            b"5 5",
            b"5, 5",
            b"1e3",
            b"18446744073709551616",
            b"\xd9\xa5",
        ] {
            assert!(
                matches!(
                    headers(&[("Content-Length", bad)]),
                    Err(HeadError::BadContentLength { .. })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(headers(&[]).expect("valid").content_length(), None);
    }

    #[test]
    fn content_length_beside_transfer_encoding_is_refused() {
        assert_eq!(
            headers(&[("Content-Length", b"5"), ("Transfer-Encoding", b"chunked")]),
            Err(HeadError::LengthAndTransferEncoding)
        );
        assert_eq!(
            headers(&[("Transfer-Encoding", b"chunked"), ("content-length", b"0")]),
            Err(HeadError::LengthAndTransferEncoding)
        );
    }

    #[test]
    fn chunked_is_the_final_coding_not_a_substring() {
        let chunked = |value: &'static [u8]| headers(&[("Transfer-Encoding", value)]);
        assert!(chunked(b"chunked").expect("valid").is_chunked());
        assert!(chunked(b"CHUNKED").expect("valid").is_chunked());
        assert!(chunked(b"gzip, chunked").expect("valid").is_chunked());
        assert!(chunked(b"gzip;level=1 , ,chunked")
            .expect("valid")
            .is_chunked());
        // Codings listed over several headers are one list.
        let split = headers(&[
            ("Transfer-Encoding", b"gzip"),
            ("transfer-encoding", b"chunked"),
        ])
        .expect("valid");
        assert!(split.is_chunked());
        assert_eq!(
            split.transfer_codings().collect::<Vec<_>>(),
            [b"gzip".as_slice(), b"chunked"]
        );
        // Not chunked: the body runs to the end of the connection (a response's business).
        assert!(!chunked(b"gzip").expect("valid").is_chunked());
        assert!(!chunked(b"xchunkedy").expect("valid").is_chunked());
    }

    #[test]
    fn chunked_twice_or_not_last_and_malformed_codings_are_refused() {
        for (value, why) in [
            (&b"chunked, chunked"[..], "twice"),
            (b"chunked, gzip", "after chunked"),
            (b"", "no transfer coding"),
            (b" , ", "no transfer coding"),
            (b"gzip deflate", "not a token"),
            (b"\"chunked\"", "not a token"),
        ] {
            match headers(&[("Transfer-Encoding", value)]) {
                Err(HeadError::BadTransferEncoding { why: said, .. }) => {
                    assert!(said.contains(why), "{value:?}: {said}")
                }
                other => panic!("{value:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn transfer_encoding_in_http_1_0_is_refused() {
        assert_eq!(
            headers_in(&[("Transfer-Encoding", b"chunked")], Version::Http10),
            Err(HeadError::TransferEncodingInHttp10)
        );
        assert!(headers_in(&[("Content-Length", b"1")], Version::Http10).is_ok());
    }

    #[test]
    fn connection_options_are_a_list_across_headers() {
        let h = headers(&[
            ("Connection", b"keep-alive, X-Secret"),
            ("connection", b" ,Upgrade"),
        ])
        .expect("valid");
        assert_eq!(
            h.connection_tokens().collect::<Vec<_>>(),
            [b"keep-alive".as_slice(), b"X-Secret", b"Upgrade"]
        );
        assert!(h.connection_has("upgrade") && h.connection_has("x-secret"));
        assert!(!h.connection_has("close"));
    }

    #[test]
    fn keep_alive_follows_the_version_and_connection() {
        let none = headers(&[]).expect("valid");
        assert!(none.keep_alive(Version::Http11));
        assert!(!none.keep_alive(Version::Http10));
        let close = headers(&[("Connection", b"keep-alive, close")]).expect("valid");
        assert!(!close.keep_alive(Version::Http11));
        let keep = headers(&[("Connection", b"Keep-Alive")]).expect("valid");
        assert!(keep.keep_alive(Version::Http10));
    }

    #[test]
    fn upgrade_protocols_match_by_name_or_exactly() {
        let h = headers(&[("Upgrade", b"WebSocket/13, tcp")]).expect("valid");
        assert!(h.upgrade_lists("websocket"));
        assert!(h.upgrade_lists("websocket/13"));
        assert!(!h.upgrade_lists("websocket/14"));
        assert!(h.upgrade_lists("TCP"));
        assert!(!h.upgrade_lists("h2c"));
        assert!(!headers(&[]).expect("valid").upgrade_lists("tcp"));
    }
}
