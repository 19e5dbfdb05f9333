//! A container's security settings, as a Kubernetes `securityContext` asks for them, in the
//! one form every hop carries them (the daemon's request to the agent, the supervisor's
//! command line, the container factory's request): words separated by spaces, `-` for none.
//!
//! - `ro`: its root is mounted read-only (its shared directories, `/tmp`, `/dev` and `/proc`
//!   are not its root);
//! - `nnp`: no process of it gains privileges through `execve` (`PR_SET_NO_NEW_PRIVS`: a
//!   setuid binary runs as its caller);
//! - `caps:HEX`: the capability bounding set of its commands, a mask (bit N: capability N)
//!   within the sandbox's own set; absent: the sandbox's whole set;
//! - `mask:PATH` (any number): a path of it hidden (OCI's `maskedPaths`);
//! - `rop:PATH` (any number): a path of it made read-only (OCI's `readonlyPaths`);
//! - `file:PATH` (any number): a file of it that is a mount of its own, writable when its
//!   root is not (kubelet's `/etc/hosts`);
//! - `bpf:HEX`: a seccomp filter of its own, stacked on the sandbox's: classic-BPF
//!   instructions of 16 hex digits each (`code << 48 | jt << 40 | jf << 32 | k`), at most
//!   [`MAX_FILTER_INSNS`].
//!
//! A path is absolute and plain ([`check_path`]): no space, `+` or `=` (the supervisor's
//! `--container` flag joins words with `+` and ends them with `=`), no `.` or `..`.

use std::fmt;
use std::str::FromStr;

/// The capabilities root keeps inside a namespace sandbox (within its user namespace), by
/// name and number: Docker's default set minus what has no use in a sandbox without a network
/// device (`NET_RAW`, `MKNOD`, `AUDIT_WRITE`). A container's `capabilities` are within it.
pub const SANDBOX_CAPABILITIES: &[(&str, u32)] = &[
    ("CAP_CHOWN", 0),
    ("CAP_DAC_OVERRIDE", 1),
    ("CAP_FOWNER", 3),
    ("CAP_FSETID", 4),
    ("CAP_KILL", 5),
    ("CAP_SETGID", 6),
    ("CAP_SETUID", 7),
    ("CAP_SETPCAP", 8),
    ("CAP_NET_BIND_SERVICE", 10),
    ("CAP_SYS_CHROOT", 18),
    ("CAP_SETFCAP", 31),
];

/// Docker's (and containerd's) default capabilities that a sandbox never grants: a spec
/// asking for them asks for no more than the default.
pub const DEFAULT_NOT_GRANTED: &[&str] = &["CAP_NET_RAW", "CAP_MKNOD", "CAP_AUDIT_WRITE"];

/// A capability's name as the kernel's headers spell it: `CAP_` and upper case, from
/// `chown`, `CHOWN` or `cap_chown`.
pub fn capability_name(name: &str) -> String {
    let upper = name.to_ascii_uppercase();
    match upper.starts_with("CAP_") {
        true => upper,
        false => format!("CAP_{upper}"),
    }
}

/// Every capability the kernel knows (Linux 6.x), by name and number. A container may ask
/// for any of them beyond [`SANDBOX_CAPABILITIES`] (Kubernetes' `capabilities.add`,
/// `privileged`): each acts within the sandbox's user namespace only, on what that namespace
/// owns, and the sandbox's seccomp filter still refuses what it refuses (mounts, new
/// namespaces, the keyring, `bpf`, netfilter's and packet sockets, …).
pub const ALL_CAPABILITIES: &[(&str, u32)] = &[
    ("CAP_CHOWN", 0),
    ("CAP_DAC_OVERRIDE", 1),
    ("CAP_DAC_READ_SEARCH", 2),
    ("CAP_FOWNER", 3),
    ("CAP_FSETID", 4),
    ("CAP_KILL", 5),
    ("CAP_SETGID", 6),
    ("CAP_SETUID", 7),
    ("CAP_SETPCAP", 8),
    ("CAP_LINUX_IMMUTABLE", 9),
    ("CAP_NET_BIND_SERVICE", 10),
    ("CAP_NET_BROADCAST", 11),
    ("CAP_NET_ADMIN", 12),
    ("CAP_NET_RAW", 13),
    ("CAP_IPC_LOCK", 14),
    ("CAP_IPC_OWNER", 15),
    ("CAP_SYS_MODULE", 16),
    ("CAP_SYS_RAWIO", 17),
    ("CAP_SYS_CHROOT", 18),
    ("CAP_SYS_PTRACE", 19),
    ("CAP_SYS_PACCT", 20),
    ("CAP_SYS_ADMIN", 21),
    ("CAP_SYS_BOOT", 22),
    ("CAP_SYS_NICE", 23),
    ("CAP_SYS_RESOURCE", 24),
    ("CAP_SYS_TIME", 25),
    ("CAP_SYS_TTY_CONFIG", 26),
    ("CAP_MKNOD", 27),
    ("CAP_LEASE", 28),
    ("CAP_AUDIT_WRITE", 29),
    ("CAP_AUDIT_CONTROL", 30),
    ("CAP_SETFCAP", 31),
    ("CAP_MAC_OVERRIDE", 32),
    ("CAP_MAC_ADMIN", 33),
    ("CAP_SYSLOG", 34),
    ("CAP_WAKE_ALARM", 35),
    ("CAP_BLOCK_SUSPEND", 36),
    ("CAP_AUDIT_READ", 37),
    ("CAP_PERFMON", 38),
    ("CAP_BPF", 39),
    ("CAP_CHECKPOINT_RESTORE", 40),
];

/// Turns capability names (`CAP_CHOWN` or `chown`, any case; `ALL`: every one of
/// [`SANDBOX_CAPABILITIES`], the sandbox's default set) into a bounding-set mask, or names
/// one the kernel does not know. Names beyond the default set are granted (see
/// [`ALL_CAPABILITIES`]).
pub fn capability_mask<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<u64, String> {
    let mut mask = 0;
    for name in names {
        if name.eq_ignore_ascii_case("ALL") {
            mask |= all_capabilities();
            continue;
        }
        let full = capability_name(name);
        let Some((_, cap)) = ALL_CAPABILITIES.iter().find(|(known, _)| *known == full) else {
            return Err(format!(
                "{name:?} is not a Linux capability (CAP_CHOWN … CAP_CHECKPOINT_RESTORE)"
            ));
        };
        mask |= 1 << cap;
    }
    Ok(mask)
}

/// The capabilities of `mask` beyond the sandbox's default set, by name.
pub fn beyond_sandbox_set(mask: u64) -> Vec<&'static str> {
    ALL_CAPABILITIES
        .iter()
        .filter(|(_, cap)| mask & (1 << cap) != 0 && all_capabilities() & (1 << cap) == 0)
        .map(|(name, _)| *name)
        .collect()
}

/// [`SANDBOX_CAPABILITIES`] as a mask.
pub fn all_capabilities() -> u64 {
    SANDBOX_CAPABILITIES
        .iter()
        .fold(0, |mask, (_, cap)| mask | (1u64 << cap))
}

/// At most this many masked paths, and as many read-only paths, per container (containerd's
/// defaults are 10 and 5).
pub const MAX_PATHS: usize = 64;

/// The longest masked or read-only path, in bytes.
pub const MAX_PATH_BYTES: usize = 256;

/// Checks a masked or read-only path: absolute, at most [`MAX_PATH_BYTES`], of ASCII letters,
/// digits and `/._-,@:` only, with no empty, `.` or `..` component and not `/` itself.
pub fn check_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') || path.len() < 2 {
        return Err(format!("{path:?} is not an absolute path below /"));
    }
    if let Some(bad) = path
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "/._-,@:".contains(*c)))
    {
        return Err(format!(
            "{path:?} has {bad:?}: a path may have ASCII letters, digits and /._-,@: only"
        ));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!(
            "{:?}… is {} bytes long, more than {MAX_PATH_BYTES}",
            path.get(..32).unwrap_or(path),
            path.len()
        ));
    }
    if path[1..].split('/').any(|c| matches!(c, "" | "." | "..")) {
        return Err(format!(
            "{path:?} is not plain: an empty, `.` or `..` component"
        ));
    }
    Ok(())
}

/// Checks a list of masked or read-only paths: each with [`check_path`], at most
/// [`MAX_PATHS`].
pub fn check_paths(paths: &[String]) -> Result<(), String> {
    if paths.len() > MAX_PATHS {
        return Err(format!("{} paths, more than {MAX_PATHS}", paths.len()));
    }
    paths.iter().try_for_each(|path| check_path(path))
}

/// At most this many host paths per container.
pub const MAX_HOST_PATHS: usize = 16;

/// The longest seccomp filter of a container's own, in instructions: half the kernel's limit
/// (`BPF_MAXINSNS`), so that its text fits the container factory's requests.
pub const MAX_FILTER_INSNS: usize = 2048;

/// A seccomp profile's bounds: rules (containerd's default profile has about 25), names over
/// all rules (it names about 380), argument checks in a rule (a call has six arguments), and
/// the largest errno a filter may return (`MAX_ERRNO`).
pub const SECCOMP_MAX_RULES: usize = 512;
/// See [`SECCOMP_MAX_RULES`].
pub const SECCOMP_MAX_NAMES: usize = 2048;
/// See [`SECCOMP_MAX_RULES`].
pub const SECCOMP_MAX_ARGS: usize = 6;
/// See [`SECCOMP_MAX_RULES`].
pub const SECCOMP_MAX_ERRNO: u32 = 4095;

/// A container's security settings; the default is the sandbox's own rules, nothing more.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContainerSecurity {
    /// Its root is mounted read-only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only_root: bool,
    /// `PR_SET_NO_NEW_PRIVS` for every process of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_new_privileges: bool,
    /// The bounding set of its commands (bit N: capability N); `None`: the sandbox's set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<u64>,
    /// Paths hidden from it: a directory under an empty read-only tmpfs, anything else under
    /// `/dev/null`; one missing from its root is left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked_paths: Vec<String>,
    /// Paths of it bound read-only on themselves; one missing from its root is left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only_paths: Vec<String>,
    /// Files of it that are each a mount of their own, on a small tmpfs of the container's,
    /// with the image's content: writable when its root is read-only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable_files: Vec<String>,
    /// A seccomp filter of its own (a compiled profile), stacked on the sandbox's: packed
    /// classic-BPF instructions; empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seccomp_filter: Vec<u64>,
}

impl ContainerSecurity {
    /// Whether it asks for nothing beyond the sandbox's rules.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Whether it asks for nothing but a seccomp filter of its own (all a microVM's
    /// container takes).
    pub fn is_only_seccomp(&self) -> bool {
        ContainerSecurity {
            seccomp_filter: Vec::new(),
            ..self.clone()
        }
        .is_default()
    }
}

impl fmt::Display for ContainerSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut words = Vec::new();
        if self.read_only_root {
            words.push("ro".to_string());
        }
        if self.no_new_privileges {
            words.push("nnp".to_string());
        }
        if let Some(mask) = self.capabilities {
            words.push(format!("caps:{mask:x}"));
        }
        for (kind, paths) in [
            ("mask", &self.masked_paths),
            ("rop", &self.read_only_paths),
            ("file", &self.writable_files),
        ] {
            words.extend(paths.iter().map(|path| format!("{kind}:{path}")));
        }
        if !self.seccomp_filter.is_empty() {
            words.push(format!("bpf:{}", filter_hex(&self.seccomp_filter)));
        }
        if words.is_empty() {
            f.write_str("-")
        } else {
            f.write_str(&words.join(" "))
        }
    }
}

impl FromStr for ContainerSecurity {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut security = ContainerSecurity::default();
        if s == "-" {
            return Ok(security);
        }
        for word in s.split(' ') {
            let repeated = match word {
                "ro" => std::mem::replace(&mut security.read_only_root, true),
                "nnp" => std::mem::replace(&mut security.no_new_privileges, true),
                _ if ["mask:", "rop:", "file:"]
                    .iter()
                    .any(|k| word.starts_with(k)) =>
                {
                    let (kind, path) = word.split_once(':').unwrap_or_default();
                    check_path(path).map_err(|why| format!("security: {kind}: {why}"))?;
                    let paths = match kind {
                        "mask" => &mut security.masked_paths,
                        "rop" => &mut security.read_only_paths,
                        _ => &mut security.writable_files,
                    };
                    if paths.len() == MAX_PATHS {
                        return Err(format!("security: more than {MAX_PATHS} {kind}: paths"));
                    }
                    paths.push(path.to_string());
                    false
                }
                _ if word.starts_with("bpf:") => {
                    let filter = parse_filter(&word["bpf:".len()..])?;
                    !std::mem::replace(&mut security.seccomp_filter, filter).is_empty()
                }
                _ => match word.strip_prefix("caps:") {
                    Some(hex) => {
                        let mask = u64::from_str_radix(hex, 16).map_err(|_| {
                            format!("security: {word:?} is not caps: and a hexadecimal mask")
                        })?;
                        security.capabilities.replace(mask).is_some()
                    }
                    None => {
                        return Err(format!(
                            "security: {word:?} is none of ro, nnp, caps:HEX, mask:PATH, rop:PATH, \
                             file:PATH, bpf:HEX (in {s:?})"
                        ))
                    }
                },
            };
            if repeated {
                return Err(format!("security: {word:?} is given twice in {s:?}"));
            }
        }
        Ok(security)
    }
}

/// A seccomp filter's packed instructions as text: 16 hex digits each.
pub fn filter_hex(filter: &[u64]) -> String {
    filter.iter().map(|insn| format!("{insn:016x}")).collect()
}

/// The instructions [`filter_hex`] wrote (a `bpf:` word's text), at most
/// [`MAX_FILTER_INSNS`].
pub fn parse_filter(hex: &str) -> Result<Vec<u64>, String> {
    let bad = || {
        format!(
            "security: bpf: is not whole 16-digit instructions ({} digits)",
            hex.len()
        )
    };
    if hex.is_empty() || !hex.len().is_multiple_of(16) || !hex.is_ascii() {
        return Err(bad());
    }
    let count = hex.len() / 16;
    if count > MAX_FILTER_INSNS {
        return Err(format!(
            "security: bpf: {count} instructions, more than {MAX_FILTER_INSNS}"
        ));
    }
    (0..count)
        .map(|i| u64::from_str_radix(&hex[16 * i..16 * (i + 1)], 16).map_err(|_| bad()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_survives_its_text_form() {
        for security in [
            ContainerSecurity::default(),
            ContainerSecurity {
                read_only_root: true,
                ..ContainerSecurity::default()
            },
            ContainerSecurity {
                read_only_root: true,
                no_new_privileges: true,
                capabilities: Some(0),
                ..ContainerSecurity::default()
            },
            ContainerSecurity {
                no_new_privileges: false,
                read_only_root: false,
                capabilities: Some(0x8004_05fb),
                masked_paths: vec!["/proc/kcore".into(), "/bin/ls".into()],
                read_only_paths: vec!["/tmp".into()],
                writable_files: vec!["/etc/hosts".into(), "/dev/termination-log".into()],
                seccomp_filter: vec![0x0020_0000_0000_0004, 0x0006_0000_7fff_0000],
            },
        ] {
            let text = security.to_string();
            assert_eq!(
                text.parse::<ContainerSecurity>(),
                Ok(security.clone()),
                "{text}"
            );
        }
        assert_eq!(ContainerSecurity::default().to_string(), "-");
    }

    #[test]
    fn capabilities_are_named_as_docker_and_kubernetes_name_them() {
        assert_eq!(capability_mask(["CAP_CHOWN"]), Ok(1));
        assert_eq!(capability_mask(["chown", "Kill"]), Ok(1 | 1 << 5));
        assert_eq!(capability_mask(["ALL"]), Ok(all_capabilities()));
        assert_eq!(capability_mask([]), Ok(0));
        assert_eq!(
            capability_mask(["NET_ADMIN", "sys_admin"]),
            Ok(1 << 12 | 1 << 21)
        );
        assert_eq!(
            beyond_sandbox_set(capability_mask(["NET_ADMIN", "CHOWN"]).expect("known")),
            ["CAP_NET_ADMIN"]
        );
        let err = capability_mask(["NET_ADMINISTRATOR"]).expect_err("unknown");
        assert!(err.contains("\"NET_ADMINISTRATOR\""), "{err}");
        for (name, cap) in ALL_CAPABILITIES {
            assert_eq!(
                ALL_CAPABILITIES[*cap as usize].0, *name,
                "numbered in order"
            );
        }
        for (name, cap) in SANDBOX_CAPABILITIES {
            assert_eq!(ALL_CAPABILITIES[*cap as usize].0, *name, "{name}");
        }
    }

    #[test]
    fn a_bad_word_is_named() {
        for (text, named) in [
            ("ro rw", "\"rw\""),
            ("caps:xyz", "\"caps:xyz\""),
            ("ro ro", "twice"),
            ("", "\"\""),
            ("nnp  ro", "\"\""),
            ("mask:tmp", "absolute"),
            ("rop:/a/../b", "not plain"),
            ("mask:/a b", "\"b\""),
            ("mask:/é", "'é'"),
            ("rop:/", "absolute"),
            ("mask:/a+b", "'+'"),
            ("bpf:", "instructions"),
            ("bpf:0006", "instructions"),
            ("bpf:000600007fff000g", "instructions"),
            ("bpf:0006000000000000 bpf:0006000000000000", "twice"),
        ] {
            let err = text.parse::<ContainerSecurity>().expect_err(text);
            assert!(err.contains(named), "{text}: {err}");
        }
    }
}
