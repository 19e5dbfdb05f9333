//! The services one critest run talks to, each a child process with its state in the run's
//! scratch directory, stopped and cleaned up when dropped (on failure too): a registry v2
//! holding the stand-in images, a private `crucible serve`, and a containerd whose CRI plugin
//! has two runtime handlers, `runc` and `crucible`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::SANDBOX_IMAGE;
use crate::util::describe;

/// A child process that is sent SIGTERM, then SIGKILL after `grace`, when dropped.
#[derive(Debug)]
struct Service {
    name: &'static str,
    child: Child,
    log: PathBuf,
    grace: Duration,
}

impl Service {
    /// Starts `command` with its output appended to `log`.
    fn spawn(
        name: &'static str,
        mut command: Command,
        log: &Path,
        grace: Duration,
    ) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        eprintln!(
            "    {name}: {} (log: {})",
            describe(&command),
            log.display()
        );
        let child = command
            .spawn()
            .with_context(|| format!("starting {name}: {}", describe(&command)))?;
        Ok(Service {
            name,
            child,
            log: log.to_path_buf(),
            grace,
        })
    }

    /// Waits until `ready` holds, failing with the log's tail if the process exits first or
    /// `limit` passes.
    fn wait_ready(&mut self, limit: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if ready() {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited at start-up ({status}); its log ({}) ends:\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} was not ready within {limit:?}; its log ({}) ends:\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, then SIGKILL after the grace period; returns how it ended.
    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child, not yet reaped, so the pid is still its.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + self.grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "    {} did not stop within {:?} of SIGTERM: killing it",
            self.name, self.grace
        );
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last lines of a log file, for error messages.
pub(crate) fn tail(log: &Path) -> String {
    guest_image::process::tail(log, 30).unwrap_or_else(|e| format!("(unreadable: {e})"))
}

/// `command`'s stdout, run to its end within `limit` ([`output_within`]), or an error naming
/// it with its stderr.
pub(crate) fn stdout_within(command: &mut Command, limit: Duration) -> Result<String> {
    let what = describe(command);
    let out = output_within(command, limit).with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `command` to its end with stdout and stderr captured (read as they come, so a full
/// pipe never blocks it); past `limit` it is killed, and the error says so.
fn output_within(command: &mut Command, limit: Duration) -> Result<std::process::Output> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    match status {
        Some(status) => Ok(std::process::Output {
            status,
            stdout,
            stderr,
        }),
        None => bail!(
            "killed after {limit:?}; its stderr so far: {}",
            String::from_utf8_lossy(&stderr).trim()
        ),
    }
}

/// A free TCP port on loopback (bound, then released for the service to take).
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// The status code of `GET path` on a stream, if it answered HTTP.
fn http_status(mut stream: impl Read + Write, host: &str, path: &str) -> Option<u16> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).ok()?;
    let head = String::from_utf8_lossy(&head[..n]).into_owned();
    head.split(' ').nth(1)?.parse().ok()
}

/// Debian's `docker-registry` (the distribution project's registry v2) on 127.0.0.1.
#[derive(Debug)]
pub(crate) struct Registry {
    /// `127.0.0.1:PORT`, plain HTTP.
    pub(crate) addr: String,
    _service: Service,
}

impl Registry {
    /// A registry storing into `dir/registry`, logging to `log`.
    pub(crate) fn start(dir: &Path, log: &Path) -> Result<Self> {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let storage = dir.join("registry");
        let config = dir.join("registry.yml");
        // Not the system service and not its config: our own storage, our own port.
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    \
                 rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                storage.display()
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;
        let mut command = Command::new("docker-registry");
        command.arg("serve").arg(&config);
        let mut service = Service::spawn("registry", command, log, Duration::from_secs(10))?;
        service.wait_ready(Duration::from_secs(30), || {
            TcpStream::connect(&addr)
                .ok()
                .and_then(|s| http_status(s, &addr, "/v2/"))
                == Some(200)
        })?;
        Ok(Registry {
            addr,
            _service: service,
        })
    }
}

/// A private `crucible serve` (the namespace backend, or the microVM one under QEMU TCG): its
/// own socket, state and data directories and cgroup parent, so it never touches another
/// daemon's sandboxes.
#[derive(Debug)]
pub(crate) struct Daemon {
    pub(crate) socket: PathBuf,
    service: Service,
}

impl Daemon {
    pub(crate) fn start(
        crucible: &Path,
        image: &Path,
        backend: &[&str],
        dir: &Path,
        log: &Path,
    ) -> Result<Self> {
        let socket = dir.join("crucible.sock");
        let mut command = Command::new(crucible);
        command
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir.join("crucible-state"))
            .arg("--data-dir")
            .arg(dir.join("crucible-data"))
            .arg("--cgroup-parent")
            .arg(format!("crucible-critest-{}", std::process::id()))
            .arg("--image")
            .arg(image)
            .args(backend)
            .env_remove("CRUCIBLE_API_KEYS")
            .env_remove("CRUCIBLE_HOST");
        // A minute to delete what is left on SIGTERM.
        let mut service = Service::spawn("crucible serve", command, log, Duration::from_secs(60))?;
        let probe = socket.clone();
        service.wait_ready(Duration::from_secs(30), || {
            UnixStream::connect(&probe)
                .ok()
                .and_then(|s| http_status(s, "localhost", "/healthz"))
                == Some(200)
        })?;
        Ok(Daemon { socket, service })
    }

    /// SIGTERM (the daemon deletes every sandbox) and its exit status.
    pub(crate) fn stop(&mut self) -> Result<()> {
        match self.service.stop() {
            Some(status) if status.success() => Ok(()),
            Some(status) => bail!(
                "crucible serve exited with {status} on SIGTERM (log: {})",
                self.service.log.display()
            ),
            None => bail!("crucible serve could not be waited for"),
        }
    }
}

/// What containerd needs to know about the run.
#[derive(Debug)]
pub(crate) struct ContainerdSetup<'a> {
    /// The scratch directory: root, state, sockets, CNI configuration.
    pub(crate) dir: &'a Path,
    pub(crate) log: &'a Path,
    /// The registry every mirrored host is sent to.
    pub(crate) registry: &'a str,
    /// The hosts to mirror.
    pub(crate) hosts: &'a [&'a str],
    /// The crucible daemon the shim talks to.
    pub(crate) daemon_socket: &'a Path,
    /// Where `containerd-shim-crucible-v2` is (put first on containerd's PATH).
    pub(crate) shim_dir: &'a Path,
    pub(crate) crictl: &'a Path,
    /// The CNI plugins' directory and the network configuration's.
    pub(crate) cni_bin: &'a Path,
    pub(crate) cni_conf: &'a Path,
}

/// A containerd of our own with the CRI plugin on and two runtime handlers.
#[derive(Debug)]
pub(crate) struct Containerd {
    pub(crate) socket: PathBuf,
    crictl: PathBuf,
    dir: PathBuf,
    service: Service,
}

impl Containerd {
    pub(crate) fn start(setup: &ContainerdSetup<'_>) -> Result<Self> {
        let dir = setup.dir;
        let config = dir.join("containerd.toml");
        std::fs::write(&config, config_toml(setup))
            .with_context(|| format!("writing {}", config.display()))?;
        let path = format!(
            "{}:{}",
            setup.shim_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Command::new("containerd");
        command
            .arg("--config")
            .arg(&config)
            .current_dir(dir)
            .env("PATH", path)
            .env("CRUCIBLE_HOST", setup.daemon_socket)
            .env_remove("CRUCIBLE_API_KEY")
            .env_remove("CRUCIBLE_SHIM_IMAGE_IDLE");
        let service = Service::spawn("containerd", command, setup.log, Duration::from_secs(20))?;
        let mut containerd = Containerd {
            socket: dir.join("containerd.sock"),
            crictl: setup.crictl.to_path_buf(),
            dir: dir.to_path_buf(),
            service,
        };
        let (crictl, endpoint) = (containerd.crictl.clone(), containerd.endpoint());
        containerd.service.wait_ready(Duration::from_secs(30), || {
            Command::new(&crictl)
                .args([
                    "--runtime-endpoint",
                    &endpoint,
                    "--timeout",
                    "5s",
                    "version",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })?;
        // Both handlers' pods need the CNI network: a configuration the CRI plugin cannot
        // load shows here, not as a failed spec.
        let info = containerd.crictl(&["info"], Duration::from_secs(30))?;
        let info: serde_json::Value =
            serde_json::from_str(&info).context("parsing `crictl info`")?;
        let conditions = info["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for condition in &conditions {
            if condition["status"] != true {
                bail!(
                    "containerd's CRI plugin is not ready: {condition} (log: {})",
                    setup.log.display()
                );
            }
        }
        Ok(containerd)
    }

    /// `unix://` and the socket, as critest and crictl take it.
    pub(crate) fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// `crictl ARGS…` against this containerd; its stdout, or an error naming the command
    /// with its stderr.
    pub(crate) fn crictl(&self, args: &[&str], limit: Duration) -> Result<String> {
        let endpoint = self.endpoint();
        let mut command = Command::new(&self.crictl);
        command
            .args([
                "--runtime-endpoint",
                &endpoint,
                "--image-endpoint",
                &endpoint,
            ])
            .args(["--timeout", &format!("{}s", limit.as_secs().max(1))])
            .args(args);
        stdout_within(&mut command, limit + Duration::from_secs(10))
    }

    /// Stops and removes every pod (and so its containers), as between the two handlers'
    /// runs: the network and the daemon are left clean for the next.
    pub(crate) fn remove_all_pods(&self) -> Result<()> {
        self.crictl(&["rmp", "--all", "--force"], Duration::from_secs(180))
            .map(|_| ())
    }

    /// The shims this containerd started (their command line names its socket).
    fn shims(&self) -> Vec<i32> {
        let needle = self.socket.display().to_string();
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        procs
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    let c = String::from_utf8_lossy(&c);
                    c.contains("containerd-shim") && c.contains(&needle)
                })
            })
            .collect()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Pods first, while containerd can still tear down their networks and the shims can
        // still tell the daemon to delete their sandboxes.
        if let Err(e) = self.remove_all_pods() {
            eprintln!("    cleaning up: {e:#}");
        }
        self.service.stop();
        for pid in self.shims() {
            eprintln!("    cleaning up: killing shim {pid}, left after containerd stopped");
            // SAFETY: kill(2) by pid on a shim of our own containerd (its command line names
            // our socket); at worst the pid was reused in the meantime and the call fails.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        // runc's containers outlive a killed shim: delete whatever its state still lists.
        let runc_root = self.dir.join("runc/k8s.io");
        if runc_root.is_dir() {
            let listed = Command::new("runc")
                .arg("--root")
                .arg(&runc_root)
                .args(["list", "--quiet"])
                .output();
            if let Ok(out) = listed {
                for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    eprintln!("    cleaning up: runc delete --force {id}");
                    let _ = Command::new("runc")
                        .arg("--root")
                        .arg(&runc_root)
                        .args(["delete", "--force", id])
                        .status();
                }
            }
        }
    }
}

/// containerd's configuration: everything in the scratch directory, the CRI plugin with the
/// `runc` handler (the baseline) and the `crucible` handler beside it, the CNI network, and
/// registry mirrors sending every host critest pulls from to our registry.
fn config_toml(setup: &ContainerdSetup<'_>) -> String {
    let t = setup.dir.display();
    let cri = r#"plugins."io.containerd.grpc.v1.cri""#;
    let mut mirrors = String::new();
    for host in setup.hosts {
        mirrors.push_str(&format!(
            "  [{cri}.registry.mirrors.\"{host}\"]\n    endpoint = [\"http://{}\"]\n",
            setup.registry
        ));
    }
    format!(
        r#"version = 2
root = "{t}/root"
state = "{t}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{t}/containerd.sock"
[ttrpc]
  address = "{t}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{t}/opt"
[{cri}]
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  sandbox_image = "{SANDBOX_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_tls_streaming = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        Root = "{t}/runc"
    [{cri}.containerd.runtimes.crucible]
      runtime_type = "io.containerd.crucible.v2"
  [{cri}.cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
{mirrors}"#,
        bin = setup.cni_bin.display(),
        conf = setup.cni_conf.display(),
    )
}
