//! The guest kernel: configure (tinyconfig + our fragment), verify, build `vmlinux`, cache it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::cache::{self, Cache, CacheLock};
use crate::deps::{self, DepsError};
use crate::elf::{self, ElfError};
use crate::kconfig::{self, KconfigError, FRAGMENT, FRAGMENT_NAME};
use crate::process::{self, CommandError};
use crate::progress::{Origin, Progress};

/// Bump when the build recipe (commands, flags, config assembly) changes: invalidates every
/// cached kernel.
pub const RECIPE_VERSION: u32 = 1;
/// Debian's kernel source package used by default.
pub const DEBIAN_SOURCE_PACKAGE: &str = "linux-source-6.12";
/// The tarball that package installs.
pub const DEBIAN_SOURCE_TARBALL: &str = "/usr/src/linux-source-6.12.tar.xz";
/// Debian packages needed to build a kernel.
pub const BUILD_PACKAGES: &[&str] = &[
    "build-essential",
    "bc",
    "bison",
    "flex",
    "libelf-dev",
    "libssl-dev",
    "xz-utils",
];

#[derive(Debug, Error)]
pub enum KernelError {
    #[error(transparent)]
    Deps(#[from] DepsError),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    Config(#[from] KconfigError),
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error("{}: {what}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: no such kernel source tree (no Makefile)", path.display())]
    NoSourceTree { path: PathBuf },
    #[error("{} does not exist", path.display())]
    NoKernel { path: PathBuf },
    #[error(
        "{}: has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY); is it an uncompressed vmlinux \
         built with CONFIG_PVH=y?",
        path.display()
    )]
    NotPvh { path: PathBuf },
    #[error("{}: not an x86_64 ELF (e_machine {machine})", path.display())]
    WrongMachine { path: PathBuf, machine: u16 },
    #[error("could not parse {}", path.display())]
    BadInfo {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

fn io_err(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> KernelError {
    let path = path.to_path_buf();
    move |source| KernelError::Io { path, what, source }
}

/// Where the kernel comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelSource {
    /// Debian's `linux-source-6.12` tarball, installed with apt when missing.
    Debian,
    /// A kernel source tree on disk (built out of tree; the tree is not modified).
    Tree(PathBuf),
    /// A ready `vmlinux` (checked for the PVH note, not built).
    Prebuilt(PathBuf),
}

/// How to get the kernel.
#[derive(Debug, Clone)]
pub struct KernelOptions {
    pub source: KernelSource,
    /// Ignore the cache and build from scratch.
    pub force: bool,
    /// `make -j`; default: the number of CPUs.
    pub jobs: Option<usize>,
}

/// A finished kernel, as recorded in the cache (`kernel.json`) and the manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KernelInfo {
    /// `debian:linux-source-6.12`, `tree:/path`, or `file:/path`.
    pub source: String,
    /// The source package version (Debian), `make kernelversion` (tree), or `unknown` (file).
    pub source_version: String,
    /// The kernel release string (`uname -r` in the guest), where known.
    pub release: Option<String>,
    pub fragment: String,
    pub fragment_sha256: String,
    /// sha256 of the final `.config` the kernel was built with.
    pub config_sha256: Option<String>,
    pub recipe_version: u32,
    pub cache_key: Option<String>,
    pub built_at: String,
    pub build_seconds: f64,
}

/// The result of [`obtain`]: where the vmlinux is and how it came to be.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub vmlinux: PathBuf,
    pub info: KernelInfo,
    pub origin: Origin,
    /// The build log, when this run built the kernel.
    pub log: Option<PathBuf>,
}

/// sha256 of the checked-in fragment.
pub fn fragment_sha256() -> String {
    hex::encode(Sha256::digest(FRAGMENT.as_bytes()))
}

/// Gets the kernel: from the cache when its key matches, else builds it. `logs` is the directory
/// for `kernel-build.log` (and apt's log).
pub fn obtain(
    opts: &KernelOptions,
    cache: &Cache,
    logs: &Path,
    progress: &dyn Progress,
) -> Result<Kernel, KernelError> {
    match &opts.source {
        KernelSource::Prebuilt(path) => prebuilt(path),
        KernelSource::Debian => {
            let apt_log = logs.join("apt.log");
            deps::ensure(
                &[DEBIAN_SOURCE_PACKAGE],
                "the kernel source",
                &apt_log,
                progress,
            )?;
            let version =
                deps::installed_version(DEBIAN_SOURCE_PACKAGE).unwrap_or_else(|| "unknown".into());
            let source = format!("debian:{DEBIAN_SOURCE_PACKAGE}");
            let key = cache::key(&[
                &format!("recipe={RECIPE_VERSION}"),
                &format!("source={source}"),
                &format!("version={version}"),
                &format!("fragment={}", fragment_sha256()),
            ]);
            let _lock = lock(cache, &key, progress)?;
            if let Some(hit) = lookup(cache, &key, opts.force)? {
                return Ok(hit);
            }
            deps::ensure(BUILD_PACKAGES, "building the kernel", &apt_log, progress)?;
            let tree = extract_debian(cache, &version, logs, progress)?;
            build(opts, cache, &key, &tree, source, version, logs, progress)
        }
        KernelSource::Tree(dir) => {
            if !dir.join("Makefile").is_file() {
                return Err(KernelError::NoSourceTree { path: dir.clone() });
            }
            let dir = fs::canonicalize(dir).map_err(io_err(dir, "resolving the source tree"))?;
            let version = process::output(
                Command::new("make")
                    .arg("-s")
                    .arg("-C")
                    .arg(&dir)
                    .arg("kernelversion"),
            )?
            .trim()
            .to_string();
            let source = format!("tree:{}", dir.display());
            let key = cache::key(&[
                &format!("recipe={RECIPE_VERSION}"),
                &format!("source={source}"),
                &format!("version={version}"),
                &format!("fragment={}", fragment_sha256()),
            ]);
            let _lock = lock(cache, &key, progress)?;
            if let Some(hit) = lookup(cache, &key, opts.force)? {
                return Ok(hit);
            }
            deps::ensure(
                BUILD_PACKAGES,
                "building the kernel",
                &logs.join("apt.log"),
                progress,
            )?;
            build(opts, cache, &key, &dir, source, version, logs, progress)
        }
    }
}

/// Serializes builds of one kernel key across processes sharing the cache.
fn lock(cache: &Cache, key: &str, progress: &dyn Progress) -> Result<CacheLock, KernelError> {
    let entry = cache.kernel_dir(key);
    CacheLock::acquire(&entry, progress).map_err(io_err(&entry, "locking the cache entry"))
}

fn prebuilt(path: &Path) -> Result<Kernel, KernelError> {
    if !path.is_file() {
        return Err(KernelError::NoKernel {
            path: path.to_path_buf(),
        });
    }
    check_vmlinux(path)?;
    Ok(Kernel {
        vmlinux: path.to_path_buf(),
        info: KernelInfo {
            source: format!("file:{}", path.display()),
            source_version: "unknown".into(),
            release: None,
            fragment: FRAGMENT_NAME.into(),
            fragment_sha256: fragment_sha256(),
            config_sha256: None,
            recipe_version: RECIPE_VERSION,
            cache_key: None,
            built_at: crate::time::now_rfc3339(),
            build_seconds: 0.0,
        },
        origin: Origin::Built,
        log: None,
    })
}

/// Checks that `path` is an x86_64 ELF with the PVH entry note.
pub fn check_vmlinux(path: &Path) -> Result<(), KernelError> {
    let info = elf::inspect_file(path)?;
    if info.machine != 62 {
        return Err(KernelError::WrongMachine {
            path: path.to_path_buf(),
            machine: info.machine,
        });
    }
    if !info.pvh_entry {
        return Err(KernelError::NotPvh {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

fn lookup(cache: &Cache, key: &str, force: bool) -> Result<Option<Kernel>, KernelError> {
    let dir = cache.kernel_dir(key);
    let vmlinux = dir.join("vmlinux");
    let info_path = dir.join("kernel.json");
    if force || !vmlinux.is_file() || !info_path.is_file() {
        return Ok(None);
    }
    let text = fs::read_to_string(&info_path).map_err(io_err(&info_path, "reading"))?;
    let info = serde_json::from_str(&text).map_err(|source| KernelError::BadInfo {
        path: info_path.clone(),
        source,
    })?;
    Ok(Some(Kernel {
        vmlinux,
        info,
        origin: Origin::Cached,
        log: None,
    }))
}

/// Extracts the Debian tarball once per package version into the cache.
fn extract_debian(
    cache: &Cache,
    version: &str,
    logs: &Path,
    progress: &dyn Progress,
) -> Result<PathBuf, KernelError> {
    let dir = cache.kernel_src_dir(&format!(
        "{DEBIAN_SOURCE_PACKAGE}_{}",
        cache::path_component(version)
    ));
    let tree = dir.join(DEBIAN_SOURCE_PACKAGE);
    let marker = dir.join(".crucible-extracted");
    let _lock = CacheLock::acquire(&dir, progress).map_err(io_err(&dir, "locking"))?;
    if marker.is_file() && tree.join("Makefile").is_file() {
        return Ok(tree);
    }
    progress.status(&format!(
        "extracting {DEBIAN_SOURCE_TARBALL} into {}",
        dir.display()
    ));
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(io_err(&dir, "removing a partial extraction"))?;
    }
    fs::create_dir_all(&dir).map_err(io_err(&dir, "creating"))?;
    process::run_logged(
        Command::new("tar")
            .arg("-xJf")
            .arg(DEBIAN_SOURCE_TARBALL)
            .arg("-C")
            .arg(&dir),
        &logs.join("kernel-extract.log"),
    )?;
    if !tree.join("Makefile").is_file() {
        return Err(KernelError::NoSourceTree { path: tree });
    }
    fs::write(&marker, version).map_err(io_err(&marker, "writing"))?;
    Ok(tree)
}

/// The KCONFIG_ALLCONFIG text: what `make tinyconfig` merges, then our fragment (which wins).
pub fn allconfig(tree: &Path) -> Result<String, KernelError> {
    let mut text = String::new();
    for part in [
        "kernel/configs/tiny-base.config",
        "kernel/configs/tiny.config",
        "arch/x86/configs/tiny.config",
    ] {
        let path = tree.join(part);
        let part_text = fs::read_to_string(&path).map_err(io_err(&path, "reading"))?;
        text.push_str(&format!("# --- {part} ---\n{part_text}\n"));
    }
    text.push_str(&format!("# --- {FRAGMENT_NAME} ---\n{FRAGMENT}"));
    Ok(text)
}

#[allow(clippy::too_many_arguments)]
fn build(
    opts: &KernelOptions,
    cache: &Cache,
    key: &str,
    tree: &Path,
    source: String,
    source_version: String,
    logs: &Path,
    progress: &dyn Progress,
) -> Result<Kernel, KernelError> {
    let started = Instant::now();
    let out = cache.kernel_build_dir(key);
    if out.exists() {
        fs::remove_dir_all(&out).map_err(io_err(&out, "removing an old build directory"))?;
    }
    fs::create_dir_all(&out).map_err(io_err(&out, "creating"))?;
    let log = logs.join("kernel-build.log");
    let _ = fs::remove_file(&log);
    let allconfig_path = out.join("crucible.allconfig");
    fs::write(&allconfig_path, allconfig(tree)?).map_err(io_err(&allconfig_path, "writing"))?;

    let make = |args: &[&str]| {
        let mut cmd = Command::new("make");
        cmd.arg("-C")
            .arg(tree)
            .arg(format!("O={}", out.display()))
            .arg("ARCH=x86_64")
            .args(args);
        cmd
    };
    progress.status(&format!(
        "configuring (tinyconfig + {FRAGMENT_NAME}); log: {}",
        log.display()
    ));
    let mut configure = make(&["allnoconfig"]);
    configure.env("KCONFIG_ALLCONFIG", &allconfig_path);
    process::run_logged(&mut configure, &log)?;
    let config_path = out.join(".config");
    let config = fs::read_to_string(&config_path).map_err(io_err(&config_path, "reading"))?;
    kconfig::verify(FRAGMENT_NAME, FRAGMENT, &config)?;

    let jobs = opts.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    progress.status(&format!(
        "make -j{jobs} vmlinux (a few minutes); log: {}",
        log.display()
    ));
    process::run_logged(&mut make(&[&format!("-j{jobs}"), "vmlinux"]), &log)?;
    let built = out.join("vmlinux");
    check_vmlinux(&built)?;
    let release_path = out.join("include/config/kernel.release");
    let release = fs::read_to_string(&release_path)
        .ok()
        .map(|s| s.trim().to_string());

    let info = KernelInfo {
        source,
        source_version,
        release,
        fragment: FRAGMENT_NAME.into(),
        fragment_sha256: fragment_sha256(),
        config_sha256: Some(hex::encode(Sha256::digest(config.as_bytes()))),
        recipe_version: RECIPE_VERSION,
        cache_key: Some(key.to_string()),
        built_at: crate::time::now_rfc3339(),
        build_seconds: started.elapsed().as_secs_f64(),
    };
    // Publish atomically: fill a temporary directory, then rename it into place.
    let dir = cache.kernel_dir(key);
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io_err(&tmp, "removing"))?;
    }
    fs::create_dir_all(&tmp).map_err(io_err(&tmp, "creating"))?;
    fs::copy(&built, tmp.join("vmlinux")).map_err(io_err(&built, "copying into the cache"))?;
    fs::write(tmp.join("config"), &config).map_err(io_err(&tmp, "writing config"))?;
    let json = serde_json::to_string_pretty(&info).map_err(|source| KernelError::BadInfo {
        path: tmp.join("kernel.json"),
        source,
    })?;
    fs::write(tmp.join("kernel.json"), json + "\n").map_err(io_err(&tmp, "writing kernel.json"))?;
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(io_err(&dir, "replacing"))?;
    }
    fs::rename(&tmp, &dir).map_err(io_err(&dir, "publishing into the cache"))?;
    // The object tree is large and useless once the kernel is cached.
    let _ = fs::remove_dir_all(&out);
    Ok(Kernel {
        vmlinux: dir.join("vmlinux"),
        info,
        origin: Origin::Built,
        log: Some(log),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_tree(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("crucible-ktree-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (file, text) in [
            ("kernel/configs/tiny-base.config", "CONFIG_EXPERT=y\n"),
            ("kernel/configs/tiny.config", "CONFIG_KERNEL_XZ=y\n"),
            ("arch/x86/configs/tiny.config", "CONFIG_NOHIGHMEM=y\n"),
        ] {
            let path = dir.join(file);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        dir
    }

    #[test]
    fn allconfig_is_tinyconfig_fragments_then_ours_last() {
        let tree = fake_tree("allconfig");
        let text = allconfig(&tree).unwrap();
        let expert = text.find("CONFIG_EXPERT=y").unwrap();
        let xz = text.find("CONFIG_KERNEL_XZ=y").unwrap();
        let nohighmem = text.find("CONFIG_NOHIGHMEM=y").unwrap();
        let ours = text.find("CONFIG_PVH=y").unwrap();
        assert!(expert < xz && xz < nohighmem && nohighmem < ours);
        let _ = fs::remove_dir_all(tree);
    }

    #[test]
    fn allconfig_names_a_missing_tinyconfig_fragment() {
        let tree = fake_tree("missing");
        fs::remove_file(tree.join("arch/x86/configs/tiny.config")).unwrap();
        let err = allconfig(&tree).unwrap_err().to_string();
        assert!(err.contains("arch/x86/configs/tiny.config"), "{err}");
        let _ = fs::remove_dir_all(tree);
    }

    #[test]
    fn cache_hit_needs_vmlinux_and_info_and_no_force() {
        let root = std::env::temp_dir().join(format!("crucible-kcache-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let cache = Cache::at(&root);
        assert!(lookup(&cache, "k1", false).unwrap().is_none());
        let dir = cache.kernel_dir("k1");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("vmlinux"), b"elf").unwrap();
        let info = KernelInfo {
            source: "debian:linux-source-6.12".into(),
            source_version: "6.12.117-1~deb12u1".into(),
            release: Some("6.12.117".into()),
            fragment: FRAGMENT_NAME.into(),
            fragment_sha256: fragment_sha256(),
            config_sha256: None,
            recipe_version: RECIPE_VERSION,
            cache_key: Some("k1".into()),
            built_at: "2026-11-30T00:00:00Z".into(),
            build_seconds: 293.0,
        };
        fs::write(
            dir.join("kernel.json"),
            serde_json::to_string(&info).unwrap(),
        )
        .unwrap();
        let hit = lookup(&cache, "k1", false).unwrap().unwrap();
        assert_eq!(hit.origin, Origin::Cached);
        assert_eq!(hit.info, info);
        assert!(
            lookup(&cache, "k1", true).unwrap().is_none(),
            "--force bypasses the cache"
        );
        fs::write(dir.join("kernel.json"), "{").unwrap();
        assert!(matches!(
            lookup(&cache, "k1", false),
            Err(KernelError::BadInfo { .. })
        ));
        let _ = fs::remove_dir_all(root);
    }

    #[test]
    fn prebuilt_kernel_without_pvh_note_is_rejected() {
        let me = std::env::current_exe().unwrap();
        assert!(matches!(prebuilt(&me), Err(KernelError::NotPvh { .. })));
        assert!(matches!(
            prebuilt(Path::new("/nonexistent/vmlinux")),
            Err(KernelError::NoKernel { .. })
        ));
    }
}
