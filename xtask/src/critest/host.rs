//! The host side of a critest run, all put back as it was when dropped: the pods' CNI network
//! (a bridge of its own on a private /24, host-local addresses, port mappings by `portmap`:
//! the bridge deleted, the iptables chains the plugins made removed, `net.ipv4.ip_forward`
//! restored), what the specs leave on the host (the shared-memory segments the HostIpc specs
//! make with `ipcmk`, runc's empty `k8s.io` cgroups), and the scratch directory (the mounts
//! the mount propagation specs leave in it undone before it is removed).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The pods' subnet: private, and checked to be unused before the run. Pods get no default
/// route, so they reach the host's bridge address and each other, never beyond.
const SUBNET: &str = "10.88.77.0/24";

/// The iptables tables the CNI plugins touch.
const TABLES: &[&str] = &["nat", "filter", "mangle"];

/// The `ipcmk -M 1048576` segments of the HostIpc specs: this size, no process attached.
const IPCMK_BYTES: &str = "1048576";

/// The CNI network, and what it and the specs change on the host, undone when dropped.
#[derive(Debug)]
pub(crate) struct Host {
    /// The plugins (`/usr/lib/cni`, Debian's `containernetworking-plugins`).
    pub(crate) bin_dir: PathBuf,
    /// The network's configuration, for containerd's CRI plugin.
    pub(crate) conf_dir: PathBuf,
    bridge: String,
    /// The iptables chains there were before, per table: only new ones are removed.
    chains_before: Vec<(String, BTreeSet<String>)>,
    ip_forward_before: Option<String>,
    shm_before: BTreeSet<String>,
    /// The `k8s.io` cgroups (runc's parent for the pods' groups) there were before.
    cgroups_before: BTreeSet<PathBuf>,
}

impl Host {
    /// Writes the network's configuration under `dir` (containerd makes the bridge with the
    /// first pod) and records the host's state to restore.
    pub(crate) fn create(dir: &Path) -> Result<Self> {
        let bin_dir = PathBuf::from("/usr/lib/cni");
        for plugin in ["bridge", "host-local", "portmap", "loopback"] {
            if !bin_dir.join(plugin).is_file() {
                bail!(
                    "the CNI plugin {}/{plugin} is missing (Debian: containernetworking-plugins)",
                    bin_dir.display()
                );
            }
        }
        let routes = read(Command::new("ip").args(["-4", "route", "show", SUBNET]))?;
        if !routes.trim().is_empty() {
            bail!(
                "{SUBNET}, the pods' subnet, is already routed on this host ({}): another \
                 critest run, or a bridge left by one that was killed (`ip link delete` it)",
                routes.trim()
            );
        }
        // A name of at most 15 bytes, unique to this run.
        let bridge = format!("critest{}", std::process::id() % 10_000_000);
        let conf_dir = dir.join("cni/net.d");
        std::fs::create_dir_all(&conf_dir)
            .with_context(|| format!("creating {}", conf_dir.display()))?;
        let conf = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": "crucible-critest",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": bridge,
                    "isGateway": true,
                    // Nothing leaves the host: no masquerading, no default route.
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": SUBNET }]],
                        "dataDir": dir.join("cni/ipam"),
                    },
                },
                // Host ports, 127.0.0.1 included (the port mapping specs dial it).
                { "type": "portmap", "capabilities": { "portMappings": true } },
            ],
        });
        let file = conf_dir.join("10-crucible-critest.conflist");
        std::fs::write(&file, serde_json::to_vec_pretty(&conf)?)
            .with_context(|| format!("writing {}", file.display()))?;
        let mut chains_before = Vec::new();
        for table in TABLES {
            chains_before.push((table.to_string(), chains(table)?));
        }
        Ok(Host {
            bin_dir,
            conf_dir,
            bridge,
            chains_before,
            ip_forward_before: std::fs::read_to_string(IP_FORWARD).ok(),
            shm_before: shm_segments()?.into_iter().map(|s| s.id).collect(),
            cgroups_before: pod_cgroups(),
        })
    }
}

/// runc's `k8s.io` cgroups (containerd's namespace), under each v1 controller or the v2 root.
fn pod_cgroups() -> BTreeSet<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut found: BTreeSet<PathBuf> = std::fs::read_dir(root)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path().join("k8s.io"))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    found.extend(Some(root.join("k8s.io")).filter(|p| p.is_dir()));
    found
}

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

impl Drop for Host {
    fn drop(&mut self) {
        // Only the ones this run made, and only when empty (rmdir refuses otherwise).
        for group in pod_cgroups().difference(&self.cgroups_before) {
            let _ = std::fs::remove_dir(group);
        }
        if Path::new("/sys/class/net").join(&self.bridge).exists() {
            let _ = Command::new("ip")
                .args(["link", "delete", &self.bridge])
                .status();
        }
        for (table, before) in &self.chains_before {
            if let Err(e) = remove_new_chains(table, before) {
                eprintln!("    cleaning up iptables -t {table}: {e:#}");
            }
        }
        // The bridge plugin turns forwarding on for its gateway; the host had it as it was.
        if let Some(before) = &self.ip_forward_before {
            if std::fs::read_to_string(IP_FORWARD).ok().as_ref() != Some(before) {
                let _ = std::fs::write(IP_FORWARD, before);
            }
        }
        match shm_segments() {
            Ok(segments) => {
                for s in segments {
                    if !self.shm_before.contains(&s.id)
                        && s.bytes == IPCMK_BYTES
                        && s.attached == "0"
                    {
                        let _ = Command::new("ipcrm").args(["-m", &s.id]).status();
                    }
                }
            }
            Err(e) => eprintln!("    cleaning up shared memory: {e:#}"),
        }
    }
}

/// The run's scratch directory, removed when dropped once nothing is mounted in it: the mount
/// propagation specs bind-mount their host paths there and, when they fail, leave the mounts.
/// A mount that will not go keeps the directory (said so), since removing a directory tree
/// through a mount would remove what is mounted.
#[derive(Debug)]
pub(crate) struct Scratch {
    dir: Option<tempfile::TempDir>,
}

impl Scratch {
    pub(crate) fn create() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("crucible-critest-")
            .tempdir()
            .context("creating the run's scratch directory")?;
        Ok(Scratch { dir: Some(dir) })
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or(Path::new("/nonexistent"), |d| d.path())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else {
            return;
        };
        // Deepest first: a mount point inside another goes before it.
        for point in mounts_under(dir.path()).iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(point).status();
        }
        let left = mounts_under(dir.path());
        if !left.is_empty() {
            let kept = dir.keep();
            eprintln!(
                "    cleaning up: {} still has {} mount(s) ({}); left in place",
                kept.display(),
                left.len(),
                left.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
}

/// The mount points at or under `dir`, in the order `/proc/self/mountinfo` lists them.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|table| parse_mountinfo(&table, dir))
        .unwrap_or_default()
}

fn parse_mountinfo(table: &str, dir: &Path) -> Vec<PathBuf> {
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(contract::mountinfo::unescape(point)))
        .filter(|point| point.starts_with(dir))
        .collect()
}

/// A host tool's stdout (`ip`, `iptables`, `ipcs`: each answers at once; 30 s is a hung
/// one), or an error naming it with its stderr.
fn read(command: &mut Command) -> Result<String> {
    super::services::stdout_within(command, std::time::Duration::from_secs(30))
}

/// The chains of an iptables table (`-N NAME` lines of `iptables -S`).
fn chains(table: &str) -> Result<BTreeSet<String>> {
    let rules = read(Command::new("iptables").args(["-t", table, "-S"]))?;
    Ok(parse_chains(&rules))
}

fn parse_chains(rules: &str) -> BTreeSet<String> {
    rules
        .lines()
        .filter_map(|l| l.strip_prefix("-N "))
        .map(|c| c.trim().to_string())
        .collect()
}

/// Removes the `CNI-` chains of `table` that were not in `before`: the rules jumping to
/// them first, then the chains.
fn remove_new_chains(table: &str, before: &BTreeSet<String>) -> Result<()> {
    let rules = read(Command::new("iptables").args(["-t", table, "-S"]))?;
    let new: Vec<String> = parse_chains(&rules)
        .into_iter()
        .filter(|c| c.starts_with("CNI-") && !before.contains(c))
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    for rule in jumps_to(&rules, &new) {
        let mut args = vec!["-t".to_string(), table.to_string(), "-D".to_string()];
        args.extend(rule);
        let _ = Command::new("iptables").args(&args).status();
    }
    for chain in &new {
        let _ = Command::new("iptables")
            .args(["-t", table, "-F", chain])
            .status();
    }
    for chain in &new {
        let _ = Command::new("iptables")
            .args(["-t", table, "-X", chain])
            .status();
    }
    Ok(())
}

/// The rules of `iptables -S` output (without the leading `-A`) that jump to one of `chains`.
fn jumps_to(rules: &str, chains: &[String]) -> Vec<Vec<String>> {
    rules
        .lines()
        .filter_map(|l| l.strip_prefix("-A "))
        .map(split_rule)
        .filter(|words| {
            words
                .windows(2)
                .any(|w| (w[0] == "-j" || w[0] == "-g") && chains.contains(&w[1]))
        })
        .collect()
}

/// The words of one rule as `iptables -S` prints it: split at spaces, except inside double
/// quotes (comments), where `\"` is a quote.
fn split_rule(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut started) = (false, false);
    let mut chars = rule.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => word.extend(chars.next()),
            '"' => {
                quoted = !quoted;
                started = true;
            }
            c if c.is_whitespace() && !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            c => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}

/// One line of `ipcs -m`.
#[derive(Debug, PartialEq)]
struct Segment {
    id: String,
    bytes: String,
    attached: String,
}

/// The host's shared-memory segments (`ipcs -m`: key, shmid, owner, perms, bytes, nattch).
fn shm_segments() -> Result<Vec<Segment>> {
    Ok(parse_ipcs(&read(Command::new("ipcs").arg("-m"))?))
}

fn parse_ipcs(out: &str) -> Vec<Segment> {
    out.lines()
        .filter(|l| l.starts_with("0x"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Segment {
                id: f.get(1)?.to_string(),
                bytes: f.get(4)?.to_string(),
                attached: f.get(5)?.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_rules_jumping_to_the_new_chains_are_deleted() {
        let rules = "-P PREROUTING ACCEPT\n\
                     -N CNI-HOSTPORT-DNAT\n\
                     -N OTHER\n\
                     -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n\
                     -A OUTPUT -j OTHER\n";
        assert_eq!(
            parse_chains(rules),
            BTreeSet::from(["CNI-HOSTPORT-DNAT".to_string(), "OTHER".to_string()])
        );
        let jumps = jumps_to(rules, &["CNI-HOSTPORT-DNAT".to_string()]);
        assert_eq!(jumps.len(), 1);
        assert_eq!(jumps[0][0], "PREROUTING");
        assert_eq!(
            jumps[0].last().map(String::as_str),
            Some("CNI-HOSTPORT-DNAT")
        );
        let masq = r#"POSTROUTING -m comment --comment "CNI portfwd \"x\" masquerade" -j CNI-HOSTPORT-MASQ"#;
        assert_eq!(
            split_rule(masq),
            [
                "POSTROUTING",
                "-m",
                "comment",
                "--comment",
                r#"CNI portfwd "x" masquerade"#,
                "-j",
                "CNI-HOSTPORT-MASQ"
            ]
        );
    }

    #[test]
    fn the_mounts_under_the_scratch_directory_are_found_with_their_escapes_decoded() {
        let table = "22 1 254:0 / / rw - ext4 /dev/vda rw\n\
                     48 27 254:0 /tmp/s/a/mnt /tmp/s/a/mnt rw shared:2 - ext4 /dev/vda rw\n\
                     49 48 0:50 / /tmp/s/a\\040b rw - tmpfs tmpfs rw\n\
                     50 27 0:51 / /tmp/sx rw - tmpfs tmpfs rw\n";
        assert_eq!(
            parse_mountinfo(table, Path::new("/tmp/s")),
            [PathBuf::from("/tmp/s/a/mnt"), PathBuf::from("/tmp/s/a b")]
        );
    }

    #[test]
    fn ipcs_lines_give_id_size_and_attachments() {
        let out = "\n------ Shared Memory Segments --------\n\
                   key        shmid      owner      perms      bytes      nattch     status\n\
                   0x2b3e8c1a 7          root       644        1048576    0\n";
        assert_eq!(
            parse_ipcs(out),
            [Segment {
                id: "7".into(),
                bytes: "1048576".into(),
                attached: "0".into()
            }]
        );
    }
}
