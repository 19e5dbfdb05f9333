//! The VMM's configuration: the [`VmConfig`] types live in `contract::vm`, shared with the
//! daemon that writes them; this module reads a `--config` file.

use std::path::{Path, PathBuf};

pub use contract::vm::{BlockConfig, ConsoleOutput, InvalidConfig, VmConfig, VsockConfig};

/// Why a configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A field is out of range.
    #[error("invalid configuration")]
    Invalid(#[from] InvalidConfig),
    /// A `--config` file could not be read or parsed.
    #[error("cannot read the configuration {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Reads a JSON configuration file (the daemon's `vm.json`) and validates it.
pub fn from_file(path: &Path) -> Result<VmConfig, ConfigError> {
    let read = |source: Box<dyn std::error::Error + Send + Sync>| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let text = std::fs::read_to_string(path).map_err(|e| read(e.into()))?;
    let config: VmConfig = serde_json::from_str(&text).map_err(|e| read(e.into()))?;
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_config_file_is_parsed_and_validated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vm.json");
        std::fs::write(&path, r#"{"kernel":"/k","mem_mib":64}"#).unwrap();
        assert_eq!(from_file(&path).unwrap().mem_mib, 64);
        std::fs::write(&path, r#"{"kernel":"/k","vcpus":0}"#).unwrap();
        assert!(matches!(
            from_file(&path),
            Err(ConfigError::Invalid(InvalidConfig::Vcpus(0)))
        ));
        std::fs::write(&path, r#"{"kernel":"/k","bogus":1}"#).unwrap();
        assert!(matches!(from_file(&path), Err(ConfigError::Read { .. })));
        let missing = dir.path().join("missing.json");
        let err = from_file(&missing).unwrap_err();
        assert!(err.to_string().contains("missing.json"), "{err}");
    }
}
