//! Just enough ELF64 reading to check two things: that a binary is static (no `PT_INTERP`, no
//! `DT_NEEDED`), and that a kernel carries the PVH entry note (`Xen`, type 18).

use std::path::{Path, PathBuf};

use thiserror::Error;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const PT_NOTE: u32 = 4;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
/// `XEN_ELFNOTE_PHYS32_ENTRY`: the 32-bit PVH entry point.
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

#[derive(Debug, Error)]
pub enum ElfError {
    #[error("could not read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a 64-bit little-endian ELF file", path.display())]
    NotElf64 { path: PathBuf },
    #[error("{}: malformed ELF: {what}", path.display())]
    Malformed { path: PathBuf, what: &'static str },
}

/// What [`inspect`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElfInfo {
    /// `e_machine` (62 is x86_64).
    pub machine: u16,
    /// The program interpreter (`PT_INTERP`), if any.
    pub interp: Option<String>,
    /// The `DT_NEEDED` libraries (a name, or `strtab+<offset>` where it cannot be resolved).
    pub needed: Vec<String>,
    /// Whether a `PT_NOTE` segment holds the Xen PVH entry note.
    pub pvh_entry: bool,
}

impl ElfInfo {
    /// No interpreter and no needed libraries: runs without a dynamic loader.
    pub fn is_static(&self) -> bool {
        self.interp.is_none() && self.needed.is_empty()
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn slice(&self, off: u64, len: u64) -> Option<&[u8]> {
        let start = usize::try_from(off).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        self.bytes.get(start..end)
    }
    fn u16(&self, off: u64) -> Option<u16> {
        Some(u16::from_le_bytes(self.slice(off, 2)?.try_into().ok()?))
    }
    fn u32(&self, off: u64) -> Option<u32> {
        Some(u32::from_le_bytes(self.slice(off, 4)?.try_into().ok()?))
    }
    fn u64(&self, off: u64) -> Option<u64> {
        Some(u64::from_le_bytes(self.slice(off, 8)?.try_into().ok()?))
    }
}

struct Phdr {
    kind: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

/// Reads the file at `path` and inspects it.
pub fn inspect_file(path: &Path) -> Result<ElfInfo, ElfError> {
    let bytes = std::fs::read(path).map_err(|source| ElfError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    inspect(&bytes, path)
}

/// Inspects ELF bytes; `path` only names the file in errors.
pub fn inspect(bytes: &[u8], path: &Path) -> Result<ElfInfo, ElfError> {
    let malformed = |what| ElfError::Malformed {
        path: path.to_path_buf(),
        what,
    };
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return Err(ElfError::NotElf64 {
            path: path.to_path_buf(),
        });
    }
    let r = Reader { bytes };
    let machine = r.u16(0x12).ok_or_else(|| malformed("short header"))?;
    let phoff = r.u64(0x20).ok_or_else(|| malformed("short header"))?;
    let phentsize = u64::from(r.u16(0x36).ok_or_else(|| malformed("short header"))?);
    let phnum = u64::from(r.u16(0x38).ok_or_else(|| malformed("short header"))?);
    if phnum > 0 && phentsize < 56 {
        return Err(malformed("program header entries too small"));
    }
    let mut phdrs = Vec::new();
    for i in 0..phnum {
        let at = phoff
            .checked_add(i * phentsize)
            .ok_or_else(|| malformed("program header offset overflows"))?;
        let field = |o: u64| {
            r.u64(at + o)
                .ok_or_else(|| malformed("program header past EOF"))
        };
        phdrs.push(Phdr {
            kind: r
                .u32(at)
                .ok_or_else(|| malformed("program header past EOF"))?,
            offset: field(8)?,
            vaddr: field(16)?,
            filesz: field(32)?,
        });
    }

    let mut info = ElfInfo {
        machine,
        ..ElfInfo::default()
    };
    for ph in &phdrs {
        match ph.kind {
            PT_INTERP => {
                let raw = r
                    .slice(ph.offset, ph.filesz)
                    .ok_or_else(|| malformed("PT_INTERP past EOF"))?;
                let name = raw.split(|&b| b == 0).next().unwrap_or_default();
                info.interp = Some(String::from_utf8_lossy(name).into_owned());
            }
            PT_DYNAMIC => {
                info.needed = needed(&r, ph, &phdrs).ok_or_else(|| malformed("PT_DYNAMIC"))?;
            }
            PT_NOTE => {
                let notes = r
                    .slice(ph.offset, ph.filesz)
                    .ok_or_else(|| malformed("PT_NOTE past EOF"))?;
                if has_pvh_note(notes) {
                    info.pvh_entry = true;
                }
            }
            _ => {}
        }
    }
    Ok(info)
}

/// The bytes of the section called `name` (a kernel module's `.modinfo`, say), or `None` when
/// the file has no such section; `path` only names the file in errors.
pub fn section<'a>(bytes: &'a [u8], path: &Path, name: &str) -> Result<Option<&'a [u8]>, ElfError> {
    let malformed = |what| ElfError::Malformed {
        path: path.to_path_buf(),
        what,
    };
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return Err(ElfError::NotElf64 {
            path: path.to_path_buf(),
        });
    }
    let r = Reader { bytes };
    let short = || malformed("short header");
    let shoff = r.u64(0x28).ok_or_else(short)?;
    let shentsize = u64::from(r.u16(0x3a).ok_or_else(short)?);
    let shnum = u64::from(r.u16(0x3c).ok_or_else(short)?);
    let shstrndx = u64::from(r.u16(0x3e).ok_or_else(short)?);
    if shnum == 0 {
        return Ok(None);
    }
    if shentsize < 64 || shstrndx >= shnum {
        return Err(malformed("section header table"));
    }
    // (name offset, file offset, size) of section `i`.
    let header = |i: u64| -> Result<(u64, u64, u64), ElfError> {
        let at = shoff
            .checked_add(i * shentsize)
            .ok_or_else(|| malformed("section header offset overflows"))?;
        let past = || malformed("section header past EOF");
        Ok((
            u64::from(r.u32(at).ok_or_else(past)?),
            r.u64(at + 0x18).ok_or_else(past)?,
            r.u64(at + 0x20).ok_or_else(past)?,
        ))
    };
    let (_, names_off, names_len) = header(shstrndx)?;
    let names = r
        .slice(names_off, names_len)
        .ok_or_else(|| malformed("section names past EOF"))?;
    for i in 0..shnum {
        let (name_off, off, len) = header(i)?;
        let this = usize::try_from(name_off)
            .ok()
            .and_then(|start| names.get(start..))
            .and_then(|rest| rest.split(|&b| b == 0).next());
        if this == Some(name.as_bytes()) {
            let data = usize::try_from(off)
                .ok()
                .zip(usize::try_from(len).ok())
                .and_then(|(start, len)| bytes.get(start..start.checked_add(len)?))
                .ok_or_else(|| malformed("section past EOF"))?;
            return Ok(Some(data));
        }
    }
    Ok(None)
}

fn needed(r: &Reader<'_>, dynamic: &Phdr, phdrs: &[Phdr]) -> Option<Vec<String>> {
    let mut offsets = Vec::new();
    let mut strtab = None;
    let count = dynamic.filesz / 16;
    for i in 0..count {
        let at = dynamic.offset.checked_add(i * 16)?;
        let tag = r.u64(at)?;
        let val = r.u64(at + 8)?;
        match tag {
            DT_NULL => break,
            DT_NEEDED => offsets.push(val),
            DT_STRTAB => strtab = Some(val),
            _ => {}
        }
    }
    // DT_STRTAB is a virtual address: find the file offset through the PT_LOAD that maps it.
    let strtab_off = strtab.and_then(|addr| {
        phdrs
            .iter()
            .find(|p| p.kind == PT_LOAD && addr >= p.vaddr && addr - p.vaddr < p.filesz)
            .map(|p| p.offset + (addr - p.vaddr))
    });
    Some(
        offsets
            .into_iter()
            .map(|off| {
                strtab_off
                    .and_then(|base| {
                        let start = usize::try_from(base.checked_add(off)?).ok()?;
                        let rest = r.bytes.get(start..)?;
                        let end = rest.iter().position(|&b| b == 0)?;
                        Some(String::from_utf8_lossy(&rest[..end]).into_owned())
                    })
                    .unwrap_or_else(|| format!("strtab+{off}"))
            })
            .collect(),
    )
}

fn has_pvh_note(mut notes: &[u8]) -> bool {
    let align4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    while notes.len() >= 12 {
        let word =
            |i: usize| u32::from_le_bytes([notes[i], notes[i + 1], notes[i + 2], notes[i + 3]]);
        let (namesz, descsz, kind) = (word(0) as usize, word(4) as usize, word(8));
        let (Some(name_len), Some(desc_len)) = (align4(namesz), align4(descsz)) else {
            return false;
        };
        let Some(total) = name_len
            .checked_add(desc_len)
            .and_then(|n| n.checked_add(12))
        else {
            return false;
        };
        if total > notes.len() {
            return false;
        }
        let name = &notes[12..12 + namesz];
        if name == b"Xen\0" && kind == XEN_ELFNOTE_PHYS32_ENTRY {
            return true;
        }
        notes = &notes[total..];
    }
    false
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ELF64 with the given program headers and trailing data.
    pub(crate) fn synthetic_elf(phdrs: &[(u32, u64, u64, u64)], data: &[u8]) -> Vec<u8> {
        let phoff = 64u64;
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[6] = 1;
        b[0x12..0x14].copy_from_slice(&62u16.to_le_bytes());
        b[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
        b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        b[0x38..0x3a].copy_from_slice(&(phdrs.len() as u16).to_le_bytes());
        for &(kind, offset, vaddr, filesz) in phdrs {
            let mut ph = vec![0u8; 56];
            ph[..4].copy_from_slice(&kind.to_le_bytes());
            ph[8..16].copy_from_slice(&offset.to_le_bytes());
            ph[16..24].copy_from_slice(&vaddr.to_le_bytes());
            ph[32..40].copy_from_slice(&filesz.to_le_bytes());
            b.extend(ph);
        }
        b.extend_from_slice(data);
        b
    }

    fn data_offset(n_phdrs: usize) -> u64 {
        64 + 56 * n_phdrs as u64
    }

    #[test]
    fn dynamic_binary_reports_interp_and_needed() {
        // Data: interp string, then a strtab, then the dynamic section.
        let base = data_offset(3);
        let interp = b"/lib64/ld-linux-x86-64.so.2\0";
        let strtab = b"\0libc.so.6\0";
        let strtab_off = base + interp.len() as u64;
        let dyn_off = strtab_off + strtab.len() as u64;
        let mut data = Vec::new();
        data.extend_from_slice(interp);
        data.extend_from_slice(strtab);
        for (tag, val) in [
            (DT_NEEDED, 1u64),
            (DT_STRTAB, 0x1000 + strtab_off),
            (DT_NULL, 0),
        ] {
            data.extend_from_slice(&tag.to_le_bytes());
            data.extend_from_slice(&val.to_le_bytes());
        }
        let total = base + data.len() as u64;
        let elf = synthetic_elf(
            &[
                (PT_INTERP, base, 0, interp.len() as u64),
                (PT_LOAD, 0, 0x1000, total),
                (PT_DYNAMIC, dyn_off, 0x1000 + dyn_off, 48),
            ],
            &data,
        );
        let info = inspect(&elf, Path::new("fake")).unwrap();
        assert_eq!(info.interp.as_deref(), Some("/lib64/ld-linux-x86-64.so.2"));
        assert_eq!(info.needed, vec!["libc.so.6".to_string()]);
        assert!(!info.is_static());
    }

    #[test]
    fn static_pie_with_empty_dynamic_is_static() {
        let base = data_offset(1);
        let mut data = Vec::new();
        data.extend_from_slice(&DT_NULL.to_le_bytes());
        data.extend_from_slice(&0u64.to_le_bytes());
        let elf = synthetic_elf(&[(PT_DYNAMIC, base, 0, 16)], &data);
        assert!(inspect(&elf, Path::new("fake")).unwrap().is_static());
    }

    #[test]
    fn pvh_note_is_found_among_other_notes() {
        let mut notes = Vec::new();
        for (name, kind) in [(&b"GNU\0"[..], 3u32), (&b"Xen\0"[..], 18)] {
            notes.extend_from_slice(&(name.len() as u32).to_le_bytes());
            notes.extend_from_slice(&8u32.to_le_bytes());
            notes.extend_from_slice(&kind.to_le_bytes());
            notes.extend_from_slice(name);
            notes.extend_from_slice(&[0xaa; 8]);
        }
        let elf = synthetic_elf(&[(PT_NOTE, data_offset(1), 0, notes.len() as u64)], &notes);
        assert!(inspect(&elf, Path::new("fake")).unwrap().pvh_entry);
        let only_gnu = synthetic_elf(&[(PT_NOTE, data_offset(1), 0, 24)], &notes[..24]);
        assert!(!inspect(&only_gnu, Path::new("fake")).unwrap().pvh_entry);
    }

    #[test]
    fn truncated_or_foreign_files_are_errors_not_panics() {
        assert!(matches!(
            inspect(b"#!/bin/sh\n", Path::new("x")),
            Err(ElfError::NotElf64 { .. })
        ));
        let mut elf = synthetic_elf(&[(PT_INTERP, 1 << 40, 0, 10)], &[]);
        assert!(matches!(
            inspect(&elf, Path::new("x")),
            Err(ElfError::Malformed { .. })
        ));
        elf.truncate(80);
        assert!(inspect(&elf, Path::new("x")).is_err());
    }

    #[test]
    fn this_test_binary_is_dynamic_and_busybox_static_is_static() {
        // The test harness itself is a normal dynamically linked gnu binary.
        let me = std::env::current_exe().unwrap();
        let info = inspect_file(&me).unwrap();
        assert_eq!(info.machine, 62);
        assert!(!info.is_static(), "{info:?}");
        assert!(
            info.needed.iter().any(|n| n.starts_with("libc.so")),
            "{info:?}"
        );
        // Debian's busybox-static, where installed, is a real static binary.
        let busybox = Path::new("/bin/busybox");
        if busybox.exists() && crate::deps::installed_version("busybox-static").is_some() {
            assert!(inspect_file(busybox).unwrap().is_static());
        }
    }

    #[test]
    fn section_finds_a_named_section_and_none_for_a_missing_one() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let text = section(&me, Path::new("me"), ".text").unwrap().unwrap();
        assert!(text.len() > 1000, "{}", text.len());
        assert!(section(&me, Path::new("me"), ".modinfo").unwrap().is_none());
        // A file with program headers only has no sections at all.
        let bare = synthetic_elf(&[], &[]);
        assert!(section(&bare, Path::new("x"), ".text").unwrap().is_none());
        assert!(matches!(
            section(b"not an elf", Path::new("x"), ".text"),
            Err(ElfError::NotElf64 { .. })
        ));
    }
}
