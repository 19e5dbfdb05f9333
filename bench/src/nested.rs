//! The `nested` section: `crucible-vmm`'s boot next to QEMU's `microvm` machine with
//! `-accel kvm`, both under the same KVM inside the nested tier's L1 (QEMU TCG emulating an AMD
//! CPU with SVM and nested paging; `cargo xtask nested`). The boots themselves run inside L1
//! (`nested_boot`, this program's `nested-boot` helper); `cargo xtask nested --boot-bench`
//! builds that L1 with this program in it and runs it; this side turns the samples L1 printed
//! into figures.
//!
//! Labelled *nested TCG* everywhere: every instruction of L1, and every exit of L2, goes
//! through an emulator, so absolute times mean nothing and are never gated. What means
//! something is the ratio of ours to QEMU's from the same run, and the exit counts.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::metrics::Plan;
use super::model::{Measurement, Row, Unit};
use super::nested_boot::{Booter, Sample, SAMPLE_PREFIX};
use super::stats::{median, Runs};
use crate::util::workspace_root;

/// The table's rows: time to the agent's hello and KVM exits to it, each beside QEMU's.
pub(crate) fn rows() -> Vec<Row> {
    [
        ("nested_hello", "nested_hello_qemu"),
        ("nested_exits", "nested_exits_qemu"),
    ]
    .into_iter()
    .map(|(metric, peer)| Row {
        section: "microVM boot, nested TCG (crucible-vmm vs QEMU microvm, both on KVM in L1)"
            .into(),
        metric: metric.into(),
        peers: vec![peer.into()],
        floor: None,
        gated: false,
    })
    .collect()
}

/// Boots `runs` times under each hypervisor inside one L1 (`cargo xtask nested --boot-bench`,
/// which builds and runs L1 with this program in it) and returns the figures.
pub(crate) fn measure(plan: &Plan) -> Result<Vec<Measurement>> {
    let runs = if plan.quick { 3 } else { 7 };
    let out = workspace_root().join("target/crucible/nested-bench");
    std::fs::create_dir_all(&out)?;
    let me = std::env::current_exe().context("this program's path")?;
    let results = out.join("results.log");
    let _ = std::fs::remove_file(&results);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    crate::util::run_step(
        "nested boot benchmark (cargo xtask nested --boot-bench)",
        Command::new(cargo)
            .args(["xtask", "nested", "--quiet", "--boot-bench"])
            .arg(runs.to_string())
            .arg("--bench-binary")
            .arg(&me)
            .arg("--results")
            .arg(&results),
    )?;
    let results = std::fs::read_to_string(&results)
        .with_context(|| format!("reading {}", results.display()))?;
    let samples: Vec<Sample> = results
        .lines()
        .filter_map(|l| l.strip_prefix(SAMPLE_PREFIX))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("a sample line from L1")?;
    figures(&samples)
}

/// The figures from L1's samples.
fn figures(samples: &[Sample]) -> Result<Vec<Measurement>> {
    let of = |b: Booter| samples.iter().filter(move |s| s.booter == b);
    let (ours, qemu): (Vec<&Sample>, Vec<&Sample>) = (
        of(Booter::CrucibleVmm).collect(),
        of(Booter::QemuMicrovm).collect(),
    );
    if ours.is_empty() || qemu.is_empty() {
        bail!(
            "L1 reported {} boots of crucible-vmm and {} of QEMU",
            ours.len(),
            qemu.len()
        );
    }
    let hello = |s: &[&Sample]| {
        let mut runs = Runs::default();
        runs.push(s.iter().map(|s| s.hello_ms).collect());
        runs
    };
    let kvm = |s: &[&Sample], key: &str| -> Vec<f64> {
        s.iter()
            .map(|s| s.kvm_stats.get(key).copied().unwrap_or(0) as f64)
            .collect()
    };
    let timing = |key: &str| -> Vec<f64> {
        ours.iter()
            .filter_map(|s| s.timings.as_ref()?.get(key)?.as_u64())
            .map(|us| us as f64 / 1000.0)
            .collect()
    };
    let by_reason = |s: &[&Sample]| -> String {
        let mut keys: Vec<&String> = s.iter().flat_map(|s| s.kvm_stats.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|k| *k != "exits")
            .map(|k| format!("{k} {:.0}", median(&kvm(s, k))))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let loop_exits = {
        let mut totals: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for s in &ours {
            let exits = s.timings.as_ref().and_then(|t| t.get("exits"));
            for (reason, n) in exits.and_then(|e| e.as_object()).into_iter().flatten() {
                totals
                    .entry(reason.clone())
                    .or_default()
                    .push(n.as_f64().unwrap_or(0.0));
            }
        }
        totals
            .iter()
            .map(|(k, v)| format!("{k} {:.0}", median(v)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    const WHERE: &str =
        "inside L1 (Debian 6.1 with kvm_amd under QEMU 7.2 TCG, -cpu EPYC,+svm,+npt \
                         -smp 1 -m 4096M); our kernel and initramfs, 256 MiB, 1 vCPU, the agent's \
                         markers on, alternating with the other hypervisor. Nested TCG: ratios \
                         and counts mean something, absolute times do not";
    Ok(vec![
        Measurement::latency(
            "nested_hello",
            "boot → agent's hello, nested TCG",
            "ours",
            &hello(&ours),
            &format!(
                "crucible-vmm (static, release) spawned → the agent's hello on <uds>_1025; {WHERE}"
            ),
        ),
        Measurement::latency(
            "nested_hello_qemu",
            "boot → agent's hello, nested TCG",
            "QEMU microvm -accel kvm",
            &hello(&qemu),
            &format!(
                "QEMU's microvm machine (-accel kvm -cpu host, no ACPI, no option ROMs, the \
                 machine the daemon's qemu-tcg hypervisor uses) spawned → the hello, our vsock \
                 device over vhost-user started beforehand; {WHERE}"
            ),
        ),
        Measurement::scalar(
            "nested_exits",
            "VM exits to the agent's hello, nested TCG",
            "ours",
            Unit::Count,
            &kvm(&ours, "exits"),
            &format!(
                "KVM's own count (debugfs `exits`) at the hello; by KVM's reasons: {}. Our \
                 vCPU loop's exits over the whole VM (boot, hello, shutdown): {loop_exits}",
                by_reason(&ours)
            ),
        ),
        Measurement::scalar(
            "nested_exits_qemu",
            "VM exits to the agent's hello, nested TCG",
            "QEMU microvm -accel kvm",
            Unit::Count,
            &kvm(&qemu, "exits"),
            &format!(
                "KVM's own count (debugfs `exits`) at the hello; by KVM's reasons: {}",
                by_reason(&qemu)
            ),
        ),
        Measurement::scalar(
            "nested_kvm_ready",
            "crucible-vmm start → KVM set up, nested TCG",
            "ours",
            Unit::Ms,
            &timing("kvm_ready_us"),
            "`kvm_ready` of --timings: VM, memory, devices, vCPUs configured",
        ),
        Measurement::scalar(
            "nested_kernel_entry",
            "crucible-vmm start → kernel entry, nested TCG",
            "ours",
            Unit::Ms,
            &timing("kernel_entry_us"),
            "`kernel_entry` of --timings: the boot vCPU's first KVM_RUN",
        ),
        Measurement::scalar(
            "nested_agent_ready",
            "crucible-vmm start → agent ready marker, nested TCG",
            "ours",
            Unit::Ms,
            &timing("boot_complete_us"),
            "`boot_complete` of --timings: the agent's READY port write, trapped by the VMM",
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(booter: Booter, hello_ms: f64, exits: u64) -> Sample {
        Sample {
            booter,
            hello_ms,
            kvm_stats: [
                ("exits".to_string(), exits),
                ("io_exits".to_string(), exits / 2),
            ]
            .into(),
            timings: (booter == Booter::CrucibleVmm).then(|| {
                serde_json::json!({"kvm_ready_us": 1000, "kernel_entry_us": 2000,
                    "boot_complete_us": 900000, "exits": {"io_out": 40, "mmio_write": 7}})
            }),
        }
    }

    #[test]
    fn figures_pair_each_of_ours_with_qemus_and_keep_the_reasons() {
        let samples = [
            sample(Booter::CrucibleVmm, 1000.0, 100),
            sample(Booter::QemuMicrovm, 3000.0, 900),
            sample(Booter::CrucibleVmm, 1200.0, 120),
            sample(Booter::QemuMicrovm, 2800.0, 800),
        ];
        let m = figures(&samples).unwrap_or_else(|e| panic!("{e}"));
        let get = |k: &str| m.iter().find(|m| m.key == k).map(|m| m.value);
        // The p50 of the two boots, nearest rank, as every latency of the suite.
        assert_eq!(get("nested_hello"), Some(1000.0));
        // Medians of an even count take the lower middle, as every scalar of the suite.
        assert_eq!(get("nested_exits"), Some(100.0));
        assert_eq!(get("nested_exits_qemu"), Some(800.0));
        assert_eq!(get("nested_agent_ready"), Some(900.0));
        let note = &m
            .iter()
            .find(|m| m.key == "nested_exits")
            .map(|m| m.note.clone());
        let note = note.as_deref().unwrap_or_default();
        assert!(
            note.contains("io_exits 50") && note.contains("io_out 40"),
            "{note}"
        );
        assert!(figures(&samples[..1]).is_err(), "QEMU's boots are missing");
    }
}
