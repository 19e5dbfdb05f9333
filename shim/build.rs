//! Sets the cfgs that decide which of the shim's microVM tests run on this host
//! (`host_probe::kvm_tests`): where the host cannot boot the image under crucible-vmm the test
//! is `#[ignore]`d with the reason (the nested tier runs it); `CRUCIBLE_REQUIRE_KVM=1` runs it
//! anyway.

fn main() {
    host_probe::kvm_tests::KvmTestGate::emit_for_build_script();
}
