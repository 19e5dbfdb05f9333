//! Bearer-key authentication.

use std::collections::HashSet;

/// The accepted API keys. Empty means no authentication (only allowed on the Unix socket, whose
/// file mode already restricts who can connect).
#[derive(Debug, Clone, Default)]
pub struct ApiKeys {
    keys: Vec<Vec<u8>>,
}

impl ApiKeys {
    /// Keys from a list; blank entries are ignored and duplicates collapsed.
    pub fn new<I: IntoIterator<Item = String>>(keys: I) -> Self {
        let unique: HashSet<String> = keys
            .into_iter()
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect();
        ApiKeys {
            keys: unique.into_iter().map(String::into_bytes).collect(),
        }
    }

    /// Keys from the `CRUCIBLE_API_KEYS` format: separated by commas or whitespace.
    pub fn parse(text: &str) -> Self {
        Self::new(
            text.split(|c: char| c == ',' || c.is_whitespace())
                .map(String::from),
        )
    }

    /// Whether any key is configured.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Checks an `Authorization` header value. Every configured key is compared in full, in
    /// time independent of where the bytes differ.
    pub fn allows(&self, authorization: Option<&[u8]>) -> bool {
        let Some(presented) = authorization.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return false;
        };
        let presented = presented.trim_ascii();
        let mut ok = false;
        for key in &self.keys {
            ok |= constant_time_eq(key, presented);
        }
        ok
    }
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
    use super::*;

    #[test]
    fn bearer_key_must_match_exactly() {
        let keys = ApiKeys::parse("alpha, beta\ngamma");
        assert!(keys.allows(Some(b"Bearer beta")));
        assert!(keys.allows(Some(b"Bearer gamma ")));
        assert!(!keys.allows(Some(b"Bearer bet")));
        assert!(!keys.allows(Some(b"Bearer betaa")));
        assert!(!keys.allows(Some(b"beta")));
        assert!(!keys.allows(Some(b"Basic beta")));
        assert!(!keys.allows(None));
    }

    #[test]
    fn blank_keys_are_ignored() {
        assert!(ApiKeys::parse(" , ,\n").is_empty());
        assert!(!ApiKeys::parse("").allows(Some(b"Bearer ")));
    }
}
