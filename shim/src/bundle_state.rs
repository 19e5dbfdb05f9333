//! What the shim leaves in the bundle so that cleanup works after it is gone.
//!
//! containerd runs `<shim> delete` in the bundle after every shim exit, a crash included. That
//! run has nothing but the bundle: this file says which sandbox, mount and image to release.
//! Cleanup is idempotent: what is already gone is fine, and the file is removed once nothing
//! is left.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ShimError;

/// The file's name in the bundle.
pub(crate) const FILE: &str = "crucible-shim.json";

/// What one container holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BundleState {
    /// The sandbox, once created.
    pub sandbox: Option<String>,
    /// Where the shim mounted the rootfs, while it is mounted.
    pub rootfs: Option<PathBuf>,
    /// The container's own image (not shared with other containers), to remove with it.
    pub private_image: Option<String>,
    /// A pod member's container in its pod's sandbox (which is the pause container's to
    /// delete), once added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_member: Option<PodMember>,
}

/// A container of a pod's sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PodMember {
    /// The pod's sandbox.
    pub sandbox: String,
    /// The container's name in it.
    pub name: String,
    /// The container that keeps its kubelet volumes up to date, when it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
}

impl BundleState {
    /// Whether nothing is held any more.
    pub(crate) fn is_empty(&self) -> bool {
        self.sandbox.is_none()
            && self.rootfs.is_none()
            && self.private_image.is_none()
            && self.pod_member.is_none()
    }

    /// Reads the bundle's state; a bundle without the file holds nothing.
    pub(crate) fn read(bundle: &Path) -> Result<Self, ShimError> {
        let path = bundle.join(FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                ShimError::Invalid(format!("{} is not the shim's state: {e}", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(ShimError::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Writes it (atomically: a crash leaves the old or the new file, never half of one), or
    /// removes the file when nothing is held.
    pub(crate) fn write(&self, bundle: &Path) -> Result<(), ShimError> {
        let path = bundle.join(FILE);
        if self.is_empty() {
            return match std::fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(ShimError::io(format!("removing {}", path.display()), e)),
            };
        }
        let json = serde_json::to_vec(self).map_err(|e| ShimError::Invalid(e.to_string()))?;
        let partial = bundle.join(format!("{FILE}.partial"));
        std::fs::write(&partial, json)
            .map_err(|e| ShimError::io(format!("writing {}", partial.display()), e))?;
        std::fs::rename(&partial, &path)
            .map_err(|e| ShimError::io(format!("renaming to {}", path.display()), e))
    }
}

/// Releases what `state` holds: deletes the sandbox, unmounts the rootfs, removes the private
/// image, recording each step in the bundle as it succeeds. What is already gone counts as
/// done. Returns the first failure after trying every step.
pub(crate) async fn release(
    client: &client::Client,
    bundle: &Path,
    state: &mut BundleState,
) -> Result<(), ShimError> {
    let mut first_error = None;
    if let Some(member) = state.pod_member.clone() {
        let writer = match &member.writer {
            Some(writer) => gone_is_fine(client.remove_container(&member.sandbox, writer).await),
            None => Ok(()),
        };
        let removed = gone_is_fine(client.remove_container(&member.sandbox, &member.name).await);
        match writer.and(removed) {
            Ok(()) => state.pod_member = None,
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    if let Some(sandbox) = state.sandbox.clone() {
        match gone_is_fine(client.delete(&sandbox).await) {
            Ok(()) => state.sandbox = None,
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    if let Some(rootfs) = state.rootfs.clone() {
        match crate::rootfs::unmount(&rootfs).await {
            Ok(()) => state.rootfs = None,
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    if let Some(image) = state.private_image.clone() {
        match gone_is_fine(client.delete_image(&image).await) {
            Ok(()) => state.private_image = None,
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    if let Err(e) = state.write(bundle) {
        first_error = first_error.or(Some(e));
    }
    first_error.map_or(Ok(()), Err)
}

/// A 404 from the daemon means the thing is already gone: the goal of a release.
fn gone_is_fine(result: Result<(), client::ClientError>) -> Result<(), ShimError> {
    match result {
        Ok(()) | Err(client::ClientError::Api { status: 404, .. }) => Ok(()),
        Err(e) => Err(ShimError::Daemon(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_round_trips_and_an_empty_one_removes_the_file() {
        let bundle = tempfile::tempdir().expect("temp dir");
        assert_eq!(
            BundleState::read(bundle.path()).expect("read"),
            BundleState::default(),
            "no file: nothing held"
        );
        let state = BundleState {
            sandbox: Some("sb-0123456789abcdef".into()),
            rootfs: Some(bundle.path().join("rootfs")),
            private_image: None,
            pod_member: None,
        };
        state.write(bundle.path()).expect("write");
        assert_eq!(BundleState::read(bundle.path()).expect("read"), state);
        let member = BundleState {
            pod_member: Some(PodMember {
                sandbox: "sb-0123456789abcdef".into(),
                name: "job".into(),
                writer: Some("files-0123456789ab".into()),
            }),
            ..BundleState::default()
        };
        assert!(!member.is_empty(), "a pod member is held");
        member.write(bundle.path()).expect("write");
        assert_eq!(BundleState::read(bundle.path()).expect("read"), member);
        BundleState::default()
            .write(bundle.path())
            .expect("write empty");
        assert!(!bundle.path().join(FILE).exists());
        std::fs::write(bundle.path().join(FILE), b"{garbage").expect("write");
        assert!(BundleState::read(bundle.path()).is_err());
    }

    #[tokio::test]
    async fn releasing_what_is_already_gone_succeeds() {
        let bundle = tempfile::tempdir().expect("temp dir");
        // Nothing mounted there, no sandbox: a daemon that is not even running is not asked.
        let client = client::Client::new(client::Endpoint::Unix(bundle.path().join("nothing")));
        let mut state = BundleState {
            rootfs: Some(bundle.path().join("rootfs")),
            ..BundleState::default()
        };
        state.write(bundle.path()).expect("write");
        release(&client, bundle.path(), &mut state)
            .await
            .expect("released");
        assert!(state.is_empty());
        assert!(!bundle.path().join(FILE).exists());
    }
}
