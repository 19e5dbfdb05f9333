//! One sans-IO HTTP/1 head parser for every place crucible reads an HTTP/1 head off a raw
//! socket: the daemon's front door (a request head, before hyper sees the connection), the
//! egress proxy (a sandbox's `GET http://host/...` or `CONNECT host:port`), and the client
//! (the daemon's response head, before a hijacked exec stream or an error body).
//!
//! Why one parser: three hand-written scanners had drifted apart. One found the end of a head
//! only at CRLFCRLF while the parser behind it accepted bare LF line ends, so such a request
//! hung until the header timeout (found by the `http_exec_request` fuzz target); one refused
//! Content-Length headers that disagree while the others took the first; each looked for
//! `chunked` as a substring. Where a proxy or a server delimits a message differently from the
//! next hop, requests can be smuggled: the rules for that live here once, with a test each.
//!
//! The crate does no I/O. A caller reads into a buffer and asks:
//! 1. [`head_end`] (or a [`HeadScanner`], which resumes where the last read stopped, so a head
//!    dribbled in a byte at a time costs linear time): where the head ends, if it has arrived;
//!    an error once [`Limits::max_head_bytes`] are read without an end. The bytes past the end
//!    are the body, or a hijacked stream's first bytes: they are the caller's.
//! 2. [`RequestHead::parse`] or [`ResponseHead::parse`] on exactly those head bytes: the start
//!    line, the header fields in order, and the framing rules checked (one Content-Length, no
//!    Content-Length beside Transfer-Encoding, chunked last, no obsolete line folding, no
//!    control characters, ...). Everything borrows from the buffer.
//!
//! Both steps are total functions of their input (no panics, no allocation beyond the parsed
//! fields), which is what a fuzz target needs.
//!
//! Line ends: [`head_end`] ends a head at the first empty line whether lines end in CRLF or a
//! bare LF (a head it never delimited would hang its reader); whether a bare LF is then
//! accepted is [`Limits::line_ends`], strict ([`LineEnds::CrlfOnly`]) by default.

#![forbid(unsafe_code)]

#[cfg(test)]
mod agreement;
mod chars;
mod end;
mod error;
mod headers;
mod request;
mod response;
mod syntax;
mod target;

pub use end::{head_end, HeadScanner};
pub use error::HeadError;
pub use headers::{Header, Headers, SINGLETON_HEADERS};
pub use request::RequestHead;
pub use response::ResponseHead;
pub use target::{Authority, RequestTarget};

/// What a head may be, beyond the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most bytes a head may have, through its empty line (and any empty lines before its
    /// start line). Pass the same number to [`head_end`] or [`HeadScanner::new`].
    pub max_head_bytes: usize,
    /// The most header fields (lines) a head may have.
    pub max_headers: usize,
    /// Which line ends are accepted.
    pub line_ends: LineEnds,
}

impl Default for Limits {
    /// 64 KiB, 64 header fields, CRLF line ends only: the daemon's own limits.
    fn default() -> Self {
        Limits {
            max_head_bytes: 64 * 1024,
            max_headers: 64,
            line_ends: LineEnds::CrlfOnly,
        }
    }
}

/// Which line ends a head may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LineEnds {
    /// CRLF only, as every sender must write them (RFC 9112 §2.2); a bare LF is an error.
    #[default]
    CrlfOnly,
    /// CRLF or a bare LF, as RFC 9112 §2.2 lets a recipient accept and as httparse and hyper
    /// do.
    CrlfOrBareLf,
}

/// The protocol version of a head: HTTP/1.0 or HTTP/1.1, the only ones this crate speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// `HTTP/1.0`.
    Http10,
    /// `HTTP/1.1`.
    Http11,
}

impl Version {
    /// The minor version: 0 or 1.
    pub fn minor(self) -> u8 {
        match self {
            Version::Http10 => 0,
            Version::Http11 => 1,
        }
    }

    /// The version as it is written on the wire (`HTTP/1.1`).
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
