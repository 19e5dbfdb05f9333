//! The peers measured in the same run: the host floor (fork+exec, posix_spawn, a Unix-socket
//! ping-pong and byte stream, a host tar extraction), namespace tools (bubblewrap one-shot,
//! `nsenter` into a running sandbox, `unshare` + `pivot_root`), and QEMU's microvm machine where
//! the host's KVM can boot our kernel.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use host_probe::host::HostKind;

use super::stats::{ms, Runs};

/// Runs `f` `warmup` times unmeasured, then `runs` × `n` measured, returning the samples.
pub(crate) fn repeat(
    runs: usize,
    n: usize,
    warmup: usize,
    mut f: impl FnMut() -> Result<f64>,
) -> Result<Runs> {
    for _ in 0..warmup {
        f()?;
    }
    let mut out = Runs::default();
    for _ in 0..runs {
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            samples.push(f()?);
        }
        out.push(samples);
    }
    Ok(out)
}

/// The host's `true`.
pub(crate) fn host_true() -> Result<CString> {
    for candidate in ["/bin/true", "/usr/bin/true"] {
        if Path::new(candidate).exists() {
            return CString::new(candidate).context("path with NUL");
        }
    }
    bail!("the host has no /bin/true")
}

/// One plain `fork` + `execv("true")` + `waitpid`, in milliseconds.
pub(crate) fn fork_exec_once(path: &CString) -> Result<f64> {
    let argv = [path.as_ptr(), std::ptr::null()];
    let started = Instant::now();
    // SAFETY: fork(2); the child only calls the async-signal-safe execv(2) and _exit(2) with
    // pointers prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: argv is a NULL-terminated array of valid C strings that outlive the call.
        unsafe {
            libc::execv(path.as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
    }
    if pid < 0 {
        bail!("fork failed: {}", std::io::Error::last_os_error());
    }
    wait_ok(pid)?;
    Ok(ms(started.elapsed()))
}

/// A burst of `n` fork+exec round trips (after `n / 10` unmeasured) in a fresh helper process
/// (this binary's hidden `bench-floor`), whose small address space keeps fork's page-table
/// copy what it is for a plain process; milliseconds.
pub(crate) fn fork_exec_burst(n: usize) -> Result<Vec<f64>> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let output = Command::new(exe)
        .args(["floor", "--spawns", &n.to_string()])
        .stdin(Stdio::null())
        .output()
        .context("running the floor helper")?;
    if !output.status.success() {
        bail!(
            "the floor helper failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    serde_json::from_slice(&output.stdout).context("parsing the floor helper's samples")
}

/// `bench-floor`: prints the samples of a fork+exec burst as a JSON array.
#[derive(clap::Args, Debug)]
pub(crate) struct FloorArgs {
    /// How many measured spawns.
    #[arg(long)]
    spawns: usize,
}

/// Runs the floor helper.
pub(crate) fn run_floor(args: FloorArgs) -> Result<()> {
    let path = host_true()?;
    for _ in 0..args.spawns / 10 {
        fork_exec_once(&path)?;
    }
    let samples = (0..args.spawns)
        .map(|_| fork_exec_once(&path))
        .collect::<Result<Vec<f64>>>()?;
    println!(
        "{}",
        serde_json::to_string(&samples).context("serializing")?
    );
    Ok(())
}

/// One `posix_spawn("true")` + `waitpid`, in milliseconds.
pub(crate) fn posix_spawn_once(path: &CString) -> Result<f64> {
    let argv = [path.as_ptr() as *mut libc::c_char, std::ptr::null_mut()];
    let envp = [std::ptr::null_mut::<libc::c_char>()];
    let mut pid: libc::pid_t = 0;
    let started = Instant::now();
    // SAFETY: every pointer is valid for the call; null attributes and file actions are
    // allowed; argv and envp are NULL-terminated.
    let rc = unsafe {
        libc::posix_spawn(
            &mut pid,
            path.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            argv.as_ptr(),
            envp.as_ptr(),
        )
    };
    if rc != 0 {
        bail!(
            "posix_spawn failed: {}",
            std::io::Error::from_raw_os_error(rc)
        );
    }
    wait_ok(pid)?;
    Ok(ms(started.elapsed()))
}

fn wait_ok(pid: libc::pid_t) -> Result<()> {
    let mut status = 0;
    // SAFETY: waitpid(2) on our own child with a valid status pointer.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    if rc != pid {
        bail!("waitpid failed: {}", std::io::Error::last_os_error());
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        bail!("`true` did not exit 0 (wait status {status})");
    }
    Ok(())
}

/// Round trips of one byte over a Unix socket pair to an echoing thread, in milliseconds.
pub(crate) fn unix_pingpong(runs: usize, n: usize) -> Result<Runs> {
    let (mut a, mut b) = UnixStream::pair().context("socketpair")?;
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        while b.read_exact(&mut byte).is_ok() {
            if b.write_all(&byte).is_err() {
                break;
            }
        }
    });
    let mut byte = [0u8; 1];
    let result = repeat(runs, n, n / 10, || {
        let started = Instant::now();
        a.write_all(b"x")?;
        a.read_exact(&mut byte)?;
        Ok(ms(started.elapsed()))
    });
    drop(a);
    let _ = echo.join();
    result
}

/// Streams `bytes` in 64 KiB writes through a Unix socket pair between two threads; GiB/s.
pub(crate) fn unix_stream_gibps(bytes: u64) -> Result<f64> {
    let (mut a, mut b) = UnixStream::pair().context("socketpair")?;
    let started = Instant::now();
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let chunk = vec![0u8; 64 * 1024];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            a.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        Ok(())
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    while got < bytes {
        let n = b.read(&mut buf).context("reading the stream")?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let elapsed = started.elapsed();
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("the writer thread panicked"))?
        .context("writing the stream")?;
    if got != bytes {
        bail!("the stream ended after {got} of {bytes} bytes");
    }
    Ok(gib_per_s(bytes, elapsed.as_secs_f64()))
}

/// Runs the image's own binary (`rootfs/bin/<cmd[0]>`, static busybox) on the host with its
/// stdout on a pipe this process reads; GiB/s. The floor of a stdout stream: the command alone.
pub(crate) fn host_command_gibps(rootfs: &Path, cmd: &[String], bytes: u64) -> Result<f64> {
    let (program, args) = cmd.split_first().context("empty command")?;
    let started = Instant::now();
    // The image's busybox itself (its applet links point at /bin/busybox, an absolute path
    // that would resolve on the host).
    let mut child = Command::new(rootfs.join("bin/busybox"))
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting the image's {program} on the host"))?;
    let mut out = child.stdout.take().context("no stdout pipe")?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    loop {
        let n = out.read(&mut buf).context("reading the pipe")?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let status = child.wait().context("waiting for the command")?;
    let elapsed = started.elapsed();
    if !status.success() || got != bytes {
        bail!("{cmd:?} on the host wrote {got} of {bytes} bytes ({status})");
    }
    Ok(gib_per_s(bytes, elapsed.as_secs_f64()))
}

/// Bytes over seconds in GiB/s.
pub(crate) fn gib_per_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64 / seconds.max(1e-9)
}

/// Extracts a tar on the host into a fresh directory on tmpfs (`/dev/shm` when present, as a
/// sandbox's `/tmp` is tmpfs), in milliseconds.
pub(crate) fn host_extract_ms(tar: &[u8]) -> Result<f64> {
    let base = if Path::new("/dev/shm").is_dir() {
        Path::new("/dev/shm")
    } else {
        Path::new("/tmp")
    };
    let dir = tempfile::Builder::new()
        .prefix("crucible-bench-extract-")
        .tempdir_in(base)
        .context("temporary directory for the host extraction")?;
    let started = Instant::now();
    tar::Archive::new(tar)
        .unpack(dir.path())
        .context("extracting on the host")?;
    Ok(ms(started.elapsed()))
}

/// Runs a command to completion, requiring success; milliseconds.
pub(crate) fn command_ms(cmd: &mut Command) -> Result<f64> {
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let started = Instant::now();
    let output = cmd
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("starting {}", crate::util::describe(cmd)))?;
    let elapsed = started.elapsed();
    if !output.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            crate::util::describe(cmd),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(ms(elapsed))
}

/// Finds `tool` on PATH, installing `package` with apt when it is missing (saying so). The error
/// is the reason to print for skipping.
pub(crate) fn ensure_tool(tool: &str, package: &str) -> Result<String, String> {
    let find = || {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(tool))
                .find(|p| p.is_file())
                .map(|p| p.display().to_string())
        })
    };
    if let Some(path) = find() {
        return Ok(path);
    }
    eprintln!(
        "    {tool} is missing: installing Debian's {package} with apt-get (a benchmark peer)"
    );
    let note = |note: &str| eprintln!("    {note}");
    let install = |update: bool| {
        if update {
            let _ = guest_image::apt::apt_get(&["update", "-qq"], &note)
                .stdout(Stdio::null())
                .status();
        }
        guest_image::apt::apt_get(&["install", "-y", "-qq", package], &note)
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !install(false) {
        install(true);
    }
    find().ok_or_else(|| format!("{tool} is not installed and `apt-get install {package}` failed"))
}

/// `bwrap` running the image's `true` in fresh namespaces: a tmpfs root with the image's
/// `/bin` bound read-only, private `/proc`, `/dev` and `/tmp`, every namespace unshared.
pub(crate) fn bwrap_command(bwrap: &str, rootfs: &Path) -> Command {
    let mut cmd = Command::new(bwrap);
    cmd.arg("--tmpfs")
        .arg("/")
        .arg("--ro-bind")
        .arg(rootfs.join("bin"))
        .arg("/bin")
        .args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"])
        .args(["--unshare-all", "--die-with-parent", "--", "/bin/true"]);
    cmd
}

/// The shell script for the `unshare` + `pivot_root` peer: a tmpfs root holding the image's
/// `/bin` (bound) and a private `/proc`, pivoted into, the old root detached, then `true`.
pub(crate) const UNSHARE_SCRIPT: &str = "set -e; mount -t tmpfs -o size=16m tmpfs \"$2\"; \
    mkdir \"$2/bin\" \"$2/proc\" \"$2/dev\" \"$2/tmp\"; mount --bind \"$1/bin\" \"$2/bin\"; \
    mount -t proc proc \"$2/proc\"; cd \"$2\"; pivot_root . .; umount -l .; exec /bin/true";

/// `unshare` (new mount, UTS, IPC, network and PID namespaces) running [`UNSHARE_SCRIPT`].
pub(crate) fn unshare_command(unshare: &str, rootfs: &Path, scratch: &Path) -> Command {
    let mut cmd = Command::new(unshare);
    cmd.args([
        "--mount",
        "--uts",
        "--ipc",
        "--net",
        "--pid",
        "--fork",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        UNSHARE_SCRIPT,
        "sh",
    ])
    .arg(rootfs)
    .arg(scratch);
    cmd
}

/// `nsenter` into every namespace (and the root) of a running sandbox's PID 1, running its
/// `true`: how `docker exec` / `runc exec` reach a running container.
pub(crate) fn nsenter_command(nsenter: &str, init_pid: u32) -> Command {
    let mut cmd = Command::new(nsenter);
    cmd.arg("--target")
        .arg(init_pid.to_string())
        .args(["--all", "/bin/true"]);
    cmd
}

/// Why QEMU's microvm machine cannot boot our kernel here, or `None` when it can be tried:
/// with the QEMU binary and its accelerator printed either way.
pub(crate) fn qemu_microvm_unavailable(image: &Path) -> Option<String> {
    let report = engine::host::inspect();
    let qemu = [
        "/usr/bin/qemu-system-x86_64",
        "/usr/local/bin/qemu-system-x86_64",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists());
    let accel = match report.kvm {
        HostKind::KvmIntel | HostKind::KvmAmd => "-accel kvm",
        HostKind::KvmPvm => "-accel kvm (kvm_pvm)",
        HostKind::Unknown => "-accel kvm (unknown KVM module)",
        HostKind::None => "-accel tcg",
    };
    eprintln!(
        "    QEMU microvm peer: {} with {accel}",
        qemu.unwrap_or("(qemu-system-x86 not installed)")
    );
    if !report.kvm.boots_stock_kernel() {
        return Some(format!(
            "{} (QEMU with KVM booting the same kernel hits the same limit; under TCG it boots, measured below as the qemu-tcg hypervisor)",
            engine::host::kvm_unavailable_reason(&report).unwrap_or_default()
        ));
    }
    let kernel = image.join("vmlinux");
    if !kernel.is_file() {
        return Some(format!(
            "no kernel at {} (cargo xtask build-image)",
            kernel.display()
        ));
    }
    if qemu.is_none() {
        return Some(
            "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)".into(),
        );
    }
    Some(
        "the QEMU microvm peer runs only beside the microVM backend, which this build lacks".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_runs() -> Result<()> {
        let t = host_true()?;
        assert!(fork_exec_once(&t)? > 0.0);
        assert!(posix_spawn_once(&t)? > 0.0);
        let runs = unix_pingpong(2, 50)?;
        assert_eq!(runs.samples.len(), 100);
        assert!(unix_stream_gibps(1 << 20)? > 0.0);
        Ok(())
    }
}
