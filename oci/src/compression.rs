//! Layers and archives arrive compressed or not; the first bytes say which.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};

use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};

/// How a stream is compressed, from its magic number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar stream.
    #[default]
    None,
    /// gzip (`1f 8b`).
    Gzip,
    /// zstd (`28 b5 2f fd`).
    Zstd,
}

impl Compression {
    /// What `prefix` (the first bytes of a stream) says.
    pub fn sniff(prefix: &[u8]) -> Compression {
        if prefix.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if prefix.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }

    /// The compression of `file`, read from its start (and left there).
    pub fn of_file(file: &mut File) -> io::Result<Compression> {
        let mut prefix = [0u8; 4];
        file.seek(SeekFrom::Start(0))?;
        let mut filled = 0;
        while filled < prefix.len() {
            match file.read(&mut prefix[filled..])? {
                0 => break,
                n => filled += n,
            }
        }
        file.seek(SeekFrom::Start(0))?;
        Ok(Compression::sniff(&prefix[..filled]))
    }
}

const READ_BUFFER: usize = 256 * 1024;

/// `file` from its start, decompressed (gzip and zstd, each of one or more members or frames).
pub fn decompressed(mut file: File) -> io::Result<Box<dyn Read + Send>> {
    let buffered = |file| BufReader::with_capacity(READ_BUFFER, file);
    match Compression::of_file(&mut file)? {
        Compression::None => Ok(Box::new(buffered(file))),
        Compression::Gzip => Ok(Box::new(flate2::read::MultiGzDecoder::new(buffered(file)))),
        Compression::Zstd => Ok(Box::new(ZstdFrames::new(buffered(file)))),
    }
}

/// A zstd stream read to its end as `zstd -d` reads it: every frame in turn (`zstd -T0` and
/// concatenated files have several), skippable frames skipped. The decoder keeps its default
/// window limit, so a frame cannot make it allocate more than that.
struct ZstdFrames<R> {
    source: R,
    decoder: FrameDecoder,
    /// Whether a frame's header has been read and its blocks are being decoded.
    in_frame: bool,
}

impl<R: BufRead> ZstdFrames<R> {
    fn new(source: R) -> Self {
        ZstdFrames {
            source,
            decoder: FrameDecoder::new(),
            in_frame: false,
        }
    }

    /// Reads the next frame's header; `false` at the end of the stream.
    fn next_frame(&mut self) -> io::Result<bool> {
        loop {
            if self.source.fill_buf()?.is_empty() {
                return Ok(false);
            }
            match self.decoder.reset(&mut self.source) {
                Ok(()) => return Ok(true),
                Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                    length,
                    ..
                })) => {
                    let skipped = io::copy(
                        &mut (&mut self.source).take(u64::from(length)),
                        &mut io::sink(),
                    )?;
                    if skipped < u64::from(length) {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "zstd: the stream ends inside a skippable frame",
                        ));
                    }
                }
                Err(e) => return Err(zstd_error(e)),
            }
        }
    }
}

fn zstd_error(e: FrameDecoderError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("zstd: {e}"))
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame {
                if !self.next_frame()? {
                    return Ok(0);
                }
                self.in_frame = true;
            }
            while self.decoder.can_collect() == 0 && !self.decoder.is_finished() {
                self.decoder
                    .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1))
                    .map_err(zstd_error)?;
            }
            let n = self.decoder.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            // This frame is done and drained: on to the next one, if any.
            self.in_frame = false;
        }
    }
}

/// Reads at most `max` bytes of its inner reader and fails past them, so that a decompression
/// bomb stops at the limit instead of filling the disk; [`Bounded::exceeded`] tells that failure
/// apart from the others.
#[derive(Debug)]
pub struct Bounded<R> {
    inner: R,
    left: u64,
    max: u64,
    exceeded: bool,
}

impl<R: Read> Bounded<R> {
    /// `inner`, of which at most `max` bytes may be read.
    pub fn new(inner: R, max: u64) -> Self {
        Bounded {
            inner,
            left: max,
            max,
            exceeded: false,
        }
    }

    /// Whether the inner reader had more than `max` bytes.
    pub fn exceeded(&self) -> bool {
        self.exceeded
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut probe = [0u8; 1];
            if self.inner.read(&mut probe)? == 0 {
                return Ok(0);
            }
            self.exceeded = true;
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("decompressed, it is larger than {} bytes", self.max),
            ));
        }
        let cap = usize::try_from(self.left)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = self.inner.read(&mut buf[..cap])?;
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn magic_numbers_are_told_apart() {
        assert_eq!(Compression::sniff(&[0x1f, 0x8b, 8, 0]), Compression::Gzip);
        assert_eq!(
            Compression::sniff(&[0x28, 0xb5, 0x2f, 0xfd]),
            Compression::Zstd
        );
        assert_eq!(Compression::sniff(b"etc/"), Compression::None);
        assert_eq!(Compression::sniff(&[]), Compression::None);
    }

    fn read_back(bytes: &[u8]) -> io::Result<Vec<u8>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("blob");
        std::fs::write(&path, bytes).expect("write");
        let mut out = Vec::new();
        decompressed(File::open(&path).expect("open"))?.read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn a_gzip_file_reads_back_decompressed() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"hello layer").expect("write");
        let out = read_back(&gz.finish().expect("finish")).expect("decompress");
        assert_eq!(out, b"hello layer");
    }

    fn zstd(bytes: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(bytes, ruzstd::encoding::CompressionLevel::Fastest)
    }

    #[test]
    fn zstd_reads_back_across_frames_and_skippable_frames() {
        let first: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let mut stream = zstd(&first);
        // A skippable frame (magic 0x184D2A50, 4-byte length) between two frames.
        stream.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
        stream.extend_from_slice(&5u32.to_le_bytes());
        stream.extend_from_slice(b"skip!");
        stream.extend_from_slice(&zstd(b"second frame"));
        let out = read_back(&stream).expect("decompress");
        assert_eq!(out.len(), first.len() + 12);
        assert_eq!(&out[..first.len()], &first[..]);
        assert_eq!(&out[first.len()..], b"second frame");
    }

    #[test]
    fn corrupt_or_truncated_zstd_is_an_error_never_a_clean_end() {
        let good = zstd(&vec![7u8; 100_000]);
        let truncated = &good[..good.len() / 2];
        assert!(read_back(truncated).is_err());
        let mut garbage = good.clone();
        for byte in garbage.iter_mut().skip(8).step_by(3) {
            *byte ^= 0x5a;
        }
        assert!(read_back(&garbage).is_err());
    }

    #[test]
    fn bounded_stops_past_the_limit_and_says_so() {
        let mut exact = Bounded::new(&[1u8; 10][..], 10);
        let mut out = Vec::new();
        exact.read_to_end(&mut out).expect("at the limit");
        assert_eq!((out.len(), exact.exceeded()), (10, false));
        let mut over = Bounded::new(&[1u8; 11][..], 10);
        let err = over
            .read_to_end(&mut Vec::new())
            .expect_err("past the limit");
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert!(over.exceeded());
    }
}
