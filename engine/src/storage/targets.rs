//! Where caches and volumes may appear inside a sandbox.

use std::path::{Path, PathBuf};

use super::StorageError;

/// Trees the sandbox's own kernel interfaces live in: a mount there would hide them.
const RESERVED: [&str; 3] = ["/proc", "/dev", "/sys"];

/// Checks every `(what, path)` a sandbox asks to mount something at: absolute and normalised
/// (no `.`, `..` or empty components), not `/`, not under `/proc`, `/dev` or `/sys`, no `:`
/// or control characters, and no two the same or one inside another (which would hide one).
pub(crate) fn validate_targets(targets: &[(String, &str)]) -> Result<(), StorageError> {
    for (what, path) in targets {
        let bad = |why: &str| StorageError::Invalid(format!("{what}: path {path:?} {why}"));
        if !path.starts_with('/') || path.len() > 4096 {
            return Err(bad("must be absolute (and at most 4096 bytes)"));
        }
        if path.chars().any(|c| c == ':' || c.is_control()) {
            return Err(bad("may not contain ':' or control characters"));
        }
        let inner = path.trim_end_matches('/');
        if inner.is_empty() {
            return Err(bad("may not be /"));
        }
        if inner[1..]
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(bad("must be normalised (no //, . or ..)"));
        }
        if RESERVED.iter().any(|r| is_within(inner, r)) {
            return Err(bad("may not be in /proc, /dev or /sys"));
        }
    }
    for (i, (what_a, a)) in targets.iter().enumerate() {
        for (what_b, b) in &targets[i + 1..] {
            let (a, b) = (a.trim_end_matches('/'), b.trim_end_matches('/'));
            if is_within(a, b) || is_within(b, a) {
                return Err(StorageError::Invalid(format!(
                    "{what_a} at {a:?} and {what_b} at {b:?} overlap: one would hide the other"
                )));
            }
        }
    }
    Ok(())
}

/// Checks a mount `target` (already through [`validate_targets`]; `what` names it in the
/// request) against the image tree `root` it goes into, `image` naming that image: no
/// directory on the way may be a symlink or something other than a directory. A namespace
/// sandbox builds each mount point with `openat2(RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)`, so
/// such a target would fail inside the new sandbox; refused here, the request is told which
/// path and why. What is missing from the image is made there and is fine; what cannot be
/// read here is left to that walk.
pub(crate) fn check_in_image(
    root: &Path,
    image: &str,
    what: &str,
    target: &str,
) -> Result<(), StorageError> {
    let mut inside = PathBuf::from("/");
    for component in target.split('/').filter(|c| !c.is_empty()) {
        inside.push(component);
        let on_host = root.join(inside.strip_prefix("/").unwrap_or(&inside));
        let meta = match std::fs::symlink_metadata(&on_host) {
            Ok(meta) => meta,
            Err(_) => return Ok(()),
        };
        let why = if meta.file_type().is_symlink() {
            let points_to = std::fs::read_link(&on_host)
                .map(|to| format!(" (to {:?})", to.display().to_string()))
                .unwrap_or_default();
            format!(
                "{} is a symlink{points_to} in image {image:?}, and a mount is never made \
                 through one: give the path it stands for",
                inside.display()
            )
        } else if !meta.is_dir() {
            format!("{} is not a directory in image {image:?}", inside.display())
        } else {
            continue;
        };
        return Err(StorageError::Invalid(format!(
            "{what}: path {target:?}: {why}"
        )));
    }
    Ok(())
}

/// Whether `path` is `dir` or inside it.
fn is_within(path: &str, dir: &str) -> bool {
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(paths: &[&str]) -> Result<(), StorageError> {
        let targets: Vec<(String, &str)> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("caches[{i}]"), *p))
            .collect();
        validate_targets(&targets)
    }

    #[test]
    fn only_plain_absolute_paths_outside_the_kernel_trees_and_apart() {
        check(&[
            "/root/.cargo/registry",
            "/opt/tools/",
            "/proceeds",
            "/devel",
        ])
        .expect("fine");
        for bad in [
            "relative",
            "/",
            "//",
            "/a//b",
            "/a/./b",
            "/a/../etc",
            "/proc",
            "/proc/sys",
            "/dev/shm",
            "/sys",
            "/a:b",
            "/a\nb",
        ] {
            let e = check(&[bad]).expect_err(bad);
            assert!(e.to_string().contains("caches[0]"), "{e}");
        }
        assert!(check(&["/a/b", "/a"]).is_err());
        assert!(check(&["/a", "/a/"]).is_err());
        check(&["/a", "/ab"]).expect("siblings");
    }

    #[test]
    fn a_target_through_a_symlink_or_a_file_of_the_image_is_refused_and_named() {
        let root = tempfile::tempdir().expect("tempdir");
        let root = root.path();
        std::fs::create_dir_all(root.join("run")).expect("mkdir");
        std::fs::create_dir_all(root.join("srv/data")).expect("mkdir");
        std::os::unix::fs::symlink("../run", root.join("var-run")).expect("symlink");
        std::fs::create_dir(root.join("var")).expect("mkdir");
        std::os::unix::fs::symlink("/run", root.join("var/run")).expect("symlink");
        std::fs::write(root.join("srv/file"), b"x").expect("write");
        let ok = |target: &str| check_in_image(root, "pg", "shared[0] (sock)", target);
        ok("/run/postgresql").expect("a real directory");
        ok("/srv/data").expect("an existing directory");
        ok("/not/there/yet").expect("made in the sandbox");
        let e = ok("/var/run/postgresql").expect_err("through a symlink");
        let e = e.to_string();
        assert!(
            e.starts_with("shared[0] (sock): path \"/var/run/postgresql\""),
            "{e}"
        );
        assert!(
            e.contains("/var/run is a symlink (to \"/run\") in image \"pg\""),
            "{e}"
        );
        let e = ok("/var-run").expect_err("the symlink itself").to_string();
        assert!(e.contains("/var-run is a symlink"), "{e}");
        let e = ok("/srv/file/sub").expect_err("through a file").to_string();
        assert!(e.contains("/srv/file is not a directory in image"), "{e}");
    }
}
