//! The proxy request head: `CONNECT host:port`, or a plain-HTTP request with an absolute URI,
//! rewritten into the head the origin server gets.

use super::rules::{parse_port, split_host_port, Host};

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
    pub status: u16,
    pub message: String,
}

impl BadRequest {
    fn new(message: impl Into<String>) -> BadRequest {
        BadRequest {
            status: 400,
            message: message.into(),
        }
    }
}

/// Parses one complete request head (through its empty line).
pub(crate) fn parse_head(head: &[u8]) -> Result<ProxyRequest, BadRequest> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => {
            return Err(BadRequest::new("the request head is empty or incomplete"))
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(BadRequest {
                status: 431,
                message: format!("the request head has more than {MAX_HEADERS} header fields"),
            })
        }
        Err(e) => {
            return Err(BadRequest::new(format!(
                "the request head is not valid HTTP/1.x: {e}"
            )))
        }
    }
    let (Some(method), Some(target), Some(minor)) = (request.method, request.path, request.version)
    else {
        return Err(BadRequest::new("the request line is incomplete"));
    };
    if method == "CONNECT" {
        let (host, port) = parse_authority(target, None)?;
        return Ok(ProxyRequest::Connect { host, port });
    }
    let Some((scheme, rest)) = target.split_once("://") else {
        return Err(BadRequest::new(format!(
            "{} is not a proxy request: a proxy needs an absolute URI (GET http://host/path) \
             or CONNECT host:port",
            quoted(target)
        )));
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
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    let (host, port) = parse_authority(authority, Some(80))?;
    let mut forwarded = Vec::with_capacity(head.len() + 32);
    forwarded.extend_from_slice(method.as_bytes());
    forwarded.push(b' ');
    if !path.starts_with('/') {
        forwarded.push(b'/');
    }
    forwarded.extend_from_slice(path.as_bytes());
    forwarded.extend_from_slice(format!(" HTTP/1.{minor}\r\nHost: {host}").as_bytes());
    if port != 80 {
        forwarded.extend_from_slice(format!(":{port}").as_bytes());
    }
    forwarded.extend_from_slice(b"\r\n");
    let named_by_connection: Vec<&[u8]> = request
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| h.value.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|token| !token.is_empty())
        .collect();
    for header in request.headers.iter() {
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
        // httparse guarantees names are tokens and values hold no CR or LF: nothing can be
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

/// Parses `host:port` (a CONNECT target, `default_port` `None`) or a URI's `host[:port]`.
/// IPv6 hosts must be bracketed; user information (`user@host`) is refused.
fn parse_authority(authority: &str, default_port: Option<u16>) -> Result<(Host, u16), BadRequest> {
    let bad = |why: &str| BadRequest::new(format!("the target {} {why}", quoted(authority)));
    if authority.contains('@') {
        return Err(bad(
            "has user information (user@host), which is not forwarded",
        ));
    }
    let split = split_host_port(authority).map_err(|e| BadRequest::new(e.to_string()))?;
    if split.host.contains(':') && !split.bracketed {
        return Err(bad("needs brackets around its IPv6 address ([::1]:443)"));
    }
    let host = if split.bracketed {
        Host::parse(&format!("[{}]", split.host))
    } else {
        Host::parse(split.host)
    }
    .map_err(|e| bad(&format!("is not a valid host: {e}")))?;
    let port = match (split.port, default_port) {
        (Some(port), _) => {
            parse_port(authority, port).map_err(|e| BadRequest::new(e.to_string()))?
        }
        (None, Some(default)) => default,
        (None, None) => return Err(bad("has no port (CONNECT needs host:port)")),
    };
    Ok((host, port))
}

/// `text` quoted for an error message, cut short: it comes from the sandbox.
pub(crate) fn quoted(text: &str) -> String {
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{:?}…", &text[..cut]),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forward(head: &str) -> (Host, u16, String) {
        match parse_head(head.as_bytes()) {
            Ok(ProxyRequest::Forward { host, port, head }) => {
                (host, port, String::from_utf8(head).expect("ASCII head"))
            }
            other => panic!("expected a forward for {head:?}, got {other:?}"),
        }
    }

    fn bad(head: &str) -> BadRequest {
        parse_head(head.as_bytes()).expect_err("a bad request")
    }

    #[test]
    fn connect_targets_need_a_host_and_a_port() {
        assert_eq!(
            parse_head(b"CONNECT Crates.IO:443 HTTP/1.1\r\nHost: crates.io:443\r\n\r\n"),
            Ok(ProxyRequest::Connect {
                host: Host::Name("crates.io".into()),
                port: 443
            })
        );
        assert_eq!(
            parse_head(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n"),
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
    }
}
