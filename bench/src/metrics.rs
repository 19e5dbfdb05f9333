//! Our metrics, each through the public API (HTTP on the daemon's Unix socket) unless it says
//! otherwise (the agent-socket exec round trip, and the footprint read from `/proc`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use api_types::{BackendKind, CreateSandbox};
use bytes::Bytes;
use client::{Client, ExecEvent};
use tokio::net::UnixStream;
use wire::agent::AgentRequest;
use wire::{Direction, ExecRequest, FrameType};

use super::blocking;
use super::daemon::{self, ChildDaemon, InProcess};
use super::model::{Measurement, Unit};
use super::peers::gib_per_s;
use super::stats::{median, ms, Runs};

/// Sizes and counts of one run (`--quick` shrinks every one of them).
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Whether this is `--quick`.
    pub quick: bool,
    /// Repeated runs each figure is the median of.
    pub runs: usize,
    /// Creates per run.
    pub creates: usize,
    /// Execs per run (API and agent socket).
    pub execs: usize,
    /// Interactive echo round trips per run.
    pub echoes: usize,
    /// Bytes of stdout streamed per run.
    pub stdout_bytes: u64,
    /// Size of the uploaded tar's one file.
    pub tar_bytes: u64,
    /// Number of small files uploaded.
    pub small_files: usize,
    /// Size of the downloaded file.
    pub download_bytes: u64,
    /// Sandboxes created at once.
    pub concurrency: Vec<usize>,
    /// Concurrent execs and the sandboxes they spread over.
    pub concurrent_execs: (usize, usize),
    /// Seconds of sustained creation, split into `runs` windows.
    pub sustain_s: u64,
    /// Spawns per run for the fork/exec floor.
    pub spawns: usize,
    /// Runs per run of the heavier peers (bwrap, unshare, nsenter).
    pub tool_runs: usize,
    /// Unix-socket ping-pongs per run.
    pub pingpongs: usize,
    /// Sandboxes alive for the footprint.
    pub footprint_sandboxes: usize,
    /// Size of the blob the egress benchmark downloads.
    pub egress_blob_bytes: u64,
    /// Downloads of the blob per timed command (sized so one command takes ≥ ~100 ms: the agent
    /// times commands in whole milliseconds).
    pub egress_downloads: usize,
    /// Small requests per timed command, for the proxy's added latency.
    pub egress_requests: usize,
}

impl Plan {
    /// The full plan, or the quick one.
    pub(crate) fn new(quick: bool) -> Self {
        if quick {
            Plan {
                quick,
                runs: 5,
                creates: 6,
                execs: 100,
                echoes: 100,
                stdout_bytes: 32 << 20,
                tar_bytes: 32 << 20,
                small_files: 500,
                download_bytes: 32 << 20,
                concurrency: vec![1, 10],
                concurrent_execs: (100, 10),
                sustain_s: 3,
                spawns: 200,
                tool_runs: 8,
                pingpongs: 2000,
                footprint_sandboxes: 4,
                egress_blob_bytes: 64 << 20,
                egress_downloads: 4,
                egress_requests: 100,
            }
        } else {
            Plan {
                quick,
                runs: 3,
                creates: 50,
                execs: 1000,
                echoes: 1000,
                stdout_bytes: 1 << 30,
                tar_bytes: 256 << 20,
                small_files: 10_000,
                download_bytes: 256 << 20,
                concurrency: vec![1, 10, 50],
                concurrent_execs: (100, 10),
                sustain_s: 30,
                spawns: 1000,
                tool_runs: 50,
                pingpongs: 10_000,
                footprint_sandboxes: 20,
                egress_blob_bytes: 256 << 20,
                egress_downloads: 4,
                egress_requests: 500,
            }
        }
    }
}

fn create_request() -> CreateSandbox {
    CreateSandbox {
        backend: Some(BackendKind::Namespace),
        ..Default::default()
    }
}

fn true_request() -> ExecRequest {
    ExecRequest::new(["true"])
}

/// Runs `true` through the API, requiring exit 0.
async fn exec_true(client: &Client, id: &str) -> Result<()> {
    let out = client
        .exec_collect(id, &true_request())
        .await
        .context("exec true")?;
    ensure!(
        out.result.exit_code == 0,
        "`true` exited {} ({})",
        out.result.exit_code,
        out.result.error
    );
    Ok(())
}

/// Runs a shell command through the API, requiring exit 0.
pub(crate) async fn sh(client: &Client, id: &str, script: &str) -> Result<()> {
    let out = client
        .exec_collect(id, &ExecRequest::new(["sh", "-c", script]))
        .await
        .with_context(|| format!("exec sh -c {script:?}"))?;
    ensure!(
        out.result.exit_code == 0,
        "`sh -c {script:?}` exited {}: {}",
        out.result.exit_code,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Create → ready (`POST /sandboxes` until it returns, which is after the agent's hello), and
/// time to interactive (create + the first `true` finished).
pub(crate) async fn create(plan: &Plan, d: &InProcess) -> Result<Vec<Measurement>> {
    let client = d.client();
    for _ in 0..3 {
        let info = client.create(&create_request()).await.context("create")?;
        client.delete(&info.id).await.context("delete")?;
    }
    let mut ready = Runs::default();
    let mut tti = Runs::default();
    let mut daemon_side = Vec::new();
    for _ in 0..plan.runs {
        let (mut r, mut t) = (Vec::new(), Vec::new());
        for _ in 0..plan.creates {
            let started = Instant::now();
            let info = client.create(&create_request()).await.context("create")?;
            r.push(ms(started.elapsed()));
            daemon_side.push(info.timings.create_to_ready_ms);
            client.delete(&info.id).await.context("delete")?;

            let started = Instant::now();
            let info = client.create(&create_request()).await.context("create")?;
            exec_true(&client, &info.id).await?;
            t.push(ms(started.elapsed()));
            client.delete(&info.id).await.context("delete")?;
        }
        ready.push(r);
        tti.push(t);
    }
    Ok(vec![
        Measurement::latency(
            "create_ready",
            "create → ready (namespace)",
            "ours",
            &ready,
            &format!(
                "POST /sandboxes until it answers (after the agent's hello), sequential, each \
                 deleted untimed; the daemon's own create_to_ready_ms p50 is {:.2} ms",
                median(&daemon_side)
            ),
        ),
        Measurement::latency(
            "tti",
            "time to interactive: create + first `true` (namespace)",
            "ours",
            &tti,
            "POST /sandboxes, then POST …/exec of `true` until its exit frame",
        ),
    ])
}

/// Ready sandboxes the pool-hit daemon keeps.
const POOL_SIZE: usize = 4;

/// Create → ready when a warm pool (`--pool default=4,backend=namespace`) serves the request,
/// on a daemon of its own: before each timed create the pool is full again (waited for,
/// untimed), so every one is a hit, which the daemon's hit counter must confirm.
pub(crate) async fn create_pool_hit(
    plan: &Plan,
    image: &std::path::Path,
) -> Result<Vec<Measurement>> {
    let d = tokio::task::block_in_place(|| {
        InProcess::start_with(image, |c| {
            c.engine.pools = vec![engine::pool::PoolSpec {
                image: "default".into(),
                size: POOL_SIZE,
                memory_mib: None,
                vcpus: None,
                backend: Some(BackendKind::Namespace),
            }];
        })
    })?;
    let client = d.client();
    let mut creates = 0u64;
    for _ in 0..3 {
        d.wait_pool_ready(POOL_SIZE).await?;
        let info = client.create(&create_request()).await.context("create")?;
        client.delete(&info.id).await.context("delete")?;
        creates += 1;
    }
    let mut ready = Runs::default();
    let mut daemon_side = Vec::new();
    for _ in 0..plan.runs {
        let mut r = Vec::new();
        for _ in 0..plan.creates {
            d.wait_pool_ready(POOL_SIZE).await?;
            let started = Instant::now();
            let info = client.create(&create_request()).await.context("create")?;
            r.push(ms(started.elapsed()));
            daemon_side.push(info.timings.create_to_ready_ms);
            client.delete(&info.id).await.context("delete")?;
            creates += 1;
        }
        ready.push(r);
    }
    let metrics = client.metrics().await.context("metrics")?;
    let hits = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("crucible_pool_hits_total ")?
                .parse::<u64>()
                .ok()
        })
        .context("no crucible_pool_hits_total in /metrics")?;
    ensure!(
        hits == creates,
        "only {hits} of {creates} creates were served from the pool"
    );
    tokio::task::block_in_place(|| d.stop());
    Ok(vec![Measurement::latency(
        "create_ready_pool",
        "create → ready, pool hit (namespace)",
        "ours",
        &ready,
        &format!(
            "POST /sandboxes served from a warm pool of {POOL_SIZE} (refilled, untimed, \
             before each), sequential, each deleted untimed; the daemon's own \
             create_to_ready_ms p50 is {:.3} ms",
            median(&daemon_side)
        ),
    )])
}

/// Exec round trips of `true` in a warm sandbox: through the API, and straight to the agent's
/// Unix socket (the daemon's overhead is the difference).
pub(crate) async fn exec(plan: &Plan, d: &InProcess) -> Result<Vec<Measurement>> {
    let client = d.client();
    let info = client.create(&create_request()).await.context("create")?;
    let id = info.id.clone();
    for _ in 0..50 {
        exec_true(&client, &id).await?;
    }
    let socket = d.agent_socket(&id);
    for _ in 0..50 {
        agent_exec_true(&socket).await?;
    }
    // Interleaved, so that both see the same machine: the daemon's overhead is their
    // difference, and a block of one then a block of the other would measure drift too.
    let (mut api, mut agent) = (Runs::default(), Runs::default());
    for _ in 0..plan.runs {
        let mut a = Vec::with_capacity(plan.execs);
        let mut b = Vec::with_capacity(plan.execs);
        for _ in 0..plan.execs {
            let started = Instant::now();
            exec_true(&client, &id).await?;
            a.push(ms(started.elapsed()));
            let started = Instant::now();
            agent_exec_true(&socket).await?;
            b.push(ms(started.elapsed()));
        }
        api.push(a);
        agent.push(b);
    }
    let overhead = daemon_overhead(plan, d.socket.clone(), id.clone(), socket.clone()).await?;
    client.delete(&id).await.context("delete")?;
    Ok(vec![
        Measurement::latency(
            "daemon_overhead",
            "the daemon's share of an exec round trip (API minus agent socket, paired)",
            "ours",
            &overhead,
            "`true` through POST …/exec and over the agent socket by two equally simple blocking \
             clients on one plain thread (no async runtime), alternating; each sample is one \
             pair's difference",
        ),
        Measurement::latency(
            "exec_rtt_api",
            "exec round trip of `true`, HTTP API",
            "ours",
            &api,
            "warm sandbox; a new connection per exec (as the client does); until the exit frame; \
             interleaved with the agent-direct exec below",
        ),
        Measurement::latency(
            "exec_rtt_agent",
            "exec round trip of `true`, agent socket directly",
            "ours",
            &agent,
            "the agent protocol on the sandbox's agent.sock, bypassing the daemon",
        ),
    ])
}

/// What the daemon adds to an exec, as runs of paired differences (ms).
async fn daemon_overhead(
    plan: &Plan,
    daemon: std::path::PathBuf,
    id: String,
    agent: std::path::PathBuf,
) -> Result<Runs> {
    let (runs, execs) = (plan.runs, plan.execs);
    tokio::task::spawn_blocking(move || {
        for _ in 0..50 {
            blocking::api_exec_true(&daemon, &id)?;
            blocking::agent_exec_true(&agent)?;
        }
        let mut overhead = Runs::default();
        for _ in 0..runs {
            let mut diffs = Vec::with_capacity(execs);
            for _ in 0..execs {
                let api = blocking::api_exec_true(&daemon, &id)?;
                let direct = blocking::agent_exec_true(&agent)?;
                diffs.push(ms(api) - ms(direct));
            }
            overhead.push(diffs);
        }
        Ok(overhead)
    })
    .await
    .context("the blocking exec thread")?
}

/// One exec of `true` over the agent protocol directly.
async fn agent_exec_true(socket: &std::path::Path) -> Result<()> {
    let mut stream = UnixStream::connect(socket)
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let request = AgentRequest::Exec {
        tail_bytes: None,
        request: true_request(),
        interactive: false,
        user: None,
    };
    wire::write_message_async(&mut stream, &request)
        .await
        .context("sending the exec request to the agent")?;
    let mut frames = wire::AsyncFrameReader::new(stream, Direction::GuestToHost);
    let mut exited = false;
    while let Some(frame) = frames
        .read_frame()
        .await
        .context("reading the agent's frames")?
    {
        if frame.frame_type == FrameType::Exit {
            let result: wire::ExecResult =
                serde_json::from_slice(frame.payload).context("the exit frame")?;
            ensure!(result.exit_code == 0, "`true` exited {}", result.exit_code);
            exited = true;
        }
    }
    ensure!(exited, "the agent's stream ended without an exit frame");
    Ok(())
}

/// Stdout throughput to the client, and the interactive echo round trip.
pub(crate) async fn streaming(plan: &Plan, d: &InProcess) -> Result<Vec<Measurement>> {
    let client = d.client();
    let info = client.create(&create_request()).await.context("create")?;
    let id = info.id.clone();
    let [head, dd] = stdout_commands(plan.stdout_bytes);
    let [head_rates] = stdout_rates(plan, &client, &id, [ExecRequest::new(head)]).await?;
    // The same dd kept for a re-attach (the default: its output is also copied into the
    // agent's tail) and killed with its connection (no copy), run alternately.
    let keep = ExecRequest::new(dd.iter().cloned());
    let kill = ExecRequest {
        on_disconnect: Some(wire::OnDisconnect::Kill),
        ..keep.clone()
    };
    let [dd_rates, dd_kill_rates] = stdout_rates(plan, &client, &id, [keep, kill]).await?;
    let rates = [head_rates, dd_rates];
    let dd = &dd;
    let socket = d.agent_socket(&id);
    let mut agent_rates = Vec::new();
    for run in 0..=plan.runs {
        let started = Instant::now();
        let got = {
            let (socket, dd) = (socket.clone(), dd.clone());
            tokio::task::spawn_blocking(move || blocking::agent_stream(&socket, &dd))
                .await
                .context("the blocking stream thread")??
        };
        let elapsed = started.elapsed().as_secs_f64();
        ensure!(
            got == plan.stdout_bytes,
            "{dd:?} streamed {got} bytes from the agent"
        );
        if run > 0 {
            agent_rates.push(gib_per_s(got, elapsed));
        }
    }

    let mut echo = Runs::default();
    let mut session = client
        .interactive(&id, &ExecRequest::new(["cat"]))
        .await
        .context("interactive cat")?;
    for run in 0..=plan.runs {
        let mut samples = Vec::with_capacity(plan.echoes);
        for _ in 0..plan.echoes {
            let started = Instant::now();
            session.send_stdin(b"x\n").await.context("stdin")?;
            let mut got = 0;
            while got < 2 {
                match session.next_event().await {
                    Some(Ok(ExecEvent::Stdout(b))) => got += b.len(),
                    Some(Ok(ExecEvent::Stderr(_))) => {}
                    other => bail!("the echo session ended early: {other:?}"),
                }
            }
            samples.push(ms(started.elapsed()));
        }
        if run > 0 {
            echo.push(samples);
        }
    }
    session.close_stdin().await.context("stdin close")?;
    while let Some(event) = session.next_event().await {
        if let ExecEvent::Exit(_) = event.context("the echo session")? {
            break;
        }
    }
    client.delete(&id).await.context("delete")?;
    let cmds = stdout_commands(plan.stdout_bytes);
    Ok(vec![
        Measurement::scalar(
            "stdout_throughput",
            &format!(
                "stdout to the client ({}, `head -c`)",
                size(plan.stdout_bytes)
            ),
            "ours",
            Unit::GibPerS,
            &rates[0],
            &format!(
                "`{}` through POST …/exec, frames decoded by the Rust client",
                cmds[0].join(" ")
            ),
        ),
        Measurement::scalar(
            "stdout_throughput_dd",
            &format!(
                "stdout to the client ({}, 64 KiB writes)",
                size(plan.stdout_bytes)
            ),
            "ours",
            Unit::GibPerS,
            &rates[1],
            &format!(
                "`{}` through POST …/exec: the path's capacity when the command writes 64 KiB at \
                 a time",
                cmds[1].join(" ")
            ),
        ),
        Measurement::scalar(
            "stdout_throughput_dd_kill",
            &format!(
                "stdout to the client ({}, 64 KiB writes, `on_disconnect: kill`)",
                size(plan.stdout_bytes)
            ),
            "ours",
            Unit::GibPerS,
            &dd_kill_rates,
            "the same `dd` asking to die with its connection: the agent keeps no tail for it, so \
             the difference to the row above is what keeping output for a re-attach costs (runs \
             alternate with it)",
        ),
        Measurement::scalar(
            "stdout_throughput_agent",
            &format!(
                "stdout from the agent socket directly ({}, 64 KiB writes)",
                size(plan.stdout_bytes)
            ),
            "ours",
            Unit::GibPerS,
            &agent_rates,
            "the same `dd` over the agent protocol on the sandbox's agent.sock, bypassing the \
             daemon, read by a blocking client on a plain thread (frames counted, not copied)",
        ),
        Measurement::latency(
            "echo_rtt",
            "interactive echo round trip (stdin frame → same bytes back)",
            "ours",
            &echo,
            "`cat` over POST …/exec?stdin=1; 2 bytes per round trip",
        ),
    ])
}

/// The stdout throughput commands: the issue's `head -c` (busybox's writes 4 KiB at a time),
/// and `dd` with 64 KiB blocks.
pub(crate) fn stdout_commands(bytes: u64) -> [Vec<String>; 2] {
    [
        vec![
            "head".into(),
            "-c".into(),
            bytes.to_string(),
            "/dev/zero".into(),
        ],
        vec![
            "dd".into(),
            "if=/dev/zero".into(),
            "bs=65536".into(),
            format!("count={}", bytes / 65536),
        ],
    ]
}

/// Streams `cmd`'s stdout through the API `runs` times after one warm-up; GiB/s per run.
/// The stdout rate of each of `requests`, run in turn within each run (so that peers see the
/// same noise).
async fn stdout_rates<const N: usize>(
    plan: &Plan,
    client: &Client,
    id: &str,
    requests: [ExecRequest; N],
) -> Result<[Vec<f64>; N]> {
    let mut rates: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    for run in 0..=plan.runs {
        for (request, rates) in requests.iter().zip(rates.iter_mut()) {
            let started = Instant::now();
            let mut stream = client.exec(id, request).await.context("exec")?;
            let mut got = 0u64;
            let mut code = None;
            while let Some(event) = stream.next_event().await {
                match event.context("the stdout stream")? {
                    ExecEvent::Stdout(b) => got += b.len() as u64,
                    ExecEvent::Stderr(_) => {}
                    ExecEvent::Exit(r) => code = Some(r.exit_code),
                }
            }
            let elapsed = started.elapsed().as_secs_f64();
            ensure!(
                got == plan.stdout_bytes && code == Some(0),
                "{:?} streamed {got} of {} bytes, exit {code:?}",
                request.cmd,
                plan.stdout_bytes
            );
            // The first pass warms up.
            if run > 0 {
                rates.push(gib_per_s(got, elapsed));
            }
        }
    }
    Ok(rates)
}

/// A human size: `1 GiB`, `256 MiB`.
pub(crate) fn size(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// A tar holding one file of `bytes` bytes.
pub(crate) fn big_tar(bytes: u64) -> Result<Bytes> {
    let mut builder = tar::Builder::new(Vec::with_capacity(bytes as usize + 4096));
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes);
    header.set_mode(0o644);
    header.set_cksum();
    let data = std::io::Read::take(std::io::repeat(0x5a), bytes);
    builder
        .append_data(&mut header, "big.bin", data)
        .context("building the tar")?;
    Ok(Bytes::from(
        builder.into_inner().context("finishing the tar")?,
    ))
}

/// A tar of `count` files of 1 KiB.
pub(crate) fn small_tar(count: usize) -> Result<Bytes> {
    let mut builder = tar::Builder::new(Vec::new());
    let content = [b'y'; 1024];
    for i in 0..count {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(
                &mut header,
                format!("d{:02}/f{i:05}", i % 100),
                &content[..],
            )
            .context("building the tar")?;
    }
    Ok(Bytes::from(
        builder.into_inner().context("finishing the tar")?,
    ))
}

/// Upload of one big tar, of many small files, and download of a big file.
pub(crate) async fn files(plan: &Plan, d: &InProcess, small: &Bytes) -> Result<Vec<Measurement>> {
    let client = d.client();
    let request = CreateSandbox {
        memory_mib: Some(2048),
        ..create_request()
    };
    let info = client.create(&request).await.context("create")?;
    let id = info.id.clone();
    let big = big_tar(plan.tar_bytes)?;
    let (mut up, mut small_ms, mut down) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..=plan.runs {
        let started = Instant::now();
        let result = client
            .put_tar(&id, "/tmp/up", std::io::Cursor::new(big.clone()))
            .await
            .context("uploading the big tar")?;
        let elapsed = started.elapsed().as_secs_f64();
        ensure!(
            result.files == 1,
            "the big tar extracted {} files",
            result.files
        );
        sh(&client, &id, "rm -rf /tmp/up").await?;

        let started = Instant::now();
        let result = client
            .put_tar(&id, "/tmp/small", std::io::Cursor::new(small.clone()))
            .await
            .context("uploading the small files")?;
        let small_elapsed = ms(started.elapsed());
        ensure!(
            result.files as usize == plan.small_files,
            "the small-files tar extracted {} of {} files",
            result.files,
            plan.small_files
        );
        sh(&client, &id, "rm -rf /tmp/small").await?;

        sh(
            &client,
            &id,
            &format!("head -c {} /dev/zero > /tmp/down.bin", plan.download_bytes),
        )
        .await?;
        let started = Instant::now();
        let mut sink = tokio::io::sink();
        let got = client
            .get_file(&id, "/tmp/down.bin", &mut sink)
            .await
            .context("downloading")?;
        let down_elapsed = started.elapsed().as_secs_f64();
        ensure!(got == plan.download_bytes, "downloaded {got} bytes");
        sh(&client, &id, "rm -f /tmp/down.bin").await?;
        if run > 0 {
            up.push(gib_per_s(plan.tar_bytes, elapsed));
            small_ms.push(small_elapsed);
            down.push(gib_per_s(plan.download_bytes, down_elapsed));
        }
    }
    client.delete(&id).await.context("delete")?;
    Ok(vec![
        Measurement::scalar(
            "upload_tar",
            &format!("upload of a {} tar", size(plan.tar_bytes)),
            "ours",
            Unit::GibPerS,
            &up,
            "POST …/files (one file), extracted to the sandbox's tmpfs /tmp",
        ),
        Measurement::scalar(
            "upload_small_files",
            &format!("upload of {} small files (1 KiB each)", plan.small_files),
            "ours",
            Unit::Ms,
            &small_ms,
            "POST …/files of one tar, 100 directories, extracted to tmpfs",
        ),
        Measurement::scalar(
            "download",
            &format!("download of a {} file", size(plan.download_bytes)),
            "ours",
            Unit::GibPerS,
            &down,
            "GET …/files from the sandbox's tmpfs",
        ),
    ])
}

/// Times `tasks` run at once; returns (total ms, each task's ms).
async fn at_once<F, Fut>(tasks: usize, f: F) -> Result<(f64, Vec<f64>)>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let fut = f(i);
            tokio::spawn(async move {
                let t = Instant::now();
                fut.await.map(|()| ms(t.elapsed()))
            })
        })
        .collect();
    let mut each = Vec::with_capacity(tasks);
    for handle in handles {
        each.push(handle.await.context("a task panicked")??);
    }
    Ok((ms(started.elapsed()), each))
}

/// Creates at once, concurrent execs, and sustained creations per second.
pub(crate) async fn concurrency(plan: &Plan, d: &InProcess) -> Result<Vec<Measurement>> {
    let client = Arc::new(d.client());
    let mut out = Vec::new();
    for &n in &plan.concurrency {
        let mut totals = Vec::new();
        let mut each = Runs::default();
        for run in 0..=plan.runs {
            let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
            let (total, lat) = at_once(n, |_| {
                let (client, ids) = (client.clone(), ids.clone());
                async move {
                    let info = client.create(&create_request()).await.context("create")?;
                    ids.lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .push(info.id);
                    Ok(())
                }
            })
            .await?;
            let ids = std::mem::take(&mut *ids.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
            for id in ids {
                client.delete(&id).await.context("delete")?;
            }
            if run > 0 {
                totals.push(total);
                each.push(lat);
            }
        }
        let mut m = Measurement::latency(
            &format!("create_concurrent_{n}"),
            &format!("creates, {n} at once: total (p50/p99/max per create)"),
            "ours",
            &each,
            "all POST /sandboxes issued together; total until the last is ready",
        );
        m.value = median(&totals);
        out.push(m);
    }

    let (execs, sandboxes) = plan.concurrent_execs;
    let mut ids = Vec::new();
    for _ in 0..sandboxes {
        ids.push(client.create(&create_request()).await.context("create")?.id);
    }
    let ids = Arc::new(ids);
    let mut totals = Vec::new();
    let mut each = Runs::default();
    for run in 0..=plan.runs {
        let (total, lat) = at_once(execs, |i| {
            let (client, ids) = (client.clone(), ids.clone());
            async move { exec_true(&client, &ids[i % ids.len()]).await }
        })
        .await?;
        if run > 0 {
            totals.push(total);
            each.push(lat);
        }
    }
    for id in ids.iter() {
        client.delete(id).await.context("delete")?;
    }
    let mut m = Measurement::latency(
        "exec_concurrent",
        &format!("{execs} execs of `true` at once over {sandboxes} sandboxes: total (p50/p99/max per exec)"),
        "ours",
        &each,
        "all POST …/exec issued together",
    );
    m.value = median(&totals);
    out.push(m);

    // Sustained: 4 workers each creating and deleting in a loop; the rate of completed creates
    // in each of `runs` equal windows.
    let window = Duration::from_secs_f64(plan.sustain_s as f64 / plan.runs as f64);
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (client, done, stop) = (client.clone(), done.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let info = client.create(&create_request()).await.context("create")?;
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    client.delete(&info.id).await.context("delete")?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    let mut rates = Vec::new();
    for _ in 0..plan.runs {
        let before = done.load(std::sync::atomic::Ordering::Relaxed);
        let started = Instant::now();
        tokio::time::sleep(window).await;
        let after = done.load(std::sync::atomic::Ordering::Relaxed);
        rates.push((after - before) as f64 / started.elapsed().as_secs_f64());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for worker in workers {
        worker.await.context("a worker panicked")??;
    }
    out.push(Measurement::scalar(
        "creates_per_s",
        &format!("creations per second, sustained for {} s", plan.sustain_s),
        "ours",
        Unit::PerS,
        &rates,
        "4 clients creating and deleting in a loop; median of equal windows",
    ));
    Ok(out)
}

/// Proportional set size of a process, MiB.
fn pss_mib(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    daemon::kib_field(&text, "Pss").map(|k| k / 1024.0)
}

/// Footprint, with the daemon in a child process so its memory is its own: RSS idle, peak RSS
/// under load, and the host memory per sandbox.
pub(crate) async fn footprint(plan: &Plan, image: &std::path::Path) -> Result<Vec<Measurement>> {
    let d = ChildDaemon::start(image).await?;
    let client = Arc::new(d.client());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle = daemon::rss_mib(d.pid(), "VmRSS")?;

    let k = plan.footprint_sandboxes;
    // Warm the allocator with one create/exec/delete so growth below is per sandbox.
    let info = client.create(&create_request()).await.context("create")?;
    exec_true(&client, &info.id).await?;
    client.delete(&info.id).await.context("delete")?;
    let before = daemon::rss_mib(d.pid(), "VmRSS")?;
    let mut ids = Vec::new();
    for _ in 0..k {
        let info = client.create(&create_request()).await.context("create")?;
        exec_true(&client, &info.id).await?;
        ids.push(info.id);
    }
    let after = daemon::rss_mib(d.pid(), "VmRSS")?;
    let mut per_sandbox_pss = Vec::new();
    for id in &ids {
        let pids = daemon::sandbox_pids(&d.cgroup_parent, id)?;
        per_sandbox_pss.push(pids.iter().filter_map(|&p| pss_mib(p)).sum::<f64>());
    }
    let daemon_share = ((after - before) / k as f64).max(0.0);
    let per_sandbox: Vec<f64> = per_sandbox_pss.iter().map(|p| p + daemon_share).collect();

    // Load: concurrent execs over every sandbox plus a stdout stream, then the peak RSS.
    let stream_bytes = if plan.quick { 32u64 << 20 } else { 256 << 20 };
    let ids = Arc::new(ids);
    let streamer = {
        let (client, id) = (client.clone(), ids[0].clone());
        tokio::spawn(async move {
            let request = ExecRequest::new(["head", "-c", &stream_bytes.to_string(), "/dev/zero"]);
            let mut stream = client.exec(&id, &request).await?;
            while let Some(event) = stream.next_event().await {
                event?;
            }
            anyhow::Ok(())
        })
    };
    for _ in 0..3 {
        at_once(ids.len() * 5, |i| {
            let (client, ids) = (client.clone(), ids.clone());
            async move { exec_true(&client, &ids[i % ids.len()]).await }
        })
        .await?;
    }
    streamer.await.context("the streamer panicked")??;
    let loaded = daemon::rss_mib(d.pid(), "VmHWM")?;
    for id in ids.iter() {
        client.delete(id).await.context("delete")?;
    }
    let cycles = if plan.quick { 50 } else { 200 };
    let bounds = super::bounds::measure(&client, d.pid(), cycles).await?;
    d.stop()?;
    let mut measured = vec![
        Measurement::scalar(
            "daemon_rss_idle",
            "daemon RSS, idle",
            "ours",
            Unit::Mib,
            &[idle],
            "a freshly started `crucible serve` (this binary's bench-daemon), no sandboxes",
        ),
        Measurement::scalar(
            "daemon_rss_load",
            "daemon peak RSS under load",
            "ours",
            Unit::Mib,
            &[loaded],
            &format!(
                "VmHWM after {k} sandboxes, 3 bursts of {} concurrent execs and a {} stdout stream",
                k * 5,
                size(stream_bytes)
            ),
        ),
        Measurement::scalar(
            "host_mem_per_sandbox",
            "host memory per sandbox (namespace overhead)",
            "ours",
            Unit::Mib,
            &[median(&per_sandbox)],
            &format!(
                "median over {k} idle sandboxes of the PSS of the sandbox's own processes (the \
                 outside supervisor and the agent, PID 1) plus the daemon's RSS growth per \
                 sandbox ({daemon_share:.2} MiB); nothing a command touched"
            ),
        ),
    ];
    measured.extend(bounds);
    Ok(measured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(size(1 << 30), "1 GiB");
        assert_eq!(size(256 << 20), "256 MiB");
    }

    #[test]
    fn tars_hold_what_they_say() -> Result<()> {
        let tar = small_tar(10)?;
        let mut archive = tar::Archive::new(&tar[..]);
        assert_eq!(archive.entries()?.count(), 10);
        let tar = big_tar(100_000)?;
        let mut archive = tar::Archive::new(&tar[..]);
        let sizes: Vec<u64> = archive
            .entries()?
            .map(|e| e.map(|e| e.size()))
            .collect::<std::io::Result<_>>()?;
        assert_eq!(sizes, vec![100_000]);
        Ok(())
    }
}
