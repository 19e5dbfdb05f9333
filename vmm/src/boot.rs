//! Loading the kernel and handing it what it needs: the ELF (linux-loader), then either the PVH
//! start info (when the ELF has a PVH note) or the Linux zero page, plus the command line, the
//! memory map and the initramfs.

use std::fs::File;
use std::path::{Path, PathBuf};

use linux_loader::cmdline::Cmdline;
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::{load_cmdline, KernelLoader};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::layout::*;

/// How the boot vCPU enters the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootEntry {
    /// PVH: 32-bit protected mode, paging off, `ebx` = start info.
    Pvh(u64),
    /// The 64-bit Linux boot protocol: long mode, identity-mapped, `rsi` = zero page.
    Linux64(u64),
}

/// Why a boot could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The kernel image could not be opened.
    #[error("cannot open the kernel {}", path.display())]
    OpenKernel {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The kernel is not a loadable x86-64 ELF.
    #[error("cannot load the kernel {} (an uncompressed vmlinux ELF is needed)", path.display())]
    LoadKernel {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: linux_loader::loader::Error,
    },
    /// The initramfs could not be read or does not fit.
    #[error("cannot load the initramfs {}: {reason}", path.display())]
    Initramfs {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The command line is too long or invalid.
    #[error("invalid kernel command line")]
    Cmdline(#[source] linux_loader::cmdline::Error),
    /// A boot structure could not be written to guest memory.
    #[error("cannot write the boot structures")]
    Memory(#[source] vm_memory::GuestMemoryError),
    /// A command line could not be written.
    #[error("cannot write the command line")]
    LoadCmdline(#[source] linux_loader::loader::Error),
}

/// Loads `kernel` into `mem`; returns the entry.
pub fn load_kernel(mem: &GuestMemoryMmap, kernel: &Path) -> Result<(BootEntry, u64), BootError> {
    let mut f = File::open(kernel).map_err(|source| BootError::OpenKernel {
        path: kernel.to_owned(),
        source,
    })?;
    let r = Elf::load(mem, None, &mut f, Some(GuestAddress(HIMEM_START))).map_err(|source| {
        BootError::LoadKernel {
            path: kernel.to_owned(),
            source,
        }
    })?;
    let entry = match r.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(a) => BootEntry::Pvh(a.raw_value()),
        _ => BootEntry::Linux64(r.kernel_load.raw_value()),
    };
    Ok((entry, r.kernel_end))
}

/// Places the initramfs at the top of low RAM (page-aligned); returns (address, size).
pub fn load_initramfs(
    mem: &GuestMemoryMmap,
    path: &Path,
    kernel_end: u64,
) -> Result<(u64, u64), BootError> {
    let err = |reason: String| BootError::Initramfs {
        path: path.to_owned(),
        reason,
    };
    let data = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    let size = data.len() as u64;
    let top = mem
        .last_addr()
        .raw_value()
        .min(MMIO_GAP_START - 1)
        .saturating_add(1);
    let addr = top.checked_sub(size).map(|a| a & !0xfff);
    match addr {
        Some(a) if a > kernel_end && a > HIMEM_START => {
            mem.write_slice(&data, GuestAddress(a))
                .map_err(|e| err(e.to_string()))?;
            Ok((a, size))
        }
        _ => Err(err(format!("{size} bytes do not fit above the kernel"))),
    }
}

/// Writes the command line.
pub fn write_cmdline(mem: &GuestMemoryMmap, cmdline: &Cmdline) -> Result<(), BootError> {
    load_cmdline(mem, GuestAddress(CMDLINE_ADDR), cmdline).map_err(BootError::LoadCmdline)
}

fn cmdline_len(cmdline: &Cmdline) -> Result<u32, BootError> {
    let s = cmdline.as_cstring().map_err(BootError::Cmdline)?;
    Ok(s.as_bytes().len() as u32)
}

/// Writes the Linux zero page: header fields, command line pointer, initramfs, e820 map.
pub fn write_zero_page(
    mem: &GuestMemoryMmap,
    mem_bytes: u64,
    cmdline: &Cmdline,
    initramfs: Option<(u64, u64)>,
) -> Result<(), BootError> {
    let mut p = boot_params::default();
    p.hdr.type_of_loader = 0xff;
    p.hdr.boot_flag = 0xaa55;
    p.hdr.header = 0x5372_6448; // "HdrS"
    p.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    p.hdr.cmdline_size = cmdline_len(cmdline)?;
    p.hdr.kernel_alignment = 0x0100_0000;
    if let Some((addr, size)) = initramfs {
        p.hdr.ramdisk_image = addr as u32;
        p.hdr.ramdisk_size = size as u32;
    }
    let map = e820_map(mem_bytes);
    for (i, &(addr, size, kind)) in map.iter().enumerate() {
        p.e820_table[i] = boot_e820_entry {
            addr,
            size,
            r#type: kind,
        };
    }
    p.e820_entries = map.len() as u8;
    mem.write_obj(p, GuestAddress(ZERO_PAGE_ADDR))
        .map_err(BootError::Memory)
}

/// `hvm_start_info.magic`.
pub const PVH_MAGIC: u32 = 0x336e_c578;

/// Writes the PVH start info (version 1, with the memory map and the initramfs module).
pub fn write_pvh_info(
    mem: &GuestMemoryMmap,
    mem_bytes: u64,
    initramfs: Option<(u64, u64)>,
) -> Result<(), BootError> {
    let w32 = |v: u32, a: u64| mem.write_obj(v, GuestAddress(a));
    let w64 = |v: u64, a: u64| mem.write_obj(v, GuestAddress(a));
    let map = e820_map(mem_bytes);
    let base = PVH_INFO_ADDR;
    let nr_modules = u32::from(initramfs.is_some());
    (|| {
        w32(PVH_MAGIC, base)?;
        w32(1, base + 4)?; // version
        w32(0, base + 8)?; // flags
        w32(nr_modules, base + 12)?;
        w64(if nr_modules > 0 { PVH_MODLIST_ADDR } else { 0 }, base + 16)?;
        w64(CMDLINE_ADDR, base + 24)?;
        w64(0, base + 32)?; // rsdp
        w64(PVH_MEMMAP_ADDR, base + 40)?;
        w32(map.len() as u32, base + 48)?;
        w32(0, base + 52)?;
        for (i, &(addr, size, kind)) in map.iter().enumerate() {
            let e = PVH_MEMMAP_ADDR + 24 * i as u64;
            w64(addr, e)?;
            w64(size, e + 8)?;
            w32(kind, e + 16)?;
            w32(0, e + 20)?;
        }
        if let Some((addr, size)) = initramfs {
            w64(addr, PVH_MODLIST_ADDR)?;
            w64(size, PVH_MODLIST_ADDR + 8)?;
            w64(0, PVH_MODLIST_ADDR + 16)?;
            w64(0, PVH_MODLIST_ADDR + 24)?;
        }
        Ok(())
    })()
    .map_err(BootError::Memory)
}

/// GDT entries: null, code, data, TSS. `long` picks a 64-bit code segment (else 32-bit).
pub fn gdt(long: bool) -> [u64; 4] {
    let code = if long {
        0x00af_9b00_0000_ffff
    } else {
        0x00cf_9b00_0000_ffff
    };
    [0, code, 0x00cf_9300_0000_ffff, 0x0080_8b00_0000_ffff]
}

/// Writes the GDT and an empty IDT.
pub fn write_gdt(mem: &GuestMemoryMmap, long: bool) -> Result<(), BootError> {
    for (i, e) in gdt(long).iter().enumerate() {
        mem.write_obj(*e, GuestAddress(GDT_ADDR + 8 * i as u64))
            .map_err(BootError::Memory)?;
    }
    mem.write_obj(0u64, GuestAddress(IDT_ADDR))
        .map_err(BootError::Memory)
}

/// Identity-maps the first 1 GiB with 2 MiB pages (PML4 → PDPT → PD).
pub fn write_page_tables(mem: &GuestMemoryMmap) -> Result<(), BootError> {
    let w = |v: u64, a: u64| mem.write_obj(v, GuestAddress(a)).map_err(BootError::Memory);
    w(PDPT_ADDR | 0x03, PML4_ADDR)?;
    w(PD_ADDR | 0x03, PDPT_ADDR)?;
    for i in 0..512u64 {
        w((i << 21) | 0x83, PD_ADDR + i * 8)?;
    }
    Ok(())
}

/// The default command line, before the device entries and the user's words. Only what the
/// guest kernel consumes itself: a word it does not know goes to `/init`, as an argument
/// (`nomodule` on a kernel without modules) or an environment variable (`pci=off` on one
/// without PCI). Dotted `module.param` words never do.
pub const DEFAULT_CMDLINE: &str =
    "reboot=k panic=1 i8042.noaux i8042.nomux i8042.dumbkbd tsc=reliable";

/// The undotted boot parameters of [`DEFAULT_CMDLINE`] and of the console words the VMM adds,
/// each one the guest kernel's own (`reboot=`, `panic=`, `tsc=`: x86 core; `console=`,
/// `quiet`: printk), so none reaches `/init`.
pub const KERNEL_OWN_PARAMS: &[&str] = &["reboot", "panic", "tsc", "console", "quiet"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_command_line_holds_nothing_the_kernel_would_hand_to_init() {
        for word in DEFAULT_CMDLINE.split_whitespace() {
            let key = word.split('=').next().unwrap_or(word);
            assert!(
                key.contains('.') || KERNEL_OWN_PARAMS.contains(&key),
                "{word:?} is not a parameter the guest kernel consumes: it would reach /init"
            );
        }
    }
}
