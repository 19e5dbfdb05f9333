//! `crucible sandbox exec [-i]` and `crucible shell`.

use anyhow::Result;
use client::{ClientError, ExecEvent};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wire::{ExecRequest, ExecResult};

use crate::{exit, output, Global};

#[derive(clap::Args)]
pub struct ExecArgs {
    /// Interactive: forward this process's stdin to the command (line-buffered, no PTY).
    #[arg(short, long)]
    pub interactive: bool,
    /// Environment added for this command (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = super::key_value)]
    pub env: Vec<(String, String)>,
    #[command(flatten)]
    pub options: CommandOptions,
    /// The sandbox id.
    pub id: String,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub cmd: Vec<String>,
}

#[derive(clap::Args)]
pub struct ShellArgs {
    /// The sandbox id.
    pub id: String,
    /// The shell to run.
    #[arg(long, default_value = "sh")]
    pub shell: String,
}

/// How a command runs: the options `sandbox exec` and `run` share.
#[derive(clap::Args)]
pub struct CommandOptions {
    /// Working directory (absolute) [default: the agent's].
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Kill the command (its whole process group) after this many seconds; exit status 124.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<i64>,
    /// Print the command's resource usage to stderr when it ends.
    #[arg(long)]
    pub stats: bool,
}

impl CommandOptions {
    /// The request to run `cmd` with `env` under these options.
    pub fn request(&self, cmd: &[String], env: &[(String, String)]) -> ExecRequest {
        ExecRequest {
            cmd: cmd.to_vec(),
            env: env.iter().cloned().collect(),
            cwd: self.cwd.clone().unwrap_or_default(),
            timeout_s: self.timeout.unwrap_or(0),
        }
    }
}

/// Writes one output event where it belongs; returns the result at the exit event.
pub async fn print_event(event: ExecEvent) -> Result<Option<ExecResult>> {
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
pub async fn stream(
    client: &client::Client,
    id: &str,
    request: &ExecRequest,
) -> Result<ExecResult> {
    let mut stream = client.exec(id, request).await?;
    while let Some(event) = stream.next_event().await {
        if let Some(result) = print_event(event?).await? {
            return Ok(result);
        }
    }
    Err(lost())
}

/// Runs an interactive session: this process's stdin goes to the command until EOF (then
/// stdin_close), the command's output comes back live.
pub async fn interactive(
    client: &client::Client,
    id: &str,
    request: &ExecRequest,
) -> Result<ExecResult> {
    let session = client.interactive(id, request).await?;
    let (mut reader, mut writer) = session.into_split();
    let input = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = writer.close_stdin().await;
                    return;
                }
                Ok(n) => {
                    if writer.send_stdin(&buf[..n]).await.is_err() {
                        return;
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

fn finish(global: &Global, result: &ExecResult, stats: bool) -> Result<i32> {
    if stats {
        eprint!("{}", output::stats_table(result));
    }
    if !result.error.is_empty() && !global.json {
        eprintln!("crucible: {}", result.error);
    }
    Ok(exit::code(result))
}

pub async fn exec(global: &Global, args: ExecArgs) -> Result<i32> {
    let client = global.client()?;
    let request = args.options.request(&args.cmd, &args.env);
    if global.json && !args.interactive {
        let out = client.exec_collect(&args.id, &request).await?;
        output::print_json(&serde_json::json!({
            "stdout": String::from_utf8_lossy(&out.stdout),
            "stderr": String::from_utf8_lossy(&out.stderr),
            "result": out.result,
        }))?;
        return Ok(exit::code(&out.result));
    }
    let result = if args.interactive {
        interactive(&client, &args.id, &request).await?
    } else {
        stream(&client, &args.id, &request).await?
    };
    if global.json {
        output::print_json(&result)?;
    }
    finish(global, &result, args.options.stats)
}

pub async fn shell(global: &Global, args: ShellArgs) -> Result<i32> {
    let client = global.client()?;
    let request = ExecRequest::new([args.shell.as_str(), "-i"]);
    let result = interactive(&client, &args.id, &request).await?;
    finish(global, &result, false)
}
