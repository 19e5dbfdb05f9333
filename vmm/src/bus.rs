//! Address decoding: a sorted map of device windows. vCPU threads look up the device that owns
//! an address and pass it the offset inside its window.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use devices::BusDevice;

/// A device window overlaps an existing one.
#[derive(Debug, thiserror::Error)]
#[error("bus window {base:#x}+{len:#x} overlaps another device")]
pub struct Overlap {
    /// The window's start.
    pub base: u64,
    /// Its length.
    pub len: u64,
}

/// One bus (MMIO or port I/O).
#[derive(Default, Clone)]
pub struct Bus {
    devices: BTreeMap<u64, (u64, Arc<Mutex<dyn BusDevice>>)>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.devices.iter().map(|(b, (l, _))| (b, l)))
            .finish()
    }
}

impl Bus {
    /// Adds `device` at `[base, base + len)`.
    pub fn insert(
        &mut self,
        device: Arc<Mutex<dyn BusDevice>>,
        base: u64,
        len: u64,
    ) -> Result<(), Overlap> {
        let end = base.checked_add(len).ok_or(Overlap { base, len })?;
        let clash = self
            .devices
            .range(..end)
            .next_back()
            .is_some_and(|(&b, &(l, _))| b + l > base);
        if len == 0 || clash {
            return Err(Overlap { base, len });
        }
        self.devices.insert(base, (len, device));
        Ok(())
    }

    fn find(&self, addr: u64) -> Option<(u64, &Arc<Mutex<dyn BusDevice>>)> {
        let (&base, (len, dev)) = self.devices.range(..=addr).next_back()?;
        (addr - base < *len).then_some((addr - base, dev))
    }

    /// A read; unclaimed addresses read as all ones. Returns whether a device claimed it.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr) {
            Some((off, dev)) => {
                lock(dev).read(off, data);
                true
            }
            None => {
                data.fill(0xff);
                false
            }
        }
    }

    /// A write; unclaimed addresses ignore it. Returns whether a device claimed it.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr) {
            Some((off, dev)) => {
                lock(dev).write(off, data);
                true
            }
            None => false,
        }
    }
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    struct Echo(Vec<(u64, u8)>);
    impl BusDevice for Echo {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data[0]));
        }
    }

    #[test]
    fn bus_decodes_windows_and_rejects_overlaps() {
        let mut bus = Bus::default();
        let a = Arc::new(Mutex::new(Echo(vec![])));
        bus.insert(a.clone(), 0x1000, 0x100).unwrap();
        assert!(bus.insert(a.clone(), 0x10ff, 1).is_err());
        assert!(bus.insert(a.clone(), 0xf00, 0x101).is_err());
        bus.insert(a.clone(), 0x1100, 0x10).unwrap();
        let mut b = [0u8; 1];
        assert!(bus.read(0x1005, &mut b));
        assert_eq!(b, [5]);
        assert!(!bus.read(0x1110, &mut b));
        assert_eq!(b, [0xff]);
        assert!(bus.write(0x1104, &[9]));
        assert_eq!(a.lock().unwrap().0, vec![(4, 9)]);
    }
}
