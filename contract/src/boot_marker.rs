//! The boot-complete marker: with `crucible.boot_marker=1` the agent, once it is listening,
//! writes [`VALUE`] to I/O port [`PORT`]; the VMM traps that write and stamps the time, so
//! "guest ready" is measured without any vsock traffic and the boot watchdog knows the guest
//! made it.

/// The I/O port. Unused by anything the VMM emulates (on real hardware it is the legacy floppy
/// controller, harmless to poke).
pub const PORT: u16 = 0x03f0;

/// The value written (0x7b); any other value on the port is ignored.
pub const VALUE: u8 = 123;
