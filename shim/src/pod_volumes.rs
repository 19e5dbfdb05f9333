//! A pod member's kubelet volumes (secret, configMap, projected, downward API) as Kubernetes
//! mounts them: read-only, and refreshed when kubelet changes them.
//!
//! A sandbox mounts no host directory, so each volume is a shared directory of the pod's
//! sandbox ([`pod::volume_dir`]). A *writer* container of the member's own
//! ([`pod::writer_name`], no main process) mounts them writable at `/v/N`; the shim puts the
//! files there through it, then the member mounts each read-only where kubelet asked. Every
//! [`REFRESH_EVERY`] the shim reads the volumes again and puts what changed, then removes
//! what kubelet removed; a file is replaced in turn, not all at once as kubelet's own `..data`
//! switch does. The refresh ends with the writer (the member's `Delete` removes both).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use sha2::Digest;
use wire::ExecRequest;

use crate::error::ShimError;
use crate::pod;

/// How often kubelet's volumes are read again.
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(2);

/// What was put last: the tar's digest, and the paths it held (in the writer).
#[derive(Debug, Default)]
struct Put {
    digest: Vec<u8>,
    paths: BTreeSet<String>,
}

/// Adds the writer container of the member that task `task` is to `sandbox`, with its
/// `volumes` (source, path in the member) filled; the shared mounts the member takes
/// (read-only) and the writer's name.
pub(crate) async fn fill(
    client: &client::Client,
    sandbox: &str,
    task: &str,
    volumes: &[(PathBuf, String)],
) -> Result<(Vec<api_types::SharedMount>, String), ShimError> {
    let writer = pod::writer_name(task);
    let writable = (0..volumes.len())
        .map(|index| api_types::SharedMount {
            name: pod::volume_dir(task, index),
            path: pod::writer_path(index),
            read_only: false,
        })
        .collect();
    let request = api_types::ContainerRequest {
        name: writer.clone(),
        shared: writable,
        ..api_types::ContainerRequest::default()
    };
    client.add_container(sandbox, &request).await?;
    put(client, sandbox, &writer, volumes, &mut Put::default()).await?;
    let read_only = volumes
        .iter()
        .enumerate()
        .map(|(index, (_, path))| api_types::SharedMount {
            name: pod::volume_dir(task, index),
            path: path.clone(),
            read_only: true,
        })
        .collect();
    Ok((read_only, writer))
}

/// Refreshes `writer`'s copy of `volumes` every [`REFRESH_EVERY`] until the writer or the
/// sandbox is gone. Failures are logged and tried again on the next round.
pub(crate) async fn keep_fresh(
    client: client::Client,
    sandbox: String,
    writer: String,
    volumes: Vec<(PathBuf, String)>,
) {
    let mut last = match pod::volumes_tar(&volumes) {
        Ok(tar) => Put {
            digest: sha2::Sha256::digest(&tar).to_vec(),
            paths: paths_of(&tar),
        },
        Err(_) => Put::default(),
    };
    loop {
        tokio::time::sleep(REFRESH_EVERY).await;
        match client.containers(&sandbox).await {
            Ok(listed) if listed.iter().any(|c| c.name == writer) => {}
            Ok(_) | Err(client::ClientError::Api { status: 404, .. }) => return,
            Err(e) => {
                log::warn!("refreshing the volumes of {writer} in {sandbox}: {e}");
                continue;
            }
        }
        if let Err(e) = put(&client, &sandbox, &writer, &volumes, &mut last).await {
            log::warn!("refreshing the volumes of {writer} in {sandbox}: {e}");
        }
    }
}

/// Puts `volumes` into `writer` unless they are what was put `last`, then removes the files
/// that are no longer there.
async fn put(
    client: &client::Client,
    sandbox: &str,
    writer: &str,
    volumes: &[(PathBuf, String)],
    last: &mut Put,
) -> Result<(), ShimError> {
    let tar = pod::volumes_tar(volumes)?;
    let digest = sha2::Sha256::digest(&tar).to_vec();
    if digest == last.digest {
        return Ok(());
    }
    let paths = paths_of(&tar);
    client
        .put_tar_in(sandbox, Some(writer), "/", std::io::Cursor::new(tar))
        .await?;
    let gone: Vec<String> = last.paths.difference(&paths).cloned().collect();
    if !gone.is_empty() {
        let mut rm = vec!["rm".to_string(), "-f".into(), "--".into()];
        rm.extend(gone.iter().map(|p| format!("/{p}")));
        // Bounded: a writer that stopped answering must not stall the refresh for good.
        let request = ExecRequest {
            timeout_s: 30,
            ..ExecRequest::new(rm)
        };
        let out = client
            .exec_in(sandbox, writer, &request)
            .await?
            .collect()
            .await?;
        if out.result.exit_code != 0 {
            return Err(ShimError::Invalid(format!(
                "removing {} file(s) kubelet removed from {writer}: {}",
                gone.len(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    if !last.digest.is_empty() {
        log::info!("refreshed the kubelet volumes of {writer} in {sandbox}");
    }
    *last = Put { digest, paths };
    Ok(())
}

/// The file paths in `tar` (relative, as extracted at `/`).
fn paths_of(tar: &[u8]) -> BTreeSet<String> {
    let mut archive = tar::Archive::new(tar);
    let Ok(entries) = archive.entries() else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.path().ok().map(|p| p.display().to_string()))
        .collect()
}
