//! The daemon's whole HTTP → agent path, without root: a real daemon on the host-process
//! backend (the agent as a plain process, `guest-init --listen unix:`), driven through every
//! transport. The agent binary is built by these tests (`cargo build -p guest-init`) if it is
//! not there yet.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use api::server::BackgroundDaemon;
use api::ServeConfig;
use api_types::{BackendKind, CreateSandbox};
use engine::backend::host_process::HostProcessBackend;
use engine::backend::Backends;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_tungstenite::tungstenite::Message;
use wire::{Decoder, Direction, ExecRequest, ExecResult, FrameType};

/// The agent binary: `$CRUCIBLE_AGENT_BINARY`, else built once per test run into this test's
/// own target directory.
fn agent_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(agent) = std::env::var_os("CRUCIBLE_AGENT_BINARY") {
                return PathBuf::from(agent);
            }
            // target/<profile>/deps/<this test> → target/<profile>, target.
            let exe = std::env::current_exe().expect("the test's own path");
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("target/<profile>/deps");
            let target_dir = profile_dir.parent().expect("target");
            let release = profile_dir.file_name().is_some_and(|n| n == "release");
            let mut cargo = Command::new(env!("CARGO"));
            cargo
                .args([
                    "build",
                    "--quiet",
                    "--package",
                    "guest-init",
                    "--bin",
                    "guest-init",
                ])
                .arg("--target-dir")
                .arg(target_dir)
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if release {
                cargo.arg("--release");
            }
            let status = cargo.status().expect("running cargo to build the agent");
            assert!(status.success(), "building guest-init failed: {status}");
            let agent = profile_dir.join("guest-init");
            assert!(agent.is_file(), "no agent at {}", agent.display());
            agent
        })
        .clone()
}

struct Daemon {
    daemon: BackgroundDaemon,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(configure: impl FnOnce(&mut ServeConfig)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = ServeConfig::new(dir.path().join("no-image"));
        config.unix_socket = Some(dir.path().join("crucible.sock"));
        config.engine.state_dir = dir.path().join("state");
        config.engine.storage.data_dir = dir.path().join("data");
        config.engine.default_backend = Some(BackendKind::Process);
        configure(&mut config);
        let backend = HostProcessBackend::new(
            agent_binary(),
            config.engine.state_dir.clone(),
            Duration::from_secs(10),
        );
        let backends = Backends::new(vec![Arc::new(backend)]);
        let daemon = BackgroundDaemon::start(config, Some(backends)).expect("the daemon starts");
        Daemon { daemon, _dir: dir }
    }

    fn socket(&self) -> PathBuf {
        self.daemon.socket.clone().expect("a socket")
    }

    fn client(&self) -> client::Client {
        client::Client::new(client::Endpoint::Unix(self.socket()))
    }

    async fn sandbox(&self) -> String {
        let info = self
            .client()
            .create(&CreateSandbox::default())
            .await
            .expect("create");
        assert_eq!(info.backend, BackendKind::Process);
        info.id
    }

    async fn metric(&self, name: &str) -> f64 {
        let text = self.client().metrics().await.expect("metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    }
}

fn decode(stream: &[u8]) -> (Vec<u8>, Vec<u8>, ExecResult) {
    let mut decoder = Decoder::new(Direction::GuestToHost);
    decoder.push(stream);
    let (mut out, mut err, mut result) = (Vec::new(), Vec::new(), None);
    while let Some(frame) = decoder.next_frame().expect("a valid frame stream") {
        match frame.frame_type {
            FrameType::Stdout => out.extend_from_slice(frame.payload),
            FrameType::Stderr => err.extend_from_slice(frame.payload),
            FrameType::Exit => {
                result = Some(serde_json::from_slice(frame.payload).expect("exit JSON"))
            }
            other => panic!("unexpected {other} frame"),
        }
    }
    (out, err, result.expect("an exit frame"))
}

#[tokio::test]
async fn one_shot_exec_runs_through_the_daemon_to_the_agent() {
    let daemon = Daemon::start(|_| {});
    let id = daemon.sandbox().await;
    let out = daemon
        .client()
        .exec_collect(
            &id,
            &ExecRequest::new(["sh", "-c", "echo out; echo err >&2; exit 3"]),
        )
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.result.exit_code, 3);
    daemon.client().delete(&id).await.expect("delete");
}

#[tokio::test]
async fn every_transport_counts_its_exec_in_the_metrics() {
    let daemon = Daemon::start(|_| {});
    let id = daemon.sandbox().await;
    let client = daemon.client();
    let request = ExecRequest::new(["sh", "-c", "head -c 1000 /dev/zero"]);

    // One-shot.
    client.exec_collect(&id, &request).await.expect("one-shot");
    // Hijacked, with stdin.
    let mut session = client
        .interactive(&id, &ExecRequest::new(["cat"]))
        .await
        .expect("hijack");
    session.send_stdin(b"hello").await.expect("stdin");
    session.close_stdin().await.expect("close stdin");
    let mut echoed = Vec::new();
    while let Some(event) = session.next_event().await {
        if let client::ExecEvent::Stdout(bytes) = event.expect("event") {
            echoed.extend_from_slice(&bytes);
        }
    }
    assert_eq!(echoed, b"hello");
    // WebSocket.
    let stream = UnixStream::connect(daemon.socket()).await.expect("connect");
    let url = format!("ws://localhost/sandboxes/{id}/exec");
    let (mut ws, _) = tokio_tungstenite::client_async(url, stream)
        .await
        .expect("upgrade");
    ws.send(Message::text(
        serde_json::to_string(&request).expect("json"),
    ))
    .await
    .expect("send the request");
    let mut frames = Vec::new();
    while let Some(message) = ws.next().await {
        match message.expect("message") {
            Message::Binary(bytes) => frames.extend_from_slice(&bytes),
            Message::Close(_) => break,
            _ => {}
        }
    }
    let (out, _, result) = decode(&frames);
    assert_eq!((out.len(), result.exit_code), (1000, 0));

    assert_eq!(daemon.metric("crucible_execs_total").await, 3.0);
    assert_eq!(
        daemon.metric("crucible_exec_duration_seconds_count").await,
        3.0,
        "each transport's exec reached its exit frame and was timed"
    );
    // 1000 bytes of stdout twice (one-shot, WebSocket) plus frame headers and exit frames.
    assert!(daemon.metric("crucible_stream_bytes_total").await > 2000.0);
    assert_eq!(
        daemon.metric("crucible_stdin_bytes_total").await,
        8.0 + 5.0 + 8.0
    );
}

#[tokio::test]
async fn domain_errors_reach_http_as_statuses_and_websocket_as_close_codes() {
    let daemon = Daemon::start(|c| c.engine.limits.max_execs_per_sandbox = 1);
    let id = daemon.sandbox().await;
    let client = daemon.client();
    let missing = "sb-0000000000000000";
    let err = client
        .exec_collect(missing, &ExecRequest::new(["true"]))
        .await
        .expect_err("no such sandbox");
    assert!(err.to_string().contains("404"), "{err}");
    let err = client
        .exec_collect("not-an-id", &ExecRequest::new(["true"]))
        .await
        .expect_err("not an id");
    assert!(err.to_string().contains("400"), "{err}");

    // The one exec slot taken, a second exec is 429 over HTTP and 1013 over WebSocket.
    let mut busy = client
        .interactive(&id, &ExecRequest::new(["cat"]))
        .await
        .expect("hijack");
    let err = client
        .exec_collect(&id, &ExecRequest::new(["true"]))
        .await
        .expect_err("over the limit");
    assert!(err.to_string().contains("429"), "{err}");
    let stream = UnixStream::connect(daemon.socket()).await.expect("connect");
    let url = format!("ws://localhost/sandboxes/{id}/exec");
    let (mut ws, _) = tokio_tungstenite::client_async(url, stream)
        .await
        .expect("upgrade");
    ws.send(Message::text(r#"{"cmd":["true"]}"#))
        .await
        .expect("send");
    let close = loop {
        match ws.next().await.expect("a message").expect("message") {
            Message::Close(frame) => break frame.expect("a close frame"),
            _ => continue,
        }
    };
    assert_eq!(u16::from(close.code), 1013, "{close:?}");
    assert!(close.reason.contains("limit"), "{close:?}");
    busy.close_stdin().await.expect("close stdin");
    while busy.next_event().await.is_some() {}
}

/// Sends a head cut short and returns the connection, held open.
async fn idle_connection(socket: &Path) -> UnixStream {
    let mut stream = UnixStream::connect(socket).await.expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    stream
}

#[tokio::test]
async fn connections_past_the_cap_get_503_and_the_cap_frees_when_they_close() {
    let daemon = Daemon::start(|c| c.max_connections = Some(4));
    let socket = daemon.socket();
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(idle_connection(&socket).await);
    }
    // Each connection is admitted when accepted; give the accept loop a moment to take all 4.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut refused = UnixStream::connect(&socket).await.expect("connect");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), refused.read_to_end(&mut answer))
        .await
        .expect("answered at once")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("too_many_connections"), "{answer}");

    // A closed connection frees its place (once the daemon has seen it close).
    drop(idle.pop());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let health = loop {
        match daemon.client().health().await {
            Ok(health) => break health,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never admitted: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(health["status"], "ok");
    // Every place freed (once the daemon has seen them close), the refusal was counted.
    drop(idle);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while daemon.client().metrics().await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "places never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(daemon.metric("crucible_connections_refused_total").await >= 1.0);
}

#[tokio::test]
async fn a_kept_alive_connection_serves_more_requests_after_a_one_shot_exec() {
    let daemon = Daemon::start(|_| {});
    let id = daemon.sandbox().await;
    let mut stream = UnixStream::connect(daemon.socket()).await.expect("connect");
    let body = r#"{"cmd":["echo","first"]}"#;
    // The exec and the next request pipelined: both arrive before the first is answered.
    let requests = format!(
        "POST /sandboxes/{id}/exec HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}\
         GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(requests.as_bytes()).await.expect("write");
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply))
        .await
        .expect("both answered")
        .expect("read");
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("first\n"), "{text}");
    let second = text
        .find("\r\n0\r\n\r\n")
        .map(|i| &text[i + 7..])
        .expect("a chunked end");
    assert!(second.starts_with("HTTP/1.1 200 OK"), "{second}");
    assert!(second.contains("\"status\":\"ok\""), "{second}");
}

#[tokio::test]
async fn a_silent_command_still_gets_its_response_head_at_once() {
    let daemon = Daemon::start(|_| {});
    let id = daemon.sandbox().await;
    // Found by the soak test: the head waited for the first frames, and a client waiting
    // for the head of `sleep` (to stream its output later) waited for ever.
    let stream = tokio::time::timeout(
        Duration::from_secs(5),
        daemon
            .client()
            .exec(&id, &ExecRequest::new(["sleep", "30"])),
    )
    .await
    .expect("the head arrives while the command is silent")
    .expect("exec");
    drop(stream);
}
