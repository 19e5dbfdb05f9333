//! Reading a layer's tar members: their headers as unpacking needs them, with the metadata
//! the `tar` crate buffers before each member bounded.

use std::cell::Cell;
use std::io::{self, Read};

use rustix::fs::{Gid, Mode, Timespec, Timestamps, Uid};

use super::{shown, UnpackError};

/// One tar member's header, as far as unpacking needs it.
pub(super) struct Member {
    pub(super) path: Vec<u8>,
    pub(super) link_target: Option<Vec<u8>>,
    pub(super) kind: tar::EntryType,
    /// Content size (PAX `size` and GNU sparse maps applied by the `tar` crate).
    pub(super) size: u64,
    pub(super) header: tar::Header,
    pub(super) pax_mtime: Option<Vec<u8>>,
}

impl Member {
    fn bad_header(&self, field: &'static str) -> impl FnOnce(io::Error) -> UnpackError + '_ {
        move |source| UnpackError::BadHeader {
            entry: shown(&self.path),
            field,
            source: Some(source),
        }
    }

    pub(super) fn owner(&self) -> Result<(Uid, Gid), UnpackError> {
        let uid = self.header.uid().map_err(self.bad_header("uid"))?;
        let gid = self.header.gid().map_err(self.bad_header("gid"))?;
        // u32::MAX is chown's "leave unchanged", not an id.
        let id = |value: u64, field| match u32::try_from(value) {
            Ok(id) if id != u32::MAX => Ok(id),
            _ => Err(UnpackError::BadHeader {
                entry: shown(&self.path),
                field,
                source: None,
            }),
        };
        Ok((
            Uid::from_raw(id(uid, "uid")?),
            Gid::from_raw(id(gid, "gid")?),
        ))
    }

    /// Permission bits with setuid, setgid and sticky; the file type bits are dropped.
    pub(super) fn permissions(&self) -> Result<Mode, UnpackError> {
        let mode = self.header.mode().map_err(self.bad_header("mode"))?;
        Ok(Mode::from_raw_mode(mode & 0o7777))
    }

    /// The modification time: PAX `mtime` when present and well formed, else the header's.
    pub(super) fn mtime(&self) -> Result<Timespec, UnpackError> {
        if let Some(time) = self.pax_mtime.as_deref().and_then(parse_pax_time) {
            return Ok(time);
        }
        let seconds = self.header.mtime().map_err(self.bad_header("mtime"))?;
        let tv_sec = i64::try_from(seconds).map_err(|_| UnpackError::BadHeader {
            entry: shown(&self.path),
            field: "mtime",
            source: None,
        })?;
        Ok(Timespec { tv_sec, tv_nsec: 0 })
    }

    pub(super) fn timestamps(&self) -> Result<Timestamps, UnpackError> {
        let mtime = self.mtime()?;
        Ok(Timestamps {
            last_access: mtime,
            last_modification: mtime,
        })
    }
}

/// Parses a PAX time (`-?SECONDS(.FRACTION)?`) into a timespec; `None` if malformed.
pub(super) fn parse_pax_time(value: &[u8]) -> Option<Timespec> {
    let text = std::str::from_utf8(value).ok()?;
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let seconds: i64 = whole.parse().ok()?;
    let mut nanos: i64 = 0;
    for (index, digit) in fraction.bytes().take(9).enumerate() {
        let exponent = 8 - u32::try_from(index).ok()?;
        nanos += i64::from(digit - b'0') * 10_i64.pow(exponent);
    }
    Some(match (negative, nanos) {
        (false, _) => Timespec {
            tv_sec: seconds,
            tv_nsec: nanos,
        },
        (true, 0) => Timespec {
            tv_sec: -seconds,
            tv_nsec: 0,
        },
        (true, _) => Timespec {
            tv_sec: -seconds - 1,
            tv_nsec: 1_000_000_000 - nanos,
        },
    })
}

/// Most bytes of tar metadata (GNU long names, PAX records, sparse maps) read before one
/// member. The `tar` crate buffers them whole, so without this bound a compressed stream could
/// make the daemon allocate without end.
const MAX_METADATA_BYTES: u64 = 1 << 20;

/// Counts what the `tar` crate reads, and refuses to let it read more than
/// [`MAX_METADATA_BYTES`] while it looks for the next member.
#[derive(Default)]
struct Meter {
    position: Cell<u64>,
    armed: Cell<bool>,
    read_while_armed: Cell<u64>,
    tripped: Cell<bool>,
}

struct MeteredReader<'m, R> {
    inner: R,
    meter: &'m Meter,
}

impl<R: Read> Read for MeteredReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let meter = self.meter;
        let mut room = buf.len();
        if meter.armed.get() {
            let used = meter.read_while_armed.get();
            if used >= MAX_METADATA_BYTES {
                meter.tripped.set(true);
                return Err(io::Error::other("too much tar metadata before one member"));
            }
            room = room.min(usize::try_from(MAX_METADATA_BYTES - used).unwrap_or(usize::MAX));
        }
        let read = self.inner.read(&mut buf[..room])?;
        let read_u64 = read as u64;
        meter
            .position
            .set(meter.position.get().saturating_add(read_u64));
        if meter.armed.get() {
            meter
                .read_while_armed
                .set(meter.read_while_armed.get() + read_u64);
        }
        Ok(read)
    }
}

/// Calls `visit` with each member of the tar `stream` and a reader of its content; whatever
/// content `visit` leaves unread is drained before the next member is parsed.
pub(super) fn for_each_member<R: Read>(
    stream: R,
    mut visit: impl FnMut(&Member, &mut dyn Read) -> Result<(), UnpackError>,
) -> Result<(), UnpackError> {
    let meter = Meter::default();
    let mut archive = tar::Archive::new(MeteredReader {
        inner: stream,
        meter: &meter,
    });
    let mut last_member = String::from("none: at the start");
    let tar_error = |meter: &Meter, after: &str, source: io::Error| {
        if meter.tripped.get() {
            UnpackError::MetadataTooLarge {
                offset: meter.position.get(),
                max: MAX_METADATA_BYTES,
            }
        } else {
            UnpackError::Tar {
                offset: meter.position.get(),
                after: after.to_owned(),
                source,
            }
        }
    };
    let mut entries = archive
        .entries()
        .map_err(|source| tar_error(&meter, &last_member, source))?;
    loop {
        meter.read_while_armed.set(0);
        meter.armed.set(true);
        let next = entries.next();
        meter.armed.set(false);
        let mut entry = match next {
            None => return Ok(()),
            Some(Ok(entry)) => entry,
            Some(Err(source)) => return Err(tar_error(&meter, &last_member, source)),
        };
        // For a member that is itself a PAX header (a global one, or one the `tar` crate did not
        // merge), `pax_extensions` would read its whole content into memory: never asked.
        let entry_type = entry.header().entry_type();
        let is_pax_header =
            entry_type.is_pax_global_extensions() || entry_type.is_pax_local_extensions();
        let pax_mtime = if is_pax_header {
            None
        } else {
            match entry.pax_extensions() {
                Ok(Some(extensions)) => extensions
                    .filter_map(Result::ok)
                    .find(|extension| extension.key_bytes() == b"mtime")
                    .map(|extension| extension.value_bytes().to_vec()),
                Ok(None) => None,
                Err(source) => return Err(tar_error(&meter, &last_member, source)),
            }
        };
        let member = Member {
            path: entry.path_bytes().into_owned(),
            link_target: entry.link_name_bytes().map(|target| target.into_owned()),
            kind: entry.header().entry_type(),
            size: entry.size(),
            header: entry.header().clone(),
            pax_mtime,
        };
        visit(&member, &mut entry)?;
        io::copy(&mut entry, &mut io::sink()).map_err(|source| UnpackError::Io {
            entry: shown(&member.path),
            operation: "reading the member's content",
            source,
        })?;
        last_member = shown(&member.path);
    }
}

/// What a member is, for unpacking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    File,
    Directory,
    Symlink,
    HardLink,
    Fifo,
    Device,
    /// A PAX global header: metadata for the whole archive, not an entry.
    GlobalMetadata,
    Other,
}

pub(super) fn kind_of(entry_type: tar::EntryType) -> Kind {
    use tar::EntryType as T;
    match entry_type {
        T::Regular | T::Continuous | T::GNUSparse => Kind::File,
        T::Directory => Kind::Directory,
        T::Symlink => Kind::Symlink,
        T::Link => Kind::HardLink,
        T::Fifo => Kind::Fifo,
        T::Char | T::Block => Kind::Device,
        T::XGlobalHeader => Kind::GlobalMetadata,
        _ => Kind::Other,
    }
}
