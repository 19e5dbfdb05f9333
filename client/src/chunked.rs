//! A sans-IO decoder of HTTP/1.1 chunked transfer coding (RFC 9112 §7.1), for the exec
//! response read by hand ([`crate::raw`]).

/// Why a chunked body is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChunkedError {
    /// A chunk-size line that is not hexadecimal, or too long.
    #[error("bad chunk size line")]
    BadSize,
    /// A chunk not followed by CRLF.
    #[error("a chunk is not followed by CRLF")]
    MissingCrlf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a size line (`size` so far; `extension` once a `;` was seen).
    Size {
        size: u64,
        digits: u8,
        extension: bool,
    },
    /// The size line's LF, after its CR.
    SizeLf {
        size: u64,
    },
    /// `left` bytes of data to go.
    Data {
        left: u64,
    },
    /// The CR, then the LF, after a chunk's data.
    DataCr,
    DataLf,
    /// After the last chunk: trailer lines until an empty one.
    Trailer {
        line_empty: bool,
        saw_cr: bool,
    },
    Done,
}

/// Turns chunked bytes into the body's bytes.
#[derive(Debug, Clone)]
pub(crate) struct Dechunker {
    state: State,
}

impl Default for Dechunker {
    fn default() -> Self {
        Dechunker {
            state: State::Size {
                size: 0,
                digits: 0,
                extension: false,
            },
        }
    }
}

impl Dechunker {
    /// Whether the terminating chunk and trailers were read.
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decodes `input`, appending body bytes to `out`; returns how many input bytes it used
    /// (all of them, unless the body ended within them).
    pub(crate) fn decode(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize, ChunkedError> {
        let mut i = 0;
        while i < input.len() {
            let byte = input[i];
            self.state = match self.state {
                State::Done => return Ok(i),
                State::Data { left } => {
                    let take = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(input.len() - i);
                    out.extend_from_slice(&input[i..i + take]);
                    i += take;
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        State::DataCr
                    } else {
                        State::Data { left }
                    };
                    continue;
                }
                State::Size {
                    size,
                    digits,
                    extension,
                } => match byte {
                    b'\r' => State::SizeLf { size },
                    b'\n' => self.after_size(size),
                    _ if extension => State::Size {
                        size,
                        digits,
                        extension,
                    },
                    b';' | b' ' | b'\t' if digits > 0 => State::Size {
                        size,
                        digits,
                        extension: true,
                    },
                    _ => {
                        let digit = (byte as char).to_digit(16).ok_or(ChunkedError::BadSize)?;
                        if digits >= 15 {
                            return Err(ChunkedError::BadSize);
                        }
                        State::Size {
                            size: size * 16 + u64::from(digit),
                            digits: digits + 1,
                            extension,
                        }
                    }
                },
                State::SizeLf { size } => match byte {
                    b'\n' => self.after_size(size),
                    _ => return Err(ChunkedError::BadSize),
                },
                State::DataCr => match byte {
                    b'\r' => State::DataLf,
                    b'\n' => self.next_size(),
                    _ => return Err(ChunkedError::MissingCrlf),
                },
                State::DataLf => match byte {
                    b'\n' => self.next_size(),
                    _ => return Err(ChunkedError::MissingCrlf),
                },
                State::Trailer { line_empty, saw_cr } => match byte {
                    b'\n' if line_empty => State::Done,
                    b'\n' => State::Trailer {
                        line_empty: true,
                        saw_cr: false,
                    },
                    b'\r' => State::Trailer {
                        line_empty,
                        saw_cr: true,
                    },
                    _ => State::Trailer {
                        line_empty: false,
                        saw_cr,
                    },
                },
            };
            i += 1;
        }
        Ok(i)
    }

    fn after_size(&self, size: u64) -> State {
        if size == 0 {
            State::Trailer {
                line_empty: true,
                saw_cr: false,
            }
        } else {
            State::Data { left: size }
        }
    }

    fn next_size(&self) -> State {
        State::Size {
            size: 0,
            digits: 0,
            extension: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_split(input: &[u8], step: usize) -> (Vec<u8>, bool, usize) {
        let mut d = Dechunker::default();
        let mut out = Vec::new();
        let mut used = 0;
        for piece in input.chunks(step) {
            let n = d.decode(piece, &mut out).expect("valid");
            used += n;
            if d.is_done() {
                break;
            }
        }
        (out, d.is_done(), used)
    }

    #[test]
    fn decodes_whatever_the_split() {
        let body = b"5\r\nhello\r\n1;ext=1\r\n \r\nA\r\n0123456789\r\n0\r\nX-T: y\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, body.len()] {
            let (out, done, used) = decode_split(body, step);
            assert_eq!(out, b"hello 0123456789", "step {step}");
            assert!(done, "step {step}");
            if step == body.len() {
                assert_eq!(&body[used..], b"NEXT", "the rest is not the body's");
            }
        }
        let (out, done, _) = decode_split(b"0\n\n", 1);
        assert!(out.is_empty() && done, "bare LF line ends");
    }

    #[test]
    fn malformed_bodies_are_errors() {
        let mut out = Vec::new();
        assert_eq!(
            Dechunker::default().decode(b"zz\r\n", &mut out),
            Err(ChunkedError::BadSize)
        );
        assert_eq!(
            Dechunker::default().decode(b"2\r\nabX", &mut out),
            Err(ChunkedError::MissingCrlf)
        );
        assert_eq!(
            Dechunker::default().decode(b"1234567890abcdef0\r\n", &mut out),
            Err(ChunkedError::BadSize)
        );
    }
}
