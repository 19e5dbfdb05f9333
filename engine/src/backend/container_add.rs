//! The host's half of adding a container to a running namespace sandbox: the container's
//! image as a read-only mount idmapped into the sandbox's user namespace (only host root can
//! make it), its host paths the same way (`namespace::host_path_tree`), its agent's socket
//! bound in the sandbox's runtime directory, all handed to the sandbox's agent with an
//! `add_container` request; its container factory makes the rest
//! (`namespace::ContainerFactory`).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use wire::agent::{AgentReply, AgentRequest};

/// How long the agent may take to answer: the factory's own deadline (10 s) and a margin.
const ANSWER_WAIT: Duration = Duration::from_secs(15);

/// What the host mounts for a container: its image's tree and its host paths.
pub(super) struct Mounts<'a> {
    /// The image's tree.
    pub(super) rootfs: &'a Path,
    /// Its host paths, in the request's order.
    pub(super) host_paths: &'a [namespace::HostPathMount],
}

/// Makes the container's mounts and socket and has the agent at `agent_socket` make it;
/// blocking. `supervisor` is the host pid of the sandbox's supervisor (its PID 1's parent).
pub(super) fn ask_agent(
    supervisor: i32,
    mounts: Mounts<'_>,
    socket: &Path,
    agent_socket: &Path,
    request: &AgentRequest,
) -> Result<(), String> {
    let init = super::mount_table::sandbox_init(supervisor)
        .map_err(|e| format!("finding the sandbox's PID 1 (the child of pid {supervisor}): {e}"))?;
    let userns = std::fs::File::open(format!("/proc/{init}/ns/user"))
        .map_err(|e| format!("the user namespace of the sandbox's PID 1 (pid {init}): {e}"))?;
    let image = namespace::idmapped_image(mounts.rootfs, userns.as_fd())
        .map_err(|e| format!("the container's image: {}", report::chain(&e)))?;
    let host_paths = mounts
        .host_paths
        .iter()
        .map(|host| {
            namespace::host_path_tree(
                &host.source,
                host.read_only,
                host.propagation,
                userns.as_fd(),
            )
            .map_err(|e| format!("host path {}: {}", host.source.display(), report::chain(&e)))
        })
        .collect::<Result<Vec<_>, String>>()?;
    if std::fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(socket);
    }
    let listener = UnixListener::bind(socket)
        .map_err(|e| format!("listening on {}: {e}", socket.display()))?;
    let answer = exchange(
        agent_socket,
        request,
        &[image, OwnedFd::from(listener)],
        &host_paths,
    );
    if answer.is_err() {
        let _ = std::fs::remove_file(socket);
    }
    answer
}

/// Sends `request`, then the image and the listener (`first`), then the host paths' mounts.
fn exchange(
    agent_socket: &Path,
    request: &AgentRequest,
    first: &[OwnedFd; 2],
    host_paths: &[OwnedFd],
) -> Result<(), String> {
    let talk = || -> io::Result<AgentReply> {
        let mut agent = UnixStream::connect(agent_socket)?;
        agent.set_read_timeout(Some(ANSWER_WAIT))?;
        agent.set_write_timeout(Some(ANSWER_WAIT))?;
        wire::write_message(&mut agent, request)
            .map_err(|e| io::Error::other(report::chain(&e)))?;
        for fd in first.iter().chain(host_paths) {
            namespace::send_stream(agent.as_fd(), fd)?;
        }
        wire::read_message(&mut agent).map_err(|e| match e {
            wire::MessageError::Io(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                io::Error::other(format!("no answer within {} s", ANSWER_WAIT.as_secs()))
            }
            other => io::Error::other(report::chain(&other)),
        })
    };
    match talk().map_err(|e| format!("asking the sandbox's agent: {e}"))? {
        AgentReply::ContainerAdded { .. } => Ok(()),
        AgentReply::Error(body) => Err(body.message),
        other => Err(format!("the sandbox's agent answered {other:?}")),
    }
}
