//! put_files and get_file against the real binary, including hostile archives.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{Agent, TempDir};
use tar::{EntryType, Header};
use wire::agent::{AgentReply, AgentRequest};
use wire::FilesPutResult;

/// Appends an entry written header-first, so that names the tar crate's builder would refuse
/// (absolute, `..`) can be produced.
fn raw(
    b: &mut tar::Builder<Vec<u8>>,
    name: &str,
    kind: EntryType,
    link: Option<&str>,
    data: &[u8],
) {
    let mut h = Header::new_gnu();
    {
        let gnu = h.as_gnu_mut().expect("gnu header");
        gnu.name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(l) = link {
            gnu.linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
    }
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(if kind == EntryType::Directory {
        0o755
    } else {
        0o644
    });
    h.set_mtime(0);
    h.set_cksum();
    b.append(&h, data).expect("append");
}

fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    build(&mut b);
    b.into_inner().expect("finish archive")
}

fn put(agent: &Agent, dest: &Path, tar: &[u8]) -> AgentReply {
    let mut s = agent.send(&AgentRequest::PutFiles {
        path: dest.to_string_lossy().into_owned(),
    });
    s.write_all(tar).expect("send archive");
    s.shutdown(std::net::Shutdown::Write).expect("half-close");
    wire::read_message(&mut s).expect("reply")
}

fn put_ok(agent: &Agent, dest: &Path, tar: &[u8]) -> FilesPutResult {
    match put(agent, dest, tar) {
        AgentReply::Files(r) => r,
        other => panic!("expected files reply, got {other:?}"),
    }
}

fn entries_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    out
}

#[test]
fn put_files_extracts_files_dirs_and_links() {
    let agent = Agent::start();
    let tmp = TempDir::new("put");
    let dest = tmp.path().join("dest/new");
    let tar = archive(|b| {
        raw(b, "./", EntryType::Directory, None, b"");
        raw(b, "d/", EntryType::Directory, None, b"");
        let mut h = Header::new_gnu();
        h.set_path("d/run.sh").expect("path");
        h.set_size(13);
        h.set_mode(0o755);
        h.set_cksum();
        b.append(&h, &b"#!/bin/sh\n:\n\n"[..]).expect("append");
        raw(b, "d/link", EntryType::Symlink, Some("run.sh"), b"");
        raw(b, "d/hard", EntryType::Link, Some("d/run.sh"), b"");
        raw(b, "a/b/c.txt", EntryType::Regular, None, b"nested");
    });
    let r = put_ok(&agent, &dest, &tar);
    assert_eq!(r.refused, None);
    assert_eq!((r.files, r.dirs, r.links, r.bytes), (2, 1, 2, 19));
    assert_eq!(
        r.written,
        ["d", "d/run.sh", "d/link", "d/hard", "a/b/c.txt"]
    );
    assert_eq!(r.path, dest.to_string_lossy());
    let run = dest.join("d/run.sh");
    assert_eq!(std::fs::read(&run).expect("run.sh"), b"#!/bin/sh\n:\n\n");
    assert_eq!(
        std::fs::metadata(&run).expect("meta").permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::read_link(dest.join("d/link")).expect("symlink"),
        Path::new("run.sh")
    );
    assert_eq!(
        std::fs::metadata(dest.join("d/hard")).expect("hard").ino(),
        std::fs::metadata(&run).expect("run").ino()
    );
    assert_eq!(
        std::fs::read(dest.join("a/b/c.txt")).expect("nested"),
        b"nested"
    );
}

#[test]
fn put_files_refuses_every_escape_and_writes_nothing_outside() {
    let agent = Agent::start();
    let tmp = TempDir::new("escape");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("target"), b"original").expect("target");
    let out = outside.to_string_lossy().into_owned();

    type Build = Box<dyn Fn(&mut tar::Builder<Vec<u8>>)>;
    let abs = format!("{out}/abs");
    let cases: Vec<(&str, Build, &str)> = vec![
        (
            "absolute name",
            Box::new(move |b| raw(b, &abs, EntryType::Regular, None, b"x")),
            "absolute",
        ),
        (
            "dotdot",
            Box::new(|b| raw(b, "../outside/dotdot", EntryType::Regular, None, b"x")),
            "..",
        ),
        (
            "dotdot inside",
            Box::new(|b| raw(b, "a/../../outside/x", EntryType::Regular, None, b"x")),
            "..",
        ),
        (
            "absolute symlink",
            {
                let o = out.clone();
                Box::new(move |b| raw(b, "evil", EntryType::Symlink, Some(&o), b""))
            },
            "escapes",
        ),
        (
            "relative symlink",
            Box::new(|b| {
                raw(
                    b,
                    "sub/evil",
                    EntryType::Symlink,
                    Some("../../outside"),
                    b"",
                )
            }),
            "escapes",
        ),
        (
            "hardlink with dotdot",
            Box::new(|b| raw(b, "hl", EntryType::Link, Some("../outside/target"), b"")),
            "escapes",
        ),
        (
            "absolute hardlink",
            {
                let t = format!("{out}/target");
                Box::new(move |b| raw(b, "hl", EntryType::Link, Some(&t), b""))
            },
            "escapes",
        ),
        (
            "char device",
            Box::new(|b| raw(b, "null", EntryType::Char, None, b"")),
            "device",
        ),
        (
            "block device",
            Box::new(|b| raw(b, "vda", EntryType::Block, None, b"")),
            "device",
        ),
        (
            "fifo",
            Box::new(|b| raw(b, "pipe", EntryType::Fifo, None, b"")),
            "fifo",
        ),
        (
            "write through an archive symlink",
            Box::new(|b| {
                raw(b, "link", EntryType::Symlink, Some("."), b"");
                raw(b, "link/x", EntryType::Regular, None, b"x");
            }),
            "symlink",
        ),
        (
            "symlink chain",
            Box::new(|b| {
                raw(b, "x/c", EntryType::Symlink, Some(".."), b"");
                raw(b, "a", EntryType::Symlink, Some("x/c/.."), b"");
                raw(b, "a/pwned", EntryType::Regular, None, b"x");
            }),
            "symlink",
        ),
        (
            "write through an existing symlink",
            Box::new(|b| raw(b, "pre/x", EntryType::Regular, None, b"x")),
            "symlink",
        ),
        (
            "hardlink through an existing symlink",
            Box::new(|b| raw(b, "hl2", EntryType::Link, Some("pre/target"), b"")),
            "symlink",
        ),
    ];
    for (i, (what, build, reason)) in cases.into_iter().enumerate() {
        let dest = tmp.path().join(format!("dest{i}"));
        std::fs::create_dir_all(&dest).expect("dest");
        std::os::unix::fs::symlink(&outside, dest.join("pre")).expect("pre-existing symlink");
        let tar = archive(|b| {
            raw(b, "first.txt", EntryType::Regular, None, b"ok");
            build(b);
            raw(b, "after.txt", EntryType::Regular, None, b"never");
        });
        let r = put_ok(&agent, &dest, &tar);
        let refused = r
            .refused
            .unwrap_or_else(|| panic!("{what}: not refused: {:?}", r.written));
        assert!(
            refused.reason.contains(reason),
            "{what}: reason {:?}",
            refused.reason
        );
        assert_eq!(
            r.written[0], "first.txt",
            "{what}: entries before the refusal are kept"
        );
        assert!(
            !r.written.iter().any(|w| w == "after.txt"),
            "{what}: extraction stopped"
        );
        assert!(!dest.join("after.txt").exists(), "{what}");
        assert_eq!(entries_under(&outside), ["target"], "{what}: wrote outside");
        assert_eq!(
            std::fs::read(outside.join("target")).expect("target"),
            b"original",
            "{what}"
        );
    }
    assert!(!tmp.path().join("dotdot").exists());
}

#[test]
fn put_files_replaces_an_existing_symlink_instead_of_following_it() {
    let agent = Agent::start();
    let tmp = TempDir::new("replace");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("target"), b"original").expect("target");
    let dest = tmp.path().join("dest");
    std::fs::create_dir_all(&dest).expect("dest");
    std::os::unix::fs::symlink(outside.join("target"), dest.join("victim")).expect("symlink");
    let tar = archive(|b| raw(b, "victim", EntryType::Regular, None, b"new"));
    let r = put_ok(&agent, &dest, &tar);
    assert_eq!(r.refused, None);
    assert_eq!(
        std::fs::read(outside.join("target")).expect("target"),
        b"original"
    );
    let meta = std::fs::symlink_metadata(dest.join("victim")).expect("victim");
    assert!(meta.is_file());
    assert_eq!(std::fs::read(dest.join("victim")).expect("victim"), b"new");
}

fn expect_error(reply: AgentReply, code: &str) {
    match reply {
        AgentReply::Error(e) => assert_eq!(e.code, code, "{}", e.message),
        other => panic!("expected {code}, got {other:?}"),
    }
}

#[test]
fn put_files_reports_bad_destinations() {
    let agent = Agent::start();
    let tmp = TempDir::new("baddest");
    let file = tmp.path().join("file");
    std::fs::write(&file, b"x").expect("file");
    let tar = archive(|b| raw(b, "a", EntryType::Regular, None, b"x"));
    expect_error(
        put(&agent, Path::new("relative/dir"), &tar),
        "invalid_request",
    );
    expect_error(put(&agent, &file, &tar), "invalid_request");

    let nobody = Agent::start_as_nobody();
    let locked = tmp.path().join("locked");
    std::fs::create_dir_all(&locked).expect("locked");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    expect_error(put(&nobody, &locked.join("sub"), &tar), "permission_denied");
}

fn get(agent: &Agent, path: &str) -> Result<Vec<u8>, Box<AgentReply>> {
    let mut s = agent.send(&AgentRequest::GetFile { path: path.into() });
    match wire::read_message(&mut s).expect("reply") {
        AgentReply::File { size, .. } => {
            let mut data = Vec::new();
            s.read_to_end(&mut data).expect("file bytes");
            assert_eq!(data.len() as u64, size, "exactly size bytes follow");
            Ok(data)
        }
        other => Err(Box::new(other)),
    }
}

#[test]
fn get_file_sends_exactly_the_file() {
    let agent = Agent::start();
    let tmp = TempDir::new("get");
    let path = tmp.path().join("blob");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&path, &data).expect("blob");
    assert!(get(&agent, &path.to_string_lossy()).expect("file") == data);
    std::fs::write(tmp.path().join("empty"), b"").expect("empty");
    assert_eq!(
        get(&agent, &tmp.path().join("empty").to_string_lossy()).expect("empty"),
        b""
    );
    // Size-less kernel files are buffered to learn their length.
    let version = get(&agent, "/proc/version").expect("/proc/version");
    assert!(
        version.starts_with(b"Linux"),
        "{}",
        String::from_utf8_lossy(&version)
    );
}

#[test]
fn get_file_errors_have_stable_codes() {
    let agent = Agent::start();
    let tmp = TempDir::new("geterr");
    let dir = tmp.path().to_string_lossy().into_owned();
    expect_error(
        *get(&agent, &format!("{dir}/missing")).expect_err("missing"),
        "not_found",
    );
    expect_error(
        *get(&agent, &format!("{dir}/missing/deeper")).expect_err("missing"),
        "not_found",
    );
    expect_error(*get(&agent, &dir).expect_err("dir"), "is_a_directory");
    expect_error(
        *get(&agent, "relative").expect_err("relative"),
        "invalid_request",
    );
    let nobody = Agent::start_as_nobody();
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, b"x").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    expect_error(
        *get(&nobody, &secret.to_string_lossy()).expect_err("denied"),
        "permission_denied",
    );
}

#[test]
fn put_files_reports_malformed_and_truncated_archives_as_invalid() {
    let agent = Agent::start();
    let tmp = TempDir::new("malformed");
    let mut header = Header::new_gnu();
    header.set_path("short").expect("path");
    header.set_size(1 << 20);
    header.set_mode(0o644);
    header.set_cksum();
    let mut truncated = header.as_bytes().to_vec();
    truncated.extend_from_slice(&[b'z'; 100]);
    for (what, body) in [
        ("garbage", vec![b'x'; 2048]),
        ("a declared size the archive lacks", truncated),
    ] {
        match put(&agent, &tmp.path().join("dest"), &body) {
            AgentReply::Error(e) => {
                assert_eq!(e.code, "invalid_request", "{what}: {}", e.message);
                assert!(e.message.contains("archive"), "{what}: {}", e.message);
            }
            other => panic!("{what}: expected invalid_request, got {other:?}"),
        }
    }
}
