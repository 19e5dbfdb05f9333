//! The declared shape of a sandbox's containers, in the flag forms the supervisor's command
//! line carries: each container's name and image tree, each shared directory of the scratch
//! and where it is mounted, and the rules they follow (checked before anything is made).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use contract::container_security::ContainerSecurity;

use crate::extra_mount::{check_target, utf8};
use crate::SandboxSpec;
/// The name of the sandbox's own root, its first container, in a [`SharedMount`].
pub const MAIN: &str = "main";

/// Checks a container's or a shared directory's name: 1 to 63 of `a-z`, `0-9` and `-`,
/// starting and ending with a letter or a digit (a DNS label, as Kubernetes names them).
pub fn check_name(name: &str, what: &str) -> Result<(), String> {
    if contract::cmdline::is_valid_name(name) {
        Ok(())
    } else {
        Err(format!(
            "{what} {name:?} must be 1 to 63 of a-z, 0-9 and -, starting and ending with a \
             letter or a digit"
        ))
    }
}

/// A container of the sandbox: `NAME=ROOTFS` in the flag form, with `+pids` after the name
/// when it joins the sandbox's own root's PID namespace and each word of its security
/// settings after a `+` too (`db+pids+ro+nnp+caps:5fb=/…/rootfs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRoot {
    /// Its name ([`check_name`]; never [`MAIN`]).
    pub name: String,
    /// The host directory of its image's tree: its root's read-only, idmapped lower layer.
    pub rootfs: PathBuf,
    /// It joins the PID namespace of the sandbox's own root (whose agent is its PID 1), as a
    /// Kubernetes pod's member with `shareProcessNamespace`, instead of getting its own.
    pub share_pids: bool,
    /// Its first command is PID 1 of its PID namespace, as under runc, rather than its agent
    /// ([`crate::container_init`]); never with `share_pids`.
    pub command_is_pid1: bool,
    /// What its processes may do, within the sandbox's own rules.
    pub security: ContainerSecurity,
}

/// The word after a container's name in the flag form when it joins the root's PID namespace.
const SHARES_PIDS: &str = "pids";
/// The word after a container's name in the flag form when its first command is PID 1.
const COMMAND_IS_PID1: &str = "pid1";

impl ContainerRoot {
    /// Checks every rule of the flag form.
    pub fn check(&self) -> Result<(), String> {
        check_name(&self.name, "a container's name")?;
        if self.name == MAIN {
            return Err(format!(
                "{MAIN:?} is the sandbox's own root, not a container"
            ));
        }
        let rootfs = utf8(&self.rootfs, "ROOTFS")?;
        if !rootfs.starts_with('/') {
            return Err(format!("ROOTFS {rootfs:?} must be an absolute host path"));
        }
        if self.share_pids && self.command_is_pid1 {
            return Err(format!(
                "container {:?} joins the root's PID namespace, whose PID 1 it cannot be",
                self.name
            ));
        }
        Ok(())
    }
}

impl fmt::Display for ContainerRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if self.share_pids {
            write!(f, "+{SHARES_PIDS}")?;
        }
        if self.command_is_pid1 {
            write!(f, "+{COMMAND_IS_PID1}")?;
        }
        if !self.security.is_default() {
            for word in self.security.to_string().split(' ') {
                write!(f, "+{word}")?;
            }
        }
        write!(f, "={}", self.rootfs.display())
    }
}

impl FromStr for ContainerRoot {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, rootfs) = s
            .split_once('=')
            .ok_or("must be NAME=ROOTFS, as in db=/var/lib/crucible/images/pg/rootfs")?;
        let mut words = name.split('+');
        let name = words.next().unwrap_or_default();
        let mut share_pids = false;
        let mut command_is_pid1 = false;
        let mut security = Vec::new();
        for word in words {
            if word == SHARES_PIDS && !share_pids {
                share_pids = true;
            } else if word == COMMAND_IS_PID1 && !command_is_pid1 {
                command_is_pid1 = true;
            } else {
                security.push(word);
            }
        }
        let security = match security.is_empty() {
            true => ContainerSecurity::default(),
            false => security.join(" ").parse()?,
        };
        let container = ContainerRoot {
            name: name.into(),
            rootfs: rootfs.into(),
            share_pids,
            command_is_pid1,
            security,
        };
        container.check()?;
        Ok(container)
    }
}

/// A shared directory of the sandbox's scratch mounted in one of its containers (or in its
/// own root, [`MAIN`]): `OWNER:DIR:TARGET` in the flag form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedMount {
    /// The container that mounts it, or [`MAIN`].
    pub owner: String,
    /// The shared directory's name ([`check_name`]): the same name is the same directory.
    pub dir: String,
    /// Where it appears in that container: absolute, normalised, not `/`, nor in `/proc`,
    /// `/dev` or `/sys`.
    pub target: PathBuf,
    /// Mounted read-only there (`:ro` in the flag form).
    pub read_only: bool,
}

impl SharedMount {
    /// Checks every rule of the flag form.
    pub fn check(&self) -> Result<(), String> {
        check_name(&self.owner, "OWNER")?;
        check_name(&self.dir, "DIR")?;
        check_target(utf8(&self.target, "TARGET")?)
    }
}

impl fmt::Display for SharedMount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.owner, self.dir, self.target.display())?;
        if self.read_only {
            f.write_str(":ro")?;
        }
        Ok(())
    }
}

impl FromStr for SharedMount {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let (owner, dir, target, read_only) = match parts.as_slice() {
            [owner, dir, target] => (owner, dir, target, false),
            [owner, dir, target, "ro"] => (owner, dir, target, true),
            _ => {
                return Err(
                    "must be OWNER:DIR:TARGET[:ro] (paths cannot contain `:`), as in \
                            main:work:/work"
                        .into(),
                )
            }
        };
        let mount = SharedMount {
            owner: (*owner).into(),
            dir: (*dir).into(),
            target: (*target).into(),
            read_only,
        };
        mount.check()?;
        Ok(mount)
    }
}

/// Where the scratch keeps shared directory `dir`, relative to the scratch's root.
pub(crate) fn shared_dir(dir: &str) -> PathBuf {
    Path::new("shared").join(dir)
}

/// Checks the containers and shared mounts of a spec: unique names, owners that exist.
pub(crate) fn check_spec(spec: &SandboxSpec) -> Result<(), (String, String, String)> {
    for (i, container) in spec.containers.iter().enumerate() {
        let bad = |reason: String| ("--container".to_string(), container.to_string(), reason);
        container.check().map_err(bad)?;
        if spec.containers[..i]
            .iter()
            .any(|c| c.name == container.name)
        {
            return Err(bad("another container has the same NAME".into()));
        }
    }
    for (i, mount) in spec.shared.iter().enumerate() {
        let bad = |reason: String| ("--shared".to_string(), mount.to_string(), reason);
        mount.check().map_err(bad)?;
        if mount.owner != MAIN && !spec.containers.iter().any(|c| c.name == mount.owner) {
            return Err(bad(format!("there is no container {:?}", mount.owner)));
        }
        let same_owner = spec.shared[..i].iter().filter(|m| m.owner == mount.owner);
        if same_owner.clone().any(|m| m.target == mount.target) {
            return Err(bad(
                "another shared mount of OWNER has the same TARGET".into()
            ));
        }
        if mount.owner == MAIN && spec.mounts.iter().any(|m| m.target == mount.target) {
            return Err(bad("a --mount has the same TARGET".into()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_containers_flag_carries_its_pid_namespace_and_security() {
        let text = "db+pids+ro+nnp+caps:21=/img/db";
        let root: ContainerRoot = text.parse().expect(text);
        assert!(root.share_pids && root.security.read_only_root);
        assert!(root.security.no_new_privileges);
        assert_eq!(root.security.capabilities, Some(0x21));
        assert_eq!(root.to_string(), text);
        let plain: ContainerRoot = "db=/img/db".parse().expect("plain");
        assert_eq!(plain.to_string(), "db=/img/db");
        let err = "db+rw=/img/db".parse::<ContainerRoot>().expect_err("rw");
        assert!(err.contains("\"rw\""), "{err}");
        let pid1: ContainerRoot = "app+pid1+nnp=/img/app".parse().expect("pid1");
        assert!(pid1.command_is_pid1 && !pid1.share_pids);
        assert_eq!(pid1.to_string(), "app+pid1+nnp=/img/app");
        let err = "app+pids+pid1=/img/app"
            .parse::<ContainerRoot>()
            .expect_err("PID 1 of a namespace it joins");
        assert!(err.contains("cannot be"), "{err}");
    }

    #[test]
    fn the_flag_forms_round_trip_and_refuse_bad_names() {
        let c: ContainerRoot = "db=/srv/images/pg/rootfs".parse().expect("container");
        assert_eq!(c.to_string(), "db=/srv/images/pg/rootfs");
        let m: SharedMount = "db:work:/var/lib/work".parse().expect("shared");
        assert_eq!(m.to_string(), "db:work:/var/lib/work");
        for (bad, says) in [
            ("main=/r", "sandbox's own root"),
            ("DB=/r", "a-z, 0-9"),
            ("-db=/r", "starting and ending"),
            ("db=r", "absolute"),
            ("db", "NAME=ROOTFS"),
            ("", "NAME=ROOTFS"),
        ] {
            let e = bad.parse::<ContainerRoot>().expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        for (bad, says) in [
            ("db:work", "OWNER:DIR:TARGET"),
            ("db:Work:/w", "DIR"),
            ("db:work:/proc/x", "inside /proc"),
            ("db:work:/", "must not be /"),
            ("db:work:/a/../b", "normalised"),
        ] {
            let e = bad.parse::<SharedMount>().expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        let long = "a".repeat(64);
        assert!(check_name(&long, "x").is_err());
        check_name(&"a".repeat(63), "x").expect("63");
    }
}
