//! The pseudo-terminal of a command started with `tty`: the agent keeps the master side (its
//! output becomes stdout frames, stdin frames are written to it, resize frames size it), the
//! command gets the other side as its stdin, stdout, stderr and controlling terminal.
//!
//! The pair comes from the agent's own `/dev/ptmx` (its devpts instance: the sandbox's, never
//! the host's) and the command's side is opened from the master with `TIOCGPTPEER`, never by
//! its `/dev/pts/N` path, so nothing in the sandbox can swap the path between the two opens.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use wire::TerminalSize;

use crate::sys::cvt;

/// The master side of a command's terminal.
#[derive(Debug)]
pub struct Terminal {
    master: OwnedFd,
}

impl Terminal {
    /// Opens a new terminal of `size`; returns it and the command's side (close-on-exec:
    /// the spawn `dup2`s it onto 0, 1 and 2).
    pub fn open(size: TerminalSize) -> io::Result<(Terminal, OwnedFd)> {
        // SAFETY: open of a NUL-terminated literal path.
        let fd = cvt(unsafe {
            libc::open(
                c"/dev/ptmx".as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: open returned a fresh descriptor that nobody else owns.
        let master = unsafe { OwnedFd::from_raw_fd(fd) };
        let unlock: libc::c_int = 0;
        // SAFETY: TIOCSPTLCK reads one int through the pointer, which points at a live int.
        cvt(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK as _, &unlock) })?;
        // SAFETY: TIOCGPTPEER takes open flags by value and returns a new descriptor.
        let peer = cvt(unsafe {
            libc::ioctl(
                master.as_raw_fd(),
                libc::TIOCGPTPEER as _,
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: the ioctl returned a fresh descriptor that nobody else owns.
        let peer = unsafe { OwnedFd::from_raw_fd(peer) };
        let terminal = Terminal { master };
        terminal.resize(size)?;
        Ok((terminal, peer))
    }

    /// A second descriptor of the master side (output is read from one, input written to the
    /// other; they share the open file's flags).
    pub fn master(&self) -> io::Result<OwnedFd> {
        self.master.try_clone()
    }

    /// Sets the terminal's size; the kernel sends `SIGWINCH` to its foreground process group
    /// when it changed.
    pub fn resize(&self, size: TerminalSize) -> io::Result<()> {
        let winsize = libc::winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize through the pointer, which points at a live one.
        cvt(unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ as _, &winsize) })?;
        Ok(())
    }

    /// The terminal's end-of-file character (`^D`) when it reads lines (canonical mode), for
    /// the end of the client's input; `None` in raw mode, where no byte means "end".
    pub fn end_of_input(&self) -> Option<u8> {
        // SAFETY: termios is plain old data; all-zeroes is a valid value to overwrite.
        let mut attrs: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr writes one termios through the pointer, which points at a live one.
        if unsafe { libc::tcgetattr(self.master.as_raw_fd(), &mut attrs) } != 0 {
            return None;
        }
        (attrs.c_lflag & libc::ICANON != 0).then_some(attrs.c_cc[libc::VEOF])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn size_of(fd: &OwnedFd) -> (u16, u16) {
        // SAFETY: winsize is plain old data; all-zeroes is a valid value to overwrite.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ writes one winsize through the pointer, which points at a live one.
        let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ as _, &mut ws) };
        assert_eq!(ret, 0, "TIOCGWINSZ: {}", io::Error::last_os_error());
        (ws.ws_row, ws.ws_col)
    }

    #[test]
    fn a_terminal_is_sized_resized_and_carries_bytes_both_ways() {
        let (terminal, peer) = Terminal::open(TerminalSize {
            rows: 30,
            cols: 100,
        })
        .expect("a terminal");
        assert_eq!(size_of(&peer), (30, 100));
        terminal
            .resize(TerminalSize {
                rows: 50,
                cols: 132,
            })
            .expect("resize");
        assert_eq!(size_of(&peer), (50, 132));
        assert_eq!(terminal.end_of_input(), Some(4), "canonical mode, ^D");

        let mut master = std::fs::File::from(terminal.master().expect("dup"));
        let mut command_side = std::fs::File::from(peer);
        master.write_all(b"typed\n").expect("type");
        let mut line = [0u8; 6];
        command_side
            .read_exact(&mut line)
            .expect("the command reads");
        assert_eq!(&line, b"typed\n");
        command_side
            .write_all(b"out\n")
            .expect("the command writes");
        let mut shown = Vec::new();
        while !shown.ends_with(b"out\r\n") && shown.len() < 64 {
            let mut byte = [0u8; 1];
            master.read_exact(&mut byte).expect("the agent reads");
            shown.push(byte[0]);
        }
        // The echo of what was typed, then the output, both with the terminal's `\r\n`.
        assert_eq!(shown, b"typed\r\nout\r\n");
    }
}
