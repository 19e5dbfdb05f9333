//! Blocking adapters: frames from a `std::io::Read`, frames to a `std::io::Write`.

use std::io::{self, IoSlice, Read, Write};

use crate::decoder::{DecodeError, Decoder, Direction, Frame};
use crate::encoder::{encode_exit_payload, encode_header};
use crate::frame::{FrameType, HEADER_SIZE, MAX_PAYLOAD};
use crate::types::ExecResult;

/// Size of the reader's buffer: two maximal frames.
pub const READ_BUFFER_SIZE: usize = 2 * (HEADER_SIZE + MAX_PAYLOAD);

/// Why reading frames failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The underlying stream failed.
    #[error("reading the frame stream failed")]
    Io(#[from] io::Error),
    /// The bytes were not a valid frame stream.
    #[error("invalid frame stream")]
    Decode(#[from] DecodeError),
}

/// Reads frames from a byte stream, reading straight into the decoder's buffer (one copy, no
/// per-frame allocation).
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    decoder: Decoder,
    eof: bool,
}

impl<R: Read> FrameReader<R> {
    /// Frames flowing in `direction` from `inner`.
    pub fn new(inner: R, direction: Direction) -> Self {
        FrameReader {
            inner,
            decoder: Decoder::with_capacity(direction, crate::io::READ_BUFFER_SIZE),
            eof: false,
        }
    }

    /// The next frame; `Ok(None)` at a clean end of stream (for a response stream: after the
    /// exit frame, then EOF). EOF anywhere else is an error.
    pub fn read_frame(&mut self) -> Result<Option<Frame<'_>>, ReadError> {
        loop {
            if self.decoder.has_frame()? {
                return Ok(self.decoder.next_frame()?);
            }
            if self.eof {
                self.decoder.finish()?;
                return Ok(None);
            }
            let n = match self.inner.read(self.decoder.unfilled_mut()) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                self.eof = true;
            }
            self.decoder.mark_filled(n);
        }
    }

    /// Whether the exit frame has been read.
    pub fn saw_exit(&self) -> bool {
        self.decoder.saw_exit()
    }

    /// The wrapped stream.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Unwraps the stream; bytes already buffered are lost.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// Writes frames to a byte stream: one vectored write per frame (header + payload), no copy.
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
}

impl<W: Write> FrameWriter<W> {
    /// Frames into `inner`.
    pub fn new(inner: W) -> Self {
        FrameWriter { inner }
    }

    /// Writes `data` as consecutive frames of `frame_type` of at most [`MAX_PAYLOAD`] bytes;
    /// empty `data` writes one empty frame.
    pub fn write_data(&mut self, frame_type: FrameType, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return self.inner.write_all(&encode_header(frame_type, 0));
        }
        for chunk in data.chunks(MAX_PAYLOAD) {
            let header = encode_header(frame_type, chunk.len());
            write_all_vectored(&mut self.inner, &header, chunk)?;
        }
        Ok(())
    }

    /// Writes the exit frame for `result` and flushes.
    pub fn write_exit(&mut self, result: &ExecResult) -> io::Result<()> {
        let payload = encode_exit_payload(result);
        self.write_data(FrameType::Exit, &payload)?;
        self.inner.flush()
    }

    /// Flushes the underlying stream.
    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    /// The wrapped stream.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// Unwraps the stream.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

fn write_all_vectored<W: Write>(w: &mut W, header: &[u8], payload: &[u8]) -> io::Result<()> {
    let mut slices = [IoSlice::new(header), IoSlice::new(payload)];
    let mut bufs: &mut [IoSlice<'_>] = &mut slices;
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out at most `step` bytes per call.
    struct Dribble<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn writer_output_reads_back_through_reader() {
        let mut w = FrameWriter::new(Vec::new());
        w.write_data(FrameType::Stdout, &vec![3u8; 150_000])
            .expect("write");
        w.write_data(FrameType::Stderr, b"oops").expect("write");
        w.write_exit(&ExecResult::default()).expect("write");
        let bytes = w.into_inner();
        for step in [1, 7, 4096, usize::MAX] {
            let mut r = FrameReader::new(Dribble { data: &bytes, step }, Direction::GuestToHost);
            let mut stdout = 0;
            let mut types = Vec::new();
            while let Some(f) = r.read_frame().expect("valid") {
                if f.frame_type == FrameType::Stdout {
                    stdout += f.payload.len();
                }
                types.push(f.frame_type);
            }
            assert_eq!(stdout, 150_000);
            assert_eq!(types.len(), 5);
            assert!(r.saw_exit());
        }
    }

    #[test]
    fn reader_reports_truncation_at_eof() {
        let mut w = FrameWriter::new(Vec::new());
        w.write_data(FrameType::Stdout, b"hello").expect("write");
        let mut bytes = w.into_inner();
        bytes.truncate(bytes.len() - 1);
        let mut r = FrameReader::new(&bytes[..], Direction::GuestToHost);
        match r.read_frame() {
            Err(ReadError::Decode(DecodeError::TruncatedPayload { got: 4, .. })) => {}
            other => panic!("expected truncation, got {other:?}"),
        }
    }
}
