//! The harness the containerd tests share: a containerd of their own (root, state, sockets
//! and FIFOs in a temporary directory) whose shims reach a test daemon, the images they run,
//! and waits with deadlines.

// Each test file uses its own part of it.
#![allow(dead_code)]

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use harness::leaks;
use harness::TestDaemon;
use sha2::{Digest, Sha256};

pub(crate) const RUNTIME: &str = "io.containerd.crucible.v2";
pub(crate) const IMAGE: &str = "docker.io/crucible-test/busybox:latest";
pub(crate) const NAMESPACE: &str = "default";
/// The containerd namespace of Kubernetes' containers.
pub(crate) const CRI_NAMESPACE: &str = "k8s.io";
/// The busybox image's reference, and the name `ctr` and CRI know it by.
const BUSYBOX_REFERENCE: &str = "crucible-test/busybox:latest";
/// The pods' `pause` image: busybox whose entrypoint sleeps.
const PAUSE_REFERENCE: &str = "crucible-test/pause:1";
pub(crate) const PAUSE_IMAGE: &str = "docker.io/crucible-test/pause:1";
/// Where a shim v2 puts its socket, whatever containerd's own paths (hard-coded, as in Go).
pub(crate) const SHIM_SOCKETS: &str = "/run/containerd/s";

/// Where Debian's `containernetworking-plugins` installs the CNI plugins.
const CNI_PLUGINS: &str = "/usr/lib/cni";

/// Fails, saying what to install, without the CNI plugins (never skips).
pub(crate) fn require_cni() {
    assert!(
        Path::new(CNI_PLUGINS).join("bridge").is_file(),
        "{CNI_PLUGINS}/bridge missing: the pod network tests run CNI's bridge plugin \
         (apt-get install containernetworking-plugins; `cargo xtask ci provision` does)"
    );
}

/// A CNI bridge network of the test's own, its bridge removed when dropped.
pub(crate) struct CniBridge {
    /// The bridge's name.
    pub(crate) bridge: String,
    /// The pods' subnet, a /24.
    pub(crate) subnet: String,
    /// The bridge's address, the pods' gateway: the node as a pod reaches it.
    pub(crate) gateway: std::net::Ipv4Addr,
}

impl CniBridge {
    pub(crate) fn new() -> Self {
        // Each of a test binary's bridges its own name and subnet: tests run at once.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let n = ((std::process::id() * 7 + k) % 200) as u8 + 20;
        CniBridge {
            bridge: format!("crbr{}x{k}", std::process::id() % 100_000),
            subnet: format!("10.215.{n}.0/24"),
            gateway: std::net::Ipv4Addr::new(10, 215, n, 1),
        }
    }
}

impl Drop for CniBridge {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .stderr(Stdio::null())
            .status();
    }
}

/// A containerd of its own, with the busybox image imported.
pub(crate) struct Containerd {
    pub(crate) dir: tempfile::TempDir,
    process: Child,
    pub(crate) socket: PathBuf,
    /// Container ids used, to find the shim sockets to remove.
    ids: Mutex<Vec<String>>,
}

pub(crate) fn require_containerd() {
    for tool in ["containerd", "ctr"] {
        let found = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            found,
            "these tests need {tool} (containerd 1.6 or 1.7) on PATH: on Debian/Ubuntu \
             `apt-get install containerd`"
        );
    }
}

/// The shim binary's directory, which containerd searches for `containerd-shim-crucible-v2`.
pub(crate) fn shim_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_containerd-shim-crucible-v2"))
        .parent()
        .expect("the shim binary has a directory")
        .to_path_buf()
}

/// The value of `name` in `ctr task metrics`' table.
pub(crate) fn metric(table: &str, name: &str) -> Option<u64> {
    table.lines().find_map(|l| {
        let mut fields = l.split_whitespace();
        (fields.next() == Some(name)).then(|| fields.next()?.parse().ok())?
    })
}

/// The CRI plugin's configuration (`t`: the scratch directory): everything in the scratch,
/// nothing the host's (cgroups, AppArmor, OOM scores, CNI), the stream server on loopback,
/// `crucible` as a runtime handler.
fn cri_plugin_config(t: &str, sandbox_image: &str) -> String {
    format!(
        r#"disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[plugins."io.containerd.grpc.v1.cri"]
  disable_cgroup = false
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  sandbox_image = "{sandbox_image}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_tls_streaming = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "crucible"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crucible]
      runtime_type = "{RUNTIME}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{t}/cni/bin"
    conf_dir = "{t}/cni/net.d"
"#
    )
}

/// A `docker save` archive of the built image's busybox tree.
pub(crate) fn busybox_archive(out: &Path, reference: &str, entrypoint: Option<Vec<String>>) {
    let rootfs = harness::image_dir().join("rootfs");
    let mut layer = tar::Builder::new(Vec::new());
    oci::write::append_tree(&mut layer, &rootfs).expect("tar the busybox tree");
    let layer = layer.into_inner().expect("finish the layer");
    let parts = oci::write::ImageParts {
        layers: vec![layer],
        config: oci::manifest::RunConfig {
            env: Some(vec!["PATH=/usr/sbin:/usr/bin:/sbin:/bin".into()]),
            entrypoint,
            ..Default::default()
        },
        reference: Some(reference.into()),
        compression: oci::compression::Compression::None,
    };
    oci::write::docker_archive(out, &parts).expect("write the archive");
}

/// Runs `command` to its end, killing it (and failing) after `limit`.
pub(crate) fn output_within(mut command: Command, limit: Duration) -> Output {
    let what = format!("{command:?}");
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    finish_within(child, limit, &what)
}

pub(crate) fn finish_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{what} did not finish within {limit:?}; stdout {:?}, stderr {:?}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

impl Containerd {
    pub(crate) fn start(daemon: &TestDaemon) -> Self {
        Self::start_with_env(daemon, &[])
    }

    /// A containerd (and so its shims) with `env` added to its environment.
    pub(crate) fn start_with_env(daemon: &TestDaemon, env: &[(&str, &str)]) -> Self {
        Self::start_for(&daemon.socket, env)
    }

    /// A containerd whose shims talk to the daemon at `socket`, with `env` added.
    pub(crate) fn start_for(socket: &Path, env: &[(&str, &str)]) -> Self {
        let containerd = Self::launch(socket, env, None);
        let archive = containerd.dir.path().join("busybox.tar");
        busybox_archive(&archive, BUSYBOX_REFERENCE, None);
        containerd.import(NAMESPACE, &archive);
        containerd
    }

    /// A containerd whose CRI plugin is on, as kubelet's is, with `crucible` as a runtime
    /// handler, host networking only (no CNI plugin is run: the pods ask for the node's
    /// network), and the pause and busybox images in its `k8s.io` namespace.
    pub(crate) fn start_cri(daemon: &TestDaemon) -> Self {
        let containerd = Self::launch(&daemon.socket, &[], Some(PAUSE_IMAGE));
        let busybox = containerd.dir.path().join("busybox.tar");
        busybox_archive(&busybox, BUSYBOX_REFERENCE, None);
        containerd.import(CRI_NAMESPACE, &busybox);
        let pause = containerd.dir.path().join("pause.tar");
        let sleep = vec!["sleep".to_string(), "2147483647".to_string()];
        busybox_archive(&pause, PAUSE_REFERENCE, Some(sleep));
        containerd.import(CRI_NAMESPACE, &pause);
        containerd
    }

    /// [`Containerd::start_cri`] with a CNI network, as a node has: `bridge` pods on
    /// `network.bridge`, addresses from `network.subnet`, the bridge the gateway (`.1`).
    pub(crate) fn start_cri_on(daemon: &TestDaemon, network: &CniBridge) -> Self {
        require_cni();
        let containerd = Self::start_cri(daemon);
        let cni = containerd.dir.path().join("cni");
        std::fs::create_dir_all(cni.join("bin")).expect("mkdir cni/bin");
        std::fs::create_dir_all(cni.join("net.d")).expect("mkdir cni/net.d");
        for plugin in ["bridge", "host-local", "loopback", "portmap"] {
            std::os::unix::fs::symlink(
                Path::new(CNI_PLUGINS).join(plugin),
                cni.join("bin").join(plugin),
            )
            .expect("link a CNI plugin");
        }
        let conflist = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": network.bridge,
            "plugins": [
                {"type": "bridge", "bridge": network.bridge, "isGateway": true,
                 "ipMasq": false, "hairpinMode": true,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": network.subnet}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        std::fs::write(
            cni.join("net.d/10-crucible-test.conflist"),
            serde_json::to_vec_pretty(&conflist).expect("json"),
        )
        .expect("write the CNI configuration");
        containerd
    }

    /// `ctr -n NAMESPACE images import ARCHIVE`, which must succeed.
    fn import(&self, namespace: &str, archive: &Path) {
        let archive = archive.display().to_string();
        let imported = self.run(&["-n", namespace, "images", "import", &archive]);
        assert!(
            imported.status.success(),
            "ctr images import: {}",
            text(&imported.stderr)
        );
    }

    /// Starts containerd with its CRI plugin off, or on with `sandbox_image`.
    fn launch(socket: &Path, env: &[(&str, &str)], sandbox_image: Option<&str>) -> Self {
        require_containerd();
        let dir = tempfile::Builder::new()
            .prefix("crucible-containerd-")
            .tempdir()
            .expect("temp dir");
        let t = dir.path().display().to_string();
        let plugins = match sandbox_image {
            None => r#"disabled_plugins = ["io.containerd.grpc.v1.cri"]"#.to_string(),
            Some(image) => cri_plugin_config(&t, image),
        };
        let config = format!(
            r#"version = 2
root = "{t}/root"
state = "{t}/state"
{plugins}
[grpc]
  address = "{t}/containerd.sock"
[ttrpc]
  address = "{t}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{t}/opt"
"#
        );
        std::fs::write(dir.path().join("config.toml"), config).expect("write the config");
        std::fs::create_dir(dir.path().join("fifo")).expect("mkdir fifo");
        let log = std::fs::File::create(dir.path().join("containerd.log")).expect("log file");
        let path = format!(
            "{}:{}",
            shim_dir().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let process = Command::new("containerd")
            .arg("--config")
            .arg(dir.path().join("config.toml"))
            .current_dir(dir.path())
            .env("PATH", path)
            .env("CRUCIBLE_HOST", socket)
            .env_remove("CRUCIBLE_API_KEY")
            .env_remove("CRUCIBLE_SHIM_IMAGE_IDLE")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("start containerd");
        let containerd = Containerd {
            socket: dir.path().join("containerd.sock"),
            dir,
            process,
            ids: Mutex::new(Vec::new()),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !containerd
            .ctr(&["version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            assert!(
                Instant::now() < deadline,
                "containerd did not answer within 20 s; its log:\n{}",
                containerd.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        containerd
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// `ctr -a SOCKET ARGS…`.
    pub(crate) fn ctr(&self, args: &[&str]) -> Command {
        let mut command = Command::new("ctr");
        command.arg("-a").arg(&self.socket).args(args);
        command
    }

    /// `ctr ARGS…` in the background, its output piped.
    pub(crate) fn spawn(&self, args: &[&str], stdin: Stdio) -> Child {
        self.ctr(args)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn ctr {args:?}: {e}"))
    }

    /// Runs `ctr ARGS…` to its end (at most a minute).
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        output_within(self.ctr(args), Duration::from_secs(60))
    }

    /// [`Containerd::run`], which must succeed.
    pub(crate) fn run_ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "ctr {args:?}: {:?}, stderr {}",
            out.status,
            text(&out.stderr)
        );
        out
    }

    /// `ctr run -d` of `cmd` as container `id`, waited for (at most `limit`) until RUNNING.
    pub(crate) fn start_detached(&self, id: &str, cmd: &[&str], limit: Duration) {
        let detached = self.spawn_container(id, &["-d"], cmd);
        let detached = finish_within(detached, limit, "ctr run -d");
        assert!(
            detached.status.success(),
            "ctr run -d: {}",
            text(&detached.stderr)
        );
        self.wait_for_status(id, "RUNNING");
    }

    /// `task kill -s SIGKILL`, waited for until STOPPED, then `task delete`.
    pub(crate) fn kill_and_delete_task(&self, id: &str) {
        self.run_ok(&["task", "kill", "-s", "SIGKILL", id]);
        self.wait_for_status(id, "STOPPED");
        self.run_ok(&["task", "delete", id]);
    }

    pub(crate) fn fifo_dir(&self) -> String {
        self.dir.path().join("fifo").display().to_string()
    }

    pub(crate) fn note(&self, id: &str) {
        self.ids.lock().expect("ids").push(id.into());
    }

    /// `ctr run --rm` of `cmd` in container `id` on our runtime, with extra `ctr run` flags.
    pub(crate) fn run_container(&self, id: &str, flags: &[&str], cmd: &[&str]) -> Output {
        self.note(id);
        let fifo = self.fifo_dir();
        let mut args = vec!["run", "--rm", "--runtime", RUNTIME, "--fifo-dir", &fifo];
        args.extend_from_slice(flags);
        args.extend_from_slice(&[IMAGE, id]);
        args.extend_from_slice(cmd);
        self.run(&args)
    }

    /// The same in the background.
    pub(crate) fn spawn_container(&self, id: &str, flags: &[&str], cmd: &[&str]) -> Child {
        self.note(id);
        let fifo = self.fifo_dir();
        let mut args = vec!["run", "--runtime", RUNTIME, "--fifo-dir", &fifo];
        args.extend_from_slice(flags);
        args.extend_from_slice(&[IMAGE, id]);
        args.extend_from_slice(cmd);
        self.spawn(&args, Stdio::null())
    }

    /// The status `ctr task ls` shows for `id` (`RUNNING`, `STOPPED`, …), if listed.
    pub(crate) fn task_status(&self, id: &str) -> Option<String> {
        let out = self.run(&["task", "ls"]);
        text(&out.stdout).lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.first() == Some(&id)).then(|| fields.last().unwrap_or(&"").to_string())
        })
    }

    pub(crate) fn wait_for_status(&self, id: &str, status: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.task_status(id).as_deref() != Some(status) {
            assert!(
                Instant::now() < deadline,
                "task {id} never became {status} (now {:?}); containerd's log:\n{}",
                self.task_status(id),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The shim sockets this containerd's containers would have (`/run/containerd/s/<hash>`).
    pub(crate) fn shim_sockets(&self) -> Vec<PathBuf> {
        let ids = self.ids.lock().expect("ids").clone();
        ids.iter()
            .map(|id| {
                let key = format!("{}/{NAMESPACE}/{id}", self.socket.display());
                Path::new(SHIM_SOCKETS).join(hex::encode(Sha256::digest(key.as_bytes())))
            })
            .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket()))
            .collect()
    }

    /// Running shim processes of this containerd (their argv names its socket).
    pub(crate) fn shims(&self) -> Vec<i32> {
        leaks::processes_mentioning(&self.socket)
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    c.windows(b"containerd-shim-crucible-v2".len())
                        .any(|w| w == b"containerd-shim-crucible-v2")
                })
            })
            .collect()
    }

    /// Nothing of a container is left: no sandbox, no shim, no mount, no shim socket, no
    /// sandbox cgroup.
    pub(crate) async fn assert_nothing_left(&self, daemon: &TestDaemon) {
        let sandboxes = daemon.client().list().await.expect("list sandboxes");
        assert!(sandboxes.is_empty(), "sandboxes left: {sandboxes:?}");
        leaks::eventually("the shims to exit", || self.shims().is_empty()).await;
        leaks::eventually("the shim sockets to go", || self.shim_sockets().is_empty()).await;
        let mounts = leaks::mounts_under(self.dir.path());
        assert!(mounts.is_empty(), "mounts left: {mounts:?}");
        leaks::eventually("the sandbox cgroups to go", || {
            leaks::sandbox_cgroups(daemon.cgroup_parent()).is_empty()
        })
        .await;
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for pid in self.shims() {
            // SIGKILL by pid: only our own containerd's shims are listed.
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        }
        let _ = Command::new("kill")
            .arg(self.process.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.process.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.process.kill();
        let _ = self.process.wait();
        for socket in self.shim_sockets() {
            let _ = std::fs::remove_file(socket);
        }
        for point in leaks::mounts_under(self.dir.path()).iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(point).status();
        }
    }
}
