//! `critest` and `crictl` from kubernetes-sigs/cri-tools at tag v1.26.1, built once with
//! Debian's Go into `~/.cache/crucible/cri-tools-v1.26.1/` (outside the clone, so CI's fresh
//! clones reuse them).
//!
//! The tag's tree vendors every dependency, so it builds offline: `GOFLAGS=-mod=vendor
//! GOPROXY=off`. Its source is found, in order: `$CRUCIBLE_CRI_TOOLS_SRC` (a tarball or an
//! unpacked tree), a vendored copy of the tag's `git archive` beside the workspace, or the
//! tag's archive downloaded from GitHub when online.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use xshell::{cmd, Shell};

use crate::util::workspace_root;

/// The release critest's specs and flags are read against.
pub(crate) const VERSION: &str = "v1.26.1";

/// The name of the vendored tarball: `git archive` of the tag, with a top-level directory.
const TARBALL: &str = "cri-tools-v1.26.1.tar.gz";

/// The sha256 of that `git archive` (GitHub's own archive of the tag may differ in bytes).
const TARBALL_SHA256: &str = "35f5d6962167434a8b5122e804fff7492d296311f414f466ac128aec867855f7";

/// Where the tag's archive is when online.
const DOWNLOAD_URL: &str =
    "https://github.com/kubernetes-sigs/cri-tools/archive/refs/tags/v1.26.1.tar.gz";

/// The environment variable naming the source (a tarball or an unpacked tree).
pub(crate) const SRC_ENV: &str = "CRUCIBLE_CRI_TOOLS_SRC";

/// The two built binaries.
#[derive(Debug, Clone)]
pub(crate) struct CriTools {
    /// The ginkgo test binary (`go test -c ./cmd/critest`).
    pub(crate) critest: PathBuf,
    /// The CRI command line, used to pre-pull images and to clean up pods.
    pub(crate) crictl: PathBuf,
}

/// The cached binaries, built first if missing; the build's output goes to `log`.
pub(crate) fn obtain(sh: &Shell, cache: &Path, log: &Path) -> Result<CriTools> {
    let dir = cache.join(format!("cri-tools-{VERSION}"));
    let tools = CriTools {
        critest: dir.join("critest"),
        crictl: dir.join("crictl"),
    };
    // Two runs sharing the cache never build into the same directory at once.
    let _lock = guest_image::cache::CacheLock::acquire(&dir, &guest_image::progress::Plain)
        .with_context(|| format!("locking {}", dir.display()))?;
    if tools.critest.is_file() && tools.crictl.is_file() {
        eprintln!("    cri-tools {VERSION}: cached in {}", dir.display());
        return Ok(tools);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let work = tempfile::Builder::new()
        .prefix(".build-")
        .tempdir_in(&dir)
        .context("creating a build directory for cri-tools")?;
    let tree = source_tree(sh, work.path())?;
    if guest_image::deps::which("go").is_none() {
        bail!("`go` is not on PATH: cri-tools needs Go 1.19 or later (Debian: golang-go)");
    }
    let go_version = cmd!(sh, "go version").read().context("go version")?;
    eprintln!(
        "    building critest and crictl {VERSION} from {} with {go_version} (once; log: {})",
        tree.display(),
        log.display()
    );
    let ldflags = format!("-X github.com/kubernetes-sigs/cri-tools/pkg/version.Version={VERSION}");
    let (critest, crictl) = (work.path().join("critest"), work.path().join("crictl"));
    let _in_tree = sh.push_dir(&tree);
    // Offline and reproducible: everything comes from the tree's vendor/, nothing from a proxy.
    let _env = [
        sh.push_env("GOFLAGS", "-mod=vendor"),
        sh.push_env("GOPROXY", "off"),
        sh.push_env("CGO_ENABLED", "0"),
        sh.push_env("GO111MODULE", "on"),
    ];
    for (what, build) in [
        (
            "go build ./cmd/crictl",
            cmd!(
                sh,
                "nice go build -ldflags {ldflags} -o {crictl} ./cmd/crictl"
            ),
        ),
        (
            "go test -c ./cmd/critest",
            cmd!(
                sh,
                "nice go test -c -ldflags {ldflags} -o {critest} ./cmd/critest"
            ),
        ),
    ] {
        let out = build
            .quiet()
            .ignore_status()
            .output()
            .with_context(|| format!("running {what}"))?;
        append_log(log, what, &out)?;
        if !out.status.success() {
            bail!(
                "{what} in {} failed ({}): {}",
                tree.display(),
                out.status,
                last_lines(&String::from_utf8_lossy(&out.stderr), 20)
            );
        }
    }
    for (built, dest) in [(&critest, &tools.critest), (&crictl, &tools.crictl)] {
        std::fs::rename(built, dest)
            .with_context(|| format!("moving {} to {}", built.display(), dest.display()))?;
    }
    Ok(tools)
}

/// Unpacks the source into `work` (or uses an unpacked tree as it is) and returns the tree's
/// root: the directory holding `cmd/critest`.
fn source_tree(sh: &Shell, work: &Path) -> Result<PathBuf> {
    let tarball = match std::env::var_os(SRC_ENV).map(PathBuf::from) {
        Some(src) if src.is_dir() => {
            if !src.join("cmd/critest").is_dir() {
                bail!(
                    "{SRC_ENV}={} is a directory without cmd/critest: not a cri-tools tree",
                    src.display()
                );
            }
            eprintln!("    cri-tools source: the tree {SRC_ENV} names");
            return Ok(src);
        }
        Some(src) => {
            let sum = sha256_of(&src)?;
            if sum == TARBALL_SHA256 {
                eprintln!(
                    "    cri-tools source: {} ({SRC_ENV}), sha256 verified",
                    src.display()
                );
            } else {
                // GitHub's archive of the tag is not byte-identical to `git archive`.
                eprintln!(
                    "    cri-tools source: {} ({SRC_ENV}); its sha256 {sum} is not the known \
                     `git archive` of {VERSION} ({TARBALL_SHA256}): building it as given",
                    src.display()
                );
            }
            src
        }
        None => match vendored() {
            Some(src) => {
                let sum = sha256_of(&src)?;
                if sum != TARBALL_SHA256 {
                    bail!(
                        "{} has sha256 {sum}, expected {TARBALL_SHA256} (`git archive` of \
                         cri-tools {VERSION}): replace it, or set {SRC_ENV}",
                        src.display()
                    );
                }
                eprintln!("    cri-tools source: {} (sha256 verified)", src.display());
                src
            }
            None => download(sh, work)?,
        },
    };
    let unpacked = work.join("src");
    std::fs::create_dir_all(&unpacked)?;
    cmd!(sh, "tar -xzf {tarball} -C {unpacked}")
        .quiet()
        .run()
        .with_context(|| format!("unpacking {}", tarball.display()))?;
    // One top-level directory (cri-tools-v1.26.1/ or cri-tools-1.26.1/): find it by content.
    let entries =
        std::fs::read_dir(&unpacked).with_context(|| format!("reading {}", unpacked.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.join("cmd/critest").is_dir() {
            return Ok(path);
        }
    }
    bail!(
        "{} holds no cri-tools tree (no top-level directory with cmd/critest)",
        tarball.display()
    )
}

/// The vendored tarball, if a copy is beside the workspace (a `shared/vendor/` folder next to
/// the clone, as on the project's own machines).
fn vendored() -> Option<PathBuf> {
    let root = workspace_root();
    let beside = root.parent().map(|p| p.join("shared/vendor").join(TARBALL));
    beside
        .into_iter()
        .chain([Path::new("/work/shared/vendor").join(TARBALL)])
        .find(|p| p.is_file())
}

/// The tag's archive from GitHub, into `work`; its bytes cannot be checked against the pinned
/// `git archive` hash, so its own hash is printed instead.
fn download(sh: &Shell, work: &Path) -> Result<PathBuf> {
    let dest = work.join(TARBALL);
    eprintln!(
        "    cri-tools source: no {SRC_ENV} and no vendored {TARBALL}: downloading {DOWNLOAD_URL}"
    );
    cmd!(
        sh,
        "curl --fail --silent --show-error --location --max-time 300 -o {dest} {DOWNLOAD_URL}"
    )
    .quiet()
    .run()
    .with_context(|| {
        format!(
            "downloading {DOWNLOAD_URL} failed (offline?): set {SRC_ENV} to a tarball of \
             cri-tools {VERSION} (or its unpacked tree)"
        )
    })?;
    eprintln!(
        "    downloaded; sha256 {} (GitHub's archive, not verifiable against the pinned \
         `git archive` hash)",
        sha256_of(&dest)?
    );
    Ok(dest)
}

/// The hex sha256 of a file's bytes.
pub(crate) fn sha256_of(path: &Path) -> Result<String> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(hasher.finalize()))
}

/// Appends a command's output to the log, under a heading naming it.
fn append_log(log: &Path, what: &str, out: &std::process::Output) -> Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    writeln!(file, "==> {what}: {}", out.status)?;
    file.write_all(&out.stdout)?;
    file.write_all(&out.stderr)?;
    Ok(())
}

/// The last `n` lines of `text`.
pub(crate) fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
