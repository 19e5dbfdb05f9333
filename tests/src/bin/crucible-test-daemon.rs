//! The daemon as its own process, for tests that measure it alone (fds, RSS) or kill it:
//! `crucible-test-daemon SOCKET STATE_DIR CGROUP_PARENT [--disk-mib N]`. Stops on SIGTERM.

use std::path::PathBuf;

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(socket), Some(state_dir), Some(parent)) = (args.next(), args.next(), args.next())
    else {
        anyhow::bail!("usage: crucible-test-daemon SOCKET STATE_DIR CGROUP_PARENT [--disk-mib N]");
    };
    let mut config = api::ServeConfig::new(harness::image_dir());
    config.unix_socket = Some(PathBuf::from(socket));
    config.state_dir = PathBuf::from(&state_dir);
    // Beside the state directory, so that a restarted daemon finds the same caches.
    config.storage.data_dir = PathBuf::from(state_dir).with_extension("data");
    config.cgroup_parent = parent.to_string_lossy().into_owned();
    while let Some(flag) = args.next() {
        let value = args.next().context("every option needs a value")?;
        let value = value.to_string_lossy();
        match flag.to_string_lossy().as_ref() {
            "--disk-mib" => config.limits.scratch_mib = value.parse().context("--disk-mib")?,
            other => anyhow::bail!("unknown option {other:?}"),
        }
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(api::serve(config))?;
    Ok(())
}
