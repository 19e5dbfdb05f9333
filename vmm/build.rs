//! Sets the cfgs that decide which KVM tests run on this host (`host_probe::kvm_tests`): the
//! test-guest boots need a usable `/dev/kvm`, the real-kernel test hardware KVM. Where the host
//! lacks them they are `#[ignore]`d with the reason; `CRUCIBLE_REQUIRE_KVM=1` runs them anyway.

fn main() {
    host_probe::kvm_tests::KvmTestGate::emit_for_build_script();
}
