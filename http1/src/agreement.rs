//! Whatever this crate accepts, hyper's parser (httparse) must read the same way: the same
//! end, method, target, version, status and header fields. A head the two read differently is
//! one a front door and the server behind it could be made to disagree on. Checked over valid
//! heads mutated many ways (a fuzz target's work, deterministic and small enough for
//! `cargo test`), along with: no panic, a head split into two reads ends in the same place,
//! and an accepted head written out again parses to the same head.

use crate::{head_end, HeadScanner, Limits, LineEnds, RequestHead, ResponseHead};

const SEEDS: &[&[u8]] = &[
    b"POST /sandboxes/sb-0123456789abcdef/exec?stdin=1 HTTP/1.1\r\nHost: x\r\n\
      Authorization: Bearer k\r\nContent-Length: 5\r\n\r\n{\"a\"}",
    b"POST /sandboxes/sb-1/exec HTTP/1.1\r\nContent-Length: 2\r\nConnection: keep-alive, close\r\n\r\n{}",
    b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nExpect: 100-continue\r\n\r\n",
    b"GET http://Example.ORG:8080/a/b?c=d HTTP/1.1\r\nHost: evil.example\r\nProxy-Connection: \
      keep-alive\r\nConnection: keep-alive, X-Secret\r\nX-Secret: hop\r\n\r\n",
    b"CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n\r\n\x16\x03\x01",
    b"OPTIONS * HTTP/1.0\r\nX-Tab:\ta\tb\t\r\n\r\n",
    b"GET /x HTTP/1.1\nUpgrade: tcp\nConnection: Upgrade\n\n",
    b"\r\nGET / HTTP/1.1\r\nX-Obs: caf\xc3\xa9\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\n",
    b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\
      Connection: close\r\n\r\n{\"e\":\"x\"}",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: tcp\r\nConnection: Upgrade\r\n\r\n\x01\x00",
    b"HTTP/1.0 204\r\n\r\n",
];

/// Bytes that sit on the grammar's edges.
const INTERESTING: &[u8] = b"\r\n\r\n \t:;,#?/[]@*\0\x01\x7f\x80\xff0123456789aZ-\"";

/// A small deterministic generator (xorshift64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        if self.below(4) == 0 {
            self.next() as u8
        } else {
            INTERESTING[self.below(INTERESTING.len())]
        }
    }
}

fn mutate(rng: &mut Rng, input: &mut Vec<u8>) {
    for _ in 0..=rng.below(3) {
        let at = rng.below(input.len() + 1);
        match rng.below(5) {
            0 if at < input.len() => input[at] = rng.byte(),
            1 => input.insert(at, rng.byte()),
            2 if at < input.len() => {
                input.remove(at);
            }
            3 => {
                // Repeat a line: duplicate headers, doubled start lines.
                let start = input[..at]
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1);
                let end = input[at..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(input.len(), |i| at + i + 1);
                let line = input[start..end].to_vec();
                input.splice(end..end, line);
            }
            _ => {
                let len = rng.below(8).min(input.len() - at.min(input.len()));
                let chunk: Vec<u8> = input[at..at + len].to_vec();
                let to = rng.below(input.len() + 1);
                input.splice(to..to, chunk);
            }
        }
    }
}

fn limits(line_ends: LineEnds) -> Limits {
    Limits {
        max_head_bytes: 4096,
        max_headers: 16,
        line_ends,
    }
}

/// httparse reads `head` (with hyper's settings, the defaults) as `request` reads it.
fn agrees_on_request(head: &[u8], request: &RequestHead<'_>) {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut theirs = httparse::Request::new(&mut fields);
    match theirs.parse(head) {
        Ok(httparse::Status::Complete(end)) => assert_eq!(end, head.len(), "{head:?}"),
        other => panic!("accepted what httparse does not ({other:?}): {head:?}"),
    }
    assert_eq!(theirs.method, Some(request.method()), "{head:?}");
    assert_eq!(theirs.path, Some(request.target()), "{head:?}");
    assert_eq!(theirs.version, Some(request.version().minor()), "{head:?}");
    let ours: Vec<_> = request
        .headers()
        .iter()
        .map(|h| (h.name, h.value))
        .collect();
    let theirs: Vec<_> = theirs.headers.iter().map(|h| (h.name, h.value)).collect();
    assert_eq!(ours, theirs, "{head:?}");
}

/// httparse reads `head` as `response` reads it.
fn agrees_on_response(head: &[u8], response: &ResponseHead<'_>) {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut theirs = httparse::Response::new(&mut fields);
    match theirs.parse(head) {
        Ok(httparse::Status::Complete(end)) => assert_eq!(end, head.len(), "{head:?}"),
        other => panic!("accepted what httparse does not ({other:?}): {head:?}"),
    }
    assert_eq!(theirs.code, Some(response.status()), "{head:?}");
    assert_eq!(theirs.version, Some(response.version().minor()), "{head:?}");
    if let Ok(reason) = std::str::from_utf8(response.reason()) {
        assert_eq!(theirs.reason, Some(reason), "{head:?}");
    }
    let ours: Vec<_> = response
        .headers()
        .iter()
        .map(|h| (h.name, h.value))
        .collect();
    let theirs: Vec<_> = theirs.headers.iter().map(|h| (h.name, h.value)).collect();
    assert_eq!(ours, theirs, "{head:?}");
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
    for header in request.headers() {
        out.extend_from_slice(header.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(header.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

fn check(rng: &mut Rng, input: &[u8], counts: &mut [usize; 3]) {
    let strict = limits(LineEnds::CrlfOnly);
    let end = match head_end(input, strict.max_head_bytes) {
        Ok(Some(end)) => end,
        Ok(None) | Err(_) => return,
    };
    // Two reads, split anywhere, end in the same place.
    let split = rng.below(input.len() + 1);
    let mut scanner = HeadScanner::new(strict.max_head_bytes);
    let _ = scanner.scan(&input[..split]);
    assert_eq!(
        scanner.scan(input),
        Ok(Some(end)),
        "{input:?} split at {split}"
    );
    let head = &input[..end];
    counts[0] += 1;
    for limits in [strict, limits(LineEnds::CrlfOrBareLf)] {
        if let Ok(request) = RequestHead::parse(head, &limits) {
            counts[1] += 1;
            agrees_on_request(head, &request);
            let written = write_request(&request);
            let again = RequestHead::parse(&written, &strict).expect("a written head parses");
            assert_eq!(again.method(), request.method());
            assert_eq!(again.target_form(), request.target_form());
            assert_eq!(again.headers(), request.headers());
        }
        if let Ok(response) = ResponseHead::parse(head, &limits) {
            counts[2] += 1;
            agrees_on_response(head, &response);
        }
        // A bare LF never makes a strict parse succeed.
        let bare_lf = head
            .iter()
            .enumerate()
            .any(|(i, &b)| b == b'\n' && (i == 0 || head[i - 1] != b'\r'));
        if bare_lf && limits.line_ends == LineEnds::CrlfOnly {
            assert!(RequestHead::parse(head, &limits).is_err(), "{head:?}");
            assert!(ResponseHead::parse(head, &limits).is_err(), "{head:?}");
        }
    }
}

#[test]
fn every_head_accepted_is_read_the_same_by_httparse_and_reparses_when_written_out() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // [delimited heads, accepted requests, accepted responses]
    let mut counts = [0; 3];
    for seed in SEEDS {
        check(&mut rng, seed, &mut counts);
    }
    for _ in 0..30_000 {
        let mut input = SEEDS[rng.below(SEEDS.len())].to_vec();
        mutate(&mut rng, &mut input);
        check(&mut rng, &input, &mut counts);
    }
    // The mutations must leave enough valid heads for the agreement to mean something.
    let [delimited, requests, responses] = counts;
    assert!(requests > 2_000 && responses > 1_000, "{counts:?}");
    assert!(delimited > requests + responses, "{counts:?}");
}

#[test]
fn the_seeds_are_valid_heads() {
    for seed in SEEDS {
        let end = head_end(seed, 4096)
            .expect("within limits")
            .expect("complete");
        let lenient = limits(LineEnds::CrlfOrBareLf);
        let head = &seed[..end];
        assert!(
            RequestHead::parse(head, &lenient).is_ok()
                || ResponseHead::parse(head, &lenient).is_ok(),
            "{:?}",
            String::from_utf8_lossy(seed)
        );
    }
}
