//! Writing images: a layer from a directory or from parts, and an image as an OCI layout, an
//! OCI archive or a `docker save` archive. The CLI tars directories with it, and tests build
//! their inputs with it (no registry is reachable from CI).

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use serde_json::json;

use crate::compression::Compression;
use crate::digest::Digest;
use crate::manifest::RunConfig;

/// A layer being built in memory, entry by entry.
pub struct LayerBuilder {
    builder: tar::Builder<Vec<u8>>,
}

impl std::fmt::Debug for LayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerBuilder").finish_non_exhaustive()
    }
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

impl LayerBuilder {
    /// An empty layer.
    pub fn new() -> Self {
        LayerBuilder {
            builder: tar::Builder::new(Vec::new()),
        }
    }

    /// A regular file.
    pub fn file(mut self, path: &str, mode: u32, data: &[u8]) -> io::Result<Self> {
        let mut h = header(tar::EntryType::Regular, mode, data.len() as u64);
        self.builder.append_data(&mut h, path, data)?;
        Ok(self)
    }

    /// A directory.
    pub fn dir(mut self, path: &str, mode: u32) -> io::Result<Self> {
        let mut h = header(tar::EntryType::Directory, mode, 0);
        self.builder.append_data(&mut h, path, io::empty())?;
        Ok(self)
    }

    /// A symlink.
    pub fn symlink(mut self, path: &str, target: &str) -> io::Result<Self> {
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        self.builder.append_link(&mut h, path, target)?;
        Ok(self)
    }

    /// A whiteout: `path` is deleted from the layers below.
    pub fn whiteout(self, path: &str) -> io::Result<Self> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let entry = if dir.is_empty() {
            format!(".wh.{name}")
        } else {
            format!("{dir}/.wh.{name}")
        };
        self.file(&entry, 0o644, b"")
    }

    /// An opaque marker: `dir`'s contents from the layers below are hidden.
    pub fn opaque(self, dir: &str) -> io::Result<Self> {
        self.file(
            &format!("{}/.wh..wh..opq", dir.trim_end_matches('/')),
            0o644,
            b"",
        )
    }

    /// The layer's tar bytes.
    pub fn finish(self) -> io::Result<Vec<u8>> {
        self.builder.into_inner()
    }
}

/// What [`append_tree`] left out.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TreeSkipped {
    /// Device nodes (an image's `/dev` is the sandbox's own).
    pub devices: u64,
    /// Sockets.
    pub sockets: u64,
}

/// Appends the tree at `dir` to `builder` as a root filesystem (paths relative to `dir`),
/// keeping owners, modes, times and symlinks as they are (never followed); device nodes and
/// sockets are left out and counted.
pub fn append_tree<W: Write>(builder: &mut tar::Builder<W>, dir: &Path) -> io::Result<TreeSkipped> {
    builder.follow_symlinks(false);
    let mut skipped = TreeSkipped::default();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        let mut entries = fs::read_dir(&current)?.collect::<Result<Vec<_>, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let meta = fs::symlink_metadata(&path)?;
            let relative = path
                .strip_prefix(dir)
                .map_err(|e| io::Error::other(format!("{}: {e}", path.display())))?;
            let kind = meta.file_type();
            if kind.is_char_device() || kind.is_block_device() {
                skipped.devices += 1;
                continue;
            }
            if kind.is_socket() {
                skipped.sockets += 1;
                continue;
            }
            let mut h = tar::Header::new_gnu();
            h.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
            h.set_uid(u64::from(meta.uid()));
            h.set_gid(u64::from(meta.gid()));
            if kind.is_symlink() {
                let target = fs::read_link(&path)?;
                builder.append_link(&mut h, relative, target)?;
            } else if kind.is_file() {
                builder.append_data(&mut h, relative, File::open(&path)?)?;
            } else if kind.is_dir() {
                h.set_size(0);
                builder.append_data(&mut h, relative, io::empty())?;
                stack.push(path);
            } else {
                // FIFOs.
                h.set_size(0);
                builder.append_data(&mut h, relative, io::empty())?;
            }
        }
    }
    Ok(skipped)
}

/// An image to write: its layers (plain tar bytes, bottom first) and config.
#[derive(Debug, Clone, Default)]
pub struct ImageParts {
    /// The layers' tar bytes.
    pub layers: Vec<Vec<u8>>,
    /// The run config.
    pub config: RunConfig,
    /// The name it carries (`org.opencontainers.image.ref.name` / `RepoTags`).
    pub reference: Option<String>,
    /// How OCI layers are compressed (`docker save` layers never are).
    pub compression: Compression,
}

/// `layer` compressed as `compression` says, with the OCI media type that names it.
fn compressed_layer(layer: &[u8], compression: Compression) -> io::Result<(Vec<u8>, &'static str)> {
    Ok(match compression {
        Compression::None => (layer.to_vec(), "application/vnd.oci.image.layer.v1.tar"),
        Compression::Gzip => {
            let mut out = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            out.write_all(layer)?;
            (out.finish()?, "application/vnd.oci.image.layer.v1.tar+gzip")
        }
        Compression::Zstd => (
            ruzstd::encoding::compress_to_vec(layer, ruzstd::encoding::CompressionLevel::Fastest),
            "application/vnd.oci.image.layer.v1.tar+zstd",
        ),
    })
}

fn config_json(parts: &ImageParts) -> io::Result<Vec<u8>> {
    let diff_ids: Vec<String> = parts
        .layers
        .iter()
        .map(|l| Digest::of(l).to_string())
        .collect();
    serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": parts.config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .map_err(io::Error::other)
}

/// The files of an OCI image layout for `parts`, by path.
fn oci_files(parts: &ImageParts) -> io::Result<Vec<(String, Vec<u8>)>> {
    let mut files = vec![(
        "oci-layout".to_string(),
        br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
    )];
    let mut blob = |bytes: Vec<u8>| {
        let digest = Digest::of(&bytes);
        let size = bytes.len();
        files.push((format!("blobs/sha256/{}", digest.hex()), bytes));
        (digest.to_string(), size)
    };
    let (config_digest, config_size) = blob(config_json(parts)?);
    let mut layers = Vec::new();
    for layer in &parts.layers {
        let (bytes, media) = compressed_layer(layer, parts.compression)?;
        let (digest, size) = blob(bytes);
        layers.push(json!({"mediaType": media, "digest": digest, "size": size}));
    }
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": layers,
    }))
    .map_err(io::Error::other)?;
    let (manifest_digest, manifest_size) = blob(manifest);
    let mut descriptor = json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": manifest_digest, "size": manifest_size,
        "platform": {"architecture": "amd64", "os": "linux"},
    });
    if let Some(reference) = &parts.reference {
        descriptor["annotations"] = json!({"org.opencontainers.image.ref.name": reference});
    }
    let index = serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [descriptor]}))
        .map_err(io::Error::other)?;
    files.push(("index.json".to_string(), index));
    Ok(files)
}

/// Writes `parts` as an OCI image layout directory at `dir`.
pub fn oci_layout(dir: &Path, parts: &ImageParts) -> io::Result<()> {
    for (path, bytes) in oci_files(parts)? {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, bytes)?;
    }
    Ok(())
}

fn tar_of(files: Vec<(String, Vec<u8>)>, out: &Path) -> io::Result<()> {
    let mut builder = tar::Builder::new(io::BufWriter::new(File::create(out)?));
    for (path, bytes) in files {
        let mut h = header(tar::EntryType::Regular, 0o644, bytes.len() as u64);
        builder.append_data(&mut h, path, bytes.as_slice())?;
    }
    builder.into_inner()?.flush()
}

/// Writes `parts` as an OCI archive (a tar of the layout) at `out`.
pub fn oci_archive(out: &Path, parts: &ImageParts) -> io::Result<()> {
    tar_of(oci_files(parts)?, out)
}

/// Writes `parts` as a `docker save` archive at `out` (Docker's pre-25 layout: `manifest.json`,
/// the config as `<id>.json`, each layer as `<diff id>/layer.tar`).
pub fn docker_archive(out: &Path, parts: &ImageParts) -> io::Result<()> {
    let config = config_json(parts)?;
    let config_name = format!("{}.json", Digest::of(&config).hex());
    let mut files = vec![(config_name.clone(), config)];
    let mut layer_paths = Vec::new();
    for layer in &parts.layers {
        let path = format!("{}/layer.tar", Digest::of(layer).hex());
        layer_paths.push(path.clone());
        files.push((path, layer.clone()));
    }
    let tags: Vec<&String> = parts.reference.iter().collect();
    let manifest = serde_json::to_vec(&json!([
        {"Config": config_name, "RepoTags": tags, "Layers": layer_paths}
    ]))
    .map_err(io::Error::other)?;
    files.push(("manifest.json".to_string(), manifest));
    tar_of(files, out)
}
