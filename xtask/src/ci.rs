//! `cargo xtask ci [TIER…]`: the CI gate, in tiers that run alone or together, cheapest first,
//! so that the checks that fail fastest fail first:
//!
//! | tier | what |
//! | --- | --- |
//! | `provision` | everything the other tiers install, in one step that says what it installs |
//! | `fast` | fmt, clippy, the architecture's rules, generated files up to date, unit tests |
//! | `e2e` | the guest images, the smoke boot, every integration test through the real daemon, the Python SDK |
//! | `nested` | the hardware-KVM tests inside a nested-KVM L1 (`cargo xtask nested`) |
//! | `critest` | Kubernetes' CRI validation suite, runc vs crucible (`cargo xtask critest`) |
//! | `slow` | fuzzing (short), the benchmark gate and its self-test, schemathesis |
//!
//! No tier: all of them, in that order. Each step's time is printed as it ends and again in a
//! table at the end, whether the run passed or not.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use host_probe::kvm_tests::KvmTestGate;
use xshell::{cmd, Cmd, Shell};

use crate::util::{cargo, run_timed, workspace_root};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Tier {
    /// Install what the other tiers need.
    Provision,
    /// fmt, clippy, the architecture's rules, generated files, unit tests (minutes).
    Fast,
    /// Guest images, the smoke boot, integration tests through the real daemon, the SDK.
    E2e,
    /// The hardware-KVM tests inside a nested-KVM L1.
    Nested,
    /// Kubernetes' CRI validation suite (critest) with runc and crucible, compared.
    Critest,
    /// Fuzzing, the benchmark gate, schemathesis.
    Slow,
}

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The tiers to run, in the order above whatever order they are given in; none: all.
    #[arg(value_enum)]
    tiers: Vec<Tier>,
}

/// Runs the steps and keeps their times.
struct Steps<'sh> {
    /// The shell the commands run in (the workspace root).
    sh: &'sh Shell,
    cargo: String,
    done: Vec<(String, Duration, bool)>,
}

impl<'sh> Steps<'sh> {
    /// `cargo ARGS…`, in the workspace root.
    fn cargo(&self, args: &[&str]) -> Cmd<'sh> {
        let cargo = &self.cargo;
        cmd!(self.sh, "{cargo} {args...}")
    }

    /// Runs `command` as the step `name`; a failure ends the run, naming the step.
    fn run(&mut self, name: &str, command: Cmd<'_>) -> Result<()> {
        let (elapsed, result) = run_timed(name, command);
        self.done.push((name.to_string(), elapsed, result.is_ok()));
        result
    }

    /// A step done in this process.
    fn run_here(&mut self, name: &str, step: impl FnOnce() -> Result<()>) -> Result<()> {
        eprintln!("==> {name}");
        let started = Instant::now();
        let result = step();
        let elapsed = started.elapsed();
        self.done.push((name.to_string(), elapsed, result.is_ok()));
        match &result {
            Ok(()) => eprintln!("    {name} ok in {elapsed:.1?}"),
            Err(e) => eprintln!("    {name} failed after {elapsed:.1?}: {e:#}"),
        }
        result
    }

    /// The table of every step run, with its time.
    fn table(&self, total: Duration) -> String {
        let mut out = String::from("| step | time | result |\n| --- | --- | --- |\n");
        for (name, elapsed, ok) in &self.done {
            out.push_str(&format!(
                "| {name} | {:.0} s | {} |\n",
                elapsed.as_secs_f64(),
                if *ok { "ok" } else { "FAILED" }
            ));
        }
        out.push_str(&format!("| **total** | {:.0} s | |\n", total.as_secs_f64()));
        out
    }
}

pub(crate) fn run(sh: &Shell, args: Args) -> Result<()> {
    let started = Instant::now();
    let mut tiers = if args.tiers.is_empty() {
        vec![
            Tier::Provision,
            Tier::Fast,
            Tier::E2e,
            Tier::Nested,
            Tier::Critest,
            Tier::Slow,
        ]
    } else {
        args.tiers.clone()
    };
    tiers.sort();
    tiers.dedup();
    // Checked first: a bad value would otherwise fail the test crates' build scripts minutes in.
    // The variable itself reaches those build scripts through the inherited environment.
    let kvm_gate = KvmTestGate::detect()?;
    let mut steps = Steps {
        sh,
        cargo: cargo(),
        done: Vec::new(),
    };
    let mut result = Ok(());
    for tier in &tiers {
        eprintln!("==> ci: tier {tier:?}");
        result = match tier {
            Tier::Provision => provision(&mut steps),
            Tier::Fast => fast(&mut steps),
            Tier::E2e => e2e(&mut steps, &kvm_gate),
            Tier::Nested => steps.run(
                "nested (crucible-vmm under KVM in L1)",
                steps.cargo(&["xtask", "nested", "--quiet"]),
            ),
            Tier::Critest => steps.run(
                "critest (CRI validation, runc vs crucible)",
                steps.cargo(&["xtask", "critest"]),
            ),
            Tier::Slow => slow(&mut steps),
        };
        if result.is_err() {
            break;
        }
    }
    eprintln!(
        "\n==> ci: step times ({})\n{}",
        if result.is_ok() { "passed" } else { "failed" },
        steps.table(started.elapsed())
    );
    result?;
    eprintln!("==> ci: all checks passed ({})", kvm_gate.summary());
    Ok(())
}

/// Everything the other tiers install, said once: host packages (apt), the musl target
/// (rustup), pytest, mypy, websockets and schemathesis (pip), nightly and cargo-fuzz. Each is skipped when
/// already there; each command below still installs what it needs when run alone.
fn provision(steps: &mut Steps) -> Result<()> {
    let sh = steps.sh;
    let log = workspace_root().join("target/crucible/logs/provision-apt.log");
    steps.run_here("provision: free disk space", || {
        ensure_free_space(sh, &workspace_root(), MIN_FREE_BYTES)
    })?;
    steps.run_here("provision: host packages (apt)", || {
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let packages = PACKAGES.iter().map(|(p, _)| *p).collect::<Vec<_>>();
        let why = PACKAGES
            .iter()
            .map(|(p, why)| format!("{p}: {why}"))
            .collect::<Vec<_>>()
            .join("; ");
        eprintln!("    {why}");
        guest_image::deps::ensure(
            &packages,
            "the CI tiers",
            &log,
            &guest_image::progress::Plain,
        )
        .map_err(|e| anyhow::anyhow!("{e} (log: {})", log.display()))
    })?;
    steps.run_here("provision: the musl target (rustup)", || {
        let root = workspace_root();
        if guest_image::agent::musl_available(&root, &log, &guest_image::progress::Plain) {
            Ok(())
        } else {
            bail!(
                "rustup could not add {} (the static agent and VMM need it)",
                guest_image::agent::MUSL_TARGET
            )
        }
    })?;
    steps.run_here("provision: pytest, mypy, websockets (pip)", || {
        ensure_python_tools(sh)
    })?;
    steps.run_here(
        "provision: Node.js 20 or later (the TypeScript SDK)",
        || ensure_node(sh),
    )?;
    steps.run_here(
        "provision: schemathesis (pip, in ~/.cache/crucible/venv)",
        || crate::hostile::ensure_schemathesis(sh).map(|_| ()),
    )?;
    steps.run_here(
        "provision: nightly and cargo-fuzz (rustup, cargo install)",
        || crate::fuzz::ensure_tools(sh),
    )
}

/// What a whole run needs on the workspace's filesystem: a clean clone's `target/` grows to
/// about 12 GiB (debug and release builds, the guest images, the nested tier's L1), and the
/// integration tests unpack a Debian image with a compiler (about 1.5 GiB) beside it. A disk
/// that fills up half-way fails some test with ENOSPC twenty minutes in; this says so first.
const MIN_FREE_BYTES: u64 = 16 << 30;

/// Fails, naming the filesystem and what it has, when less than `need` bytes are free there.
fn ensure_free_space(sh: &Shell, dir: &std::path::Path, need: u64) -> Result<()> {
    let out = cmd!(sh, "df -Pk {dir}")
        .read()
        .with_context(|| format!("df -Pk {}", dir.display()))?;
    let free = parse_df_available(&out)
        .with_context(|| format!("cannot read `df -Pk {}`: {out:?}", dir.display()))?;
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    eprintln!(
        "    {:.1} GiB free on the filesystem of {} (a run needs {:.0} GiB)",
        gib(free),
        dir.display(),
        gib(need)
    );
    if free < need {
        bail!(
            "{:.1} GiB free on the filesystem of {}, a CI run needs about {:.0} GiB: \
             free some (old `target/` directories and clones are the usual culprits)",
            gib(free),
            dir.display(),
            gib(need)
        );
    }
    Ok(())
}

/// The `Available` column (KiB) of `df -Pk`'s one filesystem line, in bytes.
fn parse_df_available(out: &str) -> Option<u64> {
    let line = out.lines().nth(1)?;
    let kib: u64 = line.split_whitespace().nth(3)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The Debian packages the tiers run, and what for.
const PACKAGES: &[(&str, &str)] = &[
    ("linux-source-6.12", "the guest kernel's source"),
    (
        "build-essential",
        "building the guest kernel and the escape probe",
    ),
    ("bc", "building the guest kernel"),
    ("bison", "building the guest kernel"),
    ("flex", "building the guest kernel"),
    ("libelf-dev", "building the guest kernel"),
    ("libssl-dev", "building the guest kernel"),
    ("xz-utils", "unpacking the kernel source"),
    ("debootstrap", "the Debian image the image tests import"),
    ("busybox-static", "the guest userland and L1's"),
    (
        "qemu-system-x86",
        "the smoke boot, the qemu-tcg tests and the nested tier",
    ),
    ("e2fsprogs", "ext4 images for caches, layers and roots"),
    ("containerd", "the containerd shim's tests"),
    (
        "protobuf-compiler",
        "the CRI client the shim's pod test builds (k8s-cri runs protoc)",
    ),
    (
        "binutils",
        "stripping the binaries the nested tier copies into L1",
    ),
    ("python3-venv", "schemathesis's virtual environment"),
    ("runc", "the critest tier's baseline runtime handler"),
    (
        "golang-go",
        "building critest and crictl from cri-tools' source (critest tier)",
    ),
    (
        "docker-registry",
        "serving the critest tier's stand-in images to containerd",
    ),
    ("skopeo", "pushing the stand-in images into that registry"),
    (
        "containernetworking-plugins",
        "the pod network of the shim's CRI tests and the critest tier (bridge, host-local, portmap)",
    ),
    (
        "iproute2",
        "the pod network tests' named network namespaces and veth pairs (ip netns, ip link)",
    ),
    ("iptables", "the portmap plugin's host ports (critest tier)"),
];

/// fmt, clippy, the architecture's rules, generated files up to date, then the unit tests
/// (libraries, binaries, doc tests: no guest image, no daemon).
fn fast(steps: &mut Steps) -> Result<()> {
    steps.run("fmt", steps.cargo(&["fmt", "--all", "--", "--check"]))?;
    steps.run(
        "clippy",
        steps.cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    let sh = steps.sh;
    steps.run_here(
        "architecture (layers, module cycles, HTTP-free engine, host-free guest, error chains)",
        || crate::architecture::run(sh),
    )?;
    check_generated(steps, "fixtures", "gen-fixtures", &["fixtures"])?;
    check_generated(
        steps,
        "docs/openapi.json",
        "gen-openapi",
        &["docs/openapi.json"],
    )?;
    // The same features as the e2e tier's integration tests, so nothing is built twice.
    steps.run(
        "unit tests",
        steps.cargo(&["test", "--workspace", "--all-features", "--lib", "--bins"]),
    )?;
    steps.run(
        "doc tests",
        steps.cargo(&["test", "--workspace", "--all-features", "--doc"]),
    )
}

/// The guest images and the smoke boot, every integration test through the real daemon, and
/// the Python SDK against it.
fn e2e(steps: &mut Steps, kvm_gate: &KvmTestGate) -> Result<()> {
    // The image the end-to-end tests and the smoke test run (kernel from ~/.cache/crucible).
    steps.run("build-image", steps.cargo(&["xtask", "build-image"]))?;
    // A Debian root with a C toolchain (the tree cached in ~/.cache/crucible, debootstrapped
    // once), which the image tests import and compile in (tests/tests/namespace_debian.rs).
    steps.run(
        "build-image (debian)",
        steps.cargo(&[
            "xtask",
            "build-image",
            "--no-kernel",
            "--rootfs",
            "debian",
            "--packages",
            "gcc,make",
            "--out",
            "target/crucible/debian",
        ]),
    )?;
    steps.run("smoke-image", steps.cargo(&["xtask", "smoke-image"]))?;
    // Tests this host cannot run are compiled ignored (counted as such, never as passed);
    // CRUCIBLE_REQUIRE_KVM=1 makes them mandatory (`host_probe::kvm_tests`); the nested tier
    // runs them in an L1 that can.
    eprintln!("==> KVM tests: {}", kvm_gate.summary());
    steps.run(
        "integration tests",
        steps.cargo(&["test", "--workspace", "--all-features", "--test", "*"]),
    )?;
    // The SDKs' own checks and suites, from the repository root (the shell's directory):
    // generated types against docs/openapi.json, strict type checks, then their tests against
    // a real daemon.
    let sh = steps.sh;
    steps.run("python sdk", cmd!(sh, "bash sdks/python/ci.sh"))?;
    steps.run("typescript sdk", cmd!(sh, "bash sdks/typescript/ci.sh"))
}

/// A few seconds of fuzzing per target, the benchmark gate and its self-test, schemathesis.
fn slow(steps: &mut Steps) -> Result<()> {
    // A few seconds per fuzz target: proves they build and that the seed corpora still pass.
    steps.run(
        "fuzz (short)",
        steps.cargo(&["xtask", "fuzz", "--seconds", "5"]),
    )?;
    // Benchmark-driven CI: the quick suite's ratios to the floor against bench-baseline.json,
    // then the gate's self-test (a build slowed through the exec-path test hook must fail it).
    steps.run(
        "bench gate",
        steps.cargo(&["xtask", "bench", "--quick", "--gate"]),
    )?;
    steps.run(
        "bench gate self-test",
        steps.cargo(&["xtask", "bench", "--check-slowed"]),
    )?;
    // Hostile input: schemathesis against a live daemon, short form (docs/reliability.md).
    steps.run("hostile (schemathesis)", steps.cargo(&["xtask", "hostile"]))
}

/// Regenerates files with `cargo xtask <task>` and fails if `paths` then differ from git.
fn check_generated(steps: &mut Steps, name: &str, task: &str, paths: &[&str]) -> Result<()> {
    steps.run(task, steps.cargo(&["xtask", task]))?;
    let sh = steps.sh;
    steps.run_here(&format!("{name} up to date"), || {
        let output = cmd!(sh, "git status --porcelain -- {paths...}")
            .output()
            .with_context(|| format!("git status failed while checking {name}"))?;
        let changed = String::from_utf8_lossy(&output.stdout);
        if !changed.trim().is_empty() {
            bail!(
                "{name} are out of date with the code: `cargo xtask {task}` changed\n{changed}\
                 Commit the regenerated files (or fix the code that changed them)."
            );
        }
        Ok(())
    })
}

/// The TypeScript SDK needs Node.js 20 or later (and npm, which installs its locked
/// dependencies from the registry). Debian 12's own `nodejs` is 18, too old: a machine
/// without a Node 20 is told so rather than given one that fails later.
fn ensure_node(sh: &Shell) -> Result<()> {
    let version = cmd!(sh, "node --version")
        .read()
        .context("node is not installed: the TypeScript SDK's checks need Node.js 20 or later")?;
    let major: u32 = version
        .trim()
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("node --version said {version:?}"))?;
    if major < 20 {
        bail!("node {version} is too old: the TypeScript SDK's checks need Node.js 20 or later");
    }
    cmd!(sh, "npm --version")
        .quiet()
        .ignore_stdout()
        .run()
        .context("npm is not installed (it comes with Node.js)")?;
    Ok(())
}

/// Installs what the Python SDK's checks use with pip when the machine lacks it (a fresh CI
/// machine does): pytest, mypy (its `--strict` check), websockets (its WebSocket transport).
fn ensure_python_tools(sh: &Shell) -> Result<()> {
    for (module, spec, why) in [
        ("pytest", "pytest>=7", "the Python SDK's tests"),
        ("mypy", "mypy>=1.8", "the Python SDK's type check"),
        (
            "websockets",
            "websockets>=13",
            "the Python SDK's WebSocket transport",
        ),
    ] {
        // Its output captured and dropped: only whether the import works matters.
        let have = cmd!(sh, "python3 -c 'import {module}'").output().is_ok();
        if !have {
            eprintln!("    {module} is missing: installing {spec} with pip ({why})");
            cmd!(sh, "python3 -m pip install --quiet {spec}")
                .quiet()
                .run()
                .with_context(|| format!("pip install {spec} failed"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_each_step_with_its_time_and_the_total() {
        let sh = Shell::new().expect("a shell");
        let steps = Steps {
            sh: &sh,
            cargo: "cargo".into(),
            done: vec![
                ("fmt".into(), Duration::from_millis(1500), true),
                ("clippy".into(), Duration::from_secs(90), false),
            ],
        };
        let table = steps.table(Duration::from_secs(92));
        assert!(table.contains("| fmt | 2 s | ok |"), "{table}");
        assert!(table.contains("| clippy | 90 s | FAILED |"), "{table}");
        assert!(table.contains("| **total** | 92 s | |"), "{table}");
    }

    #[test]
    fn the_free_space_check_reads_dfs_available_column_and_refuses_too_little() {
        let out = "Filesystem     1024-blocks     Used Available Capacity Mounted on\n\
                   /dev/vda         264000000 83000000  12582912      88% /\n";
        assert_eq!(parse_df_available(out), Some(12 << 30));
        assert_eq!(parse_df_available("Filesystem\n"), None);
        let sh = Shell::new().expect("a shell");
        let root = std::path::Path::new("/");
        ensure_free_space(&sh, root, 0).expect("any disk has 0 bytes free");
        let refused = ensure_free_space(&sh, root, u64::MAX).expect_err("no disk is that big");
        assert!(refused.to_string().contains("a CI run needs"), "{refused}");
    }

    #[test]
    fn provision_installs_everything_the_critest_tier_installs() {
        for (package, _) in crate::critest::PACKAGES {
            assert!(
                PACKAGES.iter().any(|(p, _)| p == package),
                "{package} is missing from ci's PACKAGES"
            );
        }
    }

    #[test]
    fn tiers_run_cheapest_first_whatever_order_they_are_given_in() {
        let mut tiers = vec![Tier::Slow, Tier::Fast, Tier::Nested, Tier::Fast];
        tiers.sort();
        tiers.dedup();
        assert_eq!(tiers, [Tier::Fast, Tier::Nested, Tier::Slow]);
    }
}
