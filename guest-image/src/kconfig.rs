//! The kernel config fragment and the check that `make` really honoured it.

use std::collections::BTreeMap;

use thiserror::Error;

/// The fragment checked into the repository, applied on top of `make ARCH=x86_64 tinyconfig`.
pub const FRAGMENT: &str = include_str!("../kernel/microvm-x86_64.config");
/// Its file name, for messages and the manifest.
pub const FRAGMENT_NAME: &str = "microvm-x86_64.config";

#[derive(Debug, Error, PartialEq, Eq)]
pub enum KconfigError {
    #[error("config fragment line {line}: cannot parse {text:?}")]
    Parse { line: usize, text: String },
    #[error(
        "the kernel's final .config does not honour the fragment {fragment}:{}{}\n\
         (usually a dependency that is off; see the option's `depends on` in Kconfig)",
        if missing.is_empty() { String::new() } else { format!("\n  not =y: {}", missing.join(" ")) },
        if unwanted.is_empty() { String::new() } else { format!("\n  enabled but must be off: {}", unwanted.join(" ")) }
    )]
    NotHonoured {
        fragment: String,
        missing: Vec<String>,
        unwanted: Vec<String>,
    },
}

/// What the fragment asks of one option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// `CONFIG_X=y`
    Yes,
    /// `# CONFIG_X is not set`
    Off,
    /// `CONFIG_X=<value>` other than `y` (numbers, strings, `m`): compared as text.
    Value(String),
}

/// Parses a fragment into option name → wish, in file order of first appearance (later lines
/// override earlier ones, as in Kconfig).
pub fn parse_fragment(text: &str) -> Result<BTreeMap<String, Want>, KconfigError> {
    let mut wants = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim();
            if let Some(name) = rest.strip_suffix(" is not set") {
                if name.starts_with("CONFIG_") && !name.contains(' ') {
                    wants.insert(name.to_string(), Want::Off);
                }
            }
            continue;
        }
        let parsed = line
            .split_once('=')
            .filter(|(name, _)| name.starts_with("CONFIG_") && !name.contains(' '));
        let Some((name, value)) = parsed else {
            return Err(KconfigError::Parse {
                line: i + 1,
                text: raw.to_string(),
            });
        };
        let want = if value == "y" {
            Want::Yes
        } else {
            Want::Value(value.to_string())
        };
        wants.insert(name.to_string(), want);
    }
    Ok(wants)
}

/// Parses a full `.config` into option name → value (options that are `not set` are absent).
pub fn parse_config(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| l.starts_with("CONFIG_"))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Fails naming every option of `fragment` that the final `config` does not honour.
pub fn verify(fragment_name: &str, fragment: &str, config: &str) -> Result<(), KconfigError> {
    let wants = parse_fragment(fragment)?;
    let have = parse_config(config);
    let mut missing = Vec::new();
    let mut unwanted = Vec::new();
    for (name, want) in &wants {
        let value = have.get(name).map(String::as_str);
        match want {
            Want::Yes if value != Some("y") => missing.push(name.clone()),
            Want::Off if matches!(value, Some("y" | "m")) => unwanted.push(name.clone()),
            Want::Value(v) if value != Some(v.as_str()) => {
                missing.push(format!("{name}={v}"));
            }
            _ => {}
        }
    }
    if missing.is_empty() && unwanted.is_empty() {
        Ok(())
    } else {
        Err(KconfigError::NotHonoured {
            fragment: fragment_name.to_string(),
            missing,
            unwanted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAG: &str = "\
# comment
CONFIG_64BIT=y
CONFIG_VIRTIO_VSOCKETS=y
CONFIG_NR_CPUS=8
# CONFIG_PCI is not set
";

    #[test]
    fn checked_in_fragment_parses_and_asks_for_what_the_agent_needs() {
        let wants = parse_fragment(FRAGMENT).unwrap();
        for name in [
            "CONFIG_64BIT",
            "CONFIG_PVH",
            "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES",
            "CONFIG_VIRTIO_VSOCKETS",
            "CONFIG_VIRTIO_BLK",
            "CONFIG_VIRTIO_CONSOLE",
            "CONFIG_SERIAL_8250_CONSOLE",
            "CONFIG_DEVTMPFS",
            "CONFIG_OVERLAY_FS",
            "CONFIG_EXT4_FS",
            "CONFIG_CGROUPS",
            // The agent's boot-complete marker (ioperm + outb).
            "CONFIG_X86_IOPL_IOPERM",
        ] {
            assert_eq!(wants.get(name), Some(&Want::Yes), "{name}");
        }
        for name in [
            "CONFIG_PCI",
            "CONFIG_ACPI",
            "CONFIG_MODULES",
            "CONFIG_CMDLINE_BOOL",
        ] {
            assert_eq!(wants.get(name), Some(&Want::Off), "{name}");
        }
    }

    #[test]
    fn verify_passes_when_config_honours_fragment() {
        let config = "CONFIG_64BIT=y\nCONFIG_VIRTIO_VSOCKETS=y\nCONFIG_NR_CPUS=8\n\
                      # CONFIG_PCI is not set\nCONFIG_OTHER=y\n";
        verify("f", FRAG, config).unwrap();
    }

    #[test]
    fn verify_fails_naming_missing_option() {
        let config = "CONFIG_64BIT=y\n# CONFIG_VIRTIO_VSOCKETS is not set\nCONFIG_NR_CPUS=8\n";
        let err = verify("microvm.config", FRAG, config).unwrap_err();
        assert_eq!(
            err,
            KconfigError::NotHonoured {
                fragment: "microvm.config".into(),
                missing: vec!["CONFIG_VIRTIO_VSOCKETS".into()],
                unwanted: vec![],
            }
        );
        let text = err.to_string();
        assert!(text.contains("not =y: CONFIG_VIRTIO_VSOCKETS"), "{text}");
    }

    #[test]
    fn verify_fails_on_module_value_and_unwanted_option() {
        let config = "CONFIG_64BIT=y\nCONFIG_VIRTIO_VSOCKETS=m\nCONFIG_NR_CPUS=64\nCONFIG_PCI=y\n";
        match verify("f", FRAG, config).unwrap_err() {
            KconfigError::NotHonoured {
                missing, unwanted, ..
            } => {
                assert_eq!(missing, vec!["CONFIG_NR_CPUS=8", "CONFIG_VIRTIO_VSOCKETS"]);
                assert_eq!(unwanted, vec!["CONFIG_PCI"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn garbage_fragment_line_is_a_parse_error() {
        assert_eq!(
            parse_fragment("CONFIG_A=y\nhello world\n"),
            Err(KconfigError::Parse {
                line: 2,
                text: "hello world".into()
            })
        );
    }
}
