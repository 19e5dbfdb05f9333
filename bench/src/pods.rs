//! Pods: a sandbox holding several containers, beside what a CI system does without them.
//!
//! - Creating a sandbox with three roots (its own and two containers, each with a main
//!   process) beside creating three single sandboxes, one after another and all at once: what
//!   one pod costs against the sandboxes a runner would otherwise make for a job and its
//!   services (which, unlike the pod's containers, would share no `localhost`).
//! - A job beside one service, `docker compose`-like, from the create request to the job's
//!   exit: the service listens on a loopback port, the create answers once the port accepts
//!   connections, and the job reaches it on `localhost`. Its floor is the same service and job
//!   script on the host, with no sandbox at all.
//!
//! Not gated: a pod's create is several mount namespaces' worth of work on a 2-core machine,
//! and the service job's time is mostly its readiness polling; `bench-baseline.json` has no key
//! for them.

use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use api_types::{BackendKind, CreateSandbox};
use client::Client;
use wire::ExecRequest;

use super::daemon::InProcess;
use super::host_shell::HostShell;
use super::metrics::Plan;
use super::model::{Measurement, Row};
use super::stats::{ms, Runs};

/// The report's section.
const SECTION: &str = "Pods (containers in one sandbox)";
/// The service's port on the sandbox's loopback.
const SERVICE_PORT: u16 = 6379;
/// The busybox applets the host floor's script runs.
const APPLETS: [&str; 4] = ["sh", "nc", "sleep", "grep"];

/// The report's rows.
pub(crate) fn rows() -> Vec<Row> {
    vec![
        Row {
            section: SECTION.into(),
            metric: "pod_create_3".into(),
            peers: vec![
                "pod_three_sandboxes_serial".into(),
                "pod_three_sandboxes_parallel".into(),
            ],
            floor: None,
            gated: false,
        },
        Row {
            section: SECTION.into(),
            metric: "pod_service_job".into(),
            peers: vec!["floor_service_job".into()],
            floor: Some("floor_service_job".into()),
            gated: false,
        },
    ]
}

/// A sandbox of three roots: its own and two containers with a main process each.
fn three_root_pod() -> CreateSandbox {
    let container = |name: &str| api_types::ContainerRequest {
        name: name.into(),
        command: Some(vec!["sleep".into(), "3600".into()]),
        ..Default::default()
    };
    CreateSandbox {
        backend: Some(BackendKind::Namespace),
        containers: vec![container("b"), container("c")],
        ..Default::default()
    }
}

/// The service's main process: answers `ok` to each connection on `port`, one at a time.
fn service_script(port: u16) -> String {
    format!("while true; do echo ok | nc -l -p {port}; done")
}

/// The job: reaches the service on `localhost` until it answers (tried every 10 ms, so that a
/// connection made while the service is between two listens is tried again).
fn job_script(port: u16) -> String {
    format!("until nc 127.0.0.1 {port} < /dev/null | grep -q ok; do sleep 0.01; done")
}

/// A sandbox whose service container `svc` is ready once its port accepts connections.
fn service_pod() -> CreateSandbox {
    CreateSandbox {
        backend: Some(BackendKind::Namespace),
        containers: vec![api_types::ContainerRequest {
            name: "svc".into(),
            command: Some(vec!["sh".into(), "-c".into(), service_script(SERVICE_PORT)]),
            ready: Some(api_types::ReadyCheck {
                tcp_port: Some(SERVICE_PORT),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The same service and job on the host: the service's loop in the background (a client that
/// half-closes at once can end one listen before it answered, so the job may need another),
/// the job's retries until it answers; the script ends with the job, and the host shell kills
/// the service's loop with its process group.
fn host_script(port: u16) -> String {
    format!("({}) & {}", service_script(port), job_script(port))
}

/// A port on the host's loopback nothing listens on now.
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding a free port")?;
    Ok(listener.local_addr().context("its address")?.port())
}

async fn create(client: &Client, request: &CreateSandbox) -> Result<String> {
    Ok(client.create(request).await.context("create")?.id)
}

async fn delete_all(client: &Client, ids: &[String]) -> Result<()> {
    for id in ids {
        client.delete(id).await.context("delete")?;
    }
    Ok(())
}

/// Runs the job in `id`'s own root, requiring it to exit 0.
async fn run_job(client: &Client, id: &str) -> Result<()> {
    let script = job_script(SERVICE_PORT);
    let out = client
        .exec_collect(id, &ExecRequest::new(["sh", "-c", &script]))
        .await
        .context("exec the job")?;
    ensure!(
        out.result.exit_code == 0,
        "the job exited {} ({}): {}",
        out.result.exit_code,
        out.result.error,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Every figure of the section, on a daemon of its own; the first round warms up.
pub(crate) async fn measure(plan: &Plan, image: &Path) -> Result<Vec<Measurement>> {
    let d = tokio::task::block_in_place(|| InProcess::start(image))?;
    let client = d.client();
    let host = HostShell::new(&image.join("rootfs/bin/busybox"), &APPLETS)?;
    let single = CreateSandbox {
        backend: Some(BackendKind::Namespace),
        ..Default::default()
    };
    let (pod, service) = (three_root_pod(), service_pod());
    let mut runs: [Runs; 5] = Default::default();
    for run in 0..=plan.runs {
        let mut samples: [Vec<f64>; 5] = Default::default();
        let rounds = if run == 0 { 2 } else { plan.creates };
        for _ in 0..rounds {
            let started = Instant::now();
            let id = create(&client, &pod).await?;
            samples[0].push(ms(started.elapsed()));
            delete_all(&client, &[id]).await?;

            let started = Instant::now();
            let mut ids = Vec::new();
            for _ in 0..3 {
                ids.push(create(&client, &single).await?);
            }
            samples[1].push(ms(started.elapsed()));
            delete_all(&client, &ids).await?;

            let started = Instant::now();
            let (a, b, c) = tokio::try_join!(
                create(&client, &single),
                create(&client, &single),
                create(&client, &single)
            )?;
            let ids = [a, b, c];
            samples[2].push(ms(started.elapsed()));
            delete_all(&client, &ids).await?;

            let started = Instant::now();
            let id = create(&client, &service).await?;
            run_job(&client, &id).await?;
            samples[3].push(ms(started.elapsed()));
            delete_all(&client, &[id]).await?;

            let (host, script) = (host.clone(), host_script(free_port()?));
            let took = tokio::task::spawn_blocking(move || host.run(&script))
                .await
                .context("the host script's thread")??;
            samples[4].push(ms(took));
        }
        if run > 0 {
            for (runs, samples) in runs.iter_mut().zip(samples) {
                runs.push(samples);
            }
        }
    }
    d.stop();

    let [pod_runs, serial, parallel, job, floor] = runs;
    let deleted = "each deleted untimed";
    Ok(vec![
        Measurement::latency(
            "pod_create_3",
            "create → ready of a sandbox with 3 roots (its own + 2 containers)",
            "ours",
            &pod_runs,
            &format!(
                "POST /sandboxes with `containers: [b, c]`, each running `sleep 3600` from the \
                 default image, until it answers (every container started), sequential, \
                 {deleted}"
            ),
        ),
        Measurement::latency(
            "pod_three_sandboxes_serial",
            "create → ready of 3 single sandboxes, one after another",
            "3 sandboxes",
            &serial,
            &format!("three POST /sandboxes in a row, timed together, {deleted}"),
        ),
        Measurement::latency(
            "pod_three_sandboxes_parallel",
            "create → ready of 3 single sandboxes at once",
            "3 at once",
            &parallel,
            &format!("three POST /sandboxes at once, until the last answers, {deleted}"),
        ),
        Measurement::latency(
            "pod_service_job",
            "a job beside one service: create → service ready → job reaches it → exit",
            "ours",
            &job,
            &format!(
                "POST /sandboxes with a container `svc` running `{}` and `ready.tcp_port: \
                 {SERVICE_PORT}` (the create answers once the port accepts connections), then \
                 POST …/exec of `{}` in the sandbox's own root until its exit frame; {deleted}",
                service_script(SERVICE_PORT),
                job_script(SERVICE_PORT)
            ),
        ),
        Measurement::latency(
            "floor_service_job",
            "the same service and job on the host, no sandbox",
            "floor",
            &floor,
            &format!(
                "the image's busybox `sh -c '{}'` on the host, a free port each run, from \
                 spawn to exit",
                host_script(0).replace(" 0", " PORT")
            ),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_floor_script_reaches_its_service_and_ends() -> Result<()> {
        let host = HostShell::new(crate::host_shell::busybox(), &APPLETS)?;
        host.run(&host_script(free_port()?))?;
        Ok(())
    }
}
