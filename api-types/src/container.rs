//! The JSON types of a sandbox's containers: several images in one sandbox, as a Kubernetes
//! pod's containers or a CI job's `services:` — sharing its network (`localhost`), IPC, limits
//! and the shared directories they mount, each with its own root, main process and log.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One entry of `"containers"` in a create request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ContainerRequest {
    /// Its name, used as `?container=NAME`: 1 to 63 of `a-z`, `0-9` and `-`, starting and
    /// ending with a letter or a digit; not `main` (the sandbox's own root).
    pub name: String,
    /// Its image: `"default"` (also when absent) or one imported with `POST /images`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Its main process's entrypoint, replacing the image's `Entrypoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    /// Its main process's arguments, replacing the image's `Cmd` (Docker's `command`). With
    /// neither this nor an entrypoint (the request's or the image's), the container has no
    /// main process: it is a root to run commands in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Environment of its main process and of every command run in it, over the sandbox's
    /// `env` and its image's `Env`: at most 1,024 variables and 64 KiB of names and values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The directory its main process and commands start in, over its image's `WorkingDir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Who its main process and commands run as (`uid`, `uid:gid`, `name`, `name:group`,
    /// resolved against its image's accounts), over its image's `User`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// What happens when its main process exits: `no` (default) or `on-failure` (started
    /// again after a non-zero exit, after 0.1 s, doubling to at most 10 s).
    #[serde(default)]
    pub restart: RestartPolicy,
    /// When it counts as ready; absent: once its main process has started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<ReadyCheck>,
    /// Containers that must be ready before its main process starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Shared directories it mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<SharedMount>,
    /// It joins the PID namespace of the sandbox's own root (`main`, whose agent is its PID
    /// 1), as a member of a Kubernetes pod with `shareProcessNamespace`: it sees, and may
    /// signal, the processes of `main` and of every container that joined, and they see its.
    /// Default `false`: a PID namespace of its own (the sandbox's `share_process_namespace`
    /// makes every container join).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share_process_namespace: bool,
    /// Its first command (its `command`, or the first exec in it) is PID 1 of its PID
    /// namespace, as under runc and `docker run`, instead of its agent, which stays outside
    /// that namespace: a signal reaches it as a PID 1 receives one (one it has no handler for
    /// is ignored, but `SIGKILL`), and when it exits every process of the container ends and
    /// no command can start there again. What the Kubernetes shim asks for each container.
    /// Namespace backend only; not with `share_process_namespace` or a `restart` other than
    /// `"no"` (`400`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub command_is_pid1: bool,
    /// What its processes may do, as a Kubernetes container's `securityContext` asks: within
    /// the sandbox's own rules, never beyond them. Namespace backend only (a microVM answers
    /// `400`).
    #[serde(default, skip_serializing_if = "ContainerSecurity::is_default")]
    pub security: ContainerSecurity,
    /// Host directories it mounts (Kubernetes `hostPath` volumes): at most 16, each
    /// idmapped so that host uid 0 is the sandbox's root (what the sandbox's root writes
    /// there is the host root's), `nosuid` and `nodev`. Namespace backend, and only for a
    /// container added to a running sandbox (`POST /sandboxes/{id}/containers`); only the
    /// admin key or the daemon's Unix socket may ask (`403` otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_paths: Vec<HostPath>,
}

/// A host directory mounted into a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HostPath {
    /// The host directory: an absolute path; a symlink to a directory is followed, once, by
    /// the daemon.
    pub source: String,
    /// Where it appears in the container: a plain absolute path of ASCII letters, digits and
    /// `/._-,@:`, not in `/proc`, `/dev` or `/sys`; the directories on the way are made
    /// (none may be a symlink of the image).
    pub path: String,
    /// Mounted read-only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// How mounts the host makes below it later reach the container.
    #[serde(default)]
    pub propagation: HostPathPropagation,
}

/// How a host path takes the host's later mounts (Kubernetes' `mountPropagation`; its
/// `Bidirectional` is refused: it would let the sandbox mount on the host).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum HostPathPropagation {
    /// Neither way (`rprivate`, Kubernetes' `None`).
    #[default]
    Private,
    /// The host's mounts below it appear in the container (`rslave`, `HostToContainer`).
    HostToContainer,
}

/// `"security"` of a container. Each setting only takes away from what the sandbox allows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ContainerSecurity {
    /// Its root filesystem is mounted read-only (`readOnlyRootFilesystem`, `docker run
    /// --read-only`): a write there fails with `EROFS`. Its shared directories, `/tmp`,
    /// `/dev/shm` and `/proc` are mounts of their own and keep their modes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only_root: bool,
    /// No process of it gains privileges through `execve`: a setuid binary runs with its
    /// caller's ids, file capabilities are not granted (`allowPrivilegeEscalation: false`,
    /// `--security-opt no-new-privileges`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_new_privileges: bool,
    /// The capabilities its commands may hold at most (their bounding set): names as Docker
    /// and Kubernetes write them (`CAP_CHOWN` or `CHOWN`, any case), `ALL` for the whole set
    /// a sandbox grants by default (`CHOWN`, `DAC_OVERRIDE`, `FOWNER`, `FSETID`, `KILL`,
    /// `SETGID`, `SETUID`, `SETPCAP`, `NET_BIND_SERVICE`, `SYS_CHROOT`, `SETFCAP`), `[]` for
    /// none. Any other capability (`SYS_ADMIN`, `NET_ADMIN`, …) is granted too, within the
    /// sandbox's user namespace: it acts on what the sandbox owns (its hostname, its own
    /// network namespace), never on the host's, and the sandbox's seccomp filter still
    /// refuses mounts, new namespaces, the keyring, `bpf`, packet and netfilter sockets. A
    /// name that is no Linux capability is a `400` naming it. Absent: the default set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Vec<String>>,
    /// Paths hidden from it (OCI's and Kubernetes' `maskedPaths`): a directory is covered by
    /// an empty read-only tmpfs, anything else by `/dev/null`. A path missing from its root is left
    /// alone, as runc does; a symlink is followed within the root. At most 64, each absolute,
    /// at most 256 bytes of ASCII letters, digits and `/._-,@:`, with no `.` or `..`. Its
    /// `/proc` already hides what runc's defaults hide (`/proc/kcore`, `/proc/keys`, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked_paths: Vec<String>,
    /// Paths of it made read-only (OCI's `readonlyPaths`): each is bound on itself read-only,
    /// the mounts below it included; the same rules as `masked_paths`. Its `/proc` already
    /// has runc's defaults (`/proc/sys`, `/proc/bus`, …) read-only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only_paths: Vec<String>,
    /// Files that stay writable when its root is read-only, as kubelet's `/etc/hosts`,
    /// `/etc/hostname` and `/etc/resolv.conf` do: each becomes a mount of its own, on a tmpfs
    /// of the container's (1 MiB for them all), holding the image's file (empty if the image
    /// has none). A symlink is followed within the root; a file is written in place (`PUT`
    /// of `/files` too), never replaced. The same rules as `masked_paths`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable_files: Vec<String>,
    /// A seccomp profile of its own (OCI's `linux.seccomp`, Docker's `--security-opt
    /// seccomp=FILE`, a Kubernetes `Localhost` or `RuntimeDefault` profile), stacked on the
    /// sandbox's own filter: a call must pass both, so a profile can refuse more but never
    /// allow what the sandbox refuses (no profile makes a container unconfined). It binds the
    /// container's agent too, as runc's binds a container's init: a profile that refuses
    /// what starting a command takes (`execve`, `clone`, `wait4`, …) leaves the container
    /// unable to run one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<SeccompProfile>,
}

/// A seccomp profile, as OCI's `linux.seccomp` writes one (names in snake case).
/// Architectures are not listed: a sandbox runs x86_64 calls, and its own filter refuses
/// every other ABI.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SeccompProfile {
    /// What a call no rule matches gets: `SCMP_ACT_ALLOW`, `SCMP_ACT_ERRNO`,
    /// `SCMP_ACT_KILL` (`_THREAD`), `SCMP_ACT_KILL_PROCESS`, `SCMP_ACT_TRAP` or
    /// `SCMP_ACT_TRACE`. `SCMP_ACT_NOTIFY` is refused (crucible runs no listener), and so is
    /// `SCMP_ACT_LOG` (it would have a tenant write the host's kernel log at will).
    pub default_action: String,
    /// The errno of a default `SCMP_ACT_ERRNO` (default `EPERM`), at most 4095.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_errno_ret: Option<u32>,
    /// The rules, tried in order for a call; at most 512, naming at most 2,048 calls in all.
    /// A name x86_64 does not have is skipped, as runc skips them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syscalls: Vec<SeccompRule>,
}

/// One rule of a [`SeccompProfile`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SeccompRule {
    /// The system calls it applies to (`chmod`, `fchmodat`, …).
    pub names: Vec<String>,
    /// What they get when every check of `args` holds; the same names as `default_action`.
    pub action: String,
    /// The errno of `SCMP_ACT_ERRNO` (default `EPERM`) or the data of `SCMP_ACT_TRACE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno_ret: Option<u32>,
    /// Argument checks, all of which must hold (at most 6); one argument checked twice holds
    /// when either check does, as runc reads it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<SeccompArg>,
}

/// An argument check of a [`SeccompRule`], on the 64-bit unsigned value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SeccompArg {
    /// Which argument, 0–5.
    pub index: u8,
    /// What it is compared with (the mask, for `SCMP_CMP_MASKED_EQ`).
    pub value: u64,
    /// What the masked argument must equal (`SCMP_CMP_MASKED_EQ` only).
    #[serde(default)]
    pub value_two: u64,
    /// `SCMP_CMP_NE`, `SCMP_CMP_LT`, `SCMP_CMP_LE`, `SCMP_CMP_EQ`, `SCMP_CMP_GE`,
    /// `SCMP_CMP_GT` or `SCMP_CMP_MASKED_EQ`.
    pub op: String,
}

impl ContainerSecurity {
    /// Whether it asks for nothing beyond the sandbox's own rules.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// A shared directory (a Kubernetes `emptyDir`): a directory of the sandbox's writable
/// scratch, empty at creation, the same files in every container that mounts it by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SharedMount {
    /// The directory's name (the same rules as a container's).
    pub name: String,
    /// Where it appears in this container (absolute, not in `/proc`, `/dev` or `/sys`, and
    /// not through a symlink of its image: a 400 names the link).
    pub path: String,
    /// Mounted read-only in this container (as a Kubernetes `volumeMounts[].readOnly`): it
    /// reads what the containers that mount it writable write.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// `"restart"` of a container.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Never started again.
    #[default]
    No,
    /// Started again after a non-zero exit (or a signal).
    OnFailure,
}

/// `"ready"` of a container: exactly one of `tcp_port` and `command`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ReadyCheck {
    /// Ready once something accepts connections on this port of the sandbox's loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_port: Option<u16>,
    /// Ready once this command, run in the container, exits with 0 (tried at once, then
    /// after 10 ms, the wait doubling to 0.2 s; so is `tcp_port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// How long it may take, in seconds (default 60): a container not ready by then fails
    /// the sandbox's creation, which answers with its log's last lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
}

/// Where a container is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ContainerState {
    /// Waiting for the containers it depends on.
    Waiting,
    /// Its main process runs (or it has none), its ready check has not passed yet.
    Starting,
    /// Ready: its check passed (or it has none), its main process (if any) runs.
    Ready,
    /// Its main process exited and will not be started again.
    Exited,
    /// It could not be started, or its agent is gone.
    Failed,
}

/// A container, as `GET /sandboxes/{id}/containers` and a sandbox's `containers` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ContainerInfo {
    /// Its name.
    pub name: String,
    /// Its image.
    pub image: String,
    /// Where it is in its life.
    pub state: ContainerState,
    /// Its main process's command line (empty: it has none).
    pub command: Vec<String>,
    /// The exec id of its main process (`GET …/execs/{exec_id}?container=NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_id: Option<String>,
    /// How many times its main process was started again.
    pub restarts: u32,
    /// Its main process's last exit status (-1: killed by a signal or never started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it failed, or why its main process could not run.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// The body of `GET /sandboxes/{id}/containers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ContainerList {
    /// Its containers, in the order they were asked for.
    pub containers: Vec<ContainerInfo>,
}
