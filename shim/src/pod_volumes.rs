//! A pod member's kubelet volumes (secret, configMap, projected, downward API) as Kubernetes
//! mounts them: read-only, and refreshed when kubelet changes them, all of a volume at once.
//!
//! A sandbox mounts no host directory, so each volume is a shared directory of the pod's
//! sandbox ([`pod::volume_dir`]). A *writer* container of the member's own
//! ([`pod::writer_name`], no main process) mounts them writable at `/v/N`; the shim puts the
//! files there through it, then the member mounts each read-only where kubelet asked. Every
//! [`REFRESH_EVERY`], and whenever inotify reports a change in one of kubelet's volume
//! directories, the shim reads the volumes again and, when they changed, switches to
//! them as kubelet's own volumes switch (at once when inotify reports kubelet's change in
//! the volume's directory, its `..data` rename): each volume's files go into a new generation
//! directory, `..data` is renamed onto a link to it (one `rename`: a reader sees the old
//! files or the new ones, never a mix, as a certificate and its key must be read), each
//! top-level name is a link through `..data`, and the old generation is removed. The refresh
//! ends with the writer (the member's `Delete` removes both).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::sync::mpsc;

use sha2::Digest;
use wire::ExecRequest;

use crate::error::ShimError;
use crate::pod;

/// How often kubelet's volumes are read again, whatever inotify says.
pub(crate) const REFRESH_EVERY: Duration = Duration::from_secs(2);

/// How long the refresh waits after inotify's first report, so that one change of kubelet's
/// (a generation written, then `..data` renamed) is read once, whole.
const SETTLE: Duration = Duration::from_millis(50);

/// The prefix of a generation directory's name (kubelet's are `..YYYY_MM_DD_…`).
const GENERATION_PREFIX: &str = "..crucible_";

/// What was put last: the volumes' digest, and each volume's top-level names.
#[derive(Debug, Default)]
pub(crate) struct Put {
    digest: Vec<u8>,
    names: Vec<BTreeSet<String>>,
}

/// Adds the writer container of the member that task `task` is to `sandbox`, with its
/// `volumes` (source, path in the member) filled; the shared mounts the member takes
/// (read-only), the writer's name, and what was put (for [`keep_fresh`]).
pub(crate) async fn fill(
    client: &client::Client,
    sandbox: &str,
    task: &str,
    volumes: &[(PathBuf, String)],
) -> Result<(Vec<api_types::SharedMount>, String, Put), ShimError> {
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
    let mut last = Put::default();
    put(client, sandbox, &writer, volumes, &mut last).await?;
    let read_only = volumes
        .iter()
        .enumerate()
        .map(|(index, (_, path))| api_types::SharedMount {
            name: pod::volume_dir(task, index),
            path: path.clone(),
            read_only: true,
        })
        .collect();
    Ok((read_only, writer, last))
}

/// Refreshes `writer`'s copy of `volumes` every [`REFRESH_EVERY`] until the writer or the
/// sandbox is gone, `last` being what [`fill`] put. Failures are logged and tried again on
/// the next round.
pub(crate) async fn keep_fresh(
    client: client::Client,
    sandbox: String,
    writer: String,
    volumes: Vec<(PathBuf, String)>,
    mut last: Put,
) {
    let mut watch = watch(&volumes)
        .map_err(|e| log::warn!("watching the volumes of {writer}: {e}; polling only"))
        .ok();
    loop {
        tokio::select! {
            () = tokio::time::sleep(REFRESH_EVERY) => {}
            () = changed(watch.as_mut()) => tokio::time::sleep(SETTLE).await,
        }
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

/// kubelet's volume directories under inotify: a move into one (its `..data` rename), a file
/// written or removed there. A thread of its own blocks on the events and passes each on;
/// it ends at the first event after the refresh ended (or when kubelet removes the
/// directories, which ends their watches).
fn watch(volumes: &[(PathBuf, String)]) -> std::io::Result<mpsc::Receiver<()>> {
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC)?;
    for (source, _) in volumes {
        let dir = match source.is_dir() {
            true => source.as_path(),
            false => source.parent().unwrap_or(source.as_path()),
        };
        inotify.add_watch(
            dir,
            AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_DELETE,
        )?;
    }
    let (changes, changed) = mpsc::channel(1);
    std::thread::Builder::new()
        .name("volume-watch".into())
        .spawn(move || loop {
            match inotify.read_events() {
                Ok(_) if changes.is_closed() => return,
                // Full: a refresh is already due, which reads everything.
                Ok(_) => drop(changes.try_send(())),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    log::warn!("reading the volumes' inotify events: {e}; polling only");
                    return;
                }
            }
        })?;
    Ok(changed)
}

/// Returns once `watch` reports a change; never without one.
async fn changed(watch: Option<&mut mpsc::Receiver<()>>) {
    match watch {
        Some(changes) => {
            if changes.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// Puts `volumes` into `writer` as a new generation and switches to it, unless they are what
/// was put `last`.
async fn put(
    client: &client::Client,
    sandbox: &str,
    writer: &str,
    volumes: &[(PathBuf, String)],
    last: &mut Put,
) -> Result<(), ShimError> {
    let digest = sha2::Sha256::digest(pod::volumes_tar(volumes, GENERATION_PREFIX)?).to_vec();
    if digest == last.digest {
        return Ok(());
    }
    let generation = generation_name(&digest);
    let tar = pod::volumes_tar(volumes, &generation)?;
    let names = top_level_names(&tar, volumes.len(), &generation);
    client
        .put_tar_in(sandbox, Some(writer), "/", std::io::Cursor::new(tar))
        .await?;
    let dirs: Vec<bool> = volumes.iter().map(|(source, _)| source.is_dir()).collect();
    let script = switch_script(&dirs, &generation, &names, &last.names);
    // Bounded: a writer that stopped answering must not stall the refresh for good.
    let request = ExecRequest {
        timeout_s: 30,
        ..ExecRequest::new(vec!["/bin/sh".into(), "-c".into(), script])
    };
    let out = client
        .exec_in(sandbox, writer, &request)
        .await?
        .collect()
        .await?;
    if out.result.exit_code != 0 {
        return Err(ShimError::Invalid(format!(
            "switching {writer}'s volumes to their new files: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    if !last.digest.is_empty() {
        log::info!("refreshed the kubelet volumes of {writer} in {sandbox}");
    }
    *last = Put { digest, names };
    Ok(())
}

/// A generation directory's name for volumes of `digest`.
fn generation_name(digest: &[u8]) -> String {
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("{GENERATION_PREFIX}{hex}")
}

/// Each volume's top-level names in `tar` (a directory volume's, under its generation).
fn top_level_names(tar: &[u8], volumes: usize, generation: &str) -> Vec<BTreeSet<String>> {
    let mut names = vec![BTreeSet::new(); volumes];
    let mut archive = tar::Archive::new(tar);
    let Ok(entries) = archive.entries() else {
        return names;
    };
    for entry in entries.flatten() {
        let Ok(path) = entry.path() else { continue };
        let parts: Vec<String> = path
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        // v / N / GENERATION / NAME / …
        if let [v, index, gen, name, ..] = &parts[..] {
            if let (true, Ok(index), true) = (v == "v", index.parse::<usize>(), gen == generation) {
                if let Some(set) = names.get_mut(index) {
                    set.insert(name.clone());
                }
            }
        }
    }
    names
}

/// The shell script that switches each directory volume (`dirs[N]`) of the writer to
/// `generation`: `..data` renamed onto a link to it, a link through `..data` for each of its
/// top-level `names`, the links of names it no longer has (`before`) and older generations
/// removed.
fn switch_script(
    dirs: &[bool],
    generation: &str,
    names: &[BTreeSet<String>],
    before: &[BTreeSet<String>],
) -> String {
    let none = BTreeSet::new();
    let mut script = String::from("set -e\n");
    for (index, _) in dirs.iter().enumerate().filter(|(_, dir)| **dir) {
        let now = names.get(index).unwrap_or(&none);
        let then = before.get(index).unwrap_or(&none);
        script.push_str(&format!(
            "cd {dir}\nln -sfn {gen} ..data_tmp\nmv -T ..data_tmp ..data\n",
            dir = quote(&pod::writer_path(index)),
            gen = quote(generation),
        ));
        for name in now {
            let link = quote(name);
            let target = quote(&format!("..data/{name}"));
            script.push_str(&format!("[ -L {link} ] || ln -sfn {target} {link}\n"));
        }
        for name in then.difference(now) {
            script.push_str(&format!("rm -f {}\n", quote(name)));
        }
        script.push_str(&format!(
            "for old in {prefix}*; do [ \"$old\" = {gen} ] || rm -rf \"$old\"; done\n",
            prefix = GENERATION_PREFIX,
            gen = quote(generation),
        ));
    }
    script
}

/// `text` as one shell word.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_renames_data_links_new_names_and_drops_the_rest_as_kubelet_does() {
        let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        let script = switch_script(
            &[true, false],
            "..crucible_0a0b",
            &[names(&["ca.crt", "it's"]), names(&["file"])],
            &[names(&["ca.crt", "old"]), BTreeSet::new()],
        );
        assert_eq!(
            script,
            "set -e\n\
             cd '/v/0'\n\
             ln -sfn '..crucible_0a0b' ..data_tmp\n\
             mv -T ..data_tmp ..data\n\
             [ -L 'ca.crt' ] || ln -sfn '..data/ca.crt' 'ca.crt'\n\
             [ -L 'it'\\''s' ] || ln -sfn '..data/it'\\''s' 'it'\\''s'\n\
             rm -f 'old'\n\
             for old in ..crucible_*; do [ \"$old\" = '..crucible_0a0b' ] || rm -rf \"$old\"; done\n"
        );
    }

    #[tokio::test]
    async fn kubelets_data_rename_in_a_volume_wakes_the_refresh() {
        let dir = tempfile::tempdir().expect("tempdir");
        let volume = dir.path().join("secret");
        std::fs::create_dir(&volume).expect("volume");
        let mut changes = watch(&[(volume.clone(), "/s".into())]).expect("watch");
        assert!(changes.try_recv().is_err(), "nothing happened yet");
        std::os::unix::fs::symlink("..gen", volume.join("..data_tmp")).expect("link");
        std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).expect("rename");
        tokio::time::timeout(Duration::from_secs(5), changed(Some(&mut changes)))
            .await
            .expect("the rename was reported");
        // No watch: it never returns, and the poll alone refreshes.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), changed(None))
                .await
                .is_err()
        );
        assert!(watch(&[(dir.path().join("no/such/file"), "/m".into())]).is_err());
    }

    #[test]
    fn top_level_names_are_read_per_volume_under_their_generation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let volume = dir.path().join("secret");
        std::fs::create_dir_all(volume.join("nested")).expect("dirs");
        std::fs::write(volume.join("token"), "t").expect("token");
        std::fs::write(volume.join("nested/key"), "k").expect("key");
        let volumes = [(volume, "/var/run/secrets/x".to_string())];
        let tar = pod::volumes_tar(&volumes, "..crucible_1").expect("tar");
        let names = top_level_names(&tar, 1, "..crucible_1");
        assert_eq!(names, [["nested".to_string(), "token".to_string()].into()]);
        assert!(generation_name(&[0xab; 32]).starts_with("..crucible_abababab"));
    }
}
