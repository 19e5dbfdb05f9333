//! The daemon's HTTP API end to end on the namespace backend: real sockets, real sandboxes.

use std::time::Duration;

use api_types::{BackendKind, CreateSandbox, SandboxState};
use client::{ClientError, ExecEvent};
use harness::TestDaemon;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use wire::{encode_frames, Decoder, Direction, ExecRequest, ExecResult, FrameType};

fn exec(cmd: &[&str]) -> ExecRequest {
    ExecRequest::new(cmd.iter().copied())
}

/// Decodes a whole response stream, requiring exactly one exit frame at the end.
fn decode_response(bytes: &[u8]) -> (Vec<(FrameType, Vec<u8>)>, ExecResult) {
    let mut decoder = Decoder::new(Direction::GuestToHost);
    decoder.push(bytes);
    let mut frames = Vec::new();
    while let Some(f) = decoder.next_frame().expect("valid frame stream") {
        frames.push((f.frame_type, f.payload.to_vec()));
    }
    decoder
        .finish()
        .expect("the stream ends cleanly after one exit frame");
    let (last_type, last) = frames.pop().expect("at least the exit frame");
    assert_eq!(last_type, FrameType::Exit);
    (frames, serde_json::from_slice(&last).expect("ExecResult"))
}

#[tokio::test]
async fn sandbox_lifecycle_create_get_list_delete() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let created = c
        .create(&CreateSandbox::default())
        .await
        .expect("create {}");
    assert_eq!(created.state, SandboxState::Running);
    assert_eq!(created.backend, BackendKind::Namespace);
    assert!(created.timings.create_to_ready_ms > 0.0);
    let fetched = c.get(&created.id).await.expect("get");
    assert_eq!(fetched.id, created.id);
    let listed = c.list().await.expect("list");
    assert_eq!(
        listed.iter().map(|s| &s.id).collect::<Vec<_>>(),
        [&created.id]
    );
    c.delete(&created.id).await.expect("delete");
    match c.get(&created.id).await {
        Err(ClientError::Api {
            status: 404, code, ..
        }) => assert_eq!(code, "not_found"),
        other => panic!("expected 404 after delete, got {other:?}"),
    }
    match c.get("not-an-id").await {
        Err(ClientError::Api { status: 400, .. }) => {}
        other => panic!("expected 400 for a malformed id, got {other:?}"),
    }
}

#[tokio::test]
async fn create_rejects_bad_requests_with_the_json_envelope() {
    let daemon = TestDaemon::start();
    for (body, needle) in [
        (r#"{"memory_mib": 1}"#, "memory_mib"),
        (r#"{"vcpus": 0}"#, "vcpus"),
        (r#"{"image": "ubuntu"}"#, "image"),
        (r#"{"colour": "blue"}"#, "colour"),
        ("{not json", "not a valid"),
    ] {
        let request = format!(
            "POST /sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let response = harness::raw_exchange(&daemon, request.as_bytes()).await;
        assert!(response.starts_with("HTTP/1.1 400"), "{body}: {response}");
        assert!(response.contains("application/json"), "{response}");
        assert!(
            response.contains(r#""code":"invalid_request""#),
            "{response}"
        );
        assert!(response.contains(needle), "{body}: {response}");
    }
}

#[tokio::test]
async fn exec_streams_output_exit_code_env_and_cwd() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let sandbox = c
        .create(&CreateSandbox {
            env: [("FROM_SANDBOX".into(), "yes".into())].into(),
            ..Default::default()
        })
        .await
        .expect("create");
    let output = c
        .exec_collect(
            &sandbox.id,
            &ExecRequest {
                env: [("FROM_EXEC".into(), "also".into())].into(),
                cwd: "/tmp".into(),
                ..exec(&[
                    "sh",
                    "-c",
                    "echo out; echo err >&2; echo $FROM_SANDBOX $FROM_EXEC; pwd; exit 3",
                ])
            },
        )
        .await
        .expect("exec");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "out\nyes also\n/tmp\n"
    );
    assert_eq!(String::from_utf8_lossy(&output.stderr), "err\n");
    assert_eq!(output.result.exit_code, 3);
    assert!(output.result.usage.is_some());

    let missing = c
        .exec_collect(&sandbox.id, &exec(&["no-such-command"]))
        .await
        .expect("a spawn error is reported in band");
    assert_eq!(missing.result.exit_code, -1);
    assert!(!missing.result.error.is_empty());
}

#[tokio::test]
async fn exec_validation_errors_come_back_before_streaming() {
    let daemon = TestDaemon::start();
    let id = daemon.sandbox().await;
    let cases = [
        (
            format!("/sandboxes/{id}/exec"),
            "{\"cmd\":".to_string(),
            400,
            "invalid_request",
        ),
        (
            format!("/sandboxes/{id}/exec"),
            r#"{"cmd":[]}"#.to_string(),
            400,
            "invalid_request",
        ),
        (
            format!("/sandboxes/{id}/exec"),
            r#"{"cmd":["true"],"timeout":1}"#.to_string(),
            400,
            "invalid_request",
        ),
        (
            format!("/sandboxes/{id}/exec"),
            r#"{"cmd":["a\u0000b"]}"#.to_string(),
            400,
            "invalid_request",
        ),
        (
            format!("/sandboxes/{id}/exec"),
            r#"{"cmd":["true"],"cwd":"tmp"}"#.to_string(),
            400,
            "invalid_request",
        ),
        (
            "/sandboxes/sb-0123456789abcdef/exec".to_string(),
            r#"{"cmd":["true"]}"#.to_string(),
            404,
            "not_found",
        ),
        (
            "/sandboxes/nope/exec".to_string(),
            r#"{"cmd":["true"]}"#.to_string(),
            400,
            "invalid_request",
        ),
    ];
    for (path, body, status, code) in cases {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let response = harness::raw_exchange(&daemon, request.as_bytes()).await;
        assert!(
            response.starts_with(&format!("HTTP/1.1 {status}")),
            "{body}: {response}"
        );
        assert!(
            response.contains(&format!(r#""code":"{code}""#)),
            "{body}: {response}"
        );
    }
}

#[tokio::test]
async fn one_shot_exec_is_an_octet_stream_of_frames_with_one_exit_frame() {
    let daemon = TestDaemon::start();
    let id = daemon.sandbox().await;
    let body = r#"{"cmd":["sh","-c","head -c 200000 /dev/zero; echo done >&2"]}"#;
    let request = format!(
        "POST /sandboxes/{id}/exec HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
    let head = String::from_utf8_lossy(&raw[..head_end]).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        head.contains("content-type: application/octet-stream"),
        "{head}"
    );
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    let body = dechunk(&raw[head_end..]);
    let (frames, result) = decode_response(&body);
    let stdout: usize = frames
        .iter()
        .filter(|(t, _)| *t == FrameType::Stdout)
        .map(|(_, p)| p.len())
        .sum();
    assert_eq!(stdout, 200_000);
    assert!(frames.iter().all(|(_, p)| p.len() <= wire::MAX_PAYLOAD));
    assert_eq!(result.exit_code, 0);
}

/// Decodes an HTTP/1.1 chunked body.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size = usize::from_str_radix(
            std::str::from_utf8(&body[..line_end])
                .expect("ascii")
                .trim(),
            16,
        )
        .expect("hex size");
        body = &body[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[tokio::test]
async fn hijacked_session_over_a_raw_socket_keeps_shell_state() {
    let daemon = TestDaemon::start();
    let id = daemon.sandbox().await;
    let body = r#"{"cmd":["sh"]}"#;
    let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
    let head = format!(
        "POST /sandboxes/{id}/exec?stdin=1 HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("send");
    let mut input = Vec::new();
    encode_frames(FrameType::Stdin, b"cd /tmp\n", &mut input);
    encode_frames(FrameType::Stdin, b"echo $PWD\n", &mut input);
    encode_frames(FrameType::Stdin, b"echo oops >&2; exit 5\n", &mut input);
    encode_frames(FrameType::StdinClose, b"", &mut input);
    stream.write_all(&input).await.expect("stdin frames");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut raw))
        .await
        .expect("session ends")
        .expect("read");
    let expected_head = b"HTTP/1.1 200 OK\r\n";
    assert!(
        raw.starts_with(expected_head),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
    let (frames, result) = decode_response(&raw[head_end..]);
    let stdout: Vec<u8> = frames
        .iter()
        .filter(|(t, _)| *t == FrameType::Stdout)
        .flat_map(|(_, p)| p.clone())
        .collect();
    let stderr: Vec<u8> = frames
        .iter()
        .filter(|(t, _)| *t == FrameType::Stderr)
        .flat_map(|(_, p)| p.clone())
        .collect();
    assert_eq!(stdout, b"/tmp\n");
    assert_eq!(stderr, b"oops\n");
    assert_eq!(result.exit_code, 5);
}

#[tokio::test]
async fn client_session_round_trips_stdin_and_close() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = daemon.sandbox().await;
    let mut session = c.interactive(&id, &exec(&["cat"])).await.expect("session");
    session.send_stdin(b"ping\n").await.expect("stdin");
    match session.next_event().await {
        Some(Ok(ExecEvent::Stdout(bytes))) => assert_eq!(&bytes[..], b"ping\n"),
        other => panic!("expected the echo, got {other:?}"),
    }
    session.close_stdin().await.expect("close");
    match session
        .next_event()
        .await
        .expect("the exit event")
        .expect("valid")
    {
        ExecEvent::Exit(result) => assert_eq!(result.exit_code, 0),
        other => panic!("unexpected {other:?}"),
    }
    assert!(session.next_event().await.is_none());
}

#[tokio::test]
async fn docker_style_upgrade_tcp_gets_101_then_the_raw_stream() {
    let daemon = TestDaemon::start();
    let id = daemon.sandbox().await;
    let body = r#"{"cmd":["echo","upgraded"]}"#;
    let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
    let head = format!(
        "POST /sandboxes/{id}/exec?stdin=1 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("send");
    let mut input = Vec::new();
    encode_frames(FrameType::StdinClose, b"", &mut input);
    stream.write_all(&input).await.expect("stdin_close");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut raw))
        .await
        .expect("ends")
        .expect("read");
    assert!(
        raw.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
    let (frames, result) = decode_response(&raw[head_end..]);
    assert_eq!(frames, vec![(FrameType::Stdout, b"upgraded\n".to_vec())]);
    assert_eq!(result.exit_code, 0);
}

#[tokio::test]
async fn exec_over_the_concurrency_cap_is_429() {
    let daemon = TestDaemon::start_with(|c| c.engine.limits.max_execs_per_sandbox = 1);
    let c = daemon.client();
    let id = daemon.sandbox().await;
    let mut first = c
        .interactive(&id, &exec(&["cat"]))
        .await
        .expect("first exec");
    match c.exec_collect(&id, &exec(&["true"])).await {
        Err(ClientError::Api {
            status: 429, code, ..
        }) => assert_eq!(code, "too_many_requests"),
        other => panic!("expected 429, got {other:?}"),
    }
    first.close_stdin().await.expect("close");
    while let Some(event) = first.next_event().await {
        event.expect("valid");
    }
    c.exec_collect(&id, &exec(&["true"]))
        .await
        .expect("a slot is free again");
}

#[tokio::test]
async fn healthz_and_metrics() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let health = c.health().await.expect("healthz");
    assert_eq!(health["status"], "ok");
    let id = daemon.sandbox().await;
    c.exec_collect(&id, &exec(&["echo", "x"]))
        .await
        .expect("exec");
    let metrics = c.metrics().await.expect("metrics");
    for needle in [
        "crucible_sandboxes{state=\"running\"} 1",
        "crucible_execs_total 1",
        "crucible_exec_duration_seconds_count 1",
        "crucible_stream_bytes_total",
    ] {
        assert!(metrics.contains(needle), "{needle} missing from\n{metrics}");
    }
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_json() {
    let daemon = TestDaemon::start();
    let response = harness::raw_exchange(
        &daemon,
        b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 404"), "{response}");
    assert!(response.contains(r#""code":"not_found""#), "{response}");
    let response = harness::raw_exchange(
        &daemon,
        b"PUT /sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 405"), "{response}");
    assert!(
        response.contains(r#""code":"method_not_allowed""#),
        "{response}"
    );
}

/// The entries of a tar archive: name → (type, mode, mtime, contents or link target).
fn entries(
    archive: &[u8],
) -> std::collections::BTreeMap<String, (tar::EntryType, u32, u64, Vec<u8>)> {
    let mut out = std::collections::BTreeMap::new();
    for entry in tar::Archive::new(archive).entries().expect("an archive") {
        let mut entry = entry.expect("an entry");
        let name = entry.path().expect("a name").to_string_lossy().into_owned();
        let header = entry.header().clone();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).expect("its data");
        if let Ok(Some(link)) = header.link_name() {
            data = link.to_string_lossy().into_owned().into_bytes();
        }
        out.insert(
            name,
            (
                header.entry_type(),
                header.mode().expect("mode") & 0o7777,
                header.mtime().expect("mtime"),
                data,
            ),
        );
    }
    out
}

#[tokio::test]
async fn a_directory_downloads_as_a_tar_stream_with_modes_times_and_links() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = daemon.sandbox().await;
    let (_, err, code) = harness::sh(
        &c,
        &id,
        "mkdir -p /work/build/bin /work/build/empty && printf 'tool' > /work/build/bin/tool && \
         chmod 0755 /work/build/bin/tool && touch -d '2020-01-02 03:04:05' /work/build/bin/tool && \
         ln -s bin/tool /work/build/run && head -c 300000 /dev/urandom > /work/build/big && \
         chmod 0700 /work/build/empty && rm /bin/tar",
    )
    .await;
    assert_eq!(code, 0, "{err}");

    let mut archive = Vec::new();
    let size = c
        .download_tree(&id, "/work/build", &mut archive)
        .await
        .expect("the archive");
    assert_eq!(size, archive.len() as u64);
    let got = entries(&archive);
    let names: Vec<&str> = got.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [".", "big", "bin", "bin/tool", "empty", "run"],
        "{names:?}"
    );
    let (kind, mode, mtime, data) = &got["bin/tool"];
    assert_eq!(
        (*kind, *mode, *mtime),
        (tar::EntryType::Regular, 0o755, 1_577_934_245)
    );
    assert_eq!(data, b"tool");
    assert_eq!(got["run"].0, tar::EntryType::Symlink);
    assert_eq!(got["run"].3, b"bin/tool");
    assert_eq!(got["empty"].1, 0o700);
    assert_eq!(got["big"].3.len(), 300_000);
    let mut big = Vec::new();
    c.get_file(&id, "/work/build/big", &mut big)
        .await
        .expect("big");
    assert_eq!(got["big"].3, big, "the archive holds the file's bytes");

    // One file asked as a tar: one entry, named after it.
    let mut one = Vec::new();
    c.download_tree(&id, "/work/build/bin/tool", &mut one)
        .await
        .expect("a file as a tar");
    assert_eq!(entries(&one).keys().collect::<Vec<_>>(), ["tool"]);

    // Without the Accept header a directory is refused, and the message says how to ask.
    let err = c
        .get_file(&id, "/work/build", &mut Vec::new())
        .await
        .expect_err("a directory is not a file");
    match err {
        ClientError::Api {
            status,
            code,
            message,
            ..
        } => {
            assert_eq!((status, code.as_str()), (400, "is_a_directory"));
            assert!(message.contains("Accept: application/x-tar"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let err = c
        .download_tree(&id, "/work/missing", &mut Vec::new())
        .await
        .expect_err("missing");
    assert!(
        matches!(err, ClientError::Api { status: 404, .. }),
        "{err:?}"
    );

    // An archive the agent cannot finish is cut short, never handed over as whole: a tree
    // deeper than the agent walks.
    let deep = "/d".repeat(300);
    let (_, err, code) = harness::sh(&c, &id, &format!("mkdir -p /work/deep{deep}")).await;
    assert_eq!(code, 0, "{err}");
    let mut partial = Vec::new();
    let err = c
        .download_tree(&id, "/work/deep", &mut partial)
        .await
        .expect_err("a cut archive is an error");
    assert!(err.to_string().contains("cut short"), "{err}");
    // The sandbox is still usable after.
    let (out, _, code) = harness::sh(&c, &id, "echo ok").await;
    assert_eq!((out.trim(), code), ("ok", 0));
}
