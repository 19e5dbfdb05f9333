//! `crucible doctor`: what the host offers and which backend will run sandboxes.

use std::path::PathBuf;

use anyhow::Result;
use api_types::BackendKind;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The image directory to check.
    #[arg(long, env = "CRUCIBLE_IMAGE", default_value_os_t = crate::default_image_dir())]
    image: PathBuf,
    /// The hypervisor to check microVM support for, as `crucible serve --hypervisor` takes it.
    #[arg(long, value_parser = crate::serve::parse_hypervisor, default_value = "crucible-vmm")]
    hypervisor: api_types::Hypervisor,
}

pub(crate) fn run(args: &Args, json: bool) -> Result<()> {
    let image = &args.image;
    // The daemon's own view, so doctor and `serve` can never disagree.
    let mut config = api::ServeConfig::new(image.clone());
    config.engine.hypervisor = args.hypervisor;
    let state = engine::Engine::new(config.engine);
    let report = state.host().clone();
    let agent = image.join("rootfs/init");
    let kernel = image.join("vmlinux");
    let microvm = state.unavailable_reason(BackendKind::Microvm);
    let namespace = state.unavailable_reason(BackendKind::Namespace);
    let chosen = state.default_backend();
    let usable = state.unavailable_reason(chosen).is_none();
    let storage = engine::storage::HostSupport::inspect();
    if json {
        let value = serde_json::json!({
            "host": report,
            "image": {"dir": image, "agent": agent.is_file(), "kernel": kernel.is_file()},
            "backends": {
                "microvm": {
                    "available": microvm.is_none(),
                    "reason": microvm,
                    "hypervisor": args.hypervisor,
                },
                "namespace": {"available": namespace.is_none(), "reason": namespace},
            },
            "default_backend": if usable { chosen.to_string() } else { "none".to_string() },
            "storage": {"host": storage, "problem": storage.problem()},
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    // The same probe and words as `crucible-vmm --host-info`.
    println!("KVM:               {}", report.kvm.describe());
    println!(
        "cgroups:           {}",
        match report.cgroup_version {
            2 => "v2 (unified)",
            1 => "v1 controllers",
            _ => "none mounted",
        }
    );
    println!(
        "user namespaces:   {}",
        if report.user_namespaces { "yes" } else { "no" }
    );
    println!(
        "running as root:   {}",
        if report.root { "yes" } else { "no" }
    );
    println!(
        "image:             {} (agent {}, kernel {})",
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
    println!(
        "caches and disks:  {}",
        match storage.problem() {
            None => format!(
                "yes (mkfs.ext4 at {}, loop devices)",
                storage
                    .mkfs_ext4
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ),
            Some(problem) => format!("no: {problem}"),
        }
    );
    let microvm_name = format!("microvm ({})", args.hypervisor);
    for (name, reason) in [(microvm_name.as_str(), &microvm), ("namespace", &namespace)] {
        match reason {
            None => println!("{name} backend: available"),
            Some(reason) => println!("{name} backend: unavailable: {reason}"),
        }
    }
    if usable {
        println!("sandboxes will use: {chosen}");
    } else {
        println!("sandboxes will use: nothing works yet (see above)");
    }
    Ok(())
}
