//! Images as the API shows them: `GET /images`, `POST /images?name=NAME` (the archive is the
//! body), `GET /images/{name}`, `DELETE /images/{name}`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One image a sandbox can be made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ImageInfo {
    /// Its name, as `POST /sandboxes {"image": ...}` gives it.
    pub name: String,
    /// The API key it belongs to (`"unix"` for the Unix socket without a key); the built-in
    /// image belongs to everyone and shows `"*"`.
    pub owner: String,
    /// What it was imported from: `builtin` (the daemon's own busybox image), `oci` (an OCI
    /// layout or archive), `docker_save`, or `rootfs` (a tarball or a directory).
    pub format: String,
    /// Its name inside the archive (`org.opencontainers.image.ref.name`, or `docker save`'s
    /// first tag), if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// Its config's digest (the image id Docker shows), if it had a config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Its layers' digests, bottom first (as uploaded: compressed layers by their compressed
    /// bytes).
    pub layers: Vec<String>,
    /// File content bytes of its unpacked tree.
    pub size_bytes: u64,
    /// Files, directories and links in its unpacked tree.
    pub entries: u64,
    /// Device nodes its layers held that were not created (a sandbox has its own `/dev`).
    pub dropped_devices: u64,
    /// The environment its sandboxes start with (its config's `Env`).
    pub env: BTreeMap<String, String>,
    /// The directory commands run in when a request gives none (its config's `WorkingDir`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Who commands run as (its config's `User`, resolved against its own `/etc/passwd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<ImageUser>,
    /// Its config's `Entrypoint` and `Cmd`, as recorded (nothing runs them: a sandbox runs
    /// what exec asks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    /// See `entrypoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    /// When it was imported, Unix seconds (0 for the built-in image).
    pub imported_at: u64,
}

/// The user an image's commands run as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ImageUser {
    /// The config's `User`, as written (`ci`, `1000:1000`, …).
    pub spec: String,
    /// The user id.
    pub uid: u32,
    /// The primary group id.
    pub gid: u32,
    /// Supplementary group ids.
    pub groups: Vec<u32>,
}

/// The answer to `DELETE /images` (prune).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ImagesPruned {
    /// The names of the images removed.
    pub removed: Vec<String>,
    /// What the store took less on disk afterwards (layers and trees no other image shares).
    pub reclaimed_bytes: u64,
}

/// The body of `GET /images`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ImageList {
    /// The built-in image, then the caller's images (every owner's for the admin key and the
    /// Unix socket), by owner and name.
    pub images: Vec<ImageInfo>,
}
