//! The `crucible` binary against a daemon that lies: a hostile one, or anyone who answers for
//! it on a plain-HTTP `--host`. What it answers never chooses where the CLI writes on this
//! host, and never reaches the operator's terminal as control characters.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use api_types::{
    BackendKind, CacheInfo, CacheList, ContainerInfo, ContainerList, ContainerState, ImageInfo,
    ImageList, SandboxInfo, SandboxList, SandboxState, SandboxTimings,
};
use wire::FrameType;

mod common;
use common::{crucible_at, has_control, run, text};

const ID: &str = "sb-00000000000000aa";

/// Text meant for a terminal: sets its title, clears the screen (C0 ESC and BEL, then the
/// one-byte C1 CSI), with a tab and a line break that would forge a line of output.
const HOSTILE: &str = "\x1b]0;pwned\x07\x1b[2J\u{9b}31m\tx\nlabel:    forged=1";
/// How `HOSTILE` is shown.
const HOSTILE_SHOWN: &str = "\\x1b]0;pwned\\x07\\x1b[2J\\u{9b}31m\\tx\\nlabel:    forged=1";

/// An answer: status and body.
type Answer = (u16, Vec<u8>);

/// A daemon on a Unix socket under `dir` that answers each request with what `answer` makes of
/// its method and target; every request it took is in the returned list.
fn fake_daemon(
    dir: &Path,
    answer: impl Fn(&str, &str) -> Answer + Send + 'static,
) -> (PathBuf, Arc<Mutex<Vec<String>>>) {
    let socket = dir.join("fake.sock");
    let listener = UnixListener::bind(&socket).expect("bind the fake daemon");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let Some((method, target)) = read_request(&mut stream) else {
                continue;
            };
            log.lock()
                .expect("request log")
                .push(format!("{method} {target}"));
            let (status, body) = answer(&method, &target);
            let head = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    });
    (socket, seen)
}

/// Reads one request (its head and a `Content-Length` body); its method and target.
fn read_request(stream: &mut UnixStream) -> Option<(String, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk).ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    let mut words = head.split_whitespace();
    Some((words.next()?.to_string(), words.next()?.to_string()))
}

fn json(value: &impl serde::Serialize) -> Answer {
    (200, serde_json::to_vec(value).expect("JSON"))
}

fn frames(stdout: &[u8], exit: Option<&wire::ExecResult>) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode_frames(FrameType::Stdout, stdout, &mut out);
    if let Some(result) = exit {
        wire::encode_frames(
            FrameType::Exit,
            &wire::encode_exit_payload(result),
            &mut out,
        );
    }
    out
}

fn container(name: &str) -> ContainerInfo {
    ContainerInfo {
        name: name.to_string(),
        image: "default".into(),
        state: ContainerState::Ready,
        command: vec!["sleep".into(), "300".into()],
        exec_id: None,
        restarts: 0,
        exit_code: None,
        error: String::new(),
    }
}

fn sandbox_info(text: &str) -> SandboxInfo {
    SandboxInfo {
        id: ID.into(),
        state: SandboxState::Running,
        backend: BackendKind::Namespace,
        hypervisor: None,
        image: format!("img{text}"),
        memory_mib: 512,
        vcpus: 1,
        created_at_ms: 0,
        expires_at_ms: 0,
        labels: BTreeMap::from([(format!("k{text}"), format!("v{text}"))]),
        timings: SandboxTimings::default(),
        active_execs: 0,
        error: format!("error{text}"),
        owner: Some(format!("owner{text}")),
        network: None,
        caches: vec![],
        volumes: vec![],
        disk_mib: None,
        user: None,
        containers: vec![ContainerInfo {
            error: format!("failed{text}"),
            image: format!("image{text}"),
            ..container(&format!("c{text}"))
        }],
        share_process_namespace: false,
        hostname: Some(format!("host{text}")),
    }
}

/// A daemon for `crucible run`: the job prints a line and exits 0; the sandbox has containers
/// named `names`, each of whose log is `pwned\n`.
fn daemon_for_run(dir: &Path, names: &[&str]) -> (PathBuf, Arc<Mutex<Vec<String>>>) {
    let containers = ContainerList {
        containers: names.iter().map(|name| container(name)).collect(),
    };
    fake_daemon(dir, move |method, target| {
        let sandbox = format!("/sandboxes/{ID}");
        match (method, target) {
            ("POST", "/sandboxes") => json(&sandbox_info("")),
            ("POST", t) if t == format!("{sandbox}/exec") => (
                200,
                frames(b"job ran\n", Some(&wire::ExecResult::default())),
            ),
            ("GET", t) if t == format!("{sandbox}/containers") => json(&containers),
            ("GET", t) if t.starts_with(&sandbox) && t.ends_with("/logs") => {
                (200, frames(b"pwned\n", None))
            }
            ("DELETE", t) if t == sandbox => (204, Vec::new()),
            _ => (
                404,
                br#"{"code":"not_found","message":"the fake daemon has no such thing"}"#.to_vec(),
            ),
        }
    })
}

fn crucible(socket: &Path) -> Command {
    crucible_at(socket)
}

/// Every file (not directory) under `dir`, symlinks included.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => found.extend(files_under(&path)),
            _ => found.push(path),
        }
    }
    found
}

#[test]
fn run_refuses_to_write_the_log_of_a_container_whose_name_is_a_path() {
    let root = tempfile::tempdir().expect("tempdir");
    let logs = root.path().join("a/b/logs");
    std::fs::create_dir_all(&logs).expect("mkdir");
    // Where the names lead: `logs/../../x.log` is `a/x.log`; an absolute name replaces the
    // directory altogether (made here so that following it would succeed).
    std::fs::create_dir_all(root.path().join("abs")).expect("mkdir");
    let absolute = format!("{}/abs/x", root.path().display());
    let daemon_dir = tempfile::tempdir().expect("tempdir");
    let (socket, seen) = daemon_for_run(daemon_dir.path(), &["db", "../../x", &absolute]);

    let out = run(crucible(&socket)
        .args(["run", "--service-logs"])
        .arg(&logs)
        .args(["--", "true"]));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "a crucible error: {stderr}");
    assert!(stderr.contains("\"../../x\""), "names the name: {stderr}");
    assert!(
        stderr.contains(&format!("{absolute:?}")),
        "names the name: {stderr}"
    );
    assert_eq!(
        files_under(root.path()),
        Vec::<PathBuf>::new(),
        "nothing is written, not even the good name's log: {stderr}"
    );
    let seen = seen.lock().expect("requests").clone();
    assert!(
        !seen.iter().any(|r| r.ends_with("/logs")),
        "no log is fetched for a refused list: {seen:?}"
    );
    assert!(
        seen.contains(&format!("DELETE /sandboxes/{ID}")),
        "the sandbox is deleted all the same: {seen:?}"
    );
}

#[test]
fn run_never_follows_a_symlink_planted_where_a_log_goes() {
    let root = tempfile::tempdir().expect("tempdir");
    let logs = root.path().join("logs");
    std::fs::create_dir_all(&logs).expect("mkdir");
    let target = root.path().join("precious");
    std::fs::write(&target, "precious\n").expect("write");
    std::os::unix::fs::symlink(&target, logs.join("db.log")).expect("symlink");
    let daemon_dir = tempfile::tempdir().expect("tempdir");
    let (socket, _) = daemon_for_run(daemon_dir.path(), &["db", "web"]);

    let out = run(crucible(&socket)
        .args(["run", "--service-logs"])
        .arg(&logs)
        .args(["--", "true"]));
    let stderr = text(&out.stderr);
    assert_eq!(
        std::fs::read_to_string(&target).expect("target"),
        "precious\n",
        "the symlink's target is untouched: {stderr}"
    );
    assert!(
        std::fs::symlink_metadata(logs.join("db.log"))
            .expect("db.log")
            .file_type()
            .is_symlink(),
        "the symlink stays"
    );
    assert!(
        stderr.contains("db.log") && stderr.contains("symbolic link"),
        "says which log was refused and why: {stderr}"
    );
    assert_eq!(text(&out.stdout), "job ran\n");
    assert_eq!(out.status.code(), Some(0), "the job's own status: {stderr}");
    assert_eq!(
        std::fs::read_to_string(logs.join("web.log")).expect("web.log"),
        "pwned\n",
        "the other logs are written"
    );
}

#[test]
fn what_a_daemon_says_reaches_the_terminal_escaped_and_json_exactly() {
    let daemon_dir = tempfile::tempdir().expect("tempdir");
    let info = sandbox_info(HOSTILE);
    let execs = wire::ExecList {
        execs: vec![wire::ExecStatus {
            exec_id: format!("ex{HOSTILE}"),
            cmd: vec!["sh".into(), "-c".into(), format!("echo {HOSTILE}")],
            state: wire::ExecState::Exited,
            pid: 7,
            started_unix_ms: 0,
            attached: false,
            keep: true,
            output_bytes: 0,
            output_kept_from: 0,
            result: Some(wire::ExecResult {
                signal: format!("SIG{HOSTILE}"),
                ..wire::ExecResult::default()
            }),
            stdin_bytes: None,
            stdin_closed: false,
        }],
    };
    let images = ImageList {
        images: vec![ImageInfo {
            name: format!("name{HOSTILE}"),
            owner: format!("owner{HOSTILE}"),
            format: format!("format{HOSTILE}"),
            reference: None,
            id: None,
            layers: vec![],
            size_bytes: 0,
            entries: 0,
            dropped_devices: 0,
            env: BTreeMap::new(),
            working_dir: Some(format!("/wd{HOSTILE}")),
            user: None,
            entrypoint: None,
            cmd: None,
            imported_at: 0,
        }],
    };
    let caches = CacheList {
        caches: vec![CacheInfo {
            name: format!("cache{HOSTILE}"),
            owner: format!("owner{HOSTILE}"),
            backend: BackendKind::Namespace,
            size_mib: 1,
            used_mib: 1,
            in_use_by: Some(format!("sb{HOSTILE}")),
            users: vec![format!("sb{HOSTILE}"), format!("sb2{HOSTILE}")],
            saved_by: Some(format!("sb3{HOSTILE}")),
            created_at_ms: 0,
        }],
    };
    let answers = BTreeMap::from([
        (format!("GET /sandboxes/{ID}"), json(&info).1),
        (
            "GET /sandboxes".to_string(),
            json(&SandboxList {
                sandboxes: vec![SandboxInfo {
                    id: format!("sb{HOSTILE}"),
                    ..info.clone()
                }],
            })
            .1,
        ),
        (format!("GET /sandboxes/{ID}/execs"), json(&execs).1),
        ("GET /images".to_string(), json(&images).1),
        ("GET /caches".to_string(), json(&caches).1),
    ]);
    let (socket, _) = fake_daemon(daemon_dir.path(), move |method, target| {
        match answers.get(&format!("{method} {target}")) {
            Some(body) => (200, body.clone()),
            None => (
                404,
                serde_json::to_vec(&wire::ErrorBody::new("not_found", format!("no{HOSTILE}")))
                    .expect("JSON"),
            ),
        }
    });

    for args in [
        vec!["sandbox", "get", ID],
        vec!["sandbox", "ls"],
        vec!["sandbox", "ps", ID],
        vec!["image", "ls"],
        vec!["cache", "ls"],
        vec!["sandbox", "get", "sb-00000000000000bb"],
    ] {
        let out = run(crucible(&socket).args(&args));
        assert!(
            !has_control(&out.stdout) && !has_control(&out.stderr),
            "{args:?} printed control characters: {:?} {:?}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let shown = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(
            shown.contains(HOSTILE_SHOWN),
            "{args:?} shows the text escaped: {shown}"
        );
        assert!(
            !shown
                .lines()
                .any(|line| line.starts_with("label:    forged")),
            "{args:?} forged a line: {shown}"
        );
    }
    let out = run(crucible(&socket).args(["sandbox", "get", ID]));
    assert!(
        text(&out.stdout).contains(&format!("label:    k{HOSTILE_SHOWN}=v{HOSTILE_SHOWN}\n")),
        "{}",
        text(&out.stdout)
    );
    let out = run(crucible(&socket).args(["sandbox", "get", "sb-00000000000000bb"]));
    assert_eq!(
        text(&out.stderr),
        format!("crucible: error: no{HOSTILE_SHOWN} (HTTP 404, not_found)\n"),
        "a relayed error is one line, escaped"
    );

    // --json gives the daemon's text exactly (JSON escapes it).
    let out = run(crucible(&socket).args(["--json", "sandbox", "get", ID]));
    let got: SandboxInfo = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(got, info);
    let out = run(crucible(&socket).args(["--json", "sandbox", "ps", ID]));
    let got: wire::ExecList = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(got, execs);
}
