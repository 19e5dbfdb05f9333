//! A container whose first command is PID 1 of its PID namespace (the namespace crate's
//! `container_init` makes it): the agent's side, and the two roles of this binary beside it.
//!
//! - The agent sends its first command to the container's *init* (`container-init`, PID 1
//!   of that namespace and the agent's child), which becomes it in place; every later one to
//!   the *spawner* (`container-spawner`), which clones it in that namespace with
//!   `CLONE_PARENT`, so that the agent reaps it as it reaps any command.
//! - An order is one message, `(request, user, controlling terminal, bounding set, cgroup)`,
//!   with the command's stdin, stdout and stderr (and the commands' cgroup) attached. The init
//!   answers nothing when it has executed (its end of the connection closes on exec) or the
//!   failure's report word; the spawner answers the child's pid (with its pidfd attached) or
//!   the report word.
//! - Once the init has exited, its namespace takes no new process: a command then fails,
//!   saying so.

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, OnceLock};

use wire::agent::RunAs;
use wire::ExecRequest;

use crate::reaper::{self, Child};
use crate::spawn::{self, ChildStdio, SpawnContext, SpawnError};

/// What the agent sends: the request, who it runs as, whether stdin is its controlling
/// terminal, the bounding set of commands, whether the commands' cgroup is attached.
type Order = (ExecRequest, Option<RunAs>, bool, Option<u64>, bool);
/// What the spawner answers: the child's pid, or its failure's report word and a message
/// (a word of 0: a failure before the clone, the message alone says it).
type Answer = Result<libc::pid_t, (u64, String)>;

/// The most descriptors an order or an answer carries.
const MAX_FDS: usize = 4;
/// How long the init or the spawner may take to answer an order: preparing and executing a
/// command takes milliseconds, but neither may hold the agent for ever.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The agent's connections to its container's init and spawner.
#[derive(Debug)]
pub struct ContainerInit {
    init_pid: libc::pid_t,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The init, until the first command went to it, with its pidfd.
    init: Option<(UnixStream, OwnedFd)>,
    /// The spawner, until it failed to answer (what it says after that could be the answer
    /// to an earlier order).
    spawner: Option<UnixStream>,
}

static CONTAINER: OnceLock<ContainerInit> = OnceLock::new();

/// The container's init and spawner, when this agent has them: its commands go through
/// [`ContainerInit::spawn`] instead of [`spawn::spawn`].
pub(crate) fn get() -> Option<&'static ContainerInit> {
    CONTAINER.get()
}

/// Takes the connections handed at [`namespace::CONTAINER_INIT_FD`] and
/// [`namespace::CONTAINER_SPAWNER_FD`] to the init `init_pid` (this process's child): from
/// now on every command goes through them. Called once, before serving.
pub fn adopt(init_pid: libc::pid_t) -> io::Result<()> {
    let init = take_fd(namespace::CONTAINER_INIT_FD)?;
    let spawner = take_fd(namespace::CONTAINER_SPAWNER_FD)?;
    let pidfd = pidfd_open(init_pid)?;
    let (init, spawner) = (UnixStream::from(init), UnixStream::from(spawner));
    init.set_read_timeout(Some(ANSWER_WAIT))?;
    spawner.set_read_timeout(Some(ANSWER_WAIT))?;
    let adopted = ContainerInit {
        init_pid,
        state: Mutex::new(State {
            init: Some((init, pidfd)),
            spawner: Some(spawner),
        }),
    };
    CONTAINER
        .set(adopted)
        .map_err(|_| io::Error::other("the container's init was adopted twice"))?;
    crate::sys::commands_in_pid_namespace_below();
    Ok(())
}

impl ContainerInit {
    /// Starts `req`: the first command as the init itself, every later one through the
    /// spawner. The child is this process's, registered with the reaper as any other.
    pub(crate) fn spawn(
        &self,
        req: &ExecRequest,
        user: Option<&RunAs>,
        stdio: ChildStdio<'_>,
        ctx: &SpawnContext<'_>,
    ) -> Result<Child, SpawnError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let order: Order = (
            req.clone(),
            user.cloned(),
            stdio.controlling_terminal,
            spawn::commands_bounding_set(),
            ctx.cgroup_procs.is_some(),
        );
        let mut fds = vec![stdio.stdin, stdio.stdout, stdio.stderr];
        fds.extend(ctx.cgroup_procs);
        let mut failure = None;
        let spawned = if let Some((init, pidfd)) = state.init.take() {
            reaper::register_spawn(|| {
                send_order(&init, &order, &fds)?;
                match read_report(&init)? {
                    None => Ok((self.init_pid, pidfd)),
                    Some(report) => {
                        failure = Some(spawn::error_of_report(report, req, user));
                        Err(io::Error::other("the container's init did not execute"))
                    }
                }
            })
        } else {
            let Some(spawner) = state.spawner.as_ref() else {
                return Err(SpawnError::Io(io::Error::other(format!(
                    "the container's spawner stopped answering (it did not answer an order \
                     within {ANSWER_WAIT:?}): no command can start in the container any more"
                ))));
            };
            let mut lost = false;
            let spawned = reaper::register_spawn(|| {
                send_order(spawner, &order, &fds)?;
                let (answer, mut received) = read_answer(spawner).inspect_err(|_| lost = true)?;
                match answer {
                    Ok(pid) if !received.is_empty() => Ok((pid, received.remove(0))),
                    Ok(_) => Err(io::Error::other("the spawner sent no pidfd")),
                    Err((0, message)) => {
                        failure = Some(SpawnError::Io(io::Error::other(message)));
                        Err(io::Error::other("the spawner could not clone"))
                    }
                    Err((report, _)) => {
                        failure = Some(spawn::error_of_report(report, req, user));
                        Err(io::Error::other("the command did not execute"))
                    }
                }
            });
            if lost {
                state.spawner = None;
            }
            spawned
        };
        spawned.map_err(|e| failure.unwrap_or(SpawnError::Io(e)))
    }
}

/// The container's init (`guest-init container-init`): waits for the container's first
/// command and becomes it. Returns only if it could not (the container is then over: this
/// is its PID namespace's init).
pub fn init_main() -> io::Error {
    let connection = match take_fd(namespace::CONTAINER_INIT_FD) {
        Ok(fd) => UnixStream::from(fd),
        Err(e) => return e,
    };
    let (order, fds) = match read_order(&connection) {
        Ok(Some(got)) => got,
        Ok(None) => return io::Error::other("the agent closed before the first command"),
        Err(e) => return e,
    };
    let e = match with_order(&order, &fds, |req, user, stdio, ctx| {
        spawn::exec_in_place(req, user, stdio, ctx, connection.as_raw_fd())
    }) {
        Ok(e) | Err(e) => e,
    };
    // Prepared it could not be: say so as a report of the setup stage.
    let errno = match &e {
        SpawnError::Io(io) => io.raw_os_error().unwrap_or(libc::EINVAL),
        _ => libc::EINVAL,
    };
    let word = (1u64 << 48) | u64::from(errno as u32);
    let _ = io::Write::write_all(&mut &connection, &word.to_ne_bytes());
    io::Error::other(report::chain(&e))
}

/// The container's spawner (`guest-init container-spawner`): clones each command it is sent
/// into the container's PID namespace, as its agent's child, until the agent goes.
pub fn spawner_main() -> io::Error {
    let connection = match take_fd(namespace::CONTAINER_SPAWNER_FD) {
        Ok(fd) => UnixStream::from(fd),
        Err(e) => return e,
    };
    loop {
        let (order, fds) = match read_order(&connection) {
            Ok(Some(got)) => got,
            Ok(None) => return io::Error::other("the agent has gone"),
            Err(e) => return e,
        };
        let spawned = with_order(&order, &fds, spawn::spawn_sibling);
        let (answer, pidfd): (Answer, Option<OwnedFd>) = match spawned {
            Ok(Ok(Ok((pid, pidfd)))) => (Ok(pid), Some(pidfd)),
            Ok(Ok(Err(report))) => (Err((report, String::new())), None),
            Ok(Err(e)) | Err(e) => (Err((0, spawn_failure(&e))), None),
        };
        let sent = wire::write_message(&mut &connection, &answer)
            .map_err(io::Error::other)
            .and_then(|()| match &pidfd {
                Some(pidfd) => send_fds(connection.as_fd(), &[pidfd.as_fd()]),
                None => Ok(()),
            });
        if let Err(e) = sent {
            return e;
        }
    }
}

/// What a clone that failed before the child existed says: out of memory in a PID namespace
/// means its init has exited, and the kernel makes no new process there.
fn spawn_failure(e: &SpawnError) -> String {
    match e {
        SpawnError::Io(io) if io.raw_os_error() == Some(libc::ENOMEM) => {
            "the container's main process (PID 1 of its PID namespace) has exited: no command \
             can start in it any more"
                .into()
        }
        other => report::chain(other),
    }
}

/// Runs `f` with the order's request, user, stdio and context (received descriptors: stdin,
/// stdout, stderr, then the commands' cgroup if the order says so).
fn with_order<T>(
    order: &Order,
    fds: &[OwnedFd],
    f: impl FnOnce(&ExecRequest, Option<&RunAs>, ChildStdio<'_>, &SpawnContext<'_>) -> T,
) -> Result<T, SpawnError> {
    let (req, user, controlling_terminal, bounding_set, cgroup) = order;
    let [stdin, stdout, stderr, rest @ ..] = fds else {
        return Err(SpawnError::Io(io::Error::other(
            "an order came without its stdin, stdout and stderr",
        )));
    };
    if let Some(mask) = bounding_set {
        spawn::bound_commands_to(*mask);
    }
    let devnull = std::fs::File::open("/dev/null")?;
    let ctx = SpawnContext {
        devnull: devnull.as_fd(),
        cgroup_procs: cgroup.then(|| rest.first().map(AsFd::as_fd)).flatten(),
        reset_oom_score: true,
        namespaces: None,
    };
    let stdio = ChildStdio {
        stdin: stdin.as_fd(),
        stdout: stdout.as_fd(),
        stderr: stderr.as_fd(),
        controlling_terminal: *controlling_terminal,
    };
    Ok(f(req, user.as_ref(), stdio, &ctx))
}

fn send_order(connection: &UnixStream, order: &Order, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    wire::write_message(&mut &*connection, order).map_err(io::Error::other)?;
    send_fds(connection.as_fd(), fds)
}

/// The next order and its descriptors; `None` when the agent closed the connection.
fn read_order(connection: &UnixStream) -> io::Result<Option<(Order, Vec<OwnedFd>)>> {
    let order: Order = match wire::read_message(&mut &*connection) {
        Ok(order) => order,
        Err(wire::MessageError::Closed) => return Ok(None),
        Err(e) => return Err(io::Error::other(e)),
    };
    Ok(Some((order, recv_fds(connection.as_fd())?)))
}

/// The init's answer: nothing (it executed: its end closed) or its report word.
fn read_report(connection: &UnixStream) -> io::Result<Option<u64>> {
    let mut word = [0u8; 8];
    let mut got = 0;
    while got < word.len() {
        match (&*connection).read(&mut word[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(unanswered("init", e)),
        }
    }
    Ok((got == word.len()).then(|| u64::from_ne_bytes(word)))
}

/// A read from the init or the spawner that failed: past [`ANSWER_WAIT`], said so.
fn unanswered(who: &str, e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the container's {who} did not answer within {ANSWER_WAIT:?}"),
        ),
        _ => e,
    }
}

fn read_answer(connection: &UnixStream) -> io::Result<(Answer, Vec<OwnedFd>)> {
    let answer: Answer = wire::read_message(&mut &*connection).map_err(|e| match e {
        wire::MessageError::Io(e) => unanswered("spawner", e),
        other => io::Error::other(other),
    })?;
    let fds = match &answer {
        Ok(_) => recv_fds(connection.as_fd()).map_err(|e| unanswered("spawner", e))?,
        Err(_) => Vec::new(),
    };
    Ok((answer, fds))
}

/// Sends one byte carrying `fds` (at most [`MAX_FDS`]).
fn send_fds(socket: BorrowedFd<'_>, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::other(format!(
            "{} descriptors to send",
            fds.len()
        )));
    }
    namespace::send_streams(socket, fds)
}

/// Receives [`send_fds`]' byte and the descriptors it carries (close-on-exec).
fn recv_fds(socket: BorrowedFd<'_>) -> io::Result<Vec<OwnedFd>> {
    loop {
        match namespace::recv_streams(socket) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Ok(Some(fds)) if fds.len() <= MAX_FDS => return Ok(fds),
            Ok(Some(fds)) => {
                return Err(io::Error::other(format!(
                    "{} descriptors came, more than an order carries",
                    fds.len()
                )))
            }
            Ok(None) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Err(e) => return Err(e),
        }
    }
}

/// Takes the descriptor handed at `fd`, close-on-exec from now on (no command inherits it).
fn take_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD takes an integer; it tells whether `fd` is open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        return Err(io::Error::other(format!(
            "descriptor {fd} was not handed over"
        )));
    }
    // SAFETY: F_SETFD takes an integer flag.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor is open, and only the container's maker put it there; this is
    // its one owner (each role takes its own once, at startup).
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An init or a spawner that takes an order and never answers costs the agent its
    /// deadline, then a timed-out error; one that hangs up is an answer too (the init's:
    /// "it executed").
    #[test]
    fn a_peer_that_never_answers_is_a_timeout_not_a_hang() {
        let (agent, peer) = UnixStream::pair().expect("socketpair");
        agent
            .set_read_timeout(Some(std::time::Duration::from_millis(50)))
            .expect("timeout");
        let report = read_report(&agent).expect_err("no answer");
        assert_eq!(report.kind(), io::ErrorKind::TimedOut, "{report}");
        assert!(
            report.to_string().contains("init did not answer"),
            "{report}"
        );
        let answer = read_answer(&agent).expect_err("no answer");
        assert_eq!(answer.kind(), io::ErrorKind::TimedOut, "{answer}");
        assert!(
            answer.to_string().contains("spawner did not answer"),
            "{answer}"
        );
        drop(peer);
        assert_eq!(read_report(&agent).expect("closed"), None);
    }
}
