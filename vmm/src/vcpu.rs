//! vCPU threads: run until the guest exits to us, route port and MMIO accesses to the buses,
//! report how the guest ended. They touch nothing else.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kvm_ioctls::{VcpuExit, VcpuFd};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::Bus;
use crate::HostKind;

/// How the VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmExit {
    /// The guest reset (i8042, `reboot=k`) or powered off.
    GuestStop,
    /// SIGTERM/SIGINT.
    Signal,
    /// Triple fault, KVM_SYSTEM_EVENT_CRASH, or a failed check in a test guest.
    GuestCrash(String),
    /// KVM failed, or cannot run this guest (emulator failures on PVM hosts, watchdog).
    Kvm(String),
}

impl VmExit {
    /// The process exit code (see `docs/vmm.md`).
    pub fn code(&self) -> i32 {
        match self {
            VmExit::GuestStop | VmExit::Signal => crate::EXIT_OK,
            VmExit::Kvm(_) => crate::EXIT_KVM,
            VmExit::GuestCrash(_) => crate::EXIT_GUEST_CRASH,
        }
    }
}

/// The VM exits that reached the vCPU loop, by reason: the VMM's own count (KVM handles other
/// exits in the kernel, unseen here). One relaxed increment per exit, which costs nothing
/// beside the exit itself.
#[derive(Debug, Default)]
pub struct ExitCounters {
    io_in: AtomicU64,
    io_out: AtomicU64,
    mmio_read: AtomicU64,
    mmio_write: AtomicU64,
    hlt: AtomicU64,
    interrupted: AtomicU64,
    other: AtomicU64,
}

impl ExitCounters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far, by reason.
    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        [
            ("io_in", &self.io_in),
            ("io_out", &self.io_out),
            ("mmio_read", &self.mmio_read),
            ("mmio_write", &self.mmio_write),
            ("hlt", &self.hlt),
            ("interrupted", &self.interrupted),
            ("other", &self.other),
        ]
        .into_iter()
        .map(|(name, c)| (name, c.load(Ordering::Relaxed)))
        .collect()
    }
}

/// What vCPU threads share with the event loop.
#[derive(Debug)]
pub struct Shared {
    /// The first exit reported wins.
    pub exit: Mutex<Option<VmExit>>,
    /// Written when `exit` is set.
    pub exit_evt: EventFd,
    /// Microseconds from process start to the boot vCPU's first KVM_RUN.
    pub kernel_entry_us: AtomicU64,
    /// Set to stop the vCPU threads.
    pub stop: AtomicBool,
    /// Exits by reason, all vCPUs together.
    pub exits: ExitCounters,
}

impl Shared {
    /// Records `exit` (unless one is already recorded) and wakes the event loop.
    pub fn report(&self, exit: VmExit) {
        let mut e = self.exit.lock().unwrap_or_else(|p| p.into_inner());
        if e.is_none() {
            *e = Some(exit);
        }
        drop(e);
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.exit_evt.write(1);
    }
}

/// Runs one vCPU until the VM ends.
pub fn run(
    mut vcpu: VcpuFd,
    id: u8,
    pio: Bus,
    mmio: Bus,
    shared: Arc<Shared>,
    start: Instant,
    host: HostKind,
) {
    if id == 0 {
        let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
        shared.kernel_entry_us.store(us, Ordering::SeqCst);
    }
    let counts = &shared.exits;
    while !shared.stop.load(Ordering::SeqCst) {
        let exit = match vcpu.run() {
            Ok(VcpuExit::IoOut(port, data)) => {
                ExitCounters::bump(&counts.io_out);
                pio.write(u64::from(port), data);
                continue;
            }
            Ok(VcpuExit::IoIn(port, data)) => {
                ExitCounters::bump(&counts.io_in);
                pio.read(u64::from(port), data);
                continue;
            }
            Ok(VcpuExit::MmioRead(addr, data)) => {
                ExitCounters::bump(&counts.mmio_read);
                mmio.read(addr, data);
                continue;
            }
            Ok(VcpuExit::MmioWrite(addr, data)) => {
                ExitCounters::bump(&counts.mmio_write);
                mmio.write(addr, data);
                continue;
            }
            Ok(VcpuExit::Hlt) => {
                ExitCounters::bump(&counts.hlt);
                VmExit::GuestStop
            }
            Ok(VcpuExit::Shutdown) => VmExit::GuestCrash(format!("vCPU {id}: triple fault")),
            Ok(VcpuExit::SystemEvent(kind, _)) => match kind {
                kvm_bindings::KVM_SYSTEM_EVENT_SHUTDOWN | kvm_bindings::KVM_SYSTEM_EVENT_RESET => {
                    VmExit::GuestStop
                }
                k => VmExit::GuestCrash(format!("vCPU {id}: system event {k}")),
            },
            Ok(VcpuExit::FailEntry(reason, _)) => VmExit::Kvm(format!(
                "vCPU {id}: KVM entry failed (hardware reason {reason:#x}){}",
                pvm_hint(host)
            )),
            Ok(VcpuExit::InternalError) => VmExit::Kvm(format!(
                "vCPU {id}: KVM internal error (instruction emulation failed){}",
                pvm_hint(host)
            )),
            Ok(VcpuExit::Intr) | Ok(VcpuExit::IrqWindowOpen) => {
                ExitCounters::bump(&counts.interrupted);
                continue;
            }
            Ok(other) => {
                ExitCounters::bump(&counts.other);
                VmExit::Kvm(format!("vCPU {id}: unexpected exit {other:?}"))
            }
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                ExitCounters::bump(&counts.interrupted);
                continue;
            }
            Err(e) => VmExit::Kvm(format!("vCPU {id}: KVM_RUN: {e}{}", pvm_hint(host))),
        };
        shared.report(exit);
        return;
    }
}

fn pvm_hint(host: HostKind) -> String {
    match host {
        h if !h.boots_stock_kernel() => format!(" — host is {}", h.describe()),
        _ => String::new(),
    }
}
