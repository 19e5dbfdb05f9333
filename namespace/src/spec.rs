//! What a sandbox is made of, and its one command-line form: the daemon writes it with
//! [`SandboxSpec::to_args`] and the agent reads it back with [`SandboxSpec::parse_flag`].

use std::ffi::OsString;
use std::path::PathBuf;

use crate::IdMap;

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
    /// and `/dev/shm`. Its pages are memory, charged to the sandbox's memory cgroup.
    pub scratch_mib: u64,
    /// The host ids the sandbox's ids 0–65535 map to.
    pub id_map: IdMap,
    /// Kill the sandbox when the process that started it (the daemon) dies, so a crashed
    /// daemon leaves no sandbox running.
    pub die_with_parent: bool,
    /// cgroup membership files (`cgroup.procs`) to join before entering, so every process in
    /// the sandbox is accounted and limited.
    pub cgroup_procs: Vec<PathBuf>,
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
const FLAGS: [&str; 9] = [
    "--rootfs",
    "--runtime-dir",
    "--agent-socket",
    "--ready-socket",
    "--hostname",
    "--scratch-mib",
    "--id-map",
    "--cgroup",
    "--no-die-with-parent",
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
            id_map: IdMap::default(),
            die_with_parent: true,
            cgroup_procs: Vec::new(),
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
        if !self.die_with_parent {
            args.push(FLAGS[8].into());
        }
        args
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
            _ => return Err(bad("is not a sandbox flag")),
        }
        Ok(())
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
        Ok(())
    }
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
            id_map: IdMap::new(2_000_065_536, 65_536).expect("map"),
            die_with_parent: false,
            cgroup_procs: vec!["/sys/fs/cgroup/memory/x/cgroup.procs".into(), "/p".into()],
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
    }
}
