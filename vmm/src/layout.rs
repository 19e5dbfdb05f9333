//! The guest physical memory map (see `docs/vmm.md`).

/// The GDT.
pub const GDT_ADDR: u64 = 0x500;
/// An empty IDT (the kernel installs its own).
pub const IDT_ADDR: u64 = 0x520;
/// PVH `hvm_start_info`.
pub const PVH_INFO_ADDR: u64 = 0x6000;
/// PVH memory map entries (after the start info).
pub const PVH_MEMMAP_ADDR: u64 = 0x6040;
/// PVH module list (the initramfs).
pub const PVH_MODLIST_ADDR: u64 = 0x6800;
/// The Linux zero page (`boot_params`).
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// The initial stack (64-bit boot protocol).
pub const BOOT_STACK: u64 = 0x8ff0;
/// PML4, PDPT and PD of the identity map of the first 1 GiB.
pub const PML4_ADDR: u64 = 0x9000;
/// The page-directory-pointer table.
pub const PDPT_ADDR: u64 = 0xa000;
/// The page directory (512 × 2 MiB).
pub const PD_ADDR: u64 = 0xb000;
/// The kernel command line.
pub const CMDLINE_ADDR: u64 = 0x2_0000;
/// The longest command line.
pub const CMDLINE_MAX: usize = 4096;
/// The MP table (EBDA): RAM below it is usable, up to 1 MiB is reserved.
pub const EBDA_START: u64 = 0x9_fc00;
/// Where the kernel may be loaded from.
pub const HIMEM_START: u64 = 0x10_0000;
/// The 32-bit MMIO gap: guest RAM above it continues at 4 GiB.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
/// The end of the MMIO gap.
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// The first virtio-mmio window; each device gets the next 4 KiB.
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
/// The first IRQ for virtio devices (1 = i8042, 4 = COM1 are taken).
pub const VIRTIO_IRQ_BASE: u32 = 5;
/// The TSS KVM needs on Intel (3 pages just below 4 GiB).
pub const KVM_TSS_ADDR: u64 = 0xfffb_d000;
/// The local APIC.
pub const APIC_ADDR: u64 = 0xfee0_0000;
/// The I/O APIC.
pub const IOAPIC_ADDR: u64 = 0xfec0_0000;

/// COM1.
pub const COM1_PORT: u16 = 0x3f8;
/// COM1's IRQ.
pub const COM1_IRQ: u32 = 4;
/// The i8042 window (0x60–0x64).
pub const I8042_PORT: u16 = 0x60;

/// RAM ranges (start, length) for `mem_bytes` of guest memory.
pub fn ram_ranges(mem_bytes: u64) -> Vec<(u64, u64)> {
    if mem_bytes <= MMIO_GAP_START {
        vec![(0, mem_bytes)]
    } else {
        vec![
            (0, MMIO_GAP_START),
            (MMIO_GAP_END, mem_bytes - MMIO_GAP_START),
        ]
    }
}

/// E820 map: (start, length, type) with type 1 = RAM, 2 = reserved.
pub fn e820_map(mem_bytes: u64) -> Vec<(u64, u64, u32)> {
    let mut map = vec![
        (0, EBDA_START, 1),
        (EBDA_START, HIMEM_START - EBDA_START, 2),
    ];
    for (start, len) in ram_ranges(mem_bytes) {
        if start == 0 {
            map.push((HIMEM_START, len - HIMEM_START, 1));
        } else {
            map.push((start, len, 1));
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e820_leaves_the_ebda_and_the_mmio_gap_out_of_ram() {
        let m = e820_map(256 << 20);
        assert_eq!(m[0], (0, EBDA_START, 1));
        assert_eq!(m[2], (HIMEM_START, (256 << 20) - HIMEM_START, 1));
        let big = e820_map(4 << 30);
        assert_eq!(
            big.last(),
            Some(&(MMIO_GAP_END, (4 << 30) - MMIO_GAP_START, 1))
        );
        assert!(big
            .iter()
            .all(|&(s, l, _)| s + l <= MMIO_GAP_START || s >= MMIO_GAP_END));
    }
}
