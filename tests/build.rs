//! Builds `probe/escape_probe.c` as a static binary for the escape tests, which upload it into a
//! sandbox: the image has no compiler, and a static binary needs nothing of it. A missing C
//! compiler or static libc fails the build, saying so (the tests never skip). Also sets the cfgs
//! that decide which microVM tests run on this host (`host_probe::kvm_tests`): where the host
//! cannot run one it is `#[ignore]`d with the reason; `CRUCIBLE_REQUIRE_KVM=1` runs them anyway.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    host_probe::kvm_tests::KvmTestGate::emit_for_build_script();
    let source = "probe/escape_probe.c";
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let binary = out.join("escape-probe");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-static", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&binary)
        .arg(source)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "{cc} -static {source} failed ({s}): the escape tests need a C compiler and a \
             static libc (Debian: apt-get install gcc libc6-dev)"
        ),
        Err(e) => {
            panic!("cannot run {cc} to build {source}: {e} (Debian: apt-get install gcc libc6-dev)")
        }
    }
    println!("cargo:rustc-env=CRUCIBLE_ESCAPE_PROBE={}", binary.display());
}
