//! The four forms of a request target (RFC 9112 §3.2): what a server is asked for
//! (`/path?query`), what a forward proxy is asked to fetch (`http://host:port/path`), where a
//! proxy is asked to tunnel (`CONNECT host:port`), and `OPTIONS *`.

use std::fmt;
use std::net::Ipv6Addr;

use crate::error::{quoted, HeadError};

/// A request target, split by its form. Every part borrows the target as sent; a fragment
/// (`#...`, which no form has but some clients send) is dropped, as `http::Uri` drops it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestTarget<'h> {
    /// `/path?query`: what a server is asked for.
    Origin {
        /// The path: starts with `/`.
        path: &'h str,
        /// What follows the first `?`, if there is one.
        query: Option<&'h str>,
    },
    /// `scheme://authority/path?query`: what a forward proxy is asked to fetch. The scheme is
    /// the caller's to check (`http`, or `https`, which a proxy is asked through CONNECT).
    Absolute {
        /// The scheme as sent (compare it case-insensitively).
        scheme: &'h str,
        /// Where to.
        authority: Authority<'h>,
        /// The path: empty or starting with `/` (an origin-form target needs `/` for empty).
        path: &'h str,
        /// What follows the first `?`, if there is one.
        query: Option<&'h str>,
    },
    /// `host:port`, the port required: where CONNECT asks to tunnel. Only CONNECT has it,
    /// and CONNECT has only it.
    Authority(Authority<'h>),
    /// `*`: the server as a whole. Only OPTIONS has it.
    Asterisk,
}

/// `host[:port]`, checked: no user information, an IPv6 address only in brackets, a port in
/// 1..=65535.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Authority<'h> {
    /// The host as sent: a name or an IPv4 address (unreserved, sub-delims and
    /// percent-encoded characters), or an IPv6 address in its brackets (`[::1]`). Names are
    /// not lowercased or checked further: what may be reached is the caller's to decide.
    pub host: &'h str,
    /// The port, if one is given.
    pub port: Option<u16>,
}

impl<'h> Authority<'h> {
    /// The IPv6 address inside the brackets, if the host is one.
    pub fn ipv6(&self) -> Option<Ipv6Addr> {
        self.host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .and_then(|h| h.parse().ok())
    }
}

impl fmt::Display for Authority<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.host)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// A byte a request target may hold: visible ASCII. hyper's URI parser refuses the rest
/// (spaces, controls, non-ASCII) and so does this.
pub(crate) fn is_target_byte(b: u8) -> bool {
    (b'!'..=b'~').contains(&b)
}

/// Splits `target` (checked by the caller to be visible ASCII, non-empty) by its form, which
/// `method` decides between: CONNECT has only the authority form, OPTIONS alone has `*`.
pub(crate) fn classify<'h>(method: &str, target: &'h str) -> Result<RequestTarget<'h>, HeadError> {
    let bad = |why: &str| HeadError::BadTarget {
        target: quoted(target.as_bytes()),
        why: why.to_string(),
    };
    if method == "CONNECT" {
        if target.starts_with('/') || target.contains("://") {
            return Err(bad("is not host:port, the only target CONNECT has"));
        }
        let authority = parse_authority(target).map_err(|why| bad(&why))?;
        if authority.port.is_none() {
            return Err(bad("has no port (CONNECT needs host:port)"));
        }
        return Ok(RequestTarget::Authority(authority));
    }
    if target == "*" {
        if method != "OPTIONS" {
            return Err(bad("is *, which only OPTIONS may ask for"));
        }
        return Ok(RequestTarget::Asterisk);
    }
    let target_without_fragment = target.split_once('#').map_or(target, |(before, _)| before);
    if target.starts_with('/') {
        let (path, query) = split_query(target_without_fragment);
        return Ok(RequestTarget::Origin { path, query });
    }
    let Some((scheme, rest)) = target_without_fragment.split_once("://") else {
        return Err(bad(
            "fits no request-target form: /path, http://host/path, host:port for CONNECT, \
             or * for OPTIONS",
        ));
    };
    let scheme_ok = scheme
        .as_bytes()
        .first()
        .is_some_and(u8::is_ascii_alphabetic)
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
    if !scheme_ok {
        return Err(bad("has a scheme that is not letters, digits, + - or ."));
    }
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path_and_query) = rest.split_at(authority_end);
    let authority = parse_authority(authority).map_err(|why| bad(&why))?;
    let (path, query) = split_query(path_and_query);
    Ok(RequestTarget::Absolute {
        scheme,
        authority,
        path,
        query,
    })
}

fn split_query(path_and_query: &str) -> (&str, Option<&str>) {
    match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    }
}

/// Parses `host[:port]` (RFC 3986 §3.2, without user information); on error, what is wrong.
fn parse_authority(authority: &str) -> Result<Authority<'_>, String> {
    if authority.contains('@') {
        return Err("has user information (user@host), which is refused".into());
    }
    let (host, port) = if authority.starts_with('[') {
        let close = authority
            .find(']')
            .ok_or("has a [ without its ] around an IPv6 address")?;
        let (host, after) = authority.split_at(close + 1);
        if host[1..host.len() - 1].parse::<Ipv6Addr>().is_err() {
            return Err("has brackets around something other than an IPv6 address".into());
        }
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or("has something other than :port after its ]")?,
            ),
        };
        (host, port)
    } else {
        let (host, port) = match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        };
        if port.is_some_and(|p| p.contains(':')) {
            return Err("needs brackets around its IPv6 address ([::1]:443)".into());
        }
        if host.is_empty() {
            return Err("has no host".into());
        }
        if let Some(b) = host.bytes().find(|&b| !is_reg_name_byte(b)) {
            return Err(format!(
                "has a host with {:?}, which no host name or address holds",
                char::from(b)
            ));
        }
        (host, port)
    };
    let port = match port {
        None => None,
        Some(port) => Some(parse_port(port).ok_or_else(|| {
            format!(
                "has the port {}, not a number in 1..=65535",
                quoted(port.as_bytes())
            )
        })?),
    };
    Ok(Authority { host, port })
}

/// A byte of a registered name or IPv4 address: unreserved, sub-delims, or `%` of a
/// percent-encoding (RFC 3986 §3.2.2).
fn is_reg_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%".contains(&b)
}

/// 1..=65535, digits only (`+1`, `0x50` and an empty port are refused; port 0 reaches
/// nothing).
fn parse_port(port: &str) -> Option<u16> {
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok().filter(|&p| p != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(method: &str, target: &str) -> String {
        match classify(method, target) {
            Err(HeadError::BadTarget { why, .. }) => why,
            other => panic!("{method} {target}: {other:?}"),
        }
    }

    #[test]
    fn origin_form_splits_path_and_query_and_drops_a_fragment() {
        assert_eq!(
            classify("POST", "/sandboxes/sb-1/exec?stdin=1&x=y#frag"),
            Ok(RequestTarget::Origin {
                path: "/sandboxes/sb-1/exec",
                query: Some("stdin=1&x=y")
            })
        );
        assert_eq!(
            classify("GET", "/"),
            Ok(RequestTarget::Origin {
                path: "/",
                query: None
            })
        );
        assert_eq!(
            classify("GET", "/a?"),
            Ok(RequestTarget::Origin {
                path: "/a",
                query: Some("")
            })
        );
    }

    #[test]
    fn absolute_form_splits_scheme_authority_path_and_query() {
        assert_eq!(
            classify("GET", "http://Example.ORG/a/b?c=d#frag"),
            Ok(RequestTarget::Absolute {
                scheme: "http",
                authority: Authority {
                    host: "Example.ORG",
                    port: None
                },
                path: "/a/b",
                query: Some("c=d")
            })
        );
        assert_eq!(
            classify("POST", "HTTP://10.0.0.1:8080?x=1"),
            Ok(RequestTarget::Absolute {
                scheme: "HTTP",
                authority: Authority {
                    host: "10.0.0.1",
                    port: Some(8080)
                },
                path: "",
                query: Some("x=1")
            })
        );
        let Ok(RequestTarget::Absolute {
            authority, path, ..
        }) = classify("GET", "https://[::1]:81")
        else {
            panic!("absolute form");
        };
        assert_eq!(
            (authority.host, authority.port, path),
            ("[::1]", Some(81), "")
        );
        assert_eq!(authority.ipv6(), Some(Ipv6Addr::LOCALHOST));
        assert_eq!(authority.to_string(), "[::1]:81");
    }

    #[test]
    fn absolute_form_needs_a_host_and_no_user_information() {
        assert!(why("GET", "http:///x").contains("no host"));
        assert!(why("GET", "http://user:pw@x.org/").contains("user information"));
        assert!(why("GET", "http://x.org:0/").contains("port"));
        assert!(why("GET", "http://x.org:/").contains("port"));
        assert!(why("GET", "http://x\"y.org/").contains("host"));
        assert!(why("GET", "1http://x.org/").contains("scheme"));
        assert!(why("GET", "://x.org/").contains("scheme"));
    }

    #[test]
    fn connect_has_only_the_authority_form_with_a_port() {
        assert_eq!(
            classify("CONNECT", "Crates.IO:443"),
            Ok(RequestTarget::Authority(Authority {
                host: "Crates.IO",
                port: Some(443)
            }))
        );
        assert_eq!(
            classify("CONNECT", "[::1]:8443"),
            Ok(RequestTarget::Authority(Authority {
                host: "[::1]",
                port: Some(8443)
            }))
        );
        for (target, says) in [
            ("crates.io", "no port"),
            ("crates.io:0", "1..=65535"),
            ("crates.io:99999", "1..=65535"),
            ("crates.io:+443", "1..=65535"),
            ("crates.io:", "1..=65535"),
            ("::1:443", "brackets"),
            ("[::1]443", "after its ]"),
            ("[::1:443", "without its ]"),
            ("[10.0.0.1]:443", "other than an IPv6"),
            ("user@crates.io:443", "user information"),
            ("http://crates.io:443", "host:port"),
            ("/", "host:port"),
            (":443", "no host"),
        ] {
            let said = why("CONNECT", target);
            assert!(said.contains(says), "{target}: {said}");
        }
    }

    #[test]
    fn only_connect_has_the_authority_form_and_only_options_the_asterisk() {
        assert!(why("GET", "crates.io:443").contains("fits no request-target form"));
        assert_eq!(classify("OPTIONS", "*"), Ok(RequestTarget::Asterisk));
        assert!(why("GET", "*").contains("only OPTIONS"));
        assert!(why("GET", "index.html").contains("fits no request-target form"));
    }
}
