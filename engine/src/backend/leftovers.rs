//! Processes a dead daemon's sandboxes left running. A microVM's VM and device processes
//! carry their sandbox's directory (`STATE_DIR/sandboxes/<id>/`) in their arguments, and under
//! live restore nothing ties them to the daemon: when the next daemon does not take a sandbox
//! back (its record refused or lost), they are found here and killed. (A namespace sandbox's
//! processes are found through its cgroups.)

use std::path::Path;

use super::supervised::{pidfd_kill, pidfd_open};

/// Kills every process whose arguments name a sandbox directory under `state_dir` other than
/// those of `keep`; returns how many it killed.
pub fn kill_leftover_processes(state_dir: &Path, keep: &[String]) -> usize {
    let prefix = format!("{}/", state_dir.join("sandboxes").display());
    let Ok(proc) = std::fs::read_dir("/proc") else {
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
        let Some(id) = sandbox_of(pid, &prefix) else {
            continue;
        };
        if keep.contains(&id) {
            continue;
        }
        // The pidfd pins the process; its arguments are read again through it being alive,
        // so a pid reused in between is not killed.
        let Ok(pidfd) = pidfd_open(pid) else {
            continue;
        };
        if sandbox_of(pid, &prefix).as_ref() != Some(&id) {
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

/// The sandbox id whose directory (`prefix` + id + `/`) an argument of `pid` names.
fn sandbox_of(pid: i32, prefix: &str) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    sandbox_in_args(&cmdline, prefix)
}

/// The sandbox id whose directory an argument of `cmdline` (NUL-separated) names.
fn sandbox_in_args(cmdline: &[u8], prefix: &str) -> Option<String> {
    cmdline
        .split(|&b| b == 0)
        .filter_map(|arg| std::str::from_utf8(arg).ok())
        .find_map(|arg| {
            let at = arg.find(prefix)?;
            let (id, _) = arg[at + prefix.len()..].split_once('/')?;
            crate::ids::is_valid_id(id).then(|| id.to_string())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "sb-0123456789abcdef";

    #[test]
    fn a_sandbox_is_found_in_any_argument_naming_its_directory() {
        let prefix = "/var/lib/crucible/sandboxes/";
        let args = |list: &[&str]| list.join("\0").into_bytes();
        let vsock = format!("--uds={prefix}{ID}/vsock.sock");
        assert_eq!(
            sandbox_in_args(&args(&["qemu", "-chardev", &vsock]), prefix),
            Some(ID.to_string())
        );
        let config = format!("{prefix}{ID}/vm.json");
        assert_eq!(
            sandbox_in_args(&args(&["crucible-vmm", "--config", &config]), prefix),
            Some(ID.to_string())
        );
        // Not a sandbox's directory: the directory itself, another id shape, another tree.
        assert_eq!(sandbox_in_args(&args(&["ls", prefix]), prefix), None);
        let odd = format!("{prefix}../etc/passwd");
        assert_eq!(sandbox_in_args(&args(&["cat", &odd]), prefix), None);
        let other = format!("/elsewhere/sandboxes/{ID}/vm.json");
        assert_eq!(sandbox_in_args(&args(&["x", &other]), prefix), None);
        assert_eq!(sandbox_in_args(b"", prefix), None);
    }

    #[test]
    fn a_leftover_is_killed_unless_its_sandbox_is_kept() {
        let state = tempfile::tempdir().expect("temp dir");
        let dir = state.path().join("sandboxes").join(ID);
        let prefix = format!("{}/", state.path().join("sandboxes").display());
        let spawn = || {
            let child = std::process::Command::new("sh")
                .args([
                    "-c",
                    "sleep 30; true",
                    &format!("{}/vm.json", dir.display()),
                ])
                .spawn()
                .expect("spawn sh");
            // Until it has exec'ed sh, the child's arguments are still this test's.
            let pid = i32::try_from(child.id()).expect("a pid");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while sandbox_of(pid, &prefix).as_deref() != Some(ID) {
                assert!(std::time::Instant::now() < deadline, "sh never started");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            child
        };
        let mut kept = spawn();
        assert_eq!(kill_leftover_processes(state.path(), &[ID.to_string()]), 0);
        assert_eq!(kept.try_wait().expect("wait"), None, "a kept one runs on");
        let _ = kept.kill();
        let _ = kept.wait();

        let mut left = spawn();
        assert_eq!(kill_leftover_processes(state.path(), &[]), 1);
        let status = left.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "{status}"
        );
    }
}
