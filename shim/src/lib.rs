//! `containerd-shim-crucible-v2`: a containerd shim v2 (task API v2, containerd 1.6 and 1.7)
//! that runs each container as a sandbox of the local crucible daemon, reached over its Unix
//! socket. Design and limits: `docs/kubernetes.md`.

#![forbid(unsafe_code)]

pub mod bundle_state;
pub mod daemon;
pub mod error;
pub mod events;
pub mod exit;
pub mod metrics;
pub mod process;
pub mod rootfs;
pub mod service;
pub mod shim;
pub mod spec;
pub mod stdio;

/// The runtime name containerd is configured with (`runtime_type`); the binary's name,
/// `containerd-shim-crucible-v2`, follows from it.
pub const RUNTIME_ID: &str = "io.containerd.crucible.v2";
