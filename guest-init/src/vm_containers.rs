//! A microVM sandbox's containers (`crucible.container=`, `crucible.shared=`): each one's
//! agent is PID 1 of a PID and mount namespace of its own in the guest, its root the image on
//! its disk (found by serial, read-only) under an overlay whose writes stay in the guest's
//! memory, serving on a vsock port of its own ([`contract::vsock::container_agent_port`]).
//! All of them share the guest's network, IPC, hostname and cgroups, and the shared
//! directories (`/run/crucible/shared/NAME`, in memory) each root mounts.
//!
//! PID 1 starts each agent ([`start_all`]) as a fresh execution of its own binary, cloned
//! into the new namespaces: PID 1 has threads by then, so the clone's child only duplicates
//! two descriptors and executes. The new agent builds its root ([`enter_root`]) before it
//! serves, and says it is ready on a socket PID 1 waits on, so that the host never connects
//! before it listens.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use contract::cmdline::{BootConfig, VmContainer, VmShared};

use crate::log;
use crate::mount::{mount, MountError};
use crate::sys;

/// Where the shared directories live in the guest (a tmpfs: `/run`).
const SHARED_DIR: &str = "/run/crucible/shared";

/// Where each container's layers are built, in its own mount namespace.
const POD_DIR: &str = "/run/crucible/pod";

/// The descriptor a container's agent says it is ready on (`--ready fd:4`).
pub const READY_FD: RawFd = 4;

/// How long PID 1 waits for a container's agent to listen.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// Why a container's root could not be built, or its agent started.
#[derive(Debug, thiserror::Error)]
pub enum VmContainerError {
    /// A mount failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// Another system call failed.
    #[error("{0}")]
    Sys(String, #[source] io::Error),
    /// The command line names a disk that is not attached.
    #[error("container {name}: no disk has the serial {serial:?}")]
    NoDisk {
        /// The container.
        name: String,
        /// Its disk's serial.
        serial: String,
    },
    /// Its agent did not say it was ready.
    #[error("container {name}: its agent did not start: {why}")]
    NotReady {
        /// The container.
        name: String,
        /// What happened.
        why: String,
    },
}

/// Makes the shared directories, mounts the sandbox's own root's (`main`'s), gives `main`
/// namespaces of its own when the sandbox is a pod (it has containers, or disks for them:
/// [`crate::main_ns`]), and starts each container's agent, handing it the commands' cgroup
/// (`cgroup.procs`) when there is one. Returns the pids every signal to the sandbox must
/// spare (the agents and the main init). A container that cannot start is logged and left
/// out: the host then finds nothing on its port and says so. A pod whose `main` cannot be
/// isolated is an error: it would run with every container's processes in sight.
pub fn start_all(
    cfg: &BootConfig,
    commands_cgroup: Option<BorrowedFd<'_>>,
) -> Result<Vec<libc::pid_t>, crate::main_ns::MainNamespaceError> {
    let kept = commands_cgroup.and_then(|fd| fd.try_clone_to_owned().ok());
    let _ = LATER.set(Later {
        log: cfg.log,
        commands_cgroup: kept,
    });
    let disks = crate::vm_root::disks_by_serial(Path::new("/sys/block"));
    let pod = !cfg.containers.is_empty()
        || disks
            .keys()
            .any(|serial| contract::disk::is_container_serial(serial));
    if !pod && cfg.shared.is_empty() {
        return Ok(Vec::new());
    }
    if let Err(e) = make_shared_dirs(&cfg.shared) {
        log::error(format_args!("{}", report::chain(&e)));
    }
    for shared in cfg.shared.iter().filter(|s| s.owner == "main") {
        if let Err(e) = bind_shared(shared, "") {
            log::error(format_args!("{}", report::chain(&e)));
        }
    }
    let mut agents = Vec::new();
    if pod {
        // After main's own mounts, which its namespace copies; before any container, which
        // may join it.
        agents.push(crate::main_ns::start()?.init_pid());
    }
    for (index, container) in cfg.containers.iter().enumerate() {
        let started = disks
            .get(&container.serial)
            .ok_or_else(|| VmContainerError::NoDisk {
                name: container.name.clone(),
                serial: container.serial.clone(),
            })
            .and_then(|device| {
                let shared = cfg.shared.iter().filter(|s| s.owner == container.name);
                let argv = agent_argv(cfg.log, index, &container.name, device, shared);
                start_agent(
                    &container.name,
                    &argv,
                    commands_cgroup,
                    container.share_pids,
                )
            });
        match started {
            Ok(pid) => agents.push(pid),
            Err(e) => log::error(format_args!("{}", report::chain(&e))),
        }
    }
    Ok(agents)
}

/// What a container added once the guest runs is started with, kept by [`start_all`].
struct Later {
    log: Option<contract::cmdline::LogLevel>,
    commands_cgroup: Option<OwnedFd>,
}

static LATER: std::sync::OnceLock<Later> = std::sync::OnceLock::new();

/// How long an added container's disk may take to show its image: the host gives the empty
/// disk its image before it asks, but the kernel learns the new capacity from a work queue.
const DISK_WITHIN: Duration = Duration::from_secs(5);

/// Starts `container`, added once the guest runs (`add_container` with a disk): its image is
/// on its disk (an empty slot reserved at boot, or one a removed container released, given
/// the image by the host before it asks, `sectors` long), its agent serves on the port of
/// `index`, with `shared` made and mounted, in PID 1's namespace if it shares it. Returns its
/// agent's pid, which a signal to every process must spare. `seccomp_filter` (packed
/// instructions) is a profile of the container's own, which it installs before its agent
/// starts.
pub fn add(
    container: &VmContainer,
    index: usize,
    sectors: u64,
    shared: &[VmShared],
    seccomp_filter: &[u64],
) -> Result<libc::pid_t, VmContainerError> {
    let (name, serial) = (container.name.as_str(), container.serial.as_str());
    let later = LATER.get();
    make_shared_dirs(shared)?;
    let device = wait_for_image(name, serial, sectors, Path::new("/sys/block"))?;
    forget_cached_blocks(&device)?;
    let mut argv = agent_argv(
        later.and_then(|l| l.log),
        index,
        name,
        &device,
        shared.iter(),
    );
    if !seccomp_filter.is_empty() {
        argv.extend([
            "--seccomp-filter".to_string(),
            contract::container_security::filter_hex(seccomp_filter),
        ]);
    }
    let cgroup = later.and_then(|l| l.commands_cgroup.as_ref().map(AsFd::as_fd));
    start_agent(name, &argv, cgroup, container.share_pids)
}

/// Drops what the kernel cached of `device`'s blocks (`BLKFLSBUF`): a slot given another
/// image still holds the previous image's pages, which the new root must never read.
fn forget_cached_blocks(device: &str) -> Result<(), VmContainerError> {
    let file =
        fs::File::open(device).map_err(|e| VmContainerError::Sys(format!("open {device}"), e))?;
    // SAFETY: BLKFLSBUF takes no argument; the descriptor is open for the call.
    let flushed = unsafe { libc::ioctl(file.as_raw_fd(), BLKFLSBUF, 0) };
    sys::cvt(flushed)
        .map(drop)
        .map_err(|e| VmContainerError::Sys(format!("drop {device}'s cached blocks"), e))
}

/// `BLKFLSBUF`, `_IO(0x12, 97)`: the block layer's "flush and forget the buffers" request.
const BLKFLSBUF: libc::Ioctl = 0x1261;

/// How long a removed container's disk may stay held: its mounts go when its last process
/// has, which the kernel has done by the time the container's agent is reaped.
const RELEASE_WITHIN: Duration = Duration::from_secs(10);

/// Waits until nothing holds the disk `serial` (no mount: an exclusive open succeeds), or
/// says why not within [`RELEASE_WITHIN`].
pub fn await_released(serial: &str) -> Result<(), VmContainerError> {
    let device = crate::vm_root::disks_by_serial(Path::new("/sys/block"))
        .remove(serial)
        .ok_or_else(|| VmContainerError::NoDisk {
            name: "(released)".into(),
            serial: serial.to_string(),
        })?;
    let deadline = std::time::Instant::now() + RELEASE_WITHIN;
    loop {
        let exclusive = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(&device);
        match exclusive {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                if std::time::Instant::now() >= deadline {
                    return Err(VmContainerError::Sys(
                        format!(
                            "{device} ({serial}) is still in use after {} s",
                            RELEASE_WITHIN.as_secs()
                        ),
                        e,
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(VmContainerError::Sys(format!("open {device}"), e)),
        }
    }
}

/// The device of the disk `serial` once its kernel sees it `sectors` long, or why not within
/// [`DISK_WITHIN`].
fn wait_for_image(
    name: &str,
    serial: &str,
    sectors: u64,
    sys_block: &Path,
) -> Result<String, VmContainerError> {
    let deadline = std::time::Instant::now() + DISK_WITHIN;
    loop {
        let device = crate::vm_root::disks_by_serial(sys_block).remove(serial);
        let mut seen = None;
        if let Some(device) = &device {
            let vd = device.trim_start_matches("/dev/");
            let size = fs::read_to_string(sys_block.join(vd).join("size")).unwrap_or_default();
            seen = size.trim().parse::<u64>().ok();
            if seen == Some(sectors) {
                return Ok(device.clone());
            }
        }
        if std::time::Instant::now() >= deadline {
            return match device {
                None => Err(VmContainerError::NoDisk {
                    name: name.to_string(),
                    serial: serial.to_string(),
                }),
                Some(device) => Err(VmContainerError::NotReady {
                    name: name.to_string(),
                    why: format!(
                        "its disk {device} ({serial}) is {} sectors after {} s, not the \
                         image's {sectors}",
                        seen.map_or("of unknown size".into(), |s| s.to_string()),
                        DISK_WITHIN.as_secs()
                    ),
                }),
            };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The container agent's command line: `sandbox-container` building its root first.
fn agent_argv<'a>(
    log: Option<contract::cmdline::LogLevel>,
    index: usize,
    name: &str,
    device: &str,
    shared: impl Iterator<Item = &'a VmShared>,
) -> Vec<String> {
    let mut argv = vec![
        "init".to_string(),
        "sandbox-container".into(),
        "--vm-root".into(),
        format!("{name}:{device}"),
        "--listen".into(),
        format!(
            "vsock:{}:{}",
            libc::VMADDR_CID_ANY,
            contract::vsock::container_agent_port(index)
        ),
        "--ready".into(),
        format!("fd:{READY_FD}"),
    ];
    for mount in shared {
        let flag = if mount.read_only {
            "--vm-shared-ro"
        } else {
            "--vm-shared"
        };
        argv.extend([flag.into(), format!("{}:{}", mount.name, mount.target)]);
    }
    if let Some(level) = log {
        argv.extend(["--log".into(), level.as_str().into()]);
    }
    argv
}

/// Makes each shared directory once, writable by every user (as a namespace sandbox's are).
fn make_shared_dirs(shared: &[VmShared]) -> Result<(), VmContainerError> {
    use std::os::unix::fs::PermissionsExt;
    let names: BTreeSet<&str> = shared.iter().map(|s| s.name.as_str()).collect();
    for name in names {
        let dir = format!("{SHARED_DIR}/{name}");
        fs::create_dir_all(&dir).map_err(|e| VmContainerError::Sys(format!("mkdir {dir}"), e))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777))
            .map_err(|e| VmContainerError::Sys(format!("chmod 0777 {dir}"), e))?;
    }
    Ok(())
}

/// Binds shared directory `shared.name` at `shared.target` under `root` (`""`: this root),
/// read-only if it says so.
fn bind_shared(shared: &VmShared, root: &str) -> Result<(), VmContainerError> {
    let source = format!("{SHARED_DIR}/{}", shared.name);
    let target = format!("{root}{}", shared.target);
    let flags = libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV;
    mount(&source, &target, "", flags, None)?;
    if shared.read_only {
        // A bind takes its flags only when remounted.
        mount(
            &source,
            &target,
            "",
            flags | libc::MS_REMOUNT | libc::MS_RDONLY,
            None,
        )?;
    }
    Ok(())
}

/// Clones a process into a new mount namespace and, unless `share_pids`, a new PID namespace,
/// that executes this binary with `argv`, its ready socket at [`READY_FD`] and the commands'
/// cgroup at [`contract::namespace_fds::COMMANDS_CGROUP_FD`]; waits until it says it listens.
fn start_agent(
    name: &str,
    argv: &[String],
    commands_cgroup: Option<BorrowedFd<'_>>,
    share_pids: bool,
) -> Result<libc::pid_t, VmContainerError> {
    let not_ready = |why: String| VmContainerError::NotReady {
        name: name.to_string(),
        why,
    };
    let sys_err = |what: &str| {
        let what = what.to_string();
        move |e| VmContainerError::Sys(what, e)
    };
    // Everything the child touches is made before the clone: it may not allocate.
    let program = c"/proc/self/exe";
    let args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<_, _>>()
        .map_err(|_| not_ready("an argument holds a NUL byte".into()))?;
    let env = namespace::current_env();
    let (args_p, env_p) = (
        namespace::null_terminated(&args),
        namespace::null_terminated(&env),
    );
    let (ours, theirs) = UnixStream::pair().map_err(sys_err("socketpair for a container"))?;
    // Above every descriptor the child hands on, so one dup2 cannot clobber the other's source.
    let high = |fd: BorrowedFd<'_>| -> Result<OwnedFd, VmContainerError> {
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes integers and returns a new descriptor.
        let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 16) };
        sys::cvt(copy).map_err(sys_err("duplicate a descriptor for a container"))?;
        // SAFETY: the copy is new and ours alone.
        Ok(unsafe { OwnedFd::from_raw_fd(copy) })
    };
    let theirs = high(theirs.as_fd())?;
    let cgroup = commands_cgroup.map(high).transpose()?;
    let theirs_fd = theirs.as_raw_fd();
    let cgroup_fd = cgroup.as_ref().map(AsRawFd::as_raw_fd);
    let namespaces = if share_pids {
        libc::CLONE_NEWNS
    } else {
        libc::CLONE_NEWNS | libc::CLONE_NEWPID
    };

    // A container sharing `main`'s PID namespace joins `main`'s own, when it has one. Not
    // through `spawn_inside`: this child returns from the clone, and must not run its code.
    let join = crate::main_ns::get().filter(|_| share_pids);
    if let Some(main) = join {
        main.children_inside()
            .map_err(sys_err("enter main's PID namespace"))?;
    }
    // SAFETY: a fork-style clone (no new stack: the child runs on a copy of ours). The child
    // only makes async-signal-safe system calls on memory prepared above (dup2, execve,
    // _exit), so the locks other threads may hold in the copy never matter.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            namespaces | libc::SIGCHLD,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid != 0 {
        if let Some(main) = join {
            main.children_back();
        }
    }
    if pid == 0 {
        // SAFETY: dup2 and execve take integers and pointers to the live, NUL-terminated
        // arrays above; _exit never returns. The sources are above 15, so never a target; dup2
        // leaves the new descriptors open across execve, every other one is close-on-exec.
        unsafe {
            let hand = |from: RawFd, to: RawFd| {
                if libc::dup2(from, to) < 0 {
                    libc::_exit(126);
                }
            };
            hand(theirs_fd, READY_FD);
            if let Some(fd) = cgroup_fd {
                hand(fd, contract::namespace_fds::COMMANDS_CGROUP_FD);
            }
            libc::execve(program.as_ptr(), args_p.as_ptr(), env_p.as_ptr());
            libc::_exit(127);
        }
    }
    if pid < 0 {
        return Err(VmContainerError::Sys(
            format!("clone container {name}'s agent into new PID and mount namespaces"),
            io::Error::last_os_error(),
        ));
    }
    drop((theirs, cgroup));
    let pid = libc::pid_t::try_from(pid).map_err(|_| not_ready(format!("clone returned {pid}")))?;
    let mut ours = ours;
    ours.set_read_timeout(Some(READY_WITHIN))
        .map_err(sys_err("set a timeout on a container's ready socket"))?;
    let mut hello = [0u8; 512];
    match ours.read(&mut hello) {
        Ok(n) if n > 0 => Ok(pid),
        Ok(_) => Err(not_ready(
            "it ended before it listened (the guest's console has its reason)".into(),
        )),
        Err(e) => Err(not_ready(format!(
            "no hello within {} s: {e}",
            READY_WITHIN.as_secs()
        ))),
    }
}

/// A container's agent, PID 1 of its new namespaces and still in a copy of the guest's mount
/// table: builds its root from its image's disk `device` — read-only, under an overlay on a
/// tmpfs of its own — with `shared` (`(name, target)`) bound in, `/proc` of its PID
/// namespace, the guest's `/dev`, a read-only `/sys` and a fresh `/tmp`, then makes it `/`.
/// Each shared mount is `(name, target, read_only)`.
pub fn enter_root(
    name: &str,
    device: &str,
    shared: &[(String, String, bool)],
) -> Result<(), VmContainerError> {
    let sys_err = |what: String| move |e| VmContainerError::Sys(what, e);
    // Nothing mounted here may reach the guest's own table.
    mount("none", "/", "", libc::MS_REC | libc::MS_PRIVATE, None)?;
    let base = format!("{POD_DIR}/{name}");
    mount(
        "tmpfs",
        &base,
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=0755"),
    )?;
    let (lower, upper, work, root) = (
        format!("{base}/lower"),
        format!("{base}/upper"),
        format!("{base}/work"),
        format!("{base}/root"),
    );
    mount(device, &lower, "ext4", libc::MS_RDONLY, None)?;
    for dir in [&upper, &work, &root] {
        fs::create_dir_all(dir).map_err(sys_err(format!("mkdir {dir}")))?;
    }
    let options = format!("lowerdir={lower},upperdir={upper},workdir={work}");
    mount("overlay", &root, "overlay", 0, Some(&options))?;
    for (dir, target, read_only) in shared {
        let mount = VmShared {
            owner: name.to_string(),
            name: dir.clone(),
            target: target.clone(),
            read_only: *read_only,
        };
        bind_shared(&mount, &root)?;
    }
    let hidden = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mount("proc", &format!("{root}/proc"), "proc", hidden, None)?;
    mount(
        "/dev",
        &format!("{root}/dev"),
        "",
        libc::MS_BIND | libc::MS_REC,
        None,
    )?;
    mount(
        "sysfs",
        &format!("{root}/sys"),
        "sysfs",
        hidden | libc::MS_RDONLY,
        None,
    )?;
    mount(
        "tmpfs",
        &format!("{root}/tmp"),
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777"),
    )?;
    std::env::set_current_dir(&root).map_err(sys_err(format!("chdir {root}")))?;
    let dot = c".";
    // SAFETY: both arguments are the NUL-terminated string ".". Stacking the old root under
    // the new one and detaching it needs no directory for it.
    let pivoted = unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) };
    if pivoted == 0 {
        // SAFETY: umount2 of the NUL-terminated ".", the old root stacked on the new one.
        sys::cvt(unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) })
            .map_err(sys_err("detach the guest's root".into()))?;
    } else {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(VmContainerError::Sys(format!("pivot_root into {root}"), e));
        }
        // The guest's root is its initramfs, which cannot be pivoted away from: the new root
        // is moved over it instead, as switch_root does. What it hides stays out of reach of
        // paths; a container's root could still climb out of the chroot, into the guest's
        // initramfs — the pod's own ground (its containers trust each other), never the host.
        mount(".", "/", "", libc::MS_MOVE, None)?;
        // SAFETY: chroot of the NUL-terminated ".".
        sys::cvt(unsafe { libc::chroot(dot.as_ptr()) })
            .map_err(sys_err(format!("chroot into {root}")))?;
    }
    std::env::set_current_dir("/").map_err(sys_err("chdir /".into()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_containers_agent_builds_its_root_then_serves_on_its_own_port_and_says_hello_on_fd_4() {
        let shared = [
            VmShared {
                owner: "db".into(),
                name: "work".into(),
                target: "/var/lib/my data".into(),
                read_only: false,
            },
            VmShared {
                owner: "db".into(),
                name: "sock".into(),
                target: "/run/pg".into(),
                read_only: true,
            },
        ];
        let log = Some(contract::cmdline::LogLevel::Debug);
        let argv = agent_argv(log, 1, "db", "/dev/vdb", shared.iter());
        assert_eq!(
            argv,
            [
                "init",
                "sandbox-container",
                "--vm-root",
                "db:/dev/vdb",
                "--listen",
                "vsock:4294967295:2049",
                "--ready",
                "fd:4",
                "--vm-shared",
                "work:/var/lib/my data",
                "--vm-shared-ro",
                "sock:/run/pg",
                "--log",
                "debug",
            ]
        );
    }

    #[test]
    fn an_added_containers_disk_is_waited_for_until_it_has_the_images_size() {
        let sys = tempfile::tempdir().expect("tempdir");
        let vdc = sys.path().join("vdc");
        fs::create_dir(&vdc).expect("vdc");
        fs::write(vdc.join("serial"), "crucible-ctr-2").expect("serial");
        fs::write(vdc.join("size"), "0\n").expect("size");
        let grow = {
            let size = vdc.join("size");
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                fs::write(size, "2048\n").expect("grow");
            })
        };
        let device = wait_for_image("web", "crucible-ctr-2", 2048, sys.path()).expect("device");
        assert_eq!(device, "/dev/vdc");
        grow.join().expect("grow");
        let started = std::time::Instant::now();
        let err = wait_for_image("web", "crucible-ctr-2", 4096, sys.path()).expect_err("size");
        assert!(err.to_string().contains("2048 sectors"), "{err}");
        assert!(started.elapsed() >= DISK_WITHIN);
        let err = wait_for_image("web", "crucible-ctr-3", 1, sys.path()).expect_err("no disk");
        assert!(err.to_string().contains("crucible-ctr-3"), "{err}");
    }

    #[test]
    fn a_sandbox_without_containers_or_shared_dirs_starts_nothing() {
        let started = start_all(&BootConfig::default(), None).expect("nothing to fail");
        assert!(started.is_empty());
    }
}
