//! The incremental frame decoder: bytes go in, in any split; frames come out.

use crate::frame::{FrameType, HEADER_SIZE, MAX_PAYLOAD};

/// Which way a stream flows, which decides how it must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// A response stream (stdout/stderr/exit): it must end with exactly one exit frame, and
    /// nothing may follow that frame.
    GuestToHost,
    /// An input stream (stdin/stdin_close): it may end after any whole frame.
    HostToGuest,
}

/// Why a frame stream is invalid. Every variant is terminal: after one, the decoder keeps
/// returning the same error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// EOF arrived inside a frame header.
    #[error("stream truncated inside a frame header ({got} of 8 header bytes)")]
    TruncatedHeader {
        /// Header bytes received before EOF.
        got: usize,
    },
    /// EOF arrived inside a frame payload.
    #[error("stream truncated inside a {frame_type} payload ({got} of {declared} bytes)")]
    TruncatedPayload {
        /// The type of the cut frame.
        frame_type: FrameType,
        /// Payload length its header declared.
        declared: usize,
        /// Payload bytes received before EOF.
        got: usize,
    },
    /// A header declared more than [`MAX_PAYLOAD`] bytes.
    #[error("frame declares a {declared}-byte payload, more than the 65536-byte maximum")]
    Oversize {
        /// The declared payload length.
        declared: u32,
    },
    /// A header carried a type byte that names no frame type.
    #[error("unknown frame type {type_byte}")]
    UnknownType {
        /// The offending type byte.
        type_byte: u8,
    },
    /// A response stream ended cleanly without an exit frame: the command's result was lost.
    #[error("stream ended without an exit frame")]
    MissingExit,
    /// Bytes followed the exit frame of a response stream.
    #[error("data after the exit frame")]
    DataAfterExit,
}

impl DecodeError {
    /// The error's name in the fixtures manifest (`"truncated_header"`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::TruncatedHeader { .. } => "truncated_header",
            DecodeError::TruncatedPayload { .. } => "truncated_payload",
            DecodeError::Oversize { .. } => "oversize",
            DecodeError::UnknownType { .. } => "unknown_type",
            DecodeError::MissingExit => "missing_exit",
            DecodeError::DataAfterExit => "data_after_exit",
        }
    }
}

/// One decoded frame, borrowing its payload from the decoder's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The frame's type.
    pub frame_type: FrameType,
    /// The frame's payload, at most [`MAX_PAYLOAD`] bytes.
    pub payload: &'a [u8],
}

/// Initial buffer of [`Decoder::new`]: enough for the short outputs most commands print; it
/// grows (to about two maximal frames) only when a stream carries large frames.
const INITIAL_CAPACITY: usize = 16 * 1024;

/// Below this much free tail space the buffer is compacted (or grown) before the next read.
const MIN_FREE: usize = 8 * 1024;

/// A push-style incremental decoder.
///
/// Feed bytes with [`push`](Self::push) (or read straight into
/// [`unfilled_mut`](Self::unfilled_mut) and [`mark_filled`](Self::mark_filled) to skip a copy),
/// take frames with [`next_frame`](Self::next_frame) until it returns `None`, and call
/// [`finish`](Self::finish) at end of input: EOF mid-frame, or a response stream without its exit
/// frame, is an error there, never a clean end.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    direction: Direction,
    saw_exit: bool,
    failed: Option<DecodeError>,
}

impl Decoder {
    /// A decoder for a stream flowing in `direction`, with a small buffer that grows on demand.
    pub fn new(direction: Direction) -> Self {
        Self::with_capacity(direction, INITIAL_CAPACITY)
    }

    /// A decoder whose buffer starts at `capacity` bytes (readers that expect bulk output use
    /// two maximal frames, so that reads are large and compaction rare).
    pub fn with_capacity(direction: Direction, capacity: usize) -> Self {
        Decoder {
            buf: vec![0; capacity.max(HEADER_SIZE)],
            start: 0,
            end: 0,
            direction,
            saw_exit: false,
            failed: None,
        }
    }

    /// Whether the exit frame has been decoded.
    pub fn saw_exit(&self) -> bool {
        self.saw_exit
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.make_room(bytes.len());
        self.buf[self.end..self.end + bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
    }

    /// Free buffer space to read into; follow with [`mark_filled`](Self::mark_filled). There is
    /// always room for at least the rest of the current frame, and usually far more.
    pub fn unfilled_mut(&mut self) -> &mut [u8] {
        self.make_room(self.missing_for_current_frame().max(MIN_FREE));
        &mut self.buf[self.end..]
    }

    /// Records that `n` bytes were written at the start of [`unfilled_mut`](Self::unfilled_mut).
    pub fn mark_filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// Returns the next whole frame, `Ok(None)` when more input is needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, DecodeError> {
        let Some((frame_type, len)) = self.complete_frame()? else {
            return Ok(None);
        };
        let payload_start = self.start + HEADER_SIZE;
        let payload_end = payload_start + len;
        self.start = payload_end;
        if frame_type == FrameType::Exit {
            self.saw_exit = true;
        }
        Ok(Some(Frame {
            frame_type,
            payload: &self.buf[payload_start..payload_end],
        }))
    }

    /// Takes every whole frame buffered, as the exact bytes received (headers included), and
    /// validates them as [`next_frame`](Self::next_frame) does. For relays that forward frames
    /// without re-encoding them while never forwarding half a frame. Empty when no whole frame
    /// is buffered.
    pub fn take_whole_frames(&mut self) -> Result<&[u8], DecodeError> {
        let first = self.start;
        let mut end = self.start;
        let mut result = Ok(());
        loop {
            match self.complete_frame() {
                Ok(Some((frame_type, len))) => {
                    end += HEADER_SIZE + len;
                    self.start = end;
                    if frame_type == FrameType::Exit {
                        self.saw_exit = true;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        // Whole frames before an error are still good; the error surfaces on the next call.
        if end == first {
            result?;
        }
        Ok(&self.buf[first..end])
    }

    /// Whether a whole frame is buffered (so [`next_frame`](Self::next_frame) returns one).
    pub fn has_frame(&mut self) -> Result<bool, DecodeError> {
        Ok(self.complete_frame()?.is_some())
    }

    /// Declares end of input. Frames still buffered are discarded; then a partial frame, or a
    /// response stream that never carried its exit frame, is an error.
    pub fn finish(&mut self) -> Result<(), DecodeError> {
        while self.next_frame()?.is_some() {}
        let partial = self.end - self.start;
        let error = if partial == 0 {
            if self.direction == Direction::GuestToHost && !self.saw_exit {
                DecodeError::MissingExit
            } else {
                return Ok(());
            }
        } else if partial < HEADER_SIZE {
            DecodeError::TruncatedHeader { got: partial }
        } else {
            // The header was already validated by `complete_frame`.
            let (frame_type, declared) = self.peek_header()?;
            DecodeError::TruncatedPayload {
                frame_type,
                declared,
                got: partial - HEADER_SIZE,
            }
        };
        Err(self.fail(error))
    }

    /// Validates the buffered header, if whole, and reports the frame when its payload is too.
    fn complete_frame(&mut self) -> Result<Option<(FrameType, usize)>, DecodeError> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        let available = self.end - self.start;
        if available == 0 {
            self.start = 0;
            self.end = 0;
            return Ok(None);
        }
        if self.saw_exit && self.direction == Direction::GuestToHost {
            return Err(self.fail(DecodeError::DataAfterExit));
        }
        if available < HEADER_SIZE {
            return Ok(None);
        }
        let (frame_type, len) = self.peek_header()?;
        if available < HEADER_SIZE + len {
            return Ok(None);
        }
        Ok(Some((frame_type, len)))
    }

    fn peek_header(&mut self) -> Result<(FrameType, usize), DecodeError> {
        let header = &self.buf[self.start..self.start + HEADER_SIZE];
        let type_byte = header[0];
        let declared = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
        let frame_type = match FrameType::try_from(type_byte) {
            Ok(t) => t,
            Err(_) => return Err(self.fail(DecodeError::UnknownType { type_byte })),
        };
        if declared as usize > MAX_PAYLOAD {
            return Err(self.fail(DecodeError::Oversize { declared }));
        }
        Ok((frame_type, declared as usize))
    }

    /// How many more bytes the frame at `start` needs to be whole (its declared length is capped
    /// at the maximum: an oversize header fails on decode, not here).
    fn missing_for_current_frame(&self) -> usize {
        let available = self.end - self.start;
        if available < HEADER_SIZE {
            return HEADER_SIZE - available;
        }
        let h = &self.buf[self.start..self.start + HEADER_SIZE];
        let declared = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        (HEADER_SIZE + declared.min(MAX_PAYLOAD)).saturating_sub(available)
    }

    fn fail(&mut self, error: DecodeError) -> DecodeError {
        self.failed = Some(error);
        error
    }

    /// Ensures `extra` bytes fit after `end`, compacting first and growing only if needed.
    fn make_room(&mut self, extra: usize) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.buf.len() - self.end >= extra {
            return;
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let needed = self.end + extra;
        if needed > self.buf.len() {
            self.buf.resize(needed.max(self.buf.len() * 2), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoder::encode_header;

    fn frame(t: FrameType, payload: &[u8]) -> Vec<u8> {
        let mut v = encode_header(t, payload.len()).to_vec();
        v.extend_from_slice(payload);
        v
    }

    fn decode_all(d: &mut Decoder) -> Result<Vec<(FrameType, Vec<u8>)>, DecodeError> {
        let mut out = Vec::new();
        while let Some(f) = d.next_frame()? {
            out.push((f.frame_type, f.payload.to_vec()));
        }
        Ok(out)
    }

    #[test]
    fn decodes_frames_fed_one_byte_at_a_time() {
        let mut bytes = frame(FrameType::Stdout, b"hello\n");
        bytes.extend(frame(FrameType::Exit, b"{}"));
        let mut d = Decoder::new(Direction::GuestToHost);
        let mut frames = Vec::new();
        for b in &bytes {
            d.push(std::slice::from_ref(b));
            frames.extend(decode_all(&mut d).expect("valid stream"));
        }
        d.finish().expect("clean end");
        assert_eq!(
            frames,
            vec![
                (FrameType::Stdout, b"hello\n".to_vec()),
                (FrameType::Exit, b"{}".to_vec())
            ]
        );
    }

    #[test]
    fn eof_inside_header_is_truncated_header() {
        let mut d = Decoder::new(Direction::GuestToHost);
        d.push(&[1, 0, 0]);
        assert_eq!(decode_all(&mut d), Ok(vec![]));
        assert_eq!(d.finish(), Err(DecodeError::TruncatedHeader { got: 3 }));
    }

    #[test]
    fn eof_inside_payload_is_truncated_payload() {
        let mut d = Decoder::new(Direction::GuestToHost);
        d.push(&frame(FrameType::Stderr, b"abcdef")[..10]);
        assert_eq!(decode_all(&mut d), Ok(vec![]));
        assert_eq!(
            d.finish(),
            Err(DecodeError::TruncatedPayload {
                frame_type: FrameType::Stderr,
                declared: 6,
                got: 2
            })
        );
    }

    #[test]
    fn oversize_header_is_rejected_before_its_payload_arrives() {
        let mut d = Decoder::new(Direction::GuestToHost);
        d.push(&[1, 0, 0, 0, 0, 1, 0, 1]);
        assert_eq!(
            d.next_frame(),
            Err(DecodeError::Oversize { declared: 65537 })
        );
        // Errors are sticky.
        assert_eq!(d.finish(), Err(DecodeError::Oversize { declared: 65537 }));
    }

    #[test]
    fn max_payload_is_accepted() {
        let payload = vec![7u8; MAX_PAYLOAD];
        let mut d = Decoder::new(Direction::HostToGuest);
        d.push(&frame(FrameType::Stdin, &payload));
        let frames = decode_all(&mut d).expect("valid");
        assert_eq!(frames, vec![(FrameType::Stdin, payload)]);
        d.finish().expect("input streams need no exit frame");
    }

    #[test]
    fn unknown_type_is_rejected() {
        let mut d = Decoder::new(Direction::GuestToHost);
        d.push(&[9, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            d.next_frame(),
            Err(DecodeError::UnknownType { type_byte: 9 })
        );
    }

    #[test]
    fn response_without_exit_is_missing_exit() {
        let mut d = Decoder::new(Direction::GuestToHost);
        d.push(&frame(FrameType::Stdout, b"x"));
        assert_eq!(decode_all(&mut d).map(|f| f.len()), Ok(1));
        assert_eq!(d.finish(), Err(DecodeError::MissingExit));
    }

    #[test]
    fn any_byte_after_exit_is_data_after_exit() {
        let mut d = Decoder::new(Direction::GuestToHost);
        d.push(&frame(FrameType::Exit, b"{}"));
        d.push(&[1]);
        assert_eq!(d.next_frame().map(|f| f.is_some()), Ok(true));
        assert_eq!(d.next_frame(), Err(DecodeError::DataAfterExit));
        assert_eq!(d.finish(), Err(DecodeError::DataAfterExit));
    }

    #[test]
    fn empty_input_stream_is_a_clean_end() {
        let mut d = Decoder::new(Direction::HostToGuest);
        assert_eq!(d.finish(), Ok(()));
    }

    #[test]
    fn finish_names_truncation_even_when_frames_were_not_drained() {
        let mut d = Decoder::new(Direction::GuestToHost);
        let mut bytes = frame(FrameType::Stdout, b"abc");
        bytes.extend_from_slice(&[2, 0]);
        d.push(&bytes);
        assert_eq!(d.finish(), Err(DecodeError::TruncatedHeader { got: 2 }));
    }

    #[test]
    fn take_whole_frames_returns_exact_bytes_and_keeps_the_partial_tail() {
        let mut bytes = frame(FrameType::Stdout, b"one");
        bytes.extend(frame(FrameType::Stderr, b"two"));
        let whole = bytes.len();
        bytes.extend(frame(FrameType::Exit, b"{}"));
        let mut d = Decoder::new(Direction::GuestToHost);
        d.push(&bytes[..whole + 3]);
        assert_eq!(d.take_whole_frames().expect("valid"), &bytes[..whole]);
        assert_eq!(d.take_whole_frames().expect("valid"), b"");
        d.push(&bytes[whole + 3..]);
        assert_eq!(d.take_whole_frames().expect("valid"), &bytes[whole..]);
        assert!(d.saw_exit());
        d.finish().expect("clean end");
    }

    #[test]
    fn take_whole_frames_reports_an_error_after_the_good_frames() {
        let mut bytes = frame(FrameType::Stdout, b"ok");
        let good = bytes.len();
        bytes.extend_from_slice(&[9, 0, 0, 0, 0, 0, 0, 0]);
        let mut d = Decoder::new(Direction::GuestToHost);
        d.push(&bytes);
        assert_eq!(d.take_whole_frames().expect("good part"), &bytes[..good]);
        assert_eq!(
            d.take_whole_frames(),
            Err(DecodeError::UnknownType { type_byte: 9 })
        );
    }

    #[test]
    fn unfilled_space_always_fits_a_whole_frame() {
        let mut d = Decoder::new(Direction::GuestToHost);
        let big = frame(FrameType::Stdout, &vec![1u8; MAX_PAYLOAD]);
        // Leave a partial big frame buffered at an awkward offset, then read the rest in.
        d.push(&frame(FrameType::Stdout, b"small"));
        d.push(&big[..100]);
        assert!(d.next_frame().expect("valid").is_some());
        let rest = &big[100..];
        let space = d.unfilled_mut();
        assert!(space.len() >= rest.len());
        space[..rest.len()].copy_from_slice(rest);
        d.mark_filled(rest.len());
        let f = d.next_frame().expect("valid").expect("whole frame");
        assert_eq!(f.payload.len(), MAX_PAYLOAD);
    }
}
