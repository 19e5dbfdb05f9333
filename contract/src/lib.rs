//! What crucible's guest and host must agree on, each thing defined once.
//!
//! Two sides build against this crate and must never drift apart: the host (the daemon,
//! `crucible-vmm`, the image smoke test, `crucible doctor`) and the guest agent (`guest-init`,
//! PID 1 of every sandbox). Before it existed the boot marker, the kernel command-line keys and
//! the default `PATH` were each written twice and had begun to disagree. See
//! `docs/agent-protocol.md`, "The guest/host contract". Probing the host (its KVM, which KVM
//! tests it runs) is not a contract: it is `host-probe`, beside this crate.
//!
//! - [`vm`]: the microVM configuration the daemon writes and `crucible-vmm` reads, with its
//!   validation, and the VMM's exit codes;
//! - [`cmdline`]: the `crucible.*` kernel command-line settings: one builder (host), one parser
//!   (guest);
//! - [`boot_marker`]: the agent's markers: ready, and why it ends the VM;
//! - [`disk`]: the serials by which a microVM's guest tells its scratch and mounted disks
//!   apart;
//! - [`block_selftest`]: the data patterns of the block self-test (host writes, guest checks
//!   and writes back);
//! - [`vsock`]: the agent's default ports and the hybrid-vsock socket naming;
//! - [`egress`]: the vsock port the agent's proxy reaches the daemon on, and the proxy's
//!   address inside;
//! - [`qemu`]: what runs our kernel under QEMU's `microvm` machine;
//! - [`namespace_fds`]: the descriptors a namespace sandbox's PID 1 is handed;
//! - [`DEFAULT_PATH`], [`AGENT_HOME`]: the agent's own environment, which commands inherit.
//!
//! The guest agent is a small static binary, so this crate depends on `serde` and `thiserror`
//! only and does no I/O.

#![forbid(unsafe_code)]

pub mod block_selftest;
pub mod boot_marker;
pub mod cmdline;
pub mod container_security;
pub mod disk;
pub mod egress;
pub mod hostname;
pub mod mountinfo;
pub mod namespace_fds;
pub mod qemu;
pub mod vm;
pub mod vsock;

/// The `PATH` a command gets when neither the agent's environment nor the request has one
/// (the agent in a VM, where the kernel starts PID 1 without it; the namespace sandbox, whose
/// environment the daemon clears). The usual Debian order, so images behave as under Docker.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The agent's `HOME`. The agent's whole environment is `PATH` ([`DEFAULT_PATH`]) and `HOME`,
/// on every backend: the namespace backend starts it with exactly these, and the agent as a
/// VM's init replaces whatever the kernel handed it (`HOME=/`, `TERM=linux` and every
/// unknown `key=value` boot parameter) with them, so commands see the same base everywhere.
pub const AGENT_HOME: &str = "/root";
