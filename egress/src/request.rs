//! The proxy request head: `CONNECT host:port`, or a plain-HTTP request with an absolute URI,
//! rewritten into the head the origin server gets. The head is parsed by `http1`, the parser
//! the daemon's front door and the client share: it refuses the framing a proxy and the
//! server behind it could read differently (two Content-Lengths, one beside
//! Transfer-Encoding, obsolete line folding, ...), so that what the proxy checked is what the
//! server reads.

use http1::{Authority, Limits, LineEnds, RequestHead, RequestTarget};

use crate::rules::Host;

/// The most header fields a request head may have.
const MAX_HEADERS: usize = 100;

/// Headers that concern only the hop to the proxy, never forwarded. `Host` is replaced from
/// the URI; `Connection` is replaced by `Connection: close`.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "host",
];

/// What the sandbox asked the proxy for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProxyRequest {
    /// `CONNECT host:port`: a tunnel, answered with a 200 and then relayed raw.
    Connect { host: Host, port: u16 },
    /// A plain-HTTP request: `head` (origin form, hop-by-hop headers dropped, `Host` from the
    /// URI, `Connection: close`) goes to `host:port`, then the rest of the stream raw.
    Forward {
        host: Host,
        port: u16,
        head: Vec<u8>,
    },
}

impl ProxyRequest {
    pub(crate) fn target(&self) -> (&Host, u16) {
        match self {
            ProxyRequest::Connect { host, port } | ProxyRequest::Forward { host, port, .. } => {
                (host, *port)
            }
        }
    }
}

/// A request head the proxy answers itself with `status` and `message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadRequest {
    pub(crate) status: u16,
    pub(crate) message: String,
}

impl BadRequest {
    fn new(message: impl Into<String>) -> BadRequest {
        BadRequest {
            status: 400,
            message: message.into(),
        }
    }
}

/// Parses one complete request head (through its empty line, as `http1::HeadScanner` found
/// it) of at most `max_head_bytes`. Lines may end in a bare LF, as many clients' parsers
/// accept: the head forwarded is written anew, with CRLF.
pub(crate) fn parse_head(head: &[u8], max_head_bytes: usize) -> Result<ProxyRequest, BadRequest> {
    let limits = Limits {
        max_head_bytes,
        max_headers: MAX_HEADERS,
        line_ends: LineEnds::CrlfOrBareLf,
    };
    let request = RequestHead::parse(head, &limits).map_err(|e| BadRequest {
        status: e.status(),
        message: match e.status() {
            400 => format!("the request head is not valid HTTP/1.x: {e}"),
            _ => format!("the request head is refused: {e}"),
        },
    })?;
    let (scheme, authority, path, query) = match request.target_form() {
        // CONNECT, and only CONNECT, has this form (`http1` checked).
        RequestTarget::Authority(authority) => {
            let (host, port) = checked_host(authority, None)?;
            return Ok(ProxyRequest::Connect { host, port });
        }
        RequestTarget::Origin { .. } | RequestTarget::Asterisk => {
            return Err(BadRequest::new(format!(
                "{} is not a proxy request: a proxy needs an absolute URI (GET http://host/path) \
                 or CONNECT host:port",
                quoted(request.target())
            )))
        }
        RequestTarget::Absolute {
            scheme,
            authority,
            path,
            query,
        } => (scheme, authority, path, query),
    };
    if scheme.eq_ignore_ascii_case("https") {
        return Err(BadRequest::new(
            "https:// URIs are not forwarded: use CONNECT host:443 (HTTPS clients do this \
             themselves when given an http:// proxy)",
        ));
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(BadRequest::new(format!(
            "the scheme {} is not supported: only http:// URIs and CONNECT",
            quoted(scheme)
        )));
    }
    let (host, port) = checked_host(authority, Some(80))?;
    let mut forwarded = Vec::with_capacity(head.len() + 32);
    forwarded.extend_from_slice(request.method().as_bytes());
    forwarded.push(b' ');
    forwarded.extend_from_slice(if path.is_empty() { "/" } else { path }.as_bytes());
    if let Some(query) = query {
        forwarded.push(b'?');
        forwarded.extend_from_slice(query.as_bytes());
    }
    let version = request.version();
    forwarded.extend_from_slice(format!(" {version}\r\nHost: {host}").as_bytes());
    if port != 80 {
        forwarded.extend_from_slice(format!(":{port}").as_bytes());
    }
    forwarded.extend_from_slice(b"\r\n");
    let headers = request.headers();
    let named_by_connection: Vec<&[u8]> = headers.connection_tokens().collect();
    for header in headers.iter() {
        let name = header.name.as_bytes();
        let hop_by_hop = HOP_BY_HOP
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
            || named_by_connection
                .iter()
                .any(|token| name.eq_ignore_ascii_case(token));
        if hop_by_hop {
            continue;
        }
        // `http1` guarantees names are tokens and values hold no CR, LF or NUL: nothing can be
        // injected by copying them.
        forwarded.extend_from_slice(name);
        forwarded.extend_from_slice(b": ");
        forwarded.extend_from_slice(header.value);
        forwarded.extend_from_slice(b"\r\n");
    }
    forwarded.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(ProxyRequest::Forward {
        host,
        port,
        head: forwarded,
    })
}

/// The host of `authority` (its syntax and port checked by `http1`) as the policy compares
/// it, and its port, `default_port` if it has none.
fn checked_host(
    authority: Authority<'_>,
    default_port: Option<u16>,
) -> Result<(Host, u16), BadRequest> {
    let host = Host::parse(authority.host).map_err(|e| {
        BadRequest::new(format!(
            "the target {} is not a valid host: {e}",
            quoted(&authority.to_string())
        ))
    })?;
    // `http1` already refused a CONNECT target without a port.
    let port = authority.port.or(default_port).ok_or_else(|| {
        BadRequest::new(format!(
            "the target {} has no port (CONNECT needs host:port)",
            quoted(&authority.to_string())
        ))
    })?;
    Ok((host, port))
}

/// `text` quoted for an error message, cut short: it comes from the sandbox.
fn quoted(text: &str) -> String {
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{:?}…", &text[..cut]),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 16 * 1024;

    fn parse(head: &[u8]) -> Result<ProxyRequest, BadRequest> {
        parse_head(head, LIMIT)
    }

    fn forward(head: &str) -> (Host, u16, String) {
        match parse(head.as_bytes()) {
            Ok(ProxyRequest::Forward { host, port, head }) => {
                (host, port, String::from_utf8(head).expect("ASCII head"))
            }
            other => panic!("expected a forward for {head:?}, got {other:?}"),
        }
    }

    fn bad(head: &str) -> BadRequest {
        parse(head.as_bytes()).expect_err("a bad request")
    }

    #[test]
    fn connect_targets_need_a_host_and_a_port() {
        assert_eq!(
            parse(b"CONNECT Crates.IO:443 HTTP/1.1\r\nHost: crates.io:443\r\n\r\n"),
            Ok(ProxyRequest::Connect {
                host: Host::Name("crates.io".into()),
                port: 443
            })
        );
        assert_eq!(
            parse(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n"),
            Ok(ProxyRequest::Connect {
                host: Host::Ip("::1".parse().expect("address")),
                port: 8443
            })
        );
        for target in [
            "crates.io",
            "crates.io:0",
            "crates.io:99999",
            "::1:443",
            "[10.0.0.1]:443",
            "user@crates.io:443",
            "127.1:443",
            "http://crates.io:443",
        ] {
            let request = format!("CONNECT {target} HTTP/1.1\r\n\r\n");
            let err = bad(&request);
            assert_eq!(err.status, 400, "{target}: {}", err.message);
        }
    }

    #[test]
    fn absolute_uris_become_origin_form_with_hop_by_hop_headers_dropped() {
        let (host, port, head) = forward(
            "GET http://Example.ORG/a/b?c=d#frag HTTP/1.1\r\n\
             Host: evil.example\r\n\
             User-Agent: test\r\n\
             Proxy-Connection: keep-alive\r\n\
             Proxy-Authorization: Basic Zm9vOmJhcg==\r\n\
             Connection: keep-alive, X-Secret\r\n\
             Keep-Alive: timeout=5\r\n\
             X-Secret: hop\r\n\
             Accept: */*\r\n\r\n",
        );
        assert_eq!(host, Host::Name("example.org".into()));
        assert_eq!(port, 80);
        assert_eq!(
            head,
            "GET /a/b?c=d HTTP/1.1\r\nHost: example.org\r\nUser-Agent: test\r\n\
             Accept: */*\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn absolute_uris_keep_their_port_version_and_query() {
        let (host, port, head) =
            forward("POST http://10.0.0.1:8080?x=1 HTTP/1.0\r\nContent-Length: 3\r\n\r\n");
        assert_eq!(host, Host::Ip("10.0.0.1".parse().expect("address")));
        assert_eq!(port, 8080);
        assert_eq!(
            head,
            "POST /?x=1 HTTP/1.0\r\nHost: 10.0.0.1:8080\r\nContent-Length: 3\r\nConnection: close\r\n\r\n"
        );
        let (_, port, head) = forward("GET HTTP://[::1]:81 HTTP/1.1\nX: y\n\n");
        assert_eq!(port, 81);
        assert_eq!(
            head,
            "GET / HTTP/1.1\r\nHost: [::1]:81\r\nX: y\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn other_requests_are_explained_with_a_400() {
        let origin = bad("GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(origin.status, 400);
        assert!(
            origin.message.contains("absolute URI"),
            "{}",
            origin.message
        );
        assert!(bad("GET https://crates.io/ HTTP/1.1\r\n\r\n")
            .message
            .contains("CONNECT"));
        assert!(bad("GET ftp://x.org/ HTTP/1.1\r\n\r\n")
            .message
            .contains("\"ftp\""));
        assert!(bad("GET http://user:pw@x.org/ HTTP/1.1\r\n\r\n")
            .message
            .contains("user information"));
        assert!(bad("GET http:///x HTTP/1.1\r\n\r\n").status == 400);
        assert!(bad("GET http://a b/ HTTP/1.1\r\n\r\n").status == 400);
        assert!(bad("NOT HTTP\r\n\r\n").message.contains("not valid HTTP"));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: y\r\n")).collect();
        assert_eq!(
            bad(&format!("GET http://x.org/ HTTP/1.1\r\n{many}\r\n")).status,
            431
        );
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(1000));
        assert!(bad(&long).message.len() < 400);
        let http2 = bad("GET http://x.org/ HTTP/2.0\r\n\r\n");
        assert_eq!(http2.status, 505, "{}", http2.message);
        assert!(http2.message.contains("HTTP/2.0"), "{}", http2.message);
    }

    #[test]
    fn framing_the_origin_could_read_differently_is_refused_not_forwarded() {
        for (head, says) in [
            (
                "POST http://x.org/ HTTP/1.1\r\nContent-Length: 5\r\n\
                 Transfer-Encoding: chunked\r\n\r\n",
                "both Content-Length and Transfer-Encoding",
            ),
            (
                "POST http://x.org/ HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                "more than one Content-Length",
            ),
            (
                "GET http://x.org/ HTTP/1.1\r\nHost: x.org\r\nHost: y.org\r\n\r\n",
                "more than one Host",
            ),
            (
                "POST http://x.org/ HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                "after chunked",
            ),
            (
                "POST http://x.org/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                "HTTP/1.0",
            ),
            (
                "GET http://x.org/ HTTP/1.1\r\nX-A: 1\r\n X-B: 2\r\n\r\n",
                "folding",
            ),
            (
                "GET http://x.org/ HTTP/1.1\r\nContent-Length : 1\r\n\r\n",
                "whitespace",
            ),
        ] {
            let err = bad(head);
            assert_eq!(err.status, 400, "{head:?}: {}", err.message);
            assert!(err.message.contains(says), "{head:?}: {}", err.message);
        }
        // A chunked body is forwarded with its Transfer-Encoding.
        let (_, _, head) =
            forward("POST http://x.org/up HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
        assert_eq!(
            head,
            "POST /up HTTP/1.1\r\nHost: x.org\r\nTransfer-Encoding: gzip, chunked\r\n\
             Connection: close\r\n\r\n"
        );
    }

    #[test]
    fn hosts_are_compared_as_the_policy_reads_them() {
        // A mapped IPv4 address is the IPv4 address; names are lowercase.
        let (host, port, head) = forward("GET http://[::ffff:10.0.0.1]:8080/ HTTP/1.1\r\n\r\n");
        assert_eq!(host, Host::Ip("10.0.0.1".parse().expect("address")));
        assert_eq!(port, 8080);
        assert!(head.contains("Host: 10.0.0.1:8080\r\n"), "{head}");
        assert_eq!(
            parse(b"CONNECT [::FFFF:7f00:1]:22 HTTP/1.1\r\n\r\n"),
            Ok(ProxyRequest::Connect {
                host: Host::Ip("127.0.0.1".parse().expect("address")),
                port: 22
            })
        );
        // A fragment goes nowhere; an empty path is /.
        let (_, _, head) = forward("GET http://x.org#top HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("GET / HTTP/1.1\r\n"), "{head}");
        // Empty lines before the request line are skipped (RFC 9112 §2.2).
        let (_, _, head) = forward("\r\n\r\nGET http://x.org/a HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("GET /a HTTP/1.1\r\n"), "{head}");
    }
}
