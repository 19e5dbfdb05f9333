//! The outer archive (an OCI archive or a `docker save` tarball), indexed once so that its
//! members can be read in any order: manifests name the layers, and the layers may come first.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Most members an image archive may hold: even images of hundreds of layers have a few
/// files per layer.
pub const MAX_MEMBERS: usize = 100_000;
/// Most symlinks followed to reach one member (`docker save` links repeated layers).
const MAX_LINK_HOPS: usize = 8;

/// Why the archive could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// Reading the spooled archive failed.
    #[error("reading the archive")]
    Io(#[from] io::Error),
    /// Too many members.
    #[error("the archive has more than {MAX_MEMBERS} members")]
    TooManyMembers,
    /// A member the manifest names is missing.
    #[error("the archive has no member {0:?}")]
    Missing(String),
    /// A symlink member leads outside the archive, in a loop or nowhere.
    #[error("the archive member {0:?} is a symlink that does not lead to a file in the archive")]
    BadLink(String),
    /// A member is stored in a way that cannot be read in place (GNU sparse).
    #[error("the archive member {0:?} is a sparse file, which image archives never hold")]
    Sparse(String),
}

/// Where a member's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    offset: u64,
    size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Member {
    File(Span),
    Link(String),
}

/// The archive's regular files and symlinks, by normalised path (no leading `./` or `/`).
#[derive(Debug)]
pub struct ArchiveIndex {
    path: PathBuf,
    members: BTreeMap<String, Member>,
}

/// `name` without leading `./` and `/` and trailing `/`.
pub fn normalise(name: &str) -> String {
    let mut name = name;
    loop {
        if let Some(rest) = name.strip_prefix("./") {
            name = rest;
        } else if let Some(rest) = name.strip_prefix('/') {
            name = rest;
        } else {
            break;
        }
    }
    name.trim_end_matches('/').to_string()
}

impl ArchiveIndex {
    /// Indexes the tar file at `path`.
    pub fn read(path: &Path) -> Result<Self, ArchiveError> {
        let file = File::open(path)?;
        let mut archive = tar::Archive::new(io::BufReader::with_capacity(256 * 1024, file));
        let mut members = BTreeMap::new();
        for entry in archive.entries()? {
            let entry = entry?;
            if members.len() >= MAX_MEMBERS {
                return Err(ArchiveError::TooManyMembers);
            }
            let name = normalise(&String::from_utf8_lossy(&entry.path_bytes()));
            let kind = entry.header().entry_type();
            if kind.is_gnu_sparse() {
                return Err(ArchiveError::Sparse(name));
            }
            if kind.is_file() || kind == tar::EntryType::Continuous {
                let span = Span {
                    offset: entry.raw_file_position(),
                    size: entry.size(),
                };
                members.insert(name, Member::File(span));
            } else if kind.is_symlink() || kind.is_hard_link() {
                let target = entry
                    .link_name_bytes()
                    .map(|t| String::from_utf8_lossy(&t).into_owned())
                    .unwrap_or_default();
                let target = if kind.is_symlink() {
                    resolve_relative(&name, &target)
                } else {
                    Some(normalise(&target))
                };
                members.insert(name, Member::Link(target.unwrap_or_default()));
            }
        }
        Ok(ArchiveIndex {
            path: path.to_path_buf(),
            members,
        })
    }

    /// Whether a member (file or link) is there.
    pub fn contains(&self, name: &str) -> bool {
        self.members.contains_key(&normalise(name))
    }

    fn span(&self, name: &str) -> Result<Span, ArchiveError> {
        let mut current = normalise(name);
        for _ in 0..=MAX_LINK_HOPS {
            match self.members.get(&current) {
                Some(Member::File(span)) => return Ok(*span),
                Some(Member::Link(target)) if !target.is_empty() => current = target.clone(),
                Some(Member::Link(_)) => return Err(ArchiveError::BadLink(name.to_string())),
                None if current == normalise(name) => {
                    return Err(ArchiveError::Missing(name.to_string()))
                }
                None => return Err(ArchiveError::BadLink(name.to_string())),
            }
        }
        Err(ArchiveError::BadLink(name.to_string()))
    }

    /// The size of member `name`.
    pub fn size(&self, name: &str) -> Result<u64, ArchiveError> {
        Ok(self.span(name)?.size)
    }

    /// A reader of member `name`'s bytes (symlinks followed within the archive).
    pub fn open(&self, name: &str) -> Result<io::Take<File>, ArchiveError> {
        let span = self.span(name)?;
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(span.offset))?;
        Ok(file.take(span.size))
    }

    /// Member `name`, read whole, refusing more than `max` bytes.
    pub fn read_small(&self, name: &str, max: u64) -> Result<Vec<u8>, ArchiveError> {
        let span = self.span(name)?;
        if span.size > max {
            return Err(ArchiveError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{name:?} is {} bytes, more than the {max} allowed",
                    span.size
                ),
            )));
        }
        let mut bytes = Vec::with_capacity(span.size as usize);
        self.open(name)?.read_to_end(&mut bytes)?;
        Ok(bytes)
    }
}

/// A symlink at `link` with `target`, as an archive path; `None` if it leaves the archive.
fn resolve_relative(link: &str, target: &str) -> Option<String> {
    if target.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = link.split('/').collect();
    parts.pop();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member: its name, and its bytes or its symlink target.
    type Member<'a> = (&'a str, Option<&'a [u8]>, Option<&'a str>);

    fn archive(entries: &[Member<'_>]) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().expect("temp");
        let mut builder = tar::Builder::new(file.reopen().expect("reopen"));
        for (name, data, link) in entries {
            let mut header = tar::Header::new_gnu();
            match (data, link) {
                (Some(data), _) => {
                    header.set_size(data.len() as u64);
                    header.set_mode(0o644);
                    builder
                        .append_data(&mut header, name, *data)
                        .expect("append");
                }
                (None, Some(target)) => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_size(0);
                    builder
                        .append_link(&mut header, name, target)
                        .expect("link");
                }
                _ => unreachable!(),
            }
        }
        builder.finish().expect("finish");
        file
    }

    #[test]
    fn members_are_read_in_any_order_and_links_followed() {
        let file = archive(&[
            ("./a/layer.tar", Some(b"layer-a"), None),
            ("b/layer.tar", None, Some("../a/layer.tar")),
            ("manifest.json", Some(b"[]"), None),
        ]);
        let index = ArchiveIndex::read(file.path()).expect("index");
        assert_eq!(index.read_small("manifest.json", 10).expect("m"), b"[]");
        assert_eq!(index.read_small("b/layer.tar", 100).expect("b"), b"layer-a");
        assert_eq!(index.size("a/layer.tar").expect("size"), 7);
        assert!(matches!(
            index.read_small("manifest.json", 1),
            Err(ArchiveError::Io(_))
        ));
        assert!(matches!(index.open("nope"), Err(ArchiveError::Missing(_))));
    }

    #[test]
    fn links_leaving_the_archive_or_looping_are_refused() {
        let file = archive(&[
            ("out/layer.tar", None, Some("../../etc/passwd")),
            ("abs/layer.tar", None, Some("/etc/passwd")),
            ("x", None, Some("y")),
            ("y", None, Some("x")),
        ]);
        let index = ArchiveIndex::read(file.path()).expect("index");
        for name in ["out/layer.tar", "abs/layer.tar", "x"] {
            assert!(
                matches!(index.open(name), Err(ArchiveError::BadLink(_))),
                "{name}"
            );
        }
    }

    #[test]
    fn names_are_normalised() {
        assert_eq!(normalise("./blobs/sha256/ab"), "blobs/sha256/ab");
        assert_eq!(normalise("/index.json"), "index.json");
        assert_eq!(normalise("dir/"), "dir");
    }
}
