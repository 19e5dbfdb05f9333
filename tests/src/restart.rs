//! Helpers for the live-restore tests of both backends: a long command that prints a line
//! every half second, what a listing must keep across a restart, re-attaching to a command and
//! checking its whole output, a sandbox's record.

use std::collections::BTreeMap;
use std::path::PathBuf;

use client::{Client, ExecEvent};
use wire::ExecRequest;

use crate::process::DaemonHome;

/// Lines each long command prints, one every 0.5 s: 20 s in all.
pub const LINES: usize = 40;

pub fn script(tag: &str) -> String {
    format!("for i in $(seq 1 {LINES}); do echo {tag}-line$i; sleep 0.5; done; exit 7")
}

pub fn expected(tag: &str) -> String {
    (1..=LINES).map(|i| format!("{tag}-line{i}\n")).collect()
}

/// Starts the long command in `id` and reads its first line; the stream stays open.
pub async fn start_long(c: &Client, id: &str) -> (client::ExecStream, Vec<u8>) {
    let mut stream = c
        .exec(id, &ExecRequest::new(["sh", "-c", &script(id)]))
        .await
        .expect("exec");
    match stream.next_event().await {
        Some(Ok(ExecEvent::Stdout(bytes))) => {
            let first = bytes.to_vec();
            (stream, first)
        }
        other => panic!("{id}: the first line: {other:?}"),
    }
}

/// What a listing says of each sandbox that must survive a restart.
pub fn identities(list: &[api_types::SandboxInfo]) -> BTreeMap<String, String> {
    list.iter()
        .map(|s| {
            (
                s.id.clone(),
                format!(
                    "{:?} {:?} {} {} {:?}",
                    s.owner, s.state, s.created_at_ms, s.expires_at_ms, s.labels
                ),
            )
        })
        .collect()
}

/// Re-attaches to each command from the bytes it had and checks its whole output and status.
pub async fn finish_commands(c: &Client, started: Vec<(String, String, Vec<u8>)>) {
    for (id, exec_id, head) in started {
        let rest = c
            .attach(&id, &exec_id, head.len() as u64)
            .await
            .unwrap_or_else(|e| panic!("{id}: attach {exec_id}: {e}"))
            .collect()
            .await
            .unwrap_or_else(|e| panic!("{id}: the rest of {exec_id}: {e}"));
        let mut all = head;
        all.extend_from_slice(&rest.stdout);
        assert_eq!(
            String::from_utf8_lossy(&all),
            expected(&id),
            "{id}: nothing lost"
        );
        assert_eq!(rest.result.exit_code, 7, "{id}: {:?}", rest.result);
        assert_eq!(rest.result.output_dropped_bytes, 0, "{id}");
    }
}

/// Where sandbox `id`'s live-restore record is.
pub fn record_path(home: &DaemonHome, id: &str) -> PathBuf {
    home.state_dir().join("records").join(format!("{id}.json"))
}

/// Cuts sandbox `id`'s record in half: a daemon must refuse it.
pub fn truncate_record(home: &DaemonHome, id: &str) {
    let path = record_path(home, id);
    let whole = std::fs::read(&path).expect("the record");
    std::fs::write(&path, &whole[..whole.len() / 2]).expect("cut the record");
}

/// One sandbox of each kind live restore must take back beyond the plain one: with egress to
/// a server on the host, a cache, a volume, a disk-backed layer, an imported image. The host
/// side (the server, the volume's directory) is made before the daemon, which must be started
/// with [`Kinds::daemon_options`].
#[derive(Debug)]
pub struct Kinds {
    server: crate::host_net::HostServer,
    volume: tempfile::TempDir,
}

/// The ids of the sandboxes [`Kinds::create`] made.
#[derive(Debug, Clone)]
pub struct KindIds {
    pub network: String,
    pub cache: String,
    pub volume: String,
    pub disk: String,
    pub image: String,
}

impl KindIds {
    /// All of them.
    pub fn all(&self) -> [&str; 5] {
        [
            &self.network,
            &self.cache,
            &self.volume,
            &self.disk,
            &self.image,
        ]
    }
}

/// What the host server answers.
const EGRESS_BODY: &[u8] = b"through a restart\n";
/// The file in the volume.
const VOLUME_FILE: &str = "tool.txt";

impl Kinds {
    /// The host server and the volume's directory.
    pub fn prepare() -> Self {
        let server = crate::host_net::HostServer::responding(|_| {
            crate::host_net::http_response(EGRESS_BODY)
        });
        let volume = tempfile::tempdir().expect("the volume's directory");
        std::fs::write(volume.path().join(VOLUME_FILE), "from the host\n").expect("write");
        Kinds { server, volume }
    }

    /// The daemon's flags these sandboxes need: the server allowed, the volume declared.
    pub fn daemon_options(&self) -> Vec<String> {
        vec![
            "--egress-allow".into(),
            format!("127.0.0.1:{}", self.server.port),
            "--volume".into(),
            format!("restore-tools={}:ro", self.volume.path().display()),
        ]
    }

    /// Creates one sandbox of each kind, each as `base` otherwise (memory, say), and leaves
    /// something in the cache, the disk-backed layer and the image's sandbox to find later.
    pub async fn create(&self, c: &Client, base: &api_types::CreateSandbox) -> KindIds {
        use api_types::{CacheMount, CreateSandbox, NetworkRequest, VolumeMount};
        let make =
            |request: CreateSandbox| async move { c.create(&request).await.expect("create").id };
        crate::images::import_two_layer(c, "restore-image")
            .await
            .expect("import the image");
        let ids = KindIds {
            network: make(CreateSandbox {
                network: Some(NetworkRequest {
                    allow: vec![format!("127.0.0.1:{}", self.server.port)],
                }),
                ..base.clone()
            })
            .await,
            cache: make(CreateSandbox {
                caches: vec![CacheMount {
                    name: "restore-cache".into(),
                    path: "/cache".into(),
                    size_mib: Some(64),
                    save: true,
                }],
                ..base.clone()
            })
            .await,
            volume: make(CreateSandbox {
                volumes: vec![VolumeMount {
                    name: "restore-tools".into(),
                    path: "/tools".into(),
                }],
                ..base.clone()
            })
            .await,
            disk: make(CreateSandbox {
                disk_mib: Some(64),
                ..base.clone()
            })
            .await,
            image: make(CreateSandbox {
                image: Some("restore-image".into()),
                ..base.clone()
            })
            .await,
        };
        self.check_egress(c, &ids.network).await;
        must_sh(c, &ids.cache, "echo cached > /cache/kept").await;
        must_sh(c, &ids.disk, "echo layered > /kept-on-disk").await;
        must_sh(c, &ids.image, "echo imaged > /tmp/kept").await;
        ids
    }

    /// Checks each sandbox works as it did, with what was left in it: call after each
    /// restart.
    pub async fn check(&self, c: &Client, ids: &KindIds) {
        self.check_egress(c, &ids.network).await;
        assert_eq!(must_sh(c, &ids.cache, "cat /cache/kept").await, "cached\n");
        assert_eq!(
            must_sh(c, &ids.volume, &format!("cat /tools/{VOLUME_FILE}")).await,
            "from the host\n"
        );
        assert_eq!(
            must_sh(c, &ids.disk, "cat /kept-on-disk").await,
            "layered\n"
        );
        assert_eq!(must_sh(c, &ids.image, "cat /tmp/kept").await, "imaged\n");
        let probe = must_sh(c, &ids.image, crate::images::TWO_LAYER_PROBE).await;
        let lines: Vec<&str> = probe.lines().collect();
        assert_eq!(lines, crate::images::TWO_LAYER_EXPECTED, "{probe}");
        let info = c.get(&ids.cache).await.expect("get");
        assert_eq!(info.caches.len(), 1, "{info:?}");
        let caches = c.caches().await.expect("caches");
        let cache = caches
            .iter()
            .find(|x| x.name == "restore-cache")
            .expect("the cache");
        assert_eq!(cache.in_use_by.as_deref(), Some(ids.cache.as_str()));
    }

    /// A fetch through the sandbox's proxy reaches the host server.
    async fn check_egress(&self, c: &Client, id: &str) {
        let before = self.server.connections();
        let got = must_sh(
            c,
            id,
            &format!("wget -q -O- http://127.0.0.1:{}/", self.server.port),
        )
        .await;
        assert_eq!(got.as_bytes(), EGRESS_BODY, "{id}: egress");
        assert!(
            self.server.connections() > before,
            "{id}: through the server"
        );
    }
}

/// Runs `script` in `id`, which must succeed; its stdout.
async fn must_sh(c: &Client, id: &str, script: &str) -> String {
    let out = c
        .exec_collect(id, &ExecRequest::new(["sh", "-c", script]))
        .await
        .expect("exec");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert_eq!(
        out.result.exit_code,
        0,
        "{id}: {script}: {}{} {:?}",
        text(&out.stdout),
        text(&out.stderr),
        out.result
    );
    text(&out.stdout)
}

/// The lines the burst command prints after its first.
const BURST_LINES: u32 = 40_000;

/// All the burst command prints.
fn burst_expected() -> String {
    let mut all = String::from("start\n");
    for i in 1..=BURST_LINES {
        all.push_str(&format!("{i}\n"));
    }
    all
}

/// Starts a command in `id` that prints `start`, then, a few seconds later (the daemon is
/// down by then), far more than a small tail keeps; reads its first line.
pub async fn start_burst(c: &Client, id: &str) -> (client::ExecStream, Vec<u8>) {
    let script = format!("echo start; sleep 3; seq 1 {BURST_LINES}; exit 3");
    let mut stream = c
        .exec(id, &ExecRequest::new(["sh", "-c", &script]))
        .await
        .expect("exec");
    match stream.next_event().await {
        Some(Ok(ExecEvent::Stdout(bytes))) => {
            assert_eq!(&bytes[..], b"start\n");
            (stream, bytes.to_vec())
        }
        other => panic!("{id}: the burst's first line: {other:?}"),
    }
}

/// Re-attaches to the burst command from the bytes it had: what the agent no longer kept is
/// reported as dropped, never silently skipped, and the rest is the output's very end.
pub async fn finish_burst(c: &Client, id: &str, exec_id: &str, head: &[u8]) {
    let rest = c
        .attach(id, exec_id, head.len() as u64)
        .await
        .unwrap_or_else(|e| panic!("{id}: attach {exec_id}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{id}: the rest of {exec_id}: {e}"));
    let expected = burst_expected();
    let dropped = rest.result.output_dropped_bytes;
    assert!(
        dropped > 0,
        "{id}: more than the tail was written: {:?}",
        rest.result
    );
    assert_eq!(
        head.len() as u64 + dropped + rest.stdout.len() as u64,
        expected.len() as u64,
        "{id}: every byte is received or counted as dropped"
    );
    assert!(
        expected.as_bytes().ends_with(&rest.stdout),
        "{id}: what is kept is the output's end"
    );
    assert_eq!(rest.result.exit_code, 3, "{id}: {:?}", rest.result);
}

/// Rewrites sandbox `id`'s record through `edit`, root-only as the daemon writes it: a
/// record that lies about its sandbox, which the next daemon must refuse.
pub fn edit_record(home: &DaemonHome, id: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    use std::os::unix::fs::PermissionsExt;
    let path = record_path(home, id);
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("the record")).expect("JSON");
    edit(&mut record);
    std::fs::write(&path, serde_json::to_vec(&record).expect("JSON")).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}
