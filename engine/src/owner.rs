//! Who a sandbox belongs to, and who asks for one: the engine's side of ownership. A sandbox
//! belongs to the API key that created it (by the key's *name*), or to the Unix socket; a
//! caller sees and acts on its own sandboxes only, unless it sees all (the socket without a
//! key, the admin key). How a caller is identified (bearer keys, listeners) is the HTTP
//! edge's business (`api::auth`).

use std::fmt;
use std::sync::Arc;

/// Longest key name.
pub const MAX_NAME: usize = 64;

/// Whether `name` may name a key (and so an owner): 1 to [`MAX_NAME`] of `[A-Za-z0-9_.-]`.
pub fn is_valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The owner name of sandboxes created over the Unix socket without a key. No key may take it,
/// so that no key can be mistaken for the socket's root user in a listing.
pub const UNIX_OWNER: &str = "unix";

/// Who a key is: its name, and whether it is the admin key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyIdentity {
    /// The key's name (never the key).
    pub name: Arc<str>,
    /// Whether it sees and may act on every sandbox.
    pub admin: bool,
}

/// Who a sandbox belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Created over the Unix socket without a key; shown as [`UNIX_OWNER`].
    Unix,
    /// Created with the key of this name.
    Key(Arc<str>),
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Unix => f.write_str(UNIX_OWNER),
            Owner::Key(name) => f.write_str(name),
        }
    }
}

/// Who sent a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The Unix socket without a key: whoever can open the socket (root) sees everything.
    Unix,
    /// A request that presented this key.
    Key(KeyIdentity),
}

impl Caller {
    /// Whether it sees and may act on every sandbox (the Unix socket, the admin key).
    pub fn sees_all(&self) -> bool {
        match self {
            Caller::Unix => true,
            Caller::Key(key) => key.admin,
        }
    }

    /// The owner of the sandboxes it creates.
    pub fn owner(&self) -> Owner {
        match self {
            Caller::Unix => Owner::Unix,
            Caller::Key(key) => Owner::Key(key.name.clone()),
        }
    }

    /// Whether it may see and use a sandbox of `owner`. Matching is on the owner itself, not
    /// its display name, so that even a key named like [`UNIX_OWNER`] could not reach the
    /// socket's sandboxes.
    pub fn may_use(&self, owner: &Owner) -> bool {
        if self.sees_all() {
            return true;
        }
        match (self, owner) {
            (Caller::Key(key), Owner::Key(name)) => key.name == *name,
            _ => false,
        }
    }
}
