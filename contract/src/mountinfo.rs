//! `/proc/PID/mountinfo`'s escaping: the kernel writes a space, tab, newline and backslash in
//! a path as three octal digits after a backslash (`\040`, `\011`, `\012`, `\134`).

/// A mountinfo path with the kernel's octal escapes undone (invalid UTF-8 replaced).
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|digits| {
            std::str::from_utf8(digits)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_undone_and_odd_backslashes_kept() {
        assert_eq!(unescape("/a\\040b\\011c\\134d"), "/a b\tc\\d");
        assert_eq!(unescape("/trailing\\"), "/trailing\\");
        assert_eq!(unescape("/not\\9oct"), "/not\\9oct");
    }
}
