//! Builds crucible's guest image.
//!
//! [`ImageBuilder`] produces, in one output directory:
//! - `vmlinux`: the guest kernel (optional: the namespace backend needs none), built from
//!   Debian's `linux-source-6.12` with `tinyconfig` + [`kconfig::FRAGMENT`], cached outside the
//!   checkout ([`cache::Cache`]);
//! - `initramfs.cpio`: the agent as `/init` plus busybox, deterministic ([`initramfs`]);
//! - `rootfs.ext4`: optional ([`rootfs`]);
//! - `manifest.json`: every artifact's sha256 and size and where it came from ([`manifest`]).
//!
//! Progress goes through the [`Progress`] trait so `cargo xtask build-image` and the CLI can
//! show it their own way. [`smoke`] boots the result under QEMU and checks the agent.

// Tests may unwrap: a panic there is a test failure with a backtrace.
#![cfg_attr(test, allow(clippy::unwrap_used))]

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

pub mod agent;
pub mod apt;
pub mod cache;
pub mod deps;
pub mod elf;
pub mod initramfs;
pub mod kconfig;
pub mod kernel;
pub mod manifest;
pub mod process;
pub mod progress;
pub mod rootfs;
pub mod smoke;
mod time;

pub use agent::{AgentInfo, AgentSource};
pub use cache::Cache;
pub use initramfs::{Compression, Tree};
pub use kernel::{KernelOptions, KernelSource};
pub use manifest::Manifest;
pub use progress::{Origin, Progress};
pub use rootfs::RootfsSource;

pub const VMLINUX: &str = "vmlinux";
pub const INITRAMFS: &str = "initramfs.cpio";
pub const INITRAMFS_GZ: &str = "initramfs.cpio.gz";
pub const ROOTFS: &str = "rootfs.ext4";
/// The same tree as the initramfs, unpacked: the root the namespace backend runs in.
pub const ROOT_TREE: &str = "rootfs";

#[derive(Debug, Error)]
pub enum Error {
    #[error("kernel")]
    Kernel(#[from] kernel::KernelError),
    #[error("guest agent")]
    Agent(#[from] agent::AgentError),
    #[error("initramfs")]
    Initramfs(#[from] initramfs::InitramfsError),
    #[error("rootfs")]
    Rootfs(#[from] rootfs::RootfsError),
    #[error("manifest")]
    Manifest(#[from] manifest::ManifestError),
    #[error("{}: {what}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Everything [`ImageBuilder`] needs to know.
#[derive(Debug, Clone)]
pub struct ImageOptions {
    /// Output directory (created).
    pub out: PathBuf,
    /// The kernel, or `None` to build only the initramfs (and rootfs).
    pub kernel: Option<KernelSource>,
    pub agent: AgentSource,
    pub rootfs: Option<RootfsSource>,
    pub compression: Compression,
    /// Rebuild the kernel and the rootfs tree even when cached.
    pub force: bool,
    /// `make -j` for the kernel (default: all CPUs).
    pub jobs: Option<usize>,
    pub cache: Cache,
}

impl ImageOptions {
    /// Defaults: Debian kernel, the agent built from `workspace`, no rootfs, uncompressed.
    pub fn new(out: PathBuf, workspace: PathBuf) -> Self {
        ImageOptions {
            out,
            kernel: Some(KernelSource::Debian),
            agent: AgentSource::Build { workspace },
            rootfs: None,
            compression: Compression::None,
            force: false,
            jobs: None,
            cache: Cache::default_location(),
        }
    }

    /// Where build logs go: `<out>/logs/`.
    pub fn log_dir(&self) -> PathBuf {
        self.out.join("logs")
    }
}

/// Builds the image described by [`ImageOptions`].
#[derive(Debug, Clone)]
pub struct ImageBuilder {
    opts: ImageOptions,
}

/// Runs `f` as one progress phase.
fn phase<T, E>(
    progress: &dyn Progress,
    name: &str,
    f: impl FnOnce() -> Result<(T, String), E>,
) -> Result<T, E> {
    let started = Instant::now();
    progress.phase_started(name);
    match f() {
        Ok((value, detail)) => {
            progress.phase_finished(name, started.elapsed(), &detail);
            Ok(value)
        }
        Err(e) => {
            progress.phase_failed(name, started.elapsed());
            Err(e)
        }
    }
}

fn io_err(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { path, what, source }
}

impl ImageBuilder {
    pub fn new(opts: ImageOptions) -> Self {
        ImageBuilder { opts }
    }

    pub fn options(&self) -> &ImageOptions {
        &self.opts
    }

    /// Builds every artifact and writes `manifest.json`; returns the manifest.
    pub fn build(&self, progress: &dyn Progress) -> Result<Manifest, Error> {
        let started = Instant::now();
        let opts = &self.opts;
        let out = &opts.out;
        let logs = opts.log_dir();
        fs::create_dir_all(&logs).map_err(io_err(&logs, "creating"))?;

        let kernel = match &opts.kernel {
            None => {
                remove_if_exists(&out.join(VMLINUX))?;
                None
            }
            Some(source) => Some(phase(progress, "kernel", || {
                let kopts = KernelOptions {
                    source: source.clone(),
                    force: opts.force,
                    jobs: opts.jobs,
                };
                let k = kernel::obtain(&kopts, &opts.cache, &logs, progress)?;
                let dest = out.join(VMLINUX);
                copy_if_changed(&k.vmlinux, &dest)?;
                let detail = match k.origin {
                    Origin::Cached => format!(
                        "cached ({})",
                        k.info.cache_key.as_deref().unwrap_or("no key")
                    ),
                    Origin::Built => format!("built {}", k.info.release.as_deref().unwrap_or("")),
                };
                Ok::<_, Error>((k, detail))
            })?),
        };

        let agent = phase(progress, "agent", || {
            let a = agent::obtain(&opts.agent, &logs, progress)?;
            let detail = format!(
                "{} for {}, static, {}",
                a.source,
                a.target,
                progress::format_size(a.size)
            );
            Ok::<_, Error>((a, detail))
        })?;

        let (busybox, tree_len, initramfs_file) = phase(progress, "initramfs", || {
            let busybox = initramfs::busybox(&logs, progress)?;
            let tree = initramfs::userland(&agent.path, &busybox)?;
            let (file, other) = match opts.compression {
                Compression::None => (INITRAMFS, INITRAMFS_GZ),
                Compression::Gzip => (INITRAMFS_GZ, INITRAMFS),
            };
            remove_if_exists(&out.join(other))?;
            initramfs::write_cpio_file(&tree, &out.join(file), opts.compression)?;
            write_root_tree(&tree, &out.join(ROOT_TREE))?;
            let detail = format!(
                "{} entries, busybox {} with {} applets",
                tree.len(),
                busybox.version,
                busybox.applets.len()
            );
            Ok::<_, Error>(((busybox, tree.len(), file), detail))
        })?;

        let rootfs = match &opts.rootfs {
            None => {
                remove_if_exists(&out.join(ROOTFS))?;
                None
            }
            Some(source) => Some(phase(progress, "rootfs", || {
                let info = rootfs::build(
                    source,
                    &out.join(ROOTFS),
                    &opts.cache,
                    opts.force,
                    &logs,
                    progress,
                )?;
                let detail = format!("{} (tree {})", info.source, info.tree_origin.as_str());
                Ok::<_, Error>((info, detail))
            })?),
        };

        let manifest = phase(progress, "manifest", || {
            let vmlinux = kernel
                .as_ref()
                .map(|k| manifest::Artifact::from_file(out, VMLINUX, k.origin))
                .transpose()?;
            let rootfs_artifact = rootfs
                .as_ref()
                .map(|_| manifest::Artifact::from_file(out, ROOTFS, Origin::Built))
                .transpose()?;
            let m = Manifest {
                format: manifest::FORMAT,
                built_at: time::now_rfc3339(),
                build_seconds: round_ms(started.elapsed()),
                vmlinux,
                initramfs: manifest::Artifact::from_file(out, initramfs_file, Origin::Built)?,
                rootfs: rootfs_artifact,
                kernel: kernel.map(|k| k.info),
                agent,
                userland: manifest::UserlandInfo {
                    busybox_package: initramfs::BUSYBOX_PACKAGE.into(),
                    busybox_version: busybox.version.clone(),
                    applets: busybox.applets.len(),
                },
                initramfs_info: manifest::InitramfsInfo {
                    compression: opts.compression,
                    entries: tree_len,
                },
                rootfs_info: rootfs,
            };
            let path = m.write(out)?;
            Ok::<_, Error>((m, path.display().to_string()))
        })?;
        Ok(manifest)
    }
}

/// Writes the guest userland (busybox + applet links + `agent` at `/init`) into `dir`, the same
/// tree the initramfs holds, for the namespace backend. Installs busybox-static when missing.
pub fn write_userland_dir(
    agent: &Path,
    dir: &Path,
    logs: &Path,
    progress: &dyn Progress,
) -> Result<Tree, Error> {
    let busybox = initramfs::busybox(logs, progress)?;
    let tree = initramfs::userland(agent, &busybox)?;
    initramfs::write_dir(&tree, dir)?;
    Ok(tree)
}

/// Replaces `dir` with the unpacked `tree`: built beside it, then renamed into place, so a
/// reader never sees half a tree.
fn write_root_tree(tree: &Tree, dir: &Path) -> Result<(), Error> {
    let staging = dir.with_extension("new");
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(io_err(&staging, "removing a stale staging tree"))?;
    }
    initramfs::write_dir(tree, &staging)?;
    if dir.exists() {
        let old = dir.with_extension("old");
        if old.exists() {
            fs::remove_dir_all(&old).map_err(io_err(&old, "removing an old tree"))?;
        }
        fs::rename(dir, &old).map_err(io_err(dir, "moving the previous tree aside"))?;
        fs::rename(&staging, dir).map_err(io_err(dir, "moving the tree into place"))?;
        fs::remove_dir_all(&old).map_err(io_err(&old, "removing the previous tree"))?;
    } else {
        fs::rename(&staging, dir).map_err(io_err(dir, "moving the tree into place"))?;
    }
    Ok(())
}

fn round_ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

fn remove_if_exists(path: &Path) -> Result<(), Error> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(path, "removing a stale artifact")(e)),
    }
}

/// Copies `from` to `to` unless `to` already has the same size and contents hash.
fn copy_if_changed(from: &Path, to: &Path) -> Result<(), Error> {
    if let (Ok(a), Ok(b)) = (manifest::sha256_file(from), manifest::sha256_file(to)) {
        if a == b {
            return Ok(());
        }
    }
    let tmp = to.with_extension("tmp");
    fs::copy(from, &tmp).map_err(io_err(from, "copying"))?;
    fs::rename(&tmp, to).map_err(io_err(to, "renaming into place"))
}
