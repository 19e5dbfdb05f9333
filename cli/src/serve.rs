//! `crucible serve`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use api_types::BackendKind;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Unix socket to listen on (mode 0600).
    #[arg(long, env = "CRUCIBLE_SOCKET", default_value_os_t = api::config::default_socket())]
    socket: PathBuf,
    /// Also listen on TCP at ADDR (e.g. 127.0.0.1:7070); requires API keys.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Do not listen on the Unix socket (only with --listen).
    #[arg(long, requires = "listen")]
    no_socket: bool,
    /// The image directory (rootfs/ for namespace sandboxes, vmlinux + initramfs.cpio for
    /// microVMs), as written by `cargo xtask build-image`.
    #[arg(long, env = "CRUCIBLE_IMAGE", default_value_os_t = crate::default_image_dir())]
    image: PathBuf,
    /// Where sandbox state lives.
    #[arg(long, default_value_os_t = engine::settings::default_state_dir())]
    state_dir: PathBuf,
    /// A file of API keys, one `name:key` per line (`#` comments; mode 0600, owned by root or
    /// the daemon's user). Keys also come from CRUCIBLE_API_KEYS (`name:key` entries separated
    /// by commas or whitespace; a bare key is named `key-` and the first 16 hex digits of its
    /// SHA-256). A sandbox belongs to the key that created it. TCP requests must send
    /// `Authorization: Bearer <key>`.
    #[arg(long, visible_alias = "keys-file", value_name = "FILE")]
    api_keys_file: Option<PathBuf>,
    /// The name of the admin key, which sees and may act on every sandbox (like the Unix
    /// socket).
    #[arg(long, env = "CRUCIBLE_ADMIN_KEY_NAME", value_name = "NAME")]
    admin_key_name: Option<String>,
    /// The cgroup (under each controller) holding this daemon's sandboxes: one or more names
    /// separated by '/'. At startup a daemon kills and removes the sandbox groups a dead daemon
    /// left under its parent, and it holds the parent while it runs (a lock file in
    /// /run/crucible, or the user's runtime directory): daemons sharing a host need different
    /// ones, and a second daemon given a parent in use refuses to start, naming the holder.
    #[arg(long, default_value = "crucible")]
    cgroup_parent: String,
    /// Host uid/gid of the first namespace sandbox's root. Each live sandbox gets 65,536 host
    /// ids of its own from here (its uids and gids 0-65535), never host root; the ranges of
    /// --max-sandboxes sandboxes must fit below 2^32.
    #[arg(long, value_name = "UID", default_value_t = engine::settings::DEFAULT_UID_BASE)]
    uid_base: u32,
    /// Backend for sandboxes that do not ask for one [default: the best this host offers].
    #[arg(long, value_parser = parse_backend)]
    backend: Option<BackendKind>,
    /// What runs microVM guests: `crucible-vmm` (crucible's VMM; needs hardware KVM) or
    /// `qemu-tcg` (QEMU's microvm machine under TCG with crucible's vsock device over
    /// vhost-user: a VM boundary on hosts without hardware virtualization, at emulation speed:
    /// a boot takes seconds and commands run several times slower). With `qemu-tcg` on such a
    /// host, `microvm` becomes the default backend unless --backend says otherwise
    #[arg(long, value_parser = parse_hypervisor, default_value = "crucible-vmm")]
    hypervisor: api_types::Hypervisor,
    /// Most sandboxes at once.
    #[arg(long, default_value_t = api::Limits::default().max_sandboxes)]
    max_sandboxes: usize,
    /// Most client connections open at once; past it a new connection is answered 503
    /// too_many_connections and closed [default: sized to the open-file limit, which the
    /// daemon raises to its hard limit].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Most concurrent execs per sandbox.
    #[arg(long, default_value_t = api::Limits::default().max_execs_per_sandbox)]
    max_execs: usize,
    /// Output bytes the agent keeps per command for a client that re-attaches after its
    /// connection dropped (`crucible sandbox attach`); older output is dropped and reported
    /// as dropped (at most 64 MiB).
    #[arg(long, value_name = "BYTES", default_value_t = api::Limits::default().exec_tail_bytes,
          value_parser = clap::value_parser!(u64).range(0..=wire::agent::MAX_TAIL_BYTES))]
    exec_tail_bytes: u64,
    /// Sandboxes outlive the daemon: a crash, a SIGKILL or a SIGTERM (an upgrade) leaves them
    /// running, and the next daemon started with --live-restore on the same --state-dir and
    /// --cgroup-parent takes back every one it can verify (namespace and microVM sandboxes,
    /// with their imported image, network, caches, volumes and disk) and cleans up the rest,
    /// saying why in its log. Never taken back: a sandbox with containers (SIGTERM deletes
    /// it, as without --live-restore). Off by default: without it SIGTERM deletes every
    /// sandbox, and a daemon that dies takes its sandboxes with it.
    #[arg(long)]
    live_restore: bool,
    /// Seconds without activity after which a sandbox is deleted (a command that runs with no
    /// client attached is activity).
    #[arg(long, default_value_t = api::Limits::default().idle_timeout_s)]
    idle_timeout: u64,
    /// MiB a namespace sandbox can write (to `/`, `/tmp` and `/dev/shm` together; held in
    /// memory, so at most 3/4 of its memory limit). Writes past it fail with ENOSPC.
    #[arg(long, default_value_t = api::Limits::default().scratch_mib)]
    disk_mib: u64,
    /// Where caches, disk-backed writable layers (`"disk_mib"` in a create request) and
    /// microVM volume snapshots live.
    #[arg(long, value_name = "DIR", default_value_os_t = engine::storage::default_data_dir())]
    data_dir: PathBuf,
    /// The most host disk, in MiB, that caches, disk-backed layers and microVM volume
    /// snapshots may take together (their images are sparse but counted at full size, so the
    /// host disk never fills); a request
    /// past it is answered 507 [default: 3/4 of the data directory's free space at startup,
    /// plus the caches already there].
    #[arg(long, value_name = "MIB")]
    disk_budget_mib: Option<u64>,
    /// Size limit of a new cache whose request gives none.
    #[arg(long, value_name = "MIB", default_value_t = 4096)]
    cache_mib: u64,
    /// The largest image one import may bring: its archive, and its unpacked tree (each
    /// import holds twice this of the disk budget while it runs; past it, 413).
    #[arg(long, value_name = "MIB", default_value_t = engine::storage::DEFAULT_IMAGE_MAX_MIB)]
    image_max_mib: u64,
    /// Declare a read-only volume NAME=DIR[:ro] that sandboxes may ask for by name
    /// (`"volumes": [{"name": NAME, "path": "/inside"}]`); repeatable. Volumes are never
    /// writable. Namespace sandboxes see the live directory; microVMs see a snapshot taken
    /// when the first of them asks after the daemon started (restart to refresh).
    #[arg(long, value_name = "NAME=DIR:ro")]
    volume: Vec<String>,
    /// Allow sandboxes to ask for egress to these hosts (repeatable, or comma-separated): names
    /// (`crates.io`), subdomain wildcards (`*.pypi.org`), `*` (any name), IP literals and CIDRs,
    /// each with an optional `:port`. A sandbox's own allowlist must fall within these. Private,
    /// loopback and link-local addresses are refused unless an IP or CIDR rule here names them.
    /// Without any, no sandbox gets network.
    #[arg(long, value_name = "RULE", value_delimiter = ',')]
    egress_allow: Vec<String>,
    /// Keep N sandboxes of a shape created ahead and ready (a warm pool; repeatable, one per
    /// shape): IMAGE=N, then optionally memory=MIB, vcpus=N, backend=namespace|microvm (left
    /// out: the daemon's defaults, as for a request). A create asking for exactly that shape,
    /// with no network, caches, volumes or disk_mib, takes one at once (its env, labels and
    /// TTL applied then) and the pool refills in the background, one at a time; any other
    /// create is made as usual. Pooled sandboxes count toward --max-sandboxes and must leave
    /// room under it. Example: --pool default=4,memory=512,vcpus=1
    #[arg(long, value_name = "IMAGE=N[,memory=MIB,vcpus=N,backend=KIND]", value_parser = parse_pool)]
    pool: Vec<engine::pool::PoolSpec>,
    /// Pools from a file: one --pool value per line (`#` comments), added to any --pool.
    #[arg(long, value_name = "FILE")]
    pool_file: Option<PathBuf>,
}

pub(crate) fn parse_pool(text: &str) -> Result<engine::pool::PoolSpec, String> {
    text.parse()
        .map_err(|e: engine::pool::PoolSpecError| e.to_string())
}

pub(crate) fn parse_backend(text: &str) -> Result<BackendKind, String> {
    match text {
        "microvm" => Ok(BackendKind::Microvm),
        "namespace" => Ok(BackendKind::Namespace),
        other => Err(format!(
            "unknown backend {other:?}: expected microvm or namespace"
        )),
    }
}

pub(crate) fn parse_hypervisor(text: &str) -> Result<api_types::Hypervisor, String> {
    match text {
        "crucible-vmm" => Ok(api_types::Hypervisor::CrucibleVmm),
        "qemu-tcg" => Ok(api_types::Hypervisor::QemuTcg),
        other => Err(format!(
            "unknown hypervisor {other:?}: expected crucible-vmm or qemu-tcg"
        )),
    }
}

/// The keys of CRUCIBLE_API_KEYS, then of the keys file (names unique across both), with the
/// admin marked. Errors name entries, never keys.
fn api_keys(keys_file: Option<&Path>, admin: Option<&str>) -> Result<api::ApiKeys> {
    let mut keys = api::ApiKeys::default();
    if let Ok(env) = std::env::var("CRUCIBLE_API_KEYS") {
        keys = keys.add_list(&env, "CRUCIBLE_API_KEYS")?;
    }
    if let Some(path) = keys_file {
        keys = keys.add_file(path)?;
    }
    if let Some(name) = admin {
        keys = keys.with_admin(name)?;
    }
    Ok(keys)
}

pub(crate) async fn run(args: Args) -> Result<()> {
    let mut config = api::ServeConfig::new(args.image);
    config.unix_socket = (!args.no_socket).then_some(args.socket);
    config.tcp = args.listen;
    config.engine.state_dir = args.state_dir;
    config.api_keys = api_keys(
        args.api_keys_file.as_deref(),
        args.admin_key_name.as_deref(),
    )
    .context("API keys")?;
    config.engine.default_backend = args.backend;
    config.engine.hypervisor = args.hypervisor;
    config.engine.cgroup_parent = args.cgroup_parent;
    config.engine.uid_base = args.uid_base;
    config.engine.limits.max_sandboxes = args.max_sandboxes;
    config.engine.limits.max_execs_per_sandbox = args.max_execs;
    config.engine.limits.exec_tail_bytes = args.exec_tail_bytes;
    config.engine.live_restore = args.live_restore;
    config.max_connections = args.max_connections;
    config.engine.limits.idle_timeout_s = args.idle_timeout;
    config.engine.limits.scratch_mib = args.disk_mib;
    config.engine.storage.data_dir = args.data_dir;
    config.engine.storage.disk_budget_mib = args.disk_budget_mib;
    config.engine.storage.default_cache_mib = args.cache_mib;
    config.engine.storage.image_max_mib = args.image_max_mib;
    for volume in &args.volume {
        config.engine.storage.volumes.declare(volume)?;
    }
    config.egress_allow = args.egress_allow;
    config.engine.pools = args.pool;
    if let Some(path) = &args.pool_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --pool-file {}", path.display()))?;
        config.engine.pools.extend(engine::pool::parse_file(
            &text,
            &path.display().to_string(),
        )?);
    }
    let unix_socket = config.unix_socket.clone();
    let server = api::Server::bind(config).await?;
    let state = server.state();
    if let Some(path) = &unix_socket {
        eprintln!("crucible: listening on {}", path.display());
    }
    if let Some(addr) = server.tcp_addr() {
        eprintln!("crucible: listening on http://{addr}");
    }
    eprintln!(
        "crucible: at most {} connections at once",
        server.max_connections()
    );
    if !state.keys.is_empty() {
        // Names only: keys never reach a log.
        let names: Vec<String> = state
            .keys
            .names()
            .map(|name| match args.admin_key_name.as_deref() {
                Some(admin) if admin == name => format!("{name} (admin)"),
                _ => name.to_string(),
            })
            .collect();
        eprintln!("crucible: API keys: {}", names.join(", "));
    }
    let backend = state.default_backend();
    match state.unavailable_reason(backend) {
        None if backend == BackendKind::Microvm => eprintln!(
            "crucible: default backend: {backend} ({})",
            state.config.hypervisor
        ),
        None => eprintln!("crucible: default backend: {backend}"),
        Some(reason) => {
            eprintln!("crucible: warning: default backend {backend} is unavailable: {reason}")
        }
    }
    for (shape, size) in state.pool.sizes() {
        eprintln!("crucible: warm pool {shape}: keeps {size} ready");
    }
    server.run(api::shutdown_signal()).await;
    eprintln!("crucible: stopped; every sandbox deleted");
    Ok(())
}
