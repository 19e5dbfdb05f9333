//! Revoking an API key hands nothing of its to another key. A bare key (no `name:`) is named
//! after the key itself, not after its place in the configuration, so when a key is removed
//! and the daemon restarted, the keys that stay keep their names: none of them becomes the
//! revoked key's owner name and inherits its sandboxes (taken back under `--live-restore`),
//! its caches or its images (kept on disk by owner name, with or without live restore). Under
//! live restore a revoked key's sandboxes are deleted at the restart.

use api_types::{CacheMount, CreateSandbox};
use client::{Client, ClientError, Endpoint};
use harness::process::DaemonHome;
use harness::TestDaemon;
use wire::ExecRequest;

/// Two bare keys, configured as `CRUCIBLE_API_KEYS=KEY_A,KEY_B`.
const KEY_A: &str = "tenant-a-4d1f9e07c2b85a31";
const KEY_B: &str = "tenant-b-a93c5e1176d02f4e";
const CACHE: &str = "build";
const IMAGE: &str = "tools";

/// A daemon in `home` (so that the next one finds what it left) with the bare `keys` on TCP,
/// with or without live restore.
fn daemon(home: &DaemonHome, keys: &[&str], live_restore: bool) -> TestDaemon {
    TestDaemon::start_with(|c| {
        c.unix_socket = Some(home.socket());
        c.engine.state_dir = home.state_dir();
        c.engine.storage.data_dir = home.state_dir().with_extension("data");
        c.engine.cgroup_parent = home.cgroup_parent.clone();
        c.engine.live_restore = live_restore;
        c.tcp = Some("127.0.0.1:0".parse().expect("addr"));
        c.api_keys = harness::keys(keys);
    })
}

fn tcp_client(daemon: &TestDaemon, key: &str) -> Client {
    let addr = daemon.tcp.expect("a TCP address");
    Client::new(Endpoint::Tcp(addr.to_string())).with_api_key(key)
}

fn with_cache() -> CreateSandbox {
    CreateSandbox {
        caches: vec![CacheMount {
            name: CACHE.into(),
            path: "/cache".into(),
            size_mib: Some(32),
            save: true,
        }],
        ..CreateSandbox::default()
    }
}

fn assert_not_found<T: std::fmt::Debug>(result: Result<T, ClientError>, what: &str) {
    match result {
        Err(ClientError::Api { status: 404, .. }) => {}
        other => panic!("{what}: expected 404, got {other:?}"),
    }
}

/// Key A makes a sandbox that writes into its cache, and imports an image; returns the
/// sandbox's id.
async fn tenant_a_work(c: &Client) -> String {
    let id = c.create(&with_cache()).await.expect("create").id;
    let (out, err, code) = harness::sh(c, &id, "echo only-for-a > /cache/secret").await;
    assert_eq!(code, 0, "{out}{err}");
    harness::images::import_two_layer(c, IMAGE)
        .await
        .expect("import an image");
    assert_eq!(c.caches().await.expect("caches").len(), 1);
    id
}

/// What key B must not see of key A's: its caches and images (and, through a sandbox of its
/// own with a cache of the same name, the bytes key A left in its cache). Returns the owner
/// name key B's sandboxes get.
async fn assert_tenant_b_sees_nothing_of_a(c: &Client) -> String {
    let caches = c.caches().await.expect("caches");
    assert!(
        caches.is_empty(),
        "key A's caches went to key B: {caches:?}"
    );
    let images: Vec<_> = c
        .images()
        .await
        .expect("images")
        .into_iter()
        .filter(|i| i.owner != "*")
        .collect();
    assert!(
        images.is_empty(),
        "key A's images went to key B: {images:?}"
    );
    assert_not_found(c.image(IMAGE).await, "key B inspecting key A's image");

    let own = c.create(&with_cache()).await.expect("key B's own sandbox");
    let (out, err, code) = harness::sh(c, &own.id, "cat /cache/secret 2>/dev/null; true").await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "", "key B read key A's cache");
    c.delete(&own.id).await.expect("delete");
    own.owner.expect("an owner")
}

/// The finding: with `kA,kB` and `--live-restore`, removing `kA` made `kB` "key1", the owner of
/// kA's running sandbox (and of its caches and images). Key B must see none of it: no listing,
/// the 404 of a missing sandbox for inspect, exec and delete; and the sandbox is not taken
/// back at all, but deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_keys_sandbox_is_deleted_at_a_live_restore_never_handed_to_another_key() {
    let home = DaemonHome::new();
    let first = daemon(&home, &[KEY_A, KEY_B], true);
    let a = tcp_client(&first, KEY_A);
    let id = tenant_a_work(&a).await;
    let owner_a = a.get(&id).await.expect("get").owner.expect("an owner");
    assert!(tcp_client(&first, KEY_B)
        .list()
        .await
        .expect("list")
        .is_empty());
    // Under --live-restore a stopping daemon leaves its sandboxes running for the next one.
    first.stop();

    // Key A revoked: only key B configured.
    let second = daemon(&home, &[KEY_B], true);
    let b = tcp_client(&second, KEY_B);
    let listed = b.list().await.expect("list");
    assert!(
        listed.is_empty(),
        "key A's sandbox went to key B: {listed:?}"
    );
    assert_not_found(b.get(&id).await, "key B inspecting key A's sandbox");
    assert_not_found(
        b.exec_collect(&id, &ExecRequest::new(["cat", "/cache/secret"]))
            .await,
        "key B running a command in key A's sandbox",
    );
    assert_not_found(b.delete(&id).await, "key B deleting key A's sandbox");
    let owner_b = assert_tenant_b_sees_nothing_of_a(&b).await;
    assert_ne!(owner_b, owner_a, "key B has key A's owner name");

    // A revoked key's sandbox is not taken back at all: the Unix socket, which sees
    // everything, finds none, and its processes are gone. A daemon without live restore then
    // removes the rest (the cgroup parent), so that nothing outlives the test.
    let root = second.client();
    let left = root.list().await.expect("list");
    assert!(
        left.is_empty(),
        "a revoked key's sandbox was taken back: {left:?}"
    );
    assert_not_found(
        root.get(&id).await,
        "the socket inspecting the revoked sandbox",
    );
    harness::leaks::assert_sandbox_released(&home.state_dir(), &home.cgroup_parent, &id).await;
    second.stop();
    daemon(&home, &[KEY_B], false).stop();
}

/// Without live restore every sandbox goes with the daemon, but caches and images stay on
/// disk by owner name: a revoked key's go to no other key, and they are its own again if the
/// very key comes back, wherever it is in the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_keys_caches_and_images_go_to_no_other_key_and_follow_the_key_not_its_place() {
    let home = DaemonHome::new();
    let first = daemon(&home, &[KEY_A, KEY_B], false);
    let a = tcp_client(&first, KEY_A);
    let id = tenant_a_work(&a).await;
    a.delete(&id).await.expect("delete");
    first.stop();

    let second = daemon(&home, &[KEY_B], false);
    assert_tenant_b_sees_nothing_of_a(&tcp_client(&second, KEY_B)).await;
    second.stop();

    // Key A back, now second in the list: its cache and image are where it left them.
    let third = daemon(&home, &[KEY_B, KEY_A], false);
    let a = tcp_client(&third, KEY_A);
    let caches = a.caches().await.expect("caches");
    assert_eq!(
        caches.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        [CACHE]
    );
    a.image(IMAGE).await.expect("key A's image");
    let id = a.create(&with_cache()).await.expect("create").id;
    let (out, err, code) = harness::sh(&a, &id, "cat /cache/secret").await;
    assert_eq!((out.as_str(), code), ("only-for-a\n", 0), "{err}");
    a.delete(&id).await.expect("delete");
    third.stop();
}
