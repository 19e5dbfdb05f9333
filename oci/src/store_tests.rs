use super::*;
use crate::write::{self, ImageParts, LayerBuilder};

const LIMITS: Limits = Limits {
    max_bytes: 64 * 1024 * 1024,
    max_entries: 10_000,
};

fn store() -> (tempfile::TempDir, Arc<Store>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("images")).expect("open");
    (dir, store)
}

/// A base layer and a second one that deletes a file (whiteout) and replaces a directory
/// (opaque), with a config.
fn two_layers() -> ImageParts {
    let base = LayerBuilder::new()
        .dir("etc", 0o755)
        .and_then(|l| {
            l.file(
                "etc/passwd",
                0o644,
                b"root:x:0:0::/root:/bin/sh\nci:x:1000:1000::/home/ci:/bin/sh\n",
            )
        })
        .and_then(|l| l.file("etc/group", 0o644, b"root:x:0:\nci:x:1000:\n"))
        .and_then(|l| l.file("etc/doomed", 0o644, b"gone in layer 2"))
        .and_then(|l| l.dir("opt/app", 0o755))
        .and_then(|l| l.file("opt/app/old", 0o644, b"hidden by the opaque dir"))
        .and_then(|l| l.finish())
        .expect("base");
    let top = LayerBuilder::new()
        .file("opt/app/new", 0o644, b"layer 2")
        .and_then(|l| l.opaque("opt/app"))
        .and_then(|l| l.whiteout("etc/doomed"))
        .and_then(|l| l.finish())
        .expect("top");
    ImageParts {
        layers: vec![base, top],
        config: RunConfig {
            env: Some(vec!["GREETING=hello".into(), "PATH=/usr/bin:/bin".into()]),
            working_dir: Some("/opt/app".into()),
            user: Some("ci".into()),
            ..RunConfig::default()
        },
        reference: Some("example:1".into()),
        compression: Compression::Gzip,
    }
}

fn upload(store: &Store, write: impl FnOnce(&Path) -> io::Result<()>) -> PathBuf {
    let path = store.upload_path();
    write(&path).expect("write upload");
    path
}

fn check_two_layer_root(store: &Store, record: &ImageRecord) {
    let root = store.root_dir(&record.root);
    assert!(!root.join("etc/doomed").exists(), "whiteout applied");
    assert!(!root.join("opt/app/old").exists(), "opaque dir applied");
    assert_eq!(fs::read(root.join("opt/app/new")).expect("new"), b"layer 2");
    assert_eq!(record.defaults.working_dir.as_deref(), Some("/opt/app"));
    assert_eq!(
        record.defaults.env.get("GREETING").map(String::as_str),
        Some("hello")
    );
    let user = record.defaults.user.as_ref().expect("user");
    assert_eq!(
        (user.uid, user.gid, user.home.as_str()),
        (1000, 1000, "/home/ci")
    );
}

#[test]
fn an_oci_archive_imports_with_its_layers_and_config() {
    let (_dir, store) = store();
    let parts = two_layers();
    let path = upload(&store, |p| write::oci_archive(p, &parts));
    let record = store.import("alice", "app", &path, LIMITS).expect("import");
    assert_eq!(record.format, Format::Oci);
    assert_eq!(record.reference.as_deref(), Some("example:1"));
    assert_eq!(record.layers.len(), 2);
    check_two_layer_root(&store, &record);
    assert!(!path.exists(), "the upload is removed");
    assert_eq!(store.get("alice", "app").expect("get"), record);
    assert!(matches!(
        store.get("bob", "app"),
        Err(StoreError::NotFound(_))
    ));
}

#[test]
fn a_docker_save_archive_imports_the_same_tree() {
    let (_dir, store) = store();
    let mut parts = two_layers();
    parts.compression = Compression::None;
    let path = upload(&store, |p| write::docker_archive(p, &parts));
    let record = store.import("alice", "app", &path, LIMITS).expect("import");
    assert_eq!(record.format, Format::DockerSave);
    check_two_layer_root(&store, &record);
}

#[test]
fn a_gzipped_docker_save_archive_is_recognised() {
    let (_dir, store) = store();
    let mut parts = two_layers();
    parts.compression = Compression::None;
    let plain = upload(&store, |p| write::docker_archive(p, &parts));
    let bytes = fs::read(&plain).expect("read");
    let gz = upload(&store, |p| fs::write(p, write_gzip(&bytes)));
    let record = store.import("alice", "app", &gz, LIMITS).expect("import");
    assert_eq!(record.format, Format::DockerSave);
    check_two_layer_root(&store, &record);
}

#[test]
fn zstd_layers_and_a_zstd_docker_save_archive_import_the_same_tree() {
    let (_dir, store) = store();
    let mut parts = two_layers();
    parts.compression = Compression::Zstd;
    let path = upload(&store, |p| write::oci_archive(p, &parts));
    let record = store
        .import("alice", "zstd-layers", &path, LIMITS)
        .expect("import");
    check_two_layer_root(&store, &record);

    parts.compression = Compression::None;
    let plain = upload(&store, |p| write::docker_archive(p, &parts));
    let bytes = fs::read(&plain).expect("read");
    let zst = upload(&store, |p| {
        fs::write(
            p,
            ruzstd::encoding::compress_to_vec(
                &bytes[..],
                ruzstd::encoding::CompressionLevel::Fastest,
            ),
        )
    });
    let record = store
        .import("alice", "zstd-save", &zst, LIMITS)
        .expect("import");
    assert_eq!(record.format, Format::DockerSave);
    check_two_layer_root(&store, &record);
}

#[test]
fn a_compressed_archive_bomb_stops_at_the_limit_and_leaves_nothing() {
    use std::io::Write;
    let (_dir, store) = store();
    // `docker save | gzip` whose second member is 256 MiB of zeros: a few hundred KiB on the
    // wire, four times the 64 MiB limit once decompressed.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut member = |name: &str, size: u64, fill: &mut dyn FnMut(&mut dyn Write)| {
        let mut header = tar::Header::new_gnu();
        header.set_path(name).expect("path");
        header.set_size(size);
        header.set_mode(0o644);
        header.set_cksum();
        gz.write_all(header.as_bytes()).expect("header");
        fill(&mut gz);
        let pad = (512 - size % 512) % 512;
        gz.write_all(&vec![0u8; pad as usize]).expect("pad");
    };
    member("manifest.json", 2, &mut |w| {
        w.write_all(b"[]").expect("json")
    });
    member("zeros", 256 << 20, &mut |w| {
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..256 {
            w.write_all(&zeros).expect("zeros");
        }
    });
    gz.write_all(&[0u8; 1024]).expect("end");
    let bomb = gz.finish().expect("gzip");
    assert!(bomb.len() < 2 << 20, "{} bytes", bomb.len());
    let path = upload(&store, |p| fs::write(p, &bomb));
    let refused = store
        .import("alice", "bomb", &path, LIMITS)
        .expect_err("refused");
    assert!(refused.is_too_large(), "{refused}");
    let tmp: Vec<_> = fs::read_dir(store.dir.join("tmp")).expect("tmp").collect();
    assert!(tmp.is_empty(), "left in tmp: {tmp:?}");
}

fn write_gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut out = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    out.write_all(bytes).expect("gzip");
    out.finish().expect("gzip")
}

#[test]
fn a_rootfs_tarball_is_one_layer_without_config() {
    let (_dir, store) = store();
    let layer = LayerBuilder::new()
        .file("bin/tool", 0o755, b"#!/bin/sh\n")
        .and_then(|l| l.finish())
        .expect("layer");
    let path = upload(&store, |p| fs::write(p, write_gzip(&layer)));
    let record = store
        .import("alice", "rootfs", &path, LIMITS)
        .expect("import");
    assert_eq!(record.format, Format::Rootfs);
    assert_eq!(record.defaults, Defaults::default());
    let root = store.root_dir(&record.root);
    assert_eq!(
        fs::read(root.join("bin/tool")).expect("tool"),
        b"#!/bin/sh\n"
    );
}

#[test]
fn an_archive_of_nothing_is_refused_and_leaves_nothing() {
    let (_dir, store) = store();
    // An empty tar: only its end-of-archive blocks.
    let path = upload(&store, |p| fs::write(p, [0u8; 1024]));
    let err = store
        .import("alice", "empty", &path, LIMITS)
        .expect_err("an empty archive is no image");
    assert!(matches!(err, StoreError::Empty), "{err}");
    assert!(err.is_bad_input());
    assert!(
        store.get("alice", "empty").is_err(),
        "no record was written"
    );
    // Nor does an image whose every layer is empty.
    let empty_layer = LayerBuilder::new().finish().expect("layer");
    let parts = ImageParts {
        layers: vec![empty_layer],
        config: RunConfig::default(),
        reference: None,
        compression: Compression::None,
    };
    let path = upload(&store, |p| write::oci_archive(p, &parts));
    let err = store
        .import("alice", "empty", &path, LIMITS)
        .expect_err("empty layers are no image");
    assert!(matches!(err, StoreError::Empty), "{err}");
}

#[test]
fn a_shared_layer_is_stored_once_and_collected_with_its_last_image() {
    let (_dir, store) = store();
    let parts = two_layers();
    let mut one_layer = parts.clone();
    one_layer.layers.truncate(1);
    let a = upload(&store, |p| write::oci_archive(p, &parts));
    let b = upload(&store, |p| write::oci_archive(p, &one_layer));
    let first = store.import("alice", "a", &a, LIMITS).expect("a");
    let second = store.import("bob", "b", &b, LIMITS).expect("b");
    assert_eq!(first.layers[0], second.layers[0]);
    assert_ne!(first.root, second.root);
    let blobs = || {
        fs::read_dir(store.dir().join("blobs/sha256"))
            .expect("ls")
            .count()
    };
    assert_eq!(blobs(), 2, "three layer uses, two distinct blobs");
    store.remove("alice", "a").expect("remove a");
    assert_eq!(blobs(), 1);
    assert!(!store.root_dir(&first.root).exists());
    assert!(store.root_dir(&second.root).exists());
    store.remove("bob", "b").expect("remove b");
    assert_eq!(blobs(), 0);
    assert!(store.list(None).expect("list").is_empty());
}

#[test]
fn an_image_in_use_is_not_removed_and_a_replaced_one_keeps_its_tree() {
    let (_dir, store) = store();
    let parts = two_layers();
    let path = upload(&store, |p| write::oci_archive(p, &parts));
    store.import("alice", "app", &path, LIMITS).expect("import");
    let (held, lease) = store.lease("alice", "app").expect("lease");
    assert!(matches!(
        store.remove("alice", "app"),
        Err(StoreError::InUse { sandboxes: 1, .. })
    ));
    // Re-importing the name with other content: the held tree stays for its sandbox.
    let mut other = parts.clone();
    other.layers.truncate(1);
    let path = upload(&store, |p| write::oci_archive(p, &other));
    let replaced = store
        .import("alice", "app", &path, LIMITS)
        .expect("replace");
    assert_ne!(replaced.root, held.root);
    assert!(store.root_dir(&held.root).is_dir());
    drop(lease);
    store.gc().expect("gc");
    assert!(!store.root_dir(&held.root).exists());
    store.remove("alice", "app").expect("remove");
}

#[test]
fn a_blob_that_does_not_match_its_digest_is_refused() {
    let (_dir, store) = store();
    let parts = two_layers();
    let layout = tempfile::tempdir().expect("layout");
    write::oci_layout(layout.path(), &parts).expect("layout");
    // Swap the bytes of the top layer's blob, keeping its name.
    let manifest_layer = fs::read_dir(layout.path().join("blobs/sha256"))
        .expect("ls")
        .map(|e| e.expect("entry").path())
        .find(|p| fs::read(p).is_ok_and(|b| b.starts_with(&[0x1f, 0x8b])))
        .expect("a gzip layer");
    fs::write(&manifest_layer, write_gzip(b"not the layer")).expect("tamper");
    let path = upload(&store, |p| {
        let mut builder = tar::Builder::new(File::create(p)?);
        builder.append_dir_all(".", layout.path())?;
        builder.into_inner().map(|_| ())
    });
    let err = store
        .import("alice", "bad", &path, LIMITS)
        .expect_err("refused");
    assert!(err.is_bad_input(), "{err}");
    assert!(err.to_string().contains("digest"), "{err}");
    assert!(store.list(None).expect("list").is_empty());
    assert_eq!(
        fs::read_dir(store.dir().join("blobs/sha256"))
            .expect("ls")
            .count(),
        0
    );
    assert_eq!(
        fs::read_dir(store.dir().join("tmp")).expect("ls").count(),
        0
    );
}

#[test]
fn names_are_checked() {
    for good in ["app", "rust:1.80", "ghcr.io/org/ci-image:latest", "A_b-1.2"] {
        validate_name(good).expect(good);
    }
    for bad in [
        "",
        "../x",
        "a/../b",
        "-x",
        "a//b",
        "a/",
        "a b",
        "é",
        &"x".repeat(129),
    ] {
        assert!(validate_name(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn prune_removes_only_idle_unheld_images_of_the_prefix_and_their_layers() {
    let (_dir, store) = store();
    let import = |owner: &str, name: &str| {
        let path = upload(&store, |p| write::oci_archive(p, &two_layers()));
        store.import(owner, name, &path, LIMITS).expect("import")
    };
    import("unix", "containerd-aaaa");
    import("unix", "containerd-held");
    import("unix", "mine");
    import("bob", "containerd-bobs");
    let (_record, lease) = store.lease("unix", "containerd-held").expect("lease");
    let hour = std::time::Duration::from_secs(3600);
    // Everything was used just now: nothing is an hour idle.
    assert!(store
        .prune(Some("unix"), "containerd-", hour)
        .expect("prune")
        .is_empty());
    // Backdate the records two hours; the held one is still held.
    let two_hours_ago = std::time::SystemTime::now() - 2 * hour;
    for (owner, name) in [
        ("unix", "containerd-aaaa"),
        ("unix", "containerd-held"),
        ("unix", "mine"),
        ("bob", "containerd-bobs"),
    ] {
        fs::OpenOptions::new()
            .write(true)
            .open(store.record_path(owner, name))
            .and_then(|f| f.set_modified(two_hours_ago))
            .expect("backdate");
    }
    let removed: Vec<String> = store
        .prune(Some("unix"), "containerd-", hour)
        .expect("prune")
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(removed, ["containerd-aaaa"]);
    let left: Vec<String> = store
        .list(None)
        .expect("list")
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(left, ["containerd-bobs", "containerd-held", "mine"]);
    // Releasing marks it used now: not idle, kept.
    drop(lease);
    assert!(store
        .prune(Some("unix"), "containerd-", hour)
        .expect("prune")
        .is_empty());
    // With no idle time asked and no prefix: every unheld image of the owner; the layers stay
    // while bob's image still names them, and go with the last.
    let removed = store
        .prune(Some("unix"), "", std::time::Duration::ZERO)
        .expect("prune");
    assert_eq!(removed.len(), 2);
    assert!(fs::read_dir(store.dir.join("blobs/sha256"))
        .expect("blobs")
        .next()
        .is_some());
    store
        .prune(None, "", std::time::Duration::ZERO)
        .expect("prune");
    assert_eq!(
        fs::read_dir(store.dir.join("blobs/sha256"))
            .expect("blobs")
            .count(),
        0
    );
}
