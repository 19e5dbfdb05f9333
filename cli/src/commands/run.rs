//! `crucible run`: one command in a fresh sandbox, the sandbox deleted afterwards. With no
//! daemon running it starts one inside this process (building the image first if needed), so
//! a new user needs one command.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tokio::sync::oneshot;

use super::sandbox::CreateArgs;
use crate::{exit, output, Global};

#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub sandbox: CreateArgs,
    /// The image directory for an embedded daemon.
    #[arg(long = "image-dir", env = "CRUCIBLE_IMAGE", default_value_os_t = crate::default_image_dir())]
    pub image_dir: PathBuf,
    /// Environment added for the command only (repeatable; `--env` sets it for the sandbox,
    /// which for one command comes to the same).
    #[arg(long = "cmd-env", value_name = "KEY=VALUE", value_parser = super::key_value)]
    pub cmd_env: Vec<(String, String)>,
    #[command(flatten)]
    pub options: super::exec::CommandOptions,
    /// Keep the sandbox instead of deleting it: its id is printed on stderr, and with --json
    /// is the result's `sandbox` field.
    #[arg(long)]
    pub keep: bool,
    /// Before the sandbox is deleted, write each service's log (see --service) to
    /// DIR/NAME.log. A symbolic link, or anything but a regular file, already at that path is
    /// refused (a warning), never followed; a container name the daemon reports that is not a
    /// container name (a path) fails the run, writing no log.
    #[arg(long, value_name = "DIR")]
    pub service_logs: Option<PathBuf>,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub cmd: Vec<String>,
}

/// A daemon running inside this process for the duration of `run`.
struct Embedded {
    shutdown: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

async fn start_embedded(image_dir: &Path, allow: &[String]) -> Result<(client::Client, Embedded)> {
    super::builtin_image::ensure_for_namespace(image_dir)?;
    let dir = tempfile::Builder::new()
        .prefix("crucible-run-")
        .tempdir()
        .context("creating a directory for the embedded daemon")?;
    let mut config = api::ServeConfig::new(image_dir.to_path_buf());
    let socket = dir.path().join("crucible.sock");
    config.unix_socket = Some(socket.clone());
    config.engine.state_dir = dir.path().join("state");
    // Its own data directory: a daemon may be using the default one. Caches made by an
    // embedded daemon therefore last only as long as the run (`crucible serve` keeps them).
    config.engine.storage.data_dir = dir.path().join("data");
    // The user running it is its operator: what the sandbox asks to reach is allowed.
    config.egress_allow = allow.to_vec();
    config.engine.cgroup_parent = format!("crucible-run-{}", std::process::id());
    let server = api::Server::bind(config).await?;
    let (tx, rx) = oneshot::channel::<()>();
    let done = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    let client = client::Client::new(client::Endpoint::Unix(socket));
    Ok((
        client,
        Embedded {
            shutdown: tx,
            done,
            _dir: dir,
        },
    ))
}

/// The daemon to use: the one at --host, the local one if it answers, else an embedded one.
async fn connect(
    global: &Global,
    image_dir: &Path,
    allow: &[String],
) -> Result<(client::Client, Option<Embedded>)> {
    let client = global.client()?;
    if global.host.is_some() {
        return Ok((client, None));
    }
    match client.health().await {
        Ok(_) => Ok((client, None)),
        Err(client::ClientError::Connect { .. }) => {
            eprintln!(
                "crucible: no daemon at {}; starting one in this process",
                client.endpoint()
            );
            let (client, embedded) = start_embedded(image_dir, allow).await?;
            Ok((client, Some(embedded)))
        }
        Err(e) => Err(e.into()),
    }
}

pub(crate) async fn run(global: &Global, args: Args) -> Result<i32> {
    let (client, embedded) = connect(global, &args.image_dir, &args.sandbox.allow).await?;
    let outcome = run_in_sandbox(global, &client, &args).await;
    if let Some(embedded) = embedded {
        let _ = embedded.shutdown.send(());
        let _ = embedded.done.await;
    }
    outcome
}

async fn run_in_sandbox(global: &Global, client: &client::Client, args: &Args) -> Result<i32> {
    let sandbox = client.create(&args.sandbox.request()?).await?;
    let request = args.options.request(&args.cmd, &args.cmd_env);
    let result = tokio::select! {
        result = super::exec::stream(client, &sandbox.id, &request) => Some(result),
        _ = tokio::signal::ctrl_c() => None,
    };
    // A log that cannot be written is a warning: the job's status stays what it was. A
    // daemon that names a container with a path, though, is not to be believed about the
    // job either: that fails the run, once the sandbox is dealt with.
    let mut untrusted = None;
    if let Some(dir) = &args.service_logs {
        let warn = |e: &anyhow::Error| {
            eprintln!(
                "crucible: warning: saving the services' logs to {}: {}",
                dir.display(),
                output::error_line(e)
            );
        };
        match super::services::save_logs(client, &sandbox.id, dir).await {
            Ok(failed) => failed.iter().for_each(warn),
            Err(e) if e.is::<super::services::UntrustedNames>() => untrusted = Some(e),
            Err(e) => warn(&e),
        }
    }
    let failed = !matches!(&result, Some(Ok(r)) if r.exit_code == 0);
    if failed {
        // Only a failed job pays for the question; a stats error just leaves the hint out.
        if let Ok(stats) = client.stats(&sandbox.id).await {
            let on_disk = args.sandbox.disk_mib.is_some();
            eprint!("{}", output::full_writable_layer(&stats.disk, on_disk));
        }
    }
    if sandbox.network.is_some() {
        match client.get(&sandbox.id).await {
            Ok(info) => {
                let refused = info.network.map(|n| n.refused).unwrap_or_default();
                eprint!("{}", output::egress_refusals(&refused));
            }
            Err(e) => eprintln!(
                "crucible: warning: reading the sandbox's egress refusals: {}",
                output::chain(&e)
            ),
        }
    }
    let id = output::escape(&sandbox.id);
    if args.keep {
        eprintln!("crucible: kept sandbox {id}");
    } else if let Err(e) = client.delete(&sandbox.id).await {
        eprintln!(
            "crucible: warning: deleting sandbox {id}: {}",
            output::chain(&e)
        );
    } else {
        unsaved_caches(client, &sandbox).await;
    }
    if let Some(e) = untrusted {
        return Err(e);
    }
    let Some(result) = result else {
        eprintln!("crucible: interrupted; sandbox deleted");
        return Ok(130);
    };
    let result = result?;
    if args.options.stats {
        eprint!("{}", output::stats_table(&result));
    }
    if global.json && args.keep {
        // The kept sandbox's id with the result: a script that asked to keep it needs it.
        let mut shown = serde_json::to_value(&result)?;
        if let Some(fields) = shown.as_object_mut() {
            fields.insert("sandbox".into(), sandbox.id.clone().into());
        }
        output::print_json(&shown)?;
    } else if global.json {
        output::print_json(&result)?;
    }
    if !result.error.is_empty() {
        eprintln!("crucible: {}", output::escape(&result.error));
    }
    Ok(exit::code(&result))
}

/// Says which of the run's caches did not keep its writes (another sandbox using the cache at
/// the same time ended first, and its copy became the cache): a CI job whose cache never
/// fills should learn why. Silent when every cache kept them, or asked not to.
async fn unsaved_caches(client: &client::Client, sandbox: &api_types::SandboxInfo) {
    if !sandbox.caches.iter().any(|c| c.save) {
        return;
    }
    let listed = match client.caches().await {
        Ok(listed) => listed,
        Err(e) => {
            eprintln!(
                "crucible: warning: reading what became of the caches: {}",
                output::chain(&e)
            );
            return;
        }
    };
    for mount in sandbox.caches.iter().filter(|c| c.save) {
        let cache = listed
            .iter()
            .find(|c| c.name == mount.name && c.backend == sandbox.backend);
        let saved_by = cache.and_then(|c| c.saved_by.as_deref());
        if saved_by != Some(sandbox.id.as_str()) {
            eprintln!(
                "crucible: cache {}: this run's writes were not saved: {}",
                output::escape(&mount.name),
                match saved_by {
                    Some(other) => format!(
                        "sandbox {}, using it at the same time, ended first with its own",
                        output::escape(other)
                    ),
                    None => "another sandbox using it at the same time ended first".into(),
                }
            );
        }
    }
}
