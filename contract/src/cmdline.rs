//! The agent's `crucible.*` settings on the kernel command line: [`BootConfig::to_cmdline`] is
//! what the host writes (the daemon's microVMs, the QEMU smoke test), [`BootConfig::parse`] is
//! what `guest-init` reads from `/proc/cmdline`. One type and one set of [`keys`], so a setting
//! cannot be spelt one way on one side and another way on the other.
//!
//! A value must survive the trip through the kernel: it splits the command line on spaces and
//! treats `"` as quoting, and `/proc/cmdline` gives the guest the raw text. So the builder
//! refuses any value that is not printable ASCII without spaces or quotes, and the parser
//! ignores such a value the same way, keeping the default. Mount targets, which may hold any
//! character but `:` and NUL, are percent-encoded instead ([`encode_target`]).

use std::fmt::Write as _;

use crate::vsock::{DEFAULT_AGENT_PORT, DEFAULT_READY_PORT};

/// The setting names, each with its `crucible.` prefix.
pub mod keys {
    /// The vsock port the agent serves on.
    pub const PORT: &str = "crucible.port";
    /// The host vsock port the agent sends its hello to.
    pub const READY_PORT: &str = "crucible.ready_port";
    /// The ext4 root filesystem: a block device path, or a virtio-blk serial.
    pub const ROOT: &str = "crucible.root";
    /// The agent's log level.
    pub const LOG: &str = "crucible.log";
    /// Run the boot self-test and end the VM.
    pub const SELFTEST: &str = "crucible.selftest";
    /// Block devices the self-test also reads and writes, comma-separated.
    pub const SELFTEST_BLOCK: &str = "crucible.selftest_block";
    /// Write the boot marker when ready.
    pub const BOOT_MARKER: &str = "crucible.boot_marker";
    /// The guest's hostname.
    pub const HOSTNAME: &str = "crucible.hostname";
    /// Memory kept out of the commands cgroup for the agent.
    pub const MEM_RESERVE_MIB: &str = "crucible.mem_reserve_mib";
    /// The commands cgroup's task limit.
    pub const PIDS_MAX: &str = "crucible.pids_max";
    /// `0` turns the commands cgroup off.
    pub const CGROUPS: &str = "crucible.cgroups";
    /// Serve the egress proxy, relaying each connection to this host vsock port.
    pub const EGRESS_PORT: &str = "crucible.egress_port";
    /// The serial of the disk holding the writable layer.
    pub const SCRATCH: &str = "crucible.scratch";
    /// One mounted disk, `SERIAL:MODE:TARGET`; the key repeats, once per disk.
    pub const MOUNT: &str = "crucible.mount";
    /// One container, `NAME:SERIAL` (its image's disk); the key repeats, once per container,
    /// and a container's place in that order is its index.
    pub const CONTAINER: &str = "crucible.container";
    /// One shared directory mounted in a root, `OWNER:NAME:TARGET` (`main` or a container;
    /// the directory's name; where, percent-encoded); the key repeats.
    pub const SHARED: &str = "crucible.shared";
}

/// The most bytes [`BootConfig::to_cmdline`] writes. x86 Linux keeps 2048 bytes of command
/// line (`COMMAND_LINE_SIZE`) and cuts the rest off silently; the hypervisor's own words (the
/// console, one `virtio_mmio.device=` per device) take the other half at most.
pub const MAX_WORDS_BYTES: usize = 1024;

/// A disk the agent mounts inside the VM (`crucible.mount=`): an ext4 found by its virtio-blk
/// serial ([`crate::disk`]), mounted `nosuid,nodev` at `target` in the sandbox's root (made if
/// missing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskMount {
    /// The disk's serial.
    pub serial: String,
    /// Where it appears (absolute).
    pub target: String,
    /// Mounted read-only.
    pub read_only: bool,
}

impl DiskMount {
    /// The value of its `crucible.mount=` word: `SERIAL:ro|rw:TARGET`, the target
    /// percent-encoded.
    fn to_value(&self) -> String {
        let mode = if self.read_only { "ro" } else { "rw" };
        format!("{}:{mode}:{}", self.serial, encode_target(&self.target))
    }

    /// Reads a `crucible.mount=` value; `None` for anything the builder would not write.
    fn parse(value: &str) -> Option<DiskMount> {
        let mut parts = value.splitn(3, ':');
        let (serial, mode, target) = (parts.next()?, parts.next()?, parts.next()?);
        let read_only = match mode {
            "ro" => true,
            "rw" => false,
            _ => return None,
        };
        let mount = DiskMount {
            serial: serial.to_string(),
            target: decode_target(target)?,
            read_only,
        };
        mount.is_valid().then_some(mount)
    }

    /// A serial the guest can match, an absolute target without NUL.
    fn is_valid(&self) -> bool {
        crate::disk::is_valid_serial(&self.serial)
            && self.target.starts_with('/')
            && !self.target.contains('\0')
    }
}

/// Whether `name` is a container's or a shared directory's name: 1 to 63 of `a-z`, `0-9` and
/// `-`, starting and ending with a letter or a digit.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// A container of a microVM sandbox (`crucible.container=`): its agent is PID 1 of a PID and
/// mount namespace of its own, its root the image on the disk of this serial, read-only under
/// an overlay whose writes stay in the guest's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmContainer {
    /// Its name ([`is_valid_name`], never `main`).
    pub name: String,
    /// The serial of its image's disk.
    pub serial: String,
    /// It joins `main`'s PID namespace (its init the main init PID 1 starts for a pod), as
    /// Kubernetes' `shareProcessNamespace`, instead of getting one of its own (`:pids` after
    /// the serial).
    pub share_pids: bool,
}

impl VmContainer {
    fn to_value(&self) -> String {
        let pids = if self.share_pids { ":pids" } else { "" };
        format!("{}:{}{pids}", self.name, self.serial)
    }

    fn parse(value: &str) -> Option<VmContainer> {
        let (name, rest) = value.split_once(':')?;
        let (serial, share_pids) = match rest.strip_suffix(":pids") {
            Some(serial) => (serial, true),
            None => (rest, false),
        };
        let container = VmContainer {
            name: name.to_string(),
            serial: serial.to_string(),
            share_pids,
        };
        container.is_valid().then_some(container)
    }

    /// Whether the guest can take it: a container name (never `main`) on a disk serial.
    pub fn is_valid(&self) -> bool {
        is_valid_name(&self.name)
            && self.name != "main"
            && crate::disk::is_valid_serial(&self.serial)
    }
}

/// A shared directory of a microVM sandbox mounted in one of its roots (`crucible.shared=`):
/// the same name is the same directory (in the guest's memory) wherever it is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmShared {
    /// The root that mounts it: `main` (the sandbox's own) or a container's name.
    pub owner: String,
    /// The directory's name.
    pub name: String,
    /// Where it appears in that root (absolute).
    pub target: String,
    /// Mounted read-only there (`:ro` after the target).
    pub read_only: bool,
}

impl VmShared {
    fn to_value(&self) -> String {
        let mode = if self.read_only { ":ro" } else { "" };
        format!(
            "{}:{}:{}{mode}",
            self.owner,
            self.name,
            encode_target(&self.target)
        )
    }

    fn parse(value: &str) -> Option<VmShared> {
        // The target is percent-encoded, so a `:` after it can only be the mode's.
        let (value, read_only) = match value.strip_suffix(":ro") {
            Some(rest) => (rest, true),
            None => (value, false),
        };
        let mut parts = value.splitn(3, ':');
        let (owner, name, target) = (parts.next()?, parts.next()?, parts.next()?);
        let shared = VmShared {
            owner: owner.to_string(),
            name: name.to_string(),
            target: decode_target(target)?,
            read_only,
        };
        shared.is_valid().then_some(shared)
    }

    /// Whether the guest can mount it: names for its owner and directory, an absolute target
    /// below `/` without NUL or `..`.
    pub fn is_valid(&self) -> bool {
        is_valid_name(&self.owner)
            && is_valid_name(&self.name)
            && self.target.starts_with('/')
            && self.target != "/"
            && !self.target.contains('\0')
            && !self.target.split('/').any(|part| part == "..")
    }
}

/// `target` as one command-line value: every byte that is not printable ASCII, and `"`, `%`,
/// `:`, as `%XX`.
pub fn encode_target(target: &str) -> String {
    let mut out = String::with_capacity(target.len());
    for b in target.bytes() {
        if b.is_ascii_graphic() && !matches!(b, b'"' | b'%' | b':') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The inverse of [`encode_target`]; `None` for a malformed escape, a byte it would have
/// escaped, or a result that is not UTF-8.
pub fn decode_target(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            if !hex.bytes().all(|h| h.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else if b.is_ascii_graphic() && !matches!(b, b'"' | b':') {
            out.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

/// How much the agent logs (`crucible.log=`, or `guest-init --log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum LogLevel {
    /// Only the console contract lines.
    Quiet = 0,
    /// Errors.
    Error = 1,
    /// Errors and lifecycle events (the agent's default).
    Info = 2,
    /// Every request.
    Debug = 3,
}

impl LogLevel {
    /// Parses `quiet`, `error`, `info` or `debug` (or `off`, `0` … `3`).
    pub fn parse(s: &str) -> Option<LogLevel> {
        match s {
            "quiet" | "off" | "0" => Some(LogLevel::Quiet),
            "error" | "1" => Some(LogLevel::Error),
            "info" | "2" => Some(LogLevel::Info),
            "debug" | "3" => Some(LogLevel::Debug),
            _ => None,
        }
    }

    /// The name [`LogLevel::parse`] takes back.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Quiet => "quiet",
            LogLevel::Error => "error",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

/// The agent's `crucible.*` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootConfig {
    /// `crucible.port=`: the vsock port to serve on.
    pub port: u32,
    /// `crucible.ready_port=`: the host vsock port to send the hello to.
    pub ready_port: u32,
    /// `crucible.root=`: the ext4 root filesystem: a block device (`/dev/vda`), or, for a
    /// value not starting with `/`, the serial of a virtio-blk disk ([`crate::disk`]).
    pub root: Option<String>,
    /// `crucible.log=`: `quiet`, `error`, `info` or `debug`.
    pub log: Option<LogLevel>,
    /// `crucible.selftest=1`: run the self-test and end the VM.
    pub selftest: bool,
    /// `crucible.selftest_block=/dev/vda,/dev/vdb`: block devices the self-test also checks
    /// (the patterns of [`crate::block_selftest`]); a device path may not contain a comma.
    pub selftest_block: Vec<String>,
    /// `crucible.boot_marker=1`: write the [boot marker](crate::boot_marker) when ready.
    pub boot_marker: bool,
    /// `crucible.hostname=` (default `crucible`).
    pub hostname: String,
    /// `crucible.mem_reserve_mib=`: memory kept out of the commands cgroup for the agent.
    pub mem_reserve_mib: u64,
    /// `crucible.pids_max=`: the commands cgroup's task limit.
    pub pids_max: u64,
    /// `crucible.cgroups=0` turns the `commands` cgroup off.
    pub cgroups: bool,
    /// `crucible.egress_port=`: serve the egress proxy on the guest's loopback, relaying each
    /// connection over vsock to this host port ([`crate::egress`]).
    pub egress_port: Option<u32>,
    /// `crucible.scratch=`: the serial of the ext4 disk that holds every write (the overlay's
    /// upper layer and `/tmp`) instead of memory.
    pub scratch: Option<String>,
    /// `crucible.mount=`: disks to mount, in order.
    pub mounts: Vec<DiskMount>,
    /// `crucible.container=`: the sandbox's containers, in index order.
    pub containers: Vec<VmContainer>,
    /// `crucible.shared=`: the shared directories' mounts.
    pub shared: Vec<VmShared>,
}

/// The hostname when the command line gives none.
pub const DEFAULT_HOSTNAME: &str = "crucible";

impl Default for BootConfig {
    fn default() -> Self {
        BootConfig {
            port: DEFAULT_AGENT_PORT,
            ready_port: DEFAULT_READY_PORT,
            root: None,
            log: None,
            selftest: false,
            selftest_block: Vec::new(),
            boot_marker: false,
            hostname: DEFAULT_HOSTNAME.to_string(),
            mem_reserve_mib: 16,
            pids_max: 16_384,
            cgroups: true,
            egress_port: None,
            scratch: None,
            mounts: Vec::new(),
            containers: Vec::new(),
            shared: Vec::new(),
        }
    }
}

/// Why a [`BootConfig`] cannot be written on a kernel command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmdlineError {
    /// The words are longer than the guest kernel keeps.
    #[error(
        "the crucible.* settings take {len} bytes of kernel command line, more than the \
         {MAX_WORDS_BYTES} available (fewer or shorter mount paths)"
    )]
    TooLong {
        /// Their length.
        len: usize,
    },
    /// A value the kernel would split, unquote or mangle.
    #[error(
        "{key}={value:?} cannot go on the kernel command line: a value must be non-empty \
         printable ASCII without spaces or quotes"
    )]
    BadValue {
        /// The setting.
        key: &'static str,
        /// The refused value.
        value: String,
    },
}

/// Whether `value` reaches the guest unchanged: non-empty, printable ASCII, no space (the
/// kernel's separator) and no `"` (its quoting).
pub fn is_valid_value(value: &str) -> bool {
    !value.is_empty() && value.bytes().all(|b| b.is_ascii_graphic() && b != b'"')
}

fn flag(value: &str) -> bool {
    matches!(value, "1" | "y" | "yes" | "true" | "on")
}

/// `value` if the kernel passes it through unchanged.
fn text(value: &str) -> Option<String> {
    is_valid_value(value).then(|| value.to_string())
}

impl BootConfig {
    /// Reads the `crucible.*` words of a kernel command line; unknown or malformed ones are
    /// ignored (a bad setting must never keep the agent from booting). A word without `=` is a
    /// flag set to `1`.
    pub fn parse(cmdline: &str) -> BootConfig {
        let mut cfg = BootConfig::default();
        for word in cmdline.split_ascii_whitespace() {
            let (key, value) = word.split_once('=').unwrap_or((word, "1"));
            match key {
                keys::PORT => cfg.port = value.parse().unwrap_or(cfg.port),
                keys::READY_PORT => cfg.ready_port = value.parse().unwrap_or(cfg.ready_port),
                keys::ROOT => cfg.root = text(value).or(cfg.root),
                keys::LOG => cfg.log = LogLevel::parse(value),
                keys::SELFTEST => cfg.selftest = flag(value),
                keys::SELFTEST_BLOCK => {
                    cfg.selftest_block = value.split(',').filter_map(text).collect()
                }
                keys::BOOT_MARKER => cfg.boot_marker = flag(value),
                keys::HOSTNAME => cfg.hostname = text(value).unwrap_or(cfg.hostname),
                keys::MEM_RESERVE_MIB => {
                    cfg.mem_reserve_mib = value.parse().unwrap_or(cfg.mem_reserve_mib)
                }
                keys::PIDS_MAX => cfg.pids_max = value.parse().unwrap_or(cfg.pids_max),
                keys::CGROUPS => cfg.cgroups = flag(value),
                keys::EGRESS_PORT => cfg.egress_port = value.parse().ok().or(cfg.egress_port),
                keys::SCRATCH if crate::disk::is_valid_serial(value) => {
                    cfg.scratch = Some(value.to_string())
                }
                keys::MOUNT => cfg.mounts.extend(DiskMount::parse(value)),
                keys::CONTAINER => cfg.containers.extend(VmContainer::parse(value)),
                keys::SHARED => cfg.shared.extend(VmShared::parse(value)),
                _ => {}
            }
        }
        cfg
    }

    /// The `crucible.*` words for this configuration, space-separated: only the settings that
    /// differ from the defaults (which [`BootConfig::parse`] fills in on the other side), so
    /// the command line stays short. Refuses values the kernel would not pass through
    /// unchanged.
    pub fn to_cmdline(&self) -> Result<String, CmdlineError> {
        let default = BootConfig::default();
        let mut words = Vec::new();
        let mut push = |key: &'static str, value: &dyn std::fmt::Display| {
            let mut word = String::new();
            let _ = write!(word, "{key}={value}");
            words.push(word);
        };
        let checked = |key: &'static str, value: &str| {
            if is_valid_value(value) {
                Ok(())
            } else {
                Err(CmdlineError::BadValue {
                    key,
                    value: value.to_string(),
                })
            }
        };
        if self.port != default.port {
            push(keys::PORT, &self.port);
        }
        if self.ready_port != default.ready_port {
            push(keys::READY_PORT, &self.ready_port);
        }
        if let Some(root) = &self.root {
            checked(keys::ROOT, root)?;
            push(keys::ROOT, root);
        }
        if let Some(log) = self.log {
            push(keys::LOG, &log.as_str());
        }
        if self.selftest {
            push(keys::SELFTEST, &1);
        }
        if !self.selftest_block.is_empty() {
            for device in &self.selftest_block {
                if device.contains(',') {
                    return Err(CmdlineError::BadValue {
                        key: keys::SELFTEST_BLOCK,
                        value: device.clone(),
                    });
                }
                checked(keys::SELFTEST_BLOCK, device)?;
            }
            push(keys::SELFTEST_BLOCK, &self.selftest_block.join(","));
        }
        if self.boot_marker {
            push(keys::BOOT_MARKER, &1);
        }
        if self.hostname != default.hostname {
            checked(keys::HOSTNAME, &self.hostname)?;
            push(keys::HOSTNAME, &self.hostname);
        }
        if self.mem_reserve_mib != default.mem_reserve_mib {
            push(keys::MEM_RESERVE_MIB, &self.mem_reserve_mib);
        }
        if self.pids_max != default.pids_max {
            push(keys::PIDS_MAX, &self.pids_max);
        }
        if !self.cgroups {
            push(keys::CGROUPS, &0);
        }
        if let Some(port) = self.egress_port {
            push(keys::EGRESS_PORT, &port);
        }
        if let Some(serial) = &self.scratch {
            if !crate::disk::is_valid_serial(serial) {
                return Err(CmdlineError::BadValue {
                    key: keys::SCRATCH,
                    value: serial.clone(),
                });
            }
            push(keys::SCRATCH, serial);
        }
        for mount in &self.mounts {
            if !mount.is_valid() {
                return Err(CmdlineError::BadValue {
                    key: keys::MOUNT,
                    value: format!("{}:{}", mount.serial, mount.target),
                });
            }
            push(keys::MOUNT, &mount.to_value());
        }
        for container in &self.containers {
            if !container.is_valid() {
                return Err(CmdlineError::BadValue {
                    key: keys::CONTAINER,
                    value: container.to_value(),
                });
            }
            push(keys::CONTAINER, &container.to_value());
        }
        for shared in &self.shared {
            if !shared.is_valid() {
                return Err(CmdlineError::BadValue {
                    key: keys::SHARED,
                    value: format!("{}:{}:{}", shared.owner, shared.name, shared.target),
                });
            }
            push(keys::SHARED, &shared.to_value());
        }
        let line = words.join(" ");
        if line.len() > MAX_WORDS_BYTES {
            return Err(CmdlineError::TooLong { len: line.len() });
        }
        Ok(line)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn every_setting_changed() -> BootConfig {
        BootConfig {
            port: 5000,
            ready_port: 5001,
            root: Some("/dev/vda".into()),
            log: Some(LogLevel::Debug),
            selftest: true,
            selftest_block: vec!["/dev/vda".into(), "/dev/vdb".into()],
            boot_marker: true,
            hostname: "sb-0123abcd".into(),
            mem_reserve_mib: 32,
            pids_max: 100,
            cgroups: false,
            egress_port: Some(1026),
            scratch: Some("crucible-scratch".into()),
            mounts: vec![
                DiskMount {
                    serial: "crucible-mount-0".into(),
                    target: "/root/.cargo/registry".into(),
                    read_only: false,
                },
                DiskMount {
                    serial: "crucible-mount-1".into(),
                    target: "/opt/my tools/\"q\"%50/\u{e9}".into(),
                    read_only: true,
                },
            ],
            containers: vec![
                VmContainer {
                    name: "db".into(),
                    serial: "crucible-ctr-0".into(),
                    share_pids: false,
                },
                VmContainer {
                    name: "web".into(),
                    serial: "crucible-ctr-1".into(),
                    share_pids: true,
                },
            ],
            shared: vec![
                VmShared {
                    owner: "main".into(),
                    name: "work".into(),
                    target: "/work".into(),
                    read_only: false,
                },
                VmShared {
                    owner: "db".into(),
                    name: "work".into(),
                    target: "/var/lib/my data".into(),
                    read_only: true,
                },
            ],
        }
    }

    #[test]
    fn defaults_build_nothing_and_parse_from_nothing() {
        assert_eq!(BootConfig::default().to_cmdline().unwrap(), "");
        let cfg = BootConfig::parse("console=ttyS0 quiet");
        assert_eq!(cfg, BootConfig::default());
        assert_eq!(cfg.port, DEFAULT_AGENT_PORT);
        assert_eq!(cfg.ready_port, DEFAULT_READY_PORT);
    }

    #[test]
    fn built_command_line_parses_back_to_the_same_config() {
        let mut cases = vec![BootConfig::default(), every_setting_changed()];
        for level in [
            LogLevel::Quiet,
            LogLevel::Error,
            LogLevel::Info,
            LogLevel::Debug,
        ] {
            cases.push(BootConfig {
                log: Some(level),
                ..BootConfig::default()
            });
        }
        cases.push(BootConfig {
            boot_marker: true,
            hostname: "odd!#$%&'()*+,-./:;<=>?@[\\]^_`{|}~chars".into(),
            root: Some("/dev/disk/by-id/virtio-x=y".into()),
            ..BootConfig::default()
        });
        for cfg in cases {
            let words = cfg.to_cmdline().unwrap();
            // As the guest sees it: the VMM's words around ours.
            let line =
                format!("reboot=k console=hvc0 quiet {words} virtio_mmio.device=4K@0xd0000000:5");
            assert_eq!(BootConfig::parse(&line), cfg, "{line}");
        }
    }

    #[test]
    fn builder_writes_the_documented_keys() {
        let line = every_setting_changed().to_cmdline().unwrap();
        assert_eq!(
            line,
            "crucible.port=5000 crucible.ready_port=5001 crucible.root=/dev/vda \
             crucible.log=debug crucible.selftest=1 crucible.selftest_block=/dev/vda,/dev/vdb \
             crucible.boot_marker=1 crucible.hostname=sb-0123abcd crucible.mem_reserve_mib=32 crucible.pids_max=100 \
             crucible.cgroups=0 crucible.egress_port=1026 crucible.scratch=crucible-scratch \
             crucible.mount=crucible-mount-0:rw:/root/.cargo/registry \
             crucible.mount=crucible-mount-1:ro:/opt/my%20tools/%22q%22%2550/%C3%A9 \
             crucible.container=db:crucible-ctr-0 crucible.container=web:crucible-ctr-1:pids \
             crucible.shared=main:work:/work crucible.shared=db:work:/var/lib/my%20data:ro"
        );
    }

    #[test]
    fn containers_and_shared_dirs_the_builder_would_not_write_are_refused_and_ignored() {
        for (name, serial) in [("main", "x"), ("Db", "x"), ("db", "x:y"), ("-db", "x")] {
            let cfg = BootConfig {
                containers: vec![VmContainer {
                    name: name.into(),
                    serial: serial.into(),
                    share_pids: false,
                }],
                ..BootConfig::default()
            };
            assert!(cfg.to_cmdline().is_err(), "{name}:{serial}");
            let parsed = BootConfig::parse(&format!("crucible.container={name}:{serial}"));
            assert!(parsed.containers.is_empty(), "{name}:{serial}");
        }
        for target in ["relative", "/", "/a/../etc"] {
            let parsed = BootConfig::parse(&format!("crucible.shared=main:work:{target}"));
            assert!(parsed.shared.is_empty(), "{target}");
        }
    }

    #[test]
    fn mount_targets_survive_any_character_the_api_allows() {
        for target in [
            "/a",
            "/with space/and\ttab",
            "/quote\"d/percent%41/colon:x",
            "/\u{e9}t\u{e9}/\u{1F600}",
            "/~!@#$^&*()_+={}[]|;'<>,.?`",
        ] {
            let encoded = encode_target(target);
            assert!(is_valid_value(&encoded), "{encoded:?}");
            assert!(!encoded.contains(':'), "{encoded:?}");
            assert_eq!(decode_target(&encoded).as_deref(), Some(target));
        }
        for bad in ["%", "%4", "%zz", "a b", "a:b", "say\"", "%FF"] {
            assert_eq!(decode_target(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn malformed_mounts_and_serials_are_ignored_by_the_parser() {
        let cfg = BootConfig::parse(
            "crucible.mount=crucible-mount-0:rw:/ok crucible.mount=x:rx:/mode \
             crucible.mount=bad/serial:rw:/s crucible.mount=x:rw:relative crucible.mount=x:rw \
             crucible.mount=x:ro:/a%zz crucible.mount=x:ro:/nul%00 crucible.scratch=a:b \
             crucible.egress_port=none",
        );
        assert_eq!(
            cfg.mounts,
            [DiskMount {
                serial: "crucible-mount-0".into(),
                target: "/ok".into(),
                read_only: false
            }]
        );
        assert_eq!((cfg.scratch, cfg.egress_port), (None, None));
    }

    #[test]
    fn the_builder_refuses_what_the_guest_could_not_use_or_would_lose() {
        let mount = |serial: &str, target: &str| BootConfig {
            mounts: vec![DiskMount {
                serial: serial.into(),
                target: target.into(),
                read_only: false,
            }],
            ..BootConfig::default()
        };
        for cfg in [
            mount("has space", "/x"),
            mount("123456789012345678901", "/x"),
            mount("ok", "relative"),
            mount("ok", "/nul\0"),
            BootConfig {
                scratch: Some("a:b".into()),
                ..BootConfig::default()
            },
        ] {
            assert!(
                matches!(cfg.to_cmdline(), Err(CmdlineError::BadValue { .. })),
                "{cfg:?}"
            );
        }
        // Past what the kernel keeps: refused rather than cut off inside the guest.
        let long = mount("ok", &format!("/{}", "x".repeat(MAX_WORDS_BYTES)));
        assert!(matches!(
            long.to_cmdline(),
            Err(CmdlineError::TooLong { len }) if len > MAX_WORDS_BYTES
        ));
        let fits = mount("ok", &format!("/{}", "x".repeat(900)));
        assert!(fits.to_cmdline().is_ok());
    }

    #[test]
    fn values_the_kernel_would_mangle_are_refused_by_the_builder() {
        for bad in [
            "",
            "a b",
            "a\tb",
            "a\nb",
            "say\"hi\"",
            "h\u{e9}llo",
            "del\x7f",
        ] {
            let cfg = BootConfig {
                hostname: bad.into(),
                ..BootConfig::default()
            };
            assert_eq!(
                cfg.to_cmdline(),
                Err(CmdlineError::BadValue {
                    key: keys::HOSTNAME,
                    value: bad.into()
                }),
                "{bad:?}"
            );
            let cfg = BootConfig {
                root: Some(bad.into()),
                ..BootConfig::default()
            };
            assert!(cfg.to_cmdline().is_err(), "{bad:?}");
            let cfg = BootConfig {
                selftest_block: vec!["/dev/vda".into(), bad.into()],
                ..BootConfig::default()
            };
            assert!(cfg.to_cmdline().is_err(), "{bad:?}");
        }
        // The list separator cannot be part of a device.
        let cfg = BootConfig {
            selftest_block: vec!["/dev/a,b".into()],
            ..BootConfig::default()
        };
        assert!(cfg.to_cmdline().is_err());
    }

    #[test]
    fn values_the_builder_refuses_are_ignored_by_the_parser() {
        // What /proc/cmdline shows for `crucible.hostname="a b"`: two words, a quote in each.
        let cfg = BootConfig::parse(r#"crucible.hostname="a b" crucible.root="/dev/vda""#);
        assert_eq!(cfg.hostname, DEFAULT_HOSTNAME);
        assert_eq!(cfg.root, None);
        let cfg = BootConfig::parse("crucible.hostname= crucible.root=");
        assert_eq!(cfg, BootConfig::default());
    }

    #[test]
    fn parser_ignores_garbage_and_unknown_keys() {
        let cfg = BootConfig::parse(
            "quiet crucible.port=5000 crucible.ready_port=x crucible.root=/dev/vda \
             crucible.log=debug crucible.selftest crucible.boot_marker=1 crucible.bogus=3 \
             crucible.pids_max=-1 notcrucible.port=1",
        );
        assert_eq!(cfg.port, 5000);
        assert_eq!(cfg.ready_port, DEFAULT_READY_PORT);
        assert_eq!(cfg.root.as_deref(), Some("/dev/vda"));
        assert_eq!(cfg.log, Some(LogLevel::Debug));
        assert!(cfg.selftest);
        assert!(cfg.boot_marker);
        assert_eq!(cfg.pids_max, BootConfig::default().pids_max);
    }

    #[test]
    fn log_level_names_parse_back() {
        for level in [
            LogLevel::Quiet,
            LogLevel::Error,
            LogLevel::Info,
            LogLevel::Debug,
        ] {
            assert_eq!(LogLevel::parse(level.as_str()), Some(level));
        }
        assert_eq!(LogLevel::parse("loud"), None);
    }
}
