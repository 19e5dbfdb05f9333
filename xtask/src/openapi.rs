//! `cargo xtask gen-openapi`: writes `docs/openapi.json` from the daemon's own document, as
//! `crucible openapi` prints it (so xtask does not link the daemon).

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use crate::util::{cargo, workspace_root};

pub(crate) fn run(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    // Status checked below, so that the failure shows what `crucible openapi` said.
    let out = cmd!(
        sh,
        "{cargo} run --quiet -p crucible-cli --bin crucible -- openapi"
    )
    .ignore_status()
    .output()
    .context("running `crucible openapi`")?;
    if !out.status.success() {
        bail!(
            "`crucible openapi` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let path = workspace_root().join("docs/openapi.json");
    std::fs::write(&path, &out.stdout).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
