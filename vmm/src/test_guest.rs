//! The hand-written test guests (`vmm/tests/guest/`) and the ELF wrapper that makes them
//! bootable kernels, shared by the KVM tests (`tests/test_guest.rs`) and `cargo xtask bench`
//! (the VMM's overhead beside a guest using every device). Behind the `test-guests` feature:
//! the VMM binary has no use for them.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::thread::JoinHandle;

/// The 64-bit test guest (`tests/guest/guest64.S`): checks what it was handed, probes the
/// virtio-mmio windows, resets.
pub const GUEST64: &[u8] = include_bytes!("../tests/guest/guest64.bin");
/// The 32-bit (PVH) test guest (`tests/guest/guest32.S`).
pub const GUEST32: &[u8] = include_bytes!("../tests/guest/guest32.bin");
/// The I/O test guest (`tests/guest/io_guest.c`): drives console, block (window 1) and vsock
/// (window 2) as a driver does; `io_guest.stay` on the command line halts it with its devices
/// live, `io_guest.echo` echoes a line of console input.
pub const IO_GUEST: &[u8] = include_bytes!("../tests/guest/io_guest.bin");
/// What the I/O guest finds in sector 0 of its disk (it fails its check otherwise).
pub const IO_GUEST_HOST_SECTOR0: &[u8] = b"crucible host sector 0";
/// The vsock host port the I/O guest connects to.
pub const IO_GUEST_VSOCK_PORT: u32 = 7000;
/// How long the I/O guest's vsock peer waits for each step of the guest.
pub const IO_GUEST_PEER_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);
/// Where the guests are linked to run.
pub const LOAD_ADDR: u64 = 0x10_0000;

/// An ELF64 x86-64 executable with one PT_LOAD at 1 MiB and, if `pvh`, a PT_NOTE carrying
/// `XEN_ELFNOTE_PHYS32_ENTRY` = the load address.
pub fn build_elf(code: &[u8], pvh: bool) -> Vec<u8> {
    let phnum: u16 = if pvh { 2 } else { 1 };
    let mut e = Vec::new();
    e.extend_from_slice(b"\x7fELF");
    e.extend_from_slice(&[2, 1, 1, 0]); // 64-bit, little-endian, version 1, SysV
    e.extend_from_slice(&[0; 8]);
    e.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    e.extend_from_slice(&1u32.to_le_bytes());
    e.extend_from_slice(&LOAD_ADDR.to_le_bytes()); // e_entry
    e.extend_from_slice(&64u64.to_le_bytes()); // e_phoff
    e.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    e.extend_from_slice(&0u32.to_le_bytes()); // flags
    e.extend_from_slice(&64u16.to_le_bytes()); // ehsize
    e.extend_from_slice(&56u16.to_le_bytes()); // phentsize
    e.extend_from_slice(&phnum.to_le_bytes());
    e.extend_from_slice(&64u16.to_le_bytes()); // shentsize
    e.extend_from_slice(&0u16.to_le_bytes()); // shnum
    e.extend_from_slice(&0u16.to_le_bytes()); // shstrndx
    debug_assert_eq!(e.len(), 64);
    let code_off = 0x1000u64;
    let note_off = code_off + code.len().next_multiple_of(8) as u64;
    let phdr =
        |e: &mut Vec<u8>, kind: u32, flags: u32, off: u64, addr: u64, len: u64, align: u64| {
            e.extend_from_slice(&kind.to_le_bytes());
            e.extend_from_slice(&flags.to_le_bytes());
            e.extend_from_slice(&off.to_le_bytes());
            e.extend_from_slice(&addr.to_le_bytes()); // vaddr
            e.extend_from_slice(&addr.to_le_bytes()); // paddr
            e.extend_from_slice(&len.to_le_bytes()); // filesz
            e.extend_from_slice(&len.to_le_bytes()); // memsz
            e.extend_from_slice(&align.to_le_bytes());
        };
    phdr(&mut e, 1, 5, code_off, LOAD_ADDR, code.len() as u64, 0x1000);
    let mut note = Vec::new();
    if pvh {
        note.extend_from_slice(&4u32.to_le_bytes()); // namesz
        note.extend_from_slice(&4u32.to_le_bytes()); // descsz
        note.extend_from_slice(&18u32.to_le_bytes()); // XEN_ELFNOTE_PHYS32_ENTRY
        note.extend_from_slice(b"Xen\0");
        note.extend_from_slice(&(LOAD_ADDR as u32).to_le_bytes());
        phdr(&mut e, 4, 4, note_off, 0, note.len() as u64, 4);
    }
    e.resize(code_off as usize, 0);
    e.extend_from_slice(code);
    e.resize(note_off as usize, 0);
    e.extend_from_slice(&note);
    e
}

/// What the I/O guest's vsock peer saw: its 19-byte ping and whatever followed until the guest
/// shut the connection down.
pub type IoGuestVsockPeer = JoinHandle<io::Result<([u8; 19], Vec<u8>)>>;

/// Prepares in `dir` what the I/O guest expects of the host, for a VMM started with
/// `--block dir/disk.img --vsock-uds dir/v.sock`: a 1 MiB `disk.img` whose sector 0 holds
/// [`IO_GUEST_HOST_SECTOR0`], and a listener on vsock host port [`IO_GUEST_VSOCK_PORT`]
/// (`v.sock_7000`) that reads the guest's 19-byte ping, answers, and returns the ping and
/// whatever followed it until the guest shut the connection down. Every wait has a deadline
/// ([`IO_GUEST_PEER_LIMIT`]): a guest that never connects, or stops talking, ends the thread
/// with a `TimedOut` error instead of hanging whoever joins it.
pub fn serve_io_guest_host(dir: &Path) -> io::Result<IoGuestVsockPeer> {
    let mut disk = vec![0u8; 1 << 20];
    disk[..IO_GUEST_HOST_SECTOR0.len()].copy_from_slice(IO_GUEST_HOST_SECTOR0);
    std::fs::write(dir.join("disk.img"), &disk)?;
    let listener = UnixListener::bind(dir.join(format!("v.sock_{IO_GUEST_VSOCK_PORT}")))?;
    listener.set_nonblocking(true)?;
    Ok(std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + IO_GUEST_PEER_LIMIT;
        let mut c = loop {
            match listener.accept() {
                Ok((c, _)) => break c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() > deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the I/O guest never connected to vsock port 7000",
                        ));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(e),
            }
        };
        c.set_nonblocking(false)?;
        c.set_read_timeout(Some(IO_GUEST_PEER_LIMIT))?;
        let mut ping = [0u8; 19];
        c.read_exact(&mut ping)?;
        c.write_all(b"pong from the host")?;
        let mut rest = Vec::new();
        // A VMM stopped by a signal may reset the connection: what arrived is the answer.
        let _ = c.read_to_end(&mut rest);
        Ok((ping, rest))
    }))
}
