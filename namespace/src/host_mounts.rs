//! The mounts the supervisor makes for the sandbox with host privileges (host root, outside):
//! the image, the scratch disk and the extra mounts, each a detached mount idmapped through
//! the sandbox's user namespace (on-disk uid 0 is the sandbox's root, whichever host range it
//! got), handed to the sandbox over their socket in that order. The sandbox can attach them
//! but never make them: it has no privilege over host devices or directories.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::loop_device::{self, LoopError};
use crate::mount_api::{self, FsContext};
use crate::mount_api::{MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};
use crate::sys::{self, cstring, Socket, SysError};
use crate::{ExtraMount, MountKind, SandboxSpec};

/// Why a mount for the sandbox could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HostMountError {
    /// A system call failed; the message names the step and its input.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// An image could not be attached to a loop device.
    #[error(transparent)]
    Loop(#[from] LoopError),
    /// A `dir` mount's source is not a directory.
    #[error("{} is not a directory", path.display())]
    NotADirectory {
        /// The source.
        path: PathBuf,
    },
    /// Making the mount a flag asked for failed.
    #[error("{flag}")]
    For {
        /// The flag and its value (`--mount ext4:/srv/a.ext4:/data:rw`).
        flag: String,
        /// What failed.
        #[source]
        source: Box<HostMountError>,
    },
}

impl HostMountError {
    fn for_flag(flag: String) -> impl FnOnce(HostMountError) -> HostMountError {
        move |source| HostMountError::For {
            flag,
            source: Box::new(source),
        }
    }
}

/// Every mount the sandbox gets from its supervisor.
#[derive(Debug)]
pub(crate) struct SandboxMounts {
    /// The image, read-only: the overlay's lower layer.
    pub(crate) image: OwnedFd,
    /// The scratch disk, if the spec has one: holds every write instead of a tmpfs.
    pub(crate) scratch_disk: Option<OwnedFd>,
    /// The spec's extra mounts, in its order.
    pub(crate) extra: Vec<OwnedFd>,
    /// The images of the spec's containers, in its order.
    pub(crate) containers: Vec<OwnedFd>,
}

impl SandboxMounts {
    /// Makes every mount of `spec`, idmapped through the user namespace `userns`.
    pub(crate) fn make(spec: &SandboxSpec, userns: BorrowedFd<'_>) -> Result<Self, HostMountError> {
        let image = image_tree(&spec.rootfs, userns)?;
        let scratch_disk = spec
            .scratch_disk
            .as_deref()
            .map(|disk| {
                ext4_image(disk, false, userns).map_err(HostMountError::for_flag(format!(
                    "--scratch-disk {}",
                    disk.display()
                )))
            })
            .transpose()?;
        let extra = spec
            .mounts
            .iter()
            .map(|mount| extra_mount(mount, userns))
            .collect::<Result<_, _>>()?;
        let containers = spec
            .containers
            .iter()
            .map(|container| {
                image_tree(&container.rootfs, userns).map_err(|e| HostMountError::For {
                    flag: format!("--container {container}"),
                    source: Box::new(e.into()),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(SandboxMounts {
            image,
            scratch_disk,
            extra,
            containers,
        })
    }

    /// Sends every mount to the sandbox, in the order [`SandboxMounts::receive`] expects.
    pub(crate) fn send(&self, to_child: &Socket) -> Result<(), SysError> {
        let all = std::iter::once(&self.image)
            .chain(&self.scratch_disk)
            .chain(&self.extra)
            .chain(&self.containers);
        for (i, mnt) in all.enumerate() {
            to_child
                .send_fd(mnt)
                .map_err(|e| SysError::io(format!("hand mount {i} to the sandbox"), e))?;
        }
        Ok(())
    }

    /// The sandbox's side: receives the mounts of `spec` in order; `None` if the supervisor
    /// closed the socket first (it died).
    pub(crate) fn receive(
        spec: &SandboxSpec,
        from_parent: &Socket,
    ) -> Result<Option<Self>, SysError> {
        let receive = |what: &str| {
            from_parent
                .recv_fd()
                .map_err(|e| SysError::io(format!("receive {what} from the supervisor"), e))
        };
        let Some(image) = receive("the image mount")? else {
            return Ok(None);
        };
        let scratch_disk = match &spec.scratch_disk {
            None => None,
            Some(_) => match receive("the scratch disk's mount")? {
                Some(fd) => Some(fd),
                None => return Ok(None),
            },
        };
        let mut extra = Vec::with_capacity(spec.mounts.len());
        for mount in &spec.mounts {
            match receive(&format!("the mount of --mount {mount}"))? {
                Some(fd) => extra.push(fd),
                None => return Ok(None),
            }
        }
        let mut containers = Vec::with_capacity(spec.containers.len());
        for container in &spec.containers {
            match receive(&format!("the image of --container {container}"))? {
                Some(fd) => containers.push(fd),
                None => return Ok(None),
            }
        }
        Ok(Some(SandboxMounts {
            image,
            scratch_disk,
            extra,
            containers,
        }))
    }
}

/// The image directory `dir`: a detached, read-only, idmapped clone of its mount. Not
/// `nosuid`: the image's setuid tools work inside, within the sandbox's capabilities.
pub(crate) fn image_tree(dir: &Path, userns: BorrowedFd<'_>) -> Result<OwnedFd, SysError> {
    let tree = mount_api::clone_tree(&cstring(dir)?, "the image")?;
    mount_api::set_attrs(
        tree.as_fd(),
        MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV,
        Some(userns),
    )
    .map_err(|e| {
        SysError::io(
            format!(
                "idmap the image {} (its filesystem must support idmapped mounts: ext4, xfs, \
                 btrfs, tmpfs on Linux 6.3+; not overlayfs or NFS)",
                dir.display()
            ),
            e,
        )
    })?;
    Ok(tree)
}

fn extra_mount(mount: &ExtraMount, userns: BorrowedFd<'_>) -> Result<OwnedFd, HostMountError> {
    match mount.kind {
        MountKind::Ext4Image => ext4_image(&mount.source, mount.read_only, userns),
        MountKind::HostDir => host_dir(&mount.source, userns),
    }
    .map_err(HostMountError::for_flag(format!("--mount {mount}")))
}

/// The ext4 filesystem in the file `image`, attached through a loop device that detaches
/// itself once this mount (and every copy of it) is gone: a detached `nosuid`, `nodev` mount
/// idmapped through `userns`; with `read_only`, the loop device, the filesystem and the mount
/// are all read-only.
pub(crate) fn ext4_image(
    image: &Path,
    read_only: bool,
    userns: BorrowedFd<'_>,
) -> Result<OwnedFd, HostMountError> {
    let device = loop_device::attach(image, read_only)?;
    let device_path = device.path();
    let what = format!("ext4 {} on {}", image.display(), device_path.display());
    let fs = FsContext::open(c"ext4", what.clone())?;
    fs.set_string(c"source", &cstring(&device_path)?)?;
    let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if read_only {
        fs.set_flag(c"ro")?;
        attrs |= MOUNT_ATTR_RDONLY;
    }
    let mnt = fs.mount(attrs)?;
    // The filesystem holds the device open now; ours would only keep it from detaching.
    drop(device);
    mount_api::set_attrs(mnt.as_fd(), MOUNT_ATTR_IDMAP, Some(userns))
        .map_err(|e| SysError::io(format!("idmap {what} into the sandbox's ids"), e))?;
    Ok(mnt)
}

/// The host directory `dir` (not the mounts below it): a detached read-only, `nosuid`,
/// `nodev` bind, idmapped through `userns` where its filesystem allows; where it does not,
/// bound without idmapping (files keep host owners, shown as `nobody` inside), and said so on
/// stderr.
pub(crate) fn host_dir(dir: &Path, userns: BorrowedFd<'_>) -> Result<OwnedFd, HostMountError> {
    let what = format!("the host directory {}", dir.display());
    let tree = mount_api::clone_tree(&cstring(dir)?, &what)?;
    let meta = sys::fstat(&tree, || format!("stat {what}"))?;
    if meta.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(HostMountError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    let attrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    match mount_api::set_attrs(tree.as_fd(), attrs | MOUNT_ATTR_IDMAP, Some(userns)) {
        Ok(()) => {}
        // The filesystem cannot be idmapped (overlayfs, NFS, …); nothing was changed.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            mount_api::set_attrs(tree.as_fd(), attrs, None)
                .map_err(|e| SysError::io(format!("make {what} read-only"), e))?;
            eprintln!(
                "guest-init: {} cannot be idmapped (its filesystem does not support it); \
                 mounted read-only with host ownership, which shows as nobody inside",
                dir.display()
            );
        }
        Err(e) => {
            return Err(SysError::io(format!("idmap {what} into the sandbox's ids"), e).into())
        }
    }
    Ok(tree)
}

/// How a host path's mount takes the host's later mounts below it (Kubernetes'
/// `mountPropagation`; `Bidirectional` is never offered: it would let the sandbox mount on
/// the host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// `None` (`rprivate`): neither way.
    Private,
    /// `HostToContainer` (`rslave`): the host's mounts below it appear in the container.
    FromHost,
}

/// A host directory a container mounts (a Kubernetes `hostPath` volume), as the daemon asks
/// for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPathMount {
    /// The host directory (a symlink to one is followed).
    pub source: PathBuf,
    /// Where it goes in the container ([`crate::check_host_path_target`]).
    pub target: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// How the host's later mounts below it reach the container.
    pub propagation: Propagation,
}

/// The host directory `dir` and the mounts below it, for a container (a Kubernetes
/// `hostPath` volume): a detached `nosuid`, `nodev` copy, read-only when asked,
/// idmapped through `userns` so that host uid 0 is the sandbox's root (as Kubernetes
/// mounts a host path for a user-namespaced pod), and private or a slave of the host's
/// mount, never shared: nothing mounted below it inside reaches the host.
pub fn host_path_tree(
    dir: &Path,
    read_only: bool,
    propagation: Propagation,
    userns: BorrowedFd<'_>,
) -> Result<OwnedFd, HostMountError> {
    let what = format!("the host path {}", dir.display());
    let at = sys::open_file(dir, libc::O_PATH | libc::O_DIRECTORY).map_err(|e| {
        match e.source.raw_os_error() {
            Some(libc::ENOTDIR) => HostMountError::NotADirectory {
                path: dir.to_path_buf(),
            },
            _ => e.into(),
        }
    })?;
    let tree = mount_api::clone_tree_below(at.as_fd(), &what)?;
    let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_IDMAP;
    if read_only {
        attrs |= MOUNT_ATTR_RDONLY;
    }
    let propagation = match propagation {
        Propagation::Private => libc::MS_PRIVATE,
        Propagation::FromHost => libc::MS_SLAVE,
    };
    mount_api::set_tree_attrs(tree.as_fd(), attrs, propagation, Some(userns)).map_err(|e| {
        SysError::io(
            format!(
                "idmap {what} into the sandbox's ids (its filesystem must support idmapped \
                 mounts: ext4, xfs, btrfs, tmpfs on Linux 6.3+; not overlayfs or NFS)"
            ),
            e,
        )
    })?;
    Ok(tree)
}

/// These attach real images through real loop devices: they need root, and fail without it.
#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    use std::process::Command;

    use super::*;

    /// The host id the filesystems' uid and gid 0 appear as through the test's idmap.
    const BASE: u32 = 2_123_000_000;

    fn require_root() {
        // SAFETY: geteuid takes no arguments and cannot fail.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "loop devices and idmapped mounts need root");
    }

    /// A fresh 16 MiB ext4 image in `dir`, made the way the daemon makes them.
    fn ext4_file(dir: &Path, name: &str) -> PathBuf {
        let image = dir.join(name);
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(16 << 20))
            .expect("a sparse 16 MiB file");
        let status = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&image)
            .status()
            .expect("run mkfs.ext4 (Debian's e2fsprogs)");
        assert!(status.success(), "mkfs.ext4 {}: {status}", image.display());
        image
    }

    /// A user namespace whose ids 0–65535 are host ids BASE…, held by its descriptor alone.
    fn user_namespace() -> OwnedFd {
        // SAFETY: with a null stack clone behaves as fork; the child only calls pause and
        // _exit (async-signal-safe) until it is killed, whatever threads the parent has.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        assert!(
            pid >= 0,
            "clone(CLONE_NEWUSER): {}",
            std::io::Error::last_os_error()
        );
        if pid == 0 {
            loop {
                // SAFETY: pause takes no arguments; SIGKILL ends the loop.
                unsafe { libc::pause() };
            }
        }
        let pid = pid as libc::pid_t;
        let line = format!("0 {BASE} 65536\n");
        for file in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{pid}/{file}"), &line).expect(file);
        }
        let ns = sys::open_file(Path::new(&format!("/proc/{pid}/ns/user")), libc::O_RDONLY)
            .expect("open the user namespace");
        // SAFETY: kill and waitpid take integers and a valid out-pointer.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, &mut 0, 0);
        }
        ns
    }

    /// Runs `f` on a thread of its own in a private mount namespace (nothing it mounts is seen
    /// by the host or the other tests, and all of it goes when the thread ends), with the
    /// file-system ids of the sandbox's root (BASE) while `as_sandbox_root` is set.
    fn in_private_mounts<T: Send>(f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: unshare takes an integer; it only affects this thread.
                    let ret = unsafe { libc::unshare(libc::CLONE_NEWNS) };
                    assert_eq!(ret, 0, "unshare: {}", std::io::Error::last_os_error());
                    // SAFETY: the paths are NUL-terminated; the other pointers are null.
                    let ret = unsafe {
                        libc::mount(
                            std::ptr::null(),
                            c"/".as_ptr(),
                            std::ptr::null(),
                            libc::MS_REC | libc::MS_PRIVATE,
                            std::ptr::null(),
                        )
                    };
                    assert_eq!(
                        ret,
                        0,
                        "make / private: {}",
                        std::io::Error::last_os_error()
                    );
                    f()
                })
                .join()
                .expect("the mount thread")
        })
    }

    /// This thread's file-system uid and gid, until dropped (then root's again).
    struct FsIds;

    impl FsIds {
        fn sandbox_root() -> Self {
            // SAFETY: setfsgid and setfsuid take an integer and change only this thread.
            unsafe {
                libc::syscall(libc::SYS_setfsgid, BASE);
                libc::syscall(libc::SYS_setfsuid, BASE);
            }
            FsIds
        }
    }

    impl Drop for FsIds {
        fn drop(&mut self) {
            // SAFETY: as above.
            unsafe {
                libc::syscall(libc::SYS_setfsuid, 0u32);
                libc::syscall(libc::SYS_setfsgid, 0u32);
            }
        }
    }

    fn attach_on(mnt: &OwnedFd, dir: &Path) {
        let target = sys::open_file(dir, libc::O_PATH | libc::O_DIRECTORY).expect("target");
        mount_api::attach(mnt, target.as_fd(), "the test mount").expect("attach");
    }

    /// Unmounts `dir`, strictly (no MNT_DETACH), so a reference the code under test leaked
    /// fails the test. EBUSY is retried for up to 10 s: a test on another thread that forks
    /// (Command, `user_namespace`) copies this process's descriptors, a file open on the mount
    /// among them, and its child holds them until it execs or exits.
    fn unmount(dir: &Path) {
        let path = cstring(dir).expect("path");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            // SAFETY: umount2 reads the NUL-terminated path.
            let ret = unsafe { libc::umount2(path.as_ptr(), 0) };
            let err = std::io::Error::last_os_error();
            if ret == 0 {
                return;
            }
            assert!(
                os_error(&err) == libc::EBUSY && std::time::Instant::now() < deadline,
                "umount {}: {err}",
                dir.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The loop devices whose backing file is `image`, read from sysfs.
    fn devices_backed_by(image: &Path) -> Vec<String> {
        let want = std::fs::metadata(image).expect("stat the image");
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/sys/block")
            .expect("/sys/block")
            .flatten()
        {
            let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file"))
            else {
                continue;
            };
            let same = std::fs::metadata(backing.trim_end())
                .is_ok_and(|m| m.dev() == want.dev() && m.ino() == want.ino());
            if same {
                found.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        found
    }

    /// Waits (at most 10 s) until no loop device is backed by `image`: the kernel clears an
    /// autoclear device when its last opener goes.
    fn assert_released(image: &Path) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !devices_backed_by(image).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} still backs {:?}",
                image.display(),
                devices_backed_by(image)
            );
            std::thread::yield_now();
        }
    }

    fn os_error(e: &std::io::Error) -> i32 {
        e.raw_os_error().unwrap_or_default()
    }

    #[test]
    fn an_ext4_image_fills_up_with_enospc_and_belongs_to_the_sandbox_root() {
        require_root();
        let dir = tempfile::tempdir().expect("temp dir");
        let image = ext4_file(dir.path(), "data.ext4");
        let userns = user_namespace();
        let target = dir.path().join("mnt");
        std::fs::create_dir(&target).expect("mkdir");
        in_private_mounts(|| {
            let mnt = ext4_image(&image, false, userns.as_fd()).expect("attach the image");
            assert_eq!(devices_backed_by(&image).len(), 1);
            attach_on(&mnt, &target);
            drop(mnt);
            let root = std::fs::metadata(&target).expect("stat the mount");
            assert_eq!(
                (root.uid(), root.gid()),
                (BASE, BASE),
                "uid 0 on disk is BASE"
            );
            let _ids = FsIds::sandbox_root();
            let mut file = std::fs::File::create(target.join("fill")).expect("create a file");
            let chunk = vec![0x5au8; 1 << 20];
            let full = (0..64)
                .find_map(|_| file.write_all(&chunk).and_then(|()| file.sync_all()).err())
                .expect("16 MiB cannot hold 64 MiB");
            assert_eq!(os_error(&full), libc::ENOSPC, "{full}");
            let written = file.metadata().expect("stat").len();
            assert!(written > 8 << 20, "only {written} bytes fit");
            drop(file);
            drop(_ids);
            unmount(&target);
        });
        assert_released(&image);
        // On disk, the sandbox root's file belongs to uid 0.
        let out = Command::new("debugfs")
            .args(["-R", "stat /fill"])
            .arg(&image)
            .output()
            .expect("run debugfs (e2fsprogs)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("User:     0   Group:     0"),
            "/fill on disk: {text}"
        );
    }

    #[test]
    fn a_read_only_image_refuses_writes_through_mount_and_device() {
        require_root();
        let dir = tempfile::tempdir().expect("temp dir");
        let image = ext4_file(dir.path(), "ref.ext4");
        let userns = user_namespace();
        let target = dir.path().join("mnt");
        std::fs::create_dir(&target).expect("mkdir");
        in_private_mounts(|| {
            let mnt = ext4_image(&image, true, userns.as_fd()).expect("attach read-only");
            let devices = devices_backed_by(&image);
            assert_eq!(devices.len(), 1, "{devices:?}");
            let ro = std::fs::read_to_string(format!("/sys/block/{}/ro", devices[0]))
                .expect("read the device's ro flag");
            assert_eq!(ro.trim(), "1", "{} is writable", devices[0]);
            attach_on(&mnt, &target);
            drop(mnt);
            // Neither the sandbox's root nor host root may write.
            let e = {
                let _ids = FsIds::sandbox_root();
                std::fs::write(target.join("x"), b"x").expect_err("written as sandbox root")
            };
            assert_eq!(os_error(&e), libc::EROFS, "{e}");
            let e = std::fs::create_dir(target.join("d")).expect_err("written as host root");
            assert_eq!(os_error(&e), libc::EROFS, "{e}");
            unmount(&target);
        });
        assert_released(&image);
    }

    #[test]
    fn the_loop_device_detaches_when_the_last_mount_is_gone() {
        require_root();
        let dir = tempfile::tempdir().expect("temp dir");
        let image = ext4_file(dir.path(), "scratch.ext4");
        let userns = user_namespace();
        // Detached and never attached: closing the mount is all it takes.
        let mnt = ext4_image(&image, false, userns.as_fd()).expect("attach");
        assert_eq!(devices_backed_by(&image).len(), 1);
        drop(mnt);
        assert_released(&image);
        // Attached, then unmounted (as when a sandbox's mount namespace goes).
        let target = dir.path().join("mnt");
        std::fs::create_dir(&target).expect("mkdir");
        in_private_mounts(|| {
            let mnt = ext4_image(&image, false, userns.as_fd()).expect("attach again");
            attach_on(&mnt, &target);
            drop(mnt);
            assert_eq!(devices_backed_by(&image).len(), 1);
            unmount(&target);
        });
        assert_released(&image);
    }

    #[test]
    fn an_image_still_attached_is_refused() {
        require_root();
        let dir = tempfile::tempdir().expect("temp dir");
        let image = ext4_file(dir.path(), "busy.ext4");
        let userns = user_namespace();
        let first = ext4_image(&image, false, userns.as_fd()).expect("first attach");
        let device = devices_backed_by(&image);
        let link = dir.path().join("link.ext4");
        std::os::unix::fs::symlink(&image, &link).expect("symlink");
        for (path, read_only) in [(&image, false), (&image, true), (&link, true)] {
            match ext4_image(path, read_only, userns.as_fd()) {
                Err(HostMountError::Loop(LoopError::InUse {
                    image: named,
                    device: dev,
                })) => {
                    assert_eq!(&named, path);
                    assert_eq!(vec![dev.trim_start_matches("/dev/").to_string()], device);
                }
                other => panic!("{} attached twice: {other:?}", path.display()),
            }
        }
        assert_eq!(
            devices_backed_by(&image),
            device,
            "a refused attach left a device"
        );
        drop(first);
        assert_released(&image);
        drop(ext4_image(&image, false, userns.as_fd()).expect("attach once released"));
        assert_released(&image);
    }

    #[test]
    fn sources_of_the_wrong_kind_are_refused() {
        require_root();
        let dir = tempfile::tempdir().expect("temp dir");
        let userns = user_namespace();
        match ext4_image(dir.path(), true, userns.as_fd()) {
            Err(HostMountError::Loop(LoopError::NotAFile { image })) => {
                assert_eq!(image, dir.path())
            }
            other => panic!("a directory as an image: {other:?}"),
        }
        let e = ext4_image(dir.path(), false, userns.as_fd()).expect_err("a directory, rw");
        assert!(
            e.to_string().contains(&dir.path().display().to_string()),
            "{e}"
        );
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        match host_dir(&file, userns.as_fd()) {
            Err(HostMountError::NotADirectory { path }) => assert_eq!(path, file),
            other => panic!("a file as a directory: {other:?}"),
        }
        let missing = dir.path().join("missing.ext4");
        let e = ext4_image(&missing, false, userns.as_fd()).expect_err("a missing image");
        assert!(e.to_string().contains("missing.ext4"), "{e}");
        // Not an ext4 filesystem: the error names the image and its device, and the device
        // is released.
        let junk = dir.path().join("junk.ext4");
        std::fs::write(&junk, vec![0u8; 1 << 20]).expect("write");
        let e = ext4_image(&junk, false, userns.as_fd()).expect_err("not ext4");
        assert!(e.to_string().contains("junk.ext4 on /dev/loop"), "{e}");
        assert_released(&junk);
    }

    #[test]
    fn a_host_directory_is_bound_read_only_and_idmapped() {
        require_root();
        let dir = tempfile::tempdir().expect("temp dir");
        let source = dir.path().join("src");
        std::fs::create_dir(&source).expect("mkdir");
        std::fs::write(source.join("file"), b"data").expect("write");
        let userns = user_namespace();
        let target = dir.path().join("mnt");
        std::fs::create_dir(&target).expect("mkdir");
        in_private_mounts(|| {
            let mnt = host_dir(&source, userns.as_fd()).expect("bind the directory");
            attach_on(&mnt, &target);
            drop(mnt);
            let file = target.join("file");
            assert_eq!(std::fs::read(&file).expect("read"), b"data");
            let meta = std::fs::metadata(&file).expect("stat");
            // The temporary directory's filesystem (ext4 here) supports idmapping.
            assert_eq!((meta.uid(), meta.gid()), (BASE, BASE), "host root's file");
            let e = std::fs::write(target.join("new"), b"x").expect_err("written as host root");
            assert_eq!(os_error(&e), libc::EROFS, "{e}");
            let e = {
                let _ids = FsIds::sandbox_root();
                std::fs::write(&file, b"x").expect_err("written as sandbox root")
            };
            assert_eq!(os_error(&e), libc::EROFS, "{e}");
            unmount(&target);
        });
        let raw = source.join("file");
        assert_eq!(std::fs::read(raw).expect("read"), b"data");
    }

    #[test]
    fn a_host_directory_that_cannot_be_idmapped_is_still_bound_read_only() {
        require_root();
        let dir = tempfile::tempdir().expect("temp dir");
        let userns = user_namespace();
        let [lower, upper, work, merged, target] =
            ["lower", "upper", "work", "merged", "mnt"].map(|d| dir.path().join(d));
        for d in [&lower, &upper, &work, &merged, &target] {
            std::fs::create_dir(d).expect("mkdir");
        }
        std::fs::write(lower.join("file"), b"data").expect("write");
        in_private_mounts(|| {
            // Overlayfs does not support idmapped mounts.
            let options = format!(
                "lowerdir={},upperdir={},workdir={}",
                lower.display(),
                upper.display(),
                work.display()
            );
            let options = cstring(Path::new(&options)).expect("options");
            let merged_c = cstring(&merged).expect("path");
            // SAFETY: every pointer is a NUL-terminated string alive for the call.
            let ret = unsafe {
                libc::mount(
                    c"overlay".as_ptr(),
                    merged_c.as_ptr(),
                    c"overlay".as_ptr(),
                    0,
                    options.as_ptr().cast(),
                )
            };
            assert_eq!(ret, 0, "mount overlay: {}", std::io::Error::last_os_error());
            let mnt = host_dir(&merged, userns.as_fd()).expect("bind without idmapping");
            attach_on(&mnt, &target);
            drop(mnt);
            let meta = std::fs::metadata(target.join("file")).expect("stat");
            assert_eq!(
                meta.uid(),
                0,
                "not idmapped: host root's file stays host root's"
            );
            let e = std::fs::write(target.join("new"), b"x").expect_err("written");
            assert_eq!(os_error(&e), libc::EROFS, "{e}");
            unmount(&target);
            unmount(&merged);
        });
    }
}
