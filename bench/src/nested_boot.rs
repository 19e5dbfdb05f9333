//! The nested benchmark's inside half (`crucible-bench nested-boot`, run inside the nested
//! tier's L1): boots our kernel and initramfs under `crucible-vmm` and under QEMU's `microvm`
//! machine with `-accel kvm`, alternating, and prints one `@@bench` JSON line per boot.
//!
//! Both guests are the same: our kernel, our initramfs, the agent with its markers on, our
//! vsock device (QEMU reaches it over vhost-user, as the daemon's `qemu-tcg` hypervisor does,
//! there under TCG). Each boot is timed from the hypervisor's spawn to the agent's hello on
//! `<uds>_1025`; at the hello, KVM's own per-VM counters (`/sys/kernel/debug/kvm/<pid>-<fd>/`)
//! give the exits so far, by KVM's reasons, for either hypervisor alike. Then the agent is
//! asked to shut down and the VM's end is awaited. crucible-vmm also reports its phases
//! (`kvm_ready`, `kernel_entry`, the agent's ready marker) and the exits its vCPU loop handled
//! over the whole VM's life (`--timings`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use contract::vsock::{host_port_path, DEFAULT_AGENT_PORT, DEFAULT_READY_PORT};
use serde::{Deserialize, Serialize};

/// The prefix of a sample line on L1's output.
pub(crate) const SAMPLE_PREFIX: &str = "@@bench ";

/// How long a boot may take to the hello, and a shutdown to the VM's end.
const LIMIT: Duration = Duration::from_secs(90);

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Boots per hypervisor.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// The crucible-vmm binary (also serves the vsock device to QEMU).
    #[arg(long)]
    vmm: PathBuf,
    /// qemu-system-x86_64.
    #[arg(long)]
    qemu: PathBuf,
    /// The guest kernel (vmlinux).
    #[arg(long)]
    kernel: PathBuf,
    /// The guest initramfs.
    #[arg(long)]
    initramfs: PathBuf,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 256)]
    mem_mib: u32,
}

/// Which hypervisor booted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Booter {
    /// crucible-vmm.
    CrucibleVmm,
    /// QEMU microvm, -accel kvm.
    QemuMicrovm,
}

/// One boot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Sample {
    /// Which hypervisor.
    pub booter: Booter,
    /// Spawn → the agent's hello, in milliseconds.
    pub hello_ms: f64,
    /// KVM's per-VM counters at the hello (`exits`, `io_exits`, `mmio_exits`, …).
    pub kvm_stats: BTreeMap<String, u64>,
    /// crucible-vmm's `--timings` (phases and the vCPU loop's exits), for ours.
    pub timings: Option<serde_json::Value>,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let work = tempfile::tempdir().context("a scratch directory")?;
    for run in 0..args.runs {
        for booter in [Booter::CrucibleVmm, Booter::QemuMicrovm] {
            let dir = work.path().join(format!("{run}-{booter:?}"));
            std::fs::create_dir_all(&dir)?;
            let sample = match booter {
                Booter::CrucibleVmm => boot_ours(&args, &dir),
                Booter::QemuMicrovm => boot_qemu(&args, &dir),
            }
            .with_context(|| {
                let console = std::fs::read_to_string(dir.join("console.log")).unwrap_or_default();
                format!("boot {run} under {booter:?}; guest console:\n{console}")
            })?;
            println!("{SAMPLE_PREFIX}{}", serde_json::to_string(&sample)?);
            std::io::stdout().flush()?;
        }
    }
    Ok(())
}

/// Our agent's markers on: the same words for both guests.
fn agent_cmdline() -> Result<String> {
    contract::cmdline::BootConfig {
        boot_marker: true,
        ..Default::default()
    }
    .to_cmdline()
    .context("the agent's command line")
}

fn boot_ours(args: &Args, dir: &Path) -> Result<Sample> {
    let uds = dir.join("v.sock");
    let ready = UnixListener::bind(host_port_path(&uds, DEFAULT_READY_PORT))?;
    let timings = dir.join("timings.json");
    let started = Instant::now();
    let mut vmm = Command::new(&args.vmm)
        .arg("--kernel")
        .arg(&args.kernel)
        .arg("--initramfs")
        .arg(&args.initramfs)
        .args(["--mem-mib", &args.mem_mib.to_string()])
        .args(["--vsock-cid", "3", "--vsock-uds"])
        .arg(&uds)
        .arg("--console")
        .arg(dir.join("console.log"))
        .args(["--cmdline", &agent_cmdline()?])
        .arg("--timings")
        .arg(&timings)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("vmm.log"))?)
        .spawn()
        .context("starting crucible-vmm")?;
    let (hello_ms, kvm_stats) = await_hello(&ready, &mut vmm, started)?;
    shut_down(&uds, &mut vmm)?;
    let timings: serde_json::Value = serde_json::from_slice(&std::fs::read(&timings)?)?;
    Ok(Sample {
        booter: Booter::CrucibleVmm,
        hello_ms,
        kvm_stats,
        timings: Some(timings),
    })
}

fn boot_qemu(args: &Args, dir: &Path) -> Result<Sample> {
    let uds = dir.join("v.sock");
    let ready = UnixListener::bind(host_port_path(&uds, DEFAULT_READY_PORT))?;
    // Our vsock device first, as the daemon starts it: QEMU connects to it at start.
    let socket = dir.join("vhost-vsock.sock");
    let mut device = Command::new(&args.vmm)
        .args(["vhost-user", "vsock", "--socket"])
        .arg(&socket)
        .args(["--guest-cid", "3", "--uds"])
        .arg(&uds)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("device.log"))?)
        .spawn()
        .context("starting the vsock device")?;
    let mut line = String::new();
    let stdout = device.stdout.take().context("the device's stdout")?;
    BufReader::new(stdout).read_line(&mut line)?;
    if !line.contains("listening on") {
        let _ = device.kill();
        bail!("the vsock device did not come up: {line:?}");
    }
    let cmdline = agent_cmdline()?;
    let console = dir.join("console.log");
    let guest = engine::backend::qemu::QemuGuest {
        kernel: &args.kernel,
        initramfs: &args.initramfs,
        cmdline: &cmdline,
        memory_mib: u64::from(args.mem_mib),
        vcpus: 1,
        vsock_socket: &socket,
        root_disk_socket: None,
        disk_sockets: &[],
        console: &console,
        kvm: true,
    };
    let started = Instant::now();
    let mut qemu = Command::new(&args.qemu)
        .args(engine::backend::qemu::qemu_args(&guest))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("qemu.log"))?)
        .spawn()
        .context("starting QEMU")?;
    let hello = await_hello(&ready, &mut qemu, started);
    let ended = hello.as_ref().ok().map(|_| shut_down(&uds, &mut qemu));
    let _ = qemu.kill();
    let _ = qemu.wait();
    let _ = device.kill();
    let _ = device.wait();
    let (hello_ms, kvm_stats) = hello?;
    if let Some(ended) = ended {
        ended?;
    }
    Ok(Sample {
        booter: Booter::QemuMicrovm,
        hello_ms,
        kvm_stats,
        timings: None,
    })
}

/// Waits for the agent's hello; returns the time since `started` and KVM's counters for the
/// hypervisor's VM, read at once.
fn await_hello(
    ready: &UnixListener,
    hypervisor: &mut Child,
    started: Instant,
) -> Result<(f64, BTreeMap<String, u64>)> {
    ready.set_nonblocking(true)?;
    let deadline = Instant::now() + LIMIT;
    let mut conn = loop {
        match ready.accept() {
            Ok((conn, _)) => break conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(status) = hypervisor.try_wait()? {
            bail!("the hypervisor exited ({status}) before the agent's hello");
        }
        if Instant::now() > deadline {
            let _ = hypervisor.kill();
            bail!("no hello within {LIMIT:?}");
        }
        // Fine-grained, and the hypervisor's CPU is not ours: a 200 µs look costs nothing.
        std::thread::sleep(Duration::from_micros(200));
    };
    let hello_ms = started.elapsed().as_secs_f64() * 1000.0;
    let stats = kvm_stats(hypervisor.id())?;
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(LIMIT))?;
    let _: wire::agent::Hello = wire::read_message(&mut conn).context("the hello")?;
    Ok((hello_ms, stats))
}

/// KVM's counters for the one VM process `pid` made (`/sys/kernel/debug/kvm/<pid>-<fd>/`).
fn kvm_stats(pid: u32) -> Result<BTreeMap<String, u64>> {
    let root = Path::new("/sys/kernel/debug/kvm");
    let dir = std::fs::read_dir(root)
        .with_context(|| format!("reading {} (is debugfs mounted?)", root.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{pid}-")))
        })
        .with_context(|| format!("no KVM debugfs directory for process {pid}"))?;
    let mut stats = BTreeMap::new();
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "exits" || name.ends_with("_exits") || name == "insn_emulation" {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            if let Ok(n) = text.trim().parse() {
                stats.insert(name, n);
            }
        }
    }
    Ok(stats)
}

/// Asks the agent to shut down and waits (bounded) for the hypervisor to exit.
fn shut_down(uds: &Path, hypervisor: &mut Child) -> Result<()> {
    let mut c = UnixStream::connect(uds).context("the vsock socket")?;
    c.set_read_timeout(Some(LIMIT))?;
    c.write_all(format!("CONNECT {DEFAULT_AGENT_PORT}\n").as_bytes())?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\n") {
        std::io::Read::read_exact(&mut c, &mut byte)?;
        line.push(byte[0]);
    }
    wire::write_message(&mut c, &wire::agent::AgentRequest::Shutdown)?;
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(status) = hypervisor.try_wait()? {
            if !status.success() {
                bail!("the hypervisor exited with {status} after the shutdown");
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = hypervisor.kill();
            bail!("the VM did not end within {LIMIT:?} of the shutdown");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
