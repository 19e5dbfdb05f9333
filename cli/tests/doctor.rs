//! `crucible doctor` given a daemon (`--host`, `CRUCIBLE_HOST`): it asks that daemon, never
//! this host or the current directory, and says plainly when the daemon cannot be reached.
//! The daemons here are fakes that answer what a crucible daemon answers, so the tests need
//! neither root nor an image.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

mod common;
use common::{crucible_at, has_control, run, text};

/// The key the fake daemon takes for `GET /images`.
const KEY: &str = "k-doctor";

/// What a crucible daemon answers: `/healthz` to anyone, `/images` (the built-in image and
/// one imported) only with the key when `key_required`.
fn answer(target: &str, authorization: Option<&str>, key_required: bool) -> (u16, String) {
    match target {
        "/healthz" => (
            200,
            r#"{"status":"ok","sandboxes":2,"default_backend":"namespace"}"#.into(),
        ),
        "/images" if key_required && authorization != Some(&format!("Bearer {KEY}")) => (
            401,
            r#"{"code":"unauthorized","message":"missing or invalid API key"}"#.into(),
        ),
        "/images" => (200, images_body()),
        other => (
            404,
            format!(r#"{{"code":"not_found","message":"no endpoint GET {other}"}}"#),
        ),
    }
}

fn images_body() -> String {
    let image = |name: &str| api_types::ImageInfo {
        name: name.into(),
        owner: "*".into(),
        format: "builtin".into(),
        reference: None,
        id: None,
        layers: vec![],
        size_bytes: 0,
        entries: 0,
        dropped_devices: 0,
        env: Default::default(),
        working_dir: None,
        user: None,
        entrypoint: None,
        cmd: None,
        imported_at: 0,
    };
    serde_json::to_string(&api_types::ImageList {
        images: vec![image("default"), image("python-3.12")],
    })
    .expect("JSON")
}

/// Reads one request head from `stream` and answers it; the request's line is logged.
fn answer_one(mut stream: impl Read + Write, key_required: bool, log: &Mutex<Vec<String>>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut words = head.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let authorization = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("authorization"))
        .map(|(_, value)| value.trim());
    log.lock()
        .expect("request log")
        .push(format!("{method} {target}"));
    let (status, body) = answer(target, authorization, key_required);
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
}

type Log = Arc<Mutex<Vec<String>>>;

/// A fake daemon on a Unix socket under `dir`.
fn unix_daemon(dir: &Path) -> (std::path::PathBuf, Log) {
    let socket = dir.join("daemon.sock");
    let listener = UnixListener::bind(&socket).expect("bind the fake daemon");
    let log = Log::default();
    let seen = log.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            answer_one(stream, false, &seen);
        }
    });
    (socket, log)
}

/// A fake daemon on TCP that wants the key for `/images`, as over TCP a daemon does.
fn tcp_daemon() -> (String, Log) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake daemon");
    let address = format!("http://{}", listener.local_addr().expect("address"));
    let log = Log::default();
    let seen = log.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            answer_one(stream, true, &seen);
        }
    });
    (address, log)
}

/// `crucible doctor` run where there is no image (so a probe of this host would find none),
/// with none of the caller's settings.
fn doctor(cwd: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_crucible"));
    command
        .current_dir(cwd)
        .env_remove("CRUCIBLE_HOST")
        .env_remove("CRUCIBLE_API_KEY")
        .env_remove("CRUCIBLE_IMAGE");
    command
}

#[test]
fn doctor_with_host_asks_that_daemon_and_not_this_host() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (socket, log) = unix_daemon(dir.path());
    let out = run(crucible_at(&socket)
        .current_dir(dir.path())
        .env_remove("CRUCIBLE_IMAGE")
        .arg("doctor"));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(!has_control(&out.stdout), "{stdout:?}");
    let address = format!("unix:{}", socket.display());
    assert_eq!(
        stdout,
        format!(
            "daemon:            {address} answers (status ok)\n\
             sandboxes:         2\n\
             images:            default, python-3.12\n\
             sandboxes will use: namespace (the daemon's default backend)\n"
        )
    );
    assert_eq!(
        *log.lock().expect("log"),
        ["GET /healthz", "GET /images"],
        "asked the daemon"
    );

    let out = run(doctor(dir.path())
        .arg("--host")
        .arg(&socket)
        .args(["--json", "doctor"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor JSON");
    assert_eq!(report["daemon"]["address"], address.as_str());
    assert_eq!(report["daemon"]["reachable"], true);
    assert_eq!(report["daemon"]["sandboxes"], 2);
    assert_eq!(
        report["daemon"]["images"],
        serde_json::json!(["default", "python-3.12"])
    );
    assert_eq!(report["default_backend"], "namespace");
    assert!(report.get("host").is_none(), "this host probed: {report}");
    assert!(
        report.get("image").is_none(),
        "this directory probed: {report}"
    );
}

#[test]
fn doctor_sends_the_key_and_says_when_the_daemon_refuses_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (address, _log) = tcp_daemon();
    let out = run(doctor(dir.path())
        .env("CRUCIBLE_HOST", &address)
        .arg("doctor"));
    let stdout = text(&out.stdout);
    // The daemon runs: a refused key is no reason to fail, or to say nothing works.
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains(&format!(
            "daemon:            {address} answers (status ok)\n"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "images:            not listed: missing or invalid API key (HTTP 401, \
             unauthorized); give this daemon's key with --api-key or CRUCIBLE_API_KEY\n"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("nothing works"), "{stdout}");

    let out = run(doctor(dir.path())
        .env("CRUCIBLE_HOST", &address)
        .env("CRUCIBLE_API_KEY", KEY)
        .arg("doctor"));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("images:            default, python-3.12\n"),
        "{stdout}"
    );
}

#[test]
fn doctor_names_a_daemon_it_cannot_reach_and_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("none.sock");
    let out = run(doctor(dir.path()).arg("--host").arg(&missing).arg("doctor"));
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!(
            "daemon:            cannot reach unix:{}: No such file or directory (os error 2)\n",
            missing.display()
        )
    );

    // A port nobody listens on: bound, then released.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let address = format!("http://{closed}");
    let out = run(doctor(dir.path()).args(["--host", &address, "doctor"]));
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("daemon:            cannot reach {address}: Connection refused (os error 111)\n")
    );
    let out = run(doctor(dir.path()).args(["--json", "--host", &address, "doctor"]));
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor JSON");
    assert_eq!(report["daemon"]["address"], address.as_str());
    assert_eq!(report["daemon"]["reachable"], false);
    assert_eq!(
        report["daemon"]["error"],
        "Connection refused (os error 111)"
    );
    assert_eq!(report["default_backend"], "none");
}
