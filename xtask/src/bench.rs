//! `cargo xtask bench …`: the benchmark suite lives in its own crate (`bench/`,
//! `crucible-bench`); this builds it and crucible-vmm with `--release` (figures of a debug
//! build mean little, and the QEMU TCG microVMs run crucible-vmm's vsock device) and runs it
//! with the arguments given. `cargo xtask bench --help` shows the suite's own flags.

use std::ffi::OsString;

use anyhow::Result;
use xshell::{cmd, Shell};

use crate::util::{cargo, run_step, workspace_root};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The suite's arguments (`--quick`, `--gate`, `--only nested`, …).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

pub(crate) fn run(sh: &Shell, args: Args) -> Result<()> {
    let cargo = cargo();
    run_step(
        "build the suite and crucible-vmm (--release)",
        cmd!(
            sh,
            "{cargo} build --release --quiet -p crucible-bench -p crucible-vmm"
        ),
    )?;
    let bench = workspace_root().join("target/release/crucible-bench");
    let suite_args = &args.args;
    run_step("bench", cmd!(sh, "{bench} {suite_args...}"))
}
