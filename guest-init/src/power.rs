//! The agent's markers and the VM's end (`contract::boot_marker`): READY once the agent
//! serves, then one stop marker just before the reset, so the VMM can tell an end the agent
//! chose from a kernel panic. Used by the VM's init and by the server's `shutdown`.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use contract::boot_marker::{self, Stop};

use crate::{log, sys};

/// Turns the markers on when the command line asked for them (`crucible.boot_marker=1`).
pub fn enable_markers(on: bool) {
    MARKERS.store(on, Ordering::SeqCst);
}

/// Whether the command line asked for the markers (`crucible.boot_marker=1`).
static MARKERS: AtomicBool = AtomicBool::new(false);

/// Writes one marker byte (`contract::boot_marker`: `outb(value, 0x3f0)`), trapped by the VMM,
/// when the command line asked for markers. I/O permissions belong to the calling thread, so
/// each write asks for the port again.
#[cfg(target_arch = "x86_64")]
pub fn write_marker(value: u8) {
    if !MARKERS.load(Ordering::SeqCst) {
        return;
    }
    // SAFETY: ioperm changes only this thread's I/O permission bitmap for one port.
    if unsafe { libc::ioperm(libc::c_ulong::from(boot_marker::PORT), 1, 1) } != 0 {
        log::error(format_args!(
            "marker {value}: ioperm failed: {}",
            io::Error::last_os_error()
        ));
        return;
    }
    // SAFETY: a single port write that touches no memory; the port was granted above and the
    // VMM traps it (on real hardware 0x3f0 is the legacy floppy controller, harmless to poke).
    unsafe {
        std::arch::asm!("out dx, al", in("dx") boot_marker::PORT, in("al") value,
            options(nomem, nostack, preserves_flags));
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub fn write_marker(value: u8) {
    if MARKERS.load(Ordering::SeqCst) {
        log::error(format_args!(
            "marker {value}: not supported on this architecture"
        ));
    }
}

/// Ends the VM: the stop marker (why the agent ends it), sync, then reset. Never returns.
pub fn end_vm(stop: Stop) -> ! {
    write_marker(stop.value());
    sys::sync();
    let e = sys::reboot();
    log::error(format_args!("reboot failed: {e}"));
    loop {
        // SAFETY: pause takes no arguments; PID 1 must never return.
        unsafe { libc::pause() };
    }
}
