//! Host packages the build needs, installed with apt when missing (and said so).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;

use crate::apt;
use crate::process::{self, CommandError};
use crate::progress::Progress;

#[derive(Debug, Error)]
pub enum DepsError {
    #[error(
        "missing host packages: {} (needed for {why}); this is not a Debian-like host \
         (no dpkg-query), so install their equivalents by hand",
        packages.join(" ")
    )]
    NoDpkg { packages: Vec<String>, why: String },
    #[error(
        "missing host packages: {} (needed for {why}); run as root, or install them: \
         sudo apt-get install {}",
        packages.join(" "),
        packages.join(" ")
    )]
    NotRoot { packages: Vec<String>, why: String },
    #[error("installing {} with apt-get failed", packages.join(" "))]
    Install {
        packages: Vec<String>,
        #[source]
        source: CommandError,
    },
    #[error("apt-get reported success but {} is still not installed", package)]
    StillMissing { package: String },
}

/// The installed version of a Debian package, or `None` when it is not installed (or there is
/// no dpkg).
pub fn installed_version(package: &str) -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}\t${Version}", package])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let (status, version) = text.split_once('\t')?;
    (status.trim() == "install ok installed").then(|| version.trim().to_string())
}

fn have_dpkg() -> bool {
    Command::new("dpkg-query")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// Makes sure every package in `packages` is installed, running
/// `apt-get install -y --no-install-recommends` for the missing ones (after `apt-get update`
/// if the first try fails). `why` names what needs them; apt's output goes to `log`.
pub fn ensure(
    packages: &[&str],
    why: &str,
    log: &Path,
    progress: &dyn Progress,
) -> Result<(), DepsError> {
    let dpkg = have_dpkg();
    let missing: Vec<String> = packages
        .iter()
        .filter(|p| installed_version(p).is_none())
        .map(|p| p.to_string())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !dpkg {
        return Err(DepsError::NoDpkg {
            packages: missing,
            why: why.into(),
        });
    }
    if !is_root() {
        return Err(DepsError::NotRoot {
            packages: missing,
            why: why.into(),
        });
    }
    progress.note(&format!(
        "installing {} with apt-get (needed for {why}; log: {})",
        missing.join(" "),
        log.display()
    ));
    let note = |message: &str| progress.note(message);
    let install = |log: &Path| {
        let mut args = vec!["install", "-y", "--no-install-recommends"];
        args.extend(missing.iter().map(String::as_str));
        process::run_logged(&mut apt::apt_get(&args, &note), log)
    };
    if install(log).is_err() {
        progress.status("apt-get install failed; running apt-get update and retrying");
        let update = process::run_logged(&mut apt::apt_get(&["update"], &note), log);
        let retry = update.and_then(|()| install(log));
        retry.map_err(|source| DepsError::Install {
            packages: missing.clone(),
            source,
        })?;
    }
    for package in &missing {
        if installed_version(package).is_none() {
            return Err(DepsError::StillMissing {
                package: package.clone(),
            });
        }
    }
    Ok(())
}

/// The first of `names` found as an executable on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}
