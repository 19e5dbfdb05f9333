//! The host, probed: what kind of KVM it has and whether a stock kernel boots on it
//! ([`host`]: `crucible-vmm --host-info`, the daemon's backend choice and `crucible doctor`
//! use the same probe), and which KVM-dependent tests it can run ([`kvm_tests`], for the test
//! crates' build scripts and `cargo xtask ci`). Beside `contract` (what guest and host agree
//! on), not in it: the guest never probes its host.

#![forbid(unsafe_code)]

pub mod host;
pub mod kvm_tests;

pub use host::HostKind;
