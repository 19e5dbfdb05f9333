//! The `qemu-tcg` hypervisor of the microVM backend: QEMU's `microvm` machine under TCG, for
//! hosts whose KVM cannot boot the image. The guest's devices are ours: `crucible-vmm
//! vhost-user vsock` serves the vsock device (the same queue code as under our own VMM) and
//! QEMU only runs the CPU, memory and the virtio-mmio transport. The host side is the same
//! hybrid Unix socket as under `crucible-vmm`, so the rest of the backend does not care which
//! hypervisor runs the guest.
//!
//! Both processes are started through `setpriv --pdeathsig KILL`: if the daemon dies without
//! deleting its sandboxes, its VMs die with it rather than running on, unowned. Under live
//! restore they are started as they are, each in a session of its own, to outlive the daemon.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::BackendError;

/// How long the vsock device process may take to listen.
const DEVICE_START_TIMEOUT: Duration = Duration::from_secs(5);

/// The programs the `qemu-tcg` hypervisor runs.
#[derive(Debug, Clone)]
pub(crate) struct QemuTools {
    /// `qemu-system-x86_64`.
    pub(crate) qemu: PathBuf,
    /// util-linux's `setpriv`, which ties each process's life to the daemon's; `None` when
    /// they outlive the daemon (live restore), which needs no `setpriv`.
    setpriv: Option<PathBuf>,
}

impl QemuTools {
    /// The tools found on `PATH`, or why not; with `outlive_daemon` (live restore) the
    /// processes are not tied to the daemon (no `setpriv`, a session of their own) nor killed
    /// when it drops them.
    pub(crate) fn find(outlive_daemon: bool) -> Result<QemuTools, String> {
        let qemu = find_on_path(contract::qemu::BINARY).ok_or_else(|| {
            format!(
                "{} is not installed (Debian: apt-get install {})",
                contract::qemu::BINARY,
                contract::qemu::PACKAGE
            )
        })?;
        let setpriv = match outlive_daemon {
            true => None,
            false => Some(find_on_path("setpriv").ok_or_else(|| {
                "setpriv is not installed (Debian: apt-get install util-linux)".to_string()
            })?),
        };
        Ok(QemuTools { qemu, setpriv })
    }

    /// Whether its processes outlive the daemon.
    fn outlive_daemon(&self) -> bool {
        self.setpriv.is_none()
    }

    /// A command running `program` that the kernel kills when the daemon's thread that
    /// started it dies, unless the processes outlive the daemon.
    fn command(&self, program: &Path) -> Command {
        let mut command = match &self.setpriv {
            None => {
                let mut free = Command::new(program);
                super::supervised::outlive_the_daemon(&mut free);
                free
            }
            Some(setpriv) => {
                let mut tied = Command::new(setpriv);
                tied.args(["--pdeathsig", "KILL", "--"]).arg(program);
                tied
            }
        };
        command
            .env_clear()
            .stdin(Stdio::null())
            .kill_on_drop(!self.outlive_daemon());
        command
    }
}

/// The first executable file called `name` in a `PATH` directory.
pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|path| {
            std::fs::metadata(path).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            })
        })
}

/// One guest's files and sizes.
#[derive(Debug, Clone)]
pub struct QemuGuest<'a> {
    /// The kernel (`vmlinux`).
    pub kernel: &'a Path,
    /// The initramfs with the agent as `/init`.
    pub initramfs: &'a Path,
    /// Our part of the kernel command line (`contract::cmdline`).
    pub cmdline: &'a str,
    /// Guest RAM.
    pub memory_mib: u64,
    /// vCPUs (TCG runs one host thread per vCPU).
    pub vcpus: u32,
    /// The vhost-user socket of the vsock device.
    pub vsock_socket: &'a Path,
    /// The vhost-user socket of the root disk's block device, when the image has one.
    pub root_disk_socket: Option<&'a Path>,
    /// The vhost-user sockets of the other disks (the writable layer, caches), in order. The
    /// guest tells them apart by serial, not by the `vdX` names QEMU's order gives them.
    pub disk_sockets: &'a [PathBuf],
    /// Where the serial console goes.
    pub console: &'a Path,
    /// Run on KVM (`-accel kvm -cpu host`) instead of TCG: the benchmark's QEMU peer beside
    /// `crucible-vmm` under the same KVM. The daemon's `qemu-tcg` hypervisor never does.
    pub kvm: bool,
}

/// QEMU's arguments for `guest`: the `microvm` machine, TCG, RAM as a shared memfd (the device
/// process maps it), the vsock device over vhost-user, the console into a file; no network, no
/// firmware, no other devices (`-nodefaults`), and QEMU exits when the guest reboots or powers
/// off (`-no-reboot`, `reboot=t`).
pub fn qemu_args(guest: &QemuGuest<'_>) -> Vec<OsString> {
    let mut args: Vec<OsString> = contract::qemu::shared_memory_machine_args(guest.memory_mib)
        .into_iter()
        .map(OsString::from)
        .collect();
    let mut chardev = OsString::from("socket,id=vsock,path=");
    chardev.push(guest.vsock_socket);
    let mut serial = OsString::from("file:");
    serial.push(guest.console);
    let (accel, cpu) = if guest.kvm {
        ("kvm", "host")
    } else {
        ("tcg", "max")
    };
    for arg in [
        "-accel",
        accel,
        "-cpu",
        cpu,
        "-m",
        &guest.memory_mib.to_string(),
        "-smp",
        &guest.vcpus.max(1).to_string(),
        "-nodefaults",
        "-no-user-config",
        "-no-reboot",
        "-display",
        "none",
        contract::qemu::MODERN_VIRTIO_MMIO[0],
        contract::qemu::MODERN_VIRTIO_MMIO[1],
        "-chardev",
    ] {
        args.push(arg.into());
    }
    args.push(chardev);
    args.extend(["-device", "vhost-user-vsock-device,chardev=vsock"].map(OsString::from));
    if let Some(root) = guest.root_disk_socket {
        // The only virtio-blk device: the guest's /dev/vda.
        let mut chardev = OsString::from("socket,id=root,path=");
        chardev.push(root);
        args.push("-chardev".into());
        args.push(chardev);
        args.extend(["-device", "vhost-user-blk,chardev=root"].map(OsString::from));
    }
    for (index, socket) in guest.disk_sockets.iter().enumerate() {
        let mut chardev = OsString::from(format!("socket,id=disk{index},path="));
        chardev.push(socket);
        args.push("-chardev".into());
        args.push(chardev);
        args.push("-device".into());
        args.push(format!("vhost-user-blk,chardev=disk{index}").into());
    }
    args.push("-serial".into());
    args.push(serial);
    args.push("-kernel".into());
    args.push(guest.kernel.into());
    args.push("-initrd".into());
    args.push(guest.initramfs.into());
    args.push("-append".into());
    args.push(format!("{} {}", contract::qemu::BASE_APPEND, guest.cmdline).into());
    args
}

/// Starts `crucible-vmm vhost-user vsock` for one guest and waits until its socket listens.
/// Its stderr goes to `log`.
pub(crate) async fn start_vsock_device(
    tools: &QemuTools,
    vmm_binary: &Path,
    socket: &Path,
    guest_cid: u32,
    uds: &Path,
    log: &Path,
) -> Result<Child, BackendError> {
    start_device(
        tools,
        vmm_binary,
        &vsock_device_args(socket, guest_cid, uds),
        log,
        "vsock",
    )
    .await
}

/// `crucible-vmm`'s arguments for serving the vsock device on `socket`.
pub(super) fn vsock_device_args(socket: &Path, guest_cid: u32, uds: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = ["vhost-user", "vsock", "--socket"]
        .map(OsString::from)
        .into();
    args.push(socket.into());
    args.extend([
        "--guest-cid".into(),
        guest_cid.to_string().into(),
        "--uds".into(),
    ]);
    args.push(uds.into());
    args
}

/// Starts `crucible-vmm vhost-user block` serving `image` (read-only with `read_only`: the
/// image's root, one file shared by every sandbox, under the guest's overlay) and waits until
/// its socket listens. The guest sees the file name of `image` as the disk's serial. With
/// `control`, the device takes another image through that socket while the guest runs.
pub(crate) async fn start_block_device(
    tools: &QemuTools,
    vmm_binary: &Path,
    socket: &Path,
    image: &Path,
    read_only: bool,
    control: Option<&Path>,
    log: &Path,
) -> Result<Child, BackendError> {
    start_device(
        tools,
        vmm_binary,
        &block_device_args(socket, image, read_only, control),
        log,
        "block",
    )
    .await
}

/// `crucible-vmm`'s arguments for serving `image` on `socket` (and its control socket on
/// `control`).
pub(super) fn block_device_args(
    socket: &Path,
    image: &Path,
    read_only: bool,
    control: Option<&Path>,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = ["vhost-user", "block", "--socket"]
        .map(OsString::from)
        .into();
    args.push(socket.into());
    args.push("--path".into());
    let mut path = OsString::from(image);
    if read_only {
        path.push(":ro");
    }
    args.push(path);
    if let Some(control) = control {
        args.push("--control".into());
        args.push(control.into());
    }
    args
}

/// Starts one of `crucible-vmm`'s vhost-user devices and waits for its `listening on` line.
async fn start_device(
    tools: &QemuTools,
    vmm_binary: &Path,
    args: &[OsString],
    log: &Path,
    device: &str,
) -> Result<Child, BackendError> {
    let log_file = std::fs::File::create(log)
        .map_err(|e| BackendError::setup(format!("create {}", log.display()), e))?;
    let mut command = tools.command(vmm_binary);
    command.args(args).stdout(Stdio::piped()).stderr(log_file);
    let mut child = command
        .spawn()
        .map_err(|e| BackendError::setup(format!("start {}", vmm_binary.display()), e))?;
    let Some(stdout) = child.stdout.take() else {
        return Err(BackendError::setup(
            format!("read the {device} device's ready line"),
            io::Error::other("its stdout was not captured"),
        ));
    };
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(DEVICE_START_TIMEOUT, async {
        while let Some(line) = lines.next_line().await? {
            if line.contains("listening on") {
                return Ok(true);
            }
        }
        Ok::<_, io::Error>(false)
    })
    .await;
    let why = match ready {
        Ok(Ok(true)) => return Ok(child),
        Ok(Ok(false)) => "it exited before listening".to_string(),
        Ok(Err(e)) => format!("reading its output failed: {e}"),
        Err(_) => format!("it did not listen within {DEVICE_START_TIMEOUT:?}"),
    };
    let _ = child.kill().await;
    Err(BackendError::NotReady(format!(
        "the vhost-user {device} device ({} vhost-user {device}): {why}{}",
        vmm_binary.display(),
        super::supervised::Diagnostics::new()
            .with("its log", log)
            .tails()
    )))
}

/// The QEMU command for `guest` (to hand to `spawn_and_await_hello`).
pub(crate) fn qemu_command(
    tools: &QemuTools,
    guest: &QemuGuest<'_>,
    log: &Path,
) -> io::Result<Command> {
    let log_file = std::fs::File::create(log)?;
    let mut command = tools.command(&tools.qemu);
    command
        .args(qemu_args(guest))
        .stdout(Stdio::null())
        .stderr(log_file);
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest<'a>() -> QemuGuest<'a> {
        QemuGuest {
            kernel: Path::new("/img/vmlinux"),
            initramfs: Path::new("/img/initramfs.cpio"),
            cmdline: "crucible.boot_marker=1",
            memory_mib: 512,
            vcpus: 2,
            vsock_socket: Path::new("/run/sb/vhost-vsock.sock"),
            root_disk_socket: None,
            disk_sockets: &[],
            console: Path::new("/run/sb/console.log"),
            kvm: false,
        }
    }

    fn text(args: &[OsString]) -> String {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn qemu_runs_tcg_microvm_with_shared_memory_our_vsock_and_nothing_else() {
        let args = text(&qemu_args(&guest()));
        for expected in [
            "-M microvm,x-option-roms=off",
            ",memory-backend=mem",
            "memory-backend-memfd,id=mem,size=512M,share=on",
            "-accel tcg",
            "-m 512",
            "-smp 2",
            "-nodefaults",
            "-no-reboot",
            "-global virtio-mmio.force-legacy=false",
            "-chardev socket,id=vsock,path=/run/sb/vhost-vsock.sock",
            "-device vhost-user-vsock-device,chardev=vsock",
            "-serial file:/run/sb/console.log",
            "-kernel /img/vmlinux",
            "-initrd /img/initramfs.cpio",
        ] {
            assert!(args.contains(expected), "{expected:?} missing from {args}");
        }
        assert!(
            !args.contains("-netdev") && !args.contains("-enable-kvm"),
            "{args}"
        );
        assert!(
            !args.contains("vhost-user-blk"),
            "no root disk asked for: {args}"
        );
        let append = qemu_args(&guest())
            .last()
            .map(|a| a.to_string_lossy().into_owned())
            .unwrap_or_default();
        assert!(append.starts_with(contract::qemu::BASE_APPEND), "{append}");
        assert!(append.ends_with("crucible.boot_marker=1"), "{append}");
    }

    #[test]
    fn a_root_disk_is_the_only_vhost_user_blk_device() {
        let g = QemuGuest {
            root_disk_socket: Some(Path::new("/run/sb/vhost-root.sock")),
            ..guest()
        };
        let args = text(&qemu_args(&g));
        assert!(
            args.contains(
                "-chardev socket,id=root,path=/run/sb/vhost-root.sock \
                 -device vhost-user-blk,chardev=root"
            ),
            "{args}"
        );
    }

    #[test]
    fn each_disk_is_a_vhost_user_blk_device_of_its_own_after_the_root() {
        let disks = [
            PathBuf::from("/run/sb/vhost-disk0.sock"),
            PathBuf::from("/run/sb/vhost-disk1.sock"),
        ];
        let g = QemuGuest {
            root_disk_socket: Some(Path::new("/run/sb/vhost-root.sock")),
            disk_sockets: &disks,
            ..guest()
        };
        let args = text(&qemu_args(&g));
        let root = args.find("id=root").expect("root disk");
        let first = args
            .find(
                "-chardev socket,id=disk0,path=/run/sb/vhost-disk0.sock \
                 -device vhost-user-blk,chardev=disk0",
            )
            .expect("first disk");
        let second = args
            .find(
                "-chardev socket,id=disk1,path=/run/sb/vhost-disk1.sock \
                 -device vhost-user-blk,chardev=disk1",
            )
            .expect("second disk");
        assert!(root < first && first < second, "{args}");
        assert_eq!(args.matches("vhost-user-blk").count(), 3, "{args}");
    }

    #[test]
    fn a_block_device_serves_its_image_read_only_only_when_asked() {
        let (socket, image) = (Path::new("/s.sock"), Path::new("/sb/crucible-mount-0"));
        assert_eq!(
            text(&block_device_args(socket, image, false, None)),
            "vhost-user block --socket /s.sock --path /sb/crucible-mount-0"
        );
        assert_eq!(
            text(&block_device_args(socket, image, true, None)),
            "vhost-user block --socket /s.sock --path /sb/crucible-mount-0:ro"
        );
        assert_eq!(
            text(&block_device_args(
                socket,
                Path::new("/sb/crucible-ctr-1"),
                true,
                Some(Path::new("/sb/crucible-ctr-1-control.sock"))
            )),
            "vhost-user block --socket /s.sock --path /sb/crucible-ctr-1:ro \
             --control /sb/crucible-ctr-1-control.sock"
        );
    }

    #[test]
    fn zero_vcpus_still_boots_one() {
        let g = QemuGuest {
            vcpus: 0,
            ..guest()
        };
        assert!(text(&qemu_args(&g)).contains("-smp 1"));
    }

    #[test]
    fn find_on_path_needs_an_executable_file() {
        assert!(find_on_path("sh").is_some());
        assert!(find_on_path("no-such-program-crucible").is_none());
    }

    #[test]
    fn the_benchmarks_kvm_peer_runs_on_kvm_with_the_host_cpu() {
        let kvm = text(&qemu_args(&QemuGuest {
            kvm: true,
            ..guest()
        }));
        assert!(kvm.contains("-accel kvm -cpu host"), "{kvm}");
        let tcg = text(&qemu_args(&guest()));
        assert!(tcg.contains("-accel tcg -cpu max"), "{tcg}");
    }
}
