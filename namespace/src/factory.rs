//! The container factory: makes the containers added to a sandbox after it was created.
//!
//! A container is built by a process holding `CAP_SYS_ADMIN` in the sandbox's user namespace
//! on the sandbox's scratch, which no command of the sandbox may hold or see. At creation the
//! sandbox's PID 1-to-be has both, for a moment (`container::start_all`); once it is the agent
//! it has neither. So before it pivots it clones this factory, which keeps both for the
//! sandbox's life and does nothing else:
//! - its own mount namespace, pivoted into the scratch: it sees no host path, only what the
//!   containers are made of (their layers, the shared directories), plus a `/proc` and `/dev`
//!   for the containers to mount again;
//! - undumpable, with memory that belongs to the host's user namespace (it was never executed
//!   inside): nothing in the sandbox, root included, can ptrace it or open its
//!   `/proc/PID/{fd,root,ns,mem}`;
//! - no descriptor but its connection to PID 1 and the agent binary; it takes requests from
//!   PID 1 alone, each with the container's image (an idmapped mount the host made) and its
//!   agent's listening socket (bound on the host), and answers with the new agent's pid.
//!
//! A command running as the sandbox's root can still signal it (same user): then adding a
//! container fails with an error saying so, and nothing else of the sandbox changes.
//!
//! The exchange with PID 1, on a stream socket pair: the image and the listener, each one
//! byte carrying the descriptor ([`crate::send_stream`]), then the request as text (a
//! little-endian `u32` length, then `INDEX\nNAME\n`, `pids …`, `security …`, one
//! `host TARGET\n` per host path and one `OWNER:DIR:TARGET\n` per shared mount), then each
//! host path's mount (made by the host) the same way as the image; the answer is text the
//! same way: `ok PID` or `error WHY`.

use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::container::{self, Layout};
use crate::sys::{self, SysError};
use contract::container_security::ContainerSecurity;

use crate::{mounts, pod, SharedMount};

/// The longest request or answer text: a name, an index and a few shared mounts fit many
/// times over.
const MAX_TEXT: u32 = 64 * 1024;

pub use contract::container_security::MAX_HOST_PATHS;

/// How long PID 1 waits for the factory: building a container takes milliseconds; a factory
/// that takes longer was stopped by a process of the sandbox.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// Why a container could not be added.
#[derive(Debug, thiserror::Error)]
pub enum FactoryError {
    /// This process was handed no factory (it is not a namespace sandbox's PID 1).
    #[error("this agent has no container factory: only a namespace sandbox's PID 1 has one")]
    Missing,
    /// The factory is gone, stopped or out of step.
    #[error(
        "the sandbox's container factory does not answer ({why}): a process of the sandbox may \
         have killed or stopped it; the sandbox's other containers are unaffected"
    )]
    Gone {
        /// What happened on the connection.
        why: String,
    },
    /// The factory could not make the container.
    #[error("{0}")]
    Refused(String),
}

/// Starts the factory while the caller (the sandbox's PID 1-to-be) is single-threaded, in the
/// sandbox's first mount namespace with the scratch as its working directory. Returns PID 1's
/// end of the connection to it.
/// `commands_cgroup` is the commands' `cgroup.procs`, which it hands each container's agent.
/// It stays in the sandbox's first PID namespace and keeps `namespaces` to make each
/// container in a PID namespace of its own, or in the root's when the request says so.
pub(crate) fn start(
    agent: &OwnedFd,
    argv: &[CString],
    commands_cgroup: Option<RawFd>,
    namespaces: crate::PidNamespaces,
) -> Result<OwnedFd, SysError> {
    let (ours, theirs) =
        UnixStream::pair().map_err(|e| SysError::io("socketpair for the container factory", e))?;
    match sys::clone_factory()? {
        sys::Forked::Parent(_) => {
            drop(theirs);
            Ok(OwnedFd::from(ours))
        }
        sys::Forked::Child => {
            drop(ours);
            let e = become_factory(theirs, agent, argv, commands_cgroup, namespaces);
            eprintln!(
                "guest-init: the container factory failed: {}",
                report::chain(&e)
            );
            sys::exit_now(125)
        }
    }
}

/// The factory's side: returns only with the reason it could not start or go on.
fn become_factory(
    socket: UnixStream,
    agent: &OwnedFd,
    argv: &[CString],
    commands_cgroup: Option<RawFd>,
    namespaces: crate::PidNamespaces,
) -> SysError {
    let step = move || -> Result<std::convert::Infallible, SysError> {
        sys::set_undumpable_as(c"pod-factory")?;
        // Never executed inside, it still has the supervisor's command line (host paths:
        // the runtime directory, the cgroups), which /proc/PID/cmdline shows anyone.
        blank_command_line()?;
        // High numbers: a container's agent gets its listener at descriptor 3, and the
        // agent binary and the error pipe must not be in the way of that.
        let socket = UnixStream::from(move_high(OwnedFd::from(socket))?);
        let agent = move_high(
            agent
                .try_clone()
                .map_err(|e| SysError::io("dup the agent", e))?,
        )?;
        let commands_cgroup = commands_cgroup
            .map(|fd| {
                // SAFETY: the supervisor's descriptor stays open while we duplicate it.
                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
                fd.try_clone_to_owned()
                    .map_err(|e| SysError::io("dup the commands' cgroup", e))
                    .and_then(move_high)
            })
            .transpose()?;
        let namespaces = crate::PidNamespaces {
            first: move_high(namespaces.first)?,
            main: move_high(namespaces.main)?,
        };
        let mut kept = vec![
            socket.as_raw_fd(),
            agent.as_raw_fd(),
            namespaces.first.as_raw_fd(),
            namespaces.main.as_raw_fd(),
        ];
        kept.extend(commands_cgroup.as_ref().map(AsRawFd::as_raw_fd));
        sys::close_all_but(&kept)?;
        mounts::prepare_factory_root()?;
        mounts::pivot_into(Path::new("."))?;
        // Containers are its children: reaped by the kernel, never zombies.
        // SAFETY: signal() with SIG_IGN installs no handler.
        unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
        let launch = Launch {
            agent: &agent,
            argv,
            commands_cgroup: commands_cgroup.as_ref().map(AsRawFd::as_raw_fd),
            namespaces: &namespaces,
        };
        serve(&socket, &launch)
    };
    match step() {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

/// Overwrites this process's command line in place with `pod-factory` (what `ps` and
/// `/proc/PID/cmdline` show), as setproctitle does: the bytes between the `arg_start` and
/// `arg_end` that `/proc/self/stat` gives.
fn blank_command_line() -> Result<(), SysError> {
    let stat = std::fs::read_to_string("/proc/self/stat")
        .map_err(|e| SysError::io("read /proc/self/stat", e))?;
    // Fields 48 and 49 (arg_start, arg_end), counted after the command name's `)`, which
    // ends field 2.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<usize> = after_name
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let (Some(&start), Some(&end)) = (fields.get(48 - 3), fields.get(49 - 3)) else {
        return Err(SysError::io(
            "find the command line in /proc/self/stat",
            io::ErrorKind::InvalidData.into(),
        ));
    };
    let len = end.saturating_sub(start);
    if start == 0 || len == 0 {
        return Ok(());
    }
    let mut blank = vec![0u8; len];
    let name = b"pod-factory";
    let shown = name.len().min(len - 1);
    blank[..shown].copy_from_slice(&name[..shown]);
    // SAFETY: [arg_start, arg_end) is this process's own argument area on its initial stack,
    // mapped readable and writable for its whole life, `len` bytes long; nothing here reads
    // it afterwards (the agent's arguments were parsed into owned strings before the clone,
    // and the factory never asks for them again).
    unsafe { std::ptr::copy_nonoverlapping(blank.as_ptr(), start as *mut u8, len) };
    Ok(())
}

/// What a container's agent is started from.
struct Launch<'a> {
    /// The agent binary.
    agent: &'a OwnedFd,
    /// Its command line.
    argv: &'a [CString],
    /// The commands' `cgroup.procs`, handed to it.
    commands_cgroup: Option<RawFd>,
    /// The sandbox's PID namespaces: a container joining the root's is made there.
    namespaces: &'a crate::PidNamespaces,
}

/// Answers PID 1's requests until it hangs up (then exits).
fn serve(socket: &UnixStream, launch: &Launch<'_>) -> Result<std::convert::Infallible, SysError> {
    loop {
        let image = match receive_fd(socket)? {
            Some(fd) => fd,
            None => sys::exit_now(0),
        };
        let listener = receive_fd(socket)?.ok_or_else(|| {
            SysError::io("receive a listener", io::ErrorKind::UnexpectedEof.into())
        })?;
        let text =
            read_text(&mut &*socket).map_err(|e| SysError::io("read a request from PID 1", e))?;
        // Counted on the bare text, valid or not, so that the exchange stays in step.
        let host_count = text.lines().filter(|l| l.starts_with("host ")).count();
        if host_count > MAX_HOST_PATHS {
            return Err(SysError::io(
                format!("a request with {host_count} host paths (at most {MAX_HOST_PATHS})"),
                io::ErrorKind::InvalidData.into(),
            ));
        }
        let mut host_mounts = Vec::with_capacity(host_count);
        for _ in 0..host_count {
            host_mounts.push(receive_fd(socket)?.ok_or_else(|| {
                SysError::io("receive a host path", io::ErrorKind::UnexpectedEof.into())
            })?);
        }
        let answer = match make(&text, image, listener, host_mounts, launch) {
            Ok(pid) => format!("ok {pid}"),
            Err(why) => format!("error {why}"),
        };
        write_text(&mut &*socket, &answer).map_err(|e| SysError::io("answer PID 1", e))?;
    }
}

fn receive_fd(socket: &UnixStream) -> Result<Option<OwnedFd>, SysError> {
    loop {
        match crate::recv_stream(socket.as_fd()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map_err(|e| SysError::io("receive a descriptor from PID 1", e)),
        }
    }
}

/// One request to the factory: the container to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddRequest {
    /// Its place among every container the sandbox ever had (never reused).
    pub index: usize,
    /// Its name.
    pub name: String,
    /// It joins the root's PID namespace.
    pub share_pids: bool,
    /// Its first command is PID 1 of its own PID namespace ([`crate::container_init`]).
    pub command_is_pid1: bool,
    /// What its processes may do, within the sandbox's rules.
    pub security: ContainerSecurity,
    /// Its shared mounts (their owner is the container).
    pub shared: Vec<SharedMount>,
    /// Where its host paths go, in the order of their mounts.
    pub host_paths: Vec<String>,
}

/// Checks where a host path goes in a container: a plain absolute path
/// ([`contract::container_security::check_path`]), not in `/proc`, `/dev` or `/sys`.
pub fn check_host_path_target(target: &str) -> Result<(), String> {
    contract::container_security::check_path(target)?;
    crate::extra_mount::check_target(target)
}

impl AddRequest {
    fn encode(&self) -> String {
        let pids = match (self.share_pids, self.command_is_pid1) {
            (true, _) => "pids shared",
            (false, true) => "pids own, command is pid 1",
            (false, false) => "pids own",
        };
        let mut text = format!(
            "{}\n{}\n{pids}\nsecurity {}\n",
            self.index, self.name, self.security
        );
        for target in &self.host_paths {
            text.push_str(&format!("host {target}\n"));
        }
        for mount in &self.shared {
            text.push_str(&format!("{mount}\n"));
        }
        text
    }

    fn decode(text: &str) -> Result<Self, String> {
        let mut lines = text.lines();
        let index = lines
            .next()
            .and_then(|l| l.parse().ok())
            .ok_or("the request has no index")?;
        let name = lines.next().ok_or("the request has no name")?.to_string();
        pod::check_name(&name, "a container's name")?;
        let (share_pids, command_is_pid1) = match lines.next() {
            Some("pids shared") => (true, false),
            Some("pids own") => (false, false),
            Some("pids own, command is pid 1") => (false, true),
            other => return Err(format!("the request's PID namespace is {other:?}")),
        };
        let security = lines
            .next()
            .and_then(|line| line.strip_prefix("security "))
            .ok_or("the request has no security line")?
            .parse()?;
        let mut lines = lines.peekable();
        let mut host_paths = Vec::new();
        while let Some(target) = lines.next_if(|l| l.starts_with("host ")) {
            let target = &target["host ".len()..];
            check_host_path_target(target).map_err(|why| format!("host path: {why}"))?;
            host_paths.push(target.to_string());
        }
        let shared = lines
            .map(|line| {
                let mount: SharedMount = line.parse()?;
                if mount.owner != name {
                    return Err(format!("shared mount {line:?} is not container {name:?}'s"));
                }
                Ok(mount)
            })
            .collect::<Result<_, String>>()?;
        Ok(AddRequest {
            index,
            name,
            share_pids,
            command_is_pid1,
            security,
            shared,
            host_paths,
        })
    }

    /// Where the container is built: its index and name, with a `.` no name has, so that it
    /// never meets a directory of a container made with the sandbox (`c/NAME`) or a removed
    /// one of the same name.
    fn dir(&self) -> PathBuf {
        Path::new("c").join(format!("{}.{}", self.index, self.name))
    }
}

/// Makes one container; its agent's pid, or why not.
fn make(
    text: &str,
    image: OwnedFd,
    listener: OwnedFd,
    host_mounts: Vec<OwnedFd>,
    launch: &Launch<'_>,
) -> Result<libc::pid_t, String> {
    let request = AddRequest::decode(text)?;
    let host_paths: Vec<(OwnedFd, String)> = host_mounts
        .into_iter()
        .zip(request.host_paths.iter().cloned())
        .collect();
    let dir = request.dir();
    if dir.exists() {
        return Err(format!("{} is in use on the scratch", dir.display()));
    }
    for mount in &request.shared {
        mounts::make_shared_dir(&mount.dir).map_err(|e| report::chain(&e))?;
    }
    let (errors_in, errors_out) = error_pipe().map_err(|e| report::chain(&e))?;
    let argv = container::agent_argv(launch.argv, &request.security);
    let layout = Layout {
        name: request.name.clone(),
        dir,
        shared: request.shared,
        security: request.security,
        host_paths,
        command_is_pid1: request.command_is_pid1,
    };
    let forked = if request.share_pids {
        in_pid_namespace(&launch.namespaces.main, &launch.namespaces.first, || {
            sys::clone_container(true)
        })
    } else {
        sys::clone_container(false)
    };
    match forked.map_err(|e| report::chain(&e))? {
        sys::Forked::Parent(pid) => {
            drop((errors_out, image, listener));
            let mut why = String::new();
            let _ = std::fs::File::from(errors_in).read_to_string(&mut why);
            if why.is_empty() {
                Ok(pid)
            } else {
                Err(why)
            }
        }
        sys::Forked::Child => {
            drop(errors_in);
            // An ignored SIGCHLD survives execve: the agent must see its commands exit.
            // SAFETY: signal() with SIG_DFL installs no handler.
            unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
            let errors_out = move_high(errors_out).ok();
            let raw_listener = listener.as_raw_fd();
            let commands_cgroup = launch.commands_cgroup;
            let hand = move |init: &[(RawFd, RawFd)]| {
                sys::hand_to_agent(raw_listener, commands_cgroup, init)
            };
            let e = container::become_container(&layout, image, launch.agent, hand, &argv);
            let why = format!(
                "making container {} failed: {}",
                layout.name,
                report::chain(&e)
            );
            if let Some(out) = errors_out {
                let _ = std::fs::File::from(out).write_all(why.as_bytes());
            }
            sys::exit_now(125)
        }
    }
}

/// Runs `fork` with the caller's children going to PID namespace `there`, then back to `home`
/// (the caller's own).
fn in_pid_namespace(
    there: &OwnedFd,
    home: &OwnedFd,
    fork: impl FnOnce() -> Result<sys::Forked, SysError>,
) -> Result<sys::Forked, SysError> {
    sys::enter_pid_namespace_for_children(there.as_fd())?;
    let forked = fork();
    if let Ok(sys::Forked::Child) = forked {
        return forked;
    }
    sys::enter_pid_namespace_for_children(home.as_fd())?;
    forked
}

/// A close-on-exec pipe: the container writes why it failed to the second end; the first
/// reads nothing but its end once the container's agent is executed.
fn error_pipe() -> Result<(OwnedFd, OwnedFd), SysError> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    let ret = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    sys::check(ret, || "pipe for the container's errors".into())?;
    // SAFETY: pipe2 succeeded: both descriptors are new and ours alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `fd` moved to descriptor 16 or above, close-on-exec.
fn move_high(fd: OwnedFd) -> Result<OwnedFd, SysError> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes integers and returns a new descriptor.
    let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 16) };
    sys::check(high, || format!("move descriptor {} up", fd.as_raw_fd()))?;
    // SAFETY: fcntl succeeded: `high` is a new descriptor, ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

fn write_text(to: &mut impl Write, text: &str) -> io::Result<()> {
    let len = u32::try_from(text.len())
        .ok()
        .filter(|&n| n <= MAX_TEXT)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "text too long"))?;
    let mut message = len.to_le_bytes().to_vec();
    message.extend_from_slice(text.as_bytes());
    to.write_all(&message)
}

fn read_text(from: &mut impl Read) -> io::Result<String> {
    let mut len = [0u8; 4];
    from.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_TEXT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a text of {len} bytes is over {MAX_TEXT}"),
        ));
    }
    let mut text = vec![0u8; len as usize];
    from.read_exact(&mut text)?;
    String::from_utf8(text).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
}

/// PID 1's connection to its container factory.
#[derive(Debug)]
pub struct ContainerFactory {
    socket: UnixStream,
    /// Set once an exchange broke off: the connection is out of step for good.
    broken: Option<String>,
}

impl ContainerFactory {
    /// The factory PID 1 was handed at [`crate::PID1_FACTORY_FD`], if that descriptor is a
    /// socket. Call it once: the descriptor is owned by what it returns.
    pub fn inherited() -> Option<Self> {
        let fd = crate::PID1_FACTORY_FD;
        // SAFETY: fstat writes into `stat`, a valid out-pointer; on a closed descriptor it
        // fails with EBADF.
        let is_socket = unsafe {
            let mut stat: libc::stat = std::mem::zeroed();
            libc::fstat(fd, &mut stat) == 0 && stat.st_mode & libc::S_IFMT == libc::S_IFSOCK
        };
        if !is_socket {
            return None;
        }
        // SAFETY: the descriptor is open, a socket, and (the caller's contract) owned by
        // nothing else in this process.
        let socket = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let timeouts = socket
            .set_read_timeout(Some(ANSWER_WAIT))
            .and_then(|()| socket.set_write_timeout(Some(ANSWER_WAIT)));
        Some(ContainerFactory {
            socket,
            broken: timeouts.err().map(|e| format!("setting its timeouts: {e}")),
        })
    }

    /// Has the factory make container `name` (the sandbox's `index`th, counting every
    /// container it ever had) from `image` (an idmapped, read-only mount of its tree), its
    /// agent listening on `listener`, with `shared` mounted and each of `host_mounts` (the
    /// host's mounts of its host paths, in the request's order) attached, in the root's PID
    /// namespace when `share_pids`; returns the agent's pid.
    pub fn add(
        &mut self,
        request: &AddRequest,
        image: OwnedFd,
        listener: OwnedFd,
        host_mounts: Vec<OwnedFd>,
    ) -> Result<libc::pid_t, FactoryError> {
        if let Some(why) = &self.broken {
            return Err(FactoryError::Gone { why: why.clone() });
        }
        if host_mounts.len() != request.host_paths.len() || host_mounts.len() > MAX_HOST_PATHS {
            return Err(FactoryError::Refused(format!(
                "{} host path mounts for {} host paths (at most {MAX_HOST_PATHS})",
                host_mounts.len(),
                request.host_paths.len()
            )));
        }
        let exchange = || -> io::Result<String> {
            crate::send_stream(self.socket.as_fd(), &image)?;
            crate::send_stream(self.socket.as_fd(), &listener)?;
            write_text(&mut &self.socket, &request.encode())?;
            for mount in &host_mounts {
                crate::send_stream(self.socket.as_fd(), mount)?;
            }
            read_text(&mut &self.socket)
        };
        let answer = match exchange() {
            Ok(answer) => answer,
            Err(e) => {
                let why = match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                        format!("no answer within {} s", ANSWER_WAIT.as_secs())
                    }
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe => {
                        "it is gone".to_string()
                    }
                    _ => e.to_string(),
                };
                self.broken = Some(why.clone());
                return Err(FactoryError::Gone { why });
            }
        };
        match answer.split_once(' ') {
            Some(("ok", pid)) => pid
                .parse()
                .map_err(|_| FactoryError::Refused(format!("the factory answered {answer:?}"))),
            Some(("error", why)) => Err(FactoryError::Refused(why.to_string())),
            _ => Err(FactoryError::Refused(format!(
                "the factory answered {answer:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container request with nothing but an index and a name.
    fn member(index: usize, name: &str) -> AddRequest {
        AddRequest {
            index,
            name: name.into(),
            share_pids: false,
            command_is_pid1: false,
            security: ContainerSecurity::default(),
            shared: Vec::new(),
            host_paths: Vec::new(),
        }
    }

    #[test]
    fn a_request_round_trips_and_refuses_what_is_not_its_own() {
        for (share_pids, command_is_pid1) in [(false, false), (true, false), (false, true)] {
            let request = AddRequest {
                index: 4,
                name: "db".into(),
                share_pids,
                command_is_pid1,
                security: "ro nnp caps:0".parse().expect("security"),
                shared: vec!["db:work:/var/work".parse().expect("mount")],
                host_paths: vec!["/var/cache/apt".into(), "/srv".into()],
            };
            let text = request.encode();
            assert_eq!(AddRequest::decode(&text).expect("decode"), request);
        }
        let request = AddRequest {
            index: 4,
            name: "db".into(),
            share_pids: false,
            command_is_pid1: false,
            security: ContainerSecurity::default(),
            shared: Vec::new(),
            host_paths: Vec::new(),
        };
        assert_eq!(request.dir(), Path::new("c/4.db"));
        for (bad, says) in [
            ("", "no index"),
            ("x\ndb\n", "no index"),
            ("1\n", "no name"),
            ("1\nDB\n", "a-z"),
            ("1\ndb\n", "PID namespace"),
            ("1\ndb\ndb:work:/w\n", "PID namespace"),
            ("1\ndb\npids own\nweb:work:/w\n", "no security line"),
            ("1\ndb\npids own\nsecurity rw\n", "\"rw\""),
            (
                "1\ndb\npids own\nsecurity -\nweb:work:/w\n",
                "not container",
            ),
            ("1\ndb\npids own\nsecurity -\ndb:work\n", "OWNER:DIR:TARGET"),
            ("1\ndb\npids own\nsecurity -\ndb:work:/proc/x\n", "/proc"),
            ("1\ndb\npids own\nsecurity -\nhost /dev/x\n", "host path"),
            ("1\ndb\npids own\nsecurity -\nhost srv\n", "absolute"),
            ("1\ndb\npids own\nsecurity -\nhost /a/../b\n", "not plain"),
        ] {
            let e = AddRequest::decode(bad).expect_err(bad);
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn texts_are_length_prefixed_and_bounded() {
        let mut buffer = Vec::new();
        write_text(&mut buffer, "ok 42").expect("write");
        assert_eq!(read_text(&mut buffer.as_slice()).expect("read"), "ok 42");
        let mut too_long = (MAX_TEXT + 1).to_le_bytes().to_vec();
        too_long.extend_from_slice(b"x");
        assert!(read_text(&mut too_long.as_slice()).is_err());
        assert!(read_text(&mut [1u8, 0].as_slice()).is_err());
    }

    #[test]
    fn a_factory_that_is_gone_is_named_and_stays_gone() {
        let (ours, theirs) = UnixStream::pair().expect("pair");
        drop(theirs);
        let mut factory = ContainerFactory {
            socket: ours,
            broken: None,
        };
        let null = || OwnedFd::from(std::fs::File::open("/dev/null").expect("null"));
        for _ in 0..2 {
            let e = factory
                .add(&member(0, "db"), null(), null(), Vec::new())
                .expect_err("gone");
            assert!(matches!(e, FactoryError::Gone { .. }), "{e}");
            assert!(e.to_string().contains("killed or stopped"), "{e}");
        }
    }

    #[test]
    fn a_factory_that_refuses_says_why_and_one_that_is_silent_is_out_of_step() {
        let (ours, theirs) = UnixStream::pair().expect("pair");
        let peer = std::thread::spawn(move || {
            receive_fd(&theirs).expect("image").expect("some");
            receive_fd(&theirs).expect("listener").expect("some");
            let text = read_text(&mut &theirs).expect("request");
            assert!(text.starts_with("7\nweb\n"), "{text}");
            write_text(&mut &theirs, "error c/7.web is in use").expect("answer");
            // The second request gets no answer; the socket stays open until the test ends.
            theirs
        });
        let mut factory = ContainerFactory {
            socket: ours,
            broken: None,
        };
        let null = || OwnedFd::from(std::fs::File::open("/dev/null").expect("null"));
        let refused = factory
            .add(&member(7, "web"), null(), null(), Vec::new())
            .expect_err("refused");
        assert_eq!(refused.to_string(), "c/7.web is in use");
        let theirs = peer.join().expect("peer");
        factory
            .socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let silent = factory
            .add(&member(8, "web"), null(), null(), Vec::new())
            .expect_err("silent");
        assert!(silent.to_string().contains("no answer"), "{silent}");
        let again = factory
            .add(&member(9, "web"), null(), null(), Vec::new())
            .expect_err("broken");
        assert!(matches!(again, FactoryError::Gone { .. }), "{again}");
        drop(theirs);
    }
}
