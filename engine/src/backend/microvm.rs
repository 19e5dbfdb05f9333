//! The microVM backend: one `crucible-vmm` process per sandbox, booting the image's kernel and
//! initramfs with a virtio-vsock device whose host side is a Unix socket (Firecracker's hybrid
//! design). The agent's hello arrives on `<uds>_<ready port>`, a socket the daemon listens on
//! before the VM starts (no polling); each request opens the vsock socket and says
//! `CONNECT <agent port>\n`, answered `OK <host port>\n` once the guest accepts.
//!
//! Two hypervisors run the guest: `crucible-vmm` under hardware KVM, or QEMU's `microvm`
//! machine under TCG with our vsock device served over vhost-user ([`super::qemu`]). The host
//! side (the hybrid socket, the hello, CONNECT) is the same for both, and so are storage and
//! egress: the writable layer and caches are ext4 images on virtio-blk disks the guest finds
//! by serial ([`super::microvm_disks`]), and each connection to the guest's egress proxy
//! arrives as a vsock connection on `<uds>_1026`, handed to the sandbox's egress sink.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use api_types::{BackendKind, Hypervisor};
use contract::cmdline::BootConfig;
use contract::disk::ROOT_SERIAL;
use contract::vm::{BlockConfig, ConsoleOutput, VmConfig, VsockConfig};
use contract::vsock::{host_port_path, DEFAULT_AGENT_PORT, DEFAULT_READY_PORT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use wire::agent::Hello;

use super::microvm_disks::DiskPlan;
use super::microvm_slots::{self, SlotTable};
use super::qemu::{self, QemuGuest, QemuTools};
use super::supervised::{first_exit, spawn_and_await_hello, Diagnostics, SandboxProcess};
use super::{
    AdoptSpec, Backend, BackendError, BoxFuture, Capabilities, ContainerHost, ContainerSecurity,
    EgressSink, EgressStream, Held, Instance, InstanceSpec, Restorable,
};
use crate::restore::{InstanceRecord, RecordedProcess, RestoreError};

/// The guest's vsock CID (each VM has its own vsock device, so every guest can use the same).
const GUEST_CID: u32 = 3;

/// Creates microVM sandboxes.
#[derive(Debug)]
pub(crate) struct MicrovmBackend {
    vmm_binary: PathBuf,
    kernel: PathBuf,
    initramfs: PathBuf,
    /// The image's ext4 root, when it has one (`build-image --rootfs`): under QEMU it is the
    /// guest's `/dev/vda` and its root filesystem.
    root_disk: PathBuf,
    state_dir: PathBuf,
    ready_timeout: Duration,
    host_reason: Option<String>,
    hypervisor: Hypervisor,
    /// QEMU and setpriv for `qemu-tcg`, or why they are missing.
    qemu_tools: Result<QemuTools, String>,
    /// Whether its VMs outlive the daemon, to be taken back by the next (live restore).
    live_restore: bool,
}

impl MicrovmBackend {
    /// A backend booting `image_dir`'s `vmlinux` + `initramfs.cpio` with `vmm_binary`;
    /// `host_reason` says why this host's KVM cannot boot them, if it cannot (it does not
    /// matter to `qemu-tcg`, which needs no KVM).
    pub(crate) fn new(
        vmm_binary: PathBuf,
        image_dir: &Path,
        state_dir: PathBuf,
        ready_timeout: Duration,
        host_reason: Option<String>,
        hypervisor: Hypervisor,
    ) -> Self {
        let qemu_tools = match hypervisor {
            Hypervisor::QemuTcg => QemuTools::find(false),
            Hypervisor::CrucibleVmm => Err("not used by crucible-vmm".into()),
        };
        MicrovmBackend {
            vmm_binary,
            kernel: image_dir.join("vmlinux"),
            initramfs: image_dir.join("initramfs.cpio"),
            root_disk: image_dir.join("rootfs.ext4"),
            state_dir,
            ready_timeout,
            host_reason,
            hypervisor,
            qemu_tools,
            live_restore: false,
        }
    }

    /// With VMs that outlive the daemon (not tied to it, not killed when it drops them) and
    /// records to take them back by (`crucible serve --live-restore`).
    pub(crate) fn with_live_restore(mut self, live_restore: bool) -> Self {
        self.live_restore = live_restore;
        if self.hypervisor == Hypervisor::QemuTcg {
            self.qemu_tools = QemuTools::find(live_restore);
        }
        self
    }

    /// Why this host cannot run microVM sandboxes, if it cannot.
    fn why_unavailable(&self) -> Option<String> {
        match (&self.hypervisor, &self.qemu_tools) {
            (Hypervisor::CrucibleVmm, _) => {
                if let Some(reason) = &self.host_reason {
                    return Some(reason.clone());
                }
            }
            (Hypervisor::QemuTcg, Err(reason)) => return Some(format!("qemu-tcg: {reason}")),
            (Hypervisor::QemuTcg, Ok(_)) => {}
        }
        for (what, path) in [
            ("the VMM", &self.vmm_binary),
            ("the kernel", &self.kernel),
            ("the initramfs", &self.initramfs),
        ] {
            if !path.is_file() {
                return Some(format!("{what} is missing at {}", path.display()));
            }
        }
        None
    }

    async fn create_instance(&self, spec: InstanceSpec) -> Result<MicrovmInstance, BackendError> {
        if let Some(reason) = self.why_unavailable() {
            return Err(BackendError::Unavailable {
                backend: BackendKind::Microvm,
                reason,
            });
        }
        if spec.container_disks.len() != spec.containers.len() {
            return Err(BackendError::setup(
                "attach the containers' images",
                invalid(&format!(
                    "{} containers but {} image disks",
                    spec.containers.len(),
                    spec.container_disks.len()
                )),
            ));
        }
        let containers: Vec<(String, PathBuf)> = spec
            .containers
            .iter()
            .map(|c| c.name.clone())
            .zip(spec.container_disks.iter().cloned())
            .collect();
        let mut plan = DiskPlan::new(
            spec.disk.as_deref(),
            &spec.mounts,
            &containers,
            spec.container_slots,
        )
        .map_err(|e| BackendError::setup("attach the sandbox's storage", invalid(&e)))?;
        for (planned, container) in plan.containers.iter_mut().zip(&spec.containers) {
            planned.share_pids = container.share_pids;
        }
        let dir = self.state_dir.join("sandboxes").join(&spec.id);
        // Private: its sockets (vsock, the disks' control) are the daemon's alone.
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|e| BackendError::setup(format!("create {}", dir.display()), e))?;
        }
        let launched = self.launch(&spec, &plan, &dir).await;
        let ((vm, devices, diagnostics, hello), egress) = match launched {
            Ok(launched) => launched,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let uds = dir.join("vsock.sock");
        let egress_task = egress
            .map(|(listener, sink)| tokio::spawn(receive_egress(listener, sink, spec.id.clone())));
        let record = self.live_restore.then(|| {
            let vm = RecordedProcess::of("the VM", vm.id(), None)?;
            let devices = devices
                .iter()
                .map(|(child, what, log)| RecordedProcess::of(what, child.id(), Some(log)))
                .collect::<Option<Vec<_>>>()?;
            Some(InstanceRecord {
                supervisor_pid: vm.pid,
                supervisor_start_ticks: vm.start_ticks,
                id_slot: 0,
                hello: hello.clone(),
                hypervisor: Some(self.hypervisor),
                devices,
                container_slots: plan.slots.clone().collect(),
            })
        });
        let vm = SandboxProcess::watch(vm, "the VM".into(), diagnostics);
        let devices: Vec<SandboxProcess> = devices
            .into_iter()
            .map(|(child, what, log)| {
                let diagnostics = Diagnostics::new().with(format!("{what}'s log"), log);
                SandboxProcess::watch(child, what.into(), diagnostics)
            })
            .collect();
        let exited = devices
            .iter()
            .fold(vm.exited(), |first, d| first_exit(first, d.exited()));
        Ok(MicrovmInstance {
            hello,
            uds,
            dir,
            hypervisor: self.hypervisor,
            vm,
            devices,
            exited,
            egress_task,
            shut_down_first: plan.outlives_the_sandbox(),
            record: record.flatten(),
            slots: std::sync::Mutex::new(SlotTable::new(plan.slots.clone())),
        })
    }

    /// Takes back sandbox `id` as `record` describes it (live restore): its VM process and
    /// each device process the recorded ones (pid and start time), its agent answering through
    /// the sandbox's vsock socket with the recorded hello. A refusal kills what was verified.
    async fn adopt_instance(
        &self,
        id: &str,
        record: &InstanceRecord,
        spec: AdoptSpec,
    ) -> Result<MicrovmInstance, RestoreError> {
        let mismatch = RestoreError::Mismatch;
        let Some(hypervisor) = record.hypervisor else {
            return Err(mismatch("its record names no hypervisor".into()));
        };
        let dir = self.state_dir.join("sandboxes").join(id);
        let uds = dir.join("vsock.sock");
        // The logs it was started with, quoted when it dies, as for a VM this daemon started.
        let diagnostics = match hypervisor {
            Hypervisor::CrucibleVmm => {
                Diagnostics::new().with("the VMM's stderr", dir.join("vmm.log"))
            }
            Hypervisor::QemuTcg => Diagnostics::new().with("QEMU's log", dir.join("qemu.log")),
        }
        .with("the guest console", dir.join("console.log"));
        let pid = record.supervisor_pid;
        let vm = SandboxProcess::adopt(
            pid,
            record.supervisor_start_ticks,
            "the VM".into(),
            diagnostics,
        )
        .map_err(|e| mismatch(format!("its VM process (pid {pid}): {e}")))?;
        let mut devices = Vec::new();
        let mut refused = None;
        for device in &record.devices {
            let diagnostics = match device.log.as_str() {
                "" => Diagnostics::new(),
                log => Diagnostics::new().with(format!("{}'s log", device.what), dir.join(log)),
            };
            match SandboxProcess::adopt(
                device.pid,
                device.start_ticks,
                device.what.clone(),
                diagnostics,
            ) {
                Ok(process) => devices.push(process),
                Err(e) => {
                    refused = Some(format!("{} (pid {}): {e}", device.what, device.pid));
                    break;
                }
            }
        }
        let mut refused = match refused {
            Some(why) => Some(why),
            None => match super::ping_agent(vsock_connect(&uds, DEFAULT_AGENT_PORT)).await {
                Ok(hello) if hello == record.hello => None,
                Ok(hello) => Some(format!(
                    "its agent is not the recorded one: it says {hello:?}, the record {:?}",
                    record.hello
                )),
                Err(e) => Some(format!("its agent ({}): {e}", uds.display())),
            },
        };
        // Its guest's new egress uplink: a listener where the old daemon's was, for the
        // connections the VM's vsock device makes to the host's egress port.
        let mut egress = None;
        if let (None, Some(sink)) = (refused.is_some().then_some(()), spec.egress) {
            let path = host_port_path(&uds, contract::egress::VSOCK_PORT);
            let _ = std::fs::remove_file(&path);
            match UnixListener::bind(&path) {
                Ok(listener) => egress = Some((listener, sink)),
                Err(e) => {
                    refused = Some(format!("its egress uplink: bind {}: {e}", path.display()))
                }
            }
        }
        if let Some(why) = refused {
            vm.kill_refused(&format!("the VM of refused sandbox {id}"))
                .await;
            for device in &devices {
                device
                    .kill_refused(&format!("a device of refused sandbox {id}"))
                    .await;
            }
            return Err(mismatch(why));
        }
        let egress_task = egress
            .map(|(listener, sink)| tokio::spawn(receive_egress(listener, sink, id.to_string())));
        let exited = devices
            .iter()
            .fold(vm.exited(), |first, d| first_exit(first, d.exited()));
        Ok(MicrovmInstance {
            hello: record.hello.clone(),
            uds,
            dir,
            hypervisor,
            vm,
            devices,
            exited,
            egress_task,
            shut_down_first: spec.shut_down_first,
            record: Some(record.clone()),
            // A sandbox that had containers added is not taken back, so its slots are all
            // still empty, and its devices still serve their control sockets.
            slots: std::sync::Mutex::new(SlotTable::of(&record.container_slots)),
        })
    }

    /// Binds the host's sockets (the hello's, egress's), links the disks and boots the guest
    /// on the configured hypervisor, up to its hello.
    async fn launch(
        &self,
        spec: &InstanceSpec,
        plan: &DiskPlan,
        dir: &Path,
    ) -> Result<(Launched, Option<EgressListener>), BackendError> {
        let uds = dir.join("vsock.sock");
        let ready_path = host_port_path(&uds, DEFAULT_READY_PORT);
        let ready = UnixListener::bind(&ready_path)
            .map_err(|e| BackendError::setup(format!("bind {}", ready_path.display()), e))?;
        // Listening before the guest boots: its proxy may be used as soon as commands run.
        let egress = match &spec.egress {
            Some(sink) => {
                let path = host_port_path(&uds, contract::egress::VSOCK_PORT);
                let listener = UnixListener::bind(&path)
                    .map_err(|e| BackendError::setup(format!("bind {}", path.display()), e))?;
                Some((listener, sink.clone()))
            }
            None => None,
        };
        let links = plan
            .link_in(dir)
            .map_err(|e| BackendError::setup(format!("link the disks in {}", dir.display()), e))?;
        let console = dir.join("console.log");
        let disks = Disks {
            plan,
            links: &links,
        };
        let launched = match (&self.hypervisor, &self.qemu_tools) {
            (Hypervisor::QemuTcg, Ok(tools)) => {
                self.launch_qemu(tools, spec, disks, dir, &uds, &console, &ready)
                    .await?
            }
            _ => {
                self.launch_vmm(spec, disks, dir, &uds, &console, &ready)
                    .await?
            }
        };
        Ok((launched, egress))
    }

    /// The root disk a sandbox boots into: its imported image's snapshot, else the built
    /// image's `rootfs.ext4` when there is one (else the initramfs stays the root).
    fn root_disk<'a>(&'a self, spec: &'a InstanceSpec) -> Option<&'a Path> {
        match spec.root.as_ref().and_then(|root| root.disk.as_deref()) {
            Some(disk) => Some(disk),
            None => self.root_disk.is_file().then_some(self.root_disk.as_path()),
        }
    }

    /// `crucible-vmm --config vm.json`: our VMM, its own devices.
    async fn launch_vmm(
        &self,
        spec: &InstanceSpec,
        disks: Disks<'_>,
        dir: &Path,
        uds: &Path,
        console: &Path,
        ready: &UnixListener,
    ) -> Result<Launched, BackendError> {
        let root_link = link_root_disk(self.root_disk(spec), dir)?;
        let config = vm_config(
            &self.kernel,
            &self.initramfs,
            spec,
            disks,
            root_link.as_deref(),
            uds,
            console,
        )
        .map_err(|e| BackendError::setup("build the VM config", e))?;
        let mut config = config;
        if !disks.plan.slots.is_empty() {
            config.disk_control = Some(super::microvm_slots::control_socket(
                dir,
                Hypervisor::CrucibleVmm,
                "",
            ));
        }
        // Under live restore the VM outlives the daemon, to be taken back by the next one.
        config.die_with_parent = !self.live_restore;
        let config_path = dir.join("vm.json");
        let json = serde_json::to_vec_pretty(&config)
            .map_err(|e| BackendError::setup("serialize the VM config", io::Error::other(e)))?;
        std::fs::write(&config_path, json)
            .map_err(|e| BackendError::setup(format!("write {}", config_path.display()), e))?;

        // The VMM says why it failed on stderr ("guest crashed: …", a KVM error): kept in the
        // sandbox's directory and quoted in the reason when it fails.
        let vmm_log = dir.join("vmm.log");
        let stderr = std::fs::File::create(&vmm_log)
            .map_err(|e| BackendError::setup(format!("create {}", vmm_log.display()), e))?;
        let mut command = Command::new(&self.vmm_binary);
        command
            .arg("--config")
            .arg(&config_path)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let what = self.vmm_binary.display().to_string();
        let diagnostics = Diagnostics::new()
            .with("the VMM's stderr", vmm_log)
            .with("the guest console", console);
        command.kill_on_drop(!self.live_restore);
        if self.live_restore {
            super::supervised::outlive_the_daemon(&mut command);
        }
        let (vm, hello) =
            spawn_and_await_hello(&mut command, ready, self.ready_timeout, &what, &diagnostics)
                .await?;
        Ok((vm, Vec::new(), diagnostics, hello))
    }

    /// QEMU TCG with our vsock device over vhost-user (and our block device for the image's
    /// ext4 root, when it has one, and for each of the sandbox's disks): the devices first
    /// (QEMU connects to them at start), then QEMU, awaited until the agent's hello as under
    /// our VMM.
    #[allow(clippy::too_many_arguments)]
    async fn launch_qemu(
        &self,
        tools: &QemuTools,
        spec: &InstanceSpec,
        disks: Disks<'_>,
        dir: &Path,
        uds: &Path,
        console: &Path,
        ready: &UnixListener,
    ) -> Result<Launched, BackendError> {
        let mut boot = boot_config(spec, disks.plan);
        let root_link = link_root_disk(self.root_disk(spec), dir)?;
        if root_link.is_some() {
            boot.root = Some(ROOT_SERIAL.into());
        }
        let cmdline = boot
            .to_cmdline()
            .map_err(|e| BackendError::setup("build the kernel command line", invalid(&e)))?;
        let vsock_socket = dir.join("vhost-vsock.sock");
        let vsock = qemu::start_vsock_device(
            tools,
            &self.vmm_binary,
            &vsock_socket,
            GUEST_CID,
            uds,
            &dir.join("vsock-device.log"),
        )
        .await?;
        // A failure below kills the devices started so far as the guard drops (under live
        // restore they are not killed when dropped).
        let mut devices = DeviceGuard(vec![(
            vsock,
            "the vsock device",
            dir.join("vsock-device.log"),
        )]);
        let root_socket = dir.join("vhost-root.sock");
        if let Some(root_link) = &root_link {
            let log = dir.join("root-device.log");
            let disk = qemu::start_block_device(
                tools,
                &self.vmm_binary,
                &root_socket,
                root_link,
                true,
                None,
                &log,
            )
            .await?;
            devices.0.push((disk, "the root disk device", log));
        }
        let mut disk_sockets = Vec::new();
        for (index, (disk, link)) in disks.plan.disks.iter().zip(disks.links).enumerate() {
            let socket = dir.join(format!("vhost-disk{index}.sock"));
            let log = dir.join(format!("disk{index}-device.log"));
            let control = disk.spare.then(|| {
                super::microvm_slots::control_socket(dir, Hypervisor::QemuTcg, &disk.serial)
            });
            let device = qemu::start_block_device(
                tools,
                &self.vmm_binary,
                &socket,
                link,
                disk.read_only,
                control.as_deref(),
                &log,
            )
            .await?;
            devices.0.push((device, "a disk device", log));
            disk_sockets.push(socket);
        }
        let guest = QemuGuest {
            kernel: &self.kernel,
            initramfs: &self.initramfs,
            cmdline: &cmdline,
            memory_mib: spec.memory_mib,
            vcpus: spec.vcpus,
            vsock_socket: &vsock_socket,
            root_disk_socket: root_link.as_ref().map(|_| root_socket.as_path()),
            disk_sockets: &disk_sockets,
            console,
            kvm: false,
        };
        let qemu_log = dir.join("qemu.log");
        let mut command = qemu::qemu_command(tools, &guest, &qemu_log)
            .map_err(|e| BackendError::setup(format!("create {}", qemu_log.display()), e))?;
        let what = format!("{} (qemu-tcg)", tools.qemu.display());
        let diagnostics = Diagnostics::new()
            .with("QEMU's log", qemu_log)
            .with("the guest console", console);
        command.kill_on_drop(!self.live_restore);
        let (vm, hello) =
            spawn_and_await_hello(&mut command, ready, self.ready_timeout, &what, &diagnostics)
                .await?;
        Ok((vm, std::mem::take(&mut devices.0), diagnostics, hello))
    }
}

/// Device processes being started: killed if dropped before they are handed on.
struct DeviceGuard(Vec<(Child, &'static str, PathBuf)>);

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        for (child, _, _) in &mut self.0 {
            let _ = child.start_kill();
        }
    }
}

/// A started guest: the VM process, the device processes beside it (each with what it is and
/// its log, for its exit reason), the VM's logs, and the agent's hello.
type Launched = (
    Child,
    Vec<(Child, &'static str, PathBuf)>,
    Diagnostics,
    Hello,
);

/// Where a sandbox's egress connections arrive, and who takes them.
type EgressListener = (UnixListener, EgressSink);

/// A sandbox's disks: the plan, and the link (named by serial) each block device opens.
#[derive(Clone, Copy)]
struct Disks<'a> {
    plan: &'a DiskPlan,
    links: &'a [PathBuf],
}

/// Gives each connection the guest's egress proxy opens to the host (a vsock connection to
/// [`contract::egress::VSOCK_PORT`], arriving on `listener`) to `sink`, until the sandbox is
/// destroyed. Nothing is read here: the sink serves the proxy protocol, and enforces the
/// sandbox's allowlist, on each.
async fn receive_egress(listener: UnixListener, sink: EgressSink, id: String) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => sink(EgressStream::Unix(stream)),
            Err(e) => {
                // Out of descriptors, say: back off and go on, as the guest's proxy does.
                tracing::warn!(sandbox = %id, "egress: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn invalid(e: &dyn std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

/// Links the root disk into the sandbox's directory under its serial, which the device takes
/// from the link's name: found by serial, like the sandbox's own disks, whatever order the
/// devices are attached in.
fn link_root_disk(disk: Option<&Path>, dir: &Path) -> Result<Option<PathBuf>, BackendError> {
    let Some(disk) = disk else {
        return Ok(None);
    };
    let link = dir.join(ROOT_SERIAL);
    std::os::unix::fs::symlink(disk, &link)
        .map_err(|e| BackendError::setup(format!("link {}", link.display()), e))?;
    Ok(Some(link))
}

/// What the guest agent reads from `/proc/cmdline`: the boot marker, the sandbox id as
/// hostname (as in a namespace sandbox), the egress port when the sandbox has egress, and its
/// disks; the agent's vsock ports are the defaults on both sides, so the command line does not
/// repeat them.
fn boot_config(spec: &InstanceSpec, disks: &DiskPlan) -> BootConfig {
    let mut boot = BootConfig {
        boot_marker: true,
        hostname: spec.hostname.clone(),
        egress_port: spec
            .egress
            .is_some()
            .then_some(contract::egress::VSOCK_PORT),
        shared: vm_shared(&spec.shared),
        ..BootConfig::default()
    };
    disks.describe_to(&mut boot);
    boot
}

/// The shared directories' mounts as the guest is told them (`crucible.shared=`).
pub(crate) fn vm_shared(shared: &[::namespace::SharedMount]) -> Vec<contract::cmdline::VmShared> {
    shared
        .iter()
        .map(|mount| contract::cmdline::VmShared {
            owner: mount.owner.clone(),
            name: mount.dir.clone(),
            target: mount.target.to_string_lossy().into_owned(),
            read_only: mount.read_only,
        })
        .collect()
}

/// The VM for one sandbox: the image's kernel and initramfs, the agent on the default vsock
/// ports (the guest's defaults too, so the command line does not repeat them), the boot marker,
/// the sandbox id as hostname (as in a namespace sandbox), its disks in plan order (each
/// through its link, so its serial is the link's name), the console into `console`.
/// Validated here with the VMM's own rules, so a bad size is refused before a VMM is started.
fn vm_config(
    kernel: &Path,
    initramfs: &Path,
    spec: &InstanceSpec,
    disks: Disks<'_>,
    root_link: Option<&Path>,
    uds: &Path,
    console: &Path,
) -> io::Result<VmConfig> {
    let mut config = VmConfig::new(kernel.to_owned());
    config.initramfs = Some(initramfs.to_owned());
    let mut boot = boot_config(spec, disks.plan);
    if root_link.is_some() {
        boot.root = Some(ROOT_SERIAL.into());
    }
    config.cmdline = boot.to_cmdline().map_err(|e| invalid(&e))?;
    config.block = root_link
        .map(|link| BlockConfig {
            path: link.to_path_buf(),
            read_only: true,
        })
        .into_iter()
        .chain(
            disks
                .plan
                .disks
                .iter()
                .zip(disks.links)
                .map(|(disk, link)| BlockConfig {
                    path: link.clone(),
                    read_only: disk.read_only,
                }),
        )
        .collect();
    config.mem_mib = u32::try_from(spec.memory_mib).unwrap_or(u32::MAX);
    config.vcpus = u8::try_from(spec.vcpus).unwrap_or(u8::MAX);
    config.vsock = Some(VsockConfig::new(GUEST_CID, uds.to_owned()));
    config.console = ConsoleOutput::File(console.to_owned());
    // The VM dies with the daemon (as a namespace sandbox's supervisor does): a daemon killed
    // outright leaves no VM running unowned, and the next one cleans up the rest.
    config.die_with_parent = true;
    config.validate().map_err(|e| invalid(&e))?;
    Ok(config)
}

/// Opens a connection to guest `port` through the VMM's hybrid vsock socket.
pub(crate) async fn vsock_connect(uds: &Path, port: u32) -> io::Result<UnixStream> {
    let mut stream = UnixStream::connect(uds).await?;
    stream
        .write_all(format!("CONNECT {port}\n").as_bytes())
        .await?;
    // The answer is one short line; read it byte by byte so nothing after it is consumed.
    let mut line = Vec::with_capacity(16);
    loop {
        let byte = stream.read_u8().await.map_err(|e| {
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("vsock CONNECT {port} refused (nothing listening in the guest?): {e}"),
            )
        })?;
        if byte == b'\n' {
            break;
        }
        line.push(byte);
        if line.len() > 32 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the VMM's vsock answer is not an OK line",
            ));
        }
    }
    if !line.starts_with(b"OK ") {
        return Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!(
                "vsock CONNECT {port} answered {:?}",
                String::from_utf8_lossy(&line)
            ),
        ));
    }
    Ok(stream)
}

/// A running microVM sandbox.
#[derive(Debug)]
pub(crate) struct MicrovmInstance {
    hello: Hello,
    uds: PathBuf,
    dir: PathBuf,
    hypervisor: Hypervisor,
    /// `crucible-vmm`, or QEMU.
    vm: SandboxProcess,
    /// Under QEMU: the vhost-user device processes (vsock, the root disk if any, the
    /// sandbox's disks).
    devices: Vec<SandboxProcess>,
    /// Why the sandbox ended: the first of its processes to exit.
    exited: watch::Receiver<Option<String>>,
    /// Takes the guest's egress connections, when it has egress.
    egress_task: Option<tokio::task::JoinHandle<()>>,
    /// Whether the guest must flush its disks before it is killed: a cache outlives the
    /// sandbox, and what the guest's page cache still holds would be lost.
    shut_down_first: bool,
    /// What a restarted daemon needs to take it back (under live restore).
    record: Option<InstanceRecord>,
    /// Its empty disks for containers added while it runs.
    slots: std::sync::Mutex<SlotTable>,
}

/// How long a guest may take to sync its disks and end when asked, before it is killed anyway
/// (a hostile guest may never answer). Generous: under TCG a sync of a busy cache is slow.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

impl MicrovmInstance {
    fn slot_table(&self) -> std::sync::MutexGuard<'_, SlotTable> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives the empty disk of `slot` the image `disk` and has the guest build container
    /// `root.name` from it, serving on the slot's port.
    async fn fill_slot(
        &self,
        slot: usize,
        disk: &Path,
        root: &namespace::ContainerRoot,
        shared: &[wire::agent::SharedDir],
    ) -> Result<(), String> {
        let serial = contract::disk::container_serial(slot);
        let control = microvm_slots::control_socket(&self.dir, self.hypervisor, &serial);
        let image = disk.to_path_buf();
        // A connect, a descriptor and a line: off the runtime's threads.
        let sectors = tokio::task::spawn_blocking(move || {
            microvm_slots::give_image(&control, &serial, &image)
        })
        .await
        .map_err(|e| format!("giving the disk its image stopped: {e}"))??;
        let stream = vsock_connect(&self.uds, DEFAULT_AGENT_PORT)
            .await
            .map_err(|e| format!("connecting to the guest's agent: {e}"))?;
        microvm_slots::ask_to_add(stream, slot, root, sectors, shared).await
    }

    /// Frees the slot container `index` used, once the guest says nothing holds its disk;
    /// one the guest keeps stays taken (and says why in the daemon's log).
    async fn release_slot(&self, index: usize) {
        let Some(slot) = self.slot_table().slot_of(index) else {
            return; // A container named at boot: its disk is its own for the VM's life.
        };
        let released = match vsock_connect(&self.uds, DEFAULT_AGENT_PORT).await {
            Ok(stream) => microvm_slots::ask_to_release(stream, slot).await,
            Err(e) => Err(format!("connecting to the guest's agent: {e}")),
        };
        match released {
            Ok(()) => self.slot_table().free(slot),
            Err(why) => tracing::warn!(
                dir = %self.dir.display(),
                slot,
                "a container's disk stays taken: {why}"
            ),
        }
    }

    /// Asks the agent to sync and end the VM (`shutdown`), and waits, within
    /// [`SHUTDOWN_GRACE`], for the VM to be gone. A guest that is already dead, or does not
    /// answer, is left to the kill that follows.
    async fn shut_down_guest(&self) {
        let mut exited = self.vm.exited();
        if exited.borrow().is_some() {
            return;
        }
        let asked = async {
            let mut stream = vsock_connect(&self.uds, DEFAULT_AGENT_PORT).await?;
            wire::write_message_async(&mut stream, &wire::agent::AgentRequest::Shutdown)
                .await
                .map_err(io::Error::other)?;
            // The answer, then EOF; hanging up tells the agent its answer arrived, and it
            // resets the VM.
            let answer: Result<wire::agent::AgentReply, _> =
                wire::read_message_async(&mut stream).await;
            drop(stream);
            if !matches!(answer, Ok(wire::agent::AgentReply::ShuttingDown)) {
                tracing::warn!(
                    dir = %self.dir.display(),
                    "the agent answered the shutdown request with {answer:?}; waiting for the VM \
                     to end anyway"
                );
            }
            let _ = exited.wait_for(Option::is_some).await;
            Ok::<_, io::Error>(())
        };
        match tokio::time::timeout(SHUTDOWN_GRACE, asked).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(dir = %self.dir.display(), "shutting the guest down: {e}"),
            Err(_) => tracing::warn!(
                dir = %self.dir.display(),
                "the guest did not end within {SHUTDOWN_GRACE:?} of a shutdown request; killing it"
            ),
        }
    }
}

/// How long a stats request waits for the guest's agent (under emulation it answers in tens of
/// milliseconds).
const STATS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Instance for MicrovmInstance {
    fn hello(&self) -> &Hello {
        &self.hello
    }

    fn connect(&self) -> BoxFuture<'_, io::Result<UnixStream>> {
        Box::pin(vsock_connect(&self.uds, DEFAULT_AGENT_PORT))
    }

    fn exited(&self) -> watch::Receiver<Option<String>> {
        self.exited.clone()
    }

    fn hypervisor(&self) -> Option<Hypervisor> {
        Some(self.hypervisor)
    }

    /// The guest's own counters (the VM is the sandbox), asked of its agent.
    fn stats(&self) -> BoxFuture<'_, Option<wire::SandboxStats>> {
        Box::pin(async move {
            let asked = async {
                let mut stream = vsock_connect(&self.uds, DEFAULT_AGENT_PORT).await?;
                wire::write_message_async(&mut stream, &wire::agent::AgentRequest::Stats)
                    .await
                    .map_err(io::Error::other)?;
                wire::read_message_async::<_, wire::agent::AgentReply>(&mut stream)
                    .await
                    .map_err(io::Error::other)
            };
            match tokio::time::timeout(STATS_TIMEOUT, asked).await {
                Ok(Ok(wire::agent::AgentReply::Stats(stats))) => Some(stats),
                Ok(Ok(other)) => {
                    tracing::warn!(dir = %self.dir.display(), "stats: the agent answered {other:?}");
                    None
                }
                Ok(Err(e)) => {
                    tracing::warn!(dir = %self.dir.display(), "stats: {e}");
                    None
                }
                Err(_) => None,
            }
        })
    }

    fn destroy(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(task) = &self.egress_task {
                task.abort();
            }
            if self.shut_down_first {
                self.shut_down_guest().await;
            }
            self.vm.kill_and_wait().await;
            for device in &self.devices {
                device.kill_and_wait().await;
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        })
    }

    fn containers(&self) -> Option<&dyn ContainerHost> {
        Some(self)
    }

    fn restorable(&self) -> Option<&dyn Restorable> {
        Some(self)
    }
}

impl ContainerHost for MicrovmInstance {
    /// A container named at boot serves on the port of its index, an added one on its slot's.
    fn connect_container(&self, index: usize) -> BoxFuture<'_, io::Result<UnixStream>> {
        let slot = self.slot_table().slot_of(index).unwrap_or(index);
        Box::pin(vsock_connect(
            &self.uds,
            contract::vsock::container_agent_port(slot),
        ))
    }

    /// Fills a free empty disk with `disk` (the image's ext4 snapshot) and has the guest build
    /// the container from it. A failure gives the disk back once the guest lets go of it.
    fn add_container<'a>(
        &'a self,
        index: usize,
        root: &'a namespace::ContainerRoot,
        disk: Option<&'a Path>,
        shared: &'a [wire::agent::SharedDir],
        host_paths: &'a [namespace::HostPathMount],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if !host_paths.is_empty() {
                // The engine refuses them first; the guest has no host directory to mount.
                return Err("a microVM's containers mount no host path".into());
            }
            let disk = disk.ok_or("the container's image has no disk snapshot")?;
            let slot = self
                .slot_table()
                .take(index)
                .ok_or("the microVM has no empty disk left")?;
            let added = self.fill_slot(slot, disk, root, shared).await;
            if added.is_err() {
                self.release_slot(index).await;
            }
            added
        })
    }

    fn container_room(&self) -> Option<(usize, usize)> {
        Some(self.slot_table().room())
    }

    fn container_removed(&self, index: usize) -> BoxFuture<'_, ()> {
        Box::pin(self.release_slot(index))
    }
}

impl Restorable for MicrovmInstance {
    fn record(&self) -> Option<InstanceRecord> {
        self.record.clone()
    }

    /// A disk is attached for as long as the VM process (or, under QEMU, its block device
    /// process) holds its image open; where the guest mounted it is the guest's own business.
    fn check_holds(&self, what: Held<'_>) -> Result<(), String> {
        let record = self
            .record
            .as_ref()
            .ok_or("it has no record of its processes")?;
        let pids: Vec<i32> = std::iter::once(record.supervisor_pid)
            .chain(record.devices.iter().map(|d| d.pid))
            .collect();
        match what {
            Held::Mounted { image, .. }
            | Held::WritableLayer { image }
            | Held::RootImage { image } => {
                super::open_files::held_open_by(&pids, image).map(|_| ())
            }
            Held::Bound { .. } => Err("a microVM is given no host directories".into()),
        }
    }
}

/// What the backend gives a sandbox. A microVM has its own kernel and only the disks it booted with.
pub(crate) const CAPABILITIES: Capabilities = Capabilities {
    containers: true,
    container_pid1: false,
    container_security: ContainerSecurity::SeccompWhenAdded,
    host_paths: false,
    storage: true,
    imported_images: true,
    egress: true,
    sysctls: false,
    host_network_namespace: false,
    pod_network_through_proxy: true,
    disks_fixed_at_boot: true,
    mounts_in_image_tree: false,
    restore: true,
};

impl Backend for MicrovmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Microvm
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn unavailable_reason(&self) -> Option<String> {
        self.why_unavailable()
    }

    fn adopt<'a>(
        &'a self,
        id: &'a str,
        record: &'a InstanceRecord,
        spec: AdoptSpec,
    ) -> BoxFuture<'a, Result<Box<dyn Instance>, RestoreError>> {
        Box::pin(async move {
            let instance = self.adopt_instance(id, record, spec).await?;
            Ok(Box::new(instance) as Box<dyn Instance>)
        })
    }

    fn create(&self, spec: InstanceSpec) -> BoxFuture<'_, Result<Box<dyn Instance>, BackendError>> {
        Box::pin(async move {
            let instance = self.create_instance(spec).await?;
            Ok(Box::new(instance) as Box<dyn Instance>)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{MountSource, MountSpec};
    use std::sync::Arc;

    /// A stand-in for the VMM's host side: answers CONNECT lines as the hybrid vsock does.
    async fn fake_vmm(listener: UnixListener, answer: &'static [u8]) {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut line = Vec::new();
        while !line.ends_with(b"\n") {
            line.push(stream.read_u8().await.expect("request byte"));
        }
        assert_eq!(line, b"CONNECT 1024\n");
        stream.write_all(answer).await.expect("answer");
        stream.write_all(b"agent bytes").await.expect("data");
    }

    #[tokio::test]
    async fn connect_speaks_the_hybrid_vsock_handshake() {
        let dir = tempfile::tempdir().expect("tempdir");
        let uds = dir.path().join("v.sock");
        let server = tokio::spawn(fake_vmm(
            UnixListener::bind(&uds).expect("bind"),
            b"OK 52001\n",
        ));
        let mut stream = vsock_connect(&uds, 1024).await.expect("connected");
        let mut data = [0u8; 11];
        stream
            .read_exact(&mut data)
            .await
            .expect("data after the OK line");
        assert_eq!(&data, b"agent bytes");
        server.await.expect("server");
    }

    #[tokio::test]
    async fn a_refused_connect_is_an_error_naming_the_port() {
        let dir = tempfile::tempdir().expect("tempdir");
        let uds = dir.path().join("v.sock");
        let listener = UnixListener::bind(&uds).expect("bind");
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            drop(stream);
        });
        let err = vsock_connect(&uds, 1024).await.expect_err("refused");
        assert!(err.to_string().contains("CONNECT 1024"), "{err}");
        server.await.expect("server");
    }

    fn spec(memory_mib: u64) -> InstanceSpec {
        InstanceSpec {
            id: "sb-0123456789abcdef".into(),
            hostname: "sb-0123456789abcdef".into(),
            memory_mib,
            vcpus: 2,
            env: Default::default(),
            disk: None,
            mounts: Vec::new(),
            egress: None,
            root: None,
            containers: Vec::new(),
            container_disks: Vec::new(),
            shared: Vec::new(),
            container_slots: 0,
            network_namespace: None,
            sysctls: Vec::new(),
        }
    }

    #[test]
    fn vm_config_speaks_the_guest_contract() {
        let (uds, console) = (
            Path::new("/run/sb/vsock.sock"),
            Path::new("/run/sb/console.log"),
        );
        let config = vm_config(
            Path::new("/img/vmlinux"),
            Path::new("/img/initramfs.cpio"),
            &spec(512),
            NO_DISKS,
            None,
            uds,
            console,
        )
        .expect("valid");
        assert_eq!((config.mem_mib, config.vcpus), (512, 2));
        // What guest-init will read from /proc/cmdline.
        let boot = BootConfig::parse(&config.cmdline);
        assert!(boot.boot_marker);
        assert_eq!(boot.hostname, "sb-0123456789abcdef");
        assert_eq!(
            (boot.port, boot.ready_port),
            (DEFAULT_AGENT_PORT, DEFAULT_READY_PORT)
        );
        assert_eq!(config.console, ConsoleOutput::File(console.to_owned()));
    }

    const NO_DISKS: Disks<'static> = Disks {
        plan: &DiskPlan {
            disks: Vec::new(),
            scratch: None,
            mounts: Vec::new(),
            containers: Vec::new(),
            slots: 0..0,
        },
        links: &[],
    };

    #[test]
    fn vm_config_attaches_each_disk_through_its_link_and_tells_the_guest_which_is_which() {
        let mut spec = spec(512);
        spec.disk = Some("/data/scratch/sb.ext4".into());
        spec.mounts = vec![MountSpec {
            source: MountSource::Ext4Image("/data/caches/u/cargo.ext4".into()),
            target: "/root/.cargo/registry".into(),
            read_only: false,
        }];
        spec.egress = Some(Arc::new(|_| {}));
        let plan = DiskPlan::new(spec.disk.as_deref(), &spec.mounts, &[], 0).expect("plan");
        let links = [
            PathBuf::from("/run/sb/crucible-scratch"),
            PathBuf::from("/run/sb/crucible-mount-0"),
        ];
        let disks = Disks {
            plan: &plan,
            links: &links,
        };
        let config = vm_config(
            Path::new("/k"),
            Path::new("/i"),
            &spec,
            disks,
            Some(Path::new("/run/sb/crucible-root")),
            Path::new("/run/sb/vsock.sock"),
            Path::new("/run/sb/console.log"),
        )
        .expect("valid");
        assert_eq!(
            config.block,
            [
                BlockConfig {
                    path: PathBuf::from("/run/sb/crucible-root"),
                    read_only: true
                },
                BlockConfig {
                    path: links[0].clone(),
                    read_only: false
                },
                BlockConfig {
                    path: links[1].clone(),
                    read_only: false
                },
            ]
        );
        let boot = BootConfig::parse(&config.cmdline);
        assert_eq!(boot.egress_port, Some(contract::egress::VSOCK_PORT));
        assert_eq!(boot.scratch.as_deref(), Some("crucible-scratch"));
        assert_eq!(
            boot.root.as_deref(),
            Some(ROOT_SERIAL),
            "an image's root disk, by serial"
        );
        assert_eq!(boot.mounts.len(), 1);
        assert_eq!(boot.mounts[0].serial, "crucible-mount-0");
        assert_eq!(boot.mounts[0].target, "/root/.cargo/registry");
        assert!(plan.outlives_the_sandbox());
        // Without egress the guest starts no proxy (and nothing would listen for it).
        spec.egress = None;
        assert_eq!(boot_config(&spec, &plan).egress_port, None);
    }

    #[tokio::test]
    async fn egress_connections_from_the_guest_reach_the_sink_until_destroyed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("vsock.sock_1026");
        let listener = UnixListener::bind(&path).expect("bind");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let sink: EgressSink = Arc::new(move |stream| {
            let _ = tx.send(stream);
        });
        let task = tokio::spawn(receive_egress(listener, sink, "sb-x".into()));
        for i in 0..3u8 {
            // As the vsock device connects for each guest connection to port 1026.
            let mut guest = UnixStream::connect(&path).await.expect("connect");
            guest.write_all(&[i]).await.expect("write");
            match rx.recv().await.expect("a stream") {
                EgressStream::Unix(mut s) => assert_eq!(s.read_u8().await.expect("read"), i),
                other => panic!("{other:?}"),
            }
        }
        task.abort();
        let _ = task.await;
        assert!(
            UnixStream::connect(&path).await.is_err(),
            "nothing listens once the sandbox is gone"
        );
    }

    #[test]
    fn vm_config_refuses_what_the_vmm_would_refuse() {
        let err = vm_config(
            Path::new("/k"),
            Path::new("/i"),
            &spec(1 << 20),
            NO_DISKS,
            None,
            Path::new("/v"),
            Path::new("/c"),
        )
        .expect_err("too much memory");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("mem_mib"), "{err}");
    }

    #[test]
    fn unavailable_reason_names_what_is_missing() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A backend over an empty image directory, without a VMM.
        let backend = |host_reason: Option<&str>, hypervisor| {
            MicrovmBackend::new(
                dir.path().join("crucible-vmm"),
                dir.path(),
                dir.path().join("state"),
                Duration::from_secs(1),
                host_reason.map(String::from),
                hypervisor,
            )
        };
        let reason = backend(None, Hypervisor::CrucibleVmm)
            .why_unavailable()
            .expect("missing pieces");
        assert!(reason.contains("VMM"), "{reason}");
        let pvm = backend(Some("kvm_pvm"), Hypervisor::CrucibleVmm);
        assert_eq!(pvm.unavailable_reason().as_deref(), Some("kvm_pvm"));
        // QEMU TCG needs no KVM: the host's KVM reason does not apply, the missing files do.
        let reason = backend(Some("kvm_pvm"), Hypervisor::QemuTcg)
            .unavailable_reason()
            .expect("missing pieces");
        assert!(!reason.contains("kvm_pvm"), "{reason}");
        assert!(
            reason.contains("VMM") || reason.contains("qemu-tcg"),
            "{reason}"
        );
    }
}
