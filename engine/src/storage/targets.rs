//! Where caches and volumes may appear inside a sandbox.

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
}
