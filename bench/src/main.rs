//! `crucible-bench` (`cargo xtask bench`): crucible's benchmark suite, side by side with its
//! peers and the host's floor, written as `benchmarks.md` + SVG plots + `bench-results.json`,
//! and the CI gate that compares ratios to the floor with `bench-baseline.json`. See
//! `docs/benchmarks.md`.
//!
//! - `suite`: the arguments, the run, the gate and its self-test
//! - `stats`: percentiles and medians of repeated runs
//! - `model`: the results (measurements, table rows, goals, skips)
//! - `daemon`: the daemon under test (in-process, or a child for footprint)
//! - `metrics`: our figures through the public API
//! - `peers`: the floor and the peers
//! - `egress`, `blob_server`, `minimal_proxy`: the egress proxy next to a direct host
//!   connection and a minimal proxy, and the host server they all download from
//! - `nested`, `nested_boot`: crucible-vmm's boot beside QEMU microvm's, both under KVM inside
//!   the nested tier's L1 (the figures, and the half that runs inside L1)
//! - `sdks`: the exec round trip through the Python and TypeScript SDKs, beside raw HTTP
//! - `sections`: the parts of the suite `--only` selects
//! - `runner`: the order everything runs in
//! - `report`, `plots`: the markdown, the JSON, the SVGs
//! - `gate`: the baseline comparison

mod blob_server;
mod blocking;
mod bounds;
mod daemon;
mod egress;
mod gate;
mod host_shell;
mod metrics;
mod minimal_proxy;
mod model;
mod nested;
mod nested_boot;
mod peers;
mod plots;
mod pods;
mod qemu_tcg;
mod report;
mod runner;
mod sdks;
mod sections;
mod stats;
mod suite;
mod util;
mod vmm_overhead;

use anyhow::Result;
use clap::{Parser, Subcommand};

pub(crate) use suite::microvm_skip_reason;

/// crucible's benchmark suite (`cargo xtask bench` runs it).
#[derive(Parser)]
#[command(
    name = "crucible-bench",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    /// A helper the suite starts (internal).
    #[command(subcommand)]
    helper: Option<Helper>,
    #[command(flatten)]
    suite: suite::Args,
}

#[derive(Subcommand)]
enum Helper {
    /// The daemon for the footprint benchmark, in its own process (internal).
    #[command(hide = true)]
    Daemon(daemon::ChildArgs),
    /// The fork+exec floor helper (internal).
    #[command(hide = true)]
    Floor(peers::FloorArgs),
    /// The nested benchmark's inside half, run in L1 (internal).
    #[command(hide = true)]
    NestedBoot(nested_boot::Args),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.helper {
        Some(Helper::Daemon(args)) => daemon::run_child(args),
        Some(Helper::Floor(args)) => peers::run_floor(args),
        Some(Helper::NestedBoot(args)) => nested_boot::run(args),
        None => suite::run(cli.suite),
    }
}
