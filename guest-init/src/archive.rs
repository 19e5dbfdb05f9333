//! `get_tree`: a directory (or one file) sent as a tar archive, for downloads of build output.
//!
//! The walk reads what it archives with `lstat` semantics: a symbolic link beneath the top is
//! archived as a link and never followed, so the archive holds exactly the tree as it is. Each
//! regular file is opened without following links and described by `fstat` of that open file,
//! so a name swapped for a fifo or a link mid-walk is archived as what was opened (or skipped
//! when it vanished), never read through. A file that shrinks while it is read cuts the archive
//! short with an error: a tar entry must hold the size its header announced, and a silently
//! zero-padded file is worse than a failed download.
//!
//! The archive goes out in `stdout` frames (so the host reads it with the exec stream's
//! decoder), ended by one `exit` frame carrying the outcome as an [`AgentReply`].

use std::fs::{self, File, Metadata, OpenOptions, ReadDir};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use tar::{EntryType, Header, HeaderMode};
use wire::agent::{AgentReply, TreeSummary};
use wire::{FrameType, FrameWriter, MAX_PAYLOAD};

use crate::files::FilesError;

/// Deepest directory nesting archived: each level holds one open directory while its children
/// are walked, and no build output comes near it.
pub const MAX_DEPTH: usize = 256;

/// What `get_tree` was asked for, opened.
#[derive(Debug)]
pub struct Tree {
    /// The path as asked (for messages).
    path: PathBuf,
    /// What it is.
    meta: Metadata,
}

/// Opens `path` for `get_tree`: it must be an absolute path to a directory or a regular file
/// (followed if it is a symbolic link, as `tar -C DIR` follows DIR).
pub fn open_tree(path: &str) -> Result<Tree, FilesError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(FilesError::Invalid(format!(
            "path must be absolute, got {path:?}"
        )));
    }
    let meta = fs::metadata(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => FilesError::NotFound(path.to_string()),
        _ => FilesError::io(format!("stat {path}"), e),
    })?;
    if !meta.is_dir() && !meta.is_file() {
        return Err(FilesError::Invalid(format!(
            "{path} is neither a directory nor a regular file"
        )));
    }
    if meta.is_dir() {
        // Fail here, with a status the host can answer, rather than after the archive began.
        fs::read_dir(path).map_err(|e| FilesError::io(format!("reading directory {path}"), e))?;
    }
    Ok(Tree {
        path: PathBuf::from(path),
        meta,
    })
}

/// Sends `tree` to `out` as `stdout` frames and ends with the `exit` frame. An error writing to
/// `out` (the host went away) is returned; an error reading the tree ends the stream with an
/// `error` reply in the exit frame instead.
pub fn send_tree<W: Write>(tree: &Tree, out: W) -> io::Result<()> {
    let mut frames = BufWriter::with_capacity(MAX_PAYLOAD, StdoutFrames(FrameWriter::new(out)));
    let outcome = archive(tree, &mut frames);
    let reply = match outcome {
        Ok(summary) => AgentReply::TreeSent(summary),
        Err(ArchiveError::Write(e)) => return Err(e),
        Err(ArchiveError::Read(e)) => AgentReply::Error(e.to_body()),
    };
    frames.flush()?;
    let payload = serde_json::to_vec(&reply).map_err(io::Error::other)?;
    let mut frames = frames.into_inner().map_err(|e| e.into_error())?.0;
    frames.write_data(FrameType::Exit, &payload)?;
    frames.flush()
}

/// Writes into consecutive `stdout` frames.
struct StdoutFrames<W: Write>(FrameWriter<W>);

impl<W: Write> Write for StdoutFrames<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.0.write_data(FrameType::Stdout, buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// Why an archive stopped.
#[derive(Debug)]
enum ArchiveError {
    /// Reading the tree failed: the host is told why in the exit frame.
    Read(FilesError),
    /// Writing to the host failed: nobody is left to tell.
    Write(io::Error),
}

/// Which side of the copy an `io::Error` from the tar builder came from.
struct TrackedWriter<'a, W: Write> {
    inner: &'a mut W,
    failed: Option<io::ErrorKind>,
}

impl<W: Write> Write for TrackedWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner
            .write(buf)
            .inspect_err(|e| self.failed = Some(e.kind()))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner
            .flush()
            .inspect_err(|e| self.failed = Some(e.kind()))
    }
}

/// Walks `tree` into a tar archive written to `out`.
fn archive<W: Write>(tree: &Tree, out: &mut W) -> Result<TreeSummary, ArchiveError> {
    let mut builder = tar::Builder::new(TrackedWriter {
        inner: out,
        failed: None,
    });
    let result = Walk {
        summary: TreeSummary::default(),
    }
    .run(tree, &mut builder)
    .and_then(|summary| builder.finish().map(|()| summary));
    let write_failed = builder.get_ref().failed.is_some();
    result.map_err(|e| {
        if write_failed {
            ArchiveError::Write(e)
        } else {
            ArchiveError::Read(FilesError::io(
                format!("archiving {}", tree.path.display()),
                e,
            ))
        }
    })
}

/// The walk's running count.
struct Walk {
    summary: TreeSummary,
}

impl Walk {
    fn run<W: Write>(
        mut self,
        tree: &Tree,
        builder: &mut tar::Builder<W>,
    ) -> io::Result<TreeSummary> {
        if tree.meta.is_file() {
            let name = tree.path.file_name().map(PathBuf::from).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "the path names no file")
            })?;
            let file = File::open(&tree.path)?;
            let meta = file.metadata()?;
            self.file(builder, &name, file, &meta)?;
            return Ok(self.summary);
        }
        // The top directory as `./`, so that its mode and time travel too.
        self.directory(builder, Path::new("."), &tree.meta)?;
        let mut open: Vec<(ReadDir, PathBuf)> = vec![(fs::read_dir(&tree.path)?, PathBuf::new())];
        while let Some((entries, relative)) = open.last_mut() {
            let Some(entry) = entries.next() else {
                open.pop();
                continue;
            };
            let entry = entry?;
            let name = relative.join(entry.file_name());
            let on_disk = tree.path.join(&name);
            let meta = match fs::symlink_metadata(&on_disk) {
                Ok(meta) => meta,
                // Deleted since the directory was listed: a build still cleaning up.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(named(e, &on_disk)),
            };
            let kind = meta.file_type();
            if kind.is_dir() {
                if open.len() >= MAX_DEPTH {
                    return Err(io::Error::other(format!(
                        "{} is nested deeper than {MAX_DEPTH} directories",
                        on_disk.display()
                    )));
                }
                self.directory(builder, &name, &meta)?;
                let children = match fs::read_dir(&on_disk) {
                    Ok(children) => children,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(named(e, &on_disk)),
                };
                open.push((children, name));
            } else if kind.is_symlink() {
                let target = match fs::read_link(&on_disk) {
                    Ok(target) => target,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(named(e, &on_disk)),
                };
                let mut header = header_for(&meta);
                header.set_size(0);
                builder.append_link(&mut header, &name, &target)?;
                self.summary.links += 1;
            } else if kind.is_file() {
                let file = match OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                    .open(&on_disk)
                {
                    Ok(file) => file,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(named(e, &on_disk)),
                };
                let meta = file.metadata()?;
                if meta.is_file() {
                    self.file(builder, &name, file, &meta)?;
                } else {
                    // Swapped for something else between the listing and the open.
                    self.special(builder, &name, &meta)?;
                }
            } else if kind.is_socket() {
                self.summary.sockets_skipped += 1;
            } else {
                self.special(builder, &name, &meta)?;
            }
        }
        Ok(self.summary)
    }

    fn directory<W: Write>(
        &mut self,
        builder: &mut tar::Builder<W>,
        name: &Path,
        meta: &Metadata,
    ) -> io::Result<()> {
        let mut header = header_for(meta);
        header.set_entry_type(EntryType::Directory);
        header.set_size(0);
        builder.append_data(&mut header, name, io::empty())?;
        self.summary.dirs += 1;
        Ok(())
    }

    fn file<W: Write>(
        &mut self,
        builder: &mut tar::Builder<W>,
        name: &Path,
        file: File,
        meta: &Metadata,
    ) -> io::Result<()> {
        let mut header = header_for(meta);
        header.set_entry_type(EntryType::Regular);
        header.set_size(meta.len());
        let contents = Exactly {
            file,
            left: meta.len(),
            name: name.to_path_buf(),
        };
        builder.append_data(&mut header, name, contents)?;
        self.summary.files += 1;
        self.summary.bytes += meta.len();
        Ok(())
    }

    fn special<W: Write>(
        &mut self,
        builder: &mut tar::Builder<W>,
        name: &Path,
        meta: &Metadata,
    ) -> io::Result<()> {
        let mut header = header_for(meta);
        header.set_size(0);
        let kind = meta.file_type();
        if kind.is_char_device() || kind.is_block_device() {
            let (major, minor) = split_device(meta.rdev());
            header.set_device_major(major)?;
            header.set_device_minor(minor)?;
        }
        builder.append_data(&mut header, name, io::empty())?;
        self.summary.special += 1;
        Ok(())
    }
}

/// A GNU header with the entry's mode, owner, time and type (GNU: long names and link targets
/// go in extension records, so no name is too long).
fn header_for(meta: &Metadata) -> Header {
    let mut header = Header::new_gnu();
    header.set_metadata_in_mode(meta, HeaderMode::Complete);
    header
}

/// Linux's `dev_t` split into major and minor, as glibc's `major(3)`/`minor(3)` do.
fn split_device(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

fn named(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// A file's contents, exactly as many bytes as its header announced, or an error.
struct Exactly {
    file: File,
    left: u64,
    name: PathBuf,
}

impl Read for Exactly {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.file.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{} shrank by {} bytes while it was archived",
                    self.name.display(),
                    self.left
                ),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    /// Reads the frames `send_tree` wrote: the archive's bytes and the exit frame's reply.
    fn unframe(mut bytes: &[u8]) -> (Vec<u8>, AgentReply) {
        let mut archive = Vec::new();
        loop {
            let (kind, len) = (
                bytes[0],
                u32::from_be_bytes(bytes[4..8].try_into().expect("in a test")),
            );
            let payload = &bytes[8..8 + len as usize];
            bytes = &bytes[8 + len as usize..];
            match kind {
                1 => archive.extend_from_slice(payload),
                3 => {
                    assert!(bytes.is_empty(), "nothing follows the exit frame");
                    return (archive, serde_json::from_slice(payload).expect("in a test"));
                }
                other => panic!("unexpected frame type {other}"),
            }
        }
    }

    fn send(path: &Path) -> (Vec<u8>, AgentReply) {
        let tree = open_tree(path.to_str().expect("in a test")).expect("in a test");
        let mut out = Vec::new();
        send_tree(&tree, &mut out).expect("in a test");
        unframe(&out)
    }

    #[test]
    fn a_directory_arrives_whole_with_modes_times_and_links_unfollowed() {
        let dir = tempfile::tempdir().expect("in a test");
        let top = dir.path().join("build");
        fs::create_dir_all(top.join("bin/deep")).expect("in a test");
        fs::write(top.join("bin/tool"), b"#!/bin/sh\necho hi\n").expect("in a test");
        fs::set_permissions(top.join("bin/tool"), fs::Permissions::from_mode(0o755))
            .expect("in a test");
        fs::write(top.join("bin/deep/big"), vec![7u8; 200_000]).expect("in a test");
        let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        File::options()
            .write(true)
            .open(top.join("bin/deep/big"))
            .expect("in a test")
            .set_modified(old)
            .expect("in a test");
        fs::write(dir.path().join("outside"), b"secret").expect("in a test");
        symlink("../outside", top.join("escape")).expect("in a test");
        let long = "n".repeat(150);
        fs::write(top.join("bin/deep").join(&long), b"x").expect("in a test");

        let (archive, reply) = send(&top);
        assert_eq!(
            reply,
            AgentReply::TreeSent(TreeSummary {
                files: 3,
                dirs: 3,
                links: 1,
                bytes: 18 + 200_000 + 1,
                ..Default::default()
            })
        );
        let mut seen = std::collections::BTreeMap::new();
        for entry in tar::Archive::new(archive.as_slice())
            .entries()
            .expect("in a test")
        {
            let mut entry = entry.expect("in a test");
            let path = entry.path().expect("in a test").into_owned();
            let header = entry.header().clone();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).expect("in a test");
            seen.insert(path, (header, data));
        }
        let (tool, data) = &seen[Path::new("bin/tool")];
        assert_eq!(tool.mode().expect("in a test") & 0o777, 0o755);
        assert_eq!(data, b"#!/bin/sh\necho hi\n");
        let (big, data) = &seen[Path::new("bin/deep/big")];
        assert_eq!(big.mtime().expect("in a test"), 1_000_000);
        assert_eq!(data.len(), 200_000);
        let (link, data) = &seen[Path::new("escape")];
        assert_eq!(link.entry_type(), EntryType::Symlink);
        assert_eq!(
            link.link_name().expect("in a test").expect("in a test"),
            Path::new("../outside")
        );
        assert!(data.is_empty(), "the link's target is not read");
        assert!(seen.contains_key(&Path::new("bin/deep").join(&long)));
        assert!(seen
            .keys()
            .any(|p| p == Path::new(".") || p == Path::new("./")));
    }

    #[test]
    fn a_file_alone_is_an_archive_of_one_entry_named_after_it() {
        let dir = tempfile::tempdir().expect("in a test");
        fs::write(dir.path().join("report.xml"), b"<ok/>").expect("in a test");
        let (archive, reply) = send(&dir.path().join("report.xml"));
        assert!(matches!(reply, AgentReply::TreeSent(s) if s.files == 1 && s.bytes == 5));
        let mut entries = tar::Archive::new(archive.as_slice());
        let names: Vec<PathBuf> = entries
            .entries()
            .expect("in a test")
            .map(|e| {
                e.expect("in a test")
                    .path()
                    .expect("in a test")
                    .into_owned()
            })
            .collect();
        assert_eq!(names, [PathBuf::from("report.xml")]);
    }

    #[test]
    fn sockets_are_counted_and_left_out_fifos_are_headers_never_read() {
        let dir = tempfile::tempdir().expect("in a test");
        let _socket =
            std::os::unix::net::UnixListener::bind(dir.path().join("sock")).expect("in a test");
        let fifo = std::ffi::CString::new(dir.path().join("pipe").to_str().expect("in a test"))
            .expect("in a test");
        // SAFETY: `fifo` is a valid NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let (archive, reply) = send(dir.path());
        assert!(
            matches!(reply, AgentReply::TreeSent(s) if s.sockets_skipped == 1 && s.special == 1),
            "{reply:?}"
        );
        let kinds: Vec<EntryType> = tar::Archive::new(archive.as_slice())
            .entries()
            .expect("in a test")
            .map(|e| e.expect("in a test").header().entry_type())
            .collect();
        assert!(kinds.contains(&EntryType::Fifo), "{kinds:?}");
    }

    #[test]
    fn what_is_missing_or_not_a_tree_is_refused_before_any_frame() {
        assert!(matches!(
            open_tree("/no/such/dir"),
            Err(FilesError::NotFound(_))
        ));
        assert!(matches!(open_tree("relative"), Err(FilesError::Invalid(_))));
        assert!(matches!(
            open_tree("/dev/null"),
            Err(FilesError::Invalid(_))
        ));
    }

    #[test]
    fn a_file_that_shrinks_mid_read_ends_the_archive_with_an_error() {
        let dir = tempfile::tempdir().expect("in a test");
        let path = dir.path().join("log");
        fs::write(&path, b"0123456789").expect("in a test");
        let mut contents = Exactly {
            file: File::open(&path).expect("in a test"),
            left: 20,
            name: PathBuf::from("log"),
        };
        let mut out = Vec::new();
        let err = io::copy(&mut contents, &mut out).expect_err("a short file is an error");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(err.to_string().contains("log shrank by 10 bytes"), "{err}");
    }

    #[test]
    fn device_numbers_split_as_glibc_does() {
        // glibc's makedev(3): the low bits of each number first, the high bits above them.
        let makedev = |major: u64, minor: u64| {
            (minor & 0xff)
                | ((major & 0xfff) << 8)
                | ((minor & !0xff) << 12)
                | ((major & !0xfff) << 32)
        };
        assert_eq!(split_device(makedev(1, 3)), (1, 3));
        assert_eq!(split_device(makedev(259, 0x12345)), (259, 0x12345));
        assert_eq!(split_device(makedev(0x5000, 7)), (0x5000, 7));
    }
}
