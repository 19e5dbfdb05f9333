//! The image the embedded daemon needs.

use std::path::Path;

use anyhow::{bail, Result};

/// Checks that `image_dir` holds what the namespace backend runs: the root tree with the agent.
pub fn ensure_for_namespace(image_dir: &Path) -> Result<()> {
    let agent = image_dir.join("rootfs/init");
    if agent.is_file() {
        return Ok(());
    }
    bail!(
        "no image at {} (missing {}): build it with `cargo xtask build-image`",
        image_dir.display(),
        agent.display()
    )
}
