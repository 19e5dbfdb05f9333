//! `cargo xtask hostile`: schemathesis against a live `crucible serve` (TCP loopback, a
//! temporary key, its own state directory and cgroup parent), checked for server errors,
//! response conformance and hangs (a per-request timeout); then the daemon is stopped and
//! checked to have cleaned up after itself. The end-to-end hostile-input tests are
//! `tests/tests/namespace_hostile.rs` (run by `cargo test`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use crate::util::{cargo, describe, run_step, workspace_root};

/// The schemathesis versions whose CLI and config file this step speaks.
const SCHEMATHESIS: &str = "schemathesis>=4.32,<5";

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Test cases per operation and phase; CI's short form uses the default. Try 100+ for a
    /// longer hunt.
    #[arg(long, default_value_t = 10)]
    pub max_examples: u32,
    /// Hypothesis seed (a fixed one keeps CI reproducible; change it to explore).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds a single request may take before it counts as a hang and fails the run: past
    /// the longest wait the API documents (adding a container answers once its ready check
    /// passes or its 60 s default timeout ends, as a generated one on a live sandbox may).
    #[arg(long, default_value_t = 70)]
    pub request_timeout: u32,
}

pub(crate) fn run(sh: &Shell, args: Args) -> Result<()> {
    let started = Instant::now();
    let root = workspace_root();
    let schemathesis = ensure_schemathesis(sh)?;
    let cargo = cargo();
    run_step(
        "build crucible",
        cmd!(sh, "{cargo} build -p crucible-cli --bin crucible"),
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let crucible = target.join("debug/crucible");
    let image = std::env::var_os("CRUCIBLE_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| target.join("crucible/image"));
    if !image.join("rootfs/init").is_file() {
        bail!(
            "no image at {} (rootfs/init missing): run `cargo xtask build-image` first",
            image.display()
        );
    }

    let dir = tempfile::Builder::new()
        .prefix("crucible-hostile-")
        .tempdir()
        .context("creating a temporary directory")?;
    let mut daemon = Daemon::start(&crucible, &image, dir.path())?;
    let outcome = fuzz(sh, &mut daemon, &schemathesis, &args, dir.path());
    let stopped = daemon.stop();
    let (figures, passed) = match outcome {
        Ok(result) => result,
        Err(e) => {
            daemon.print_log();
            return Err(e);
        }
    };
    if let Err(e) = stopped {
        daemon.print_log();
        return Err(e);
    }
    eprintln!(
        "==> hostile: {figures}; daemon stopped clean; {:.1?} in all",
        started.elapsed()
    );
    if !passed {
        daemon.print_log();
        bail!("schemathesis found failures ({figures}); its report is above");
    }
    Ok(())
}

/// The venv under `~/.cache/crucible/venv`, with schemathesis installed in it if missing.
pub(crate) fn ensure_schemathesis(sh: &Shell) -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let venv = Path::new(&home).join(".cache/crucible/venv");
    let bin = venv.join("bin/schemathesis");
    if bin.is_file() {
        return Ok(bin);
    }
    eprintln!(
        "==> schemathesis is missing: installing {SCHEMATHESIS} with pip into {} (needed for \
         the hostile-input step)",
        venv.display()
    );
    run_step("python venv", cmd!(sh, "python3 -m venv {venv}"))?;
    let pip = venv.join("bin/pip");
    run_step(
        "pip install schemathesis",
        cmd!(sh, "{pip} install --quiet {SCHEMATHESIS}"),
    )?;
    if !bin.is_file() {
        bail!(
            "pip installed schemathesis but {} is missing",
            bin.display()
        );
    }
    Ok(bin)
}

/// For the example, coverage and fuzzing phases: the operations on one sandbox get a live one
/// (created by `fuzz`), so that they reach their logic rather than answering 404 to random
/// ids; DELETE still gets random ids. Not for the stateful phase, which follows the links from
/// `POST /sandboxes` and would have the live sandbox deleted under the others.
const LIVE_SANDBOX: &str = r#"
[[operations]]
include-name-regex = "^(GET /sandboxes/\\{id\\}|(GET|POST) /sandboxes/\\{id\\}/(exec|files))$"
parameters = { "path.id" = "${CRUCIBLE_SANDBOX_ID}" }
"#;

/// Runs schemathesis (the stateless phases against a live sandbox, then the stateful phase);
/// returns the figures and whether both runs passed.
fn fuzz(
    sh: &Shell,
    daemon: &mut Daemon,
    schemathesis: &Path,
    args: &Args,
    dir: &Path,
) -> Result<(String, bool)> {
    let root = workspace_root();
    let (status, body) = daemon.request("POST", "/sandboxes", "{}")?;
    if status != 201 {
        bail!("creating the sandbox to fuzz against failed: {status} {body}");
    }
    let created: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("parsing the create reply {body}"))?;
    let id = created["id"]
        .as_str()
        .with_context(|| format!("no id in the create reply {body}"))?
        .to_string();
    let scripts = root.join("scripts/schemathesis");
    let base = scripts.join("schemathesis.toml");
    let base_text =
        std::fs::read_to_string(&base).with_context(|| format!("reading {}", base.display()))?;
    let live = dir.join("schemathesis-live.toml");
    std::fs::write(&live, format!("{base_text}{LIVE_SANDBOX}"))
        .with_context(|| format!("writing {}", live.display()))?;

    let mut passed = true;
    let mut figures = Vec::new();
    let spec = root.join("docs/openapi.json");
    let url = format!("http://{}", daemon.addr);
    let header = format!("Authorization: Bearer {}", daemon.key);
    let request_timeout = args.request_timeout.to_string();
    let max_examples = args.max_examples.to_string();
    let seed = args.seed.to_string();
    for (phases, config) in [("examples,coverage,fuzzing", &live), ("stateful", &base)] {
        let _in_dir = sh.push_dir(dir);
        let cmd = cmd!(
            sh,
            "{schemathesis} --no-color --config-file {config} run {spec} --url {url}
             --header {header} --checks all --exclude-checks not_a_server_error
             --phases={phases} --request-timeout={request_timeout}
             --max-examples={max_examples} --seed={seed} --workers 1"
        )
        .env("SCHEMATHESIS_HOOKS", "hooks")
        .env("PYTHONPATH", &scripts)
        .env("CRUCIBLE_SANDBOX_ID", &id);
        let shown = cmd.to_string().replace(&daemon.key, "<temporary key>");
        eprintln!("==> schemathesis ({phases}): {shown}");
        // Its report (stdout) is printed below; its stderr is captured and dropped, as before;
        // its status is checked below, so that a failing run still reports its figures.
        let output = cmd
            .ignore_status()
            .output()
            .with_context(|| format!("could not start {}", schemathesis.display()))?;
        let report = String::from_utf8_lossy(&output.stdout);
        print!("{report}");
        passed &= output.status.success();
        figures.push(format!("{phases}: {}", summary(&report)));
        // The daemon must have survived it all.
        let (status, body) = daemon
            .request("GET", "/healthz", "")
            .context("the daemon does not answer after the run")?;
        if status != 200 {
            bail!("/healthz after the run: {status} {body}");
        }
        if let Ok(Some(exit)) = daemon.child.try_wait() {
            bail!("the daemon exited during the run: {exit}");
        }
    }
    Ok((format!("schemathesis {}", figures.join("; ")), passed))
}

/// "N operations tested, M test cases: …" from schemathesis's summary.
fn summary(report: &str) -> String {
    let after = |label: &str| {
        report
            .lines()
            .skip_while(|l| !l.trim().starts_with(label))
            .nth(1)
            .map(|l| l.trim().to_string())
    };
    let tested = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("Tested: "))
        .unwrap_or("?");
    let cases = after("Test cases:").unwrap_or_else(|| "? test cases".into());
    format!("{tested} operations tested, test cases {cases}")
}

/// A `crucible serve` child on TCP loopback with a temporary key.
struct Daemon {
    child: Child,
    addr: SocketAddr,
    key: String,
    socket: PathBuf,
    state_dir: PathBuf,
    cgroup_parent: String,
    log: PathBuf,
}

impl Daemon {
    fn start(crucible: &Path, image: &Path, dir: &Path) -> Result<Daemon> {
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free loopback port")?;
        let mut key = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key))
            .context("reading /dev/urandom for the temporary key")?;
        let key: String = key.iter().map(|b| format!("{b:02x}")).collect();
        let socket = dir.join("crucible.sock");
        let state_dir = dir.join("state");
        let cgroup_parent = format!("crucible-hostile-{}", std::process::id());
        let log = dir.join("daemon.log");
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        // why std::process::Command: the daemon runs alongside the fuzzing, supervised (polled,
        // signalled, killed), its output sent to a log file; xshell only runs to completion.
        let mut cmd = Command::new(crucible);
        cmd.arg("serve")
            .arg("--socket")
            .arg(&socket)
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--state-dir")
            .arg(&state_dir)
            .arg("--cgroup-parent")
            .arg(&cgroup_parent)
            .arg("--data-dir")
            .arg(dir.join("data"))
            // Generated requests make caches and disk-backed layers: keep them small.
            .args(["--disk-budget-mib", "4096", "--cache-mib", "64"])
            .arg("--image")
            .arg(image)
            .args(["--max-sandboxes", "8"])
            .env("CRUCIBLE_API_KEYS", &key)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        eprintln!("==> daemon: {}", describe(&cmd));
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", crucible.display()))?;
        let mut daemon = Daemon {
            child,
            addr,
            key,
            socket,
            state_dir,
            cgroup_parent,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _)) = daemon.request("GET", "/healthz", "") {
                return Ok(daemon);
            }
            if let Ok(Some(exit)) = daemon.child.try_wait() {
                daemon.print_log();
                bail!("the daemon exited at startup: {exit}");
            }
            if Instant::now() > deadline {
                daemon.print_log();
                let _ = daemon.child.kill();
                bail!("the daemon did not answer /healthz on {addr} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One request with the key; returns the status and body.
    fn request(&self, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
        let mut stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))
            .with_context(|| format!("connecting to {}", self.addr))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            self.key,
            body.len()
        );
        stream.write_all(request.as_bytes())?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .with_context(|| format!("reading the answer to {method} {path}"))?;
        let status = response
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("no status in the answer to {method} {path}"))?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((status, body))
    }

    /// SIGTERM, wait, then check that nothing is left: socket, sandbox state, cgroups.
    fn stop(&mut self) -> Result<()> {
        let pid = libc::pid_t::try_from(self.child.id()).context("daemon pid out of range")?;
        // SAFETY: kill(2) on our own child's pid, which has not been reaped (no wait yet
        // succeeded), so the pid cannot have been reused.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("the daemon did not stop within 60 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !status.success() {
            bail!("the daemon exited with {status} on SIGTERM");
        }
        let mut left = Vec::new();
        if self.socket.exists() {
            left.push(format!("the socket {}", self.socket.display()));
        }
        let sandboxes = self.state_dir.join("sandboxes");
        if let Ok(entries) = std::fs::read_dir(&sandboxes) {
            for entry in entries.flatten() {
                left.push(format!("sandbox state {}", entry.path().display()));
            }
        }
        if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
            for controller in controllers.flatten() {
                let group = controller.path().join(&self.cgroup_parent);
                if group.exists() {
                    left.push(format!("the cgroup {}", group.display()));
                }
            }
        }
        if !left.is_empty() {
            bail!("the daemon left behind: {}", left.join(", "));
        }
        Ok(())
    }

    fn print_log(&self) {
        if let Ok(log) = std::fs::read_to_string(&self.log) {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- daemon log (last 40 lines) ---");
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
