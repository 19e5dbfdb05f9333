//! The guest agent's request parser: the first message of every connection, read with
//! `wire::read_message::<AgentRequest>` exactly as `guest_init::server::handle` does, from a
//! reader that hands the bytes over in fuzzer-chosen dribbles (and interrupts now and then).
//!
//! Input layout: `[split byte][connection bytes…]`. Checked:
//! - the error names what is wrong with the bytes: `Closed` only for an empty connection,
//!   `TooLarge` exactly when the length prefix exceeds `MAX_MESSAGE_SIZE`, an I/O error when
//!   the connection ends inside the prefix or the body;
//! - a parsed request re-encodes to a message that parses back to the same request;
//! - an exec request that passes `validate()` can actually be handed to `execve`: a program
//!   name, no NUL anywhere, no `=` in variable names, an absolute (or empty) working directory,
//!   a timeout within range and a total size within the limit.

#![no_main]

use std::ffi::CString;
use std::io::{self, Read};

use libfuzzer_sys::fuzz_target;
use wire::agent::AgentRequest;
use wire::{encode_message, read_message, ExecRequest, MessageError, MAX_MESSAGE_SIZE};

/// A connection that delivers its bytes a few at a time, as a socket may.
struct Dribble<'a> {
    bytes: &'a [u8],
    split: u8,
    calls: u32,
}

impl Read for Dribble<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.calls += 1;
        if self.split & 0x80 != 0 && self.calls % 7 == 3 {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let step = usize::from(self.split & 0x7f).max(1) + (self.calls as usize % 3);
        let n = step.min(buf.len()).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

fn assert_executable(request: &ExecRequest) {
    assert!(!request.cmd.is_empty() && !request.cmd[0].is_empty());
    assert!(request.cmd.len() <= wire::MAX_ARGS && request.env.len() <= wire::MAX_ENV);
    for arg in &request.cmd {
        assert!(
            CString::new(arg.as_bytes()).is_ok(),
            "NUL in a validated argument"
        );
    }
    for (name, value) in &request.env {
        assert!(!name.is_empty() && !name.contains('='));
        assert!(
            CString::new(format!("{name}={value}")).is_ok(),
            "NUL in a validated variable"
        );
    }
    assert!(request.cwd.is_empty() || request.cwd.starts_with('/'));
    assert!(
        CString::new(request.cwd.as_bytes()).is_ok(),
        "NUL in a validated cwd"
    );
    assert!((0..=wire::MAX_TIMEOUT_S).contains(&request.timeout_s));
    let total: usize = request.cmd.iter().map(String::len).sum::<usize>()
        + request
            .env
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
        + request.cwd.len();
    assert!(
        total <= wire::MAX_REQUEST_BYTES,
        "validated request of {total} bytes"
    );
}

fuzz_target!(|data: &[u8]| {
    let [split, connection @ ..] = data else {
        return;
    };
    let mut reader = Dribble {
        bytes: connection,
        split: *split,
        calls: 0,
    };
    let declared = connection
        .get(..4)
        .map(|p| u32::from_be_bytes([p[0], p[1], p[2], p[3]]) as usize);
    match read_message::<_, AgentRequest>(&mut reader) {
        Err(MessageError::Closed) => assert!(connection.is_empty()),
        Err(MessageError::TooLarge(n)) => {
            assert_eq!(Some(n), declared);
            assert!(n > MAX_MESSAGE_SIZE);
        }
        Err(MessageError::Io(e)) => {
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
            assert!(connection.len() < 4 + declared.unwrap_or(0));
        }
        Err(MessageError::Json(_)) => {
            let n = declared.expect("a body was read");
            assert!(n <= MAX_MESSAGE_SIZE && connection.len() >= 4 + n);
        }
        Ok(request) => {
            let n = declared.expect("a body was read");
            assert!(n <= MAX_MESSAGE_SIZE && connection.len() >= 4 + n);
            // The agent reads exactly one message: nothing past it was consumed.
            assert_eq!(reader.bytes.len(), connection.len() - 4 - n);
            let encoded = encode_message(&request).expect("a parsed request re-encodes");
            let back: AgentRequest =
                read_message(&mut &encoded[..]).expect("a re-encoded request parses");
            assert_eq!(back, request, "request did not round-trip");
            if let AgentRequest::Exec { request, .. } = &request {
                if request.validate().is_ok() {
                    assert_executable(request);
                }
            }
        }
    }
});
