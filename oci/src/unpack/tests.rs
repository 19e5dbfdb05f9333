//! Applying layers end to end, and attacking the root from inside a layer. These need root
//! (chown, mknod, AT_EMPTY_PATH links) and fail without it.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Cursor, Read};
use std::os::unix::fs::symlink;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use tar::{EntryType, Header};

use super::create::copy_counted;
use super::members::parse_pax_time;
use super::*;

const MIB: u64 = 1024 * 1024;

fn generous() -> Budget {
    Budget::new(Limits {
        max_bytes: 1 << 30,
        max_entries: 100_000,
    })
}

/// `root/` to unpack into and a sibling `outside/` that must never change.
struct Fixture {
    _temp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

fn fixture() -> Fixture {
    assert!(
        rustix::process::geteuid().is_root(),
        "these tests must run as root (chown, mknod, linkat)"
    );
    let temp = tempfile::tempdir().expect("tempdir");
    let root = temp.path().join("root");
    let outside = temp.path().join("outside");
    fs::create_dir(&root).expect("mkdir root");
    fs::create_dir(&outside).expect("mkdir outside");
    Fixture {
        _temp: temp,
        root,
        outside,
    }
}

/// Everything below `dir` (not following symlinks): type, mode, owner, link count, content.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in fs::read_dir(&current).expect("read_dir") {
            let path = entry.expect("entry").path();
            let meta = fs::symlink_metadata(&path).expect("lstat");
            let detail = if meta.is_file() {
                format!("{:?}", fs::read(&path).expect("read"))
            } else if meta.file_type().is_symlink() {
                format!("-> {:?}", fs::read_link(&path).expect("readlink"))
            } else {
                if meta.is_dir() {
                    pending.push(path.clone());
                }
                String::new()
            };
            let summary = format!(
                "{:o} {}:{} n{} {detail}",
                meta.mode(),
                meta.uid(),
                meta.gid(),
                meta.nlink()
            );
            found.insert(
                path.strip_prefix(dir).expect("below").to_path_buf(),
                summary,
            );
        }
    }
    found
}

/// A layer written member by member.
struct Layer {
    builder: tar::Builder<Vec<u8>>,
}

fn header(kind: EntryType, size: u64, mode: u32) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(1_600_000_000);
    header
}

impl Layer {
    fn new() -> Self {
        Self {
            builder: tar::Builder::new(Vec::new()),
        }
    }

    /// Appends `header` for `path`, via the builder (long names handled) when it accepts the
    /// path, else with the raw name bytes written into the header.
    fn member(&mut self, mut header: Header, path: &str, content: &[u8]) -> &mut Self {
        let refused = path.starts_with('/') || path.split('/').any(|c| c == "..");
        if refused {
            let name = &mut header.as_old_mut().name;
            assert!(
                path.len() <= name.len(),
                "raw names are at most 100 bytes here"
            );
            name.fill(0);
            name[..path.len()].copy_from_slice(path.as_bytes());
            header.set_cksum();
            self.builder.append(&header, content).expect("append raw");
        } else {
            self.builder
                .append_data(&mut header, path, content)
                .expect("append");
        }
        self
    }

    fn file(&mut self, path: &str, content: &[u8]) -> &mut Self {
        self.member(
            header(EntryType::Regular, content.len() as u64, 0o644),
            path,
            content,
        )
    }

    fn dir(&mut self, path: &str) -> &mut Self {
        self.member(header(EntryType::Directory, 0, 0o755), path, b"")
    }

    fn link(&mut self, kind: EntryType, path: &str, target: &str) -> &mut Self {
        let mut header = header(kind, 0, 0o777);
        let linkname = &mut header.as_old_mut().linkname;
        linkname.fill(0);
        linkname[..target.len()].copy_from_slice(target.as_bytes());
        self.member(header, path, b"")
    }

    fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.link(EntryType::Symlink, path, target)
    }

    fn hardlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.link(EntryType::Link, path, target)
    }

    fn whiteout(&mut self, path: &str) -> &mut Self {
        self.file(path, b"")
    }

    fn bytes(&mut self) -> Vec<u8> {
        let builder = std::mem::replace(&mut self.builder, tar::Builder::new(Vec::new()));
        builder.into_inner().expect("finish tar")
    }
}

fn apply(root: &Path, layer: &[u8], budget: &mut Budget) -> Result<LayerStats, UnpackError> {
    apply_layer(root, || Ok(Cursor::new(layer)), budget)
}

fn meta(path: &Path) -> fs::Metadata {
    fs::symlink_metadata(path).unwrap_or_else(|error| panic!("lstat {}: {error}", path.display()))
}

#[test]
fn creates_files_dirs_symlinks_hardlinks_and_fifos_with_owner_mode_and_mtime() {
    let fx = fixture();
    let mut tool = header(EntryType::Regular, 5, 0o4755);
    tool.set_uid(1000);
    tool.set_gid(1001);
    tool.set_mtime(1_234_567_890);
    let mut shared = header(EntryType::Directory, 0, 0o1777);
    shared.set_uid(5);
    shared.set_gid(6);
    let mut link = header(EntryType::Symlink, 0, 0o777);
    link.set_uid(7);
    link.set_gid(8);
    link.set_mtime(1_111_111_111);
    link.set_link_name("/usr/bin/../weird/target")
        .expect("link name");
    let mut fifo = header(EntryType::Fifo, 0, 0o2640);
    fifo.set_uid(9);
    fifo.set_gid(10);
    let layer = Layer::new()
        .member(tool, "usr/bin/tool", b"hello")
        .member(shared, "var/shared/", b"")
        .member(link, "bin", b"")
        .hardlink("usr/bin/tool-alias", "/usr/bin/tool")
        .member(fifo, "run/pipe", b"")
        .bytes();

    let mut budget = generous();
    let stats = apply(&fx.root, &layer, &mut budget).expect("apply");

    let tool = meta(&fx.root.join("usr/bin/tool"));
    assert_eq!(
        fs::read(fx.root.join("usr/bin/tool")).expect("read"),
        b"hello"
    );
    assert_eq!(
        (tool.mode() & 0o7777, tool.uid(), tool.gid()),
        (0o4755, 1000, 1001),
        "setuid kept after chown"
    );
    assert_eq!(tool.mtime(), 1_234_567_890);
    assert_eq!(tool.nlink(), 2);
    assert_eq!(meta(&fx.root.join("usr/bin/tool-alias")).ino(), tool.ino());
    let usr = meta(&fx.root.join("usr"));
    assert_eq!(
        (usr.mode() & 0o7777, usr.uid(), usr.gid()),
        (0o755, 0, 0),
        "missing parents: 0755 root"
    );
    let shared = meta(&fx.root.join("var/shared"));
    assert!(shared.is_dir());
    assert_eq!(
        (shared.mode() & 0o7777, shared.uid(), shared.gid()),
        (0o1777, 5, 6)
    );
    let bin = meta(&fx.root.join("bin"));
    assert!(bin.file_type().is_symlink());
    assert_eq!(
        fs::read_link(fx.root.join("bin")).expect("readlink"),
        Path::new("/usr/bin/../weird/target")
    );
    assert_eq!((bin.uid(), bin.gid(), bin.mtime()), (7, 8, 1_111_111_111));
    let pipe = meta(&fx.root.join("run/pipe"));
    assert!(pipe.file_type().is_fifo());
    assert_eq!(
        (pipe.mode() & 0o7777, pipe.uid(), pipe.gid()),
        (0o2640, 9, 10)
    );

    // tool, var/shared, bin, tool-alias, run/pipe + the parents usr, usr/bin, var, run.
    assert_eq!(
        stats,
        LayerStats {
            entries: 9,
            bytes: 5,
            ..LayerStats::default()
        },
    );
    assert_eq!((budget.entries_used(), budget.bytes_used()), (9, 5));
}

#[test]
fn whiteouts_remove_a_file_and_a_tree_from_the_lower_layer() {
    let fx = fixture();
    let mut budget = generous();
    let lower = Layer::new()
        .file("etc/gone", b"1")
        .file("etc/kept", b"2")
        .file("opt/tree/a/b/c", b"3")
        .symlink("opt/tree/link", "/etc")
        .bytes();
    apply(&fx.root, &lower, &mut budget).expect("lower");
    let upper = Layer::new()
        .whiteout("etc/.wh.gone")
        .whiteout("opt/.wh.tree")
        .whiteout("missing/dir/.wh.whatever")
        .whiteout("etc/.wh.never-existed")
        .bytes();
    let stats = apply(&fx.root, &upper, &mut budget).expect("upper");

    assert!(!fx.root.join("etc/gone").exists());
    assert!(!fx.root.join("opt/tree").exists());
    assert!(fx.root.join("opt").is_dir());
    assert_eq!(fs::read(fx.root.join("etc/kept")).expect("kept"), b"2");
    assert!(
        !fx.root.join("missing").exists(),
        "a whiteout creates nothing"
    );
    let whiteout_names = snapshot(&fx.root)
        .keys()
        .filter(|p| p.to_string_lossy().contains(".wh."))
        .count();
    assert_eq!(whiteout_names, 0, "whiteout members are never created");
    assert_eq!(
        stats,
        LayerStats {
            whiteouts: 4,
            ..LayerStats::default()
        }
    );
}

#[test]
fn opaque_directory_hides_lower_children_but_keeps_this_layers_own() {
    for marker_last in [true, false] {
        let fx = fixture();
        let mut budget = generous();
        let lower = Layer::new()
            .file("d/old", b"1")
            .file("d/sub/x", b"2")
            .file("other/y", b"3")
            .bytes();
        apply(&fx.root, &lower, &mut budget).expect("lower");
        let mut upper = Layer::new();
        if !marker_last {
            upper.whiteout("d/.wh..wh..opq");
        }
        upper
            .dir("d/")
            .file("d/new", b"4")
            .file("d/sub/fresh", b"5");
        if marker_last {
            upper.whiteout("d/.wh..wh..opq");
        }
        let stats = apply(&fx.root, &upper.bytes(), &mut budget).expect("upper");

        let left: Vec<_> = snapshot(&fx.root.join("d")).into_keys().collect();
        assert_eq!(
            left,
            [
                PathBuf::from("new"),
                PathBuf::from("sub"),
                PathBuf::from("sub/fresh")
            ],
            "marker last: {marker_last}"
        );
        assert_eq!(fs::read(fx.root.join("other/y")).expect("untouched"), b"3");
        assert_eq!(stats.opaque_dirs, 1);
    }
}

#[test]
fn replaces_a_directory_with_a_file_and_a_file_with_a_directory() {
    let fx = fixture();
    let mut budget = generous();
    let lower = Layer::new()
        .file("was-dir/child/deep", b"1")
        .file("was-file", b"2")
        .file("kept-dir/lower-child", b"3")
        .file("was-symlink-target", b"4")
        .bytes();
    apply(&fx.root, &lower, &mut budget).expect("lower");
    let mut restricted = header(EntryType::Directory, 0, 0o700);
    restricted.set_uid(42);
    let upper = Layer::new()
        .file("was-dir", b"now a file")
        .dir("was-file/")
        .file("was-file/inside", b"5")
        .member(restricted, "kept-dir/", b"")
        .bytes();
    apply(&fx.root, &upper, &mut budget).expect("upper");

    assert_eq!(
        fs::read(fx.root.join("was-dir")).expect("file"),
        b"now a file"
    );
    assert!(meta(&fx.root.join("was-file")).is_dir());
    assert_eq!(
        fs::read(fx.root.join("was-file/inside")).expect("inside"),
        b"5"
    );
    let kept = meta(&fx.root.join("kept-dir"));
    assert_eq!(
        (kept.mode() & 0o7777, kept.uid()),
        (0o700, 42),
        "a directory over a directory is updated"
    );
    assert_eq!(
        fs::read(fx.root.join("kept-dir/lower-child")).expect("child"),
        b"3",
        "and keeps its children"
    );
}

#[test]
fn dot_dot_paths_refuse_the_layer_and_write_nothing_outside() {
    for hostile in ["../outside/x", "a/../../outside/x", "./../outside/x"] {
        let fx = fixture();
        let before = snapshot(&fx.outside);
        let layer = Layer::new().file(hostile, b"pwned").bytes();
        let error = apply(&fx.root, &layer, &mut generous()).expect_err(hostile);
        assert!(
            matches!(error, UnpackError::BadPath { .. }),
            "{hostile}: {error}"
        );
        assert!(
            error.to_string().contains(hostile),
            "the message names the member: {error}"
        );
        assert_eq!(snapshot(&fx.outside), before, "{hostile}");
    }
}

#[test]
fn absolute_paths_land_inside_the_root() {
    let fx = fixture();
    let outside = fx.outside.to_str().expect("utf-8 temp path").to_owned();
    let layer = Layer::new()
        .file("/etc/abs", b"1")
        .file(&format!("{outside}/x"), b"2")
        .bytes();
    apply(&fx.root, &layer, &mut generous()).expect("apply");
    assert_eq!(fs::read(fx.root.join("etc/abs")).expect("in root"), b"1");
    assert_eq!(
        fs::read(fx.root.join(outside.trim_start_matches('/')).join("x")).expect("in root"),
        b"2"
    );
    assert!(snapshot(&fx.outside).is_empty());
}

#[test]
fn symlinked_parents_resolve_inside_the_root() {
    let fx = fixture();
    let outside = fx.outside.to_str().expect("utf-8 temp path").to_owned();
    let layer = Layer::new()
        .symlink("esc", "../outside")
        .symlink("deep", "../../../../../../../../outside")
        .symlink("abs", &outside)
        .file("esc/pwned", b"1")
        .file("deep/pwned2", b"2")
        .file("abs/pwned3", b"3")
        .bytes();
    apply(&fx.root, &layer, &mut generous()).expect("apply");

    assert!(
        snapshot(&fx.outside).is_empty(),
        "nothing written outside the root"
    );
    assert_eq!(
        fs::read(fx.root.join("outside/pwned")).expect("in root"),
        b"1"
    );
    assert_eq!(
        fs::read(fx.root.join("outside/pwned2")).expect("in root"),
        b"2"
    );
    let in_root_outside = fx.root.join(outside.trim_start_matches('/'));
    assert_eq!(
        fs::read(in_root_outside.join("pwned3")).expect("in root"),
        b"3"
    );
    assert!(
        meta(&fx.root.join("esc")).file_type().is_symlink(),
        "the symlink itself stays"
    );
}

#[test]
fn whiteouts_and_opaque_markers_through_symlinks_stay_inside_the_root() {
    let fx = fixture();
    fs::write(fx.outside.join("victim"), b"keep").expect("write");
    fs::create_dir(fx.outside.join("dir")).expect("mkdir");
    fs::write(fx.outside.join("dir/child"), b"keep").expect("write");
    let before = snapshot(&fx.outside);
    let outside = fx.outside.to_str().expect("utf-8 temp path").to_owned();
    let mut budget = generous();
    let lower = Layer::new()
        .symlink("esc", "../outside")
        .symlink("abs", &outside)
        .symlink("to-inside", "/inside")
        .file("inside/victim", b"in root")
        .bytes();
    apply(&fx.root, &lower, &mut budget).expect("lower");
    let upper = Layer::new()
        .whiteout("esc/.wh.victim")
        .whiteout("abs/.wh.victim")
        .whiteout("esc/.wh.dir")
        .whiteout("abs/dir/.wh..wh..opq")
        .whiteout("esc/.wh..wh..opq")
        .whiteout("abs/.wh..wh..opq")
        .whiteout("to-inside/.wh.victim")
        .bytes();
    apply(&fx.root, &upper, &mut budget).expect("upper");

    assert_eq!(snapshot(&fx.outside), before, "outside untouched");
    assert!(
        !fx.root.join("inside/victim").exists(),
        "a whiteout through an in-root symlink works"
    );
}

#[test]
fn replacing_a_symlink_never_writes_or_chowns_through_it() {
    let fx = fixture();
    fs::write(fx.outside.join("file"), b"keep").expect("write");
    fs::set_permissions(&fx.outside, fs::Permissions::from_mode(0o755)).expect("chmod");
    let before = snapshot(&fx.outside);
    let outside_meta = meta(&fx.outside);
    let outside = fx.outside.to_str().expect("utf-8 temp path").to_owned();
    let mut budget = generous();
    let lower = Layer::new()
        .symlink("file-link", &format!("{outside}/file"))
        .symlink("dir-link", &outside)
        .bytes();
    // Symlinks to host paths (stored verbatim); the next layer puts a file and a directory,
    // with their own owner and mode, at those names.
    apply(&fx.root, &lower, &mut budget).expect("lower");
    let mut hostile_dir = header(EntryType::Directory, 0, 0o777);
    hostile_dir.set_uid(666);
    let upper = Layer::new()
        .file("file-link", b"pwned")
        .member(hostile_dir, "dir-link/", b"")
        .bytes();
    apply(&fx.root, &upper, &mut budget).expect("upper");

    assert_eq!(snapshot(&fx.outside), before);
    let after = meta(&fx.outside);
    assert_eq!(
        (after.mode(), after.uid()),
        (outside_meta.mode(), outside_meta.uid())
    );
    assert_eq!(fs::read(fx.root.join("file-link")).expect("file"), b"pwned");
    let dir = meta(&fx.root.join("dir-link"));
    assert!(dir.is_dir());
    assert_eq!((dir.mode() & 0o777, dir.uid()), (0o777, 666));
}

#[test]
fn hard_links_resolve_their_target_inside_the_root() {
    let fx = fixture();
    fs::write(fx.outside.join("secret"), b"host secret").expect("write");
    let outside = fx.outside.to_str().expect("utf-8 temp path").to_owned();

    let escaping = Layer::new().hardlink("h", "../outside/secret").bytes();
    let error = apply(&fx.root, &escaping, &mut generous()).expect_err("`..` target");
    assert!(
        matches!(error, UnpackError::BadLinkTarget { .. }),
        "{error}"
    );

    let via_symlink = Layer::new()
        .symlink("esc", &outside)
        .hardlink("h", "esc/secret")
        .bytes();
    let error = apply(&fx.root, &via_symlink, &mut generous()).expect_err("missing in root");
    assert!(
        matches!(error, UnpackError::BadLinkTarget { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("esc/secret") && error.to_string().contains("\"h\""),
        "{error}"
    );

    let absolute = Layer::new()
        .hardlink("h2", &format!("{outside}/secret"))
        .bytes();
    assert!(apply(&fx.root, &absolute, &mut generous()).is_err());
    assert_eq!(
        meta(&fx.outside.join("secret")).nlink(),
        1,
        "the outside file was never linked"
    );

    // With a file of that name inside the root, the same link points at it.
    let in_root = Layer::new()
        .file(&format!("{outside}/secret"), b"in root")
        .hardlink("h", "esc/secret")
        .bytes();
    apply(&fx.root, &in_root, &mut generous()).expect("link inside the root");
    assert_eq!(fs::read(fx.root.join("h")).expect("read"), b"in root");
    assert_eq!(meta(&fx.root.join("h")).nlink(), 2);
    assert_eq!(meta(&fx.outside.join("secret")).nlink(), 1);

    let to_dir = Layer::new().dir("d/").hardlink("hd", "d").bytes();
    let error = apply(&fx.root, &to_dir, &mut generous()).expect_err("directory target");
    assert!(error.to_string().contains("directory"), "{error}");
}

#[test]
fn device_nodes_and_unknown_types_are_dropped_and_counted() {
    let fx = fixture();
    let mut null = header(EntryType::Char, 0, 0o666);
    null.set_device_major(1).expect("major");
    null.set_device_minor(3).expect("minor");
    let mut disk = header(EntryType::Block, 0, 0o660);
    disk.set_device_major(8).expect("major");
    disk.set_device_minor(0).expect("minor");
    let layer = Layer::new()
        .member(null, "dev/null", b"")
        .member(disk, "dev/sda", b"")
        .member(header(EntryType::new(b'Z'), 0, 0o644), "strange", b"")
        .bytes();
    let stats = apply(&fx.root, &layer, &mut generous()).expect("apply");
    assert_eq!(
        stats,
        LayerStats {
            dropped_devices: 2,
            dropped_other: 1,
            ..LayerStats::default()
        }
    );
    assert!(snapshot(&fx.root).is_empty());
}

/// A gzip stream of a tar holding one file of `size` zero bytes.
fn gzipped_zero_file(size: u64) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    {
        let mut builder = tar::Builder::new(&mut encoder);
        let mut header = header(EntryType::Regular, size, 0o644);
        builder
            .append_data(&mut header, "zeros", io::repeat(0).take(size))
            .expect("append");
        builder.finish().expect("finish");
    }
    encoder.finish().expect("gzip")
}

#[test]
fn gzip_tar_bomb_stops_at_the_byte_limit() {
    let fx = fixture();
    let bomb = gzipped_zero_file(1 << 30);
    assert!(
        bomb.len() < 8 * MIB as usize,
        "the bomb is small compressed"
    );
    let mut budget = Budget::new(Limits {
        max_bytes: 64 * MIB,
        max_entries: 1000,
    });
    let error = apply_layer(
        &fx.root,
        || Ok(GzDecoder::new(bomb.as_slice())),
        &mut budget,
    )
    .expect_err("bomb");
    assert!(
        matches!(error, UnpackError::LimitExceeded { limit: Limit::Bytes, max, .. } if max == 64 * MIB),
        "{error}"
    );
    assert!(error.to_string().contains("max_bytes"), "{error}");
    let written: u64 = snapshot(&fx.root)
        .keys()
        .map(|p| meta(&fx.root.join(p)).len())
        .sum();
    assert!(
        written <= 64 * MIB && budget.bytes_used() <= 64 * MIB,
        "wrote {written}"
    );
}

#[test]
fn a_second_read_that_differs_still_cannot_pass_the_byte_limit() {
    let fx = fixture();
    let benign = Layer::new().file("a", b"small").bytes();
    let forty = vec![7_u8; 40 * MIB as usize];
    let greedy = Layer::new().file("a", &forty).file("b", &forty).bytes();
    let mut reads = 0;
    let mut budget = Budget::new(Limits {
        max_bytes: 64 * MIB,
        max_entries: 1000,
    });
    let error = apply_layer(
        &fx.root,
        || {
            reads += 1;
            Ok(Cursor::new(if reads == 1 {
                benign.clone()
            } else {
                greedy.clone()
            }))
        },
        &mut budget,
    )
    .expect_err("second read is bigger");
    assert!(
        matches!(
            error,
            UnpackError::LimitExceeded {
                limit: Limit::Bytes,
                ..
            }
        ),
        "{error}"
    );
    assert!(budget.bytes_used() <= 64 * MIB);
    assert!(!fx.root.join("b").exists());
}

#[test]
fn copy_stops_at_the_limit_even_when_the_stream_outruns_its_header() {
    let mut budget = Budget::new(Limits {
        max_bytes: MIB,
        max_entries: 10,
    });
    let mut written = Vec::new();
    let error = copy_counted(
        &mut io::repeat(1).take(10 * MIB),
        &mut written,
        &mut budget,
        b"f",
    )
    .expect_err("past the limit");
    assert!(
        matches!(
            error,
            UnpackError::LimitExceeded {
                limit: Limit::Bytes,
                ..
            }
        ),
        "{error}"
    );
    assert!(written.len() as u64 <= MIB && budget.bytes_used() <= MIB);
}

#[test]
fn entry_limit_holds_within_and_across_layers() {
    let fx = fixture();
    let mut budget = Budget::new(Limits {
        max_bytes: MIB,
        max_entries: 5,
    });
    let mut many = Layer::new();
    for index in 0..10 {
        many.file(&format!("f{index}"), b"x");
    }
    let error = apply(&fx.root, &many.bytes(), &mut budget).expect_err("10 > 5");
    assert!(
        matches!(
            error,
            UnpackError::LimitExceeded {
                limit: Limit::Entries,
                max: 5,
                ..
            }
        ),
        "{error}"
    );
    assert!(
        snapshot(&fx.root).is_empty(),
        "refused before creating anything"
    );

    let three = Layer::new()
        .file("a", b"1")
        .file("b", b"2")
        .file("c", b"3")
        .bytes();
    apply(&fx.root, &three, &mut budget).expect("3 of 5");
    let error = apply(&fx.root, &three, &mut budget).expect_err("6 > 5");
    assert!(
        matches!(
            error,
            UnpackError::LimitExceeded {
                limit: Limit::Entries,
                ..
            }
        ),
        "{error}"
    );
    assert!(budget.entries_used() <= 5);

    // Members that create nothing are bounded too.
    let mut whiteouts = Layer::new();
    for index in 0..10 {
        whiteouts.whiteout(&format!(".wh.w{index}"));
    }
    let error = apply(&fx.root, &whiteouts.bytes(), &mut budget).expect_err("10 members > 5");
    assert!(
        matches!(
            error,
            UnpackError::LimitExceeded {
                limit: Limit::Entries,
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn truncated_or_garbage_tar_is_an_error_not_a_panic() {
    let content = vec![b'x'; 3000];
    let layer = Layer::new()
        .dir("d/")
        .file("d/f", &content)
        .file("g", b"y")
        .bytes();
    // Cut inside the second member's content: its file is short.
    let fx = fixture();
    let error = apply(&fx.root, &layer[..512 * 2 + 1000], &mut generous()).expect_err("truncated");
    assert!(
        matches!(
            error,
            UnpackError::Truncated { .. } | UnpackError::Tar { .. }
        ),
        "{error}"
    );
    // Every cut, and a few kinds of garbage, end in a result: none panics.
    for cut in (0..layer.len()).step_by(97) {
        let fx = fixture();
        let _ = apply(&fx.root, &layer[..cut], &mut generous());
    }
    let mut corrupted = layer.clone();
    corrupted[100] ^= 0xff; // the first header's mode: its checksum no longer matches
    for garbage in [vec![0xff_u8; 4096], vec![b'7'; 1024], corrupted] {
        let fx = fixture();
        assert!(apply(&fx.root, &garbage, &mut generous()).is_err());
    }
}

#[test]
fn oversized_metadata_is_refused_without_buffering_it() {
    let fx = fixture();
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    {
        let mut long_name = Header::new_gnu();
        long_name.set_entry_type(EntryType::GNULongName);
        long_name.set_size(256 * MIB);
        let name = &mut long_name.as_old_mut().name;
        name[..13].copy_from_slice(b"././@LongLink");
        long_name.set_cksum();
        let mut builder = tar::Builder::new(&mut encoder);
        builder
            .append(&long_name, io::repeat(b'a').take(256 * MIB))
            .expect("append");
        builder.finish().expect("finish");
    }
    let stream = encoder.finish().expect("gzip");
    let error = apply_layer(
        &fx.root,
        || Ok(GzDecoder::new(stream.as_slice())),
        &mut generous(),
    )
    .expect_err("too much metadata");
    assert!(
        matches!(error, UnpackError::MetadataTooLarge { .. }),
        "{error}"
    );
}

#[test]
fn overlong_paths_are_refused() {
    let fx = fixture();
    let long = "d/".repeat(2100) + "f";
    let layer = Layer::new().file_long(&long).bytes();
    let error = apply(&fx.root, &layer, &mut generous()).expect_err("over 4096 bytes");
    assert!(matches!(error, UnpackError::BadPath { .. }), "{error}");
}

impl Layer {
    /// A file whose name goes through a GNU long-name record.
    fn file_long(&mut self, path: &str) -> &mut Self {
        let mut header = header(EntryType::Regular, 1, 0o644);
        self.builder
            .append_data(&mut header, path, &b"x"[..])
            .expect("append long");
        self
    }
}

#[test]
fn read_in_root_resolves_symlinks_inside_the_root() {
    let fx = fixture();
    let layer = Layer::new()
        .file("data/etc/passwd", b"root:x:0:0:in-root:/root:/bin/sh\n")
        .symlink("etc", "/data/etc")
        .symlink("final", "/etc/passwd")
        .symlink("up", "../../../../../../../etc/passwd")
        .symlink("loop", "/loop")
        .file("big", &[b'b'; 100])
        .member(header(EntryType::Fifo, 0, 0o644), "pipe", b"")
        .bytes();
    apply(&fx.root, &layer, &mut generous()).expect("apply");

    let expected = b"root:x:0:0:in-root:/root:/bin/sh\n".to_vec();
    for path in [
        "/etc/passwd",
        "etc/passwd",
        "final",
        "/up",
        "data/../etc/passwd",
    ] {
        assert_eq!(
            read_in_root(&fx.root, path, 4096).expect(path),
            Some(expected.clone()),
            "{path}"
        );
    }
    assert_eq!(
        read_in_root(&fx.root, "/etc/group", 4096).expect("missing"),
        None
    );
    assert_eq!(
        read_in_root(&fx.root, "/big/x", 4096).expect("under a file"),
        None
    );
    assert!(matches!(
        read_in_root(&fx.root, "big", 99),
        Err(UnpackError::FileTooLarge { max: 99, .. })
    ));
    assert_eq!(
        read_in_root(&fx.root, "big", 100)
            .expect("at the limit")
            .map(|c| c.len()),
        Some(100)
    );
    assert!(matches!(
        read_in_root(&fx.root, "pipe", 10),
        Err(UnpackError::NotRegularFile { .. })
    ));
    assert!(matches!(
        read_in_root(&fx.root, "/", 10),
        Err(UnpackError::NotRegularFile { .. })
    ));
    assert!(read_in_root(&fx.root, "loop", 10).is_err());

    // `etc -> /etc` in the image: resolved inside the root it points at itself, never at the
    // host's /etc.
    let fx = fixture();
    symlink("/etc", fx.root.join("etc")).expect("symlink");
    let read = read_in_root(&fx.root, "/etc/passwd", 1 << 20);
    assert!(
        !matches!(read, Ok(Some(_))),
        "the host's /etc/passwd must not be read: {read:?}"
    );
}

#[test]
fn pax_times_parse_with_fractions_and_signs() {
    let time = |raw: &str| parse_pax_time(raw.as_bytes()).map(|t| (t.tv_sec, t.tv_nsec));
    assert_eq!(time("1700000000"), Some((1_700_000_000, 0)));
    assert_eq!(time("1700000000.25"), Some((1_700_000_000, 250_000_000)));
    assert_eq!(time("-1.5"), Some((-2, 500_000_000)));
    assert_eq!(time("1.1234567891"), Some((1, 123_456_789)));
    for bad in ["", ".5", "1e9", "abc", "1.x", "99999999999999999999"] {
        assert_eq!(time(bad), None, "{bad:?}");
    }
}

#[test]
fn whiteout_member_writes_nothing_even_for_a_directory_type() {
    let fx = fixture();
    let layer = Layer::new()
        .dir(".wh.dir/")
        .member(header(EntryType::Fifo, 0, 0o644), "x/.wh.fifo", b"")
        .bytes();
    apply(&fx.root, &layer, &mut generous()).expect("apply");
    let names: Vec<_> = snapshot(&fx.root).into_keys().collect();
    assert!(
        names.iter().all(|p| !p.to_string_lossy().contains(".wh.")),
        "{names:?}"
    );
}

#[test]
fn pax_mtime_with_a_fraction_is_applied() {
    let fx = fixture();
    let mut layer = Layer::new();
    layer
        .builder
        .append_pax_extensions([("mtime", &b"1700000000.25"[..])])
        .expect("pax");
    layer.file("stamped", b"x");
    apply(&fx.root, &layer.bytes(), &mut generous()).expect("apply");
    let stamped = meta(&fx.root.join("stamped"));
    assert_eq!(
        (stamped.mtime(), stamped.mtime_nsec()),
        (1_700_000_000, 250_000_000)
    );
}

/// A small deterministic generator, so a failing mutation can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % below as u64) as usize
    }
}

#[test]
fn mutated_headers_never_panic_or_reach_outside() {
    let long_name = "long/".repeat(30) + "name";
    let mut layer = Layer::new();
    layer
        .dir("d/")
        .file("d/f", b"content")
        .symlink("d/s", "../../outside")
        .hardlink("d/h", "d/f")
        .file(&long_name, b"long")
        .whiteout("d/.wh.gone")
        .member(header(EntryType::Fifo, 0, 0o644), "p", b"");
    layer
        .builder
        .append_pax_extensions([("mtime", &b"12.5"[..])])
        .expect("pax");
    layer.file("after-pax", b"y");
    let layer = layer.bytes();
    let mut archive = tar::Archive::new(layer.as_slice());
    let headers: Vec<usize> = archive
        .entries()
        .expect("entries")
        .raw(true)
        .map(|entry| entry.expect("entry").raw_header_position() as usize)
        .collect();

    let mut random = Lcg(0x5eed);
    for round in 0..300 {
        let fx = fixture();
        let mut mutated = layer.clone();
        let start = headers[random.next(headers.len())];
        for _ in 0..1 + random.next(3) {
            let offset = loop {
                let offset = random.next(512);
                if !(148..156).contains(&offset) {
                    break offset;
                }
            };
            mutated[start + offset] = match random.next(4) {
                0 => 0,
                1 => b'/',
                2 => b'.',
                _ => random.next(256) as u8,
            };
        }
        let mut fixed = Header::new_old();
        fixed
            .as_mut_bytes()
            .copy_from_slice(&mutated[start..start + 512]);
        fixed.set_cksum();
        mutated[start..start + 512].copy_from_slice(fixed.as_bytes());

        // Ok or an error, both fine: what matters is no panic and nothing outside.
        let _ = apply(&fx.root, &mutated, &mut generous());
        assert!(
            snapshot(&fx.outside).is_empty(),
            "round {round} wrote outside the root"
        );
    }
}
