//! Runs the suite: the floor first (while this process is small), then our metrics against an
//! in-process daemon, the namespace peers, and the footprint against a child daemon.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use host_probe::host::HostKind;

use super::daemon::{self, InProcess};
use super::metrics::{self, Plan};
use super::model::{
    cost_ratio, format_value, Goal, Machine, Measurement, Results, Row, Skipped, Unit,
};
use super::peers;
use super::sections::{Section, Selection};
use super::stats::Runs;

/// Which backends to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backends {
    /// The namespace backend.
    pub namespace: bool,
    /// The microVM backend.
    pub microvm: bool,
}

/// The machine, for the top of the report.
pub(crate) fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|v| v.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let host = engine::host::inspect();
    let kvm = match host.kvm {
        HostKind::KvmIntel | HostKind::KvmAmd => "hardware (kvm_intel/kvm_amd)",
        HostKind::KvmPvm => "kvm_pvm (nested, pagetable-based)",
        HostKind::Unknown => "unknown KVM module",
        HostKind::None => "none",
    };
    Machine {
        cpu,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into()),
        memory_mib: daemon::kib_field(&meminfo, "MemTotal").map_or(0, |k| (k / 1024.0) as u64),
        kvm: kvm.into(),
        cgroup: format!("v{}", host.cgroup_version),
    }
}

fn step(name: &str) -> Instant {
    eprintln!("==> bench: {name}");
    Instant::now()
}

fn done(started: Instant) {
    eprintln!("    done in {:.1?}", started.elapsed());
}

/// Runs the sections `selection` names, as the plan sizes them.
pub(crate) fn run(
    plan: &Plan,
    image: &Path,
    backends: Backends,
    selection: &Selection,
    command: String,
) -> Result<Results> {
    let started = Instant::now();
    let mut measurements: Vec<Measurement> = Vec::new();
    let mut skipped: Vec<Skipped> = Vec::new();
    let rootfs = image.join("rootfs");
    let small = metrics::small_tar(plan.small_files)?;
    // The fork+exec floor runs in a fresh, small helper process (fork's cost grows with the
    // forking process's memory), in bursts spread over the whole suite so that the ratios
    // gated in CI compare figures taken under the same machine load.
    let mut fork_floor = Runs::default();
    if selection.has(Section::Floor) {
        floor(plan, &rootfs, &small, &mut fork_floor, &mut measurements)?;
    }

    if selection.has(Section::Vmm) {
        let t = step("VMM overhead: the I/O test guest under KVM");
        super::vmm_overhead::measure(plan, &mut measurements, &mut skipped)?;
        done(t);
    }

    if backends.microvm {
        skipped.push(Skipped {
            what: "microVM backend on crucible-vmm (every KVM metric)".into(),
            reason: crate::microvm_skip_reason(),
        });
    }
    if selection.has(Section::Create) {
        if let Some(reason) = peers::qemu_microvm_unavailable(image) {
            skipped.push(Skipped {
                what: "QEMU microvm peer (KVM)".into(),
                reason,
            });
        }
    }

    if backends.namespace {
        namespace(
            plan,
            image,
            selection,
            &small,
            &mut fork_floor,
            &mut measurements,
            &mut skipped,
        )?;
    }

    if !fork_floor.summaries.is_empty() {
        measurements.insert(
            0,
            Measurement::latency(
                "floor_fork_exec",
                "host fork+exec+wait of `true`",
                "floor",
                &fork_floor,
                "fork(2), execv(2) of the host's /bin/true, waitpid(2), from a small helper \
                 process; runs spread over the whole suite",
            ),
        );
    }
    let mut results = Results {
        command,
        quick: plan.quick,
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        elapsed_s: started.elapsed().as_secs_f64(),
        machine: machine(),
        measurements,
        rows: rows(plan),
        goals: Vec::new(),
        skipped,
    };
    results.goals = goals(&results);
    Ok(results)
}

/// The floor, while this process is still small (fork copies its page tables).
fn floor(
    plan: &Plan,
    rootfs: &Path,
    small: &[u8],
    fork_floor: &mut Runs,
    measurements: &mut Vec<Measurement>,
) -> Result<()> {
    let t = step("floor: fork+exec, posix_spawn, Unix-socket ping-pong and stream");
    let host_true = peers::host_true()?;
    for _ in 0..plan.runs {
        fork_floor.push(peers::fork_exec_burst(plan.spawns)?);
    }
    let runs = peers::repeat(plan.runs, plan.spawns, plan.spawns / 10, || {
        peers::posix_spawn_once(&host_true)
    })?;
    measurements.push(Measurement::latency(
        "floor_posix_spawn",
        "host posix_spawn+wait of `true`",
        "floor",
        &runs,
        "posix_spawn(3) (vfork-style) of /bin/true, waitpid(2)",
    ));
    let runs = peers::unix_pingpong(plan.runs, plan.pingpongs)?;
    measurements.push(Measurement::latency(
        "floor_unix_pingpong",
        "Unix-socket ping-pong (1 byte)",
        "floor",
        &runs,
        "a socketpair to an echoing thread",
    ));
    let mut rates = Vec::new();
    for run in 0..=plan.runs {
        let rate = peers::unix_stream_gibps(plan.stdout_bytes)?;
        if run > 0 {
            rates.push(rate);
        }
    }
    measurements.push(Measurement::scalar(
        "floor_unix_stream",
        &format!(
            "Unix-socket byte stream ({})",
            metrics::size(plan.stdout_bytes)
        ),
        "floor",
        Unit::GibPerS,
        &rates,
        "64 KiB writes through a socketpair between two threads",
    ));
    let cmds = metrics::stdout_commands(plan.stdout_bytes);
    for (key, cmd) in ["floor_host_head", "floor_host_dd"].iter().zip(&cmds) {
        let mut rates = Vec::new();
        for run in 0..=plan.runs {
            let rate = peers::host_command_gibps(rootfs, cmd, plan.stdout_bytes)?;
            if run > 0 {
                rates.push(rate);
            }
        }
        measurements.push(Measurement::scalar(
            key,
            &format!("the same `{}` on the host, into a pipe", cmd[0]),
            "floor",
            Unit::GibPerS,
            &rates,
            &format!(
                "the image's static busybox `{}` run directly on the host, its stdout a pipe \
                 read in 64 KiB reads: the command alone, without a sandbox",
                cmd.join(" ")
            ),
        ));
    }
    let mut times = Vec::new();
    for run in 0..=plan.runs {
        let t = peers::host_extract_ms(small)?;
        if run > 0 {
            times.push(t);
        }
    }
    measurements.push(Measurement::scalar(
        "floor_host_extract",
        &format!("host extraction of the {} small files", plan.small_files),
        "floor",
        Unit::Ms,
        &times,
        "the same tar unpacked by the tar crate into a tmpfs directory on the host",
    ));
    done(t);
    Ok(())
}

/// The namespace backend's sections, with the peers that need its sandboxes or run beside it.
fn namespace(
    plan: &Plan,
    image: &Path,
    selection: &Selection,
    small: &bytes::Bytes,
    fork_floor: &mut Runs,
    measurements: &mut Vec<Measurement>,
    skipped: &mut Vec<Skipped>,
) -> Result<()> {
    let rootfs = image.join("rootfs");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the client runtime")?;
    let through_api = [
        Section::Create,
        Section::Exec,
        Section::Streaming,
        Section::Files,
        Section::Concurrency,
        Section::Peers,
        Section::Sdk,
    ];
    if selection.any(&through_api) {
        let d = InProcess::start(image)?;
        eprintln!(
            "    daemon on {} (cgroup parent {})",
            d.socket.display(),
            d.cgroup_parent
        );
        let bursts = selection.has(Section::Floor);
        let fork_floor = std::sync::Mutex::new(&mut *fork_floor);
        let burst = || -> Result<()> {
            if !bursts {
                return Ok(());
            }
            let samples = peers::fork_exec_burst(plan.spawns / 2)?;
            fork_floor
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .push(samples);
            Ok(())
        };
        let result = runtime.block_on(async {
            let mut out = Vec::new();
            burst()?;
            if selection.has(Section::Create) {
                let t = step("create → ready and time to interactive");
                out.extend(metrics::create(plan, &d).await?);
                done(t);
                let t = step("create → ready from a warm pool");
                out.extend(metrics::create_pool_hit(plan, image).await?);
                done(t);
                burst()?;
            }
            if selection.has(Section::Exec) {
                let t = step("exec round trips (API and agent socket)");
                out.extend(metrics::exec(plan, &d).await?);
                done(t);
                burst()?;
            }
            if selection.has(Section::Streaming) {
                let t = step("streaming (stdout throughput, interactive echo)");
                out.extend(metrics::streaming(plan, &d).await?);
                done(t);
                burst()?;
            }
            if selection.has(Section::Files) {
                let t = step("files (upload tar, small files, download)");
                out.extend(metrics::files(plan, &d, small).await?);
                done(t);
                burst()?;
            }
            if selection.has(Section::Concurrency) {
                let t = step("concurrency");
                out.extend(metrics::concurrency(plan, &d).await?);
                done(t);
                burst()?;
            }
            anyhow::Ok(out)
        });
        measurements.extend(result?);

        if selection.has(Section::Sdk) {
            let t = step("exec round trips through the Python and TypeScript SDKs");
            super::sdks::measure(plan, &d.socket, measurements, skipped)?;
            done(t);
        }

        if selection.has(Section::Peers) {
            // nsenter into a running sandbox, while the daemon is up.
            let t = step("peers: nsenter into a running sandbox");
            nsenter_peer(plan, &runtime, &d, measurements, skipped)?;
            done(t);
        }
        d.stop();
    }

    if selection.has(Section::Peers) {
        let t = step("peers: bubblewrap one-shot, unshare + pivot_root");
        one_shot_peers(plan, &rootfs, measurements, skipped)?;
        done(t);
    }

    if selection.has(Section::Egress) {
        let t = step("egress proxy next to a direct host connection");
        measurements.extend(runtime.block_on(super::egress::measure(plan, image))?);
        done(t);
    }

    if selection.has(Section::Pods) {
        let t = step("pods: a sandbox with containers, a job beside a service");
        measurements.extend(runtime.block_on(super::pods::measure(plan, image))?);
        done(t);
    }

    if selection.has(Section::Footprint) {
        let t = step("footprint (daemon in a child process)");
        measurements.extend(runtime.block_on(metrics::footprint(plan, image))?);
        done(t);
    }

    if selection.has(Section::Nested) {
        if plan.quick {
            skipped.push(Skipped {
                what: "microVM boot, nested TCG (crucible-vmm vs QEMU microvm)".into(),
                reason: "not in --quick (it boots an L1 under emulation): `cargo xtask bench \
                         --only nested`"
                    .into(),
            });
        } else {
            let t = step("microVM boot, nested TCG: crucible-vmm vs QEMU microvm in one L1");
            measurements.extend(super::nested::measure(plan)?);
            done(t);
        }
    }

    if selection.has(Section::Tcg) {
        match super::qemu_tcg::unavailable(image) {
            None => {
                let t = step("microVMs under QEMU TCG (--hypervisor qemu-tcg)");
                measurements.extend(runtime.block_on(super::qemu_tcg::measure(plan, image))?);
                done(t);
            }
            Some(reason) => skipped.push(Skipped {
                what: "microVM backend under QEMU TCG".into(),
                reason,
            }),
        }
    }
    Ok(())
}

/// `nsenter` into a running sandbox of `d`, running `true`.
fn nsenter_peer(
    plan: &Plan,
    runtime: &tokio::runtime::Runtime,
    d: &InProcess,
    measurements: &mut Vec<Measurement>,
    skipped: &mut Vec<Skipped>,
) -> Result<()> {
    match peers::ensure_tool("nsenter", "util-linux") {
        Ok(nsenter) => {
            let client = d.client();
            let info = runtime
                .block_on(client.create(&api_types::CreateSandbox {
                    backend: Some(api_types::BackendKind::Namespace),
                    ..Default::default()
                }))
                .context("create for nsenter")?;
            let pid = daemon::sandbox_init_pid(&d.cgroup_parent, &info.id)?;
            let runs = peers::repeat(plan.runs, plan.tool_runs, 5, || {
                peers::command_ms(&mut peers::nsenter_command(&nsenter, pid))
            })?;
            measurements.push(Measurement::latency(
                "peer_nsenter_exec",
                "nsenter into a running sandbox + exec `true`",
                "nsenter",
                &runs,
                &format!(
                    "`nsenter --target <PID 1> --all /bin/true`, PID 1 found via the \
                     sandbox's cgroup.procs (NSpid 1): how docker/runc exec work ({nsenter})"
                ),
            ));
            runtime
                .block_on(client.delete(&info.id))
                .context("delete")?;
        }
        Err(reason) => skipped.push(Skipped {
            what: "nsenter peer".into(),
            reason,
        }),
    }
    Ok(())
}

/// bubblewrap one-shot and `unshare` + `pivot_root`, each running `true`.
fn one_shot_peers(
    plan: &Plan,
    rootfs: &Path,
    measurements: &mut Vec<Measurement>,
    skipped: &mut Vec<Skipped>,
) -> Result<()> {
    match peers::ensure_tool("bwrap", "bubblewrap") {
        Ok(bwrap) => {
            let runs = peers::repeat(plan.runs, plan.tool_runs, 3, || {
                peers::command_ms(&mut peers::bwrap_command(&bwrap, rootfs))
            })?;
            measurements.push(Measurement::latency(
                "peer_bwrap",
                "bwrap one-shot: create namespaces + run `true`",
                "bwrap",
                &runs,
                &format!(
                    "`{bwrap} --tmpfs / --ro-bind <image>/bin /bin --proc /proc --dev /dev \
                     --tmpfs /tmp --unshare-all --die-with-parent /bin/true`"
                ),
            ));
        }
        Err(reason) => skipped.push(Skipped {
            what: "bubblewrap peer".into(),
            reason,
        }),
    }
    match peers::ensure_tool("unshare", "util-linux") {
        Ok(unshare) => {
            let scratch = tempfile::Builder::new()
                .prefix("crucible-bench-unshare-")
                .tempdir()
                .context("scratch directory")?;
            let runs = peers::repeat(plan.runs, plan.tool_runs, 3, || {
                peers::command_ms(&mut peers::unshare_command(
                    &unshare,
                    rootfs,
                    scratch.path(),
                ))
            })?;
            measurements.push(Measurement::latency(
                "peer_unshare_pivot_root",
                "unshare + pivot_root: create namespaces + run `true`",
                "unshare",
                &runs,
                "`unshare --mount --uts --ipc --net --pid --fork`, a tmpfs root with the \
                 image's /bin bound and a private /proc, `pivot_root . .`, `umount -l .`, \
                 exec /bin/true",
            ));
        }
        Err(reason) => skipped.push(Skipped {
            what: "unshare + pivot_root peer".into(),
            reason,
        }),
    }
    Ok(())
}

/// The table: our metric, its peers, and the floor of its gated ratio.
fn rows(plan: &Plan) -> Vec<Row> {
    let row = |section: &str, metric: &str, peers: &[&str], floor: Option<&str>, gated: bool| Row {
        section: section.into(),
        metric: metric.into(),
        peers: peers.iter().map(|p| p.to_string()).collect(),
        floor: floor.map(String::from),
        gated,
    };
    let fork = Some("floor_fork_exec");
    let stream = Some("floor_unix_stream");
    let mut rows = vec![
        row(
            "Create",
            "create_ready",
            &["floor_fork_exec", "peer_unshare_pivot_root", "peer_bwrap"],
            fork,
            true,
        ),
        // Not gated: a hit is a map lookup and an HTTP round trip, a few hundredths of a
        // millisecond, whose ratio to the fork/exec floor swings with scheduling noise.
        row(
            "Create",
            "create_ready_pool",
            &["floor_fork_exec", "peer_bwrap", "create_ready"],
            fork,
            false,
        ),
        row(
            "Create",
            "tti",
            &["floor_fork_exec", "peer_bwrap"],
            fork,
            true,
        ),
        row(
            "Exec",
            "exec_rtt_api",
            &["floor_fork_exec", "floor_posix_spawn", "peer_nsenter_exec"],
            fork,
            true,
        ),
        row(
            "Exec",
            "exec_rtt_agent",
            &["floor_fork_exec", "peer_nsenter_exec"],
            fork,
            true,
        ),
        row("Exec", "daemon_overhead", &[], None, false),
        row(
            "Streaming",
            "stdout_throughput",
            &["floor_host_head", "floor_unix_stream"],
            Some("floor_host_head"),
            true,
        ),
        row(
            "Streaming",
            "stdout_throughput_dd",
            &["floor_host_dd", "floor_unix_stream"],
            Some("floor_host_dd"),
            true,
        ),
        // Not gated: it is here to show, paired with the row above, what keeping a command's
        // output for a re-attach costs.
        row(
            "Streaming",
            "stdout_throughput_dd_kill",
            &["stdout_throughput_dd", "floor_host_dd"],
            None,
            false,
        ),
        row(
            "Streaming",
            "stdout_throughput_agent",
            &["floor_host_dd", "floor_unix_stream"],
            Some("floor_host_dd"),
            true,
        ),
        row(
            "Streaming",
            "echo_rtt",
            &["floor_unix_pingpong"],
            Some("floor_unix_pingpong"),
            true,
        ),
        row("Files", "upload_tar", &["floor_unix_stream"], stream, true),
        row(
            "Files",
            "upload_small_files",
            &["floor_host_extract"],
            Some("floor_host_extract"),
            true,
        ),
        row("Files", "download", &["floor_unix_stream"], stream, true),
    ];
    for &n in &plan.concurrency {
        // Only the counts both --quick and the full run measure are gated.
        let gated = n <= 10;
        rows.push(row(
            "Concurrency",
            &format!("create_concurrent_{n}"),
            &["floor_fork_exec"],
            fork,
            gated,
        ));
    }
    rows.push(row(
        "Concurrency",
        "exec_concurrent",
        &["floor_fork_exec"],
        fork,
        true,
    ));
    rows.push(row(
        "Concurrency",
        "creates_per_s",
        &["floor_fork_exec"],
        fork,
        true,
    ));
    for m in [
        "daemon_rss_idle",
        "daemon_rss_load",
        "host_mem_per_sandbox",
        "daemon_rss_bounds",
        "daemon_rss_churn",
    ] {
        rows.push(row("Footprint", m, &[], None, false));
    }
    // Emulated CPUs: no floor, no gate, not comparable with the figures above.
    for m in [
        "tcg_create_ready",
        "tcg_exec_rtt",
        "tcg_stdout",
        "tcg_host_mem_per_sandbox",
    ] {
        rows.push(row("microVM under QEMU TCG", m, &[], None, false));
    }
    rows.extend(super::sdks::rows());
    rows.extend(super::egress::rows());
    rows.extend(super::pods::rows());
    rows.extend(super::vmm_overhead::rows());
    rows.extend(super::nested::rows());
    rows
}

fn goal(results: &Results, text: &str, key: &str, pass: impl Fn(f64) -> bool) -> Goal {
    match results.get(key) {
        Some(m) => Goal {
            goal: text.into(),
            measured: format_value(m.value, m.unit),
            met: Some(pass(m.value)),
        },
        None => Goal {
            goal: text.into(),
            measured: "not measured".into(),
            met: None,
        },
    }
}

/// The published goals, with this run's figures.
fn goals(results: &Results) -> Vec<Goal> {
    let mut goals = vec![goal(
        results,
        "exec round trip p50 ≤ 1 ms through the HTTP API",
        "exec_rtt_api",
        |v| v <= 1.0,
    )];
    let ratio = results
        .get("exec_rtt_api")
        .zip(results.get("floor_fork_exec"))
        .and_then(|(a, b)| cost_ratio(a, b));
    goals.push(Goal {
        goal: "exec round trip ≤ 10× the fork/exec floor".into(),
        measured: ratio.map_or("not measured".into(), |r| format!("{r:.2}× the floor")),
        met: ratio.map(|r| r <= 10.0),
    });
    goals.push(goal(
        results,
        "namespace create → ready ≤ 10 ms p50",
        "create_ready",
        |v| v <= 10.0,
    ));
    goals.push(goal(
        results,
        "create → ready p50 ≤ 1 ms through the HTTP API for a pool hit",
        "create_ready_pool",
        |v| v <= 1.0,
    ));
    goals.push(goal(
        results,
        "stdout ≥ 1 GiB/s",
        "stdout_throughput",
        |v| v >= 1.0,
    ));
    let microvm_reason = results
        .skipped
        .iter()
        .find(|s| s.what.starts_with("microVM backend on crucible-vmm"))
        .map_or_else(crate::microvm_skip_reason, |s| s.reason.clone());
    for text in [
        "microVM create → ready ≤ 25 ms p50",
        "microVM create → ready ≥ 5× faster than QEMU microvm on the same kernel",
    ] {
        goals.push(Goal {
            goal: text.into(),
            measured: format!("not measurable here: {microvm_reason}"),
            met: None,
        });
    }
    goals.push(goal(
        results,
        "host overhead ≤ 3 MiB per sandbox",
        "host_mem_per_sandbox",
        |v| v <= 3.0,
    ));
    goals.push(goal(
        results,
        "the daemon adds ≤ 50 µs p50 over the agent socket (paired, blocking clients)",
        "daemon_overhead",
        |v| v <= 0.050,
    ));
    let gap = results
        .get("exec_rtt_agent")
        .zip(results.get("floor_posix_spawn"))
        .map(|(agent, spawn)| agent.value - spawn.value);
    goals.push(Goal {
        goal: "agent-socket exec of `true` within 0.1 ms of posix_spawn, p50".into(),
        measured: gap.map_or("not measured".into(), |g| format!("{:+.3} ms", g)),
        met: gap.map(|g| g <= 0.1),
    });
    for (text, ours, peer, at_least) in [
        (
            "stdout through the API ≥ 0.9× the host pipe (64 KiB writes)",
            "stdout_throughput_dd",
            "floor_host_dd",
            0.9,
        ),
        (
            "stdout from the agent socket ≥ 0.95× the host pipe (64 KiB writes)",
            "stdout_throughput_agent",
            "floor_host_dd",
            0.95,
        ),
        (
            "upload ≥ 0.4× the Unix-socket stream",
            "upload_tar",
            "floor_unix_stream",
            0.4,
        ),
        (
            "download ≥ 0.4× the Unix-socket stream",
            "download",
            "floor_unix_stream",
            0.4,
        ),
    ] {
        goals.push(speed_goal(results, text, ours, peer, at_least));
    }
    let echo = results
        .get("echo_rtt")
        .zip(results.get("floor_unix_pingpong"))
        .and_then(|(a, b)| cost_ratio(a, b));
    goals.push(Goal {
        goal: "interactive echo ≤ 2× the Unix-socket ping-pong".into(),
        measured: echo.map_or("not measured".into(), |r| format!("{r:.2}× the ping-pong")),
        met: echo.map(|r| r <= 2.0),
    });
    // The egress goal of many small requests over new connections, shown beside what a
    // minimal proxy (no checks, one thread) pays for the same extra hop in the same run.
    let ratio_of = |ours: &str, peer: &str| {
        results
            .get(ours)
            .zip(results.get(peer))
            .and_then(|(a, b)| cost_ratio(a, b))
    };
    let named = ratio_of("egress_named_request", "floor_direct_named_request");
    let minimal = ratio_of("peer_minimal_proxy_request", "floor_direct_request");
    goals.push(Goal {
        goal: "egress: many small requests over new connections (by name, slow resolver) ≤ 1.3× \
               direct"
            .into(),
        measured: match (named, minimal) {
            (Some(r), Some(m)) => format!(
                "{r:.2}× direct; a minimal proxy with no checks pays {m:.2}× for the same hop"
            ),
            (Some(r), None) => format!("{r:.2}× direct"),
            _ => "not measured".into(),
        },
        met: named.map(|r| r <= 1.3),
    });
    for (key, text) in super::sdks::goals() {
        goals.push(goal(results, &text, &key, |v| {
            v <= super::sdks::OVERHEAD_GOAL_MS
        }));
    }
    goals
}

/// A throughput goal as a fraction of a peer's speed (the inverse of the cost ratio).
fn speed_goal(results: &Results, text: &str, ours: &str, peer: &str, at_least: f64) -> Goal {
    let speed = results
        .get(ours)
        .zip(results.get(peer))
        .and_then(|(a, b)| cost_ratio(a, b))
        .map(|cost| 1.0 / cost);
    Goal {
        goal: text.into(),
        measured: speed.map_or("not measured".into(), |s| format!("{s:.2}× its speed")),
        met: speed.map(|s| s >= at_least),
    }
}
