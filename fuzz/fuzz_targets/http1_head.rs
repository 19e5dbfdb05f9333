//! `http1`, the one HTTP/1 head parser of the daemon's front door, the egress proxy and the
//! client, on arbitrary bytes.
//!
//! Input layout: `[split][flags][bytes…]`. `split` picks where the bytes are cut into two reads
//! (and the step of a third, dribbled, read); `flags` picks the limits: bits 0-5 the most
//! header fields (0..=63), bit 6 a head limit of 256 bytes instead of 64 KiB. Checked:
//! - never a panic, whatever the bytes and limits;
//! - `HeadScanner` over two reads, or over many small ones, ends where `head_end` over the
//!   whole does (or fails the same way); the end is just past an LF, within the limit, and the
//!   first: no shorter prefix has ended; no end yet means fewer bytes than the limit, too
//!   large means at least as many;
//! - the head, parsed as a request and as a response under both line-end settings: what the
//!   strict setting accepts the lenient one accepts the same way; a bare LF never passes the
//!   strict one; errors answer 400, 431 or 505; a parser given more or fewer bytes than the
//!   head refuses them;
//! - an accepted head obeys every rule the crate promises (a token method, a target of the
//!   form its method allows, header names that are tokens, values without CR, LF or NUL, at
//!   most one Content-Length, Host, Authorization and Proxy-Authorization, never a length
//!   beside Transfer-Encoding, chunked last in a request, at most the allowed number of
//!   fields), and written out again with CRLF it parses strictly to the same head;
//! - the header-field limit refuses a head exactly when it has more fields than allowed.

#![no_main]

use http1::{
    head_end, HeadError, HeadScanner, Headers, Limits, LineEnds, RequestHead, RequestTarget,
    ResponseHead, Version, SINGLETON_HEADERS,
};
use libfuzzer_sys::fuzz_target;

/// A token character (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether a line of `head` ends with a bare LF.
fn has_bare_lf(head: &[u8]) -> bool {
    head.iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || head[i - 1] != b'\r'))
}

fn assert_status(error: &HeadError) {
    assert!(
        [400, 431, 505].contains(&error.status()),
        "{error:?} answers {}",
        error.status()
    );
    // Every message quotes the peer's text cut short (it goes into answers and logs): at most
    // 100 characters of it, each escaped to at most 10 bytes.
    let message = error.to_string();
    assert!(message.len() < 2048, "{message}");
}

/// The rules every accepted head's header fields obey.
fn check_headers(headers: &Headers<'_>, version: Version, limits: &Limits) {
    assert!(headers.len() <= limits.max_headers);
    assert_eq!(headers.len(), headers.as_slice().len());
    assert_eq!(headers.is_empty(), headers.len() == 0);
    for header in headers {
        assert!(
            !header.name.is_empty() && header.name.bytes().all(is_tchar),
            "{:?}",
            header.name
        );
        assert!(
            !header
                .value
                .iter()
                .any(|&b| b == b'\r' || b == b'\n' || b == 0),
            "{:?}",
            header.value
        );
        // No whitespace left at either end of a value.
        for edge in [header.value.first(), header.value.last()]
            .into_iter()
            .flatten()
        {
            assert!(*edge != b' ' && *edge != b'\t', "{:?}", header.value);
        }
        assert!(headers.get(header.name).is_some());
    }
    for name in SINGLETON_HEADERS {
        assert!(headers.all(name).count() <= 1, "two {name} headers");
    }
    if let Some(length) = headers.content_length() {
        let value = headers.get("content-length").expect("a Content-Length");
        assert!(!value.is_empty() && value.iter().all(u8::is_ascii_digit));
        let digits = std::str::from_utf8(value).expect("digits");
        assert_eq!(digits.parse::<u64>().ok(), Some(length));
        assert!(!headers.has_transfer_encoding(), "a length beside TE");
    } else {
        assert!(!headers.contains("content-length"));
    }
    if headers.has_transfer_encoding() {
        assert_eq!(version, Version::Http11, "Transfer-Encoding in HTTP/1.0");
        let codings: Vec<&[u8]> = headers.transfer_codings().collect();
        assert!(!codings.is_empty());
        let chunked = |c: &&[u8]| {
            c.split(|&b| b == b';')
                .next()
                .is_some_and(|n| n.trim_ascii().eq_ignore_ascii_case(b"chunked"))
        };
        assert!(codings.iter().filter(|c| chunked(c)).count() <= 1);
        assert_eq!(headers.is_chunked(), codings.last().is_some_and(chunked));
    } else {
        assert!(!headers.is_chunked());
    }
    // The list readers never panic.
    let _ = headers.connection_tokens().count();
    let _ = headers.connection_has("close");
    let _ = headers.upgrade_lists("websocket");
    let _ = headers.upgrade_lists("tcp/1");
}

/// `request` written out with CRLF line ends.
fn write_request(request: &RequestHead<'_>) -> Vec<u8> {
    let mut out = format!(
        "{} {} {}\r\n",
        request.method(),
        request.target(),
        request.version()
    )
    .into_bytes();
    write_fields(&mut out, request.headers());
    out
}

/// `response` written out with CRLF line ends.
fn write_response(response: &ResponseHead<'_>) -> Vec<u8> {
    let mut out = format!("{} {} ", response.version(), response.status()).into_bytes();
    out.extend_from_slice(response.reason());
    out.extend_from_slice(b"\r\n");
    write_fields(&mut out, response.headers());
    out
}

fn write_fields(out: &mut Vec<u8>, headers: &Headers<'_>) {
    for header in headers {
        out.extend_from_slice(header.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(header.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The limits a written-out head is parsed again under: its own length, the same fields.
fn rewritten(written: &[u8], limits: &Limits) -> Limits {
    Limits {
        max_head_bytes: written.len(),
        max_headers: limits.max_headers,
        line_ends: LineEnds::CrlfOnly,
    }
}

fn check_request(head: &[u8], limits: &Limits) -> Option<usize> {
    let request = match RequestHead::parse(head, limits) {
        Ok(request) => request,
        Err(error) => {
            assert_status(&error);
            return None;
        }
    };
    let method = request.method();
    assert!(
        !method.is_empty() && method.bytes().all(is_tchar),
        "{method:?}"
    );
    let target = request.target();
    assert!(!target.is_empty() && target.bytes().all(|b| (b'!'..=b'~').contains(&b)));
    match request.target_form() {
        RequestTarget::Origin { path, query } => {
            assert!(path.starts_with('/') && method != "CONNECT", "{target:?}");
            assert!(target.starts_with(path));
            assert!(query.is_none_or(|q| target.contains(q)));
        }
        RequestTarget::Absolute {
            scheme,
            authority,
            path,
            query,
        } => {
            assert!(method != "CONNECT", "{target:?}");
            assert!(target.starts_with(scheme) && target.contains("://"));
            assert!(path.is_empty() || path.starts_with('/'), "{path:?}");
            assert!(!authority.host.is_empty() && !authority.host.contains('@'));
            assert_ne!(authority.port, Some(0));
            assert!(query.is_none_or(|q| target.contains(q)));
            let _ = (authority.ipv6(), authority.to_string());
        }
        RequestTarget::Authority(authority) => {
            assert_eq!(method, "CONNECT");
            assert!(authority.port.is_some_and(|p| p != 0), "{target:?}");
            assert!(!authority.host.is_empty() && !authority.host.contains('@'));
            if authority.host.starts_with('[') {
                assert!(authority.ipv6().is_some(), "{target:?}");
            }
            // The port may be spelled with leading zeros: the host is as sent.
            assert!(target.starts_with(authority.host), "{target:?}");
            let _ = authority.to_string();
        }
        RequestTarget::Asterisk => assert_eq!((method, target), ("OPTIONS", "*")),
    }
    if method == "CONNECT" {
        assert!(matches!(request.target_form(), RequestTarget::Authority(_)));
    }
    let headers = request.headers();
    check_headers(headers, request.version(), limits);
    // A request body is framed by a length or by chunked, last.
    if headers.has_transfer_encoding() {
        assert!(headers.is_chunked());
    }
    assert_eq!(request.host(), headers.get("host"));
    let _ = (
        request.keep_alive(),
        request.wants_upgrade("tcp"),
        request.expects_continue(),
    );
    let written = write_request(&request);
    let again = RequestHead::parse(&written, &rewritten(&written, limits))
        .expect("a request written out parses");
    assert_eq!(again.method(), request.method());
    assert_eq!(again.target(), request.target());
    assert_eq!(again.target_form(), request.target_form());
    assert_eq!(again.version(), request.version());
    assert_eq!(again.headers(), request.headers());
    Some(headers.len())
}

fn check_response(head: &[u8], limits: &Limits) -> Option<usize> {
    let response = match ResponseHead::parse(head, limits) {
        Ok(response) => response,
        Err(error) => {
            assert_status(&error);
            return None;
        }
    };
    assert!((100..=999).contains(&response.status()));
    assert!(response
        .reason()
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80));
    check_headers(response.headers(), response.version(), limits);
    let _ = (response.keep_alive(), response.switches_to("tcp"));
    let written = write_response(&response);
    let again = ResponseHead::parse(&written, &rewritten(&written, limits))
        .expect("a response written out parses");
    assert_eq!(again.version(), response.version());
    assert_eq!(again.status(), response.status());
    assert_eq!(again.headers(), response.headers());
    Some(response.headers().len())
}

fuzz_target!(|data: &[u8]| {
    let [split, flags, bytes @ ..] = data else {
        return;
    };
    let limit = if flags & 0x40 != 0 { 256 } else { 64 * 1024 };
    let max_headers = usize::from(flags & 0x3f);

    // Where the head ends: whole, in two reads, and dribbled.
    let whole = head_end(bytes, limit);
    let at = bytes.len() * usize::from(*split) / 255;
    let mut scanner = HeadScanner::new(limit);
    let first = scanner.scan(&bytes[..at]);
    assert_eq!(scanner.scan(bytes), whole, "split at {at}");
    // Once found, an end or an error is found again.
    assert_eq!(scanner.scan(bytes), whole);
    if let Ok(Some(end)) = first {
        assert_eq!(whole, Ok(Some(end)), "the first read's end moved");
    }
    let step = usize::from(split % 7) + 1;
    let mut dribbled = HeadScanner::new(limit);
    let mut found = Ok(None);
    for n in (0..=bytes.len()).step_by(step).chain([bytes.len()]) {
        found = dribbled.scan(&bytes[..n]);
        if !matches!(found, Ok(None)) {
            break;
        }
    }
    assert_eq!(found, whole, "dribbled in steps of {step}");
    let end = match whole {
        Ok(Some(end)) => end,
        Ok(None) => {
            assert!(bytes.len() < limit);
            return;
        }
        Err(HeadError::TooLarge { limit: said }) => {
            assert_eq!(said, limit);
            assert!(bytes.len() >= limit);
            return;
        }
        Err(other) => panic!("head_end failed with {other:?}"),
    };
    assert!(end <= limit && end <= bytes.len() && bytes[end - 1] == b'\n');
    assert_eq!(
        head_end(&bytes[..end - 1], limit),
        Ok(None),
        "not the first end"
    );
    let head = &bytes[..end];
    assert_eq!(head_end(head, limit), Ok(Some(end)));

    let strict = Limits {
        max_head_bytes: limit,
        max_headers,
        line_ends: LineEnds::CrlfOnly,
    };
    let lenient = Limits {
        line_ends: LineEnds::CrlfOrBareLf,
        ..strict
    };
    let request = check_request(head, &strict);
    let response = check_response(head, &strict);
    let lenient_request = check_request(head, &lenient);
    let lenient_response = check_response(head, &lenient);
    // Strict accepts less, and what it accepts reads the same leniently.
    if request.is_some() {
        assert_eq!(
            RequestHead::parse(head, &strict),
            RequestHead::parse(head, &lenient)
        );
    }
    if response.is_some() {
        assert_eq!(
            ResponseHead::parse(head, &strict),
            ResponseHead::parse(head, &lenient)
        );
    }
    if has_bare_lf(head) {
        assert!(request.is_none() && response.is_none(), "a bare LF passed");
    } else {
        assert_eq!(request, lenient_request);
        assert_eq!(response, lenient_response);
    }
    // The field limit refuses exactly the heads with more fields than allowed.
    let unlimited = Limits {
        max_headers: usize::MAX,
        ..lenient
    };
    if let Ok(any) = RequestHead::parse(head, &unlimited) {
        match RequestHead::parse(head, &lenient) {
            Ok(limited) => assert_eq!(limited, any),
            Err(error) => {
                assert!(any.headers().len() > max_headers, "{error:?}");
                assert_eq!(error, HeadError::TooManyHeaders { limit: max_headers });
            }
        }
    }
    // A parser takes exactly one head: not a byte more, nor less.
    if end < bytes.len() {
        assert!(RequestHead::parse(bytes, &lenient).is_err());
        assert!(ResponseHead::parse(bytes, &lenient).is_err());
    }
    assert!(RequestHead::parse(&head[..end - 1], &lenient).is_err());
    assert!(ResponseHead::parse(&head[..end - 1], &lenient).is_err());
});
