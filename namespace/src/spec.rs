//! What a sandbox is made of, and its one command-line form: the daemon writes it with
//! [`SandboxSpec::to_args`] and the agent reads it back with [`SandboxSpec::parse_flag`].

use std::ffi::OsString;
use std::path::PathBuf;

use crate::{ContainerRoot, ExtraMount, IdMap, MountKind, SharedMount};

/// What the sandbox is made of. All paths are host paths, opened before entering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    /// The image's root directory: becomes the read-only, idmapped lower layer of `/`.
    pub rootfs: PathBuf,
    /// A host directory private to this sandbox (mode 0700, root's): the agent's sockets live
    /// there, and inside the sandbox's own mount namespace its scratch tmpfs is mounted on it
    /// (invisible to the host, gone after `pivot_root`).
    pub runtime_dir: PathBuf,
    /// Where the agent listens: a Unix socket path on the host, bound before entering.
    pub agent_socket: PathBuf,
    /// Where the daemon waits for the agent's hello: a Unix socket path on the host,
    /// connected before entering.
    pub ready_socket: PathBuf,
    /// The sandbox's hostname.
    pub hostname: String,
    /// Size of the one tmpfs that holds every write: to `/` (the overlay's upper layer), `/tmp`
    /// and `/dev/shm`. Its pages are memory, charged to the sandbox's memory cgroup. Ignored
    /// when there is a [`SandboxSpec::scratch_disk`].
    pub scratch_mib: u64,
    /// A host file holding an ext4 filesystem that takes the scratch tmpfs's place: every
    /// write lands on disk instead of in memory, and a full disk is `ENOSPC` inside. Attached
    /// through a loop device that detaches itself when the sandbox is gone.
    pub scratch_disk: Option<PathBuf>,
    /// Filesystems mounted inside besides the root, in this order.
    pub mounts: Vec<ExtraMount>,
    /// Where the agent hands connections to the daemon: a Unix socket path on the host,
    /// connected before entering and given to PID 1 as [`crate::PID1_EGRESS_FD`].
    pub egress_socket: Option<PathBuf>,
    /// The host ids the sandbox's ids 0–65535 map to.
    pub id_map: IdMap,
    /// Kill the sandbox when the process that started it (the daemon) dies, so a crashed
    /// daemon leaves no sandbox running.
    pub die_with_parent: bool,
    /// cgroup membership files (`cgroup.procs`) to join before entering, so every process in
    /// the sandbox is accounted and limited.
    pub cgroup_procs: Vec<PathBuf>,
    /// The commands' cgroup membership file, opened on the host and handed to PID 1 and every
    /// container's agent as [`crate::COMMANDS_CGROUP_FD`]: each command joins it, so that its
    /// process limit leaves the agents room to answer.
    pub commands_cgroup: Option<PathBuf>,
    /// The sandbox's containers besides its own root, each with its own image, mount and PID
    /// namespaces and agent ([`crate::container`]), in this order.
    pub containers: Vec<ContainerRoot>,
    /// Shared directories of the scratch mounted in the sandbox's root or its containers.
    pub shared: Vec<SharedMount>,
    /// A network namespace to join instead of making one ([`crate::netns`]): a Kubernetes
    /// pod's, as CNI made it.
    pub network_namespace: Option<PathBuf>,
    /// Namespaced kernel settings written before anything runs ([`crate::sysctl`]).
    pub sysctls: Vec<crate::sysctl::Sysctl>,
    /// The host CPUs the sandbox's processes run on (empty: the supervisor's own), as many as
    /// it has vCPUs, so that `nproc`, `make -j$(nproc)`, cargo and Go count what the sandbox
    /// may use rather than the host's. Its cgroup's quota is the limit; this is what it sees.
    pub cpus: Vec<u32>,
}

/// A spec that cannot be used, or a flag that cannot be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// A flag needs a value and got none.
    #[error("{0} needs a value")]
    MissingValue(String),
    /// A flag's value is not what it must be.
    #[error("{flag}: {reason}, got {value:?}")]
    BadValue {
        /// The flag.
        flag: String,
        /// What it got.
        value: String,
        /// What it must be.
        reason: String,
    },
    /// A required flag was not given.
    #[error("sandbox needs {0}")]
    Missing(&'static str),
}

/// Flags that take a value, in the order [`SandboxSpec::to_args`] writes them.
const FLAGS: [&str; 18] = [
    "--rootfs",
    "--runtime-dir",
    "--agent-socket",
    "--ready-socket",
    "--hostname",
    "--scratch-mib",
    "--id-map",
    "--cgroup",
    "--scratch-disk",
    "--mount",
    "--egress-socket",
    "--no-die-with-parent",
    "--container",
    "--shared",
    "--commands-cgroup",
    "--netns",
    "--sysctl",
    "--cpus",
];

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec {
            rootfs: PathBuf::new(),
            runtime_dir: PathBuf::new(),
            agent_socket: PathBuf::new(),
            ready_socket: PathBuf::new(),
            hostname: String::new(),
            scratch_mib: 1024,
            scratch_disk: None,
            mounts: Vec::new(),
            egress_socket: None,
            id_map: IdMap::default(),
            die_with_parent: true,
            cgroup_procs: Vec::new(),
            commands_cgroup: None,
            containers: Vec::new(),
            shared: Vec::new(),
            network_namespace: None,
            sysctls: Vec::new(),
            cpus: Vec::new(),
        }
    }
}

impl SandboxSpec {
    /// The arguments that follow `guest-init sandbox`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut pair = |flag: &str, value: OsString| {
            args.push(flag.into());
            args.push(value);
        };
        pair(FLAGS[0], self.rootfs.clone().into());
        pair(FLAGS[1], self.runtime_dir.clone().into());
        pair(FLAGS[2], self.agent_socket.clone().into());
        pair(FLAGS[3], self.ready_socket.clone().into());
        pair(FLAGS[4], self.hostname.clone().into());
        pair(FLAGS[5], self.scratch_mib.to_string().into());
        pair(FLAGS[6], self.id_map.to_string().into());
        for procs in &self.cgroup_procs {
            pair(FLAGS[7], procs.clone().into());
        }
        if let Some(disk) = &self.scratch_disk {
            pair(FLAGS[8], disk.clone().into());
        }
        for mount in &self.mounts {
            pair(FLAGS[9], mount.to_string().into());
        }
        if let Some(socket) = &self.egress_socket {
            pair(FLAGS[10], socket.clone().into());
        }
        for container in &self.containers {
            pair(FLAGS[12], container.to_string().into());
        }
        for shared in &self.shared {
            pair(FLAGS[13], shared.to_string().into());
        }
        if let Some(procs) = &self.commands_cgroup {
            pair(FLAGS[14], procs.clone().into());
        }
        if let Some(netns) = &self.network_namespace {
            pair(FLAGS[15], netns.clone().into());
        }
        for sysctl in &self.sysctls {
            pair(FLAGS[16], sysctl.to_string().into());
        }
        if !self.cpus.is_empty() {
            pair(FLAGS[17], cpu_list(&self.cpus).into());
        }
        if !self.die_with_parent {
            args.push(FLAGS[11].into());
        }
        args
    }

    /// Where container `index` (of [`SandboxSpec::containers`]) has its agent listen: a Unix
    /// socket in the runtime directory, bound on the host before entering. Named by index, so
    /// that no container name makes the path longer than a socket address holds.
    pub fn container_socket(&self, index: usize) -> PathBuf {
        container_socket(&self.runtime_dir, index)
    }

    /// Whether `flag` is one of the spec's.
    pub fn is_flag(flag: &str) -> bool {
        FLAGS.contains(&flag)
    }

    /// Applies one flag. `value` is called only for flags that take one.
    pub fn parse_flag(
        &mut self,
        flag: &str,
        value: impl FnOnce() -> Option<String>,
    ) -> Result<(), SpecError> {
        if flag == "--no-die-with-parent" {
            self.die_with_parent = false;
            return Ok(());
        }
        let v = value().ok_or_else(|| SpecError::MissingValue(flag.to_string()))?;
        let bad = |reason: &str| SpecError::BadValue {
            flag: flag.to_string(),
            value: v.clone(),
            reason: reason.to_string(),
        };
        match flag {
            "--rootfs" => self.rootfs = v.into(),
            "--runtime-dir" => self.runtime_dir = v.into(),
            "--agent-socket" => self.agent_socket = v.into(),
            "--ready-socket" => self.ready_socket = v.into(),
            "--hostname" => self.hostname = v,
            "--scratch-mib" => {
                self.scratch_mib = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad("must be a positive number of MiB"))?
            }
            "--id-map" => self.id_map = v.parse().map_err(|e: String| bad(&e))?,
            "--cgroup" => self.cgroup_procs.push(v.into()),
            "--commands-cgroup" => self.commands_cgroup = Some(v.into()),
            "--scratch-disk" => self.scratch_disk = Some(v.into()),
            "--mount" => self.mounts.push(v.parse().map_err(|e: String| bad(&e))?),
            "--egress-socket" => self.egress_socket = Some(v.into()),
            "--container" => self
                .containers
                .push(v.parse().map_err(|e: String| bad(&e))?),
            "--shared" => self.shared.push(v.parse().map_err(|e: String| bad(&e))?),
            "--netns" => self.network_namespace = Some(v.into()),
            "--sysctl" => self.sysctls.push(v.parse().map_err(|e: String| bad(&e))?),
            "--cpus" => self.cpus = parse_cpu_list(&v).map_err(|e| bad(&e))?,
            _ => return Err(bad("is not a sandbox flag")),
        }
        Ok(())
    }

    /// Whether any of its containers joins its own root's PID namespace.
    pub fn shares_pids(&self) -> bool {
        self.containers.iter().any(|c| c.share_pids)
    }

    /// Checks that everything needed is there and usable.
    pub fn validate(&self) -> Result<(), SpecError> {
        for (value, flag) in [
            (&self.rootfs, "--rootfs"),
            (&self.runtime_dir, "--runtime-dir"),
            (&self.agent_socket, "--agent-socket"),
            (&self.ready_socket, "--ready-socket"),
        ] {
            if value.as_os_str().is_empty() {
                return Err(SpecError::Missing(flag));
            }
        }
        if self.hostname.is_empty() || self.hostname.len() > 64 {
            return Err(SpecError::BadValue {
                flag: "--hostname".into(),
                value: self.hostname.clone(),
                reason: "must be 1 to 64 bytes".into(),
            });
        }
        if self.id_map.host_base == 0 {
            return Err(SpecError::Missing(
                "--id-map (sandboxes never map to host root)",
            ));
        }
        for (value, flag) in [
            (&self.scratch_disk, "--scratch-disk"),
            (&self.egress_socket, "--egress-socket"),
        ] {
            if let Some(path) = value.as_ref().filter(|p| !p.is_absolute()) {
                return Err(SpecError::BadValue {
                    flag: flag.into(),
                    value: path.display().to_string(),
                    reason: "must be an absolute host path".into(),
                });
            }
        }
        self.validate_mounts()?;
        crate::pod::check_spec(self).map_err(|(flag, value, reason)| SpecError::BadValue {
            flag,
            value,
            reason,
        })
    }

    /// Each mount follows the flag form's rules; no two share a target; no image is attached
    /// twice (the scratch disk included): ext4 mounted through two loop devices is corrupted.
    fn validate_mounts(&self) -> Result<(), SpecError> {
        let bad = |mount: &ExtraMount, reason: String| SpecError::BadValue {
            flag: "--mount".into(),
            value: mount.to_string(),
            reason,
        };
        for (i, mount) in self.mounts.iter().enumerate() {
            mount.check().map_err(|reason| bad(mount, reason))?;
            let earlier = &self.mounts[..i];
            if earlier.iter().any(|m| m.target == mount.target) {
                return Err(bad(mount, "another mount has the same TARGET".into()));
            }
            if mount.kind == MountKind::Ext4Image {
                let attached_before = earlier
                    .iter()
                    .filter(|m| m.kind == MountKind::Ext4Image)
                    .map(|m| &m.source)
                    .chain(self.scratch_disk.as_ref())
                    .any(|source| *source == mount.source);
                if attached_before {
                    return Err(bad(
                        mount,
                        "this image is already mounted (an image can be mounted once)".into(),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Where container `index` of the sandbox whose runtime directory is `runtime_dir` listens
/// ([`SandboxSpec::container_socket`]); the daemon connects there.
pub fn container_socket(runtime_dir: &std::path::Path, index: usize) -> PathBuf {
    runtime_dir.join(format!("c{index}.sock"))
}

/// The most CPUs a `--cpus` list names: as many as a `cpu_set_t` holds.
pub(crate) const MAX_CPUS: usize = 1024;

/// `--cpus`' value: CPU numbers separated by commas (`0,2`).
fn cpu_list(cpus: &[u32]) -> String {
    cpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_cpu_list(text: &str) -> Result<Vec<u32>, String> {
    let mut cpus = Vec::new();
    for word in text.split(',') {
        let cpu: u32 = word
            .parse()
            .ok()
            .filter(|n| (*n as usize) < MAX_CPUS)
            .ok_or_else(|| format!("must be CPU numbers below {MAX_CPUS}, separated by commas"))?;
        if cpus.contains(&cpu) {
            return Err(format!("names CPU {cpu} twice"));
        }
        cpus.push(cpu);
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> SandboxSpec {
        SandboxSpec {
            rootfs: "/img/rootfs".into(),
            runtime_dir: "/run/crucible/sandboxes/sb-1".into(),
            agent_socket: "/run/crucible/sandboxes/sb-1/agent.sock".into(),
            ready_socket: "/run/crucible/sandboxes/sb-1/ready.sock".into(),
            hostname: "sb-1".into(),
            scratch_mib: 384,
            scratch_disk: Some("/var/lib/crucible/sb-1/scratch.ext4".into()),
            mounts: vec![
                "ext4:/srv/cache.ext4:/cache:rw".parse().expect("mount"),
                "ext4:/srv/ref.ext4:/opt/ref:ro".parse().expect("mount"),
                "dir:/srv/datasets:/mnt/data sets:ro"
                    .parse()
                    .expect("mount"),
            ],
            egress_socket: Some("/run/crucible/sandboxes/sb-1/egress.sock".into()),
            id_map: IdMap::new(2_000_065_536, 65_536).expect("map"),
            die_with_parent: false,
            cgroup_procs: vec!["/sys/fs/cgroup/memory/x/cgroup.procs".into(), "/p".into()],
            commands_cgroup: Some("/sys/fs/cgroup/pids/x/commands/cgroup.procs".into()),
            containers: vec![
                "db+pids=/img/pg/rootfs".parse().expect("container"),
                "web+ro+nnp+caps:21=/img/web/rootfs"
                    .parse()
                    .expect("container"),
            ],
            shared: vec![
                "main:work:/work".parse().expect("shared"),
                "db:work:/var/lib/work:ro".parse().expect("shared"),
            ],
            network_namespace: Some("/run/netns/cni-1".into()),
            sysctls: vec!["kernel.shm_rmid_forced=1".parse().expect("sysctl")],
            cpus: vec![1, 0],
        }
    }

    fn parse(args: &[OsString]) -> Result<SandboxSpec, SpecError> {
        let mut spec = SandboxSpec::default();
        let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
        while let Some(flag) = it.next() {
            assert!(SandboxSpec::is_flag(&flag), "{flag}");
            spec.parse_flag(&flag, || it.next())?;
        }
        Ok(spec)
    }

    #[test]
    fn the_argv_round_trips() {
        let spec = example();
        assert_eq!(parse(&spec.to_args()).expect("parse"), spec);
        let default_death = SandboxSpec {
            die_with_parent: true,
            ..example()
        };
        assert_eq!(
            parse(&default_death.to_args()).expect("parse"),
            default_death
        );
        spec.validate().expect("valid");
        let bare = SandboxSpec {
            scratch_disk: None,
            mounts: Vec::new(),
            egress_socket: None,
            containers: Vec::new(),
            shared: Vec::new(),
            ..example()
        };
        let args = bare.to_args();
        for flag in [
            "--scratch-disk",
            "--mount",
            "--egress-socket",
            "--container",
            "--shared",
        ] {
            assert!(!args.iter().any(|a| a == flag), "{flag} written when unset");
        }
        assert_eq!(parse(&args).expect("parse"), bare);
    }

    #[test]
    fn a_bad_mount_flag_says_why() {
        let mut spec = SandboxSpec::default();
        let e = spec
            .parse_flag("--mount", || Some("dir:/srv/x:/x:rw".into()))
            .expect_err("rw dir");
        let text = e.to_string();
        assert!(
            text.starts_with("--mount: a host directory can only be mounted ro"),
            "{text}"
        );
        assert!(text.contains("dir:/srv/x:/x:rw"), "{text}");
        assert!(spec.mounts.is_empty());
        assert_eq!(
            spec.parse_flag("--mount", || None),
            Err(SpecError::MissingValue("--mount".into()))
        );
    }

    fn refused(spec: SandboxSpec, flag: &str, reason: &str) {
        match spec.validate() {
            Err(SpecError::BadValue {
                flag: f, reason: r, ..
            }) => {
                assert_eq!(f, flag);
                assert!(r.contains(reason), "{r:?} does not say {reason:?}");
            }
            other => panic!("{flag} {reason}: {other:?}"),
        }
    }

    #[test]
    fn validate_refuses_bad_disks_sockets_and_mounts() {
        let mount = |text: &str| text.parse::<ExtraMount>().expect(text);
        refused(
            SandboxSpec {
                scratch_disk: Some("scratch.ext4".into()),
                ..example()
            },
            "--scratch-disk",
            "absolute",
        );
        refused(
            SandboxSpec {
                egress_socket: Some("".into()),
                ..example()
            },
            "--egress-socket",
            "absolute",
        );
        refused(
            SandboxSpec {
                mounts: vec![mount("ext4:/a.ext4:/x:rw"), mount("dir:/d:/x:ro")],
                ..example()
            },
            "--mount",
            "same TARGET",
        );
        refused(
            SandboxSpec {
                mounts: vec![mount("ext4:/a.ext4:/x:ro"), mount("ext4:/a.ext4:/y:ro")],
                ..example()
            },
            "--mount",
            "already mounted",
        );
        refused(
            SandboxSpec {
                scratch_disk: Some("/a.ext4".into()),
                mounts: vec![mount("ext4:/a.ext4:/x:rw")],
                ..example()
            },
            "--mount",
            "already mounted",
        );
        // A spec built in code gets the flag form's checks too.
        let mut rw_dir = mount("dir:/d:/x:ro");
        rw_dir.read_only = false;
        let mut into_proc = mount("ext4:/a.ext4:/x:rw");
        into_proc.target = "/proc/sys".into();
        let mut colon = mount("ext4:/a.ext4:/x:rw");
        colon.target = "/x:y".into();
        for (bad, reason) in [
            (rw_dir, "only be mounted ro"),
            (into_proc, "inside /proc"),
            (colon, "`:`"),
        ] {
            refused(
                SandboxSpec {
                    mounts: vec![bad],
                    ..example()
                },
                "--mount",
                reason,
            );
        }
        // The same directory twice, at two targets, is fine: nothing is attached twice.
        SandboxSpec {
            mounts: vec![mount("dir:/d:/x:ro"), mount("dir:/d:/y:ro")],
            ..example()
        }
        .validate()
        .expect("a directory twice");
    }

    #[test]
    fn validate_refuses_clashing_containers_and_shared_mounts() {
        let container = |text: &str| text.parse::<ContainerRoot>().expect(text);
        let shared = |text: &str| text.parse::<SharedMount>().expect(text);
        refused(
            SandboxSpec {
                containers: vec![container("db=/a"), container("db=/b")],
                ..example()
            },
            "--container",
            "same NAME",
        );
        refused(
            SandboxSpec {
                shared: vec![shared("cache:work:/w")],
                ..example()
            },
            "--shared",
            "no container \"cache\"",
        );
        refused(
            SandboxSpec {
                shared: vec![shared("db:work:/w"), shared("db:other:/w")],
                ..example()
            },
            "--shared",
            "same TARGET",
        );
        refused(
            SandboxSpec {
                shared: vec![shared("main:work:/cache")],
                ..example()
            },
            "--shared",
            "a --mount has the same TARGET",
        );
        // The same directory in two containers, at the same path, is what sharing is.
        SandboxSpec {
            shared: vec![shared("main:work:/w"), shared("db:work:/w")],
            ..example()
        }
        .validate()
        .expect("shared twice");
        assert_eq!(
            example().container_socket(1),
            PathBuf::from("/run/crucible/sandboxes/sb-1/c1.sock")
        );
    }

    #[test]
    fn bad_values_name_the_flag() {
        let mut spec = SandboxSpec::default();
        let e = spec
            .parse_flag("--scratch-mib", || Some("0".into()))
            .expect_err("zero");
        assert!(e.to_string().starts_with("--scratch-mib"), "{e}");
        let e = spec
            .parse_flag("--id-map", || Some("0:65536".into()))
            .expect_err("host root");
        assert!(e.to_string().contains("--id-map"), "{e}");
        assert_eq!(
            spec.parse_flag("--rootfs", || None),
            Err(SpecError::MissingValue("--rootfs".into()))
        );
        assert_eq!(
            SandboxSpec::default().validate(),
            Err(SpecError::Missing("--rootfs"))
        );
        for (cpus, reason) in [("0,0", "twice"), ("1,x", "separated"), ("1024", "below")] {
            let e = spec
                .parse_flag("--cpus", || Some(cpus.into()))
                .expect_err(cpus);
            assert!(e.to_string().contains(reason), "{cpus}: {e}");
        }
    }
}
