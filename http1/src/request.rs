//! A request head: what the daemon's front door and the egress proxy read.

use crate::error::{quoted, HeadError};
use crate::headers::Headers;
use crate::syntax::{is_token, parse_field, parse_version, split_lines};
use crate::target::{classify, is_target_byte, RequestTarget};
use crate::{Limits, Version};

/// A parsed request head, borrowing the bytes it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead<'h> {
    method: &'h str,
    target: &'h str,
    form: RequestTarget<'h>,
    version: Version,
    headers: Headers<'h>,
}

impl<'h> RequestHead<'h> {
    /// Parses `head`: exactly one request head, through its empty line, as [`crate::head_end`]
    /// delimits it (the bytes past that are the body: pass `&buf[..end]`). On top of the
    /// grammar (RFC 9112), refuses what a proxy and a server may read differently: see
    /// [`HeadError`] and [`Headers`]. A request body must be framed by Content-Length or by
    /// chunked as the final transfer coding (RFC 9112 §6.3).
    pub fn parse(head: &'h [u8], limits: &Limits) -> Result<RequestHead<'h>, HeadError> {
        let lines = split_lines(head, limits)?;
        let line = lines.start.text;
        let bad_line = |why| HeadError::BadRequestLine {
            line: quoted(line),
            why,
        };
        let mut parts = line.split(|&b| b == b' ');
        let (Some(method), Some(target), Some(version), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad_line(
                "is not METHOD TARGET VERSION separated by single spaces",
            ));
        };
        let bad_method = || HeadError::BadMethod {
            method: quoted(method),
        };
        if !is_token(method) {
            return Err(bad_method());
        }
        let method = std::str::from_utf8(method).map_err(|_| bad_method())?;
        let version = match parse_version(version) {
            Some(version) => version?,
            None => return Err(bad_line("does not end with a version (HTTP/1.1)")),
        };
        let bad_target = |why: String| HeadError::BadTarget {
            target: quoted(target),
            why,
        };
        if target.is_empty() {
            return Err(bad_target("is empty".into()));
        }
        if let Some(&b) = target.iter().find(|&&b| !is_target_byte(b)) {
            return Err(bad_target(format!(
                "holds the byte {b:#04x}: a target is visible ASCII only"
            )));
        }
        let target = std::str::from_utf8(target).map_err(|_| bad_target("is not ASCII".into()))?;
        let form = classify(method, target)?;
        let fields = lines
            .fields
            .into_iter()
            .map(parse_field)
            .collect::<Result<Vec<_>, _>>()?;
        let headers = Headers::new(fields, version)?;
        if headers.has_transfer_encoding() && !headers.is_chunked() {
            return Err(HeadError::BadTransferEncoding {
                value: quoted(
                    &headers
                        .all("transfer-encoding")
                        .collect::<Vec<_>>()
                        .join(&b", "[..]),
                ),
                why: "does not end with chunked, so the request body's length cannot be known \
                      (RFC 9112 §6.3)",
            });
        }
        Ok(RequestHead {
            method,
            target,
            form,
            version,
            headers,
        })
    }

    /// The method, as sent (methods are case-sensitive: `GET`, not `get`).
    pub fn method(&self) -> &'h str {
        self.method
    }

    /// The request target, as sent.
    pub fn target(&self) -> &'h str {
        self.target
    }

    /// The request target, split by its form.
    pub fn target_form(&self) -> RequestTarget<'h> {
        self.form
    }

    /// The version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The header fields.
    pub fn headers(&self) -> &Headers<'h> {
        &self.headers
    }

    /// The Host header, if sent (at most one: a second is refused at parse time). HTTP/1.1
    /// makes it mandatory; whether to insist is the caller's choice.
    pub fn host(&self) -> Option<&'h [u8]> {
        self.headers.get("host")
    }

    /// Whether the connection stays open after this request's response (RFC 9112 §9.3).
    pub fn keep_alive(&self) -> bool {
        self.headers.keep_alive(self.version)
    }

    /// Whether the request asks to switch to `protocol` (`websocket`, `tcp`): HTTP/1.1 (a
    /// server ignores Upgrade in HTTP/1.0, RFC 9110 §7.8), Connection lists `upgrade`, and
    /// Upgrade lists `protocol`. A request with Upgrade but not these is an ordinary one to
    /// RFC 9110; a caller that must hand any Upgrade header elsewhere checks
    /// `headers().contains("upgrade")`.
    pub fn wants_upgrade(&self, protocol: &str) -> bool {
        self.version == Version::Http11
            && self.headers.connection_has("upgrade")
            && self.headers.upgrade_lists(protocol)
    }

    /// Whether the client waits for `100 Continue` before sending its body.
    pub fn expects_continue(&self) -> bool {
        self.headers
            .list("expect")
            .any(|e| e.eq_ignore_ascii_case(b"100-continue"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Authority;
    use crate::LineEnds;

    fn parse(head: &[u8]) -> Result<RequestHead<'_>, HeadError> {
        RequestHead::parse(head, &Limits::default())
    }

    fn lenient() -> Limits {
        Limits {
            line_ends: LineEnds::CrlfOrBareLf,
            ..Limits::default()
        }
    }

    #[test]
    fn parses_the_request_line_and_the_headers_in_order() {
        let head = b"POST /sandboxes/sb-1/exec?stdin=1 HTTP/1.1\r\nHost: x\r\n\
                     Authorization: Bearer k\r\nContent-Length: 17\r\nX-Empty:\r\n\r\n";
        let request = parse(head).expect("valid");
        assert_eq!(request.method(), "POST");
        assert_eq!(request.target(), "/sandboxes/sb-1/exec?stdin=1");
        assert_eq!(
            request.target_form(),
            RequestTarget::Origin {
                path: "/sandboxes/sb-1/exec",
                query: Some("stdin=1")
            }
        );
        assert_eq!(request.version(), Version::Http11);
        assert_eq!(request.host(), Some(&b"x"[..]));
        assert_eq!(
            request.headers().get("authorization"),
            Some(&b"Bearer k"[..])
        );
        assert_eq!(request.headers().content_length(), Some(17));
        let fields: Vec<_> = request
            .headers()
            .iter()
            .map(|h| (h.name, h.value))
            .collect();
        assert_eq!(
            fields,
            [
                ("Host", &b"x"[..]),
                ("Authorization", b"Bearer k"),
                ("Content-Length", b"17"),
                ("X-Empty", b"")
            ]
        );
        assert!(request.keep_alive());
    }

    #[test]
    fn a_head_without_headers_parses() {
        let request = parse(b"GET / HTTP/1.0\r\n\r\n").expect("valid");
        assert_eq!(request.version(), Version::Http10);
        assert!(request.headers().is_empty());
        assert!(!request.keep_alive());
    }

    #[test]
    fn empty_lines_before_the_request_line_are_skipped() {
        let request = parse(b"\r\n\r\nGET / HTTP/1.1\r\n\r\n").expect("valid");
        assert_eq!(request.target(), "/");
        assert_eq!(parse(b"\r\n\r\n"), Err(HeadError::Incomplete));
    }

    #[test]
    fn only_exactly_one_head_is_parsed() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(HeadError::Incomplete));
        assert_eq!(parse(b""), Err(HeadError::Incomplete));
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\n\r\nbody"),
            Err(HeadError::BytesAfterHead { extra: 4 })
        );
    }

    #[test]
    fn bare_lf_line_ends_are_refused_unless_allowed() {
        let head = b"GET / HTTP/1.1\r\nHost: x\n\r\n";
        assert_eq!(parse(head), Err(HeadError::BareLf { line: 2 }));
        assert_eq!(
            parse(b"GET / HTTP/1.1\n\n"),
            Err(HeadError::BareLf { line: 1 })
        );
        let request = RequestHead::parse(head, &lenient()).expect("bare LF allowed");
        assert_eq!(request.host(), Some(&b"x"[..]));
        let all_lf = b"POST /x HTTP/1.1\nContent-Length: 2\n\n";
        let request = RequestHead::parse(all_lf, &lenient()).expect("bare LF allowed");
        assert_eq!(request.headers().content_length(), Some(2));
    }

    #[test]
    fn a_cr_that_ends_no_line_is_refused() {
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n"),
            Err(HeadError::BareCr { line: 2 })
        );
        assert_eq!(
            RequestHead::parse(b"GET / HTTP/1.1\r\r\n\r\n", &lenient()),
            Err(HeadError::BareCr { line: 1 })
        );
    }

    #[test]
    fn a_nul_anywhere_is_refused() {
        for head in [
            &b"G\0T / HTTP/1.1\r\n\r\n"[..],
            b"GET /\0 HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\0\r\n\r\n",
            b"GET / HTTP/1.1\r\nX\0: y\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: \0\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: y\0\r\n\r\n",
            b"\0\r\nGET / HTTP/1.1\r\n\r\n",
        ] {
            assert!(parse(head).is_err(), "{head:?}");
        }
    }

    #[test]
    fn request_lines_are_three_parts_separated_by_single_spaces() {
        for head in [
            &b"GET  / HTTP/1.1\r\n\r\n"[..],
            b"GET / HTTP/1.1 \r\n\r\n",
            b" GET / HTTP/1.1\r\n\r\n",
            b"GET /\r\n\r\n",
            b"GET\t/\tHTTP/1.1\r\n\r\n",
            b"NOT HTTP\r\n\r\n",
            b"GET http://a b/ HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(
                    parse(head),
                    Err(HeadError::BadRequestLine { .. } | HeadError::BadMethod { .. })
                ),
                "{head:?}: {:?}",
                parse(head)
            );
        }
        assert!(matches!(
            parse(b"GET / HTTP/1.1x\r\n\r\n"),
            Err(HeadError::BadRequestLine { .. })
        ));
    }

    #[test]
    fn methods_must_be_tokens() {
        for head in [
            &b"G@T / HTTP/1.1\r\n\r\n"[..],
            b"G\xc3\x89T / HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(parse(head), Err(HeadError::BadMethod { .. })),
                "{head:?}"
            );
        }
        assert_eq!(
            parse(b"M-SEARCH * HTTP/1.1\r\n\r\n").map(|r| r.method()),
            Err(HeadError::BadTarget {
                target: "\"*\"".into(),
                why: "is *, which only OPTIONS may ask for".into()
            })
        );
        assert_eq!(
            parse(b"PURGE_x /a HTTP/1.1\r\n\r\n").map(|r| r.method()),
            Ok("PURGE_x")
        );
    }

    #[test]
    fn versions_other_than_1_0_and_1_1_are_refused() {
        assert!(matches!(
            parse(b"GET / HTTP/2.0\r\n\r\n"),
            Err(HeadError::UnsupportedVersion { .. })
        ));
        assert!(matches!(
            parse(b"PRI * HTTP/2.0\r\n\r\n"),
            Err(HeadError::UnsupportedVersion { .. })
        ));
        assert!(matches!(
            parse(b"GET / http/1.1\r\n\r\n"),
            Err(HeadError::BadRequestLine { .. })
        ));
    }

    #[test]
    fn targets_are_visible_ascii() {
        for head in [
            &b"GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n"[..],
            b"GET /\x01 HTTP/1.1\r\n\r\n",
            b"GET /\x7f HTTP/1.1\r\n\r\n",
            b"GET http://crates.io/\x01 HTTP/1.1\r\n\r\n",
        ] {
            match parse(head) {
                Err(HeadError::BadTarget { why, .. }) => assert!(why.contains("visible ASCII")),
                other => panic!("{head:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn targets_are_split_by_form_for_the_method() {
        let connect =
            parse(b"CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n\r\n").expect("valid");
        assert_eq!(
            connect.target_form(),
            RequestTarget::Authority(Authority {
                host: "[::1]",
                port: Some(8443)
            })
        );
        let proxied =
            parse(b"GET http://mirror.test:8080/x.crate?v=1 HTTP/1.1\r\n\r\n").expect("valid");
        assert!(matches!(
            proxied.target_form(),
            RequestTarget::Absolute {
                scheme: "http",
                authority: Authority {
                    host: "mirror.test",
                    port: Some(8080)
                },
                path: "/x.crate",
                query: Some("v=1"),
            }
        ));
        let bad = parse(b"CONNECT crates.io HTTP/1.1\r\n\r\n").expect_err("no port");
        assert!(bad.to_string().contains("no port"), "{bad}");
        assert!(parse(b"GET crates.io:443 HTTP/1.1\r\n\r\n").is_err());
    }

    #[test]
    fn too_many_headers_or_bytes_are_refused() {
        let limits = Limits {
            max_headers: 3,
            ..Limits::default()
        };
        let three = b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
        assert!(RequestHead::parse(three, &limits).is_ok());
        let four = b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n";
        assert_eq!(
            RequestHead::parse(four, &limits),
            Err(HeadError::TooManyHeaders { limit: 3 })
        );
        let limits = Limits {
            max_head_bytes: three.len() - 1,
            ..Limits::default()
        };
        assert_eq!(
            RequestHead::parse(three, &limits),
            Err(HeadError::TooLarge {
                limit: three.len() - 1
            })
        );
    }

    #[test]
    fn smuggling_shapes_are_refused() {
        for (head, expected) in [
            (
                &b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
                HeadError::LengthAndTransferEncoding,
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                HeadError::DuplicateHeader {
                    name: "Content-Length",
                },
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n",
                HeadError::DuplicateHeader {
                    name: "Content-Length",
                },
            ),
            (
                b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                HeadError::DuplicateHeader { name: "Host" },
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 5\r\n ignored: 6\r\n\r\n",
                HeadError::ObsFold { line: 3 },
            ),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n",
                HeadError::WhitespaceBeforeColon {
                    line: 2,
                    name: "\"Transfer-Encoding\"".into(),
                },
            ),
            (
                b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                HeadError::TransferEncodingInHttp10,
            ),
        ] {
            assert_eq!(
                parse(head),
                Err(expected),
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
        assert!(matches!(
            parse(b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n"),
            Err(HeadError::BadContentLength { .. })
        ));
    }

    #[test]
    fn a_request_body_must_end_in_chunked_if_transfer_encoded() {
        let chunked =
            parse(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").expect("valid");
        assert!(chunked.headers().is_chunked());
        for value in ["gzip", "identity", "xchunkedy"] {
            let head = format!("POST / HTTP/1.1\r\nTransfer-Encoding: {value}\r\n\r\n");
            match parse(head.as_bytes()) {
                Err(HeadError::BadTransferEncoding { why, .. }) => {
                    assert!(why.contains("does not end with chunked"), "{value}: {why}")
                }
                other => panic!("{value}: {other:?}"),
            }
        }
    }

    #[test]
    fn upgrades_need_http_1_1_connection_upgrade_and_the_protocol() {
        let upgrade = b"POST /x HTTP/1.1\r\nUpgrade: tcp\r\nConnection: Upgrade\r\n\r\n";
        let request = parse(upgrade).expect("valid");
        assert!(request.wants_upgrade("tcp"));
        assert!(!request.wants_upgrade("websocket"));
        let no_connection = parse(b"POST /x HTTP/1.1\r\nUpgrade: tcp\r\n\r\n").expect("valid");
        assert!(!no_connection.wants_upgrade("tcp"));
        assert!(no_connection.headers().contains("upgrade"));
        let old = parse(b"GET /x HTTP/1.0\r\nUpgrade: tcp\r\nConnection: upgrade\r\n\r\n")
            .expect("valid");
        assert!(!old.wants_upgrade("tcp"));
    }

    #[test]
    fn connection_close_and_expect_continue_are_read() {
        let request = parse(
            b"POST /x HTTP/1.1\r\nConnection: keep-alive, close\r\nExpect: 100-Continue\r\n\
              Content-Length: 2\r\n\r\n",
        )
        .expect("valid");
        assert!(!request.keep_alive());
        assert!(request.expects_continue());
        assert!(!parse(b"GET / HTTP/1.1\r\n\r\n")
            .expect("valid")
            .expects_continue());
    }
}
