//! The guest agent (`guest-init`), built static for the guest.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::elf::{self, ElfError};
use crate::process::{self, CommandError};
use crate::progress::Progress;

/// The agent's cargo package.
pub const PACKAGE: &str = "guest-init";
/// The preferred target: fully static with musl.
pub const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";
/// The fallback: glibc, statically linked with `+crt-static`.
pub const GNU_TARGET: &str = "x86_64-unknown-linux-gnu";

#[derive(Debug, Error)]
pub enum AgentError {
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error("could not parse `cargo metadata` output")]
    Metadata(#[source] serde_json::Error),
    #[error(
        "the workspace at {} has no `{PACKAGE}` package (is the guest agent merged?)",
        workspace.display()
    )]
    NoPackage { workspace: PathBuf },
    #[error("{} does not exist", path.display())]
    Missing { path: PathBuf },
    #[error(
        "{} is not static: {}{}",
        path.display(),
        interp.as_ref().map(|i| format!("PT_INTERP {i}; ")).unwrap_or_default(),
        if needed.is_empty() { String::new() } else { format!("NEEDED {}", needed.join(", ")) }
    )]
    NotStatic {
        path: PathBuf,
        interp: Option<String>,
        needed: Vec<String>,
    },
    #[error("could not read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where the agent binary comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSource {
    /// Build `guest-init` from the cargo workspace at this path.
    Build { workspace: PathBuf },
    /// Use this binary (checked static, not built).
    Prebuilt(PathBuf),
}

/// The agent that goes into the image.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AgentInfo {
    pub path: PathBuf,
    /// `guest-init <version>`, or `file:<path>`.
    pub source: String,
    pub target: String,
    pub size: u64,
    pub sha256: String,
}

/// Builds (or takes) the agent and checks it is static.
pub fn obtain(
    source: &AgentSource,
    logs: &Path,
    progress: &dyn Progress,
) -> Result<AgentInfo, AgentError> {
    let (path, source, target) = match source {
        AgentSource::Prebuilt(path) => {
            if !path.is_file() {
                return Err(AgentError::Missing { path: path.clone() });
            }
            (
                path.clone(),
                format!("file:{}", path.display()),
                "unknown".into(),
            )
        }
        AgentSource::Build { workspace } => build(workspace, logs, progress)?,
    };
    check_static(&path)?;
    let bytes = std::fs::read(&path).map_err(|source| AgentError::Read {
        path: path.clone(),
        source,
    })?;
    Ok(AgentInfo {
        size: bytes.len() as u64,
        sha256: hex::encode(Sha256::digest(&bytes)),
        path,
        source,
        target,
    })
}

/// Fails unless `path` is an ELF without `PT_INTERP` and without `DT_NEEDED` entries.
pub fn check_static(path: &Path) -> Result<(), AgentError> {
    let info = elf::inspect_file(path)?;
    if info.is_static() {
        Ok(())
    } else {
        Err(AgentError::NotStatic {
            path: path.to_path_buf(),
            interp: info.interp,
            needed: info.needed,
        })
    }
}

#[derive(Deserialize)]
struct Metadata {
    target_directory: PathBuf,
    packages: Vec<MetaPackage>,
}

#[derive(Deserialize)]
struct MetaPackage {
    name: String,
    version: String,
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Whether rustup has (or can now add) the musl target for the workspace's toolchain.
pub fn musl_available(workspace: &Path, log: &Path, progress: &dyn Progress) -> bool {
    let installed = process::output(Command::new("rustup").current_dir(workspace).args([
        "target",
        "list",
        "--installed",
    ]));
    match installed {
        Ok(list) if list.lines().any(|l| l.trim() == MUSL_TARGET) => true,
        Ok(_) => {
            progress.note(&format!("adding the {MUSL_TARGET} target with rustup"));
            process::run_logged(
                Command::new("rustup")
                    .current_dir(workspace)
                    .args(["target", "add", MUSL_TARGET]),
                log,
            )
            .is_ok()
        }
        Err(_) => false,
    }
}

fn build(
    workspace: &Path,
    logs: &Path,
    progress: &dyn Progress,
) -> Result<(PathBuf, String, String), AgentError> {
    let meta = process::output(Command::new(cargo()).current_dir(workspace).args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
    ]))?;
    let meta: Metadata = serde_json::from_str(&meta).map_err(AgentError::Metadata)?;
    let package = meta
        .packages
        .iter()
        .find(|p| p.name == PACKAGE)
        .ok_or_else(|| AgentError::NoPackage {
            workspace: workspace.to_path_buf(),
        })?;
    let log = logs.join("agent-build.log");
    let _ = std::fs::remove_file(&log);
    let target = if musl_available(workspace, &log, progress) {
        MUSL_TARGET
    } else {
        progress.note(&format!(
            "{MUSL_TARGET} is not available; building for {GNU_TARGET} with +crt-static"
        ));
        GNU_TARGET
    };
    let mut cmd = Command::new(cargo());
    cmd.current_dir(workspace)
        .args([
            "build",
            "--release",
            "--package",
            PACKAGE,
            "--target",
            target,
        ])
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
    if target == GNU_TARGET {
        // `--target` keeps these flags off build scripts and proc-macros, which must stay dynamic.
        cmd.env("RUSTFLAGS", "-C target-feature=+crt-static");
    }
    progress.status(&format!(
        "cargo build --release -p {PACKAGE} --target {target}; log: {}",
        log.display()
    ));
    process::run_logged(&mut cmd, &log)?;
    let path = meta
        .target_directory
        .join(target)
        .join("release")
        .join(PACKAGE);
    if !path.is_file() {
        return Err(AgentError::Missing { path });
    }
    Ok((
        path,
        format!("{PACKAGE} {}", package.version),
        target.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_binary_fails_static_check_naming_interp_and_libs() {
        let me = std::env::current_exe().unwrap();
        let err = check_static(&me).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, AgentError::NotStatic { .. }), "{text}");
        assert!(text.contains("PT_INTERP"), "{text}");
        assert!(text.contains("libc.so"), "{text}");
    }

    #[test]
    fn static_binary_passes_static_check() {
        let busybox = Path::new("/bin/busybox");
        if crate::deps::installed_version("busybox-static").is_none() {
            eprintln!("skipped: busybox-static is not installed");
            return;
        }
        check_static(busybox).unwrap();
    }

    #[test]
    fn freshly_built_static_c_binary_passes_and_dynamic_one_fails() {
        let Some(cc) = crate::deps::which("cc") else {
            eprintln!("skipped: no C compiler");
            return;
        };
        let dir = std::env::temp_dir().join(format!("crucible-static-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("hello.c");
        std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
        let build = |name: &str, extra: &[&str]| {
            let out = dir.join(name);
            let status = Command::new(&cc)
                .args(extra)
                .arg("-o")
                .arg(&out)
                .arg(&src)
                .status()
                .unwrap();
            status.success().then_some(out)
        };
        if let Some(dynamic) = build("dynamic", &[]) {
            assert!(matches!(
                check_static(&dynamic),
                Err(AgentError::NotStatic { .. })
            ));
        }
        // Needs libc.a (libc6-dev); both plain -static and static-pie must pass.
        for (name, flags) in [
            ("static", &["-static"][..]),
            ("static-pie", &["-static-pie"][..]),
        ] {
            match build(name, flags) {
                Some(bin) => check_static(&bin).unwrap(),
                None => eprintln!("skipped {name}: the C toolchain cannot link it"),
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn missing_prebuilt_agent_is_named() {
        let err = obtain(
            &AgentSource::Prebuilt("/nonexistent/guest-init".into()),
            Path::new("/tmp"),
            &crate::progress::Silent,
        )
        .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/guest-init"));
    }
}
