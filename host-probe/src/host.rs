//! What kind of KVM this host has, and what that means for booting a stock kernel: one probe
//! for `crucible-vmm` (its boot watchdog, `--host-info`), the daemon (whether the microVM
//! backend is offered) and `crucible doctor`.
//!
//! The one decision made here: only hardware KVM (`kvm_intel`, `kvm_amd`) is known to boot our
//! stock guest kernel. `kvm_pvm` is known not to, and a module we do not recognise is a host we
//! cannot vouch for, so it is treated the same way: the daemon does not use microVMs there and
//! says why, and the VMM (which still runs what it is told) arms its boot watchdog.

use std::path::Path;

use serde::Serialize;

/// Where the probe looks for the loaded KVM modules.
pub const SYS_MODULE: &str = "/sys/module";
/// The KVM device.
pub const DEV_KVM: &str = "/dev/kvm";

/// Whether this process can open `dev_kvm` for reading and writing, as creating a VM needs:
/// the node can exist (so [`HostKind::has_kvm`]) yet be closed to this user. The error says why.
pub fn dev_kvm_access(dev_kvm: &Path) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev_kvm)
        .map(drop)
}

/// The host's KVM implementation. Serialized as [`HostKind::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostKind {
    /// Hardware virtualization (Intel VT-x).
    KvmIntel,
    /// Hardware virtualization (AMD-V).
    KvmAmd,
    /// PVM (`kvm_pvm`): page-table-based virtualization without hardware support. The KVM API
    /// works, but a stock kernel runs in KVM's instruction emulator (console after ~14 s, then it
    /// dies on XRSTOR/POPCNT); only a PVM-enabled guest kernel boots properly.
    KvmPvm,
    /// `/dev/kvm` exists but the module is none of the above.
    Unknown,
    /// No `/dev/kvm`.
    None,
}

impl HostKind {
    /// Detects the host kind from `/sys/module` and `/dev/kvm`.
    pub fn detect() -> Self {
        Self::detect_in(Path::new(SYS_MODULE), Path::new(DEV_KVM))
    }

    /// Detection against other roots (for tests). A hardware module wins over `kvm_pvm`: only
    /// one vendor module drives `/dev/kvm`, and one that failed to initialise is not listed.
    pub fn detect_in(sys_module: &Path, dev_kvm: &Path) -> Self {
        if !dev_kvm.exists() {
            return HostKind::None;
        }
        let loaded = |module: &str| sys_module.join(module).exists();
        if loaded("kvm_intel") {
            HostKind::KvmIntel
        } else if loaded("kvm_amd") {
            HostKind::KvmAmd
        } else if loaded("kvm_pvm") {
            HostKind::KvmPvm
        } else {
            HostKind::Unknown
        }
    }

    /// Whether `/dev/kvm` exists at all (the VMM can create VMs, if not necessarily boot a
    /// stock kernel in them).
    pub fn has_kvm(self) -> bool {
        self != HostKind::None
    }

    /// Whether a stock Linux kernel is known to boot at native speed here.
    pub fn boots_stock_kernel(self) -> bool {
        matches!(self, HostKind::KvmIntel | HostKind::KvmAmd)
    }

    /// Why microVM sandboxes (our stock kernel) are not used on this host, or `None` where
    /// they are.
    pub fn unavailable_reason(self) -> Option<&'static str> {
        (!self.boots_stock_kernel()).then(|| self.describe())
    }

    /// A plain statement of what will happen on this host, naming the module (it is also the
    /// daemon's reason for not offering microVMs).
    pub fn describe(self) -> &'static str {
        match self {
            HostKind::KvmIntel => "kvm_intel (hardware virtualization): guests boot natively",
            HostKind::KvmAmd => "kvm_amd (hardware virtualization): guests boot natively",
            HostKind::KvmPvm => {
                "kvm_pvm (no hardware virtualization): a stock kernel falls into KVM's \
                 instruction emulator and dies on XRSTOR/POPCNT; only tiny test guests or a \
                 PVM-enabled guest kernel run; use the namespace backend, or `crucible serve \
                 --hypervisor qemu-tcg` for microVMs under QEMU TCG"
            }
            HostKind::Unknown => {
                "an unknown KVM module (/dev/kvm exists, but none of kvm_intel, kvm_amd, \
                 kvm_pvm is loaded): crucible cannot vouch that a stock kernel boots here, so \
                 sandboxes use the namespace backend and crucible-vmm stops a guest that does \
                 not finish booting within 10 s"
            }
            HostKind::None => "no /dev/kvm: microVMs cannot run here; use the namespace backend",
        }
    }

    /// A short name (`--timings`, logs, `crucible doctor --json`).
    pub fn name(self) -> &'static str {
        match self {
            HostKind::KvmIntel => "kvm_intel",
            HostKind::KvmAmd => "kvm_amd",
            HostKind::KvmPvm => "kvm_pvm",
            HostKind::Unknown => "unknown",
            HostKind::None => "none",
        }
    }
}

impl std::fmt::Display for HostKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A fake `/sys/module` with `modules` loaded, and a fake `/dev/kvm` if `dev_kvm`.
    fn detect(modules: &[&str], dev_kvm: bool) -> HostKind {
        let d = tempfile::tempdir().unwrap();
        let sys_module = d.path().join("module");
        std::fs::create_dir(&sys_module).unwrap();
        // `kvm` itself is loaded on every KVM host and must not decide anything.
        std::fs::create_dir(sys_module.join("kvm")).unwrap();
        for m in modules {
            std::fs::create_dir(sys_module.join(m)).unwrap();
        }
        let kvm = d.path().join("kvm");
        if dev_kvm {
            std::fs::write(&kvm, "").unwrap();
        }
        HostKind::detect_in(&sys_module, &kvm)
    }

    #[test]
    fn no_dev_kvm_is_none_whatever_modules_are_loaded() {
        assert_eq!(detect(&[], false), HostKind::None);
        assert_eq!(detect(&["kvm_intel"], false), HostKind::None);
        assert!(!HostKind::None.has_kvm());
    }

    #[test]
    fn hardware_modules_boot_a_stock_kernel() {
        assert_eq!(detect(&["kvm_intel"], true), HostKind::KvmIntel);
        assert_eq!(detect(&["kvm_amd"], true), HostKind::KvmAmd);
        assert_eq!(detect(&["kvm_intel", "kvm_pvm"], true), HostKind::KvmIntel);
        for h in [HostKind::KvmIntel, HostKind::KvmAmd] {
            assert!(h.boots_stock_kernel());
            assert_eq!(h.unavailable_reason(), None);
        }
    }

    #[test]
    fn kvm_pvm_has_kvm_but_does_not_boot_a_stock_kernel() {
        let h = detect(&["kvm_pvm"], true);
        assert_eq!(h, HostKind::KvmPvm);
        assert!(h.has_kvm());
        assert!(!h.boots_stock_kernel());
        assert!(h.unavailable_reason().unwrap().contains("kvm_pvm"));
    }

    #[test]
    fn an_unknown_module_is_not_vouched_for_and_says_why() {
        let h = detect(&["kvm_something_new"], true);
        assert_eq!(h, HostKind::Unknown);
        assert!(h.has_kvm());
        assert!(!h.boots_stock_kernel());
        let why = h.unavailable_reason().unwrap();
        assert!(why.contains("cannot vouch"), "{why}");
        assert!(why.contains("namespace backend"), "{why}");
    }

    #[test]
    fn dev_kvm_access_needs_the_node_to_open_read_write() {
        let d = tempfile::tempdir().unwrap();
        let kvm = d.path().join("kvm");
        let missing = dev_kvm_access(&kvm).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
        std::fs::write(&kvm, "").unwrap();
        dev_kvm_access(&kvm).unwrap();
        // A directory exists but does not open for writing (as a node closed to this user).
        assert!(dev_kvm_access(d.path()).is_err());
    }

    #[test]
    fn serialized_as_the_short_name() {
        for h in [
            HostKind::KvmIntel,
            HostKind::KvmAmd,
            HostKind::KvmPvm,
            HostKind::Unknown,
            HostKind::None,
        ] {
            assert_eq!(
                serde_json::to_value(h).unwrap(),
                serde_json::Value::String(h.name().into())
            );
            assert_eq!(h.to_string(), h.name());
        }
    }
}
