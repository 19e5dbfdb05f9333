//! `crucible doctor`: what the host offers and which backend will run sandboxes.

use std::path::PathBuf;

use anyhow::Result;
use api::host::{self, KvmKind};

#[derive(clap::Args)]
pub struct Args {
    /// The image directory to check.
    #[arg(long, env = "CRUCIBLE_IMAGE", default_value_os_t = crate::default_image_dir())]
    image: PathBuf,
}

pub fn run(args: &Args, json: bool) -> Result<()> {
    let image = &args.image;
    let report = host::inspect();
    let agent = image.join("rootfs/init");
    let kernel = image.join("vmlinux");
    let microvm = host::microvm_unavailable_reason(&report);
    let namespace = if !report.root {
        Some("needs root (namespaces, mounts, cgroups)".to_string())
    } else if !agent.is_file() {
        Some(format!(
            "no agent at {} (run: cargo xtask build-image)",
            agent.display()
        ))
    } else if report.cgroup_version == 0 {
        Some("no cgroup hierarchy is mounted".to_string())
    } else {
        None
    };
    let chosen = if namespace.is_none() {
        "namespace"
    } else {
        "none"
    };
    if json {
        let value = serde_json::json!({
            "host": report,
            "image": {"dir": image, "agent": agent.is_file(), "kernel": kernel.is_file()},
            "backends": {
                "microvm": {"available": false, "reason": microvm},
                "namespace": {"available": namespace.is_none(), "reason": namespace},
            },
            "default_backend": chosen,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    let kvm = match report.kvm {
        KvmKind::Hardware => "hardware (kvm_intel / kvm_amd)",
        KvmKind::Pvm => "PVM (kvm_pvm: nested, pagetable-based)",
        KvmKind::None => "none",
    };
    println!("KVM:              {kvm}");
    println!(
        "cgroups:          {}",
        match report.cgroup_version {
            2 => "v2 (unified)",
            1 => "v1 controllers",
            _ => "none mounted",
        }
    );
    println!(
        "user namespaces:  {}",
        if report.user_namespaces { "yes" } else { "no" }
    );
    println!(
        "running as root:  {}",
        if report.root { "yes" } else { "no" }
    );
    println!(
        "image:            {} (agent {}, kernel {})",
        image.display(),
        if agent.is_file() {
            "present"
        } else {
            "missing"
        },
        if kernel.is_file() {
            "present"
        } else {
            "missing"
        }
    );
    println!("microvm backend:  unavailable: {microvm}");
    match &namespace {
        None => println!("namespace backend: available"),
        Some(reason) => println!("namespace backend: unavailable: {reason}"),
    }
    println!("sandboxes will use: {chosen}");
    Ok(())
}
