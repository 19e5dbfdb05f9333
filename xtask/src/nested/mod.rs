//! `cargo xtask nested`: the nested-KVM tier. Real Linux under `crucible-vmm` on any host:
//! QEMU's TCG emulates an AMD CPU with SVM and nested paging, Debian's stock kernel runs in it
//! as L1 and loads `kvm_amd`, and inside L1 our own tests boot our image (L2) under
//! `crucible-vmm` with a working `/dev/kvm`. The test binaries are the ones `cargo test` built
//! on the host, run inside L1 with every KVM test included (`--include-ignored`: nothing the
//! host had to ignore is ignored there), each under a deadline.
//!
//! An emulator is not a CPU: L1 may freeze or its kernel panic for reasons outside our code.
//! Each run is judged ([`verdict`]): a failed step is ours and fails the tier at once; an L1
//! that panicked, froze or whose QEMU died is the emulator's, retried up to `--retries` times,
//! each retry printed. Every run's logs stay in `target/crucible/nested/`.

mod l1_kernel;
pub(crate) mod l1_root;
pub(crate) mod machine;
pub(crate) mod verdict;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use guest_image::progress::Plain;
use xshell::{cmd, Cmd, Shell};

use crate::util::{cargo, workspace_root};
use l1_root::L1Root;
use machine::{Limits, Machine};
use verdict::Verdict;

/// The modules L1 loads (their dependencies come along): KVM for AMD, and overlayfs, which
/// containerd's default snapshotter needs.
const L1_MODULES: &[&str] = &["kvm_amd", "overlay"];

/// The L1 init script.
const L1_INIT: &str = include_str!("l1-init.sh");

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Run only these steps (comma-separated): vmm-e2e, vmm-test-guests, daemon-microvm,
    /// shim-microvm, shim-pod-microvm.
    #[arg(long, value_delimiter = ',', value_name = "STEP,…")]
    only: Vec<String>,
    /// Boot L1 this many times, each run judged on its own (for measuring the emulator's
    /// failure rate); the summary counts each kind of ending.
    #[arg(long, default_value_t = 1, value_name = "N")]
    repeat: u32,
    /// Retry a run this many times when it failed for the emulator's reasons (L1 panicked or
    /// froze, QEMU died); a failure of ours is never retried.
    #[arg(long, default_value_t = 3, value_name = "N")]
    retries: u32,
    /// QEMU's CPU model; it must offer svm and npt.
    #[arg(long, default_value = "EPYC,+svm,+npt")]
    cpu: String,
    /// L1's vCPUs. One by default: with two, L1 froze in 2 of 8 runs of the test-guest step
    /// (both vCPUs stuck, its kernel reporting soft lockups: QEMU 7.2's multi-threaded TCG
    /// with nested SVM); with one, in none (docs/nested.md, "Stability").
    #[arg(long, default_value_t = 1)]
    smp: u32,
    /// L1's memory in MiB.
    #[arg(long, default_value_t = 4096)]
    mem_mib: u32,
    /// kvm_amd module parameters in L1, space-separated (e.g. "nested=1 npt=1 avic=0").
    #[arg(long, default_value = "", value_name = "PARAMS")]
    kvm_amd: String,
    /// Seconds of silence from L1 (it prints a heartbeat every 5 s) before it counts as frozen.
    #[arg(long, default_value_t = 120, value_name = "S")]
    silence_s: u64,
    /// Print only L1's step lines, not the tests' own output.
    #[arg(long)]
    quiet: bool,
    /// Run only the tests whose names contain this, in each step: for debugging one case (a
    /// step none of whose tests match passes with nothing run, so never use it to judge).
    #[arg(long, value_name = "NAME")]
    filter: Option<String>,
    /// Instead of the tests: the boot benchmark (`cargo xtask bench --only nested` runs this),
    /// RUNS boots under crucible-vmm and under QEMU microvm -accel kvm inside one L1, by
    /// --bench-binary's `nested-boot` helper; what L1 said goes to --results.
    #[arg(long, value_name = "RUNS", requires_all = ["bench_binary", "results"])]
    boot_bench: Option<u32>,
    /// The crucible-bench binary to run inside L1 (with --boot-bench).
    #[arg(long, value_name = "PATH")]
    bench_binary: Option<PathBuf>,
    /// Where to copy what L1 said (with --boot-bench).
    #[arg(long, value_name = "FILE")]
    results: Option<PathBuf>,
}

/// One step L1 runs: a name, a deadline, environment and a command line.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub name: &'static str,
    pub seconds: u64,
    pub env: Vec<(String, String)>,
    pub argv: Vec<String>,
}

/// What every L1 needs from the host, ready.
#[derive(Debug)]
pub(crate) struct Host {
    /// qemu-system-x86_64.
    pub qemu: PathBuf,
    /// L1's kernel and modules.
    pub kernel: l1_kernel::L1Kernel,
    /// The guest image (`cargo xtask build-image`).
    pub image: PathBuf,
    /// crucible-vmm, static, release.
    pub static_vmm: PathBuf,
    /// Where apt's and the builds' logs go.
    pub logs: PathBuf,
}

/// Installs what the tier runs on the host (saying so), fetches L1's kernel, checks the
/// guest image and builds the static VMM.
pub(crate) fn prepare_host(sh: &Shell, out: &Path) -> Result<Host> {
    let root = workspace_root();
    check_visible_in_l1(&root)?;
    let logs = out.join("logs");
    let cache = guest_image::Cache::default_location().root().join("nested");
    guest_image::deps::ensure(
        &[
            guest_image::smoke::QEMU_PACKAGE,
            "binutils",
            "e2fsprogs",
            "containerd",
        ],
        "the nested-KVM tier (QEMU; objcopy to strip debug info; mkfs.ext4 and containerd, \
         which the tests run inside L1)",
        &logs.join("apt.log"),
        &Plain,
    )?;
    let kernel = l1_kernel::obtain(sh, &cache, &logs.join("apt.log"))?;
    eprintln!(
        "    L1 kernel: {} ({})",
        kernel.name,
        kernel.vmlinuz.display()
    );
    let image = root.join("target/crucible/image");
    for f in ["vmlinux", "initramfs.cpio", "rootfs/init"] {
        if !image.join(f).is_file() {
            bail!(
                "{} is missing: run `cargo xtask build-image` first",
                image.join(f).display()
            );
        }
    }
    let static_vmm = build_static_vmm(sh, &root, &logs)?;
    let qemu = guest_image::deps::which(guest_image::smoke::QEMU)
        .context("qemu-system-x86_64 is not on PATH")?;
    Ok(Host {
        qemu,
        kernel,
        image,
        static_vmm,
        logs,
    })
}

/// Where L1's `/init` mounts a file system of its own, hiding whatever the initramfs put there.
const L1_MOUNT_POINTS: [&str; 3] = ["/dev", "/proc", "/sys"];

/// The test payload is packed at its host paths (the test binaries have them compiled in), so
/// a workspace under one of L1's mount points would be hidden in L1: refuse it before booting.
fn check_visible_in_l1(workspace: &Path) -> Result<()> {
    if let Some(mount) = L1_MOUNT_POINTS
        .iter()
        .find(|m| workspace.starts_with(Path::new(m)))
    {
        bail!(
            "the workspace {} lies under {mount}, which L1 mounts over: the tests packed at \
             their host paths would be hidden there; clone the repository elsewhere",
            workspace.display()
        );
    }
    Ok(())
}

/// L1's root with what every run needs: busybox, `/init`, the modules, the plan of `steps`,
/// the guest image and the static VMM. Stripped binaries go under `out`.
pub(crate) fn base_root(host: &Host, out: &Path, steps: &[Step]) -> Result<L1Root> {
    use guest_image::initramfs::{Contents, Node};
    let mut root = L1Root::new(out.join("stripped"))?;
    let busybox = guest_image::initramfs::busybox(&host.logs, &Plain)?;
    root.busybox(&busybox)?;
    root.file("init", 0o755, L1_INIT)?;
    let mut names = String::new();
    for (name, file) in l1_kernel::load_order(&host.kernel, L1_MODULES)? {
        root.insert(
            &format!("nested/modules/{name}.ko"),
            Node::File {
                mode: 0o644,
                contents: Contents::Path(file),
            },
        )?;
        names.push_str(&name);
        names.push('\n');
    }
    root.file("nested/modules.list", 0o644, names)?;
    root.file("nested/steps.sh", 0o644, steps_script(steps))?;
    for dir in ["dev", "proc", "sys", "tmp", "run", "root", "etc"] {
        root.insert(dir, Node::Dir { mode: 0o755 })?;
    }
    root.file("etc/passwd", 0o644, "root:x:0:0:root:/root:/busybox/sh\n")?;
    root.file("etc/group", 0o644, "root:x:0:\n")?;
    // What containerd's CRI plugin copies into a host-network pod (the CRI step).
    root.file("etc/hosts", 0o644, "127.0.0.1 localhost\n::1 localhost\n")?;
    root.file("etc/resolv.conf", 0o644, "nameserver 127.0.0.1\n")?;
    root.file("etc/hostname", 0o644, "l1\n")?;
    // `/bin/sh` where the host has it (merged /usr): scripts the tests write start with it.
    root.insert(
        "bin",
        Node::Symlink {
            target: "usr/bin".into(),
        },
    )?;
    root.insert(
        "usr/bin/sh",
        Node::Symlink {
            target: format!("/{}/busybox", l1_root::BUSYBOX_DIR),
        },
    )?;
    // The guest image the steps boot.
    for f in ["vmlinux", "initramfs.cpio", "manifest.json"] {
        root.mirror(&host.image.join(f))?;
    }
    root.mirror(&host.image.join("rootfs"))?;
    root.executable(&host.static_vmm, false)?;
    Ok(root)
}

/// The emulated machine and limits `args` ask for, for `steps`.
fn machine_and_limits(
    cpu: &str,
    smp: u32,
    mem_mib: u32,
    kvm_amd: &str,
    silence_s: u64,
    steps: &[Step],
) -> (Machine, Limits) {
    (
        Machine {
            cpu: cpu.into(),
            smp,
            mem_mib,
            kvm_amd: kvm_amd.into(),
        },
        Limits {
            silence: Duration::from_secs(silence_s),
            // Every step's deadline, plus L1's boot and a margin.
            deadline: Duration::from_secs(steps.iter().map(|s| s.seconds).sum::<u64>() + 180),
        },
    )
}

/// The default machine: what CI runs.
pub(crate) fn default_machine(steps: &[Step]) -> (Machine, Limits) {
    machine_and_limits("EPYC,+svm,+npt", 1, 4096, "", 120, steps)
}

/// Runs L1 until a run is judged other than the emulator's (at most `retries` retries, each
/// printed); logs in `dir/attempt-N`. Returns the last run and the retries used.
#[allow(clippy::too_many_arguments)]
pub(crate) fn boot_until_judged(
    host: &Host,
    initrd: &Path,
    machine: &Machine,
    limits: Limits,
    dir: &Path,
    retries: u32,
    echo: bool,
    label: &str,
) -> Result<(machine::Run, u32)> {
    let mut used = 0;
    loop {
        let attempt_dir = dir.join(format!("attempt-{used}"));
        let _ = std::fs::remove_dir_all(&attempt_dir);
        eprintln!(
            "==> nested: {label}, attempt {} of {}: {machine}",
            used + 1,
            retries + 1
        );
        let run = machine::run(
            &host.qemu,
            &host.kernel,
            initrd,
            machine,
            limits,
            &attempt_dir,
            echo,
        )?;
        for step in &run.transcript.ended {
            eprintln!(
                "    step {:<16} {} in {:.1} s (limit {} s)",
                step.name,
                if step.status == 0 { "ok" } else { "FAILED" },
                step.seconds,
                step.limit
            );
        }
        eprintln!(
            "    {label}: {} after {:.1?} (logs: {})",
            run.verdict,
            run.elapsed,
            run.dir.display()
        );
        match &run.verdict {
            Verdict::Emulator(why) if used < retries => {
                print_tail(&run.dir);
                used += 1;
                eprintln!(
                    "    retrying: the emulator failed, not our code ({why}); retry {used} of \
                     {retries}"
                );
            }
            Verdict::Passed => return Ok((run, used)),
            _ => {
                print_tail(&run.dir);
                return Ok((run, used));
            }
        }
    }
}

pub(crate) fn run(sh: &Shell, args: Args) -> Result<()> {
    if let (Some(runs), Some(binary), Some(results)) =
        (args.boot_bench, &args.bench_binary, &args.results)
    {
        return boot_bench(sh, runs, binary, results, args.retries);
    }
    let root = workspace_root();
    let out = root.join("target/crucible/nested");
    std::fs::create_dir_all(&out)?;
    let started = Instant::now();

    eprintln!("==> nested: preparing L1 (QEMU TCG, AMD SVM + NPT, Debian's kernel with kvm_amd)");
    let host = prepare_host(sh, &out)?;
    let tests = build_test_binaries(sh)?;
    let steps = plan(&args, &tests, &host.static_vmm)?;
    let initrd = out.join("l1.cpio");
    let mut l1 = base_root(&host, &out, &steps)?;
    add_test_payload(&mut l1, &steps)?;
    let size = l1.write(&initrd)?;
    eprintln!(
        "    L1 initramfs: {} ({} MiB, {} entries), steps: {}; prepared in {:.1?}",
        initrd.display(),
        size >> 20,
        l1.len(),
        steps.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
        started.elapsed()
    );

    let (machine, limits) = machine_and_limits(
        &args.cpu,
        args.smp,
        args.mem_mib,
        &args.kvm_amd,
        args.silence_s,
        &steps,
    );
    let mut tally: BTreeMap<&str, u32> = BTreeMap::new();
    let mut retries_used = 0;
    let mut failures = Vec::new();
    for run_index in 1..=args.repeat {
        let label = format!("run {run_index}/{}", args.repeat);
        let (run, used) = boot_until_judged(
            &host,
            &initrd,
            &machine,
            limits,
            &out.join(format!("run-{run_index}")),
            args.retries,
            !args.quiet,
            &label,
        )?;
        retries_used += used;
        // Every attempt counts: each retried one ended as the emulator's.
        *tally.entry("failed (emulator)").or_default() += used;
        *tally.entry(kind(&run.verdict)).or_default() += 1;
        if run.verdict != Verdict::Passed {
            failures.push(format!("{label}: {}", run.verdict));
        }
    }
    let counts = tally
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    eprintln!(
        "==> nested: {} run(s) in {:.1?}: {counts}; {retries_used} retr{} for the emulator",
        args.repeat,
        started.elapsed(),
        if retries_used == 1 { "y" } else { "ies" }
    );
    if !failures.is_empty() {
        bail!("the nested tier failed:\n  {}", failures.join("\n  "));
    }
    Ok(())
}

/// The boot benchmark's L1: the base, the bench binary and QEMU with its firmware; one step
/// that runs `crucible-bench nested-boot`. Retried for the emulator as the tests are; what
/// L1 said (the `@@bench` sample lines among it) is copied to `results`.
fn boot_bench(sh: &Shell, runs: u32, bench: &Path, results: &Path, retries: u32) -> Result<()> {
    let out = workspace_root().join("target/crucible/nested-bench");
    std::fs::create_dir_all(&out)?;
    let host = prepare_host(sh, &out)?;
    let arg = |p: &Path| p.to_string_lossy().into_owned();
    let steps = vec![Step {
        name: "boot-bench",
        seconds: 1200,
        env: Vec::new(),
        argv: vec![
            arg(bench),
            "nested-boot".into(),
            "--runs".into(),
            runs.to_string(),
            "--vmm".into(),
            arg(&host.static_vmm),
            "--qemu".into(),
            arg(&host.qemu),
            "--kernel".into(),
            arg(&host.image.join("vmlinux")),
            "--initramfs".into(),
            arg(&host.image.join("initramfs.cpio")),
        ],
    }];
    let mut root = base_root(&host, &out, &steps)?;
    root.executable(bench, true)?;
    root.executable(&host.qemu, false)?;
    // The firmware QEMU's microvm machine loads, wherever Debian keeps it.
    root.mirror(Path::new("/usr/share/qemu/bios-microvm.bin"))?;
    let initrd = out.join("l1.cpio");
    root.write(&initrd)?;
    let (machine, limits) = default_machine(&steps);
    let (run, _) = boot_until_judged(
        &host,
        &initrd,
        &machine,
        limits,
        &out.join("run"),
        retries,
        false,
        "boot benchmark",
    )?;
    std::fs::copy(run.dir.join("results.log"), results)
        .with_context(|| format!("copying what L1 said to {}", results.display()))?;
    if run.verdict != Verdict::Passed {
        bail!("the nested boot benchmark failed: {}", run.verdict);
    }
    Ok(())
}

fn kind(v: &Verdict) -> &'static str {
    match v {
        Verdict::Passed => "passed",
        Verdict::Ours(_) => "failed (ours)",
        Verdict::Emulator(_) => "failed (emulator)",
    }
}

/// The last lines of a failed run's logs, so CI shows what happened without the files: what
/// L1 said (the failed tests' output, L1's dmesg), its kernel console, QEMU's own log.
fn print_tail(dir: &Path) {
    for (file, lines) in [("results.log", 200), ("console.log", 40), ("qemu.log", 20)] {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let all: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("@@nested heartbeat") && !l.contains("TCG doesn't support"))
            .collect();
        let tail = &all[all.len().saturating_sub(lines)..];
        if !tail.is_empty() {
            eprintln!(
                "    --- last {} lines of {} ---",
                tail.len(),
                path.display()
            );
            for l in tail {
                eprintln!("    {l}");
            }
        }
    }
}

/// `cargo test --no-run` with the same flags as the CI test step (nothing is rebuilt after
/// it), in `sh`'s directory (the workspace root): the test executables by target name.
fn build_test_binaries(sh: &Shell) -> Result<BTreeMap<String, PathBuf>> {
    eprintln!("    test binaries: cargo test --workspace --all-features --no-run");
    let cargo = cargo();
    let artifacts = cargo_artifacts(
        "the test binaries",
        cmd!(sh, "{cargo} test --workspace --all-features --no-run"),
    )?;
    Ok(artifacts
        .into_iter()
        .filter(|a| a.kinds.iter().any(|k| k == "test"))
        .map(|a| (a.name, a.executable))
        .collect())
}

/// `crucible-vmm` built static (musl; glibc with `+crt-static` where rustup has no musl), as
/// shipped to hosts: the e2e step boots with it. Built in `sh`'s directory, the workspace
/// root (`root`).
fn build_static_vmm(sh: &Shell, root: &Path, logs: &Path) -> Result<PathBuf> {
    let log = logs.join("static-vmm.log");
    let target = if guest_image::agent::musl_available(root, &log, &Plain) {
        guest_image::agent::MUSL_TARGET
    } else {
        guest_image::agent::GNU_TARGET
    };
    eprintln!("    static crucible-vmm: cargo build --release -p crucible-vmm --target {target}");
    let cargo = cargo();
    let mut cmd = cmd!(
        sh,
        "{cargo} build --release -p crucible-vmm --bin crucible-vmm --target {target}"
    );
    if target == guest_image::agent::GNU_TARGET {
        cmd = cmd.env("RUSTFLAGS", "-C target-feature=+crt-static");
    }
    let vmm = cargo_artifacts("the static crucible-vmm", cmd)?
        .into_iter()
        .find(|a| a.name == "crucible-vmm" && a.kinds.iter().any(|k| k == "bin"))
        .map(|a| a.executable)
        .context("cargo built no crucible-vmm binary")?;
    let info = guest_image::elf::inspect_file(&vmm)?;
    if !info.is_static() {
        bail!("{} is not static: {info:?}", vmm.display());
    }
    Ok(vmm)
}

/// A built executable, from cargo's JSON messages.
#[derive(Debug)]
struct Artifact {
    name: String,
    kinds: Vec<String>,
    executable: PathBuf,
}

/// Runs a cargo build of `what` with `--message-format=json-render-diagnostics` (its
/// diagnostics shown as they come, its JSON messages read) and returns the executables it
/// produced (or found fresh).
fn cargo_artifacts(what: &str, cmd: Cmd<'_>) -> Result<Vec<Artifact>> {
    let messages = cmd
        .arg("--message-format=json-render-diagnostics")
        .read()
        .with_context(|| format!("building {what} with cargo"))?;
    let mut found = Vec::new();
    for line in messages.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        found.push(Artifact {
            name: msg["target"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            kinds: msg["target"]["kind"]
                .as_array()
                .map(|k| {
                    k.iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default(),
            executable: PathBuf::from(exe),
        });
    }
    Ok(found)
}

/// The steps L1 runs, in order: the VMM's own tests first (quick, and the most basic), then
/// the daemon's microVM suite.
fn plan(args: &Args, tests: &BTreeMap<String, PathBuf>, static_vmm: &Path) -> Result<Vec<Step>> {
    let test = |name: &str| -> Result<String> {
        tests
            .get(name)
            .map(|p| p.to_string_lossy().into_owned())
            .with_context(|| format!("cargo built no test target {name}"))
    };
    let static_vmm = static_vmm.to_string_lossy().into_owned();
    let all = vec![
        Step {
            name: "vmm-e2e",
            seconds: 300,
            // The static build, as shipped: it must boot Linux and survive its own seccomp
            // filters to the end of the VM.
            env: vec![("CRUCIBLE_VMM".into(), static_vmm.clone())],
            argv: vec![
                test("e2e_linux")?,
                "--include-ignored".into(),
                "--test-threads=1".into(),
            ],
        },
        Step {
            name: "vmm-test-guests",
            seconds: 300,
            env: vec![("CRUCIBLE_VMM".into(), static_vmm)],
            argv: vec![
                test("test_guest")?,
                "--include-ignored".into(),
                // A tool that writes the guests out for manual runs, not a check.
                "--skip".into(),
                "write_test_guest_elfs".into(),
                "--test-threads=1".into(),
            ],
        },
        Step {
            name: "daemon-microvm",
            seconds: 1500,
            env: Vec::new(),
            argv: vec![
                test("microvm_api")?,
                "--include-ignored".into(),
                // Checks the refusal on hosts *without* hardware KVM; L1 has it.
                "--skip".into(),
                "microvm_requests_are_refused_clearly_where_kvm_cannot_boot_the_image".into(),
                // Makes a host network namespace with iproute2's `ip netns`, which L1's busybox
                // `ip` lacks. The daemon's side it checks is the hypervisor's concern nowhere:
                // it runs on the host under QEMU TCG (`microvm_qemu_tcg`, and the CRI test
                // `a_microvm_pod_on_a_cni_network_fetches_from_the_node_as_its_pod_ip`).
                "--skip".into(),
                "a_pods_connections_leave_from_its_network_namespace".into(),
                "--test-threads=1".into(),
            ],
        },
        Step {
            name: "shim-microvm",
            seconds: 600,
            env: Vec::new(),
            argv: vec![
                test("containerd")?,
                "--include-ignored".into(),
                // The shim's microVM case on crucible-vmm; its other cases run on the host.
                "--exact".into(),
                "a_container_runs_as_a_crucible_vmm_microvm_with_its_output_status_and_metrics"
                    .into(),
                "--test-threads=1".into(),
            ],
        },
        Step {
            name: "shim-pod-microvm",
            seconds: 900,
            env: Vec::new(),
            argv: vec![
                test("cri")?,
                "--include-ignored".into(),
                // A Kubernetes pod as one crucible-vmm microVM, driven through containerd's CRI
                // plugin; its other cases run on the host.
                "--exact".into(),
                "a_pod_of_three_containers_runs_as_one_crucible_vmm_microvm_the_way_kubelet_drives_it"
                    .into(),
                "--test-threads=1".into(),
            ],
        },
    ];
    for name in &args.only {
        if !all.iter().any(|s| s.name == name) {
            bail!(
                "--only {name}: no such step (steps: {})",
                all.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
            );
        }
    }
    let mut steps: Vec<Step> = all
        .into_iter()
        .filter(|s| args.only.is_empty() || args.only.iter().any(|o| o == s.name))
        .collect();
    if let Some(filter) = &args.filter {
        for step in &mut steps {
            // `--exact NAME` already picks one test; otherwise the filter narrows the step.
            if !step.argv.iter().any(|a| a == "--exact") {
                step.argv.push(filter.clone());
            }
        }
    }
    Ok(steps)
}

/// `'word'`, safe for sh.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// `/nested/steps.sh`: one `step` call per step (the function is L1's `/init`'s).
fn steps_script(steps: &[Step]) -> String {
    let mut s = String::from("# Generated by `cargo xtask nested`: what L1 runs.\n");
    for step in steps {
        let mut words = vec![quote(step.name), step.seconds.to_string()];
        if !step.env.is_empty() {
            words.push("env".into());
            words.extend(step.env.iter().map(|(k, v)| quote(&format!("{k}={v}"))));
        }
        words.extend(step.argv.iter().map(|a| quote(a)));
        s.push_str(&format!("step {}\n", words.join(" ")));
    }
    s
}

/// What the test steps need in L1 beside the base: the test binaries, the binaries they start
/// (at their host paths, where the tests look for them), the crate directories their paths
/// go through, and the host tools the daemon and the shim's test run.
fn add_test_payload(root: &mut L1Root, steps: &[Step]) -> Result<()> {
    let workspace = workspace_root();
    // The crate directories, so that `<crate>/../target/…` paths resolve.
    for member in ["vmm", "tests", "shim", "api"] {
        root.dir(&workspace.join(member))?;
    }
    for step in steps {
        root.executable(Path::new(&step.argv[0]), true)?;
    }
    let debug = workspace.join("target/debug");
    // The VMM the daemon's tests start, the daemon as a process of its own (the restart test
    // kills it), and the containerd shim.
    for binary in [
        "crucible-vmm",
        "crucible-test-daemon",
        "containerd-shim-crucible-v2",
    ] {
        root.executable(&debug.join(binary), true)?;
    }
    // What the daemon runs for its disks (ext4 images, filled or empty, and their checks), and
    // the shim's step drives a real containerd.
    for (tool, package) in [
        ("mkfs.ext4", "e2fsprogs"),
        ("mke2fs", "e2fsprogs"),
        ("debugfs", "e2fsprogs"),
        ("e2fsck", "e2fsprogs"),
        ("containerd", "containerd"),
        ("ctr", "containerd"),
    ] {
        let path = guest_image::deps::which(tool).with_context(|| {
            format!("{tool} is not on PATH (Debian: apt-get install {package})")
        })?;
        root.executable(&path, false)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_under_tmp_is_packed_and_one_under_l1s_mounts_is_refused() -> Result<()> {
        // /tmp and /run are part of L1's initramfs root (a CI clone in /tmp once found its
        // tests hidden behind a tmpfs there).
        for ok in ["/tmp/ci-check", "/run/user/0/w", "/work/main", "/devel/x"] {
            check_visible_in_l1(Path::new(ok))?;
        }
        let err = check_visible_in_l1(Path::new("/dev/shm/w")).expect_err("/dev is mounted over");
        assert!(
            err.to_string().contains("/dev/shm/w lies under /dev"),
            "{err:#}"
        );
        assert!(check_visible_in_l1(Path::new("/proc/x")).is_err());
        Ok(())
    }

    #[test]
    fn the_steps_script_quotes_every_word() {
        let s = steps_script(&[Step {
            name: "a",
            seconds: 5,
            env: vec![("K".into(), "it's".into())],
            argv: vec!["/bin/x".into(), "--skip".into(), "a b".into()],
        }]);
        assert!(
            s.contains("step 'a' 5 env 'K=it'\\''s' '/bin/x' '--skip' 'a b'\n"),
            "{s}"
        );
    }
}
