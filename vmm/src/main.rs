//! `crucible-vmm`: run one microVM until the guest ends. See `docs/vmm.md`.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Parser;
use crucible_vmm::{
    config, error_chain, privileges, seccomp::ThreadFilters, BlockConfig, ConsoleOutput, HostKind,
    VmConfig, Vmm, VsockConfig, EXIT_CONFIG, EXIT_INTERNAL, EXIT_KVM,
};

/// Run one crucible microVM.
#[derive(Debug, Parser)]
#[command(name = "crucible-vmm", version)]
struct Args {
    /// A JSON VmConfig (the daemon's way); other flags are then not allowed.
    #[arg(long, conflicts_with_all = ["kernel"])]
    config: Option<PathBuf>,
    /// The uncompressed vmlinux ELF.
    #[arg(long, required_unless_present_any = ["config", "host_info"])]
    kernel: Option<PathBuf>,
    /// An initramfs.
    #[arg(long)]
    initramfs: Option<PathBuf>,
    /// Words appended to the kernel command line.
    #[arg(long, default_value = "")]
    cmdline: String,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 256)]
    mem_mib: u32,
    /// vCPUs.
    #[arg(long, default_value_t = 1)]
    vcpus: u8,
    /// Back guest memory with 2 MiB hugepages.
    #[arg(long)]
    hugepages: bool,
    /// A raw disk image (repeatable); suffix `:ro` for read-only.
    #[arg(long = "block")]
    block: Vec<String>,
    /// The guest CID for vsock (needs --vsock-uds).
    #[arg(long, requires = "vsock_uds")]
    vsock_cid: Option<u32>,
    /// The vsock Unix socket path.
    #[arg(long, requires = "vsock_cid")]
    vsock_uds: Option<PathBuf>,
    /// Console: `stdout`, `off`, or a file path.
    #[arg(long, default_value = "stdout")]
    console: String,
    /// Emulate the 8250 serial at 0x3f8 and use it as the console (early-boot debugging).
    #[arg(long)]
    serial: bool,
    /// Stop the VM if the guest has not written the boot-complete marker by then (0 = never;
    /// default 10000 on kvm_pvm hosts, never elsewhere).
    #[arg(long)]
    boot_timeout_ms: Option<u64>,
    /// Write boot timings as JSON when the VM ends: to FILE (created before the VM starts),
    /// or as one line on stderr when no FILE is given.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = TIMINGS_ON_STDERR)]
    timings: Option<PathBuf>,
    /// Write the device metrics (driver protocol violations per virtio device) to FILE as JSON
    /// when the VM ends. The file is created before the VM starts.
    #[arg(long, value_name = "FILE")]
    metrics: Option<PathBuf>,
    /// Run without the per-thread seccomp filters (debugging only).
    #[arg(long)]
    no_seccomp: bool,
    /// Drop to this uid once the VM is built.
    #[arg(long)]
    uid: Option<u32>,
    /// Drop to this gid once the VM is built.
    #[arg(long)]
    gid: Option<u32>,
    /// Print the host's KVM kind and what it means, then exit.
    #[arg(long)]
    host_info: bool,
}

fn config_from(args: &Args) -> Result<VmConfig, String> {
    if let Some(p) = &args.config {
        return config::from_file(p).map_err(|e| error_chain(&e));
    }
    let kernel = args
        .kernel
        .clone()
        .ok_or("--kernel or --config is required")?;
    let mut c = VmConfig::new(kernel);
    c.initramfs = args.initramfs.clone();
    c.cmdline = args.cmdline.clone();
    c.mem_mib = args.mem_mib;
    c.vcpus = args.vcpus;
    c.hugepages = args.hugepages;
    c.serial = args.serial;
    c.boot_timeout_ms = args.boot_timeout_ms;
    c.block = args
        .block
        .iter()
        .map(|b| match b.strip_suffix(":ro") {
            Some(p) => BlockConfig {
                path: p.into(),
                read_only: true,
            },
            None => BlockConfig {
                path: b.into(),
                read_only: false,
            },
        })
        .collect();
    if let (Some(cid), Some(uds)) = (args.vsock_cid, &args.vsock_uds) {
        c.vsock = Some(VsockConfig {
            guest_cid: cid,
            uds_path: uds.clone(),
        });
    }
    c.console = match args.console.as_str() {
        "stdout" => ConsoleOutput::Stdout,
        "off" => ConsoleOutput::Off,
        p => ConsoleOutput::File(p.into()),
    };
    Ok(c)
}

/// `--timings` without a FILE: the JSON goes to stderr.
const TIMINGS_ON_STDERR: &str = "-";

/// Creates the output file `path` (if any) for `what`; a path that cannot be created is a
/// configuration error.
fn create_output(path: Option<&Path>, what: &str) -> Option<File> {
    let path = path?;
    match File::create(path) {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!(
                "crucible-vmm: cannot create the {what} file {}: {e}",
                path.display()
            );
            std::process::exit(EXIT_CONFIG);
        }
    }
}

/// Writes `value` as one JSON line to `file`. The VM's exit code stays the answer: a lost file
/// is reported, not fatal.
fn write_json(mut file: &File, path: &Path, what: &str, value: &impl serde::Serialize) {
    let written = serde_json::to_writer(&mut file, value)
        .map_err(std::io::Error::from)
        .and_then(|()| file.write_all(b"\n"));
    if let Err(e) = written {
        eprintln!(
            "crucible-vmm: cannot write the {what} file {}: {e}",
            path.display()
        );
    }
}

fn main() {
    let start = Instant::now();
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            std::process::exit(if e.use_stderr() { EXIT_CONFIG } else { 0 });
        }
    };
    if args.host_info {
        let h = HostKind::detect();
        println!("{}: {}", h.name(), h.describe());
        return;
    }
    let cfg = match config_from(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crucible-vmm: {e}");
            std::process::exit(EXIT_CONFIG);
        }
    };
    // Opened now: a bad path is a configuration error before anything runs, and neither the
    // seccomp filters nor a dropped uid can stop the write at the end.
    let metrics_file = create_output(args.metrics.as_deref(), "metrics");
    let timings_file = create_output(
        args.timings
            .as_deref()
            .filter(|p| *p != Path::new(TIMINGS_ON_STDERR)),
        "timings",
    );
    let host = HostKind::detect();
    if !host.has_kvm() {
        eprintln!("crucible-vmm: {}", host.describe());
        std::process::exit(EXIT_KVM);
    }
    let vmm = match Vmm::new(&cfg, start) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("crucible-vmm: {}", error_chain(&e));
            std::process::exit(e.code());
        }
    };
    if !host.boots_stock_kernel() {
        eprintln!("crucible-vmm: note: host is {}", host.describe());
    }
    if let Err(e) = privileges::drop_privileges(args.uid, args.gid) {
        eprintln!("crucible-vmm: cannot drop privileges: {e}");
        std::process::exit(EXIT_CONFIG);
    }
    let filters = if args.no_seccomp {
        None
    } else {
        match ThreadFilters::compile() {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!("crucible-vmm: {}", error_chain(&e));
                std::process::exit(EXIT_INTERNAL);
            }
        }
    };
    let metrics = vmm.metrics();
    let (exit, timings) = vmm.run(filters);
    match (&timings_file, &args.timings) {
        (Some(f), Some(path)) => write_json(f, path, "timings", &timings),
        (None, Some(_)) => eprintln!("{}", serde_json::to_string(&timings).unwrap_or_default()),
        _ => {}
    }
    eprintln!("crucible-vmm: {}", metrics.summary_line());
    if let (Some(f), Some(path)) = (&metrics_file, &args.metrics) {
        write_json(f, path, "metrics", &metrics.to_json());
    }
    match &exit {
        crucible_vmm::VmExit::GuestCrash(m) => eprintln!("crucible-vmm: guest crashed: {m}"),
        crucible_vmm::VmExit::Kvm(m) => eprintln!("crucible-vmm: {m}"),
        _ => {}
    }
    std::process::exit(exit.code());
}
