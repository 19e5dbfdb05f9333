//! The daemon on the microVM backend with our own `crucible-vmm`: the microVM suite
//! (`microvm_suite/mod.rs`, which `microvm_qemu_tcg.rs` runs on QEMU TCG). It needs a host
//! whose KVM boots our kernel (hardware KVM); on any other host `cargo xtask nested` runs this
//! binary inside an L1 Linux with `kvm_amd` under QEMU TCG, every case included. The clear
//! refusal can be checked only where KVM cannot boot the image. `tests/build.rs` sets
//! `crucible_hardware_kvm` from the host probe, so on each host one side runs and the other is
//! reported as ignored, with its reason; `CRUCIBLE_REQUIRE_KVM=1` sets it whatever the host, so
//! the suite is mandatory (and fails on a host without hardware KVM).

mod microvm_suite;

use api_types::{BackendKind, CreateSandbox, Hypervisor};
use client::ClientError;
use harness::TestDaemon;

microvm_suite::microvm_suite!(
    Hypervisor::CrucibleVmm,
    #[cfg_attr(
        not(crucible_hardware_kvm),
        ignore = "needs hardware KVM (kvm_intel/kvm_amd) to boot the image; on other hosts `cargo xtask nested` runs it inside a nested-KVM L1"
    )]
);

#[tokio::test]
#[cfg_attr(
    crucible_hardware_kvm,
    ignore = "this host boots the image (hardware KVM, or CRUCIBLE_REQUIRE_KVM=1): nothing is refused"
)]
async fn microvm_requests_are_refused_clearly_where_kvm_cannot_boot_the_image() {
    let report = engine::host::inspect();
    let reason = engine::host::kvm_unavailable_reason(&report).unwrap_or_else(|| {
        panic!(
            "built for a host without hardware KVM, but this one is {}: rebuild the tests",
            report.kvm
        )
    });
    let daemon = TestDaemon::start();
    match daemon
        .client()
        .create(&CreateSandbox {
            backend: Some(BackendKind::Microvm),
            ..Default::default()
        })
        .await
    {
        Err(ClientError::Api {
            status: 503,
            code,
            message,
        }) => {
            assert_eq!(code, "backend_unavailable");
            assert!(message.contains(&reason), "{message}");
        }
        other => panic!("expected 503, got {other:?}"),
    }
    // The default is the backend that works.
    let sandbox = daemon
        .client()
        .create(&CreateSandbox::default())
        .await
        .expect("create");
    assert_eq!(sandbox.backend, BackendKind::Namespace);
}
