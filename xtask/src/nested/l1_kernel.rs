//! L1's kernel: Debian's stock `linux-image-amd64`, whose KVM is a module (`kvm_amd`), fetched
//! with `apt-get download` once into the cache and unpacked there with `dpkg-deb`. Nothing is
//! installed on the host. The modules L1 needs are picked with their dependencies, read from
//! each module's `.modinfo`, so they load in order with busybox `insmod`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

/// The metapackage that names Debian's current kernel.
const META_PACKAGE: &str = "linux-image-amd64";

/// A Debian kernel unpacked in the cache.
#[derive(Debug, Clone)]
pub(crate) struct L1Kernel {
    /// The package and version, e.g. `linux-image-6.1.0-57-amd64_6.1.192-3`.
    pub name: String,
    /// The compressed kernel QEMU boots.
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>`.
    pub modules: PathBuf,
}

/// The kernel in `cache` (`~/.cache/crucible/nested`), fetched and unpacked first if needed;
/// apt's output goes to `log`.
pub(super) fn obtain(sh: &Shell, cache: &Path, log: &Path) -> Result<L1Kernel> {
    let package = match resolve_package(sh, log) {
        Ok(p) => p,
        // Offline, say: a kernel fetched before still serves.
        Err(e) => match cached(cache)? {
            Some(k) => {
                eprintln!(
                    "    note: cannot ask apt for {META_PACKAGE} ({e:#}); using {}",
                    k.name
                );
                return Ok(k);
            }
            None => return Err(e),
        },
    };
    if let Some(k) = cached(cache)?.filter(|k| k.name.starts_with(&format!("{package}_"))) {
        return Ok(k);
    }
    fetch(cache, &package, log)
}

/// The kernel package `linux-image-amd64` depends on (`linux-image-6.1.0-57-amd64`); runs
/// `apt-get update` once if apt does not know it.
fn resolve_package(sh: &Shell, log: &Path) -> Result<String> {
    let ask = || -> Option<String> {
        // Whatever its status, what it printed is searched (as before the move to xshell).
        let out = cmd!(sh, "apt-cache depends --important {META_PACKAGE}")
            .ignore_status()
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
            l.trim()
                .strip_prefix("Depends: ")
                .filter(|p| p.starts_with("linux-image-"))
                .map(|p| p.trim().to_string())
        })
    };
    if let Some(p) = ask() {
        return Ok(p);
    }
    eprintln!("    apt does not know {META_PACKAGE}: running apt-get update");
    // why std::process::Command: guest_image::process::run_logged (another crate) takes one,
    // to send its output to the log file, which xshell cannot do.
    guest_image::process::run_logged(&mut apt_get(&["update"]), log)
        .with_context(|| format!("apt-get update (log: {})", log.display()))?;
    ask().with_context(|| format!("apt-cache depends {META_PACKAGE} names no linux-image package"))
}

/// `apt-get ARGS` as every apt-get of the project runs (waiting for a lock another apt
/// holds); says so on stderr when one is held now. (why std::process::Command: run_logged
/// takes one.)
fn apt_get(args: &[&str]) -> Command {
    guest_image::apt::apt_get(args, &|note| eprintln!("    {note}"))
}

/// The most recently unpacked kernel in `cache`, if any.
fn cached(cache: &Path) -> Result<Option<L1Kernel>> {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return Ok(None);
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        if dir.join("complete").is_file() {
            let modified = entry.metadata().and_then(|m| m.modified()).ok();
            found.push((modified, dir));
        }
    }
    found.sort();
    match found.pop() {
        Some((_, dir)) => unpacked(&dir).map(Some),
        None => Ok(None),
    }
}

/// The kernel unpacked in `dir`.
fn unpacked(dir: &Path) -> Result<L1Kernel> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let root = dir.join("root");
    let vmlinuz = only_entry(&root.join("boot"), "vmlinuz-")?;
    let modules = only_entry(&root.join("lib/modules"), "")
        .or_else(|_| only_entry(&root.join("usr/lib/modules"), ""))?;
    Ok(L1Kernel {
        name,
        vmlinuz,
        modules,
    })
}

fn only_entry(dir: &Path, prefix: &str) -> Result<PathBuf> {
    let mut hits: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    match hits.len() {
        1 => Ok(hits.remove(0)),
        n => bail!(
            "{} holds {n} entries starting {prefix:?}, expected one",
            dir.display()
        ),
    }
}

/// `apt-get download` + `dpkg-deb -x` into a fresh directory, renamed into place when complete.
fn fetch(cache: &Path, package: &str, log: &Path) -> Result<L1Kernel> {
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let work = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(cache)
        .context("creating a download directory")?;
    eprintln!(
        "    fetching {package} with apt-get download (once; cached in {})",
        cache.display()
    );
    // why std::process::Command: run_logged takes one (output to the log file).
    guest_image::process::run_logged(
        apt_get(&["download", package]).current_dir(work.path()),
        log,
    )
    .with_context(|| format!("apt-get download {package} (log: {})", log.display()))?;
    let deb = only_entry(work.path(), package)?;
    let stem = deb
        .file_stem()
        .map(|s| s.to_string_lossy().replace("_amd64", ""))
        .context("the downloaded package has no name")?;
    // why std::process::Command: run_logged takes one (output to the log file).
    guest_image::process::run_logged(
        Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(work.path().join("root")),
        log,
    )
    .with_context(|| format!("dpkg-deb -x {} (log: {})", deb.display(), log.display()))?;
    std::fs::remove_file(&deb).with_context(|| format!("removing {}", deb.display()))?;
    std::fs::write(work.path().join("complete"), b"")?;
    let dir = cache.join(&stem);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("replacing {}", dir.display()))?;
    }
    let work = work.keep();
    std::fs::rename(&work, &dir)
        .with_context(|| format!("moving {} to {}", work.display(), dir.display()))?;
    unpacked(&dir)
}

/// The modules under `modules` (`lib/modules/<release>`) by name (`kvm_amd`), from their
/// file names (`kvm-amd.ko`).
fn index(modules: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![modules.join("kernel")];
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                if let Some(stem) = name.strip_suffix(".ko") {
                    found.insert(stem.replace('-', "_"), path.clone());
                }
            }
        }
    }
    Ok(found)
}

/// The `depends=` of a module's `.modinfo` (names, possibly none).
pub(super) fn module_depends(ko: &Path) -> Result<Vec<String>> {
    let bytes = std::fs::read(ko).with_context(|| format!("reading {}", ko.display()))?;
    let modinfo = guest_image::elf::section(&bytes, ko, ".modinfo")?
        .with_context(|| format!("{} has no .modinfo section", ko.display()))?;
    let depends = modinfo
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(b"depends="))
        .map(|d| String::from_utf8_lossy(d).into_owned())
        .unwrap_or_default();
    Ok(depends
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('-', "_"))
        .collect())
}

/// `wanted` and everything they depend on, each after its dependencies, as (name, file).
pub(super) fn load_order(kernel: &L1Kernel, wanted: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let all = index(&kernel.modules)?;
    let mut order = Vec::new();
    let mut placed = BTreeSet::new();
    fn visit(
        name: &str,
        all: &BTreeMap<String, PathBuf>,
        placed: &mut BTreeSet<String>,
        order: &mut Vec<(String, PathBuf)>,
        depth: usize,
    ) -> Result<()> {
        if placed.contains(name) {
            return Ok(());
        }
        if depth > 32 {
            bail!("module dependencies of {name} loop");
        }
        let file = all
            .get(name)
            .with_context(|| format!("the L1 kernel has no module {name}"))?;
        for dep in module_depends(file)? {
            visit(&dep, all, placed, order, depth + 1)?;
        }
        placed.insert(name.to_string());
        order.push((name.to_string(), file.clone()));
        Ok(())
    }
    for name in wanted {
        visit(&name.replace('-', "_"), &all, &mut placed, &mut order, 0)?;
    }
    Ok(order)
}
