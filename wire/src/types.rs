//! The JSON types of the protocol, with exactly the spec's field names.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Most supplementary groups a command may be given (the kernel's `NGROUPS_MAX` is 65536;
/// an image needing more is a mistake).
pub const MAX_GROUPS: usize = 256;

/// Longest accepted `timeout_s`: one week. Anything longer is a mistake, not a CI job.
pub const MAX_TIMEOUT_S: i64 = 7 * 24 * 3600;
/// Most arguments accepted in `cmd`.
pub const MAX_ARGS: usize = 65_536;
/// Most variables accepted in `env`.
pub const MAX_ENV: usize = 4_096;
/// Largest total size of `cmd`, `env` and `cwd` together (Linux's default `ARG_MAX` is 2 MiB,
/// shared between argv and the environment).
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// A command to run in the sandbox: the body of `POST /sandboxes/{id}/exec` and the first
/// WebSocket message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The command and its arguments; `cmd[0]` is resolved on `PATH` inside the guest.
    #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
    pub cmd: Vec<String>,
    /// Variables added to (not replacing) the agent's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory; empty inherits the agent's.
    #[serde(default)]
    pub cwd: String,
    /// Deadline in seconds after which the agent kills the command's process group; 0 = none.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(min = 0, max = 604800)))]
    pub timeout_s: i64,
    /// Who the command runs as, as `docker exec --user` takes it: `uid`, `uid:gid`, `name` or
    /// `name:group`, resolved against the sandbox image's `/etc/passwd` and `/etc/group`.
    /// Empty: the sandbox's user (its `user`, else its image's `User`, else root).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// Supplementary groups added for this command, as `docker run --group-add`: gids, or group
    /// names of the image's `/etc/group`; on top of the user's own memberships.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 256)))]
    pub group_add: Vec<String>,
    /// Resource limits the command starts with (`setrlimit`), as OCI's `process.rlimits` and
    /// `docker run --ulimit` give them. A limit not listed keeps the agent's default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schemars(length(max = 16)))]
    pub rlimits: Vec<Rlimit>,
    /// A name for the running command, unique in its sandbox while it runs, so that
    /// `POST /sandboxes/{id}/signal {"exec_id": …}` can signal it alone: 1 to 128 letters,
    /// digits, `.`, `_` and `-` (containerd's exec ids fit). Empty: the command has none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^[A-Za-z0-9._-]{0,128}$"))
    )]
    pub exec_id: String,
    /// What happens to the command when the connection that started it drops (the client
    /// went away, a proxy timed out, the daemon restarted): `keep` runs it on, its output kept
    /// in a bounded tail, and a client re-attaches by `exec_id`; `kill` kills its process
    /// group. Absent: `keep` for a one-shot exec, `kill` for an interactive session (closing
    /// its connection ends it, as the protocol says). An interactive session that asks for
    /// `keep` outlives its connection too: a re-attach (`?stdin=1`) carries its stdin on from
    /// the bytes it took (`ExecStatus::stdin_bytes`), and only `stdin_close` ends its input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_disconnect: Option<OnDisconnect>,
    /// Whether the command runs on a pseudo-terminal, as `docker exec -t` runs it: the
    /// terminal is its stdin, stdout and stderr and its controlling terminal, so everything
    /// it writes arrives as stdout frames (no stderr frames) with the terminal's line
    /// endings (`\r\n`), and interactive input goes through the terminal's line discipline
    /// (`^C` interrupts, `^D` at the start of a line ends a read). `resize` frames change its
    /// size. `false` (the default): pipes, no terminal.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tty: bool,
    /// The terminal's size when the command starts; absent: 24 rows of 80 columns. Only with
    /// `tty`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty_size: Option<TerminalSize>,
}

/// A terminal's size in characters: the `tty_size` of an exec request and the payload of a
/// `resize` frame (`{"rows":40,"cols":120}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    /// Lines.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

impl Default for TerminalSize {
    /// A VT100's 24 by 80, what a terminal with no size reports.
    fn default() -> Self {
        TerminalSize { rows: 24, cols: 80 }
    }
}

/// What a command does when the connection that started it drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnDisconnect {
    /// Runs on; a client re-attaches by `exec_id`.
    Keep,
    /// Its process group is killed.
    Kill,
}

/// Whether a command still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExecState {
    /// It runs.
    Running,
    /// It has exited; `result` says how.
    Exited,
}

/// A command the agent can find by `exec_id`: one that runs, or one that ended while no client
/// was attached and whose result has not been collected yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecStatus {
    /// Its name.
    pub exec_id: String,
    /// The command and its arguments.
    pub cmd: Vec<String>,
    /// Running or exited.
    pub state: ExecState,
    /// Its process id inside the sandbox (also its process group).
    pub pid: i32,
    /// When it started, in milliseconds since the Unix epoch (the guest's clock).
    pub started_unix_ms: u64,
    /// Whether a client is attached to its output now.
    pub attached: bool,
    /// Whether it outlives its connection (`on_disconnect: keep`).
    pub keep: bool,
    /// Output bytes (stdout and stderr payload, in stream order) produced so far: the end of
    /// its output stream, where an attach with `offset` equal to it starts live.
    pub output_bytes: u64,
    /// The oldest output byte still kept: an attach from an earlier offset misses the bytes
    /// in between (reported as dropped).
    pub output_kept_from: u64,
    /// How it ended, once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ExecResult>,
    /// An interactive command's stdin: the payload bytes of the stdin frames it had taken
    /// (delivered to it, or queued for it) when its last client left (0 before any did; it
    /// moves on while a client is attached). A client that re-attaches sends its input on
    /// from there: frames it sent past it were lost with the connection. Absent for a
    /// one-shot command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_bytes: Option<u64>,
    /// Whether an interactive command's stdin was closed (`stdin_close`): nothing more is
    /// taken.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin_closed: bool,
}

/// The commands of a sandbox that can be found by `exec_id`: the answer to
/// `GET /sandboxes/{id}/execs` (and the agent's to `execs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecList {
    /// The commands, oldest first.
    pub execs: Vec<ExecStatus>,
}

/// One resource limit: `setrlimit(type, {soft, hard})`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Rlimit {
    /// The resource, as OCI spells it (`RLIMIT_NOFILE`) or as Docker's `--ulimit` does
    /// (`nofile`).
    #[serde(rename = "type")]
    pub kind: String,
    /// The soft limit (what the command gets); 18446744073709551615 is unlimited.
    pub soft: u64,
    /// The hard limit (how far the command may raise it); at least `soft`.
    pub hard: u64,
}

/// The resources `setrlimit` knows, by their short names (`RLIMIT_` + upper case is the
/// long form).
pub const RLIMIT_RESOURCES: [&str; 16] = [
    "as",
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
];

impl Rlimit {
    /// The short name of its resource (`nofile`), when it names one of [`RLIMIT_RESOURCES`].
    pub fn resource(&self) -> Option<&'static str> {
        let short = match self.kind.strip_prefix("RLIMIT_") {
            Some(long) if long.bytes().all(|b| !b.is_ascii_lowercase()) => {
                long.to_ascii_lowercase()
            }
            Some(_) => return None,
            None => self.kind.clone(),
        };
        RLIMIT_RESOURCES.iter().copied().find(|r| *r == short)
    }
}

/// Longest `exec_id`: room for a containerd identifier (at most 76 characters) with a
/// prefix.
pub const MAX_EXEC_ID: usize = 128;

/// Whether `id` can name a running command (see [`ExecRequest::exec_id`]).
pub fn valid_exec_id(id: &str) -> bool {
    (1..=MAX_EXEC_ID).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Why an [`ExecRequest`] was refused. The message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ValidationError {
    /// The offending field, as spelled in JSON (`cmd[2]`, `env.PATH`, `timeout_s`).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ValidationError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ValidationError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl ExecRequest {
    /// A request for `cmd` with no env, cwd or timeout.
    pub fn new<I, S>(cmd: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecRequest {
            cmd: cmd.into_iter().map(Into::into).collect(),
            ..ExecRequest::default()
        }
    }

    /// Checks what JSON parsing cannot: a non-empty command, no NUL bytes anywhere (they cannot
    /// cross `execve`), valid env names, an absolute `cwd`, and sane sizes and timeouts.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.tty_size.is_some() && !self.tty {
            return Err(ValidationError::new(
                "tty_size",
                "sizes a terminal, and only a request with `tty` has one",
            ));
        }
        if self.cmd.is_empty() {
            return Err(ValidationError::new("cmd", "must not be empty"));
        }
        if self.cmd[0].is_empty() {
            return Err(ValidationError::new(
                "cmd[0]",
                "the program name must not be empty",
            ));
        }
        if self.cmd.len() > MAX_ARGS {
            return Err(ValidationError::new(
                "cmd",
                format!(
                    "{} arguments, more than the {MAX_ARGS} allowed",
                    self.cmd.len()
                ),
            ));
        }
        for (i, arg) in self.cmd.iter().enumerate() {
            if arg.contains('\0') {
                return Err(ValidationError::new(
                    format!("cmd[{i}]"),
                    "contains a NUL byte",
                ));
            }
        }
        if self.env.len() > MAX_ENV {
            return Err(ValidationError::new(
                "env",
                format!(
                    "{} variables, more than the {MAX_ENV} allowed",
                    self.env.len()
                ),
            ));
        }
        for (name, value) in &self.env {
            if name.is_empty() {
                return Err(ValidationError::new("env", "a variable name is empty"));
            }
            if name.contains('=') || name.contains('\0') {
                return Err(ValidationError::new(
                    format!("env.{}", name.escape_debug()),
                    "variable names must not contain '=' or NUL",
                ));
            }
            if value.contains('\0') {
                return Err(ValidationError::new(
                    format!("env.{name}"),
                    "value contains a NUL byte",
                ));
            }
        }
        if self.cwd.contains('\0') {
            return Err(ValidationError::new("cwd", "contains a NUL byte"));
        }
        if !self.cwd.is_empty() && !self.cwd.starts_with('/') {
            return Err(ValidationError::new(
                "cwd",
                format!("must be an absolute path, got {:?}", self.cwd),
            ));
        }
        if !(0..=MAX_TIMEOUT_S).contains(&self.timeout_s) {
            return Err(ValidationError::new(
                "timeout_s",
                format!(
                    "must be between 0 and {MAX_TIMEOUT_S}, got {}",
                    self.timeout_s
                ),
            ));
        }
        if self.user.len() > 256 || self.user.contains(['\0', '\n']) {
            return Err(ValidationError::new(
                "user",
                "must be uid, uid:gid, name or name:group (at most 256 bytes, no NUL or newline)",
            ));
        }
        if self.group_add.len() > MAX_GROUPS {
            return Err(ValidationError::new(
                "group_add",
                format!(
                    "{} groups, more than the {} allowed",
                    self.group_add.len(),
                    MAX_GROUPS
                ),
            ));
        }
        for (i, group) in self.group_add.iter().enumerate() {
            if group.is_empty() || group.len() > 64 || group.contains([':', '\n', '\0']) {
                return Err(ValidationError::new(
                    format!("group_add[{i}]"),
                    "must be a gid or a group name (1 to 64 bytes, no ':', newline or NUL)",
                ));
            }
        }
        if self.rlimits.len() > RLIMIT_RESOURCES.len() {
            return Err(ValidationError::new(
                "rlimits",
                format!(
                    "{} limits, more than the {} resources there are",
                    self.rlimits.len(),
                    RLIMIT_RESOURCES.len()
                ),
            ));
        }
        let mut seen = Vec::new();
        for (i, limit) in self.rlimits.iter().enumerate() {
            let field = format!("rlimits[{i}]");
            let Some(resource) = limit.resource() else {
                return Err(ValidationError::new(
                    format!("{field}.type"),
                    format!(
                        "{:?} is not a resource: one of {} (or RLIMIT_ and its upper case)",
                        limit.kind.escape_debug().to_string(),
                        RLIMIT_RESOURCES.join(", ")
                    ),
                ));
            };
            if seen.contains(&resource) {
                return Err(ValidationError::new(
                    format!("{field}.type"),
                    format!("{resource} is limited twice"),
                ));
            }
            seen.push(resource);
            if limit.soft > limit.hard {
                return Err(ValidationError::new(
                    field,
                    format!(
                        "soft limit {} is above the hard limit {}",
                        limit.soft, limit.hard
                    ),
                ));
            }
        }
        if !self.exec_id.is_empty() && !valid_exec_id(&self.exec_id) {
            return Err(ValidationError::new(
                "exec_id",
                format!(
                    "{:?} is not 1 to {MAX_EXEC_ID} letters, digits, '.', '_' or '-'",
                    self.exec_id.escape_debug().to_string()
                ),
            ));
        }
        let total: usize = self.cmd.iter().map(|a| a.len() + 1).sum::<usize>()
            + self
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len() + 2)
                .sum::<usize>()
            + self.cwd.len();
        if total > MAX_REQUEST_BYTES {
            return Err(ValidationError::new(
                "cmd",
                format!(
                    "cmd, env and cwd total {total} bytes, more than the {MAX_REQUEST_BYTES} allowed"
                ),
            ));
        }
        Ok(())
    }
}

/// Resource usage of a finished command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Usage {
    /// User CPU time.
    pub cpu_user_ms: u64,
    /// System CPU time.
    pub cpu_sys_ms: u64,
    /// Peak resident set size.
    pub peak_memory_bytes: u64,
    /// Page faults that needed I/O.
    pub page_faults_major: u64,
    /// Times the command was preempted.
    pub context_switches_involuntary: u64,
    /// Bytes read from storage (approximate for very short commands).
    pub io_read_bytes: u64,
    /// Bytes written to storage (approximate for very short commands).
    pub io_write_bytes: u64,
}

/// The payload of the exit frame: how a command ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecResult {
    /// The exit status; -1 when the process was killed by a signal or never started.
    pub exit_code: i32,
    /// Wall time from spawn to exit.
    #[serde(default)]
    pub duration_ms: u64,
    /// The signal name (`"SIGKILL"`) when the process was signalled; empty otherwise.
    #[serde(default)]
    pub signal: String,
    /// Whether the agent killed the command at its `timeout_s` deadline.
    #[serde(default)]
    pub timed_out: bool,
    /// Best-effort: whether the kernel's OOM killer ended the command.
    #[serde(default)]
    pub oom_killed: bool,
    /// Why the command could not run or was lost; empty on a normal exit.
    #[serde(default)]
    pub error: String,
    /// Resource usage; `null` when the agent collected none ("no data", not zeroes).
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Output bytes this stream never carried: its command outlived a dropped connection and
    /// produced more than the agent keeps before this client attached (absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub output_dropped_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ExecResult {
    /// The result of a command that never ran or was lost: `exit_code: -1` and `error`.
    pub fn failed(error: impl Into<String>) -> Self {
        ExecResult {
            exit_code: -1,
            error: error.into(),
            ..ExecResult::default()
        }
    }
}

/// A tar entry that `put_files` refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RefusedEntry {
    /// The entry's path as written in the archive.
    pub path: String,
    /// Why it was refused (`"escapes the destination"`, `"device nodes are not allowed"`, …).
    pub reason: String,
}

/// The answer to a file upload (`POST /sandboxes/{id}/files`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FilesPutResult {
    /// The guest directory the archive was extracted beneath.
    pub path: String,
    /// Regular files written.
    pub files: u64,
    /// Directories created.
    pub dirs: u64,
    /// Symbolic and hard links created.
    pub links: u64,
    /// File content bytes written.
    pub bytes: u64,
    /// Paths written, relative to `path`, in archive order.
    pub written: Vec<String>,
    /// The first refused entry, if any; extraction stopped there and nothing was written outside
    /// `path`. Entries before it were extracted.
    pub refused: Option<RefusedEntry>,
}

/// The JSON body of every 4xx/5xx the daemon sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorBody {
    /// A stable machine-readable code (`"not_found"`, `"invalid_request"`, `"unauthorized"`, …).
    pub code: String,
    /// A human-readable sentence saying what failed and on which input.
    pub message: String,
}

impl ErrorBody {
    /// An error envelope.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorBody {
            code: code.into(),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_result_uses_the_spec_field_names_and_null_usage() {
        let json = serde_json::to_value(ExecResult::default()).expect("serializes");
        let keys: Vec<&str> = json
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut expected = vec![
            "exit_code",
            "duration_ms",
            "signal",
            "timed_out",
            "oom_killed",
            "error",
            "usage",
        ];
        expected.sort();
        let mut keys = keys;
        keys.sort();
        assert_eq!(keys, expected);
        assert!(json["usage"].is_null());
    }

    #[test]
    fn spec_example_exec_result_parses() {
        let text = r#"{"exit_code":0,"duration_ms":247,"signal":"","timed_out":false,
            "oom_killed":false,"error":"","usage":{"cpu_user_ms":180,"cpu_sys_ms":40,
            "peak_memory_bytes":35389440,"page_faults_major":2,
            "context_switches_involuntary":14,"io_read_bytes":0,"io_write_bytes":0}}"#;
        let r: ExecResult = serde_json::from_str(text).expect("parses");
        assert_eq!(r.duration_ms, 247);
        assert_eq!(r.usage.expect("usage").peak_memory_bytes, 35389440);
    }

    #[test]
    fn exec_request_defaults_optional_fields() {
        let r: ExecRequest = serde_json::from_str(r#"{"cmd":["true"]}"#).expect("parses");
        assert_eq!(r, ExecRequest::new(["true"]));
        r.validate().expect("valid");
    }

    fn limit(kind: &str, soft: u64, hard: u64) -> Rlimit {
        Rlimit {
            kind: kind.into(),
            soft,
            hard,
        }
    }

    #[test]
    fn rlimit_types_take_the_oci_and_the_docker_spelling() {
        assert_eq!(limit("RLIMIT_NOFILE", 1, 1).resource(), Some("nofile"));
        assert_eq!(limit("nofile", 1, 1).resource(), Some("nofile"));
        assert_eq!(limit("RLIMIT_AS", 1, 1).resource(), Some("as"));
        assert_eq!(limit("RLIMIT_nofile", 1, 1).resource(), None);
        assert_eq!(limit("NOFILE", 1, 1).resource(), None);
        assert_eq!(limit("", 1, 1).resource(), None);
        let r: ExecRequest = serde_json::from_str(
            r#"{"cmd":["true"],"user":"1000:1000","exec_id":"build.1",
                "rlimits":[{"type":"RLIMIT_NOFILE","soft":64,"hard":18446744073709551615}]}"#,
        )
        .expect("parses");
        r.validate().expect("valid");
        assert_eq!(r.rlimits[0].hard, u64::MAX);
        // Requests without the new fields serialize as before (the agent's wire is unchanged).
        let plain = serde_json::to_string(&ExecRequest::new(["true"])).expect("serializes");
        assert_eq!(plain, r#"{"cmd":["true"],"env":{},"cwd":"","timeout_s":0}"#);
    }

    #[test]
    fn exec_ids_are_containerd_identifiers() {
        assert!(valid_exec_id("exec-1"));
        assert!(valid_exec_id("a.b_c-D9"));
        assert!(valid_exec_id(&"x".repeat(MAX_EXEC_ID)));
        assert!(!valid_exec_id(""));
        assert!(!valid_exec_id("a b"));
        assert!(!valid_exec_id("../x"));
        assert!(!valid_exec_id("é"));
    }

    #[test]
    fn exec_request_rejects_unknown_fields() {
        let e = serde_json::from_str::<ExecRequest>(r#"{"cmd":["true"],"timeout":3}"#)
            .expect_err("unknown field");
        assert!(e.to_string().contains("timeout"), "{e}");
    }

    #[test]
    fn validation_names_the_field() {
        let cases: Vec<(ExecRequest, &str)> = vec![
            (ExecRequest::default(), "cmd"),
            (ExecRequest::new([""]), "cmd[0]"),
            (ExecRequest::new(["echo", "a\0b"]), "cmd[1]"),
            (
                ExecRequest {
                    env: [("A=B".to_string(), "x".to_string())].into(),
                    ..ExecRequest::new(["true"])
                },
                "env.A=B",
            ),
            (
                ExecRequest {
                    env: [("A".to_string(), "x\0".to_string())].into(),
                    ..ExecRequest::new(["true"])
                },
                "env.A",
            ),
            (
                ExecRequest {
                    cwd: "relative".into(),
                    ..ExecRequest::new(["true"])
                },
                "cwd",
            ),
            (
                ExecRequest {
                    timeout_s: -1,
                    ..ExecRequest::new(["true"])
                },
                "timeout_s",
            ),
            (
                ExecRequest {
                    timeout_s: MAX_TIMEOUT_S + 1,
                    ..ExecRequest::new(["true"])
                },
                "timeout_s",
            ),
            (
                ExecRequest::new(vec!["x".repeat(MAX_REQUEST_BYTES + 1)]),
                "cmd",
            ),
            (
                ExecRequest {
                    user: "a\nb".into(),
                    ..ExecRequest::new(["true"])
                },
                "user",
            ),
            (
                ExecRequest {
                    rlimits: vec![limit("RLIMIT_NOPE", 1, 1)],
                    ..ExecRequest::new(["true"])
                },
                "rlimits[0].type",
            ),
            (
                ExecRequest {
                    rlimits: vec![limit("nofile", 1, 1), limit("RLIMIT_NOFILE", 2, 2)],
                    ..ExecRequest::new(["true"])
                },
                "rlimits[1].type",
            ),
            (
                ExecRequest {
                    rlimits: vec![limit("core", 0, 0), limit("nproc", 10, 9)],
                    ..ExecRequest::new(["true"])
                },
                "rlimits[1]",
            ),
            (
                ExecRequest {
                    group_add: vec!["wheel".into(), "a:b".into()],
                    ..ExecRequest::new(["true"])
                },
                "group_add[1]",
            ),
            (
                ExecRequest {
                    exec_id: "a/b".into(),
                    ..ExecRequest::new(["true"])
                },
                "exec_id",
            ),
            (
                ExecRequest {
                    exec_id: "x".repeat(MAX_EXEC_ID + 1),
                    ..ExecRequest::new(["true"])
                },
                "exec_id",
            ),
        ];
        for (req, field) in cases {
            let err = req.validate().expect_err("invalid");
            assert_eq!(err.field, field, "{err}");
        }
    }
}
