//! Builds the sandbox's root inside its own mount namespace and pivots into it.
//!
//! Everything is mounted by the sandbox's root in its user namespace, relative to a scratch
//! tmpfs that is the working directory while building, so the mount table the sandbox sees
//! afterwards names no host path: the overlay's options read `lowerdir=lower,upperdir=upper`.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use crate::sys::{self, check, cstring, owned_fd, SysError};
use crate::SandboxSpec;

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

fn chmod(path: &Path, mode: u32) -> Result<(), SysError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| SysError::io(format!("chmod {mode:o} {}", path.display()), e))
}

const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// `/proc` entries hidden from the sandbox, as runc's default spec does: kernel memory, the
/// keyring, timers and scheduler internals (which leak host activity), hardware tables.
const MASKED: [&str; 9] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
];

/// `/proc` entries made read-only, as runc's default spec does: sysctls (a namespaced
/// network sysctl is the sandbox's own, but the kernel's are the host's), the SysRq trigger,
/// IRQ affinity, bus and filesystem settings.
const READ_ONLY: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Opens the sandbox's host runtime directory, the scratch tmpfs's mount point, while the
/// caller may still traverse the daemon's root-only state directory.
pub(crate) fn open_stage(runtime_dir: &Path) -> Result<OwnedFd, SysError> {
    sys::open_file(runtime_dir, libc::O_PATH | libc::O_DIRECTORY)
}

/// Builds the root: a scratch tmpfs on `stage` (in this mount namespace only), the idmapped
/// `image` under an overlay, `/proc`, `/dev`, `/tmp`; then pivots into it.
pub(crate) fn build_root(
    spec: &SandboxSpec,
    stage: &OwnedFd,
    image: OwnedFd,
) -> Result<(), SysError> {
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
    // Nothing mounted from here on may propagate back to the host.
    mount(
        "none",
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    let scratch = scratch_tmpfs(spec.scratch_mib)?;
    attach(&scratch, stage, "the scratch tmpfs")?;
    // SAFETY: fchdir takes a descriptor of ours: the scratch tmpfs's root.
    check(unsafe { libc::fchdir(scratch.as_raw_fd()) }, || {
        "enter the scratch tmpfs".into()
    })?;
    drop(scratch);

    // Relative to the scratch tmpfs from here on.
    let (upper, work, lower, root) = (
        Path::new("upper"),
        Path::new("work"),
        Path::new("lower"),
        Path::new("root"),
    );
    // `/tmp` and `/dev/shm` live on the same tmpfs as the overlay's upper layer, so that one
    // size bounds every byte a command can write (a tmpfs each would multiply it).
    let (scratch_tmp, scratch_shm) = (Path::new("tmp"), Path::new("shm"));
    for dir in [upper, work, lower, root, scratch_tmp, scratch_shm] {
        mkdir(dir)?;
    }
    for dir in [scratch_tmp, scratch_shm] {
        chmod(dir, 0o1777)?;
    }
    move_mount_to(&image, lower, "the image")?;
    drop(image);
    // userxattr: overlay keeps its metadata in user.overlay.* (trusted.* needs host root).
    mount(
        "overlay",
        root,
        Some("overlay"),
        0,
        Some("lowerdir=lower,upperdir=upper,workdir=work,userxattr"),
    )?;

    let (proc_dir, dev, tmp) = (root.join("proc"), root.join("dev"), root.join("tmp"));
    for dir in [&proc_dir, &dev, &tmp] {
        mkdir(dir)?;
    }
    // Mounted before the pivot: a user namespace may mount procfs only where a full /proc is
    // already visible (the host's, until the pivot).
    mount_proc(&proc_dir)?;
    build_dev(&dev, scratch_shm)?;
    bind_with_flags(scratch_tmp, &tmp, nosuid_nodev)?;
    pivot_into(root)
}

/// A detached tmpfs of `size_mib`, made with the new mount API so it needs no path.
fn scratch_tmpfs(size_mib: u64) -> Result<OwnedFd, SysError> {
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
    const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
    // SAFETY: fsopen reads the NUL-terminated filesystem name.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) };
    let fs = owned_fd(fs, || "fsopen(tmpfs) for the scratch".into())?;
    let size = cstring(Path::new(&format!("{size_mib}m")))?;
    for (key, value) in [(c"size", size.as_c_str()), (c"mode", c"0755")] {
        // SAFETY: fsconfig reads the NUL-terminated key and value.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        };
        check(ret as libc::c_int, || {
            format!("set the scratch tmpfs's {key:?} to {value:?}")
        })?;
    }
    // SAFETY: FSCONFIG_CMD_CREATE takes no key or value.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    check(ret as libc::c_int, || "create the scratch tmpfs".into())?;
    // SAFETY: fsmount takes a descriptor and integers.
    let mnt = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        )
    };
    owned_fd(mnt, || "fsmount the scratch tmpfs".into())
}

const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// Attaches the detached mount `mnt` on the directory `target` (a descriptor).
fn attach(mnt: &OwnedFd, target: &OwnedFd, what: &str) -> Result<(), SysError> {
    // SAFETY: both paths are the empty NUL-terminated string; the descriptors are ours.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    check(ret as libc::c_int, || format!("attach {what}"))
}

/// Attaches the detached mount `mnt` on `target` (relative to the working directory).
fn move_mount_to(mnt: &OwnedFd, target: &Path, what: &str) -> Result<(), SysError> {
    let target_c = cstring(target)?;
    // SAFETY: both paths are NUL-terminated strings alive for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target_c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(ret as libc::c_int, || {
        format!("attach {what} on {}", target.display())
    })
}

/// A `/proc` of the sandbox's PID namespace at `dir`, with runc's masked and read-only paths.
fn mount_proc(dir: &Path) -> Result<(), SysError> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mount("proc", dir, Some("proc"), flags, None)?;
    let inside = |path: &str| dir.join(path.trim_start_matches("/proc/"));
    for path in MASKED {
        let target = inside(path);
        match fs::symlink_metadata(&target) {
            Ok(meta) if meta.is_dir() => mount(
                "tmpfs",
                &target,
                Some("tmpfs"),
                flags | libc::MS_RDONLY,
                Some("mode=0555"),
            )?,
            Ok(_) => mount("/dev/null", &target, None, libc::MS_BIND, None)?,
            Err(_) => {} // not in this kernel
        }
    }
    for path in READ_ONLY {
        let target = inside(path);
        if fs::symlink_metadata(&target).is_ok() {
            bind_with_flags(&target, &target, flags | libc::MS_RDONLY)?;
        }
    }
    Ok(())
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
