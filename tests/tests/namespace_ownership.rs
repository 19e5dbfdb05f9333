//! Per-key sandbox ownership, end to end: a sandbox belongs to the key that created it; every
//! other key gets the 404 of a missing sandbox on every endpoint and transport, and does not
//! see it listed or in metrics; the admin key and the Unix socket without a key see everything.

use std::net::SocketAddr;
use std::time::Duration;

use api_types::CreateSandbox;
use client::{Client, ClientError, Endpoint, ExecEvent};
use futures_util::{SinkExt, StreamExt};
use harness::TestDaemon;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};
use wire::{Decoder, Direction, ExecRequest, ExecResult, FrameType};

const ALICE: &str = "alice-key-3f9a1c0e7d";
const BOB: &str = "bob-key-8e21b4d6aa";
const ADMIN: &str = "admin-key-5c7e09f1b2";
/// A well-formed id no sandbox has.
const MISSING: &str = "sb-0123456789abcdef";

fn daemon() -> TestDaemon {
    TestDaemon::start_with(|c| {
        c.tcp = Some("127.0.0.1:0".parse().expect("addr"));
        c.api_keys = api::ApiKeys::parse(&format!("alice:{ALICE},bob:{BOB},ops:{ADMIN}"))
            .and_then(|keys| keys.with_admin("ops"))
            .expect("valid keys");
    })
}

fn tcp_client(daemon: &TestDaemon, key: &str) -> Client {
    let addr = daemon.tcp.expect("tcp address");
    Client::new(Endpoint::Tcp(addr.to_string())).with_api_key(key)
}

/// Asserts `result` is the 404 of a missing sandbox, and returns its message.
fn expect_not_found<T>(result: Result<T, ClientError>, what: &str) -> String {
    match result {
        Err(ClientError::Api {
            status: 404,
            code,
            message,
        }) => {
            assert_eq!(code, "not_found", "{what}");
            message
        }
        Err(other) => panic!("{what}: expected 404 not_found, got {other:?}"),
        Ok(_) => panic!("{what}: expected 404 not_found, got a success"),
    }
}

/// Sends one raw request on a fresh connection and reads the whole answer.
async fn raw<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, request: &[u8]) -> String {
    stream.write_all(request).await.expect("send");
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut response))
        .await
        .expect("an answer in time")
        .expect("read");
    String::from_utf8_lossy(&response).into_owned()
}

async fn raw_tcp(addr: SocketAddr, request: &str) -> String {
    raw(
        TcpStream::connect(addr).await.expect("connect"),
        request.as_bytes(),
    )
    .await
}

/// An answer with the id and the date (the one header that varies) taken out, so that answers
/// about two ids can be compared byte for byte.
fn normalized(response: &str, id: &str) -> String {
    response
        .split("\r\n")
        .filter(|line| !line.to_ascii_lowercase().starts_with("date:"))
        .collect::<Vec<_>>()
        .join("\r\n")
        .replace(id, "<ID>")
}

/// Every request shape that names a sandbox, as raw HTTP with `key`.
fn raw_requests(id: &str, key: &str) -> Vec<(&'static str, String)> {
    let auth = format!("Authorization: Bearer {key}\r\n");
    let exec = r#"{"cmd":["echo","hi"]}"#;
    vec![
        (
            "GET",
            format!("GET /sandboxes/{id} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"),
        ),
        (
            "DELETE",
            format!(
                "DELETE /sandboxes/{id} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
            ),
        ),
        (
            "exec",
            format!(
                "POST /sandboxes/{id}/exec HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{exec}",
                exec.len()
            ),
        ),
        (
            "exec ?stdin=1 (hijack)",
            format!(
                "POST /sandboxes/{id}/exec?stdin=1 HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\n\r\n{exec}",
                exec.len()
            ),
        ),
        (
            "exec ?stdin=1 + Upgrade: tcp",
            format!(
                "POST /sandboxes/{id}/exec?stdin=1 HTTP/1.1\r\nHost: x\r\n{auth}Connection: Upgrade, close\r\nUpgrade: tcp\r\nContent-Length: {}\r\n\r\n{exec}",
                exec.len()
            ),
        ),
        (
            "WebSocket",
            format!(
                "GET /sandboxes/{id}/exec HTTP/1.1\r\nHost: x\r\n{auth}Connection: Upgrade, close\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
            ),
        ),
        (
            "files GET",
            format!(
                "GET /sandboxes/{id}/files?path=/etc/hostname HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
            ),
        ),
        (
            "files POST",
            format!(
                "POST /sandboxes/{id}/files?path=/tmp HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
            ),
        ),
        (
            "execs",
            format!("GET /sandboxes/{id}/execs HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"),
        ),
        (
            "exec status",
            format!(
                "GET /sandboxes/{id}/execs/owned-job HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
            ),
        ),
        (
            "exec attach",
            format!(
                "POST /sandboxes/{id}/execs/owned-job/attach HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
            ),
        ),
        (
            "exec DELETE",
            format!(
                "DELETE /sandboxes/{id}/execs/owned-job HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
            ),
        ),
    ]
}

async fn websocket_tcp(
    addr: SocketAddr,
    id: &str,
    key: &str,
) -> Result<tokio_tungstenite::WebSocketStream<TcpStream>, tungstenite::Error> {
    let mut request = format!("ws://{addr}/sandboxes/{id}/exec")
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {key}").parse().expect("header"),
    );
    let stream = TcpStream::connect(addr).await.expect("connect");
    tokio_tungstenite::client_async(request, stream)
        .await
        .map(|(ws, _)| ws)
}

/// Runs `echo <word>` over a WebSocket session and returns its stdout and exit code.
async fn websocket_echo(addr: SocketAddr, id: &str, key: &str, word: &str) -> (Vec<u8>, i32) {
    let mut ws = websocket_tcp(addr, id, key).await.expect("upgrade");
    let request = serde_json::json!({ "cmd": ["echo", word] }).to_string();
    ws.send(Message::text(request)).await.expect("request");
    let mut decoder = Decoder::new(Direction::GuestToHost);
    let mut stdout = Vec::new();
    let mut exit = None;
    while let Some(message) = tokio::time::timeout(Duration::from_secs(20), ws.next())
        .await
        .expect("the session progresses")
    {
        match message.expect("valid message") {
            Message::Binary(bytes) => {
                decoder.push(&bytes);
                while let Some(frame) = decoder.next_frame().expect("valid frames") {
                    match frame.frame_type {
                        FrameType::Stdout => stdout.extend_from_slice(frame.payload),
                        FrameType::Exit => {
                            let result: ExecResult =
                                serde_json::from_slice(frame.payload).expect("ExecResult");
                            exit = Some(result.exit_code);
                        }
                        _ => {}
                    }
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    (stdout, exit.expect("an exit frame"))
}

/// Runs `cat` over a hijacked session, feeding it `input`.
async fn interactive_cat(c: &Client, id: &str, input: &[u8]) -> Result<Vec<u8>, ClientError> {
    let mut session = c.interactive(id, &ExecRequest::new(["cat"])).await?;
    session.send_stdin(input).await?;
    session.close_stdin().await?;
    let mut out = Vec::new();
    while let Some(event) = session.next_event().await {
        match event? {
            ExecEvent::Stdout(bytes) => out.extend_from_slice(&bytes),
            ExecEvent::Stderr(_) => {}
            ExecEvent::Exit(result) => {
                assert_eq!(result.exit_code, 0);
                break;
            }
        }
    }
    Ok(out)
}

fn one_file_tar(name: &str, contents: &[u8]) -> std::io::Cursor<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(contents.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, name, contents)
        .expect("tar entry");
    std::io::Cursor::new(builder.into_inner().expect("tar"))
}

#[tokio::test]
async fn another_key_cannot_tell_a_sandbox_from_a_missing_one() {
    let daemon = daemon();
    let addr = daemon.tcp.expect("tcp address");
    let alice = tcp_client(&daemon, ALICE);
    let bob = tcp_client(&daemon, BOB);
    let info = alice
        .create(&CreateSandbox::default())
        .await
        .expect("alice creates a sandbox");
    let id = info.id.clone();
    assert_ne!(id, MISSING);
    assert_eq!(info.owner.as_deref(), Some("alice"));
    // A command of alice's that outlived its connection: bob must not find or attach to it.
    let job = ExecRequest {
        exec_id: "owned-job".into(),
        ..ExecRequest::new(["sleep", "600"])
    };
    drop(alice.exec(&id, &job).await.expect("alice starts a job"));

    // Through the client, on every endpoint: the 404 of a missing id, word for word.
    let exec = ExecRequest::new(["echo", "bob was here"]);
    for target in [id.as_str(), MISSING] {
        let expected = format!("no sandbox with id {target:?}");
        let mut sink = Vec::new();
        let messages = [
            expect_not_found(bob.get(target).await, "GET"),
            expect_not_found(bob.delete(target).await, "DELETE"),
            expect_not_found(bob.exec_collect(target, &exec).await, "one-shot exec"),
            expect_not_found(bob.interactive(target, &exec).await, "hijacked exec"),
            expect_not_found(
                bob.put_tar(target, "/tmp", one_file_tar("x", b"bob")).await,
                "files POST",
            ),
            expect_not_found(
                bob.get_file(target, "/etc/hostname", &mut sink).await,
                "files GET",
            ),
            expect_not_found(bob.execs(target).await, "execs"),
            expect_not_found(bob.exec_status(target, "owned-job").await, "exec status"),
            expect_not_found(bob.attach(target, "owned-job", 0).await, "exec attach"),
            expect_not_found(bob.delete_exec(target, "owned-job").await, "exec DELETE"),
        ];
        for message in messages {
            assert_eq!(message, expected);
        }
        match websocket_tcp(addr, target, BOB).await {
            Err(tungstenite::Error::Http(response)) => {
                assert_eq!(response.status().as_u16(), 404, "WebSocket {target}");
                let body: wire::ErrorBody =
                    serde_json::from_slice(response.body().as_deref().unwrap_or_default())
                        .expect("the JSON envelope");
                assert_eq!(body.code, "not_found");
                assert_eq!(body.message, expected);
            }
            other => panic!("WebSocket {target}: expected a 404, got {other:?}"),
        }
    }

    // Byte for byte, on every request shape (headers included, but the date): the answer
    // about alice's sandbox is the answer about a missing one.
    for ((what, ours), (_, missing)) in raw_requests(&id, BOB)
        .into_iter()
        .zip(raw_requests(MISSING, BOB))
    {
        let ours = raw_tcp(addr, &ours).await;
        let missing = raw_tcp(addr, &missing).await;
        assert!(ours.starts_with("HTTP/1.1 404"), "{what}: {ours}");
        assert_eq!(
            normalized(&ours, &id),
            normalized(&missing, MISSING),
            "{what}"
        );
    }

    // Not listed, not in metrics.
    let listed = bob.list().await.expect("bob lists");
    assert!(listed.is_empty(), "bob sees {listed:?}");
    let metrics = bob.metrics().await.expect("bob's metrics");
    assert!(!metrics.contains(&id), "{metrics}");
    assert!(metrics.contains("crucible_sandboxes_created_total"));

    // Nothing bob did touched it: alice still has it, and no command of bob's ran.
    let out = alice
        .exec_collect(&id, &ExecRequest::new(["ls", "/tmp"]))
        .await
        .expect("alice execs");
    assert_eq!(out.stdout, b"", "bob's upload landed");
    assert_eq!(
        alice.list().await.expect("alice lists").len(),
        1,
        "bob's DELETE deleted it"
    );
    let job = alice
        .exec_status(&id, "owned-job")
        .await
        .expect("alice still finds her job");
    assert_eq!((job.state, job.attached), (wire::ExecState::Running, false));
}

#[tokio::test]
async fn the_owner_the_admin_key_and_the_unix_socket_see_and_use_it() {
    let daemon = daemon();
    let addr = daemon.tcp.expect("tcp address");
    let alice = tcp_client(&daemon, ALICE);
    let bob = tcp_client(&daemon, BOB);
    let admin = tcp_client(&daemon, ADMIN);
    let unix = daemon.client();
    let first = alice
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let second = alice
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let bobs = bob
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    let roots = unix
        .create(&CreateSandbox::default())
        .await
        .expect("create over the socket");
    assert_eq!(roots.owner.as_deref(), Some("unix"));
    let roots = roots.id;

    // The owner: listed with its name, usable on every transport.
    let listed = alice.list().await.expect("list");
    let ids: Vec<_> = listed.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, [first.as_str(), second.as_str()]);
    assert!(listed.iter().all(|s| s.owner.as_deref() == Some("alice")));
    let got = alice.get(&first).await.expect("get");
    assert_eq!(got.owner.as_deref(), Some("alice"));
    let out = alice
        .exec_collect(&first, &ExecRequest::new(["echo", "mine"]))
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"mine\n");
    assert_eq!(
        interactive_cat(&alice, &first, b"typed\n")
            .await
            .expect("hijacked session"),
        b"typed\n"
    );
    assert_eq!(
        websocket_echo(addr, &first, ALICE, "socket").await,
        (b"socket\n".to_vec(), 0)
    );
    let put = alice
        .put_tar(&first, "/work", one_file_tar("note", b"alice's"))
        .await
        .expect("upload");
    assert_eq!(put.files, 1);
    let mut file = Vec::new();
    alice
        .get_file(&first, "/work/note", &mut file)
        .await
        .expect("download");
    assert_eq!(file, b"alice's");
    // Neither bob's nor the socket's sandbox is alice's.
    expect_not_found(alice.get(&bobs).await, "bob's sandbox");
    expect_not_found(alice.get(&roots).await, "the socket's sandbox");

    // The admin key and the Unix socket without a key see every sandbox, with its owner.
    for (who, c) in [("admin", &admin), ("unix", &unix)] {
        let mut owners: Vec<_> = c
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|s| (s.id, s.owner.unwrap_or_default()))
            .collect();
        owners.sort();
        let mut expected = vec![
            (first.clone(), "alice".to_string()),
            (second.clone(), "alice".to_string()),
            (bobs.clone(), "bob".to_string()),
            (roots.clone(), "unix".to_string()),
        ];
        expected.sort();
        assert_eq!(owners, expected, "{who}");
        let got = c.get(&first).await.expect("get alice's");
        assert_eq!(got.owner.as_deref(), Some("alice"), "{who}");
        let out = c
            .exec_collect(&first, &ExecRequest::new(["cat", "/work/note"]))
            .await
            .expect("exec in alice's");
        assert_eq!(out.stdout, b"alice's", "{who}");
        let mut file = Vec::new();
        c.get_file(&first, "/work/note", &mut file)
            .await
            .expect("download from alice's");
        assert_eq!(file, b"alice's", "{who}");
        assert_eq!(
            interactive_cat(c, &first, b"root\n")
                .await
                .expect("hijacked session"),
            b"root\n",
            "{who}"
        );
    }
    assert_eq!(
        websocket_echo(addr, &first, ADMIN, "admin").await,
        (b"admin\n".to_vec(), 0)
    );
    // A sandbox the admin key creates is the admin key's: alice does not see it.
    let admins = admin
        .create(&CreateSandbox::default())
        .await
        .expect("create")
        .id;
    assert_eq!(
        unix.get(&admins).await.expect("get").owner.as_deref(),
        Some("ops")
    );
    expect_not_found(alice.get(&admins).await, "the admin's sandbox");

    // Both can delete alice's sandboxes; then alice sees them gone.
    admin.delete(&first).await.expect("the admin key deletes");
    unix.delete(&second).await.expect("the socket deletes");
    expect_not_found(alice.get(&first).await, "deleted by the admin key");
    expect_not_found(alice.get(&second).await, "deleted over the socket");
    assert!(alice.list().await.expect("list").is_empty());
    let left: Vec<_> = unix
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(left.len(), 3, "{left:?}");
    assert!(!left.contains(&first) && !left.contains(&second));
}

#[tokio::test]
async fn a_key_on_the_unix_socket_acts_as_that_key() {
    let daemon = daemon();
    let alice = daemon.client().with_api_key(ALICE);
    let bob = daemon.client().with_api_key(BOB);
    let info = alice
        .create(&CreateSandbox::default())
        .await
        .expect("alice over the socket");
    assert_eq!(info.owner.as_deref(), Some("alice"));
    let id = info.id;
    expect_not_found(bob.get(&id).await, "bob over the socket");
    expect_not_found(
        bob.interactive(&id, &ExecRequest::new(["true"])).await,
        "bob's hijack over the socket",
    );
    assert!(bob.list().await.expect("list").is_empty());
    // The same sandbox over TCP with alice's key.
    tcp_client(&daemon, ALICE)
        .get(&id)
        .await
        .expect("alice over TCP");

    // A wrong key is refused on the socket too, never taken as the socket's root.
    let wrong = daemon.client().with_api_key("not-a-key");
    match wrong.list().await {
        Err(ClientError::Api { status: 401, .. }) => {}
        other => panic!("expected 401, got {other:?}"),
    }
    match wrong.interactive(&id, &ExecRequest::new(["true"])).await {
        Err(ClientError::Api { status: 401, .. }) => {}
        other => panic!("the hijack: expected 401, got {other:?}"),
    }
    let response = raw(
        UnixStream::connect(&daemon.socket).await.expect("connect"),
        format!(
            "GET /sandboxes/{id} HTTP/1.1\r\nHost: x\r\nAuthorization: Basic abc\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 401"), "{response}");
    // Without a key, TCP stays closed.
    let anonymous = Client::new(Endpoint::Tcp(daemon.tcp.expect("tcp address").to_string()));
    match anonymous.list().await {
        Err(ClientError::Api { status: 401, .. }) => {}
        other => panic!("expected 401, got {other:?}"),
    }
}
