//! `guest-init`: crucible's guest agent. See `--help`.

use std::process::ExitCode;

use guest_init::exec::ExecContext;
use guest_init::log::{self, Level};
use guest_init::server::{self, Address, Agent, Listener, ShutdownAction};
use guest_init::{init, reaper, selftest, sys};

const HELP: &str = "\
guest-init: crucible's guest agent

USAGE:
    guest-init                                   (as PID 1 of a crucible microVM)
    guest-init --listen unix:PATH [--ready unix:PATH] [--log LEVEL]
    guest-init --selftest
    guest-init sandbox --rootfs DIR --runtime-dir DIR --hostname NAME [--scratch-mib N]
               [--memory-bytes N] [--cgroup FILE]... --listen unix:PATH [--ready unix:PATH]

MODES:
    With no --listen and running as PID 1, it is the VM's init: it mounts /proc, /sys, /dev,
    /run and /tmp, reads crucible.* settings from /proc/cmdline (port, ready_port, root, log,
    selftest, boot_marker, hostname), listens on vsock, sends its hello to the host (CID 2) and
    prints `crucible-agent: ready ...` on the console. It never exits: shutdown syncs and resets.

    With --listen it is a plain process serving the same protocol on ADDR (unix:PATH, or
    vsock:PORT). If --ready is given it connects there once it is listening and sends its hello
    (one length-prefixed JSON message), so the caller needs no polling. It reaps orphaned
    descendants (as a subreaper, or as PID 1 of a PID namespace). `shutdown` exits with 0.

    `sandbox` first makes the process PID 1 of a namespace sandbox (the daemon's namespace
    backend runs it this way): new PID, mount, UTS, IPC, network and cgroup namespaces, the
    image directory --rootfs read-only under a tmpfs overlay of --scratch-mib MiB as `/` (/tmp
    and /dev/shm share it), the host directory --runtime-dir at /run/crucible, the cgroups
    whose cgroup.procs files are given with --cgroup joined, every capability dropped and
    no_new_privs set; the sandbox dies with the process that started it. Then it serves as
    with --listen (paths are inside the sandbox). --memory-bytes is the sandbox's memory limit,
    for the OOM verdict.

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
    --selftest       run the self-test and exit
    -h, --help       this text
    -V, --version    the version
";

#[derive(Debug, Default)]
struct Args {
    listen: Option<Address>,
    ready: Option<Address>,
    log: Option<Level>,
    selftest: bool,
    sandbox: Option<namespace::SandboxSpec>,
    memory_bytes: Option<u64>,
}

fn number(flag: &str, text: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("{flag} needs a number, got {text:?}"))
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args::default();
    let mut it = std::env::args().skip(1).peekable();
    if it.peek().map(String::as_str) == Some("sandbox") {
        it.next();
        args.sandbox = Some(namespace::SandboxSpec {
            rootfs: Default::default(),
            runtime_dir: Default::default(),
            hostname: String::new(),
            scratch_mib: 1024,
            die_with_parent: true,
            cgroup_procs: Vec::new(),
        });
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
                args.log = Some(Level::parse(&v).ok_or(format!("bad --log level {v:?}"))?);
            }
            "--selftest" => args.selftest = true,
            "--memory-bytes" => args.memory_bytes = Some(number(&flag, &value(&flag)?)?),
            "--rootfs" | "--runtime-dir" | "--hostname" | "--scratch-mib" | "--cgroup" => {
                let v = value(&flag)?;
                let Some(spec) = args.sandbox.as_mut() else {
                    return Err(format!("{flag} is only valid after `sandbox` (see --help)"));
                };
                match flag.as_str() {
                    "--rootfs" => spec.rootfs = v.into(),
                    "--runtime-dir" => spec.runtime_dir = v.into(),
                    "--hostname" => spec.hostname = v,
                    "--scratch-mib" => spec.scratch_mib = number(&flag, &v)?,
                    _ => spec.cgroup_procs.push(v.into()),
                }
            }
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    if let Some(spec) = &args.sandbox {
        if spec.rootfs.as_os_str().is_empty() || spec.runtime_dir.as_os_str().is_empty() {
            return Err("sandbox needs --rootfs and --runtime-dir".into());
        }
        if args.listen.is_none() {
            return Err("sandbox needs --listen".into());
        }
    }
    Ok(Some(args))
}

fn main() -> ExitCode {
    // First, before any thread or child exists (see the reaper module).
    reaper::block_sigchld();
    let args = match parse_args() {
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
    if let Some(spec) = &args.sandbox {
        // Still single-threaded here, as entering requires.
        if let Err(e) = namespace::enter(spec) {
            eprintln!("guest-init: entering the sandbox failed: {}", chain(&e));
            return ExitCode::FAILURE;
        }
    }
    if args.listen.is_none() && !args.selftest {
        if sys::getpid() == 1 {
            init::vm_main();
        }
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
            if args.sandbox.is_some() {
                // The agent's OOM score is -1000 (set on entering); commands go back to 0.
                c.reset_oom_score = true;
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
        let (_, failed) = selftest::run(agent);
        return if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let Some(addr) = args.listen else {
        return ExitCode::from(2);
    };
    let listener = match Listener::bind(&addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("guest-init: {}", chain(&e));
            return ExitCode::FAILURE;
        }
    };
    if let Some(ready) = &args.ready {
        if let Err(e) = server::send_hello(ready, &agent.hello()) {
            eprintln!("guest-init: {}", chain(&e));
            return ExitCode::FAILURE;
        }
    }
    init::print_ready_line(agent.ready_uptime_ms);
    let e = server::serve(listener, agent);
    eprintln!("guest-init: {}", chain(&e));
    ExitCode::FAILURE
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
