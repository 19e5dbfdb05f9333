//! Bearer-key authentication: who a request comes from (`engine::owner` says what that
//! caller may see).
//!
//! Keys are named (`ci:KEY1,dev:KEY2`); a sandbox belongs to the key that created it, and
//! other keys cannot tell it from a missing one. One key may be the admin, which sees every
//! sandbox, as does a request on the Unix socket that carries no key. A key given without a
//! name is named after the key itself ([`derived_name`]), never after its place in the
//! configuration: removing one key must not rename another, which would hand it the removed
//! key's sandboxes, caches and images.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub(crate) use engine::owner::{is_valid_name, KeyIdentity, MAX_NAME, UNIX_OWNER};
pub use engine::owner::{Caller, Owner};

/// Why the configured keys were refused at startup. Messages name the entry by its place
/// (`CRUCIBLE_API_KEYS entry 3`, `FILE line 5`) and never repeat a key.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// A name with characters outside `[A-Za-z0-9_.-]`, empty, or too long. The entry itself is
    /// not shown: what was meant as a name may be the start of a key that contains `:`.
    #[error(
        "{at}: the key name before ':' must be 1 to {MAX_NAME} characters of A-Z a-z 0-9 _ . - \
         (the entry is not shown, it may hold a key)"
    )]
    BadName {
        /// Where the entry is.
        at: String,
    },
    /// `name:` with nothing after it.
    #[error("{at}: the entry named {name:?} has no key after ':'")]
    EmptyKey {
        /// Where the entry is.
        at: String,
        /// Its name.
        name: String,
    },
    /// The name reserved for the Unix socket's sandboxes.
    #[error("{at}: the key name {UNIX_OWNER:?} is reserved for sandboxes created over the Unix socket without a key")]
    ReservedName {
        /// Where the entry is.
        at: String,
    },
    /// A name of the form bare keys' names take: a key given it could one day be another
    /// key's owner name. Not shown, like a bad name.
    #[error(
        "{at}: key names of the form key-<{DERIVED_HEX_DIGITS} hex digits> are reserved for keys \
         given without a name (the entry is not shown, it may hold a key)"
    )]
    DerivedFormName {
        /// Where the entry is.
        at: String,
    },
    /// Two entries with one name (a bare key's derived name counts).
    #[error("{at}: the key name {name:?} is already used by {first}")]
    DuplicateName {
        /// Where the second entry is.
        at: String,
        /// The name.
        name: String,
        /// Where the first one is.
        first: String,
    },
    /// One key under two names: which of them a request acts as would be ambiguous.
    #[error("{at}: this key is already configured, as {first_name:?} ({first})")]
    DuplicateKey {
        /// Where the second entry is.
        at: String,
        /// The first entry's name.
        first_name: String,
        /// Where the first one is.
        first: String,
    },
    /// The admin key name names no configured key.
    #[error("the admin key name {0:?} names no configured API key")]
    UnknownAdmin(String),
    /// The keys file could not be read.
    #[error("reading the API keys file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The keys file is open to other users.
    #[error(
        "the API keys file {path} has mode {mode:04o}: it must not be accessible to group or \
         others (chmod 600 it)"
    )]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The keys file belongs to a user who could add keys to it.
    #[error(
        "the API keys file {path} is owned by uid {uid}: it must belong to root or to the \
         daemon's user"
    )]
    Owner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
    },
    /// The keys file is not UTF-8.
    #[error("the API keys file {path} is not UTF-8 text")]
    NotText {
        /// The file.
        path: PathBuf,
    },
}

/// Which listener a connection came from: TCP always requires an API key; the Unix socket,
/// which only root can open, does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// The Unix socket.
    Unix,
    /// TCP.
    Tcp,
}

/// What starts a bare key's derived name.
const DERIVED_PREFIX: &str = "key-";
/// How many hex digits of the key's SHA-256 a derived name holds (64 bits).
const DERIVED_HEX_DIGITS: usize = 16;

/// The name of a key given without one: `key-` and the first 16 hex digits of the SHA-256 of
/// the key. It depends on the key alone, so a key keeps its name (and with it its sandboxes,
/// caches and images) wherever it sits in the configuration, and a key that is removed leaves
/// its name to no other. 64 bits of a digest tell nothing about a random key; names are shown
/// to their own key, the admin and the daemon's log.
pub(crate) fn derived_name(key: &str) -> String {
    let digest = oci::Digest::of(key.as_bytes());
    let hex = digest.hex();
    format!(
        "{DERIVED_PREFIX}{}",
        hex.get(..DERIVED_HEX_DIGITS).unwrap_or(hex)
    )
}

/// Whether `name` has the form of a derived name (either case), which no named key may take.
fn has_derived_form(name: &str) -> bool {
    name.strip_prefix(DERIVED_PREFIX).is_some_and(|digits| {
        digits.len() == DERIVED_HEX_DIGITS && digits.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

#[derive(Clone)]
struct Entry {
    identity: KeyIdentity,
    secret: Vec<u8>,
    /// Where it was configured, for error messages.
    at: String,
}

/// The accepted API keys, each with a name. Empty means no authentication (only allowed on the
/// Unix socket, whose file mode already restricts who can connect).
#[derive(Clone, Default)]
pub struct ApiKeys {
    entries: Vec<Entry>,
}

/// Never prints a key: the configuration is `Debug`, and might end up in a log.
impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| &e.identity))
            .finish()
    }
}

impl ApiKeys {
    /// Keys in the `CRUCIBLE_API_KEYS` format: `name:key` entries (or bare keys) separated by
    /// commas or whitespace.
    pub fn parse(text: &str) -> Result<Self, KeysError> {
        Self::default().add_list(text, "CRUCIBLE_API_KEYS")
    }

    /// Adds the entries of `text` (the `CRUCIBLE_API_KEYS` format); `origin` says where they
    /// came from in error messages.
    pub fn add_list(mut self, text: &str, origin: &str) -> Result<Self, KeysError> {
        let entries = text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|e| !e.is_empty());
        for (i, entry) in entries.enumerate() {
            self.add_entry(entry, format!("{origin} entry {}", i + 1))?;
        }
        Ok(self)
    }

    /// Adds the keys of a keys file: the `CRUCIBLE_API_KEYS` format, conventionally one
    /// `name:key` per line; blank lines and lines starting with `#` are skipped. The file must
    /// belong to root or the daemon's user and be closed to group and others, since whoever can
    /// read it can act as every key in it, and whoever can write it can add one.
    pub fn add_file(mut self, path: &Path) -> Result<Self, KeysError> {
        let read_error = |source| KeysError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(read_error)?;
        // The open file's own metadata, so that what is checked is what is read.
        let meta = file.metadata().map_err(read_error)?;
        check_file_access(path, meta.mode(), meta.uid(), daemon_uid())?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(read_error)?;
        let text = String::from_utf8(bytes).map_err(|_| KeysError::NotText {
            path: path.to_path_buf(),
        })?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.starts_with('#') {
                continue;
            }
            for entry in line
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|e| !e.is_empty())
            {
                self.add_entry(entry, format!("{} line {}", path.display(), n + 1))?;
            }
        }
        Ok(self)
    }

    /// Makes the key named `name` the admin key, which sees every sandbox.
    pub fn with_admin(mut self, name: &str) -> Result<Self, KeysError> {
        let entry = self
            .entries
            .iter_mut()
            .find(|e| &*e.identity.name == name)
            .ok_or_else(|| KeysError::UnknownAdmin(name.to_string()))?;
        entry.identity.admin = true;
        Ok(self)
    }

    /// One `name:key` or bare `key` entry. A bare key is named by [`derived_name`], from the
    /// key alone: a name taken from its place would pass to another key when an earlier one is
    /// removed, and with it every sandbox, cache and image of that name.
    fn add_entry(&mut self, entry: &str, at: String) -> Result<(), KeysError> {
        let (name, secret) = match entry.split_once(':') {
            Some((name, secret)) => {
                if !is_valid_name(name) {
                    return Err(KeysError::BadName { at });
                }
                if has_derived_form(name) {
                    return Err(KeysError::DerivedFormName { at });
                }
                if secret.is_empty() {
                    return Err(KeysError::EmptyKey {
                        at,
                        name: name.to_string(),
                    });
                }
                (name.to_string(), secret)
            }
            None => (derived_name(entry), entry),
        };
        if name == UNIX_OWNER {
            return Err(KeysError::ReservedName { at });
        }
        // The key first: a bare key given twice has one name twice too, and the key is what
        // is wrong.
        if let Some(other) = self.entries.iter().find(|o| o.secret == secret.as_bytes()) {
            return Err(KeysError::DuplicateKey {
                at,
                first_name: other.identity.name.to_string(),
                first: other.at.clone(),
            });
        }
        if let Some(other) = self.entries.iter().find(|o| *o.identity.name == *name) {
            return Err(KeysError::DuplicateName {
                at,
                name,
                first: other.at.clone(),
            });
        }
        self.entries.push(Entry {
            identity: KeyIdentity {
                name: name.into(),
                admin: false,
            },
            secret: secret.as_bytes().to_vec(),
            at,
        });
        Ok(())
    }

    /// Whether any key is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The names of the configured keys, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| &*e.identity.name)
    }

    /// The key an `Authorization` header value presents, if it is one of ours. Every
    /// configured key is compared in full, in time independent of where the bytes differ and
    /// of which key matched: no early exit, and the match is selected with a mask rather than
    /// a branch.
    pub(crate) fn authenticate(&self, authorization: Option<&[u8]>) -> Option<&KeyIdentity> {
        let presented = authorization?.strip_prefix(b"Bearer ")?.trim_ascii();
        // 1 + the index of the matching key; 0 for none. Keys are unique, so at most one does.
        let mut found = 0usize;
        for (i, entry) in self.entries.iter().enumerate() {
            let equal = std::hint::black_box(constant_time_eq(&entry.secret, presented));
            let mask = usize::from(equal).wrapping_neg();
            found = (found & !mask) | ((i + 1) & mask);
        }
        let index = found.checked_sub(1)?;
        self.entries.get(index).map(|e| &e.identity)
    }

    /// Who sent a request that arrived on `transport` with this `Authorization` value; `None`
    /// means 401. With no key configured the Unix socket is everyone's (TCP never runs without
    /// keys). Otherwise a presented key must be valid on either transport — a wrong key is
    /// refused, never taken as the socket's root — and no key at all is the root user on the
    /// Unix socket and refused on TCP.
    pub(crate) fn identify(
        &self,
        transport: Transport,
        authorization: Option<&[u8]>,
    ) -> Option<Caller> {
        if self.is_empty() {
            return (transport == Transport::Unix).then_some(Caller::Unix);
        }
        match (authorization, transport) {
            (Some(value), _) => self
                .authenticate(Some(value))
                .map(|key| Caller::Key(key.clone())),
            (None, Transport::Unix) => Some(Caller::Unix),
            (None, Transport::Tcp) => None,
        }
    }
}

/// The uid the daemon runs as (the owner of `/proc/self`, so without `unsafe`).
fn daemon_uid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
}

/// A keys file must be closed to group and others, and belong to root or the daemon's user.
fn check_file_access(path: &Path, mode: u32, uid: u32, daemon_uid: u32) -> Result<(), KeysError> {
    if mode & 0o077 != 0 {
        return Err(KeysError::Permissions {
            path: path.to_path_buf(),
            mode: mode & 0o7777,
        });
    }
    if uid != 0 && uid != daemon_uid {
        return Err(KeysError::Owner {
            path: path.to_path_buf(),
            uid,
        });
    }
    Ok(())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn name_of(keys: &ApiKeys, header: &[u8]) -> Option<String> {
        keys.authenticate(Some(header))
            .map(|identity| identity.name.to_string())
    }

    #[test]
    fn bearer_key_must_match_exactly() {
        let keys = ApiKeys::parse("alpha, beta\ngamma").expect("valid");
        assert!(keys.authenticate(Some(b"Bearer beta")).is_some());
        assert!(keys.authenticate(Some(b"Bearer gamma ")).is_some());
        assert!(keys.authenticate(Some(b"Bearer bet")).is_none());
        assert!(keys.authenticate(Some(b"Bearer betaa")).is_none());
        assert!(keys.authenticate(Some(b"beta")).is_none());
        assert!(keys.authenticate(Some(b"Basic beta")).is_none());
        assert!(keys.authenticate(None).is_none());
    }

    #[test]
    fn blank_entries_are_ignored() {
        assert!(ApiKeys::parse(" , ,\n").expect("valid").is_empty());
        let none = ApiKeys::parse("").expect("valid");
        assert!(none.authenticate(Some(b"Bearer ")).is_none());
    }

    #[test]
    fn named_keys_say_which_key_matched() {
        let keys = ApiKeys::parse("ci:KEY-ONE,dev:KEY-TWO ops.team-1_x:KEY-THREE").expect("valid");
        assert_eq!(name_of(&keys, b"Bearer KEY-ONE").as_deref(), Some("ci"));
        assert_eq!(name_of(&keys, b"Bearer KEY-TWO").as_deref(), Some("dev"));
        assert_eq!(
            name_of(&keys, b"Bearer KEY-THREE").as_deref(),
            Some("ops.team-1_x")
        );
        // The name is not part of the key.
        assert_eq!(name_of(&keys, b"Bearer ci:KEY-ONE"), None);
        assert_eq!(name_of(&keys, b"Bearer KEY-ON"), None);
        let names: Vec<_> = keys.names().collect();
        assert_eq!(names, ["ci", "dev", "ops.team-1_x"]);
    }

    #[test]
    fn the_last_and_first_keys_match_too() {
        // The mask selection must not favour any position.
        let keys = ApiKeys::parse("a:k1,b:k2,c:k3,d:k4").expect("valid");
        for (key, name) in [("k1", "a"), ("k2", "b"), ("k3", "c"), ("k4", "d")] {
            let header = format!("Bearer {key}");
            assert_eq!(name_of(&keys, header.as_bytes()).as_deref(), Some(name));
        }
    }

    #[test]
    fn a_bare_keys_name_is_the_start_of_its_sha256() {
        // As `printf %s first | sha256sum | cut -c1-16` says.
        assert_eq!(derived_name("first"), "key-a7937b64b8caa58f");
        let keys = ApiKeys::parse("first,ci:second third").expect("valid");
        assert_eq!(
            name_of(&keys, b"Bearer first").as_deref(),
            Some("key-a7937b64b8caa58f")
        );
        assert_eq!(name_of(&keys, b"Bearer second").as_deref(), Some("ci"));
        assert_eq!(
            name_of(&keys, b"Bearer third").as_deref(),
            Some(&*derived_name("third"))
        );
        for key in ["first", "third", "a", "x".repeat(4096).as_str()] {
            let name = derived_name(key);
            assert!(is_valid_name(&name), "{name}");
            assert!(has_derived_form(&name), "{name}");
            assert_ne!(name, UNIX_OWNER);
        }
        assert_ne!(derived_name("first"), derived_name("third"));
        // A key may contain ':' after its name.
        let keys = ApiKeys::parse("ci:a:b").expect("valid");
        assert_eq!(name_of(&keys, b"Bearer a:b").as_deref(), Some("ci"));
    }

    #[test]
    fn a_bare_keys_name_follows_the_key_not_its_place_so_revoking_one_renames_no_other() {
        let both = ApiKeys::parse("kA,kB").expect("valid");
        let names: Vec<_> = both.names().collect();
        let (name_a, name_b) = (derived_name("kA"), derived_name("kB"));
        assert_eq!(names, [name_a.as_str(), name_b.as_str()]);
        // kA revoked: kB keeps its own name and never takes kA's.
        let revoked = ApiKeys::parse("kB").expect("valid");
        assert_eq!(name_of(&revoked, b"Bearer kB").as_deref(), Some(&*name_b));
        assert!(revoked.names().all(|name| name != name_a));
        // Reordered, or behind named keys and another source: the same names.
        let reordered = ApiKeys::parse("kB,kA").expect("valid");
        assert_eq!(name_of(&reordered, b"Bearer kA").as_deref(), Some(&*name_a));
        assert_eq!(name_of(&reordered, b"Bearer kB").as_deref(), Some(&*name_b));
        let mixed = ApiKeys::parse("ci:x,dev:y")
            .and_then(|k| k.add_list("kB kA", "elsewhere"))
            .expect("valid");
        assert_eq!(name_of(&mixed, b"Bearer kA").as_deref(), Some(&*name_a));
        assert_eq!(name_of(&mixed, b"Bearer kB").as_deref(), Some(&*name_b));
        // A derived name is as good as any for the admin.
        let admin = ApiKeys::parse("kA,kB")
            .and_then(|k| k.with_admin(&name_b))
            .expect("valid");
        assert_eq!(
            admin.authenticate(Some(b"Bearer kB")).map(|k| k.admin),
            Some(true)
        );
    }

    #[test]
    fn no_named_key_may_take_the_form_of_a_derived_name() {
        let taken = derived_name("kA");
        for name in [
            taken.clone(),
            taken.to_ascii_uppercase().replacen("KEY-", "key-", 1),
            "key-0123456789abcdef".to_string(),
        ] {
            let error =
                ApiKeys::parse(&format!("kA,{name}:s3cr3t")).expect_err("a name of derived form");
            let message = error.to_string();
            assert!(
                matches!(error, KeysError::DerivedFormName { .. }),
                "{name}: {message}"
            );
            assert!(
                message.starts_with("CRUCIBLE_API_KEYS entry 2:"),
                "{message}"
            );
            assert!(!message.contains("s3cr3t"), "{message}");
            // Refused even with no bare key configured: the key it would collide with may be
            // configured tomorrow, or may have been yesterday.
            let alone = ApiKeys::parse(&format!("{name}:s3cr3t")).expect_err("alone");
            assert!(
                matches!(alone, KeysError::DerivedFormName { .. }),
                "{alone}"
            );
        }
        // Names that only look alike are anyone's: other lengths, not hex, no dash, and the
        // positional names of old (`key1:…` keeps what a bare first key had before).
        for name in [
            "key-0123456789abcde",
            "key-0123456789abcdef0",
            "key-0123456789abcdeg",
            "key0123456789abcdef",
            "key-ci",
            "key1",
            "key2",
        ] {
            let keys = ApiKeys::parse(&format!("kA,{name}:s3cr3t")).expect(name);
            assert_eq!(name_of(&keys, b"Bearer s3cr3t").as_deref(), Some(name));
        }
    }

    #[test]
    fn bad_names_are_refused_without_echoing_the_entry() {
        let long = format!("{}:s3cr3t", "n".repeat(65));
        for list in [
            "ok:k1,b@d:s3cr3t".to_string(),
            "ok:k1,:s3cr3t".to_string(),
            "ok:k1,é:s3cr3t".to_string(),
            format!("ok:k1,{long}"),
        ] {
            let error = ApiKeys::parse(&list).expect_err("a bad name");
            let message = error.to_string();
            assert!(matches!(error, KeysError::BadName { .. }), "{message}");
            assert!(
                message.starts_with("CRUCIBLE_API_KEYS entry 2:"),
                "{message}"
            );
            assert!(!message.contains("s3cr3t"), "{message}");
        }
        assert!(ApiKeys::parse(&format!("{}:k", "n".repeat(64))).is_ok());
    }

    #[test]
    fn empty_keys_reserved_and_duplicate_names_and_keys_are_refused() {
        let error = ApiKeys::parse("ci:").expect_err("no key");
        assert!(matches!(error, KeysError::EmptyKey { .. }), "{error}");
        let error = ApiKeys::parse("unix:s3cr3t").expect_err("reserved");
        assert!(matches!(error, KeysError::ReservedName { .. }), "{error}");

        let error = ApiKeys::parse("ci:s3cr3t-1,dev:x,ci:s3cr3t-2").expect_err("dup name");
        let message = error.to_string();
        assert!(
            matches!(&error, KeysError::DuplicateName { name, .. } if name == "ci"),
            "{message}"
        );
        assert!(message.contains("entry 1"), "{message}");
        assert!(!message.contains("s3cr3t"), "{message}");
        // A derived name is checked like any other: the same key twice is refused, and its
        // name may be the admin's.
        let error = ApiKeys::parse("s3cr3t-1,ci:x,s3cr3t-1").expect_err("dup bare key");
        let message = error.to_string();
        assert!(
            matches!(&error, KeysError::DuplicateKey { first_name, .. }
                if *first_name == derived_name("s3cr3t-1")),
            "{message}"
        );
        assert!(
            message.contains("entry 1") && message.contains("entry 3"),
            "{message}"
        );
        assert!(!message.contains("s3cr3t"), "{message}");
        // Two bare keys whose names collided (64 bits of digest: never in practice) would be
        // refused by the name check, which a derived name goes through like any other.
        let mut keys = ApiKeys::parse("ci:x").expect("valid");
        keys.entries[0].identity.name = derived_name("s3cr3t-2").into();
        let error = keys
            .add_list("s3cr3t-2", "CRUCIBLE_API_KEYS")
            .expect_err("dup derived name");
        assert!(
            matches!(&error, KeysError::DuplicateName { name, .. }
                if *name == derived_name("s3cr3t-2")),
            "{error}"
        );

        let error = ApiKeys::parse("ci:s3cr3t,dev:s3cr3t").expect_err("dup key");
        let message = error.to_string();
        assert!(
            matches!(&error, KeysError::DuplicateKey { first_name, .. } if first_name == "ci"),
            "{message}"
        );
        assert!(!message.contains("s3cr3t"), "{message}");
        let error = ApiKeys::parse("s3cr3t s3cr3t").expect_err("dup bare key");
        assert!(matches!(error, KeysError::DuplicateKey { .. }), "{error}");
    }

    fn keys_file(text: &str, mode: u32) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(text.as_bytes()).expect("write");
        std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(mode))
            .expect("chmod");
        file
    }

    #[test]
    fn keys_file_has_one_entry_a_line_with_comments() {
        let file = keys_file(
            "# CI runners\nci:KEY-ONE\n\n   # the dev team\n  dev:KEY-TWO  \nKEY-BARE\n",
            0o600,
        );
        let keys = ApiKeys::default()
            .add_list("env:KEY-ENV", "CRUCIBLE_API_KEYS")
            .and_then(|k| k.add_file(file.path()))
            .expect("valid");
        let names: Vec<_> = keys.names().collect();
        // The bare key's name is its own, not its place (the fourth entry in all).
        let bare = derived_name("KEY-BARE");
        assert_eq!(names, ["env", "ci", "dev", bare.as_str()]);
        assert_eq!(name_of(&keys, b"Bearer KEY-TWO").as_deref(), Some("dev"));

        let file = keys_file("ci:KEY-ONE\n# comment\nci:s3cr3t\n", 0o600);
        let error = ApiKeys::default().add_file(file.path()).expect_err("dup");
        let message = error.to_string();
        assert!(message.contains("line 3"), "{message}");
        assert!(message.contains("line 1"), "{message}");
        assert!(!message.contains("s3cr3t"), "{message}");

        let file = keys_file("ci:KEY-ONE\ndev:KEY-ONE\n", 0o600);
        let error = ApiKeys::default().add_file(file.path()).expect_err("dup");
        assert!(matches!(error, KeysError::DuplicateKey { .. }), "{error}");

        let file = keys_file("ci:KEY-ONE\nb@d:s3cr3t\n", 0o400);
        let error = ApiKeys::default()
            .add_file(file.path())
            .expect_err("bad name");
        let message = error.to_string();
        assert!(message.ends_with("line 2: the key name before ':' must be 1 to 64 characters of A-Z a-z 0-9 _ . - (the entry is not shown, it may hold a key)"), "{message}");
        assert!(!message.contains("s3cr3t"), "{message}");

        // Duplicates across the list and the file are refused too.
        let file = keys_file("ci:KEY-ONE\n", 0o600);
        let error = ApiKeys::parse("ci:OTHER")
            .and_then(|k| k.add_file(file.path()))
            .expect_err("dup across sources");
        assert!(matches!(error, KeysError::DuplicateName { .. }), "{error}");
    }

    #[test]
    fn keys_file_must_be_closed_to_group_and_others() {
        for mode in [0o640, 0o604, 0o660, 0o644, 0o620, 0o602, 0o610] {
            let file = keys_file("ci:KEY-ONE\n", mode);
            match ApiKeys::default().add_file(file.path()) {
                Err(KeysError::Permissions { mode: got, .. }) => assert_eq!(got, mode),
                other => panic!("mode {mode:o}: {other:?}"),
            }
        }
        for mode in [0o600, 0o400] {
            let file = keys_file("ci:KEY-ONE\n", mode);
            ApiKeys::default()
                .add_file(file.path())
                .unwrap_or_else(|e| panic!("mode {mode:o}: {e}"));
        }
        let path = Path::new("/k");
        assert!(check_file_access(path, 0o100600, 1000, 1000).is_ok());
        assert!(check_file_access(path, 0o100600, 0, 1000).is_ok());
        assert!(matches!(
            check_file_access(path, 0o100600, 1001, 1000),
            Err(KeysError::Owner { uid: 1001, .. })
        ));
        let missing = ApiKeys::default().add_file(Path::new("/nonexistent/keys"));
        assert!(matches!(missing, Err(KeysError::Read { .. })));
    }

    #[test]
    fn admin_is_named_and_must_exist() {
        let keys = ApiKeys::parse("ci:k1,root:k2")
            .and_then(|k| k.with_admin("root"))
            .expect("valid");
        assert_eq!(
            keys.authenticate(Some(b"Bearer k2")).map(|k| k.admin),
            Some(true)
        );
        assert_eq!(
            keys.authenticate(Some(b"Bearer k1")).map(|k| k.admin),
            Some(false)
        );
        let error = ApiKeys::parse("ci:k1")
            .and_then(|k| k.with_admin("root"))
            .expect_err("no such key");
        assert!(matches!(error, KeysError::UnknownAdmin(_)), "{error}");
    }

    #[test]
    fn debug_never_shows_a_key() {
        let keys = ApiKeys::parse("ci:s3cr3t-one,s3cr3t-two").expect("valid");
        let text = format!("{keys:?}");
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(
            text.contains("ci") && text.contains(&derived_name("s3cr3t-two")),
            "{text}"
        );
    }

    #[test]
    fn callers_by_transport() {
        let keys = ApiKeys::parse("ci:k1,dev:k2,root:k3")
            .and_then(|k| k.with_admin("root"))
            .expect("valid");
        let unix = Transport::Unix;
        let tcp = Transport::Tcp;
        assert_eq!(keys.identify(unix, None), Some(Caller::Unix));
        assert_eq!(keys.identify(tcp, None), None);
        assert_eq!(keys.identify(unix, Some(b"Bearer nope")), None);
        assert_eq!(keys.identify(tcp, Some(b"Bearer nope")), None);
        assert_eq!(keys.identify(unix, Some(b"")), None);
        let ci = keys.identify(unix, Some(b"Bearer k1")).expect("ci");
        assert_eq!(keys.identify(tcp, Some(b"Bearer k1")), Some(ci.clone()));
        let dev = keys.identify(tcp, Some(b"Bearer k2")).expect("dev");
        let root = keys.identify(tcp, Some(b"Bearer k3")).expect("root");

        let ci_owned = ci.owner();
        assert_eq!(ci_owned.to_string(), "ci");
        assert!(ci.may_use(&ci_owned));
        assert!(!dev.may_use(&ci_owned));
        assert!(root.may_use(&ci_owned));
        assert!(Caller::Unix.may_use(&ci_owned));
        assert!(!ci.may_use(&Owner::Unix));
        assert!(root.may_use(&Owner::Unix));
        assert_eq!(Owner::Unix.to_string(), "unix");

        // Without keys, only the socket is open, and to everyone on it.
        let none = ApiKeys::default();
        assert_eq!(
            none.identify(unix, Some(b"Bearer anything")),
            Some(Caller::Unix)
        );
        assert_eq!(none.identify(tcp, None), None);
    }
}
