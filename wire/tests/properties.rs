//! Property tests: arbitrary frame sequences survive encode → split anywhere → decode, and the
//! decoder never panics on arbitrary bytes.

use proptest::prelude::*;
use wire::{encode_frames, Decoder, Direction, FrameType, MAX_PAYLOAD};

fn data_type() -> impl Strategy<Value = FrameType> {
    prop_oneof![
        Just(FrameType::Stdout),
        Just(FrameType::Stderr),
        Just(FrameType::Stdin)
    ]
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => proptest::collection::vec(any::<u8>(), 0..300),
        1 => proptest::collection::vec(any::<u8>(), MAX_PAYLOAD - 2..MAX_PAYLOAD + 3),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn round_trip_survives_any_split(
        frames in proptest::collection::vec((data_type(), payload()), 0..12),
        exit in proptest::collection::vec(any::<u8>(), 0..200),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..20),
    ) {
        let mut bytes = Vec::new();
        for (t, p) in &frames {
            encode_frames(*t, p, &mut bytes);
        }
        encode_frames(FrameType::Exit, &exit, &mut bytes);

        let mut positions: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        positions.push(0);
        positions.push(bytes.len());
        positions.sort_unstable();

        let mut decoder = Decoder::new(Direction::GuestToHost);
        let mut streams: Vec<(FrameType, Vec<u8>)> = Vec::new();
        for w in positions.windows(2) {
            decoder.push(&bytes[w[0]..w[1]]);
            while let Some(f) = decoder.next_frame().expect("valid stream") {
                // Consecutive frames of one type are one stream: join them.
                match streams.last_mut() {
                    Some((t, data)) if *t == f.frame_type && f.frame_type != FrameType::Exit => {
                        data.extend_from_slice(f.payload)
                    }
                    _ => streams.push((f.frame_type, f.payload.to_vec())),
                }
            }
        }
        decoder.finish().expect("clean end");

        let mut expected: Vec<(FrameType, Vec<u8>)> = Vec::new();
        for (t, p) in frames {
            match expected.last_mut() {
                Some((last, data)) if *last == t => data.extend_from_slice(&p),
                _ => expected.push((t, p)),
            }
        }
        expected.push((FrameType::Exit, exit));
        prop_assert_eq!(streams, expected);
    }

    #[test]
    fn decoder_never_panics_on_random_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        step in 1usize..64,
        response in any::<bool>(),
    ) {
        let direction = if response { Direction::GuestToHost } else { Direction::HostToGuest };
        let mut decoder = Decoder::new(direction);
        let mut failed = false;
        for piece in bytes.chunks(step) {
            decoder.push(piece);
            loop {
                match decoder.next_frame() {
                    Ok(Some(f)) => prop_assert!(f.payload.len() <= MAX_PAYLOAD),
                    Ok(None) => break,
                    Err(_) => { failed = true; break; }
                }
            }
        }
        let finished = decoder.finish();
        // An error is sticky: once the stream failed it can never end cleanly.
        if failed {
            prop_assert!(finished.is_err());
        }
    }
}
