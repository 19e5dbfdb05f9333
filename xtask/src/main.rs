//! `cargo xtask …`: builds, checks and generated files for crucible.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod bench;
mod ci;
mod fixtures;
mod fuzz;
mod hostile;
mod image;
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
    /// Everything CI checks: fmt, clippy, tests, generated files up to date.
    Ci(ci::Args),
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
    /// Targets: frame_decoder, agent_request, http_exec_request, tar_extract, virtqueue_chain,
    /// vsock_packet.
    Fuzz(fuzz::Args),
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
    /// The soak test's long form: 10,000 execs across 20 sandboxes with random cancellations
    /// and file transfers, nothing lost, memory steady (the short form runs in `cargo test`).
    Soak(soak::Args),
    /// Run the benchmark suite against its peers; write docs/benchmarks.md, plots and JSON.
    Bench(bench::Args),
    /// The daemon for the footprint benchmark, in its own process (internal).
    #[command(hide = true)]
    BenchDaemon(bench::ChildArgs),
    /// The fork+exec floor helper of the benchmarks (internal).
    #[command(hide = true)]
    BenchFloor(bench::FloorArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Ci(args) => ci::run(args),
        Command::Fuzz(args) => fuzz::run(args),
        Command::GenFixtures(args) => fixtures::run(args),
        Command::GenOpenapi => openapi::run(),
        Command::Hostile(args) => hostile::run(args),
        Command::BuildImage(args) => image::build(args),
        Command::SmokeImage(args) => image::smoke(args),
        Command::Soak(args) => soak::run(args),
        Command::Bench(args) => bench::run(args),
        Command::BenchDaemon(args) => bench::run_child(args),
        Command::BenchFloor(args) => bench::run_floor(args),
    }
}
