//! The Intel MultiProcessor table (spec 1.4), so a kernel without ACPI finds every vCPU and
//! the I/O APIC. Written at the EBDA (0x9fc00), which the e820 map reserves.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::layout::{APIC_ADDR, EBDA_START, IOAPIC_ADDR};

/// The MP table could not be written.
#[derive(Debug, thiserror::Error)]
pub enum MpTableError {
    /// Too many vCPUs for the space below 1 MiB we reserve.
    #[error("too many vCPUs for the MP table: {0}")]
    TooManyCpus(u8),
    /// Guest memory write failed.
    #[error("cannot write the MP table")]
    Memory(#[source] vm_memory::GuestMemoryError),
}

const IRQS: u8 = 24;

fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |a, b| a.wrapping_add(*b))
        .wrapping_neg()
}

/// Builds the floating pointer and configuration table for `cpus` processors.
pub fn build(cpus: u8) -> Result<Vec<u8>, MpTableError> {
    if cpus == 0 || cpus > 32 {
        return Err(MpTableError::TooManyCpus(cpus));
    }
    let table_addr = EBDA_START as u32 + 16;
    let mut entries = Vec::new();
    let mut count = 0u16;
    for id in 0..cpus {
        entries.push(0u8); // processor
        entries.push(id);
        entries.push(0x14); // local APIC version
        entries.push(if id == 0 { 3 } else { 1 }); // enabled (| BSP)
        entries.extend_from_slice(&0x600u32.to_le_bytes()); // signature
        entries.extend_from_slice(&0x201u32.to_le_bytes()); // FPU | APIC
        entries.extend_from_slice(&[0u8; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[1, 0]); // bus 0
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    let ioapic_id = cpus;
    entries.extend_from_slice(&[2, ioapic_id, 0x11, 1]);
    entries.extend_from_slice(&(IOAPIC_ADDR as u32).to_le_bytes());
    count += 1;
    for irq in 0..IRQS {
        // I/O interrupt: INT, conforming polarity/trigger, ISA bus, irq → I/O APIC pin.
        entries.extend_from_slice(&[3, 0, 0, 0, 0, irq, ioapic_id, irq]);
        count += 1;
    }
    // Local interrupts: ExtINT on LINT0, NMI on LINT1, to every local APIC.
    entries.extend_from_slice(&[4, 3, 0, 0, 0, 0, 0xff, 0]);
    entries.extend_from_slice(&[4, 1, 0, 0, 0, 0, 0xff, 1]);
    count += 2;

    let mut hdr = Vec::with_capacity(44);
    hdr.extend_from_slice(b"PCMP");
    hdr.extend_from_slice(&((44 + entries.len()) as u16).to_le_bytes());
    hdr.push(4); // spec revision
    hdr.push(0); // checksum, below
    hdr.extend_from_slice(b"CRUCIBLE");
    hdr.extend_from_slice(b"microVM     ");
    hdr.extend_from_slice(&0u32.to_le_bytes()); // OEM table
    hdr.extend_from_slice(&0u16.to_le_bytes());
    hdr.extend_from_slice(&count.to_le_bytes());
    hdr.extend_from_slice(&(APIC_ADDR as u32).to_le_bytes());
    hdr.extend_from_slice(&[0u8; 4]); // extended table length, checksum, reserved
    let mut table = hdr;
    table.extend_from_slice(&entries);
    table[7] = checksum(&table);

    let mut fp = Vec::with_capacity(16);
    fp.extend_from_slice(b"_MP_");
    fp.extend_from_slice(&table_addr.to_le_bytes());
    fp.extend_from_slice(&[1, 4, 0, 0, 0, 0, 0, 0]);
    fp[10] = checksum(&fp);
    fp.extend_from_slice(&table);
    Ok(fp)
}

/// Writes the MP table for `cpus` processors into guest memory.
pub fn write(mem: &GuestMemoryMmap, cpus: u8) -> Result<(), MpTableError> {
    let bytes = build(cpus)?;
    if EBDA_START + bytes.len() as u64 > crate::layout::HIMEM_START {
        return Err(MpTableError::TooManyCpus(cpus));
    }
    mem.write_slice(&bytes, GuestAddress(EBDA_START))
        .map_err(MpTableError::Memory)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn mptable_checksums_and_counts_are_valid() {
        let b = build(4).unwrap();
        assert_eq!(&b[..4], b"_MP_");
        assert_eq!(b[..16].iter().fold(0u8, |a, x| a.wrapping_add(*x)), 0);
        let t = &b[16..];
        assert_eq!(&t[..4], b"PCMP");
        let len = u16::from_le_bytes([t[4], t[5]]) as usize;
        assert_eq!(len, t.len());
        assert_eq!(t.iter().fold(0u8, |a, x| a.wrapping_add(*x)), 0);
        assert_eq!(u16::from_le_bytes([t[34], t[35]]), 4 + 2 + 24 + 2);
        assert!(build(0).is_err());
    }
}
