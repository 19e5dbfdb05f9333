//! The suite's front: the arguments, the run (sections, report, plots), the CI gate and its
//! self-test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::util::workspace_root;
use crate::{gate, metrics, plots, report, runner, sections};

/// Set to run the suite from a debug build (`cargo xtask bench` builds it with `--release`, as
/// benchmarks of a debug build mean little).
const ANY_PROFILE_ENV: &str = "CRUCIBLE_BENCH_ANY_PROFILE";

/// Quick runs whose median ratios make the baseline.
const BASELINE_QUICK_RUNS: usize = 3;

/// The exec delay `--check-slowed` injects (µs).
const SLOWED_DELAY_US: u64 = 20_000;

/// The metric the slowed build must fail the gate on.
const SLOWED_METRIC: &str = "exec_rtt_api";

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BackendArg {
    /// Linux namespaces.
    Namespace,
    /// KVM microVMs.
    Microvm,
    /// Every backend this host can run (the others are listed as skipped, with the reason).
    All,
}

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Small N and sizes: a few seconds, every gated ratio still measured.
    #[arg(long)]
    quick: bool,
    /// Which backend(s) to measure.
    #[arg(long, value_enum, default_value = "all")]
    backend: BackendArg,
    /// Where to write `benchmarks.md`, `bench/*.svg` and `bench/bench-results.json` (default:
    /// `docs/` for a full run, `target/crucible/bench-quick/` for --quick).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Compare this run's ratios with the baseline and fail when one is worse than 2× its
    /// baseline.
    #[arg(long)]
    gate: bool,
    /// Rewrite the baseline from this run.
    #[arg(long)]
    update_baseline: bool,
    /// The baseline file.
    #[arg(long, default_value = "bench-baseline.json")]
    baseline: PathBuf,
    /// Self-test of the gate: runs `--quick --gate` with the exec path slowed by the
    /// `CRUCIBLE_DEBUG_EXEC_DELAY_US` test hook and requires it to fail naming the exec metric.
    #[arg(long)]
    check_slowed: bool,
    /// The image directory (default `$CRUCIBLE_IMAGE`, else `target/crucible/image`).
    #[arg(long)]
    image: Option<PathBuf>,
    /// Run only these sections (comma-separated), e.g. `--only egress`; written to
    /// `target/crucible/bench-only/` unless --out says otherwise. A ratio to the host floor
    /// needs `floor` in the list too (egress measures its own direct floor). With --gate, only
    /// the baseline's metrics these sections measure are judged (CI gates the whole suite).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        conflicts_with_all = ["update_baseline", "check_slowed"]
    )]
    only: Vec<sections::Section>,
}

pub(crate) fn run(args: Args) -> Result<()> {
    if cfg!(debug_assertions) && std::env::var_os(ANY_PROFILE_ENV).is_none() {
        bail!(
            "this is a debug build, whose figures mean little: run `cargo xtask bench`, which \
             builds the suite and crucible-vmm with --release (or set {ANY_PROFILE_ENV}=1)"
        );
    }
    if args.check_slowed {
        return check_slowed(&args);
    }
    let root = workspace_root();
    let backends = match args.backend {
        BackendArg::Namespace => runner::Backends {
            namespace: true,
            microvm: false,
        },
        BackendArg::Microvm => runner::Backends {
            namespace: false,
            microvm: true,
        },
        BackendArg::All => runner::Backends {
            namespace: true,
            microvm: true,
        },
    };
    if backends.microvm {
        let reason = microvm_skip_reason();
        eprintln!("==> bench: the microVM backend cannot run on this host: {reason}; skipping it");
        if !backends.namespace {
            bail!(
                "nothing to benchmark: --backend microvm was asked for, but the microVM backend \
                 cannot run here: {reason}"
            );
        }
    }
    let image = args
        .image
        .clone()
        .or_else(|| std::env::var_os("CRUCIBLE_IMAGE").map(PathBuf::from))
        .unwrap_or_else(|| root.join("target/crucible/image"));
    let agent = image.join("rootfs/init");
    if !agent.is_file() {
        bail!(
            "the benchmarks need the image's root tree with the agent at {} (run `cargo xtask \
             build-image`)",
            agent.display()
        );
    }
    if !is_root() {
        bail!("namespace sandboxes (and so the benchmarks) need root");
    }
    let selection = sections::Selection::only(&args.only);
    let out = args.out.clone().unwrap_or_else(|| {
        if selection.is_partial() {
            root.join("target/crucible/bench-only")
        } else if args.quick {
            root.join("target/crucible/bench-quick")
        } else {
            root.join("docs")
        }
    });
    let plot_dir = out.join("bench");
    std::fs::create_dir_all(&plot_dir)
        .with_context(|| format!("creating {}", plot_dir.display()))?;

    let mut command = String::from("cargo xtask bench");
    if args.quick {
        command.push_str(" --quick");
    }
    if let Some(only) = selection.arg() {
        command.push(' ');
        command.push_str(&only);
    }
    let plan = metrics::Plan::new(args.quick);
    let results = runner::run(&plan, &image, backends, &selection, command)?;

    let plots = plots::write_all(&results, &plot_dir)?;
    let plots: Vec<(String, String)> = plots
        .into_iter()
        .map(|(title, file)| (title, format!("bench/{file}")))
        .collect();
    let md_path = out.join("benchmarks.md");
    let notes = std::fs::read_to_string(plot_dir.join("notes.md")).ok();
    std::fs::write(
        &md_path,
        report::markdown(&results, &plots, notes.as_deref()),
    )
    .with_context(|| format!("writing {}", md_path.display()))?;
    let json_path = plot_dir.join("bench-results.json");
    report::write_json(&results, &json_path)?;
    eprintln!("\n{}", report::table(&results));
    for s in &results.skipped {
        eprintln!("    skipped {}: {}", s.what, s.reason);
    }
    eprintln!(
        "==> bench: wrote {}, {} and {} plots in {:.0} s",
        md_path.display(),
        json_path.display(),
        plots.len(),
        results.elapsed_s
    );

    let baseline_path = if args.baseline.is_absolute() {
        args.baseline.clone()
    } else {
        root.join(&args.baseline)
    };
    let ratios = results.gate_ratios();
    if args.update_baseline {
        // CI gates `--quick` ratios, so the baseline holds quick ratios (the median of
        // BASELINE_QUICK_RUNS quick runs); a full run's own ratios are kept for reference.
        let (quick_runs, full_run_ratios) = if args.quick {
            (vec![ratios.clone()], BTreeMap::new())
        } else {
            (Vec::new(), ratios.clone())
        };
        let mut quick_runs = quick_runs;
        let quick_plan = metrics::Plan::new(true);
        while quick_runs.len() < BASELINE_QUICK_RUNS {
            eprintln!(
                "==> bench: quick run {} of {BASELINE_QUICK_RUNS} for the baseline",
                quick_runs.len() + 1
            );
            let quick = runner::run(
                &quick_plan,
                &image,
                backends,
                &sections::Selection::all(),
                "cargo xtask bench --quick".into(),
            )?;
            quick_runs.push(quick.gate_ratios());
        }
        // Other machines' entries are kept; this machine's is replaced.
        let mut baseline = match gate::read(&baseline_path) {
            Ok(old) => old,
            Err(e) => {
                eprintln!("==> bench: starting a new baseline ({e:#})");
                gate::Baseline {
                    note: String::new(),
                    command: String::new(),
                    machines: BTreeMap::new(),
                }
            }
        };
        baseline.note = format!(
            "Cost ratios to the floor measured in the same run (see docs/benchmarks.md), as \
             --quick measures them, per machine (CPU model, cores, kernel): the median of \
             {BASELINE_QUICK_RUNS} quick runs. CI fails when one is more than {}× its value for \
             the machine it runs on in a run and each of its confirmation runs; a machine not \
             listed is gated against each metric's largest ratio here.",
            gate::TOLERANCE
        );
        baseline.command = "cargo xtask bench --quick --update-baseline".into();
        let key = gate::machine_key(
            &results.machine.cpu,
            results.machine.cores,
            &results.machine.kernel,
        );
        baseline.machines.insert(
            key.clone(),
            gate::MachineBaseline {
                note: format!(
                    "the median of {} quick runs; kernel {}, {} MiB",
                    quick_runs.len(),
                    results.machine.kernel,
                    results.machine.memory_mib
                ),
                ratios: gate::median_ratios(&quick_runs),
                full_run_ratios,
            },
        );
        gate::write(&baseline_path, &baseline)?;
        eprintln!(
            "==> bench: wrote the baseline of {key} in {}",
            baseline_path.display()
        );
    }
    if args.gate {
        let key = gate::machine_key(
            &results.machine.cpu,
            results.machine.cores,
            &results.machine.kernel,
        );
        run_gate(
            &baseline_path,
            &key,
            &ratios,
            selection.is_partial(),
            || {
                let again =
                    runner::run(&plan, &image, backends, &selection, results.command.clone())?;
                Ok(again.gate_ratios())
            },
        )?;
    }
    Ok(())
}

/// Gates `ratios` against the baseline; when some fail, re-measures (`remeasure`) up to
/// `gate::CONFIRMATIONS` times and fails only on a metric that failed in every measurement.
fn run_gate(
    baseline_path: &Path,
    machine: &str,
    ratios: &BTreeMap<String, f64>,
    partial: bool,
    mut remeasure: impl FnMut() -> Result<BTreeMap<String, f64>>,
) -> Result<()> {
    let (mut baseline, which) = gate::read(baseline_path)?.for_machine(machine);
    if partial {
        let judged = gate::measured_only(&mut baseline, ratios);
        eprintln!(
            "==> bench gate: --only ran part of the suite; judging the {judged} baseline \
             metrics it measures"
        );
        if judged == 0 {
            bail!(
                "--gate with --only: none of the baseline's metrics is measured by these \
                 sections (a ratio to the host floor needs `floor` in the list too)"
            );
        }
    }
    let show = |verdicts: &[gate::Verdict]| {
        for v in verdicts {
            eprintln!("    {}", v.describe(gate::TOLERANCE));
        }
    };
    eprintln!(
        "==> bench gate against {}: {which}",
        baseline_path.display()
    );
    let first = gate::compare(&baseline, ratios);
    show(&first);
    if gate::failures(&first, gate::TOLERANCE).is_empty() {
        eprintln!("    gate passed ({} ratios)", first.len());
        return Ok(());
    }
    let mut runs = vec![first];
    for round in 1..=gate::CONFIRMATIONS {
        eprintln!(
            "==> bench gate: re-measuring to confirm the failure ({round} of at most {})",
            gate::CONFIRMATIONS
        );
        let again = gate::compare(&baseline, &remeasure()?);
        show(&again);
        runs.push(again);
        if gate::confirmed(&runs, gate::TOLERANCE).is_empty() {
            eprintln!("    gate passed: no failure repeated in confirmation run {round}");
            return Ok(());
        }
    }
    bail!(
        "benchmark gate failed: {} regressed more than {}× against {} in all {} runs (if this \
         is deliberate, `cargo xtask bench --update-baseline`)",
        gate::confirmed(&runs, gate::TOLERANCE).join(", "),
        gate::TOLERANCE,
        baseline_path.display(),
        runs.len()
    )
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// Runs the quick gate with the exec path slowed and requires it to fail, naming the metric.
fn check_slowed(args: &Args) -> Result<()> {
    let out = tempfile::Builder::new()
        .prefix("crucible-bench-slowed-")
        .tempdir()
        .context("temporary output directory")?;
    let exe = std::env::current_exe().context("locating this executable")?;
    let mut cmd = Command::new(exe);
    // Only the sections the exec metric needs: the slowed gate fails and re-measures twice,
    // and the rest of the suite would be measured three times for nothing this checks.
    cmd.args([
        "--quick",
        "--gate",
        "--only",
        "floor,exec",
        "--backend",
        "namespace",
        "--out",
    ])
    .arg(out.path())
    .arg("--baseline")
    .arg(&args.baseline)
    .env(api::DEBUG_EXEC_DELAY_ENV, SLOWED_DELAY_US.to_string())
    .env(ANY_PROFILE_ENV, "1");
    if let Some(image) = &args.image {
        cmd.arg("--image").arg(image);
    }
    eprintln!(
        "==> bench --check-slowed: `{}` with {}={SLOWED_DELAY_US} must fail the gate on {SLOWED_METRIC}",
        crate::util::describe(&cmd),
        api::DEBUG_EXEC_DELAY_ENV
    );
    let output = cmd.output().context("running the slowed benchmark")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let gate_lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("FAIL") || l.starts_with("==> bench gate") || l.starts_with("Error"))
        .collect();
    for line in &gate_lines {
        eprintln!("    | {line}");
    }
    if output.status.success() {
        bail!(
            "the gate passed a build slowed by {SLOWED_DELAY_US} µs per exec: it would not catch \
             an exec-path regression"
        );
    }
    let named = stderr
        .lines()
        .any(|l| l.contains("benchmark gate failed") && l.contains(SLOWED_METRIC));
    if !named {
        bail!("the slowed run failed, but not by the gate naming {SLOWED_METRIC}:\n{stderr}");
    }
    eprintln!("    ok: the slowed build fails the gate, naming {SLOWED_METRIC}");
    Ok(())
}

/// Why the suite does not measure the microVM backend on this host.
pub(crate) fn microvm_skip_reason() -> String {
    engine::host::kvm_unavailable_reason(&engine::host::inspect()).unwrap_or_else(|| {
        "the bench does not drive the microVM backend on crucible-vmm through the API yet; \
         its boot is measured beside QEMU's in the nested section"
            .into()
    })
}
