//! WebSocket exec, file transfer and authentication, end to end on the namespace backend.

use std::time::Duration;

use api_types::CreateSandbox;
use client::{ClientError, Endpoint};
use futures_util::{SinkExt, StreamExt};
use harness::TestDaemon;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};
use wire::{encode_frames, Decoder, Direction, ExecRequest, ExecResult, FrameType};

type Ws = tokio_tungstenite::WebSocketStream<UnixStream>;

async fn websocket(daemon: &TestDaemon, id: &str) -> Result<Ws, tungstenite::Error> {
    let stream = UnixStream::connect(&daemon.socket).await.expect("connect");
    let url = format!("ws://crucible/sandboxes/{id}/exec");
    tokio_tungstenite::client_async(url, stream)
        .await
        .map(|(ws, _)| ws)
}

/// Reads binary messages until the close frame; returns the decoded frames and the close code.
async fn read_session(ws: &mut Ws) -> (Vec<(FrameType, Vec<u8>)>, Option<CloseCode>) {
    let mut decoder = Decoder::new(Direction::GuestToHost);
    let mut frames = Vec::new();
    let mut close = None;
    while let Some(message) = tokio::time::timeout(Duration::from_secs(20), ws.next())
        .await
        .expect("the session progresses")
    {
        match message.expect("valid message") {
            Message::Binary(bytes) => {
                decoder.push(&bytes);
                while let Some(f) = decoder.next_frame().expect("valid frames") {
                    frames.push((f.frame_type, f.payload.to_vec()));
                }
            }
            Message::Close(frame) => {
                close = frame.map(|f| f.code);
                break;
            }
            _ => {}
        }
    }
    decoder
        .finish()
        .expect("exactly one exit frame, then nothing");
    (frames, close)
}

#[tokio::test]
async fn websocket_session_with_frames_split_and_packed_across_messages() {
    let daemon = TestDaemon::start();
    let id = daemon.sandbox().await;
    let mut ws = websocket(&daemon, &id).await.expect("upgrade");
    ws.send(Message::text(r#"{"cmd":["sh"]}"#))
        .await
        .expect("request");

    let mut first = Vec::new();
    encode_frames(FrameType::Stdin, b"cd /tmp; echo $PWD\n", &mut first);
    // One frame split over three messages.
    for piece in [&first[..3], &first[3..10], &first[10..]] {
        ws.send(Message::binary(piece.to_vec()))
            .await
            .expect("piece");
    }
    // Two frames packed into one message.
    let mut packed = Vec::new();
    encode_frames(FrameType::Stdin, b"echo two >&2\n", &mut packed);
    encode_frames(FrameType::StdinClose, b"", &mut packed);
    ws.send(Message::binary(packed)).await.expect("packed");

    let (frames, close) = read_session(&mut ws).await;
    let stream = |t: FrameType| -> Vec<u8> {
        frames
            .iter()
            .filter(|(ft, _)| *ft == t)
            .flat_map(|(_, p)| p.clone())
            .collect()
    };
    assert_eq!(stream(FrameType::Stdout), b"/tmp\n");
    assert_eq!(stream(FrameType::Stderr), b"two\n");
    let (last_type, last) = frames.last().expect("exit frame");
    assert_eq!(*last_type, FrameType::Exit);
    let result: ExecResult = serde_json::from_slice(last).expect("ExecResult");
    assert_eq!(result.exit_code, 0);
    assert_eq!(close, Some(CloseCode::Normal));
}

#[tokio::test]
async fn websocket_request_as_binary_and_invalid_request_closes_1008() {
    let daemon = TestDaemon::start();
    let id = daemon.sandbox().await;

    let mut ws = websocket(&daemon, &id).await.expect("upgrade");
    ws.send(Message::binary(br#"{"cmd":["echo","bin"]}"#.to_vec()))
        .await
        .expect("request");
    let (frames, close) = read_session(&mut ws).await;
    assert_eq!(frames[0], (FrameType::Stdout, b"bin\n".to_vec()));
    assert_eq!(close, Some(CloseCode::Normal));

    let mut ws = websocket(&daemon, &id).await.expect("upgrade");
    ws.send(Message::text(r#"{"cmd":[]}"#))
        .await
        .expect("request");
    match ws.next().await {
        Some(Ok(Message::Close(Some(frame)))) => {
            assert_eq!(frame.code, CloseCode::Policy);
            assert!(frame.reason.contains("cmd"), "{}", frame.reason);
        }
        other => panic!("expected close 1008, got {other:?}"),
    }
}

#[tokio::test]
async fn websocket_handshake_errors_are_plain_http() {
    let daemon = TestDaemon::start();
    let id = daemon.sandbox().await;
    for (target, status) in [("sb-0123456789abcdef", 404), ("bad-id", 400)] {
        match websocket(&daemon, target).await {
            Err(tungstenite::Error::Http(response)) => {
                assert_eq!(response.status().as_u16(), status)
            }
            other => panic!("{target}: expected HTTP {status}, got {other:?}"),
        }
    }
    let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
    let request =
        format!("GET /sandboxes/{id}/exec HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    assert!(response.starts_with("HTTP/1.1 426"), "{response}");
    assert!(
        response.contains(r#""code":"upgrade_required""#),
        "{response}"
    );
}

/// Builds a directory tree with text, binary, empty and nested files.
fn sample_tree(root: &std::path::Path) {
    std::fs::create_dir_all(root.join("sub/deeper")).expect("mkdir");
    std::fs::write(root.join("hello.txt"), b"hello\n").expect("write");
    std::fs::write(root.join("empty"), b"").expect("write");
    let binary: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(root.join("sub/blob.bin"), &binary).expect("write");
    std::fs::write(root.join("sub/deeper/note"), b"deep\n").expect("write");
}

#[tokio::test]
async fn files_round_trip_a_directory_tree_byte_for_byte() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = daemon.sandbox().await;
    let local = tempfile::tempdir().expect("tempdir");
    let tree = local.path().join("tree");
    sample_tree(&tree);
    let result = c.put_path(&id, &tree, "/work").await.expect("upload");
    assert_eq!(result.files, 4, "{result:?}");
    assert!(result.refused.is_none());
    for rel in ["hello.txt", "empty", "sub/blob.bin", "sub/deeper/note"] {
        let mut downloaded = Vec::new();
        let n = c
            .get_file(&id, &format!("/work/tree/{rel}"), &mut downloaded)
            .await
            .expect("download");
        let original = std::fs::read(tree.join(rel)).expect("read");
        assert_eq!(n as usize, original.len(), "{rel}");
        assert!(downloaded == original, "{rel} differs");
    }
}

#[tokio::test]
async fn files_refuse_escapes_and_report_missing_files() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = daemon.sandbox().await;

    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    header.set_mode(0o777);
    builder
        .append_link(&mut header, "escape", "/etc")
        .expect("symlink entry");
    let mut header = tar::Header::new_gnu();
    header.set_size(4);
    header.set_mode(0o644);
    builder
        .append_data(&mut header, "escape/owned", &b"pwnd"[..])
        .expect("file entry");
    let archive = builder.into_inner().expect("tar");
    match c.put_tar(&id, "/work", std::io::Cursor::new(archive)).await {
        Err(ClientError::Api {
            status: 400,
            code,
            message,
        }) => {
            assert_eq!(code, "refused_entry");
            assert!(message.contains("escape"), "{message}");
        }
        other => panic!("expected the escape to be refused, got {other:?}"),
    }
    let check = c
        .exec_collect(&id, &ExecRequest::new(["sh", "-c", "test ! -e /etc/owned"]))
        .await
        .expect("exec");
    assert_eq!(
        check.result.exit_code, 0,
        "nothing was written outside /work"
    );

    let mut sink = Vec::new();
    for (path, status) in [("/no/such/file", 404), ("/tmp", 400), ("relative", 400)] {
        match c.get_file(&id, path, &mut sink).await {
            Err(ClientError::Api { status: got, .. }) => assert_eq!(got, status, "{path}"),
            other => panic!("{path}: expected HTTP {status}, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn tcp_requires_a_bearer_key() {
    let daemon = TestDaemon::start_with(|c| {
        c.tcp = Some("127.0.0.1:0".parse().expect("addr"));
        c.api_keys = harness::keys(&["sekrit-key"]);
    });
    let addr = daemon.tcp.expect("tcp address");
    let endpoint = Endpoint::Tcp(addr.to_string());
    let anonymous = client::Client::new(endpoint.clone());
    let wrong = client::Client::new(endpoint.clone()).with_api_key("sekrit-kez");
    let right = client::Client::new(endpoint).with_api_key("sekrit-key");
    for c in [&anonymous, &wrong] {
        match c.list().await {
            Err(ClientError::Api {
                status: 401, code, ..
            }) => assert_eq!(code, "unauthorized"),
            other => panic!("expected 401, got {other:?}"),
        }
    }
    let id = right
        .create(&CreateSandbox::default())
        .await
        .expect("create with the key")
        .id;
    let out = right
        .exec_collect(&id, &ExecRequest::new(["echo", "authorized"]))
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"authorized\n");
    match wrong.interactive(&id, &ExecRequest::new(["cat"])).await {
        Err(ClientError::Api { status: 401, .. }) => {}
        other => panic!("the hijack path must check the key too, got {other:?}"),
    }
    // The daemon's keys never reach the sandbox.
    let env = right
        .exec_collect(&id, &ExecRequest::new(["env"]))
        .await
        .expect("env");
    assert!(!String::from_utf8_lossy(&env.stdout).contains("sekrit"));

    let mut raw = TcpStream::connect(addr).await.expect("connect");
    raw.write_all(b"GET /sandboxes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("send");
    let mut response = String::new();
    raw.read_to_string(&mut response).await.expect("read");
    assert!(response.starts_with("HTTP/1.1 401"), "{response}");
    assert!(response.contains("application/json"), "{response}");
}

#[test]
fn tcp_without_keys_is_refused_at_startup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = api::ServeConfig::new(harness::image_dir());
    config.unix_socket = Some(dir.path().join("s.sock"));
    config.engine.state_dir = dir.path().join("state");
    config.tcp = Some("127.0.0.1:0".parse().expect("addr"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    match runtime.block_on(api::Server::bind(config)) {
        Err(api::ServeError::TcpWithoutKeys(_)) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
}
