//! `manifest.json`: what was built, from what, and each artifact's sha256 and size.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::agent::AgentInfo;
use crate::initramfs::Compression;
use crate::kernel::KernelInfo;
use crate::progress::Origin;
use crate::rootfs::RootfsInfo;

/// The manifest's format version; bump on incompatible changes.
pub const FORMAT: u32 = 1;
pub const FILE_NAME: &str = "manifest.json";

#[derive(Debug, Error)]
pub enum ManifestError {
    #[error("{}: {what}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a valid manifest", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// One output file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Artifact {
    /// File name inside the output directory.
    pub file: String,
    pub size: u64,
    pub sha256: String,
    pub origin: Origin,
}

impl Artifact {
    /// Hashes the file at `dir/file`.
    pub fn from_file(dir: &Path, file: &str, origin: Origin) -> Result<Self, ManifestError> {
        let path = dir.join(file);
        let (size, sha256) = sha256_file(&path)?;
        Ok(Artifact {
            file: file.into(),
            size,
            sha256,
            origin,
        })
    }
}

/// The size and sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<(u64, String), ManifestError> {
    let io = |what| {
        let path = path.to_path_buf();
        move |source| ManifestError::Io { path, what, source }
    };
    let mut file = fs::File::open(path).map_err(io("opening"))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io("reading"))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex::encode(hasher.finalize())))
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UserlandInfo {
    pub busybox_package: String,
    pub busybox_version: String,
    pub applets: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct InitramfsInfo {
    pub compression: Compression,
    pub entries: usize,
}

/// The whole manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format: u32,
    /// When this manifest was written (RFC 3339, UTC).
    pub built_at: String,
    /// Wall time of the whole build-image run.
    pub build_seconds: f64,
    pub vmlinux: Option<Artifact>,
    pub initramfs: Artifact,
    pub rootfs: Option<Artifact>,
    pub kernel: Option<KernelInfo>,
    pub agent: AgentInfo,
    pub userland: UserlandInfo,
    pub initramfs_info: InitramfsInfo,
    pub rootfs_info: Option<RootfsInfo>,
}

impl Manifest {
    /// The artifacts that exist, in output order.
    pub fn artifacts(&self) -> Vec<&Artifact> {
        [
            self.vmlinux.as_ref(),
            Some(&self.initramfs),
            self.rootfs.as_ref(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    pub fn write(&self, dir: &Path) -> Result<PathBuf, ManifestError> {
        let path = dir.join(FILE_NAME);
        let json = serde_json::to_string_pretty(self).map_err(|source| ManifestError::Parse {
            path: path.clone(),
            source,
        })?;
        fs::write(&path, json + "\n").map_err(|source| ManifestError::Io {
            path: path.clone(),
            what: "writing",
            source,
        })?;
        Ok(path)
    }

    pub fn read(dir: &Path) -> Result<Self, ManifestError> {
        let path = dir.join(FILE_NAME);
        let text = fs::read_to_string(&path).map_err(|source| ManifestError::Io {
            path: path.clone(),
            what: "reading (run `cargo xtask build-image` first)",
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| ManifestError::Parse { path, source })
    }

    /// Re-hashes every artifact in `dir` and names any that changed since the manifest was
    /// written.
    pub fn verify(&self, dir: &Path) -> Result<Vec<String>, ManifestError> {
        let mut changed = Vec::new();
        for artifact in self.artifacts() {
            let (size, sha256) = sha256_file(&dir.join(&artifact.file))?;
            if size != artifact.size || sha256 != artifact.sha256 {
                changed.push(artifact.file.clone());
            }
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::RECIPE_VERSION;

    fn sample(dir: &Path) -> Manifest {
        fs::write(dir.join("vmlinux"), b"kernel").unwrap();
        fs::write(dir.join("initramfs.cpio"), b"cpio").unwrap();
        Manifest {
            format: FORMAT,
            built_at: "2026-11-30T04:00:00Z".into(),
            build_seconds: 1.5,
            vmlinux: Some(Artifact::from_file(dir, "vmlinux", Origin::Cached).unwrap()),
            initramfs: Artifact::from_file(dir, "initramfs.cpio", Origin::Built).unwrap(),
            rootfs: None,
            kernel: Some(KernelInfo {
                source: "debian:linux-source-6.12".into(),
                source_version: "6.12.117-1~deb12u1".into(),
                release: Some("6.12.117".into()),
                fragment: "microvm-x86_64.config".into(),
                fragment_sha256: "ab".repeat(32),
                config_sha256: Some("cd".repeat(32)),
                recipe_version: RECIPE_VERSION,
                cache_key: Some("0123456789abcdef".into()),
                built_at: "2026-11-30T03:00:00Z".into(),
                build_seconds: 293.0,
            }),
            agent: AgentInfo {
                path: "/t/guest-init".into(),
                source: "guest-init 0.1.0".into(),
                target: "x86_64-unknown-linux-musl".into(),
                size: 1,
                sha256: "ef".repeat(32),
            },
            userland: UserlandInfo {
                busybox_package: "busybox-static".into(),
                busybox_version: "1:1.35.0-4+deb12u1+b1".into(),
                applets: 268,
            },
            initramfs_info: InitramfsInfo {
                compression: Compression::None,
                entries: 290,
            },
            rootfs_info: None,
        }
    }

    #[test]
    fn manifest_records_hashes_sizes_versions_and_round_trips() {
        let dir = std::env::temp_dir().join(format!("crucible-manifest-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let manifest = sample(&dir);
        let vmlinux = manifest.vmlinux.as_ref().unwrap();
        assert_eq!(vmlinux.size, 6);
        assert_eq!(vmlinux.sha256, hex::encode(Sha256::digest(b"kernel")));
        manifest.write(&dir).unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(dir.join(FILE_NAME)).unwrap()).unwrap();
        assert_eq!(json["format"], 1);
        assert_eq!(json["vmlinux"]["origin"], "cached");
        assert_eq!(json["initramfs"]["file"], "initramfs.cpio");
        assert_eq!(json["initramfs"]["size"], 4);
        assert_eq!(json["kernel"]["source_version"], "6.12.117-1~deb12u1");
        assert_eq!(json["kernel"]["fragment_sha256"], "ab".repeat(32));
        assert_eq!(json["kernel"]["recipe_version"], RECIPE_VERSION);
        assert_eq!(json["userland"]["busybox_version"], "1:1.35.0-4+deb12u1+b1");
        assert_eq!(json["initramfs_info"]["compression"], "none");
        assert!(json["rootfs"].is_null());
        assert_eq!(Manifest::read(&dir).unwrap(), manifest);
        assert!(manifest.verify(&dir).unwrap().is_empty());
        fs::write(dir.join("initramfs.cpio"), b"changed").unwrap();
        assert_eq!(manifest.verify(&dir).unwrap(), vec!["initramfs.cpio"]);
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn missing_manifest_error_names_file_and_fix() {
        let err = Manifest::read(Path::new("/nonexistent-dir")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/nonexistent-dir/manifest.json"), "{text}");
        assert!(text.contains("build-image"), "{text}");
    }
}
