//! The port-I/O devices a boot needs: the 8250 serial (early-boot debugging only), the i8042
//! reset line, and the port the guest agent writes its markers to (ready, stopping).

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;

use contract::boot_marker::{Stop, READY};

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

/// What the guest agent's markers (`contract::boot_marker`) said so far: when it was ready,
/// and the last stop marker. Shared by the marker device and the VMM, which judges the VM's
/// end by it.
#[derive(Debug, Default)]
pub struct AgentMarkers {
    /// Microseconds since the VMM's start when READY was first written; 0 = not yet.
    ready_us: AtomicU64,
    /// The last stop marker's value; 0 = none.
    stop: AtomicU8,
}

impl AgentMarkers {
    /// When the agent said it was ready (microseconds since the VMM's start), if it has.
    pub fn ready_us(&self) -> Option<u64> {
        let us = self.ready_us.load(Ordering::SeqCst);
        (us > 0).then_some(us)
    }

    /// The last stop marker the agent wrote, if any.
    pub fn stop(&self) -> Option<Stop> {
        Stop::from_value(self.stop.load(Ordering::SeqCst))
    }
}

/// The marker port: records the agent's markers into [`AgentMarkers`], timing READY from
/// `start`. Other values are ignored; reads return 0.
#[derive(Debug)]
pub struct BootMarker {
    start: Instant,
    markers: Arc<AgentMarkers>,
}

impl BootMarker {
    /// A marker port timing from `start`, recording into `markers`.
    pub fn new(start: Instant, markers: Arc<AgentMarkers>) -> Self {
        BootMarker { start, markers }
    }
}

impl BusDevice for BootMarker {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        match data.first() {
            Some(&READY) => {
                let us = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
                let _ = self.markers.ready_us.compare_exchange(
                    0,
                    us.max(1),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
            Some(&value) if Stop::from_value(value).is_some() => {
                self.markers.stop.store(value, Ordering::SeqCst);
            }
            _ => {}
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
    fn marker_port_records_the_first_ready_and_the_last_stop() {
        let markers = Arc::new(AgentMarkers::default());
        let mut m = BootMarker::new(Instant::now(), markers.clone());
        m.write(0, &[1]);
        assert_eq!((markers.ready_us(), markers.stop()), (None, None));
        m.write(0, &[READY]);
        let first = markers.ready_us().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        m.write(0, &[READY]);
        assert_eq!(markers.ready_us(), Some(first));
        assert_eq!(markers.stop(), None);
        m.write(0, &[Stop::Failed.value()]);
        m.write(0, &[Stop::Requested.value()]);
        m.write(0, &[7]);
        assert_eq!(markers.stop(), Some(Stop::Requested));
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
