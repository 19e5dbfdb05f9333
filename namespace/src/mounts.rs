//! Builds the sandbox's root inside its own mount namespace and pivots into it.
//!
//! Everything is mounted by the sandbox's root in its user namespace, relative to the scratch
//! (a tmpfs, or the scratch disk) that is the working directory while building, so the mount
//! table the sandbox sees afterwards names no host path: the overlay's options read
//! `lowerdir=lower,upperdir=upper`.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::mount_api::{self, FsContext, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID};
use crate::sys::{self, check, cstring, owned_fd, SysError};
use crate::SandboxSpec;

pub(crate) fn mount(
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

pub(crate) fn mkdir(path: &Path) -> Result<(), SysError> {
    fs::create_dir_all(path).map_err(|e| SysError::io(format!("mkdir {}", path.display()), e))
}

pub(crate) fn chmod(path: &Path, mode: u32) -> Result<(), SysError> {
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

/// Makes every mount private and attaches the scratch (the disk handed over, or a tmpfs) on
/// `stage` (in this mount namespace only), then makes it the working directory, with the
/// directories every root built on it needs: `/tmp`'s and `/dev/shm`'s sources and the
/// shared directories.
pub(crate) fn prepare_scratch(
    spec: &SandboxSpec,
    stage: &OwnedFd,
    scratch_disk: Option<OwnedFd>,
    own_network: bool,
) -> Result<(), SysError> {
    // Nothing mounted from here on may propagate back to the host.
    mount(
        "none",
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    let (scratch, what) = match scratch_disk {
        Some(disk) => (disk, "the scratch disk"),
        None => (scratch_tmpfs(spec.scratch_mib)?, "the scratch tmpfs"),
    };
    mount_api::attach(&scratch, stage.as_fd(), what)?;
    // SAFETY: fchdir takes a descriptor of ours: the scratch's root.
    check(unsafe { libc::fchdir(scratch.as_raw_fd()) }, || {
        format!("enter {what}")
    })?;
    drop(scratch);
    // `/tmp` and `/dev/shm` live on the same scratch as the overlay's upper layer, so that one
    // size bounds every byte a command can write (a tmpfs each would multiply it).
    for dir in [SCRATCH_TMP, SCRATCH_SHM] {
        mkdir(Path::new(dir))?;
        chmod(Path::new(dir), 0o1777)?;
    }
    for shared in &spec.shared {
        make_shared_dir(&shared.dir)?;
    }
    if own_network {
        // The kernel lets the sandbox's root mount sysfs because the sandbox owns its network
        // namespace, and only while the host's `/sys` is fully visible (as for `/proc`): here,
        // before any root is pivoted into. Each root binds its network part alone.
        let sysfs = Path::new(SCRATCH_SYSFS);
        mkdir(sysfs)?;
        let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY;
        mount("sysfs", sysfs, Some("sysfs"), flags, None)?;
    }
    Ok(())
}

/// Relative to the scratch: the sources of the sandbox root's `/tmp` and of every root's
/// `/dev/shm` (one IPC namespace, one `/dev/shm`).
const SCRATCH_TMP: &str = "tmp";
const SCRATCH_SHM: &str = "shm";
/// Relative to the scratch: the whole sysfs of the sandbox's network namespace, out of every
/// root's sight, when the sandbox has a namespace of its own (not on the host's network).
const SCRATCH_SYSFS: &str = "sysfs";
/// The parts of sysfs each root gets under `/sys`, read-only: the network namespace's own
/// interfaces (`brctl` and tools reading `/sys/class/net/IF/...` need them), nothing of the
/// host's devices, kernel or cgroups.
const NETWORK_SYSFS: [&str; 2] = ["class/net", "devices/virtual/net"];

/// Builds the sandbox's own root on the prepared scratch (the working directory): the
/// idmapped image under an overlay, `/proc`, `/dev`, `/tmp`, the extra mounts, its shared
/// directories; then pivots into it.
pub(crate) fn build_root(
    spec: &SandboxSpec,
    image: OwnedFd,
    extra: Vec<OwnedFd>,
) -> Result<(), SysError> {
    // Relative to the scratch from here on.
    let (upper, work, lower, root) = (
        Path::new("upper"),
        Path::new("work"),
        Path::new("lower"),
        Path::new("root"),
    );
    for dir in [upper, work, lower, root] {
        mkdir(dir)?;
    }
    mount_api::attach_at(&image, &cstring(lower)?, "the image")?;
    drop(image);
    // userxattr: overlay keeps its metadata in user.overlay.* (trusted.* needs host root).
    mount(
        "overlay",
        root,
        Some("overlay"),
        0,
        Some("lowerdir=lower,upperdir=upper,workdir=work,userxattr"),
    )?;
    finish_root(root, Path::new(SCRATCH_TMP), false)?;
    // Last, so that a mount under /tmp is not hidden by it.
    let root_dir = sys::open_file(root, libc::O_PATH | libc::O_DIRECTORY)?;
    for (mount, mnt) in spec.mounts.iter().zip(extra) {
        let what = format!("--mount {mount}");
        let target = mount_point(&root_dir, &mount.target, &what)?;
        mount_api::attach(
            &mnt,
            target.as_fd(),
            &format!("{what} on {}", mount.target.display()),
        )?;
    }
    drop(root_dir);
    attach_shared(spec, crate::pod::MAIN, root)?;
    pivot_into(root)
}

/// Gives the root being built at `root` its `/proc` (of the caller's PID namespace), `/dev`
/// and `/tmp` (bound from `tmp_source`).
pub(crate) fn finish_root(
    root: &Path,
    tmp_source: &Path,
    proc_mounted: bool,
) -> Result<(), SysError> {
    let (proc_dir, dev, tmp) = (root.join("proc"), root.join("dev"), root.join("tmp"));
    for dir in [&proc_dir, &dev, &tmp] {
        mkdir(dir)?;
    }
    // Mounted before the pivot: a user namespace may mount procfs only where a full /proc is
    // already visible (the host's, until the pivot). A container's init mounts its own.
    if !proc_mounted {
        mount_proc(&proc_dir)?;
    }
    build_dev(&dev, Path::new(SCRATCH_SHM))?;
    bind_with_flags(tmp_source, &tmp, libc::MS_NOSUID | libc::MS_NODEV)?;
    // Mounted by `prepare_scratch` exactly when the sandbox has a network namespace of its own.
    if Path::new(SCRATCH_SYSFS).join("class").is_dir() {
        build_sys(&root.join("sys"), Path::new(SCRATCH_SYSFS))?;
    }
    Ok(())
}

/// A read-only `/sys` at `sys` holding only [`NETWORK_SYSFS`], bound from the whole sysfs at
/// `sysfs`.
fn build_sys(sys: &Path, sysfs: &Path) -> Result<(), SysError> {
    let locked = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mkdir(sys)?;
    mount(
        "tmpfs",
        sys,
        Some("tmpfs"),
        locked,
        Some("size=16k,mode=0755"),
    )?;
    for part in NETWORK_SYSFS {
        let target = sys.join(part);
        mkdir(&target)?;
        bind_with_flags(&sysfs.join(part), &target, locked | libc::MS_RDONLY)?;
    }
    mount(
        "none",
        sys,
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | locked,
        Some("size=16k,mode=0755"),
    )
}

/// Binds the shared directories `owner` mounts (`--shared OWNER:DIR:TARGET`) under `root`.
pub(crate) fn attach_shared(spec: &SandboxSpec, owner: &str, root: &Path) -> Result<(), SysError> {
    attach_shared_mounts(spec.shared.iter().filter(|s| s.owner == owner), root)
}

/// Binds each of `mounts` (shared directories of the scratch, the working directory) under
/// `root`.
pub(crate) fn attach_shared_mounts<'a>(
    mounts: impl Iterator<Item = &'a crate::SharedMount>,
    root: &Path,
) -> Result<(), SysError> {
    let root_dir = sys::open_file(root, libc::O_PATH | libc::O_DIRECTORY)?;
    for shared in mounts {
        let what = format!("--shared {shared}");
        let source = crate::pod::shared_dir(&shared.dir);
        let tree = mount_api::clone_tree(&cstring(&source)?, &what)?;
        let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        if shared.read_only {
            attrs |= mount_api::MOUNT_ATTR_RDONLY;
        }
        mount_api::set_attrs(tree.as_fd(), attrs, None)
            .map_err(|e| SysError::io(format!("set the attributes of {what}"), e))?;
        let target = mount_point(&root_dir, &shared.target, &what)?;
        mount_api::attach(&tree, target.as_fd(), &what)?;
    }
    Ok(())
}

/// A detached tmpfs of `size_mib`, made with the new mount API so it needs no path.
fn scratch_tmpfs(size_mib: u64) -> Result<OwnedFd, SysError> {
    let fs = FsContext::open(c"tmpfs", "the scratch tmpfs")?;
    let size = cstring(Path::new(&format!("{size_mib}m")))?;
    fs.set_string(c"size", &size)?;
    fs.set_string(c"mode", c"0755")?;
    fs.mount(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
}

/// `struct open_how` of openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// openat2(2) of `name` relative to `dir`: the new descriptor, or -1 with `errno` set.
fn openat2(dir: &OwnedFd, name: &std::ffi::CStr, how: &OpenHow) -> libc::c_long {
    // SAFETY: openat2 reads the NUL-terminated name and `how`, whose size is passed.
    unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    }
}

/// The directory `target` under the new root `root`, for `mount` (named in errors), made if missing. No component may
/// be a symlink (or leave `root`): the image decides what its paths are, and a link must not
/// carry a mount out of the root or into `/proc` or `/dev`.
pub(crate) fn mount_point(root: &OwnedFd, target: &Path, mount: &str) -> Result<OwnedFd, SysError> {
    let mut current: Option<OwnedFd> = None;
    let mut prefix = PathBuf::from("/");
    for component in target.components() {
        let Component::Normal(name) = component else {
            continue; // the leading `/`; the spec's checks allow nothing else
        };
        prefix.push(name);
        let parent = current.as_ref().unwrap_or(root);
        let name_c = cstring(Path::new(name))?;
        // SAFETY: mkdirat reads the NUL-terminated name, relative to our descriptor.
        let ret = unsafe { libc::mkdirat(parent.as_raw_fd(), name_c.as_ptr(), 0o755) };
        if ret < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
            return Err(SysError::last(format!(
                "create {} for {mount}",
                prefix.display()
            )));
        }
        let how = OpenHow {
            flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
            mode: 0,
            resolve: libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_BENEATH,
        };
        let fd = openat2(parent, &name_c, &how);
        current = Some(owned_fd(fd, || {
            format!(
                "open {} for {mount} (it must be a directory, not a symlink)",
                prefix.display()
            )
        })?);
    }
    current.ok_or_else(|| {
        SysError::io(
            mount.to_string(),
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "the target is /"),
        )
    })
}

/// `path` (absolute, as the container sees it) under the root `root`, opened `O_PATH`: every
/// symlink of it followed within the root (an absolute one, or `..`, never leaves it), no
/// `/proc` magic link. `None` when it does not exist.
pub(crate) fn open_in_root(root: &OwnedFd, path: &str) -> Result<Option<OwnedFd>, SysError> {
    open_in_root_with(root, path, libc::O_PATH)
}

/// [`open_in_root`] with open(2)'s `flags` (`O_CLOEXEC` added).
pub(crate) fn open_in_root_with(
    root: &OwnedFd,
    path: &str,
    flags: libc::c_int,
) -> Result<Option<OwnedFd>, SysError> {
    let name = cstring(Path::new(path.trim_start_matches('/')))?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    };
    let fd = openat2(root, &name, &how);
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
        return Ok(None);
    }
    owned_fd(fd, || format!("open {path} in the container's root")).map(Some)
}

/// A `/proc` of the sandbox's PID namespace at `dir`, with runc's masked and read-only paths.
pub(crate) fn mount_proc(dir: &Path) -> Result<(), SysError> {
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

/// Makes the mount at `target` read-only, keeping its other per-mount flags (a remount sets
/// them all, and the kernel refuses to clear one a user namespace may not).
pub(crate) fn make_read_only(target: &Path) -> Result<(), SysError> {
    let target_c = cstring(target)?;
    // SAFETY: `target_c` is NUL-terminated; `stat` is a valid out-pointer.
    let stat = unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        check(libc::statvfs(target_c.as_ptr(), &mut stat), || {
            format!("statvfs {}", target.display())
        })?;
        stat
    };
    let kept = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
    ]
    .iter()
    .filter(|(st, _)| stat.f_flag & st != 0)
    .fold(0, |flags, (_, ms)| flags | ms);
    mount(
        "none",
        target,
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | kept,
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

/// The container factory's own root, made on the scratch (the working directory) before it
/// pivots there: a `/proc` (so that a container, in a PID namespace of its own, may mount
/// one: the kernel lets a user namespace mount procfs only where one is fully visible) and a
/// `/dev` whose devices each container's `/dev` binds again.
pub(crate) fn prepare_factory_root() -> Result<(), SysError> {
    let (proc_dir, dev) = (Path::new(FACTORY_PROC), Path::new(FACTORY_DEV));
    for dir in [proc_dir, dev] {
        mkdir(dir)?;
    }
    mount_proc(proc_dir)?;
    build_dev(dev, Path::new(SCRATCH_SHM))
}

/// Relative to the scratch: where the container factory's `/proc` and `/dev` are mounted (in
/// its own mount namespace; its pivot makes them `/proc` and `/dev`).
const FACTORY_PROC: &str = "proc";
const FACTORY_DEV: &str = "dev";

/// Makes the directory of shared directory `dir` on the scratch (the working directory), if
/// it is not there yet: world-writable, as a Kubernetes emptyDir (the containers sharing it
/// may run as different users).
pub(crate) fn make_shared_dir(dir: &str) -> Result<(), SysError> {
    let path = crate::pod::shared_dir(dir);
    if path.is_dir() {
        return Ok(());
    }
    mkdir(&path)?;
    chmod(&path, 0o777)
}

/// Makes `root` the new `/` and detaches the old root entirely.
pub(crate) fn pivot_into(root: &Path) -> Result<(), SysError> {
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::{ExtraMount, MountKind};

    fn mount_at(target: &str) -> ExtraMount {
        ExtraMount {
            kind: MountKind::Ext4Image,
            source: "/srv/a.ext4".into(),
            target: target.into(),
            read_only: false,
        }
    }

    fn root(dir: &Path) -> OwnedFd {
        sys::open_file(dir, libc::O_PATH | libc::O_DIRECTORY).expect("open the root")
    }

    #[test]
    fn mount_points_are_made_under_the_root() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("opt")).expect("mkdir");
        let fd = mount_point(&root(dir.path()), &mount_at("/opt/a/b").target, "--mount x")
            .expect("made");
        let made = std::fs::metadata(dir.path().join("opt/a/b")).expect("made");
        let got = sys::fstat(&fd, || "stat".into()).expect("fstat");
        assert_eq!((got.st_dev, got.st_ino), (made.dev(), made.ino()));
        mount_point(&root(dir.path()), Path::new("/opt/a/b"), "--mount x").expect("existing");
    }

    #[test]
    fn symlinks_and_files_on_the_way_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let outside = tempfile::tempdir().expect("outside");
        symlink(outside.path(), dir.path().join("out")).expect("symlink");
        symlink("proc", dir.path().join("p")).expect("symlink");
        std::fs::create_dir(dir.path().join("proc")).expect("mkdir");
        std::fs::write(dir.path().join("file"), b"x").expect("write");
        for (target, errno, named) in [
            ("/out/x", libc::ELOOP, "/out"),
            ("/out", libc::ELOOP, "/out"),
            ("/p/sys", libc::ELOOP, "/p"),
            ("/file/x", libc::ENOTDIR, "/file"),
        ] {
            let e = mount_point(&root(dir.path()), &mount_at(target).target, "--mount x")
                .expect_err(target);
            assert_eq!(e.source.raw_os_error(), Some(errno), "{target}: {e:?}");
            assert!(
                e.step.contains(&format!("open {named} for --mount")),
                "{e:?}"
            );
        }
        assert_eq!(
            std::fs::read_dir(outside.path()).expect("ls").count(),
            0,
            "made something through the link"
        );
    }
}
