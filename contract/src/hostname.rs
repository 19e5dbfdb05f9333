//! A sandbox's hostname as a create request may give it: what both backends can set
//! (`sethostname(2)` takes at most 64 bytes) and a Kubernetes pod's hostname always is.

/// The most bytes a hostname may have (Linux's `__NEW_UTS_LEN`).
pub const MAX_BYTES: usize = 64;

/// The most bytes one label may have (RFC 1123).
const MAX_LABEL_BYTES: usize = 63;

/// Checks `name`: 1 to [`MAX_BYTES`] bytes of dot-separated labels, each 1 to 63 ASCII
/// letters, digits and `-`, neither starting nor ending with `-` (RFC 1123). The error says
/// what is wrong.
pub fn check(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_BYTES {
        return Err(format!(
            "{name:?} must be 1 to {MAX_BYTES} bytes, got {}",
            name.len()
        ));
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > MAX_LABEL_BYTES {
            return Err(format!(
                "{name:?}: each dot-separated label must be 1 to {MAX_LABEL_BYTES} bytes"
            ));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(format!(
                "{name:?}: only ASCII letters, digits, '-' and '.' are allowed"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("{name:?}: a label may not start or end with '-'"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_1123_names_up_to_64_bytes_pass_and_the_rest_say_why() {
        for good in ["a", "build-7", "web-0.svc", "X1", &"a".repeat(63)] {
            check(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        let long = format!("{}.{}", "a".repeat(40), "b".repeat(24));
        assert_eq!(long.len(), 65);
        for (bad, says) in [
            ("", "1 to 64"),
            (long.as_str(), "1 to 64"),
            (&"a".repeat(64), "label"),
            ("a..b", "label"),
            (".a", "label"),
            ("-a", "start or end"),
            ("a-", "start or end"),
            ("a_b", "letters"),
            ("a b", "letters"),
            ("h\u{e9}", "letters"),
            ("a\nb", "letters"),
        ] {
            let e = check(bad).expect_err(bad);
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
