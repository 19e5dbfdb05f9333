//! What the QEMU tests share: the built image, the QEMU binary, and a running
//! `crucible-vmm vhost-user …` backend.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The `crucible-vmm` under test: `$CRUCIBLE_VMM` when set (the nested tier points it at the
/// static build, as shipped), else the one cargo built with these tests.
pub(crate) fn vmm_binary() -> PathBuf {
    std::env::var_os("CRUCIBLE_VMM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_crucible-vmm")))
}

/// How long a backend may take to notice QEMU is gone.
pub(crate) const BACKEND_EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// The image's kernel and initramfs: `$CRUCIBLE_IMAGE`, else `target/crucible/image` in the
/// workspace. Fails (never skips) when they are missing, saying how to build them.
pub(crate) fn image_files() -> (PathBuf, PathBuf) {
    let dir = std::env::var_os("CRUCIBLE_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/crucible/image"));
    let (kernel, initramfs) = (dir.join("vmlinux"), dir.join("initramfs.cpio"));
    for file in [&kernel, &initramfs] {
        assert!(
            file.is_file(),
            "this test boots our kernel and initramfs under QEMU, and {} is missing: run \
             `cargo xtask build-image` (or `cargo xtask ci`, which does) first",
            file.display()
        );
    }
    (kernel, initramfs)
}

/// QEMU on `PATH`; fails saying which package to install.
pub(crate) fn qemu_binary() -> PathBuf {
    let (qemu, package) = (contract::qemu::BINARY, contract::qemu::PACKAGE);
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(qemu))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "this test boots Linux under QEMU and {qemu} is not on PATH: install it with \
                 `apt-get install {package}`"
            )
        })
}

/// A running `crucible-vmm vhost-user <device> --socket S …`, listening; killed when dropped
/// (a failing test must not leave it running).
pub(crate) struct Backend {
    child: Option<Child>,
    socket: PathBuf,
}

impl Backend {
    /// Starts `crucible-vmm vhost-user <device> --socket <socket> <args>` and waits for its
    /// `listening on` line (EOF instead means it died).
    pub(crate) fn start(device: &str, socket: PathBuf, args: &[&std::ffi::OsStr]) -> Backend {
        let mut child = Command::new(vmm_binary())
            .args(["vhost-user", device, "--socket"])
            .arg(&socket)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let line = testkit::Lines::new(child.stdout.take().unwrap())
            .next_within(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("the {device} backend never said it listens: {e}"))
            .unwrap_or_default();
        assert_eq!(
            line.trim_end(),
            format!(
                "crucible-vmm: vhost-user {device} listening on {}",
                socket.display()
            ),
            "the {device} backend ({args:?}) did not come up: {:?}",
            child.try_wait()
        );
        Backend {
            child: Some(child),
            socket,
        }
    }

    /// Its vhost-user socket.
    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    /// Waits for the backend to end by itself once its frontend is gone and requires exit 0;
    /// returns its socket path, for checks on what it left behind.
    pub(crate) fn expect_clean_exit(self) -> PathBuf {
        let socket = self.socket.clone();
        let status = self.wait();
        assert!(
            status.success(),
            "backend on {}: {status}",
            socket.display()
        );
        socket
    }

    /// Waits for the backend to end by itself once its frontend is gone.
    pub(crate) fn wait(mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        let pid = child.id();
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let status = child.wait();
            let _ = tx.send(());
            status
        });
        if rx.recv_timeout(BACKEND_EXIT_TIMEOUT).is_err() {
            // The child is with the waiting thread: end it by its pid, so the test does not hang.
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!(
                "the backend on {} still runs {BACKEND_EXIT_TIMEOUT:?} after QEMU exited",
                self.socket.display()
            );
        }
        waiter.join().unwrap().unwrap()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
