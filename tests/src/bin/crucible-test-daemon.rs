//! The daemon as its own process, for tests that measure it alone (fds, RSS):
//! `crucible-test-daemon SOCKET STATE_DIR CGROUP_PARENT`. Stops on SIGTERM.

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1).map(PathBuf::from);
    let (Some(socket), Some(state_dir), Some(parent)) = (args.next(), args.next(), args.next())
    else {
        anyhow::bail!("usage: crucible-test-daemon SOCKET STATE_DIR CGROUP_PARENT");
    };
    let mut config = api::ServeConfig::new(harness::image_dir());
    config.unix_socket = Some(socket);
    config.state_dir = state_dir;
    config.cgroup_parent = parent.to_string_lossy().into_owned();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(api::serve(config))?;
    Ok(())
}
