//! `guest-init`: crucible's guest agent. See `--help`.

use std::process::ExitCode;

use guest_init::exec::ExecContext;
use guest_init::log::{self, LogLevel};
use guest_init::server::{self, Address, Agent, Listener, ShutdownAction};
use guest_init::{egress, init, reaper, selftest, sys};

const HELP: &str = "\
guest-init: crucible's guest agent

USAGE:
    guest-init                                   (as PID 1 of a crucible microVM)
    guest-init --listen unix:PATH [--ready unix:PATH] [--log LEVEL]
    guest-init --selftest
    guest-init sandbox --rootfs DIR --runtime-dir DIR --agent-socket PATH --ready-socket PATH
               --hostname NAME --id-map HOST_BASE:COUNT [--scratch-mib N] [--scratch-disk FILE]
               [--mount KIND:SOURCE:TARGET:MODE]... [--egress-socket PATH] [--cgroup FILE]...
               [--no-die-with-parent] [--memory-bytes N] [--log LEVEL]

MODES:
    With no --listen and running as PID 1, it is the VM's init: it mounts /proc, /sys, /dev,
    /run and /tmp, reads crucible.* settings from /proc/cmdline (port, ready_port, root, log,
    selftest, boot_marker, hostname), listens on vsock, sends its hello to the host (CID 2) and
    prints `crucible-agent: ready ...` on the console. It never exits: shutdown syncs and resets.

    With --listen it is a plain process serving the same protocol on ADDR (unix:PATH,
    vsock:PORT, or fd:N for an inherited listening socket). If --ready is given it connects
    there once it is listening (or writes to fd:N, an inherited connected socket) and sends its
    hello (one length-prefixed JSON message), so the caller needs no polling. It reaps orphaned
    descendants (as a subreaper, or as PID 1 of a PID namespace). `shutdown` exits with 0.

    `sandbox` (run as host root; the daemon's namespace backend runs it this way) makes a
    namespace sandbox and starts this agent again as its PID 1: a user namespace whose ids
    0-65535 are the host ids of --id-map (never host root), new PID, mount, UTS, IPC, network
    and cgroup namespaces, the image directory --rootfs idmapped and read-only under a tmpfs
    overlay of --scratch-mib MiB as `/` (/tmp and /dev/shm share it), /proc with runc's masked
    and read-only paths, the cgroups whose cgroup.procs files are given with --cgroup joined,
    Docker's capabilities scoped to the user namespace and an allowlist seccomp filter. The
    agent listens on the host path --agent-socket and says hello on --ready-socket, both opened
    before entering (the sandbox never sees them). This process stays outside as the
    supervisor: it exits with PID 1's status, and PID 1 dies with it; it dies with the process
    that started it unless --no-die-with-parent. --memory-bytes is the sandbox's memory limit,
    for the OOM verdict. (`sandbox-pid1` is the inside half, started only by `sandbox`.)
    --commands-cgroup FILE is the cgroup.procs every command joins (handed to each agent as
    descriptor 7), whose process limit leaves the agents a reserve.

    `sandbox-container` is a container's agent: started by `sandbox` (or its container
    factory) in a namespace sandbox, or by a microVM's PID 1 with --vm-root NAME:DEVICE, which
    first builds its root from the read-only ext4 on DEVICE under a tmpfs overlay, with each
    --vm-shared DIR:TARGET (repeatable; --vm-shared-ro read-only) bound in from
    /run/crucible/shared/DIR.

    --scratch-disk FILE puts every write (the overlay's upper layer, /tmp, /dev/shm) on the
    ext4 filesystem in FILE instead of the tmpfs (--scratch-mib is then ignored; a full disk is
    ENOSPC inside). --mount KIND:SOURCE:TARGET:MODE (repeatable) mounts SOURCE at TARGET
    inside, nosuid and nodev, idmapped so that its uid 0 is the sandbox's root: KIND ext4 is an
    ext4 image file, MODE rw or ro; KIND dir is a host directory, MODE ro only. TARGET is an
    absolute, normalised path, not / nor in /proc, /dev or /sys, made if missing (never
    through a symlink); no path may contain `:`. Images are attached through loop devices that
    detach themselves when the sandbox is gone, and an image already attached is refused.
    --egress-socket PATH is a Unix socket on the host, connected before entering like
    --ready-socket and handed to PID 1 as descriptor 5 (close-on-exec, so no command
    inherits it), for passing connections to the daemon.

    --selftest runs the boot self-test through the exec engine and exits (1 if any test fails;
    `pid1` fails unless run as PID 1).

PROTOCOL:
    One request per connection: a length-prefixed JSON AgentRequest (exec, put_files,
    get_file, ping, shutdown); exec answers with stdout/stderr frames and one exit frame.
    See docs/agent-protocol.md.

OPTIONS:
    --listen ADDR    serve on ADDR instead of being the VM's init
    --ready ADDR     send the hello to ADDR once listening
    --log LEVEL      quiet, error, info (default) or debug
    --egress ADDR    serve the egress proxy on 127.0.0.1:3128, passing each connection to the
                     daemon: fd:N (an inherited Unix socket taking descriptors) or vsock:PORT
    --selftest       run the self-test and exit
    -h, --help       this text
    -V, --version    the version
";

#[derive(Debug, Default)]
struct Args {
    listen: Option<Address>,
    ready: Option<Address>,
    log: Option<LogLevel>,
    selftest: bool,
    mode: Mode,
    memory_bytes: Option<u64>,
    egress: Option<Address>,
    /// A namespace sandbox's PID 1 has a container factory, its connection at
    /// `namespace::PID1_FACTORY_FD`.
    container_factory: bool,
    /// `sandbox-container` in a microVM: the container's name and its image's disk, to build
    /// its root from before serving.
    vm_root: Option<(String, String)>,
    /// With `vm_root`: shared directories `(name, target, read_only)` to bind into it.
    vm_shared: Vec<(String, String, bool)>,
    /// `sandbox-pid1 --share-pid-namespace`: a container of the sandbox joins this agent's PID
    /// namespace.
    shared_pids: bool,
    /// `sandbox-container --command-capabilities HEX`: the bounding set of every command.
    command_capabilities: Option<u64>,
    /// `sandbox-container --container-init PID`: the container's first command is PID 1,
    /// started by its init (this pid, our child); later ones by its spawner.
    container_init: Option<libc::pid_t>,
    /// `sandbox-container --seccomp-filter HEX` in a microVM: the container's own seccomp
    /// profile, compiled (packed instructions), installed once its root is built.
    seccomp_filter: Vec<u64>,
}

/// Which half of a namespace sandbox this process is, if any.
#[derive(Debug, Default)]
enum Mode {
    /// Not a namespace sandbox.
    #[default]
    Plain,
    /// `sandbox`: make the sandbox, then supervise its PID 1 from outside.
    Sandbox(Box<namespace::SandboxSpec>),
    /// `sandbox-pid1`: the sandbox's PID 1, started by the `sandbox` half.
    SandboxPid1,
    /// `sandbox-container`: a container's agent, PID 1 of the container's PID namespace
    /// inside the sandbox, started by the `sandbox` half.
    SandboxContainer,
}

fn number(flag: &str, text: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("{flag} needs a number, got {text:?}"))
}

/// Whether this process is a microVM's init: PID 1, started by the kernel. Its arguments, if
/// any, are then boot parameters the kernel did not know and handed on (`nomodule`, `single`,
/// …), never ours, and must not stop the VM from booting. Every other way to run the agent
/// names itself: a subcommand first, or `--listen` / `--selftest`.
fn is_vm_init(pid: u32, args: &[String]) -> bool {
    let names_a_mode =
        |a: &str| matches!(a, "--listen" | "--selftest") || a.starts_with("--listen=");
    let subcommand = matches!(
        args.first().map(String::as_str),
        Some(
            "sandbox"
                | "sandbox-pid1"
                | "sandbox-container"
                | "container-init"
                | "container-spawner"
        )
    );
    pid == 1 && !subcommand && !args.iter().any(|a| names_a_mode(a))
}

/// The arguments after the program name; bytes that are not UTF-8 (a kernel hands init
/// whatever the boot loader wrote) become U+FFFD rather than a panic.
fn arguments() -> Vec<String> {
    std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

fn parse_args(argv: Vec<String>) -> Result<Option<Args>, String> {
    let mut args = Args::default();
    let mut it = argv.into_iter().peekable();
    match it.peek().map(String::as_str) {
        Some("sandbox") => args.mode = Mode::Sandbox(Box::default()),
        Some("sandbox-pid1") => args.mode = Mode::SandboxPid1,
        Some("sandbox-container") => args.mode = Mode::SandboxContainer,
        _ => {}
    }
    if !matches!(args.mode, Mode::Plain) {
        it.next();
    }
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(None);
            }
            "-V" | "--version" => {
                println!("guest-init {}", env!("CARGO_PKG_VERSION"));
                return Ok(None);
            }
            "--listen" => {
                let v = value("--listen")?;
                args.listen =
                    Some(Address::parse(&v).ok_or(format!("bad --listen address {v:?}"))?);
            }
            "--ready" => {
                let v = value("--ready")?;
                args.ready = Some(Address::parse(&v).ok_or(format!("bad --ready address {v:?}"))?);
            }
            "--log" => {
                let v = value("--log")?;
                args.log = Some(LogLevel::parse(&v).ok_or(format!("bad --log level {v:?}"))?);
            }
            "--selftest" => args.selftest = true,
            "--egress" => {
                let v = value("--egress")?;
                match Address::parse(&v) {
                    Some(addr @ (Address::Fd(_) | Address::Vsock(..))) => args.egress = Some(addr),
                    _ => return Err(format!("bad --egress address {v:?} (fd:N or vsock:PORT)")),
                }
            }
            "--memory-bytes" => args.memory_bytes = Some(number(&flag, &value(&flag)?)?),
            "--share-pid-namespace" => {
                if !matches!(args.mode, Mode::SandboxPid1) {
                    return Err(format!("{flag} is only valid after `sandbox-pid1`"));
                }
                args.shared_pids = true;
            }
            "--command-capabilities" => {
                if !matches!(args.mode, Mode::SandboxContainer) {
                    return Err(format!("{flag} is only valid after `sandbox-container`"));
                }
                let v = value(&flag)?;
                let mask = u64::from_str_radix(&v, 16)
                    .map_err(|_| format!("{flag} needs a hexadecimal mask, got {v:?}"))?;
                args.command_capabilities = Some(mask);
            }
            "--seccomp-filter" => {
                if !matches!(args.mode, Mode::SandboxContainer) {
                    return Err(format!("{flag} is only valid after `sandbox-container`"));
                }
                args.seccomp_filter = contract::container_security::parse_filter(&value(&flag)?)
                    .map_err(|why| format!("{flag}: {why}"))?;
            }
            "--container-init" => {
                if !matches!(args.mode, Mode::SandboxContainer) {
                    return Err(format!("{flag} is for sandbox-container only"));
                }
                let pid = value(&flag)?;
                args.container_init = Some(
                    pid.parse()
                        .ok()
                        .filter(|p: &libc::pid_t| *p > 0)
                        .ok_or(format!("{flag} needs a pid, got {pid:?}"))?,
                );
            }
            "--container-factory" => {
                if !matches!(args.mode, Mode::SandboxPid1) {
                    return Err(format!("{flag} is only valid after `sandbox-pid1`"));
                }
                args.container_factory = true;
            }
            "--vm-root" | "--vm-shared" | "--vm-shared-ro" => {
                if !matches!(args.mode, Mode::SandboxContainer) {
                    return Err(format!("{flag} is only valid after `sandbox-container`"));
                }
                let v = value(&flag)?;
                let (name, rest) = v
                    .split_once(':')
                    .filter(|(name, rest)| !name.is_empty() && rest.starts_with('/'))
                    .ok_or_else(|| format!("{flag} takes NAME:/PATH, got {v:?}"))?;
                let (name, rest) = (name.to_string(), rest.to_string());
                match flag.as_str() {
                    "--vm-root" => args.vm_root = Some((name, rest)),
                    ro => args.vm_shared.push((name, rest, ro == "--vm-shared-ro")),
                }
            }
            other if namespace::SandboxSpec::is_flag(other) => {
                let Mode::Sandbox(spec) = &mut args.mode else {
                    return Err(format!("{flag} is only valid after `sandbox` (see --help)"));
                };
                spec.parse_flag(other, || inline.clone().or_else(|| it.next()))
                    .map_err(|e| e.to_string())?;
            }
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    match &args.mode {
        Mode::Sandbox(spec) => {
            spec.validate().map_err(|e| e.to_string())?;
            if args.listen.is_some() || args.ready.is_some() {
                return Err(
                    "sandbox takes --agent-socket and --ready-socket, not --listen or \
                            --ready"
                        .into(),
                );
            }
        }
        Mode::SandboxPid1 | Mode::SandboxContainer if args.listen.is_none() => {
            return Err("sandbox-pid1 and sandbox-container need --listen".into())
        }
        _ => {}
    }
    Ok(Some(args))
}

/// `sync-host-mounts SOCKET SUPERVISOR (SOURCE TARGET ro|rw)...`: the daemon's helper for a
/// container with `HostToContainer` host paths (`namespace::propagation`), whose agent listens
/// on SOCKET below the sandbox's SUPERVISOR; run single-threaded as the host's root before
/// each connection to that agent.
fn sync_host_mounts(args: &[String]) -> ExitCode {
    type Parsed = (
        std::path::PathBuf,
        libc::pid_t,
        Vec<namespace::propagation::FromHostPath>,
    );
    let parsed = (|| -> Result<Parsed, String> {
        let [socket, supervisor, rest @ ..] = args else {
            return Err("sync-host-mounts: expected SOCKET SUPERVISOR then triples".into());
        };
        let supervisor = supervisor
            .parse()
            .map_err(|_| format!("sync-host-mounts: {supervisor:?} is not a pid"))?;
        if rest.is_empty() || rest.len() % 3 != 0 {
            return Err("sync-host-mounts: expected SOURCE TARGET ro|rw triples".into());
        }
        let paths = rest
            .chunks(3)
            .map(|t| match t[2].as_str() {
                "ro" | "rw" => Ok(namespace::propagation::FromHostPath {
                    source: t[0].clone().into(),
                    target: t[1].clone().into(),
                    read_only: t[2] == "ro",
                }),
                other => Err(format!("sync-host-mounts: {other:?} is neither ro nor rw")),
            })
            .collect::<Result<_, _>>()?;
        Ok((socket.into(), supervisor, paths))
    })();
    let (socket, supervisor, paths) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("guest-init: {e}");
            return ExitCode::from(2);
        }
    };
    let synced = namespace::propagation::agent_of(&socket, supervisor)
        .and_then(|pid| namespace::propagation::sync(pid, &paths));
    match synced {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("guest-init: sync-host-mounts: {}", report::chain(&e));
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    // First, before any thread or child exists (see the reaper module).
    reaper::block_sigchld();
    let argv = arguments();
    if is_vm_init(sys::getpid(), &argv) {
        init::vm_main(&argv);
    }
    // A container's init and spawner (guest_init::container_init): no flags, no serving.
    let role = match argv.first().map(String::as_str) {
        Some("container-init") => {
            Some(("init", guest_init::container_init::init_main as fn() -> _))
        }
        Some("container-spawner") => Some((
            "spawner",
            guest_init::container_init::spawner_main as fn() -> _,
        )),
        _ => None,
    };
    if argv.first().map(String::as_str) == Some("sync-host-mounts") {
        return sync_host_mounts(&argv[1..]);
    }
    if let Some((name, run)) = role {
        if let Err(e) = namespace::harden_pid1() {
            eprintln!("guest-init: the container's {name}: {}", report::chain(&e));
            return ExitCode::FAILURE;
        }
        let e = run();
        eprintln!("guest-init: the container's {name}: {e}");
        return ExitCode::from(125);
    }
    let args = match parse_args(argv) {
        Ok(Some(a)) => a,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("guest-init: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(level) = args.log {
        log::set_level(level);
    }
    match &args.mode {
        Mode::Sandbox(spec) => {
            // Still single-threaded here, as entering requires. Returns only on failure.
            let argv = namespace::AgentArgv {
                pid1: pid1_argv(&args),
                container: container_argv(&args),
            };
            let Err(e) = namespace::enter(spec, &argv);
            eprintln!(
                "guest-init: making the sandbox failed: {}",
                report::chain(&e)
            );
            return ExitCode::FAILURE;
        }
        Mode::SandboxPid1 | Mode::SandboxContainer => {
            if let Some((name, device)) = &args.vm_root {
                // A microVM's container: PID 1 of its namespaces, its root still to build.
                if let Err(e) = guest_init::vm_containers::enter_root(name, device, &args.vm_shared)
                {
                    eprintln!(
                        "guest-init: container {name}: cannot build its root: {}",
                        report::chain(&e)
                    );
                    return ExitCode::FAILURE;
                }
                // The guest's root holds CAP_SYS_ADMIN: no no_new_privs needed. Its agent is
                // bound as well as its commands, as on the namespace backend.
                if !args.seccomp_filter.is_empty() {
                    if let Err(e) = namespace::seccomp::install_profile(&args.seccomp_filter) {
                        eprintln!(
                            "guest-init: container {name}: its seccomp profile: {}",
                            report::chain(&e)
                        );
                        return ExitCode::FAILURE;
                    }
                }
            }
            if let Err(e) = namespace::harden_pid1() {
                eprintln!("guest-init: {}", report::chain(&e));
                return ExitCode::FAILURE;
            }
            if args.container_factory {
                server::adopt_container_factory();
            }
            if let Some(mask) = args.command_capabilities {
                guest_init::spawn::bound_commands_to(mask);
            }
            if let Some(pid) = args.container_init {
                if let Err(e) = guest_init::container_init::adopt(pid) {
                    eprintln!("guest-init: the container's init (pid {pid}): {e}");
                    return ExitCode::FAILURE;
                }
            }
            // A container's agent that is not PID 1 joined the sandbox's root's PID namespace;
            // PID 1 is told when a container joins its own.
            let joined = matches!(args.mode, Mode::SandboxContainer) && sys::getpid() != 1;
            if args.shared_pids || joined {
                sys::share_pid_namespace();
            }
        }
        Mode::Plain => {}
    }
    if args.listen.is_none() && !args.selftest {
        eprintln!(
            "guest-init: not PID 1; use --listen unix:PATH to serve as a process (see --help)"
        );
        return ExitCode::from(2);
    }
    host_main(args)
}

/// Modes 2 and 3: a process serving on a socket (possibly PID 1 of a PID namespace).
fn host_main(args: Args) -> ExitCode {
    sys::ensure_stdio_open();
    if sys::getpid() != 1 {
        // Orphaned grandchildren come back to us, so our reaper collects them.
        if let Err(e) = sys::set_child_subreaper() {
            log::info(format_args!("cannot become a subreaper: {e}"));
        }
    }
    if let Err(e) = reaper::start_orphan_reaper() {
        eprintln!("guest-init: cannot start the orphan reaper: {e}");
        return ExitCode::FAILURE;
    }
    let exec = match ExecContext::new() {
        Ok(mut c) => {
            if matches!(args.mode, Mode::SandboxPid1 | Mode::SandboxContainer) {
                // The agent's OOM score is -1000 (set on entering); commands go back to 0.
                c.reset_oom_score = true;
                // Commands join their own cgroup, whose process limit leaves us room.
                c.cgroup_procs = namespace::take_commands_cgroup();
            }
            if let Some(limit) = args.memory_bytes {
                c.mem_total_bytes = limit;
            }
            c
        }
        Err(e) => {
            eprintln!("guest-init: cannot open /dev/null: {e}");
            return ExitCode::FAILURE;
        }
    };
    let agent: &'static Agent = Box::leak(Box::new(Agent {
        exec,
        shutdown: ShutdownAction::Exit,
        ready_uptime_ms: sys::uptime_ms(),
    }));
    if args.selftest {
        let (_, failed) = selftest::run(agent, &[]);
        return if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let Some(addr) = args.listen else {
        return ExitCode::from(2);
    };
    if let Some(uplink) = &args.egress {
        let uplink = match uplink {
            Address::Vsock(_, port) => Ok(egress::Uplink::Vsock(*port)),
            Address::Fd(fd) => server::adopt_fd(*fd).map(egress::Uplink::Descriptors),
            Address::Unix(_) => Err(std::io::Error::other("not an egress address")),
        };
        let started = uplink
            .map_err(|e| e.to_string())
            .and_then(|uplink| egress::start(uplink).map_err(|e| report::chain(&e)));
        if let Err(e) = started {
            eprintln!("guest-init: {e}");
            return ExitCode::FAILURE;
        }
    }
    let listener = match Listener::bind(&addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("guest-init: {}", report::chain(&e));
            return ExitCode::FAILURE;
        }
    };
    if let Some(ready) = &args.ready {
        if let Err(e) = server::send_hello(ready, &agent.hello()) {
            eprintln!("guest-init: {}", report::chain(&e));
            return ExitCode::FAILURE;
        }
    }
    init::print_ready_line(agent.ready_uptime_ms);
    let e = server::serve(listener, agent);
    eprintln!("guest-init: {}", report::chain(&e));
    ExitCode::FAILURE
}

/// The command line of the sandbox's PID 1: this binary in `sandbox-pid1` mode, serving on the
/// descriptors the `sandbox` half hands it.
fn pid1_argv(args: &Args) -> Vec<std::ffi::CString> {
    let mut argv = vec![
        "init".to_string(),
        "sandbox-pid1".into(),
        "--listen".into(),
        Address::Fd(namespace::PID1_LISTEN_FD).to_string(),
        "--ready".into(),
        Address::Fd(namespace::PID1_READY_FD).to_string(),
    ];
    if let Some(bytes) = args.memory_bytes {
        argv.extend(["--memory-bytes".into(), bytes.to_string()]);
    }
    if matches!(&args.mode, Mode::Sandbox(spec) if spec.egress_socket.is_some()) {
        argv.extend([
            "--egress".into(),
            Address::Fd(namespace::PID1_EGRESS_FD).to_string(),
        ]);
    }
    if matches!(&args.mode, Mode::Sandbox(spec) if spec.shares_pids()) {
        argv.push("--share-pid-namespace".into());
    }
    if let Some(level) = args.log {
        argv.extend(["--log".into(), level.as_str().into()]);
    }
    // None of these contains a NUL.
    argv.into_iter()
        .filter_map(|a| std::ffi::CString::new(a).ok())
        .collect()
}

/// The command line of each container's agent: this binary in `sandbox-container` mode,
/// serving on the descriptor the `sandbox` half hands it, with no ready socket (the daemon
/// learns it is up by connecting) and no egress uplink (its commands reach the sandbox's
/// proxy on the loopback they share).
fn container_argv(args: &Args) -> Vec<std::ffi::CString> {
    let mut argv = vec![
        "init".to_string(),
        "sandbox-container".into(),
        "--listen".into(),
        Address::Fd(namespace::PID1_LISTEN_FD).to_string(),
    ];
    if let Some(bytes) = args.memory_bytes {
        argv.extend(["--memory-bytes".into(), bytes.to_string()]);
    }
    if let Some(level) = args.log {
        argv.extend(["--log".into(), level.as_str().into()]);
    }
    // None of these contains a NUL.
    argv.into_iter()
        .filter_map(|a| std::ffi::CString::new(a).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn a_microvm_containers_root_is_only_for_a_container_agent_and_names_an_absolute_device() {
        let args = parse_args(words(
            "sandbox-container --vm-root db:/dev/vdb --vm-shared work:/data \
             --vm-shared-ro x:/a:b --listen vsock:2048 --ready fd:4",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(args.vm_root, Some(("db".into(), "/dev/vdb".into())));
        assert_eq!(
            args.vm_shared,
            [
                ("work".into(), "/data".into(), false),
                ("x".into(), "/a:b".into(), true)
            ]
        );
        for bad in [
            "--listen unix:/s --vm-root db:/dev/vdb",
            "sandbox-pid1 --listen fd:3 --vm-root db:/dev/vdb",
            "sandbox-container --listen fd:3 --vm-root db",
            "sandbox-container --listen fd:3 --vm-root :/dev/vdb",
            "sandbox-container --listen fd:3 --vm-shared work:data",
        ] {
            assert!(parse_args(words(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn pid_1_with_what_a_kernel_forwards_is_the_vm_init() {
        for forwarded in ["", "nomodule", "nomodule single -s", "--bogus x"] {
            assert!(is_vm_init(1, &words(forwarded)), "{forwarded:?}");
        }
        // The same words anywhere but PID 1 are not an init's.
        assert!(!is_vm_init(42, &words("nomodule")));
    }

    #[test]
    fn pid_1_that_names_a_mode_is_not_the_vm_init() {
        for own in [
            "sandbox-pid1 --listen fd:3",
            "sandbox --rootfs /r",
            "--listen unix:/tmp/a",
            "--listen=unix:/tmp/a",
            "--selftest",
        ] {
            assert!(!is_vm_init(1, &words(own)), "{own:?}");
        }
    }

    #[test]
    fn outside_the_vm_init_an_unknown_argument_is_still_an_error() {
        let e = parse_args(words("--listen unix:/tmp/a nomodule")).unwrap_err();
        assert!(e.contains("nomodule"), "{e}");
    }
}
