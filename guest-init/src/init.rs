//! VM mode: the agent as PID 1 of the microVM.
//!
//! Order of boot: mount the API filesystems, read `/proc/cmdline`, set up the root and disks it
//! names ([`vm_root`]: the ext4 root, the scratch disk, caches), set the hostname and bring up
//! `lo`, start the egress proxy when asked (`crucible.egress_port=`), protect the agent
//! from the OOM killer, create the `commands` cgroup, listen on vsock, announce readiness
//! (hello to the host, optional ready marker, the console line), then serve. PID 1 never exits:
//! every way out goes through [`power::end_vm`] (the stop marker, sync, then reset), so the
//! VMM can tell an end the agent chose from a kernel panic.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use contract::boot_marker::{self, Stop};
use contract::cmdline::BootConfig;
use contract::DEFAULT_PATH;

use crate::egress::{self, Uplink};
use crate::exec::{self, ExecContext};
use crate::log;
use crate::mount::{mount, MountError};
use crate::server::{self, Address, Agent, Listener, ShutdownAction};
use crate::{power, selftest, sys, vm_root};

/// Why a boot step failed. Most are logged and survived; see [`vm_main`].
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A mount failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// Another system call failed.
    #[error("{0}")]
    Sys(String, #[source] io::Error),
}

/// The API filesystems every process expects.
fn mount_basics() {
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
    let mounts: [(&str, &str, &str, libc::c_ulong, Option<&str>); 7] = [
        (
            "proc",
            "/proc",
            "proc",
            nosuid_nodev | libc::MS_NOEXEC,
            None,
        ),
        (
            "sysfs",
            "/sys",
            "sysfs",
            nosuid_nodev | libc::MS_NOEXEC,
            None,
        ),
        (
            "devtmpfs",
            "/dev",
            "devtmpfs",
            libc::MS_NOSUID,
            Some("mode=0755"),
        ),
        (
            "devpts",
            "/dev/pts",
            "devpts",
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some("gid=5,mode=0620,ptmxmode=0666"),
        ),
        (
            "tmpfs",
            "/dev/shm",
            "tmpfs",
            nosuid_nodev,
            Some("mode=1777"),
        ),
        ("tmpfs", "/run", "tmpfs", nosuid_nodev, Some("mode=0755")),
        ("tmpfs", "/tmp", "tmpfs", nosuid_nodev, Some("mode=1777")),
    ];
    for (src, target, fstype, flags, data) in mounts {
        if let Err(e) = mount(src, target, fstype, flags, data) {
            log::error(format_args!("{}", report::chain(&e)));
        }
    }
}

fn set_hostname(name: &str) -> Result<(), InitError> {
    // SAFETY: the pointer and length describe the live bytes of `name`.
    sys::cvt(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })
        .map_err(|e| InitError::Sys(format!("sethostname {name}"), e))?;
    Ok(())
}

/// `ip link set lo up`.
fn loopback_up() -> Result<(), InitError> {
    let err = |what: &str, e| InitError::Sys(format!("bringing up lo: {what}"), e);
    // SAFETY: socket takes no pointers.
    let fd =
        sys::cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })
            .map_err(|e| err("socket", e))?;
    // SAFETY: socket returned a fresh descriptor that nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    use std::os::fd::AsRawFd;
    // SAFETY: ifreq is plain old data; all-zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name and writes the flags of the live ifreq we pass.
    sys::cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) })
        .map_err(|e| err("SIOCGIFFLAGS", e))?;
    // SAFETY: after SIOCGIFFLAGS the flags member of the union is the initialized one.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads the live ifreq we pass.
    sys::cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &req) })
        .map_err(|e| err("SIOCSIFFLAGS", e))?;
    Ok(())
}

/// Creates the `commands` cgroup (memory and pids limits) and returns its `cgroup.procs` and
/// `memory.events`. Best effort: `None` when cgroup2 or the controllers are unavailable.
fn commands_cgroup(cfg: &BootConfig) -> Option<(OwnedFd, PathBuf)> {
    let root = Path::new("/sys/fs/cgroup");
    if let Err(e) = mount(
        "cgroup2",
        "/sys/fs/cgroup",
        "cgroup2",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    ) {
        log::info(format_args!(
            "no cgroup2, commands run without limits: {}",
            report::chain(&e)
        ));
        return None;
    }
    for ctl in ["+memory", "+pids"] {
        if let Err(e) = fs::write(root.join("cgroup.subtree_control"), ctl) {
            log::info(format_args!("cgroup controller {ctl} unavailable: {e}"));
        }
    }
    // Its memory.events is also where the stats op counts OOM kills.
    let group = root.join("commands");
    if let Err(e) = fs::create_dir_all(&group) {
        log::error(format_args!("cannot create the commands cgroup: {e}"));
        return None;
    }
    if let Some(total) = exec::mem_total_bytes() {
        let limit = total
            .saturating_sub(cfg.mem_reserve_mib * 1024 * 1024)
            .max(16 * 1024 * 1024);
        if let Err(e) = fs::write(group.join("memory.max"), limit.to_string()) {
            log::info(format_args!("cannot set memory.max: {e}"));
        }
    }
    if let Err(e) = fs::write(group.join("pids.max"), cfg.pids_max.to_string()) {
        log::info(format_args!("cannot set pids.max: {e}"));
    }
    let procs = fs::OpenOptions::new()
        .write(true)
        .open(group.join("cgroup.procs"))
        .map_err(|e| log::error(format_args!("cannot open the commands cgroup: {e}")))
        .ok()?;
    Some((procs.into(), group.join("memory.events")))
}

/// The console line that says the agent is ready (a contract: see docs/agent-protocol.md).
pub fn print_ready_line(uptime_ms: u64) {
    log::console(format_args!(
        "crucible-agent: ready pid={} version={} kernel={} uptime_ms={uptime_ms}",
        sys::getpid(),
        env!("CARGO_PKG_VERSION"),
        sys::kernel_release(),
    ));
}

/// PID 1 of the microVM. `forwarded` is what the kernel passed as arguments: boot parameters
/// it did not know, logged and ignored. Never returns.
pub fn vm_main(forwarded: &[String]) -> ! {
    // CRUCIBLE_CMDLINE stands in for /proc/cmdline, to exercise VM mode as PID 1 of a
    // namespace (see docs/agent-protocol.md); read before the environment is replaced.
    let cmdline = std::env::var("CRUCIBLE_CMDLINE").ok();
    let stop =
        std::panic::catch_unwind(|| boot_and_serve(cmdline, forwarded)).unwrap_or_else(|_| {
            log::error(format_args!("the agent panicked; ending the VM"));
            Stop::Failed
        });
    power::end_vm(stop)
}

/// Replaces the environment the kernel gave init (`HOME=/`, `TERM=linux` and every unknown
/// `key=value` boot parameter, such as `pci=off` on a kernel without PCI) with the agent's
/// own, as in a namespace sandbox: `PATH`, `HOME` (see [`contract::AGENT_HOME`]) and
/// `HOSTNAME`. Commands inherit it. Returns the names it dropped. Called while the process
/// has one thread, as changing the environment requires.
fn reset_environment(hostname: &str) -> Vec<String> {
    let mut dropped = Vec::new();
    for (name, _) in std::env::vars_os() {
        // The kernel always sets these three; only the others are worth a log line.
        if !matches!(name.to_str(), Some("PATH" | "HOME" | "TERM" | "HOSTNAME")) {
            dropped.push(name.to_string_lossy().into_owned());
        }
        std::env::remove_var(&name);
    }
    std::env::set_var("PATH", DEFAULT_PATH);
    std::env::set_var("HOME", contract::AGENT_HOME);
    std::env::set_var("HOSTNAME", hostname);
    dropped
}

/// Boots and serves until the agent must end the VM; says why.
fn boot_and_serve(cmdline: Option<String>, forwarded: &[String]) -> Stop {
    // The kernel hands init the console as 0/1/2 when the initramfs has /dev/console; then
    // stderr is the console. Otherwise open it once devtmpfs is mounted.
    let have_stderr = sys::fd_is_open(2);
    mount_basics();
    sys::ensure_stdio_open();
    if !have_stderr {
        if let Ok(console) = fs::OpenOptions::new()
            .write(true)
            .custom_flags_noctty()
            .open("/dev/console")
        {
            log::set_sink(Box::new(console));
        }
    }
    let cmdline = cmdline
        .or_else(|| fs::read_to_string("/proc/cmdline").ok())
        .unwrap_or_default();
    let cfg = BootConfig::parse(&cmdline);
    // Still one thread: the reaper starts next.
    let ignored_env = reset_environment(&cfg.hostname);
    if !forwarded.is_empty() || !ignored_env.is_empty() {
        log::info(format_args!(
            "ignoring what the kernel handed init: arguments {forwarded:?}, environment \
             {ignored_env:?}"
        ));
    }
    if let Err(e) = crate::reaper::start_orphan_reaper() {
        log::error(format_args!("cannot start the orphan reaper: {e}"));
    }
    power::enable_markers(cfg.boot_marker);
    if let Some(level) = cfg.log {
        log::set_level(level);
    }
    if let Err(e) = vm_root::prepare(&cfg) {
        log::error(format_args!(
            "cannot set up the root and disks: {}",
            report::chain(&e)
        ));
        if cfg.scratch.is_some() || !cfg.mounts.is_empty() {
            // The sandbox was created with this storage (a cache, a disk-backed layer):
            // running without it would lose what its commands write. No hello: the host sees
            // the VM end before it was ready, and says so.
            log::error(format_args!("ending the VM: its storage is not there"));
            return Stop::Failed;
        }
    }
    for step in [set_hostname(&cfg.hostname), loopback_up()] {
        if let Err(e) = step {
            log::error(format_args!("{}", report::chain(&e)));
        }
    }
    if let Some(port) = cfg.egress_port {
        // Before any command runs, so none can take the proxy's address first.
        if let Err(e) = egress::start(Uplink::Vsock(port)) {
            log::error(format_args!("{}", report::chain(&e)));
        }
    }
    if let Err(e) = fs::write("/proc/self/oom_score_adj", "-1000") {
        log::error(format_args!("cannot set oom_score_adj: {e}"));
    }

    let mut exec_ctx = match ExecContext::new() {
        Ok(c) => c,
        Err(e) => {
            log::error(format_args!("cannot open /dev/null: {e}"));
            return Stop::Failed;
        }
    };
    exec_ctx.reset_oom_score = true;
    if let Some((procs, events)) = cfg.cgroups.then(|| commands_cgroup(&cfg)).flatten() {
        exec_ctx.cgroup_procs = Some(procs);
        exec_ctx.cgroup_memory_events = fs::File::open(&events)
            .map_err(|e| log::info(format_args!("cannot open {}: {e}", events.display())))
            .ok();
    }
    // Before the listener and the hello: the host connects to the containers once it has the
    // hello, and each container's agent listens by then.
    let container_agents = match crate::vm_containers::start_all(
        &cfg,
        exec_ctx.cgroup_procs.as_ref().map(std::os::fd::AsFd::as_fd),
    ) {
        Ok(agents) => agents,
        Err(e) => {
            // No hello: the host sees the VM end before it was ready, and says so.
            log::error(format_args!("ending the VM: {}", report::chain(&e)));
            return Stop::Failed;
        }
    };
    sys::spare_from_signals(container_agents);
    if cfg.containers.iter().any(|c| c.share_pids) {
        // The containers' processes are in PID 1's namespace: a signal to the sandbox must
        // still reach its own root's alone.
        sys::share_pid_namespace();
    }

    let listener = match Listener::bind(&Address::Vsock(libc::VMADDR_CID_ANY, cfg.port)) {
        Ok(l) => Some(l),
        Err(e) => {
            // Without vsock (QEMU without a vsock device) the agent still boots, prints its
            // console line and can run the self-test.
            log::error(format_args!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ));
            None
        }
    };
    let uptime_ms = sys::uptime_ms();
    let agent: &'static Agent = Box::leak(Box::new(Agent {
        exec: exec_ctx,
        shutdown: ShutdownAction::Reboot,
        ready_uptime_ms: uptime_ms,
    }));

    // The hello goes out on its own thread: a host that does not answer must never delay the
    // console line or the service.
    let hello = agent.hello();
    let ready = Address::Vsock(libc::VMADDR_CID_HOST, cfg.ready_port);
    let _ = std::thread::Builder::new()
        .name("hello".into())
        .spawn(move || {
            if let Err(e) = server::send_hello(&ready, &hello) {
                let cause = std::error::Error::source(&e)
                    .map(ToString::to_string)
                    .unwrap_or_default();
                log::info(format_args!("{e} ({cause}); continuing without it"));
            }
        });
    power::write_marker(boot_marker::READY);
    print_ready_line(uptime_ms);

    if cfg.selftest {
        selftest::run(agent, &cfg.selftest_block);
        let _ = io::stdout().flush();
        return Stop::Requested; // vm_main ends the VM.
    }
    match listener {
        Some(l) => {
            let e = server::serve(l, agent);
            log::error(format_args!("{e}"));
        }
        None => log::error(format_args!("nothing to serve on; ending the VM")),
    }
    Stop::Failed
}

/// `O_NOCTTY` for opening the console without making it our controlling terminal.
trait NoCtty {
    fn custom_flags_noctty(&mut self) -> &mut Self;
}

impl NoCtty for fs::OpenOptions {
    fn custom_flags_noctty(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NOCTTY)
    }
}
