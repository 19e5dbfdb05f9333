//! What this host offers, for backend choice and `crucible doctor`.

use std::path::Path;

use host_probe::host::HostKind;
use serde::Serialize;

/// A summary of the host.
#[derive(Debug, Clone, Serialize)]
pub struct HostReport {
    /// KVM kind (the probe `crucible-vmm --host-info` uses too).
    pub kvm: HostKind,
    /// Whether `/dev/kvm` exists.
    pub(crate) dev_kvm: bool,
    /// `2` for a unified cgroup v2 hierarchy, `1` for v1 controllers only, `0` for none.
    pub cgroup_version: u8,
    /// Whether unprivileged user namespaces are allowed.
    pub user_namespaces: bool,
    /// Whether the daemon runs as root (the namespace backend needs it).
    pub root: bool,
}

/// Inspects the host.
pub fn inspect() -> HostReport {
    let kvm = HostKind::detect();
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
        dev_kvm: kvm.has_kvm(),
        cgroup_version,
        user_namespaces,
        root,
    }
}

/// Why this host's KVM cannot boot the image, if it cannot (hardware KVM only: kvm_pvm and
/// unknown modules are not vouched for; see `host_probe::host`).
pub fn kvm_unavailable_reason(report: &HostReport) -> Option<String> {
    report.kvm.unavailable_reason().map(str::to_string)
}
