//! The agent's `crucible.*` settings on the kernel command line: [`BootConfig::to_cmdline`] is
//! what the host writes (the daemon's microVMs, the QEMU smoke test), [`BootConfig::parse`] is
//! what `guest-init` reads from `/proc/cmdline`. One type and one set of [`keys`], so a setting
//! cannot be spelt one way on one side and another way on the other.
//!
//! A value must survive the trip through the kernel: it splits the command line on spaces and
//! treats `"` as quoting, and `/proc/cmdline` gives the guest the raw text. So the builder
//! refuses any value that is not printable ASCII without spaces or quotes, and the parser
//! ignores such a value the same way, keeping the default.

use std::fmt::Write as _;

use crate::vsock::{DEFAULT_AGENT_PORT, DEFAULT_READY_PORT};

/// The setting names, each with its `crucible.` prefix.
pub mod keys {
    /// The vsock port the agent serves on.
    pub const PORT: &str = "crucible.port";
    /// The host vsock port the agent sends its hello to.
    pub const READY_PORT: &str = "crucible.ready_port";
    /// A block device holding the ext4 root filesystem.
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
    /// `crucible.root=`: a block device holding the ext4 root filesystem.
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
        }
    }
}

/// Why a [`BootConfig`] cannot be written on a kernel command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmdlineError {
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
        Ok(words.join(" "))
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
             crucible.cgroups=0"
        );
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
