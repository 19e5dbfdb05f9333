//! The agent's tar extraction (`guest_init::files::put_files`, the `put_files` request) into a
//! scratch directory, with an invariant check of what ends up on disk.
//!
//! Layout per process: `<tmp>/crucible-fuzz-tar-<pid>/{dest/, outside/secret}`. Each input is
//! extracted into a fresh `dest/`. Checked afterwards:
//! - nothing was written outside `dest/`: the scratch directory holds exactly `dest` and
//!   `outside`, `outside` holds exactly `secret`, unchanged, still a regular file with one link
//!   (no hardlink to it was made from inside);
//! - every symlink in `dest/` resolves (lexically, from its directory) inside `dest/`, and no
//!   device node or fifo exists there;
//! - every path the result reports as written exists, and the counts add up.
//!
//! Fuzzers rarely get a tar header's checksum right, so the input's headers have their
//! checksums recomputed first (walking the archive as a reader would): the extractor's logic is
//! what is being tested, not the checksum check (which the tar crate does).

#![no_main]

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

const BLOCK: usize = 512;
const SECRET: &[u8] = b"outside the destination\n";

fn scratch() -> &'static PathBuf {
    static SCRATCH: OnceLock<PathBuf> = OnceLock::new();
    SCRATCH.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("crucible-fuzz-tar-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(base.join("outside")).expect("scratch directory");
        fs::write(base.join("outside/secret"), SECRET).expect("secret file");
        base
    })
}

/// Parses a tar numeric field: octal text, or GNU base-256 when the top bit is set.
fn tar_number(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut n: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            n = n.checked_mul(256)?.checked_add(u64::from(b))?;
        }
        return Some(n);
    }
    let text = std::str::from_utf8(field).ok()?;
    let text = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(text, 8).ok()
}

/// Rewrites the checksum of every header a reader would visit.
fn fix_checksums(archive: &mut [u8]) {
    let mut at = 0;
    while at + BLOCK <= archive.len() {
        let header = &mut archive[at..at + BLOCK];
        if header.iter().all(|&b| b == 0) {
            return;
        }
        header[148..156].fill(b' ');
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        let text = format!("{sum:06o}\0 ");
        header[148..156].copy_from_slice(text.as_bytes());
        let Some(size) = tar_number(&header[124..136]) else {
            return;
        };
        let Some(next) = usize::try_from(size)
            .ok()
            .and_then(|s| s.checked_next_multiple_of(BLOCK))
            .and_then(|s| (at + BLOCK).checked_add(s))
        else {
            return;
        };
        at = next;
    }
}

/// Makes every directory beneath `dir` writable again (the archive may have set mode 0) and
/// removes it.
fn scrub(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = fs::set_permissions(entry.path(), fs::Permissions::from_mode(0o700));
                scrub(&entry.path());
            }
        }
    }
}

fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir => out.push("/"),
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
        }
    }
    Some(out)
}

/// Walks `dir` without following symlinks, checking each entry.
fn check_tree(root: &Path, dir: &Path) {
    for entry in fs::read_dir(dir).expect("readable extracted directory") {
        let entry = entry.expect("directory entry");
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).expect("lstat");
        let kind = meta.file_type();
        assert!(
            !kind.is_fifo()
                && !kind.is_char_device()
                && !kind.is_block_device()
                && !kind.is_socket(),
            "special file extracted at {}",
            path.display()
        );
        if kind.is_symlink() {
            let target = fs::read_link(&path).expect("readlink");
            let resolved = if target.is_absolute() {
                normalize(&target)
            } else {
                normalize(&dir.join(&target))
            };
            assert!(
                resolved.is_some_and(|r| r.starts_with(root)),
                "symlink {} -> {} escapes the destination",
                path.display(),
                target.display()
            );
        } else if kind.is_dir() {
            check_tree(root, &path);
        }
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("readable scratch directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fuzz_target!(|data: &[u8]| {
    let base = scratch();
    let dest = base.join("dest");
    scrub(&dest);
    let _ = fs::remove_dir_all(&dest);

    let mut archive = data.to_vec();
    fix_checksums(&mut archive);
    let dest_str = dest.to_str().expect("UTF-8 scratch path");
    let result = guest_init::files::put_files(&archive[..], dest_str);

    assert_eq!(
        names(base),
        ["dest", "outside"],
        "something was written outside dest/"
    );
    assert_eq!(names(&base.join("outside")), ["secret"], "outside/ changed");
    let secret = fs::symlink_metadata(base.join("outside/secret")).expect("secret exists");
    assert!(secret.file_type().is_file(), "outside/secret was replaced");
    assert_eq!(
        secret.nlink(),
        1,
        "outside/secret was hardlinked into dest/"
    );
    assert_eq!(
        fs::read(base.join("outside/secret")).expect("read secret"),
        SECRET
    );

    let root = fs::canonicalize(&dest).expect("dest exists");
    check_tree(&root, &root);

    if let Ok(result) = result {
        assert_eq!(
            result.files + result.dirs + result.links,
            result.written.len() as u64,
            "counts disagree with the written list"
        );
        for written in &result.written {
            if written.contains(char::REPLACEMENT_CHARACTER) {
                continue; // A non-UTF-8 name, reported lossily: it cannot be looked up.
            }
            let path = root.join(written);
            assert!(path.starts_with(&root));
            assert!(
                fs::symlink_metadata(&path).is_ok(),
                "reported {written} as written but it is not there"
            );
        }
    }
});
