//! What a running VMM costs in memory beside its guest, from `/proc/<pid>/smaps`: the private
//! pages of every mapping except guest RAM. Guest RAM is recognised by what [`crate::build_memory`]
//! does to it: anonymous mappings marked `MADV_DONTDUMP` (`dd` in `VmFlags`), which no other
//! anonymous mapping of the VMM is; their total size must be the guest's memory, or the
//! measurement is refused rather than wrong.

use std::path::PathBuf;

/// Why the overhead could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum OverheadError {
    /// The smaps file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A line did not parse.
    #[error("smaps line {line}: cannot parse {text:?}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// The mappings taken for guest RAM do not add up to the guest's memory.
    #[error("found {found_kib} KiB of guest RAM mappings, expected {expected_kib} KiB")]
    GuestRamMismatch {
        /// What was found.
        found_kib: u64,
        /// The guest's memory.
        expected_kib: u64,
    },
}

/// The VMM's memory beside guest RAM, in KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryOverhead {
    /// Private pages (clean and dirty) of every mapping but guest RAM. This includes the
    /// binary's code and read-only data while no other process maps them.
    pub private_kib: u64,
    /// Of those, anonymous pages (heap, stacks, written data): what each VM adds. The rest are
    /// page-cache pages of files, shared by every VMM running the same binary.
    pub anonymous_kib: u64,
    /// Resident pages of every mapping but guest RAM (Firecracker's "overhead RSS").
    pub rss_kib: u64,
    /// The guest RAM mappings' size.
    pub guest_ram_kib: u64,
    /// The guest RAM the guest has touched.
    pub guest_ram_rss_kib: u64,
}

impl MemoryOverhead {
    /// What one more VM adds: its anonymous pages (a second VMM shares the file pages).
    pub fn per_vm_kib(&self) -> u64 {
        self.anonymous_kib
    }
}

#[derive(Default)]
struct Mapping {
    named: bool,
    size_kib: u64,
    rss_kib: u64,
    private_clean_kib: u64,
    private_dirty_kib: u64,
    anonymous_kib: u64,
    dont_dump: bool,
}

impl Mapping {
    fn is_guest_ram(&self) -> bool {
        !self.named && self.dont_dump
    }
}

fn add(total: &mut MemoryOverhead, m: &Mapping) {
    if m.is_guest_ram() {
        total.guest_ram_kib += m.size_kib;
        total.guest_ram_rss_kib += m.rss_kib;
        return;
    }
    total.private_kib += m.private_clean_kib + m.private_dirty_kib;
    total.anonymous_kib += m.anonymous_kib;
    total.rss_kib += m.rss_kib;
}

/// Parses a whole smaps file.
pub fn parse_smaps(text: &str) -> Result<MemoryOverhead, OverheadError> {
    let mut total = MemoryOverhead::default();
    let mut current: Option<Mapping> = None;
    for (at, line) in text.lines().enumerate() {
        let bad = || OverheadError::Parse {
            line: at + 1,
            text: line.to_string(),
        };
        let mut words = line.split_whitespace();
        let first = words.next().ok_or_else(bad)?;
        if let Some(key) = first.strip_suffix(':') {
            let m = current.as_mut().ok_or_else(bad)?;
            if key == "VmFlags" {
                m.dont_dump = words.any(|flag| flag == "dd");
                continue;
            }
            let mut kib = || -> Result<u64, OverheadError> {
                words.next().and_then(|v| v.parse().ok()).ok_or_else(bad)
            };
            match key {
                "Size" => m.size_kib = kib()?,
                "Rss" => m.rss_kib = kib()?,
                "Private_Clean" => m.private_clean_kib = kib()?,
                "Private_Dirty" => m.private_dirty_kib = kib()?,
                "Anonymous" => m.anonymous_kib = kib()?,
                _ => {}
            }
            continue;
        }
        // A mapping header: `start-end perms offset dev inode [name]`.
        if !first.contains('-') {
            return Err(bad());
        }
        let name = words.nth(4);
        if let Some(done) = current.take() {
            add(&mut total, &done);
        }
        current = Some(Mapping {
            named: name.is_some(),
            ..Mapping::default()
        });
    }
    if let Some(done) = current {
        add(&mut total, &done);
    }
    Ok(total)
}

/// Measures the running VMM `pid` whose guest has `guest_ram_bytes` of memory.
pub fn measure(pid: u32, guest_ram_bytes: u64) -> Result<MemoryOverhead, OverheadError> {
    let path = PathBuf::from(format!("/proc/{pid}/smaps"));
    let text = std::fs::read_to_string(&path).map_err(|source| OverheadError::Read {
        path: path.clone(),
        source,
    })?;
    let overhead = parse_smaps(&text)?;
    let expected_kib = guest_ram_bytes / 1024;
    if overhead.guest_ram_kib != expected_kib {
        return Err(OverheadError::GuestRamMismatch {
            found_kib: overhead.guest_ram_kib,
            expected_kib,
        });
    }
    Ok(overhead)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A smaps entry; anonymous pages are the dirty ones unless the header names a file.
    fn mapping(header: &str, size: u64, rss: u64, clean: u64, dirty: u64, flags: &str) -> String {
        let anon = if header.contains(" /") { 0 } else { dirty };
        format!(
            "{header}\nSize: {size} kB\nRss: {rss} kB\nPss: {rss} kB\nShared_Clean: 0 kB\n\
             Private_Clean: {clean} kB\nPrivate_Dirty: {dirty} kB\nAnonymous: {anon} kB\n\
             Swap: 0 kB\nVmFlags: {flags}\n"
        )
    }

    #[test]
    fn guest_ram_is_left_out_and_anonymous_pages_are_told_apart() {
        let smaps = [
            mapping(
                "55d0a0000000-55d0a0280000 r-xp 00001000 00:2a 1234 /usr/bin/crucible-vmm",
                2560,
                2000,
                2000,
                0,
                "rd ex mr mw me",
            ),
            mapping(
                "55d0a0400000-55d0a0420000 rw-p 00000000 00:00 0 [heap]",
                128,
                100,
                0,
                100,
                "rd wr mr mw me ac",
            ),
            mapping(
                "7f0000000000-7f0006000000 rw-p 00000000 00:00 0 ",
                98304,
                28,
                0,
                28,
                "rd wr mr mw me nr dd",
            ),
            mapping(
                "7f1000000000-7f1000021000 rw-p 00000000 00:00 0 ",
                132,
                20,
                4,
                16,
                "rd wr mr mw me nr",
            ),
            mapping(
                "7fff00000000-7fff00002000 r--p 00000000 00:00 0 [vvar]",
                8,
                0,
                0,
                0,
                "rd mr pf io de dd",
            ),
        ]
        .concat();
        let o = parse_smaps(&smaps).expect("parses");
        assert_eq!(
            o,
            MemoryOverhead {
                private_kib: 2000 + 100 + 20,
                anonymous_kib: 100 + 16,
                rss_kib: 2000 + 100 + 20,
                guest_ram_kib: 98304,
                guest_ram_rss_kib: 28,
            }
        );
        assert_eq!(o.per_vm_kib(), 116);
    }

    #[test]
    fn malformed_smaps_is_an_error_not_a_number() {
        assert!(matches!(
            parse_smaps("Rss: 4 kB\n"),
            Err(OverheadError::Parse { line: 1, .. })
        ));
        let bad = "7f00-7f01 rw-p 00000000 00:00 0\nRss: lots kB\n";
        assert!(matches!(
            parse_smaps(bad),
            Err(OverheadError::Parse { line: 2, .. })
        ));
    }

    #[test]
    fn a_process_without_marked_guest_ram_is_refused() {
        // This test process has no guest RAM: measuring it as a VMM must fail, not report.
        let err = measure(std::process::id(), 64 << 20).expect_err("no guest RAM here");
        assert!(
            matches!(
                err,
                OverheadError::GuestRamMismatch {
                    found_kib: 0,
                    expected_kib: 65536
                }
            ),
            "{err}"
        );
    }
}
