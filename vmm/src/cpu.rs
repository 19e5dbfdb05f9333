//! vCPU state at kernel entry: CPUID, MSRs, FPU, LAPIC, registers and segments.

use kvm_bindings::{
    kvm_fpu, kvm_msr_entry, kvm_regs, kvm_segment, kvm_sregs, CpuId, Msrs, KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::{Kvm, VcpuFd};

use crate::boot::{gdt, BootEntry};
use crate::layout::*;

/// Why a vCPU could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// A KVM ioctl failed.
    #[error("KVM {what}")]
    Kvm {
        /// The ioctl.
        what: &'static str,
        /// The cause.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// An MSR list could not be built.
    #[error("MSR list")]
    Msrs,
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> CpuError {
    move |source| CpuError::Kvm { what, source }
}

/// The supported CPUID, read once per VM.
pub fn supported_cpuid(kvm_fd: &Kvm) -> Result<CpuId, CpuError> {
    kvm_fd
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm("get supported CPUID"))
}

/// CPUID leaf 1, ECX: the local APIC's TSC-deadline timer mode.
const TSC_DEADLINE_BIT: u32 = 1 << 24;

/// Whether this KVM's local APIC emulates the TSC-deadline timer. KVM leaves the bit out of its
/// supported CPUID and reports it as a capability instead.
pub fn has_tsc_deadline(kvm_fd: &Kvm) -> bool {
    kvm_fd.check_extension(kvm_ioctls::Cap::TscDeadlineTimer)
}

/// Per-vCPU CPUID: APIC id, logical count, the hypervisor bit and, where KVM emulates it, the
/// TSC-deadline timer (the guest then arms its timer with one MSR write KVM handles itself,
/// not through the APIC's registers).
pub fn vcpu_cpuid(base: &CpuId, id: u8, count: u8, tsc_deadline: bool) -> CpuId {
    let mut c = base.clone();
    for e in c.as_mut_slice() {
        match e.function {
            1 => {
                e.ebx = (e.ebx & 0x0000_ffff) | (u32::from(id) << 24) | (u32::from(count) << 16);
                e.ecx |= 1 << 31; // hypervisor present
                if tsc_deadline {
                    e.ecx |= TSC_DEADLINE_BIT;
                }
                if count > 1 {
                    e.edx |= 1 << 28; // HTT: the logical count is valid
                }
            }
            0xb => e.edx = u32::from(id),
            _ => {}
        }
    }
    c
}

/// Programs CPUID, MSRs, FPU, LAPIC, registers and segments for `entry`.
pub fn configure(
    vcpu: &VcpuFd,
    cpuid: &CpuId,
    id: u8,
    entry: Option<BootEntry>,
) -> Result<(), CpuError> {
    vcpu.set_cpuid2(cpuid).map_err(kvm("set CPUID"))?;
    set_msrs(vcpu)?;
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(kvm("set FPU"))?;
    set_lint(vcpu)?;
    // Application processors wait for INIT/SIPI from the boot vCPU.
    let Some(entry) = entry.filter(|_| id == 0) else {
        return Ok(());
    };
    let mut sregs = vcpu.get_sregs().map_err(kvm("get sregs"))?;
    let mut regs = kvm_regs {
        rflags: 0x2,
        ..Default::default()
    };
    match entry {
        BootEntry::Linux64(rip) => {
            set_segments(&mut sregs, true);
            sregs.cr3 = PML4_ADDR;
            sregs.cr4 |= 0x20; // PAE
            sregs.cr0 |= 0x8000_0001; // PG | PE
            sregs.efer |= 0x500; // LME | LMA
            regs.rip = rip;
            regs.rsp = BOOT_STACK;
            regs.rbp = BOOT_STACK;
            regs.rsi = ZERO_PAGE_ADDR;
        }
        BootEntry::Pvh(rip) => {
            set_segments(&mut sregs, false);
            sregs.cr0 = (sregs.cr0 & !0x8000_0000) | 0x11; // PE | ET, paging off
            sregs.cr4 = 0;
            sregs.efer = 0;
            regs.rip = rip;
            regs.rbx = PVH_INFO_ADDR;
        }
    }
    vcpu.set_sregs(&sregs).map_err(kvm("set sregs"))?;
    vcpu.set_regs(&regs).map_err(kvm("set regs"))
}

fn segment(entry: u64, selector: u16) -> kvm_segment {
    let base = ((entry >> 16) & 0xff_ffff) | (((entry >> 56) & 0xff) << 24);
    let limit = (entry & 0xffff) | (((entry >> 48) & 0xf) << 16);
    let g = ((entry >> 55) & 1) as u8;
    kvm_segment {
        base,
        limit: if g == 1 {
            ((limit as u32) << 12) | 0xfff
        } else {
            limit as u32
        },
        selector,
        type_: ((entry >> 40) & 0xf) as u8,
        present: ((entry >> 47) & 1) as u8,
        dpl: ((entry >> 45) & 3) as u8,
        db: ((entry >> 54) & 1) as u8,
        s: ((entry >> 44) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        g,
        avl: ((entry >> 52) & 1) as u8,
        unusable: 0,
        padding: 0,
    }
}

fn set_segments(sregs: &mut kvm_sregs, long: bool) {
    let g = gdt(long);
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (g.len() * 8 - 1) as u16;
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 7;
    let code = segment(g[1], 0x08);
    let data = segment(g[2], 0x10);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment(g[3], 0x18);
}

fn set_msrs(vcpu: &VcpuFd) -> Result<(), CpuError> {
    let e = |index: u32, data: u64| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    let entries = [
        e(0x174, 0),       // SYSENTER_CS
        e(0x175, 0),       // SYSENTER_ESP
        e(0x176, 0),       // SYSENTER_EIP
        e(0xc000_0081, 0), // STAR
        e(0xc000_0082, 0), // LSTAR
        e(0xc000_0083, 0), // CSTAR
        e(0xc000_0102, 0), // KERNEL_GS_BASE
        e(0xc000_0084, 0), // SYSCALL_MASK
        e(0x10, 0),        // TSC
        e(0x1a0, 1),       // MISC_ENABLE: fast strings
    ];
    let msrs = Msrs::from_entries(&entries).map_err(|_| CpuError::Msrs)?;
    // Some hosts refuse a few of these (PVM): what was set is what matters to the kernel.
    vcpu.set_msrs(&msrs).map_err(kvm("set MSRs"))?;
    Ok(())
}

/// LINT0 = ExtINT (the PIC), LINT1 = NMI.
fn set_lint(vcpu: &VcpuFd) -> Result<(), CpuError> {
    let mut lapic = vcpu.get_lapic().map_err(kvm("get LAPIC"))?;
    let mut set = |off: usize, mode: u32| {
        let mut b = [0u8; 4];
        for (i, x) in b.iter_mut().enumerate() {
            *x = lapic.regs[off + i] as u8;
        }
        let v = (u32::from_le_bytes(b) & !0x700) | (mode << 8);
        for (i, x) in v.to_le_bytes().iter().enumerate() {
            lapic.regs[off + i] = *x as _;
        }
    };
    set(0x350, 0x7);
    set(0x360, 0x4);
    vcpu.set_lapic(&lapic).map_err(kvm("set LAPIC"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tsc_deadline_timer_is_advertised_only_where_kvm_emulates_it() {
        let leaf1 = kvm_bindings::kvm_cpuid_entry2 {
            function: 1,
            ..Default::default()
        };
        let base = CpuId::from_entries(&[leaf1]).expect("one entry fits");
        let ecx = |c: &CpuId| c.as_slice()[0].ecx;
        assert_eq!(
            ecx(&vcpu_cpuid(&base, 0, 1, true)) & TSC_DEADLINE_BIT,
            TSC_DEADLINE_BIT
        );
        assert_eq!(ecx(&vcpu_cpuid(&base, 0, 1, false)) & TSC_DEADLINE_BIT, 0);
        let c = vcpu_cpuid(&base, 1, 2, false);
        assert_eq!(c.as_slice()[0].ebx >> 24, 1, "APIC id");
        assert_eq!(ecx(&c) >> 31, 1, "hypervisor bit");
    }

    #[test]
    fn gdt_entries_decode_to_flat_segments() {
        let long = gdt(true);
        let cs = segment(long[1], 8);
        assert_eq!(
            (cs.base, cs.limit, cs.l, cs.db, cs.present),
            (0, 0xffff_ffff, 1, 0, 1)
        );
        let cs32 = segment(gdt(false)[1], 8);
        assert_eq!((cs32.l, cs32.db, cs32.type_), (0, 1, 0xb));
        let ds = segment(long[2], 0x10);
        assert_eq!((ds.type_, ds.s, ds.g), (3, 1, 1));
    }
}
