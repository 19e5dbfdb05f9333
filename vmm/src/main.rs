//! `crucible-vmm`: run one microVM until the guest ends, or (`crucible-vmm vhost-user block|vsock`)
//! serve our block or vsock device to QEMU over vhost-user. See `docs/vmm.md`.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use crucible_vmm::{
    config, error_chain, privileges, seccomp::ThreadFilters, BlockConfig, ConsoleOutput, HostKind,
    VmConfig, Vmm, VsockConfig, EXIT_CONFIG, EXIT_INTERNAL, EXIT_KVM, EXIT_OK,
    VSOCK_MAX_CONNECTIONS,
};
use devices::vhost_user::block::{self as vhost_user_block, VhostUserBlockError};
use devices::vhost_user::vsock::{self as vhost_user_vsock, VhostUserVsockError};
use devices::virtio::vsock::connection::Timeouts;
use devices::virtio::vsock::MuxerConfig;

/// Run one crucible microVM.
#[derive(Debug, Parser)]
#[command(
    name = "crucible-vmm",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Args {
    /// Instead of running a VM, serve one device to another VMM.
    #[command(subcommand)]
    mode: Option<Mode>,
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
    /// How long a vsock handshake step may take: a host client's CONNECT line plus the guest's
    /// answer, or the guest's RST after a SHUTDOWN (default 2000).
    #[arg(long, requires = "vsock_uds")]
    vsock_handshake_timeout_ms: Option<u64>,
    /// Reset a vsock connection with work pending and no progress for this long (0 = never;
    /// default 60000).
    #[arg(long, requires = "vsock_uds")]
    vsock_stall_timeout_ms: Option<u64>,
    /// Console: `stdout`, `off`, or a file path.
    #[arg(long, default_value = "stdout")]
    console: String,
    /// Debugging: feed the guest console's input (hvc0) from this FIFO or file
    /// (`/proc/self/fd/N` for an inherited descriptor); reading stops at end of file.
    #[arg(long, value_name = "PATH")]
    console_input: Option<PathBuf>,
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
    /// SIGKILL the VMM (and so the VM) when the process that started it dies.
    #[arg(long)]
    die_with_parent: bool,
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

#[derive(Debug, Subcommand)]
enum Mode {
    /// Serve a device over vhost-user to one frontend (QEMU) until it disconnects; the device
    /// code is the one our own VM runs, only the transport differs.
    #[command(subcommand)]
    VhostUser(VhostUserDevice),
}

#[derive(Debug, Subcommand)]
enum VhostUserDevice {
    /// virtio-block on a raw image (QEMU: `-chardev socket,id=c,path=S
    /// -device vhost-user-blk-device,chardev=c` with shared guest memory). Prints
    /// `crucible-vmm: vhost-user block listening on S` on stdout once S accepts connections.
    Block {
        /// The Unix socket to listen on; a stale socket there is replaced, any other file is
        /// an error.
        #[arg(long, value_name = "S")]
        socket: PathBuf,
        /// The raw disk image; suffix `:ro` for read-only.
        #[arg(long, value_name = "IMG[:ro]")]
        path: String,
        /// Also listen on this Unix socket for the daemon's requests to give the (read-only)
        /// disk another image while the guest runs: the line `replace SERIAL`, then one byte
        /// carrying the image's descriptor; answered `ok SECTORS` or `error WHY` (see
        /// docs/vmm.md, "Disk slots").
        #[arg(long, value_name = "C")]
        control: Option<PathBuf>,
    },
    /// virtio-vsock with the hybrid Unix-socket host side, as `--vsock-uds` gives our own VM
    /// (QEMU: `-chardev socket,id=c,path=S -device vhost-user-vsock-device,chardev=c` with
    /// shared guest memory). Host clients connect to UDS and write `CONNECT <port>\n`; guest
    /// connections to host port P go to `UDS_P`. Prints
    /// `crucible-vmm: vhost-user vsock listening on S` on stdout once S accepts connections.
    Vsock {
        /// The vhost-user Unix socket to listen on; a stale socket there is replaced, any other
        /// file is an error.
        #[arg(long, value_name = "S")]
        socket: PathBuf,
        /// The guest's CID (3 or more, below 2^32 - 1), reported in the device's config space.
        #[arg(long, value_name = "CID",
              value_parser = clap::value_parser!(u32).range(3..i64::from(u32::MAX)))]
        guest_cid: u32,
        /// The hybrid vsock's host socket; removed when the backend ends.
        #[arg(long, value_name = "UDS")]
        uds: PathBuf,
        /// As `crucible-vmm --vsock-handshake-timeout-ms`: how long a host client's CONNECT
        /// line plus the guest's answer, or the guest's RST after a SHUTDOWN, may take.
        #[arg(long, value_name = "MS", default_value_t = contract::vsock::DEFAULT_HANDSHAKE_TIMEOUT_MS)]
        vsock_handshake_timeout_ms: u64,
        /// As `crucible-vmm --vsock-stall-timeout-ms`: reset a connection with work pending and
        /// no progress for this long (0 = never).
        #[arg(long, value_name = "MS", default_value_t = contract::vsock::DEFAULT_STALL_TIMEOUT_MS)]
        vsock_stall_timeout_ms: u64,
    },
}

/// `IMG` or `IMG:ro`, as `--block` and `vhost-user block --path` take it.
fn block_config(arg: &str) -> BlockConfig {
    match arg.strip_suffix(":ro") {
        Some(p) => BlockConfig {
            path: p.into(),
            read_only: true,
        },
        None => BlockConfig {
            path: arg.into(),
            read_only: false,
        },
    }
}

/// Serves `disk` on `socket` (and its control socket on `control`) until the frontend hangs
/// up; returns the exit code.
fn serve_vhost_user_block(socket: &Path, disk: &BlockConfig, control: Option<&Path>) -> i32 {
    let listening = || {
        println!(
            "crucible-vmm: vhost-user block listening on {}",
            socket.display()
        )
    };
    match vhost_user_block::serve(socket, &disk.path, disk.read_only, control, listening) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("crucible-vmm: {}", error_chain(&e));
            match e {
                VhostUserBlockError::Disk(_)
                | VhostUserBlockError::Listen(_)
                | VhostUserBlockError::Control { .. } => EXIT_CONFIG,
                VhostUserBlockError::ExitEvent(_) | VhostUserBlockError::Daemon { .. } => {
                    EXIT_INTERNAL
                }
            }
        }
    }
}

/// Serves the vsock device on `socket` until the frontend hangs up; returns the exit code.
fn serve_vhost_user_vsock(socket: &Path, guest_cid: u32, uds: &Path, timeouts: Timeouts) -> i32 {
    let listening = || {
        println!(
            "crucible-vmm: vhost-user vsock listening on {}",
            socket.display()
        );
        // The caller (a test, a script) waits for this line before starting QEMU.
        let _ = std::io::stdout().flush();
    };
    let config = MuxerConfig {
        max_conns: VSOCK_MAX_CONNECTIONS,
        timeouts,
    };
    match vhost_user_vsock::serve(socket, u64::from(guest_cid), uds, config, listening) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("crucible-vmm: {}", error_chain(&e));
            match e {
                VhostUserVsockError::Muxer(_) | VhostUserVsockError::Listen(_) => EXIT_CONFIG,
                VhostUserVsockError::ExitEvent(_)
                | VhostUserVsockError::WatchBackend(_)
                | VhostUserVsockError::Daemon { .. } => EXIT_INTERNAL,
            }
        }
    }
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
    c.die_with_parent = args.die_with_parent;
    c.block = args.block.iter().map(|b| block_config(b)).collect();
    if let (Some(cid), Some(uds)) = (args.vsock_cid, &args.vsock_uds) {
        let mut v = VsockConfig::new(cid, uds.clone());
        if let Some(ms) = args.vsock_handshake_timeout_ms {
            v.handshake_timeout_ms = ms;
        }
        if let Some(ms) = args.vsock_stall_timeout_ms {
            v.stall_timeout_ms = ms;
        }
        c.vsock = Some(v);
    }
    c.console_input = args.console_input.clone();
    c.console = match args.console.as_str() {
        "stdout" => ConsoleOutput::Stdout,
        "off" => ConsoleOutput::Off,
        p => ConsoleOutput::File(p.into()),
    };
    // Checked here too (not only in `Vmm::new`): a bad configuration is exit 2 on any host,
    // before the KVM check.
    c.validate().map_err(|e| error_chain(&e))?;
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
    let parent = std::os::unix::process::parent_id();
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            std::process::exit(if e.use_stderr() { EXIT_CONFIG } else { 0 });
        }
    };
    if let Some(Mode::VhostUser(VhostUserDevice::Block {
        socket,
        path,
        control,
    })) = &args.mode
    {
        std::process::exit(serve_vhost_user_block(
            socket,
            &block_config(path),
            control.as_deref(),
        ));
    }
    if let Some(Mode::VhostUser(VhostUserDevice::Vsock {
        socket,
        guest_cid,
        uds,
        vsock_handshake_timeout_ms,
        vsock_stall_timeout_ms,
    })) = &args.mode
    {
        let timeouts = Timeouts {
            handshake: Duration::from_millis(*vsock_handshake_timeout_ms),
            stall: (*vsock_stall_timeout_ms > 0)
                .then(|| Duration::from_millis(*vsock_stall_timeout_ms)),
        };
        std::process::exit(serve_vhost_user_vsock(socket, *guest_cid, uds, timeouts));
    }
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
    // After the drop: a change of credentials clears the parent-death signal.
    if cfg.die_with_parent {
        if let Err(e) = privileges::die_with_parent(parent) {
            eprintln!("crucible-vmm: {e}");
            std::process::exit(EXIT_INTERNAL);
        }
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
