//! What an uploaded archive is, and which layers and config it holds: an OCI image layout (as
//! a tar: an OCI archive, or a layout directory the CLI tarred), a `docker save` archive, or a
//! plain rootfs tarball (one layer).

use std::io::Read;

use serde::Serialize;

use crate::archive::{ArchiveError, ArchiveIndex};
use crate::digest::{BadDigest, Digest};
use crate::manifest::{
    ConfigFile, Descriptor, DockerEntry, Index, Layout, Manifest, RunConfig, MEDIA_INDEX,
    MEDIA_MANIFEST,
};

/// Largest JSON document (index, manifest, config) read from an archive.
const MAX_DOCUMENT: u64 = 4 * 1024 * 1024;
/// Deepest nesting of indexes followed.
const MAX_INDEX_DEPTH: usize = 4;
/// Most layers an image may have (Docker's own limit is 127).
pub const MAX_LAYERS: usize = 256;

/// What kind of archive an image came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// An OCI image layout (`oci-layout`, `index.json`, `blobs/`).
    Oci,
    /// A `docker save` archive (`manifest.json` and layer tarballs).
    DockerSave,
    /// A tarball of a root filesystem (or a directory, tarred by the CLI).
    Rootfs,
}

/// Why an archive is not an image crucible can use.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The archive could not be read.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// A JSON document is malformed.
    #[error("{what} is not valid")]
    Json {
        /// Which document.
        what: String,
        /// The parser's complaint.
        source: serde_json::Error,
    },
    /// A digest is not sha256.
    #[error(transparent)]
    Digest(#[from] BadDigest),
    /// A blob's content does not match its digest.
    #[error("blob {expected} has digest {actual}: the archive is corrupt or was tampered with")]
    DigestMismatch {
        /// What the manifest says.
        expected: Digest,
        /// What the bytes hash to.
        actual: Digest,
    },
    /// The archive does not say which image to use.
    #[error("{0}")]
    Ambiguous(String),
    /// It is not an image this host can run.
    #[error("{0}")]
    Unsupported(String),
}

/// Where one layer's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerBlob {
    /// A member of the archive, with the digest its manifest gives (OCI) or none (`docker save`
    /// names layers by path; the store hashes them).
    Member {
        /// Its path in the archive.
        path: String,
        /// Its expected digest.
        digest: Option<Digest>,
    },
    /// The whole uploaded file (a rootfs tarball).
    Whole,
}

/// An image found in an archive: its layers, bottom first, and its run config.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The archive's format.
    pub format: Format,
    /// The layers, bottom first.
    pub layers: Vec<LayerBlob>,
    /// The run defaults (none for a rootfs tarball).
    pub run_config: RunConfig,
    /// The image's own name in the archive (`org.opencontainers.image.ref.name`, or the first
    /// of `docker save`'s `RepoTags`), if it has one.
    pub reference: Option<String>,
    /// The config's digest, the image's id as Docker shows it (none for a rootfs tarball).
    pub config_digest: Option<Digest>,
}

impl Plan {
    /// The plan for a plain rootfs tarball: one layer, no config.
    pub fn rootfs() -> Plan {
        Plan {
            format: Format::Rootfs,
            layers: vec![LayerBlob::Whole],
            run_config: RunConfig::default(),
            reference: None,
            config_digest: None,
        }
    }
}

/// Whether the indexed archive is an image archive (OCI or `docker save`) rather than a rootfs.
pub fn is_image_archive(index: &ArchiveIndex) -> bool {
    (index.contains("oci-layout") && index.contains("index.json"))
        || index.contains("manifest.json")
}

/// The image in the archive `index`: an OCI layout when it has `oci-layout` and `index.json`
/// (Docker 25's `docker save` writes both formats; OCI's is read), else `docker save`'s
/// `manifest.json`, else the archive is a rootfs tarball.
pub fn plan(index: &ArchiveIndex) -> Result<Plan, SourceError> {
    if index.contains("oci-layout") && index.contains("index.json") {
        oci(index)
    } else if index.contains("manifest.json") {
        docker(index)
    } else {
        Ok(Plan::rootfs())
    }
}

fn json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, SourceError> {
    serde_json::from_slice(bytes).map_err(|source| SourceError::Json {
        what: what.to_string(),
        source,
    })
}

/// A blob of the layout, read whole and checked against its digest.
fn blob(index: &ArchiveIndex, descriptor: &Descriptor) -> Result<Vec<u8>, SourceError> {
    let digest = Digest::parse(&descriptor.digest)?;
    let bytes = index.read_small(&format!("blobs/sha256/{}", digest.hex()), MAX_DOCUMENT)?;
    let actual = Digest::of(&bytes);
    if actual != digest {
        return Err(SourceError::DigestMismatch {
            expected: digest,
            actual,
        });
    }
    Ok(bytes)
}

fn oci(index: &ArchiveIndex) -> Result<Plan, SourceError> {
    let layout: Layout = json(&index.read_small("oci-layout", MAX_DOCUMENT)?, "oci-layout")?;
    if layout.image_layout_version != "1.0.0" {
        return Err(SourceError::Unsupported(format!(
            "oci-layout says imageLayoutVersion {:?}; only 1.0.0 is known",
            layout.image_layout_version
        )));
    }
    let top: Index = json(&index.read_small("index.json", MAX_DOCUMENT)?, "index.json")?;
    let mut chosen = choose(&top, "index.json")?;
    let mut reference = chosen
        .annotations
        .get("org.opencontainers.image.ref.name")
        .cloned();
    for depth in 0.. {
        if !MEDIA_INDEX.contains(&chosen.media_type.as_str()) {
            break;
        }
        if depth == MAX_INDEX_DEPTH {
            return Err(SourceError::Unsupported(format!(
                "indexes nested more than {MAX_INDEX_DEPTH} deep"
            )));
        }
        let what = format!("index {}", chosen.digest);
        let nested: Index = json(&blob(index, &chosen)?, &what)?;
        chosen = choose(&nested, &what)?;
        if reference.is_none() {
            reference = chosen
                .annotations
                .get("org.opencontainers.image.ref.name")
                .cloned();
        }
    }
    let what = format!("manifest {}", chosen.digest);
    let manifest: Manifest = json(&blob(index, &chosen)?, &what)?;
    let config_digest = Digest::parse(&manifest.config.digest)?;
    let config: ConfigFile = json(
        &blob(index, &manifest.config)?,
        &format!("config {config_digest}"),
    )?;
    check_platform(&config)?;
    if manifest.layers.len() > MAX_LAYERS {
        return Err(SourceError::Unsupported(format!(
            "the image has {} layers; at most {MAX_LAYERS} are accepted",
            manifest.layers.len()
        )));
    }
    let layers = manifest
        .layers
        .iter()
        .map(|layer| {
            let digest = Digest::parse(&layer.digest)?;
            let path = format!("blobs/sha256/{}", digest.hex());
            if !index.contains(&path) {
                let foreign = if layer.urls.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (a non-distributable layer, from {})",
                        layer.urls.join(", ")
                    )
                };
                return Err(SourceError::Unsupported(format!(
                    "layer {digest}{foreign} is not in the archive"
                )));
            }
            Ok(LayerBlob::Member {
                path,
                digest: Some(digest),
            })
        })
        .collect::<Result<_, SourceError>>()?;
    Ok(Plan {
        format: Format::Oci,
        layers,
        run_config: config.config.unwrap_or_default(),
        reference,
        config_digest: Some(config_digest),
    })
}

/// The one image an index describes: its only manifest, or its only `linux/amd64` one.
fn choose(index: &Index, what: &str) -> Result<Descriptor, SourceError> {
    let images: Vec<&Descriptor> = index
        .manifests
        .iter()
        .filter(|d| {
            d.media_type.is_empty()
                || MEDIA_MANIFEST.contains(&d.media_type.as_str())
                || MEDIA_INDEX.contains(&d.media_type.as_str())
        })
        .collect();
    let for_us: Vec<&Descriptor> = images
        .iter()
        .copied()
        .filter(|d| {
            d.platform
                .as_ref()
                .is_none_or(|p| p.os == "linux" && p.architecture == "amd64")
        })
        .collect();
    match for_us.as_slice() {
        [one] => Ok((*one).clone()),
        [] if images.is_empty() => Err(SourceError::Unsupported(format!(
            "{what} lists no image manifest"
        ))),
        [] => Err(SourceError::Unsupported(format!(
            "{what} has no linux/amd64 image (platforms: {})",
            images
                .iter()
                .filter_map(|d| d.platform.as_ref())
                .map(|p| format!("{}/{}", p.os, p.architecture))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        many => Err(SourceError::Ambiguous(format!(
            "{what} holds {} images ({}); import an archive of one image",
            many.len(),
            many.iter()
                .map(|d| {
                    d.annotations
                        .get("org.opencontainers.image.ref.name")
                        .cloned()
                        .unwrap_or_else(|| d.digest.clone())
                })
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

fn check_platform(config: &ConfigFile) -> Result<(), SourceError> {
    if !config.os.is_empty() && config.os != "linux" {
        return Err(SourceError::Unsupported(format!(
            "the image is for {:?}; crucible runs linux images",
            config.os
        )));
    }
    if !config.architecture.is_empty() && config.architecture != "amd64" {
        return Err(SourceError::Unsupported(format!(
            "the image is for {}; this host runs amd64",
            config.architecture
        )));
    }
    Ok(())
}

fn docker(index: &ArchiveIndex) -> Result<Plan, SourceError> {
    let entries: Vec<DockerEntry> = json(
        &index.read_small("manifest.json", MAX_DOCUMENT)?,
        "manifest.json",
    )?;
    let entry = match entries.as_slice() {
        [one] => one,
        [] => {
            return Err(SourceError::Unsupported(
                "manifest.json lists no image".into(),
            ))
        }
        many => {
            return Err(SourceError::Ambiguous(format!(
                "the archive holds {} images ({}); docker save one image at a time",
                many.len(),
                many.iter()
                    .map(|e| e.repo_tags.clone().unwrap_or_default().join(" "))
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    };
    let mut config_bytes = Vec::new();
    index
        .open(&entry.config)?
        .take(MAX_DOCUMENT + 1)
        .read_to_end(&mut config_bytes)
        .map_err(ArchiveError::Io)?;
    let config: ConfigFile = json(&config_bytes, &entry.config)?;
    check_platform(&config)?;
    if entry.layers.len() > MAX_LAYERS {
        return Err(SourceError::Unsupported(format!(
            "the image has {} layers; at most {MAX_LAYERS} are accepted",
            entry.layers.len()
        )));
    }
    let layers = entry
        .layers
        .iter()
        .map(|path| {
            index.size(path)?;
            Ok(LayerBlob::Member {
                path: path.clone(),
                digest: None,
            })
        })
        .collect::<Result<_, SourceError>>()?;
    Ok(Plan {
        format: Format::DockerSave,
        layers,
        run_config: config.config.unwrap_or_default(),
        reference: entry
            .repo_tags
            .as_ref()
            .and_then(|tags| tags.first().cloned()),
        config_digest: Some(Digest::of(&config_bytes)),
    })
}
