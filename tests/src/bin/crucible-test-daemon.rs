//! The daemon as its own process, for tests that measure it alone (fds, RSS) or kill it:
//! `crucible-test-daemon SOCKET STATE_DIR CGROUP_PARENT [--disk-mib N] [--microvm HYPERVISOR]
//! [--egress-allow RULE]... [--volume NAME=DIR:ro]... [--exec-tail-bytes N] [--live-restore]`
//! (`--microvm crucible-vmm|qemu-tcg`: microVM sandboxes by default, with the harness's
//! `crucible-vmm`; the others as `crucible serve`'s flags of those names). Stops on SIGTERM.

use std::path::PathBuf;

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    // As `crucible serve` logs: `CRUCIBLE_LOG` (default `warn`), to stderr.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CRUCIBLE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let mut args = std::env::args_os().skip(1);
    let (Some(socket), Some(state_dir), Some(parent)) = (args.next(), args.next(), args.next())
    else {
        anyhow::bail!(
            "usage: crucible-test-daemon SOCKET STATE_DIR CGROUP_PARENT [--disk-mib N] \
             [--microvm crucible-vmm|qemu-tcg]"
        );
    };
    let mut config = api::ServeConfig::new(harness::image_dir());
    config.unix_socket = Some(PathBuf::from(socket));
    config.engine.state_dir = PathBuf::from(&state_dir);
    // Beside the state directory, so that a restarted daemon finds the same caches.
    config.engine.storage.data_dir = PathBuf::from(state_dir).with_extension("data");
    config.engine.cgroup_parent = parent.to_string_lossy().into_owned();
    while let Some(flag) = args.next() {
        if flag == "--live-restore" {
            config.engine.live_restore = true;
            continue;
        }
        let value = args
            .next()
            .context("every option but --live-restore needs a value")?;
        let value = value.to_string_lossy();
        match flag.to_string_lossy().as_ref() {
            "--disk-mib" => {
                config.engine.limits.scratch_mib = value.parse().context("--disk-mib")?
            }
            "--egress-allow" => config.egress_allow.push(value.into_owned()),
            "--volume" => config
                .engine
                .storage
                .volumes
                .declare(&value)
                .context("--volume")?,
            "--exec-tail-bytes" => {
                config.engine.limits.exec_tail_bytes = value.parse().context("--exec-tail-bytes")?
            }
            "--microvm" => {
                config.engine.hypervisor = match value.as_ref() {
                    "crucible-vmm" => api_types::Hypervisor::CrucibleVmm,
                    "qemu-tcg" => api_types::Hypervisor::QemuTcg,
                    other => anyhow::bail!("--microvm {other:?}: crucible-vmm or qemu-tcg"),
                };
                config.engine.vmm_binary = harness::vmm_binary();
                config.engine.default_backend = Some(api_types::BackendKind::Microvm);
            }
            other => anyhow::bail!("unknown option {other:?}"),
        }
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(api::serve(config))?;
    Ok(())
}
