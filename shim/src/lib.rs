//! `containerd-shim-crucible-v2`: a containerd shim v2 (task API v2, containerd 1.6 and 1.7)
//! that runs each container as a sandbox of the local crucible daemon, reached over its Unix
//! socket, and each Kubernetes pod as one sandbox holding the pod's containers. Design and limits: `docs/kubernetes.md`.

#![forbid(unsafe_code)]

mod bundle_state;
mod daemon;
mod error;
mod events;
mod exit;
mod metrics;
mod pod;
mod pod_volumes;
mod process;
mod rootfs;
mod service;
mod shim;
mod spec;
mod stdio;

pub use rootfs::IMAGE_PREFIX;
pub use shim::CrucibleShim;

/// The runtime name containerd is configured with (`runtime_type`); the binary's name,
/// `containerd-shim-crucible-v2`, follows from it.
pub const RUNTIME_ID: &str = "io.containerd.crucible.v2";
