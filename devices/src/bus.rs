//! What a device on the VMM's MMIO or port-I/O bus implements. The bus (in the VMM) decodes the
//! address and passes the offset inside the device's window.

/// A device on a bus. `offset` is relative to the start of the device's window; `data` is the
/// access (1, 2, 4 or 8 bytes). Accesses come from vCPU threads and must never panic, whatever the
/// guest does.
pub trait BusDevice: Send {
    /// A guest read: fill `data`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// A guest write.
    fn write(&mut self, offset: u64, data: &[u8]);
}
