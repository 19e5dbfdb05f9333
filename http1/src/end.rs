//! Where a head ends in what has been read so far.
//!
//! A head ends just past its first empty line. Lines may end in CRLF or a bare LF: this
//! delimits either, so that no head is left waiting for a terminator its sender never writes
//! (the parser then accepts a bare LF or refuses it, per [`crate::Limits::line_ends`], but at
//! once). Empty lines before the start line are skipped, as RFC 9112 §2.2 asks of a server
//! and as httparse and hyper do, so they delimit nothing: the end found here is the one hyper
//! would find, and the bytes past it are the same body.

use crate::error::HeadError;

/// Where the head in `buf` ends: the index just past its empty line, `Ok(None)` if it has not
/// arrived yet, or [`HeadError::TooLarge`] once `limit` bytes have arrived without an end (a
/// head may be at most `limit` bytes long, its empty line included).
///
/// This searches `buf` from its start; a reader that calls it after every read of a slowly
/// sent head does quadratic work. Such a reader keeps a [`HeadScanner`] instead.
pub fn head_end(buf: &[u8], limit: usize) -> Result<Option<usize>, HeadError> {
    HeadScanner::new(limit).scan(buf)
}

/// [`head_end`] over a buffer that grows read by read: each call looks only at the bytes the
/// last one had not seen, so a head costs linear time however it is split.
#[derive(Debug, Clone)]
pub struct HeadScanner {
    limit: usize,
    /// Bytes of the buffer already looked at.
    scanned: usize,
    /// Where the line being looked at starts.
    line_start: usize,
    /// Whether a non-empty line (the start line) has been seen.
    started: bool,
    /// The end, or the error, once found: every later call returns it again.
    outcome: Option<Result<usize, HeadError>>,
}

impl HeadScanner {
    /// A scanner for a head of at most `limit` bytes.
    pub fn new(limit: usize) -> HeadScanner {
        HeadScanner {
            limit,
            scanned: 0,
            line_start: 0,
            started: false,
            outcome: None,
        }
    }

    /// [`head_end`] of `buf`, which must be the buffer of the previous call with bytes
    /// appended (a shorter one starts the search over). Once an end or an error is found,
    /// every later call returns it.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, HeadError> {
        if let Some(outcome) = &self.outcome {
            return outcome.clone().map(Some);
        }
        if buf.len() < self.scanned {
            *self = HeadScanner::new(self.limit);
        }
        let window = buf.len().min(self.limit);
        while let Some(at) = buf[self.scanned..window].iter().position(|&b| b == b'\n') {
            let lf = self.scanned + at;
            let line = &buf[self.line_start..lf];
            self.scanned = lf + 1;
            self.line_start = lf + 1;
            if line.is_empty() || line == b"\r" {
                if self.started {
                    self.outcome = Some(Ok(lf + 1));
                    return Ok(Some(lf + 1));
                }
            } else {
                self.started = true;
            }
        }
        self.scanned = window;
        if buf.len() >= self.limit {
            let error = HeadError::TooLarge { limit: self.limit };
            self.outcome = Some(Err(error.clone()));
            return Err(error);
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 64 * 1024;

    #[test]
    fn a_head_ends_just_past_its_crlf_empty_line_leaving_the_body() {
        let buf = b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody\r\n\r\n";
        assert_eq!(head_end(buf, LIMIT), Ok(Some(27)));
        assert_eq!(&buf[27..], b"body\r\n\r\n");
    }

    #[test]
    fn a_bare_lf_empty_line_ends_a_head_too_so_it_never_hangs() {
        assert_eq!(
            head_end(b"GET / HTTP/1.1\nHost: x\n\nbody", LIMIT),
            Ok(Some(24))
        );
        // Mixed: an LF line end, then a CRLF empty line; a CRLF line end, then an LF one.
        assert_eq!(
            head_end(b"GET / HTTP/1.1\r\nHost: x\n\r\n", LIMIT),
            Ok(Some(26))
        );
        assert_eq!(
            head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\n", LIMIT),
            Ok(Some(26))
        );
    }

    #[test]
    fn a_head_without_its_empty_line_needs_more() {
        assert_eq!(head_end(b"", LIMIT), Ok(None));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n", LIMIT), Ok(None));
        assert_eq!(
            head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r", LIMIT),
            Ok(None)
        );
        // A CR alone is no line end.
        assert_eq!(head_end(b"GET / HTTP/1.1\r\r\r\r", LIMIT), Ok(None));
    }

    #[test]
    fn empty_lines_before_the_start_line_are_skipped_not_taken_for_its_end() {
        assert_eq!(head_end(b"\r\n\r\n\n", LIMIT), Ok(None));
        let buf = b"\r\n\nGET / HTTP/1.1\r\n\r\n";
        assert_eq!(head_end(buf, LIMIT), Ok(Some(buf.len())));
    }

    #[test]
    fn a_head_may_end_exactly_at_the_limit_but_not_past_it() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let len = head.len();
        assert_eq!(head_end(head, len), Ok(Some(len)));
        // The end found past the limit in the same read is refused, not returned.
        assert_eq!(
            head_end(head, len - 1),
            Err(HeadError::TooLarge { limit: len - 1 })
        );
        // Body bytes past a head within the limit do not count.
        let mut with_body = head.to_vec();
        with_body.extend_from_slice(&[b'x'; 100]);
        assert_eq!(head_end(&with_body, len), Ok(Some(len)));
    }

    #[test]
    fn limit_bytes_without_an_end_are_too_large_before_more_is_read() {
        let partial = b"GET / HTTP/1.1\r\nX-Filler: aaaaaaaaaaaa";
        assert_eq!(head_end(partial, partial.len() + 1), Ok(None));
        assert_eq!(
            head_end(partial, partial.len()),
            Err(HeadError::TooLarge {
                limit: partial.len()
            })
        );
        // Endless empty lines are no way around the limit.
        assert_eq!(
            head_end(&b"\r\n".repeat(100), 64),
            Err(HeadError::TooLarge { limit: 64 })
        );
    }

    #[test]
    fn a_scanner_finds_the_end_of_a_head_fed_a_byte_at_a_time() {
        let buf = b"POST /x HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
        let mut scanner = HeadScanner::new(LIMIT);
        let mut found = None;
        for n in 0..=buf.len() {
            let end = scanner.scan(&buf[..n]).expect("within the limit");
            assert!(end.is_none() || end == Some(buf.len() - 2));
            found = found.or(end);
        }
        assert_eq!(found, Some(buf.len() - 2));
    }

    #[test]
    fn a_scanner_keeps_its_answer_and_its_error() {
        let mut scanner = HeadScanner::new(LIMIT);
        let head = b"GET / HTTP/1.1\r\n\r\n";
        assert_eq!(scanner.scan(head), Ok(Some(head.len())));
        assert_eq!(
            scanner.scan(b"GET / HTTP/1.1\r\n\r\nmore"),
            Ok(Some(head.len()))
        );
        let mut scanner = HeadScanner::new(4);
        assert_eq!(
            scanner.scan(b"GET /"),
            Err(HeadError::TooLarge { limit: 4 })
        );
        assert_eq!(
            scanner.scan(b"GET /"),
            Err(HeadError::TooLarge { limit: 4 })
        );
    }

    #[test]
    fn a_scanner_given_a_shorter_buffer_starts_over() {
        let mut scanner = HeadScanner::new(LIMIT);
        assert_eq!(scanner.scan(b"GET / HTTP/1.1\r\nHost: x\r\n"), Ok(None));
        assert_eq!(scanner.scan(b"\r\n"), Ok(None));
        assert_eq!(scanner.scan(b"\r\nGET / HTTP/1.1\r\n\r\n"), Ok(Some(20)));
    }

    /// Heads of every shape the end search meets: CRLF, bare LF, mixed, leading empty lines,
    /// CRs inside lines, a body after the head, and a head that never ends.
    fn corpus() -> Vec<Vec<u8>> {
        let mut heads: Vec<Vec<u8>> = [
            &b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody"[..],
            b"GET / HTTP/1.1\nHost: x\n\nbody",
            b"GET / HTTP/1.1\r\nHost: x\n\r\n\r\n",
            b"GET / HTTP/1.1\nHost: x\r\n\n",
            b"\r\n\r\nGET / HTTP/1.1\r\n\r\n",
            b"\n\nGET / HTTP/1.1\n\n",
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: tcp\r\nConnection: Upgrade\r\n\r\n\x01\x02",
            b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: \r\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: y\r\n",
            b"\r\n\r\n\r\n",
        ]
        .iter()
        .map(|h| h.to_vec())
        .collect();
        let mut long = b"POST /sandboxes/sb-1/exec?stdin=1 HTTP/1.1\r\n".to_vec();
        for i in 0..40 {
            long.extend_from_slice(format!("X-Header-{i}: value {i}\r\n").as_bytes());
        }
        long.extend_from_slice(b"\r\n{\"cmd\":[\"true\"]}");
        heads.push(long);
        heads
    }

    #[test]
    fn splitting_any_head_at_any_byte_into_two_reads_gives_the_same_end() {
        for buf in corpus() {
            for limit in [LIMIT, buf.len(), buf.len() / 2 + 1] {
                let whole = head_end(&buf, limit);
                for split in 0..=buf.len() {
                    let mut scanner = HeadScanner::new(limit);
                    let first = scanner.scan(&buf[..split]);
                    // What the first read says is never contradicted by the second.
                    match &first {
                        Ok(Some(_)) | Err(_) => assert_eq!(first, whole, "{buf:?} at {split}"),
                        Ok(None) => {}
                    }
                    let second = scanner.scan(&buf);
                    assert_eq!(second, whole, "{buf:?} split at {split}, limit {limit}");
                    // And a fresh search of the first read agrees with the scanner's.
                    assert_eq!(head_end(&buf[..split], limit), first, "{buf:?} at {split}");
                }
            }
        }
    }
}
