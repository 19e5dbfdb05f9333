//! `crucible sandbox exec [-i]` and `crucible shell`.

use anyhow::{Context, Result};
use client::{ClientError, ExecEvent};
use tokio::io::AsyncWriteExt;
use wire::{ExecRequest, ExecResult};

use crate::{exit, output, terminal, Global};

#[derive(clap::Args)]
pub(crate) struct ExecArgs {
    /// Interactive: forward this process's stdin to the command (line-buffered, no PTY;
    /// with -t, through a terminal).
    #[arg(short, long)]
    pub interactive: bool,
    /// Run the command on a pseudo-terminal, as `docker exec -t`: its stderr comes on the
    /// terminal too, sized as this one. With -i, this terminal is in raw mode while the
    /// session lasts (keys such as Ctrl-C go to the command) and its size follows this
    /// window; stdin must then be a terminal.
    #[arg(short, long)]
    pub tty: bool,
    /// Environment added for this command (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = super::key_value)]
    pub env: Vec<(String, String)>,
    /// Who this command runs as: uid, uid:gid, name or name:group (as `docker exec --user`),
    /// looked up in the image's /etc/passwd [default: the sandbox's user].
    #[arg(short, long, value_name = "USER")]
    pub user: Option<String>,
    /// A supplementary group for this command: a gid or a group name of the image (as
    /// `docker run --group-add`; repeatable).
    #[arg(long, value_name = "GROUP")]
    pub group_add: Vec<String>,
    /// Run it in the sandbox's container NAME (a --service) instead of its own root; with
    /// the container's env, working directory and user as defaults. Not with -i yet.
    #[arg(long, value_name = "NAME")]
    pub container: Option<String>,
    #[command(flatten)]
    pub options: CommandOptions,
    /// The sandbox id.
    pub id: String,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub cmd: Vec<String>,
}

#[derive(clap::Args)]
pub(crate) struct ShellArgs {
    /// The sandbox id.
    pub id: String,
    /// The shell to run.
    #[arg(long, default_value = "sh")]
    pub shell: String,
}

/// How a command runs: the options `sandbox exec` and `run` share.
#[derive(clap::Args)]
pub(crate) struct CommandOptions {
    /// Working directory (absolute) [default: the agent's].
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Kill the command (its whole process group) after this many seconds; exit status 124.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<i64>,
    /// Print the command's resource usage to stderr when it ends.
    #[arg(long)]
    pub stats: bool,
    /// A resource limit, as `docker run --ulimit`: nofile=1024, nofile=1024:4096,
    /// core=0, stack=unlimited (repeatable; the names are setrlimit's without RLIMIT_).
    #[arg(long, value_name = "NAME=SOFT[:HARD]", value_parser = ulimit)]
    pub ulimit: Vec<wire::Rlimit>,
    /// Name the running command, so that `crucible sandbox kill ID --exec-id NAME` signals it
    /// alone and `crucible sandbox attach ID NAME` finds it again (letters, digits, '.', '_',
    /// '-') [default: a name the daemon makes up].
    #[arg(long, value_name = "NAME")]
    pub exec_id: Option<String>,
    /// What happens to the command if this client goes away (Ctrl-C, a dropped connection):
    /// `keep` runs it on (re-attach with `crucible sandbox attach`, `-i` for an interactive
    /// one), `kill` kills it [default: keep; for an interactive session, kill].
    #[arg(long, value_name = "POLICY", value_parser = on_disconnect)]
    pub on_disconnect: Option<wire::OnDisconnect>,
}

fn on_disconnect(text: &str) -> Result<wire::OnDisconnect, String> {
    match text {
        "keep" => Ok(wire::OnDisconnect::Keep),
        "kill" => Ok(wire::OnDisconnect::Kill),
        other => Err(format!("expected keep or kill, got {other:?}")),
    }
}

#[derive(clap::Args)]
pub(crate) struct AttachArgs {
    /// Interactive: the command is an interactive one started with `--on-disconnect keep`;
    /// this process's stdin goes to it from here on (what the command took before is not
    /// sent again).
    #[arg(short, long)]
    pub interactive: bool,
    /// The output bytes (stdout and stderr together) you already have: the stream starts
    /// after them [default: 0, everything the agent still keeps].
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub offset: u64,
    /// Print the command's resource usage to stderr when it ends.
    #[arg(long)]
    pub stats: bool,
    /// The sandbox id.
    pub id: String,
    /// The command's exec id (`crucible sandbox ps ID` lists them).
    pub exec_id: String,
}

impl CommandOptions {
    /// The request to run `cmd` with `env` under these options.
    pub(crate) fn request(&self, cmd: &[String], env: &[(String, String)]) -> ExecRequest {
        ExecRequest {
            cmd: cmd.to_vec(),
            env: env.iter().cloned().collect(),
            cwd: self.cwd.clone().unwrap_or_default(),
            timeout_s: self.timeout.unwrap_or(0),
            rlimits: self.ulimit.clone(),
            exec_id: self.exec_id.clone().unwrap_or_default(),
            on_disconnect: self.on_disconnect,
            ..ExecRequest::default()
        }
    }
}

/// `NAME=SOFT[:HARD]` (a missing hard limit is the soft one; `unlimited` and `-1` are no
/// limit), as Docker's `--ulimit` takes it.
fn ulimit(text: &str) -> Result<wire::Rlimit, String> {
    let (name, values) = text
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=SOFT[:HARD], got {text:?}"))?;
    let value = |v: &str| match v {
        "unlimited" | "-1" => Ok(u64::MAX),
        v => v
            .parse::<u64>()
            .map_err(|_| format!("{v:?} in {text:?} is not a number or \"unlimited\"")),
    };
    let (soft, hard) = match values.split_once(':') {
        Some((soft, hard)) => (value(soft)?, value(hard)?),
        None => (value(values)?, value(values)?),
    };
    let limit = wire::Rlimit {
        kind: name.to_string(),
        soft,
        hard,
    };
    if limit.resource().is_none() {
        return Err(format!(
            "{name:?} is not a resource: one of {}",
            wire::RLIMIT_RESOURCES.join(", ")
        ));
    }
    if soft > hard {
        return Err(format!("soft limit above the hard limit in {text:?}"));
    }
    Ok(limit)
}

/// Writes one output event where it belongs; returns the result at the exit event.
pub(crate) async fn print_event(event: ExecEvent) -> Result<Option<ExecResult>> {
    match event {
        ExecEvent::Stdout(bytes) => {
            let mut out = tokio::io::stdout();
            out.write_all(&bytes).await?;
            out.flush().await?;
        }
        ExecEvent::Stderr(bytes) => {
            let mut err = tokio::io::stderr();
            err.write_all(&bytes).await?;
            err.flush().await?;
        }
        ExecEvent::Exit(result) => return Ok(Some(result)),
    }
    Ok(None)
}

fn lost() -> anyhow::Error {
    ClientError::Protocol("the exec stream ended without an exit frame".into()).into()
}

/// Streams a one-shot exec's output live; returns its result.
pub(crate) async fn stream(
    client: &client::Client,
    id: &str,
    request: &ExecRequest,
) -> Result<ExecResult> {
    let stream = client.exec(id, request).await?;
    let keeps_running = request.on_disconnect != Some(wire::OnDisconnect::Kill);
    follow(client, id, stream, 0, keeps_running).await
}

/// How many times a broken stream is re-attached before the command gives up.
const MAX_RESUMES: u32 = 5;

/// Prints a frame stream's output live from output byte `offset`; returns its result. When
/// the connection breaks and the command runs on, it re-attaches from the bytes already
/// printed (nothing twice, nothing lost) up to [`MAX_RESUMES`] times, waiting longer each
/// time (a restarting daemon, a network blip); past that, the error says how to re-attach.
async fn follow(
    client: &client::Client,
    id: &str,
    mut stream: client::ExecStream,
    offset: u64,
    keeps_running: bool,
) -> Result<ExecResult> {
    let mut received = offset;
    let mut resumes = 0;
    loop {
        let broken = loop {
            let event = match stream.next_event().await {
                Some(Ok(event)) => event,
                Some(Err(e)) => break anyhow::Error::from(e),
                None => break lost(),
            };
            if let ExecEvent::Stdout(bytes) | ExecEvent::Stderr(bytes) = &event {
                received += bytes.len() as u64;
            }
            if let Some(result) = print_event(event).await? {
                if result.output_dropped_bytes > 0 {
                    eprintln!(
                        "crucible: {} bytes of output are missing: the agent keeps only the \
                         latest (the daemon's --exec-tail-bytes)",
                        result.output_dropped_bytes
                    );
                }
                return Ok(result);
            }
        };
        let exec_id = match stream.exec_id() {
            Some(exec_id) if keeps_running => exec_id.to_string(),
            _ => return Err(broken),
        };
        let mut last = broken;
        stream = loop {
            if resumes == MAX_RESUMES {
                return Err(reattach_hint(&last, id, &exec_id, received));
            }
            resumes += 1;
            eprintln!(
                "crucible: the stream broke ({}); re-attaching to {} at byte {received}",
                output::error_line(&last),
                output::escape(&exec_id)
            );
            tokio::time::sleep(std::time::Duration::from_millis(100 << resumes)).await;
            match client.attach(id, &exec_id, received).await {
                Ok(stream) => break stream,
                // The daemon answered: the command is not there to follow (collected,
                // attached elsewhere). Retrying cannot change that.
                Err(e @ ClientError::Api { .. }) => {
                    return Err(reattach_hint(&e.into(), id, &exec_id, received))
                }
                Err(e) => last = e.into(),
            }
        };
    }
}

/// `error`, with the command that re-attaches to the command, which runs on.
fn reattach_hint(error: &anyhow::Error, id: &str, exec_id: &str, received: u64) -> anyhow::Error {
    anyhow::anyhow!(
        "{}; the command may run on: `crucible sandbox attach {id} {exec_id} --offset \
         {received}` follows it from where this stopped",
        output::error_line(error)
    )
}

/// `crucible sandbox attach ID EXEC_ID`.
pub(crate) async fn attach(global: &Global, args: AttachArgs) -> Result<i32> {
    let client = global.client()?;
    if args.interactive {
        let (session, position) = client
            .attach_interactive(&args.id, &args.exec_id, args.offset)
            .await?;
        let result = drive(session, !position.stdin_closed, false).await?;
        if global.json {
            output::print_json(&result)?;
        }
        return finish(global, &result, args.stats);
    }
    let stream = client.attach(&args.id, &args.exec_id, args.offset).await?;
    let result = follow(&client, &args.id, stream, args.offset, true).await?;
    if global.json {
        output::print_json(&result)?;
    }
    finish(global, &result, args.stats)
}

/// `crucible sandbox ps ID`.
pub(crate) async fn ps(global: &Global, id: &str) -> Result<()> {
    let execs = global.client()?.execs(id).await?;
    if global.json {
        return output::print_json(&wire::ExecList { execs });
    }
    print!("{}", output::exec_table(&execs));
    Ok(())
}

/// Runs an interactive session: this process's stdin goes to the command until EOF (then
/// stdin_close), the command's output comes back live.
pub(crate) async fn interactive(
    client: &client::Client,
    id: &str,
    request: &ExecRequest,
) -> Result<ExecResult> {
    let session = client.interactive(id, request).await?;
    drive(session, true, false).await
}

/// Runs an interactive session on a terminal: this process's terminal is raw while it lasts
/// (restored however it ends) and its size is sent whenever its window changes.
async fn on_terminal(
    client: &client::Client,
    id: &str,
    request: &ExecRequest,
) -> Result<ExecResult> {
    let raw = terminal::RawMode::enter()?;
    let session = client.interactive(id, request).await?;
    let result = drive(session, true, true).await;
    drop(raw);
    result
}

/// Drives an interactive session: with `forward_stdin`, this process's stdin goes to the
/// command until EOF (then stdin_close); the command's output comes back live. With
/// `window`, a change of this terminal's window (SIGWINCH) sends its new size.
async fn drive(session: client::Session, forward_stdin: bool, window: bool) -> Result<ExecResult> {
    let (mut reader, mut writer) = session.into_split();
    let mut window_changes = if window {
        Some(
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
                .context("watching the window's size (SIGWINCH)")?,
        )
    } else {
        None
    };
    let mut typed = forward_stdin.then(stdin_chunks);
    let input = tokio::spawn(async move {
        loop {
            let window_changed = async {
                match window_changes.as_mut() {
                    Some(changes) => changes.recv().await,
                    None => std::future::pending().await,
                }
            };
            let chunk = async {
                match typed.as_mut() {
                    Some(typed) => typed.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                chunk = chunk => match chunk {
                    Some(chunk) if !chunk.is_empty() => {
                        if writer.send_stdin(&chunk).await.is_err() {
                            return;
                        }
                    }
                    _ => {
                        let _ = writer.close_stdin().await;
                        typed = None;
                    }
                },
                Some(()) = window_changed => {
                    if let Some(size) = terminal::size() {
                        if writer.resize(size).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
    let result = loop {
        match reader.next_event().await {
            Some(event) => {
                if let Some(result) = print_event(event?).await? {
                    break Ok(result);
                }
            }
            None => break Err(lost()),
        }
    };
    input.abort();
    result
}

/// This process's stdin in chunks as it is read, then an empty chunk at its end (or on a read
/// error). Read on a thread of its own, never joined: a read from a terminal blocks until a
/// key is pressed, and the command may end first (tokio's stdin would make the runtime's
/// shutdown wait for that key).
fn stdin_chunks() -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    let (send, receive) = tokio::sync::mpsc::channel(4);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let chunk = match stdin.read(&mut buf) {
                Ok(n) => buf[..n].to_vec(),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => Vec::new(),
            };
            let end = chunk.is_empty();
            if send.blocking_send(chunk).is_err() || end {
                return;
            }
        }
    });
    receive
}

fn finish(global: &Global, result: &ExecResult, stats: bool) -> Result<i32> {
    if stats {
        eprint!("{}", output::stats_table(result));
    }
    if !result.error.is_empty() && !global.json {
        eprintln!("crucible: {}", output::escape(&result.error));
    }
    Ok(exit::code(result))
}

pub(crate) async fn exec(global: &Global, args: ExecArgs) -> Result<i32> {
    let client = global.client()?;
    let mut request = args.options.request(&args.cmd, &args.env);
    request.user = args.user.unwrap_or_default();
    request.group_add = args.group_add;
    if args.tty {
        if args.interactive && !terminal::stdin_is_terminal() {
            anyhow::bail!(
                "-t with -i types this process's stdin into the command's terminal, and stdin \
                 is not a terminal: drop -t to pipe input to the command"
            );
        }
        request.tty = true;
        request.tty_size = terminal::size();
    }
    if let Some(container) = &args.container {
        if args.interactive {
            anyhow::bail!("--container does not go with -i yet: run it without -i");
        }
        // Not re-attached if the connection breaks: a re-attach finds the sandbox's own
        // commands only.
        let stream = client.exec_in(&args.id, container, &request).await?;
        let result = follow(&client, &args.id, stream, 0, false).await?;
        if global.json {
            output::print_json(&result)?;
        }
        return finish(global, &result, args.options.stats);
    }
    if global.json && !args.interactive {
        let out = client.exec_collect(&args.id, &request).await?;
        output::print_json(&serde_json::json!({
            "stdout": String::from_utf8_lossy(&out.stdout),
            "stderr": String::from_utf8_lossy(&out.stderr),
            "result": out.result,
        }))?;
        return Ok(exit::code(&out.result));
    }
    let result = if args.interactive && args.tty {
        on_terminal(&client, &args.id, &request).await?
    } else if args.interactive {
        interactive(&client, &args.id, &request).await?
    } else {
        stream(&client, &args.id, &request).await?
    };
    if global.json {
        output::print_json(&result)?;
    }
    finish(global, &result, args.options.stats)
}

pub(crate) async fn shell(global: &Global, args: ShellArgs) -> Result<i32> {
    let client = global.client()?;
    let request = ExecRequest::new([args.shell.as_str(), "-i"]);
    let result = interactive(&client, &args.id, &request).await?;
    finish(global, &result, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulimits_parse_like_docker() {
        let l = ulimit("nofile=1024:4096").expect("valid");
        assert_eq!((l.kind.as_str(), l.soft, l.hard), ("nofile", 1024, 4096));
        let l = ulimit("core=0").expect("valid");
        assert_eq!((l.soft, l.hard), (0, 0));
        let l = ulimit("stack=unlimited").expect("valid");
        assert_eq!((l.soft, l.hard), (u64::MAX, u64::MAX));
        assert!(ulimit("nofile").is_err());
        assert!(ulimit("nofile=x").is_err());
        assert!(ulimit("files=1").expect_err("unknown").contains("nofile"));
        assert!(ulimit("nofile=10:5").is_err());
    }
}
