//! The microVM backend on the `qemu-tcg` hypervisor: QEMU's `microvm` machine under TCG with
//! our vsock device over vhost-user, through the same API. Labelled TCG everywhere: emulated
//! CPUs, not comparable with KVM or with the namespace backend's figures beside them, and
//! never gated.

use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use api_types::{BackendKind, CreateSandbox, Hypervisor};
use wire::ExecRequest;

use super::daemon::{self, InProcess};
use super::metrics::Plan;
use super::model::{Measurement, Unit};
use super::peers::gib_per_s;
use super::stats::{ms, Runs};

/// Why the `qemu-tcg` hypervisor cannot run here, or `None` when it can.
pub(crate) fn unavailable(image: &Path) -> Option<String> {
    let vmm = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("crucible-vmm")));
    match vmm {
        Some(path) if path.is_file() => {}
        _ => {
            return Some(
                "crucible-vmm is not built beside this xtask (cargo build --release -p \
                 crucible-vmm)"
                    .into(),
            )
        }
    }
    let config = daemon::config(image, Path::new("/nonexistent"));
    let mut config = config;
    config.engine.hypervisor = Hypervisor::QemuTcg;
    engine::Engine::new(config.engine).unavailable_reason(BackendKind::Microvm)
}

fn create_request() -> CreateSandbox {
    CreateSandbox {
        backend: Some(BackendKind::Microvm),
        ..Default::default()
    }
}

/// Create → ready, the exec round trip of `true`, a stdout stream and the host memory per
/// sandbox (QEMU and the device process), each under TCG.
pub(crate) async fn measure(plan: &Plan, image: &Path) -> Result<Vec<Measurement>> {
    let d = InProcess::start_with(image, |c| {
        c.engine.hypervisor = Hypervisor::QemuTcg;
        c.engine.limits.ready_timeout_s = 120;
    })?;
    let client = d.client();
    let (creates, execs, stdout_bytes) = if plan.quick {
        (2, 20, 8u64 << 20)
    } else {
        (5, 200, 64u64 << 20)
    };

    let mut create = Runs::default();
    for _ in 0..plan.runs.min(3) {
        let mut samples = Vec::with_capacity(creates);
        for _ in 0..creates {
            let started = Instant::now();
            let info = client.create(&create_request()).await.context("create")?;
            samples.push(ms(started.elapsed()));
            ensure!(
                info.hypervisor == Some(Hypervisor::QemuTcg),
                "the sandbox runs on {:?}",
                info.hypervisor
            );
            client.delete(&info.id).await.context("delete")?;
        }
        create.push(samples);
    }

    let info = client.create(&create_request()).await.context("create")?;
    let id = info.id.clone();
    for _ in 0..5 {
        client
            .exec_collect(&id, &ExecRequest::new(["true"]))
            .await
            .context("warm-up exec")?;
    }
    let mut exec = Runs::default();
    for _ in 0..plan.runs.min(3) {
        let mut samples = Vec::with_capacity(execs);
        for _ in 0..execs {
            let started = Instant::now();
            let out = client
                .exec_collect(&id, &ExecRequest::new(["true"]))
                .await
                .context("exec true")?;
            samples.push(ms(started.elapsed()));
            ensure!(
                out.result.exit_code == 0,
                "`true` exited {}",
                out.result.exit_code
            );
        }
        exec.push(samples);
    }

    let dd = format!(
        "dd if=/dev/zero bs=65536 count={} 2>/dev/null",
        stdout_bytes / 65536
    );
    let mut rates = Vec::new();
    for _ in 0..plan.runs.min(3) {
        let started = Instant::now();
        let out = client
            .exec_collect(&id, &ExecRequest::new(["sh", "-c", &dd]))
            .await
            .context("stdout stream")?;
        let elapsed = started.elapsed().as_secs_f64();
        ensure!(
            out.stdout.len() as u64 == stdout_bytes,
            "streamed {} of {stdout_bytes} bytes",
            out.stdout.len()
        );
        rates.push(gib_per_s(stdout_bytes, elapsed));
    }

    let memory = sandbox_pss_mib(&d, &id)?;
    client.delete(&id).await.context("delete")?;
    d.stop();
    Ok(vec![
        Measurement::latency(
            "tcg_create_ready",
            "create → ready (microVM, QEMU TCG)",
            "ours",
            &create,
            "POST /sandboxes with `--hypervisor qemu-tcg`: the vhost-user vsock device, QEMU \
             microvm under TCG booting our kernel, until the agent's hello; sequential, each \
             deleted untimed. Emulated CPU: not comparable with KVM",
        ),
        Measurement::latency(
            "tcg_exec_rtt",
            "exec round trip of `true` (microVM, QEMU TCG)",
            "ours",
            &exec,
            "POST …/exec through the API into the TCG guest over vhost-user vsock; fork and \
             exec run emulated",
        ),
        Measurement::scalar(
            "tcg_stdout",
            &format!(
                "stdout to the client ({} MiB, 64 KiB writes; microVM, QEMU TCG)",
                stdout_bytes >> 20
            ),
            "ours",
            Unit::GibPerS,
            &rates,
            "`dd` inside the TCG guest through the guest's vsock driver, our device (credit \
             flow, vhost-user) and the daemon",
        ),
        Measurement::scalar(
            "tcg_host_mem_per_sandbox",
            "host memory per sandbox (microVM, QEMU TCG)",
            "ours",
            Unit::Mib,
            &[memory],
            "PSS of QEMU and the vsock device process of an idle sandbox after the runs \
             above, guest RAM included as far as the guest touched it (512 MiB configured)",
        ),
    ])
}

/// The PSS (MiB) of the processes whose command line names sandbox `id`: QEMU and the device.
fn sandbox_pss_mib(d: &InProcess, id: &str) -> Result<f64> {
    let dir = d.state_dir.join("sandboxes").join(id);
    let needle = dir.to_string_lossy().into_owned();
    let mut total = 0.0;
    let mut found = 0;
    for entry in std::fs::read_dir("/proc").context("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains(&needle) {
            continue;
        }
        let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .with_context(|| format!("/proc/{pid}/smaps_rollup"))?;
        total += daemon::kib_field(&rollup, "Pss").context("no Pss line")? / 1024.0;
        found += 1;
    }
    ensure!(
        found == 2,
        "expected QEMU and the vsock device for {id}, found {found} processes"
    );
    Ok(total)
}
