//! `cargo xtask critest`: Kubernetes' CRI validation suite (critest, cri-tools v1.26.1)
//! against Debian's containerd with two runtime handlers in the same containerd, on the same
//! images, in the same run: `runc`, the baseline, then `crucible` (the shim, backed by a
//! private `crucible serve` on the namespace backend).
//!
//! The tier fails when a spec passes with runc and fails with crucible unless
//! `shim/critest/known-failures.txt` lists it (with the part of the work it waits for), when
//! a listed spec passes with crucible (the list is kept true), and when the baseline itself
//! fails a spec (the environment is broken). Reports go to `target/crucible/critest/`: per
//! handler `junit.xml`, ginkgo's `report.json` (what is judged) and `critest.log`; the
//! services' logs and `summary.md` beside them.
//!
//! Everything runs in a scratch directory, torn down on the way out, failure or not ([`services`]
//! and [`host`] are guards): containerd's pods removed, containerd, the daemon and the
//! registry stopped, the CNI bridge and its iptables chains removed, the mounts the specs left
//! undone.

mod cri_tools;
mod host;
mod images;
mod services;
mod verdict;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use crate::util::{cargo, describe, run_step, workspace_root};
use services::{Containerd, ContainerdSetup, Daemon, Registry};
use verdict::Run;

/// The pod sandbox image: containerd 1.6's default name, served by our registry.
pub(crate) const SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.6";

/// The committed list of specs expected to fail with crucible only.
const KNOWN_FAILURES: &str = "shim/critest/known-failures.txt";

/// The handlers, baseline first.
const HANDLERS: [&str; 2] = ["runc", "crucible"];

/// Skipped for every handler: it pins an upstream manifest's digest, which no image rebuilt
/// here can have.
const SKIP: &str = "public image with digest";

/// The Debian packages the tier installs when missing, and what for (`cargo xtask ci
/// provision` installs them too). busybox and nginx are not installed: their .debs are
/// fetched with `apt-get download` and unpacked into the stand-in images.
pub(crate) const PACKAGES: &[(&str, &str)] = &[
    ("containerd", "the CRI plugin critest drives"),
    ("runc", "the baseline runtime handler"),
    (
        "golang-go",
        "building critest and crictl from cri-tools' source",
    ),
    (
        "docker-registry",
        "serving the stand-in images to containerd",
    ),
    ("skopeo", "pushing the stand-in images into that registry"),
    (
        "containernetworking-plugins",
        "the pods' CNI network (bridge, host-local, portmap, loopback)",
    ),
    ("iptables", "the portmap plugin's host ports"),
    (
        "build-essential",
        "the stand-in images' static pause and nonewprivs programs",
    ),
];

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Minutes each handler's critest run may take; past it the run is killed (ginkgo's own
    /// suite timeout, a minute shorter, ends it first with a report).
    #[arg(long, default_value_t = 20, value_name = "MIN")]
    deadline_min: u64,
    /// Run only the specs matching this regular expression (ginkgo's focus), for debugging;
    /// listed specs that did not run then do not fail the tier.
    #[arg(long, value_name = "REGEX")]
    focus: Option<String>,
    /// Measure crucible's microVM backend instead (`crucible serve --backend microvm
    /// --hypervisor qemu-tcg`: QEMU TCG, no KVM needed): the same suite and report, but the
    /// crucible failures are printed, not judged against the known-failures list, which is
    /// the namespace backend's. Slow (each pod boots a VM under emulation); not a CI tier.
    #[arg(long)]
    microvm_qemu_tcg: bool,
}

pub(crate) fn run(sh: &Shell, args: Args) -> Result<()> {
    let started = Instant::now();
    let root = workspace_root();
    require_root()?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|t| root.join(t))
        .unwrap_or_else(|| root.join("target"));
    let out = target.join("crucible/critest");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    // Read first: a malformed list fails now, not after twelve minutes.
    let known_path = root.join(KNOWN_FAILURES);
    let known = verdict::parse_known(
        &std::fs::read_to_string(&known_path)
            .with_context(|| format!("reading {}", known_path.display()))?,
        KNOWN_FAILURES,
    )?;

    let mut times: Vec<(String, Duration)> = Vec::new();
    let mut timed = |name: &str, since: Instant| times.push((name.to_string(), since.elapsed()));

    let step = Instant::now();
    eprintln!("==> critest: host packages");
    let apt_log = out.join("apt.log");
    let packages: Vec<&str> = PACKAGES.iter().map(|(p, _)| *p).collect();
    guest_image::deps::ensure(
        &packages,
        "cargo xtask critest",
        &apt_log,
        &guest_image::progress::Plain,
    )
    .map_err(|e| anyhow::anyhow!("{e} (log: {})", apt_log.display()))?;
    timed("host packages", step);

    let cache = guest_image::Cache::default_location().root().to_path_buf();
    let step = Instant::now();
    eprintln!("==> critest: cri-tools {}", cri_tools::VERSION);
    let tools = cri_tools::obtain(sh, &cache, &out.join("cri-tools-build.log"))?;
    timed("cri-tools (critest, crictl)", step);

    let step = Instant::now();
    eprintln!("==> critest: stand-in images");
    let layout = images::obtain(sh, &cache, &out.join("images-build.log"))?;
    timed("stand-in images", step);

    let step = Instant::now();
    let cargo = cargo();
    // The microVM backend runs crucible-vmm beside the daemon (under QEMU, its vsock device).
    let vmm: &[&str] = match args.microvm_qemu_tcg {
        true => &["-p", "crucible-vmm", "--bin", "crucible-vmm"],
        false => &[],
    };
    run_step(
        "build crucible and the shim",
        cmd!(
            sh,
            "nice {cargo} build -p crucible-cli --bin crucible -p crucible-shim --bin containerd-shim-crucible-v2 {vmm...}"
        ),
    )?;
    timed("cargo build", step);
    let bin_dir = target.join("debug");
    let crucible = bin_dir.join("crucible");
    let image = match std::env::var_os("CRUCIBLE_IMAGE") {
        Some(given) => PathBuf::from(given),
        None => {
            // The daemon only talks to an agent of its own protocol: the image is built (or
            // found up to date, in seconds) from this tree, never taken as it lies.
            let step = Instant::now();
            run_step(
                "build the guest image",
                cmd!(sh, "nice {cargo} xtask build-image"),
            )?;
            timed("guest image", step);
            target.join("crucible/image")
        }
    };
    if !image.join("rootfs/init").is_file() {
        bail!(
            "no image at {} (rootfs/init missing): the daemon needs it; run `cargo xtask \
             build-image` first",
            image.display()
        );
    }

    let scratch = host::Scratch::create()?;
    let dir = scratch.path();
    eprintln!("==> critest: services (scratch: {})", dir.display());
    let step = Instant::now();
    // Declared in the order they start: dropped (stopped, cleaned up) in the reverse one.
    let registry = Registry::start(dir, &out.join("registry.log"))?;
    images::push(&layout, &registry.addr, &out.join("skopeo.log"))?;
    let host = host::Host::create(dir)?;
    let backend: &[&str] = match args.microvm_qemu_tcg {
        true => &["--backend", "microvm", "--hypervisor", "qemu-tcg"],
        false => &["--backend", "namespace"],
    };
    let mut daemon = Daemon::start(
        &crucible,
        &image,
        backend,
        dir,
        &out.join("crucible-serve.log"),
    )?;
    let hosts = images::registry_hosts();
    let containerd = Containerd::start(&ContainerdSetup {
        dir,
        log: &out.join("containerd.log"),
        registry: &registry.addr,
        hosts: &hosts,
        daemon_socket: &daemon.socket,
        shim_dir: &bin_dir,
        crictl: &tools.crictl,
        cni_bin: &host.bin_dir,
        cni_conf: &host.conf_dir,
    })?;
    for reference in images::PREPULL {
        containerd
            .crictl(&["pull", reference], Duration::from_secs(120))
            .with_context(|| format!("pre-pulling {reference} through the registry mirror"))?;
    }
    timed("services up, images pushed and pulled", step);

    let mut runs = Vec::new();
    for handler in HANDLERS {
        let run = run_critest(&tools.critest, &containerd, handler, &args, &out, dir)?;
        timed(
            &format!("critest --runtime-handler {handler}"),
            Instant::now() - run.elapsed,
        );
        containerd
            .remove_all_pods()
            .with_context(|| format!("removing the pods left after the {handler} run"))?;
        runs.push(run);
    }

    let step = Instant::now();
    drop(containerd);
    let daemon_stopped = daemon.stop();
    drop(daemon);
    drop(host);
    drop(registry);
    drop(scratch);
    timed("teardown", step);

    let [baseline, crucible_run] = &runs[..] else {
        bail!("expected a run per handler, got {}", runs.len());
    };
    let verdict = verdict::judge(baseline, crucible_run, &known);
    let focused = args.focus.is_some();
    let table = verdict::table(&[baseline, crucible_run]);
    let words = verdict::report(&verdict, KNOWN_FAILURES, focused);
    let words = match args.microvm_qemu_tcg {
        true => verdict::failures(crucible_run),
        false => words,
    };
    let mut summary = format!(
        "critest {} (`cargo xtask critest{}`), skipped for every handler: {SKIP:?}{}\n\n{table}\n{words}",
        cri_tools::VERSION,
        if args.microvm_qemu_tcg {
            " --microvm-qemu-tcg"
        } else {
            ""
        },
        args.focus
            .as_ref()
            .map(|f| format!(", focus {f:?}"))
            .unwrap_or_default()
    );
    summary.push_str("\n| step | time |\n| --- | --- |\n");
    for (name, elapsed) in &times {
        summary.push_str(&format!("| {name} | {:.0} s |\n", elapsed.as_secs_f64()));
    }
    summary.push_str(&format!(
        "| **total** | {:.0} s |\n",
        started.elapsed().as_secs_f64()
    ));
    let summary_path = out.join("summary.md");
    std::fs::write(&summary_path, &summary)
        .with_context(|| format!("writing {}", summary_path.display()))?;
    eprintln!(
        "\n==> critest: results (also in {})\n{summary}",
        summary_path.display()
    );
    daemon_stopped?;
    if args.microvm_qemu_tcg {
        eprintln!(
            "==> critest: measured the microVM backend (QEMU TCG) in {:.0?}; not judged",
            started.elapsed()
        );
        return Ok(());
    }
    if !verdict.passed(focused) {
        bail!(
            "critest: crucible's results differ from {KNOWN_FAILURES} (above); reports in {}",
            out.display()
        );
    }
    eprintln!(
        "==> critest: passed ({} known crucible-only failures) in {:.0?}",
        verdict.known.len(),
        started.elapsed()
    );
    Ok(())
}

/// Namespace sandboxes, containerd and the CNI network all need root.
fn require_root() -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .context("reading /proc/self")?;
    if uid != 0 {
        bail!("cargo xtask critest needs root (containerd, runc, the CNI network, the daemon)");
    }
    Ok(())
}

/// Runs critest against `containerd` with `handler`, to its end or its deadline; its
/// reports and log go to `out/<handler>/`.
fn run_critest(
    critest: &Path,
    containerd: &Containerd,
    handler: &str,
    args: &Args,
    out: &Path,
    scratch: &Path,
) -> Result<Run> {
    let reports = out.join(handler);
    std::fs::create_dir_all(&reports)?;
    // The specs' temporary host paths, seccomp profiles and log directories: in the scratch
    // directory, removed with it.
    let tmp = scratch.join(format!("tmp-{handler}"));
    std::fs::create_dir_all(&tmp)?;
    let log = reports.join("critest.log");
    let json = reports.join("report.json");
    let deadline = Duration::from_secs(args.deadline_min.max(2) * 60);
    let endpoint = containerd.endpoint();
    let mut command = Command::new(critest);
    command
        .args([
            "--runtime-endpoint",
            &endpoint,
            "--image-endpoint",
            &endpoint,
        ])
        .args(["--runtime-handler", handler])
        .args(["--ginkgo.skip", SKIP])
        .arg(format!(
            "--ginkgo.junit-report={}",
            reports.join("junit.xml").display()
        ))
        .arg(format!("--ginkgo.json-report={}", json.display()))
        .arg("--ginkgo.no-color")
        .arg(format!(
            "--ginkgo.timeout={}s",
            deadline.as_secs().saturating_sub(60)
        ));
    if handler == HANDLERS[0] {
        // The baseline is not what is tested: a spec that flakes with runc is run again rather
        // than failing the tier for the environment's sake.
        command.arg("--ginkgo.flake-attempts=2");
    }
    if let Some(focus) = &args.focus {
        command.args(["--ginkgo.focus", focus]);
    }
    let file =
        std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    command
        .current_dir(scratch)
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    eprintln!(
        "==> critest --runtime-handler {handler}: {}",
        describe(&command)
    );
    eprintln!("    log: {}", log.display());
    let started = Instant::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {}", critest.display()))?;
    let mut said = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        if said.elapsed() > Duration::from_secs(60) {
            eprintln!(
                "    critest ({handler}): {:.0} s…",
                started.elapsed().as_secs_f64()
            );
            said = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let elapsed = started.elapsed();
    let Some(status) = status else {
        bail!(
            "critest --runtime-handler {handler} did not finish within {deadline:?}: killed; \
             its log ({}) ends:\n{}",
            log.display(),
            services::tail(&log)
        );
    };
    if !json.is_file() {
        bail!(
            "critest --runtime-handler {handler} ended ({status}) without writing {}; its log \
             ends:\n{}",
            json.display(),
            services::tail(&log)
        );
    }
    let specs = verdict::read_report(&json)?;
    if specs.is_empty() {
        bail!(
            "critest --runtime-handler {handler} ran no spec ({status}); see {}",
            log.display()
        );
    }
    eprintln!(
        "    critest ({handler}) ended ({status}) in {:.0} s",
        elapsed.as_secs_f64()
    );
    Ok(Run {
        handler: handler.to_string(),
        specs,
        elapsed,
    })
}
