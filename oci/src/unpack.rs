//! Applying one image layer (an uncompressed tar stream) onto a root directory, safely.
//!
//! The layer comes from an untrusted upload and the daemon writing it is host root, so the
//! rules are the OCI image-spec changeset rules, applied without ever leaving the root:
//!
//! - **Two passes.** The first applies only deletions: `DIR/.wh.NAME` removes `DIR/NAME` (a
//!   whole tree if it is a directory) and `DIR/.wh..wh..opq` empties `DIR`, both against what
//!   the lower layers left. The second creates every other member. So an opaque marker hides
//!   the lower layers' children of `DIR` but never this layer's, wherever it sits in the tar.
//! - **Paths stay inside.** A member path loses its leading `/` and `./`; a `..` component, a
//!   NUL or more than 4096 bytes refuses the whole layer. Parent directories are resolved by
//!   the kernel with `RESOLVE_IN_ROOT`, so a symlink planted by an earlier member (`etc ->
//!   /etc`, `etc -> ../../../etc`) is followed as if the root were `/`; the final component is
//!   only ever handled by calls that do not follow it. Hard-link targets resolve the same way.
//! - **What is created.** Regular files, directories, symlinks (their target stored verbatim:
//!   it is only ever interpreted inside the sandbox), hard links and FIFOs, owned by the tar's
//!   numeric uid/gid with its permission bits (setuid/setgid/sticky included) and, for all but
//!   directories, its mtime. Hard links take the metadata of the inode they point at. Character
//!   and block devices, sockets and unknown types are not created, only counted. Extended
//!   attributes (PAX `SCHILY.xattr.*`) are ignored: no file capabilities, no ACLs, no SELinux
//!   labels come from an image.
//! - **Bounded.** [`Limits`] cap the file bytes and entries one image may write over all its
//!   layers ([`Budget`]); file content is counted while it is copied, so a tar bomb stops at
//!   the limit. A layer's member count, its declared content size and the tar metadata (long
//!   names, PAX records) before each member are bounded too, so no stream makes the reader
//!   buffer or spin without end.

mod create;
mod entry_path;
mod fs_ops;
mod members;
#[cfg(test)]
mod tests;

use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, FileType, OFlags};
use rustix::io::Errno;

use entry_path::Target;
use members::{for_each_member, kind_of, Kind, Member};

/// Bounds on what unpacking one image may write, across all its layers.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_bytes: u64,
    pub max_entries: u64,
}

/// What is left of the limits while an image's layers are applied in turn.
#[derive(Debug)]
pub struct Budget {
    limits: Limits,
    bytes_used: u64,
    entries_used: u64,
}

impl Budget {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            bytes_used: 0,
            entries_used: 0,
        }
    }

    /// File content bytes written so far (regular files' sizes).
    pub fn bytes_used(&self) -> u64 {
        self.bytes_used
    }

    pub fn entries_used(&self) -> u64 {
        self.entries_used
    }

    fn bytes_left(&self) -> u64 {
        self.limits.max_bytes.saturating_sub(self.bytes_used)
    }

    fn entries_left(&self) -> u64 {
        self.limits.max_entries.saturating_sub(self.entries_used)
    }

    fn exceeded(&self, limit: Limit, entry: &[u8]) -> UnpackError {
        let max = match limit {
            Limit::Bytes => self.limits.max_bytes,
            Limit::Entries => self.limits.max_entries,
        };
        UnpackError::LimitExceeded {
            limit,
            max,
            entry: shown(entry),
        }
    }

    /// Takes one entry for `entry`, before it is created.
    fn take_entry(&mut self, entry: &[u8]) -> Result<(), UnpackError> {
        if self.entries_left() == 0 {
            return Err(self.exceeded(Limit::Entries, entry));
        }
        self.entries_used += 1;
        Ok(())
    }

    /// Takes `bytes` of file content for `entry`, before they are written.
    fn take_bytes(&mut self, bytes: u64, entry: &[u8]) -> Result<(), UnpackError> {
        if bytes > self.bytes_left() {
            return Err(self.exceeded(Limit::Bytes, entry));
        }
        self.bytes_used += bytes;
        Ok(())
    }
}

/// Which of the [`Limits`] an image went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Bytes,
    Entries,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limit::Bytes => "max_bytes",
            Limit::Entries => "max_entries",
        })
    }
}

/// What applying one layer did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LayerStats {
    /// Entries written (files, directories, symlinks, hard links, FIFOs, missing parents).
    pub entries: u64,
    /// Regular-file content bytes written.
    pub bytes: u64,
    /// `.wh.NAME` entries applied.
    pub whiteouts: u64,
    /// `.wh..wh..opq` entries applied.
    pub opaque_dirs: u64,
    /// Character and block device nodes not created.
    pub dropped_devices: u64,
    /// Other members not created (sockets, unknown types).
    pub dropped_other: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("opening the root directory {}", root.display())]
    OpenRoot {
        root: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("opening the layer's tar stream for pass {pass}")]
    OpenLayer {
        pass: u8,
        #[source]
        source: io::Error,
    },
    #[error("reading the layer's tar stream near byte {offset} (after member {after})")]
    Tar {
        offset: u64,
        after: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "the tar metadata (long names, PAX records) before the member near byte {offset} is \
         larger than {max} bytes"
    )]
    MetadataTooLarge { offset: u64, max: u64 },
    #[error("member {entry}: its {field} field is malformed or out of range")]
    BadHeader {
        entry: String,
        field: &'static str,
        source: Option<io::Error>,
    },
    #[error("member {entry}: {reason}")]
    BadPath { entry: String, reason: &'static str },
    #[error("member {entry}: link target {target}: {reason}")]
    BadLinkTarget {
        entry: String,
        target: String,
        reason: &'static str,
    },
    #[error("member {entry}: the content ends after {written} of its {declared} bytes")]
    Truncated {
        entry: String,
        written: u64,
        declared: u64,
    },
    #[error("the image exceeds its {limit} limit of {max} (at member {entry})")]
    LimitExceeded {
        limit: Limit,
        max: u64,
        entry: String,
    },
    #[error("member {entry}: {operation}")]
    Io {
        entry: String,
        operation: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("reading {path} inside the image")]
    ReadInRoot {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path} inside the image is larger than {max} bytes")]
    FileTooLarge { path: String, max: usize },
    #[error("{path} inside the image is not a regular file")]
    NotRegularFile { path: String },
}

/// A member path for messages: lossy UTF-8, quoted, cut short if huge.
fn shown(raw: &[u8]) -> String {
    const MAX_SHOWN: usize = 256;
    let cut = &raw[..raw.len().min(MAX_SHOWN)];
    let ellipsis = if raw.len() > MAX_SHOWN { "…" } else { "" };
    format!("{:?}{ellipsis}", String::from_utf8_lossy(cut))
}

fn io_error<'a>(
    entry: &'a [u8],
    operation: &'static str,
) -> impl FnOnce(Errno) -> UnpackError + 'a {
    move |errno| UnpackError::Io {
        entry: shown(entry),
        operation,
        source: errno.into(),
    }
}

/// Applies the layer read by `open()` onto `root`. `open` is called twice (the layer is read
/// in two passes) and must return the *decompressed* tar stream from its start each time.
pub fn apply_layer<R: Read>(
    root: &Path,
    mut open: impl FnMut() -> io::Result<R>,
    budget: &mut Budget,
) -> Result<LayerStats, UnpackError> {
    let root_fd = fs_ops::open_root(root).map_err(|source| UnpackError::OpenRoot {
        root: root.to_path_buf(),
        source,
    })?;
    let mut stats = LayerStats::default();

    let mut bounds = LayerBounds::new(budget);
    let stream = open().map_err(|source| UnpackError::OpenLayer { pass: 1, source })?;
    for_each_member(stream, |member, _content| {
        bounds.admit(member)?;
        apply_deletion(root_fd.as_fd(), member, &mut stats)
    })?;

    let mut bounds = LayerBounds::new(budget);
    let stream = open().map_err(|source| UnpackError::OpenLayer { pass: 2, source })?;
    for_each_member(stream, |member, content| {
        bounds.admit(member)?;
        create::create_member(root_fd.as_fd(), member, content, budget, &mut stats)
    })?;
    Ok(stats)
}

/// Reads the file at `path` (absolute or relative, as seen from inside `root`), resolving every
/// symlink as if `root` were `/` (RESOLVE_IN_ROOT), at most `max` bytes (error past it). For
/// reading an image's /etc/passwd and /etc/group safely. `Ok(None)` if it does not exist.
pub fn read_in_root(root: &Path, path: &str, max: usize) -> Result<Option<Vec<u8>>, UnpackError> {
    let failed = |source: io::Error| UnpackError::ReadInRoot {
        path: path.to_owned(),
        source,
    };
    let root_fd = fs_ops::open_root(root).map_err(|source| UnpackError::OpenRoot {
        root: root.to_path_buf(),
        source,
    })?;
    let relative = path.trim_start_matches('/');
    let relative = if relative.is_empty() { "." } else { relative };
    // O_NONBLOCK: opening a FIFO planted at that path must not hang the daemon.
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = match fs_ops::open_in_root(root_fd.as_fd(), relative.as_bytes(), flags) {
        Ok(fd) => fd,
        Err(error)
            if matches!(
                Errno::from_io_error(&error),
                Some(Errno::NOENT | Errno::NOTDIR)
            ) =>
        {
            return Ok(None);
        }
        Err(error) => return Err(failed(error)),
    };
    let stat = rfs::fstat(&fd).map_err(|errno| failed(errno.into()))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(UnpackError::NotRegularFile {
            path: path.to_owned(),
        });
    }
    let mut content = Vec::new();
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    File::from(fd)
        .take(limit)
        .read_to_end(&mut content)
        .map_err(failed)?;
    if content.len() > max {
        return Err(UnpackError::FileTooLarge {
            path: path.to_owned(),
            max,
        });
    }
    Ok(Some(content))
}

/// Per-layer bounds checked in both passes (the second read of a layer is not trusted to
/// match the first): at most `max_entries` members of any kind, at most as many creatable
/// members as entries are left, and no more declared content than bytes are left.
struct LayerBounds {
    max_members: u64,
    entries_left: u64,
    bytes_left: u64,
    max_entries: u64,
    max_bytes: u64,
    members: u64,
    creatable: u64,
    declared_bytes: u64,
}

impl LayerBounds {
    fn new(budget: &Budget) -> Self {
        Self {
            max_members: budget.limits.max_entries,
            entries_left: budget.entries_left(),
            bytes_left: budget.bytes_left(),
            max_entries: budget.limits.max_entries,
            max_bytes: budget.limits.max_bytes,
            members: 0,
            creatable: 0,
            declared_bytes: 0,
        }
    }

    fn admit(&mut self, member: &Member) -> Result<(), UnpackError> {
        let exceeded = |limit, max| UnpackError::LimitExceeded {
            limit,
            max,
            entry: shown(&member.path),
        };
        self.members += 1;
        if self.members > self.max_members {
            return Err(exceeded(Limit::Entries, self.max_entries));
        }
        self.declared_bytes = self.declared_bytes.saturating_add(member.size);
        if self.declared_bytes > self.bytes_left {
            return Err(exceeded(Limit::Bytes, self.max_bytes));
        }
        let kind = kind_of(member.kind);
        let creatable = matches!(
            kind,
            Kind::File | Kind::Directory | Kind::Symlink | Kind::HardLink | Kind::Fifo
        ) && matches!(entry_path::classify(&member.path), Ok(Target::Entry { .. }));
        if creatable {
            self.creatable += 1;
            if self.creatable > self.entries_left {
                return Err(exceeded(Limit::Entries, self.max_entries));
            }
        }
        Ok(())
    }
}

/// Classifies a member's path, refusing the layer for a hostile one.
fn target_of(member: &Member) -> Result<Option<Target<'_>>, UnpackError> {
    if kind_of(member.kind) == Kind::GlobalMetadata {
        return Ok(None);
    }
    entry_path::classify(&member.path)
        .map(Some)
        .map_err(|reason| UnpackError::BadPath {
            entry: shown(&member.path),
            reason,
        })
}

fn c_name(name: &[u8], entry: &[u8]) -> Result<CString, UnpackError> {
    CString::new(name).map_err(|_| UnpackError::BadPath {
        entry: shown(entry),
        reason: "the path contains a NUL byte",
    })
}

/// Pass 1: applies the member if it is a whiteout or an opaque marker.
fn apply_deletion(
    root: BorrowedFd<'_>,
    member: &Member,
    stats: &mut LayerStats,
) -> Result<(), UnpackError> {
    let entry = &member.path;
    let (parent, name) = match target_of(member)? {
        Some(Target::Whiteout { parent, name }) => (parent, Some(name)),
        Some(Target::Opaque { parent }) => (parent, None),
        _ => return Ok(()),
    };
    // A parent that does not exist (or is not a directory) has nothing to delete.
    let parent_fd = match fs_ops::open_dir_in_root(root, &entry_path::join(&parent)) {
        Ok(fd) => Some(fd),
        Err(error)
            if matches!(
                Errno::from_io_error(&error),
                Some(Errno::NOENT | Errno::NOTDIR)
            ) =>
        {
            None
        }
        Err(source) => {
            return Err(UnpackError::Io {
                entry: shown(entry),
                operation: "opening the directory to delete in",
                source,
            });
        }
    };
    match name {
        Some(name) => {
            if let Some(parent_fd) = parent_fd {
                fs_ops::remove_entry(parent_fd.as_fd(), &c_name(name, entry)?).map_err(
                    |source| UnpackError::Io {
                        entry: shown(entry),
                        operation: "removing the whited-out entry",
                        source,
                    },
                )?;
            }
            stats.whiteouts += 1;
        }
        None => {
            if let Some(parent_fd) = parent_fd {
                fs_ops::remove_children(parent_fd.as_fd()).map_err(|source| UnpackError::Io {
                    entry: shown(entry),
                    operation: "emptying the opaque directory",
                    source,
                })?;
            }
            stats.opaque_dirs += 1;
        }
    }
    Ok(())
}
