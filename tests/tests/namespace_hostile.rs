//! Hostile input through the real daemon: oversized and never-finished requests, slow and
//! silent clients, invalid UTF-8 and NULs, tar bombs and path escapes, malformed WebSocket
//! frames and malformed frame-protocol input. Each test checks exactly what the client sees
//! (status and error envelope, or close code) and that the daemon still runs a command
//! afterwards.

use std::io::Read as _;
use std::time::{Duration, Instant};

use harness::TestDaemon;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use wire::{encode_frames, encode_header, Decoder, Direction, ExecRequest, ExecResult, FrameType};

/// How long any single exchange may take before the test calls it a hang.
const HANG: Duration = Duration::from_secs(15);
/// The request-head timeout the daemons here run with (30 s in production).
const HEADER_TIMEOUT: Duration = Duration::from_secs(1);

fn daemon() -> TestDaemon {
    TestDaemon::start_with(|c| {
        c.header_timeout = HEADER_TIMEOUT;
        c.first_message_timeout = HEADER_TIMEOUT;
    })
}

/// What the client saw: status, raw head, body.
#[derive(Debug)]
struct Reply {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Reply {
    /// The error envelope's `code`, asserting the body is one.
    fn code(&self) -> String {
        let body: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not a JSON error envelope ({e}): {}\n{}",
                self.head,
                String::from_utf8_lossy(&self.body)
            )
        });
        assert!(body["message"].is_string(), "no message in {body}");
        body["code"].as_str().expect("code").to_string()
    }

    fn message(&self) -> String {
        let body: serde_json::Value = serde_json::from_slice(&self.body).expect("envelope");
        body["message"].as_str().expect("message").to_string()
    }

    fn expect(&self, status: u16, code: &str) -> &Self {
        assert_eq!(
            self.status,
            status,
            "{}\n{}",
            self.head,
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(self.code(), code, "{}", self.message());
        assert!(
            self.head
                .to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{}",
            self.head
        );
        self
    }
}

/// Reads one response (head, then a Content-Length body, else until EOF).
async fn read_reply<S: AsyncRead + Unpin>(stream: &mut S) -> Reply {
    let mut buf = Vec::new();
    let head_len = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(HANG, stream.read(&mut chunk))
            .await
            .expect("the daemon answers in time")
            .unwrap_or(0);
        assert!(
            n > 0,
            "the connection closed without a response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_len]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let length = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    let mut body = buf[head_len..].to_vec();
    match length {
        Some(n) => {
            while body.len() < n {
                let mut chunk = vec![0u8; n - body.len()];
                let got = tokio::time::timeout(HANG, stream.read(&mut chunk))
                    .await
                    .expect("the body arrives in time")
                    .unwrap_or(0);
                assert!(got > 0, "the body was cut short: {head}");
                body.extend_from_slice(&chunk[..got]);
            }
            body.truncate(n);
        }
        None => {
            let _ = tokio::time::timeout(HANG, stream.read_to_end(&mut body))
                .await
                .expect("the connection ends in time");
        }
    }
    Reply { status, head, body }
}

/// Sends `request` on a new connection and reads the response.
async fn exchange(daemon: &TestDaemon, request: &[u8]) -> Reply {
    let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
    // The daemon may answer and close before taking it all (a refused body): that is fine.
    let _ = stream.write_all(request).await;
    read_reply(&mut stream).await
}

/// A POST with a JSON body, closing the connection after.
fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// The daemon still runs a command and answers /healthz.
async fn assert_healthy(daemon: &TestDaemon, id: &str) {
    let out = tokio::time::timeout(
        HANG,
        daemon
            .client()
            .exec_collect(id, &ExecRequest::new(["echo", "still", "here"])),
    )
    .await
    .expect("a normal exec finishes in time")
    .expect("a normal exec works");
    assert_eq!(out.stdout, b"still here\n");
    assert_eq!(out.result.exit_code, 0);
    let health = exchange(
        daemon,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(health.status, 200);
}

/// Runs `script` in the sandbox and returns its exit code.
async fn sh(daemon: &TestDaemon, id: &str, script: &str) -> i32 {
    daemon
        .client()
        .exec_collect(id, &ExecRequest::new(["sh", "-c", script]))
        .await
        .expect("exec")
        .result
        .exit_code
}

#[tokio::test]
async fn oversized_request_heads_are_431_with_the_envelope() {
    let daemon = daemon();
    let id = daemon.sandbox().await;
    let big = "a".repeat(70 * 1024);
    // One huge header, in one write.
    let request = format!("GET /sandboxes HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n");
    exchange(&daemon, request.as_bytes())
        .await
        .expect(431, "headers_too_large");
    // A head just past the limit that arrives whole, terminator included.
    let just_over = "b".repeat(api::config::MAX_HEAD - 20);
    let request = format!("GET /sandboxes HTTP/1.1\r\nHost: x\r\nX-Big: {just_over}\r\n\r\n");
    assert!(request.len() > api::config::MAX_HEAD);
    exchange(&daemon, request.as_bytes())
        .await
        .expect(431, "headers_too_large");
    // Too many small headers.
    let many: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    let request = format!("GET /sandboxes HTTP/1.1\r\nHost: x\r\n{many}\r\n");
    exchange(&daemon, request.as_bytes())
        .await
        .expect(431, "headers_too_large");
    // The same on the hijack path.
    let request = format!(
        "POST /sandboxes/{id}/exec?stdin=1 HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\
         Content-Length: 2\r\n\r\n{{}}"
    );
    exchange(&daemon, request.as_bytes())
        .await
        .expect(431, "headers_too_large");
    // A second request on a kept-alive connection is parsed by hyper: still refused, never
    // served, and the daemon does not hang on it.
    let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send");
    assert_eq!(read_reply(&mut stream).await.status, 200);
    let second = format!("GET /sandboxes HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n");
    let _ = stream.write_all(second.as_bytes()).await;
    read_reply(&mut stream)
        .await
        .expect(431, "headers_too_large");
    let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
    let second =
        format!("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /sandboxes HTTP/1.1\r\n{many}\r\n");
    stream.write_all(second.as_bytes()).await.expect("send");
    // Both answers may arrive in one read: take everything, then look at the second.
    let mut both = Vec::new();
    tokio::time::timeout(HANG, stream.read_to_end(&mut both))
        .await
        .expect("the daemon answers in time")
        .expect("read");
    let both = String::from_utf8_lossy(&both);
    assert!(both.starts_with("HTTP/1.1 200"), "{both}");
    let second = &both[both.rfind("HTTP/1.1 ").unwrap_or(0)..];
    assert!(second.starts_with("HTTP/1.1 431"), "{both}");
    assert!(second.contains(r#""code":"headers_too_large""#), "{both}");
    assert_healthy(&daemon, &id).await;
}

#[tokio::test]
async fn oversized_and_never_sent_bodies_are_refused_at_once() {
    let daemon = daemon();
    let id = daemon.sandbox().await;
    let exec = format!("/sandboxes/{id}/exec");
    // A real 3 MiB ExecRequest.
    let huge = format!(r#"{{"cmd":["echo","{}"]}}"#, "x".repeat(3 * 1024 * 1024));
    let reply = exchange(&daemon, &post(&exec, huge.as_bytes())).await;
    reply.expect(413, "payload_too_large");
    // Declared sizes far beyond the limit whose bytes never come: refused before reading, not
    // after waiting for them.
    for target in [exec.clone(), "/sandboxes".to_string()] {
        let started = Instant::now();
        let request =
            format!("POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n{{");
        let reply = exchange(&daemon, request.as_bytes()).await;
        reply.expect(413, "payload_too_large");
        assert!(
            reply.message().contains("1000000000000"),
            "{}",
            reply.message()
        );
        assert!(
            started.elapsed() < HEADER_TIMEOUT,
            "{target}: waited for the body"
        );
    }
    let request =
        format!("POST {exec}?stdin=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n");
    exchange(&daemon, request.as_bytes())
        .await
        .expect(413, "payload_too_large");
    // A chunked body that keeps going past the limit.
    let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
    let head = format!("POST {exec} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    stream.write_all(head.as_bytes()).await.expect("head");
    let chunk = format!("100000\r\n{}\r\n", "y".repeat(0x100000));
    for _ in 0..3 {
        if stream.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    read_reply(&mut stream)
        .await
        .expect(413, "payload_too_large");
    // An unparsable Content-Length.
    let request =
        format!("POST {exec}?stdin=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n");
    exchange(&daemon, request.as_bytes())
        .await
        .expect(400, "invalid_request");
    // Framing a smuggler would use: both lengths, or two that disagree; a chunked hijack.
    let hijack = format!("{exec}?stdin=1");
    for (target, headers, status, code) in [
        (
            &exec,
            "Content-Length: 2\r\nTransfer-Encoding: chunked",
            400,
            "invalid_request",
        ),
        (
            &exec,
            "Content-Length: 2\r\nContent-Length: 3",
            400,
            "invalid_request",
        ),
        (
            &hijack,
            "Transfer-Encoding: chunked",
            411,
            "length_required",
        ),
    ] {
        let request = format!("POST {target} HTTP/1.1\r\nHost: x\r\n{headers}\r\n\r\n{{}}");
        exchange(&daemon, request.as_bytes())
            .await
            .expect(status, code);
    }
    assert_healthy(&daemon, &id).await;
}

#[tokio::test]
async fn slow_and_silent_clients_time_out_with_408() {
    let daemon = daemon();
    let id = daemon.sandbox().await;
    // Connects and sends nothing.
    let started = Instant::now();
    exchange(&daemon, b"").await.expect(408, "request_timeout");
    let waited = started.elapsed();
    assert!(
        waited >= HEADER_TIMEOUT && waited < HEADER_TIMEOUT * 5,
        "{waited:?}"
    );
    // Dribbles a head that never ends, a byte every 100 ms (slowloris).
    let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
    let started = Instant::now();
    let dribble = async {
        for byte in b"GET /sandboxes HTTP/1.1\r\nHost: x\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if stream.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let _ = tokio::time::timeout(HEADER_TIMEOUT * 3, dribble).await;
    let reply = read_reply(&mut stream).await;
    reply.expect(408, "request_timeout");
    assert!(started.elapsed() < HEADER_TIMEOUT * 5);
    // A body that stops halfway: JSON, hijacked ExecRequest, and a tar upload.
    let exec = format!("/sandboxes/{id}/exec");
    for (target, code) in [
        (exec.clone(), "request_timeout"),
        (format!("{exec}?stdin=1"), "request_timeout"),
        (
            format!("/sandboxes/{id}/files?path=/tmp"),
            "request_timeout",
        ),
    ] {
        let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
        let request =
            format!("POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n{{\"cmd\"");
        stream.write_all(request.as_bytes()).await.expect("send");
        let started = Instant::now();
        read_reply(&mut stream).await.expect(408, code);
        assert!(started.elapsed() < HEADER_TIMEOUT * 5, "{target}");
    }
    assert_healthy(&daemon, &id).await;
}

#[tokio::test]
async fn invalid_utf8_and_nul_bytes_are_400_naming_the_field() {
    let daemon = daemon();
    let id = daemon.sandbox().await;
    let exec = format!("/sandboxes/{id}/exec");
    // Raw bytes that are not UTF-8 inside a JSON string, and a lone surrogate escape.
    let mut bad = br#"{"cmd":["echo",""#.to_vec();
    bad.extend_from_slice(&[0xff, 0xfe, 0xc3]);
    bad.extend_from_slice(br#""]}"#);
    for body in [bad.as_slice(), br#"{"cmd":["echo","\ud800"]}"#] {
        let reply = exchange(&daemon, &post(&exec, body)).await;
        reply.expect(400, "invalid_request");
        assert!(
            reply.message().contains("ExecRequest"),
            "{}",
            reply.message()
        );
        let reply = exchange(&daemon, &post("/sandboxes", body)).await;
        reply.expect(400, "invalid_request");
    }
    // NULs in every string an ExecRequest carries: refused, naming the field; nothing runs.
    let cases = [
        (r#"{"cmd":["touch\u0000x","/tmp/nul0"]}"#, "cmd[0]"),
        (r#"{"cmd":["touch","/tmp/nul1\u0000x"]}"#, "cmd[1]"),
        (
            r#"{"cmd":["touch","/tmp/nul2"],"env":{"A":"b\u0000c"}}"#,
            "env.A",
        ),
        (
            r#"{"cmd":["touch","/tmp/nul3"],"env":{"A\u0000B":"c"}}"#,
            "env.",
        ),
        (
            r#"{"cmd":["touch","/tmp/nul4"],"cwd":"/tmp\u0000/x"}"#,
            "cwd",
        ),
    ];
    for (body, field) in cases {
        let reply = exchange(&daemon, &post(&exec, body.as_bytes())).await;
        reply.expect(400, "invalid_request");
        assert!(
            reply.message().contains(field),
            "{body}: {}",
            reply.message()
        );
        assert!(
            reply.message().contains("NUL"),
            "{body}: {}",
            reply.message()
        );
        // The hijacked transport validates the same way, before its 200.
        let reply = exchange(&daemon, &post(&format!("{exec}?stdin=1"), body.as_bytes())).await;
        reply.expect(400, "invalid_request");
        assert!(
            reply.message().contains(field),
            "{body}: {}",
            reply.message()
        );
        // And the WebSocket transport closes with 1008 naming the field.
        let mut ws = RawWs::connect(&daemon, &id).await;
        ws.send(0x1, body.as_bytes()).await;
        let (code, reason) = ws.close_code().await;
        assert_eq!(code, 1008, "{body}: {reason}");
        assert!(reason.contains(field), "{body}: {reason}");
    }
    assert_eq!(
        sh(
            &daemon,
            &id,
            "ls /tmp/nul* 2>/dev/null | wc -l | grep -qx 0"
        )
        .await,
        0,
        "a NUL-truncated command ran"
    );
    // NULs and non-UTF-8 in the path, the query and the request line.
    let cases: Vec<(String, &str)> = vec![
        (
            format!("GET /sandboxes/{id}/files?path=/etc/passwd%00x"),
            "NUL",
        ),
        (format!("POST /sandboxes/{id}/files?path=/tmp%00x"), "NUL"),
        (
            format!("GET /sandboxes/{id}/files?path=/a&path=/b"),
            "query",
        ),
        (format!("POST /sandboxes/{id}/exec?stdin=%ff"), "stdin"),
        ("GET /sandboxes/sb-%ff%fe".to_string(), "path"),
        ("DELETE /sandboxes/%00".to_string(), "sandbox id"),
    ];
    for (line, what) in cases {
        let request =
            format!("{line} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
        let reply = exchange(&daemon, request.as_bytes()).await;
        reply.expect(400, "invalid_request");
        assert!(
            reply.message().contains(what),
            "{line}: {}",
            reply.message()
        );
    }
    // A request line with a raw NUL or raw non-UTF-8 bytes is not HTTP.
    for raw in [
        &b"GET /heal\x00thz HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
    ] {
        exchange(&daemon, raw).await.expect(400, "invalid_request");
    }
    assert_healthy(&daemon, &id).await;
}

/// Found by schemathesis: serde takes a JSON array as a struct's fields in order, so
/// `[null, null]` created a sandbox; and an empty upload "extracted" nothing with a 200.
#[tokio::test]
async fn json_bodies_must_be_objects_and_uploads_must_not_be_empty() {
    let daemon = daemon();
    let id = daemon.sandbox().await;
    let exec = format!("/sandboxes/{id}/exec");
    for body in [
        &b"[null, null]"[..],
        b"[[\"echo\"]]",
        b"null",
        b"\"{}\"",
        b"7",
    ] {
        for target in ["/sandboxes", exec.as_str(), &format!("{exec}?stdin=1")] {
            let reply = exchange(&daemon, &post(target, body)).await;
            reply.expect(400, "invalid_request");
            assert!(
                reply.message().contains("JSON object"),
                "{}",
                reply.message()
            );
        }
        let mut ws = RawWs::connect(&daemon, &id).await;
        ws.send(0x1, body).await;
        let (code, reason) = ws.close_code().await;
        assert_eq!(code, 1008, "{reason}");
        assert!(reason.contains("JSON object"), "{reason}");
    }
    assert_eq!(
        daemon.state.registry.list().len(),
        1,
        "no sandbox was created"
    );
    let reply = upload(&daemon, &id, "/tmp/empty", b"").await;
    reply.expect(400, "invalid_request");
    assert!(reply.message().contains("empty"), "{}", reply.message());
    // A real empty archive is fine.
    let reply = upload(&daemon, &id, "/tmp/empty", &archive(|_| {})).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_healthy(&daemon, &id).await;
}

// ---- tar bombs and path escapes ----

/// Appends an entry written header-first, so that names the tar crate's builder would refuse
/// (absolute, `..`) can be produced.
fn raw_entry(
    b: &mut tar::Builder<Vec<u8>>,
    name: &str,
    kind: tar::EntryType,
    link: Option<&str>,
    data: &[u8],
) {
    let mut h = tar::Header::new_gnu();
    {
        let gnu = h.as_gnu_mut().expect("gnu header");
        gnu.name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(l) = link {
            gnu.linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
    }
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append(&h, data).expect("append");
}

fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    build(&mut b);
    b.into_inner().expect("finish archive")
}

/// Uploads `body` as a tar to `dir`.
async fn upload(daemon: &TestDaemon, id: &str, dir: &str, body: &[u8]) -> Reply {
    let mut request = format!(
        "POST /sandboxes/{id}/files?path={dir} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/x-tar\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    exchange(daemon, &request).await
}

/// An upload the daemon refuses before reading it (no such sandbox, no image name, a tar
/// entry the agent refuses) is answered, and the client can still send its whole body: the
/// rest is read and dropped after the answer, so the client sees the answer, not a broken pipe
/// mid-send.
#[tokio::test]
async fn a_refused_upload_gets_its_answer_not_a_broken_pipe() {
    let daemon = daemon();
    let id = daemon.sandbox().await;
    // Far more than the socket buffers hold: the daemon must read it for the send to finish.
    let body = vec![0u8; 8 << 20];
    let evil = archive(|b| {
        let mut data = vec![0u8; 4 << 20];
        data.extend_from_slice(b"tail");
        raw_entry(b, "../escape", tar::EntryType::Regular, None, &data);
    });
    let cases: [(String, &[u8], u16, &str); 3] = [
        (
            "/sandboxes/sb-00000000000000ff/files?path=/tmp".into(),
            &body,
            404,
            "not_found",
        ),
        ("/images".into(), &body, 400, "invalid_request"),
        (
            format!("/sandboxes/{id}/files?path=/tmp"),
            &evil,
            400,
            "refused_entry",
        ),
    ];
    for (target, payload, status, code) in cases {
        let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
        let head = format!(
            "POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-tar\r\n\
             Content-Length: {}\r\n\r\n",
            payload.len()
        );
        stream.write_all(head.as_bytes()).await.expect("head");
        tokio::time::timeout(HANG, stream.write_all(payload))
            .await
            .expect("the body is taken in time")
            .unwrap_or_else(|e| panic!("{target}: sending the body failed: {e}"));
        read_reply(&mut stream).await.expect(status, code);
    }
    assert_healthy(&daemon, &id).await;
}

#[tokio::test]
async fn tar_bombs_are_bounded_and_reported() {
    // A small disk, so that "bigger than the disk" is cheap to send.
    let daemon = TestDaemon::start_with(|c| {
        c.header_timeout = HEADER_TIMEOUT;
        c.engine.limits.scratch_mib = 16;
    });
    let id = daemon.sandbox().await;

    // Many entries: extracted in bounded time and counted.
    let n = 10_000;
    let many = archive(|b| {
        for i in 0..n {
            raw_entry(b, &format!("f{i}"), tar::EntryType::Regular, None, b"");
        }
    });
    let started = Instant::now();
    let reply = upload(&daemon, &id, "/tmp/many", &many).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let result: wire::FilesPutResult = serde_json::from_slice(&reply.body).expect("result");
    assert_eq!(result.files, n);
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(sh(&daemon, &id, "rm -rf /tmp/many").await, 0);

    // A declared size the archive does not have (8 GiB, 1 KiB sent).
    let mut header = tar::Header::new_gnu();
    header.set_path("huge").expect("path");
    header.set_size(8 << 30);
    header.set_mode(0o644);
    header.set_cksum();
    let mut lying = header.as_bytes().to_vec();
    lying.extend_from_slice(&[b'z'; 1024]);
    let reply = upload(&daemon, &id, "/tmp/lying", &lying).await;
    reply.expect(400, "invalid_request");
    assert!(reply.message().contains("huge"), "{}", reply.message());

    // More data than the sandbox's disk holds: 24 MiB into a 16 MiB /tmp.
    let big = archive(|b| {
        let mut h = tar::Header::new_gnu();
        h.set_path("big").expect("path");
        h.set_size(24 << 20);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, std::io::repeat(7).take(24 << 20))
            .expect("append");
    });
    let reply = upload(&daemon, &id, "/tmp/full", &big).await;
    reply.expect(413, "no_space");
    assert!(reply.message().contains("big"), "{}", reply.message());
    assert_eq!(sh(&daemon, &id, "rm -rf /tmp/full").await, 0);

    // Nesting deeper than a path can be (GNU long names, 3000 levels).
    let deep = archive(|b| {
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        let name = format!("{}leaf", "d/".repeat(3000));
        b.append_data(&mut h, name, &b"x"[..]).expect("append");
    });
    let reply = upload(&daemon, &id, "/tmp/deep", &deep).await;
    reply.expect(400, "invalid_request");
    assert_eq!(sh(&daemon, &id, "rm -rf /tmp/deep").await, 0);

    // Not a tar at all.
    let reply = upload(&daemon, &id, "/tmp/garbage", &[b'x'; 4096]).await;
    reply.expect(400, "invalid_request");
    assert!(reply.message().contains("archive"), "{}", reply.message());

    assert_healthy(&daemon, &id).await;
}

#[tokio::test]
async fn every_path_escape_is_refused_end_to_end() {
    let daemon = daemon();
    let id = daemon.sandbox().await;
    // A symlink already in the sandbox, pointing out of the destination.
    assert_eq!(
        sh(&daemon, &id, "mkdir -p /work && ln -s /etc /work/pre").await,
        0
    );
    use tar::EntryType::{Block, Char, Fifo, Link, Regular, Symlink};
    type Build = Box<dyn Fn(&mut tar::Builder<Vec<u8>>)>;
    let cases: Vec<(&str, Build, &str)> = vec![
        (
            "absolute name",
            Box::new(|b| raw_entry(b, "/etc/pwned", Regular, None, b"x")),
            "absolute",
        ),
        (
            "dotdot",
            Box::new(|b| raw_entry(b, "../etc/pwned", Regular, None, b"x")),
            "..",
        ),
        (
            "dotdot in the middle",
            Box::new(|b| raw_entry(b, "a/../../etc/pwned", Regular, None, b"x")),
            "..",
        ),
        (
            "relative symlink out, then a write through it",
            Box::new(|b| {
                raw_entry(b, "up", Symlink, Some("../../etc"), b"");
                raw_entry(b, "up/pwned", Regular, None, b"x");
            }),
            "escapes",
        ),
        (
            "symlink to inside, then a write through it",
            Box::new(|b| {
                raw_entry(b, "self", Symlink, Some("."), b"");
                raw_entry(b, "self/pwned", Regular, None, b"x");
            }),
            "symlink",
        ),
        (
            "hardlink to an absolute path outside",
            Box::new(|b| raw_entry(b, "hl", Link, Some("/etc/passwd"), b"")),
            "escapes",
        ),
        (
            "hardlink with ..",
            Box::new(|b| raw_entry(b, "hl", Link, Some("../../etc/passwd"), b"")),
            "escapes",
        ),
        (
            "symlinked parent already in the sandbox",
            Box::new(|b| raw_entry(b, "pre/pwned", Regular, None, b"x")),
            "symlink",
        ),
        (
            "hardlink through the symlinked parent",
            Box::new(|b| raw_entry(b, "hl", Link, Some("pre/passwd"), b"")),
            "symlink",
        ),
        (
            "char device",
            Box::new(|b| raw_entry(b, "mem", Char, None, b"")),
            "device",
        ),
        (
            "block device",
            Box::new(|b| raw_entry(b, "sda", Block, None, b"")),
            "device",
        ),
        (
            "fifo",
            Box::new(|b| raw_entry(b, "pipe", Fifo, None, b"")),
            "fifo",
        ),
    ];
    for (what, build, reason) in cases {
        let tar = archive(|b| {
            raw_entry(b, "first.txt", Regular, None, b"ok");
            build(b);
            raw_entry(b, "after.txt", Regular, None, b"never");
        });
        let reply = upload(&daemon, &id, "/work", &tar).await;
        reply.expect(400, "refused_entry");
        assert!(
            reply.message().contains(reason),
            "{what}: {}",
            reply.message()
        );
        assert!(
            reply.message().contains("entries before it were extracted"),
            "{what}: {}",
            reply.message()
        );
    }
    let clean = "test ! -e /etc/pwned && test ! -e /pwned && test ! -e /work/after.txt && \
                 test ! -e /work/hl && test ! -e /work/mem && test ! -e /work/pipe && \
                 test -L /work/pre && grep -q root /etc/passwd";
    assert_eq!(sh(&daemon, &id, clean).await, 0, "something was written");
    // A destination that is not absolute, or empty.
    for dir in ["work", "", "..%2Fetc"] {
        upload(&daemon, &id, dir, &archive(|_| {}))
            .await
            .expect(400, "invalid_request");
    }
    assert_healthy(&daemon, &id).await;
}

// ---- WebSocket ----

/// A WebSocket client that writes frames byte by byte as told, malformed ones included.
struct RawWs {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl RawWs {
    async fn connect(daemon: &TestDaemon, id: &str) -> RawWs {
        let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
        let handshake = format!(
            "GET /sandboxes/{id}/exec HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        );
        stream.write_all(handshake.as_bytes()).await.expect("send");
        let mut buf = Vec::new();
        let end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            let mut chunk = [0u8; 1024];
            let n = tokio::time::timeout(HANG, stream.read(&mut chunk))
                .await
                .expect("handshake in time")
                .expect("read");
            assert!(n > 0, "closed during the handshake");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        RawWs {
            stream,
            buf: buf.split_off(end),
        }
    }

    /// One frame: FIN set, masked, as a well-behaved client sends it.
    async fn send(&mut self, opcode: u8, payload: &[u8]) {
        let bytes = ws_frame(0x80 | opcode, true, payload);
        self.write(&bytes).await;
    }

    async fn write(&mut self, bytes: &[u8]) {
        // The daemon may already have failed the connection: the reply says what it saw.
        let _ = self.stream.write_all(bytes).await;
    }

    async fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            let mut chunk = [0u8; 65536];
            match tokio::time::timeout(HANG, self.stream.read(&mut chunk))
                .await
                .expect("the daemon answers in time")
            {
                Ok(0) | Err(_) => return false,
                Ok(got) => self.buf.extend_from_slice(&chunk[..got]),
            }
        }
        true
    }

    /// The next server frame: (opcode, payload); `None` at EOF.
    async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        if !self.fill(2).await {
            return None;
        }
        let opcode = self.buf[0] & 0x0f;
        assert_eq!(self.buf[1] & 0x80, 0, "server frames are not masked");
        let (len, start) = match self.buf[1] & 0x7f {
            126 => {
                assert!(self.fill(4).await);
                (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4)
            }
            127 => {
                assert!(self.fill(10).await);
                let mut n = [0u8; 8];
                n.copy_from_slice(&self.buf[2..10]);
                (u64::from_be_bytes(n) as usize, 10)
            }
            n => (n as usize, 2),
        };
        assert!(self.fill(start + len).await, "frame cut short");
        let payload = self.buf[start..start + len].to_vec();
        self.buf.drain(..start + len);
        Some((opcode, payload))
    }

    /// Reads up to the close frame: its code and reason, and the frame stream before it.
    async fn close(&mut self) -> (u16, String, Vec<u8>) {
        let mut data = Vec::new();
        while let Some((opcode, payload)) = self.next().await {
            match opcode {
                0x8 => {
                    assert!(payload.len() >= 2, "a close frame without a code");
                    let code = u16::from_be_bytes([payload[0], payload[1]]);
                    let reason = String::from_utf8_lossy(&payload[2..]).into_owned();
                    return (code, reason, data);
                }
                0x2 => data.extend_from_slice(&payload),
                _ => {}
            }
        }
        panic!("the connection ended without a close frame");
    }

    async fn close_code(&mut self) -> (u16, String) {
        let (code, reason, _) = self.close().await;
        (code, reason)
    }
}

/// A WebSocket frame with the given first byte (FIN, RSV, opcode), masked or not.
fn ws_frame(first: u8, masked: bool, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mask_bit = if masked { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(mask_bit | n as u8),
        n if n <= 0xffff => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if masked {
        let key = [0x12, 0x34, 0x56, 0x78];
        out.extend_from_slice(&key);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

/// The ExecResult of the exit frame in `stream` (asserting the stream is well formed).
fn exit_result(stream: &[u8]) -> ExecResult {
    let mut decoder = Decoder::new(Direction::GuestToHost);
    decoder.push(stream);
    let mut result = None;
    while let Some(frame) = decoder.next_frame().expect("valid frames") {
        if frame.frame_type == FrameType::Exit {
            result = Some(serde_json::from_slice(frame.payload).expect("ExecResult"));
        }
    }
    decoder
        .finish()
        .expect("exactly one exit frame, then nothing");
    result.expect("an exit frame")
}

#[tokio::test]
async fn malformed_websocket_frames_close_with_the_rfc_code() {
    let daemon = daemon();
    let id = daemon.sandbox().await;
    let request = br#"{"cmd":["cat"]}"#;
    let mut oversized_header = vec![0x82, 0x80 | 127];
    oversized_header.extend_from_slice(&(9u64 << 20).to_be_bytes());
    oversized_header.extend_from_slice(&[0, 0, 0, 0]);
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("reserved data opcode 0x3", ws_frame(0x83, true, b"x"), 1002),
        (
            "reserved control opcode 0xB",
            ws_frame(0x8b, true, b""),
            1002,
        ),
        (
            "unmasked client frame",
            ws_frame(0x81, false, request),
            1002,
        ),
        (
            "RSV1 without an extension",
            ws_frame(0xc1, true, request),
            1002,
        ),
        ("fragmented ping", ws_frame(0x09, true, b"p"), 1002),
        (
            "control frame over 125 bytes",
            ws_frame(0x89, true, &[0; 200]),
            1002,
        ),
        (
            "continuation with nothing to continue",
            ws_frame(0x80, true, b"x"),
            1002,
        ),
        (
            "text frame that is not UTF-8",
            ws_frame(0x81, true, b"{\"cmd\":[\"\xff\xfe\"]}"),
            1007,
        ),
        (
            "a 9 MiB frame header, payload never sent",
            oversized_header,
            1009,
        ),
    ];
    for (when, prefix) in [("first message", false), ("mid-session", true)] {
        for (what, bytes, code) in &cases {
            let mut ws = RawWs::connect(&daemon, &id).await;
            if prefix {
                ws.send(0x1, request).await;
            }
            ws.write(bytes).await;
            let started = Instant::now();
            let (got, reason, _) = ws.close().await;
            assert_eq!(got, *code, "{what} ({when}): {reason}");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{what} ({when})"
            );
        }
    }
    // A message over the 8 MiB limit in fragments of allowed size.
    let mut ws = RawWs::connect(&daemon, &id).await;
    let piece = vec![b'a'; 5 << 20];
    ws.write(&ws_frame(0x02, true, &piece)).await;
    ws.write(&ws_frame(0x80, true, &piece)).await;
    assert_eq!(ws.close_code().await.0, 1009);
    // After the ExecRequest, a text message is a policy violation.
    let mut ws = RawWs::connect(&daemon, &id).await;
    ws.send(0x1, request).await;
    ws.send(0x1, b"not binary").await;
    assert_eq!(ws.close_code().await.0, 1008);
    assert_healthy(&daemon, &id).await;
}

#[tokio::test]
async fn websocket_that_never_sends_its_request_is_closed_1008() {
    let daemon = daemon();
    let id = daemon.sandbox().await;
    let mut ws = RawWs::connect(&daemon, &id).await;
    let started = Instant::now();
    let (code, reason) = ws.close_code().await;
    assert_eq!(code, 1008, "{reason}");
    assert!(reason.contains("no ExecRequest within"), "{reason}");
    assert!(started.elapsed() >= HEADER_TIMEOUT);
    // Pings do not extend the deadline.
    let mut ws = RawWs::connect(&daemon, &id).await;
    let started = Instant::now();
    let keep_pinging = async {
        loop {
            ws.send(0x9, b"ping").await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let _ = tokio::time::timeout(HEADER_TIMEOUT * 2, keep_pinging).await;
    let (code, _) = ws.close_code().await;
    assert_eq!(code, 1008);
    assert!(started.elapsed() < HEADER_TIMEOUT * 4);
    assert_healthy(&daemon, &id).await;
}

/// Malformed input frames for an interactive session: (what, bytes, words the error names).
fn malformed_stdin() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let mut unknown = [0u8; 8];
    unknown[0] = 9;
    unknown[7] = 1;
    let mut unknown = unknown.to_vec();
    unknown.push(b'x');
    let mut oversized = encode_header(FrameType::Stdin, 0).to_vec();
    oversized[4..8].copy_from_slice(&(wire::MAX_PAYLOAD as u32 + 1).to_be_bytes());
    let mut stdout = Vec::new();
    encode_frames(FrameType::Stdout, b"spoofed", &mut stdout);
    vec![
        ("unknown frame type 9", unknown, "9"),
        ("length over the maximum payload", oversized, "65537"),
        ("a stdout frame from the client", stdout, "stdout"),
    ]
}

#[tokio::test]
async fn malformed_stdin_frames_end_the_session_with_an_error() {
    let daemon = daemon();
    let id = daemon.sandbox().await;
    // Over WebSocket.
    for (what, bytes, words) in malformed_stdin() {
        let mut ws = RawWs::connect(&daemon, &id).await;
        ws.send(0x1, br#"{"cmd":["cat"]}"#).await;
        let mut good = Vec::new();
        encode_frames(FrameType::Stdin, b"before\n", &mut good);
        ws.send(0x2, &good).await;
        ws.send(0x2, &bytes).await;
        let (code, reason, stream) = ws.close().await;
        let result = exit_result(&stream);
        assert_eq!(result.exit_code, -1, "{what}: {result:?}");
        assert!(result.error.contains(words), "{what}: {:?}", result.error);
        assert_eq!(code, 1000, "{what}: {reason}");
    }
    // Over the hijacked connection.
    for (what, bytes, words) in malformed_stdin() {
        let body = br#"{"cmd":["cat"]}"#;
        let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
        stream
            .write_all(&post(&format!("/sandboxes/{id}/exec?stdin=1"), body))
            .await
            .expect("send");
        stream.write_all(&bytes).await.expect("send frame");
        let (head, frames) = read_hijacked(&mut stream).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let result = exit_result(&frames);
        assert_eq!(result.exit_code, -1, "{what}: {result:?}");
        assert!(result.error.contains(words), "{what}: {:?}", result.error);
    }
    assert_healthy(&daemon, &id).await;
}

/// The head and the raw frame bytes of a hijacked session, read to EOF.
async fn read_hijacked<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) -> (String, Vec<u8>) {
    let mut all = Vec::new();
    tokio::time::timeout(HANG, stream.read_to_end(&mut all))
        .await
        .expect("the session ends in time")
        .expect("read");
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4)
        .expect("a head");
    (
        String::from_utf8_lossy(&all[..end]).into_owned(),
        all[end..].to_vec(),
    )
}

/// A tenant owns its sandbox's `/dev`: a `/dev/ptmx` it replaced (a FIFO, a symlink to a
/// file, or nothing) gives its next terminal request a clear error from the agent, which opens
/// the multiplexer inside the sandbox and so never reaches the host's terminals; a flood of
/// resize frames of the largest size changes nothing but the sandbox's own terminal.
#[tokio::test]
async fn a_replaced_terminal_multiplexer_fails_only_the_tenants_own_terminal_requests() {
    let daemon = daemon();
    let client = daemon.client();
    let id = client.create(&Default::default()).await.expect("create").id;
    let tty = || {
        let mut request = ExecRequest::new(["sh", "-c", "tty"]);
        request.tty = true;
        request
    };
    let out = client.exec_collect(&id, &tty()).await.expect("exec");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("/dev/pts/"),
        "{out:?}"
    );

    // Resizes of every size, thousands of them, then the session still answers.
    let mut session = client
        .interactive(&id, &tty_session())
        .await
        .expect("session");
    for i in 0..5000u32 {
        let size = wire::TerminalSize {
            rows: if i % 2 == 0 { u16::MAX } else { 0 },
            cols: (i % 65_536) as u16,
        };
        session.resize(size).await.expect("resize");
    }
    session
        .send_stdin(b"stty size; exit 3\r")
        .await
        .expect("type");
    let mut shown = Vec::new();
    let result = loop {
        match tokio::time::timeout(HANG, session.next_event()).await {
            Ok(Some(Ok(client::ExecEvent::Stdout(bytes)))) => shown.extend_from_slice(&bytes),
            Ok(Some(Ok(client::ExecEvent::Exit(result)))) => break result,
            other => panic!("{other:?} after {:?}", String::from_utf8_lossy(&shown)),
        }
    };
    assert_eq!(result.exit_code, 3, "{:?}", String::from_utf8_lossy(&shown));

    for replace in [
        "rm -f /dev/ptmx && mkfifo /dev/ptmx",
        "rm -f /dev/ptmx && echo x > /tmp/f && ln -s /tmp/f /dev/ptmx",
        "rm -f /dev/ptmx",
    ] {
        assert_eq!(sh(&daemon, &id, replace).await, 0, "{replace}");
        let out = tokio::time::timeout(HANG, client.exec_collect(&id, &tty()))
            .await
            .expect("the agent answers in time")
            .expect("exec");
        assert_eq!(out.result.exit_code, -1, "{replace}: {out:?}");
        assert!(
            out.result.error.starts_with("cannot open a terminal"),
            "{replace}: {:?}",
            out.result.error
        );
        assert_healthy(&daemon, &id).await;
    }
    // Put back, the sandbox's terminals work again.
    assert_eq!(sh(&daemon, &id, "ln -s pts/ptmx /dev/ptmx").await, 0);
    let out = client.exec_collect(&id, &tty()).await.expect("exec");
    assert_eq!(out.result.exit_code, 0, "{out:?}");
}

fn tty_session() -> ExecRequest {
    let mut request = ExecRequest::new(["sh"]);
    request.tty = true;
    request
}
