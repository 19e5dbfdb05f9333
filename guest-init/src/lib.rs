//! crucible's guest agent.
//!
//! The same code serves three ways (see `docs/agent-protocol.md`):
//! - **VM PID 1** ([`init::vm_main`]): mounts, cgroups, vsock, console readiness line;
//! - **host process** (`--listen unix:PATH`): the same protocol on a Unix socket;
//! - **namespace PID 1**: the host-process mode run as PID 1 of a PID namespace, where the
//!   [`reaper`] also reaps orphans.
//!
//! Modules: [`server`] accepts connections and dispatches requests; [`exec`] streams one
//! command; [`exec_ids`] names running commands for signals; [`spawn`] forks and execs it; [`reaper`] reaps it (each exec its own command,
//! through a pidfd) and reaps orphans; [`files`] extracts tar archives and sends files;
//! [`vm_root`] builds a microVM's root and mounts its disks; [`egress`] serves the proxy.

pub mod archive;
pub mod container_init;
pub mod egress;
pub mod exec;
pub mod exec_ids;
pub mod exec_registry;
pub mod exec_tail;
pub mod files;
pub mod guest_stats;
pub mod inbound;
pub mod init;
pub mod log;
pub mod main_ns;
pub mod mount;
pub mod power;
pub mod pty;
pub mod reaper;
pub mod relay;
pub mod selftest;
pub mod server;
pub mod spawn;
pub mod sys;
pub mod vm_containers;
pub mod vm_root;
mod vsock;
