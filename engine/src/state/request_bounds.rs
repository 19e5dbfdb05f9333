//! The sizes a create or add-container request may have beyond what its body's limit allows:
//! what the daemon keeps for a sandbox's life (labels and env, in memory and in its live
//! restore record) is bounded per sandbox, not only per request, so that 256 sandboxes of one
//! tenant cannot hold gigabytes.

use std::collections::BTreeMap;

use api_types::{ContainerRequest, CreateSandbox};

/// The most labels a sandbox carries.
pub const MAX_LABELS: usize = 64;
/// The longest label key, in bytes.
pub const MAX_LABEL_KEY: usize = 128;
/// The most bytes of all label keys and values together.
pub const MAX_LABEL_BYTES: usize = 16 * 1024;
/// The most variables of a sandbox's or a container's `env`.
pub const MAX_ENV_VARS: usize = 1024;
/// The most bytes of all names and values of a sandbox's or a container's `env`.
pub const MAX_ENV_BYTES: usize = 64 * 1024;

/// Checks `request`'s labels, env and containers' env; the error names the field and the
/// limit.
pub(crate) fn check_create(request: &CreateSandbox) -> Result<(), String> {
    check_labels(&request.labels)?;
    check_env("env", &request.env)?;
    for (i, container) in request.containers.iter().enumerate() {
        check_env(&format!("containers[{i}].env"), &container.env)?;
    }
    Ok(())
}

/// Checks the env of a container added to a running sandbox.
pub(crate) fn check_container(request: &ContainerRequest) -> Result<(), String> {
    check_env("env", &request.env)
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), String> {
    if labels.len() > MAX_LABELS {
        return Err(format!(
            "labels: {} given, a sandbox carries at most {MAX_LABELS}",
            labels.len()
        ));
    }
    if let Some(key) = labels
        .keys()
        .find(|k| k.is_empty() || k.len() > MAX_LABEL_KEY)
    {
        return Err(format!(
            "labels: a key must be 1 to {MAX_LABEL_KEY} bytes, got one of {} bytes",
            key.len()
        ));
    }
    let bytes = strings_bytes(labels);
    if bytes > MAX_LABEL_BYTES {
        return Err(format!(
            "labels: {bytes} bytes of keys and values, more than the {MAX_LABEL_BYTES} byte limit"
        ));
    }
    Ok(())
}

fn check_env(field: &str, env: &BTreeMap<String, String>) -> Result<(), String> {
    if env.len() > MAX_ENV_VARS {
        return Err(format!(
            "{field}: {} variables given, at most {MAX_ENV_VARS}",
            env.len()
        ));
    }
    let bytes = strings_bytes(env);
    if bytes > MAX_ENV_BYTES {
        return Err(format!(
            "{field}: {bytes} bytes of names and values, more than the {MAX_ENV_BYTES} byte limit"
        ));
    }
    Ok(())
}

fn strings_bytes(map: &BTreeMap<String, String>) -> usize {
    map.iter().map(|(k, v)| k.len() + v.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: impl IntoIterator<Item = (String, String)>) -> BTreeMap<String, String> {
        pairs.into_iter().collect()
    }

    #[test]
    fn labels_within_every_limit_pass_and_past_each_are_refused_naming_it() {
        let most = map((0..MAX_LABELS).map(|i| (format!("k{i}"), "v".repeat(200))));
        assert_eq!(check_labels(&most), Ok(()));

        let many = map((0..=MAX_LABELS).map(|i| (format!("k{i}"), String::new())));
        let err = check_labels(&many).expect_err("too many");
        assert!(err.contains(&format!("at most {MAX_LABELS}")), "{err}");

        let long_key = map([("k".repeat(MAX_LABEL_KEY + 1), String::new())]);
        let err = check_labels(&long_key).expect_err("long key");
        assert!(
            err.contains(&format!("1 to {MAX_LABEL_KEY} bytes")),
            "{err}"
        );

        let big = map([("k".into(), "v".repeat(MAX_LABEL_BYTES))]);
        let err = check_labels(&big).expect_err("too big");
        assert!(
            err.contains(&format!("{MAX_LABEL_BYTES} byte limit")),
            "{err}"
        );
    }

    #[test]
    fn env_past_its_count_or_size_is_refused_naming_the_field() {
        let request = CreateSandbox {
            env: map((0..=MAX_ENV_VARS).map(|i| (format!("V{i}"), String::new()))),
            ..CreateSandbox::default()
        };
        let err = check_create(&request).expect_err("too many");
        assert!(err.starts_with("env: "), "{err}");

        let mut request = CreateSandbox::default();
        let mut container = ContainerRequest {
            name: "db".into(),
            ..ContainerRequest::default()
        };
        container.env = map([("BIG".into(), "x".repeat(MAX_ENV_BYTES))]);
        request.containers.push(container.clone());
        let err = check_create(&request).expect_err("too big");
        assert!(err.starts_with("containers[0].env: "), "{err}");
        assert!(check_container(&container).is_err());
        container.env.clear();
        assert_eq!(check_container(&container), Ok(()));
    }
}
