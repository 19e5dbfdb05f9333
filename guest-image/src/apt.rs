//! Every `apt-get` the project runs: non-interactive, and waiting for the locks another apt or
//! dpkg holds instead of failing at once. A fresh cloud VM runs its unattended upgrades in its
//! first minutes, holding dpkg's lock all that time; apt-get without a timeout gives up on
//! the spot ("Could not get lock /var/lib/dpkg/lock-frontend").

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

/// How long an apt-get of ours waits for a lock that is held, in seconds (apt's
/// `DPkg::Lock::Timeout`).
pub const LOCK_WAIT_S: u32 = 600;

/// The locks apt-get takes: dpkg's (its frontend's and its own) and the package lists'.
const LOCKS: [&str; 3] = [
    "/var/lib/dpkg/lock-frontend",
    "/var/lib/dpkg/lock",
    "/var/lib/apt/lists/lock",
];

/// The arguments `apt-get` gets for `args`: the lock wait, then `args`.
pub fn args(args: &[&str]) -> Vec<String> {
    let mut all = vec![
        "-o".to_string(),
        format!("DPkg::Lock::Timeout={LOCK_WAIT_S}"),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    all
}

/// `apt-get ARGS` ([`args`]), with `DEBIAN_FRONTEND=noninteractive`. When another process
/// holds one of apt's locks now, `note` is told that this one waits for it, and for how long.
pub fn apt_get(apt_args: &[&str], note: &dyn Fn(&str)) -> Command {
    if let Some(held) = held_lock() {
        note(&format!(
            "{held}: waiting up to {} min for another apt to finish",
            LOCK_WAIT_S / 60
        ));
    }
    let mut cmd = Command::new("apt-get");
    cmd.env("DEBIAN_FRONTEND", "noninteractive")
        .args(args(apt_args));
    cmd
}

/// Which of apt's locks another process holds now, and who (`/var/lib/dpkg/lock-frontend is
/// held by pid 812 (unattended-upgr)`); `None` when none is, or `/proc/locks` cannot tell.
fn held_lock() -> Option<String> {
    LOCKS.iter().find_map(|lock| {
        let pid = holder_of(Path::new(lock))?;
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|comm| format!(" ({})", comm.trim()))
            .unwrap_or_default();
        Some(format!("{lock} is held by pid {pid}{name}"))
    })
}

/// The pid holding a lock on the file `path` now, as `/proc/locks` tells.
fn holder_of(path: &Path) -> Option<u32> {
    let meta = std::fs::metadata(path).ok()?;
    let table = std::fs::read_to_string("/proc/locks").ok()?;
    holder(&table, meta.dev(), meta.ino())
}

/// The pid holding a lock on the file `(dev, ino)` in `table` (the text of `/proc/locks`), if
/// any: apt and dpkg take POSIX record locks, which it lists as
/// `1: POSIX  ADVISORY  WRITE 812 08:01:131090 0 EOF` (the device's major and minor in hex);
/// a process waiting for the lock (`1: -> POSIX …`) holds nothing.
fn holder(table: &str, dev: u64, ino: u64) -> Option<u32> {
    // The kernel's split of a device number (glibc's gnu_dev_major and gnu_dev_minor).
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    table.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) == Some(&"->") {
            return None;
        }
        let at = fields.iter().position(|f| f.matches(':').count() == 2)?;
        let mut file = fields[at].split(':');
        let (maj, min, i) = (file.next()?, file.next()?, file.next()?);
        let same = u64::from_str_radix(maj, 16).ok() == Some(major)
            && u64::from_str_radix(min, 16).ok() == Some(minor)
            && i.parse::<u64>().ok() == Some(ino);
        if !same {
            return None;
        }
        // The pid is the field before the file; an open file description's lock has -1.
        fields.get(at.checked_sub(1)?)?.parse::<u32>().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_apt_get_waits_ten_minutes_for_the_lock_before_its_own_arguments() {
        assert_eq!(
            args(&["install", "-y", "qemu-system-x86"]),
            [
                "-o",
                "DPkg::Lock::Timeout=600",
                "install",
                "-y",
                "qemu-system-x86"
            ]
        );
        assert_eq!(
            args(&["update"]),
            ["-o", "DPkg::Lock::Timeout=600", "update"]
        );
        let cmd = apt_get(&["download", "linux-image-amd64"], &|_| {});
        assert_eq!(cmd.get_program(), "apt-get");
        let given: Vec<_> = cmd.get_args().collect();
        assert_eq!(
            given,
            [
                "-o",
                "DPkg::Lock::Timeout=600",
                "download",
                "linux-image-amd64"
            ]
        );
    }

    #[test]
    fn the_holder_of_a_lock_is_read_from_proc_locks_and_a_waiter_is_not_one() {
        // Device 8:1 (st_dev 0x801), and a device past the old 8-bit split: 259:3.
        let dev_8_1 = 0x801;
        let dev_259_3 = (259 << 8) | 3;
        let table = "\
1: POSIX  ADVISORY  WRITE 812 08:01:131090 0 EOF
1: -> POSIX  ADVISORY  WRITE 990 08:01:131090 0 EOF
2: FLOCK  ADVISORY  WRITE 77 08:01:555 0 EOF
3: OFDLCK ADVISORY  READ  -1 103:03:42 0 EOF
4: POSIX  ADVISORY  WRITE 4242 103:03:7 0 EOF
";
        assert_eq!(holder(table, dev_8_1, 131090), Some(812));
        assert_eq!(holder(table, dev_8_1, 555), Some(77));
        assert_eq!(holder(table, dev_8_1, 131091), None);
        assert_eq!(holder(table, 0x802, 131090), None, "another device");
        assert_eq!(holder(table, dev_259_3, 7), Some(4242));
        assert_eq!(holder(table, dev_259_3, 42), None, "no pid to name");
        assert_eq!(holder("", dev_8_1, 131090), None);
        assert_eq!(holder("garbage\n1: POSIX\n", dev_8_1, 131090), None);
    }

    #[test]
    fn a_lock_this_process_holds_is_found_on_this_kernel() {
        let path = std::env::temp_dir().join(format!("apt-lock-test-{}", std::process::id()));
        let file = std::fs::File::create(&path).expect("create");
        assert_eq!(holder_of(&path), None);
        file.try_lock().expect("lock");
        assert_eq!(holder_of(&path), Some(std::process::id()));
        file.unlock().expect("unlock");
        assert_eq!(holder_of(&path), None);
        std::fs::remove_file(&path).expect("remove");
    }
}
