//! Builds the sandbox's root and pivots into it.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use crate::sys::{check, cstring, SysError};
use crate::{SandboxSpec, SANDBOX_RUNTIME_DIR};

fn mount(
    source: &str,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), SysError> {
    let step = || {
        format!(
            "mount {source} ({}) on {} with {:?}",
            fstype.unwrap_or("bind"),
            target.display(),
            data.unwrap_or("")
        )
    };
    let source_c = cstring(Path::new(source))?;
    let target_c = cstring(target)?;
    let fstype_c = fstype.map(|f| cstring(Path::new(f))).transpose()?;
    let data_c = data.map(|d| cstring(Path::new(d))).transpose()?;
    // SAFETY: every pointer is either null or a NUL-terminated string that outlives the call.
    let ret = unsafe {
        libc::mount(
            source_c.as_ptr(),
            target_c.as_ptr(),
            fstype_c.as_ref().map_or(std::ptr::null(), |f| f.as_ptr()),
            flags,
            data_c
                .as_ref()
                .map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    check(ret, step)
}

fn mkdir(path: &Path) -> Result<(), SysError> {
    fs::create_dir_all(path).map_err(|e| SysError::io(format!("mkdir {}", path.display()), e))
}

/// Overlay options are comma- and colon-separated: paths containing them cannot be passed.
fn overlay_safe(path: &Path) -> Result<&str, SysError> {
    let text = path.to_str().filter(|p| !p.contains([',', ':', '\\']));
    text.ok_or_else(|| {
        SysError::io(
            format!("overlay path {}", path.display()),
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "must be UTF-8 without ',', ':' or '\\'",
            ),
        )
    })
}

const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

pub(crate) fn build_root(spec: &SandboxSpec) -> Result<(), SysError> {
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
    // Nothing we mount from here on may propagate back to the host.
    mount(
        "none",
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;

    let scratch = spec.runtime_dir.join("scratch");
    let root = spec.runtime_dir.join("root");
    mkdir(&scratch)?;
    mkdir(&root)?;
    let size = format!("size={}m,mode=0755", spec.scratch_mib);
    mount("tmpfs", &scratch, Some("tmpfs"), nosuid_nodev, Some(&size))?;
    let upper = scratch.join("upper");
    let work = scratch.join("work");
    mkdir(&upper)?;
    mkdir(&work)?;
    // `/tmp` and `/dev/shm` live on the same tmpfs as the overlay's upper layer, so that one
    // size bounds every byte a command can write (a tmpfs each would multiply it).
    let scratch_tmp = scratch.join("tmp");
    let scratch_shm = scratch.join("shm");
    for dir in [&scratch_tmp, &scratch_shm] {
        mkdir(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o1777))
            .map_err(|e| SysError::io(format!("chmod 1777 {}", dir.display()), e))?;
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        overlay_safe(&spec.rootfs)?,
        overlay_safe(&upper)?,
        overlay_safe(&work)?
    );
    mount(
        "overlay",
        &root,
        Some("overlay"),
        libc::MS_NOSUID,
        Some(&options),
    )?;

    for dir in ["proc", "dev", "tmp", "run/crucible"] {
        mkdir(&root.join(dir))?;
    }
    let inside_runtime = root.join(SANDBOX_RUNTIME_DIR.trim_start_matches('/'));
    let runtime = spec.runtime_dir.to_string_lossy();
    mount(&runtime, &inside_runtime, None, libc::MS_BIND, None)?;

    build_dev(&root.join("dev"), &scratch_shm)?;
    bind_with_flags(&scratch_tmp, &root.join("tmp"), nosuid_nodev)?;

    pivot_into(&root)?;
    mount(
        "proc",
        Path::new("/proc"),
        Some("proc"),
        nosuid_nodev | libc::MS_NOEXEC,
        None,
    )
}

/// Binds `source` on `target`, then applies `flags` to the new mount (a bind ignores them).
fn bind_with_flags(source: &Path, target: &Path, flags: libc::c_ulong) -> Result<(), SysError> {
    let source = source.to_string_lossy();
    mount(&source, target, None, libc::MS_BIND, None)?;
    mount(
        "none",
        target,
        None,
        libc::MS_REMOUNT | libc::MS_BIND | flags,
        None,
    )
}

fn build_dev(dev: &Path, shm_source: &Path) -> Result<(), SysError> {
    let flags = libc::MS_NOSUID | libc::MS_NOEXEC;
    mount(
        "tmpfs",
        dev,
        Some("tmpfs"),
        flags,
        Some("size=64k,mode=0755"),
    )?;
    for name in DEVICES {
        let node = dev.join(name);
        fs::File::create(&node)
            .map_err(|e| SysError::io(format!("create {}", node.display()), e))?;
        mount(&format!("/dev/{name}"), &node, None, libc::MS_BIND, None)?;
    }
    let pts = dev.join("pts");
    mkdir(&pts)?;
    mount(
        "devpts",
        &pts,
        Some("devpts"),
        flags,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )?;
    let shm = dev.join("shm");
    mkdir(&shm)?;
    bind_with_flags(shm_source, &shm, flags | libc::MS_NODEV)?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let path = dev.join(link);
        symlink(target, &path)
            .map_err(|e| SysError::io(format!("symlink {} -> {target}", path.display()), e))?;
    }
    Ok(())
}

/// Makes `root` the new `/` and detaches the old root entirely.
fn pivot_into(root: &Path) -> Result<(), SysError> {
    std::env::set_current_dir(root)
        .map_err(|e| SysError::io(format!("chdir {}", root.display()), e))?;
    let dot = cstring(Path::new("."))?;
    // SAFETY: both arguments are the NUL-terminated string ".", valid for the call. Stacking
    // the old root under the new one and detaching it avoids needing a put_old directory.
    let ret = unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) };
    check(ret as libc::c_int, || {
        format!("pivot_root into {}", root.display())
    })?;
    // SAFETY: `dot` is a valid NUL-terminated path.
    let ret = unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) };
    check(ret, || "detach the host's root".into())?;
    std::env::set_current_dir("/").map_err(|e| SysError::io("chdir /", e))
}
