//! Settings from the kernel command line (`/proc/cmdline`), for VM mode.

use wire::agent::{DEFAULT_AGENT_PORT, DEFAULT_READY_PORT};

use crate::log::Level;

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
    pub log: Option<Level>,
    /// `crucible.selftest=1`: run the self-test and end the VM.
    pub selftest: bool,
    /// `crucible.boot_marker=1`: `outb` 123 to port 0x3f0 when ready.
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

impl Default for BootConfig {
    fn default() -> Self {
        BootConfig {
            port: DEFAULT_AGENT_PORT,
            ready_port: DEFAULT_READY_PORT,
            root: None,
            log: None,
            selftest: false,
            boot_marker: false,
            hostname: "crucible".to_string(),
            mem_reserve_mib: 16,
            pids_max: 16_384,
            cgroups: true,
        }
    }
}

fn flag(value: &str) -> bool {
    matches!(value, "1" | "y" | "yes" | "true" | "on")
}

impl BootConfig {
    /// Reads the `crucible.*` words of a kernel command line; unknown or malformed ones are
    /// ignored (a bad setting must never keep the agent from booting).
    pub fn parse(cmdline: &str) -> BootConfig {
        let mut cfg = BootConfig::default();
        for word in cmdline.split_ascii_whitespace() {
            let Some(setting) = word.strip_prefix("crucible.") else {
                continue;
            };
            let (key, value) = setting.split_once('=').unwrap_or((setting, "1"));
            match key {
                "port" => cfg.port = value.parse().unwrap_or(cfg.port),
                "ready_port" => cfg.ready_port = value.parse().unwrap_or(cfg.ready_port),
                "root" if !value.is_empty() => cfg.root = Some(value.to_string()),
                "log" => cfg.log = Level::parse(value),
                "selftest" => cfg.selftest = flag(value),
                "boot_marker" => cfg.boot_marker = flag(value),
                "hostname" if !value.is_empty() => cfg.hostname = value.to_string(),
                "mem_reserve_mib" => {
                    cfg.mem_reserve_mib = value.parse().unwrap_or(cfg.mem_reserve_mib)
                }
                "pids_max" => cfg.pids_max = value.parse().unwrap_or(cfg.pids_max),
                "cgroups" => cfg.cgroups = flag(value),
                _ => {}
            }
        }
        cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_when_absent() {
        let cfg = BootConfig::parse("console=ttyS0 quiet");
        assert_eq!(cfg, BootConfig::default());
        assert_eq!(cfg.port, DEFAULT_AGENT_PORT);
    }

    #[test]
    fn reads_every_setting_and_ignores_garbage() {
        let cfg = BootConfig::parse(
            "quiet crucible.port=5000 crucible.ready_port=x crucible.root=/dev/vda \
             crucible.log=debug crucible.selftest=1 crucible.boot_marker=1 crucible.bogus=3",
        );
        assert_eq!(cfg.port, 5000);
        assert_eq!(cfg.ready_port, DEFAULT_READY_PORT);
        assert_eq!(cfg.root.as_deref(), Some("/dev/vda"));
        assert_eq!(cfg.log, Some(Level::Debug));
        assert!(cfg.selftest);
        assert!(cfg.boot_marker);
    }
}
