//! What crucible's guest and host must agree on, each thing defined once.
//!
//! Two sides build against this crate and must never drift apart: the host (the daemon,
//! `crucible-vmm`, the image smoke test, `crucible doctor`) and the guest agent (`guest-init`,
//! PID 1 of every sandbox). Before it existed the boot marker, the kernel command-line keys, the
//! default `PATH` and the KVM probe were each written twice and had begun to disagree. See
//! `docs/agent-protocol.md`, "The guest/host contract".
//!
//! - [`vm`]: the microVM configuration the daemon writes and `crucible-vmm` reads, with its
//!   validation, and the VMM's exit codes;
//! - [`cmdline`]: the `crucible.*` kernel command-line settings: one builder (host), one parser
//!   (guest);
//! - [`boot_marker`]: the port write that tells the VMM the guest has booted;
//! - [`disk`]: the serials by which a microVM's guest tells its scratch and mounted disks
//!   apart;
//! - [`block_selftest`]: the data patterns of the block self-test (host writes, guest checks
//!   and writes back);
//! - [`vsock`]: the agent's default ports and the hybrid-vsock socket naming;
//! - [`host`]: what kind of KVM this host has and whether a stock kernel boots on it;
//! - [`kvm_tests`]: which KVM-dependent tests this host runs (for the test crates' build
//!   scripts: ignored where the host cannot run them, mandatory with `CRUCIBLE_REQUIRE_KVM=1`);
//! - [`DEFAULT_PATH`]: the `PATH` commands get when nobody gave one.
//!
//! The guest agent is a small static binary, so this crate depends on `serde` and `thiserror`
//! only and does no I/O beyond the host probe's `stat`s and its opening of `/dev/kvm`.

#![forbid(unsafe_code)]

pub mod block_selftest;
pub mod boot_marker;
pub mod cmdline;
pub mod disk;
pub mod egress;
pub mod host;
pub mod kvm_tests;
pub mod qemu;
pub mod vm;
pub mod vsock;

/// The `PATH` a command gets when neither the agent's environment nor the request has one
/// (the agent in a VM, where the kernel starts PID 1 without it; the namespace sandbox, whose
/// environment the daemon clears). The usual Debian order, so images behave as under Docker.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
