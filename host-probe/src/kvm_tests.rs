//! Which KVM-dependent tests this host can run, decided once for the build scripts of the crates
//! that own such tests (`vmm`, `tests`).
//!
//! Stable Rust cannot mark a test ignored at run time, and a test that returns early is counted
//! as passed. So the build script probes the host ([`HostKind`], the same probe as the VMM and
//! the daemon) and sets cfgs; each test that needs more than the host has carries
//! `#[cfg_attr(not(<cfg>), ignore = "<why>")]`, and `cargo test` reports it as ignored, with
//! its reason. `CRUCIBLE_REQUIRE_KVM=1` sets every cfg whatever the host: the tests then run, and
//! fail on a host that cannot run them (a CI machine that should have KVM and lost it).

use std::path::Path;

use crate::host::{self, HostKind};

/// The environment variable that makes every KVM test mandatory (`1`); `0` or unset lets the
/// host decide.
pub const REQUIRE_ENV: &str = "CRUCIBLE_REQUIRE_KVM";
/// Set where `/dev/kvm` opens read-write: the hand-assembled test guests run (any KVM,
/// `kvm_pvm` included).
pub const CFG_KVM: &str = "crucible_kvm";
/// Set where a stock kernel boots (hardware KVM: `kvm_intel`, `kvm_amd`): the tests that boot
/// our kernel and agent run.
pub const CFG_HARDWARE_KVM: &str = "crucible_hardware_kvm";

/// `CRUCIBLE_REQUIRE_KVM` holds something other than `1`, `0` or nothing: a typo must not
/// quietly leave the KVM tests optional.
#[derive(Debug, thiserror::Error)]
#[error("{REQUIRE_ENV}={0:?}: expected 1 (every KVM test runs, and fails where it cannot) or 0/unset (the host decides)")]
pub struct BadRequireKvm(pub String);

/// What the KVM-dependent tests may assume on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvmTestGate {
    /// The host as probed.
    pub host: HostKind,
    /// `CRUCIBLE_REQUIRE_KVM=1`: every KVM test runs.
    pub required: bool,
    /// Run the tests that need a usable `/dev/kvm`.
    pub kvm: bool,
    /// Run the tests that boot a stock kernel.
    pub hardware_kvm: bool,
}

/// Whether `CRUCIBLE_REQUIRE_KVM` (its value, if set) asks for every KVM test.
pub fn parse_require(value: Option<&str>) -> Result<bool, BadRequireKvm> {
    match value.map(str::trim) {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(BadRequireKvm(other.to_string())),
    }
}

impl KvmTestGate {
    /// The gate for this host and this process's `CRUCIBLE_REQUIRE_KVM`.
    pub fn detect() -> Result<Self, BadRequireKvm> {
        let require = std::env::var(REQUIRE_ENV).ok();
        let required = parse_require(require.as_deref())?;
        let opens = host::dev_kvm_access(Path::new(host::DEV_KVM)).is_ok();
        Ok(Self::decide(HostKind::detect(), opens, required))
    }

    /// The gate for `host`, whose `/dev/kvm` opens read-write if `dev_kvm_opens`.
    pub fn decide(host: HostKind, dev_kvm_opens: bool, required: bool) -> Self {
        KvmTestGate {
            host,
            required,
            kvm: required || dev_kvm_opens,
            hardware_kvm: required || host.boots_stock_kernel(),
        }
    }

    /// The `cargo::` lines a build script prints for this gate. `dev_kvm_exists` decides whether
    /// `/dev/kvm` is watched: cargo reruns a build script on every build while a watched path is
    /// missing, which would rebuild the test crate each time on a host without KVM.
    ///
    /// `/dev/kvm` is the only path watched: the KVM vendor module creates it when it loads and
    /// removes it when it unloads (its devtmpfs node keeps a real mtime), whereas a
    /// `/sys/module/*` directory's mtime is that of its cached inode and changes whenever the
    /// kernel evicts and rereads it, which would rebuild at random.
    pub fn cargo_directives(&self, dev_kvm_exists: bool) -> Vec<String> {
        let mut lines = vec![
            format!("cargo::rustc-check-cfg=cfg({CFG_KVM})"),
            format!("cargo::rustc-check-cfg=cfg({CFG_HARDWARE_KVM})"),
            format!("cargo::rerun-if-env-changed={REQUIRE_ENV}"),
        ];
        if dev_kvm_exists {
            lines.push(format!("cargo::rerun-if-changed={}", host::DEV_KVM));
        }
        if self.kvm {
            lines.push(format!("cargo::rustc-cfg={CFG_KVM}"));
        }
        if self.hardware_kvm {
            lines.push(format!("cargo::rustc-cfg={CFG_HARDWARE_KVM}"));
        }
        lines
    }

    /// One line for a CI log (`cargo xtask ci`): which KVM tests run here and why.
    pub fn summary(&self) -> String {
        let runs = match (self.kvm, self.hardware_kvm) {
            (true, true) => "all KVM tests run",
            (true, false) => {
                "test-guest KVM tests run; hardware-KVM tests are ignored here (the nested tier, \
                 `cargo xtask nested`, runs them)"
            }
            (false, _) => "KVM tests are ignored",
        };
        if self.required {
            format!(
                "{REQUIRE_ENV}=1: {runs} (host is {}); they fail where the host cannot run them",
                self.host
            )
        } else {
            format!(
                "host is {}: {runs} ({REQUIRE_ENV}=1 makes them mandatory)",
                self.host
            )
        }
    }

    /// Prints [`Self::cargo_directives`] for the calling build script, or fails the build on a
    /// bad `CRUCIBLE_REQUIRE_KVM`.
    pub fn emit_for_build_script() {
        let gate = match Self::detect() {
            Ok(g) => g,
            // A build script reports by failing; the message names the variable and the value.
            Err(e) => panic!("{e}"),
        };
        for line in gate.cargo_directives(Path::new(host::DEV_KVM).exists()) {
            println!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_host_decides_unless_kvm_is_required() {
        let pvm = KvmTestGate::decide(HostKind::KvmPvm, true, false);
        assert!(pvm.kvm && !pvm.hardware_kvm);
        let intel = KvmTestGate::decide(HostKind::KvmIntel, true, false);
        assert!(intel.kvm && intel.hardware_kvm);
        // A hardware module whose /dev/kvm this user cannot open: no test guests, but the
        // real-kernel tests still count as runnable and fail loudly if run.
        let closed = KvmTestGate::decide(HostKind::KvmAmd, false, false);
        assert!(!closed.kvm && closed.hardware_kvm);
        let none = KvmTestGate::decide(HostKind::None, false, false);
        assert!(!none.kvm && !none.hardware_kvm);
        let forced = KvmTestGate::decide(HostKind::None, false, true);
        assert!(forced.kvm && forced.hardware_kvm);
    }

    #[test]
    fn require_kvm_accepts_one_zero_or_nothing_and_refuses_the_rest() {
        assert!(!parse_require(None).unwrap());
        assert!(!parse_require(Some("")).unwrap());
        assert!(!parse_require(Some("0")).unwrap());
        assert!(parse_require(Some("1")).unwrap());
        assert!(parse_require(Some(" 1\n")).unwrap());
        for bad in ["yes", "true", "2"] {
            let e = parse_require(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(REQUIRE_ENV) && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn directives_declare_both_cfgs_and_set_only_what_the_host_runs() {
        let pvm = KvmTestGate::decide(HostKind::KvmPvm, true, false).cargo_directives(true);
        assert!(pvm.contains(&"cargo::rustc-check-cfg=cfg(crucible_kvm)".to_string()));
        assert!(pvm.contains(&"cargo::rustc-check-cfg=cfg(crucible_hardware_kvm)".to_string()));
        assert!(pvm.contains(&"cargo::rerun-if-env-changed=CRUCIBLE_REQUIRE_KVM".to_string()));
        assert!(pvm.contains(&"cargo::rerun-if-changed=/dev/kvm".to_string()));
        assert!(pvm.contains(&"cargo::rustc-cfg=crucible_kvm".to_string()));
        assert!(!pvm
            .iter()
            .any(|l| l == "cargo::rustc-cfg=crucible_hardware_kvm"));

        let none = KvmTestGate::decide(HostKind::None, false, false).cargo_directives(false);
        assert!(!none.iter().any(|l| l.starts_with("cargo::rustc-cfg=")));
        // A missing path would make cargo rerun the script, and rebuild the tests, every time.
        assert!(!none
            .iter()
            .any(|l| l.starts_with("cargo::rerun-if-changed=")));
    }

    #[test]
    fn the_summary_says_what_runs_and_how_to_make_it_mandatory() {
        let pvm = KvmTestGate::decide(HostKind::KvmPvm, true, false).summary();
        assert!(pvm.contains("host is kvm_pvm"), "{pvm}");
        assert!(pvm.contains("hardware-KVM tests are ignored"), "{pvm}");
        assert!(
            pvm.contains("CRUCIBLE_REQUIRE_KVM=1 makes them mandatory"),
            "{pvm}"
        );
        let forced = KvmTestGate::decide(HostKind::KvmPvm, true, true).summary();
        assert!(
            forced.starts_with("CRUCIBLE_REQUIRE_KVM=1: all KVM tests run"),
            "{forced}"
        );
        assert!(forced.contains("fail where the host cannot"), "{forced}");
    }
}
