//! What runs our kernel under QEMU's `microvm` machine with TCG, agreed once for the image's
//! smoke test and the daemon's `qemu-tcg` hypervisor.

/// The QEMU binary, looked up on `PATH`.
pub const BINARY: &str = "qemu-system-x86_64";

/// The Debian package that provides [`BINARY`].
pub const PACKAGE: &str = "qemu-system-x86";

/// The microvm machine as measured to work: no ACPI (so `virtio_mmio.device=` reaches the
/// guest), legacy serial for the console, PIT and PIC for timers and interrupts, no option
/// ROMs (no firmware).
pub const MACHINE: &str = "microvm,x-option-roms=off,isa-serial=on,rtc=off,pit=on,pic=on,acpi=off";

/// Kernel command line: serial console, reset by triple fault, reboot at once on panic, and
/// `quiet`: informational kernel messages printed while the agent writes its lines can land in
/// the middle of one and garble it, and each serial byte is slow under emulation. Append
/// `loglevel=7` to see the whole kernel log.
pub const BASE_APPEND: &str = "console=ttyS0 reboot=t panic=-1 quiet";

/// QEMU's virtio-mmio devices are legacy (version 1) unless told otherwise, and a legacy
/// device cannot offer feature bits 32 and up: `VIRTIO_F_VERSION_1` (bit 32), and with it the
/// virtio 1.x rules our own MMIO transport runs under, would never be negotiated. Every QEMU
/// crucible starts uses the modern transport.
pub const MODERN_VIRTIO_MMIO: [&str; 2] = ["-global", "virtio-mmio.force-legacy=false"];

/// The memory-backend object id the machine's RAM comes from when vhost-user devices are
/// attached: a vhost-user backend maps guest memory itself, so RAM must be a shareable memfd.
pub const SHARED_MEMORY_ID: &str = "mem";

/// `-M` and `-object` arguments for a machine whose RAM (`memory_mib`) is a shared memfd, as
/// every vhost-user device needs.
pub fn shared_memory_machine_args(memory_mib: u64) -> [String; 4] {
    [
        "-M".into(),
        format!("{MACHINE},memory-backend={SHARED_MEMORY_ID}"),
        "-object".into(),
        format!("memory-backend-memfd,id={SHARED_MEMORY_ID},size={memory_mib}M,share=on"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_backs_the_machine_with_the_same_id_and_size() {
        let args = shared_memory_machine_args(256);
        assert_eq!(args[0], "-M");
        assert!(args[1].starts_with(MACHINE));
        assert!(args[1].ends_with(",memory-backend=mem"));
        assert_eq!(args[3], "memory-backend-memfd,id=mem,size=256M,share=on");
    }
}
