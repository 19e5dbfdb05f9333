//! `sha256:<hex>` digests: the only algorithm accepted (the one every registry and Docker use).

use std::fmt;
use std::io::{self, Read, Write};

use sha2::{Digest as _, Sha256};

/// A sha256 digest, as 64 lower-case hex digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

/// Why a digest string was refused.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a sha256 digest (sha256:<64 hex digits>)")]
pub struct BadDigest(pub String);

impl Digest {
    /// Parses `sha256:<64 lower-case hex digits>`.
    pub fn parse(text: &str) -> Result<Self, BadDigest> {
        let hex = text
            .strip_prefix("sha256:")
            .ok_or_else(|| BadDigest(text.to_string()))?;
        Self::from_hex(hex).ok_or_else(|| BadDigest(text.to_string()))
    }

    /// From 64 lower-case hex digits.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let ok = hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| Digest(hex.to_string()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(hex::encode(Sha256::digest(bytes)))
    }

    /// The hex digits alone (a file name in the store).
    pub fn hex(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.0)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Digest::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Copies `from` into `to`, returning the digest and length of what was copied.
pub fn copy_hashing(from: &mut impl Read, to: &mut impl Write) -> io::Result<(Digest, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
    Ok((Digest(hex::encode(hasher.finalize())), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sha256_hex_digests_parse() {
        let d = Digest::of(b"");
        assert_eq!(
            d.to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::parse(&d.to_string()).expect("parse"), d);
        for bad in [
            "sha512:00",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:../../etc/passwd",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn copying_hashes_what_passes() {
        let mut out = Vec::new();
        let (d, n) = copy_hashing(&mut &b"abc"[..], &mut out).expect("copy");
        assert_eq!((d, n, out.as_slice()), (Digest::of(b"abc"), 3, &b"abc"[..]));
    }
}
