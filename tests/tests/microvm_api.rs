//! The daemon on the microVM backend. The full run needs a host whose KVM can boot our kernel
//! (hardware KVM); the clear refusal can be checked only where it cannot. `tests/build.rs` sets
//! `crucible_hardware_kvm` from the host probe, so on each host exactly one of the two runs and
//! the other is reported as ignored, with its reason; `CRUCIBLE_REQUIRE_KVM=1` sets it whatever
//! the host, so the full run is mandatory (and fails on a host without hardware KVM).

use std::path::Path;

use client::ClientError;
use harness::TestDaemon;
use wire::{BackendKind, CreateSandbox, ExecRequest, SandboxState};

fn vmm_binary() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/crucible-vmm")
}

#[tokio::test]
#[cfg_attr(
    crucible_hardware_kvm,
    ignore = "this host boots the image (hardware KVM, or CRUCIBLE_REQUIRE_KVM=1): nothing is refused"
)]
async fn microvm_requests_are_refused_clearly_where_kvm_cannot_boot_the_image() {
    let report = api::host::inspect();
    let reason = api::host::kvm_unavailable_reason(&report).unwrap_or_else(|| {
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

#[tokio::test]
#[cfg_attr(
    not(crucible_hardware_kvm),
    ignore = "needs hardware KVM (kvm_intel/kvm_amd) to boot the image; CRUCIBLE_REQUIRE_KVM=1 runs it anyway"
)]
async fn microvm_sandbox_runs_commands_end_to_end() {
    let report = api::host::inspect();
    if let Some(reason) = api::host::kvm_unavailable_reason(&report) {
        panic!("the microVM backend cannot run here: {reason}");
    }
    let binary = vmm_binary();
    assert!(
        binary.is_file(),
        "{} missing: cargo build -p crucible-vmm",
        binary.display()
    );
    let daemon = TestDaemon::start_with(|c| c.vmm_binary = binary);
    let c = daemon.client();
    let sandbox = c
        .create(&CreateSandbox {
            backend: Some(BackendKind::Microvm),
            env: [("FROM_SANDBOX".into(), "vm".into())].into(),
            ..Default::default()
        })
        .await
        .expect("a microVM sandbox boots");
    assert_eq!(sandbox.state, SandboxState::Running);
    let out = c
        .exec_collect(
            &sandbox.id,
            &ExecRequest::new(["sh", "-c", "echo $FROM_SANDBOX; cat /proc/1/comm; exit 3"]),
        )
        .await
        .expect("exec");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "vm\ninit\n");
    assert_eq!(out.result.exit_code, 3);
    let mut session = c
        .interactive(&sandbox.id, &ExecRequest::new(["cat"]))
        .await
        .expect("session");
    session.send_stdin(b"over vsock\n").await.expect("stdin");
    session.close_stdin().await.expect("close");
    let mut echoed = Vec::new();
    while let Some(event) = session.next_event().await {
        if let client::ExecEvent::Stdout(b) = event.expect("event") {
            echoed.extend_from_slice(&b);
        }
    }
    assert_eq!(echoed, b"over vsock\n");
    c.delete(&sandbox.id).await.expect("delete");
}
