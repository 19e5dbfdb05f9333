//! What `crucible-vmm` itself costs beside its guest: the process's private and anonymous
//! memory other than guest RAM (`crucible_vmm::overhead`, from `/proc/<pid>/smaps`) and the
//! boot timings it writes with `--timings FILE`, for the I/O test guest having used every
//! device (console, a disk, vsock with a live host connection) and halted with them attached.
//! A test guest, not our kernel: it runs wherever `/dev/kvm` opens (kvm_pvm included), and the
//! figures are the VMM's, not Linux's. Not gated: no floor to take a ratio against.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use crucible_vmm::overhead::{self, MemoryOverhead};
use crucible_vmm::test_guest::{build_elf, serve_io_guest_host, IO_GUEST};

use super::metrics::Plan;
use super::model::{Measurement, Row, Skipped, Unit};
use crate::util::{run_step, workspace_root};

/// Guest RAM of the measured VM (as the test measuring the same figure uses).
const GUEST_MEM_MIB: u64 = 64;
/// What the measurements are labelled with.
const WHO: &str = "test guest under KVM";
/// What the I/O guest prints once it has used every device and halts with them live.
const STAYING: &str = "test-guest: staying";

/// The report's rows for these figures.
pub(crate) fn rows() -> Vec<Row> {
    [
        "vmm_private_mib",
        "vmm_anon_mib",
        "vmm_kvm_ready_ms",
        "vmm_boot_ms",
        "vmm_guest_io_done_ms",
    ]
    .into_iter()
    .map(|metric| Row {
        section: "VMM overhead".into(),
        metric: metric.into(),
        peers: Vec::new(),
        floor: None,
        gated: false,
    })
    .collect()
}

/// One VM's figures.
struct Sample {
    memory: MemoryOverhead,
    timings: serde_json::Value,
}

/// Measures `plan.runs` VMs into `measurements`, or says in `skipped` why this host cannot.
pub(crate) fn measure(
    plan: &Plan,
    measurements: &mut Vec<Measurement>,
    skipped: &mut Vec<Skipped>,
) -> Result<()> {
    if let Err(e) = host_probe::host::dev_kvm_access(Path::new(host_probe::host::DEV_KVM)) {
        skipped.push(Skipped {
            what: format!("VMM overhead ({WHO})"),
            reason: format!(
                "{} does not open read-write: {e}",
                host_probe::host::DEV_KVM
            ),
        });
        return Ok(());
    }
    let vmm = build_vmm()?;
    let scratch = tempfile::Builder::new()
        .prefix("crucible-bench-vmm-")
        .tempdir()
        .context("scratch directory")?;
    let kernel = scratch.path().join("io_guest.elf");
    std::fs::write(&kernel, build_elf(IO_GUEST, false))
        .with_context(|| format!("writing {}", kernel.display()))?;
    let mut samples = Vec::new();
    for run in 0..plan.runs {
        let dir = scratch.path().join(format!("run{run}"));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        samples.push(one_vm(&vmm, &kernel, &dir)?);
    }
    let mib = |f: fn(&MemoryOverhead) -> u64| -> Vec<f64> {
        samples
            .iter()
            .map(|s| f(&s.memory) as f64 / 1024.0)
            .collect()
    };
    let ms = |field: &str| -> Result<Vec<f64>> {
        samples
            .iter()
            .map(|s| {
                s.timings[field]
                    .as_u64()
                    .map(|us| us as f64 / 1000.0)
                    .with_context(|| format!("--timings has no {field}: {}", s.timings))
            })
            .collect()
    };
    let setup = format!(
        "the release `crucible-vmm` running the I/O test guest (`vmm/tests/guest/io_guest.c`) \
         with {GUEST_MEM_MIB} MiB of guest RAM, one vCPU, a console log, a 1 MiB disk and vsock \
         with a live host connection, every device used, seccomp filters on"
    );
    measurements.push(Measurement::scalar(
        "vmm_private_mib",
        &format!("VMM private memory beside guest RAM ({WHO})"),
        "ours",
        Unit::Mib,
        &mib(|m| m.private_kib),
        &format!(
            "{setup}; once the guest halts with its devices live: Private_Clean + Private_Dirty \
             of every mapping in /proc/<pid>/smaps but guest RAM (crucible_vmm::overhead)"
        ),
    ));
    measurements.push(Measurement::scalar(
        "vmm_anon_mib",
        &format!("VMM anonymous memory beside guest RAM, what each VM adds ({WHO})"),
        "ours",
        Unit::Mib,
        &mib(|m| m.anonymous_kib),
        &format!(
            "{setup}; of the private memory, the anonymous pages (heap, stacks, written data); \
             the rest is the binary's page cache, shared by every VMM"
        ),
    ));
    let timing = |key: &str, label: &str, field: &str, what: &str| -> Result<Measurement> {
        Ok(Measurement::scalar(
            key,
            &format!("{label} ({WHO})"),
            "ours",
            Unit::Ms,
            &ms(field)?,
            &format!("{setup}; `{field}` of `--timings FILE`: {what}"),
        ))
    };
    measurements.push(timing(
        "vmm_kvm_ready_ms",
        "VMM start → VM built",
        "kvm_ready_us",
        "process start to VM, memory, devices and vCPUs set up",
    )?);
    measurements.push(timing(
        "vmm_boot_ms",
        "VMM start → guest's first instruction",
        "kernel_entry_us",
        "process start to the boot vCPU's first KVM_RUN",
    )?);
    measurements.push(timing(
        "vmm_guest_io_done_ms",
        "VMM start → guest done with every device",
        "boot_complete_us",
        "process start to the guest's boot-complete marker, written after its console, \
         block and vsock I/O",
    )?);
    Ok(())
}

/// Builds the release VMM; returns its path.
fn build_vmm() -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run_step(
        "build crucible-vmm (release)",
        Command::new(cargo).args([
            "build",
            "--release",
            "--quiet",
            "--package",
            "crucible-vmm",
            "--bin",
            "crucible-vmm",
        ]),
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let vmm = target.join("release/crucible-vmm");
    if !vmm.is_file() {
        bail!("cargo built crucible-vmm but {} is missing", vmm.display());
    }
    Ok(vmm)
}

/// Runs one VM in `dir` until the guest has used every device and halts, measures its memory,
/// stops it with SIGTERM and reads its timings.
fn one_vm(vmm: &Path, kernel: &Path, dir: &Path) -> Result<Sample> {
    let host = serve_io_guest_host(dir).context("preparing the test guest's disk and vsock")?;
    let timings_file = dir.join("timings.json");
    // Kept out of the bench's own output; quoted when the VM fails.
    let stderr_file = dir.join("vmm.stderr");
    let stderr = || std::fs::read_to_string(&stderr_file).unwrap_or_default();
    let mut cmd = Command::new(vmm);
    cmd.arg("--kernel")
        .arg(kernel)
        .args(["--mem-mib", &GUEST_MEM_MIB.to_string(), "--serial"])
        .args(["--cmdline", "io_guest.stay", "--boot-timeout-ms", "10000"])
        .arg("--console")
        .arg(dir.join("console.log"))
        .arg("--block")
        .arg(dir.join("disk.img"))
        .args(["--vsock-cid", "3", "--vsock-uds"])
        .arg(dir.join("v.sock"))
        .arg("--timings")
        .arg(&timings_file)
        .stdout(Stdio::piped())
        .stderr(
            std::fs::File::create(&stderr_file)
                .with_context(|| format!("creating {}", stderr_file.display()))?,
        );
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", vmm.display()))?;
    let stdout = child.stdout.take().context("the VMM's stdout")?;
    let mut serial = BufReader::new(stdout);
    let mut seen = String::new();
    let mut line = String::new();
    while !line.contains(STAYING) {
        line.clear();
        let n = serial
            .read_line(&mut line)
            .context("reading the guest's serial output")?;
        seen.push_str(&line);
        if n == 0 {
            let status = child.wait().context("waiting for the VMM")?;
            bail!(
                "the VMM ended ({status}) before the test guest halted; serial:\n{seen}\
                 stderr:\n{}",
                stderr()
            );
        }
    }
    let measured = overhead::measure(child.id(), GUEST_MEM_MIB << 20);
    // SAFETY: kill(2) on our own child's pid, which has not been waited for yet.
    let killed = unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().context("waiting for the VMM")?;
    if killed != 0 || status.code() != Some(0) {
        bail!(
            "the VMM did not stop cleanly on SIGTERM ({status}); serial:\n{seen}stderr:\n{}",
            stderr()
        );
    }
    let memory = measured.context("measuring the VMM's memory")?;
    match host.join() {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(e).context("the test guest's vsock connection"),
        Err(_) => bail!("the test guest's vsock host thread panicked"),
    }
    let text = std::fs::read_to_string(&timings_file)
        .with_context(|| format!("reading {}", timings_file.display()))?;
    let timings = serde_json::from_str(&text)
        .with_context(|| format!("parsing {}: {text}", timings_file.display()))?;
    Ok(Sample { memory, timings })
}
