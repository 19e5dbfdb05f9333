//! Pass 2: creating one member inside the root, replacing what is at its path.

use std::collections::VecDeque;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{self as rfs, AtFlags, FileType, Gid, Mode, OFlags, Uid};
use rustix::io::Errno;

use super::entry_path::{self, RelPath, Target};
use super::fs_ops;
use super::members::{kind_of, Kind, Member};
use super::{c_name, io_error, shown, target_of, Budget, LayerStats, Limit, UnpackError};

/// Pass 2: creates the member (whiteouts and the root itself are skipped).
pub(super) fn create_member(
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
    let mut remaining: VecDeque<Vec<u8>> = parent.iter().map(|c| c.to_vec()).collect();
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
pub(super) fn copy_counted(
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
