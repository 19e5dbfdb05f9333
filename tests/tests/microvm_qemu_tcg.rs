//! The daemon's microVM backend on the `qemu-tcg` hypervisor: a real guest kernel under QEMU's
//! TCG with our vsock and block devices served over vhost-user. Runs on every host (no KVM
//! needed); needs QEMU (the image's smoke test installs it) and the image with its kernel
//! (`cargo xtask build-image`). The cases are the microVM suite (`microvm_suite/mod.rs`),
//! which `microvm_api.rs` runs on `crucible-vmm`.

mod microvm_suite;

use api_types::Hypervisor;

microvm_suite::microvm_suite!(Hypervisor::QemuTcg);
