//! Frame encoding: headers, chunking of large writes, and the exit frame's payload.

use crate::frame::{FrameType, HEADER_SIZE, MAX_PAYLOAD};
use crate::types::ExecResult;

/// The 8-byte header for a frame of `frame_type` carrying `len` payload bytes.
///
/// `len` must be at most [`MAX_PAYLOAD`]; callers chunk larger writes ([`encode_frames`] does).
pub fn encode_header(frame_type: FrameType, len: usize) -> [u8; HEADER_SIZE] {
    debug_assert!(
        len <= MAX_PAYLOAD,
        "frame payload of {len} bytes exceeds the maximum"
    );
    let size = (len.min(MAX_PAYLOAD) as u32).to_be_bytes();
    [
        frame_type.as_u8(),
        0,
        0,
        0,
        size[0],
        size[1],
        size[2],
        size[3],
    ]
}

/// Appends `data` to `out` as consecutive frames of `frame_type`, each at most [`MAX_PAYLOAD`]
/// bytes. Empty `data` still produces one empty frame (as `stdin_close` needs).
pub fn encode_frames(frame_type: FrameType, data: &[u8], out: &mut Vec<u8>) {
    if data.is_empty() {
        out.extend_from_slice(&encode_header(frame_type, 0));
        return;
    }
    out.reserve(data.len() + data.len().div_ceil(MAX_PAYLOAD) * HEADER_SIZE);
    for chunk in data.chunks(MAX_PAYLOAD) {
        out.extend_from_slice(&encode_header(frame_type, chunk.len()));
        out.extend_from_slice(chunk);
    }
}

/// Suffix put on an `error` string that had to be cut to fit the exit frame.
const TRUNCATION_MARK: &str = "… [truncated]";

/// The JSON payload of an exit frame. An `error` string too long for one frame is cut (on a
/// character boundary, marked as such) so that the result always fits: the exit frame is never
/// split and never dropped.
pub fn encode_exit_payload(result: &ExecResult) -> Vec<u8> {
    let payload = to_json(result);
    if payload.len() <= MAX_PAYLOAD {
        return payload;
    }
    let overflow = payload.len() - MAX_PAYLOAD;
    let mut cut = result.clone();
    // JSON escaping can make the encoded error longer than the string: cut generously.
    let mut keep = result
        .error
        .len()
        .saturating_sub(overflow + TRUNCATION_MARK.len() * 2);
    loop {
        while !result.error.is_char_boundary(keep) {
            keep -= 1;
        }
        cut.error = format!("{}{TRUNCATION_MARK}", &result.error[..keep]);
        let payload = to_json(&cut);
        if payload.len() <= MAX_PAYLOAD || keep == 0 {
            return payload;
        }
        keep /= 2;
    }
}

fn to_json(result: &ExecResult) -> Vec<u8> {
    // Serializing a struct of plain strings, integers and bools cannot fail.
    serde_json::to_vec(result).unwrap_or_else(|_| b"{\"exit_code\":-1}".to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_is_type_reserved_then_big_endian_size() {
        assert_eq!(
            encode_header(FrameType::Stderr, 0x0102),
            [2, 0, 0, 0, 0, 0, 1, 2]
        );
        assert_eq!(
            encode_header(FrameType::Stdout, MAX_PAYLOAD),
            [1, 0, 0, 0, 0, 1, 0, 0]
        );
    }

    #[test]
    fn large_writes_are_chunked_into_max_payload_frames() {
        let data = vec![b'x'; 200 * 1024];
        let mut out = Vec::new();
        encode_frames(FrameType::Stdout, &data, &mut out);
        assert_eq!(out.len(), data.len() + 4 * HEADER_SIZE);
        let sizes: Vec<usize> = [0, 65544, 131088, 196632]
            .iter()
            .map(|&at| {
                u32::from_be_bytes([out[at + 4], out[at + 5], out[at + 6], out[at + 7]]) as usize
            })
            .collect();
        assert_eq!(sizes, [65536, 65536, 65536, 8192]);
    }

    #[test]
    fn empty_write_is_one_empty_frame() {
        let mut out = Vec::new();
        encode_frames(FrameType::StdinClose, &[], &mut out);
        assert_eq!(out, [5, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn huge_error_is_cut_to_fit_one_frame() {
        let result = ExecResult::failed("é\"".repeat(100_000));
        let payload = encode_exit_payload(&result);
        assert!(payload.len() <= MAX_PAYLOAD, "{} bytes", payload.len());
        let back: ExecResult = serde_json::from_slice(&payload).expect("valid JSON");
        assert!(back.error.ends_with(TRUNCATION_MARK));
        assert_eq!(back.exit_code, -1);
    }
}
