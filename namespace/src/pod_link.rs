//! Links a sandbox's own network namespace to a Kubernetes pod's, the one CNI made
//! ([`crate::netns`]), so that the pod's address is the sandbox's while the pod's namespace
//! stays the node's.
//!
//! The sandbox gets a network namespace of its own, owned by its user namespace: a container
//! granted `NET_ADMIN` configures it (bridges, addresses, routes), as under runc. The pod's
//! namespace (owned by the node's user namespace) becomes a router in front of it, set up here
//! with the host's privileges before the sandbox starts:
//!
//! - a veth pair: [`POD_SIDE`] in the pod's namespace (`169.254.77.1/32`), `eth0` in the
//!   sandbox's, which gets each of the pod's IPv4 addresses (as `/32`) and a default route
//!   through [`POD_SIDE`];
//! - each pod address stops being local in the pod's namespace (its `local` route is removed)
//!   and is routed to [`POD_SIDE`] instead; the interface that holds it answers ARP for it
//!   (`proxy_arp`, no delay) and forwards, so the node and other pods reach the sandbox at the
//!   pod's address, with their own addresses as the source;
//! - [`POD_SIDE`] is reverse-path filtered (`rp_filter` strict): a packet from the sandbox whose
//!   source is not one of the pod's addresses is dropped, so root in the sandbox, which may
//!   change its own namespace at will, cannot speak on the node's network as anyone else;
//! - `crictl port-forward` (containerd connects to `localhost:PORT` inside the pod's namespace)
//!   is carried on with two `nat` rules there: TCP to `127.0.0.1` goes to the pod's first
//!   address, from [`POD_SIDE`]'s (`route_localnet` on [`POD_SIDE`]).
//!
//! The pod's IPv6 addresses are not carried into the sandbox (a warning names each). When the
//! sandbox ends, its namespace and with it the veth pair go; the routes the pod's namespace
//! was given stay, pointing nowhere, until containerd removes it with the pod.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The veth end in the pod's namespace.
pub const POD_SIDE: &str = "crucible0";

/// The veth end in the sandbox's namespace.
pub const SANDBOX_SIDE: &str = "eth0";

/// [`POD_SIDE`]'s address: link-local, the sandbox's gateway, and the source of what
/// port-forward carries in.
pub const POD_SIDE_ADDRESS: Ipv4Addr = Ipv4Addr::new(169, 254, 77, 1);

/// Why a sandbox could not be linked to its pod's network namespace.
#[derive(Debug, thiserror::Error)]
pub enum PodLinkError {
    /// A step failed.
    #[error("pod network {path}: {what}: {why}")]
    Step {
        /// The pod's namespace.
        path: String,
        /// The step.
        what: String,
        /// Why (the tool's own message, or the system's).
        why: String,
    },
}

/// One IPv4 address of the pod's, and the interface CNI gave it to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodAddress {
    interface: String,
    address: Ipv4Addr,
}

/// Links the network namespace of process `sandbox` (its own, just made) to the pod's,
/// `pod` (opened from `path`). The caller is the supervisor, still with the host's privileges,
/// in the host's network namespace, single-threaded; it is there again on return.
pub fn link(pod: &OwnedFd, path: &Path, sandbox: libc::pid_t) -> Result<(), PodLinkError> {
    let linker = Linker {
        path: path.to_path_buf(),
    };
    let host = linker.open("/proc/self/ns/net")?;
    let own = linker.open(&format!("/proc/{sandbox}/ns/net"))?;
    linker.enter(pod, "enter the pod's network namespace")?;
    let linked = linker.in_pod(sandbox).and_then(|addresses| {
        linker.enter(&own, "enter the sandbox's network namespace")?;
        linker.in_sandbox(&addresses)
    });
    // Back home whatever happened: the supervisor's later work is the host's.
    linker.enter(&host, "return to the host's network namespace")?;
    linked
}

struct Linker {
    path: PathBuf,
}

impl Linker {
    fn fail(&self, what: impl Into<String>, why: impl std::fmt::Display) -> PodLinkError {
        PodLinkError::Step {
            path: self.path.display().to_string(),
            what: what.into(),
            why: why.to_string(),
        }
    }

    fn open(&self, file: &str) -> Result<OwnedFd, PodLinkError> {
        std::fs::File::open(file)
            .map(OwnedFd::from)
            .map_err(|e| self.fail(format!("open {file}"), e))
    }

    fn enter(&self, netns: &OwnedFd, what: &str) -> Result<(), PodLinkError> {
        // SAFETY: setns takes a live descriptor and a flag; the caller is single-threaded, so
        // the whole process (and what it starts) moves.
        if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(self.fail(what, std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// In the pod's namespace: makes the pair, routes the pod's addresses to it, and returns
    /// them.
    fn in_pod(&self, sandbox: libc::pid_t) -> Result<Vec<PodAddress>, PodLinkError> {
        let listed = self.tool("ip", &["-o", "addr", "show", "scope", "global"], None)?;
        let (addresses, ipv6) = parse_addresses(&listed);
        for (interface, address) in ipv6 {
            eprintln!(
                "guest-init: pod network {}: IPv6 address {address} of {interface} is not \
                 carried into the sandbox (IPv4 only)",
                self.path.display()
            );
        }
        let Some(first) = addresses.first() else {
            // Nothing to carry: the sandbox keeps a namespace with only `lo`, as isolated as
            // the pod's.
            return Ok(addresses);
        };
        let links = self.tool("ip", &["-o", "link", "show", "dev", &first.interface], None)?;
        let mtu = parse_mtu(&links).ok_or_else(|| {
            self.fail(
                format!("read the MTU of {}", first.interface),
                format!("no `mtu` in {links:?}"),
            )
        })?;
        let mut batch = format!(
            "link add {POD_SIDE} mtu {mtu} type veth peer name {SANDBOX_SIDE} mtu {mtu} netns {sandbox}\n\
             addr add {POD_SIDE_ADDRESS}/32 dev {POD_SIDE} scope link\n\
             link set {POD_SIDE} up\n"
        );
        for a in &addresses {
            batch.push_str(&format!("route replace {}/32 dev {POD_SIDE}\n", a.address));
        }
        self.tool("ip", &["-batch", "-"], Some(&batch))?;
        for a in &addresses {
            // Absent when an earlier sandbox of this pod removed it.
            let local = a.address.to_string();
            if let Err(e) = self.tool(
                "ip",
                &[
                    "route",
                    "del",
                    "local",
                    &local,
                    "dev",
                    &a.interface,
                    "table",
                    "local",
                ],
                None,
            ) {
                if !e.to_string().contains("No such process") {
                    return Err(e);
                }
            }
            self.write_setting(&format!("ipv4/conf/{}/forwarding", a.interface), "1")?;
            self.write_setting(&format!("ipv4/conf/{}/proxy_arp", a.interface), "1")?;
            self.write_setting(&format!("ipv4/neigh/{}/proxy_delay", a.interface), "0")?;
        }
        for (setting, value) in [
            ("forwarding", "1"),
            ("rp_filter", "1"),
            ("route_localnet", "1"),
        ] {
            self.write_setting(&format!("ipv4/conf/{POD_SIDE}/{setting}"), value)?;
        }
        let to_first = first.address.to_string();
        let from_pod_side = POD_SIDE_ADDRESS.to_string();
        self.nat_rule(&[
            "OUTPUT",
            "-d",
            "127.0.0.1/32",
            "-p",
            "tcp",
            "-j",
            "DNAT",
            "--to-destination",
            &to_first,
        ])?;
        self.nat_rule(&[
            "POSTROUTING",
            "-s",
            "127.0.0.0/8",
            "-o",
            POD_SIDE,
            "-j",
            "SNAT",
            "--to-source",
            &from_pod_side,
        ])?;
        Ok(addresses)
    }

    /// In the sandbox's namespace: gives its end the pod's addresses and the way out.
    fn in_sandbox(&self, addresses: &[PodAddress]) -> Result<(), PodLinkError> {
        let Some(first) = addresses.first() else {
            return Ok(());
        };
        let mut batch = format!("link set {SANDBOX_SIDE} up\n");
        for a in addresses {
            batch.push_str(&format!("addr add {}/32 dev {SANDBOX_SIDE}\n", a.address));
        }
        batch.push_str(&format!(
            "route add {POD_SIDE_ADDRESS}/32 dev {SANDBOX_SIDE} scope link\n\
             route add default via {POD_SIDE_ADDRESS} dev {SANDBOX_SIDE} src {}\n",
            first.address
        ));
        self.tool("ip", &["-batch", "-"], Some(&batch))?;
        Ok(())
    }

    /// Appends a rule to the `nat` table unless it is there (from an earlier sandbox of the pod).
    fn nat_rule(&self, rule: &[&str]) -> Result<(), PodLinkError> {
        let with = |verb: &'static str| {
            // A bounded wait for the xtables lock: never a supervisor hung on another holder.
            let mut args = vec!["-w", "5", "-t", "nat", verb];
            args.extend_from_slice(rule);
            args
        };
        if self.tool("iptables", &with("-C"), None).is_ok() {
            return Ok(());
        }
        self.tool("iptables", &with("-A"), None).map(drop)
    }

    /// Writes `/proc/sys/net/NAME` as the current network namespace sees it.
    fn write_setting(&self, name: &str, value: &str) -> Result<(), PodLinkError> {
        let file = format!("/proc/sys/net/{name}");
        std::fs::write(&file, value).map_err(|e| self.fail(format!("write {value} to {file}"), e))
    }

    /// Runs `program` (looked up on `PATH`, then in the system directories) with `args` and
    /// `input` on its standard input; its standard output.
    fn tool(
        &self,
        program: &str,
        args: &[&str],
        input: Option<&str>,
    ) -> Result<String, PodLinkError> {
        use std::io::Write;
        let shown = format!("{program} {}", args.join(" "));
        let path = find_tool(program).ok_or_else(|| {
            self.fail(
                format!("run {program}"),
                format!(
                    "not found on PATH or in /usr/sbin, /sbin (install {})",
                    if program == "ip" { "iproute2" } else { program }
                ),
            )
        })?;
        let mut child = Command::new(path)
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| self.fail(format!("run {shown}"), e))?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| self.fail(format!("write to {shown}"), e))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| self.fail(format!("run {shown}"), e))?;
        if !out.status.success() {
            let what = match input {
                Some(text) => format!("{shown} <<< {:?}", text.trim_end()),
                None => shown,
            };
            return Err(self.fail(
                what,
                format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

pub(crate) fn find_tool(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// The global addresses in `ip -o addr show scope global`: IPv4 ones in order, and the
/// (interface, address) of IPv6 ones. [`POD_SIDE`]'s are left out.
fn parse_addresses(listed: &str) -> (Vec<PodAddress>, Vec<(String, String)>) {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for line in listed.lines() {
        // `2: eth0    inet 10.88.77.5/24 brd 10.88.77.255 scope global eth0\ ...`
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(interface), Some(family), Some(address)) =
            (fields.get(1), fields.get(2), fields.get(3))
        else {
            continue;
        };
        if *interface == POD_SIDE {
            continue;
        }
        let address = address.split('/').next().unwrap_or_default();
        match *family {
            "inet" => {
                if let Ok(address) = address.parse() {
                    v4.push(PodAddress {
                        interface: interface.to_string(),
                        address,
                    });
                }
            }
            "inet6" => v6.push((interface.to_string(), address.to_string())),
            _ => {}
        }
    }
    (v4, v6)
}

/// The `mtu N` in `ip -o link show dev IF`.
fn parse_mtu(links: &str) -> Option<u32> {
    let mut fields = links.split_whitespace();
    fields.find(|f| *f == "mtu")?;
    fields.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pods_ipv4_addresses_are_read_and_ipv6_ones_named() {
        let listed = "2: eth0    inet 10.88.77.5/24 brd 10.88.77.255 scope global eth0\\       valid_lft forever preferred_lft forever\n\
                      3: crucible0    inet 169.254.77.1/32 scope link crucible0\\       valid_lft forever\n\
                      4: net1    inet 192.168.9.3/16 scope global net1\\ ...\n\
                      2: eth0    inet6 fd00::5/64 scope global \\       valid_lft forever\n\
                      garbage\n";
        let (v4, v6) = parse_addresses(listed);
        assert_eq!(
            v4,
            vec![
                PodAddress {
                    interface: "eth0".into(),
                    address: Ipv4Addr::new(10, 88, 77, 5)
                },
                PodAddress {
                    interface: "net1".into(),
                    address: Ipv4Addr::new(192, 168, 9, 3)
                },
            ]
        );
        assert_eq!(v6, vec![("eth0".to_string(), "fd00::5".to_string())]);
    }

    #[test]
    fn the_mtu_is_read_from_the_link() {
        let line =
            "2: eth0@if316: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1450 qdisc noqueue state UP";
        assert_eq!(parse_mtu(line), Some(1450));
        assert_eq!(parse_mtu("2: eth0: <UP> qdisc"), None);
    }
}
