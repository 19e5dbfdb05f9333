//! crucible's wire protocol: the length-prefixed frame codec that carries exec output and
//! interactive input, and the JSON types that travel beside it.
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
mod image;
mod io;
mod message;
mod sandbox;
mod signal;
mod types;

#[cfg(feature = "tokio")]
mod async_io;

pub use decoder::{DecodeError, Decoder, Direction, Frame};
pub use encoder::{encode_exit_payload, encode_frames, encode_header};
pub use frame::{FrameType, UnknownFrameType, HEADER_SIZE, MAX_PAYLOAD};
pub use image::{ImageInfo, ImageList, ImageUser, ImagesPruned};
pub use io::{FrameReader, FrameWriter, ReadError, READ_BUFFER_SIZE};
pub use message::{encode_message, read_message, write_message, MessageError, MAX_MESSAGE_SIZE};
pub use sandbox::{
    BackendKind, CacheInfo, CacheList, CacheMount, CpuStats, CreateSandbox, Hypervisor,
    MemoryStats, NetworkInfo, NetworkRequest, PidsStats, SandboxInfo, SandboxList, SandboxState,
    SandboxStats, SandboxTimings, SignalRequest, VolumeMount,
};
pub use signal::signal_number;
pub use types::{
    valid_exec_id, ErrorBody, ExecRequest, ExecResult, FilesPutResult, RefusedEntry, Rlimit, Usage,
    ValidationError, MAX_ARGS, MAX_ENV, MAX_EXEC_ID, MAX_REQUEST_BYTES, MAX_TIMEOUT_S,
    RLIMIT_RESOURCES,
};

#[cfg(feature = "tokio")]
pub use async_io::{read_message_async, write_message_async, AsyncFrameReader, AsyncFrameWriter};
