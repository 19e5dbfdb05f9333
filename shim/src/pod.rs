//! Kubernetes pods, as containerd's CRI plugin runs them: which container of a pod a task is
//! (its spec's annotations), and what of its spec's mounts a pod member gets.
//!
//! The pod's `pause` container (`io.kubernetes.cri.container-type: sandbox`) is the sandbox;
//! every app container of the pod (`container`, with `io.kubernetes.cri.sandbox-id` naming
//! the pause container) is a container added to that sandbox, named after its
//! `io.kubernetes.cri.container-name`. Of the spec's mounts:
//! - an `emptyDir` (kubelet's `…/volumes/kubernetes.io~empty-dir/NAME`) becomes the sandbox's
//!   shared directory `NAME`: a directory of the sandbox's own scratch, the same files in
//!   every container that mounts it, empty at first (as an `emptyDir` is);
//! - a secret, configMap, projected or downward-API volume is a shared directory mounted
//!   read-only, filled and kept up to date through a writer container ([`crate::pod_volumes`]);
//! - a small host file (`/etc/hosts`, `/etc/resolv.conf`, `/etc/hostname`, the termination
//!   log, a volume's key mounted by `subPath`) is copied into the container when it is made
//!   (writable, as Kubernetes mounts it, and not refreshed);
//! - every other mount (host directories, the spec's own `/proc`, `/dev`, `/sys`) is not
//!   applied: the sandbox has its own.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{Mount, Spec};

use crate::error::ShimError;

/// The annotation that says which container of a pod the spec is.
pub(crate) const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// The pod's sandbox (its `pause` container's id).
pub(crate) const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// The container's name in its pod.
pub(crate) const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";

/// The most a pod member's copied files may hold together.
const MAX_COPIED_BYTES: u64 = 8 * 1024 * 1024;

/// Which container of a pod a task's spec is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    /// Not a pod's (no CRI annotations: `ctr run`): a sandbox of its own.
    Alone,
    /// A pod's `pause` container: the pod's sandbox.
    PodSandbox,
    /// An app container of the pod whose sandbox is the task `sandbox_id`.
    Member {
        /// The pause container's task id.
        sandbox_id: String,
        /// Its name in the pod (a DNS label).
        name: String,
    },
}

/// The role `annotations` give a task `id`.
pub(crate) fn role(annotations: Option<&HashMap<String, String>>, id: &str) -> Role {
    let get = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    match (get(CONTAINER_TYPE), get(SANDBOX_ID)) {
        (Some("sandbox"), _) => Role::PodSandbox,
        (Some("container"), Some(sandbox_id)) if !sandbox_id.is_empty() => Role::Member {
            sandbox_id: sandbox_id.to_string(),
            name: member_name(get(CONTAINER_NAME), id),
        },
        _ => Role::Alone,
    }
}

/// The grouping of a task for `start`: one shim per pod, as runc's shim groups them (the
/// pause container's id for every container of a pod), one per task otherwise.
pub(crate) fn grouping(annotations: Option<&HashMap<String, String>>, id: &str) -> String {
    annotations
        .and_then(|a| a.get(SANDBOX_ID))
        .filter(|s| !s.is_empty())
        .cloned()
        .unwrap_or_else(|| id.to_string())
}

/// A container's name in its sandbox: its pod's name for it when that is a DNS label (as
/// Kubernetes requires), else one made of its task id.
fn member_name(pod_name: Option<&str>, id: &str) -> String {
    let is_label = |name: &str| contract::cmdline::is_valid_name(name) && name != "main";
    match pod_name {
        Some(name) if is_label(name) => name.to_string(),
        _ => {
            let tail: String = id
                .chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .map(|c| c.to_ascii_lowercase())
                .take(12)
                .collect();
            format!("c-{tail}")
        }
    }
}

/// What a pod member gets of its spec's mounts.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct MemberMounts {
    /// Shared directories: `emptyDir`s, by name, and where each is mounted.
    pub(crate) shared: Vec<api_types::SharedMount>,
    /// Host files to copy in: the source, and the path in the container.
    pub(crate) copies: Vec<(PathBuf, String)>,
    /// Kubelet's volume directories (secret, configMap, projected, downward API): the source,
    /// and the path in the container, where it is mounted read-only from a shared directory
    /// the shim fills and keeps up to date ([`volume_dir`], [`writer_name`]).
    pub(crate) volumes: Vec<(PathBuf, String)>,
    /// Host directories (`hostPath` volumes), mounted idmapped by the daemon.
    pub(crate) host_paths: Vec<api_types::HostPath>,
}

/// Where the writer container mounts its member's volume `index` (writable).
pub(crate) fn writer_path(index: usize) -> String {
    format!("/v/{index}")
}

/// The shared directory that holds volume `index` of the pod member that task `task` is.
pub(crate) fn volume_dir(task: &str, index: usize) -> String {
    format!("kv{index}-{}", short_hash(task))
}

/// The container that fills the volume directories of the pod member that task `task` is: a
/// container of its own (no main process) that mounts them writable, so that the member
/// mounts them read-only.
pub(crate) fn writer_name(task: &str) -> String {
    format!("files-{}", short_hash(task))
}

/// 12 hex digits of `text`'s SHA-256: a name part of fixed length from any member name.
fn short_hash(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))[..12].to_string()
}

/// The tar that fills the writer's volume directories with what kubelet wrote in `volumes`
/// (extracted at `/` in the writer), bounded as [`copies_tar`] is: a directory's files go
/// into its `generation` directory (`/v/N/GENERATION/…`, switched to afterwards), a single
/// file to `/v/N` itself.
pub(crate) fn volumes_tar(
    volumes: &[(PathBuf, String)],
    generation: &str,
) -> Result<Vec<u8>, ShimError> {
    let at_writer: Vec<(PathBuf, String)> = volumes
        .iter()
        .enumerate()
        .map(|(index, (source, _))| match source.is_dir() {
            true => (
                source.clone(),
                format!("{}/{generation}", writer_path(index)),
            ),
            false => (source.clone(), writer_path(index)),
        })
        .collect();
    copies_tar(&at_writer)
}

/// Sorts `spec`'s mounts into what a pod member gets (see the module's doc), or refuses one
/// a sandbox cannot give, naming it: a host path shared both ways (`rshared`, Kubernetes'
/// `Bidirectional`), or a host socket or device.
pub(crate) fn member_mounts(spec: &Spec) -> Result<MemberMounts, ShimError> {
    let mut out = MemberMounts::default();
    for mount in spec.mounts().iter().flatten() {
        sort_mount(mount, &mut out)?;
    }
    Ok(out)
}

fn sort_mount(mount: &Mount, out: &mut MemberMounts) -> Result<(), ShimError> {
    let options: Vec<&str> = mount
        .options()
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    let is_bind = mount.typ().as_deref() == Some("bind")
        || options.iter().any(|o| *o == "bind" || *o == "rbind");
    let (Some(source), Some(target)) = (mount.source(), mount.destination().to_str()) else {
        return Ok(());
    };
    if !is_bind || !target.starts_with('/') {
        return Ok(());
    }
    let text = source.to_string_lossy();
    if let Some((_, name)) = text.split_once("/volumes/kubernetes.io~empty-dir/") {
        let name = name.trim_end_matches('/');
        if !name.contains('/') && !name.is_empty() {
            out.shared.push(api_types::SharedMount {
                name: name.to_string(),
                path: target.to_string(),
                read_only: false,
            });
            return Ok(());
        }
    }
    let copied_kind = [
        "/volumes/kubernetes.io~secret/",
        "/volumes/kubernetes.io~configmap/",
        "/volumes/kubernetes.io~projected/",
        "/volumes/kubernetes.io~downward-api/",
    ]
    .iter()
    .any(|kind| text.contains(kind));
    let meta = std::fs::metadata(source).ok();
    let is_file = meta.as_ref().is_some_and(|m| m.is_file());
    let is_dir = meta.as_ref().is_some_and(|m| m.is_dir());
    if copied_kind && !is_file {
        out.volumes.push((source.clone(), target.to_string()));
    } else if is_file {
        out.copies.push((source.clone(), target.to_string()));
    } else if target == "/dev/shm" {
        // containerd's bind of the pod's shared memory: the sandbox's IPC namespace has its
        // own `/dev/shm`, which every member shares.
    } else if is_dir {
        if options.iter().any(|o| *o == "rshared" || *o == "shared") {
            return Err(ShimError::Invalid(format!(
                "mount of host path {} on {target}: propagation Bidirectional (rshared) would \
                 let the sandbox mount on the node; a crucible sandbox takes None or \
                 HostToContainer",
                source.display()
            )));
        }
        let from_host = options.iter().any(|o| *o == "rslave" || *o == "slave");
        out.host_paths.push(api_types::HostPath {
            source: text.into_owned(),
            path: target.to_string(),
            read_only: options.contains(&"ro"),
            propagation: match from_host {
                true => api_types::HostPathPropagation::HostToContainer,
                false => api_types::HostPathPropagation::Private,
            },
        });
    } else {
        return Err(ShimError::Invalid(format!(
            "mount of host path {} on {target}: {}; a crucible sandbox mounts host \
             directories and copies host files, not sockets or devices",
            source.display(),
            match meta {
                None => "it does not exist",
                Some(_) => "it is neither a directory nor a regular file",
            }
        )));
    }
    Ok(())
}

/// A tar of `copies` (each source at its path in the container, a directory with the files
/// in it, symlinks followed as kubelet's atomic writer makes them), at most
/// [`MAX_COPIED_BYTES`] of file contents, to extract at `/`.
pub(crate) fn copies_tar(copies: &[(PathBuf, String)]) -> Result<Vec<u8>, ShimError> {
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(true);
    let mut total = 0u64;
    for (source, target) in copies {
        let inside = target.trim_start_matches('/');
        let meta = std::fs::metadata(source)
            .map_err(|e| ShimError::io(format!("reading mount source {}", source.display()), e))?;
        if meta.is_dir() {
            for entry in walk(source)? {
                let relative = entry.strip_prefix(source).unwrap_or(&entry);
                total += append_file(&mut tar, &entry, &Path::new(inside).join(relative))?;
            }
        } else {
            total += append_file(&mut tar, source, Path::new(inside))?;
        }
        if total > MAX_COPIED_BYTES {
            return Err(ShimError::Invalid(format!(
                "the host files mounted into a pod member hold more than {} MiB (up to {}): a \
                 sandbox copies them in",
                MAX_COPIED_BYTES / (1024 * 1024),
                source.display()
            )));
        }
    }
    tar.into_inner()
        .map_err(|e| ShimError::io("building the tar of a pod member's files", e))
}

/// The regular files under `dir`, following symlinks (kubelet's `..data` link), skipping
/// its hidden `..`-prefixed entries, which are the same files again.
fn walk(dir: &Path) -> Result<Vec<PathBuf>, ShimError> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let entries = std::fs::read_dir(&next)
            .map_err(|e| ShimError::io(format!("listing {}", next.display()), e))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| ShimError::io(format!("listing {}", next.display()), e))?;
            if entry.file_name().to_string_lossy().starts_with("..") {
                continue;
            }
            let path = entry.path();
            match std::fs::metadata(&path) {
                Ok(m) if m.is_dir() => pending.push(path),
                Ok(m) if m.is_file() => files.push(path),
                _ => {}
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Appends the regular file `source` as `name`; its size.
fn append_file(
    tar: &mut tar::Builder<Vec<u8>>,
    source: &Path,
    name: &Path,
) -> Result<u64, ShimError> {
    let mut file = std::fs::File::open(source)
        .map_err(|e| ShimError::io(format!("opening {}", source.display()), e))?;
    let meta = file
        .metadata()
        .map_err(|e| ShimError::io(format!("reading {}", source.display()), e))?;
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX_COPIED_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ShimError::io(format!("reading {}", source.display()), e))?;
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, name, bytes.as_slice())
        .map_err(|e| ShimError::io(format!("adding {} to a tar", source.display()), e))?;
    Ok(bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn roles_and_groupings_follow_the_cri_annotations() {
        assert_eq!(role(None, "abc"), Role::Alone);
        assert_eq!(grouping(None, "abc"), "abc");
        let pause = annotations(&[(CONTAINER_TYPE, "sandbox"), (SANDBOX_ID, "p1")]);
        assert_eq!(role(Some(&pause), "p1"), Role::PodSandbox);
        assert_eq!(grouping(Some(&pause), "p1"), "p1");
        let app = annotations(&[
            (CONTAINER_TYPE, "container"),
            (SANDBOX_ID, "p1"),
            (CONTAINER_NAME, "job"),
        ]);
        assert_eq!(
            role(Some(&app), "c9"),
            Role::Member {
                sandbox_id: "p1".into(),
                name: "job".into()
            }
        );
        assert_eq!(grouping(Some(&app), "c9"), "p1");
        // A name that is no DNS label (or `main`) is made of the task id instead.
        for bad in ["Job", "main", "-x", ""] {
            let odd = annotations(&[
                (CONTAINER_TYPE, "container"),
                (SANDBOX_ID, "p1"),
                (CONTAINER_NAME, bad),
            ]);
            assert_eq!(
                role(Some(&odd), "ABCDEF0123456789ff"),
                Role::Member {
                    sandbox_id: "p1".into(),
                    name: "c-abcdef012345".into()
                },
                "{bad:?}"
            );
        }
    }

    #[test]
    fn empty_dirs_are_shared_volumes_mounted_read_only_small_files_copied_and_host_dirs_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "127.0.0.1 localhost\n").expect("hosts");
        let empty_dir = dir
            .path()
            .join("pods/u1/volumes/kubernetes.io~empty-dir/work");
        let secret = dir
            .path()
            .join("pods/u1/volumes/kubernetes.io~secret/token");
        std::fs::create_dir_all(&empty_dir).expect("empty dir");
        std::fs::create_dir_all(secret.join("..2024_01")).expect("secret");
        std::fs::write(secret.join("..2024_01/token"), "s3cret").expect("token");
        std::os::unix::fs::symlink("..2024_01/token", secret.join("token")).expect("link");
        let spec: Spec = serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/etc/hosts", "type": "bind", "source": hosts,
                 "options": ["rbind", "ro"]},
                {"destination": "/work", "type": "bind", "source": empty_dir,
                 "options": ["rbind", "rw"]},
                {"destination": "/var/run/secrets/x", "type": "bind", "source": secret,
                 "options": ["rbind", "ro"]},
                {"destination": "/host", "type": "bind", "source": dir.path(),
                 "options": ["rbind", "rslave", "ro"]},
                {"destination": "/cache", "type": "bind", "source": empty_dir.parent().expect("dir"),
                 "options": ["rbind", "rprivate", "rw"]},
                {"destination": "/dev/shm", "type": "bind", "source": dir.path(),
                 "options": ["rbind", "rw"]}
            ]
        }))
        .expect("spec");
        let mounts = member_mounts(&spec).expect("mounts");
        assert_eq!(
            mounts.host_paths,
            [
                api_types::HostPath {
                    source: dir.path().display().to_string(),
                    path: "/host".into(),
                    read_only: true,
                    propagation: api_types::HostPathPropagation::HostToContainer,
                },
                api_types::HostPath {
                    source: empty_dir.parent().expect("dir").display().to_string(),
                    path: "/cache".into(),
                    read_only: false,
                    propagation: api_types::HostPathPropagation::Private,
                }
            ]
        );
        for (options, source, refused) in [
            (
                vec!["rbind", "rshared"],
                dir.path().to_path_buf(),
                "Bidirectional",
            ),
            (vec!["rbind"], dir.path().join("missing"), "does not exist"),
        ] {
            let spec: Spec = serde_json::from_value(serde_json::json!({
                "ociVersion": "1.0.2",
                "mounts": [{"destination": "/x", "type": "bind", "source": source,
                            "options": options}]
            }))
            .expect("spec");
            let err = member_mounts(&spec).expect_err(refused);
            assert!(err.to_string().contains(refused), "{err}");
        }
        assert_eq!(
            mounts.shared,
            [api_types::SharedMount {
                name: "work".into(),
                path: "/work".into(),
                read_only: false,
            }]
        );
        assert_eq!(mounts.copies, [(hosts.clone(), "/etc/hosts".to_string())]);
        assert_eq!(
            mounts.volumes,
            [(secret.clone(), "/var/run/secrets/x".to_string())]
        );
        let entries = |tar: Vec<u8>| {
            let mut archive = tar::Archive::new(std::io::Cursor::new(tar));
            let mut seen = Vec::new();
            for entry in archive.entries().expect("entries") {
                let mut entry = entry.expect("entry");
                let mut text = String::new();
                entry.read_to_string(&mut text).expect("read");
                seen.push((entry.path().expect("path").display().to_string(), text));
            }
            seen
        };
        assert_eq!(
            entries(copies_tar(&mounts.copies).expect("tar")),
            [("etc/hosts".to_string(), "127.0.0.1 localhost\n".to_string())]
        );
        // A volume goes to its generation in the writer's directory for it, kubelet's `..`
        // entries left out.
        assert_eq!(
            entries(volumes_tar(&mounts.volumes, "..crucible_1").expect("tar")),
            [("v/0/..crucible_1/token".to_string(), "s3cret".to_string())]
        );
        assert_eq!(
            volume_dir("job", 0),
            format!("kv0-{}", &writer_name("job")[6..])
        );
        assert!(volume_dir(&"x".repeat(63), 99).len() <= 63);
    }
}
