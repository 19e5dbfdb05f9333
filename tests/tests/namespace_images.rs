//! Images users bring, through the real daemon: a two-layer OCI image and a `docker save`
//! archive (built here from the busybox tree) import, and their sandboxes see the right files
//! (whiteout and opaque directory applied), env, working directory and user; our agent is PID 1
//! whatever the image holds; images are per key; hostile archives are refused or neutralised
//! with nothing written outside the store.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use api_types::CreateSandbox;
use client::{Client, ClientError, Endpoint};
use harness::images::{self, REPLACED};
use harness::{sh, TestDaemon};
use oci::write::{self, ImageParts, LayerBuilder};
use wire::ExecRequest;

fn with_image(name: &str) -> CreateSandbox {
    CreateSandbox {
        image: Some(name.into()),
        ..CreateSandbox::default()
    }
}

/// What a command in a sandbox of the two-layer image sees.
async fn check_two_layer_sandbox(c: &Client, image: &str) {
    let id = c.create(&with_image(image)).await.expect("create").id;
    let probe = c
        .exec_collect(&id, &ExecRequest::new(["true"]))
        .await
        .expect("exec");
    assert_eq!(probe.result.exit_code, 0, "{image}: {:?}", probe.result);
    let (out, err, code) = sh(c, &id, images::TWO_LAYER_PROBE).await;
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, images::TWO_LAYER_EXPECTED, "{image}: {out}{err}");
    // What the caller says wins over what the image says.
    let mut request = ExecRequest::new(["sh", "-c", "pwd; echo $GREETING"]);
    request.cwd = "/tmp".into();
    request
        .env
        .insert("GREETING".into(), "from the request".into());
    let out = c.exec_collect(&id, &request).await.expect("exec");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/tmp\nfrom the request\n"
    );
    // The image's user cannot do what root can in the sandbox.
    let (_, _, code) = sh(c, &id, "touch /etc/written-by-ci").await;
    assert_ne!(code, 0, "the image's unprivileged user wrote to /etc");
    c.delete(&id).await.expect("delete");
}

#[tokio::test]
async fn an_oci_image_and_a_docker_save_archive_run_with_their_files_env_workdir_and_user() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let dir = tempfile::tempdir().expect("tempdir");

    let oci_archive = dir.path().join("image.oci.tar");
    write::oci_archive(&oci_archive, &images::two_layer_image(true)).expect("oci archive");
    let info = images::import_file(&c, "ci-oci", &oci_archive)
        .await
        .expect("import the OCI archive");
    assert_eq!(
        (
            info.format.as_str(),
            info.layers.len(),
            info.reference.as_deref()
        ),
        ("oci", 2, Some("example.test/ci:1"))
    );
    assert_eq!(info.working_dir.as_deref(), Some(REPLACED));
    assert_eq!(
        info.user.as_ref().map(|u| (u.uid, u.gid)),
        Some((1000, 1000))
    );
    check_two_layer_sandbox(&c, "ci-oci").await;

    let docker = dir.path().join("image.docker.tar");
    write::docker_archive(&docker, &images::two_layer_image(false)).expect("docker archive");
    let info = images::import_file(&c, "ci-docker", &docker)
        .await
        .expect("import the docker save archive");
    assert_eq!(info.format, "docker_save");
    check_two_layer_sandbox(&c, "ci-docker").await;

    // zstd layers (BuildKit's and skopeo's `tar+zstd`) give the same sandbox.
    let zstd_archive = dir.path().join("image.zstd.oci.tar");
    let mut zstd = images::two_layer_image(true);
    zstd.compression = oci::compression::Compression::Zstd;
    write::oci_archive(&zstd_archive, &zstd).expect("oci archive");
    images::import_file(&c, "ci-zstd", &zstd_archive)
        .await
        .expect("import the zstd OCI archive");
    check_two_layer_sandbox(&c, "ci-zstd").await;
    c.delete_image("ci-zstd").await.expect("remove");

    // The sandbox's own env sits between the image's and each request's.
    let mut request = with_image("ci-oci");
    request
        .env
        .insert("GREETING".into(), "from the sandbox".into());
    let id = c.create(&request).await.expect("create").id;
    let (out, _, _) = sh(&c, &id, "echo $GREETING").await;
    assert_eq!(out, "from the sandbox\n");

    // Listed after the built-in image; in use, it cannot be removed.
    let listed: Vec<String> = c
        .images()
        .await
        .expect("list")
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(listed, ["default", "ci-docker", "ci-oci"]);
    let busy = c.delete_image("ci-oci").await.expect_err("in use");
    assert!(
        matches!(busy, ClientError::Api { status: 409, .. }),
        "{busy}"
    );
    c.delete(&id).await.expect("delete");
    c.delete_image("ci-oci").await.expect("remove");
    c.delete_image("ci-docker").await.expect("remove");
    let unknown = c.create(&with_image("ci-oci")).await.expect_err("gone");
    assert!(unknown.to_string().contains("unknown image"), "{unknown}");
    // Nothing of them is left in the store, whose directory no other host user can enter.
    let store = daemon.state.config.storage.data_dir.join("images");
    assert_eq!(
        std::fs::metadata(&store)
            .expect("store")
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    for sub in ["blobs/sha256", "roots", "refs", "tmp"] {
        let left: Vec<_> = std::fs::read_dir(store.join(sub))
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert!(left.is_empty(), "{sub}: {left:?}");
    }
}

#[tokio::test]
async fn a_rootfs_tarball_imports_as_one_layer_and_a_minimal_root_still_boots() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let dir = tempfile::tempdir().expect("tempdir");
    // Only busybox and a shell: no /proc, /dev, /tmp, /etc to mount over.
    let busybox = std::fs::read(harness::image_dir().join("rootfs/bin/busybox")).expect("busybox");
    let layer = LayerBuilder::new()
        .file("bin/busybox", 0o755, &busybox)
        .and_then(|l| l.symlink("bin/sh", "busybox"))
        .and_then(|l| l.symlink("bin/cat", "busybox"))
        .and_then(|l| l.finish())
        .expect("layer");
    let tarball = dir.path().join("rootfs.tar.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &layer).expect("gzip");
    std::fs::write(&tarball, gz.finish().expect("gzip")).expect("write");
    let info = images::import_file(&c, "minimal", &tarball)
        .await
        .expect("import");
    assert_eq!((info.format.as_str(), info.layers.len()), ("rootfs", 1));
    let id = c.create(&with_image("minimal")).await.expect("create").id;
    let (out, err, code) = sh(
        &c,
        &id,
        "echo ok; cat /proc/1/comm; echo x > /tmp/f && cat /tmp/f",
    )
    .await;
    assert_eq!((out.as_str(), code), ("ok\ninit\nx\n", 0), "{err}");
}

const ALICE: &str = "alice-key-3f9a1c0e7d";
const BOB: &str = "bob-key-8e21b4d6aa";

#[tokio::test]
async fn images_belong_to_the_key_that_imported_them() {
    let daemon = TestDaemon::start_with(|c| {
        c.tcp = Some("127.0.0.1:0".parse().expect("addr"));
        c.api_keys = api::ApiKeys::parse(&format!("alice:{ALICE},bob:{BOB}")).expect("keys");
    });
    let tcp = |key: &str| {
        Client::new(Endpoint::Tcp(daemon.tcp.expect("tcp").to_string())).with_api_key(key)
    };
    let (alice, bob) = (tcp(ALICE), tcp(BOB));
    images::import_two_layer(&alice, "app")
        .await
        .expect("alice imports");
    // Bob neither sees nor uses alice's image, and his own of the same name is his.
    let names =
        |list: Vec<api_types::ImageInfo>| list.into_iter().map(|i| i.name).collect::<Vec<_>>();
    assert_eq!(names(bob.images().await.expect("list")), ["default"]);
    let refused = bob.create(&with_image("app")).await.expect_err("not his");
    assert!(refused.to_string().contains("unknown image"), "{refused}");
    assert!(matches!(
        bob.delete_image("app").await,
        Err(ClientError::Api { status: 404, .. })
    ));
    let minimal = write::ImageParts {
        layers: vec![LayerBuilder::new()
            .file("marker", 0o644, b"bob's")
            .and_then(|l| l.finish())
            .expect("layer")],
        ..ImageParts::default()
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let bobs = dir.path().join("bob.tar");
    write::oci_archive(&bobs, &minimal).expect("archive");
    images::import_file(&bob, "app", &bobs)
        .await
        .expect("bob imports");
    let info = alice.image("app").await.expect("alice's is intact");
    assert_eq!(info.layers.len(), 2);
    // Alice's sandboxes still run hers.
    let id = alice.create(&with_image("app")).await.expect("create").id;
    let (out, _, _) = sh(&alice, &id, "test -e /marker && echo bob || echo alice").await;
    assert_eq!(out, "alice\n");
}

/// A layer whose members are written with raw names, bypassing the tar crate's refusal of
/// `..` and absolute paths (as an attacker's tool would).
fn raw_layer(members: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, data, link) in members {
        let mut header = tar::Header::new_gnu();
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        header.set_entry_type(*kind);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_size(data.len() as u64);
        if matches!(kind, tar::EntryType::Char | tar::EntryType::Block) {
            header.set_device_major(1).expect("major");
            header.set_device_minor(1).expect("minor");
        }
        header.set_cksum();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

#[tokio::test]
async fn hostile_images_are_refused_or_neutralised_with_nothing_written_outside_the_store() {
    let daemon = TestDaemon::start_with(|c| c.engine.storage.image_max_mib = 64);
    let c = daemon.client();
    let dir = tempfile::tempdir().expect("tempdir");
    // A host directory an image tries to reach, and a file in it to delete.
    let victim = tempfile::tempdir().expect("victim");
    std::fs::write(victim.path().join("keep"), b"host data").expect("victim file");
    let victim_path = victim.path().display().to_string();
    let relative_victim = format!("{}{}", "../".repeat(16), &victim_path[1..]);
    let import = |name: &'static str, layers: Vec<Vec<u8>>| {
        let path = dir.path().join(format!("{name}.tar"));
        let c = c.clone();
        async move {
            let parts = ImageParts {
                layers,
                ..ImageParts::default()
            };
            write::oci_archive(&path, &parts).expect("archive");
            images::import_file(&c, name, &path).await
        }
    };
    let base = images::base_layer();

    // `..` in a member's path: refused, naming the member.
    let dotdot = raw_layer(&[(
        &format!("{relative_victim}/dotdot"),
        tar::EntryType::Regular,
        b"x",
        "",
    )]);
    let refused = import("dotdot", vec![base.clone(), dotdot])
        .await
        .expect_err("refused");
    assert!(
        matches!(&refused, ClientError::Api { status: 400, code, .. } if code == "invalid_image"),
        "{refused}"
    );

    // Symlinks pointing out (absolute and relative), then writes, a whiteout and a hard link
    // through them: resolved inside the image's root, never on the host.
    let plant = raw_layer(&[
        ("abs", tar::EntryType::Symlink, b"", &victim_path),
        ("rel", tar::EntryType::Symlink, b"", &relative_victim),
    ]);
    let through = raw_layer(&[
        ("abs/pwned-abs", tar::EntryType::Regular, b"x", ""),
        ("rel/pwned-rel", tar::EntryType::Regular, b"x", ""),
        ("abs/.wh.keep", tar::EntryType::Regular, b"", ""),
    ]);
    import("symlinks", vec![base.clone(), plant, through])
        .await
        .expect("neutralised");
    let record = daemon
        .state
        .storage()
        .expect("storage")
        .images
        .get(&api::Owner::Unix, "symlinks")
        .expect("record");
    let root = daemon
        .state
        .storage()
        .expect("storage")
        .images
        .root_dir(&record);
    for landed in ["pwned-abs", "pwned-rel"] {
        let inside = root.join(&victim_path[1..]).join(landed);
        assert!(
            inside.is_file(),
            "{} is not inside the root",
            inside.display()
        );
    }

    // A hard link to a host file, by absolute and by relative path: resolved inside the root,
    // where there is no such file, so the image is refused.
    for target in [
        format!("{victim_path}/keep"),
        format!("{relative_victim}/keep"),
    ] {
        let link = raw_layer(&[("hard", tar::EntryType::Link, b"", &target)]);
        let refused = import("hardlink", vec![base.clone(), link])
            .await
            .expect_err("refused");
        assert!(
            matches!(&refused, ClientError::Api { status: 400, .. }),
            "{target}: {refused}"
        );
    }
    assert_eq!(
        std::fs::metadata(victim.path().join("keep"))
            .expect("keep")
            .nlink(),
        1,
        "no link to the host file was made"
    );

    // Device nodes alone: dropped, counted, and absent in the sandbox.
    let devices = raw_layer(&[
        ("dev/evil-mem", tar::EntryType::Char, b"", ""),
        ("root/evil-disk", tar::EntryType::Block, b"", ""),
    ]);
    let info = import("devices", vec![base.clone(), devices])
        .await
        .expect("neutralised");
    assert_eq!(info.dropped_devices, 2);
    let id = c.create(&with_image("devices")).await.expect("create").id;
    let (out, _, _) = sh(
        &c,
        &id,
        "for f in /dev/evil-mem /root/evil-disk; do test -e $f && echo $f; done; echo checked",
    )
    .await;
    assert_eq!(
        out, "checked\n",
        "device nodes from the image exist in the sandbox"
    );

    // A tar bomb: 1 GiB of zeros in a few MiB of gzip, over the 64 MiB limit.
    // Streamed into gzip, so the test never holds the gigabyte; the layer's bytes are gzip
    // whatever its media type says (the store reads the magic number).
    let bomb = {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut header = tar::Header::new_gnu();
        header.set_path("zeros").expect("path");
        header.set_size(1 << 30);
        header.set_mode(0o644);
        header.set_cksum();
        gz.write_all(header.as_bytes()).expect("header");
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..1024 {
            gz.write_all(&zeros).expect("zeros");
        }
        gz.write_all(&[0u8; 1024]).expect("end");
        gz.finish().expect("gzip")
    };
    let refused = import("bomb", vec![bomb]).await.expect_err("refused");
    assert!(
        matches!(&refused, ClientError::Api { status: 413, .. }),
        "{refused}"
    );

    // The host directory is as it was; the store holds no upload, tree or image of the refused.
    let mut host: Vec<_> = std::fs::read_dir(victim.path())
        .expect("victim")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    host.sort();
    assert_eq!(host, ["keep"]);
    assert_eq!(
        std::fs::read(victim.path().join("keep")).expect("keep"),
        b"host data"
    );
    let store = daemon.state.config.storage.data_dir.join("images");
    assert_eq!(
        std::fs::read_dir(store.join("tmp")).expect("tmp").count(),
        0
    );
    let names: Vec<String> = c
        .images()
        .await
        .expect("list")
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert!(!names.contains(&"dotdot".to_string()) && !names.contains(&"bomb".to_string()));
}

#[tokio::test]
async fn imports_count_in_the_disk_budget_and_a_refusal_reaches_a_streaming_client() {
    let daemon = TestDaemon::start_with(|c| c.engine.storage.disk_budget_mib = Some(48));
    let c = daemon.client();
    // Small enough to fit: the budget bounds the tree, not the operator's 4 GiB limit.
    images::import_two_layer(&c, "small")
        .await
        .expect("fits in 48 MiB");
    let budget = &daemon.state.storage().expect("storage").budget;
    let held = budget.taken_mib();
    assert!(held > 0, "the store is counted in the budget");
    // 64 MiB of incompressible bytes cannot be spooled within what is left: 507, and the
    // client, still sending, gets the answer.
    let dir = tempfile::tempdir().expect("tempdir");
    let big = dir.path().join("big.tar");
    let noise: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&big, noise).expect("write");
    let refused = images::import_file(&c, "big", &big)
        .await
        .expect_err("over budget");
    assert!(
        matches!(&refused, ClientError::Api { status: 507, .. }),
        "{refused}"
    );
    assert_eq!(
        budget.taken_mib(),
        held,
        "the refused upload gave its share back"
    );
    let store = daemon.state.config.storage.data_dir.join("images");
    assert_eq!(
        std::fs::read_dir(store.join("tmp")).expect("tmp").count(),
        0
    );
    c.delete_image("small").await.expect("remove");
    assert_eq!(budget.taken_mib(), 0, "an empty store holds nothing");
}

#[tokio::test]
async fn a_create_requests_user_overrides_the_images_as_docker_run_user_does() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let as_user = |image: &str, user: &str| CreateSandbox {
        image: Some(image.into()),
        user: Some(user.into()),
        ..CreateSandbox::default()
    };
    // The built-in image, a bare uid:gid it has no entry for.
    let info = c
        .create(&as_user("default", "1234:5678"))
        .await
        .expect("create");
    assert_eq!(info.user.as_deref(), Some("1234:5678"));
    let (out, err, code) = sh(&c, &info.id, "id -u; id -g; echo $HOME").await;
    assert_eq!((out.as_str(), code), ("1234\n5678\n/\n", 0), "{err}");

    // An imported image whose User is ci, run as root instead (and back to ci by name).
    images::import_two_layer(&c, "ci").await.expect("import");
    let info = c.create(&as_user("ci", "root")).await.expect("create");
    assert_eq!(info.user.as_deref(), Some("0:0"));
    let (out, _, _) = sh(&c, &info.id, "id -u; echo $HOME; pwd").await;
    assert_eq!(out, format!("0\n/root\n{REPLACED}\n"));
    let info = c.create(&with_image("ci")).await.expect("create");
    assert_eq!(
        info.user.as_deref(),
        Some("1000:1000"),
        "the image's own User"
    );

    for bad in ["nobody-here", "ci:nogroup", ""] {
        let refused = c.create(&as_user("ci", bad)).await.expect_err("refused");
        assert!(
            matches!(&refused, ClientError::Api { status: 400, .. }),
            "{bad:?}: {refused}"
        );
    }
}

#[tokio::test]
async fn an_exec_requests_user_and_rlimits_apply_to_that_command_only() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    images::import_two_layer(&c, "ci").await.expect("import");
    // A sandbox of the image run as root; one command as the image's ci (by name, with its
    // supplementary group and home), one as a bare uid:gid.
    let id = c
        .create(&CreateSandbox {
            image: Some("ci".into()),
            user: Some("root".into()),
            ..CreateSandbox::default()
        })
        .await
        .expect("create")
        .id;
    let as_user = |user: &str| ExecRequest {
        user: user.into(),
        ..ExecRequest::new(["sh", "-c", "id -u; id -G; echo $HOME"])
    };
    let out = c.exec_collect(&id, &as_user("ci")).await.expect("exec");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1000\n1000 2000\n/home/ci\n",
        "{:?}",
        out.result
    );
    let out = c
        .exec_collect(&id, &as_user("4321:99"))
        .await
        .expect("exec");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "4321\n99\n/\n");
    // The request's HOME wins over the user's.
    let mut request = as_user("ci");
    request.env.insert("HOME".into(), "/elsewhere".into());
    let out = c.exec_collect(&id, &request).await.expect("exec");
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("/elsewhere\n"));
    // Groups added (`docker run --group-add`): by name or number, over the user's own.
    let mut request = as_user("ci");
    request.group_add = vec!["builders".into(), "4242".into(), "ci".into()];
    let out = c.exec_collect(&id, &request).await.expect("exec");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("1000\n1000 2000 4242\n"),
        "{:?} {:?}",
        String::from_utf8_lossy(&out.stdout),
        out.result
    );
    // Without a user of its own: added to whoever the command runs as (root here).
    let request = ExecRequest {
        group_add: vec!["4242".into()],
        ..ExecRequest::new(["id", "-G"])
    };
    let out = c.exec_collect(&id, &request).await.expect("exec");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0 4242\n");
    let request = ExecRequest {
        group_add: vec!["nosuch".into()],
        ..ExecRequest::new(["true"])
    };
    let refused = c
        .exec_collect(&id, &request)
        .await
        .expect_err("unknown group");
    assert!(
        matches!(&refused, ClientError::Api { status: 400, .. })
            && refused.to_string().contains("nosuch"),
        "{refused}"
    );
    // The sandbox's own user is untouched.
    let (out, _, _) = sh(&c, &id, "id -u").await;
    assert_eq!(out, "0\n");
    for bad in ["nobody-here", "ci:nogroup"] {
        let refused = c.exec_collect(&id, &as_user(bad)).await.expect_err(bad);
        assert!(
            matches!(&refused, ClientError::Api { status: 400, .. }),
            "{bad:?}: {refused}"
        );
    }

    // rlimits: lowered for the command (as the image's user, after the switch they hold).
    let mut request = as_user("ci");
    request.cmd = vec![
        "sh".into(),
        "-c".into(),
        "ulimit -n; ulimit -Hn; ulimit -c".into(),
    ];
    request.rlimits = vec![
        wire::Rlimit {
            kind: "RLIMIT_NOFILE".into(),
            soft: 100,
            hard: 200,
        },
        wire::Rlimit {
            kind: "core".into(),
            soft: 0,
            hard: 0,
        },
    ];
    let out = c.exec_collect(&id, &request).await.expect("exec");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "100\n200\n0\n",
        "{:?}",
        out.result
    );
    // Raising the hard limit past the host's is beyond a namespace sandbox's root: the command
    // does not start and the exit frame says why.
    request.rlimits = vec![wire::Rlimit {
        kind: "nofile".into(),
        soft: u64::MAX,
        hard: u64::MAX,
    }];
    let out = c.exec_collect(&id, &request).await.expect("exec");
    assert!(
        out.result.error.contains("cannot set the nofile limit") && out.stdout.is_empty(),
        "{:?}",
        out.result
    );
    request.rlimits = vec![wire::Rlimit {
        kind: "RLIMIT_NOPE".into(),
        soft: 1,
        hard: 1,
    }];
    let refused = c.exec_collect(&id, &request).await.expect_err("bad type");
    assert!(
        matches!(&refused, ClientError::Api { status: 400, .. }),
        "{refused}"
    );
}
