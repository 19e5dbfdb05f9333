//! Stand-ins for the images critest pulls, built here and served by a local registry.
//!
//! Nothing upstream can be pulled on the project's machines, so each image critest names
//! (cri-tools v1.26.1's `pkg/framework` and `pkg/validate`) is rebuilt from Debian's packages
//! to do what its specs need of it: the root trees come from `shim/critest/rootfs.sh`, and
//! this file packs them into OCI images (one layout, shared layers) under the names critest
//! uses. The layout is cached in `~/.cache/crucible/critest-images/<key>/`, keyed by a hash
//! of everything it is built from; [`push`] copies it into the run's registry with `skopeo`,
//! and containerd's registry mirrors send critest's pulls there, so the specs' image names
//! stay as they are.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::json;
use xshell::{cmd, Shell};

use super::cri_tools::sha256_of;
use crate::util::workspace_root;

/// A layer of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    /// A tree `rootfs.sh` built (`busybox`, `nginx`, …).
    Tree(&'static str),
    /// One empty file `/<name>`: what upstream's `image-test` Dockerfile adds (`ADD ${TEST}
    /// ${TEST}`), making images of the same base differ.
    Marker(&'static str),
}

/// One image: the references it is pushed under, its layers (bottom first) and its config.
#[derive(Debug)]
struct Image {
    references: &'static [&'static str],
    layers: &'static [Layer],
    cmd: &'static [&'static str],
    entrypoint: &'static [&'static str],
    /// The config's `User` (the image status specs read it back as uid or user name).
    user: &'static str,
}

use Layer::{Marker, Tree};

const BUSYBOX: &[Layer] = &[Tree("busybox")];
const SH: &[&str] = &["sh"];
const NGINX: &[&str] = &["nginx", "-g", "daemon off;"];

/// Every image critest's default specs pull (Linux, amd64), and the pod sandbox image.
/// `test-image-digest` is left out: its spec pins an upstream manifest's digest, which no
/// rebuilt image can have (the spec is skipped for every handler).
const IMAGES: &[Image] = &[
    // The default container image of nearly every spec.
    Image {
        references: &["registry.k8s.io/e2e-test-images/busybox:1.29-2"],
        layers: BUSYBOX,
        cmd: SH,
        entrypoint: &[],
        user: "",
    },
    // Port mapping, port forwarding, the PID namespace specs: nginx as PID 1 ("master
    // process" in its command line), its pid in /var/run/nginx.pid, serving on port 80.
    Image {
        references: &["registry.k8s.io/e2e-test-images/nginx:1.14-2"],
        layers: &[Tree("busybox"), Tree("nginx")],
        cmd: NGINX,
        entrypoint: &[],
        user: "",
    },
    // The multi-container pod: a web server on port 80 whose log says "httpd -D FOREGROUND"
    // (as httpd's own start-up line does).
    Image {
        references: &["registry.k8s.io/e2e-test-images/httpd:2.4.39-4"],
        layers: &[Tree("busybox"), Tree("nginx")],
        cmd: &[
            "sh",
            "-c",
            "echo \"AH00094: Command line: 'httpd -D FOREGROUND'\" >&2; exec nginx -g 'daemon off;'",
        ],
        entrypoint: &[],
        user: "",
    },
    // NoNewPrivs: a setuid-root program run as uid 1000 prints its effective uid.
    Image {
        references: &["registry.k8s.io/e2e-test-images/nonewprivs:1.3"],
        layers: &[Tree("busybox"), Tree("nonewprivs")],
        cmd: &["/usr/local/bin/nonewprivs"],
        entrypoint: &[],
        user: "",
    },
    // The pod sandbox image (containerd's `sandbox_image`).
    Image {
        references: &[super::SANDBOX_IMAGE],
        layers: &[Tree("pause")],
        cmd: &[],
        entrypoint: &["/pause"],
        user: "",
    },
    // Port forwarding in the host network: nginx on port 12003.
    Image {
        references: &["gcr.io/k8s-staging-cri-tools/hostnet-nginx-amd64:latest"],
        layers: &[Tree("busybox"), Tree("nginx"), Tree("hostnet-nginx")],
        cmd: NGINX,
        entrypoint: &[],
        user: "",
    },
    // Image status: the config's user as uid, name, uid:group, name:group.
    Image {
        references: &["gcr.io/k8s-staging-cri-tools/test-image-user-uid:latest"],
        layers: BUSYBOX,
        cmd: SH,
        entrypoint: &[],
        user: "1002",
    },
    Image {
        references: &["gcr.io/k8s-staging-cri-tools/test-image-user-username:latest"],
        layers: BUSYBOX,
        cmd: SH,
        entrypoint: &[],
        user: "www-data",
    },
    Image {
        references: &["gcr.io/k8s-staging-cri-tools/test-image-user-uid-group:latest"],
        layers: BUSYBOX,
        cmd: SH,
        entrypoint: &[],
        user: "1003:1004",
    },
    Image {
        references: &["gcr.io/k8s-staging-cri-tools/test-image-user-username-group:latest"],
        layers: BUSYBOX,
        cmd: SH,
        entrypoint: &[],
        user: "www-data:1004",
    },
    // SupplementalGroups with a group the image defines for its user.
    Image {
        references: &["gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest"],
        layers: &[Tree("busybox"), Tree("predefined-group")],
        cmd: SH,
        entrypoint: &[],
        user: "1000",
    },
    // Image pulls by name, with and without a tag; three names of one image; three images.
    Image {
        references: &["gcr.io/k8s-staging-cri-tools/test-image-latest:latest"],
        layers: &[Tree("busybox"), Marker("test-image-latest")],
        cmd: SH,
        entrypoint: &[],
        user: "",
    },
    Image {
        references: &["gcr.io/k8s-staging-cri-tools/test-image-tag:test"],
        layers: &[Tree("busybox"), Marker("test")],
        cmd: SH,
        entrypoint: &[],
        user: "",
    },
    Image {
        references: &["gcr.io/k8s-staging-cri-tools/test-image-tag:all"],
        layers: &[Tree("busybox"), Marker("all")],
        cmd: SH,
        entrypoint: &[],
        user: "",
    },
    Image {
        references: &[
            "gcr.io/k8s-staging-cri-tools/test-image-tags:1",
            "gcr.io/k8s-staging-cri-tools/test-image-tags:2",
            "gcr.io/k8s-staging-cri-tools/test-image-tags:3",
        ],
        layers: &[Tree("busybox"), Marker("same-image")],
        cmd: SH,
        entrypoint: &[],
        user: "",
    },
    Image {
        references: &["gcr.io/k8s-staging-cri-tools/test-image-1:latest"],
        layers: &[Tree("busybox"), Marker("test-image-1")],
        cmd: SH,
        entrypoint: &[],
        user: "",
    },
    Image {
        references: &["gcr.io/k8s-staging-cri-tools/test-image-2:latest"],
        layers: &[Tree("busybox"), Marker("test-image-2")],
        cmd: SH,
        entrypoint: &[],
        user: "",
    },
    Image {
        references: &["gcr.io/k8s-staging-cri-tools/test-image-3:latest"],
        layers: &[Tree("busybox"), Marker("test-image-3")],
        cmd: SH,
        entrypoint: &[],
        user: "",
    },
];

/// The images whose containers the specs run, pulled before critest starts so that the first
/// handler does not pay for pulls the second gets for free (the image manager's specs pull
/// and remove their own).
pub(crate) const PREPULL: &[&str] = &[
    super::SANDBOX_IMAGE,
    "registry.k8s.io/e2e-test-images/busybox:1.29-2",
    "registry.k8s.io/e2e-test-images/nginx:1.14-2",
    "registry.k8s.io/e2e-test-images/httpd:2.4.39-4",
    "registry.k8s.io/e2e-test-images/nonewprivs:1.3",
    "gcr.io/k8s-staging-cri-tools/hostnet-nginx-amd64:latest",
    "gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest",
];

/// The registry hosts the images' references name, which containerd must mirror.
pub(crate) fn registry_hosts() -> Vec<&'static str> {
    let mut hosts: Vec<&str> = IMAGES
        .iter()
        .flat_map(|i| i.references.iter())
        .filter_map(|r| r.split_once('/').map(|(host, _)| host))
        .collect();
    hosts.sort_unstable();
    hosts.dedup();
    hosts
}

/// Bumped when the layout's format changes, so caches of the old one are not used.
const FORMAT: &str = "critest-images 1";

/// The built images: an OCI layout, and each image's name in it.
#[derive(Debug)]
pub(crate) struct Layout {
    dir: PathBuf,
}

/// The images' layout from the cache, built first if missing (apt's and the build's output
/// go to `log`).
pub(crate) fn obtain(sh: &Shell, cache: &Path, log: &Path) -> Result<Layout> {
    let scripts = workspace_root().join("shim/critest");
    let mut inputs = vec![FORMAT.to_string(), format!("{IMAGES:?}")];
    for file in ["rootfs.sh", "pause.c", "nonewprivs.c"] {
        let path = scripts.join(file);
        inputs.push(
            std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?,
        );
    }
    let key = guest_image::cache::key(&inputs.iter().map(String::as_str).collect::<Vec<_>>());
    let root = cache.join("critest-images");
    let entry = root.join(&key);
    let _lock = guest_image::cache::CacheLock::acquire(&entry, &guest_image::progress::Plain)
        .with_context(|| format!("locking {}", entry.display()))?;
    let layout = Layout {
        dir: entry.join("layout"),
    };
    if entry.join("complete").is_file() {
        eprintln!("    images: cached in {}", entry.display());
        return Ok(layout);
    }
    eprintln!(
        "    images: building {} stand-ins into {} (once for these inputs; log: {})",
        IMAGES.len(),
        entry.display(),
        log.display()
    );
    // Older keys' images only take space (another run's build directory is left alone).
    if let Ok(old) = std::fs::read_dir(&root) {
        for dir in old.flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
            let is_key = dir
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.len() == key.len() && n.chars().all(|c| c.is_ascii_hexdigit()));
            if is_key && dir != entry {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
    if entry.exists() {
        std::fs::remove_dir_all(&entry).with_context(|| format!("clearing {}", entry.display()))?;
    }
    std::fs::create_dir_all(&entry).with_context(|| format!("creating {}", entry.display()))?;
    let work = tempfile::Builder::new()
        .prefix(".build-")
        .tempdir_in(&root)
        .context("creating a build directory for the images")?;
    let debs = download_debs(work.path(), log)?;
    let trees = work.path().join("trees");
    let script = scripts.join("rootfs.sh");
    let (busybox, nginx) = (&debs[0], &debs[1]);
    let out = cmd!(sh, "bash {script} {trees} {busybox} {nginx}")
        .quiet()
        .ignore_status()
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    std::fs::write(
        log.with_extension("rootfs.log"),
        [out.stdout, out.stderr].concat(),
    )?;
    if !out.status.success() {
        bail!(
            "{} failed ({}); its output: {}",
            script.display(),
            out.status,
            log.with_extension("rootfs.log").display()
        );
    }
    write_layout(sh, &trees, &layout.dir)?;
    std::fs::write(entry.join("complete"), key.as_bytes())?;
    Ok(layout)
}

/// `apt-get download busybox nginx` into `dir`: the dynamic busybox and nginx, unpacked by
/// `rootfs.sh`, never installed (`busybox` would replace the host's `busybox-static`, and
/// `nginx` would start a web server on the host). Returns their paths in that order.
fn download_debs(dir: &Path, log: &Path) -> Result<Vec<PathBuf>> {
    let packages = ["busybox", "nginx"];
    let note = |n: &str| eprintln!("    {n}");
    let download = || {
        let mut args = vec!["download"];
        args.extend(packages);
        guest_image::process::run_logged(
            guest_image::apt::apt_get(&args, &note).current_dir(dir),
            log,
        )
    };
    if download().is_err() {
        eprintln!("    apt-get download failed; running apt-get update and retrying");
        guest_image::process::run_logged(&mut guest_image::apt::apt_get(&["update"], &note), log)
            .with_context(|| format!("apt-get update (log: {})", log.display()))?;
        download().with_context(|| {
            format!(
                "apt-get download {} (log: {})",
                packages.join(" "),
                log.display()
            )
        })?;
    }
    packages
        .iter()
        .map(|p| {
            let prefix = format!("{p}_");
            std::fs::read_dir(dir)?
                .flatten()
                .map(|e| e.path())
                .find(|path| {
                    path.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
                })
                .with_context(|| format!("apt-get download left no {p}_*.deb in {}", dir.display()))
        })
        .collect()
}

/// The name of image `index` in the layout (`org.opencontainers.image.ref.name`).
fn ref_name(index: usize) -> String {
    format!("image-{index:02}")
}

/// A blob in the layout: its digest and size.
#[derive(Debug, Clone)]
struct Blob {
    digest: String,
    size: u64,
}

/// Stores `bytes` as a blob of the layout at `dir`.
fn put_blob(dir: &Path, bytes: &[u8]) -> Result<Blob> {
    use sha2::{Digest, Sha256};
    let hex = hex::encode(Sha256::digest(bytes));
    let path = dir.join("blobs/sha256").join(&hex);
    std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    Ok(Blob {
        digest: format!("sha256:{hex}"),
        size: bytes.len() as u64,
    })
}

/// Packs each image of [`IMAGES`] from the trees under `trees` into the OCI layout `dir`.
fn write_layout(sh: &Shell, trees: &Path, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("blobs/sha256"))
        .with_context(|| format!("creating {}", dir.display()))?;
    // Each layer is packed once, however many images share it.
    let mut layers: BTreeMap<Layer, Blob> = BTreeMap::new();
    let mut manifests = Vec::new();
    for (index, image) in IMAGES.iter().enumerate() {
        let mut blobs = Vec::new();
        for layer in image.layers {
            if !layers.contains_key(layer) {
                let blob = pack_layer(sh, trees, dir, *layer)?;
                layers.insert(*layer, blob);
            }
            if let Some(blob) = layers.get(layer) {
                blobs.push(blob.clone());
            }
        }
        let mut config = serde_json::Map::new();
        config.insert(
            "Env".into(),
            json!(["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]),
        );
        if !image.cmd.is_empty() {
            config.insert("Cmd".into(), json!(image.cmd));
        }
        if !image.entrypoint.is_empty() {
            config.insert("Entrypoint".into(), json!(image.entrypoint));
        }
        if !image.user.is_empty() {
            config.insert("User".into(), json!(image.user));
        }
        let config = json!({
            "created": "1970-01-01T00:00:00Z",
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            // Layers are stored uncompressed: each diff id is its blob's digest.
            "rootfs": {
                "type": "layers",
                "diff_ids": blobs.iter().map(|b| b.digest.clone()).collect::<Vec<_>>(),
            },
        });
        let config = put_blob(dir, &serde_json::to_vec(&config)?)?;
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config.digest,
                "size": config.size,
            },
            "layers": blobs.iter().map(|b| json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": b.digest,
                "size": b.size,
            })).collect::<Vec<_>>(),
        });
        let manifest = put_blob(dir, &serde_json::to_vec(&manifest)?)?;
        manifests.push(json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest.digest,
            "size": manifest.size,
            "annotations": { "org.opencontainers.image.ref.name": ref_name(index) },
        }));
    }
    let index = json!({ "schemaVersion": 2, "manifests": manifests });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(())
}

/// Packs one layer as an uncompressed tar blob. GNU tar keeps the trees' hard links (every
/// busybox applet is one), owners and modes (the setuid bit included); names sorted and
/// times zeroed, so the same tree always gives the same digest.
fn pack_layer(sh: &Shell, trees: &Path, dir: &Path, layer: Layer) -> Result<Blob> {
    let source = match layer {
        Tree(name) => trees.join(name),
        Marker(name) => {
            let tree = trees.join(format!(".marker-{name}"));
            std::fs::create_dir_all(&tree)?;
            std::fs::write(tree.join(name), b"")?;
            tree
        }
    };
    if !source.is_dir() {
        bail!(
            "{} is missing: rootfs.sh did not build it",
            source.display()
        );
    }
    let tar = dir.join("layer.tar");
    cmd!(
        sh,
        "tar --create --file {tar} --directory {source} --numeric-owner --sort=name --mtime=@0 ."
    )
    .quiet()
    .run()
    .with_context(|| format!("packing the layer {layer:?}"))?;
    let hex = sha256_of(&tar)?;
    let size = std::fs::metadata(&tar)?.len();
    let path = dir.join("blobs/sha256").join(&hex);
    std::fs::rename(&tar, &path)
        .with_context(|| format!("moving {} to {}", tar.display(), path.display()))?;
    Ok(Blob {
        digest: format!("sha256:{hex}"),
        size,
    })
}

/// Copies every image into the registry at `registry` (`127.0.0.1:PORT`, plain HTTP) under
/// its references' paths (the host left out: the mirrors add it back).
pub(crate) fn push(layout: &Layout, registry: &str, log: &Path) -> Result<()> {
    for (index, image) in IMAGES.iter().enumerate() {
        for reference in image.references {
            let (_, path) = reference
                .split_once('/')
                .with_context(|| format!("{reference} names no registry host"))?;
            let from = format!("oci:{}:{}", layout.dir.display(), ref_name(index));
            let to = format!("docker://{registry}/{path}");
            // why std::process::Command: run_logged takes one (output to the log file).
            // --insecure-policy: no signature policy applies to copying our own images into our
            // own registry (a host may have no /etc/containers/policy.json at all).
            let mut copy = Command::new("skopeo");
            copy.args([
                "--insecure-policy",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
            ])
            .arg(&from)
            .arg(&to);
            guest_image::process::run_logged(&mut copy, log).with_context(|| {
                format!(
                    "skopeo copy {from} {to} (pushing {reference}; log: {})",
                    log.display()
                )
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_image_has_a_host_and_a_tag_and_no_reference_repeats() {
        let mut seen = std::collections::BTreeSet::new();
        for image in IMAGES {
            for r in image.references {
                let (host, path) = r.split_once('/').expect("a host");
                assert!(host.contains('.'), "{r}: no registry host");
                assert!(path.contains(':'), "{r}: no tag");
                assert!(seen.insert(*r), "{r} twice");
            }
        }
        assert_eq!(registry_hosts(), ["gcr.io", "registry.k8s.io"]);
    }

    #[test]
    fn every_prepulled_image_is_built() {
        for r in PREPULL {
            assert!(
                IMAGES.iter().any(|i| i.references.contains(r)),
                "{r} is not built"
            );
        }
    }
}
