//! The frozen constants of the frame protocol. These values travel on the wire and non-Rust
//! clients hard-code them: never change them.

use std::fmt;

/// Size of every frame header: `[type:1][reserved:3][size:4 BE]`.
pub const HEADER_SIZE: usize = 8;

/// Largest payload a single frame may carry. Writers chunk larger writes into consecutive frames
/// of the same type; readers reject a header that declares more.
pub const MAX_PAYLOAD: usize = 65536;

/// The type byte of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameType {
    /// Command output on stdout (guest to host).
    Stdout = 1,
    /// Command output on stderr (guest to host).
    Stderr = 2,
    /// The terminal frame of a response stream; the payload is an `ExecResult` JSON document.
    Exit = 3,
    /// Interactive input for the command's stdin (host to guest).
    Stdin = 4,
    /// End of interactive input: the command's stdin is closed (host to guest, empty payload).
    StdinClose = 5,
    /// The client's terminal changed size (host to guest): the payload is a
    /// [`TerminalSize`](crate::TerminalSize) JSON document, `{"rows":R,"cols":C}`. Only a
    /// command started with `tty` has a terminal to resize; for any other it is ignored.
    Resize = 6,
}

impl FrameType {
    /// Every frame type, in wire-value order.
    pub const ALL: [FrameType; 6] = [
        FrameType::Stdout,
        FrameType::Stderr,
        FrameType::Exit,
        FrameType::Stdin,
        FrameType::StdinClose,
        FrameType::Resize,
    ];

    /// The snake_case name used by the fixtures manifest (`"stdin_close"`).
    pub fn name(self) -> &'static str {
        match self {
            FrameType::Stdout => "stdout",
            FrameType::Stderr => "stderr",
            FrameType::Exit => "exit",
            FrameType::Stdin => "stdin",
            FrameType::StdinClose => "stdin_close",
            FrameType::Resize => "resize",
        }
    }

    /// The value of the type byte.
    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

impl fmt::Display for FrameType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A type byte that names no frame type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown frame type {0}")]
pub struct UnknownFrameType(pub u8);

impl TryFrom<u8> for FrameType {
    type Error = UnknownFrameType;

    fn try_from(value: u8) -> Result<Self, Self::Error> {
        match value {
            1 => Ok(FrameType::Stdout),
            2 => Ok(FrameType::Stderr),
            3 => Ok(FrameType::Exit),
            4 => Ok(FrameType::Stdin),
            5 => Ok(FrameType::StdinClose),
            6 => Ok(FrameType::Resize),
            other => Err(UnknownFrameType(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_type_values_are_frozen() {
        let values: Vec<u8> = FrameType::ALL.iter().map(|t| t.as_u8()).collect();
        assert_eq!(values, [1, 2, 3, 4, 5, 6]);
        assert_eq!(HEADER_SIZE, 8);
        assert_eq!(MAX_PAYLOAD, 65536);
    }

    #[test]
    fn type_byte_round_trips_and_rejects_unknown_values() {
        for t in FrameType::ALL {
            assert_eq!(FrameType::try_from(t.as_u8()), Ok(t));
        }
        for bad in [0u8, 7, 0x7f, 0xff] {
            assert_eq!(FrameType::try_from(bad), Err(UnknownFrameType(bad)));
        }
    }
}
