//! Read-only volumes the operator declares (`crucible serve --volume NAME=DIR:ro`) and
//! sandboxes request by name: toolchains, datasets. A sandbox can never write to one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::StorageError;

/// The declared volumes, by name.
#[derive(Debug, Clone, Default)]
pub struct Volumes {
    by_name: BTreeMap<String, PathBuf>,
}

impl Volumes {
    /// Adds one declaration, `NAME=DIR` or `NAME=DIR:ro` (`:rw` is refused: volumes are
    /// shared by every sandbox, so a writable one would let one job tamper with the next).
    pub fn declare(&mut self, text: &str) -> Result<(), StorageError> {
        let bad = |why: &str| StorageError::Invalid(format!("--volume {text:?}: {why}"));
        let (name, rest) = text
            .split_once('=')
            .ok_or_else(|| bad("expected NAME=DIR[:ro]"))?;
        let dir = match rest.rsplit_once(':') {
            Some((dir, "ro")) => dir,
            Some((_, "rw")) => return Err(bad("volumes are read-only; use a cache for writes")),
            Some((_, mode)) if !mode.contains('/') => {
                return Err(bad(&format!("unknown mode {mode:?} (only ro)")))
            }
            _ => rest,
        };
        super::caches::validate_name(name)
            .map_err(|_| bad("NAME must be 1 to 64 of A-Z a-z 0-9 . _ - and not start with ."))?;
        if dir.contains(':') {
            return Err(bad("DIR may not contain ':'"));
        }
        let dir = Path::new(dir);
        if !dir.is_absolute() {
            return Err(bad("DIR must be an absolute path"));
        }
        let dir = dir
            .canonicalize()
            .map_err(|e| bad(&format!("{}: {e}", dir.display())))?;
        if !dir.is_dir() {
            return Err(bad(&format!("{} is not a directory", dir.display())));
        }
        if self.by_name.insert(name.to_string(), dir).is_some() {
            return Err(bad(&format!("volume {name:?} is declared twice")));
        }
        Ok(())
    }

    /// The host directory of volume `name`.
    pub(crate) fn get(&self, name: &str) -> Result<&Path, StorageError> {
        self.by_name
            .get(name)
            .map(PathBuf::as_path)
            .ok_or_else(|| StorageError::NoVolume {
                name: name.to_string(),
                declared: if self.by_name.is_empty() {
                    "none".into()
                } else {
                    self.names().collect::<Vec<_>>().join(", ")
                },
            })
    }

    /// The declared names.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_are_read_only_existing_directories() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().display().to_string();
        let mut volumes = Volumes::default();
        volumes
            .declare(&format!("toolchains={dir}:ro"))
            .expect("ro");
        volumes
            .declare(&format!("data={dir}"))
            .expect("ro by default");
        assert_eq!(
            volumes.get("data").expect("declared"),
            tmp.path().canonicalize().expect("c")
        );
        for bad in [
            format!("x={dir}:rw"),
            format!("x={dir}:wat"),
            format!("toolchains={dir}"),
            "x=relative".into(),
            "x=/no/such/dir".into(),
            format!(".x={dir}"),
            "nodir".into(),
        ] {
            assert!(volumes.declare(&bad).is_err(), "{bad}");
        }
        let e = volumes.get("nope").expect_err("undeclared");
        assert!(e.to_string().contains("data, toolchains"), "{e}");
    }
}
