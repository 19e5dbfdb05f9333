//! `containerd-shim-crucible-v2`: containerd starts it as `… start`, `… delete`, or to serve.

use containerd_shim::Config;

#[tokio::main]
async fn main() {
    let config = Config {
        // The shim has no child processes: crucible's daemon runs the commands. Reaping every
        // child with waitpid(-1) would only race tokio.
        no_reaper: true,
        no_sub_reaper: true,
        ..Config::default()
    };
    containerd_shim::run::<shim::CrucibleShim>(shim::RUNTIME_ID, Some(config)).await;
}
