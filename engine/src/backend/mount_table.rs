//! What a namespace sandbox has mounted, read from the host: its PID 1 (its supervisor's one
//! child) and that process's mount table. Live restore checks with it that an adopted sandbox
//! still has each cache its record names mounted where the record says: the kernel's table,
//! which root inside the sandbox (no `CAP_SYS_ADMIN` in the host's namespaces) cannot forge.

use std::io;

/// The host pid of the sandbox's PID 1: the only child of its supervisor, `supervisor`.
pub(crate) fn sandbox_init(supervisor: i32) -> io::Result<i32> {
    let path = format!("/proc/{supervisor}/task/{supervisor}/children");
    let text = std::fs::read_to_string(&path)?;
    let children: Vec<&str> = text.split_whitespace().collect();
    match children.as_slice() {
        [one] => one
            .parse()
            .map_err(|_| io::Error::other(format!("{path}: {one:?} is not a pid"))),
        _ => Err(io::Error::other(format!(
            "{path}: expected one child, found {children:?}"
        ))),
    }
}

/// Whether `mountinfo` (the text of a `/proc/PID/mountinfo`) lists a filesystem of device
/// `device` (`major:minor`) mounted at `target` (trailing slashes ignored).
pub(crate) fn mounted_at(mountinfo: &str, device: &str, target: &str) -> bool {
    let target = match target.trim_end_matches('/') {
        "" => "/",
        inner => inner,
    };
    mountinfo.lines().any(|line| {
        // `ID PARENT MAJOR:MINOR ROOT MOUNT-POINT OPTIONS …`
        let mut fields = line.split(' ');
        let dev = fields.nth(2);
        let point = fields.nth(1);
        dev == Some(device) && point.is_some_and(|p| contract::mountinfo::unescape(p) == target)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
901 900 0:61 / / ro,nosuid,nodev - overlay overlay rw
902 901 0:63 / /proc rw,nosuid,nodev,noexec - proc proc rw
903 901 7:3 / /root/.cargo/registry rw,nosuid,nodev - ext4 /dev/loop3 rw
904 901 7:4 / /with\\040space rw - ext4 /dev/loop4 rw
";

    #[test]
    fn a_device_is_found_only_at_its_own_mount_point() {
        assert!(mounted_at(TABLE, "7:3", "/root/.cargo/registry"));
        assert!(mounted_at(TABLE, "7:3", "/root/.cargo/registry/"));
        assert!(!mounted_at(TABLE, "7:3", "/root/.cargo"));
        assert!(!mounted_at(TABLE, "7:4", "/root/.cargo/registry"));
        assert!(!mounted_at(TABLE, "7:30", "/root/.cargo/registry"));
        assert!(mounted_at(TABLE, "7:4", "/with space"));
        assert!(!mounted_at("", "7:3", "/root/.cargo/registry"));
        assert!(!mounted_at("garbage", "7:3", "/"));
    }

    #[test]
    fn the_init_is_the_supervisors_only_child() {
        // `sh` stands in for a supervisor: one child, forked from its only thread.
        let mut supervisor = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .expect("spawn sh");
        let pid = i32::try_from(supervisor.id()).expect("a pid");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // The child is `sh` for a moment after the fork, until it has exec'ed `sleep`.
        let comm = |child: i32| std::fs::read_to_string(format!("/proc/{child}/comm"));
        let found = loop {
            match sandbox_init(pid) {
                Ok(child) if comm(child).is_ok_and(|c| c.trim_end() == "sleep") => break Ok(child),
                Err(e) if std::time::Instant::now() >= deadline => break Err(e),
                Ok(child) if std::time::Instant::now() >= deadline => {
                    break Err(io::Error::other(format!("{child} never became sleep")))
                }
                _ => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        };
        let _ = std::process::Command::new("pkill")
            .args(["-P", &pid.to_string()])
            .status();
        let _ = supervisor.kill();
        let _ = supervisor.wait();
        found.expect("the sleep child");
        assert!(sandbox_init(i32::MAX).is_err(), "no such process");
    }
}
