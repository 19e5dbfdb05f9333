//! `cargo xtask gen-openapi`: writes `docs/openapi.json` from the daemon's own document.

use anyhow::{Context, Result};

use crate::util::workspace_root;

pub fn run() -> Result<()> {
    let path = workspace_root().join("docs/openapi.json");
    std::fs::write(&path, api::openapi::document_text())
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
