//! The image the embedded daemon needs, built on demand with the same library as
//! `cargo xtask build-image` (no kernel: the namespace backend does not boot one).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use guest_image::{AgentSource, ImageBuilder, ImageOptions};

/// Where the agent can come from: built from a crucible checkout containing the current
/// directory, or a static `guest-init` installed beside this binary.
fn agent_source() -> Result<AgentSource> {
    let cwd = std::env::current_dir().context("reading the current directory")?;
    if let Some(workspace) = cwd
        .ancestors()
        .find(|dir| dir.join("guest-init/Cargo.toml").is_file() && dir.join("Cargo.toml").is_file())
    {
        return Ok(AgentSource::Build {
            workspace: workspace.to_path_buf(),
        });
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("guest-init")));
    match beside {
        Some(agent) if agent.is_file() => Ok(AgentSource::Prebuilt(agent)),
        _ => bail!(
            "no image, and no way to build one here: run from a crucible checkout, install a \
             static guest-init beside the crucible binary, or point --image-dir at a built image"
        ),
    }
}

/// Makes sure `image_dir` holds what the namespace backend runs (the root tree with the
/// agent), building it with progress when it is missing.
pub(crate) fn ensure_for_namespace(image_dir: &Path) -> Result<()> {
    if image_dir.join("rootfs/init").is_file() {
        return Ok(());
    }
    eprintln!(
        "crucible: no image at {}; building one (agent + busybox userland, no kernel)",
        image_dir.display()
    );
    let workspace = match agent_source()? {
        AgentSource::Build { workspace } => workspace,
        prebuilt => {
            let mut options = ImageOptions::new(image_dir.to_path_buf(), PathBuf::new());
            options.kernel = None;
            options.agent = prebuilt;
            return build(options);
        }
    };
    let mut options = ImageOptions::new(image_dir.to_path_buf(), workspace);
    options.kernel = None;
    build(options)
}

fn build(options: ImageOptions) -> Result<()> {
    let manifest = ImageBuilder::new(options)
        .build(&guest_image::progress::Plain)
        .context("building the image")?;
    eprintln!("crucible: image ready ({} s)", manifest.build_seconds);
    Ok(())
}
