//! `cargo xtask …`: builds, checks and generated files for crucible.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod architecture;
mod bench;
mod ci;
mod critest;
mod doc_paths;
mod fixtures;
mod fuzz;
mod hostile;
mod image;
mod nested;
mod openapi;
mod soak;
mod util;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "crucible's project automation", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Everything CI checks, in tiers: provision, fast, e2e, nested, critest, slow (none given:
    /// all).
    ///
    /// `fast` (fmt, clippy, the architecture's rules, generated files, unit tests) runs in a
    /// few minutes; `e2e` builds the guest images and runs every integration test through the
    /// real daemon and the Python SDK; `nested` the hardware-KVM tests in a nested-KVM L1;
    /// `critest` Kubernetes' CRI validation suite with runc and crucible, compared; `slow`
    /// fuzzing, the benchmark gate and schemathesis. `provision` installs what they
    /// need, saying what. Each step's time is printed, and a table of them at the end.
    Ci(ci::Args),
    /// The architecture's rules: no module cycle in any crate, the engine knows no HTTP, no
    /// error message repeats its cause.
    Architecture,
    /// Build the cargo-fuzz targets (nightly) and run each for --seconds.
    ///
    /// Builds the targets in fuzz/ with nightly and AddressSanitizer, then runs each for
    /// --seconds on a scratch corpus (target/fuzz/corpus/<target>, seeded from the committed
    /// fuzz/corpus/<target>), logging to target/fuzz/logs/<target>.log; the build goes to
    /// ~/.cache/crucible/fuzz-target, so fresh clones reuse it. Installs cargo-fuzz
    /// (`cargo install cargo-fuzz --locked`) and the nightly toolchain (rustup) when missing.
    /// Reports executions and execs/s per target; fails with the crash artifact's path if a
    /// target crashes.
    ///
    /// Targets: frame_decoder, agent_request, http_exec_request, http1_head, tar_extract,
    /// virtqueue_chain, vsock_packet.
    Fuzz(fuzz::Args),
    /// Kubernetes' CRI validation suite (critest) against containerd, runc vs crucible.
    ///
    /// Runs critest from kubernetes-sigs/cri-tools v1.26.1 against Debian's containerd with two
    /// runtime handlers in one containerd, on the same images, in the same run: `runc` (the
    /// baseline) and `crucible` (containerd-shim-crucible-v2 backed by a private `crucible serve`
    /// on the namespace backend, its own socket, state and cgroup parent). Fails when a spec
    /// passes with runc and fails with crucible unless shim/critest/known-failures.txt lists it
    /// (SPEC | WAITS FOR | REASON), when a listed spec passes with crucible ("remove it from the
    /// list"), and when runc itself fails a spec. Prints handler | passed | failed | skipped |
    /// time and each crucible-only failure's first error line.
    ///
    /// Installs with apt when missing: containerd, runc, golang-go, docker-registry, skopeo,
    /// containernetworking-plugins, iptables, build-essential. critest and crictl are built
    /// once from cri-tools' source (offline: its vendor/) into
    /// ~/.cache/crucible/cri-tools-v1.26.1/; the source is $CRUCIBLE_CRI_TOOLS_SRC (a tarball or
    /// an unpacked tree of the tag), else the tag's archive downloaded when online. Nothing
    /// upstream is pulled: stand-in images (busybox, nginx, httpd, nonewprivs, pause, the
    /// test-image-* tags) are built from Debian's busybox and nginx packages (fetched with
    /// apt-get download, not installed) by shim/critest/rootfs.sh, cached in
    /// ~/.cache/crucible/critest-images/, pushed to a private docker-registry on 127.0.0.1, and
    /// containerd's registry mirrors send critest's pulls there. Pods get a CNI bridge on
    /// 10.88.77.0/24, removed afterwards with its iptables chains. Needs root and the guest image
    /// (`cargo xtask build-image`). Reports (JUnit XML, ginkgo JSON, logs, summary.md):
    /// target/crucible/critest/.
    Critest(critest::Args),
    /// Regenerate the conformance fixtures (`fixtures/*.bin` + `manifest.json`) from the codec.
    GenFixtures(fixtures::Args),
    /// Regenerate `docs/openapi.json` from the API's wire types and route table.
    GenOpenapi,
    /// schemathesis against a live daemon: no 5xx, conforming responses, no hangs.
    Hostile(hostile::Args),
    /// Build the guest image (vmlinux, initramfs.cpio, optional rootfs.ext4, manifest.json).
    BuildImage(image::BuildArgs),
    /// Boot the built image under QEMU microvm and check the agent's selftests.
    SmokeImage(image::SmokeArgs),
    /// The nested-KVM tier: real Linux under crucible-vmm on any host.
    ///
    /// QEMU TCG emulates an AMD CPU with SVM and nested paging; Debian's stock kernel
    /// (`linux-image-amd64`, fetched once with apt-get download into ~/.cache/crucible/nested)
    /// runs in it as L1 and loads kvm_amd; inside L1 the test binaries `cargo test` built run
    /// with every KVM test included: the VMM's real-kernel and test-guest tests (with the static
    /// crucible-vmm) and the daemon's microVM suite on crucible-vmm. Each step has a deadline;
    /// a failed step fails the tier. A run the emulator spoiled (L1 panicked or froze, QEMU
    /// died) is retried up to --retries times, each retry printed. Logs: target/crucible/nested.
    Nested(nested::Args),
    /// The soak test's long form: 10,000 execs across 20 sandboxes with random cancellations
    /// and file transfers, nothing lost, memory steady (the short form runs in `cargo test`).
    Soak(soak::Args),
    /// Run the benchmark suite against its peers; write docs/benchmarks.md, plots and JSON.
    ///
    /// Builds `crucible-bench` (the `bench/` crate) and crucible-vmm with --release and runs
    /// the suite with the arguments given (`cargo xtask bench -- --help` lists them): `--quick`,
    /// `--gate`, `--check-slowed`, `--only SECTION,…` (floor, vmm, create, exec, streaming,
    /// files, concurrency, peers, footprint, tcg, egress, sdk, nested), `--update-baseline`.
    #[command(disable_help_flag = true)]
    Bench(bench::Args),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // The one shell every external command runs through, in the workspace root.
    let sh = &util::shell()?;
    match cli.command {
        Command::Ci(args) => ci::run(sh, args),
        Command::Architecture => architecture::run(sh),
        Command::Fuzz(args) => fuzz::run(sh, args),
        Command::Critest(args) => critest::run(sh, args),
        Command::GenFixtures(args) => fixtures::run(args),
        Command::GenOpenapi => openapi::run(sh),
        Command::Hostile(args) => hostile::run(sh, args),
        Command::BuildImage(args) => image::build(args),
        Command::SmokeImage(args) => image::smoke(args),
        Command::Nested(args) => nested::run(sh, args),
        Command::Soak(args) => soak::run(sh, args),
        Command::Bench(args) => bench::run(sh, args),
    }
}
