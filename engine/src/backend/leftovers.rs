//! Processes a dead daemon's microVMs left running. Under live restore nothing ties a VM or its
//! device processes to the daemon: when the next daemon does not take a sandbox back (its
//! record refused or lost), they are found here and killed. (A namespace sandbox's processes
//! are found through its cgroups.)
//!
//! Such a process is in no cgroup of ours, so it is told apart from everything else on the host
//! by three things, all of which must hold, or it is left alone:
//!
//! - its executable is one the daemon starts for microVMs: the configured `crucible-vmm` (the
//!   VMM, and under QEMU each vhost-user device) or the QEMU the `qemu-tcg` hypervisor finds on
//!   `PATH`, compared by file identity, not by name;
//! - it runs in the daemon's own mount namespace, where the paths in its arguments mean what
//!   they mean to the daemon;
//! - an argument names exactly one sandbox directory, `STATE_DIR/sandboxes/<id>/`, in a shape
//!   those processes are started with (`sandbox_in_arg`), anchored at the start of the path,
//!   so neither an operator's `tail -f …/sandboxes/sb-…/console.log` nor the VMs of a daemon
//!   whose state directory merely has this one's as a prefix (`/var/lib/crucible2/…` beside
//!   `/var/lib/crucible/…`) are taken for ours.
//!
//! Every check is made again once a pidfd pins the process, so a pid reused in between is not
//! killed. The scan reads all of `/proc`: callers on an async runtime run it on a blocking
//! thread.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::qemu::find_on_path;
use super::supervised::{pidfd_kill, pidfd_open};
use crate::settings::EngineConfig;

/// What tells this daemon's leftover microVM processes from any other process: where its
/// sandboxes live and the programs it runs for them.
#[derive(Debug, Clone)]
pub struct LeftoverScan {
    state_dir: PathBuf,
    programs: Vec<PathBuf>,
}

impl LeftoverScan {
    /// A scan for the sandboxes under `state_dir` whose processes run one of `programs` (as
    /// configured: a bare name is looked up on `PATH`, as starting it would).
    pub fn new(state_dir: PathBuf, programs: Vec<PathBuf>) -> Self {
        LeftoverScan {
            state_dir,
            programs,
        }
    }

    /// The scan for `config`'s daemon: its `crucible-vmm` and, whichever hypervisor is
    /// configured now, the QEMU `qemu-tcg` runs (its bare name, found on `PATH` when the scan
    /// runs, as `QemuTools::find` finds it), since the leftovers are the previous daemon's,
    /// which may have run the other one. Nothing is read from disk until the scan.
    pub fn for_config(config: &EngineConfig) -> Self {
        LeftoverScan::new(
            config.state_dir.clone(),
            vec![
                config.vmm_binary.clone(),
                PathBuf::from(contract::qemu::BINARY),
            ],
        )
    }

    /// Kills every leftover process of a sandbox other than those of `keep`; returns how many
    /// it killed. Blocking: it reads all of `/proc`.
    pub fn kill(&self, keep: &[String]) -> usize {
        let Some(ours) = Ours::resolve(self) else {
            return 0;
        };
        let Ok(proc) = std::fs::read_dir("/proc") else {
            tracing::warn!("looking for leftover VM processes: cannot read /proc");
            return 0;
        };
        let mut killed = 0;
        for entry in proc.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<i32>().ok())
            else {
                continue;
            };
            let Some(id) = ours.sandbox_of(pid) else {
                continue;
            };
            if keep.contains(&id) {
                continue;
            }
            // The pidfd pins the process; every check is made again with it held, so a pid
            // reused since the first look is not killed (if the pinned one has exited and its
            // pid is reused again, the kill goes to the dead process and does nothing).
            let Ok(pidfd) = pidfd_open(pid) else {
                continue;
            };
            if ours.sandbox_of(pid).as_ref() != Some(&id) {
                continue;
            }
            match pidfd_kill(&pidfd) {
                Ok(()) => {
                    tracing::info!("killed pid {pid}, a process of sandbox {id} left running");
                    killed += 1;
                }
                Err(e) => tracing::warn!("killing pid {pid} of sandbox {id} left running: {e}"),
            }
        }
        killed
    }
}

/// A file's identity: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    /// The identity of the file `path` resolves to (through symlinks and `/proc`'s magic links).
    fn of(path: impl AsRef<Path>) -> Option<FileId> {
        let meta = std::fs::metadata(path).ok()?;
        Some(FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

/// One program the daemon runs for microVMs, resolved.
#[derive(Debug)]
struct Program {
    /// The file it is now, if it exists.
    file: Option<FileId>,
    /// Its absolute path, symlinks resolved where it exists.
    path: PathBuf,
}

/// A [`LeftoverScan`] resolved for one pass over `/proc`.
#[derive(Debug)]
struct Ours {
    /// `STATE_DIR/sandboxes/`, as the backend spells the sandbox directories it creates.
    sandboxes: Vec<u8>,
    programs: Vec<Program>,
    mount_ns: FileId,
}

impl Ours {
    /// `None` when the daemon's own mount namespace cannot be read: then no process can be
    /// shown to be ours.
    fn resolve(scan: &LeftoverScan) -> Option<Ours> {
        let Some(mount_ns) = FileId::of("/proc/self/ns/mnt") else {
            tracing::warn!(
                "looking for leftover VM processes: cannot read /proc/self/ns/mnt; killing none"
            );
            return None;
        };
        let mut sandboxes = scan
            .state_dir
            .join("sandboxes")
            .as_os_str()
            .as_bytes()
            .to_vec();
        sandboxes.push(b'/');
        let programs = scan.programs.iter().map(|p| resolve_program(p)).collect();
        Some(Ours {
            sandboxes,
            programs,
            mount_ns,
        })
    }

    /// The sandbox whose leftover `pid` is, if it passes every check.
    fn sandbox_of(&self, pid: i32) -> Option<String> {
        // The arguments first: readable for every process, and they rule out nearly all.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let id = sandbox_in_args(&cmdline, &self.sandboxes)?;
        let in_our_mount_ns =
            FileId::of(format!("/proc/{pid}/ns/mnt")).is_some_and(|ns| ns == self.mount_ns);
        (in_our_mount_ns && self.runs_a_program(pid)).then_some(id)
    }

    /// Whether `pid`'s executable is one of the programs.
    fn runs_a_program(&self, pid: i32) -> bool {
        let exe = format!("/proc/{pid}/exe");
        // The magic link resolves to the very file the process runs, deleted or not.
        if let Some(file) = FileId::of(&exe) {
            if self.programs.iter().any(|p| p.file == Some(file)) {
                return true;
            }
        }
        // An upgrade replaces the binary (a new file renamed over the old one) while the VMs
        // started from the old one run on: those are exactly the leftovers a daemon started
        // from the new binary must find, yet the file they run is no longer at the path. The
        // kernel names it by its old path with " (deleted)" appended, so that path is accepted
        // too. Only a process whose file is gone qualifies, and only at the configured path.
        let Ok(link) = std::fs::read_link(&exe) else {
            return false;
        };
        link.as_os_str()
            .as_bytes()
            .strip_suffix(b" (deleted)")
            .is_some_and(|old| {
                self.programs
                    .iter()
                    .any(|p| p.path.as_os_str().as_bytes() == old)
            })
    }
}

/// `program` as the kernel would name it in `/proc/PID/exe`: a bare name looked up on `PATH`
/// (as `Command` does), then made absolute with symlinks resolved.
fn resolve_program(program: &Path) -> Program {
    let bare = !program.as_os_str().as_bytes().contains(&b'/');
    let found = bare
        .then(|| program.to_str().and_then(find_on_path))
        .flatten()
        .unwrap_or_else(|| program.to_path_buf());
    let path = std::fs::canonicalize(&found)
        .or_else(|_| std::path::absolute(&found))
        .unwrap_or(found);
    Program {
        file: FileId::of(&path),
        path,
    }
}

/// The one sandbox whose directory the arguments of `cmdline` (NUL-separated, the program's
/// name first) name, under `sandboxes` (`STATE_DIR/sandboxes/`). Arguments naming two
/// sandboxes are no VM or device process of ours.
fn sandbox_in_args(cmdline: &[u8], sandboxes: &[u8]) -> Option<String> {
    let mut found: Option<&[u8]> = None;
    for arg in cmdline.split(|&b| b == 0).skip(1) {
        let Some(id) = sandbox_in_arg(arg, sandboxes) else {
            continue;
        };
        match found {
            Some(other) if other != id => return None,
            _ => found = Some(id),
        }
    }
    found
        .and_then(|id| std::str::from_utf8(id).ok())
        .map(str::to_string)
}

/// The sandbox id whose directory `arg` names, in one of the two shapes our VM and device
/// processes are started with (`microvm.rs`, `qemu.rs`):
///
/// - the whole argument is a path beneath it: `crucible-vmm --config <dir>/vm.json`, the
///   vhost-user devices' `--socket <dir>/vhost-….sock`, `--uds <dir>/vsock.sock`, `--path
///   <dir>/…[:ro]`;
/// - a QEMU option list whose `path=` is such a path: `-chardev
///   socket,id=vsock,path=<dir>/vhost-vsock.sock`. (A state directory with a comma in it
///   would need QEMU's `,,` escape, which the backend does not write: such a VM is not found,
///   the safe way to be wrong.)
fn sandbox_in_arg<'a>(arg: &'a [u8], sandboxes: &[u8]) -> Option<&'a [u8]> {
    if let Some(id) = sandbox_in_path(arg, sandboxes) {
        return Some(id);
    }
    // The first element is the chardev's backend (`socket`), never the path.
    arg.split(|&b| b == b',')
        .skip(1)
        .find_map(|opt| sandbox_in_path(opt.strip_prefix(b"path=")?, sandboxes))
}

/// The sandbox id of `path` if it is a path beneath `<sandboxes><id>/` (not the directory
/// itself, nothing climbing out of it with `..`).
fn sandbox_in_path<'a>(path: &'a [u8], sandboxes: &[u8]) -> Option<&'a [u8]> {
    let rest = path.strip_prefix(sandboxes)?;
    let slash = rest.iter().position(|&b| b == b'/')?;
    let (id, within) = (&rest[..slash], &rest[slash + 1..]);
    let valid = std::str::from_utf8(id).is_ok_and(crate::ids::is_valid_id);
    let inside = !within.is_empty() && !within.split(|&b| b == b'/').any(|c| c == b"..");
    (valid && inside).then_some(id)
}

#[cfg(test)]
mod tests {
    use std::ffi::{OsStr, OsString};
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    use super::super::qemu::{block_device_args, qemu_args, vsock_device_args, QemuGuest};
    use super::*;

    const ID: &str = "sb-0123456789abcdef";
    const SANDBOXES: &[u8] = b"/var/lib/crucible/sandboxes/";

    /// `args` as `/proc/PID/cmdline` holds them.
    fn cmdline_of<S: AsRef<OsStr>>(args: &[S]) -> Vec<u8> {
        let mut out = Vec::new();
        for arg in args {
            out.extend_from_slice(arg.as_ref().as_bytes());
            out.push(0);
        }
        out
    }

    fn found(args: &[&str]) -> Option<String> {
        sandbox_in_args(&cmdline_of(args), SANDBOXES)
    }

    fn dir() -> String {
        format!("/var/lib/crucible/sandboxes/{ID}")
    }

    #[test]
    fn the_vmm_and_device_arguments_name_their_sandbox() {
        let dir = PathBuf::from(dir());
        let with_program = |args: Vec<OsString>| {
            let mut all = vec![OsString::from("crucible-vmm")];
            all.extend(args);
            sandbox_in_args(&cmdline_of(&all), SANDBOXES)
        };
        let config = format!("{}/vm.json", dir.display());
        assert_eq!(
            found(&["crucible-vmm", "--config", &config]),
            Some(ID.into())
        );
        let vsock = vsock_device_args(&dir.join("vhost-vsock.sock"), 3, &dir.join("vsock.sock"));
        assert_eq!(with_program(vsock), Some(ID.into()));
        let block = block_device_args(&dir.join("vhost-root.sock"), &dir.join("root"), true, None);
        assert_eq!(with_program(block), Some(ID.into()));
        // Only QEMU's `path=` names it (its kernel and initramfs are the image's).
        let guest = QemuGuest {
            kernel: Path::new("/img/vmlinux"),
            initramfs: Path::new("/img/initramfs.cpio"),
            cmdline: "crucible.boot_marker=1",
            memory_mib: 512,
            vcpus: 1,
            vsock_socket: &dir.join("vhost-vsock.sock"),
            root_disk_socket: None,
            disk_sockets: &[],
            console: Path::new("/elsewhere/console.log"),
            kvm: false,
        };
        let mut qemu = vec![OsString::from("qemu-system-x86_64")];
        qemu.extend(qemu_args(&guest));
        assert_eq!(
            sandbox_in_args(&cmdline_of(&qemu), SANDBOXES),
            Some(ID.into())
        );
    }

    #[test]
    fn an_argument_names_a_sandbox_only_anchored_at_its_directory() {
        let dir = dir();
        // The second daemon's state directory has this one's as a prefix string.
        let second = format!("/var/lib/crucible2/sandboxes/{ID}/vm.json");
        assert_eq!(found(&["crucible-vmm", "--config", &second]), None);
        // Somewhere inside an argument is not enough.
        for arg in [
            format!("/tmp{dir}/vm.json"),
            format!("x{dir}/vm.json"),
            format!("--config={dir}/vm.json"),
            format!("file:{dir}/console.log"),
            format!("socket,id=vsock,path=/tmp{dir}/vhost-vsock.sock"),
        ] {
            assert_eq!(found(&["x", &arg]), None, "{arg}");
        }
        // Not a sandbox's directory: the directory itself, the tree, another id shape, a climb.
        for arg in [
            dir.clone(),
            format!("{dir}/"),
            "/var/lib/crucible/sandboxes/".to_string(),
            "/var/lib/crucible/sandboxes/sb-xyz/vm.json".to_string(),
            format!("/var/lib/crucible/sandboxes/{ID}x/vm.json"),
            format!("{dir}/../../../../etc/passwd"),
            format!("/elsewhere/sandboxes/{ID}/vm.json"),
        ] {
            assert_eq!(found(&["x", &arg]), None, "{arg}");
        }
        // The program's own name is no argument.
        assert_eq!(found(&[&format!("{dir}/vmm")]), None);
        assert_eq!(sandbox_in_args(b"", SANDBOXES), None);
    }

    #[test]
    fn only_a_qemu_option_lists_path_counts() {
        let dir = dir();
        let opts = |s: &str| found(&["qemu", "-chardev", s]);
        assert_eq!(
            opts(&format!("socket,id=disk0,path={dir}/vhost-disk0.sock")),
            Some(ID.into())
        );
        assert_eq!(
            opts(&format!("socket,path={dir}/vhost-disk0.sock,id=disk0")),
            Some(ID.into())
        );
        // Another key, the backend's place, or a value that runs into the next option.
        assert_eq!(opts(&format!("socket,id=a,logfile={dir}/log")), None);
        assert_eq!(opts(&format!("path={dir}/vhost.sock")), None);
        assert_eq!(opts(&format!("socket,path={dir},id=x")), None);
    }

    #[test]
    fn arguments_naming_two_sandboxes_name_none() {
        let other = "/var/lib/crucible/sandboxes/sb-fedcba9876543210/vm.json";
        let dir = dir();
        let ours = format!("{dir}/vm.json");
        assert_eq!(found(&["x", &ours, other]), None);
        let same = format!("{dir}/vsock.sock");
        assert_eq!(found(&["x", &ours, &same]), Some(ID.into()));
    }

    #[test]
    fn a_program_is_named_by_the_path_the_kernel_gives_its_executable() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let vmm = tmp.path().join("crucible-vmm");
        std::fs::write(&vmm, b"new").expect("write");
        let program = resolve_program(&vmm);
        assert!(program.file.is_some());
        // The temp dir may sit behind a symlink: the path is the resolved one.
        assert_eq!(
            program.path,
            std::fs::canonicalize(&vmm).expect("canonicalize")
        );
        // A bare name is looked up on PATH; a missing one keeps its absolute path.
        assert!(resolve_program(Path::new("sh")).path.is_absolute());
        let gone = resolve_program(&tmp.path().join("missing"));
        assert_eq!((gone.file, gone.path.is_absolute()), (None, true));
    }

    /// A state directory whose one sandbox's directory exists, and a copy of `/bin/sh` to
    /// stand in for the VMM.
    struct Host {
        state: tempfile::TempDir,
        vmm: PathBuf,
    }

    impl Host {
        fn new() -> Host {
            let state = tempfile::tempdir().expect("temp dir");
            std::fs::create_dir_all(state.path().join("sandboxes").join(ID)).expect("mkdir");
            let vmm = state.path().join("crucible-vmm");
            std::fs::copy("/bin/sh", &vmm).expect("copy /bin/sh");
            Host { state, vmm }
        }

        fn scan(&self) -> LeftoverScan {
            LeftoverScan::new(self.state.path().to_path_buf(), vec![self.vmm.clone()])
        }

        fn console(&self) -> String {
            let dir = self.state.path().join("sandboxes").join(ID);
            format!("{}/console.log", dir.display())
        }

        /// `program -c 'read x' <console>`, running until its stdin closes (dropping the
        /// child) or it is killed, once it has exec'ed `program` with those arguments.
        fn spawn(&self, program: &Path) -> Running {
            self.spawn_under(&[], program)
        }

        /// [`Host::spawn`] through `wrapper`, a program that execs the rest of its arguments.
        fn spawn_under(&self, wrapper: &[&str], program: &Path) -> Running {
            let deadline = Instant::now() + Duration::from_secs(10);
            let child = loop {
                let mut command = match wrapper.split_first() {
                    Some((first, rest)) => {
                        let mut command = Command::new(first);
                        command.args(rest).arg(program);
                        command
                    }
                    None => {
                        let mut command = Command::new(program);
                        command.arg0("sh");
                        command
                    }
                };
                let spawned = command
                    .args(["-c", "read x", &self.console()])
                    .stdin(Stdio::piped())
                    .spawn();
                match spawned {
                    Ok(child) => break child,
                    // A copy just written can be held open for writing a moment by a child
                    // another test forked before it exec'ed.
                    Err(e)
                        if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                            && Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => panic!("spawn {}: {e}", program.display()),
                }
            };
            let running = Running(child);
            let pid = running.pid();
            let want = FileId::of(program);
            // Until it has exec'ed, the child's executable and arguments are still this test's.
            while !(FileId::of(format!("/proc/{pid}/exe")) == want
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.windows(ID.len()).any(|w| w == ID.as_bytes())))
            {
                assert!(
                    Instant::now() < deadline,
                    "{} never started",
                    program.display()
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            running
        }
    }

    /// A child that is killed and reaped when dropped, so no test leaves one behind.
    struct Running(Child);

    impl Running {
        fn pid(&self) -> i32 {
            i32::try_from(self.0.id()).expect("a pid")
        }

        /// Its exit signal, waiting at most 10 s.
        fn signal(&mut self) -> Option<i32> {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(status) = self.0.try_wait().expect("wait") {
                    return std::os::unix::process::ExitStatusExt::signal(&status);
                }
                assert!(Instant::now() < deadline, "it never exited");
                std::thread::sleep(Duration::from_millis(5));
            }
        }

        /// Whether it still runs a moment later (a SIGKILL would have been delivered by then).
        fn runs_on(&mut self) -> bool {
            std::thread::sleep(Duration::from_millis(100));
            self.0.try_wait().expect("wait").is_none()
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_process_naming_a_sandbox_is_left_alone_unless_it_runs_the_vmm() {
        let host = Host::new();
        let mut other = host.spawn(Path::new("/bin/sh"));
        assert_eq!(host.scan().kill(&[]), 0);
        assert!(other.runs_on(), "a process not running the VMM is not ours");

        let mut vmm = host.spawn(&host.vmm);
        assert_eq!(host.scan().kill(&[]), 1);
        assert_eq!(vmm.signal(), Some(9));
        assert!(other.runs_on());
    }

    #[test]
    fn a_vmm_in_another_mount_namespace_is_left_alone() {
        let can_unshare = Command::new("unshare")
            .args(["-m", "true"])
            .status()
            .is_ok_and(|s| s.success());
        // Never skipped: CI runs as root, where a new mount namespace is always allowed.
        assert!(
            can_unshare,
            "unshare -m is not allowed here: this test needs root (CAP_SYS_ADMIN)"
        );
        let host = Host::new();
        let mut elsewhere = host.spawn_under(&["unshare", "-m", "--"], &host.vmm);
        assert_eq!(host.scan().kill(&[]), 0);
        assert!(elsewhere.runs_on(), "its paths are not the daemon's");
    }

    #[test]
    fn a_leftover_is_killed_unless_its_sandbox_is_kept() {
        let host = Host::new();
        let mut kept = host.spawn(&host.vmm);
        assert_eq!(host.scan().kill(&[ID.to_string()]), 0);
        assert!(kept.runs_on(), "a kept one runs on");
        drop(kept);

        let mut left = host.spawn(&host.vmm);
        assert_eq!(host.scan().kill(&[]), 1);
        assert_eq!(left.signal(), Some(9));
    }

    #[test]
    fn a_vmm_whose_binary_was_replaced_is_still_found() {
        let host = Host::new();
        let mut old = host.spawn(&host.vmm);
        // An upgrade: a new file renamed over the running one.
        let new = host.state.path().join("crucible-vmm.new");
        std::fs::copy("/bin/sh", &new).expect("copy");
        std::fs::rename(&new, &host.vmm).expect("rename");
        let exe = std::fs::read_link(format!("/proc/{}/exe", old.pid())).expect("readlink");
        assert!(exe.to_string_lossy().ends_with(" (deleted)"), "{exe:?}");
        assert_eq!(host.scan().kill(&[]), 1);
        assert_eq!(old.signal(), Some(9));
    }

    #[test]
    fn the_daemon_looks_for_its_vmm_and_qemu_whichever_hypervisor_it_runs() {
        let mut config = EngineConfig::new(PathBuf::from("/img"));
        config.vmm_binary = PathBuf::from("/opt/crucible/crucible-vmm");
        let scan = LeftoverScan::for_config(&config);
        assert_eq!(scan.state_dir, config.state_dir);
        assert_eq!(
            scan.programs,
            [
                PathBuf::from("/opt/crucible/crucible-vmm"),
                PathBuf::from(contract::qemu::BINARY)
            ]
        );
    }

    #[test]
    fn a_daemon_in_this_mount_namespace_finds_itself_there() {
        let scan = LeftoverScan::new(PathBuf::from("/nonexistent"), Vec::new());
        let ours = Ours::resolve(&scan).expect("our mount namespace");
        assert_eq!(
            FileId::of(format!("/proc/{}/ns/mnt", std::process::id())),
            Some(ours.mount_ns)
        );
    }
}
