//! `cargo xtask soak`: the soak test (`tests/tests/namespace_soak.rs`) in its long form. The
//! short form (1,000 execs) runs in `cargo test`, and so in `cargo xtask ci`.

use anyhow::Result;
use xshell::{cmd, Shell};

use crate::util::{cargo, run_step};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Execs in all (completed and cancelled), plus one file transfer per 10.
    #[arg(long, default_value_t = 10_000)]
    execs: u64,
    /// Sandboxes the execs are spread across.
    #[arg(long, default_value_t = 20)]
    sandboxes: u64,
    /// The seed of a run to replay (printed by every run) [default: from the clock].
    #[arg(long)]
    seed: Option<u64>,
}

pub(crate) fn run(sh: &Shell, args: Args) -> Result<()> {
    let cargo = cargo();
    let mut command = cmd!(
        sh,
        "{cargo} test -p crucible-tests --test namespace_soak -- --nocapture"
    )
    .env("CRUCIBLE_SOAK_EXECS", args.execs.to_string())
    .env("CRUCIBLE_SOAK_SANDBOXES", args.sandboxes.to_string());
    let mut knobs = format!(
        "CRUCIBLE_SOAK_EXECS={} CRUCIBLE_SOAK_SANDBOXES={}",
        args.execs, args.sandboxes
    );
    if let Some(seed) = args.seed {
        command = command.env("CRUCIBLE_SOAK_SEED", seed.to_string());
        knobs.push_str(&format!(" CRUCIBLE_SOAK_SEED={seed}"));
    }
    run_step(&format!("soak ({knobs})"), command)
}
