//! Kernel settings a sandbox may have set for it, as a Kubernetes pod's `sysctls`: only those
//! the kernel keeps per namespace, each of a namespace the sandbox has of its own (IPC: shared
//! memory, message queues, semaphores, POSIX message queues) or its network namespace. Written
//! before anything of the sandbox runs, through `/proc/sys` as the writer's namespaces see it:
//! the IPC ones by the sandbox's root in its new namespaces, the network ones by whoever owns
//! the network namespace (the sandbox's root for its own; the supervisor, with the host's
//! privileges, for a pod's it joined). Nothing else — no `vm.*`, `kernel.*` beyond IPC, `fs.*`
//! beyond `fs.mqueue` — since those are the host's.

use std::fmt;
use std::str::FromStr;

use crate::sys::SysError;

/// The prefixes of the namespaced settings a sandbox may set (what Kubernetes calls
/// namespaced sysctls).
const NAMESPACED: &[&str] = &[
    "kernel.shm_rmid_forced",
    "kernel.shmmax",
    "kernel.shmall",
    "kernel.shmmni",
    "kernel.msgmax",
    "kernel.msgmnb",
    "kernel.msgmni",
    "kernel.sem",
    "fs.mqueue.",
    "net.",
];

/// Longest value written.
const MAX_VALUE: usize = 256;

/// One setting, `NAME=VALUE` in the flag form (`kernel.shm_rmid_forced=1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysctl {
    /// Its name, dotted (`net.ipv4.ip_local_port_range`); `/` separators are taken too.
    pub name: String,
    /// Its value, as written to its `/proc/sys` file.
    pub value: String,
}

impl Sysctl {
    /// Checks that it is a namespaced setting with a name that is one path under `/proc/sys`
    /// and a value of one line.
    pub fn check(&self) -> Result<(), String> {
        let name = self.name.replace('/', ".");
        let plain = !name.is_empty()
            && name.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
            });
        if !plain {
            return Err(format!(
                "{:?} is not a sysctl name (dot-separated words of letters, digits, _ and -)",
                self.name
            ));
        }
        let namespaced = NAMESPACED.iter().any(|prefix| {
            if prefix.ends_with('.') {
                name.starts_with(prefix)
            } else {
                name == *prefix
            }
        });
        if !namespaced {
            return Err(format!(
                "{:?} is not a namespaced sysctl a sandbox may set (kernel.shm*, kernel.msg*, \
                 kernel.sem, fs.mqueue.*, net.*): it is the host's",
                self.name
            ));
        }
        if self.value.len() > MAX_VALUE || self.value.contains(['\n', '\0']) {
            return Err(format!(
                "{}: the value must be one line of at most {MAX_VALUE} bytes",
                self.name
            ));
        }
        Ok(())
    }

    /// Whether it belongs to the network namespace.
    pub fn is_network(&self) -> bool {
        self.name.starts_with("net.") || self.name.starts_with("net/")
    }

    /// Writes it through `/proc/sys` as the caller's namespaces see it.
    pub(crate) fn apply(&self) -> Result<(), SysError> {
        let path = format!("/proc/sys/{}", self.name.replace('.', "/"));
        std::fs::write(&path, &self.value).map_err(|e| {
            SysError::io(
                format!("set sysctl {} to {:?} ({path})", self.name, self.value),
                e,
            )
        })
    }
}

impl fmt::Display for Sysctl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.value)
    }
}

impl FromStr for Sysctl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, value) = s
            .split_once('=')
            .ok_or("must be NAME=VALUE, as in kernel.shm_rmid_forced=1")?;
        let sysctl = Sysctl {
            name: name.into(),
            value: value.into(),
        };
        sysctl.check()?;
        Ok(sysctl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_namespaced_settings_are_taken() {
        for good in [
            "kernel.shm_rmid_forced=1",
            "fs.mqueue.msg_max=100",
            "net.ipv4.ip_local_port_range=40000 50000",
            "net/ipv4/ping_group_range=0 2147483647",
            "kernel.sem=250 32000 100 128",
        ] {
            let sysctl: Sysctl = good.parse().expect(good);
            assert_eq!(sysctl.to_string(), good);
        }
        for (bad, says) in [
            ("vm.swappiness=10", "the host's"),
            ("kernel.hostname=x", "the host's"),
            ("kernel.shm_rmid_forcedX=1", "the host's"),
            ("net..x=1", "not a sysctl name"),
            ("net.ipv4/../../x=1", "not a sysctl name"),
            ("net.x=1\n2", "one line"),
            ("net.x", "NAME=VALUE"),
        ] {
            let err = bad.parse::<Sysctl>().expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
        assert!("net.core.somaxconn=1"
            .parse::<Sysctl>()
            .expect("net")
            .is_network());
        assert!(!"fs.mqueue.msg_max=1"
            .parse::<Sysctl>()
            .expect("ipc")
            .is_network());
    }
}
