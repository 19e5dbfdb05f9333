//! Layers and archives arrive compressed or not; the first bytes say which.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};

/// How a stream is compressed, from its magic number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar stream.
    None,
    /// gzip (`1f 8b`).
    Gzip,
    /// zstd (`28 b5 2f fd`): recognised so the refusal can say so.
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

/// `file` from its start, decompressed. zstd is refused with an error that says so.
pub fn decompressed(mut file: File) -> io::Result<Box<dyn Read + Send>> {
    match Compression::of_file(&mut file)? {
        Compression::None => Ok(Box::new(BufReader::with_capacity(256 * 1024, file))),
        Compression::Gzip => Ok(Box::new(flate2::read::MultiGzDecoder::new(
            BufReader::with_capacity(256 * 1024, file),
        ))),
        Compression::Zstd => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "zstd-compressed layers are not supported; export the image with gzip or \
             uncompressed layers (docker save does)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_gzip_file_reads_back_decompressed() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.gz");
        let mut gz = flate2::write::GzEncoder::new(
            File::create(&path).expect("create"),
            flate2::Compression::fast(),
        );
        gz.write_all(b"hello layer").expect("write");
        gz.finish().expect("finish");
        let mut out = String::new();
        decompressed(File::open(&path).expect("open"))
            .expect("decompress")
            .read_to_string(&mut out)
            .expect("read");
        assert_eq!(out, "hello layer");
    }
}
