//! What a tar member's path means for the tree being written: the root itself, an entry to
//! create, or a whiteout. Paths are judged as raw bytes, before anything touches the disk.

/// Longest member path (or hard-link target) accepted, as Linux's `PATH_MAX`.
pub(super) const MAX_PATH_BYTES: usize = 4096;

/// The basename that marks a directory opaque (its lower layers' children are hidden).
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
/// Basenames starting with this are whiteouts and are never created.
const WHITEOUT_PREFIX: &[u8] = b".wh.";

/// A member path split into its components below the root, `.` and empty components dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RelPath<'a> {
    components: Vec<&'a [u8]>,
}

impl<'a> RelPath<'a> {
    /// Splits `raw`, refusing anything that could name a place outside the root or that the
    /// kernel would misread: a `..` component, a NUL byte, more than [`MAX_PATH_BYTES`].
    /// Leading `/` and `./` are dropped, so an absolute path names the same place in the root.
    pub(super) fn parse(raw: &'a [u8]) -> Result<Self, &'static str> {
        if raw.len() > MAX_PATH_BYTES {
            return Err("the path is longer than 4096 bytes");
        }
        if raw.contains(&0) {
            return Err("the path contains a NUL byte");
        }
        let mut components = Vec::new();
        for component in raw.split(|byte| *byte == b'/') {
            match component {
                b"" | b"." => {}
                b".." => return Err("the path has a `..` component"),
                name => components.push(name),
            }
        }
        Ok(Self { components })
    }

    pub(super) fn components(&self) -> &[&'a [u8]] {
        &self.components
    }

    pub(super) fn is_root(&self) -> bool {
        self.components.is_empty()
    }

    /// The components joined by `/` (`.` for the root), for `openat2` below the root fd.
    pub(super) fn joined(&self) -> Vec<u8> {
        join(&self.components)
    }
}

/// `components` joined by `/`, or `.` when there are none.
pub(super) fn join(components: &[&[u8]]) -> Vec<u8> {
    if components.is_empty() {
        return b".".to_vec();
    }
    components.join(&b'/')
}

/// What one member path asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target<'a> {
    /// The root directory itself (`.`, `/`, `./`): nothing is done for it.
    Root,
    /// An entry to create: `name` inside the directory `parent`.
    Entry {
        parent: Vec<&'a [u8]>,
        name: &'a [u8],
    },
    /// `parent/.wh.NAME`: remove `parent/NAME` from the lower layers.
    Whiteout {
        parent: Vec<&'a [u8]>,
        name: &'a [u8],
    },
    /// `parent/.wh..wh..opq`: remove every lower-layer child of `parent`.
    Opaque { parent: Vec<&'a [u8]> },
    /// Another `.wh..wh.*` name (aufs bookkeeping such as `.wh..wh.plnk`): ignored.
    WhiteoutMetadata,
}

/// Classifies a member path (see [`Target`]); the error says why the path is refused.
pub(super) fn classify(raw: &[u8]) -> Result<Target<'_>, &'static str> {
    let path = RelPath::parse(raw)?;
    let Some((&last, parent)) = path.components().split_last() else {
        return Ok(Target::Root);
    };
    let parent = parent.to_vec();
    if last == OPAQUE_MARKER {
        return Ok(Target::Opaque { parent });
    }
    let Some(hidden) = last.strip_prefix(WHITEOUT_PREFIX) else {
        return Ok(Target::Entry { parent, name: last });
    };
    if hidden.starts_with(WHITEOUT_PREFIX) {
        return Ok(Target::WhiteoutMetadata);
    }
    if matches!(hidden, b"" | b"." | b"..") {
        return Err("the whiteout names no entry (`.wh.`, `.wh..` or `.wh...`)");
    }
    Ok(Target::Whiteout {
        parent,
        name: hidden,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_slashes_and_dots_are_dropped() {
        let expected = Target::Entry {
            parent: vec![b"etc".as_slice()],
            name: b"passwd",
        };
        for raw in [
            &b"etc/passwd"[..],
            b"/etc/passwd",
            b"./etc/passwd",
            b"//./etc//./passwd/",
        ] {
            assert_eq!(classify(raw), Ok(expected.clone()), "{raw:?}");
        }
    }

    #[test]
    fn root_spellings_name_the_root() {
        for raw in [&b""[..], b".", b"./", b"/", b"//.//"] {
            assert_eq!(classify(raw), Ok(Target::Root), "{raw:?}");
        }
    }

    #[test]
    fn dot_dot_nul_and_overlong_paths_are_refused() {
        for raw in [
            &b".."[..],
            b"../x",
            b"a/../../x",
            b"/../x",
            b"a/..",
            b"a\0b",
        ] {
            assert!(classify(raw).is_err(), "{raw:?}");
        }
        assert!(classify(&[b'a'; MAX_PATH_BYTES + 1]).is_err());
        assert!(classify(&[b'a'; MAX_PATH_BYTES]).is_ok());
    }

    #[test]
    fn whiteouts_are_recognised_by_basename() {
        assert_eq!(
            classify(b"usr/.wh.lib"),
            Ok(Target::Whiteout {
                parent: vec![b"usr".as_slice()],
                name: b"lib"
            })
        );
        assert_eq!(
            classify(b"usr/.wh..wh..opq"),
            Ok(Target::Opaque {
                parent: vec![b"usr".as_slice()]
            })
        );
        assert_eq!(
            classify(b".wh..wh..opq"),
            Ok(Target::Opaque { parent: vec![] })
        );
        assert_eq!(classify(b"a/.wh..wh.plnk"), Ok(Target::WhiteoutMetadata));
        for raw in [&b"a/.wh."[..], b"a/.wh..", b"a/.wh..."] {
            assert!(classify(raw).is_err(), "{raw:?}");
        }
        // Only the basename counts: a directory named `.wh.x` on the way is an ordinary entry.
        assert_eq!(
            classify(b".wh.x/y"),
            Ok(Target::Entry {
                parent: vec![b".wh.x".as_slice()],
                name: b"y"
            })
        );
    }
}
