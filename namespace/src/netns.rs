//! A network namespace made by someone else that a sandbox uses: a Kubernetes pod's, which CNI
//! configured (its interfaces, addresses and routes) and whose file containerd names in the
//! pause container's spec.
//!
//! The namespace belongs to the host's user namespace, so the sandbox's root (root only in the
//! sandbox's own user namespace) could never change it. The sandbox gets a namespace of its
//! own instead, which [`crate::pod_link`] links to the pod's with the host's privileges: the
//! pod's addresses are the sandbox's, and the pod's namespace routes them, out of the
//! sandbox's reach.
//!
//! What is refused: a file that is not a network namespace, and the host's own (the daemon's)
//! named by its file. The host's own is asked for by name, [`HOST`] (a Kubernetes
//! `hostNetwork` pod): the supervisor then stays where it is, makes no network namespace,
//! and writes nothing in it (no `ip_unprivileged_port_start`, no `net.*` sysctl), since its
//! settings are the host's.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// What names the daemon's own network namespace in place of a path.
pub const HOST: &str = "host";

/// Whether `path` names the daemon's own network namespace ([`HOST`]).
pub fn is_host(path: &Path) -> bool {
    path == Path::new(HOST)
}

/// `NSFS_MAGIC`: the filesystem of `/proc/PID/ns/*` and of their bind mounts.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// `NS_GET_NSTYPE`, `_IO(0xb7, 0x3)`: which kind of namespace a namespace file is.
const NS_GET_NSTYPE: libc::Ioctl = 0xb703;

/// Why a network namespace cannot be joined.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// It could not be opened or examined.
    #[error("network namespace {path}: {what}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It is not what a sandbox may join.
    #[error("network namespace {path}: {why}")]
    Refused {
        /// The file.
        path: String,
        /// Why not.
        why: String,
    },
}

/// Opens `path` and checks that it is a network namespace other than the caller's own (the
/// host's, for the daemon and the supervisor); the descriptor to [`join`].
pub fn open_checked(path: &Path) -> Result<OwnedFd, NetnsError> {
    let shown = path.display().to_string();
    let io = |what: &str| {
        let (path, what) = (shown.clone(), what.to_string());
        move |source| NetnsError::Io { path, what, source }
    };
    let refused = |why: &str| NetnsError::Refused {
        path: shown.clone(),
        why: why.to_string(),
    };
    if !path.is_absolute() {
        return Err(refused("must be an absolute path"));
    }
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(io("open"))?;
    // SAFETY: fstatfs writes into `fs`, a valid out-pointer, for a live descriptor.
    let fs_type = unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        if libc::fstatfs(file.as_raw_fd(), &mut fs) != 0 {
            return Err(io("fstatfs")(std::io::Error::last_os_error()));
        }
        fs.f_type
    };
    // The field's type differs between libcs (i64 in glibc, u64 in musl); the magic fits both.
    #[allow(clippy::unnecessary_cast)]
    if fs_type as i64 != NSFS_MAGIC {
        return Err(refused(
            "is not a namespace file (a bind mount of /proc/PID/ns/net)",
        ));
    }
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the namespace's CLONE_NEW* flag.
    let kind = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE) };
    if kind < 0 {
        return Err(io("ioctl(NS_GET_NSTYPE)")(std::io::Error::last_os_error()));
    }
    if kind != libc::CLONE_NEWNET {
        return Err(refused("is a namespace, but not a network namespace"));
    }
    let own = std::fs::metadata("/proc/self/ns/net").map_err(io("stat /proc/self/ns/net"))?;
    let theirs = file.metadata().map_err(io("fstat"))?;
    if (own.dev(), own.ino()) == (theirs.dev(), theirs.ino()) {
        return Err(refused(
            "is the host's own network namespace, which a sandbox never joins",
        ));
    }
    Ok(OwnedFd::from(file))
}

/// Opens TCP sockets in a pod's network namespace for the daemon, which stays in the host's:
/// a microVM pod's connections out leave from the pod's namespace, with its address and
/// routes, as a runc pod's would. The namespace is held open from [`PodSockets::open`] on, so
/// the path cannot be swapped for another namespace later.
#[derive(Debug)]
pub struct PodSockets {
    netns: OwnedFd,
    path: std::path::PathBuf,
}

impl PodSockets {
    /// Opens the pod's namespace at `path` ([`open_checked`]).
    pub fn open(path: &Path) -> Result<PodSockets, NetnsError> {
        Ok(PodSockets {
            netns: open_checked(path)?,
            path: path.to_path_buf(),
        })
    }

    /// The namespace's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A new, unconnected TCP socket (IPv6 when `ipv6`) of the pod's namespace, non-blocking
    /// and close-on-exec. Made on a short-lived thread of its own, which alone enters the
    /// namespace: the caller's threads never leave the host's. A socket stays in the namespace
    /// it was made in: binding, listening and connecting it later need no thread.
    pub fn tcp_socket(&self, ipv6: bool) -> std::io::Result<OwnedFd> {
        self.within(move || {
            let domain = if ipv6 { libc::AF_INET6 } else { libc::AF_INET };
            // SAFETY: socket takes three integers and returns a new descriptor or -1.
            let fd = unsafe {
                libc::socket(
                    domain,
                    libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    0,
                )
            };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: `fd` was just returned by socket and is owned by nothing else.
            Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
        })
    }

    /// Runs `command` to its end in the pod's namespace (a child inherits the namespace of
    /// the thread that starts it), from a short-lived thread as [`PodSockets::tcp_socket`];
    /// its output.
    pub fn run(
        &self,
        command: &mut std::process::Command,
    ) -> std::io::Result<std::process::Output> {
        self.within(|| command.output())
    }

    /// Calls `work` on a short-lived thread that first enters the pod's namespace.
    fn within<T: Send>(
        &self,
        work: impl FnOnce() -> std::io::Result<T> + Send,
    ) -> std::io::Result<T> {
        let netns = self.netns.as_raw_fd();
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    // SAFETY: setns takes a descriptor (held open by `self` for the thread's
                    // whole life) and a flag; a network namespace is per thread.
                    if unsafe { libc::setns(netns, libc::CLONE_NEWNET) } != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    work()
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the namespace thread panicked")))
        })
    }
}

/// Lets every user of the namespace the caller is in bind ports below 1024
/// (`net.ipv4.ip_unprivileged_port_start = 0`, as containerd's `enable_unprivileged_ports`
/// and Kubernetes' safe sysctl do for pods, whose containers may run as any user). Written
/// through the caller's own view of `/proc/sys/net`, which is its network namespace's.
pub(crate) fn allow_low_ports() -> Result<(), NetnsError> {
    let path = "/proc/sys/net/ipv4/ip_unprivileged_port_start";
    std::fs::write(path, "0").map_err(|source| NetnsError::Io {
        path: path.into(),
        what: "write 0".into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_namespace_is_named_not_a_path() {
        assert!(is_host(Path::new("host")));
        for path in ["/host", "./host", "hosts", "/proc/self/ns/net"] {
            assert!(!is_host(Path::new(path)), "{path}");
        }
        let err = open_checked(Path::new(HOST)).expect_err("not a path to open");
        assert!(err.to_string().contains("absolute"), "{err}");
    }

    #[test]
    fn only_another_network_namespace_is_taken() {
        for (path, says) in [
            ("/proc/self/ns/net", "host's own"),
            ("/proc/self/ns/mnt", "not a network namespace"),
            ("/etc/hostname", "not a namespace file"),
            ("relative/net", "absolute"),
        ] {
            let err = open_checked(Path::new(path)).expect_err(path);
            assert!(err.to_string().contains(says), "{path}: {err}");
        }
        // A process in a network namespace of its own (util-linux's unshare; root runs tests).
        let mut other = std::process::Command::new("unshare")
            .args(["--net", "sleep", "10"])
            .spawn()
            .expect("unshare --net sleep");
        let path = format!("/proc/{}/ns/net", other.id());
        let mut joined = None;
        for _ in 0..100 {
            // Until unshare has executed sleep, its namespace is still ours.
            match open_checked(Path::new(&path)) {
                Ok(fd) => {
                    joined = Some(fd);
                    break;
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        let _ = other.kill();
        let _ = other.wait();
        assert!(joined.is_some(), "{path} was never taken");
    }

    #[test]
    fn a_pods_sockets_are_made_in_its_namespace_and_ours_stay_in_ours() {
        let mut other = std::process::Command::new("unshare")
            .args(["--net", "sleep", "10"])
            .spawn()
            .expect("unshare --net sleep");
        let path = format!("/proc/{}/ns/net", other.id());
        let mut pod = None;
        for _ in 0..100 {
            match PodSockets::open(Path::new(&path)) {
                Ok(sockets) => {
                    pod = Some(sockets);
                    break;
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        let pod = pod.expect("the namespace of unshare's sleep");
        let theirs = std::fs::metadata(&path)
            .expect("stat their namespace")
            .ino();
        let ours = std::fs::metadata("/proc/self/ns/net")
            .expect("stat ours")
            .ino();
        for ipv6 in [false, true] {
            let socket = pod.tcp_socket(ipv6).expect("a socket in their namespace");
            // SIOCGSKNS: a descriptor of the namespace a socket belongs to.
            // SAFETY: the ioctl takes no argument beyond the live socket descriptor.
            let netns = unsafe { libc::ioctl(socket.as_raw_fd(), 0x894C) };
            assert!(netns >= 0, "SIOCGSKNS: {}", std::io::Error::last_os_error());
            // SAFETY: `netns` was just returned to us and is owned by nothing else.
            let netns = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(netns) };
            let of_socket = File::from(netns).metadata().expect("fstat").ino();
            assert_eq!(of_socket, theirs, "ipv6: {ipv6}");
        }
        // The calling thread never left the host's namespace.
        let still = std::fs::metadata("/proc/thread-self/ns/net")
            .expect("stat")
            .ino();
        assert_eq!(still, ours);
        let _ = other.kill();
        let _ = other.wait();
    }
}
