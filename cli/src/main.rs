//! `crucible`: run and use disposable Linux sandboxes.

#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};

mod commands;
mod doctor;
mod exit;
mod output;
mod serve;
mod terminal;

#[derive(Parser)]
#[command(
    name = "crucible",
    version,
    about = "Disposable Linux sandboxes for CI: microVMs where the host can boot them, \
             namespace sandboxes elsewhere, driven over HTTP",
    after_help = "Quick start:  crucible run -- uname -a\n\
                  Daemon:       crucible serve   (then: crucible sandbox create, sandbox exec ID -- CMD)"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every client command shares (`serve`, the daemon, takes none of them).
#[derive(clap::Args, Clone)]
pub(crate) struct Global {
    /// The daemon to talk to: a Unix socket path or http://host:port [default: the local
    /// daemon's socket]
    #[arg(long, global = true, env = "CRUCIBLE_HOST", value_name = "ADDR")]
    host: Option<String>,
    /// API key sent as `Authorization: Bearer <key>`.
    #[arg(long, global = true, env = "CRUCIBLE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Create a sandbox, run one command in it with live output, delete it, and exit with the
    /// command's status. Starts a daemon inside this process when none is running.
    Run(commands::run::Args),
    /// Manage sandboxes and run commands in them.
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// An interactive shell in a sandbox (line-buffered, no PTY; Ctrl-D ends it).
    Shell(commands::exec::ShellArgs),
    /// List or delete named caches (`--cache NAME:PATH` on create/run mounts one).
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Import, list, inspect or remove images (`--image NAME` on create/run uses one).
    #[command(subcommand)]
    Image(ImageCommand),
    /// Copy files in or out: `cp LOCAL ID:DIR` uploads (directories recursively),
    /// `cp ID:FILE LOCAL` downloads one file (`-` for stdout).
    Cp(commands::cp::Args),
    /// Run the sandbox daemon (HTTP on a Unix socket, and on TCP with --listen).
    ///
    /// It listens where --socket and --listen say. The client options --host, --api-key and
    /// --json are refused here; CRUCIBLE_HOST and CRUCIBLE_API_KEY in the environment are the
    /// client's, and ignored (the daemon's keys come from --api-keys-file or
    /// CRUCIBLE_API_KEYS).
    Serve(serve::Args),
    /// Report what this host offers (KVM kind, cgroups, namespaces, the image) and which
    /// backend sandboxes will use, and why; with --host, what that daemon says.
    ///
    /// On this host it also says whether a daemon answers on the default socket: one that
    /// does decides the backend of the sandboxes client commands create. With --host (or
    /// CRUCIBLE_HOST) it asks that daemon alone, never this host: whether it answers, how many
    /// sandboxes it has, its images (which also tells whether it takes the API key) and its
    /// default backend. It exits 125 when that daemon cannot be reached.
    Doctor(doctor::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    Man,
    /// Print the API's OpenAPI document, as `GET /openapi.json` serves it (`cargo xtask
    /// gen-openapi` writes docs/openapi.json from it).
    #[command(hide = true)]
    Openapi,
}

#[derive(Subcommand)]
enum CacheCommand {
    /// List your caches (every cache over the Unix socket or with the admin key).
    Ls,
    /// Delete caches; a cache in use by a sandbox is refused.
    Rm {
        /// The cache names.
        names: Vec<String>,
        /// Every one of your caches not in use.
        #[arg(long, conflicts_with = "names")]
        all: bool,
    },
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Import an image: a `docker save` archive, an OCI layout (directory or archive), a
    /// rootfs tarball or directory. Streams it to the daemon with progress.
    Import(commands::images::ImportArgs),
    /// List the built-in image and yours (every image over the Unix socket or with the admin
    /// key).
    Ls,
    /// Print one image's JSON: layers, size, env, working directory, user.
    Inspect {
        /// The image name.
        name: String,
    },
    /// Remove images; one a sandbox uses is refused.
    Rm {
        /// The image names.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Remove every image of yours that no sandbox uses (as `docker image prune -a`),
    /// optionally only those idle for a while or named with a prefix; prints their names.
    Prune(commands::images::PruneArgs),
}

#[derive(Subcommand)]
enum SandboxCommand {
    /// Create a sandbox and print its id (or its JSON with --json).
    Create(commands::sandbox::CreateArgs),
    /// List sandboxes.
    Ls,
    /// Show one sandbox.
    Get {
        /// The sandbox id.
        id: String,
    },
    /// Change a running sandbox's memory and CPU limits, as `docker update` (namespace
    /// backend; a microVM's are fixed at boot); prints the sandbox as `get` does.
    Update {
        /// The sandbox id.
        id: String,
        /// The new memory limit in MiB.
        #[arg(long, value_name = "MIB")]
        memory: Option<u64>,
        /// The new CPU limit in whole CPUs.
        #[arg(long, value_name = "N")]
        cpus: Option<u32>,
    },
    /// Delete sandboxes; with --container, remove those containers from one sandbox instead
    /// (each ends with every process in it; the sandbox runs on).
    Rm {
        /// The sandbox ids (exactly one with --container).
        #[arg(required = true)]
        ids: Vec<String>,
        /// A container of the sandbox to remove, not the sandbox (repeatable).
        #[arg(long = "container", value_name = "NAME")]
        containers: Vec<String>,
    },
    /// Add containers to a running sandbox (namespace backend), as with `run --service`: each
    /// starts once what it depends on is ready; prints each name when it is ready. A name
    /// that was removed may be used again (a fresh writable layer).
    Add {
        /// The sandbox id.
        id: String,
        #[command(flatten)]
        services: commands::services::ServiceArgs,
        /// Print each container's JSON instead of its name.
        #[arg(long)]
        json: bool,
    },
    /// Run a command in a sandbox, streaming its output; exits with its status (128+N when
    /// killed by signal N, 124 on timeout, 127 when not found).
    Exec(commands::exec::ExecArgs),
    /// Send a signal to every process of a sandbox but its agent, or (--exec-id) to one
    /// running command; the sandbox stays.
    Kill(commands::sandbox::KillArgs),
    /// List a sandbox's commands that can be found by exec id: those that run, and those that
    /// ended while nobody was attached and whose result was not collected yet.
    Ps {
        /// The sandbox id.
        id: String,
    },
    /// Re-attach to a command whose connection dropped (a one-shot exec runs on without its
    /// client): print the output it kept from --offset on, then follow it live; exits with its
    /// status, as `sandbox exec` does. Attaching to an ended command collects its result.
    Attach(commands::exec::AttachArgs),
    /// Print what a sandbox uses now (as `docker stats --no-stream`): memory against its
    /// limit, CPU time, processes; with --container, that container's share (its processes'
    /// resident memory and CPU time, the sandbox's limits).
    Stats {
        /// The sandbox id.
        id: String,
        /// One of its containers (a --service) [default: the whole sandbox].
        #[arg(long, value_name = "NAME")]
        container: Option<String>,
    },
    /// Print the log of one of a sandbox's containers (a --service): its main process's
    /// stdout to stdout and stderr to stderr, the last MiB of it, every run of it.
    Logs {
        /// The sandbox id.
        id: String,
        /// The container's name.
        container: String,
    },
}

impl Global {
    /// A client for the configured daemon.
    pub(crate) fn client(&self) -> anyhow::Result<client::Client> {
        let endpoint: client::Endpoint = match &self.host {
            Some(host) => host.parse()?,
            None => client::Endpoint::Unix(api::config::default_socket()),
        };
        let mut c = client::Client::new(endpoint);
        if let Some(key) = &self.api_key {
            c = c.with_api_key(key.clone());
        }
        Ok(c)
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let global = cli.global;
    match cli.command {
        Command::Doctor(args) => doctor::run(&args, &global),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut command_line(),
                "crucible",
                &mut std::io::stdout(),
            );
            Ok(0)
        }
        Command::Man => {
            clap_mangen::Man::new(command_line()).render(&mut std::io::stdout())?;
            Ok(0)
        }
        Command::Openapi => {
            print!("{}", api::openapi::document_text());
            Ok(0)
        }
        Command::Serve(args) => runtime()?.block_on(serve::run(args)).map(|()| 0),
        Command::Run(args) => runtime()?.block_on(commands::run::run(&global, args)),
        Command::Shell(args) => runtime()?.block_on(commands::exec::shell(&global, args)),
        Command::Image(command) => runtime()?
            .block_on(async {
                match command {
                    ImageCommand::Import(args) => commands::images::import(&global, args).await,
                    ImageCommand::Ls => commands::images::list(&global).await,
                    ImageCommand::Inspect { name } => {
                        commands::images::inspect(&global, &name).await
                    }
                    ImageCommand::Rm { names } => commands::images::remove(&global, &names).await,
                    ImageCommand::Prune(args) => commands::images::prune(&global, &args).await,
                }
            })
            .map(|()| 0),
        Command::Cache(command) => runtime()?
            .block_on(async {
                match command {
                    CacheCommand::Ls => commands::cache::list(&global).await,
                    CacheCommand::Rm { names, all } => {
                        commands::cache::remove(&global, &names, all).await
                    }
                }
            })
            .map(|()| 0),
        Command::Cp(args) => runtime()?
            .block_on(commands::cp::run(&global, args))
            .map(|()| 0),
        Command::Sandbox(command) => runtime()?.block_on(async {
            match command {
                SandboxCommand::Create(args) => {
                    commands::sandbox::create(&global, args).await.map(|()| 0)
                }
                SandboxCommand::Ls => commands::sandbox::list(&global).await.map(|()| 0),
                SandboxCommand::Get { id } => {
                    commands::sandbox::get(&global, &id).await.map(|()| 0)
                }
                SandboxCommand::Update { id, memory, cpus } => {
                    commands::sandbox::update(&global, &id, memory, cpus)
                        .await
                        .map(|()| 0)
                }
                SandboxCommand::Stats { id, container } => {
                    commands::sandbox::stats(&global, &id, container.as_deref())
                        .await
                        .map(|()| 0)
                }
                SandboxCommand::Logs { id, container } => {
                    commands::services::logs(&global, &id, &container)
                        .await
                        .map(|()| 0)
                }
                SandboxCommand::Add { id, services, json } => {
                    commands::services::add(&global, &id, &services, json)
                        .await
                        .map(|()| 0)
                }
                SandboxCommand::Rm { ids, containers } if !containers.is_empty() => {
                    commands::sandbox::remove_containers(&global, &ids, &containers)
                        .await
                        .map(|()| 0)
                }
                SandboxCommand::Rm { ids, .. } => {
                    commands::sandbox::remove(&global, &ids).await.map(|()| 0)
                }
                SandboxCommand::Exec(args) => commands::exec::exec(&global, args).await,
                SandboxCommand::Kill(args) => {
                    commands::sandbox::kill(&global, &args).await.map(|()| 0)
                }
                SandboxCommand::Ps { id } => commands::exec::ps(&global, &id).await.map(|()| 0),
                SandboxCommand::Attach(args) => commands::exec::attach(&global, args).await,
            }
        }),
    }
}

/// The client options, by clap id, each with what to say when one is given to `serve`.
const CLIENT_OPTIONS: [(&str, &str); 3] = [
    (
        "host",
        "--host names the daemon a client talks to; `crucible serve` listens on --socket, and \
         on TCP with --listen ADDR",
    ),
    (
        "api_key",
        "--api-key is the key a client sends; `crucible serve` takes its keys from \
         --api-keys-file or CRUCIBLE_API_KEYS",
    ),
    (
        "json",
        "--json is for client commands; `crucible serve` writes its log as text to stderr",
    ),
];

/// The command line: the derived one, but with the client options hidden from `serve`'s help.
/// They are global (`crucible sandbox ls --json` and `crucible --json sandbox ls` both work),
/// so clap would copy them into every subcommand, the daemon's too, where they mean nothing.
/// `serve` gets hidden copies of its own instead, which clap's copying leaves alone; they must
/// be there before the command is built, which indexes every subcommand's options.
fn command_line() -> clap::Command {
    let command = Cli::command();
    let hidden: Vec<clap::Arg> = command
        .get_arguments()
        .filter(|option| CLIENT_OPTIONS.iter().any(|(id, _)| option.get_id() == id))
        .map(|option| option.clone().hide(true))
        .collect();
    command.mut_subcommand("serve", |serve| serve.args(hidden))
}

/// Refuses a client option given to `serve` on the command line (before or after `serve`): a
/// Docker user's `dockerd --host` is where the daemon listens, and quietly ignoring
/// `crucible serve --host 0.0.0.0:7070` would leave them wondering why nothing listens there.
/// The environment's CRUCIBLE_HOST and CRUCIBLE_API_KEY are the client's and stay ignored: a
/// shell set up for the client can still start the daemon.
fn refuse_client_options_on_serve(
    command: &clap::Command,
    matches: &ArgMatches,
) -> Result<(), clap::Error> {
    let Some(("serve", serve_matches)) = matches.subcommand() else {
        return Ok(());
    };
    for (id, why) in CLIENT_OPTIONS {
        let given = [matches, serve_matches]
            .iter()
            .any(|m| m.value_source(id) == Some(ValueSource::CommandLine));
        if given {
            // `serve`'s own command, so the error shows its usage line.
            let mut serve = command
                .find_subcommand("serve")
                .cloned()
                .unwrap_or_else(|| command.clone());
            return Err(serve.error(ErrorKind::ArgumentConflict, why));
        }
    }
    Ok(())
}

fn parse() -> Result<Cli, clap::Error> {
    let mut command = command_line();
    let matches = command.try_get_matches_from_mut(std::env::args_os())?;
    refuse_client_options_on_serve(&command, &matches)?;
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
}

fn main() {
    let cli = parse().unwrap_or_else(|e| {
        // A usage error is crucible's own failure (125, as `docker run`), never a status the
        // command could have had (clap's 2); `--help` and `--version` are answers (0).
        let code = if e.use_stderr() {
            exit::CRUCIBLE_ERROR
        } else {
            0
        };
        let _ = e.print();
        std::process::exit(code)
    });
    let verbose = matches!(cli.command, Command::Serve(_));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CRUCIBLE_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(if verbose { "info" } else { "warn" })
            }),
        )
        // Colour only for a person at a terminal: a log file or journal gets plain text.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .with_writer(std::io::stderr)
        .init();
    match dispatch(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("crucible: error: {}", output::error_line(&e));
            std::process::exit(exit::CRUCIBLE_ERROR);
        }
    }
}

/// The default image directory: `$CRUCIBLE_IMAGE`, else `target/crucible/image`.
pub(crate) fn default_image_dir() -> PathBuf {
    PathBuf::from("target/crucible/image")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `args` parse, the client options on `serve` refused.
    fn accepted(args: &[&str]) -> Result<(), clap::Error> {
        let command = command_line();
        let matches = command.clone().try_get_matches_from(args)?;
        refuse_client_options_on_serve(&command, &matches)
    }

    #[test]
    fn the_command_line_with_serves_hidden_copies_is_valid() {
        command_line().debug_assert();
    }

    #[test]
    fn serve_refuses_client_options_that_client_commands_take() {
        for args in [
            &["crucible", "serve", "--host", "0.0.0.0:7070"][..],
            &["crucible", "--host", "http://127.0.0.1:7070", "serve"],
            &["crucible", "serve", "--api-key", "k"],
            &["crucible", "--json", "serve"],
        ] {
            let refused = accepted(args).expect_err("a client option on serve");
            assert_eq!(refused.kind(), ErrorKind::ArgumentConflict, "{args:?}");
        }
        for args in [
            &["crucible", "serve", "--socket", "/tmp/crucible.sock"][..],
            &["crucible", "--host", "/d.sock", "sandbox", "ls", "--json"],
            &["crucible", "sandbox", "ls", "--json", "--api-key", "k"],
            &["crucible", "doctor", "--host", "http://127.0.0.1:7070"],
        ] {
            accepted(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
    }
}
