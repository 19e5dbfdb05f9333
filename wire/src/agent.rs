//! The host↔agent protocol: what the daemon says to `guest-init` over one stream connection
//! (vsock in a microVM, a Unix socket in a namespace sandbox). See `docs/agent-protocol.md`.
//!
//! Every connection carries one request. The host first sends an [`AgentRequest`] as a
//! length-prefixed JSON message ([`write_message`](crate::write_message)); then:
//! - `exec`: the agent answers with a frame stream (stdout/stderr, then exactly one exit frame).
//!   With `interactive`, the host sends stdin/stdin_close frames; otherwise the command's stdin
//!   is `/dev/null`. Closing the connection kills the command's process group, unless the
//!   request says `on_disconnect: keep` (then it runs on and a later `attach` finds it).
//! - `put_files`: the host streams a tar archive and closes its write half (or simply ends the
//!   archive); the agent answers with one [`AgentReply`] (`files` or `error`).
//! - `get_file`: the agent answers with one [`AgentReply`]: `file` with the size, followed by
//!   exactly that many raw bytes, or `error`.
//! - `attach`: [`AgentReply::Attached`], then the named command's frame stream, as for `exec`.
//! - `execs`: [`AgentReply::Execs`], the commands that can be found by name.
//! - `ping`: [`AgentReply::Pong`] with the agent's [`Hello`]. `shutdown`: `shutting_down`, then
//!   the agent syncs and ends the VM.
//! - `connect_tcp`: [`AgentReply::Connected`], then the connection carries the bytes of a TCP
//!   connection to the sandbox's port both ways (each side's end of stream passed on as a
//!   half-close); or `error`.
//!
//! Where the agent listens (its vsock ports, set on the kernel command line) is agreed at boot,
//! not on a connection: see `contract::vsock` and `contract::cmdline`.

use serde::{Deserialize, Serialize};

use crate::types::{ErrorBody, ExecList, ExecRequest, ExecStatus, FilesPutResult};

/// Version of this host↔agent protocol, sent in the hello. A daemon talks only to an agent of
/// its own version (an agent refuses what it does not know, so a newer daemon's requests would
/// fail one by one): 2 added `attach`, `execs`, `on_disconnect` and `tail_bytes`; 3 added
/// `egress_uplink`; 4 added `probe_tcp` and `process_stats` (a sandbox's containers); 5 added
/// `add_container`; 6 added a shared directory's `read_only`; 9 added `add_container`'s
/// `security`; 11 added `connect_tcp` (a microVM pod's inbound connections), and a namespace
/// agent hands over its egress proxy's listening socket instead of each connection; 12 added
/// `get_tree` (a directory downloaded as a tar stream).
pub const PROTOCOL_VERSION: u32 = 12;

/// One request, the first message on a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentRequest {
    /// Run a command and stream its output as frames.
    Exec {
        /// What to run.
        request: ExecRequest,
        /// Whether the host will send stdin frames.
        #[serde(default)]
        interactive: bool,
        /// Who the command runs as (an image's `User`); absent, the agent's own user (root).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<RunAs>,
        /// How many of the latest output bytes the agent keeps for a client that re-attaches
        /// (a command that outlives its connection); absent: [`DEFAULT_TAIL_BYTES`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tail_bytes: Option<u64>,
    },
    /// Re-attach to the command named `exec_id`: answered with `attached` (its status as the
    /// stream starts) and then its frame stream from output byte `offset` on (what is still
    /// kept of it), ending with its one exit frame; or with `error` (`not_found`, `conflict`
    /// when another connection is attached, `invalid_request` for an offset beyond its
    /// output). Closing the connection detaches again.
    Attach {
        /// The command's name.
        exec_id: String,
        /// The first output byte the client wants (the bytes it has already received).
        #[serde(default)]
        offset: u64,
        /// Whether the client will send stdin frames (an interactive command's re-attach):
        /// refused with `invalid_request`, before anything is served, for a command that takes
        /// no stdin.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stdin: bool,
    },
    /// Answer with `execs`: the commands that can be found by name (running, or exited with
    /// a result not yet collected); with `exec_id`, that one only (`error` `not_found` when
    /// there is none).
    Execs {
        /// One command's name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exec_id: Option<String>,
    },
    /// Extract the tar archive that follows beneath `path`.
    PutFiles {
        /// The destination directory (absolute; created if missing).
        path: String,
    },
    /// Send one file's bytes.
    GetFile {
        /// The file (absolute).
        path: String,
    },
    /// Send a directory (or one file) as a tar archive: answered with `tree` and then the
    /// archive's bytes in `stdout` frames, ended by one `exit` frame whose payload is an
    /// [`AgentReply`] (`tree_sent` when the archive is whole, `error` when it was cut short);
    /// or with `error` alone when `path` cannot be read at all.
    GetTree {
        /// The directory or file (absolute; a symbolic link here is followed, none beneath).
        path: String,
    },
    /// Send `signal` to the process group of the running command named `exec_id`, or, with
    /// none, to every process of the sandbox but the agent (the agent must be PID 1:
    /// `kill(-1, signal)` from PID 1 spares only itself). Answered with `signaled` or `error`
    /// (`not_found` when no command of that name runs).
    Signal {
        /// The signal number, 1 to 64.
        signal: i32,
        /// The command's `exec_id`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exec_id: Option<String>,
    },
    /// Answer with what the whole guest uses (`stats`): a microVM is its sandbox, so its own
    /// kernel's counters are the sandbox's.
    Stats,
    /// Answer with what the processes of the agent's PID namespace use (`stats`): one
    /// container's share of a sandbox — its processes' resident memory, CPU time and count,
    /// the sandbox-wide fields (limits, peak, cache, OOM kills) 0.
    ProcessStats,
    /// Answer with the agent's hello.
    Ping,
    /// Try to connect to `port` on the sandbox's loopback (127.0.0.1, then ::1) within a
    /// second: a container's readiness check. Answered with `probed`.
    ProbeTcp {
        /// The TCP port.
        port: u16,
    },
    /// Connect to `port` on the sandbox's loopback (127.0.0.1, then ::1) and carry that
    /// connection's bytes from here on: a microVM pod's inbound connection, which arrived at
    /// the pod's network namespace on the host. Answered with `connected`, then raw bytes both
    /// ways; or `error`: `not_found` (nothing listens there, or, with `wildcard_only`, only on
    /// a loopback address), `permission_denied` (the agent's own egress proxy port, never
    /// reachable from outside), `io_error`.
    ConnectTcp {
        /// The TCP port.
        port: u16,
        /// The connection came to the pod's address, not its loopback: only a listener on
        /// every address (`0.0.0.0` or `::`) takes it, as a runc pod's loopback-only service
        /// is not reached on its pod IP.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        wildcard_only: bool,
    },
    /// A namespace sandbox's new egress uplink (a restarted daemon's, live restore): right
    /// after this message, in a message of its own, comes one byte carrying a connected Unix
    /// stream socket (`SCM_RIGHTS`); the agent sends its proxy's listening socket over it and
    /// holds it open instead of the one it connected before entering (whose daemon is gone):
    /// the new daemon accepts the proxy's connections from then on.
    /// Answered with `egress_uplinked`, or `error` when the sandbox has no such proxy.
    EgressUplink,
    /// A new container in a running sandbox. In a namespace sandbox its container factory
    /// makes it: right after this message come two messages of one byte each, the first
    /// carrying the container's image (a detached, read-only mount idmapped into the sandbox,
    /// made by the host), the second its agent's listening Unix socket (bound on the host).
    /// In a microVM (`disk` given) nothing follows: the image is on that disk, an empty slot
    /// the host gave the image before asking, and the agent serves on the vsock port of
    /// `index`. Answered with `container_added`, or `error` (`invalid_request`: the request
    /// or a descriptor is missing or wrong; `io_error`: it could not be made).
    AddContainer {
        /// Its name (a DNS label, not `main`).
        name: String,
        /// Its place among every container the sandbox ever had (never reused): it names the
        /// container's directory on the sandbox's scratch.
        index: usize,
        /// The shared directories it mounts.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        shared: Vec<SharedDir>,
        /// It joins the PID namespace of the sandbox's own root (whose agent is its PID 1)
        /// instead of getting one of its own: Kubernetes' `shareProcessNamespace`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        share_pids: bool,
        /// Namespace sandboxes: its first command is PID 1 of its own PID namespace, as
        /// under runc, rather than its agent (never with `share_pids`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        command_is_pid1: bool,
        /// In a microVM: the disk holding its image.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disk: Option<ContainerDisk>,
        /// Its security settings in their text form (`contract::container_security`: `ro`,
        /// `nnp`, `caps:HEX`); empty: none beyond the sandbox's rules.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        security: String,
        /// Namespace sandboxes: where each host path goes in it; the host's mount of each
        /// follows the image and the listener on the connection, in this order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        host_paths: Vec<String>,
    },
    /// In a microVM: wait until nothing in the guest holds the disk `disk` (a removed
    /// container's: its mounts go when its last process has), so the host may give it another
    /// image. Answered with `disk_released`, or `error` (`not_found`: no such disk;
    /// `io_error`: still held after 10 s).
    ReleaseDisk {
        /// The disk's serial.
        disk: String,
    },
    /// Sync and end the VM (or the namespace sandbox).
    Shutdown,
}

/// The disk a microVM's added container's image is on: an empty slot reserved at boot, given
/// the image by the host before it asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerDisk {
    /// Its serial.
    pub serial: String,
    /// Its capacity with the image, in 512-byte sectors: the guest waits until its kernel
    /// sees it (the device announces the change, the kernel applies it from a work queue).
    pub sectors: u64,
}

/// A shared directory of the sandbox's scratch mounted in a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedDir {
    /// The directory's name: the same name is the same directory.
    pub name: String,
    /// Where it appears in the container.
    pub path: String,
    /// Mounted read-only there.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// The ids a command runs with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunAs {
    /// The user id.
    pub uid: u32,
    /// The primary group id.
    pub gid: u32,
    /// Supplementary group ids (at most [`MAX_GROUPS`]).
    #[serde(default)]
    pub groups: Vec<u32>,
}

pub use crate::types::MAX_GROUPS;

/// The agent's JSON answer to the requests that have one (not `exec`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum AgentReply {
    /// The request failed; `code` is one of `invalid_request`, `not_found`, `is_a_directory`,
    /// `permission_denied`, `io_error`.
    Error(ErrorBody),
    /// The result of `put_files`.
    Files(FilesPutResult),
    /// `get_file` succeeded: exactly `size` raw bytes follow.
    File {
        /// The file's length in bytes.
        size: u64,
        /// Its permission bits (`st_mode & 0o7777`); absent from an older agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
        /// When it was last modified, in seconds since the Unix epoch; absent from an older
        /// agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        modified: Option<i64>,
    },
    /// The answer to `ping`.
    Pong(Hello),
    /// The answer to `shutdown`, sent before the agent ends the VM.
    ShuttingDown,
    /// The answer to `signal`: it was sent.
    Signaled,
    /// The answer to `stats` and `process_stats`.
    Stats(crate::SandboxStats),
    /// The answer to `attach`: the command's status as its frame stream starts.
    Attached(ExecStatus),
    /// The answer to `execs`.
    Execs(ExecList),
    /// The answer to `egress_uplink`: the new uplink is in use.
    EgressUplinked,
    /// The answer to `release_disk`: nothing holds the disk.
    DiskReleased,
    /// The answer to `add_container`: its agent runs.
    ContainerAdded {
        /// The agent's pid, as the sandbox's PID 1 sees it.
        pid: i32,
    },
    /// The answer to `probe_tcp`.
    Probed {
        /// Whether something accepted the connection.
        open: bool,
    },
    /// The answer to `connect_tcp`: the sandbox's port accepted; raw bytes follow both ways.
    Connected,
    /// The answer to `get_tree`: the archive's frames follow.
    Tree,
    /// The payload of `get_tree`'s `exit` frame when the archive is whole.
    TreeSent(TreeSummary),
}

/// What a `get_tree` archive holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeSummary {
    /// Regular files archived.
    pub files: u64,
    /// Directories archived (the top one included).
    pub dirs: u64,
    /// Symbolic links archived.
    pub links: u64,
    /// Other entries archived (fifos, device nodes) as headers without data.
    pub special: u64,
    /// Sockets left out: a tar archive cannot hold one.
    pub sockets_skipped: u64,
    /// Bytes of the files' contents.
    pub bytes: u64,
}

/// The output an agent keeps per command for a client that re-attaches, unless the host asks
/// for another size: enough for a build log's last screens, small beside a sandbox's memory.
pub const DEFAULT_TAIL_BYTES: u64 = 1024 * 1024;

/// The most a host may ask an agent to keep per command.
pub const MAX_TAIL_BYTES: u64 = 64 * 1024 * 1024;

/// What the agent says when it is ready (and in answer to `ping`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The agent's crate version.
    pub agent_version: String,
    /// [`PROTOCOL_VERSION`] of the agent.
    pub protocol: u32,
    /// `uname -r` of the guest kernel.
    pub kernel_release: String,
    /// The guest's `/proc/uptime` when the agent became ready, in milliseconds.
    pub uptime_ms: u64,
    /// The agent's PID (1 when it is the guest's init).
    pub pid: u32,
}

impl Hello {
    /// Whether this agent speaks this host's protocol; the error says what to do when not.
    pub fn check_protocol(&self) -> Result<(), String> {
        if self.protocol == PROTOCOL_VERSION {
            Ok(())
        } else {
            Err(format!(
                "the agent (crucible-agent {}) speaks protocol {}, this daemon protocol {}: \
                 rebuild the guest image with this version (`cargo xtask build-image`)",
                self.agent_version, self.protocol, PROTOCOL_VERSION
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_agent_of_this_protocol_is_spoken_to() {
        let mut hello = Hello {
            agent_version: "0.1.0".into(),
            protocol: PROTOCOL_VERSION,
            kernel_release: "6.12".into(),
            uptime_ms: 1,
            pid: 1,
        };
        assert_eq!(hello.check_protocol(), Ok(()));
        hello.protocol = PROTOCOL_VERSION - 1;
        let err = hello.check_protocol().expect_err("an older agent");
        assert!(
            err.contains(&format!("speaks protocol {}", PROTOCOL_VERSION - 1))
                && err.contains("cargo xtask build-image"),
            "{err}"
        );
    }

    #[test]
    fn requests_are_tagged_by_op() {
        let json = serde_json::to_string(&AgentRequest::GetFile {
            path: "/etc/hostname".into(),
        })
        .expect("serializes");
        assert_eq!(json, r#"{"op":"get_file","path":"/etc/hostname"}"#);
        let ping: AgentRequest = serde_json::from_str(r#"{"op":"ping"}"#).expect("parses");
        assert_eq!(ping, AgentRequest::Ping);
        let exec: AgentRequest =
            serde_json::from_str(r#"{"op":"exec","request":{"cmd":["true"]}}"#).expect("parses");
        assert_eq!(
            exec,
            AgentRequest::Exec {
                request: ExecRequest::new(["true"]),
                interactive: false,
                user: None,
                tail_bytes: None,
            }
        );
    }

    #[test]
    fn replies_are_tagged_by_reply() {
        let json = serde_json::to_string(&AgentReply::File {
            size: 3,
            mode: None,
            modified: None,
        })
        .expect("serializes");
        assert_eq!(json, r#"{"reply":"file","size":3}"#);
        let err: AgentReply =
            serde_json::from_str(r#"{"reply":"error","code":"not_found","message":"no /x"}"#)
                .expect("parses");
        assert_eq!(err, AgentReply::Error(ErrorBody::new("not_found", "no /x")));
    }
}
