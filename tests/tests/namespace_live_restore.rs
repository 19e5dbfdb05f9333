//! Live restore on the namespace backend (`--live-restore`): a daemon killed with SIGKILL, or
//! stopped with SIGTERM for an upgrade, leaves its sandboxes running; the next daemon on the
//! same state directory and cgroup parent takes back every one it can verify, with its id,
//! owner, TTL and labels, and the commands that were streaming when the daemon went are
//! re-attached and finish with their output complete and their exit status. What it cannot
//! verify (a truncated record, a supervisor gone, a pid that is another process now, a cgroup
//! emptied, a cache not mounted where its record says) is cleaned up, never adopted, with a
//! log line saying why. A sandbox taken back keeps its caches.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use api_types::{CacheMount, CreateSandbox};
use client::Client;
use harness::leaks::{
    assert_a_new_sandbox_works, assert_nothing_held, eventually_within, sandbox_cgroups,
};
use harness::process::{DaemonHome, DaemonProcess};
use harness::restart::{
    finish_burst, finish_commands, identities, record_path, start_burst, start_long,
    truncate_record, Kinds,
};
use nix::sys::signal::Signal;
use wire::ExecRequest;

const LIVE: &[&str] = &["--live-restore"];

/// The tail the daemons of the restart test keep per command: small, so that the burst
/// command outgrows it.
const TAIL: &str = "65536";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_and_their_commands_survive_a_killed_daemon_and_an_upgrade_restart() {
    let home = DaemonHome::new();
    let kinds = Kinds::prepare();
    let mut options: Vec<String> = vec!["--live-restore".into(), "--exec-tail-bytes".into()];
    options.push(TAIL.into());
    options.extend(kinds.daemon_options());
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let mut daemon = DaemonProcess::start_in(&home, &options).await;
    let c = daemon.client();
    // Twenty sandboxes: fifteen plain ones (ten of them running a command that prints for
    // 20 s, one a command that outgrows its tail while the daemon is down) and one of each
    // kind with more to take back: egress, a cache, a volume, a disk-backed layer, an
    // imported image.
    let mut ids = Vec::new();
    for i in 0..15 {
        let info = c
            .create(&CreateSandbox {
                ttl_s: Some(900 + i),
                labels: BTreeMap::from([("n".to_string(), i.to_string())]),
                ..CreateSandbox::default()
            })
            .await
            .expect("create");
        ids.push(info.id);
    }
    // A TTL within the idle timeout, so that the idle timeout starting again does not move
    // the end a listing shows.
    let kind_ids = kinds
        .create(
            &c,
            &CreateSandbox {
                ttl_s: Some(600),
                ..CreateSandbox::default()
            },
        )
        .await;
    let mut started = Vec::new();
    let mut streams = Vec::new();
    for id in &ids[..10] {
        let (stream, head) = start_long(&c, id).await;
        let exec_id = stream.exec_id().expect("named").to_string();
        started.push((id.clone(), exec_id, head));
        streams.push(stream);
    }
    let (burst_stream, burst_head) = start_burst(&c, &ids[10]).await;
    let burst = (
        ids[10].clone(),
        burst_stream.exec_id().expect("named").to_string(),
    );
    streams.push(burst_stream);
    let before = identities(&c.list().await.expect("list"));
    assert_eq!(before.len(), 20);

    // SIGKILL: nothing of the daemon runs on; its sandboxes do.
    daemon.stop_with(Signal::SIGKILL);
    drop(streams);
    // Long enough for the burst command to write past its tail with nobody attached.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let restarted_at = Instant::now();
    let daemon = DaemonProcess::start_in(&home, &options).await;
    let took = restarted_at.elapsed();
    let c = daemon.client();
    let after = identities(&c.list().await.expect("list"));
    assert_eq!(
        after, before,
        "the same ids, owners, creation times, TTLs and labels"
    );
    eprintln!("a new daemon took back 20 sandboxes and answered in {took:.1?}");

    // New work in the adopted sandboxes: exec and files, and each kind's own.
    let out = c
        .exec_collect(
            &ids[13],
            &ExecRequest::new(["sh", "-c", "echo again; hostname"]),
        )
        .await
        .expect("exec");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("again\n{}\n", ids[13])
    );
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(5);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append_data(&mut header, "kept.txt", &b"hello"[..])
        .expect("tar");
    let archive = tar.into_inner().expect("tar");
    c.put_tar(&ids[14], "/work", std::io::Cursor::new(archive))
        .await
        .expect("upload");
    let mut back = Vec::new();
    c.get_file(&ids[14], "/work/kept.txt", &mut back)
        .await
        .expect("download");
    assert_eq!(back, b"hello");
    kinds.check(&c, &kind_ids).await;
    finish_burst(&c, &burst.0, &burst.1, &burst_head).await;

    // Half the commands are finished through this daemon...
    let rest = started.split_off(5);
    finish_commands(&c, started).await;

    // ...the others after an upgrade-style restart: SIGTERM, which under --live-restore
    // keeps every sandbox.
    let mut daemon = daemon;
    assert!(daemon.stop_with(Signal::SIGTERM).success());
    let daemon = DaemonProcess::start_in(&home, &options).await;
    let c = daemon.client();
    let again = identities(&c.list().await.expect("list"));
    assert_eq!(again, before, "a SIGTERM restart keeps them too");
    finish_commands(&c, rest).await;
    kinds.check(&c, &kind_ids).await;

    for id in ids.iter().map(String::as_str).chain(kind_ids.all()) {
        c.delete(id).await.expect("delete");
    }
    assert_nothing_held(&home.state_dir(), &home.cgroup_parent).await;
    let data = home.state_dir().with_extension("data");
    for kept in ["scratch", "volumes"] {
        let left: Vec<_> = std::fs::read_dir(data.join(kept))
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "left in {kept}: {left:?}");
    }
    assert_a_new_sandbox_works(&c).await;
}

/// The ids of the sandboxes `c` lists.
async fn listed_ids(c: &Client) -> Vec<String> {
    c.list()
        .await
        .expect("list")
        .into_iter()
        .map(|s| s.id)
        .collect()
}

fn read_record(home: &DaemonHome, id: &str) -> serde_json::Value {
    let text = std::fs::read(record_path(home, id)).expect("the record");
    serde_json::from_slice(&text).expect("record JSON")
}

fn supervisor_pid(home: &DaemonHome, id: &str) -> i32 {
    read_record(home, id)["instance"]["supervisor_pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .expect("a pid")
}

/// Writes `value` as `id`'s record, root-only as the daemon writes it.
fn write_record(home: &DaemonHome, id: &str, value: &serde_json::Value) {
    use std::os::unix::fs::PermissionsExt;
    let path = record_path(home, id);
    std::fs::write(&path, serde_json::to_vec(value).expect("JSON")).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// Moves every process of `cgroup` to its parent group.
fn empty_cgroup(cgroup: &Path) {
    let procs = std::fs::read_to_string(cgroup.join("cgroup.procs")).expect("procs");
    let parent = cgroup.parent().expect("a parent group");
    for pid in procs.split_whitespace() {
        std::fs::write(parent.join("cgroup.procs"), pid).expect("move a process out");
    }
}

/// Whether `pid` runs (a zombie nobody reaped yet does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_that_is_not_as_recorded_is_cleaned_up_never_adopted() {
    let home = DaemonHome::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("daemon.log");
    let mut daemon = DaemonProcess::start_logging(&home, LIVE, Some(&log)).await;
    let c = daemon.client();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(
            c.create(&CreateSandbox::default())
                .await
                .expect("create")
                .id,
        );
    }
    let pids: Vec<i32> = ids.iter().map(|id| supervisor_pid(&home, id)).collect();
    daemon.stop_with(Signal::SIGKILL);
    let [truncated, gone, replaced, emptied, kept] = [0, 1, 2, 3, 4].map(|i| ids[i].clone());

    // A truncated record.
    truncate_record(&home, &truncated);
    // A supervisor gone.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pids[1]), Signal::SIGKILL).expect("kill");
    eventually_within("the supervisor to die", Duration::from_secs(10), || {
        !alive(pids[1])
    })
    .await;
    // A pid that is another process now: the same pid, another start time.
    let mut record = read_record(&home, &replaced);
    let ticks = record["instance"]["supervisor_start_ticks"]
        .as_u64()
        .expect("ticks");
    record["instance"]["supervisor_start_ticks"] = (ticks + 1).into();
    write_record(&home, &replaced, &record);
    // A cgroup emptied.
    for cgroup in sandbox_cgroups(&home.cgroup_parent)
        .iter()
        .filter(|g| g.ends_with(&emptied))
    {
        empty_cgroup(cgroup);
    }

    let daemon = DaemonProcess::start_logging(&home, LIVE, Some(&log)).await;
    let c = daemon.client();
    let listed = listed_ids(&c).await;
    assert_eq!(
        listed,
        std::slice::from_ref(&kept),
        "only the intact one is taken back"
    );
    let text = std::fs::read_to_string(&log).expect("the log");
    for (id, whys) in [
        (&truncated, &["not a record"][..]),
        (&gone, &["its supervisor (pid", "it is gone|it has exited"]),
        (&replaced, &["is another process now"]),
        (&emptied, &["does not hold its supervisor"]),
    ] {
        let line = text
            .lines()
            .find(|l| l.contains(&format!("not taking back sandbox {id}")))
            .unwrap_or_else(|| panic!("no log line for {id}:\n{text}"));
        for why in whys {
            assert!(why.split('|').any(|w| line.contains(w)), "{id}: {line}");
        }
        eprintln!("{line}");
    }
    // None of theirs runs on: the replaced and emptied ones' supervisors were the recorded
    // processes, and are killed.
    for (i, pid) in pids.iter().enumerate().take(4) {
        let what = format!("{}'s supervisor (pid {pid}) to end", ids[i]);
        eventually_within(&what, Duration::from_secs(10), || !alive(*pid)).await;
    }
    c.delete(&kept).await.expect("delete");
    assert_nothing_held(&home.state_dir(), &home.cgroup_parent).await;
    assert_a_new_sandbox_works(&c).await;
}

fn with_cache(name: &str, path: &str) -> CreateSandbox {
    CreateSandbox {
        caches: vec![CacheMount {
            name: name.into(),
            path: path.into(),
            size_mib: Some(32),
            save: true,
        }],
        ..CreateSandbox::default()
    }
}

async fn sh_out(c: &Client, id: &str, script: &str) -> String {
    let (out, err, code) = harness::sh(c, id, script).await;
    assert_eq!(code, 0, "{id}: {script}: {out}{err}");
    out
}

/// A sandbox's cache comes back with it: its copy mounted, its data there for the next
/// sandbox once it is deleted (it ends before the other one using the cache). A record naming a cache path where the sandbox has no such
/// mount is refused and its sandbox cleaned up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_taken_back_keeps_its_cache_and_a_forged_cache_path_is_refused() {
    let home = DaemonHome::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("daemon.log");
    let mut daemon = DaemonProcess::start_logging(&home, LIVE, Some(&log)).await;
    let c = daemon.client();
    let kept = c
        .create(&with_cache("build", "/cache/"))
        .await
        .expect("create")
        .id;
    sh_out(&c, &kept, "echo first > /cache/f").await;
    let forged = c
        .create(&with_cache("other", "/other"))
        .await
        .expect("create")
        .id;
    let forged_pid = supervisor_pid(&home, &forged);
    daemon.stop_with(Signal::SIGKILL);
    let mut record = read_record(&home, &forged);
    record["caches"][0]["path"] = "/elsewhere".into();
    write_record(&home, &forged, &record);

    let daemon = DaemonProcess::start_logging(&home, LIVE, Some(&log)).await;
    let c = daemon.client();
    let listed = c.list().await.expect("list");
    let ids: Vec<&str> = listed.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(
        ids,
        [kept.as_str()],
        "only the one as recorded is taken back"
    );
    assert_eq!(listed[0].caches.len(), 1, "{:?}", listed[0]);
    let text = std::fs::read_to_string(&log).expect("the log");
    let line = text
        .lines()
        .find(|l| l.contains(&format!("not taking back sandbox {forged}")))
        .unwrap_or_else(|| panic!("no log line for {forged}:\n{text}"));
    assert!(
        line.contains("its cache \"other\"") && line.contains("not mounted at /elsewhere"),
        "{line}"
    );
    let what = format!("{forged}'s supervisor (pid {forged_pid}) to end");
    eventually_within(&what, Duration::from_secs(10), || !alive(forged_pid)).await;

    // The adopted sandbox has its cache (its own copy), and is its first user still.
    assert_eq!(
        sh_out(&c, &kept, "cat /cache/f; echo second >> /cache/f").await,
        "first\n"
    );
    let caches = c.caches().await.expect("caches");
    let build = caches.iter().find(|x| x.name == "build").expect("build");
    assert_eq!(
        build.in_use_by.as_deref(),
        Some(kept.as_str()),
        "{caches:?}"
    );
    // Another sandbox gets the cache as last saved: the adopted one has not ended yet.
    let parallel = c
        .create(&with_cache("build", "/c2"))
        .await
        .expect("shared")
        .id;
    assert_eq!(
        sh_out(&c, &parallel, "cat /c2/f 2>/dev/null || echo none").await,
        "none\n"
    );

    // Deleted first, its copy becomes the cache; the next sandbox finds what it wrote.
    c.delete(&kept).await.expect("delete");
    c.delete(&parallel).await.expect("delete");
    let next = c
        .create(&with_cache("build", "/c2"))
        .await
        .expect("create")
        .id;
    assert_eq!(sh_out(&c, &next, "cat /c2/f").await, "first\nsecond\n");
    c.delete(&next).await.expect("delete");
    assert_nothing_held(&home.state_dir(), &home.cgroup_parent).await;
    assert_a_new_sandbox_works(&c).await;
}

/// How long a restarted daemon takes to take back N sandboxes (the figure docs/reliability.md
/// gives, N = 10 and 100): from its start to its first answer, which comes only once it has
/// checked and taken back every record. Printed, never asserted (timings are noisy here);
/// every sandbox must be taken back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_and_a_hundred_sandboxes_are_taken_back_and_the_time_is_printed() {
    let home = DaemonHome::new();
    let mut daemon = DaemonProcess::start_in(&home, LIVE).await;
    let mut ids = Vec::new();
    for n in [10, 100] {
        let c = daemon.client();
        while ids.len() < n {
            ids.push(
                c.create(&CreateSandbox::default())
                    .await
                    .expect("create")
                    .id,
            );
        }
        daemon.stop_with(Signal::SIGKILL);
        let started = Instant::now();
        daemon = DaemonProcess::start_in(&home, LIVE).await;
        let took = started.elapsed();
        let listed = daemon.client().list().await.expect("list");
        assert_eq!(listed.len(), n, "every sandbox is taken back");
        eprintln!("live restore: {n} sandboxes taken back, the daemon answered in {took:.1?}");
    }
    let c = daemon.client();
    for id in &ids {
        c.delete(id).await.expect("delete");
    }
    assert_nothing_held(&home.state_dir(), &home.cgroup_parent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_with_containers_is_deleted_when_the_daemon_stops_not_left_unsupervised() {
    let home = DaemonHome::new();
    let mut daemon = DaemonProcess::start_in(&home, LIVE).await;
    let c = daemon.client();
    let plain = c
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let pod: CreateSandbox = serde_json::from_value(serde_json::json!({
        "containers": [{"name": "svc", "command": ["sleep", "600"]}]
    }))
    .expect("a pod request");
    let pod = c.create(&pod).await.expect("create a pod").id;
    assert!(
        !record_path(&home, &pod).exists(),
        "a sandbox with containers has no record"
    );
    let pod_pid = {
        let cgroups = sandbox_cgroups(&home.cgroup_parent);
        let group = cgroups
            .iter()
            .find(|g| g.ends_with(&pod))
            .expect("the pod's cgroup");
        let procs = std::fs::read_to_string(group.join("cgroup.procs")).expect("procs");
        procs
            .split_whitespace()
            .next()
            .and_then(|p| p.parse::<i32>().ok())
            .expect("a process of the pod")
    };

    daemon.stop_with(Signal::SIGTERM);
    // Destroyed before the daemon exits; the wait only covers reaping by init.
    eventually_within(
        "the pod's processes to end",
        Duration::from_secs(10),
        || !alive(pod_pid),
    )
    .await;
    let left: Vec<_> = sandbox_cgroups(&home.cgroup_parent)
        .into_iter()
        .filter(|g| g.ends_with(&pod))
        .collect();
    assert!(left.is_empty(), "the pod's cgroups are gone: {left:?}");

    let daemon = DaemonProcess::start_in(&home, LIVE).await;
    let c = daemon.client();
    let listed = listed_ids(&c).await;
    assert_eq!(
        listed,
        vec![plain.clone()],
        "the plain sandbox is taken back"
    );
    c.delete(&plain).await.expect("delete");
    assert_nothing_held(&home.state_dir(), &home.cgroup_parent).await;
}
