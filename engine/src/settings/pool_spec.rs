//! `--pool IMAGE=N[,memory=MiB][,vcpus=N][,backend=KIND]`: what a warm pool holds, as the
//! operator declares it, and the shape it resolves to against the daemon's defaults.

use api_types::BackendKind;

/// Why a `--pool` declaration (or the set of them) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolSpecError {
    /// The text is not `IMAGE=N[,key=value…]`; the message says which part is wrong.
    #[error("--pool {text:?}: {reason}")]
    Malformed {
        /// The declaration as given.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A pool's shape is not one a request could ask for.
    #[error("--pool {shape}: {reason}")]
    Invalid {
        /// The shape, as resolved.
        shape: String,
        /// Why it cannot be.
        reason: String,
    },
    /// A line of a pool file is malformed.
    #[error("{origin} line {line}")]
    InFile {
        /// The file.
        origin: String,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        #[source]
        source: Box<PoolSpecError>,
    },
    /// Two declarations resolve to the same shape.
    #[error("--pool: the shape {0} is declared twice")]
    Duplicate(String),
    /// The pools would hold every sandbox the daemon may run, or more.
    #[error(
        "--pool: the pools hold {pooled} sandboxes, which leaves no room under \
         --max-sandboxes {max} (they count toward it); lower the pools or raise the cap"
    )]
    OverCap {
        /// The sum of the pools' sizes.
        pooled: usize,
        /// The cap.
        max: usize,
    },
}

/// One `--pool` declaration: the fields left out take the daemon's defaults when resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    /// The image its sandboxes run.
    pub image: String,
    /// How many ready sandboxes it keeps.
    pub size: usize,
    /// Their memory limit; the daemon's default when `None`.
    pub memory_mib: Option<u64>,
    /// Their CPUs; the daemon's default when `None`.
    pub vcpus: Option<u32>,
    /// Their backend; the daemon's default backend when `None`.
    pub backend: Option<BackendKind>,
}

/// What a request must ask for, exactly, to be served from a pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Image name.
    pub(crate) image: String,
    /// Backend.
    pub(crate) backend: BackendKind,
    /// Memory limit.
    pub(crate) memory_mib: u64,
    /// CPUs.
    pub(crate) vcpus: u32,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{},memory={},vcpus={},backend={}",
            self.image, self.memory_mib, self.vcpus, self.backend
        )
    }
}

impl std::str::FromStr for PoolSpec {
    type Err = PoolSpecError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let malformed = |reason: String| PoolSpecError::Malformed {
            text: text.to_string(),
            reason,
        };
        let mut parts = text.split(',');
        let head = parts.next().unwrap_or_default();
        let (image, size) = head
            .split_once('=')
            .ok_or_else(|| malformed("expected IMAGE=N first (e.g. default=4)".into()))?;
        if image.is_empty() {
            return Err(malformed("the image name is empty".into()));
        }
        let size: usize = size
            .parse()
            .map_err(|_| malformed(format!("the size {size:?} is not a whole number")))?;
        if size == 0 {
            return Err(malformed("the size must be at least 1".into()));
        }
        let mut spec = PoolSpec {
            image: image.to_string(),
            size,
            memory_mib: None,
            vcpus: None,
            backend: None,
        };
        for part in parts {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| malformed(format!("expected key=value, got {part:?}")))?;
            let number = |what: &str| -> Result<u64, PoolSpecError> {
                value
                    .parse()
                    .map_err(|_| malformed(format!("{what}: {value:?} is not a whole number")))
            };
            let repeated = match key {
                "memory" => spec.memory_mib.replace(number("memory")?).is_some(),
                "vcpus" => {
                    let vcpus = u32::try_from(number("vcpus")?)
                        .map_err(|_| malformed(format!("vcpus: {value:?} is too large")))?;
                    spec.vcpus.replace(vcpus).is_some()
                }
                "backend" => {
                    let backend = match value {
                        "namespace" => BackendKind::Namespace,
                        "microvm" => BackendKind::Microvm,
                        other => {
                            return Err(malformed(format!(
                                "backend: unknown backend {other:?} (expected namespace or \
                                 microvm)"
                            )))
                        }
                    };
                    spec.backend.replace(backend).is_some()
                }
                other => {
                    return Err(malformed(format!(
                        "unknown key {other:?} (expected memory, vcpus or backend)"
                    )))
                }
            };
            if repeated {
                return Err(malformed(format!("{key} is given twice")));
            }
        }
        Ok(spec)
    }
}

impl PoolSpec {
    /// Its shape, with what it leaves out taken from the daemon's defaults.
    pub(crate) fn resolve(&self, defaults: &ShapeDefaults) -> Shape {
        Shape {
            image: self.image.clone(),
            backend: self.backend.unwrap_or(defaults.backend),
            memory_mib: self.memory_mib.unwrap_or(defaults.memory_mib),
            vcpus: self.vcpus.unwrap_or(defaults.vcpus),
        }
    }
}

/// What a request that leaves a field out gets.
#[derive(Debug, Clone)]
pub struct ShapeDefaults {
    /// The daemon's default backend.
    pub(crate) backend: BackendKind,
    /// `Limits::default_memory_mib`.
    pub(crate) memory_mib: u64,
    /// `Limits::default_vcpus`.
    pub(crate) vcpus: u32,
}

/// The daemon's bounds a pool must fit in (from its `Limits`).
#[derive(Debug, Clone)]
pub(crate) struct ShapeBounds {
    /// Largest memory a request may ask for.
    pub max_memory_mib: u64,
    /// Most CPUs a request may ask for.
    pub max_vcpus: u32,
    /// Most sandboxes at once, pooled ones included.
    pub max_sandboxes: usize,
}

/// Resolves `specs` and checks them together: each shape one a request could ask for (image
/// known, memory and CPUs within the limits), no shape twice, and room left under `max`
/// sandboxes for at least one that is not pooled.
pub(crate) fn resolve_all(
    specs: &[PoolSpec],
    defaults: &ShapeDefaults,
    limits: &ShapeBounds,
    known_image: impl Fn(&str) -> bool,
) -> Result<Vec<(Shape, usize)>, PoolSpecError> {
    let mut pools: Vec<(Shape, usize)> = Vec::new();
    for spec in specs {
        let shape = spec.resolve(defaults);
        let invalid = |reason: String| PoolSpecError::Invalid {
            shape: shape.to_string(),
            reason,
        };
        if !known_image(&shape.image) {
            return Err(invalid(format!("unknown image {:?}", shape.image)));
        }
        if !(16..=limits.max_memory_mib).contains(&shape.memory_mib) {
            return Err(invalid(format!(
                "memory must be between 16 and {} MiB",
                limits.max_memory_mib
            )));
        }
        if !(1..=limits.max_vcpus).contains(&shape.vcpus) {
            return Err(invalid(format!(
                "vcpus must be between 1 and {}",
                limits.max_vcpus
            )));
        }
        if shape.backend == BackendKind::Process {
            return Err(invalid("the process backend cannot be pooled".into()));
        }
        if pools.iter().any(|(s, _)| *s == shape) {
            return Err(PoolSpecError::Duplicate(shape.to_string()));
        }
        pools.push((shape, spec.size));
    }
    let pooled = pools
        .iter()
        .fold(0usize, |sum, (_, size)| sum.saturating_add(*size));
    if !pools.is_empty() && pooled >= limits.max_sandboxes {
        return Err(PoolSpecError::OverCap {
            pooled,
            max: limits.max_sandboxes,
        });
    }
    Ok(pools)
}

/// The declarations of a pool file (`crucible serve --pool-file`): one `--pool` value per
/// line, blank lines and `#` comments ignored; errors name `origin` and the line.
pub fn parse_file(text: &str, origin: &str) -> Result<Vec<PoolSpec>, PoolSpecError> {
    text.lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line.split('#').next().unwrap_or("").trim()))
        .filter(|(_, line)| !line.is_empty())
        .map(|(line, text)| {
            text.parse().map_err(|e| PoolSpecError::InFile {
                origin: origin.to_string(),
                line,
                source: Box::new(e),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PoolSpec, PoolSpecError> {
        text.parse()
    }

    fn defaults() -> ShapeDefaults {
        ShapeDefaults {
            backend: BackendKind::Namespace,
            memory_mib: 512,
            vcpus: 1,
        }
    }

    fn bounds() -> ShapeBounds {
        ShapeBounds {
            max_memory_mib: 16 * 1024,
            max_vcpus: 16,
            max_sandboxes: 256,
        }
    }

    #[test]
    fn a_bare_pool_takes_every_default() {
        let spec = parse("default=4").expect("valid");
        assert_eq!(
            spec,
            PoolSpec {
                image: "default".into(),
                size: 4,
                memory_mib: None,
                vcpus: None,
                backend: None,
            }
        );
        assert_eq!(
            spec.resolve(&defaults()),
            Shape {
                image: "default".into(),
                backend: BackendKind::Namespace,
                memory_mib: 512,
                vcpus: 1,
            }
        );
    }

    #[test]
    fn every_key_is_read() {
        let spec = parse("default=2,memory=256,vcpus=2,backend=microvm").expect("valid");
        assert_eq!(spec.size, 2);
        assert_eq!(spec.memory_mib, Some(256));
        assert_eq!(spec.vcpus, Some(2));
        assert_eq!(spec.backend, Some(BackendKind::Microvm));
    }

    #[test]
    fn malformed_declarations_are_refused_naming_the_part() {
        for (text, part) in [
            ("default", "IMAGE=N"),
            ("=4", "image name is empty"),
            ("default=0", "at least 1"),
            ("default=-1", "not a whole number"),
            ("default=four", "not a whole number"),
            ("default=4,memory", "key=value"),
            ("default=4,memory=lots", "memory"),
            ("default=4,vcpus=99999999999", "too large"),
            ("default=4,backend=process", "unknown backend"),
            ("default=4,disk=1024", "unknown key \"disk\""),
            ("default=4,memory=256,memory=512", "twice"),
        ] {
            let error = parse(text).expect_err(text).to_string();
            assert!(error.contains(part), "{text}: {error}");
            assert!(error.contains(text), "{text}: {error}");
        }
    }

    #[test]
    fn pools_must_leave_room_under_the_cap() {
        let limits = ShapeBounds {
            max_sandboxes: 8,
            ..bounds()
        };
        let known = |image: &str| image == "default";
        let specs = [
            parse("default=4").expect("valid"),
            parse("default=3,memory=256").expect("valid"),
        ];
        let pools = resolve_all(&specs, &defaults(), &limits, known).expect("7 of 8 fit");
        assert_eq!(pools.len(), 2);
        let specs = [
            parse("default=4").expect("valid"),
            parse("default=4,memory=256").expect("valid"),
        ];
        assert_eq!(
            resolve_all(&specs, &defaults(), &limits, known),
            Err(PoolSpecError::OverCap { pooled: 8, max: 8 })
        );
    }

    #[test]
    fn shapes_are_checked_against_the_limits_and_each_other() {
        let limits = bounds();
        let known = |image: &str| image == "default";
        let refused = |texts: &[&str]| {
            let specs: Vec<PoolSpec> = texts.iter().map(|t| parse(t).expect("valid")).collect();
            resolve_all(&specs, &defaults(), &limits, known)
                .expect_err("refused")
                .to_string()
        };
        assert!(refused(&["alpine=1"]).contains("unknown image"));
        assert!(refused(&["default=1,memory=8"]).contains("memory must be"));
        assert!(refused(&["default=1,vcpus=0"]).contains("vcpus must be"));
        // Leaving a field out means the default: the same shape as spelling it out.
        assert!(
            refused(&["default=1", "default=2,memory=512,backend=namespace"])
                .contains("declared twice")
        );
    }

    #[test]
    fn a_pool_file_has_one_declaration_per_line_and_errors_name_the_line() {
        let text = "# warm pools\ndefault=2,memory=256\n\n  default=1,vcpus=2  # two CPUs\n";
        let specs = parse_file(text, "pools.conf").expect("parsed");
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0], "default=2,memory=256".parse().expect("spec"));
        assert_eq!(specs[1], "default=1,vcpus=2".parse().expect("spec"));
        let e = parse_file("default=1\ndefault=x\n", "pools.conf").expect_err("bad line");
        assert_eq!(e.to_string(), "pools.conf line 2");
        let source = "default=x".parse::<PoolSpec>().expect_err("bad spec");
        assert_eq!(
            report::chain(&e),
            format!("pools.conf line 2: {source}"),
            "the line's error once"
        );
        assert!(parse_file("# nothing\n", "p").expect("empty").is_empty());
    }
}
