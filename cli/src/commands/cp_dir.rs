//! `crucible cp ID:DIR LOCAL`: a sandbox directory, whole, with modes and times, downloaded as
//! the files endpoint's tar stream (`Accept: application/x-tar`). The sandbox's agent writes
//! that archive, and a sandbox runs hostile code as root, so the archive is the sandbox's to
//! forge: it is read as hostile input. Only directories, regular files and
//! symbolic links are made, each strictly beneath the destination: an absolute name, a `..`,
//! a name under a symbolic link the archive made, a hard link or a device is skipped (and
//! counted); modes lose setuid, setgid and sticky; nothing is ever written through a link.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use serde::Serialize;

/// What a directory download made.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Extracted {
    /// Regular files written.
    pub files: u64,
    /// Directories made (the destination included).
    pub dirs: u64,
    /// Symbolic links made.
    pub links: u64,
    /// Bytes of the files written.
    pub bytes: u64,
    /// Entries not made, each with why.
    pub skipped: Vec<String>,
}

/// Most skipped entries listed (the rest are counted in the last line).
const MAX_SKIPPED_LISTED: usize = 20;

/// Downloads the sandbox directory `dir` into `target` (made; it must not exist yet).
pub(crate) async fn download(
    client: &client::Client,
    id: &str,
    dir: &str,
    target: &Path,
) -> Result<Extracted> {
    let spool = tempfile::tempfile().context("a temporary file for the archive")?;
    let mut writer = tokio::fs::File::from_std(
        spool
            .try_clone()
            .context("a second handle on the archive's temporary file")?,
    );
    client.download_tree(id, dir, &mut writer).await?;
    drop(writer);
    let mut spool = spool;
    spool.rewind().context("reading the archive back")?;
    let target = target.to_path_buf();
    tokio::task::spawn_blocking(move || extract(spool, &target))
        .await
        .context("the extraction's thread")?
}

/// Makes `target` and the archive's entries beneath it (see the module's documentation).
pub(crate) fn extract(archive: impl Read, target: &Path) -> Result<Extracted> {
    fs::create_dir(target).with_context(|| format!("creating {}", target.display()))?;
    let mut made = Extracted {
        dirs: 1,
        ..Extracted::default()
    };
    // Directories get their modes and times last: a read-only one must still take its files.
    let mut dirs: Vec<(PathBuf, u32, Option<SystemTime>)> = Vec::new();
    let mut skipped = 0usize;
    let mut skip = |made: &mut Extracted, name: &str, why: &str| {
        skipped += 1;
        if made.skipped.len() < MAX_SKIPPED_LISTED {
            made.skipped
                .push(format!("{}: {why}", crate::output::escape(name)));
        }
    };
    let mut archive = tar::Archive::new(archive);
    for entry in archive.entries().context("reading the archive")? {
        let mut entry = entry.context("reading the archive")?;
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let Some(rel) = relative(&entry.path().context("an entry's name")?) else {
            skip(&mut made, &name, "a name outside the directory");
            continue;
        };
        if rel.as_os_str().is_empty() {
            // `.`: the directory itself.
            let mode = entry.header().mode().unwrap_or(0o755);
            dirs.push((target.to_path_buf(), mode, mtime(&entry)));
            continue;
        }
        let path = target.join(&rel);
        if !parents_are_real_directories(target, &rel) {
            skip(
                &mut made,
                &name,
                "beneath something that is not a directory it made",
            );
            continue;
        }
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                match fs::symlink_metadata(&path) {
                    Ok(meta) if meta.is_dir() => {}
                    Ok(_) => {
                        skip(
                            &mut made,
                            &name,
                            "a directory where something else was made",
                        );
                        continue;
                    }
                    Err(_) => {
                        fs::create_dir(&path)
                            .with_context(|| format!("creating {}", path.display()))?;
                        made.dirs += 1;
                    }
                }
                dirs.push((path, mode, mtime(&entry)));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                // O_EXCL | O_NOFOLLOW: never through a link, never over what is there.
                let mut file = match OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .mode(0o600)
                    .open(&path)
                {
                    Ok(file) => file,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        skip(&mut made, &name, "named twice");
                        continue;
                    }
                    Err(e) => {
                        return Err(e).with_context(|| format!("creating {}", path.display()))
                    }
                };
                let n = io::copy(&mut entry, &mut file)
                    .with_context(|| format!("writing {}", path.display()))?;
                if let Some(time) = mtime(&entry) {
                    file.set_modified(time)
                        .with_context(|| format!("setting the time of {}", path.display()))?;
                }
                file.set_permissions(fs::Permissions::from_mode(mode))
                    .with_context(|| format!("setting the mode of {}", path.display()))?;
                made.files += 1;
                made.bytes += n;
            }
            tar::EntryType::Symlink => {
                let Some(to) = entry.link_name().ok().flatten() else {
                    skip(&mut made, &name, "a link to nothing");
                    continue;
                };
                match std::os::unix::fs::symlink(&to, &path) {
                    Ok(()) => made.links += 1,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        skip(&mut made, &name, "named twice")
                    }
                    Err(e) => return Err(e).with_context(|| format!("linking {}", path.display())),
                }
            }
            tar::EntryType::Link => skip(&mut made, &name, "a hard link (not made)"),
            other => skip(&mut made, &name, &format!("a {other:?} entry (not made)")),
        }
    }
    // Deepest first, so a parent's time is set after its children changed it.
    dirs.sort_by_key(|(path, ..)| std::cmp::Reverse(path.components().count()));
    for (path, mode, time) in dirs {
        if let Some(time) = time {
            if let Ok(dir) = File::open(&path) {
                let _ = dir.set_modified(time);
            }
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o777))
            .with_context(|| format!("setting the mode of {}", path.display()))?;
    }
    if skipped > made.skipped.len() {
        made.skipped
            .push(format!("… and {} more", skipped - made.skipped.len()));
    }
    Ok(made)
}

/// `name` as a path beneath the destination: only normal components (a leading `./` and
/// inner `.` dropped); `None` for an absolute name or one with `..`.
fn relative(name: &Path) -> Option<PathBuf> {
    let mut rel = PathBuf::new();
    for component in name.components() {
        match component {
            Component::Normal(part) => rel.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(rel)
}

/// Whether every directory above `rel` beneath `target` is a real directory (never a link).
fn parents_are_real_directories(target: &Path, rel: &Path) -> bool {
    let mut at = target.to_path_buf();
    let Some(parent) = rel.parent() else {
        return true;
    };
    for part in parent.components() {
        at.push(part);
        match fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_dir() => {}
            _ => return false,
        }
    }
    true
}

/// The entry's modification time.
fn mtime<R: Read>(entry: &tar::Entry<'_, R>) -> Option<SystemTime> {
    let seconds = entry.header().mtime().ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        build(&mut builder);
        builder.into_inner().expect("an archive")
    }

    fn entry(
        b: &mut tar::Builder<Vec<u8>>,
        kind: tar::EntryType,
        name: &[u8],
        link: &str,
        mode: u32,
        data: &[u8],
    ) {
        let mut header = tar::Header::new_old();
        // Written raw: the builder refuses `..` and absolute names, which a forged one has.
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_mtime(1_577_934_245);
        header.set_size(data.len() as u64);
        if !link.is_empty() {
            header.set_link_name(link).expect("link name");
        }
        header.set_cksum();
        b.append(&header, data).expect("append");
    }

    #[test]
    fn a_forged_archive_makes_nothing_outside_and_nothing_setuid() {
        let outside = tempfile::tempdir().expect("tempdir");
        let target = outside.path().join("out");
        use tar::EntryType::{Directory, Link, Regular, Symlink};
        let forged = archive(|b| {
            entry(b, Directory, b"./", "", 0o755, b"");
            entry(b, Regular, b"./bin/tool", "", 0o6755, b"#!/bin/sh\n");
            entry(b, Directory, b"./bin/", "", 0o755, b"");
            entry(b, Regular, b"./bin/tool", "", 0o6755, b"#!/bin/sh\n");
            entry(b, Regular, b"../escaped", "", 0o644, b"x");
            entry(b, Regular, b"/abs-escaped", "", 0o644, b"x");
            entry(b, Symlink, b"./up", "..", 0o777, b"");
            entry(b, Regular, b"./up/through-link", "", 0o644, b"x");
            entry(b, Symlink, b"./etc", "/etc", 0o777, b"");
            entry(b, Regular, b"./etc/written", "", 0o644, b"x");
            entry(b, Link, b"./hard", "/etc/passwd", 0o644, b"");
            entry(b, Regular, b"./bin/tool", "", 0o644, b"again");
        });
        let made = extract(&forged[..], &target).expect("extracted");
        let tool = target.join("bin/tool");
        assert_eq!(fs::read(&tool).expect("tool"), b"#!/bin/sh\n");
        let meta = fs::metadata(&tool).expect("tool");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o755, "never setuid");
        assert_eq!(
            meta.modified().expect("mtime"),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_577_934_245)
        );
        assert!(!outside.path().join("escaped").exists());
        assert!(!Path::new("/abs-escaped").exists());
        assert!(!outside.path().join("through-link").exists());
        assert!(!Path::new("/etc/written").exists());
        assert!(!target.join("hard").exists(), "no hard link made");
        assert_eq!((made.files, made.links, made.dirs), (1, 2, 2), "{made:?}");
        // The tool before its directory, the escapes, the writes through links, the hard
        // link and the second tool.
        assert_eq!(made.skipped.len(), 7, "{:?}", made.skipped);
        assert!(made
            .skipped
            .iter()
            .any(|s| s.starts_with("./hard: a hard link")));
    }

    #[test]
    fn relative_names_stay_beneath() {
        assert_eq!(relative(Path::new("./a/./b")), Some(PathBuf::from("a/b")));
        assert_eq!(relative(Path::new(".")), Some(PathBuf::new()));
        assert_eq!(relative(Path::new("a/../../b")), None);
        assert_eq!(relative(Path::new("/etc")), None);
    }
}
