//! The spec's SDK conformance suite, run against our own codec: no daemon, no KVM, just
//! `fixtures/manifest.json` and the recorded `.bin` streams.

use std::fs;
use std::path::PathBuf;

use serde_json::Value;
use sha2::{Digest, Sha256};
use wire::{encode_frames, Decoder, Direction, ExecResult, FrameType, HEADER_SIZE, MAX_PAYLOAD};

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn manifest() -> Value {
    let path = fixtures_dir().join("manifest.json");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("manifest.json is JSON")
}

fn fixtures() -> Vec<Value> {
    manifest()["fixtures"]
        .as_array()
        .expect("fixtures is an array")
        .clone()
}

fn read_bin(fixture: &Value) -> Vec<u8> {
    let name = fixture["file"].as_str().expect("file name");
    let path = fixtures_dir().join(name);
    fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn direction(fixture: &Value) -> Direction {
    match fixture["direction"].as_str() {
        Some("guest_to_host") => Direction::GuestToHost,
        Some("host_to_guest") => Direction::HostToGuest,
        other => panic!("bad direction {other:?}"),
    }
}

/// Step 1: the manifest's header constants are the codec's.
#[test]
fn manifest_constants_match_the_codec() {
    let m = manifest();
    assert_eq!(m["version"], 1);
    assert_eq!(m["header_size"], HEADER_SIZE);
    assert_eq!(m["max_payload_size"], MAX_PAYLOAD);
    for t in FrameType::ALL {
        assert_eq!(m["frame_types"][t.name()], t.as_u8(), "frame type {t}");
    }
    assert_eq!(m["frame_types"].as_object().map(|o| o.len()), Some(6));
}

/// Step 2: every valid fixture decodes to exactly the listed frames, then a clean EOF — fed
/// whole and one byte at a time, since transports split streams anywhere.
#[test]
fn valid_fixtures_decode_to_the_manifest_frames() {
    let mut checked = 0;
    for fixture in fixtures().iter().filter(|f| f["invalid"] == false) {
        let name = fixture["file"].as_str().expect("file");
        let expected = fixture["frames"].as_array().expect("frames");
        let bytes = read_bin(fixture);
        for split in [bytes.len().max(1), 1, 4093] {
            let mut decoder = Decoder::new(direction(fixture));
            let mut got = Vec::new();
            for piece in bytes.chunks(split) {
                decoder.push(piece);
                while let Some(frame) = decoder
                    .next_frame()
                    .unwrap_or_else(|e| panic!("{name}: {e}"))
                {
                    got.push((frame.frame_type, frame.payload.to_vec()));
                }
            }
            decoder
                .finish()
                .unwrap_or_else(|e| panic!("{name}: no clean EOF: {e}"));
            assert_eq!(got.len(), expected.len(), "{name}: frame count");
            for (i, ((frame_type, payload), want)) in got.iter().zip(expected).enumerate() {
                assert_eq!(want["type"], frame_type.as_u8(), "{name} frame {i} type");
                assert_eq!(
                    want["type_name"],
                    frame_type.name(),
                    "{name} frame {i} name"
                );
                assert_eq!(want["length"], payload.len(), "{name} frame {i} length");
                assert_eq!(
                    want["sha256"].as_str(),
                    Some(hex::encode(Sha256::digest(payload)).as_str()),
                    "{name} frame {i} sha256"
                );
                if let Some(text) = want.get("text") {
                    assert_eq!(text.as_str().map(str::as_bytes), Some(&payload[..]));
                }
                if *frame_type == FrameType::Exit {
                    let parsed: ExecResult =
                        serde_json::from_slice(payload).expect("exit payload is an ExecResult");
                    let listed: ExecResult =
                        serde_json::from_value(want["exec_result"].clone()).expect("listed");
                    assert_eq!(parsed, listed, "{name} exec_result");
                }
            }
        }
        checked += 1;
    }
    assert!(checked >= 13, "only {checked} valid fixtures");
}

/// Step 3: every invalid fixture fails with its named error, never a clean EOF.
#[test]
fn invalid_fixtures_fail_with_their_named_error() {
    let mut kinds = Vec::new();
    for fixture in fixtures().iter().filter(|f| f["invalid"] == true) {
        let name = fixture["file"].as_str().expect("file");
        let want = fixture["error"].as_str().expect("error kind");
        let mut decoder = Decoder::new(direction(fixture));
        decoder.push(&read_bin(fixture));
        let mut result = Ok(());
        loop {
            match decoder.next_frame() {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let result = result.and_then(|()| decoder.finish());
        let err = result.expect_err(name);
        assert_eq!(err.kind(), want, "{name}");
        kinds.push(want.to_string());
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "data_after_exit",
            "missing_exit",
            "oversize",
            "truncated_header",
            "truncated_payload",
            "unknown_type"
        ]
    );
}

/// Step 4: encoding the stdin session's listed frames reproduces the fixture byte for byte.
#[test]
fn encoding_the_stdin_session_is_byte_identical() {
    let all = fixtures();
    let fixture = all
        .iter()
        .find(|f| f["file"] == "stdin_session.bin")
        .expect("stdin_session.bin listed");
    assert_eq!(fixture["direction"], "host_to_guest");
    let mut encoded = Vec::new();
    for frame in fixture["frames"].as_array().expect("frames") {
        let type_byte = frame["type"].as_u64().expect("type") as u8;
        let frame_type = FrameType::try_from(type_byte).expect("known type");
        let text = frame["text"].as_str().unwrap_or("");
        encode_frames(frame_type, text.as_bytes(), &mut encoded);
    }
    assert_eq!(encoded, read_bin(fixture));
}
