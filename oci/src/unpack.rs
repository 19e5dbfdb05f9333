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

mod entry_path;
mod fs_ops;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid};
use rustix::io::Errno;

use entry_path::{RelPath, Target};

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
        create_member(root_fd.as_fd(), member, content, budget, &mut stats)
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

/// One tar member's header, as far as unpacking needs it.
struct Member {
    path: Vec<u8>,
    link_target: Option<Vec<u8>>,
    kind: tar::EntryType,
    /// Content size (PAX `size` and GNU sparse maps applied by the `tar` crate).
    size: u64,
    header: tar::Header,
    pax_mtime: Option<Vec<u8>>,
}

impl Member {
    fn bad_header(&self, field: &'static str) -> impl FnOnce(io::Error) -> UnpackError + '_ {
        move |source| UnpackError::BadHeader {
            entry: shown(&self.path),
            field,
            source: Some(source),
        }
    }

    fn owner(&self) -> Result<(Uid, Gid), UnpackError> {
        let uid = self.header.uid().map_err(self.bad_header("uid"))?;
        let gid = self.header.gid().map_err(self.bad_header("gid"))?;
        // u32::MAX is chown's "leave unchanged", not an id.
        let id = |value: u64, field| match u32::try_from(value) {
            Ok(id) if id != u32::MAX => Ok(id),
            _ => Err(UnpackError::BadHeader {
                entry: shown(&self.path),
                field,
                source: None,
            }),
        };
        Ok((
            Uid::from_raw(id(uid, "uid")?),
            Gid::from_raw(id(gid, "gid")?),
        ))
    }

    /// Permission bits with setuid, setgid and sticky; the file type bits are dropped.
    fn permissions(&self) -> Result<Mode, UnpackError> {
        let mode = self.header.mode().map_err(self.bad_header("mode"))?;
        Ok(Mode::from_raw_mode(mode & 0o7777))
    }

    /// The modification time: PAX `mtime` when present and well formed, else the header's.
    fn mtime(&self) -> Result<Timespec, UnpackError> {
        if let Some(time) = self.pax_mtime.as_deref().and_then(parse_pax_time) {
            return Ok(time);
        }
        let seconds = self.header.mtime().map_err(self.bad_header("mtime"))?;
        let tv_sec = i64::try_from(seconds).map_err(|_| UnpackError::BadHeader {
            entry: shown(&self.path),
            field: "mtime",
            source: None,
        })?;
        Ok(Timespec { tv_sec, tv_nsec: 0 })
    }

    fn timestamps(&self) -> Result<Timestamps, UnpackError> {
        let mtime = self.mtime()?;
        Ok(Timestamps {
            last_access: mtime,
            last_modification: mtime,
        })
    }
}

/// Parses a PAX time (`-?SECONDS(.FRACTION)?`) into a timespec; `None` if malformed.
fn parse_pax_time(value: &[u8]) -> Option<Timespec> {
    let text = std::str::from_utf8(value).ok()?;
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let seconds: i64 = whole.parse().ok()?;
    let mut nanos: i64 = 0;
    for (index, digit) in fraction.bytes().take(9).enumerate() {
        let exponent = 8 - u32::try_from(index).ok()?;
        nanos += i64::from(digit - b'0') * 10_i64.pow(exponent);
    }
    Some(match (negative, nanos) {
        (false, _) => Timespec {
            tv_sec: seconds,
            tv_nsec: nanos,
        },
        (true, 0) => Timespec {
            tv_sec: -seconds,
            tv_nsec: 0,
        },
        (true, _) => Timespec {
            tv_sec: -seconds - 1,
            tv_nsec: 1_000_000_000 - nanos,
        },
    })
}

/// Most bytes of tar metadata (GNU long names, PAX records, sparse maps) read before one
/// member. The `tar` crate buffers them whole, so without this bound a compressed stream could
/// make the daemon allocate without end.
const MAX_METADATA_BYTES: u64 = 1 << 20;

/// Counts what the `tar` crate reads, and refuses to let it read more than
/// [`MAX_METADATA_BYTES`] while it looks for the next member.
#[derive(Default)]
struct Meter {
    position: Cell<u64>,
    armed: Cell<bool>,
    read_while_armed: Cell<u64>,
    tripped: Cell<bool>,
}

struct MeteredReader<'m, R> {
    inner: R,
    meter: &'m Meter,
}

impl<R: Read> Read for MeteredReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let meter = self.meter;
        let mut room = buf.len();
        if meter.armed.get() {
            let used = meter.read_while_armed.get();
            if used >= MAX_METADATA_BYTES {
                meter.tripped.set(true);
                return Err(io::Error::other("too much tar metadata before one member"));
            }
            room = room.min(usize::try_from(MAX_METADATA_BYTES - used).unwrap_or(usize::MAX));
        }
        let read = self.inner.read(&mut buf[..room])?;
        let read_u64 = read as u64;
        meter
            .position
            .set(meter.position.get().saturating_add(read_u64));
        if meter.armed.get() {
            meter
                .read_while_armed
                .set(meter.read_while_armed.get() + read_u64);
        }
        Ok(read)
    }
}

/// Calls `visit` with each member of the tar `stream` and a reader of its content; whatever
/// content `visit` leaves unread is drained before the next member is parsed.
fn for_each_member<R: Read>(
    stream: R,
    mut visit: impl FnMut(&Member, &mut dyn Read) -> Result<(), UnpackError>,
) -> Result<(), UnpackError> {
    let meter = Meter::default();
    let mut archive = tar::Archive::new(MeteredReader {
        inner: stream,
        meter: &meter,
    });
    let mut last_member = String::from("none: at the start");
    let tar_error = |meter: &Meter, after: &str, source: io::Error| {
        if meter.tripped.get() {
            UnpackError::MetadataTooLarge {
                offset: meter.position.get(),
                max: MAX_METADATA_BYTES,
            }
        } else {
            UnpackError::Tar {
                offset: meter.position.get(),
                after: after.to_owned(),
                source,
            }
        }
    };
    let mut entries = archive
        .entries()
        .map_err(|source| tar_error(&meter, &last_member, source))?;
    loop {
        meter.read_while_armed.set(0);
        meter.armed.set(true);
        let next = entries.next();
        meter.armed.set(false);
        let mut entry = match next {
            None => return Ok(()),
            Some(Ok(entry)) => entry,
            Some(Err(source)) => return Err(tar_error(&meter, &last_member, source)),
        };
        let pax_mtime = match entry.pax_extensions() {
            Ok(Some(extensions)) => extensions
                .filter_map(Result::ok)
                .find(|extension| extension.key_bytes() == b"mtime")
                .map(|extension| extension.value_bytes().to_vec()),
            Ok(None) => None,
            Err(source) => return Err(tar_error(&meter, &last_member, source)),
        };
        let member = Member {
            path: entry.path_bytes().into_owned(),
            link_target: entry.link_name_bytes().map(|target| target.into_owned()),
            kind: entry.header().entry_type(),
            size: entry.size(),
            header: entry.header().clone(),
            pax_mtime,
        };
        visit(&member, &mut entry)?;
        io::copy(&mut entry, &mut io::sink()).map_err(|source| UnpackError::Io {
            entry: shown(&member.path),
            operation: "reading the member's content",
            source,
        })?;
        last_member = shown(&member.path);
    }
}

/// What a member is, for unpacking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Directory,
    Symlink,
    HardLink,
    Fifo,
    Device,
    /// A PAX global header: metadata for the whole archive, not an entry.
    GlobalMetadata,
    Other,
}

fn kind_of(entry_type: tar::EntryType) -> Kind {
    use tar::EntryType as T;
    match entry_type {
        T::Regular | T::Continuous | T::GNUSparse => Kind::File,
        T::Directory => Kind::Directory,
        T::Symlink => Kind::Symlink,
        T::Link => Kind::HardLink,
        T::Fifo => Kind::Fifo,
        T::Char | T::Block => Kind::Device,
        T::XGlobalHeader => Kind::GlobalMetadata,
        _ => Kind::Other,
    }
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

/// Pass 2: creates the member (whiteouts and the root itself are skipped).
fn create_member(
    root: BorrowedFd<'_>,
    member: &Member,
    content: &mut dyn Read,
    budget: &mut Budget,
    stats: &mut LayerStats,
) -> Result<(), UnpackError> {
    let Some(Target::Entry { parent, name }) = target_of(member)? else {
        return Ok(());
    };
    let kind = kind_of(member.kind);
    match kind {
        Kind::Device => {
            stats.dropped_devices += 1;
            return Ok(());
        }
        Kind::Other => {
            stats.dropped_other += 1;
            return Ok(());
        }
        Kind::GlobalMetadata => return Ok(()),
        Kind::File | Kind::Directory | Kind::Symlink | Kind::HardLink | Kind::Fifo => {}
    }
    let entry = &member.path;
    let name = c_name(name, entry)?;
    // A hard link's target is found before anything at the link's own path is replaced.
    let link_source = match kind {
        Kind::HardLink => Some(open_hard_link_target(root, member)?),
        _ => None,
    };
    if kind == Kind::File && member.size > budget.bytes_left() {
        // The declared size is checked before anything is created; the copy counts again.
        return Err(budget.exceeded(Limit::Bytes, entry));
    }
    let parent_fd = open_or_create_parent(root, &parent, entry, budget, stats)?;
    let parent_fd = parent_fd.as_fd();
    let existing = fs_ops::entry_type(parent_fd, &name).map_err(|source| UnpackError::Io {
        entry: shown(entry),
        operation: "looking at what is at the path already",
        source,
    })?;
    budget.take_entry(entry)?;
    if let (Some(source), Some(existing)) = (&link_source, &existing) {
        let source_stat =
            rfs::fstat(source).map_err(io_error(entry, "looking at the link target"))?;
        if (source_stat.st_dev, source_stat.st_ino) == (existing.st_dev, existing.st_ino) {
            // Already linked (a member linking to its own path): nothing to replace.
            stats.entries += 1;
            return Ok(());
        }
    }
    let keep_directory = kind == Kind::Directory && existing.as_ref().is_some_and(fs_ops::is_dir);
    if existing.is_some() && !keep_directory {
        fs_ops::remove_entry(parent_fd, &name).map_err(|source| UnpackError::Io {
            entry: shown(entry),
            operation: "removing what was at the path",
            source,
        })?;
    }
    if let Some(source) = link_source {
        rfs::linkat(&source, c"", parent_fd, &name, AtFlags::EMPTY_PATH)
            .map_err(io_error(entry, "creating the hard link"))?;
    } else if kind == Kind::File {
        create_file(parent_fd, &name, member, content, budget, stats)?;
    } else if kind == Kind::Directory {
        create_directory(parent_fd, &name, member, keep_directory)?;
    } else if kind == Kind::Symlink {
        create_symlink(parent_fd, &name, member)?;
    } else {
        create_fifo(parent_fd, &name, member)?;
    }
    stats.entries += 1;
    Ok(())
}

/// Most symlinks followed while creating one member's missing parents, as the kernel's limit.
const MAX_SYMLINK_FOLLOWS: usize = 40;

/// Opens the directory `parent` (resolved in root), creating what is missing of it as
/// directories 0755 owned by 0:0, each counted as an entry.
///
/// When something is missing the path is walked here component by component with the kernel's
/// in-root rules (a symlink's target continues the walk, `..` stops at the root), so a dangling
/// symlink on the way (`esc -> ../outside`) gets its target created inside the root, and every
/// step is an `*at` call on one component that does not follow it.
fn open_or_create_parent(
    root: BorrowedFd<'_>,
    parent: &[&[u8]],
    entry: &[u8],
    budget: &mut Budget,
    stats: &mut LayerStats,
) -> Result<OwnedFd, UnpackError> {
    let failed = |operation| {
        move |source| UnpackError::Io {
            entry: shown(entry),
            operation,
            source,
        }
    };
    match fs_ops::open_dir_in_root(root, &entry_path::join(parent)) {
        Ok(fd) => return Ok(fd),
        Err(error) if Errno::from_io_error(&error) == Some(Errno::NOENT) => {}
        Err(error) => return Err(failed("opening the parent directory")(error)),
    }
    let mut remaining: std::collections::VecDeque<Vec<u8>> =
        parent.iter().map(|c| c.to_vec()).collect();
    // The real directories (no symlinks) from the root to `current`.
    let mut walked: Vec<Vec<u8>> = Vec::new();
    let mut current = fs_ops::open_dir_in_root(root, b".").map_err(failed("opening the root"))?;
    let mut follows = 0;
    while let Some(component) = remaining.pop_front() {
        match component.as_slice() {
            b"" | b"." => continue,
            b".." => {
                walked.pop();
                let path: Vec<&[u8]> = walked.iter().map(Vec::as_slice).collect();
                current = fs_ops::open_dir_in_root(root, &entry_path::join(&path))
                    .map_err(failed("opening a parent directory"))?;
                continue;
            }
            _ => {}
        }
        let name = c_name(&component, entry)?;
        let existing = fs_ops::entry_type(current.as_fd(), &name)
            .map_err(failed("looking at a parent directory"))?;
        match existing.map(|stat| FileType::from_raw_mode(stat.st_mode)) {
            None => {
                budget.take_entry(entry)?;
                rfs::mkdirat(&current, &name, Mode::from_raw_mode(0o755))
                    .map_err(io_error(entry, "creating a missing parent directory"))?;
                let created = fs_ops::open_child_dir(current.as_fd(), &name)
                    .map_err(failed("opening a created parent directory"))?;
                rfs::fchown(&created, Some(Uid::ROOT), Some(Gid::ROOT)).map_err(io_error(
                    entry,
                    "setting a created parent directory's owner",
                ))?;
                rfs::fchmod(&created, Mode::from_raw_mode(0o755))
                    .map_err(io_error(entry, "setting a created parent directory's mode"))?;
                stats.entries += 1;
                current = created;
                walked.push(component);
            }
            Some(FileType::Directory) => {
                current = fs_ops::open_child_dir(current.as_fd(), &name)
                    .map_err(failed("opening a parent directory"))?;
                walked.push(component);
            }
            Some(FileType::Symlink) => {
                follows += 1;
                if follows > MAX_SYMLINK_FOLLOWS {
                    return Err(failed("resolving the parent directory")(Errno::LOOP.into()));
                }
                let target = rfs::readlinkat(&current, &name, Vec::new())
                    .map_err(io_error(entry, "reading a symlink on the parent path"))?;
                let target = target.as_bytes();
                if target.starts_with(b"/") {
                    walked.clear();
                    current =
                        fs_ops::open_dir_in_root(root, b".").map_err(failed("opening the root"))?;
                }
                for component in target.split(|byte| *byte == b'/').rev() {
                    remaining.push_front(component.to_vec());
                }
            }
            Some(_) => return Err(failed("opening the parent directory")(Errno::NOTDIR.into())),
        }
    }
    Ok(current)
}

/// Applies owner, then mode (chown clears setuid), then optionally times, through `fd`.
fn set_metadata(fd: BorrowedFd<'_>, member: &Member, with_times: bool) -> Result<(), UnpackError> {
    let entry = &member.path;
    let (uid, gid) = member.owner()?;
    rfs::fchown(fd, Some(uid), Some(gid)).map_err(io_error(entry, "setting the owner"))?;
    rfs::fchmod(fd, member.permissions()?).map_err(io_error(entry, "setting the mode"))?;
    if with_times {
        rfs::futimens(fd, &member.timestamps()?).map_err(io_error(entry, "setting the mtime"))?;
    }
    Ok(())
}

fn create_file(
    parent: BorrowedFd<'_>,
    name: &CString,
    member: &Member,
    content: &mut dyn Read,
    budget: &mut Budget,
    stats: &mut LayerStats,
) -> Result<(), UnpackError> {
    let entry = &member.path;
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rfs::openat(parent, name, flags, Mode::from_raw_mode(0o600))
        .map_err(io_error(entry, "creating the file"))?;
    let mut file = File::from(fd);
    let written = copy_counted(content, &mut file, budget, entry)?;
    stats.bytes += written;
    if written != member.size {
        return Err(UnpackError::Truncated {
            entry: shown(entry),
            written,
            declared: member.size,
        });
    }
    set_metadata(file.as_fd(), member, true)
}

/// Copies `content` into `file`, taking each chunk from the budget before it is written: the
/// stream, not the header, decides how much is written, and it stops at the limit.
fn copy_counted(
    content: &mut dyn Read,
    file: &mut dyn Write,
    budget: &mut Budget,
    entry: &[u8],
) -> Result<u64, UnpackError> {
    let mut buffer = vec![0_u8; 64 * 1024];
    let mut written = 0_u64;
    loop {
        let read = match content.read(&mut buffer) {
            Ok(0) => return Ok(written),
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(UnpackError::Io {
                    entry: shown(entry),
                    operation: "reading the member's content",
                    source,
                });
            }
        };
        budget.take_bytes(read as u64, entry)?;
        file.write_all(&buffer[..read])
            .map_err(|source| UnpackError::Io {
                entry: shown(entry),
                operation: "writing the file",
                source,
            })?;
        written += read as u64;
    }
}

fn create_directory(
    parent: BorrowedFd<'_>,
    name: &CString,
    member: &Member,
    exists: bool,
) -> Result<(), UnpackError> {
    let entry = &member.path;
    if !exists {
        rfs::mkdirat(parent, name, Mode::from_raw_mode(0o700))
            .map_err(io_error(entry, "creating the directory"))?;
    }
    let fd = fs_ops::open_child_dir(parent, name).map_err(|source| UnpackError::Io {
        entry: shown(entry),
        operation: "opening the directory",
        source,
    })?;
    // A directory's mtime is left: the members created in it afterwards would change it anyway.
    set_metadata(fd.as_fd(), member, false)
}

fn create_symlink(
    parent: BorrowedFd<'_>,
    name: &CString,
    member: &Member,
) -> Result<(), UnpackError> {
    let entry = &member.path;
    let bad_target = |reason| UnpackError::BadLinkTarget {
        entry: shown(entry),
        target: shown(member.link_target.as_deref().unwrap_or_default()),
        reason,
    };
    let target = match member.link_target.as_deref() {
        None | Some(b"") => return Err(bad_target("a symlink needs a target")),
        Some(target) => {
            CString::new(target).map_err(|_| bad_target("the target contains a NUL byte"))?
        }
    };
    rfs::symlinkat(&target, parent, name).map_err(io_error(entry, "creating the symlink"))?;
    let (uid, gid) = member.owner()?;
    rfs::chownat(
        parent,
        name,
        Some(uid),
        Some(gid),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(io_error(entry, "setting the symlink's owner"))?;
    rfs::utimensat(
        parent,
        name,
        &member.timestamps()?,
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(io_error(entry, "setting the symlink's mtime"))?;
    Ok(())
}

fn create_fifo(parent: BorrowedFd<'_>, name: &CString, member: &Member) -> Result<(), UnpackError> {
    let entry = &member.path;
    rfs::mknodat(parent, name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)
        .map_err(io_error(entry, "creating the FIFO"))?;
    // Opened (without blocking, without following) so metadata goes through a descriptor.
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rfs::openat(parent, name, flags, Mode::empty())
        .map_err(io_error(entry, "opening the FIFO"))?;
    set_metadata(fd.as_fd(), member, true)
}

/// Opens a hard link's target (resolved in root, its last component not followed) as an
/// `O_PATH` descriptor for `linkat(AT_EMPTY_PATH)`.
fn open_hard_link_target(root: BorrowedFd<'_>, member: &Member) -> Result<OwnedFd, UnpackError> {
    let entry = &member.path;
    let raw_target = member.link_target.as_deref().unwrap_or_default();
    let bad_target = |reason| UnpackError::BadLinkTarget {
        entry: shown(entry),
        target: shown(raw_target),
        reason,
    };
    let target = RelPath::parse(raw_target).map_err(bad_target)?;
    if target.is_root() {
        return Err(bad_target("a hard link cannot point at the root directory"));
    }
    let fd = match fs_ops::open_in_root(root, &target.joined(), OFlags::PATH | OFlags::NOFOLLOW) {
        Ok(fd) => fd,
        Err(error)
            if matches!(
                Errno::from_io_error(&error),
                Some(Errno::NOENT | Errno::NOTDIR)
            ) =>
        {
            return Err(bad_target("it does not exist"));
        }
        Err(source) => {
            return Err(UnpackError::Io {
                entry: shown(entry),
                operation: "opening the hard link's target",
                source,
            })
        }
    };
    let stat = rfs::fstat(&fd).map_err(io_error(entry, "looking at the hard link's target"))?;
    if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
        return Err(bad_target("it is a directory"));
    }
    Ok(fd)
}
