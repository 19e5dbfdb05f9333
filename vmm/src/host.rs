//! What kind of KVM this host has, and what that means for booting a stock kernel.

use std::path::Path;

/// The host's KVM implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
        Self::detect_in(Path::new("/sys/module"), Path::new("/dev/kvm"))
    }

    /// Detection against other roots (for tests).
    pub fn detect_in(sys_module: &Path, dev_kvm: &Path) -> Self {
        if !dev_kvm.exists() {
            return HostKind::None;
        }
        if sys_module.join("kvm_intel").exists() {
            HostKind::KvmIntel
        } else if sys_module.join("kvm_amd").exists() {
            HostKind::KvmAmd
        } else if sys_module.join("kvm_pvm").exists() {
            HostKind::KvmPvm
        } else {
            HostKind::Unknown
        }
    }

    /// Whether a stock Linux kernel boots at native speed here.
    pub fn boots_stock_kernel(self) -> bool {
        matches!(self, HostKind::KvmIntel | HostKind::KvmAmd)
    }

    /// A plain statement of what will happen on this host.
    pub fn describe(self) -> &'static str {
        match self {
            HostKind::KvmIntel | HostKind::KvmAmd => "hardware KVM: guests boot natively",
            HostKind::KvmPvm => {
                "kvm_pvm (no hardware virtualization): a stock kernel falls into KVM's \
                 instruction emulator and dies on XRSTOR/POPCNT; only tiny test guests or a \
                 PVM-enabled guest kernel run; use the namespace backend for sandboxes"
            }
            HostKind::Unknown => "unknown KVM module: boot behaviour unknown",
            HostKind::None => "no /dev/kvm: microVMs cannot run here; use the namespace backend",
        }
    }

    /// A short name (`--timings`, logs).
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn host_kind_is_read_from_sys_module() {
        let d = tempfile::tempdir().unwrap();
        let kvm = d.path().join("kvm");
        assert_eq!(HostKind::detect_in(d.path(), &kvm), HostKind::None);
        std::fs::write(&kvm, "").unwrap();
        assert_eq!(HostKind::detect_in(d.path(), &kvm), HostKind::Unknown);
        std::fs::create_dir(d.path().join("kvm_pvm")).unwrap();
        assert_eq!(HostKind::detect_in(d.path(), &kvm), HostKind::KvmPvm);
        assert!(!HostKind::KvmPvm.boots_stock_kernel());
        std::fs::create_dir(d.path().join("kvm_intel")).unwrap();
        assert_eq!(HostKind::detect_in(d.path(), &kvm), HostKind::KvmIntel);
    }
}
