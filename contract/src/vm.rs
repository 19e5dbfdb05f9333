//! [`VmConfig`]: the one description of a microVM. The daemon builds it and writes it as JSON
//! for `crucible-vmm --config`; the VMM's own flags build the same value. Both sides call
//! [`VmConfig::validate`], so a value the daemon accepts is one the VMM accepts. Also here: the
//! VMM's process exit codes ([`VmmExitCode`]), the interface of the binary to whatever runs it.

use std::ops::RangeInclusive;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Guest memory the VMM accepts, in MiB.
pub const MEM_MIB: RangeInclusive<u32> = 16..=65536;
/// vCPUs the VMM accepts (the MP table and the CPUID topology are built for at most 32).
pub const VCPUS: RangeInclusive<u8> = 1..=32;
/// The lowest guest CID: 0 and 1 are reserved, 2 is the host.
pub const MIN_GUEST_CID: u32 = 3;
/// Most block devices (`vda` … `vdp`), so the MMIO windows and IRQs stay in their ranges.
pub const MAX_BLOCK_DEVICES: usize = 16;

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

/// Accepted vsock handshake timeouts, in ms (0 would refuse every host connection).
pub const VSOCK_HANDSHAKE_TIMEOUT_MS: RangeInclusive<u64> = 1..=3_600_000;
/// The longest vsock stall timeout, in ms (a day; 0 means none).
pub const MAX_VSOCK_STALL_TIMEOUT_MS: u64 = 86_400_000;

/// The virtio-vsock device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockConfig {
    /// The guest's CID (≥ [`MIN_GUEST_CID`]).
    pub guest_cid: u32,
    /// The host-side Unix socket (`CONNECT <port>`); guest connections to port P go to
    /// [`host_port_path`](crate::vsock::host_port_path)`(uds_path, P)`. A stale socket there is
    /// replaced; anything else there is an error. The VMM removes it when it exits.
    pub uds_path: PathBuf,
    /// How long each handshake step may take (see
    /// [`DEFAULT_HANDSHAKE_TIMEOUT_MS`](crate::vsock::DEFAULT_HANDSHAKE_TIMEOUT_MS)).
    #[serde(default = "default_handshake_timeout_ms")]
    pub handshake_timeout_ms: u64,
    /// How long a connection may have work pending without progress before it is reset; 0:
    /// never (see [`DEFAULT_STALL_TIMEOUT_MS`](crate::vsock::DEFAULT_STALL_TIMEOUT_MS)).
    #[serde(default = "default_stall_timeout_ms")]
    pub stall_timeout_ms: u64,
}

impl VsockConfig {
    /// Guest `guest_cid`, host socket `uds_path`, default timeouts.
    pub fn new(guest_cid: u32, uds_path: PathBuf) -> Self {
        VsockConfig {
            guest_cid,
            uds_path,
            handshake_timeout_ms: default_handshake_timeout_ms(),
            stall_timeout_ms: default_stall_timeout_ms(),
        }
    }
}

fn default_handshake_timeout_ms() -> u64 {
    crate::vsock::DEFAULT_HANDSHAKE_TIMEOUT_MS
}

fn default_stall_timeout_ms() -> u64 {
    crate::vsock::DEFAULT_STALL_TIMEOUT_MS
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
    /// Appended to the default kernel command line (build the `crucible.*` words with
    /// [`BootArgs::to_cmdline`](crate::cmdline::BootArgs::to_cmdline)).
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
    /// The disk control socket (bound when the VM is built): the daemon gives a read-only
    /// disk another image through it while the guest runs ([`crate::disk::control`]), how an
    /// empty disk reserved at boot receives a container added later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_control: Option<PathBuf>,
    /// The vsock device.
    #[serde(default)]
    pub vsock: Option<VsockConfig>,
    /// The guest console.
    #[serde(default)]
    pub console: ConsoleOutput,
    /// Debugging a guest: read the guest console's input (`hvc0`'s receive queue) from this
    /// FIFO or file (`/proc/self/fd/N` for an inherited descriptor), opened without blocking
    /// when the VM is built. Off by default; needs a console that is not `off`.
    #[serde(default)]
    pub console_input: Option<PathBuf>,
    /// Also emulate the 8250 serial at 0x3f8 (early-boot debugging; slow).
    #[serde(default)]
    pub serial: bool,
    /// Stop the VM (KVM error) if the guest has neither written the boot-complete marker nor
    /// exited by then; `Some(0)` never. Default: 10 s on hosts that cannot vouch for a stock
    /// kernel (`host_probe::HostKind::boots_stock_kernel` is
    /// false: kvm_pvm, where it would crawl through the instruction emulator, or an unknown
    /// module), none on hardware KVM.
    #[serde(default)]
    pub boot_timeout_ms: Option<u64>,
    /// End the VM (SIGKILL) when the process that started the VMM dies, as a daemon's
    /// sandboxes die with it: a daemon killed outright must not leave VMs running unowned.
    #[serde(default)]
    pub die_with_parent: bool,
}

fn default_mem() -> u32 {
    256
}

fn default_vcpus() -> u8 {
    1
}

/// Why a [`VmConfig`] is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidConfig {
    /// `mem_mib` is outside [`MEM_MIB`].
    #[error("mem_mib must be between {min} and {max} (got {0})", min = MEM_MIB.start(), max = MEM_MIB.end())]
    Memory(u32),
    /// `vcpus` is outside [`VCPUS`].
    #[error("vcpus must be between {min} and {max} (got {0})", min = VCPUS.start(), max = VCPUS.end())]
    Vcpus(u8),
    /// The vsock guest CID is reserved.
    #[error("vsock guest_cid must be {MIN_GUEST_CID} or more (got {0})")]
    GuestCid(u32),
    /// The vsock handshake timeout is outside [`VSOCK_HANDSHAKE_TIMEOUT_MS`].
    #[error("vsock handshake_timeout_ms must be between {min} and {max} (got {0})", min = VSOCK_HANDSHAKE_TIMEOUT_MS.start(), max = VSOCK_HANDSHAKE_TIMEOUT_MS.end())]
    VsockHandshakeTimeout(u64),
    /// The vsock stall timeout is above [`MAX_VSOCK_STALL_TIMEOUT_MS`].
    #[error(
        "vsock stall_timeout_ms must be at most {MAX_VSOCK_STALL_TIMEOUT_MS} (0: never; got {0})"
    )]
    VsockStallTimeout(u64),
    /// Console input was asked for with the console device off.
    #[error("console_input needs a console (the console is off)")]
    ConsoleInputWithoutConsole,
    /// More than [`MAX_BLOCK_DEVICES`] disks.
    #[error("at most {MAX_BLOCK_DEVICES} block devices (got {0})")]
    TooManyBlockDevices(usize),
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
            disk_control: None,
            vsock: None,
            console: ConsoleOutput::default(),
            console_input: None,
            serial: false,
            boot_timeout_ms: None,
            die_with_parent: false,
        }
    }

    /// Checks the ranges the VMM relies on.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if !MEM_MIB.contains(&self.mem_mib) {
            return Err(InvalidConfig::Memory(self.mem_mib));
        }
        if !VCPUS.contains(&self.vcpus) {
            return Err(InvalidConfig::Vcpus(self.vcpus));
        }
        if let Some(v) = &self.vsock {
            if v.guest_cid < MIN_GUEST_CID {
                return Err(InvalidConfig::GuestCid(v.guest_cid));
            }
            if !VSOCK_HANDSHAKE_TIMEOUT_MS.contains(&v.handshake_timeout_ms) {
                return Err(InvalidConfig::VsockHandshakeTimeout(v.handshake_timeout_ms));
            }
            if v.stall_timeout_ms > MAX_VSOCK_STALL_TIMEOUT_MS {
                return Err(InvalidConfig::VsockStallTimeout(v.stall_timeout_ms));
            }
        }
        if self.console_input.is_some() && self.console == ConsoleOutput::Off {
            return Err(InvalidConfig::ConsoleInputWithoutConsole);
        }
        if self.block.len() > MAX_BLOCK_DEVICES {
            return Err(InvalidConfig::TooManyBlockDevices(self.block.len()));
        }
        Ok(())
    }
}

/// `crucible-vmm`'s process exit codes (`docs/vmm.md`, "Exit codes"): the VMM exits with them;
/// whatever runs it (the daemon, tests, scripts) can map a status back with
/// [`VmmExitCode::from_code`] and name it with [`VmmExitCode::meaning`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmmExitCode {
    /// The guest reset or powered off, or SIGTERM stopped the VM.
    Ok,
    /// An unexpected VMM failure.
    Internal,
    /// Bad flags/configuration, or an unreadable kernel, initramfs or disk image.
    Config,
    /// KVM is missing, failed, or cannot run this guest on this host.
    Kvm,
    /// The guest crashed (triple fault, a failed test-guest check).
    GuestCrash,
}

impl VmmExitCode {
    /// Every code, in numeric order.
    pub const ALL: [VmmExitCode; 5] = [
        VmmExitCode::Ok,
        VmmExitCode::Internal,
        VmmExitCode::Config,
        VmmExitCode::Kvm,
        VmmExitCode::GuestCrash,
    ];

    /// The process exit status.
    pub const fn code(self) -> i32 {
        match self {
            VmmExitCode::Ok => 0,
            VmmExitCode::Internal => 1,
            VmmExitCode::Config => 2,
            VmmExitCode::Kvm => 3,
            VmmExitCode::GuestCrash => 4,
        }
    }

    /// The code for a process exit status, if it is one of the VMM's.
    pub fn from_code(code: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.code() == code)
    }

    /// What the code means, for messages about a VM that ended.
    pub fn meaning(self) -> &'static str {
        match self {
            VmmExitCode::Ok => "the guest powered off or reset",
            VmmExitCode::Internal => "internal VMM error",
            VmmExitCode::Config => "bad VM configuration or unreadable kernel, initramfs or disk",
            VmmExitCode::Kvm => "KVM error, or the guest did not finish booting in time",
            VmmExitCode::GuestCrash => "the guest crashed",
        }
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
        assert_eq!(c.console_input, None, "console input is off by default");
        let v = c.vsock.as_ref().unwrap();
        assert_eq!(
            (v.handshake_timeout_ms, v.stall_timeout_ms),
            (2_000, 60_000),
            "vsock timeouts default when absent"
        );
        let set: VsockConfig = serde_json::from_str(
            r#"{"guest_cid":3,"uds_path":"/v","handshake_timeout_ms":500,"stall_timeout_ms":0}"#,
        )
        .unwrap();
        assert_eq!((set.handshake_timeout_ms, set.stall_timeout_ms), (500, 0));
        let back: VmConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        c.validate().unwrap();
    }

    #[test]
    fn vm_config_rejects_unknown_fields() {
        assert!(serde_json::from_str::<VmConfig>(r#"{"kernel":"/k","bogus":1}"#).is_err());
        assert!(serde_json::from_str::<VmConfig>(
            r#"{"kernel":"/k","vsock":{"guest_cid":3,"uds_path":"/v","extra":0}}"#
        )
        .is_err());
    }

    #[test]
    fn vm_config_validation_names_each_bad_range() {
        let good = VmConfig::new("/k".into());
        good.validate().unwrap();
        let with = |f: &dyn Fn(&mut VmConfig)| {
            let mut c = good.clone();
            f(&mut c);
            c.validate()
        };
        assert_eq!(with(&|c| c.mem_mib = 15), Err(InvalidConfig::Memory(15)));
        assert_eq!(
            with(&|c| c.mem_mib = 65537),
            Err(InvalidConfig::Memory(65537))
        );
        assert_eq!(with(&|c| c.mem_mib = 16), Ok(()));
        assert_eq!(with(&|c| c.vcpus = 0), Err(InvalidConfig::Vcpus(0)));
        assert_eq!(with(&|c| c.vcpus = 33), Err(InvalidConfig::Vcpus(33)));
        assert_eq!(with(&|c| c.vcpus = 32), Ok(()));
        let vsock =
            |cid| move |c: &mut VmConfig| c.vsock = Some(VsockConfig::new(cid, "/x".into()));
        assert_eq!(with(&vsock(2)), Err(InvalidConfig::GuestCid(2)));
        assert_eq!(with(&vsock(3)), Ok(()));
        let timeouts = |handshake, stall| {
            move |c: &mut VmConfig| {
                let mut v = VsockConfig::new(3, "/x".into());
                v.handshake_timeout_ms = handshake;
                v.stall_timeout_ms = stall;
                c.vsock = Some(v);
            }
        };
        assert_eq!(
            with(&timeouts(0, 0)),
            Err(InvalidConfig::VsockHandshakeTimeout(0))
        );
        assert_eq!(
            with(&timeouts(3_600_001, 0)),
            Err(InvalidConfig::VsockHandshakeTimeout(3_600_001))
        );
        assert_eq!(with(&timeouts(1, 0)), Ok(()));
        assert_eq!(with(&timeouts(2000, 86_400_000)), Ok(()));
        assert_eq!(
            with(&timeouts(2000, 86_400_001)),
            Err(InvalidConfig::VsockStallTimeout(86_400_001))
        );
        let disks = |n| {
            move |c: &mut VmConfig| {
                c.block = vec![
                    BlockConfig {
                        path: "/d".into(),
                        read_only: false
                    };
                    n
                ]
            }
        };
        assert_eq!(with(&disks(16)), Ok(()));
        assert_eq!(
            with(&disks(17)),
            Err(InvalidConfig::TooManyBlockDevices(17))
        );
        let input = |console: ConsoleOutput| {
            move |c: &mut VmConfig| {
                c.console = console.clone();
                c.console_input = Some("/run/in.fifo".into());
            }
        };
        assert_eq!(
            with(&input(ConsoleOutput::Off)),
            Err(InvalidConfig::ConsoleInputWithoutConsole)
        );
        assert_eq!(with(&input(ConsoleOutput::Stdout)), Ok(()));
        assert_eq!(
            InvalidConfig::Memory(1).to_string(),
            "mem_mib must be between 16 and 65536 (got 1)"
        );
    }

    #[test]
    fn exit_codes_are_the_documented_numbers_and_map_back() {
        let codes: Vec<i32> = VmmExitCode::ALL.iter().map(|c| c.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4]);
        for c in VmmExitCode::ALL {
            assert_eq!(VmmExitCode::from_code(c.code()), Some(c));
        }
        assert_eq!(VmmExitCode::from_code(137), None);
    }
}
