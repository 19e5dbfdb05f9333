//! The container's root filesystem as a crucible image.
//!
//! containerd hands a v2 shim the rootfs as mounts (an overlay of committed layer directories
//! under the container's own empty upper directory, or a bind mount). The shim mounts them at
//! `bundle/rootfs`, as runc's shim does, tars that tree into the daemon as an image, and
//! unmounts it: the sandbox runs on the daemon's copy. An image made from committed layers
//! only is named after those layers, so every later container of the same image on this node
//! reuses it instead of importing again.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use containerd_shim::protos::api::Mount;
use sha2::{Digest, Sha256};

use crate::error::ShimError;

/// Where the shim mounts the rootfs, inside the bundle (as runc's shim does).
pub(crate) const ROOTFS_DIR: &str = "rootfs";
/// Every image the shim makes starts with this, so an operator can tell them apart.
pub const IMAGE_PREFIX: &str = "containerd-";

/// The read-only layer directories a rootfs is made of, top first, and the container's own
/// writable directory on top of them, when the mounts are that simple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layers {
    /// The committed layers (overlay `lowerdir=`, top first; or a read-only bind's source).
    pub lower: Vec<PathBuf>,
    /// The container's writable layer (`upperdir=`), if any.
    pub upper: Option<PathBuf>,
}

/// The layers of `mounts` when they are one overlay (or one read-only bind) of absolute
/// directories; `None` for anything else (several mounts, other filesystems, relative paths),
/// which then gets an image of its own.
pub(crate) fn layers(mounts: &[Mount]) -> Option<Layers> {
    let [mount] = mounts else {
        return None;
    };
    let absolute = |p: &str| Some(PathBuf::from(p)).filter(|p| p.is_absolute());
    match mount.type_.as_str() {
        "overlay" => {
            let option = |key: &str| {
                mount
                    .options
                    .iter()
                    .find_map(|o| o.strip_prefix(key)?.strip_prefix('='))
            };
            let lower = option("lowerdir")?
                .split(':')
                .map(absolute)
                .collect::<Option<Vec<_>>>()?;
            let upper = match option("upperdir") {
                Some(dir) => Some(absolute(dir)?),
                None => None,
            };
            (!lower.is_empty()).then_some(Layers { lower, upper })
        }
        "bind" | "rbind" if mount.options.iter().any(|o| o == "ro") => Some(Layers {
            lower: vec![absolute(&mount.source)?],
            upper: None,
        }),
        _ => None,
    }
}

/// The image name for layers known by `identities` (one line per layer, top first):
/// `containerd-` and 32 hex digits of their SHA-256.
pub(crate) fn image_name(identities: &[String]) -> String {
    let mut hash = Sha256::new();
    for identity in identities {
        hash.update(identity.as_bytes());
        hash.update(b"\n");
    }
    let digest = hex::encode(hash.finalize());
    format!("{IMAGE_PREFIX}{}", &digest[..32])
}

/// A layer directory's identity: its path, plus the inode and change time of the directory, so
/// that a snapshot directory removed and made again under the same path (containerd's
/// snapshot ids restart after its state is wiped) is another image, never a stale one.
fn layer_identity(dir: &Path) -> Result<String, ShimError> {
    let meta = std::fs::metadata(dir)
        .map_err(|e| ShimError::io(format!("reading layer {}", dir.display()), e))?;
    Ok(format!(
        "{}\0{}:{}:{}.{}",
        dir.display(),
        meta.dev(),
        meta.ino(),
        meta.ctime(),
        meta.ctime_nsec()
    ))
}

/// Which image a container's rootfs becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ImageChoice {
    /// The image's name in the daemon.
    pub name: String,
    /// Whether other containers may share it (made of committed layers only): then it is kept
    /// when the container goes; otherwise it is the container's and removed with it.
    pub shared: bool,
}

/// The image for a container with these rootfs mounts. A container whose writable layer
/// already holds files (a restarted container's snapshot) gets an image of its own, as does
/// anything [`layers`] does not understand.
pub(crate) fn choose_image(
    mounts: &[Mount],
    namespace: &str,
    id: &str,
) -> Result<ImageChoice, ShimError> {
    if let Some(layers) = layers(mounts) {
        let upper_empty = match &layers.upper {
            None => true,
            Some(upper) => std::fs::read_dir(upper)
                .map_err(|e| ShimError::io(format!("reading {}", upper.display()), e))?
                .next()
                .is_none(),
        };
        if upper_empty {
            let identities = layers
                .lower
                .iter()
                .map(|dir| layer_identity(dir))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(ImageChoice {
                name: image_name(&identities),
                shared: true,
            });
        }
    }
    Ok(ImageChoice {
        name: image_name(&[format!("container\0{namespace}\0{id}")]),
        shared: false,
    })
}

/// Mounts `mounts` in order at `target` (created `0711`, as runc's shim does).
pub(crate) async fn mount(mounts: &[Mount], target: &Path) -> Result<(), ShimError> {
    containerd_shim::util::mkdir(target, 0o711)
        .await
        .map_err(|e| ShimError::shim(format!("creating {}", target.display()), e))?;
    for m in mounts {
        containerd_shim::util::mount_rootfs(m, target)
            .await
            .map_err(|e| {
                ShimError::shim(
                    format!(
                        "mounting {} ({}) at {}",
                        m.source,
                        m.type_,
                        target.display()
                    ),
                    e,
                )
            })?;
    }
    Ok(())
}

/// Unmounts everything at and below `target`; nothing mounted there is fine.
pub(crate) async fn unmount(target: &Path) -> Result<(), ShimError> {
    let path = target
        .to_str()
        .ok_or_else(|| ShimError::Invalid(format!("{} is not UTF-8", target.display())))?
        .to_string();
    let context = format!("unmounting {path}");
    tokio::task::spawn_blocking(move || containerd_shim::mount::umount_recursive(Some(&path), 0))
        .await
        .map_err(|e| ShimError::io(context.clone(), std::io::Error::other(e)))?
        .map_err(|e| ShimError::shim(context, e))
}

/// Streams the tree at `dir` to the daemon as image `name` (a rootfs tarball: owners, modes,
/// links kept; device nodes and sockets left out, a sandbox has its own `/dev`).
pub(crate) async fn import(
    client: &client::Client,
    name: &str,
    dir: &Path,
) -> Result<(), ShimError> {
    let (writer, reader) = tokio::io::duplex(256 * 1024);
    let root = dir.to_path_buf();
    let tarring = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut bridge = tokio_util::io::SyncIoBridge::new(writer);
        let mut tar = tar::Builder::new(&mut bridge);
        tar.follow_symlinks(false);
        oci::write::append_tree(&mut tar, &root)?;
        tar.finish()?;
        drop(tar);
        std::io::Write::flush(&mut bridge)?;
        bridge.shutdown()
    });
    // The daemon's answer first: a refusal stops it reading, and the tar then fails with a
    // broken pipe that says nothing about why.
    let imported = client.import_image(name, reader).await;
    let tarred = tarring.await;
    imported?;
    match tarred {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(ShimError::io(format!("tarring {}", dir.display()), e)),
        Err(e) => Err(ShimError::io(
            format!("tarring {}", dir.display()),
            std::io::Error::other(e),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay(options: &[&str]) -> Mount {
        Mount {
            type_: "overlay".into(),
            source: "overlay".into(),
            options: options.iter().map(|o| o.to_string()).collect(),
            ..Mount::default()
        }
    }

    #[test]
    fn an_overlay_gives_its_lower_layers_top_first_and_its_upper() {
        let m = overlay(&[
            "index=off",
            "workdir=/c/snapshots/9/work",
            "upperdir=/c/snapshots/9/fs",
            "lowerdir=/c/snapshots/2/fs:/c/snapshots/1/fs",
        ]);
        assert_eq!(
            layers(&[m]),
            Some(Layers {
                lower: vec!["/c/snapshots/2/fs".into(), "/c/snapshots/1/fs".into()],
                upper: Some("/c/snapshots/9/fs".into()),
            })
        );
    }

    #[test]
    fn only_simple_absolute_rootfs_mounts_are_shared() {
        let relative = overlay(&["lowerdir=1/fs:2/fs", "upperdir=/u"]);
        assert_eq!(layers(&[relative]), None);
        let no_lower = overlay(&["upperdir=/u"]);
        assert_eq!(layers(&[no_lower]), None);
        let rw_bind = Mount {
            type_: "bind".into(),
            source: "/c/snapshots/3/fs".into(),
            options: vec!["rbind".into(), "rw".into()],
            ..Mount::default()
        };
        assert_eq!(layers(std::slice::from_ref(&rw_bind)), None);
        let ro_bind = Mount {
            options: vec!["rbind".into(), "ro".into()],
            ..rw_bind.clone()
        };
        assert_eq!(
            layers(&[ro_bind]).map(|l| l.lower),
            Some(vec![PathBuf::from("/c/snapshots/3/fs")])
        );
        assert_eq!(layers(&[]), None);
        assert_eq!(layers(&[rw_bind.clone(), rw_bind]), None);
    }

    #[test]
    fn image_names_are_stable_valid_and_differ_per_layer_chain() {
        let a = image_name(&["/l/2\0x".into(), "/l/1\0y".into()]);
        assert_eq!(a, image_name(&["/l/2\0x".into(), "/l/1\0y".into()]));
        assert_ne!(a, image_name(&["/l/1\0y".into(), "/l/2\0x".into()]));
        assert_ne!(a, image_name(&["/l/2\0x".into()]));
        assert!(a.starts_with(IMAGE_PREFIX));
        assert_eq!(a.len(), IMAGE_PREFIX.len() + 32);
        assert!(a[IMAGE_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn a_recreated_layer_directory_is_another_image() {
        let dir = tempfile::tempdir().expect("temp dir");
        let layer = dir.path().join("fs");
        std::fs::create_dir(&layer).expect("mkdir");
        let mounts = [overlay(&[&format!("lowerdir={}", layer.display())])];
        let first = choose_image(&mounts, "default", "c1").expect("an image");
        assert!(first.shared);
        assert_eq!(
            first,
            choose_image(&mounts, "default", "c2").expect("an image"),
            "two containers of the same layers share one image"
        );
        std::fs::remove_dir(&layer).expect("rmdir");
        // A different inode (or change time): never mistaken for the old layer.
        let filler = dir.path().join("filler");
        std::fs::create_dir(&filler).expect("mkdir");
        std::fs::create_dir(&layer).expect("mkdir");
        let second = choose_image(&mounts, "default", "c1").expect("an image");
        assert_ne!(first.name, second.name);
    }

    #[test]
    fn a_container_whose_upper_layer_has_files_gets_its_own_image() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
        std::fs::create_dir(&lower).expect("mkdir");
        std::fs::create_dir(&upper).expect("mkdir");
        let mounts = [overlay(&[
            &format!("upperdir={}", upper.display()),
            &format!("lowerdir={}", lower.display()),
        ])];
        assert!(choose_image(&mounts, "ns", "c").expect("an image").shared);
        std::fs::write(upper.join("written"), b"x").expect("write");
        let own = choose_image(&mounts, "ns", "c").expect("an image");
        assert!(!own.shared);
        assert_ne!(
            own.name,
            choose_image(&mounts, "ns", "d").expect("image").name
        );
        assert_eq!(own, choose_image(&[], "ns", "c").expect("an image"));
    }
}
