//! The host side's `CONNECT <port>\n` line, checked byte by byte as it arrives, so a line that
//! cannot become valid is refused at the first wrong byte rather than at the newline or the
//! timeout. The muxer reads the socket one byte at a time so no stream data after the line is
//! consumed.
//!
//! Accepted: `CONNECT` (any case, as Firecracker accepts), one or more spaces, a decimal port
//! (at most `u32::MAX`), optional spaces, optional `\r`, `\n`; at most [`MAX_CONNECT_LINE`]
//! bytes in all.

/// The longest `CONNECT <port>\n` line accepted, newline included.
pub const MAX_CONNECT_LINE: usize = 32;

const KEYWORD: &[u8] = b"CONNECT";

/// What the line says so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineStatus {
    /// A valid line could still follow: read more.
    Incomplete,
    /// A complete, valid line for this guest port.
    Port(u32),
    /// The line can never become valid (why, for the log).
    Refused(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// `n` bytes of the keyword matched.
    Keyword(usize),
    /// The keyword is complete: at least one space must follow.
    SpaceAfterKeyword,
    /// Spaces before the port.
    Spaces,
    /// Port digits so far.
    Port(u32),
    /// Spaces after the port.
    TrailingSpaces(u32),
    /// `\r` after the port: only `\n` may follow.
    CarriageReturn(u32),
    /// The line ended (valid or not): nothing more is read.
    Done,
}

/// A `CONNECT` line being read.
#[derive(Debug, Clone)]
pub struct ConnectLine {
    part: Part,
    len: usize,
}

impl Default for ConnectLine {
    fn default() -> Self {
        ConnectLine {
            part: Part::Keyword(0),
            len: 0,
        }
    }
}

impl ConnectLine {
    /// An empty line.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next byte. Once it returns something other than [`LineStatus::Incomplete`],
    /// further bytes are refused.
    pub fn push(&mut self, byte: u8) -> LineStatus {
        let status = self.step(byte);
        if status != LineStatus::Incomplete {
            self.part = Part::Done;
        }
        status
    }

    fn step(&mut self, byte: u8) -> LineStatus {
        self.len += 1;
        if self.len > MAX_CONNECT_LINE {
            return LineStatus::Refused("line too long");
        }
        let next = match (self.part, byte) {
            (Part::Done, _) => return LineStatus::Refused("line already ended"),
            (Part::Keyword(n), b) if b.eq_ignore_ascii_case(&KEYWORD[n]) => {
                if n + 1 == KEYWORD.len() {
                    Part::SpaceAfterKeyword
                } else {
                    Part::Keyword(n + 1)
                }
            }
            (Part::Keyword(_), _) => return LineStatus::Refused("not a CONNECT line"),
            (Part::SpaceAfterKeyword | Part::Spaces, b' ') => Part::Spaces,
            (Part::SpaceAfterKeyword, _) => return LineStatus::Refused("no space after CONNECT"),
            (Part::Spaces, b'0'..=b'9') => Part::Port(u32::from(byte - b'0')),
            (Part::Spaces, _) => return LineStatus::Refused("port is not a number"),
            (Part::Port(p), b'0'..=b'9') => {
                match p
                    .checked_mul(10)
                    .and_then(|p| p.checked_add(u32::from(byte - b'0')))
                {
                    Some(p) => Part::Port(p),
                    None => return LineStatus::Refused("port out of range"),
                }
            }
            (Part::Port(p) | Part::TrailingSpaces(p), b' ') => Part::TrailingSpaces(p),
            (Part::Port(p) | Part::TrailingSpaces(p), b'\r') => Part::CarriageReturn(p),
            (Part::Port(p) | Part::TrailingSpaces(p) | Part::CarriageReturn(p), b'\n') => {
                return LineStatus::Port(p)
            }
            (Part::Port(_), _) => return LineStatus::Refused("port is not a number"),
            (Part::TrailingSpaces(_) | Part::CarriageReturn(_), _) => {
                return LineStatus::Refused("junk after the port")
            }
        };
        self.part = next;
        LineStatus::Incomplete
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(line: &[u8]) -> (LineStatus, usize) {
        let mut l = ConnectLine::new();
        for (i, &b) in line.iter().enumerate() {
            let s = l.push(b);
            if s != LineStatus::Incomplete {
                return (s, i + 1);
            }
        }
        (LineStatus::Incomplete, line.len())
    }

    #[test]
    fn connect_line_accepts_the_documented_forms() {
        assert_eq!(feed(b"CONNECT 1024\n").0, LineStatus::Port(1024));
        assert_eq!(feed(b"connect 52\r\n").0, LineStatus::Port(52));
        assert_eq!(feed(b"CONNECT   7  \n").0, LineStatus::Port(7));
        assert_eq!(feed(b"CONNECT 4294967295\n").0, LineStatus::Port(u32::MAX));
        assert_eq!(feed(b"CONNECT 1024").0, LineStatus::Incomplete);
        assert_eq!(feed(b"").0, LineStatus::Incomplete);
    }

    #[test]
    fn connect_line_is_refused_at_the_first_byte_that_cannot_fit() {
        // (line, how many bytes it takes to know)
        for (line, at) in [
            (&b"HELLO\n"[..], 1),
            (b"GET / HTTP/1.1\r\n", 1),
            (b"CONNECTX", 8),
            (b"CONNECT x", 9),
            (b"CONNECT \n", 9),
            (b"CONNECT 12a", 11),
            (b"CONNECT 4294967296", 18),
            (b"CONNECT 1 2\n", 11),
            (b"CONNECT 1\rX", 11),
        ] {
            let (status, n) = feed(line);
            assert!(
                matches!(status, LineStatus::Refused(_)),
                "{:?}: {status:?}",
                String::from_utf8_lossy(line)
            );
            assert_eq!(n, at, "{:?}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn connect_line_longer_than_the_limit_is_refused_even_if_it_looks_valid() {
        let mut line = b"CONNECT".to_vec();
        line.extend(std::iter::repeat_n(b' ', MAX_CONNECT_LINE));
        let (status, n) = feed(&line);
        assert_eq!(status, LineStatus::Refused("line too long"));
        assert_eq!(n, MAX_CONNECT_LINE + 1);
        // Exactly the limit is fine.
        let mut ok = b"CONNECT".to_vec();
        ok.extend(std::iter::repeat_n(b' ', MAX_CONNECT_LINE - 7 - 3));
        ok.extend_from_slice(b"9\r\n");
        assert_eq!(ok.len(), MAX_CONNECT_LINE);
        assert_eq!(feed(&ok).0, LineStatus::Port(9));
    }

    #[test]
    fn connect_line_takes_nothing_after_it_ended() {
        let mut l = ConnectLine::new();
        for &b in b"CONNECT 5\n" {
            l.push(b);
        }
        assert!(matches!(l.push(b'x'), LineStatus::Refused(_)));
    }
}
