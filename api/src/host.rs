//! What this host offers, for backend choice and `crucible doctor`.

use std::path::Path;

use serde::Serialize;

/// The kind of KVM the host has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvmKind {
    /// `kvm_intel` or `kvm_amd`: hardware virtualization; stock guest kernels boot natively.
    Hardware,
    /// `kvm_pvm`: pagetable-based nested virtualization; only PVM-patched guest kernels run
    /// natively, a stock kernel falls into KVM's instruction emulator and does not boot.
    Pvm,
    /// No usable `/dev/kvm`.
    None,
}

/// A summary of the host.
#[derive(Debug, Clone, Serialize)]
pub struct HostReport {
    /// KVM kind.
    pub kvm: KvmKind,
    /// Whether `/dev/kvm` exists.
    pub dev_kvm: bool,
    /// `2` for a unified cgroup v2 hierarchy, `1` for v1 controllers only, `0` for none.
    pub cgroup_version: u8,
    /// Whether unprivileged user namespaces are allowed.
    pub user_namespaces: bool,
    /// Whether the daemon runs as root (the namespace backend needs it).
    pub root: bool,
}

/// Inspects the host.
pub fn inspect() -> HostReport {
    let module = |name: &str| Path::new("/sys/module").join(name).exists();
    let dev_kvm = Path::new("/dev/kvm").exists();
    let kvm = if !dev_kvm {
        KvmKind::None
    } else if module("kvm_intel") || module("kvm_amd") {
        KvmKind::Hardware
    } else if module("kvm_pvm") {
        KvmKind::Pvm
    } else {
        KvmKind::None
    };
    let cgroup_version = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        2
    } else if Path::new("/sys/fs/cgroup/memory").is_dir() {
        1
    } else {
        0
    };
    let user_namespaces = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0);
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    HostReport {
        kvm,
        dev_kvm,
        cgroup_version,
        user_namespaces,
        root,
    }
}

/// Why this host's KVM cannot boot the image, if it cannot.
pub fn kvm_unavailable_reason(report: &HostReport) -> Option<String> {
    match report.kvm {
        KvmKind::None => Some("there is no usable /dev/kvm on this host".into()),
        KvmKind::Pvm => Some(
            "this host's KVM is kvm_pvm (nested, pagetable-based): a stock guest kernel runs \
             in KVM's instruction emulator and does not boot"
                .into(),
        ),
        KvmKind::Hardware => None,
    }
}
