//! A sandbox's containers, on the daemon's side: what each runs (its main process, made from
//! its image's config and its request), its life (started in dependency order, checked for
//! readiness, started again on failure if asked), and its log (the main process's output,
//! bounded, kept by the daemon so it can be read after the process has exited). Each
//! container has an agent of its own in the sandbox (`Instance::connect_container`), which
//! runs its commands in its root; everything here talks to it through the [`Sandbox`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use api_types::{ContainerInfo, ContainerState, ReadyCheck, RestartPolicy};
use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use wire::agent::AgentRequest;
use wire::{ExecRequest, ExecResult, FrameType};

use crate::sandbox::{ExecAccounts, Sandbox};

/// The most output of a container's main process the daemon keeps for its log: the latest
/// bytes, as `docker logs --tail` would show of a bounded log.
pub const LOG_LIMIT_BYTES: usize = 1024 * 1024;

/// The most containers a sandbox holds at once besides its own root (at creation, and added
/// later): each costs the daemon its log ([`LOG_LIMIT_BYTES`]) and a task. A Kubernetes pod
/// or a CI job's services need a handful.
pub const MAX_CONTAINERS: usize = 16;

/// What the daemon counts for each kept frame of a log beside its bytes (the queue's entry,
/// the buffer's header): a stream of one-byte frames must not hold many times the limit.
const LOG_FRAME_COST: usize = 64;

/// How long a container's readiness may take unless its check says otherwise.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The first and the longest wait between two tries of a readiness check: a service up in a
/// few milliseconds is seen as ready then, one that takes seconds is not polled needlessly.
const READY_FIRST: Duration = Duration::from_millis(10);
const READY_MAX: Duration = Duration::from_millis(200);

/// The first and the longest wait before a failed main process is started again.
const RESTART_FIRST: Duration = Duration::from_millis(100);
const RESTART_MAX: Duration = Duration::from_secs(10);

/// The name that addresses the sandbox's own root where a container's could be
/// (`?container=main` is the same as none).
pub const MAIN_CONTAINER: &str = "main";

/// The exec id of every container's main process (each container's agent has its own ids).
pub const MAIN_EXEC_ID: &str = "main";

/// One container of a sandbox.
#[derive(Debug)]
pub struct Container {
    /// Its name.
    pub name: String,
    /// Its place among the sandbox's containers: its agent's socket.
    pub(crate) index: usize,
    /// Its image's name.
    pub(crate) image: String,
    /// Its env, over the sandbox's.
    pub(crate) env: BTreeMap<String, String>,
    /// Its image's config with the request's `cwd` and `user` over it.
    pub(crate) defaults: Option<Arc<oci::defaults::Defaults>>,
    /// Where its commands' users are looked up: its image's tree.
    pub(crate) accounts: Arc<ExecAccounts>,
    /// Its main process's command line; empty when it has none.
    pub(crate) main: Vec<String>,
    restart: RestartPolicy,
    ready: Option<ReadyCheck>,
    /// Containers that must be ready before its main process starts.
    pub(crate) depends_on: Vec<String>,
    status: Mutex<Status>,
    state: watch::Sender<ContainerState>,
    log: Mutex<Log>,
    /// Removed from its sandbox (`Sandbox::remove_container`): never started again.
    removed: AtomicBool,
}

#[derive(Debug, Default)]
struct Status {
    restarts: u32,
    last_exit: Option<ExecResult>,
    error: String,
}

/// The kept output of a container's main process: whole frames, oldest first.
#[derive(Debug, Default)]
struct Log {
    frames: VecDeque<(FrameType, Bytes)>,
    /// What the kept frames cost: their bytes and [`LOG_FRAME_COST`] each.
    bytes: usize,
    dropped: u64,
}

impl Log {
    fn push(&mut self, kind: FrameType, payload: &[u8]) {
        self.frames
            .push_back((kind, Bytes::copy_from_slice(payload)));
        self.bytes += payload.len() + LOG_FRAME_COST;
        while self.bytes > LOG_LIMIT_BYTES {
            match self.frames.pop_front() {
                Some((_, old)) => {
                    self.bytes -= old.len() + LOG_FRAME_COST;
                    self.dropped += old.len() as u64;
                }
                None => break,
            }
        }
    }
}

/// What a container is made of, resolved from its request by the engine.
#[derive(Debug)]
pub(crate) struct ContainerPlan {
    pub(crate) name: String,
    pub(crate) image: String,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) defaults: Option<Arc<oci::defaults::Defaults>>,
    pub(crate) accounts: Arc<ExecAccounts>,
    pub(crate) main: Vec<String>,
    pub(crate) restart: RestartPolicy,
    pub(crate) ready: Option<ReadyCheck>,
    pub(crate) depends_on: Vec<String>,
}

/// Whether a container may go from `from` to `to`: every change of its state goes through
/// this table, so no task can undo another's (an exit is never taken back by a late ready
/// check, nor a failure by a late start). `Exited` and `Failed` are final; removal is not a
/// state (a removed container keeps the state it had, and is never started again).
///
/// | from | to | when |
/// | --- | --- | --- |
/// | `Waiting` | `Starting` | every container it depends on is ready |
/// | `Waiting` | `Failed` | one it depends on does not exist or never becomes ready |
/// | `Starting` | `Ready` | its ready check passed (at once without one) |
/// | `Starting` | `Failed` | its ready check did not pass in time |
/// | `Starting` | `Exited` | its main process ended for good before it was ready |
/// | `Ready` | `Exited` | its main process ended for good |
pub(crate) fn may_become(from: ContainerState, to: ContainerState) -> bool {
    use ContainerState::{Exited, Failed, Ready, Starting, Waiting};
    matches!(
        (from, to),
        (Waiting, Starting)
            | (Waiting, Failed)
            | (Starting, Ready)
            | (Starting, Failed)
            | (Starting, Exited)
            | (Ready, Exited)
    )
}

impl Container {
    pub(crate) fn new(index: usize, plan: ContainerPlan) -> Self {
        Container {
            name: plan.name,
            index,
            image: plan.image,
            env: plan.env,
            defaults: plan.defaults,
            accounts: plan.accounts,
            main: plan.main,
            restart: plan.restart,
            ready: plan.ready,
            depends_on: plan.depends_on,
            status: Mutex::new(Status::default()),
            state: watch::Sender::new(ContainerState::Waiting),
            log: Mutex::new(Log::default()),
            removed: AtomicBool::new(false),
        }
    }

    /// Whether it was removed from its sandbox.
    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Marks it removed; false when it already was.
    pub(crate) fn mark_removed(&self) -> bool {
        !self.removed.swap(true, Ordering::AcqRel)
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where it is in its life.
    pub fn state(&self) -> ContainerState {
        *self.state.borrow()
    }

    /// Moves it to `to` when [`may_become`] allows it from where it is; false, and no
    /// change, when it does not.
    fn move_to(&self, to: ContainerState) -> bool {
        self.state.send_if_modified(|state| {
            let allowed = may_become(*state, to);
            if allowed {
                *state = to;
            }
            allowed
        })
    }

    /// Fails it with `error`, unless it has already ended (an exit keeps its own status).
    fn fail(&self, error: String) {
        if !may_become(self.state(), ContainerState::Failed) {
            return;
        }
        tracing::warn!("container {}: {error}", self.name);
        self.status().error = error;
        self.move_to(ContainerState::Failed);
    }

    /// The API's view of it.
    pub fn info(&self) -> ContainerInfo {
        let status = self.status();
        ContainerInfo {
            name: self.name.clone(),
            image: self.image.clone(),
            state: self.state(),
            command: self.main.clone(),
            exec_id: (!self.main.is_empty()).then(|| MAIN_EXEC_ID.to_string()),
            restarts: status.restarts,
            exit_code: status.last_exit.as_ref().map(|r| r.exit_code),
            error: match (&status.error, &status.last_exit) {
                (error, Some(exit)) if error.is_empty() => exit.error.clone(),
                (error, _) => error.clone(),
            },
        }
    }

    /// Its log as an exec frame stream: the kept stdout and stderr frames of its main process
    /// (every run of it, oldest first), then, once it has exited for good, its last exit
    /// frame (whose `output_dropped_bytes` counts what the log no longer holds).
    pub fn log_frames(&self) -> Vec<u8> {
        let log = self.log();
        let mut out = Vec::with_capacity(log.bytes + log.frames.len() * wire::HEADER_SIZE);
        for (kind, payload) in &log.frames {
            wire::encode_frames(*kind, payload, &mut out);
        }
        let finished = matches!(
            self.state(),
            ContainerState::Exited | ContainerState::Failed
        );
        if finished {
            if let Some(result) = &self.status().last_exit {
                let mut result = result.clone();
                result.output_dropped_bytes = log.dropped;
                wire::encode_frames(
                    FrameType::Exit,
                    &wire::encode_exit_payload(&result),
                    &mut out,
                );
            }
        }
        out
    }

    /// The last lines of its log, for an error message.
    fn log_tail(&self) -> String {
        let log = self.log();
        let mut text = Vec::new();
        for (_, payload) in log.frames.iter().rev() {
            text.splice(0..0, payload.iter().copied());
            if text.len() > 2048 {
                break;
            }
        }
        let text = String::from_utf8_lossy(&text);
        let lines: Vec<&str> = text.lines().collect();
        let last = &lines[lines.len().saturating_sub(10)..];
        if last.is_empty() {
            "(its log is empty)".into()
        } else {
            format!("its log ends:\n{}", last.join("\n"))
        }
    }
}

/// Runs `request` in `container` to its end, handing each stdout and stderr payload to
/// `on_output`; the exit result, or why there was none.
async fn run_to_exit(
    sandbox: &Sandbox,
    container: &Container,
    mut request: ExecRequest,
    tail_bytes: u64,
    mut on_output: impl FnMut(FrameType, &[u8]),
) -> Result<ExecResult, String> {
    let user = sandbox.apply_defaults(&mut request, Some(container))?;
    let message = AgentRequest::Exec {
        request,
        interactive: false,
        user,
        tail_bytes: Some(tail_bytes),
    };
    let connection = sandbox
        .send_to_container(container, &message)
        .await
        .map_err(|e| report::chain(&e))?;
    let (mut read, _write) = connection.into_split();
    let mut decoder = wire::Decoder::new(wire::Direction::GuestToHost);
    loop {
        while let Some(frame) = decoder
            .next_frame()
            .map_err(|e| format!("the agent sent an invalid frame stream: {e}"))?
        {
            match frame.frame_type {
                FrameType::Exit => {
                    return serde_json::from_slice(frame.payload)
                        .map_err(|e| format!("the agent's exit frame is not valid JSON: {e}"))
                }
                kind => on_output(kind, frame.payload),
            }
        }
        match read.read(decoder.unfilled_mut()).await {
            Ok(0) => return Err("the agent's stream ended without an exit frame".into()),
            Ok(n) => decoder.mark_filled(n),
            Err(e) => return Err(format!("reading from the agent failed: {e}")),
        }
    }
}

/// Brings up every container of `sandbox`, in dependency order, and waits until each is
/// ready; the error names the first that could not be, with the end of its log. Their main
/// processes go on in tasks of their own, which end with the sandbox.
pub(crate) async fn start_all(sandbox: &Arc<Sandbox>) -> Result<(), String> {
    let containers = sandbox.containers();
    for container in &containers {
        ping(sandbox, container).await?;
    }
    for container in &containers {
        tokio::spawn(live(Arc::downgrade(sandbox), container.clone()));
    }
    for container in &containers {
        await_started(container).await?;
    }
    Ok(())
}

/// [`start_all`] for one container, added to a running sandbox.
pub(crate) async fn start_one(
    sandbox: &Arc<Sandbox>,
    container: &Arc<Container>,
) -> Result<(), String> {
    ping(sandbox, container).await?;
    tokio::spawn(live(Arc::downgrade(sandbox), container.clone()));
    await_started(container).await
}

async fn ping(sandbox: &Sandbox, container: &Container) -> Result<(), String> {
    sandbox
        .ping_container(container)
        .await
        .map_err(|e| format!("container {}: its agent did not start: {e}", container.name))
}

/// Waits until `container` is ready (or, with no ready check, has exited); the error says
/// why it is not, with the end of its log.
async fn await_started(container: &Container) -> Result<(), String> {
    let mut state = container.state.subscribe();
    let reached = state
        .wait_for(|s| {
            matches!(
                s,
                ContainerState::Ready | ContainerState::Exited | ContainerState::Failed
            )
        })
        .await
        .map(|s| *s);
    match reached {
        Ok(ContainerState::Ready) => Ok(()),
        Ok(ContainerState::Exited) if container.ready.is_none() => Ok(()),
        _ => {
            let info = container.info();
            let exit = container.status().last_exit.as_ref().map(describe_exit);
            let why = match (info.error.is_empty(), exit) {
                (false, Some(exit)) => format!("{}: {exit}", info.error),
                (false, None) => info.error,
                (true, Some(exit)) => exit,
                (true, None) => "it did not become ready".into(),
            };
            Err(format!(
                "container {} is not ready: {why}; {}",
                container.name,
                container.log_tail()
            ))
        }
    }
}

/// How a main process ended, in words: its exit status, its signal or why it was lost.
fn describe_exit(result: &ExecResult) -> String {
    if !result.error.is_empty() {
        format!("its main process failed: {}", result.error)
    } else if !result.signal.is_empty() {
        format!("its main process was killed by {}", result.signal)
    } else {
        format!("its main process exited with {}", result.exit_code)
    }
}

/// A container's life: waits for what it depends on, starts its main process (again, as its
/// restart policy says), runs its ready check.
async fn live(sandbox: Weak<Sandbox>, container: Arc<Container>) {
    let Some(strong) = sandbox.upgrade() else {
        return;
    };
    for name in &container.depends_on {
        let Some(dependency) = strong.container(name) else {
            return container.fail(format!("it depends on {name:?}, which does not exist"));
        };
        let mut state = dependency.state.subscribe();
        let ready = state
            .wait_for(|s| !matches!(s, ContainerState::Waiting | ContainerState::Starting))
            .await
            .map(|s| *s);
        if !matches!(ready, Ok(ContainerState::Ready)) {
            return container.fail(format!("{name}, which it depends on, is not ready"));
        }
    }
    container.move_to(ContainerState::Starting);
    drop(strong);
    let main = (!container.main.is_empty())
        .then(|| tokio::spawn(run_main(sandbox.clone(), container.clone())));
    let Some(strong) = sandbox.upgrade() else {
        return;
    };
    match await_ready(&strong, &container).await {
        Ok(()) => {
            // A main process that has already exited for good keeps its Exited.
            container.move_to(ContainerState::Ready);
        }
        Err(why) => {
            if let Some(main) = main {
                main.abort();
            }
            // A main process that exited before it was ready stays Exited: its exit status
            // says why, and the state must not depend on which task saw the exit first.
            container.fail(why);
        }
    }
}

/// Waits until `container` passes its ready check (at once when it has none), within its
/// timeout.
async fn await_ready(sandbox: &Sandbox, container: &Container) -> Result<(), String> {
    let Some(check) = &container.ready else {
        return Ok(());
    };
    let timeout = check
        .timeout_s
        .map_or(DEFAULT_READY_TIMEOUT, Duration::from_secs);
    let attempt = async {
        let mut wait = READY_FIRST;
        loop {
            if matches!(
                container.state(),
                ContainerState::Exited | ContainerState::Failed
            ) {
                return Err("its main process exited before it was ready".to_string());
            }
            let passed = match (&check.tcp_port, &check.command) {
                (Some(port), _) => sandbox.probe_tcp(*port).await?,
                (None, Some(command)) => {
                    let request = ExecRequest {
                        cmd: command.clone(),
                        timeout_s: 10,
                        ..ExecRequest::default()
                    };
                    run_to_exit(sandbox, container, request, 0, |_, _| {})
                        .await
                        .is_ok_and(|result| result.exit_code == 0)
                }
                (None, None) => true,
            };
            if passed {
                return Ok(());
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(READY_MAX);
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "its ready check did not pass within {} s",
            timeout.as_secs()
        )),
    }
}

/// Runs `container`'s main process, and again after each failure when its policy says so,
/// for as long as the sandbox lives.
async fn run_main(sandbox: Weak<Sandbox>, container: Arc<Container>) {
    let mut backoff = RESTART_FIRST;
    loop {
        let Some(strong) = sandbox.upgrade() else {
            return;
        };
        if container.is_removed() {
            return;
        }
        let request = ExecRequest {
            cmd: container.main.clone(),
            exec_id: MAIN_EXEC_ID.to_string(),
            ..ExecRequest::default()
        };
        let result = run_to_exit(&strong, &container, request, 0, |kind, payload| {
            container.log().push(kind, payload)
        })
        .await;
        if container.is_removed() {
            tracing::debug!(
                "container {}: removed, its main process ended",
                container.name
            );
            return;
        }
        let result = match result {
            Ok(result) => result,
            Err(why) if !strong.is_running() => {
                tracing::debug!("container {}: {why} (its sandbox ended)", container.name);
                return;
            }
            Err(why) => ExecResult::failed(format!("it was lost: {why}")),
        };
        let failed = result.exit_code != 0;
        container.status().last_exit = Some(result);
        if !failed || container.restart == RestartPolicy::No || !strong.is_running() {
            container.move_to(ContainerState::Exited);
            return;
        }
        drop(strong);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RESTART_MAX);
        container.status().restarts += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [ContainerState; 5] = [
        ContainerState::Waiting,
        ContainerState::Starting,
        ContainerState::Ready,
        ContainerState::Exited,
        ContainerState::Failed,
    ];

    #[test]
    fn an_ended_container_stays_ended_and_none_goes_back() {
        for to in ALL {
            assert!(!may_become(ContainerState::Exited, to), "Exited → {to:?}");
            assert!(!may_become(ContainerState::Failed, to), "Failed → {to:?}");
            assert!(!may_become(to, ContainerState::Waiting), "{to:?} → Waiting");
            assert!(!may_become(to, to), "{to:?} → itself");
        }
        assert!(!may_become(ContainerState::Ready, ContainerState::Starting));
        assert!(!may_become(ContainerState::Ready, ContainerState::Failed));
        let allowed = ALL
            .iter()
            .flat_map(|from| ALL.iter().map(move |to| (*from, *to)))
            .filter(|(from, to)| may_become(*from, *to))
            .count();
        assert_eq!(allowed, 6, "the table in may_become's documentation");
    }

    #[test]
    fn a_late_ready_or_failure_does_not_undo_an_exit() {
        let container = Container::new(
            0,
            ContainerPlan {
                name: "db".into(),
                image: "default".into(),
                env: BTreeMap::new(),
                defaults: None,
                accounts: Arc::new(ExecAccounts {
                    root: std::path::PathBuf::from("/nonexistent"),
                    image_sets_home: false,
                }),
                main: vec!["true".into()],
                restart: RestartPolicy::No,
                ready: None,
                depends_on: Vec::new(),
            },
        );
        assert!(
            !container.move_to(ContainerState::Ready),
            "not from Waiting"
        );
        assert!(container.move_to(ContainerState::Starting));
        assert!(container.move_to(ContainerState::Exited));
        assert!(!container.move_to(ContainerState::Ready));
        container.fail("its ready check did not pass".into());
        assert_eq!(container.state(), ContainerState::Exited);
        assert_eq!(
            container.info().error,
            "",
            "a refused failure leaves no error behind"
        );
    }

    #[test]
    fn the_log_keeps_the_latest_bytes_and_counts_the_rest() {
        let mut log = Log::default();
        let piece = vec![b'x'; 300 * 1024];
        for _ in 0..5 {
            log.push(FrameType::Stdout, &piece);
        }
        log.push(FrameType::Stderr, b"last");
        assert!(log.bytes <= LOG_LIMIT_BYTES, "{}", log.bytes);
        let kept: usize = log.frames.iter().map(|(_, p)| p.len()).sum();
        assert_eq!(kept as u64 + log.dropped, 5 * 300 * 1024 + 4);
        assert_eq!(log.bytes, kept + log.frames.len() * LOG_FRAME_COST);
        assert_eq!(
            log.frames.back().map(|(k, p)| (*k, p.clone())),
            Some((FrameType::Stderr, Bytes::from_static(b"last")))
        );
    }

    #[test]
    fn a_log_of_tiny_frames_keeps_fewer_of_them_not_more_memory() {
        let mut log = Log::default();
        for _ in 0..LOG_LIMIT_BYTES {
            log.push(FrameType::Stdout, b"x");
        }
        assert!(log.bytes <= LOG_LIMIT_BYTES, "{}", log.bytes);
        assert!(
            log.frames.len() <= LOG_LIMIT_BYTES / (1 + LOG_FRAME_COST),
            "{} frames kept",
            log.frames.len()
        );
        assert_eq!(
            log.frames.len() as u64 + log.dropped,
            LOG_LIMIT_BYTES as u64
        );
    }
}
