//! crucible's wire protocol: the length-prefixed frame codec that carries exec output and
//! interactive input, the exec request and result that travel beside it, and the agent
//! protocol (what the guest compiles). The REST API's own types are `api-types`.
//!
//! Every frame is an 8-byte header — `[type:1][reserved:3][size:4 big-endian]` — followed by
//! `size` payload bytes, at most [`MAX_PAYLOAD`]. A response stream (guest to host) ends with
//! exactly one [`FrameType::Exit`] frame whose payload is an [`ExecResult`], then EOF.
//!
//! The crate has no required runtime: [`Decoder`] is a push-style incremental decoder that any
//! transport can feed, [`FrameReader`]/[`FrameWriter`] adapt `std::io`, and the `tokio` feature
//! adds [`AsyncFrameReader`]/[`AsyncFrameWriter`].

#![forbid(unsafe_code)]

pub mod agent;
mod decoder;
mod encoder;
mod frame;
mod io;
mod message;
mod signal;
mod stats;
mod types;

#[cfg(feature = "tokio")]
mod async_io;

pub use decoder::{DecodeError, Decoder, Direction, Frame};
pub use encoder::{encode_exit_payload, encode_frames, encode_header};
pub use frame::{FrameType, UnknownFrameType, HEADER_SIZE, MAX_PAYLOAD};
pub use io::{FrameReader, FrameWriter, ReadError, READ_BUFFER_SIZE};
pub use message::{encode_message, read_message, write_message, MessageError, MAX_MESSAGE_SIZE};
pub use signal::signal_number;
pub use stats::{CpuStats, DiskStats, MemoryStats, PidsStats, SandboxStats};
pub use types::{
    valid_exec_id, ErrorBody, ExecList, ExecRequest, ExecResult, ExecState, ExecStatus,
    FilesPutResult, OnDisconnect, RefusedEntry, Rlimit, TerminalSize, Usage, ValidationError,
    MAX_ARGS, MAX_ENV, MAX_EXEC_ID, MAX_REQUEST_BYTES, MAX_TIMEOUT_S, RLIMIT_RESOURCES,
};

#[cfg(feature = "tokio")]
pub use async_io::{read_message_async, write_message_async, AsyncFrameReader, AsyncFrameWriter};
