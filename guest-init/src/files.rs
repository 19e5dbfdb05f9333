//! File transfer: `put_files` (a tar stream extracted beneath a directory) and `get_file`.
//!
//! Extraction is done entry by entry by hand rather than with `tar::Entry::unpack_in`, so that
//! every rule is explicit and the first refused entry stops the archive with a reason:
//! - names must be relative and free of `..` (`.` components are dropped);
//! - no entry may be written through a symlink: every parent directory on disk is checked with
//!   `lstat`, and an existing file, link or symlink at the entry's own path is removed first, so
//!   a new file never follows an old symlink;
//! - a symlink's target must resolve (lexically, from the symlink's directory) inside the
//!   destination; a hardlink's target must name an existing non-directory inside it, reached
//!   without symlinked parents;
//! - device nodes and fifos are refused, and so are entry types we do not know.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use wire::{ErrorBody, FilesPutResult, RefusedEntry};

use crate::sys;

/// Largest size-less file (`/proc/…`) that `get_file` will buffer to learn its length.
const MAX_UNSIZED_FILE: u64 = 16 * 1024 * 1024;

/// Why a file request failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The request itself is wrong (relative path, destination is a file, …).
    #[error("{0}")]
    Invalid(String),
    /// The path does not exist.
    #[error("{0} does not exist")]
    NotFound(String),
    /// The path is a directory where a file was wanted.
    #[error("{0} is a directory")]
    IsADirectory(String),
    /// The upload is not a readable tar archive (garbage, truncated, a size it does not have).
    #[error("the archive is malformed or truncated: {0}")]
    BadArchive(String),
    /// A filesystem operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
}

impl FilesError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> FilesError {
        FilesError::Io {
            what: what.into(),
            source,
        }
    }

    /// The error envelope for the host, with a stable code.
    pub fn to_body(&self) -> ErrorBody {
        let code = match self {
            FilesError::Invalid(_) => "invalid_request",
            FilesError::NotFound(_) => "not_found",
            FilesError::IsADirectory(_) => "is_a_directory",
            FilesError::BadArchive(_) => "invalid_request",
            FilesError::Io { source, .. } => match source.kind() {
                io::ErrorKind::PermissionDenied => "permission_denied",
                io::ErrorKind::NotFound => "not_found",
                // The sandbox's disk or inode table is full: the upload ran into a limit.
                io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => "no_space",
                // A name the filesystem cannot hold (too long, too deep): the archive's fault.
                io::ErrorKind::InvalidFilename => "invalid_request",
                _ if source.raw_os_error() == Some(libc::ELOOP) => "invalid_request",
                _ => "io_error",
            },
        };
        ErrorBody::new(code, report::chain(self))
    }
}

/// Extracts the tar archive read from `input` beneath `dest` (absolute; created if missing).
/// Stops at the first refused entry, which is reported in the result.
pub fn put_files<R: Read>(input: R, dest: &str) -> Result<FilesPutResult, FilesError> {
    if !dest.starts_with('/') || dest.contains('\0') {
        return Err(FilesError::Invalid(format!(
            "destination must be an absolute path, got {dest:?}"
        )));
    }
    match fs::metadata(dest) {
        Ok(m) if !m.is_dir() => {
            return Err(FilesError::Invalid(format!("{dest} is not a directory")));
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dest).map_err(|e| FilesError::io(format!("creating {dest}"), e))?;
        }
        Err(e) => return Err(FilesError::io(format!("checking {dest}"), e)),
    }
    let root =
        fs::canonicalize(dest).map_err(|e| FilesError::io(format!("resolving {dest}"), e))?;

    let mut result = FilesPutResult {
        path: dest.to_string(),
        ..FilesPutResult::default()
    };
    let mut archive = tar::Archive::new(input);
    // One copy buffer for the whole archive, grown to the largest file up to COPY_BLOCK.
    let mut block = Vec::new();
    let entries = archive
        .entries()
        .map_err(|e| FilesError::BadArchive(e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| {
            FilesError::BadArchive(format!("after {} entries: {e}", result.written.len()))
        })?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        match extract(&root, &mut entry, &mut result, &mut block) {
            Ok(()) => {}
            Err(Extract::Refused(reason)) => {
                result.refused = Some(RefusedEntry { path: name, reason });
                break;
            }
            Err(Extract::Failed(e)) => return Err(e),
        }
    }
    Ok(result)
}

enum Extract {
    Refused(String),
    Failed(FilesError),
}

impl From<FilesError> for Extract {
    fn from(e: FilesError) -> Extract {
        Extract::Failed(e)
    }
}

fn refuse<T>(reason: impl Into<String>) -> Result<T, Extract> {
    Err(Extract::Refused(reason.into()))
}

/// `name` as a clean relative path: no root, no `..`, no `.`; `None` for the root itself.
fn sanitize(name: &[u8]) -> Result<Option<PathBuf>, Extract> {
    let path = Path::new(OsStr::from_bytes(name));
    let mut clean = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return refuse("absolute path"),
            Component::ParentDir => return refuse("path contains '..'"),
        }
    }
    Ok((!clean.as_os_str().is_empty()).then_some(clean))
}

/// Makes sure every parent of `rel` beneath `root` is a real directory (creating missing ones
/// when `create`), never a symlink.
fn check_parents(root: &Path, rel: &Path, create: bool) -> Result<(), Extract> {
    let Some(parent) = rel.parent() else {
        return Ok(());
    };
    let mut cur = root.to_path_buf();
    for part in parent.components() {
        cur.push(part);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return refuse(format!(
                    "parent {} is a symlink",
                    cur.strip_prefix(root).unwrap_or(&cur).display()
                ))
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return refuse(format!(
                    "parent {} is not a directory",
                    cur.strip_prefix(root).unwrap_or(&cur).display()
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                fs::create_dir(&cur)
                    .map_err(|e| FilesError::io(format!("creating {}", cur.display()), e))?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return refuse(format!(
                    "{} does not exist",
                    cur.strip_prefix(root).unwrap_or(&cur).display()
                ))
            }
            Err(e) => return Err(FilesError::io(format!("checking {}", cur.display()), e).into()),
        }
    }
    Ok(())
}

/// Removes whatever non-directory is at `path`, so that nothing new follows an old symlink.
fn clear_non_dir(path: &Path) -> Result<(), Extract> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => refuse("would replace a directory"),
        Ok(_) => fs::remove_file(path)
            .map_err(|e| FilesError::io(format!("replacing {}", path.display()), e).into()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FilesError::io(format!("checking {}", path.display()), e).into()),
    }
}

/// Normalizes `path` lexically; `None` if `..` climbs above `/`.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir => out.push("/"),
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if !out.pop() || out.as_os_str().is_empty() {
                    return None;
                }
            }
        }
    }
    Some(out)
}

fn extract<R: Read>(
    root: &Path,
    entry: &mut tar::Entry<'_, R>,
    result: &mut FilesPutResult,
    block: &mut Vec<u8>,
) -> Result<(), Extract> {
    let Some(rel) = sanitize(&entry.path_bytes())? else {
        return Ok(()); // "./": the destination itself.
    };
    let kind = entry.header().entry_type();
    let mode = entry.header().mode().unwrap_or(0o644) & 0o7777;
    match kind {
        tar::EntryType::Char | tar::EntryType::Block => {
            return refuse("device nodes are not allowed")
        }
        tar::EntryType::Fifo => return refuse("fifos are not allowed"),
        tar::EntryType::XGlobalHeader => return Ok(()),
        _ => {}
    }
    check_parents(root, &rel, true)?;
    let target = root.join(&rel);
    match kind {
        tar::EntryType::Directory => {
            match fs::symlink_metadata(&target) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    clear_non_dir(&target)?;
                    create_dir(&target)?;
                }
                Err(_) => create_dir(&target)?,
            }
            fs::set_permissions(&target, fs::Permissions::from_mode(mode))
                .map_err(|e| FilesError::io(format!("chmod {}", target.display()), e))?;
            result.dirs += 1;
        }
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
            let mut file = match sys::is_mount_root(&target) {
                // A file that is a mount of its own (a container's writable file under a
                // read-only root, kubelet's /etc/hosts) cannot be replaced: it is rewritten.
                Ok(true) if fs::symlink_metadata(&target).is_ok_and(|m| m.is_file()) => {
                    OpenOptions::new()
                        .write(true)
                        .truncate(true)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&target)
                }
                _ => {
                    clear_non_dir(&target)?;
                    OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(mode)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&target)
                }
            }
            .map_err(|e| FilesError::io(format!("creating {}", target.display()), e))?;
            let declared = entry.size();
            let n = copy_in_blocks(entry, &mut file, block)
                .map_err(|e| FilesError::io(format!("writing {}", target.display()), e))?;
            if n < declared && kind != tar::EntryType::GNUSparse {
                return Err(FilesError::BadArchive(format!(
                    "entry {} declares {declared} bytes but the archive ended after {n}",
                    rel.display()
                ))
                .into());
            }
            file.flush()
                .map_err(|e| FilesError::io(format!("writing {}", target.display()), e))?;
            // create_new applied the umask; set the archive's mode exactly.
            file.set_permissions(fs::Permissions::from_mode(mode))
                .map_err(|e| FilesError::io(format!("chmod {}", target.display()), e))?;
            result.files += 1;
            result.bytes += n;
        }
        tar::EntryType::Symlink => {
            let Some(link) = entry
                .link_name_bytes()
                .map(|l| PathBuf::from(OsStr::from_bytes(&l)))
            else {
                return refuse("symlink without a target");
            };
            let resolved = if link.is_absolute() {
                normalize(&link)
            } else {
                let dir = target.parent().unwrap_or(root);
                normalize(&dir.join(&link))
            };
            if !resolved.is_some_and(|r| r.starts_with(root)) {
                return refuse(format!(
                    "symlink target {} escapes the destination",
                    link.display()
                ));
            }
            clear_non_dir(&target)?;
            std::os::unix::fs::symlink(&link, &target)
                .map_err(|e| FilesError::io(format!("symlink {}", target.display()), e))?;
            result.links += 1;
        }
        tar::EntryType::Link => {
            let Some(link) = entry.link_name_bytes() else {
                return refuse("hardlink without a target");
            };
            let Some(src_rel) = sanitize(&link).map_err(|_| {
                Extract::Refused(format!(
                    "hardlink target {} escapes the destination",
                    String::from_utf8_lossy(&link)
                ))
            })?
            else {
                return refuse("hardlink to the destination directory");
            };
            check_parents(root, &src_rel, false)?;
            let src = root.join(&src_rel);
            match fs::symlink_metadata(&src) {
                Ok(m) if m.is_dir() => return refuse("hardlink to a directory"),
                Ok(_) => {}
                Err(_) => {
                    return refuse(format!(
                        "hardlink target {} does not exist",
                        src_rel.display()
                    ))
                }
            }
            clear_non_dir(&target)?;
            // linkat without AT_SYMLINK_FOLLOW: a symlink is linked as itself, never followed.
            fs::hard_link(&src, &target)
                .map_err(|e| FilesError::io(format!("hardlink {}", target.display()), e))?;
            result.links += 1;
        }
        other => {
            return refuse(format!(
                "unsupported entry type {:?}",
                other.as_byte() as char
            ))
        }
    }
    result.written.push(rel.to_string_lossy().into_owned());
    Ok(())
}

fn create_dir(path: &Path) -> Result<(), Extract> {
    fs::create_dir(path)
        .map_err(|e| FilesError::io(format!("creating {}", path.display()), e).into())
}

/// An opened file ready to send, with its permission bits and modification time.
#[derive(Debug)]
pub struct Outgoing {
    /// Its bytes.
    pub content: Content,
    /// `st_mode & 0o7777`.
    pub mode: u32,
    /// `st_mtime`.
    pub modified: i64,
}

/// Where an outgoing file's bytes come from.
#[derive(Debug)]
pub enum Content {
    /// A regular file of known size, streamed from disk.
    File(File, u64),
    /// A size-less file (procfs, sysfs), read into memory.
    Buffered(Vec<u8>),
}

impl Outgoing {
    /// The size announced to the host.
    pub fn size(&self) -> u64 {
        match &self.content {
            Content::File(_, n) => *n,
            Content::Buffered(b) => b.len() as u64,
        }
    }

    /// Writes exactly [`size`](Self::size) bytes, or fails (the host then sees a short stream).
    pub fn send<W: Write + AsFd>(self, out: &mut W) -> io::Result<()> {
        match self.content {
            Content::Buffered(b) => out.write_all(&b),
            Content::File(f, n) => {
                let sent = send_file(&f, out, n)?;
                if sent < n {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the file shrank to {sent} of {n} bytes while being sent"),
                    ));
                }
                Ok(())
            }
        }
    }
}

/// Largest read and write of a file's bytes: a 256 MiB upload is a thousand pairs of system
/// calls rather than io::copy's 8 KiB thirty thousand.
const COPY_BLOCK: usize = 256 * 1024;

/// Copies `from` to `to` to the end, in reads and writes of up to [`COPY_BLOCK`] bytes through
/// `block` (grown as the data needs, so a 1 KiB file costs a 1 KiB buffer).
fn copy_in_blocks(
    from: &mut impl Read,
    to: &mut impl Write,
    block: &mut Vec<u8>,
) -> io::Result<u64> {
    let mut total = 0u64;
    loop {
        if block.len() < COPY_BLOCK {
            // Grow geometrically while the input keeps filling the buffer.
            let want = (block.len() * 2).clamp(16 * 1024, COPY_BLOCK);
            block.resize(want, 0);
        }
        let n = match from.read(block) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&block[..n])?;
        total += n as u64;
    }
}

/// Sends `n` bytes of `file` from its current offset with sendfile(2), so they never pass
/// through the agent; where the kernel cannot (EINVAL/ENOSYS: a filesystem or socket without
/// splice support), falls back to reads and writes. Returns how many bytes were sent: fewer
/// than `n` only when the file shrank meanwhile.
fn send_file<W: Write + AsFd>(file: &File, out: &mut W, n: u64) -> io::Result<u64> {
    let mut sent = 0u64;
    while sent < n {
        let want = usize::try_from(n - sent).unwrap_or(usize::MAX).min(1 << 30);
        match sys::sendfile(out.as_fd(), file.as_fd(), want) {
            Ok(0) => return Ok(sent),
            Ok(k) => sent += k as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if sent == 0 && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) =>
            {
                let mut block = Vec::new();
                return copy_in_blocks(&mut file.take(n), out, &mut block);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}

/// Opens `path` for `get_file`.
pub fn open_for_get(path: &str) -> Result<Outgoing, FilesError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(FilesError::Invalid(format!(
            "path must be absolute, got {path:?}"
        )));
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => FilesError::NotFound(path.to_string()),
            _ => FilesError::io(format!("opening {path}"), e),
        })?;
    let meta = file
        .metadata()
        .map_err(|e| FilesError::io(format!("stat {path}"), e))?;
    if meta.is_dir() {
        return Err(FilesError::IsADirectory(path.to_string()));
    }
    if !meta.is_file() {
        return Err(FilesError::Invalid(format!("{path} is not a regular file")));
    }
    let (mode, modified) = (meta.mode() & 0o7777, meta.mtime());
    if meta.len() > 0 {
        return Ok(Outgoing {
            content: Content::File(file, meta.len()),
            mode,
            modified,
        });
    }
    let mut buf = Vec::new();
    file.take(MAX_UNSIZED_FILE)
        .read_to_end(&mut buf)
        .map_err(|e| FilesError::io(format!("reading {path}"), e))?;
    Ok(Outgoing {
        content: Content::Buffered(buf),
        mode,
        modified,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out at most `step` bytes per read, like a socket under load.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn copy_in_blocks_moves_every_byte_whatever_the_read_sizes() {
        let data: Vec<u8> = (0..1_000_003u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for step in [1, 511, 4096, 70_000, usize::MAX] {
            let mut out = Vec::new();
            let mut block = Vec::new();
            let n = copy_in_blocks(&mut Trickle { data: &data, step }, &mut out, &mut block)
                .expect("copies");
            assert_eq!(n, data.len() as u64, "step {step}");
            assert!(out == data, "step {step}: bytes differ");
            assert!(block.len() <= COPY_BLOCK);
        }
    }

    #[test]
    fn send_file_sends_exactly_the_announced_bytes_from_the_current_offset() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        fs::write(&path, &data).expect("write");
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            b.read_to_end(&mut got).expect("read");
            got
        });
        let mut file = File::open(&path).expect("open");
        io::Seek::seek(&mut file, io::SeekFrom::Start(10)).expect("seek");
        let sent = send_file(&file, &mut a, 2_000_000).expect("sendfile");
        drop(a);
        assert_eq!(sent, 2_000_000);
        let got = reader.join().expect("reader");
        assert!(got == data[10..2_000_010], "bytes differ");
    }

    #[test]
    fn send_file_reports_a_file_that_shrank() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        fs::write(&path, vec![1u8; 1000]).expect("write");
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            b.read_to_end(&mut got).expect("read");
            got.len()
        });
        let file = File::open(&path).expect("open");
        assert_eq!(send_file(&file, &mut a, 5000).expect("sendfile"), 1000);
        drop(a);
        assert_eq!(reader.join().expect("reader"), 1000);
    }

    #[test]
    fn sanitize_drops_dots_and_refuses_escapes() {
        assert_eq!(
            sanitize(b"./a/./b").ok().flatten(),
            Some(PathBuf::from("a/b"))
        );
        assert!(matches!(sanitize(b"./"), Ok(None)));
        assert!(matches!(sanitize(b"/etc/passwd"), Err(Extract::Refused(_))));
        assert!(matches!(sanitize(b"a/../../x"), Err(Extract::Refused(_))));
    }

    #[test]
    fn normalize_is_lexical_and_stops_at_root() {
        assert_eq!(
            normalize(Path::new("/d/a/../b/./c")),
            Some(PathBuf::from("/d/b/c"))
        );
        assert_eq!(normalize(Path::new("/d/../..")), None);
    }
}
