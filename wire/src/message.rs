//! Length-prefixed JSON messages: the small control messages of the host↔agent protocol
//! (`[length:4 BE][JSON]`), as opposed to the frame stream that carries command output.

use std::io::{self, Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest control message accepted: far below a memory problem, and above the largest valid
/// exec request, whose 1 MiB of strings (`MAX_REQUEST_BYTES`) can take 6 MiB as JSON when every
/// character is a control character escaped as `\u00XX`.
pub const MAX_MESSAGE_SIZE: usize = 8 * 1024 * 1024;

/// Why a control message could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    /// The stream ended before a message began.
    #[error("the peer closed the connection before sending a message")]
    Closed,
    /// The stream failed or ended inside a message.
    #[error("reading or writing a control message failed")]
    Io(#[from] io::Error),
    /// The length prefix exceeds [`MAX_MESSAGE_SIZE`].
    #[error("control message of {0} bytes exceeds the {MAX_MESSAGE_SIZE}-byte limit")]
    TooLarge(usize),
    /// The message was not the JSON expected.
    #[error("control message is not valid JSON for this request")]
    Json(#[from] serde_json::Error),
}

/// Encodes `value` as one length-prefixed message.
pub fn encode_message<T: Serialize>(value: &T) -> Result<Vec<u8>, MessageError> {
    let json = serde_json::to_vec(value)?;
    if json.len() > MAX_MESSAGE_SIZE {
        return Err(MessageError::TooLarge(json.len()));
    }
    let mut out = Vec::with_capacity(4 + json.len());
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// Parses the length prefix; errors when over the limit.
pub(crate) fn message_len(prefix: [u8; 4]) -> Result<usize, MessageError> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > MAX_MESSAGE_SIZE {
        return Err(MessageError::TooLarge(len));
    }
    Ok(len)
}

/// Writes one message and flushes.
pub fn write_message<W: Write, T: Serialize>(w: &mut W, value: &T) -> Result<(), MessageError> {
    w.write_all(&encode_message(value)?)?;
    w.flush()?;
    Ok(())
}

/// Reads one message. EOF before its first byte is [`MessageError::Closed`].
pub fn read_message<R: Read, T: DeserializeOwned>(r: &mut R) -> Result<T, MessageError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut prefix[got..]) {
            Ok(0) if got == 0 => return Err(MessageError::Closed),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = message_len(prefix)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(serde_json::from_slice(&body)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ExecRequest;

    #[test]
    fn message_round_trips() {
        let mut buf = Vec::new();
        write_message(&mut buf, &ExecRequest::new(["ls", "-l"])).expect("write");
        let back: ExecRequest = read_message(&mut &buf[..]).expect("read");
        assert_eq!(back, ExecRequest::new(["ls", "-l"]));
    }

    #[test]
    fn empty_stream_is_closed_and_cut_message_is_io_error() {
        let r: Result<ExecRequest, _> = read_message(&mut &[][..]);
        assert!(matches!(r, Err(MessageError::Closed)));
        let r: Result<ExecRequest, _> = read_message(&mut &[0u8, 0, 0, 9, b'{'][..]);
        assert!(matches!(r, Err(MessageError::Io(_))));
    }

    #[test]
    fn every_valid_exec_request_fits_one_agent_message() {
        use crate::agent::AgentRequest;
        use crate::types::MAX_REQUEST_BYTES;
        // The worst case for JSON: every character a control character, escaped as `\u00XX`.
        // Such a request passes the daemon's checks (the WebSocket first message may be 8 MiB)
        // but was refused when sent to the agent at the old 4 MiB limit; found while writing
        // the http_exec_request fuzz target's invariant.
        let arg = "\u{1}".repeat(MAX_REQUEST_BYTES - 16);
        let request = ExecRequest::new(["x".to_string(), arg]);
        request.validate().expect("within the request limits");
        let message = encode_message(&AgentRequest::Exec {
            tail_bytes: None,
            request,
            interactive: false,
            user: None,
        })
        .expect("a validated request must reach the agent");
        assert!(message.len() > 6 * (MAX_REQUEST_BYTES - 16));
    }

    #[test]
    fn oversized_prefix_is_refused_without_allocating() {
        let r: Result<ExecRequest, _> = read_message(&mut &[0xffu8, 0xff, 0xff, 0xff][..]);
        assert!(matches!(r, Err(MessageError::TooLarge(_))));
    }
}
