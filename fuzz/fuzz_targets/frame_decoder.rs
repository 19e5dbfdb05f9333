//! The incremental frame decoder (`wire::Decoder`) fed arbitrary bytes in arbitrary splits.
//!
//! Input layout: `[flags][split seed][stream…]`. The stream is decoded twice: once pushed whole
//! (the reference) and once in chunks whose sizes come from the seed, alternating the decoder's
//! three ways in (`push`, `unfilled_mut` + `mark_filled`) and two ways out (`next_frame`,
//! `take_whole_frames`). Checked:
//! - the split never changes the outcome: same frames, same final result;
//! - the frames re-encode to exactly the bytes they were decoded from, in order (reserved
//!   header bytes aside), and a stream that decodes cleanly is exactly its frames;
//! - payloads are at most `MAX_PAYLOAD`; a response stream has at most one exit frame, last;
//! - `buffered()` is always the received bytes not yet returned as frames;
//! - errors are sticky: every later call returns the same error;
//! - each error agrees with the bytes (a truncation names the real number of bytes cut off, an
//!   unknown type names the real type byte, an oversize the real declared length).

#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::{encode_header, DecodeError, Decoder, Direction, FrameType, HEADER_SIZE, MAX_PAYLOAD};

/// What one decoding produced: the frames, re-encoded, and how it ended.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    frames: Vec<(FrameType, Vec<u8>)>,
    end: Result<(), DecodeError>,
}

fn reencode(frames: &[(FrameType, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (frame_type, payload) in frames {
        out.extend_from_slice(&encode_header(*frame_type, payload.len()));
        out.extend_from_slice(payload);
    }
    out
}

/// A small deterministic generator for chunk sizes (xorshift; the seed is fuzzer-chosen).
struct Splits(u32);

impl Splits {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }

    /// Mostly small chunks (the awkward splits), sometimes large ones.
    fn chunk(&mut self) -> usize {
        let r = self.next();
        match r % 8 {
            0 => 1,
            1..=4 => (r >> 8) as usize % 16 + 1,
            5 | 6 => (r >> 8) as usize % 300 + 1,
            _ => (r >> 8) as usize % (2 * MAX_PAYLOAD) + 1,
        }
    }
}

fn decode_whole(direction: Direction, stream: &[u8]) -> Outcome {
    let mut decoder = Decoder::new(direction);
    decoder.push(stream);
    let mut frames = Vec::new();
    loop {
        match decoder.next_frame() {
            Ok(Some(f)) => frames.push((f.frame_type, f.payload.to_vec())),
            Ok(None) => break,
            Err(e) => {
                assert_sticky(&mut decoder, e);
                return Outcome {
                    frames,
                    end: Err(e),
                };
            }
        }
    }
    let end = decoder.finish();
    if let Err(e) = end {
        assert_sticky(&mut decoder, e);
    }
    Outcome { frames, end }
}

fn assert_sticky(decoder: &mut Decoder, error: DecodeError) {
    assert_eq!(
        decoder.next_frame().err(),
        Some(error),
        "next_frame not sticky"
    );
    assert_eq!(
        decoder.has_frame().err(),
        Some(error),
        "has_frame not sticky"
    );
    assert_eq!(
        decoder.take_whole_frames().err(),
        Some(error),
        "take_whole_frames not sticky"
    );
    assert_eq!(decoder.finish().err(), Some(error), "finish not sticky");
}

/// Splits `whole` (bytes `take_whole_frames` returned) back into frames; they were validated.
fn split_whole(mut whole: &[u8], frames: &mut Vec<(FrameType, Vec<u8>)>) {
    while !whole.is_empty() {
        assert!(
            whole.len() >= HEADER_SIZE,
            "half a header among whole frames"
        );
        let frame_type = FrameType::try_from(whole[0]).expect("whole frames have known types");
        let len = u32::from_be_bytes([whole[4], whole[5], whole[6], whole[7]]) as usize;
        assert!(len <= MAX_PAYLOAD);
        assert!(
            whole.len() >= HEADER_SIZE + len,
            "half a payload among whole frames"
        );
        frames.push((frame_type, whole[HEADER_SIZE..HEADER_SIZE + len].to_vec()));
        whole = &whole[HEADER_SIZE + len..];
    }
}

fn decode_chunked(direction: Direction, stream: &[u8], flags: u8, seed: u8) -> Outcome {
    let mut splits = Splits(u32::from(seed).wrapping_mul(0x9e37_79b9) | 1);
    let mut decoder = if flags & 2 != 0 {
        Decoder::with_capacity(direction, usize::from(seed))
    } else {
        Decoder::new(direction)
    };
    let mut frames: Vec<(FrameType, Vec<u8>)> = Vec::new();
    let mut fed = 0;
    let mut returned = 0;
    while fed < stream.len() {
        let want = splits.chunk().min(stream.len() - fed);
        let chunk = &stream[fed..fed + want];
        if splits.next() % 2 == 0 {
            decoder.push(chunk);
            fed += want;
        } else {
            let space = decoder.unfilled_mut();
            assert!(!space.is_empty(), "unfilled_mut offered no room");
            let n = space.len().min(want);
            space[..n].copy_from_slice(&chunk[..n]);
            decoder.mark_filled(n);
            fed += n;
        }
        let drained = if splits.next() % 3 == 0 {
            match decoder.take_whole_frames() {
                Ok(whole) => {
                    let whole = whole.to_vec();
                    split_whole(&whole, &mut frames);
                    returned += whole.len();
                    Ok(())
                }
                Err(e) => Err(e),
            }
        } else {
            loop {
                match decoder.next_frame() {
                    Ok(Some(f)) => {
                        returned += HEADER_SIZE + f.payload.len();
                        frames.push((f.frame_type, f.payload.to_vec()));
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                }
            }
        };
        if let Err(e) = drained {
            assert_sticky(&mut decoder, e);
            return Outcome {
                frames,
                end: Err(e),
            };
        }
        assert_eq!(decoder.buffered(), fed - returned, "buffered() disagrees");
    }
    // Whole frames may be left before an error that `take_whole_frames` deferred.
    loop {
        match decoder.next_frame() {
            Ok(Some(f)) => frames.push((f.frame_type, f.payload.to_vec())),
            Ok(None) => break,
            Err(e) => {
                assert_sticky(&mut decoder, e);
                return Outcome {
                    frames,
                    end: Err(e),
                };
            }
        }
    }
    let end = decoder.finish();
    if let Err(e) = end {
        assert_sticky(&mut decoder, e);
    }
    Outcome { frames, end }
}

fuzz_target!(|data: &[u8]| {
    let [flags, seed, stream @ ..] = data else {
        return;
    };
    let direction = if flags & 1 == 0 {
        Direction::GuestToHost
    } else {
        Direction::HostToGuest
    };

    let reference = decode_whole(direction, stream);
    let chunked = decode_chunked(direction, stream, *flags, *seed);
    assert_eq!(reference, chunked, "the split changed the outcome");

    // The frames are exactly the bytes they came from, except the three reserved header bytes,
    // which readers ignore (and the encoder writes as zero).
    let consumed = reencode(&reference.frames);
    assert!(
        consumed.len() <= stream.len(),
        "frames longer than the input"
    );
    let mut at = 0;
    while at < consumed.len() {
        let len = u32::from_be_bytes([
            consumed[at + 4],
            consumed[at + 5],
            consumed[at + 6],
            consumed[at + 7],
        ]);
        let end = at + HEADER_SIZE + len as usize;
        assert_eq!(stream[at], consumed[at], "type byte differs");
        assert_eq!(
            stream[at + 4..end],
            consumed[at + 4..end],
            "frames do not re-encode to the input"
        );
        at = end;
    }
    for (i, (frame_type, payload)) in reference.frames.iter().enumerate() {
        assert!(payload.len() <= MAX_PAYLOAD);
        if direction == Direction::GuestToHost && *frame_type == FrameType::Exit {
            assert_eq!(
                i + 1,
                reference.frames.len(),
                "a frame followed the exit frame"
            );
        }
    }
    let rest = &stream[consumed.len()..];
    match reference.end {
        Ok(()) => {
            assert!(rest.is_empty(), "clean end with bytes left over");
            if direction == Direction::GuestToHost {
                assert_eq!(
                    reference.frames.last().map(|f| f.0),
                    Some(FrameType::Exit),
                    "a response stream ended cleanly without its exit frame"
                );
            }
        }
        Err(DecodeError::TruncatedHeader { got }) => {
            assert_eq!(got, rest.len());
            assert!(got > 0 && got < HEADER_SIZE);
        }
        Err(DecodeError::TruncatedPayload {
            frame_type,
            declared,
            got,
        }) => {
            assert_eq!(rest[0], frame_type.as_u8());
            assert_eq!(
                declared,
                u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize
            );
            assert_eq!(got, rest.len() - HEADER_SIZE);
            assert!(got < declared);
        }
        Err(DecodeError::Oversize { declared }) => {
            assert!(rest.len() >= HEADER_SIZE);
            assert_eq!(
                declared,
                u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]])
            );
            assert!(declared as usize > MAX_PAYLOAD);
        }
        Err(DecodeError::UnknownType { type_byte }) => {
            assert!(rest.len() >= HEADER_SIZE);
            assert_eq!(type_byte, rest[0]);
            assert!(FrameType::try_from(type_byte).is_err());
        }
        Err(DecodeError::MissingExit) => {
            assert_eq!(direction, Direction::GuestToHost);
            assert!(rest.is_empty());
            assert!(reference.frames.iter().all(|f| f.0 != FrameType::Exit));
        }
        Err(DecodeError::DataAfterExit) => {
            assert_eq!(direction, Direction::GuestToHost);
            assert!(!rest.is_empty());
            assert_eq!(reference.frames.last().map(|f| f.0), Some(FrameType::Exit));
        }
    }
});
