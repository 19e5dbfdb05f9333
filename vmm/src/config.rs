//! [`VmConfig`]: the one description of a microVM, shared by `crucible-vmm`'s flags and the
//! daemon (which serializes it to JSON and passes `--config`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where the guest console (`hvc0`) goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "kind", content = "path")]
pub enum ConsoleOutput {
    /// Discarded.
    Off,
    /// The VMM's stdout (a pipe when the daemon runs us).
    #[default]
    Stdout,
    /// Appended to a file.
    File(PathBuf),
}

/// A virtio-block device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockConfig {
    /// A raw image file.
    pub path: PathBuf,
    /// Whether the guest may only read it.
    #[serde(default)]
    pub read_only: bool,
}

/// The virtio-vsock device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockConfig {
    /// The guest's CID (≥ 3).
    pub guest_cid: u32,
    /// The host-side Unix socket (`CONNECT <port>`); guest connections to port P go to
    /// `<uds_path>_P`.
    pub uds_path: PathBuf,
}

/// One microVM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// The uncompressed `vmlinux` ELF.
    pub kernel: PathBuf,
    /// An initramfs (cpio), placed high in guest memory.
    #[serde(default)]
    pub initramfs: Option<PathBuf>,
    /// Appended to the default kernel command line.
    #[serde(default)]
    pub cmdline: String,
    /// Guest memory in MiB.
    #[serde(default = "default_mem")]
    pub mem_mib: u32,
    /// Number of vCPUs.
    #[serde(default = "default_vcpus")]
    pub vcpus: u8,
    /// Back guest memory with hugetlbfs pages (2 MiB).
    #[serde(default)]
    pub hugepages: bool,
    /// Block devices, `vda`, `vdb`, … in order.
    #[serde(default)]
    pub block: Vec<BlockConfig>,
    /// The vsock device.
    #[serde(default)]
    pub vsock: Option<VsockConfig>,
    /// The guest console.
    #[serde(default)]
    pub console: ConsoleOutput,
    /// Also emulate the 8250 serial at 0x3f8 (early-boot debugging; slow).
    #[serde(default)]
    pub serial: bool,
    /// Stop the VM (KVM error) if the guest has neither written the boot-complete marker nor
    /// exited by then. Default: 10 s on kvm_pvm hosts (where a stock kernel would crawl through
    /// the instruction emulator), none on hardware KVM.
    #[serde(default)]
    pub boot_timeout_ms: Option<u64>,
}

fn default_mem() -> u32 {
    256
}

fn default_vcpus() -> u8 {
    1
}

/// Why a configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A field is out of range.
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// A `--config` file could not be read or parsed.
    #[error("cannot read the configuration {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl VmConfig {
    /// A configuration with defaults for everything but the kernel.
    pub fn new(kernel: PathBuf) -> Self {
        VmConfig {
            kernel,
            initramfs: None,
            cmdline: String::new(),
            mem_mib: default_mem(),
            vcpus: default_vcpus(),
            hugepages: false,
            block: Vec::new(),
            vsock: None,
            console: ConsoleOutput::default(),
            serial: false,
            boot_timeout_ms: None,
        }
    }

    /// Reads a JSON configuration file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let read = |source: Box<dyn std::error::Error + Send + Sync>| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let text = std::fs::read_to_string(path).map_err(|e| read(e.into()))?;
        serde_json::from_str(&text).map_err(|e| read(e.into()))
    }

    /// Checks the ranges the VMM relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        if !(16..=65536).contains(&self.mem_mib) {
            return bad("mem_mib must be between 16 and 65536");
        }
        if !(1..=32).contains(&self.vcpus) {
            return bad("vcpus must be between 1 and 32");
        }
        if let Some(v) = &self.vsock {
            if v.guest_cid < 3 {
                return bad("vsock guest_cid must be 3 or more");
            }
        }
        if self.block.len() > 16 {
            return bad("at most 16 block devices");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn vm_config_round_trips_as_json_with_defaults() {
        let c: VmConfig = serde_json::from_str(
            r#"{"kernel":"/k","vsock":{"guest_cid":3,"uds_path":"/tmp/v.sock"},
                "block":[{"path":"/d.img","read_only":true}],
                "console":{"kind":"file","path":"/tmp/c.log"}}"#,
        )
        .unwrap();
        assert_eq!(c.mem_mib, 256);
        assert_eq!(c.vcpus, 1);
        assert!(c.block[0].read_only);
        assert_eq!(c.console, ConsoleOutput::File("/tmp/c.log".into()));
        let back: VmConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        c.validate().unwrap();
    }

    #[test]
    fn vm_config_rejects_unknown_fields_and_bad_ranges() {
        assert!(serde_json::from_str::<VmConfig>(r#"{"kernel":"/k","bogus":1}"#).is_err());
        let mut c = VmConfig::new("/k".into());
        c.vcpus = 0;
        assert!(c.validate().is_err());
        c.vcpus = 1;
        c.vsock = Some(VsockConfig {
            guest_cid: 2,
            uds_path: "/x".into(),
        });
        assert!(c.validate().is_err());
    }
}
