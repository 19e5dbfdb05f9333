//! What the CLI's end-to-end tests share.

/// Whether `bytes` hold a control character a terminal acts on: C0 (but the line ends of the
/// output's own lines), DEL, or C1 in UTF-8.
pub(crate) fn has_control(bytes: &[u8]) -> bool {
    bytes.iter().any(|&b| (b < 0x20 && b != b'\n') || b == 0x7f)
        || bytes
            .windows(2)
            .any(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1]))
}
