//! Soak: many execs across many sandboxes through one daemon process, with random
//! cancellations and file transfers. Every completed exec gets exactly one exit frame and its
//! exact output (hash-checked), every transfer comes back byte for byte, cancelled commands
//! are killed, the daemon's memory and fds end where they started after a warm-up, and once
//! the sandboxes are deleted nothing of them is left on the host.
//!
//! Short form by default (1,000 execs across 20 sandboxes, part of `cargo test`); the long form
//! is `cargo xtask soak --execs 10000`. Knobs: `CRUCIBLE_SOAK_EXECS`, `CRUCIBLE_SOAK_SANDBOXES`,
//! `CRUCIBLE_SOAK_SEED` (printed, and named in every failure, to replay a run).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_types::CreateSandbox;
use client::{Client, ExecEvent};
use futures_util::StreamExt;
use harness::leaks::{
    assert_nothing_held, eventually_within, memory_cgroup, open_fds, pids_in, rss_kib,
};
use harness::process::DaemonProcess;
use sha2::{Digest, Sha256};
use wire::ExecRequest;

/// Requests in flight at once: enough to overlap execs in one sandbox and across sandboxes on
/// a small host.
const CONCURRENCY: usize = 8;
/// One file transfer (upload, download, compare) per this many execs.
const EXECS_PER_TRANSFER: u64 = 10;
/// Longest any single operation may take before the soak fails (never a hang).
const OPERATION_TIMEOUT: Duration = Duration::from_secs(120);

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}")),
        Err(_) => default,
    }
}

/// What happened, for the report.
#[derive(Debug, Default)]
struct Totals {
    execs_completed: AtomicU64,
    execs_cancelled: AtomicU64,
    exit_frames: AtomicU64,
    transfers: AtomicU64,
    bytes_checked: AtomicU64,
}

/// The SHA-256 of the first `len` bytes of `line` repeated (what `yes` prints).
fn pattern_sha256(line: &[u8], len: u64) -> String {
    let block = line.repeat((64 * 1024 / line.len()).max(1));
    let mut hasher = Sha256::new();
    let mut left = len;
    while left > 0 {
        let take = (block.len() as u64).min(left) as usize;
        hasher.update(&block[..take]);
        left -= take as u64;
    }
    hex::encode(hasher.finalize())
}

/// Output sizes: mostly small, sometimes large, rarely none.
fn output_len(rng: &mut fastrand::Rng) -> u64 {
    match rng.u32(0..100) {
        0..=4 => 0,
        5..=89 => rng.u64(1..16 * 1024),
        90..=98 => rng.u64(16 * 1024..512 * 1024),
        _ => rng.u64(512 * 1024..4 << 20),
    }
}

/// The seed of operation `index`: each operation is reproducible on its own, whatever the
/// interleaving.
fn op_rng(seed: u64, index: u64) -> fastrand::Rng {
    fastrand::Rng::with_seed(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// One exec that runs to completion: checks exactly one exit frame, the exit code and both
/// streams' exact content.
async fn complete_exec(c: &Client, id: &str, index: u64, rng: &mut fastrand::Rng, totals: &Totals) {
    let (out_len, err_len) = (output_len(rng), rng.u64(0..4096));
    let code = rng.i32(0..4);
    let out_line = format!("out {index} {}\n", rng.u64(..));
    let err_line = format!("err {index}\n");
    let script = format!(
        "yes '{}' | head -c {out_len}; yes '{}' | head -c {err_len} >&2; exit {code}",
        out_line.trim_end(),
        err_line.trim_end()
    );
    let mut stream = c
        .exec(id, &ExecRequest::new(["sh", "-c", &script]))
        .await
        .unwrap_or_else(|e| panic!("exec {index}: {e}"));
    let (mut stdout, mut stderr) = (Sha256::new(), Sha256::new());
    let (mut out_seen, mut err_seen) = (0u64, 0u64);
    let mut exits = Vec::new();
    while let Some(event) = stream.next_event().await {
        match event.unwrap_or_else(|e| panic!("exec {index}: {e}")) {
            ExecEvent::Stdout(b) => {
                assert!(
                    exits.is_empty(),
                    "exec {index}: output after the exit frame"
                );
                stdout.update(&b);
                out_seen += b.len() as u64;
            }
            ExecEvent::Stderr(b) => {
                assert!(
                    exits.is_empty(),
                    "exec {index}: output after the exit frame"
                );
                stderr.update(&b);
                err_seen += b.len() as u64;
            }
            ExecEvent::Exit(result) => exits.push(result),
        }
    }
    assert_eq!(exits.len(), 1, "exec {index}: exit frames {exits:?}");
    let result = &exits[0];
    assert_eq!(result.exit_code, code, "exec {index}: {result:?}");
    assert_eq!(
        (out_seen, err_seen),
        (out_len, err_len),
        "exec {index}: lost bytes"
    );
    assert_eq!(
        hex::encode(stdout.finalize()),
        pattern_sha256(out_line.as_bytes(), out_len),
        "exec {index}: stdout changed"
    );
    assert_eq!(
        hex::encode(stderr.finalize()),
        pattern_sha256(err_line.as_bytes(), err_len),
        "exec {index}: stderr changed"
    );
    totals.execs_completed.fetch_add(1, Ordering::Relaxed);
    totals.exit_frames.fetch_add(1, Ordering::Relaxed);
    totals
        .bytes_checked
        .fetch_add(out_len + err_len, Ordering::Relaxed);
}

/// One exec the client abandons: mid-output (an endless `yes`) or before any (a `sleep`). What
/// arrived must be exact; the command must die (checked for all at the end).
async fn cancelled_exec(
    c: &Client,
    id: &str,
    index: u64,
    rng: &mut fastrand::Rng,
    totals: &Totals,
) {
    let line = format!("cancel {index}\n");
    let quiet = rng.bool();
    let script = if quiet {
        "sleep 1000".to_string()
    } else {
        format!("yes '{}'", line.trim_end())
    };
    // A cancellation that kills: a command left to run on is `namespace_attach.rs`'s case.
    let request = ExecRequest {
        on_disconnect: Some(wire::OnDisconnect::Kill),
        ..ExecRequest::new(["sh", "-c", &script])
    };
    let mut stream = c
        .exec(id, &request)
        .await
        .unwrap_or_else(|e| panic!("exec {index}: {e}"));
    if !quiet {
        let want = rng.u64(1..256 * 1024);
        let mut seen = Vec::new();
        while (seen.len() as u64) < want {
            match stream.next_event().await {
                Some(Ok(ExecEvent::Stdout(b))) => seen.extend_from_slice(&b),
                other => panic!("exec {index}: expected endless output, got {other:?}"),
            }
        }
        assert_eq!(
            hex::encode(Sha256::digest(&seen)),
            pattern_sha256(line.as_bytes(), seen.len() as u64),
            "exec {index}: the output before the cancellation changed"
        );
        totals
            .bytes_checked
            .fetch_add(seen.len() as u64, Ordering::Relaxed);
    }
    drop(stream);
    totals.execs_cancelled.fetch_add(1, Ordering::Relaxed);
}

/// Uploads a random file, downloads it and compares.
async fn transfer(c: &Client, id: &str, index: u64, rng: &mut fastrand::Rng, totals: &Totals) {
    let len = rng.usize(0..256 * 1024);
    let content: Vec<u8> = std::iter::repeat_with(|| rng.u8(..)).take(len).collect();
    let name = format!("soak-{index}.bin");
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(len as u64);
    header.set_mode(0o644);
    tar.append_data(&mut header, &name, &content[..])
        .expect("tar");
    let archive = tar.into_inner().expect("tar");
    let put = c
        .put_tar(id, "/tmp", std::io::Cursor::new(archive))
        .await
        .unwrap_or_else(|e| panic!("transfer {index}: upload: {e}"));
    assert!(put.refused.is_none(), "transfer {index}: {put:?}");
    let mut back = Vec::new();
    c.get_file(id, &format!("/tmp/{name}"), &mut back)
        .await
        .unwrap_or_else(|e| panic!("transfer {index}: download: {e}"));
    assert_eq!(
        hex::encode(Sha256::digest(&back)),
        hex::encode(Sha256::digest(&content)),
        "transfer {index}: the file came back changed ({} of {len} bytes)",
        back.len()
    );
    totals.transfers.fetch_add(1, Ordering::Relaxed);
    totals
        .bytes_checked
        .fetch_add(2 * len as u64, Ordering::Relaxed);
}

/// Runs operations `range` (execs, with a transfer every [`EXECS_PER_TRANSFER`]),
/// [`CONCURRENCY`] at a time.
async fn run_ops(
    c: &Client,
    ids: &Arc<Vec<String>>,
    seed: u64,
    range: std::ops::Range<u64>,
    totals: &Arc<Totals>,
) {
    let ops = futures_util::stream::iter(range).map(|index| {
        let (c, ids, totals) = (c.clone(), ids.clone(), totals.clone());
        async move {
            let mut rng = op_rng(seed, index);
            let id = &ids[rng.usize(..ids.len())];
            let op = async {
                if rng.u32(0..100) < 10 {
                    cancelled_exec(&c, id, index, &mut rng, &totals).await;
                } else {
                    complete_exec(&c, id, index, &mut rng, &totals).await;
                }
                if index % EXECS_PER_TRANSFER == EXECS_PER_TRANSFER / 2 {
                    transfer(&c, id, index, &mut rng, &totals).await;
                }
            };
            tokio::time::timeout(OPERATION_TIMEOUT, op)
                .await
                .unwrap_or_else(|_| panic!("operation {index} hung"));
        }
    });
    ops.buffer_unordered(CONCURRENCY).collect::<Vec<()>>().await;
}

/// Waits until every sandbox runs nothing but its agent (and supervisor): every cancelled
/// command has been killed.
async fn quiesce(c: &Client, parent: &str, ids: &[String]) {
    for id in ids {
        let cgroup = memory_cgroup(parent, id);
        eventually_within(
            &format!("sandbox {id} to run only its agent"),
            Duration::from_secs(60),
            || pids_in(&cgroup).len() == harness::leaks::IDLE_PROCESSES,
        )
        .await;
        let info = c.get(id).await.expect("get");
        assert_eq!(info.active_execs, 0, "{id}");
    }
    // Let the daemon's allocator settle after the burst.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_execs_cancellations_and_transfers_lose_nothing_and_leak_nothing() {
    let execs = env_u64("CRUCIBLE_SOAK_EXECS", 1000);
    let sandboxes = env_u64("CRUCIBLE_SOAK_SANDBOXES", 20) as usize;
    let seed = env_u64(
        "CRUCIBLE_SOAK_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    );
    eprintln!(
        "soak: seed {seed} ({execs} execs across {sandboxes} sandboxes; replay with \
         CRUCIBLE_SOAK_SEED={seed})"
    );
    // Name the seed in any failure, whichever task panics.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        eprintln!("soak failed: replay with CRUCIBLE_SOAK_SEED={seed}");
        default_hook(info);
    }));

    let started = Instant::now();
    let daemon = DaemonProcess::start().await;
    let parent = daemon.home().cgroup_parent.clone();
    let pid = daemon.pid();
    let c = daemon.client();
    let mut ids = Vec::new();
    for _ in 0..sandboxes {
        ids.push(
            c.create(&CreateSandbox::default())
                .await
                .expect("create")
                .id,
        );
    }
    let ids = Arc::new(ids);
    let totals = Arc::new(Totals::default());

    // A warm-up grows the daemon's allocator and buffers to their working size; after it,
    // growth is a leak.
    let warm_up = (execs / 5).min(500);
    run_ops(&c, &ids, seed, 0..warm_up, &totals).await;
    quiesce(&c, &parent, &ids).await;
    let (rss_start, fds_start) = (rss_kib(pid), open_fds(pid));
    run_ops(&c, &ids, seed, warm_up..execs, &totals).await;
    quiesce(&c, &parent, &ids).await;
    let (rss_end, fds_end) = (rss_kib(pid), open_fds(pid));

    let metrics = c.metrics().await.expect("metrics");
    let lost = metrics
        .lines()
        .find_map(|l| l.strip_prefix("crucible_execs_lost_total "))
        .unwrap_or("?")
        .to_string();
    for id in ids.iter() {
        c.delete(id).await.expect("delete");
    }
    assert_nothing_held(&daemon.home().state_dir(), &parent).await;
    let duration = started.elapsed();
    let t = &totals;
    let completed = t.execs_completed.load(Ordering::Relaxed);
    let cancelled = t.execs_cancelled.load(Ordering::Relaxed);
    eprintln!(
        "soak: seed {seed}: {} execs ({completed} completed with {} exit frames, {cancelled} \
         cancelled) across {sandboxes} sandboxes, {} file transfers, {} bytes hash-checked, \
         0 lost, execs lost by the daemon: {lost}, {:.1} s; daemon RSS {rss_start} -> {rss_end} \
         KiB, fds {fds_start} -> {fds_end} (after a {warm_up}-exec warm-up)",
        completed + cancelled,
        t.exit_frames.load(Ordering::Relaxed),
        t.transfers.load(Ordering::Relaxed),
        t.bytes_checked.load(Ordering::Relaxed),
        duration.as_secs_f64(),
    );
    assert_eq!(completed + cancelled, execs);
    assert_eq!(lost, "0", "the daemon reports lost execs");
    assert!(
        fds_end <= fds_start,
        "daemon fds grew from {fds_start} to {fds_end}"
    );
    // Bursts of concurrent execs move RSS by a few MiB (allocator fragmentation); a leak of
    // 1 KiB per exec grows it by 8 MiB over the short form's measured 800 execs.
    assert!(
        rss_end <= rss_start + 6 * 1024,
        "daemon RSS grew from {rss_start} to {rss_end} KiB"
    );
}
