//! Thin, checked wrappers over the system calls the sandbox needs.

use std::ffi::{CString, NulError};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use crate::SandboxSpec;

/// A failed system call, with the step and the input it was given.
#[derive(Debug, thiserror::Error)]
#[error("{step} failed")]
pub struct SysError {
    /// What was being done, with its arguments (`mount overlay on /run/…/root`).
    pub step: String,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

impl SysError {
    pub(crate) fn last(step: impl Into<String>) -> Self {
        SysError {
            step: step.into(),
            source: io::Error::last_os_error(),
        }
    }

    pub(crate) fn io(step: impl Into<String>, source: io::Error) -> Self {
        SysError {
            step: step.into(),
            source,
        }
    }
}

/// Checks a libc return value.
pub(crate) fn check(ret: libc::c_int, step: impl FnOnce() -> String) -> Result<(), SysError> {
    if ret < 0 {
        Err(SysError::last(step()))
    } else {
        Ok(())
    }
}

pub(crate) fn cstring(path: &Path) -> Result<CString, SysError> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|e: NulError| {
        SysError::io(
            format!("path {}", path.display()),
            io::Error::new(io::ErrorKind::InvalidInput, e),
        )
    })
}

/// The namespaces a sandbox gets: all of them but time, the user namespace owning the rest.
const NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWCGROUP;

pub(crate) enum Forked {
    Parent(libc::pid_t),
    Child,
}

/// Forks into new namespaces: the child is PID 1 of the new PID namespace and, until its id
/// maps are written, nobody in its new user namespace (with all capabilities there). With
/// `own_network` false it stays in the caller's network namespace (one it joined).
pub(crate) fn clone_into_namespaces(own_network: bool) -> Result<Forked, SysError> {
    if own_network {
        fork_into(
            NAMESPACES,
            "clone into new user, mount, PID, UTS, IPC, network and cgroup namespaces",
        )
    } else {
        fork_into(
            NAMESPACES & !libc::CLONE_NEWNET,
            "clone into new user, mount, PID, UTS, IPC and cgroup namespaces",
        )
    }
}

/// Forks a container of the sandbox: in a new mount namespace (a copy of the caller's) owned
/// by the sandbox's user namespace, and, unless `shared_pids`, as PID 1 of a new PID namespace;
/// with it, in the PID namespace the caller's children go to ([`enter_pid_namespace_for_children`]).
/// It shares every other namespace with the caller.
pub(crate) fn clone_container(shared_pids: bool) -> Result<Forked, SysError> {
    if shared_pids {
        fork_into(
            libc::CLONE_NEWNS,
            "clone a container into a new mount namespace",
        )
    } else {
        fork_into(
            libc::CLONE_NEWNS | libc::CLONE_NEWPID,
            "clone a container into new mount and PID namespaces",
        )
    }
}

/// Makes a new PID namespace for the caller's children (the caller stays in its own): the
/// next child is its PID 1. Returns the caller's own PID namespace, to go back to with
/// [`enter_pid_namespace_for_children`]. Namespaces are opened through `/proc/self`, the one
/// process whose namespaces the caller may always open (the sandbox's processes are not
/// dumpable, so a pidfd or `/proc/PID/ns` of another is refused).
pub(crate) fn new_pid_namespace_for_children() -> Result<OwnedFd, SysError> {
    let own = open_file(Path::new("/proc/self/ns/pid"), libc::O_RDONLY)?;
    // SAFETY: unshare takes flags only.
    let ret = unsafe { libc::unshare(libc::CLONE_NEWPID) };
    check(ret, || {
        "unshare a PID namespace for the sandbox's root".into()
    })?;
    Ok(own)
}

/// The PID namespace the caller's children are made in, once its PID 1 exists (before, the
/// kernel does not show it).
pub(crate) fn pid_namespace_for_children() -> Result<OwnedFd, SysError> {
    open_file(Path::new("/proc/self/ns/pid_for_children"), libc::O_RDONLY)
}

/// From now on the caller's children are made in the PID namespace `namespace` (the caller
/// itself stays where it is): the caller's own, or one below it.
pub(crate) fn enter_pid_namespace_for_children(namespace: BorrowedFd<'_>) -> Result<(), SysError> {
    // SAFETY: setns takes a descriptor and flags.
    let ret = unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWPID) };
    check(ret, || "setns into a PID namespace for the children".into())
}

/// Forks the process that becomes the sandbox's own root (`main`, the agent and its commands):
/// into the PID namespace [`new_pid_namespace_for_children`] made, as its PID 1; every other
/// namespace shared with the caller.
pub(crate) fn fork_main_root() -> Result<Forked, SysError> {
    fork_into(0, "fork the sandbox's own root into its PID namespace")
}

/// Forks the sandbox's container factory: in a mount namespace of its own (a copy of the
/// caller's, owned by the sandbox's user namespace), every other namespace shared.
pub(crate) fn clone_factory() -> Result<Forked, SysError> {
    fork_into(
        libc::CLONE_NEWNS,
        "clone the container factory into a new mount namespace",
    )
}

/// A plain fork (see [`fork_into`] for what the child may do).
pub(crate) fn fork() -> Result<Forked, SysError> {
    fork_into(0, "fork")
}

/// `clone(2)` as a fork (a null stack) into the new namespaces of `namespaces`; `what` names
/// the step in its error.
fn fork_into(namespaces: libc::c_int, what: &str) -> Result<Forked, SysError> {
    let flags = namespaces | libc::SIGCHLD;
    // SAFETY: with a null stack, clone behaves as fork. The callers' callers guarantee the
    // process is single-threaded (documented on `enter`), so the child may run arbitrary code;
    // libc's cached thread id is stale in the child, which therefore makes only plain system
    // calls until it executes.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    match pid {
        -1 => Err(SysError::last(what)),
        0 => Ok(Forked::Child),
        child => Ok(Forked::Parent(child as libc::pid_t)),
    }
}

/// Makes the caller uid and gid 0 of its user namespace (the host range's base), with no
/// supplementary groups. Raw system calls: libc's wrappers synchronise threads.
pub(crate) fn become_root_inside() -> Result<(), SysError> {
    // SAFETY: setgroups with a zero count reads no memory.
    let ret =
        unsafe { libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) };
    check(ret as libc::c_int, || {
        "setgroups([]) inside the sandbox".into()
    })?;
    // SAFETY: setresgid takes three integers.
    let ret = unsafe { libc::syscall(libc::SYS_setresgid, 0u32, 0u32, 0u32) };
    check(ret as libc::c_int, || {
        "setresgid(0) inside the sandbox".into()
    })?;
    // SAFETY: setresuid takes three integers.
    let ret = unsafe { libc::syscall(libc::SYS_setresuid, 0u32, 0u32, 0u32) };
    check(ret as libc::c_int, || {
        "setresuid(0) inside the sandbox".into()
    })
}

/// Ends the calling process at once, without unwinding or running exit handlers (the child of
/// a clone shares them with nobody, but they are its parent's).
pub(crate) fn exit_now(code: libc::c_int) -> ! {
    // SAFETY: _exit takes an integer and never returns.
    unsafe { libc::_exit(code) }
}

/// SIGKILLs `pid` (best effort: it may be gone already).
pub(crate) fn kill(pid: libc::pid_t) {
    // SAFETY: kill takes two integers.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// Wraps a system call's descriptor result.
pub(crate) fn owned_fd(
    ret: libc::c_long,
    step: impl FnOnce() -> String,
) -> Result<OwnedFd, SysError> {
    if ret < 0 {
        return Err(SysError::last(step()));
    }
    // SAFETY: the call returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

/// Opens `path` with `flags` (plus `O_CLOEXEC`).
pub(crate) fn open_file(path: &Path, flags: libc::c_int) -> Result<OwnedFd, SysError> {
    let c = cstring(path)?;
    // SAFETY: open reads the NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    owned_fd(fd.into(), || format!("open {}", path.display()))
}

/// The status of the open file `fd`.
pub(crate) fn fstat(fd: &OwnedFd, step: impl FnOnce() -> String) -> Result<libc::stat, SysError> {
    // SAFETY: stat is plain old data; all-zeroes is valid and fstat overwrites it.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `stat` is a valid out-pointer for the call; the descriptor is ours.
    let ret = unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) };
    check(ret, step)?;
    Ok(stat)
}

/// One end of the socket pair between the supervisor and the sandbox's first process.
#[derive(Debug)]
pub(crate) struct Socket(UnixStream);

pub(crate) fn socketpair() -> Result<(Socket, Socket), SysError> {
    let (a, b) = UnixStream::pair().map_err(|e| SysError::io("socketpair for the sandbox", e))?;
    Ok((Socket(a), Socket(b)))
}

impl Socket {
    /// Sends one byte with `fd` attached.
    pub(crate) fn send_fd(&self, fd: &OwnedFd) -> io::Result<()> {
        send_stream(self.0.as_fd(), fd)
    }

    /// Receives what [`Socket::send_fd`] sent; `None` if the peer closed without sending.
    pub(crate) fn recv_fd(&self) -> io::Result<Option<OwnedFd>> {
        loop {
            match recv_stream(self.0.as_fd()) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }

    /// Whether the other end is still open (its process alive).
    pub(crate) fn peer_alive(&self) -> bool {
        let mut fds = [libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: `fds` is a valid array of one pollfd for the call; zero timeout.
        let ret = unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) };
        ret == 0 || fds[0].revents & (libc::POLLHUP | libc::POLLERR) == 0
    }

    /// Sends one byte: "done".
    pub(crate) fn send_byte(&self) -> io::Result<()> {
        io::Write::write_all(&mut &self.0, &[1])
    }

    /// Waits for [`Socket::send_byte`]'s byte: false if the peer closed without sending it.
    pub(crate) fn recv_byte(&self) -> io::Result<bool> {
        let mut byte = [0u8];
        loop {
            match io::Read::read(&mut &self.0, &mut byte) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(n) => return Ok(n == 1),
                Err(e) => return Err(e),
            }
        }
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// How many descriptors one received message may carry before the kernel truncates it: room
/// for a hostile peer's extras, which are closed.
const MAX_RECEIVED_FDS: usize = 8;

/// Sends `stream` (any descriptor) over the Unix socket `control`, as one message of one byte
/// carrying it. Never raises SIGPIPE: a closed peer is an `EPIPE` error.
pub fn send_stream(control: BorrowedFd<'_>, stream: &OwnedFd) -> io::Result<()> {
    send_streams(control, &[stream.as_fd()])
}

/// Sends `streams` (1 to [`MAX_RECEIVED_FDS`] descriptors) over the Unix socket `control`, as
/// one message of one byte carrying them all. Never raises SIGPIPE.
pub fn send_streams(control: BorrowedFd<'_>, streams: &[BorrowedFd<'_>]) -> io::Result<()> {
    if streams.is_empty() || streams.len() > MAX_RECEIVED_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} descriptors in one message", streams.len()),
        ));
    }
    let raw: Vec<RawFd> = streams.iter().map(AsRawFd::as_raw_fd).collect();
    let payload = size_of_val(raw.as_slice()) as u32;
    let mut byte = [1u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // u64 elements: the control buffer must be aligned for cmsghdr; room for a header and
    // MAX_RECEIVED_FDS descriptors.
    let mut buffer = [0u64; 2 + MAX_RECEIVED_FDS / 2];
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
    // SAFETY: msghdr is plain old data; all-zeroes is valid before the fields are set.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = buffer.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `buffer`, large enough for one cmsghdr carrying
    // MAX_RECEIVED_FDS descriptors (space <= 48 bytes), so CMSG_FIRSTHDR is non-null and its
    // data in bounds.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as _;
        let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
        for (i, fd) in raw.iter().enumerate() {
            std::ptr::write_unaligned(data.add(i), *fd);
        }
    }
    loop {
        // SAFETY: `msg` and everything it points at live for the call.
        let sent = unsafe { libc::sendmsg(control.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if sent >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives what [`send_stream`] sent: the descriptor (close-on-exec), or `None` if the peer
/// closed without sending anything. Extra descriptors a peer attached are closed.
pub fn recv_stream(control: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    match recv_streams(control)? {
        None => Ok(None),
        Some(received) => Ok(received.into_iter().next()),
    }
}

/// Receives what [`send_streams`] sent: its descriptors (close-on-exec, at least one), or
/// `None` if the peer closed without sending anything.
pub fn recv_streams(control: BorrowedFd<'_>) -> io::Result<Option<Vec<OwnedFd>>> {
    let mut byte = [0u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // u64 elements: aligned for cmsghdr; room for a header and MAX_RECEIVED_FDS descriptors.
    let mut buffer = [0u64; 2 + MAX_RECEIVED_FDS / 2];
    // SAFETY: msghdr is plain old data; all-zeroes is valid before the fields are set.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = buffer.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&buffer) as _;
    // SAFETY: `msg` and the buffers it points at live for the call.
    let got = unsafe { libc::recvmsg(control.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    // Every descriptor the kernel installed is owned (and so closed) from here on.
    let mut received: Vec<OwnedFd> = Vec::new();
    // SAFETY: recvmsg filled `msg`; CMSG_FIRSTHDR checks msg_controllen before returning a
    // header inside `buffer`.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: a non-null header from CMSG_FIRSTHDR/CMSG_NXTHDR lies within `buffer`,
        // written by the kernel.
        let header = unsafe { std::ptr::read_unaligned(cmsg) };
        if header.cmsg_level == libc::SOL_SOCKET && header.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN(0) is a pure computation.
            let data_len =
                (header.cmsg_len as usize).saturating_sub(unsafe { libc::CMSG_LEN(0) } as usize);
            // SAFETY: the header is inside `buffer`; its data starts within it.
            let data = unsafe { libc::CMSG_DATA(cmsg) };
            for i in 0..data_len / size_of::<RawFd>() {
                // SAFETY: the kernel wrote `data_len` bytes of descriptors after the header,
                // within `buffer` (it truncates rather than overrun msg_controllen).
                let fd = unsafe { std::ptr::read_unaligned(data.cast::<RawFd>().add(i)) };
                // SAFETY: the kernel installed `fd` in our table for us alone.
                received.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
        // SAFETY: `cmsg` is a valid header of `msg`; CMSG_NXTHDR stays within msg_control.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    if got == 0 && received.is_empty() {
        return Ok(None);
    }
    if received.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the message carried no descriptor",
        ));
    }
    Ok(Some(received))
}

/// What the sandbox's PID 1 needs from the host, opened with the host's view before entering:
/// its listening socket, its connection to the daemon and, if asked for, its egress connection.
#[derive(Debug)]
pub(crate) struct HostSide {
    listener: UnixListener,
    ready: UnixStream,
    egress: Option<UnixStream>,
    /// Each container's agent socket, in the spec's order.
    containers: Vec<UnixListener>,
    /// The commands' `cgroup.procs`, opened for writing with the host's credentials (which
    /// the kernel checks on each write, not the writer's).
    commands_cgroup: Option<std::fs::File>,
}

impl HostSide {
    pub(crate) fn open(spec: &SandboxSpec) -> Result<Self, SysError> {
        let listen = |socket: &Path| {
            // A stale socket file (a previous sandbox of the same id) is replaced.
            if std::fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
                let _ = std::fs::remove_file(socket);
            }
            UnixListener::bind(socket)
                .map_err(|e| SysError::io(format!("listen on {}", socket.display()), e))
        };
        let listener = listen(&spec.agent_socket)?;
        let containers = (0..spec.containers.len())
            .map(|i| listen(&spec.container_socket(i)))
            .collect::<Result<_, _>>()?;
        let connect = |path: &Path| {
            UnixStream::connect(path)
                .map_err(|e| SysError::io(format!("connect to {}", path.display()), e))
        };
        let ready = connect(&spec.ready_socket)?;
        let egress = spec.egress_socket.as_deref().map(connect).transpose()?;
        let commands_cgroup = spec
            .commands_cgroup
            .as_deref()
            .map(|path| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|e| SysError::io(format!("open {} for writing", path.display()), e))
            })
            .transpose()?;
        Ok(HostSide {
            listener,
            ready,
            egress,
            containers,
            commands_cgroup,
        })
    }

    /// The commands' `cgroup.procs`, if the spec names one.
    pub(crate) fn commands_cgroup(&self) -> Option<RawFd> {
        self.commands_cgroup.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Puts the listener, the ready connection and the egress connection at PID 1's
    /// descriptors 3, 4 and 5 and marks every other descriptor above 2 close-on-exec, so that
    /// nothing else crosses `execve`.
    pub(crate) fn hand_to_pid1(&self, factory: RawFd) -> Result<(), SysError> {
        let mut handed = vec![
            (self.listener.as_raw_fd(), crate::PID1_LISTEN_FD),
            (self.ready.as_raw_fd(), crate::PID1_READY_FD),
        ];
        if let Some(egress) = &self.egress {
            handed.push((egress.as_raw_fd(), crate::PID1_EGRESS_FD));
        }
        handed.push((factory, crate::PID1_FACTORY_FD));
        if let Some(commands) = self.commands_cgroup() {
            handed.push((commands, crate::COMMANDS_CGROUP_FD));
        }
        hand_over(&handed)
    }

    /// Puts container `index`'s listener at its agent's descriptor 3 (as PID 1's) and marks
    /// every other descriptor above 2 close-on-exec: the container's agent holds no socket of
    /// the sandbox's own agent or of another container.
    pub(crate) fn hand_to_container(
        &self,
        index: usize,
        init: &[(RawFd, RawFd)],
    ) -> Result<(), SysError> {
        let listener = self.containers.get(index).ok_or_else(|| {
            SysError::io(
                format!("hand container {index} its socket"),
                io::Error::new(io::ErrorKind::NotFound, "no such container"),
            )
        })?;
        hand_to_agent(listener.as_raw_fd(), self.commands_cgroup(), init)
    }
}

/// Puts `listener` at a container agent's descriptor 3 ([`crate::PID1_LISTEN_FD`]), the
/// commands' cgroup, if any, at [`crate::COMMANDS_CGROUP_FD`] and each of `init` (the
/// connections to a container's init and spawner, [`crate::container_init`]) at its target,
/// and marks every other descriptor above 2 close-on-exec.
pub(crate) fn hand_to_agent(
    listener: RawFd,
    commands_cgroup: Option<RawFd>,
    init: &[(RawFd, RawFd)],
) -> Result<(), SysError> {
    let mut handed = vec![(listener, crate::PID1_LISTEN_FD)];
    if let Some(commands) = commands_cgroup {
        handed.push((commands, crate::COMMANDS_CGROUP_FD));
    }
    handed.extend_from_slice(init);
    hand_over(&handed)
}

/// Puts `socket` at `target` and marks every other descriptor above 2 close-on-exec: what a
/// container's init or spawner takes across its `execve`.
pub(crate) fn hand_alone(socket: RawFd, target: RawFd) -> Result<(), SysError> {
    hand_over(&[(socket, target)])
}

/// Duplicates each `(fd, target)` to its target and marks every descriptor above the last
/// target close-on-exec, so that nothing else crosses `execve`.
fn hand_over(handed: &[(RawFd, RawFd)]) -> Result<(), SysError> {
    // Every source first goes above every descriptor the agent will get, so no dup2 below can
    // clobber a later one's source; these copies are close-on-exec.
    let mut high = Vec::with_capacity(handed.len());
    for &(fd, target) in handed {
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes integers and returns a new descriptor.
        let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 16) };
        check(copy, || format!("duplicate descriptor {fd}"))?;
        high.push((copy, target));
    }
    // Then everything above 2 is close-on-exec, gaps between the targets included (descriptor
    // 5 when there is no egress connection but a factory at 6)...
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range takes integers; with CLOSE_RANGE_CLOEXEC it only sets flags.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    check(ret as libc::c_int, || {
        "mark descriptors close-on-exec".into()
    })?;
    // ...but the targets, which dup2 leaves open across execve.
    for (copy, target) in high {
        // SAFETY: dup2 takes integers; the copy at `target` is not close-on-exec.
        let ret = unsafe { libc::dup2(copy, target) };
        check(ret, || format!("dup2 to descriptor {target}"))?;
    }
    Ok(())
}

/// This process's environment as `execve` takes it (`KEY=VALUE`; a pair holding a NUL, which
/// no exec could pass, is left out).
pub fn current_env() -> Vec<CString> {
    std::env::vars_os()
        .filter_map(|(k, v)| {
            let mut pair = k.into_vec();
            pair.push(b'=');
            pair.extend(v.into_vec());
            CString::new(pair).ok()
        })
        .collect()
}

/// `list` as the null-terminated array of pointers `execve` takes; valid while `list` is.
/// Made before a fork whose child may not allocate.
pub fn null_terminated(list: &[CString]) -> Vec<*const libc::c_char> {
    list.iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Executes the agent binary as the sandbox's PID 1, with the current environment.
pub(crate) fn exec_pid1(agent: &OwnedFd, argv: &[CString]) -> SysError {
    let env = current_env();
    let argv_p = null_terminated(argv);
    let env_p = null_terminated(&env);
    // SAFETY: argv and envp are null-terminated arrays of NUL-terminated strings that outlive
    // the call; with AT_EMPTY_PATH the empty path names `agent` itself. It returns only on
    // failure.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            agent.as_raw_fd(),
            c"".as_ptr(),
            argv_p.as_ptr(),
            env_p.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    SysError::last("execute the agent as the sandbox's PID 1")
}

/// Makes the caller undumpable (no ptrace, no `/proc/PID/mem`, no core dumps of its memory)
/// and names it `init` (an `execveat` of a descriptor names a process after the descriptor
/// on older kernels).
pub(crate) fn set_undumpable() -> Result<(), SysError> {
    set_undumpable_as(c"init")
}

/// Makes the caller undumpable (nothing without `CAP_SYS_PTRACE` over its memory's user
/// namespace may ptrace it or open its `/proc/PID/{fd,root,ns,mem}`) and names it `name`
/// (at most 15 bytes) in `ps`.
pub(crate) fn set_undumpable_as(name: &std::ffi::CStr) -> Result<(), SysError> {
    // SAFETY: PR_SET_DUMPABLE takes an integer.
    let ret = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong) };
    check(ret, || "prctl(PR_SET_DUMPABLE, 0)".into())?;
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    let ret = unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
    check(ret, || format!("prctl(PR_SET_NAME, {name:?})"))
}

/// Closes every descriptor above 2 but those in `keep`.
pub(crate) fn close_all_but(keep: &[RawFd]) -> Result<(), SysError> {
    let mut keep: Vec<libc::c_uint> = keep
        .iter()
        .filter_map(|&fd| libc::c_uint::try_from(fd).ok())
        .filter(|&fd| fd > 2)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut first: libc::c_uint = 3;
    for fd in keep.into_iter().chain(std::iter::once(libc::c_uint::MAX)) {
        if fd > first {
            let last = if fd == libc::c_uint::MAX { fd } else { fd - 1 };
            // SAFETY: close_range takes integers; it closes descriptors this process owns and
            // no Rust object of ours refers to afterwards (the caller's contract).
            let ret = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
            check(ret as libc::c_int, || {
                format!("close descriptors {first} to {last}")
            })?;
        }
        first = fd.saturating_add(1);
    }
    Ok(())
}

/// Whether descriptor `fd` is open.
pub(crate) fn is_open(fd: RawFd) -> bool {
    // SAFETY: fcntl(F_GETFD) takes integers and only reads the descriptor's flags.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// Marks `fd` close-on-exec if it is open.
pub(crate) fn keep_from_commands(fd: RawFd) -> Result<(), SysError> {
    // SAFETY: fcntl(F_SETFD) takes integers; on a closed descriptor it fails with EBADF.
    let ret = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    if ret < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EBADF) {
        return Err(SysError::last(format!(
            "mark descriptor {fd} close-on-exec"
        )));
    }
    Ok(())
}

/// The outer process: waits for the sandbox's PID 1 and exits with its status.
pub(crate) fn supervise(child: libc::pid_t) -> ! {
    std::process::exit(wait_for(child))
}

/// The sandbox's first process once it has made the containers, the factory and `main`
/// (whose PID namespaces are its namespace's children): the init of that namespace, which
/// nothing of the sandbox can see. It holds no descriptor, reaps what the kernel hands it,
/// and ends with `main` as the supervisor ends with it (128 + a signal's number), taking
/// every container with it: a PID namespace ends with its init.
pub(crate) fn be_pod_init(main: libc::pid_t) -> ! {
    // SAFETY: close_range takes integers; it closes descriptors this process owns, none of
    // which is used after this call (the caller never returns).
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            0,
        )
    };
    exit_now(wait_for(main))
}

/// Reaps children until `child` ends (any other is reaped and forgotten: an init is handed
/// orphans); its exit code, or 128 + the signal that killed it; 125 when there is nothing to
/// wait for.
fn wait_for(child: libc::pid_t) -> libc::c_int {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer for the duration of the call.
        let ret = unsafe { libc::waitpid(-1, &mut status, 0) };
        if ret == child {
            if libc::WIFEXITED(status) {
                return libc::WEXITSTATUS(status);
            } else if libc::WIFSIGNALED(status) {
                return 128 + libc::WTERMSIG(status);
            }
            continue;
        }
        if ret < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return 125;
        }
    }
}

/// PID 1 is SIGKILLed when the supervisor dies, which takes the whole namespace with it.
pub(crate) fn die_with_parent() -> Result<(), SysError> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) reads only its integer arguments.
    let ret = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    check(ret, || "prctl(PR_SET_PDEATHSIG)".into())
}

/// Runs the caller, and every process it forks later, on `cpus` alone (none: as it was).
/// Not a limit (a process may widen its own set again; the cgroup's quota is the limit), but
/// what `sched_getaffinity` reports: `nproc`, cargo, make and Go size their work by it.
pub(crate) fn run_on_cpus(cpus: &[u32]) -> Result<(), SysError> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: cpu_set_t is plain bits; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let holds = 8 * std::mem::size_of_val(&set);
    for &cpu in cpus.iter().filter(|c| (**c as usize) < holds) {
        // SAFETY: CPU_SET writes bit `cpu` of `set`, which holds `holds` bits.
        unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed, alive for the call.
    let ret = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    check(ret, || format!("sched_setaffinity to CPUs {cpus:?}"))
}

pub(crate) fn parent_pid() -> libc::pid_t {
    // SAFETY: getppid takes no arguments and cannot fail.
    unsafe { libc::getppid() }
}

pub(crate) fn set_hostname(name: &str) -> Result<(), SysError> {
    // SAFETY: the pointer and length describe `name`'s bytes, valid for the call.
    let ret = unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    check(ret, || format!("sethostname({name:?})"))
}

/// Sets `IFF_UP` on `lo`, the only interface of the new network namespace.
pub(crate) fn bring_up_loopback() -> Result<(), SysError> {
    // SAFETY: socket() takes plain integers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(SysError::last("socket(AF_INET) to configure lo"));
    }
    // SAFETY: an all-zero ifreq is a valid value of this plain C struct.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq for SIOCGIFFLAGS, which writes its flags union member.
    let got = unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req) };
    let result = if got < 0 {
        Err(SysError::last("ioctl(SIOCGIFFLAGS, lo)"))
    } else {
        // SAFETY: SIOCGIFFLAGS initialised the flags member of the union.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
        // SAFETY: `req` is a valid ifreq for SIOCSIFFLAGS, which only reads it.
        let set = unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &req) };
        check(set, || "ioctl(SIOCSIFFLAGS, lo up)".into())
    };
    // SAFETY: `fd` is ours and closed exactly once.
    unsafe { libc::close(fd) };
    result
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    fn pipe() -> (std::fs::File, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid array of two descriptors for pipe2 to fill.
        let ret = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
        assert_eq!(ret, 0, "pipe2: {}", io::Error::last_os_error());
        // SAFETY: pipe2 returned two new descriptors that nothing else owns.
        unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        }
    }

    #[test]
    fn a_descriptor_crosses_and_arrives_close_on_exec() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let (mut read_end, write_end) = pipe();
        send_stream(a.as_fd(), &OwnedFd::from(write_end)).expect("send");
        let got = recv_stream(b.as_fd())
            .expect("receive")
            .expect("a descriptor");
        // SAFETY: F_GETFD takes integers.
        let flags = unsafe { libc::fcntl(got.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        std::fs::File::from(got).write_all(b"hi").expect("write");
        let mut buf = [0u8; 2];
        read_end.read_exact(&mut buf).expect("read");
        assert_eq!(&buf, b"hi");
    }

    #[test]
    fn eof_is_none_and_would_block_is_an_error() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        b.set_nonblocking(true).expect("nonblocking");
        let e = recv_stream(b.as_fd()).expect_err("nothing sent yet");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        drop(a);
        assert!(recv_stream(b.as_fd()).expect("eof").is_none());
    }

    #[test]
    fn a_message_without_a_descriptor_is_refused() {
        let (mut a, b) = UnixStream::pair().expect("socketpair");
        a.write_all(b"x").expect("write");
        let e = recv_stream(b.as_fd()).expect_err("no descriptor");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn descriptors_beyond_the_first_are_closed() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let pipes = [pipe(), pipe(), pipe()];
        let raw: Vec<RawFd> = pipes.iter().map(|(_, w)| w.as_raw_fd()).collect();
        let mut byte = [1u8];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut buffer = [0u64; 8];
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(size_of_val(raw.as_slice()) as u32) };
        // SAFETY: msghdr is plain old data; all-zeroes is valid before the fields are set.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = buffer.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `buffer` (64 bytes) holds one header and three descriptors (space = 32).
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of_val(raw.as_slice()) as u32) as _;
            std::ptr::copy_nonoverlapping(
                raw.as_ptr(),
                libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                raw.len(),
            );
        }
        // SAFETY: `msg` and everything it points at live for the call.
        let sent = unsafe { libc::sendmsg(a.as_raw_fd(), &msg, 0) };
        assert_eq!(sent, 1, "sendmsg: {}", io::Error::last_os_error());
        let got = recv_stream(b.as_fd()).expect("receive").expect("one");
        let [(mut r0, w0), (mut r1, w1), (mut r2, w2)] = pipes;
        drop((w0, w1, w2));
        // The first write end is still open (we hold it); the others are closed everywhere.
        let mut buf = [0u8; 1];
        let e = r0.read(&mut buf).expect_err("the first pipe is still open");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        for r in [&mut r1, &mut r2] {
            assert_eq!(r.read(&mut buf).expect("eof"), 0, "an extra is still open");
        }
        drop(got);
        assert_eq!(r0.read(&mut buf).expect("eof"), 0);
    }
}
