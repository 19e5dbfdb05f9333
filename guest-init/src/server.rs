//! The request server: listeners (vsock or Unix), one thread per connection, dispatch of the
//! first message to exec, file transfer, ping or shutdown.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use wire::agent::{AgentReply, AgentRequest, Hello, PROTOCOL_VERSION};
use wire::{ErrorBody, MessageError};

use crate::exec::{self, ExecContext};
use crate::log;
use crate::sys;
use crate::vsock;
use crate::{archive, files};

/// Per-connection thread stack: the exec loop needs little, and there may be many.
const CONNECTION_STACK: usize = 256 * 1024;

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Creating or binding the listening socket failed.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Accepting a connection failed.
    #[error("accept failed")]
    Accept(#[source] io::Error),
    /// Sending the readiness hello failed.
    #[error("cannot send the hello to {addr}")]
    Ready {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Where to listen or connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A Unix stream socket path.
    Unix(PathBuf),
    /// A vsock (cid, port); the cid is ignored for listening.
    Vsock(u32, u32),
    /// An inherited descriptor: a listening socket (`--listen`) or a connected one (`--ready`),
    /// as a namespace sandbox's PID 1 receives them.
    Fd(RawFd),
}

impl Address {
    /// Parses `unix:PATH`, `vsock:PORT` / `vsock:CID:PORT` or `fd:N` (N above 2).
    pub fn parse(s: &str) -> Option<Address> {
        if let Some(path) = s.strip_prefix("unix:") {
            return (!path.is_empty()).then(|| Address::Unix(PathBuf::from(path)));
        }
        if let Some(fd) = s.strip_prefix("fd:") {
            return fd.parse().ok().filter(|fd| *fd > 2).map(Address::Fd);
        }
        let rest = s.strip_prefix("vsock:")?;
        match rest.split_once(':') {
            Some((cid, port)) => Some(Address::Vsock(cid.parse().ok()?, port.parse().ok()?)),
            None => Some(Address::Vsock(libc::VMADDR_CID_HOST, rest.parse().ok()?)),
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Vsock(cid, port) => write!(f, "vsock:{cid}:{port}"),
            Address::Fd(fd) => write!(f, "fd:{fd}"),
        }
    }
}

/// A listening socket of either kind.
#[derive(Debug)]
pub enum Listener {
    /// Unix stream socket.
    Unix(UnixListener),
    /// AF_VSOCK stream socket.
    Vsock(OwnedFd),
}

impl Listener {
    /// Binds and listens on `addr` (a stale Unix socket file is replaced).
    pub fn bind(addr: &Address) -> Result<Listener, ServerError> {
        let err = |source| ServerError::Listen {
            addr: addr.to_string(),
            source,
        };
        match addr {
            Address::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    use std::os::unix::fs::FileTypeExt;
                    if meta.file_type().is_socket() {
                        let _ = std::fs::remove_file(path);
                    }
                }
                Ok(Listener::Unix(UnixListener::bind(path).map_err(err)?))
            }
            Address::Vsock(_, port) => Ok(Listener::Vsock(
                vsock::listen(*port, LISTEN_BACKLOG).map_err(err)?,
            )),
            Address::Fd(fd) => {
                let fd = adopt(*fd).map_err(err)?;
                Ok(Listener::Unix(UnixListener::from(fd)))
            }
        }
    }

    /// The next connection. Vsock sockets are carried as `UnixStream`: the agent only uses
    /// read, write, shutdown, poll and non-blocking mode on them, which work on any stream
    /// socket.
    pub fn accept(&self) -> io::Result<UnixStream> {
        match self {
            Listener::Unix(l) => l.accept().map(|(s, _)| s),
            Listener::Vsock(fd) => {
                // SAFETY: accept4 with null address pointers only returns a new descriptor.
                let conn = sys::cvt(unsafe {
                    libc::accept4(
                        fd.as_raw_fd(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_CLOEXEC,
                    )
                })?;
                // SAFETY: accept4 returned a fresh descriptor that nobody else owns.
                Ok(UnixStream::from(unsafe { OwnedFd::from_raw_fd(conn) }))
            }
        }
    }
}

/// Takes ownership of an inherited descriptor, marking it close-on-exec so that no command
/// inherits it. Refuses a descriptor that is not open (nothing else may own it: it was
/// handed over to this process for this purpose).
fn adopt(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(F_SETFD) takes integers; it fails with EBADF on a closed descriptor.
    sys::cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) })?;
    // SAFETY: the descriptor is open and was given to this process to own (`--listen fd:N`).
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Takes ownership of an inherited descriptor (closed on exec from now on), as `fd:N`
/// addresses name them.
pub fn adopt_fd(fd: RawFd) -> io::Result<OwnedFd> {
    adopt(fd)
}

/// Connects to `addr` and sends `hello` (the readiness signal), then closes.
pub fn send_hello(addr: &Address, hello: &Hello) -> Result<(), ServerError> {
    let err = |source| ServerError::Ready {
        addr: addr.to_string(),
        source,
    };
    let mut stream = match addr {
        Address::Unix(path) => UnixStream::connect(path).map_err(err)?,
        Address::Vsock(cid, port) => {
            vsock::connect(*cid, *port, Duration::from_secs(5)).map_err(err)?
        }
        Address::Fd(fd) => UnixStream::from(adopt(*fd).map_err(err)?),
    };
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(err)?;
    wire::write_message(&mut stream, hello).map_err(|e| match e {
        MessageError::Io(io) => err(io),
        other => err(io::Error::other(other.to_string())),
    })
}

/// What `shutdown` does once answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownAction {
    /// Exit the process with status 0 (host process, namespace PID 1).
    Exit,
    /// sync and reset the machine (VM PID 1).
    Reboot,
}

/// Everything a connection handler needs.
#[derive(Debug)]
pub struct Agent {
    /// Exec settings.
    pub exec: ExecContext,
    /// What shutdown does.
    pub shutdown: ShutdownAction,
    /// The boot-time uptime reported in hellos.
    pub ready_uptime_ms: u64,
}

impl Agent {
    /// The agent's hello.
    pub fn hello(&self) -> Hello {
        Hello {
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            protocol: PROTOCOL_VERSION,
            kernel_release: sys::kernel_release(),
            uptime_ms: self.ready_uptime_ms,
            pid: sys::getpid(),
        }
    }

    /// Ends the agent (never returns).
    pub fn end(&self) -> ! {
        sys::sync();
        match self.shutdown {
            ShutdownAction::Exit => std::process::exit(0),
            ShutdownAction::Reboot => crate::power::end_vm(contract::boot_marker::Stop::Requested),
        }
    }
}

/// Connections the kernel holds for the agent before it accepts them: a burst of host
/// requests (the daemon opens one per exec) must not be reset while the agent catches up.
const LISTEN_BACKLOG: libc::c_int = 1024;

/// Idle threads kept blocked in `accept` beyond the one that must always be there.
const SPARE_ACCEPTORS: usize = 4;

/// Connection threads, leader/follower style: idle threads block in `accept` on the shared
/// listener themselves (the kernel hands each connection to one of them), so a connection
/// reaches its thread without a hand-off. A thread that takes a connection while no other is
/// left accepting starts a new one first, so one slow client never waits behind another.
#[derive(Debug)]
struct Workers {
    agent: &'static Agent,
    listener: &'static Listener,
    /// Threads currently blocked in (or about to enter) `accept`.
    accepting: AtomicUsize,
}

impl Workers {
    fn start(&'static self) -> io::Result<()> {
        std::thread::Builder::new()
            .name("conn".into())
            .stack_size(CONNECTION_STACK)
            .spawn(move || {
                let _ = self.work(false);
            })
            .map(drop)
    }

    /// Accepts and serves connections. The main thread (`forever`) only returns when
    /// accepting keeps failing; other threads return `None` when enough others are idle.
    fn work(&'static self, forever: bool) -> Option<ServerError> {
        let mut failures = 0u32;
        loop {
            self.accepting.fetch_add(1, Ordering::AcqRel);
            let accepted = self.listener.accept();
            if self.accepting.fetch_sub(1, Ordering::AcqRel) == 1 {
                // Nobody else is accepting now: make sure somebody is before we get busy.
                if let Err(e) = self.start() {
                    log::error(format_args!("cannot start a connection thread: {e}"));
                }
            }
            match accepted {
                Ok(conn) => {
                    failures = 0;
                    handle(conn, self.agent);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and friends are transient: back off instead of spinning.
                    log::error(format_args!("accept failed: {e}"));
                    failures += 1;
                    if failures > 100 && forever {
                        return Some(ServerError::Accept(e));
                    }
                    std::thread::sleep(Duration::from_millis(10 * u64::from(failures.min(100))));
                }
            }
            // Enough idle threads: let this one go. (If they all get busy at once, the last
            // one to leave `accept` starts a new thread, as above.)
            if !forever && self.accepting.load(Ordering::Acquire) > SPARE_ACCEPTORS {
                return None;
            }
        }
    }
}

/// Accepts connections forever, on this thread and the connection threads. Returns only if
/// accepting keeps failing.
pub fn serve(listener: Listener, agent: &'static Agent) -> ServerError {
    crate::spawn::raise_agent_fd_limit();
    let workers: &'static Workers = Box::leak(Box::new(Workers {
        agent,
        listener: Box::leak(Box::new(listener)),
        accepting: AtomicUsize::new(0),
    }));
    loop {
        if let Some(e) = workers.work(true) {
            return e;
        }
    }
}

/// The sandbox's container factory (a namespace sandbox's PID 1 has one), behind a lock: one
/// container is made at a time.
static FACTORY: std::sync::OnceLock<std::sync::Mutex<namespace::ContainerFactory>> =
    std::sync::OnceLock::new();

/// Takes the container factory handed at `namespace::PID1_FACTORY_FD`, if there is one.
/// Called once, by a namespace sandbox's PID 1 at startup.
pub fn adopt_container_factory() {
    if let Some(factory) = namespace::ContainerFactory::inherited() {
        let _ = FACTORY.set(std::sync::Mutex::new(factory));
    }
}

/// Receives the descriptors that follow an `add_container` request on `conn` (the image, the
/// listener, one mount per host path) and has the factory make the container; its agent's
/// pid.
fn add_container(
    conn: &UnixStream,
    name: &str,
    index: usize,
    (share_pids, command_is_pid1, security): (
        bool,
        bool,
        contract::container_security::ContainerSecurity,
    ),
    shared: &[wire::agent::SharedDir],
    host_paths: &[String],
) -> Result<i32, ErrorBody> {
    use std::os::fd::AsFd;
    let invalid = |why: String| ErrorBody::new("invalid_request", format!("add_container: {why}"));
    let factory = FACTORY
        .get()
        .ok_or_else(|| invalid(namespace::FactoryError::Missing.to_string()))?;
    conn.set_read_timeout(Some(UPLINK_WAIT))
        .map_err(|e| invalid(e.to_string()))?;
    if host_paths.len() > namespace::MAX_HOST_PATHS {
        return Err(invalid(format!(
            "{} host paths, more than {}",
            host_paths.len(),
            namespace::MAX_HOST_PATHS
        )));
    }
    let mut received = Vec::with_capacity(2);
    let mut host_mounts = Vec::with_capacity(host_paths.len());
    let names = ["the image", "the listener"]
        .into_iter()
        .map(str::to_string);
    let names = names.chain(host_paths.iter().map(|p| format!("the host path {p}")));
    for (i, what) in names.enumerate() {
        let fd = match namespace::recv_stream(conn.as_fd()) {
            Ok(Some(fd)) => fd,
            Ok(None) => return Err(invalid(format!("the host hung up before {what}"))),
            Err(e) => return Err(invalid(format!("receiving {what}: {e}"))),
        };
        match i {
            0 | 1 => received.push(fd),
            _ => host_mounts.push(fd),
        }
    }
    let shared = shared
        .iter()
        .map(|dir| {
            let mount = namespace::SharedMount {
                owner: name.to_string(),
                dir: dir.name.clone(),
                target: dir.path.clone().into(),
                read_only: dir.read_only,
            };
            mount.check().map(|()| mount)
        })
        .collect::<Result<Vec<_>, String>>()
        .map_err(|why| invalid(format!("shared: {why}")))?;
    let listener = received.pop();
    let image = received.pop();
    let (Some(image), Some(listener)) = (image, listener) else {
        return Err(invalid("two descriptors were expected".into()));
    };
    let pid = factory
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .add(
            &namespace::AddRequest {
                index,
                name: name.to_string(),
                share_pids,
                command_is_pid1,
                security,
                shared,
                host_paths: host_paths.to_vec(),
            },
            image,
            listener,
            host_mounts,
        )
        .map_err(|e| {
            let code = match e {
                namespace::FactoryError::Missing => "invalid_request",
                _ => "io_error",
            };
            ErrorBody::new(
                code,
                format!("add_container {name:?}: {}", report::chain(&e)),
            )
        })?;
    // Its pid is the factory's view: the agent is in a PID namespace beside this one, which
    // no signal of this agent's reaches.
    log::info(format_args!(
        "container {name} added: its agent is pid {pid} in the sandbox's first PID namespace"
    ));
    Ok(pid)
}

/// How a microVM's container is made: in PID 1's PID namespace or not, from which disk, under
/// which seccomp profile of its own (packed instructions; empty: none).
struct VmMember<'a> {
    share_pids: bool,
    disk: &'a wire::agent::ContainerDisk,
    seccomp_filter: &'a [u64],
}

/// Starts container `name` of a microVM from its image on its disk; its agent's pid.
fn add_vm_container(
    name: &str,
    index: usize,
    member: VmMember<'_>,
    shared: &[wire::agent::SharedDir],
) -> Result<i32, ErrorBody> {
    let VmMember {
        share_pids,
        disk,
        seccomp_filter,
    } = member;
    let serial = disk.serial.as_str();
    let invalid = |why: String| ErrorBody::new("invalid_request", format!("add_container: {why}"));
    let container = contract::cmdline::VmContainer {
        name: name.to_string(),
        serial: serial.to_string(),
        share_pids,
    };
    if !container.is_valid() {
        return Err(invalid(format!(
            "{name:?} on disk {serial:?} is not a container name on a disk serial"
        )));
    }
    let shared = shared
        .iter()
        .map(|dir| {
            let mount = contract::cmdline::VmShared {
                owner: name.to_string(),
                name: dir.name.clone(),
                target: dir.path.trim_end_matches('/').to_string(),
                read_only: dir.read_only,
            };
            match mount.is_valid() {
                true => Ok(mount),
                false => Err(invalid(format!(
                    "shared: {:?} at {:?} is not a directory name at an absolute path below /",
                    dir.name, dir.path
                ))),
            }
        })
        .collect::<Result<Vec<_>, ErrorBody>>()?;
    let pid = crate::vm_containers::add(&container, index, disk.sectors, &shared, seccomp_filter)
        .map_err(|e| {
        ErrorBody::new(
            "io_error",
            format!("add_container {name:?}: {}", report::chain(&e)),
        )
    })?;
    sys::spare_from_signals([pid]);
    log::info(format_args!(
        "container {name} added from {serial}: its agent is pid {pid}"
    ));
    Ok(pid)
}

/// How long the host may take to send the descriptor an `egress_uplink` announces.
const UPLINK_WAIT: Duration = Duration::from_secs(5);

/// Receives the descriptor that follows an `egress_uplink` request on `conn` and makes it the
/// proxy's uplink.
fn receive_uplink(conn: &UnixStream) -> Result<(), String> {
    use std::os::fd::AsFd;
    conn.set_read_timeout(Some(UPLINK_WAIT))
        .map_err(|e| format!("egress_uplink: {e}"))?;
    let uplink = match namespace::recv_stream(conn.as_fd()) {
        Ok(Some(fd)) => fd,
        Ok(None) => return Err("egress_uplink: the host hung up before the descriptor".into()),
        Err(e) => return Err(format!("egress_uplink: receiving the descriptor: {e}")),
    };
    crate::egress::replace_uplink(uplink).map_err(|e| format!("egress_uplink: {e}"))?;
    log::info(format_args!("egress: a new daemon's uplink is in use"));
    Ok(())
}

/// Serves one connection: reads the request and answers it.
pub fn handle(mut conn: UnixStream, agent: &Agent) {
    let request: AgentRequest = match wire::read_message(&mut conn) {
        Ok(r) => r,
        Err(MessageError::Closed) => return,
        Err(e) => {
            log::debug(format_args!("bad request: {e}"));
            let body = ErrorBody::new("invalid_request", format!("bad request: {e}"));
            let _ = wire::write_message(&mut conn, &AgentReply::Error(body));
            return;
        }
    };
    match request {
        AgentRequest::Exec {
            request,
            interactive,
            user,
            tail_bytes,
        } => {
            log::debug(format_args!("exec {:?}", request.cmd));
            if let Err(e) = exec::run(
                conn,
                &request,
                interactive,
                user.as_ref(),
                tail_bytes,
                &agent.exec,
            ) {
                log::debug(format_args!(
                    "exec {:?}: {}",
                    request.cmd,
                    report::chain(&e)
                ));
            }
        }
        AgentRequest::PutFiles { path } => put_files(conn, &path),
        AgentRequest::GetFile { path } => {
            let reply = match files::open_for_get(&path) {
                Ok(out) => {
                    let header = AgentReply::File {
                        size: out.size(),
                        mode: Some(out.mode),
                        modified: Some(out.modified),
                    };
                    if wire::write_message(&mut conn, &header).is_ok() {
                        if let Err(e) = out.send(&mut conn) {
                            log::debug(format_args!("get_file {path}: {e}"));
                        }
                    }
                    return;
                }
                Err(e) => AgentReply::Error(e.to_body()),
            };
            let _ = wire::write_message(&mut conn, &reply);
        }
        AgentRequest::GetTree { path } => {
            let reply = match archive::open_tree(&path) {
                Ok(tree) => {
                    if wire::write_message(&mut conn, &AgentReply::Tree).is_ok() {
                        if let Err(e) = archive::send_tree(&tree, &mut conn) {
                            log::debug(format_args!("get_tree {path}: {e}"));
                        }
                    }
                    return;
                }
                Err(e) => AgentReply::Error(e.to_body()),
            };
            let _ = wire::write_message(&mut conn, &reply);
        }
        AgentRequest::Attach {
            exec_id,
            offset,
            stdin,
        } => {
            let Ok(reply_conn) = conn.try_clone() else {
                return;
            };
            if let Err(e) = crate::exec_registry::attach(&exec_id, conn, offset, stdin) {
                log::debug(format_args!("attach {exec_id:?}: {}", report::chain(&e)));
                let mut reply_conn = reply_conn;
                let _ = wire::write_message(&mut reply_conn, &AgentReply::Error(e.to_body()));
            }
        }
        AgentRequest::Execs { exec_id } => {
            let execs = crate::exec_registry::statuses(exec_id.as_deref());
            let reply = match exec_id {
                Some(id) if execs.is_empty() => AgentReply::Error(ErrorBody::new(
                    "not_found",
                    format!(
                        "no command has exec_id {id:?} (it never ran, or its result was collected)"
                    ),
                )),
                _ => AgentReply::Execs(wire::ExecList { execs }),
            };
            let _ = wire::write_message(&mut conn, &reply);
        }
        AgentRequest::Ping => {
            let _ = wire::write_message(&mut conn, &AgentReply::Pong(agent.hello()));
        }
        AgentRequest::ProbeTcp { port } => {
            let open = [
                std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
                std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            ]
            .into_iter()
            .any(|ip| {
                let address = std::net::SocketAddr::new(ip, port);
                std::net::TcpStream::connect_timeout(&address, PROBE_TIMEOUT).is_ok()
            });
            let _ = wire::write_message(&mut conn, &AgentReply::Probed { open });
        }
        AgentRequest::ConnectTcp {
            port,
            wildcard_only,
        } => crate::inbound::connect_tcp(conn, port, wildcard_only),
        AgentRequest::EgressUplink => {
            let reply = match receive_uplink(&conn) {
                Ok(()) => AgentReply::EgressUplinked,
                Err(why) => AgentReply::Error(ErrorBody::new("invalid_request", why)),
            };
            let _ = wire::write_message(&mut conn, &reply);
        }
        AgentRequest::AddContainer {
            name,
            index,
            shared,
            share_pids,
            command_is_pid1,
            disk,
            security,
            host_paths,
        } => {
            if share_pids {
                // Before it exists: a signal to the sandbox must never reach it.
                sys::share_pid_namespace();
            }
            let security = match security.as_str() {
                "" => Ok(Default::default()),
                text => text.parse::<contract::container_security::ContainerSecurity>(),
            };
            let added = match (disk, security) {
                (_, Err(why)) => Err(ErrorBody::new(
                    "invalid_request",
                    format!("add_container {name:?}: {why}"),
                )),
                (_, Ok(_)) if command_is_pid1 && share_pids => Err(ErrorBody::new(
                    "invalid_request",
                    format!(
                        "add_container {name:?}: a container joining the root's PID namespace \
                         cannot have its command as PID 1 there"
                    ),
                )),
                (Some(_), Ok(_)) if command_is_pid1 => Err(ErrorBody::new(
                    "invalid_request",
                    format!(
                        "add_container {name:?}: in a microVM a container's agent is its PID 1"
                    ),
                )),
                (Some(_), Ok(_)) if !host_paths.is_empty() => Err(ErrorBody::new(
                    "invalid_request",
                    format!("add_container {name:?}: a microVM's containers mount no host path"),
                )),
                (Some(_), Ok(security)) if !security.is_only_seccomp() => Err(ErrorBody::new(
                    "invalid_request",
                    format!(
                        "add_container {name:?}: a microVM's containers take no security \
                         settings but a seccomp profile ({security})"
                    ),
                )),
                (Some(disk), Ok(security)) => {
                    let vm = VmMember {
                        share_pids,
                        disk: &disk,
                        seccomp_filter: &security.seccomp_filter,
                    };
                    add_vm_container(&name, index, vm, &shared)
                }
                (None, Ok(security)) => {
                    let member = (share_pids, command_is_pid1, security);
                    add_container(&conn, &name, index, member, &shared, &host_paths)
                }
            };
            let reply = match added {
                Ok(pid) => AgentReply::ContainerAdded { pid },
                Err(body) => AgentReply::Error(body),
            };
            let _ = wire::write_message(&mut conn, &reply);
        }
        AgentRequest::ReleaseDisk { disk } => {
            let reply = match crate::vm_containers::await_released(&disk) {
                Ok(()) => AgentReply::DiskReleased,
                Err(e @ crate::vm_containers::VmContainerError::NoDisk { .. }) => {
                    AgentReply::Error(ErrorBody::new("not_found", report::chain(&e)))
                }
                Err(e) => AgentReply::Error(ErrorBody::new("io_error", report::chain(&e))),
            };
            let _ = wire::write_message(&mut conn, &reply);
        }
        AgentRequest::Stats => {
            let reply = match crate::guest_stats::read(
                std::path::Path::new("/proc"),
                std::path::Path::new(crate::guest_stats::COMMANDS_MEMORY_EVENTS),
            ) {
                Ok(stats) => AgentReply::Stats(stats),
                Err(e) => AgentReply::Error(ErrorBody::new("io_error", format!("stats: {e}"))),
            };
            let _ = wire::write_message(&mut conn, &reply);
        }
        AgentRequest::ProcessStats => {
            // In a shared PID namespace `/proc` shows the other members' processes too; in a
            // microVM pod PID 1's shows every member's, and `main`'s are in its namespaces.
            let own_mounts = match crate::main_ns::get() {
                Some(main) => Some(main.mounts_link().to_path_buf()),
                None => sys::shares_pid_namespace()
                    .then(|| std::fs::read_link("/proc/self/ns/mnt").ok())
                    .flatten(),
            };
            let proc = std::path::Path::new("/proc");
            let reply = match crate::guest_stats::read_processes(proc, own_mounts.as_deref()) {
                Ok(stats) => AgentReply::Stats(stats),
                Err(e) => AgentReply::Error(ErrorBody::new(
                    "io_error",
                    format!("process stats from /proc: {e}"),
                )),
            };
            let _ = wire::write_message(&mut conn, &reply);
        }
        AgentRequest::Signal { signal, exec_id } => {
            let reply = match exec_id {
                Some(exec_id) => match crate::exec_ids::signal(&exec_id, signal) {
                    Ok(()) => AgentReply::Signaled,
                    Err(e @ crate::exec_ids::ExecIdError::NotRunning(_)) => {
                        AgentReply::Error(ErrorBody::new("not_found", report::chain(&e)))
                    }
                    Err(e) => {
                        AgentReply::Error(ErrorBody::new("invalid_request", report::chain(&e)))
                    }
                },
                None => match crate::sys::signal_all_but_self(signal) {
                    Ok(()) => AgentReply::Signaled,
                    Err(e) => AgentReply::Error(ErrorBody::new(
                        "invalid_request",
                        format!("signal {signal}: {e}"),
                    )),
                },
            };
            let _ = wire::write_message(&mut conn, &reply);
        }
        AgentRequest::Shutdown => {
            log::info(format_args!("shutdown requested"));
            let _ = wire::write_message(&mut conn, &AgentReply::ShuttingDown);
            let _ = conn.shutdown(std::net::Shutdown::Write);
            await_hang_up(&mut conn, SHUTDOWN_LINGER);
            drop(conn);
            agent.end();
        }
    }
}

/// How long a `probe_tcp` waits for each connection.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long the agent waits, once it has answered `shutdown`, for the host to hang up.
const SHUTDOWN_LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// Waits (at most `limit`) until the peer closes `conn`. In a VM the answer to `shutdown`
/// travels through the vsock driver's queue after `write` returns; resetting the machine at
/// once could drop it (the host then saw the connection close without an answer). The host
/// closes once it has read the answer, so its hang-up is the acknowledgement.
fn await_hang_up(conn: &mut UnixStream, limit: std::time::Duration) {
    let deadline = std::time::Instant::now() + limit;
    let mut sink = [0u8; 256];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match std::io::Read::read(conn, &mut sink) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn put_files(mut conn: UnixStream, path: &str) {
    let reply = match files::put_files(&mut conn, path) {
        Ok(result) => AgentReply::Files(result),
        Err(e) => AgentReply::Error(e.to_body()),
    };
    if wire::write_message(&mut conn, &reply).is_err() {
        return;
    }
    // The host may still be sending (after a refusal, or trailing padding): tell it we are done
    // and drain until it closes, so that it does not see a reset before reading the reply.
    let _ = conn.shutdown(std::net::Shutdown::Write);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut sink = [0u8; 16 * 1024];
    while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
    let _ = conn.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(
            Address::parse("unix:/tmp/a.sock"),
            Some(Address::Unix("/tmp/a.sock".into()))
        );
        assert_eq!(Address::parse("vsock:1024"), Some(Address::Vsock(2, 1024)));
        assert_eq!(Address::parse("vsock:3:5"), Some(Address::Vsock(3, 5)));
        assert_eq!(Address::parse("unix:"), None);
        assert_eq!(Address::parse("tcp:1"), None);
        assert_eq!(Address::parse("fd:3"), Some(Address::Fd(3)));
        assert_eq!(Address::parse("fd:2"), None, "never stdio");
        assert_eq!(Address::parse("fd:x"), None);
    }
}
