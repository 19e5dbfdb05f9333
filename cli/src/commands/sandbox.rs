//! `crucible sandbox create | ls | get | rm`.

use anyhow::{Context, Result};
use api_types::{BackendKind, CreateSandbox};

use crate::output;
use crate::Global;

#[derive(clap::Args, Clone, Default)]
pub(crate) struct CreateArgs {
    /// Memory limit in MiB [default: 512]. A namespace sandbox's writes to `/`, `/tmp` and
    /// `/dev/shm` are held in memory too, up to 3/4 of it (384 MiB at the default; the
    /// daemon's `serve --disk-mib` caps it): a build that writes more gets ENOSPC unless
    /// given --disk.
    #[arg(long, value_name = "MIB")]
    pub memory: Option<u64>,
    /// vCPUs (microVM) or CPU quota (namespace) [default: 1]. `nproc` inside says the same
    /// (at most the host's CPU count), so `make -j$(nproc)`, cargo and Go run as many jobs as
    /// the sandbox has CPU for.
    #[arg(long)]
    pub vcpus: Option<u32>,
    /// Lifetime in seconds [default: 3600].
    #[arg(long, value_name = "SECONDS")]
    pub ttl: Option<u64>,
    /// Backend: microvm or namespace [default: the daemon's choice].
    #[arg(long, value_parser = crate::serve::parse_backend)]
    pub backend: Option<BackendKind>,
    /// Image: `default` (the built-in busybox image) or one imported with `crucible image
    /// import` (its Env, WorkingDir and User become the sandbox's defaults).
    #[arg(long)]
    pub image: Option<String>,
    /// Who every command runs as: uid, uid:gid, name or name:group (as `docker run --user`),
    /// resolved against the image's /etc/passwd [default: the image's User, else root].
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// Environment for every command in the sandbox (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = super::key_value)]
    pub env: Vec<(String, String)>,
    /// Labels (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = super::key_value)]
    pub labels: Vec<(String, String)>,
    /// Give the sandbox egress through the daemon's proxy to these hosts (repeatable or
    /// comma-separated): `crates.io`, `*.pypi.org`, `static.example.org:443`, `10.1.2.3:8080`.
    /// Commands see HTTP_PROXY/HTTPS_PROXY. Without it the sandbox reaches no network.
    #[arg(long, value_name = "HOST[:PORT]", value_delimiter = ',')]
    pub allow: Vec<String>,
    /// Mount the named cache at PATH, read-write, kept between sandboxes (repeatable); made
    /// with SIZE_MIB (else the daemon's default) if new. Sandboxes at once share it: each
    /// gets a copy as it was last saved, and the first to end saves its copy back whole (the
    /// others' writes are dropped; `crucible run` says so when its were). `:nosave` for a job
    /// that only reads it: its writes are never saved. Kept by `crucible serve`; the daemon `crucible run` starts for itself
    /// keeps nothing.
    #[arg(long, value_name = "NAME:PATH[:SIZE_MIB][:nosave]", value_parser = parse_cache)]
    pub cache: Vec<api_types::CacheMount>,
    /// Mount the operator's read-only volume NAME at PATH (repeatable).
    #[arg(long, value_name = "NAME:PATH", value_parser = parse_volume)]
    pub volume: Vec<api_types::VolumeMount>,
    /// A disk-backed writable layer of MIB (on the host's disk, not in memory), for builds
    /// bigger than memory (a Rust `target/` outgrows the in-memory default).
    #[arg(long = "disk", value_name = "MIB")]
    pub disk_mib: Option<u64>,
    /// A microVM's room for N containers added once it runs (`POST
    /// /sandboxes/ID/containers`): N empty read-only disks attached at boot, each filled by
    /// one added container's image. Counts toward its 6 disks with caches, volumes, --disk
    /// and --service. A namespace sandbox needs none.
    #[arg(long, value_name = "N")]
    pub container_slots: Option<u32>,
    /// One PID namespace for the sandbox and its --service containers (Kubernetes'
    /// shareProcessNamespace): each then sees, and may signal, the others' processes, their
    /// roots and environments. Without it none sees another's.
    #[arg(long)]
    pub share_processes: bool,
    /// The sandbox's hostname (what `hostname` prints and $HOSTNAME holds inside): RFC 1123
    /// labels, at most 64 bytes [default: the sandbox's id].
    #[arg(long, value_name = "NAME")]
    pub hostname: Option<String>,
    #[command(flatten)]
    pub services: super::services::ServiceArgs,
}

fn parse_cache(text: &str) -> Result<api_types::CacheMount, String> {
    let mut parts = text.split(':');
    let (Some(name), Some(path)) = (parts.next(), parts.next()) else {
        return Err(format!(
            "expected NAME:PATH[:SIZE_MIB][:nosave], got {text:?}"
        ));
    };
    let mut cache = api_types::CacheMount {
        name: name.to_string(),
        path: path.to_string(),
        size_mib: None,
        save: true,
    };
    for part in parts {
        match part {
            "nosave" if cache.save => cache.save = false,
            size if cache.size_mib.is_none() && cache.save => {
                cache.size_mib = Some(size.parse().map_err(|_| {
                    format!("expected NAME:PATH[:SIZE_MIB][:nosave]: SIZE_MIB must be a number of MiB, got {size:?}")
                })?);
            }
            extra => {
                return Err(format!(
                "expected NAME:PATH[:SIZE_MIB][:nosave], got {text:?} ({extra:?} is one too many)"
            ))
            }
        }
    }
    Ok(cache)
}

fn parse_volume(text: &str) -> Result<api_types::VolumeMount, String> {
    let (name, path) = text
        .split_once(':')
        .ok_or_else(|| format!("expected NAME:PATH, got {text:?}"))?;
    Ok(api_types::VolumeMount {
        name: name.to_string(),
        path: path.to_string(),
    })
}

impl CreateArgs {
    pub(crate) fn request(&self) -> Result<CreateSandbox> {
        let (containers, shared) = self.services.containers()?;
        Ok(CreateSandbox {
            memory_mib: self.memory,
            vcpus: self.vcpus,
            image: self.image.clone(),
            user: self.user.clone(),
            backend: self.backend,
            ttl_s: self.ttl,
            env: self.env.iter().cloned().collect(),
            labels: self.labels.iter().cloned().collect(),
            network: (!self.allow.is_empty()).then(|| api_types::NetworkRequest {
                allow: self.allow.clone(),
            }),
            caches: self.cache.clone(),
            volumes: self.volume.clone(),
            disk_mib: self.disk_mib,
            containers,
            shared,
            container_slots: self.container_slots,
            share_process_namespace: self.share_processes,
            hostname: self.hostname.clone(),
            // Joining a host network namespace is the Kubernetes shim's (admin) business.
            network_namespace: None,
            sysctls: Default::default(),
        })
    }
}

pub(crate) async fn create(global: &Global, args: CreateArgs) -> Result<()> {
    let info = global.client()?.create(&args.request()?).await?;
    if global.json {
        output::print_json(&info)
    } else {
        println!("{}", output::escape(&info.id));
        Ok(())
    }
}

pub(crate) async fn list(global: &Global) -> Result<()> {
    let sandboxes = global.client()?.list().await?;
    if global.json {
        return output::print_json(&api_types::SandboxList { sandboxes });
    }
    print!("{}", output::sandbox_table(&sandboxes));
    Ok(())
}

pub(crate) async fn get(global: &Global, id: &str) -> Result<()> {
    let info = global.client()?.get(id).await?;
    if global.json {
        return output::print_json(&info);
    }
    print!("{}", output::sandbox_details(&info));
    Ok(())
}

pub(crate) async fn update(
    global: &Global,
    id: &str,
    memory_mib: Option<u64>,
    vcpus: Option<u32>,
) -> Result<()> {
    if memory_mib.is_none() && vcpus.is_none() {
        anyhow::bail!("nothing to change: give --memory MIB, --cpus N or both");
    }
    let request = api_types::UpdateSandbox { memory_mib, vcpus };
    let info = global.client()?.update(id, &request).await?;
    if global.json {
        return output::print_json(&info);
    }
    print!("{}", output::sandbox_details(&info));
    Ok(())
}

pub(crate) async fn stats(global: &Global, id: &str, container: Option<&str>) -> Result<()> {
    let client = global.client()?;
    let stats = match container {
        Some(name) => client.container_stats(id, name).await?,
        None => client.stats(id).await?,
    };
    if global.json {
        return output::print_json(&stats);
    }
    print!("{}", output::usage_table(&stats));
    Ok(())
}

pub(crate) async fn remove(global: &Global, ids: &[String]) -> Result<()> {
    let client = global.client()?;
    let mut failed = None;
    for id in ids {
        match client.delete(id).await {
            Ok(()) => {
                if !global.json {
                    println!("{id}");
                }
            }
            Err(e) => {
                eprintln!(
                    "crucible: error: {}: {}",
                    output::escape(id),
                    output::chain(&e)
                );
                failed = Some(e);
            }
        }
    }
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// `crucible sandbox rm --container NAME… ID`: removes containers of one sandbox, printing
/// each name removed.
pub(crate) async fn remove_containers(
    global: &Global,
    ids: &[String],
    containers: &[String],
) -> Result<()> {
    let [id] = ids else {
        anyhow::bail!(
            "--container removes containers of one sandbox: name exactly one sandbox id, not {}",
            ids.len()
        );
    };
    let client = global.client()?;
    for name in containers {
        client
            .remove_container(id, name)
            .await
            .with_context(|| format!("removing container {name} of {id}"))?;
        if !global.json {
            println!("{name}");
        }
    }
    Ok(())
}

/// `crucible sandbox kill`: a signal to every process of a sandbox, or to one named command.
#[derive(clap::Args)]
pub(crate) struct KillArgs {
    /// The sandbox id.
    pub id: String,
    /// The signal: a name (TERM, SIGTERM) or a number [default: KILL, as `docker kill`].
    #[arg(short, long, default_value = "KILL", value_parser = signal)]
    pub signal: i32,
    /// Only the running command started with this `--exec-id` (its process group); without
    /// it, every process of the sandbox but its agent.
    #[arg(long, value_name = "NAME")]
    pub exec_id: Option<String>,
}

fn signal(text: &str) -> Result<i32, String> {
    wire::signal_number(text)
        .ok_or_else(|| format!("{text:?} is not a signal name (TERM, SIGKILL) or number 1 to 64"))
}

pub(crate) async fn kill(global: &Global, args: &KillArgs) -> Result<()> {
    let client = global.client()?;
    match &args.exec_id {
        Some(exec_id) => client.signal_exec(&args.id, exec_id, args.signal).await?,
        None => client.signal(&args.id, args.signal).await?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Create {
        #[command(flatten)]
        args: CreateArgs,
    }

    #[test]
    fn a_cache_takes_a_size_and_nosave_in_that_order() {
        let cache = |text| parse_cache(text).map(|c| (c.name, c.path, c.size_mib, c.save));
        let owned = |name: &str, path: &str, size, save| {
            Ok((name.to_string(), path.to_string(), size, save))
        };
        assert_eq!(cache("cargo:/c"), owned("cargo", "/c", None, true));
        assert_eq!(cache("cargo:/c:64"), owned("cargo", "/c", Some(64), true));
        assert_eq!(cache("cargo:/c:nosave"), owned("cargo", "/c", None, false));
        assert_eq!(
            cache("cargo:/c:64:nosave"),
            owned("cargo", "/c", Some(64), false)
        );
        for bad in [
            "cargo",
            "cargo:/c:big",
            "cargo:/c:nosave:64",
            "cargo:/c:1:2",
            "c:/c:nosave:nosave",
        ] {
            let error = parse_cache(bad).expect_err(bad);
            assert!(
                error.contains("NAME:PATH[:SIZE_MIB][:nosave]"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn container_slots_reach_the_create_request_only_when_given() {
        let given =
            Create::parse_from(["create", "--backend", "microvm", "--container-slots", "2"]);
        let request = given.args.request().expect("request");
        assert_eq!(
            (request.backend, request.container_slots),
            (Some(BackendKind::Microvm), Some(2))
        );
        let plain = Create::parse_from(["create"])
            .args
            .request()
            .expect("request");
        assert_eq!(plain.container_slots, None);
        assert!(Create::try_parse_from(["create", "--container-slots", "-1"]).is_err());
    }
}
