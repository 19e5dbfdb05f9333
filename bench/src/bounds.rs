//! The daemon's memory at the bounds a tenant can fill (docs/security.md, "Bounds"): one
//! sandbox at every per-sandbox limit at once, and a container added and removed in a loop.
//! Part of the footprint section, on its daemon.

use std::collections::BTreeMap;

use anyhow::{ensure, Context, Result};
use api_types::{BackendKind, ContainerRequest, CreateSandbox, ReadyCheck};
use client::Client;

use super::daemon;
use super::model::{Measurement, Unit};
use super::stats::median;

/// Containers, labels and env at the daemon's limits (16; 64 labels in 16 KiB; 64 KiB of
/// env), each container's main process printing past its log's 1 MiB.
const CONTAINERS: usize = 16;
const LABELS: usize = 64;
const LABEL_VALUE: usize = 240;
const ENV_VARS: usize = 64;
const ENV_VALUE: usize = 1000;
const PRINTED: u64 = 1_100_000;

/// A container that prints [`PRINTED`] bytes, then is ready and sleeps.
fn noisy(name: String, env: BTreeMap<String, String>) -> ContainerRequest {
    ContainerRequest {
        name,
        env,
        command: Some(vec![
            "/bin/sh".into(),
            "-c".into(),
            format!(
                "head -c {PRINTED} /dev/zero | tr '\\0' x; touch /tmp/printed; exec sleep 3600"
            ),
        ]),
        ready: Some(ReadyCheck {
            command: Some(vec!["test".into(), "-e".into(), "/tmp/printed".into()]),
            ..ReadyCheck::default()
        }),
        ..ContainerRequest::default()
    }
}

fn env_at_limit() -> BTreeMap<String, String> {
    (0..ENV_VARS)
        .map(|i| (format!("VAR_{i:02}"), "x".repeat(ENV_VALUE)))
        .collect()
}

/// Measures, on the daemon `pid` that `client` talks to, its RSS growth with one sandbox at
/// every bound, and its RSS growth over `cycles` container add/remove cycles (medians of
/// per-cycle samples, so a log's megabyte not yet handed back is not counted).
pub(crate) async fn measure(client: &Client, pid: u32, cycles: usize) -> Result<Vec<Measurement>> {
    let before = daemon::rss_mib(pid, "VmRSS")?;
    let request = CreateSandbox {
        backend: Some(BackendKind::Namespace),
        labels: (0..LABELS)
            .map(|i| (format!("label-{i:02}"), "v".repeat(LABEL_VALUE)))
            .collect(),
        env: env_at_limit(),
        containers: (0..CONTAINERS)
            .map(|i| noisy(format!("c{i}"), env_at_limit()))
            .collect(),
        ..CreateSandbox::default()
    };
    let full = client
        .create(&request)
        .await
        .context("create a sandbox at every bound")?;
    let at_bounds = daemon::rss_mib(pid, "VmRSS")?;
    client.delete(&full.id).await.context("delete")?;

    let id = client
        .create(&CreateSandbox {
            backend: Some(BackendKind::Namespace),
            ..CreateSandbox::default()
        })
        .await
        .context("create")?
        .id;
    let one_cycle = || async {
        let container = noisy("same".into(), BTreeMap::new());
        client
            .add_container(&id, &container)
            .await
            .context("add a container")?;
        client
            .remove_container(&id, "same")
            .await
            .context("remove the container")?;
        daemon::rss_mib(pid, "VmRSS")
    };
    let warm_up = (cycles / 10).max(5);
    let mut first = Vec::new();
    for _ in 0..warm_up {
        first.push(one_cycle().await?);
    }
    let mut last = Vec::new();
    for _ in 0..cycles {
        last.push(one_cycle().await?);
    }
    let tail = last.split_off(cycles - warm_up.min(cycles));
    ensure!(!tail.is_empty(), "no add/remove cycle was measured");
    let growth = median(&tail) - median(&first);
    client.delete(&id).await.context("delete")?;
    Ok(vec![
        Measurement::scalar(
            "daemon_rss_bounds",
            "daemon RSS growth, one sandbox at every bound",
            "ours",
            Unit::Mib,
            &[at_bounds - before],
            &format!(
                "VmRSS with one sandbox of {CONTAINERS} containers each past its 1 MiB log \
                 ({PRINTED} bytes printed), {LABELS} labels of {LABEL_VALUE} bytes and \
                 {ENV_VARS} env variables of {ENV_VALUE} bytes (its own and each container's), \
                 less VmRSS before it"
            ),
        ),
        Measurement::scalar(
            "daemon_rss_churn",
            "daemon RSS growth over container add/remove cycles",
            "ours",
            Unit::Mib,
            &[growth],
            &format!(
                "{cycles} cycles of adding a container that prints {PRINTED} bytes and removing \
                 it: the median VmRSS of the last {warm_up} cycles less that of {warm_up} \
                 warm-up cycles"
            ),
        ),
    ])
}
