//! crucible's minimal KVM VMM. One narrow door: [`Vmm::new`] from a [`VmConfig`], then
//! [`Vmm::run`] until the guest ends. The builder functions ([`build_memory`],
//! [`attach_virtio_device`], …) follow Firecracker's `builder.rs`: each device attach also adds
//! its `virtio_mmio.device=4K@…:IRQ` to the command line, so the two can never disagree.

pub mod boot;
pub mod bus;
pub mod config;
pub mod cpu;
pub mod layout;
pub mod metrics;
pub mod mptable;
pub mod overhead;
pub mod privileges;
pub mod seccomp;
#[cfg(feature = "test-guests")]
pub mod test_guest;
pub mod vcpu;

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use contract::boot_marker::Verdict;
use devices::legacy::{AgentMarkers, BootMarker, SerialPort, I8042};
use devices::virtio::block::Block;
use devices::virtio::console::{Console, ConsoleInput};
use devices::virtio::mmio::{MmioTransport, MMIO_WINDOW_SIZE};
use devices::virtio::subscriber::DeviceSubscriber;
use devices::virtio::vsock::connection::Timeouts;
use devices::virtio::vsock::socket_file::SocketFile;
use devices::virtio::vsock::{MuxerConfig, Vsock};
use devices::virtio::{ids, Interrupt, VirtioDevice};
use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{IoEventAddress, Kvm, VcpuFd, VmFd};
use linux_loader::cmdline::Cmdline;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

pub use config::{BlockConfig, ConsoleOutput, VmConfig, VsockConfig};
pub use contract::vm::VmmExitCode;
pub use host_probe::host::HostKind;
pub use metrics::VmMetrics;
pub use vcpu::VmExit;

use crate::boot::BootEntry;
use crate::bus::Bus;
use crate::layout::*;
use crate::seccomp::{ThreadFilters, VmmThread};
use crate::vcpu::Shared;

// The process exit codes, as numbers for `std::process::exit`; a caller maps them back
// through the same `contract::vm::VmmExitCode`.
/// Exit code: the guest reset or powered off, or SIGTERM stopped the VM.
pub const EXIT_OK: i32 = VmmExitCode::Ok.code();
/// Exit code: an unexpected VMM failure.
pub const EXIT_INTERNAL: i32 = VmmExitCode::Internal.code();
/// Exit code: bad flags/configuration, or an unreadable kernel, initramfs or disk image.
pub const EXIT_CONFIG: i32 = VmmExitCode::Config.code();
/// Exit code: KVM is missing, failed, or cannot run this guest on this host.
pub const EXIT_KVM: i32 = VmmExitCode::Kvm.code();
/// Exit code: the guest crashed (triple fault, a failed test-guest check).
pub const EXIT_GUEST_CRASH: i32 = VmmExitCode::GuestCrash.code();

/// At most this many vsock connections at once.
pub const VSOCK_MAX_CONNECTIONS: usize = 1024;
/// On a host that cannot vouch for a stock kernel (kvm_pvm, an unknown KVM module: see
/// [`HostKind::boots_stock_kernel`]), a guest that has neither finished booting nor exited by
/// then is stopped (unless the configuration says otherwise).
pub const PVM_BOOT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a VM could not be built.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The kernel or initramfs could not be loaded.
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    /// A KVM call failed.
    #[error("KVM: {what}")]
    Kvm {
        /// The call.
        what: &'static str,
        /// The cause.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A vCPU could not be configured.
    #[error(transparent)]
    Cpu(#[from] cpu::CpuError),
    /// Guest memory could not be allocated.
    #[error("guest memory: {0}")]
    Memory(String),
    /// A device could not be created.
    #[error("device {what}")]
    Device {
        /// Which.
        what: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The MP table does not fit.
    #[error(transparent)]
    MpTable(#[from] mptable::MpTableError),
}

impl VmmError {
    /// The process exit code for this error.
    pub fn code(&self) -> i32 {
        match self {
            VmmError::Config(_) | VmmError::Boot(_) | VmmError::Device { .. } => EXIT_CONFIG,
            VmmError::Kvm { .. } | VmmError::Cpu(_) | VmmError::Memory(_) => EXIT_KVM,
            VmmError::MpTable(_) => EXIT_INTERNAL,
        }
    }
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Kvm { what, source }
}

fn dev_err<E: std::error::Error + Send + Sync + 'static>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> VmmError {
    let what = what.into();
    move |e| VmmError::Device {
        what,
        source: Box::new(e),
    }
}

/// Boot timings in microseconds since process start.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Timings {
    /// The host's KVM kind.
    pub host: &'static str,
    /// Always 0: the reference point.
    pub process_start_us: u64,
    /// VM, memory, devices and vCPUs are set up.
    pub kvm_ready_us: u64,
    /// The boot vCPU's first KVM_RUN.
    pub kernel_entry_us: u64,
    /// The guest agent wrote its ready marker (absent if it never did).
    pub boot_complete_us: Option<u64>,
    /// The command line asked the agent for its markers (`crucible.boot_marker=1`): a guest
    /// that resets without the agent's stop marker then counts as crashed.
    pub markers_expected: bool,
    /// The VM ended.
    pub exit_us: u64,
    /// How it ended.
    pub exit: String,
    /// The VM exits that reached the VMM's vCPU loop over the VM's life, by reason (the ones
    /// KVM handled in the kernel are not here).
    pub exits: std::collections::BTreeMap<&'static str, u64>,
}

/// A built VM, ready to run.
pub struct Vmm {
    start: Instant,
    host: HostKind,
    #[allow(dead_code)]
    kvm: Kvm,
    vm: VmFd,
    mem: GuestMemoryMmap,
    vcpus: Vec<VcpuFd>,
    pio: Bus,
    mmio: Bus,
    cmdline: Cmdline,
    devices: Vec<Arc<Mutex<dyn VirtioDevice>>>,
    metrics: VmMetrics,
    reset_evt: EventFd,
    markers: Arc<AgentMarkers>,
    markers_expected: bool,
    kvm_ready_us: u64,
    boot_timeout: Option<Duration>,
    next_mmio: u64,
    next_irq: u32,
    /// Socket files the VMM bound: removed when `run` returns or the build fails (the devices
    /// themselves live on in the vCPU threads until the process exits).
    socket_files: Vec<SocketFile>,
    /// The disk control socket and the read-only disks it may give another image.
    disk_control: Option<DiskControl>,
}

/// The disk control socket ([`devices::virtio::block::control`]) and the read-only disks it
/// serves, by serial.
struct DiskControl {
    listener: std::os::unix::net::UnixListener,
    disks: Vec<(String, Arc<Mutex<Block>>)>,
}

impl DiskControl {
    /// Serves the daemon's requests until accepting fails, on a thread of its own: the only
    /// thread allowed to receive a descriptor.
    fn serve(self) {
        let failed = devices::virtio::block::control::serve(&self.listener, |serial, file| {
            let Some((_, disk)) = self.disks.iter().find(|(own, _)| own == serial) else {
                return Err(format!("the VM has no read-only disk {serial:?}"));
            };
            let mut disk = disk.lock().unwrap_or_else(|p| p.into_inner());
            disk.replace_image(file).map_err(|e| error_chain(&e))
        });
        eprintln!("crucible-vmm: the disk control socket stopped: {failed}");
    }
}

impl std::fmt::Debug for Vmm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vmm")
            .field("host", &self.host)
            .field("pio", &self.pio)
            .field("mmio", &self.mmio)
            .finish_non_exhaustive()
    }
}

/// Allocates guest RAM (anonymous, mapped lazily; 2 MiB hugepages if asked; never in a core
/// dump).
pub fn build_memory(mem_bytes: u64, hugepages: bool) -> Result<GuestMemoryMmap, VmmError> {
    let mut regions = Vec::new();
    for (start, len) in ram_ranges(mem_bytes) {
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        if hugepages {
            flags |= libc::MAP_HUGETLB;
        }
        let region = MmapRegionBuilder::new(len as usize)
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(flags)
            .with_hugetlbfs(hugepages)
            .build()
            .map_err(|e| VmmError::Memory(format!("mmap {len} bytes: {e}")))?;
        // Left out of core dumps: a crashed VMM must not write out the guest's memory. It also
        // tells guest RAM apart in smaps (`overhead`).
        // SAFETY: madvise on a mapping the region owns, over exactly its length; DONTDUMP
        // changes no content.
        if unsafe { libc::madvise(region.as_ptr().cast(), region.size(), libc::MADV_DONTDUMP) } != 0
        {
            let e = io::Error::last_os_error();
            return Err(VmmError::Memory(format!("madvise DONTDUMP: {e}")));
        }
        let r = GuestRegionMmap::new(region, GuestAddress(start))
            .ok_or_else(|| VmmError::Memory("region overflows".into()))?;
        regions.push(r);
    }
    GuestMemoryMmap::from_regions(regions).map_err(|e| VmmError::Memory(e.to_string()))
}

fn register_memory(vm: &VmFd, mem: &GuestMemoryMmap) -> Result<(), VmmError> {
    for (slot, r) in mem.iter().enumerate() {
        let region = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: r.start_addr().0,
            memory_size: r.len(),
            userspace_addr: r.as_ptr() as u64,
            flags: 0,
        };
        // SAFETY: the mapping is owned by `mem`, which the Vmm keeps alive (and never unmaps)
        // as long as the VM exists; the slot numbers are distinct.
        unsafe { vm.set_user_memory_region(region) }.map_err(kvm_err("set memory region"))?;
    }
    Ok(())
}

/// Attaches a virtio device at the next MMIO window and IRQ: transport on the bus, irqfd,
/// one ioeventfd per queue, and its `virtio_mmio.device=` on the command line.
pub fn attach_virtio_device(
    vmm: &mut Vmm,
    device: Arc<Mutex<dyn VirtioDevice>>,
    name: &str,
) -> Result<(), VmmError> {
    let base = vmm.next_mmio;
    let irq = vmm.next_irq;
    let irqfd = EventFd::new(libc::EFD_NONBLOCK).map_err(dev_err(name))?;
    vmm.vm
        .register_irqfd(&irqfd, irq)
        .map_err(kvm_err("register irqfd"))?;
    let interrupt = Arc::new(Interrupt::new(irqfd));
    let label = {
        let dev = device.lock().unwrap_or_else(|p| p.into_inner());
        for (i, evt) in dev.queue_events().iter().enumerate() {
            let addr = IoEventAddress::Mmio(base + devices::virtio::mmio::reg::QUEUE_NOTIFY);
            vmm.vm
                .register_ioevent(evt, &addr, i as u32)
                .map_err(kvm_err("register ioeventfd"))?;
        }
        format!("virtio-{}@{base:#x}", ids::name(dev.device_type()))
    };
    let transport = MmioTransport::new(label, device.clone(), vmm.mem.clone(), interrupt);
    vmm.metrics.devices.push(metrics::DeviceMetrics {
        attached_as: name.to_string(),
        irq,
        counters: transport.metrics().clone(),
    });
    vmm.mmio
        .insert(Arc::new(Mutex::new(transport)), base, MMIO_WINDOW_SIZE)
        .map_err(dev_err(name))?;
    vmm.cmdline
        .add_virtio_mmio_device(MMIO_WINDOW_SIZE, GuestAddress(base), irq, None)
        .map_err(|e| VmmError::Boot(boot::BootError::Cmdline(e)))?;
    vmm.devices.push(device);
    vmm.next_mmio += MMIO_WINDOW_SIZE;
    vmm.next_irq += 1;
    Ok(())
}

/// The vsock backend's limits from the configuration.
fn vsock_config(v: &VsockConfig) -> MuxerConfig {
    MuxerConfig {
        max_conns: VSOCK_MAX_CONNECTIONS,
        timeouts: Timeouts {
            handshake: Duration::from_millis(v.handshake_timeout_ms),
            stall: (v.stall_timeout_ms > 0).then(|| Duration::from_millis(v.stall_timeout_ms)),
        },
    }
}

fn console_writer(out: &ConsoleOutput) -> Result<Box<dyn Write + Send>, VmmError> {
    Ok(match out {
        ConsoleOutput::Off => Box::new(io::sink()),
        ConsoleOutput::Stdout => Box::new(io::stdout()),
        ConsoleOutput::File(p) => Box::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(dev_err(format!("console log {}", p.display())))?,
        ),
    })
}

impl Vmm {
    /// Builds the VM: KVM, memory, irqchip, kernel, devices, vCPUs. `start` is the process start
    /// (the zero of the timings).
    pub fn new(cfg: &VmConfig, start: Instant) -> Result<Self, VmmError> {
        cfg.validate().map_err(config::ConfigError::Invalid)?;
        let host = HostKind::detect();
        let kvm = Kvm::new().map_err(kvm_err("open /dev/kvm"))?;
        let vm = kvm.create_vm().map_err(kvm_err("create VM"))?;
        let mem_bytes = u64::from(cfg.mem_mib) << 20;
        let mem = build_memory(mem_bytes, cfg.hugepages)?;
        register_memory(&vm, &mem)?;
        vm.set_tss_address(KVM_TSS_ADDR as usize)
            .map_err(kvm_err("set TSS address"))?;
        vm.create_irq_chip().map_err(kvm_err("create irqchip"))?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        vm.create_pit2(pit).map_err(kvm_err("create PIT"))?;

        let mut cmdline =
            Cmdline::new(CMDLINE_MAX).map_err(|e| VmmError::Boot(boot::BootError::Cmdline(e)))?;
        let console = match (&cfg.console, cfg.serial) {
            (_, true) => "console=ttyS0",
            (ConsoleOutput::Off, false) => "quiet",
            _ => "console=hvc0 quiet",
        };
        cmdline
            .insert_str(format!("{} {console}", boot::DEFAULT_CMDLINE))
            .map_err(|e| VmmError::Boot(boot::BootError::Cmdline(e)))?;

        let reset_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(dev_err("reset eventfd"))?;
        let mut vmm = Vmm {
            start,
            host,
            kvm,
            vm,
            mem,
            vcpus: Vec::new(),
            pio: Bus::default(),
            mmio: Bus::default(),
            cmdline,
            devices: Vec::new(),
            metrics: VmMetrics::default(),
            reset_evt,
            markers: Arc::new(AgentMarkers::default()),
            markers_expected: contract::cmdline::BootConfig::parse(&cfg.cmdline).boot_marker,
            kvm_ready_us: 0,
            boot_timeout: match (cfg.boot_timeout_ms, host) {
                (Some(0), _) => None,
                (Some(ms), _) => Some(Duration::from_millis(ms)),
                (None, h) if !h.boots_stock_kernel() => Some(PVM_BOOT_TIMEOUT),
                (None, _) => None,
            },
            next_mmio: VIRTIO_MMIO_BASE,
            next_irq: VIRTIO_IRQ_BASE,
            socket_files: Vec::new(),
            disk_control: None,
        };
        vmm.attach_legacy_devices(cfg)?;
        if cfg.console != ConsoleOutput::Off {
            // Opened now, before any seccomp filter (no `open` after) and before privileges drop.
            let input = match &cfg.console_input {
                Some(p) => Some(
                    ConsoleInput::open(p)
                        .map_err(dev_err(format!("console input {}", p.display())))?,
                ),
                None => None,
            };
            let c = Console::with_input(console_writer(&cfg.console)?, input)
                .map_err(dev_err("console"))?;
            attach_virtio_device(&mut vmm, Arc::new(Mutex::new(c)), "console")?;
        }
        let mut read_only_disks = Vec::new();
        for b in &cfg.block {
            let what = format!("block {}", b.path.display());
            let d = Block::new(&b.path, b.read_only).map_err(dev_err(what.clone()))?;
            let serial = d.serial();
            let d = Arc::new(Mutex::new(d));
            if b.read_only {
                read_only_disks.push((serial, d.clone()));
            }
            attach_virtio_device(&mut vmm, d, &what)?;
        }
        if let Some(path) = &cfg.disk_control {
            // Bound now: no path calls once the filters are on.
            let what = format!("disk control {}", path.display());
            let (listener, file) =
                devices::virtio::vsock::socket_file::bind(path).map_err(dev_err(what.clone()))?;
            vmm.socket_files.push(file);
            // Its thread blocks in accept (the vsock device's listener is polled instead).
            listener.set_nonblocking(false).map_err(dev_err(what))?;
            vmm.disk_control = Some(DiskControl {
                listener,
                disks: read_only_disks,
            });
        }
        if let Some(v) = &cfg.vsock {
            let d = Vsock::with_config(u64::from(v.guest_cid), &v.uds_path, vsock_config(v))
                .map_err(dev_err("vsock"))?;
            vmm.socket_files.push(d.muxer().socket_file());
            attach_virtio_device(&mut vmm, Arc::new(Mutex::new(d)), "vsock")?;
        }
        if !cfg.cmdline.is_empty() {
            vmm.cmdline
                .insert_str(&cfg.cmdline)
                .map_err(|e| VmmError::Boot(boot::BootError::Cmdline(e)))?;
        }

        let (entry, kernel_end) = boot::load_kernel(&vmm.mem, &cfg.kernel)?;
        let initramfs = match &cfg.initramfs {
            Some(p) => Some(boot::load_initramfs(&vmm.mem, p, kernel_end)?),
            None => None,
        };
        boot::write_cmdline(&vmm.mem, &vmm.cmdline)?;
        match entry {
            BootEntry::Pvh(_) => {
                boot::write_gdt(&vmm.mem, false)?;
                boot::write_pvh_info(&vmm.mem, mem_bytes, initramfs)?;
            }
            BootEntry::Linux64(_) => {
                boot::write_gdt(&vmm.mem, true)?;
                boot::write_page_tables(&vmm.mem)?;
                boot::write_zero_page(&vmm.mem, mem_bytes, &vmm.cmdline, initramfs)?;
            }
        }
        // Always, one vCPU included: without it a kernel without ACPI finds no I/O APIC, runs in
        // virtual wire mode and keeps the PIT behind the 8259 as its timer (every tick a mask,
        // an EOI and a reprogramming, each a port exit), never the local APIC timer.
        mptable::write(&vmm.mem, cfg.vcpus)?;
        let cpuid = cpu::supported_cpuid(&vmm.kvm)?;
        let tsc_deadline = cpu::has_tsc_deadline(&vmm.kvm);
        for id in 0..cfg.vcpus {
            let vcpu = vmm
                .vm
                .create_vcpu(u64::from(id))
                .map_err(kvm_err("create vCPU"))?;
            cpu::configure(
                &vcpu,
                &cpu::vcpu_cpuid(&cpuid, id, cfg.vcpus, tsc_deadline),
                id,
                Some(entry),
            )?;
            vmm.vcpus.push(vcpu);
        }
        vmm.kvm_ready_us = micros(start);
        Ok(vmm)
    }

    fn attach_legacy_devices(&mut self, cfg: &VmConfig) -> Result<(), VmmError> {
        let i8042 = I8042::new(self.reset_evt.try_clone().map_err(dev_err("i8042"))?);
        self.pio
            .insert(Arc::new(Mutex::new(i8042)), u64::from(I8042_PORT), 5)
            .map_err(dev_err("i8042"))?;
        let marker = BootMarker::new(self.start, self.markers.clone());
        self.pio
            .insert(
                Arc::new(Mutex::new(marker)),
                u64::from(contract::boot_marker::PORT),
                1,
            )
            .map_err(dev_err("boot marker"))?;
        if cfg.serial {
            let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(dev_err("serial"))?;
            self.vm
                .register_irqfd(&irq, COM1_IRQ)
                .map_err(kvm_err("register irqfd"))?;
            let out: Box<dyn Write + Send> = Box::new(io::stdout());
            let serial = SerialPort::new(irq, out);
            self.pio
                .insert(Arc::new(Mutex::new(serial)), u64::from(COM1_PORT), 8)
                .map_err(dev_err("serial"))?;
        }
        Ok(())
    }

    /// The kernel command line as built (defaults, devices, the user's words).
    pub fn cmdline(&self) -> String {
        self.cmdline
            .as_cstring()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The host kind detected.
    pub fn host(&self) -> HostKind {
        self.host
    }

    /// The devices' metrics: live counters, to read once [`Vmm::run`] has returned.
    pub fn metrics(&self) -> VmMetrics {
        self.metrics.clone()
    }

    /// Runs the VM until it ends; returns how, with the timings. With `filters`, each thread
    /// installs its own seccomp filter once its setup is done: every vCPU thread before its
    /// first `KVM_RUN`, the main thread after starting them and before its event loop. No
    /// thread runs the guest until every filter is on.
    pub fn run(self, filters: Option<ThreadFilters>) -> (VmExit, Timings) {
        let Vmm {
            start,
            host,
            vcpus,
            pio,
            mmio,
            devices,
            reset_evt,
            markers,
            markers_expected,
            kvm_ready_us,
            boot_timeout,
            socket_files,
            disk_control,
            ..
        } = self;
        let ended = |exit: VmExit, kernel_entry_us: u64, exits| {
            finish(
                Started {
                    start,
                    host,
                    kvm_ready_us,
                    kernel_entry_us,
                },
                &markers,
                markers_expected,
                exit,
                exits,
            )
        };
        // Dropped on every return below: the socket files go with the VM (normal exit, guest
        // reset or poweroff, SIGTERM, errors).
        let _socket_files = socket_files;
        let exit_evt = match EventFd::new(libc::EFD_NONBLOCK) {
            Ok(e) => e,
            Err(e) => return ended(VmExit::Kvm(e.to_string()), 0, Default::default()),
        };
        let shared = Arc::new(Shared {
            exit: Mutex::new(None),
            exit_evt,
            kernel_entry_us: AtomicU64::new(0),
            stop: Default::default(),
            exits: Default::default(),
        });
        let mut em = match EventManager::<Box<dyn MutEventSubscriber + Send>>::new() {
            Ok(em) => em,
            Err(e) => {
                let exit = VmExit::Kvm(format!("event manager: {e:?}"));
                return ended(exit, 0, Default::default());
            }
        };
        for d in devices {
            em.add_subscriber(Box::new(DeviceSubscriber::new(d)));
        }
        let watchdog = boot_timeout.and_then(|d| {
            let mut t = TimerFd::new().ok()?;
            t.reset(d, None).ok()?;
            Some((t, d))
        });
        let signal_evt = match install_signal_handlers() {
            Ok(e) => Some(e),
            Err(e) => {
                eprintln!("crucible-vmm: cannot handle SIGTERM: {e}");
                None
            }
        };
        em.add_subscriber(Box::new(ExitHandler {
            shared: shared.clone(),
            reset_evt,
            signal_evt,
            watchdog,
            host,
            markers: markers.clone(),
        }));
        let filters = filters.map(Arc::new);
        // Every vCPU thread, the disk control's and the main thread meet here once their
        // filters are on.
        let threads = vcpus.len() + 1 + usize::from(disk_control.is_some());
        let all_filtered = Arc::new(Barrier::new(threads));
        let mut all_started = true;
        if let Some(control) = disk_control {
            let (filters, all_filtered, sh) =
                (filters.clone(), all_filtered.clone(), shared.clone());
            let t = std::thread::Builder::new()
                .name("disk-control".into())
                .spawn(move || {
                    if let Some(Err(e)) = filters.map(|f| f.install(VmmThread::DiskControl)) {
                        sh.report(VmExit::Kvm(format!("disk control: {}", error_chain(&e))));
                    }
                    all_filtered.wait();
                    control.serve();
                });
            if let Err(e) = t {
                shared.report(VmExit::Kvm(format!("cannot start the disk control: {e}")));
                all_started = false;
            }
        }
        for (id, vcpu) in vcpus.into_iter().enumerate() {
            let (pio, mmio, sh) = (pio.clone(), mmio.clone(), shared.clone());
            let (filters, all_filtered) = (filters.clone(), all_filtered.clone());
            let t = std::thread::Builder::new()
                .name(format!("vcpu{id}"))
                .spawn(move || {
                    if let Some(Err(e)) = filters.map(|f| f.install(VmmThread::Vcpu)) {
                        sh.report(VmExit::Kvm(format!("vCPU {id}: {}", error_chain(&e))));
                    }
                    all_filtered.wait();
                    vcpu::run(vcpu, id as u8, pio.clone(), mmio.clone(), sh, start, host);
                    // The devices are torn down by the main thread, never here: a vCPU thread
                    // that dropped the last reference to a bus would run the devices' drops
                    // (the vsock socket file's removal: stat and unlink) under the vCPU filter,
                    // which allows no path calls and would kill the process. The process ends
                    // right after the VM does, so these references are never missed.
                    std::mem::forget(pio);
                    std::mem::forget(mmio);
                });
            if let Err(e) = t {
                shared.report(VmExit::Kvm(format!("cannot start vCPU {id}: {e}")));
                all_started = false;
            }
        }
        if let Some(Err(e)) = filters.map(|f| f.install(VmmThread::EventLoop)) {
            shared.report(VmExit::Kvm(error_chain(&e)));
        }
        // With a thread missing nobody else would arrive: the VM ends without running.
        if all_started {
            all_filtered.wait();
        }
        loop {
            if let Some(exit) = shared
                .exit
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
            {
                return ended(
                    exit,
                    shared.kernel_entry_us.load(Ordering::SeqCst),
                    shared.exits.snapshot(),
                );
            }
            if let Err(e) = em.run() {
                shared.report(VmExit::Kvm(format!("event loop: {e:?}")));
            }
        }
    }
}

pub use report::chain as error_chain;

fn micros(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// When the VM started and what it got to, for its [`Timings`].
struct Started {
    start: Instant,
    host: HostKind,
    kvm_ready_us: u64,
    kernel_entry_us: u64,
}

/// How the VM ended, judged by the agent's markers (a reset the agent did not ask for is a
/// crash, not a clean stop), with its timings.
fn finish(
    started: Started,
    markers: &AgentMarkers,
    markers_expected: bool,
    exit: VmExit,
    exits: std::collections::BTreeMap<&'static str, u64>,
) -> (VmExit, Timings) {
    let ready_us = markers.ready_us();
    let exit = match exit {
        VmExit::GuestStop => {
            match Verdict::judge(markers_expected, ready_us.is_some(), markers.stop()) {
                Verdict::Clean => VmExit::GuestStop,
                Verdict::Crashed(why) => VmExit::GuestCrash(why.to_string()),
            }
        }
        other => other,
    };
    let t = Timings {
        host: started.host.name(),
        process_start_us: 0,
        kvm_ready_us: started.kvm_ready_us,
        kernel_entry_us: started.kernel_entry_us,
        boot_complete_us: ready_us,
        markers_expected,
        exit_us: micros(started.start),
        exit: match &exit {
            VmExit::GuestStop => "guest_stop".into(),
            VmExit::Signal => "signal".into(),
            VmExit::GuestCrash(_) => "guest_crash".into(),
            VmExit::Kvm(_) => "kvm_error".into(),
        },
        exits,
    };
    (exit, t)
}

/// Watches the reset line, the vCPUs' exit event, SIGTERM and the PVM boot watchdog.
struct ExitHandler {
    shared: Arc<Shared>,
    reset_evt: EventFd,
    signal_evt: Option<EventFd>,
    watchdog: Option<(TimerFd, Duration)>,
    host: HostKind,
    markers: Arc<AgentMarkers>,
}

const EV_RESET: u32 = 1;
const EV_EXIT: u32 = 2;
const EV_SIGNAL: u32 = 3;
const EV_WATCHDOG: u32 = 4;

impl MutEventSubscriber for ExitHandler {
    fn init(&mut self, ops: &mut EventOps) {
        let _ = ops.add(Events::with_data(&self.reset_evt, EV_RESET, EventSet::IN));
        let _ = ops.add(Events::with_data(
            &self.shared.exit_evt,
            EV_EXIT,
            EventSet::IN,
        ));
        if let Some(s) = &self.signal_evt {
            let _ = ops.add(Events::with_data(s, EV_SIGNAL, EventSet::IN));
        }
        if let Some((w, _)) = &self.watchdog {
            let _ = ops.add(Events::with_data(w, EV_WATCHDOG, EventSet::IN));
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match events.data() {
            EV_RESET => self.shared.report(VmExit::GuestStop),
            EV_EXIT => {
                let _ = self.shared.exit_evt.read();
            }
            EV_SIGNAL => self.shared.report(VmExit::Signal),
            EV_WATCHDOG => {
                let Some((w, d)) = &mut self.watchdog else {
                    return;
                };
                let _ = w.wait();
                if self.markers.ready_us().is_none() {
                    let why = match self.host {
                        h if !h.boots_stock_kernel() => format!("; host is {}", h.describe()),
                        _ => String::new(),
                    };
                    self.shared.report(VmExit::Kvm(format!(
                        "the guest did not finish booting within {} ms (no boot-complete \
                         marker){why}",
                        d.as_millis()
                    )));
                }
            }
            _ => {}
        }
    }
}

static SIGNAL_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_: libc::c_int) {
    let fd = SIGNAL_FD.load(Ordering::SeqCst);
    let one: u64 = 1;
    // SAFETY: write(2) is async-signal-safe; `one` outlives the call and is 8 bytes, as an
    // eventfd write requires. A failure (full counter) still leaves the event pending.
    unsafe { libc::write(fd, std::ptr::from_ref(&one).cast(), 8) };
}

/// SIGTERM and SIGINT stop the VM cleanly through an eventfd.
fn install_signal_handlers() -> io::Result<EventFd> {
    let evt = EventFd::new(libc::EFD_NONBLOCK)?;
    let dup = evt.try_clone()?;
    SIGNAL_FD.store(dup.as_raw_fd(), Ordering::SeqCst);
    std::mem::forget(dup); // Must stay open for the handler for the life of the process.
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        // SAFETY: installs a handler that only calls async-signal-safe functions.
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(evt)
}
