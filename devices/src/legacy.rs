//! The port-I/O devices a boot needs: the 8250 serial (early-boot debugging only), the i8042
//! reset line, and the boot-complete marker the guest agent writes.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;

/// The value the guest agent writes (`contract::boot_marker`).
const BOOT_MARKER_VALUE: u8 = contract::boot_marker::VALUE;

/// The i8042 command port.
pub const I8042_COMMAND_PORT: u64 = 0x64;
/// The i8042 command that pulses the CPU reset line.
pub const I8042_CMD_RESET: u8 = 0xfe;

/// The i8042 controller, reduced to its reset line: a write of 0xFE to port 0x64 signals
/// `reset_evt` (`reboot=k`). Its window starts at port 0x60; reads return 0.
#[derive(Debug)]
pub struct I8042 {
    reset_evt: EventFd,
}

impl I8042 {
    /// A controller that signals `reset_evt` on reset.
    pub fn new(reset_evt: EventFd) -> Self {
        I8042 { reset_evt }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == I8042_COMMAND_PORT - 0x60 && data.first() == Some(&I8042_CMD_RESET) {
            // A full counter cannot lose the reset: it is already pending.
            let _ = self.reset_evt.write(1);
        }
    }
}

/// The serial port's interrupt line (an irqfd).
#[derive(Debug)]
pub struct EventFdTrigger(pub EventFd);

impl Trigger for EventFdTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// A 16550A UART at one of the COM ports, output only.
pub struct SerialPort {
    serial: Serial<EventFdTrigger, NoEvents, Box<dyn Write + Send>>,
}

impl std::fmt::Debug for SerialPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SerialPort").finish_non_exhaustive()
    }
}

impl SerialPort {
    /// A port raising `irq` and writing to `out`.
    pub fn new(irq: EventFd, out: Box<dyn Write + Send>) -> Self {
        SerialPort {
            serial: Serial::new(EventFdTrigger(irq), out),
        }
    }
}

impl BusDevice for SerialPort {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let (Some(b), Ok(off)) = (data.first_mut(), u8::try_from(offset)) {
            *b = self.serial.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&b), Ok(off)) = (data.first(), u8::try_from(offset)) {
            // Output errors lose console bytes; the guest goes on.
            let _ = self.serial.write(off, b);
        }
    }
}

/// Records when the guest agent wrote the boot-complete marker (microseconds since `start`).
#[derive(Debug)]
pub struct BootMarker {
    start: Instant,
    at_us: Arc<AtomicU64>,
}

impl BootMarker {
    /// A marker timing from `start`, storing into `at_us` (0 = not yet).
    pub fn new(start: Instant, at_us: Arc<AtomicU64>) -> Self {
        BootMarker { start, at_us }
    }
}

impl BusDevice for BootMarker {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        if data.first() == Some(&BOOT_MARKER_VALUE) {
            let us = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
            let _ = self
                .at_us
                .compare_exchange(0, us.max(1), Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn i8042_reset_command_signals_the_reset_event() {
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut dev = I8042::new(evt.try_clone().unwrap());
        dev.write(4, &[0x01]);
        dev.write(0, &[I8042_CMD_RESET]);
        assert!(evt.read().is_err(), "only 0xfe on port 0x64 resets");
        dev.write(4, &[I8042_CMD_RESET]);
        assert_eq!(evt.read().unwrap(), 1);
        let mut b = [0xffu8];
        dev.read(4, &mut b);
        assert_eq!(b, [0]);
    }

    #[test]
    fn boot_marker_records_the_first_write_of_the_marker_value() {
        let at = Arc::new(AtomicU64::new(0));
        let mut m = BootMarker::new(Instant::now(), at.clone());
        m.write(0, &[1]);
        assert_eq!(at.load(Ordering::SeqCst), 0);
        m.write(0, &[BOOT_MARKER_VALUE]);
        let first = at.load(Ordering::SeqCst);
        assert!(first > 0);
        std::thread::sleep(std::time::Duration::from_millis(2));
        m.write(0, &[BOOT_MARKER_VALUE]);
        assert_eq!(at.load(Ordering::SeqCst), first);
    }

    #[test]
    fn serial_output_reaches_the_writer() {
        #[derive(Clone, Default)]
        struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let mut s = SerialPort::new(
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            Box::new(sink.clone()),
        );
        for b in b"ok\n" {
            s.write(0, &[*b]);
        }
        assert_eq!(sink.0.lock().unwrap().as_slice(), b"ok\n");
    }
}
