//! The one process behind a sandbox (the namespace supervisor, or `crucible-vmm`): watched
//! until it exits, killed on request. Shared by both backends.

use std::sync::Mutex;

use tokio::process::Child;
use tokio::sync::{oneshot, watch};

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
