//! A mount the sandbox gets besides its root: an ext4 image or a host directory, and its one
//! command-line form `KIND:SOURCE:TARGET:MODE`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// What an [`ExtraMount`] mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    /// `ext4`: a host file holding an ext4 filesystem, attached through a loop device.
    Ext4Image,
    /// `dir`: a host directory, bound read-only.
    HostDir,
}

impl MountKind {
    /// The word of the flag form.
    pub fn as_str(self) -> &'static str {
        match self {
            MountKind::Ext4Image => "ext4",
            MountKind::HostDir => "dir",
        }
    }
}

/// A filesystem mounted at `target` inside the sandbox (created there if missing), `nosuid`
/// and `nodev`, and idmapped through the sandbox's user namespace so that its uid 0 is the
/// sandbox's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraMount {
    /// What `source` is.
    pub kind: MountKind,
    /// The host path of the image file or directory.
    pub source: PathBuf,
    /// Where it appears inside the sandbox: absolute and normalised, not `/`, nor in `/proc`,
    /// `/dev` or `/sys`.
    pub target: PathBuf,
    /// Mounted read-only (for an image, its loop device is read-only too). Host directories
    /// are always read-only.
    pub read_only: bool,
}

/// Where extra mounts may not go: the kernel's and the sandbox's own interfaces.
const RESERVED: [&str; 3] = ["/proc", "/dev", "/sys"];

impl ExtraMount {
    /// Checks every rule of the flag form; the reason says which one failed.
    pub fn check(&self) -> Result<(), String> {
        let source = utf8(&self.source, "SOURCE")?;
        if !source.starts_with('/') {
            return Err(format!("SOURCE {source:?} must be an absolute host path"));
        }
        check_target(utf8(&self.target, "TARGET")?)?;
        if self.kind == MountKind::HostDir && !self.read_only {
            return Err("a host directory can only be mounted ro".into());
        }
        Ok(())
    }
}

/// The path as text without `:` or NUL, which the flag form cannot carry.
pub(crate) fn utf8<'a>(path: &'a Path, name: &str) -> Result<&'a str, String> {
    let text = path
        .to_str()
        .ok_or_else(|| format!("{name} {path:?} must be UTF-8"))?;
    if text.contains(':') || text.contains('\0') {
        return Err(format!("{name} {text:?} must not contain `:` or NUL"));
    }
    Ok(text)
}

/// A path inside the sandbox a mount may go to: absolute, normalised, not `/`, not in `/proc`,
/// `/dev` or `/sys`.
pub(crate) fn check_target(target: &str) -> Result<(), String> {
    let Some(relative) = target.strip_prefix('/') else {
        return Err(format!("TARGET {target:?} must be absolute"));
    };
    if relative.is_empty() {
        return Err("TARGET must not be / itself".into());
    }
    if relative
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(format!(
            "TARGET {target:?} must be normalised (no empty, `.` or `..` component, no \
             trailing /)"
        ));
    }
    if let Some(reserved) = RESERVED
        .iter()
        .find(|r| target == **r || target.starts_with(&format!("{r}/")))
    {
        return Err(format!("TARGET {target:?} is inside {reserved}"));
    }
    Ok(())
}

impl fmt::Display for ExtraMount {
    /// `KIND:SOURCE:TARGET:MODE`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.kind.as_str(),
            self.source.display(),
            self.target.display(),
            if self.read_only { "ro" } else { "rw" }
        )
    }
}

impl FromStr for ExtraMount {
    type Err = String;

    /// `KIND:SOURCE:TARGET:MODE`, checked with [`ExtraMount::check`].
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let [kind, source, target, mode] = parts.as_slice() else {
            return Err(
                "must be KIND:SOURCE:TARGET:MODE (paths cannot contain `:`), as in \
                 ext4:/srv/cache.ext4:/cache:rw"
                    .into(),
            );
        };
        let kind = match *kind {
            "ext4" => MountKind::Ext4Image,
            "dir" => MountKind::HostDir,
            other => return Err(format!("KIND must be ext4 or dir, not {other:?}")),
        };
        let read_only = match *mode {
            "ro" => true,
            "rw" => false,
            other => return Err(format!("MODE must be ro or rw, not {other:?}")),
        };
        let mount = ExtraMount {
            kind,
            source: source.into(),
            target: target.into(),
            read_only,
        };
        mount.check()?;
        Ok(mount)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_form_round_trips() {
        for text in [
            "ext4:/srv/cache.ext4:/cache:rw",
            "ext4:/srv/data.ext4:/var/lib/data:ro",
            "dir:/srv/datasets:/mnt/datasets:ro",
        ] {
            let mount: ExtraMount = text.parse().expect(text);
            assert_eq!(mount.to_string(), text);
        }
        let mount: ExtraMount = "ext4:/a b/c.img:/x y:rw".parse().expect("spaces");
        assert_eq!(mount.source, Path::new("/a b/c.img"));
        assert_eq!(mount.target, Path::new("/x y"));
        assert!(!mount.read_only);
    }

    fn refused(text: &str, reason: &str) {
        let e = text
            .parse::<ExtraMount>()
            .expect_err(&format!("{text} must be refused"));
        assert!(e.contains(reason), "{text}: {e:?} does not say {reason:?}");
    }

    #[test]
    fn malformed_forms_are_refused() {
        refused("ext4:/a.img:/x", "KIND:SOURCE:TARGET:MODE");
        refused("ext4:/a.img:/x:rw:extra", "KIND:SOURCE:TARGET:MODE");
        refused("ext4:/a:b.img:/x:rw", "KIND:SOURCE:TARGET:MODE");
        refused("ext4:/a.img:/x:y:rw", "KIND:SOURCE:TARGET:MODE");
        refused("", "KIND:SOURCE:TARGET:MODE");
        refused("btrfs:/a.img:/x:rw", "KIND must be ext4 or dir");
        refused("ext4:/a.img:/x:rx", "MODE must be ro or rw");
        refused("ext4:/a.img:/x:", "MODE must be ro or rw");
        refused("ext4:a.img:/x:rw", "must be an absolute host path");
        refused("ext4::/x:rw", "must be an absolute host path");
    }

    #[test]
    fn targets_must_be_absolute_normalised_and_outside_kernel_interfaces() {
        refused("ext4:/a.img:x:rw", "must be absolute");
        refused("ext4:/a.img::rw", "must be absolute");
        refused("ext4:/a.img:/:rw", "must not be / itself");
        for bad in ["/x/../etc", "/..", "/x/.", "/./x", "//x", "/x//y", "/x/"] {
            refused(&format!("ext4:/a.img:{bad}:rw"), "must be normalised");
        }
        for reserved in [
            "/proc",
            "/proc/sys",
            "/dev",
            "/dev/shm",
            "/sys",
            "/sys/fs/cgroup",
        ] {
            refused(&format!("ext4:/a.img:{reserved}:rw"), "is inside");
        }
        // A name that merely starts like a reserved one is fine.
        for fine in ["/process", "/devices", "/system", "/tmp/proc"] {
            format!("ext4:/a.img:{fine}:rw")
                .parse::<ExtraMount>()
                .expect(fine);
        }
    }

    #[test]
    fn host_directories_are_read_only() {
        refused("dir:/srv/data:/data:rw", "only be mounted ro");
        "dir:/srv/data:/data:ro"
            .parse::<ExtraMount>()
            .expect("ro dir");
    }

    #[test]
    fn check_refuses_what_the_flag_form_cannot_carry() {
        let mut mount = ExtraMount {
            kind: MountKind::Ext4Image,
            source: "/a:b.img".into(),
            target: "/x".into(),
            read_only: false,
        };
        assert!(mount.check().expect_err(":").contains("`:`"));
        mount.source = "/a.img".into();
        mount.target = "/x\0y".into();
        assert!(mount.check().expect_err("NUL").contains("NUL"));
        use std::os::unix::ffi::OsStrExt;
        mount.target = std::ffi::OsStr::from_bytes(b"/\xff").into();
        assert!(mount.check().expect_err("not UTF-8").contains("UTF-8"));
        mount.target = "/x".into();
        mount.check().expect("fine");
    }
}
