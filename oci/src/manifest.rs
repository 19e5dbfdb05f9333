//! The JSON documents of an image: OCI's index, manifest and config (image-spec v1), and
//! `docker save`'s `manifest.json`. Only the fields crucible uses are read; unknown ones are
//! ignored, as the spec asks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `application/vnd.oci.image.index.v1+json` (also Docker's manifest list).
pub const MEDIA_INDEX: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
/// An image manifest (OCI or Docker v2 schema 2).
pub const MEDIA_MANIFEST: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// A content descriptor: what a blob is, its digest and size.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Its media type.
    #[serde(default)]
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Its size in bytes.
    #[serde(default)]
    pub size: u64,
    /// The platform, in an index.
    #[serde(default)]
    pub platform: Option<Platform>,
    /// Annotations (`org.opencontainers.image.ref.name` names an image in a layout).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Where a non-distributable layer may be fetched: never, here.
    #[serde(default)]
    pub urls: Vec<String>,
}

/// An index entry's platform.
#[derive(Debug, Clone, Deserialize)]
pub struct Platform {
    /// `amd64`, `arm64`, …
    #[serde(default)]
    pub architecture: String,
    /// `linux`, …
    #[serde(default)]
    pub os: String,
}

/// `index.json`, or an index blob.
#[derive(Debug, Clone, Deserialize)]
pub struct Index {
    /// The manifests (or nested indexes).
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

/// An image manifest.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    /// The config blob.
    pub config: Descriptor,
    /// The layers, bottom first.
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

/// `oci-layout`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Layout {
    /// Must be `1.0.0`.
    pub image_layout_version: String,
}

/// One entry of `docker save`'s `manifest.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DockerEntry {
    /// The config file's path in the archive.
    pub config: String,
    /// The image's tags (`name:tag`).
    #[serde(default)]
    pub repo_tags: Option<Vec<String>>,
    /// The layer files' paths, bottom first.
    pub layers: Vec<String>,
}

/// The image config blob (OCI and Docker share it).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigFile {
    /// `amd64`, …
    #[serde(default)]
    pub architecture: String,
    /// `linux`, …
    #[serde(default)]
    pub os: String,
    /// The run defaults.
    #[serde(default)]
    pub config: Option<RunConfig>,
}

/// What a container of the image runs with, unless told otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    /// `NAME=value` entries.
    #[serde(default)]
    pub env: Option<Vec<String>>,
    /// The working directory.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// `user`, `uid`, `user:group`, `uid:gid`, …
    #[serde(default)]
    pub user: Option<String>,
    /// The default command (kept for `GET /images`; crucible runs what exec asks).
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// The entrypoint (likewise).
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
}
