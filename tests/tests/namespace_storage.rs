//! Caches, read-only volumes and disk-backed writable layers, through the real daemon: what a
//! CI job writes to a cache is there for the next job (owned by its root, whatever host ids
//! that sandbox got), and jobs at once each work on a copy; a cache's limit is ENOSPC for the writer and nothing else; a volume
//! cannot be written or remounted; a disk-backed layer holds more than the sandbox's memory
//! and goes with the sandbox. Each check looks at the host too.

use api_types::{CacheMount, CreateSandbox, VolumeMount};
use harness::{loops_backed_under, sh, TestDaemon};

fn cache(name: &str, path: &str, size_mib: Option<u64>) -> CacheMount {
    CacheMount {
        name: name.into(),
        path: path.into(),
        size_mib,
        save: true,
    }
}

#[tokio::test]
async fn a_cache_outlives_its_sandbox_keeps_its_limit_and_is_shared_by_copies() {
    let daemon = TestDaemon::start();
    let data_dir = daemon.state.config.storage.data_dir.clone();
    let c = daemon.client();
    let with_cache = |size| CreateSandbox {
        caches: vec![cache("cargo", "/root/.cargo/registry", size)],
        ..CreateSandbox::default()
    };

    let first = c.create(&with_cache(Some(64))).await.expect("create").id;
    let (out, err, code) = sh(
        &c,
        &first,
        "set -e; cd /root/.cargo/registry; echo 'serde 1.0.0' > index; mkdir -p src/serde; \
         echo built > src/serde/lib.rs; stat -c '%u:%g' .; head -n1 /proc/self/uid_map",
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.lines().next(),
        Some("0:0"),
        "the sandbox's root owns its cache: {out}"
    );
    let first_map = out.lines().nth(1).unwrap_or_default().to_string();
    // A sandbox started meanwhile shares the cache: it gets the cache as it was saved last
    // (empty), not what the first is writing, and its own writes stay its own.
    let parallel = c.create(&with_cache(None)).await.expect("shared").id;
    let (out, err, code) = sh(
        &c,
        &parallel,
        "set -e; cd /root/.cargo/registry; ls -A | grep -v lost+found || true; \
         echo parallel > who",
    )
    .await;
    assert_eq!((out.as_str(), code), ("", 0), "{err}");
    let listed = c.caches().await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].in_use_by.as_deref(), Some(first.as_str()));
    assert_eq!(listed[0].users, [first.clone(), parallel.clone()]);
    assert_eq!(listed[0].size_mib, 64);
    let rm = c.delete_cache("cargo").await.expect_err("in use");
    assert!(rm.to_string().contains("409"), "{rm}");
    // The first ends first: the cache becomes what it left; the other's writes are dropped.
    c.delete(&first).await.expect("delete");
    c.delete(&parallel).await.expect("delete");

    // The next job, in a sandbox holding other host ids (the first one's range is taken by a
    // sandbox made in between), finds what the first wrote, owned by its own root.
    let between = c
        .create(&CreateSandbox::default())
        .await
        .expect("between")
        .id;
    let second = c.create(&with_cache(None)).await.expect("create").id;
    let (out, err, code) = sh(
        &c,
        &second,
        "set -e; cd /root/.cargo/registry; cat index src/serde/lib.rs; stat -c '%u:%g' index; \
         head -n1 /proc/self/uid_map; test ! -e who",
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..3], ["serde 1.0.0", "built", "0:0"], "{out}");
    assert_ne!(
        lines[3], first_map,
        "the two sandboxes hold different host ids"
    );

    // The limit: the writer gets ENOSPC; the sandbox, its other files and the cache's
    // earlier contents are fine; the host's image never grows past the limit.
    // What it writes goes to its own copy, which becomes the cache when it ends.
    let copy = data_dir.join(format!("caches/namespace/unix/.in-use/cargo@{second}.ext4"));
    harness::assert_cache_limit_holds(
        &c,
        &second,
        "/root/.cargo/registry",
        "serde 1.0.0",
        &copy,
        (64, 200),
    )
    .await;
    let image = data_dir.join("caches/namespace/unix/cargo.ext4");

    // Freed with its sandbox: the loop device goes, the cache can be deleted.
    c.delete(&second).await.expect("delete");
    c.delete(&between).await.expect("delete");
    for _ in 0..200 {
        if loops_backed_under(&data_dir).is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(loops_backed_under(&data_dir), Vec::<String>::new());
    c.delete_cache("cargo").await.expect("delete the cache");
    assert!(!image.exists());
    assert!(c.caches().await.expect("list").is_empty());
}

#[tokio::test]
async fn a_volume_is_read_only_whatever_root_inside_tries() {
    let volume = tempfile::tempdir().expect("tempdir");
    std::fs::write(volume.path().join("toolchain.txt"), "gcc 12\n").expect("write");
    let declared = format!("tools={}:ro", volume.path().display());
    let daemon = TestDaemon::start_with(|config| {
        config
            .engine
            .storage
            .volumes
            .declare(&declared)
            .expect("declare");
    });
    let c = daemon.client();
    let undeclared = c
        .create(&CreateSandbox {
            volumes: vec![VolumeMount {
                name: "datasets".into(),
                path: "/data".into(),
            }],
            ..CreateSandbox::default()
        })
        .await
        .expect_err("undeclared");
    assert!(
        undeclared.to_string().contains("400") && undeclared.to_string().contains("tools"),
        "{undeclared}"
    );
    let id = c
        .create(&CreateSandbox {
            volumes: vec![VolumeMount {
                name: "tools".into(),
                path: "/opt/tools".into(),
            }],
            ..CreateSandbox::default()
        })
        .await
        .expect("create")
        .id;
    let (out, err, code) = sh(
        &c,
        &id,
        "cat /opt/tools/toolchain.txt; stat -c %u /opt/tools/toolchain.txt; \
         echo x > /opt/tools/new 2>&1; echo write=$?; \
         echo x >> /opt/tools/toolchain.txt 2>&1; echo append=$?; \
         rm /opt/tools/toolchain.txt 2>&1; echo rm=$?; \
         mount -o remount,rw /opt/tools 2>&1; echo remount=$?; \
         umount /opt/tools 2>&1; echo umount=$?; \
         mkdir /tmp/m && mount --bind /opt/tools /tmp/m 2>&1; echo bind=$?",
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("gcc 12\n0\n"), "{out}");
    for step in ["write", "append", "rm", "remount", "umount", "bind"] {
        assert!(
            out.contains(&format!("{step}=1")) || out.contains(&format!("{step}=2")),
            "{step} must fail: {out}"
        );
    }
    assert!(out.contains("Read-only file system"), "{out}");
    // The host's directory is as it was.
    let names: Vec<_> = std::fs::read_dir(volume.path())
        .expect("read")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["toolchain.txt"]);
    assert_eq!(
        std::fs::read_to_string(volume.path().join("toolchain.txt")).expect("read"),
        "gcc 12\n"
    );
}

#[tokio::test]
async fn a_disk_backed_layer_holds_more_than_memory_and_goes_with_its_sandbox() {
    let daemon = TestDaemon::start();
    let data_dir = daemon.state.config.storage.data_dir.clone();
    let c = daemon.client();
    let id = c
        .create(&CreateSandbox {
            memory_mib: Some(128),
            disk_mib: Some(320),
            ..CreateSandbox::default()
        })
        .await
        .expect("create")
        .id;
    assert_eq!(c.get(&id).await.expect("get").disk_mib, Some(320));
    // 200 MiB in /root and 40 in /tmp: more than the 128 MiB of memory the sandbox has, so
    // on the default memory-backed layer this could not fit.
    let (out, err, code) = sh(
        &c,
        &id,
        "set -e; dd if=/dev/zero of=/root/big bs=1M count=200 2>/dev/null; \
         dd if=/dev/zero of=/tmp/big bs=1M count=40 2>/dev/null; \
         stat -c '%s %n' /root/big /tmp/big; sync; \
         dd if=/dev/zero of=/root/more bs=1M count=200 2>&1 || echo enospc; \
         echo still > /root/small 2>&1 || true; rm /root/more; echo fine > /root/after; \
         cat /root/after",
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("209715200 /root/big") && out.contains("41943040 /tmp/big"),
        "{out}"
    );
    assert!(
        out.contains("No space left on device") && out.contains("enospc"),
        "{out}"
    );
    assert!(out.trim_end().ends_with("fine"), "{out}");
    let layer = data_dir.join(format!("scratch/{id}.ext4"));
    assert!(layer.exists(), "{}", layer.display());
    c.delete(&id).await.expect("delete");
    assert!(!layer.exists(), "the layer goes with its sandbox");
    for _ in 0..200 {
        if loops_backed_under(&data_dir).is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(loops_backed_under(&data_dir), Vec::<String>::new());
}

#[tokio::test]
async fn storage_requests_past_the_budget_or_malformed_are_refused_and_hold_nothing() {
    let daemon = TestDaemon::start_with(|config| config.engine.storage.disk_budget_mib = Some(256));
    let c = daemon.client();
    let over = c
        .create(&CreateSandbox {
            disk_mib: Some(300),
            ..CreateSandbox::default()
        })
        .await
        .expect_err("over the budget");
    assert!(over.to_string().contains("507"), "{over}");
    for bad in [
        cache("x", "relative", None),
        cache("x", "/proc/x", None),
        cache("../x", "/x", None),
        cache("x", "/", None),
    ] {
        let e = c
            .create(&CreateSandbox {
                caches: vec![bad.clone()],
                ..CreateSandbox::default()
            })
            .await
            .expect_err("malformed");
        assert!(e.to_string().contains("400"), "{bad:?}: {e}");
    }
    // Nothing was held by the refusals: the whole budget is there.
    let id = c
        .create(&CreateSandbox {
            disk_mib: Some(256),
            ..CreateSandbox::default()
        })
        .await
        .expect("the whole budget")
        .id;
    c.delete(&id).await.expect("delete");
    assert!(c.caches().await.expect("list").is_empty());
}
