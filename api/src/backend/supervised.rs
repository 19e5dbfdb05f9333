//! The one process behind a sandbox (the namespace supervisor, `crucible-vmm`, or the agent
//! itself): started and awaited until its agent says hello, then watched until it exits,
//! killed on request. Shared by every backend.

use std::sync::Mutex;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};
use wire::agent::Hello;

use super::BackendError;

/// Starts `command` and waits for its agent's hello on `ready` (no polling), racing the
/// process's exit and `timeout`. `what` names the process and `see` where to look when it
/// fails (a log, a console). On failure the process is killed.
pub async fn spawn_and_await_hello(
    command: &mut Command,
    ready: &UnixListener,
    timeout: Duration,
    what: &str,
    see: &str,
) -> Result<(Child, Hello), BackendError> {
    let mut child = command
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| BackendError::setup(format!("start {what}"), e))?;
    let hello = tokio::select! {
        hello = accept_hello(ready) => hello,
        status = child.wait() => Err(format!(
            "{what} exited before its agent was ready ({}); see {see}",
            status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()),
        )),
        () = tokio::time::sleep(timeout) => Err(format!(
            "no hello from the agent within {timeout:?}; see {see}"
        )),
    };
    match hello {
        Ok(hello) => Ok((child, hello)),
        Err(reason) => {
            let _ = child.kill().await;
            Err(BackendError::NotReady(reason))
        }
    }
}

/// Accepts the agent's connection on `listener` and reads its hello.
async fn accept_hello(listener: &UnixListener) -> Result<Hello, String> {
    let (mut stream, _) = listener
        .accept()
        .await
        .map_err(|e| format!("accepting the agent's hello: {e}"))?;
    wire::read_message_async(&mut stream)
        .await
        .map_err(|e| format!("reading the agent's hello: {e}"))
}

/// A receiver that ends with whichever of `a` and `b` ends first: a sandbox made of two
/// processes is dead when either is.
pub fn first_exit(
    mut a: watch::Receiver<Option<String>>,
    mut b: watch::Receiver<Option<String>>,
) -> watch::Receiver<Option<String>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let reason = tokio::select! {
            r = a.wait_for(Option::is_some) => r.ok().and_then(|r| r.clone()),
            r = b.wait_for(Option::is_some) => r.ok().and_then(|r| r.clone()),
        };
        let _ = tx.send(Some(reason.unwrap_or_else(|| "its watcher ended".into())));
    });
    rx
}

/// A watched sandbox process.
#[derive(Debug)]
pub struct SandboxProcess {
    exited: watch::Receiver<Option<String>>,
    kill: Mutex<Option<oneshot::Sender<()>>>,
}

impl SandboxProcess {
    /// Watches `child`; `what` names it in the exit reason (`"the VM"`).
    pub fn watch(mut child: Child, what: String) -> Self {
        let (exited_tx, exited_rx) = watch::channel(None);
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let reason = tokio::select! {
                status = child.wait() => match status {
                    Ok(s) => format!("{what} exited ({s})"),
                    Err(e) => format!("waiting for {what} failed: {e}"),
                },
                _ = kill_rx => {
                    let _ = child.kill().await;
                    "deleted".to_string()
                }
            };
            let _ = exited_tx.send(Some(reason));
        });
        SandboxProcess {
            exited: exited_rx,
            kill: Mutex::new(Some(kill_tx)),
        }
    }

    /// `None` while it runs; why it ended, once it has.
    pub fn exited(&self) -> watch::Receiver<Option<String>> {
        self.exited.clone()
    }

    /// Kills it (once; later calls do nothing) and waits until it is gone.
    pub async fn kill_and_wait(&self) {
        if let Some(kill) = self.kill.lock().ok().and_then(|mut k| k.take()) {
            let _ = kill.send(());
        }
        let mut exited = self.exited.clone();
        let _ = exited.wait_for(Option::is_some).await;
    }
}
