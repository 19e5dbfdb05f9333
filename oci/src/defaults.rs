//! An image's config as the defaults of the sandboxes made from it: `Env` under the sandbox's
//! and each command's own variables, `WorkingDir` as the commands' directory, `User` resolved
//! to ids once at import (against the image's own `/etc/passwd` and `/etc/group`, as Docker
//! does when a container starts).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::manifest::RunConfig;
use crate::unpack::{self, UnpackError};

/// Largest `/etc/passwd` or `/etc/group` read.
const MAX_ACCOUNT_FILE: usize = 4 * 1024 * 1024;

/// Why an image's config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DefaultsError {
    /// The config names a user or group the image does not have.
    #[error("the image's User {spec:?}: {reason}")]
    User {
        /// The config's `User`.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// A group to add names no group of the image.
    #[error("group {0:?}: no such group in the image's /etc/group (a number needs none)")]
    Group(String),
    /// An `Env` entry cannot be a variable.
    #[error("the image's Env entry {0:?} is not NAME=value with a valid name")]
    Env(String),
    /// Reading the image's account files failed.
    #[error(transparent)]
    Read(#[from] UnpackError),
}

/// Who commands run as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// The config's `User`, as written.
    pub spec: String,
    /// The user id.
    pub uid: u32,
    /// The primary group id.
    pub gid: u32,
    /// Supplementary groups (from `/etc/group` membership of a named user).
    pub groups: Vec<u32>,
    /// The home directory from `/etc/passwd` (`/` when the user has no entry).
    pub home: String,
}

/// What a sandbox made from the image starts with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Defaults {
    /// Variables under the sandbox's and each command's own.
    pub env: BTreeMap<String, String>,
    /// The commands' directory when a request gives none.
    pub working_dir: Option<String>,
    /// Who commands run as; `None` is root.
    pub user: Option<User>,
}

impl Defaults {
    /// These defaults with commands run as `user` instead: `HOME` follows the user unless
    /// `explicit_home` (the image's `Env` set it).
    pub fn with_user(mut self, user: User, explicit_home: bool) -> Defaults {
        if !explicit_home {
            self.env.insert("HOME".into(), user.home.clone());
        }
        self.user = Some(user);
        self
    }
}

/// Whether `name` can be an environment variable's name (as the exec API checks it).
fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('=') && !name.contains('\0')
}

/// The defaults of an image whose config is `run`, unpacked at `root`.
pub fn resolve(run: &RunConfig, root: &Path) -> Result<Defaults, DefaultsError> {
    let mut env = BTreeMap::new();
    for entry in run.env.iter().flatten() {
        let (name, value) = entry.split_once('=').unwrap_or((entry.as_str(), ""));
        if !valid_env_name(name) || value.contains('\0') {
            return Err(DefaultsError::Env(entry.clone()));
        }
        env.insert(name.to_string(), value.to_string());
    }
    let working_dir = run
        .working_dir
        .as_deref()
        .filter(|dir| !dir.is_empty())
        .map(|dir| {
            if dir.starts_with('/') {
                dir.to_string()
            } else {
                format!("/{dir}")
            }
        });
    let user = match run.user.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(spec) => Some(user(spec, root)?),
    };
    if let Some(user) = &user {
        env.entry("HOME".into())
            .or_insert_with(|| user.home.clone());
    }
    Ok(Defaults {
        env,
        working_dir,
        user,
    })
}

/// One `/etc/passwd` or `/etc/group` line's fields.
fn records(text: &str) -> impl Iterator<Item = Vec<&str>> {
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| line.split(':').collect::<Vec<_>>())
}

/// The gid `group` names in the `/etc/group` text `groups`: a number as it is, else the entry of
/// that name.
fn group_id(groups: &str, group: &str) -> Option<u32> {
    group.parse::<u32>().ok().or_else(|| {
        records(groups)
            .find(|f| f.len() >= 3 && f[0] == group)
            .and_then(|f| f[2].parse::<u32>().ok())
    })
}

/// The gids of `names` (numbers, or group names of the tree at `root`), as `docker run
/// --group-add` resolves them.
pub fn group_ids(names: &[String], root: &Path) -> Result<Vec<u32>, DefaultsError> {
    if names.iter().all(|n| n.parse::<u32>().is_ok()) {
        return Ok(names.iter().filter_map(|n| n.parse().ok()).collect());
    }
    let group = unpack::read_in_root(root, "/etc/group", MAX_ACCOUNT_FILE)?
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    names
        .iter()
        .map(|name| group_id(&group, name).ok_or_else(|| DefaultsError::Group(name.clone())))
        .collect()
}

/// Resolves `spec` (`uid`, `uid:gid`, `name`, `name:group`, as Docker's `User` and `--user`)
/// against the account files of the tree at `root`.
pub fn user(spec: &str, root: &Path) -> Result<User, DefaultsError> {
    let fail = |reason: String| DefaultsError::User {
        spec: spec.to_string(),
        reason,
    };
    let passwd = unpack::read_in_root(root, "/etc/passwd", MAX_ACCOUNT_FILE)?
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let group = unpack::read_in_root(root, "/etc/group", MAX_ACCOUNT_FILE)?
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let (user_part, group_part) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    // passwd: name:x:uid:gid:gecos:home:shell
    let entry = records(&passwd).find(|f| {
        f.len() >= 4
            && (f[0] == user_part || (user_part.parse::<u32>().is_ok() && f[2] == user_part))
    });
    let (name, uid, mut gid, home) = match (entry, user_part.parse::<u32>()) {
        (Some(f), _) => {
            let uid = f[2]
                .parse::<u32>()
                .map_err(|_| fail(format!("/etc/passwd gives uid {:?}", f[2])))?;
            let gid = f[3]
                .parse::<u32>()
                .map_err(|_| fail(format!("/etc/passwd gives gid {:?}", f[3])))?;
            let home = f.get(5).filter(|h| !h.is_empty()).unwrap_or(&"/");
            (Some(f[0].to_string()), uid, gid, home.to_string())
        }
        (None, Ok(uid)) => (None, uid, 0, "/".to_string()),
        (None, Err(_)) => {
            return Err(fail(format!(
                "no user {user_part:?} in the image's /etc/passwd"
            )))
        }
    };
    if let Some(group_part) = group_part {
        gid = group_id(&group, group_part)
            .ok_or_else(|| fail(format!("no group {group_part:?} in the image's /etc/group")))?;
    }
    // Supplementary groups: a named user's memberships, as login(1) would give.
    let mut groups: Vec<u32> = match (&name, group_part) {
        (Some(name), None) => records(&group)
            .filter(|f| f.len() >= 4 && f[3].split(',').any(|member| member == name))
            .filter_map(|f| f[2].parse::<u32>().ok())
            .collect(),
        _ => Vec::new(),
    };
    groups.retain(|g| *g != gid);
    groups.sort_unstable();
    groups.dedup();
    Ok(User {
        spec: spec.to_string(),
        uid,
        gid,
        groups,
        home,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with_accounts() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("etc")).expect("etc");
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nbuilder:x:1000:1000::/home/builder:/bin/sh\n",
        )
        .expect("passwd");
        std::fs::write(
            dir.path().join("etc/group"),
            "root:x:0:\nbuilder:x:1000:\nwheel:x:10:builder\nstaff:x:50:other,builder\n",
        )
        .expect("group");
        dir
    }

    #[test]
    fn groups_to_add_are_numbers_or_the_images_group_names() {
        let dir = root_with_accounts();
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            group_ids(&names(&["wheel", "4242", "staff"]), dir.path()).expect("resolves"),
            [10, 4242, 50]
        );
        assert!(matches!(
            group_ids(&names(&["nosuch"]), dir.path()),
            Err(DefaultsError::Group(g)) if g == "nosuch"
        ));
        // Numbers alone need no /etc/group at all.
        let bare = tempfile::tempdir().expect("tempdir");
        assert_eq!(
            group_ids(&names(&["7"]), bare.path()).expect("numbers"),
            [7]
        );
    }

    fn run(user: &str) -> RunConfig {
        RunConfig {
            user: Some(user.to_string()),
            ..RunConfig::default()
        }
    }

    #[test]
    fn users_resolve_like_docker() {
        let root = root_with_accounts();
        let d = resolve(&run("builder"), root.path()).expect("builder");
        let user = d.user.expect("user");
        assert_eq!(
            (user.uid, user.gid, user.groups),
            (1000, 1000, vec![10, 50])
        );
        assert_eq!(d.env.get("HOME").map(String::as_str), Some("/home/builder"));
        let user = resolve(&run("1000:wheel"), root.path())
            .expect("uid:group")
            .user
            .expect("user");
        assert_eq!((user.uid, user.gid, user.groups), (1000, 10, vec![]));
        let user = resolve(&run("4242"), root.path())
            .expect("bare uid")
            .user
            .expect("user");
        assert_eq!((user.uid, user.gid, user.home.as_str()), (4242, 0, "/"));
        assert!(resolve(&run("nobody"), root.path()).is_err());
        assert!(resolve(&run("builder:nogroup"), root.path()).is_err());
    }

    #[test]
    fn env_and_working_dir_become_defaults() {
        let root = root_with_accounts();
        let d = resolve(
            &RunConfig {
                env: Some(vec![
                    "PATH=/usr/bin:/bin".into(),
                    "EMPTY".into(),
                    "A=b=c".into(),
                ]),
                working_dir: Some("src/app".into()),
                ..RunConfig::default()
            },
            root.path(),
        )
        .expect("defaults");
        assert_eq!(d.env.get("A").map(String::as_str), Some("b=c"));
        assert_eq!(d.env.get("EMPTY").map(String::as_str), Some(""));
        assert_eq!(d.working_dir.as_deref(), Some("/src/app"));
        assert!(d.user.is_none());
        let bad = RunConfig {
            env: Some(vec!["=x".into()]),
            ..RunConfig::default()
        };
        assert!(matches!(
            resolve(&bad, root.path()),
            Err(DefaultsError::Env(_))
        ));
    }
}
