//! The `crucible` binary as a user runs it, against a real daemon.

use std::io::Write;
use std::process::{Command, Stdio};

use api_types::CreateSandbox;
use harness::TestDaemon;

mod common;
use common::{crucible_at, has_control, run, text};

fn crucible(daemon: &TestDaemon) -> Command {
    crucible_at(&daemon.socket)
}

fn sandbox(daemon: &TestDaemon) -> String {
    let out = run(crucible(daemon).args(["sandbox", "create"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_string()
}

/// `crucible sandbox exec ID -- sh -c SCRIPT`, which must succeed; its stdout.
fn sh_in(daemon: &TestDaemon, id: &str, script: &str) -> String {
    let out = run(crucible(daemon).args(["sandbox", "exec", id, "--", "sh", "-c", script]));
    assert!(out.status.success(), "{script}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// A file's modification time, in seconds since the epoch.
fn mtime_secs(meta: &std::fs::Metadata) -> u64 {
    meta.modified()
        .expect("mtime")
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs()
}

#[test]
fn run_streams_output_and_exits_with_the_command_status() {
    let daemon = TestDaemon::start();
    let out =
        run(crucible(&daemon).args(["run", "--", "sh", "-c", "echo hi; echo warn >&2; exit 3"]));
    assert_eq!(text(&out.stdout), "hi\n");
    assert_eq!(text(&out.stderr), "warn\n");
    assert_eq!(out.status.code(), Some(3));
    let left = run(crucible(&daemon).args(["--json", "sandbox", "ls"]));
    let list: serde_json::Value = serde_json::from_slice(&left.stdout).expect("JSON");
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(0),
        "run deletes its sandbox"
    );
}

#[test]
fn exit_codes_map_signals_timeouts_and_missing_commands() {
    let daemon = TestDaemon::start();
    let id = sandbox(&daemon);
    for (options, cmd, code) in [
        (vec![], vec!["sh", "-c", "kill -KILL $$"], 137),
        (vec![], vec!["sh", "-c", "kill -TERM $$"], 143),
        (vec!["--timeout", "1"], vec!["sleep", "30"], 124),
        (vec![], vec!["no-such-command"], 127),
        (vec![], vec!["true"], 0),
    ] {
        let out = run(crucible(&daemon)
            .args(["sandbox", "exec"])
            .args(&options)
            .args([id.as_str(), "--"])
            .args(&cmd));
        assert_eq!(
            out.status.code(),
            Some(code),
            "{cmd:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn json_output_everywhere() {
    let daemon = TestDaemon::start();
    let out = run(crucible(&daemon).args(["--json", "sandbox", "create", "--label", "team=ci"]));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("create JSON");
    let id = info["id"].as_str().expect("id").to_string();
    assert_eq!(info["labels"]["team"], "ci");
    let out = run(crucible(&daemon).args(["--json", "sandbox", "get", &id]));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("get JSON");
    assert_eq!(got["state"], "running");
    let out = run(crucible(&daemon).args([
        "--json",
        "sandbox",
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo o; echo e >&2; exit 2",
    ]));
    let exec: serde_json::Value = serde_json::from_slice(&out.stdout).expect("exec JSON");
    assert_eq!(exec["stdout"], "o\n");
    assert_eq!(exec["stderr"], "e\n");
    assert_eq!(exec["result"]["exit_code"], 2);
    assert_eq!(out.status.code(), Some(2));
    let out =
        run(crucible(&daemon).args(["--json", "sandbox", "exec", "--stats", &id, "--", "true"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    // With --host, doctor asks that daemon, not this host.
    let out = run(crucible(&daemon).args(["--json", "doctor"]));
    let doctor: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor JSON");
    assert_eq!(doctor["daemon"]["reachable"], true, "{doctor}");
    assert_eq!(
        doctor["default_backend"],
        daemon.state.default_backend().to_string()
    );
    assert!(doctor.get("host").is_none(), "{doctor}");
}

#[test]
fn errors_are_one_clear_line() {
    let daemon = TestDaemon::start_with(|c| {
        c.tcp = Some("127.0.0.1:0".parse().expect("addr"));
        c.api_keys = harness::keys(&["right-key"]);
    });
    let unreachable = run(Command::new(env!("CARGO_BIN_EXE_crucible")).args([
        "--host",
        "/nonexistent/crucible.sock",
        "sandbox",
        "ls",
    ]));
    let tcp = format!("http://{}", daemon.tcp.expect("tcp"));
    let bad_auth = run(Command::new(env!("CARGO_BIN_EXE_crucible")).args([
        "--host",
        &tcp,
        "--api-key",
        "wrong-key",
        "sandbox",
        "ls",
    ]));
    let unknown = run(Command::new(env!("CARGO_BIN_EXE_crucible")).args([
        "--host",
        &tcp,
        "--api-key",
        "right-key",
        "sandbox",
        "get",
        "sb-0123456789abcdef",
    ]));
    for (out, needle) in [
        (
            &unreachable,
            "cannot connect to the crucible daemon at unix:/nonexistent/crucible.sock",
        ),
        (&bad_auth, "missing or invalid API key"),
        (&unknown, "no sandbox with id \"sb-0123456789abcdef\""),
    ] {
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.starts_with("crucible: error: "), "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
        assert!(
            !stderr.contains("Error {") && !stderr.contains("Api {"),
            "no debug dump: {stderr}"
        );
    }
    // The cause follows the message, once.
    assert_eq!(
        text(&unreachable.stderr),
        "crucible: error: cannot connect to the crucible daemon at \
         unix:/nonexistent/crucible.sock: No such file or directory (os error 2)\n"
    );
}

#[test]
fn shell_runs_a_session_from_piped_stdin() {
    let daemon = TestDaemon::start();
    let id = sandbox(&daemon);
    let mut child = crucible(&daemon)
        .args(["shell", &id])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("shell");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"cd /tmp\necho now in $(pwd)\nexit 3\n")
        .expect("type");
    let out = child.wait_with_output().expect("wait");
    assert!(
        text(&out.stdout).contains("now in /tmp"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(3));

    // Ctrl-D (EOF) ends the session cleanly.
    let out = crucible(&daemon)
        .args(["sandbox", "exec", "-i", &id, "--", "cat"])
        .stdin(Stdio::null())
        .output()
        .expect("exec -i");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn exec_t_runs_the_command_on_a_terminal_and_it_takes_keys_from_this_one() {
    let daemon = TestDaemon::start();
    let id = sandbox(&daemon);
    // -t alone: a terminal whose size is the default here (stdout is a pipe), stderr on it.
    let out = run(crucible(&daemon).args([
        "sandbox",
        "exec",
        "-t",
        &id,
        "--",
        "sh",
        "-c",
        "tty; stty size; echo on-stderr >&2; exit 4",
    ]));
    let shown = text(&out.stdout);
    assert!(shown.starts_with("/dev/pts/"), "{shown:?}");
    assert!(shown.ends_with("\r\n24 80\r\non-stderr\r\n"), "{shown:?}");
    assert_eq!(text(&out.stderr), "");
    assert_eq!(out.status.code(), Some(4));

    // -it from something that is not a terminal is refused, as Docker refuses it.
    let out = crucible(&daemon)
        .args(["sandbox", "exec", "-it", &id, "--", "cat"])
        .stdin(Stdio::null())
        .output()
        .expect("exec -it");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("stdin is not a terminal"),
        "{}",
        text(&out.stderr)
    );

    // -it on a terminal (script(1) gives it one): what is typed reaches the command through
    // its terminal, which echoes it, and Ctrl-D at the start of a line ends its input.
    let command = format!(
        "{} --host {} sandbox exec -it {id} -- sh -c 'read line; echo got $line; cat; echo cat-ended'",
        env!("CARGO_BIN_EXE_crucible"),
        daemon.socket.display()
    );
    let mut script = Command::new("script")
        .args(["-q", "-e", "-c", &command, "/dev/null"])
        .env_remove("CRUCIBLE_API_KEY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script(1) runs");
    let mut keys = script.stdin.take().expect("piped");
    keys.write_all(b"typed\r").expect("type");
    std::thread::sleep(std::time::Duration::from_millis(500));
    keys.write_all(b"\x04").expect("Ctrl-D");
    let out = script.wait_with_output().expect("script ends");
    let shown = text(&out.stdout);
    assert!(
        shown.contains("got typed"),
        "{shown:?} {}",
        text(&out.stderr)
    );
    assert!(
        shown.contains("cat-ended"),
        "{shown:?} {}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{shown:?}");
}

#[test]
fn cp_round_trips_a_directory_tree_byte_for_byte() {
    let daemon = TestDaemon::start();
    let id = sandbox(&daemon);
    let local = tempfile::tempdir().expect("tempdir");
    let tree = local.path().join("project");
    std::fs::create_dir_all(tree.join("src/nested")).expect("mkdir");
    let blob: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("README", b"read me\n".to_vec()),
        ("src/main.rs", b"fn main() {}\n".to_vec()),
        ("src/nested/blob.bin", blob),
        ("src/nested/empty", Vec::new()),
    ];
    for (rel, data) in &files {
        std::fs::write(tree.join(rel), data).expect("write");
    }
    let up =
        run(crucible(&daemon).args(["cp", tree.to_str().expect("utf8"), &format!("{id}:/work")]));
    assert!(up.status.success(), "{}", text(&up.stderr));
    let back = local.path().join("back");
    std::fs::create_dir_all(&back).expect("mkdir");
    for (rel, data) in &files {
        let dest = back.join(rel.replace('/', "_"));
        let down = run(crucible(&daemon).args([
            "cp",
            &format!("{id}:/work/project/{rel}"),
            dest.to_str().expect("utf8"),
        ]));
        assert!(down.status.success(), "{rel}: {}", text(&down.stderr));
        assert!(
            std::fs::read(&dest).expect("read") == *data,
            "{rel} differs"
        );
    }
    let out = run(crucible(&daemon).args(["cp", &format!("{id}:/work/project/README"), "-"]));
    assert_eq!(out.stdout, b"read me\n");
}

#[test]
fn cp_down_keeps_the_files_mode_and_time_but_never_setuid() {
    use std::os::unix::fs::PermissionsExt;
    let daemon = TestDaemon::start();
    let id = sandbox(&daemon);
    let made = sh_in(
        &daemon,
        &id,
        "printf '#!/bin/sh\\necho hi\\n' > /tmp/tool && chmod 0750 /tmp/tool && \
         touch -d '2020-01-02 03:04:05' /tmp/tool && \
         cp -p /tmp/tool /tmp/planted && chmod 6755 /tmp/planted && stat -c %a /tmp/planted",
    );
    assert_eq!(made, "6755\n", "setuid and setgid in the sandbox");
    let local = tempfile::tempdir().expect("tempdir");
    for (file, want) in [("tool", 0o750), ("planted", 0o755)] {
        let dest = local.path().join(file);
        let out = run(crucible(&daemon).args([
            "cp",
            &format!("{id}:/tmp/{file}"),
            dest.to_str().expect("utf8"),
        ]));
        assert!(out.status.success(), "{file}: {}", text(&out.stderr));
        let meta = std::fs::metadata(&dest).expect("downloaded");
        assert_eq!(
            meta.permissions().mode() & 0o7777,
            want,
            "{file}: mode {:o}",
            meta.permissions().mode()
        );
        let modified = mtime_secs(&meta);
        // 2020-01-02 03:04:05 in the sandbox's zone (UTC: it has no /etc/localtime).
        assert_eq!(modified, 1_577_934_245, "{file}: time kept");
    }
}

#[test]
fn cp_down_of_a_directory_brings_the_tree_with_modes_times_and_links() {
    use std::os::unix::fs::PermissionsExt;
    let daemon = TestDaemon::start();
    let id = sandbox(&daemon);
    sh_in(
        &daemon,
        &id,
        "mkdir -p /work/build/bin /work/build/lib /work/build/empty && \
         printf 'tool' > /work/build/bin/tool && chmod 0750 /work/build/bin/tool && \
         printf 'data' > /work/build/lib/a.txt && ln -s ../bin/tool /work/build/lib/tool && \
         touch -d '2020-01-02 03:04:05' /work/build/bin/tool && chmod 0700 /work/build/lib",
    );
    let local = tempfile::tempdir().expect("tempdir");
    // Into an existing directory: beneath it, under the directory's own name.
    let out = run(crucible(&daemon).args([
        "--json",
        "cp",
        &format!("{id}:/work/build"),
        local.path().to_str().expect("utf8"),
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let counts: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(counts["files"], 2, "{counts}");
    assert_eq!(counts["links"], 1, "{counts}");
    assert_eq!(counts["dirs"], 4, "{counts}");
    let tree = local.path().join("build");
    let tool = tree.join("bin/tool");
    assert_eq!(std::fs::read(&tool).expect("tool"), b"tool");
    let meta = std::fs::metadata(&tool).expect("tool");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o750);
    let modified = mtime_secs(&meta);
    assert_eq!(modified, 1_577_934_245);
    assert_eq!(
        std::fs::read_link(tree.join("lib/tool")).expect("link"),
        std::path::Path::new("../bin/tool")
    );
    assert_eq!(
        std::fs::read(tree.join("lib/a.txt")).expect("a.txt"),
        b"data"
    );
    let lib = std::fs::metadata(tree.join("lib")).expect("lib");
    assert_eq!(lib.permissions().mode() & 0o777, 0o700);
    assert!(tree.join("empty").is_dir());

    // The agent writes the archive: a sandbox without `tar` (or with a forged one) changes
    // nothing. (A forged archive is the extractor's unit test: `cp_dir::tests`.)
    sh_in(
        &daemon,
        &id,
        "rm /bin/tar && printf '#!/bin/sh\\nexit 3\\n' > /bin/tar && chmod 755 /bin/tar",
    );
    let dest = local.path().join("nested/out");
    std::fs::create_dir_all(local.path().join("nested")).expect("mkdir");
    let out = run(crucible(&daemon).args([
        "cp",
        &format!("{id}:/work/build"),
        dest.to_str().expect("utf8"),
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(dest.join("bin/tool")).expect("tool"), b"tool");
    assert_eq!(
        std::fs::metadata(dest.join("bin/tool"))
            .expect("tool")
            .permissions()
            .mode()
            & 0o7777,
        0o750
    );
}

#[test]
fn completions_and_man_page_are_generated() {
    let out = run(Command::new(env!("CARGO_BIN_EXE_crucible")).args(["completions", "bash"]));
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("crucible"));
    let out = run(Command::new(env!("CARGO_BIN_EXE_crucible")).arg("man"));
    assert!(out.status.success());
    assert!(text(&out.stdout).contains(".TH crucible"));
}

#[test]
fn doctor_with_host_reports_that_daemon_not_this_directory() {
    let daemon = TestDaemon::start();
    let id = sandbox(&daemon);
    // Where a probe of this host would find no image, and so nothing that works.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let out = run(crucible(&daemon)
        .current_dir(elsewhere.path())
        .env_remove("CRUCIBLE_IMAGE")
        .arg("doctor"));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let backend = daemon.state.default_backend();
    for line in [
        format!(
            "daemon:            unix:{} answers (status ok)\n",
            daemon.socket.display()
        ),
        "sandboxes:         1\n".to_string(),
        format!("sandboxes will use: {backend} (the daemon's default backend)\n"),
    ] {
        assert!(stdout.contains(&line), "no {line:?} in:\n{stdout}");
    }
    assert!(stdout.contains("\nimages:            default"), "{stdout}");
    for local in ["KVM:", "image:", "nothing works"] {
        assert!(!stdout.contains(local), "{local} in:\n{stdout}");
    }
    run(crucible(&daemon).args(["sandbox", "rm", &id]));
}

/// The long options `crucible ARGS` (a help request) lists: the first words of its option
/// lines (`  -h, --help`, `      --host <ADDR>`), not the prose that may name them.
fn listed_options(args: &[&str]) -> Vec<String> {
    let out = run(Command::new(env!("CARGO_BIN_EXE_crucible")).args(args));
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with('-'))
        .filter_map(|line| {
            line.split_whitespace()
                .map(|word| word.trim_end_matches(','))
                .find(|word| word.starts_with("--"))
                .map(String::from)
        })
        .collect()
}

#[test]
fn serve_help_shows_the_daemons_options_only() {
    for args in [
        &["serve", "--help"][..],
        &["serve", "-h"],
        &["help", "serve"],
    ] {
        let listed = listed_options(args);
        for client_option in ["--host", "--api-key", "--json"] {
            assert!(
                !listed.iter().any(|o| o == client_option),
                "{args:?}: {listed:?}"
            );
        }
        for own in ["--socket", "--listen", "--api-keys-file", "--help"] {
            assert!(listed.iter().any(|o| o == own), "{args:?}: {listed:?}");
        }
    }
    // Every client command keeps them.
    for args in [
        &["--help"][..],
        &["sandbox", "--help"],
        &["sandbox", "ls", "--help"],
    ] {
        let listed = listed_options(args);
        for client_option in ["--host", "--api-key", "--json"] {
            assert!(
                listed.iter().any(|o| o == client_option),
                "{args:?}: {listed:?}"
            );
        }
    }
}

/// `crucible ARGS` with a private socket and directories, given `env`; its output once it
/// ended, which must be within 10 s: these must fail before a daemon starts.
fn serve_failure(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_crucible"));
    command
        .args(args)
        .arg("--socket")
        .arg(dir.path().join("crucible.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env_remove("CRUCIBLE_HOST")
        .env_remove("CRUCIBLE_API_KEY")
        .env_remove("CRUCIBLE_API_KEYS")
        .env_remove("CRUCIBLE_ADMIN_KEY_NAME")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("crucible runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("crucible {args:?} started a daemon");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn serve_refuses_client_options_and_leaves_the_clients_environment_alone() {
    // `dockerd --host` is where Docker's daemon listens; crucible's is --socket / --listen.
    for (args, says) in [
        (&["serve", "--host", "0.0.0.0:7070"][..], "--listen"),
        (&["--host", "/tmp/d.sock", "serve"], "--listen"),
        (&["serve", "--api-key", "k"], "--api-keys-file"),
        (&["--json", "serve"], "--json"),
    ] {
        let out = serve_failure(args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(
            stderr.contains("Usage: crucible serve"),
            "{args:?}: {stderr}"
        );
    }
    // The client's CRUCIBLE_HOST and CRUCIBLE_API_KEY neither stop the daemon nor give it a
    // key: TCP without keys is still refused, by the daemon itself.
    let out = serve_failure(
        &["serve", "--listen", "127.0.0.1:0"],
        &[
            ("CRUCIBLE_HOST", "http://127.0.0.1:7070"),
            ("CRUCIBLE_API_KEY", "s3cr3t"),
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.starts_with("crucible: error: listening on TCP (127.0.0.1:0) requires API keys"),
        "{stderr}"
    );
}

#[test]
fn create_request_flags_reach_the_daemon() {
    let daemon = TestDaemon::start();
    let out = run(crucible(&daemon).args([
        "--json",
        "sandbox",
        "create",
        "--memory",
        "256",
        "--ttl",
        "600",
        "--env",
        "GREETING=hi",
    ]));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(info["memory_mib"], 256);
    let id = info["id"].as_str().expect("id");
    let out =
        run(crucible(&daemon).args(["sandbox", "exec", id, "--", "sh", "-c", "echo $GREETING"]));
    assert_eq!(text(&out.stdout), "hi\n");
    let _ = CreateSandbox::default();
    let out = run(crucible(&daemon).args(["sandbox", "rm", id]));
    assert!(out.status.success());
}

/// Runs `crucible serve` expecting it to refuse to start; a daemon that starts anyway is
/// stopped after 10 s and fails the test.
#[test]
fn run_ends_with_the_destinations_its_egress_refused_and_why() {
    let daemon = TestDaemon::start_with(|config| {
        config.egress_allow = vec!["127.0.0.1:9".into()];
    });
    let out = run(crucible(&daemon).args([
        "run",
        "--allow",
        "127.0.0.1:9",
        "--",
        "sh",
        "-c",
        "wget -q -O- http://denied.test/ 2>/dev/null; wget -q -O- http://denied.test/ 2>/dev/null; exit 0",
    ]));
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("crucible: egress refused 2 connections to 1 destination"),
        "{said}"
    );
    assert!(
        said.contains("  denied.test:80 (2x): crucible egress: denied.test:80 is not allowed"),
        "{said}"
    );
    // Nothing refused: nothing said.
    let out = run(crucible(&daemon).args(["run", "--allow", "127.0.0.1:9", "--", "true"]));
    assert_eq!(text(&out.stderr), "");
}

/// The finding of issue 42: a build that outgrew the in-memory writable layer failed with
/// ENOSPC, and nothing said that the sandbox's layer was full or that `--disk` makes it larger.
#[test]
fn a_job_that_fills_its_writable_layer_is_told_to_give_disk() {
    let daemon = TestDaemon::start();
    let out = run(crucible(&daemon).args([
        "run",
        "--memory",
        "64",
        "--",
        "sh",
        "-c",
        "dd if=/dev/zero of=/big bs=1M count=100 2>/dev/null || { echo dd failed; exit 3; }",
    ]));
    assert_eq!(text(&out.stdout), "dd failed\n", "{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(3));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("writable layer was full") && stderr.contains("--disk MIB"),
        "{stderr}"
    );
    // A job that fails for another reason is not told about its layer.
    let out = run(crucible(&daemon).args(["run", "--", "sh", "-c", "exit 4"]));
    assert_eq!(out.status.code(), Some(4));
    assert!(
        !text(&out.stderr).contains("writable layer"),
        "{}",
        text(&out.stderr)
    );
}

/// The finding of issue 42: `nproc` said the host's CPU count inside a 1-vCPU sandbox, so
/// `make -j$(nproc)`, cargo and Go ran twice the jobs they had CPU for. It now counts the
/// sandbox's vCPUs, at most the host's CPUs.
#[test]
fn nproc_inside_a_sandbox_counts_its_vcpus() {
    let daemon = TestDaemon::start();
    let host = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (flags, expected) in [(&[][..], 1), (&["--vcpus", "2"][..], host.min(2))] {
        let out = run(crucible(&daemon)
            .arg("run")
            .args(flags)
            .args(["--", "nproc"]));
        assert_eq!(
            (text(&out.stdout), out.status.code()),
            (format!("{expected}\n"), Some(0)),
            "{flags:?}: {}",
            text(&out.stderr)
        );
    }
    if host < 2 {
        return;
    }
    // Live sandboxes spread over the CPUs; one that goes gives its CPU to the next.
    let cpus_of = |id: &str| sh_in(&daemon, id, "grep Cpus_allowed_list /proc/self/status");
    let (a, b) = (sandbox(&daemon), sandbox(&daemon));
    let (cpu_a, cpu_b) = (cpus_of(&a), cpus_of(&b));
    assert_ne!(cpu_a, cpu_b, "two 1-vCPU sandboxes on one CPU of {host}");
    let out = run(crucible(&daemon).args(["sandbox", "rm", &a]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let c = sandbox(&daemon);
    assert_eq!(cpus_of(&c), cpu_a, "the CPU the deleted sandbox left");
}

#[test]
fn json_run_keep_reports_the_kept_sandbox() {
    let daemon = TestDaemon::start();
    let out = run(crucible(&daemon).args(["--json", "run", "--keep", "--", "sh", "-c", "exit 2"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(shown["exit_code"], 2, "{shown}");
    let id = shown["sandbox"]
        .as_str()
        .expect("the kept sandbox's id")
        .to_string();
    let kept = run(crucible(&daemon).args(["--json", "sandbox", "get", &id]));
    assert!(kept.status.success(), "kept: {}", text(&kept.stderr));
    // Without --keep the result is as before: nothing names a sandbox that is gone.
    let out = run(crucible(&daemon).args(["--json", "run", "--", "true"]));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(shown.get("sandbox").is_none(), "{shown}");
}

#[test]
fn a_daemon_logging_to_a_file_writes_no_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("crucible.sock");
    let log = std::fs::File::create(dir.path().join("serve.log")).expect("log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_crucible"))
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--image")
        .arg(harness::image_dir())
        .arg("--cgroup-parent")
        .arg(format!("crucible-cli-colour-{}", std::process::id()))
        .env_remove("CRUCIBLE_API_KEYS")
        .env_remove("CRUCIBLE_ADMIN_KEY_NAME")
        .env_remove("CRUCIBLE_LOG")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("crucible serve runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !socket.exists() && std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!(
                "crucible serve ended ({status}): {}",
                std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // A sandbox made and removed: the daemon logs both.
    let made = run(crucible_at(&socket).args(["sandbox", "create"]));
    let id = text(&made.stdout).trim().to_string();
    let removed = run(crucible_at(&socket).args(["sandbox", "rm", &id]));
    // SIGTERM: the daemon logs its shutdown.
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(made.status.success(), "{}", text(&made.stderr));
    assert!(removed.status.success(), "{}", text(&removed.stderr));
    let logged = std::fs::read_to_string(dir.path().join("serve.log")).expect("read log");
    assert!(
        logged.contains("INFO"),
        "the daemon logs its shutdown: {logged:?}"
    );
    assert!(
        !logged.contains('\x1b'),
        "colour codes in a file: {logged:?}"
    );
}

fn serve_refusal(configure: impl FnOnce(&mut Command)) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_crucible"));
    command
        .arg("serve")
        .arg("--socket")
        .arg(dir.path().join("crucible.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env_remove("CRUCIBLE_API_KEYS")
        .env_remove("CRUCIBLE_ADMIN_KEY_NAME")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    configure(&mut command);
    let mut child = command.spawn().expect("crucible serve runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("crucible serve started instead of refusing its keys");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with("crucible: error: API keys: "),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cr3t"), "a key in the error: {stderr}");
    stderr
}

fn keys_file(dir: &std::path::Path, text: &str, mode: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("keys-{mode:o}"));
    std::fs::write(&path, text).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

#[test]
fn serve_refuses_bad_api_keys_naming_the_entry_never_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stderr = serve_refusal(|c| {
        c.env("CRUCIBLE_API_KEYS", "ci:s3cr3t-1,b@d:s3cr3t-2");
    });
    assert!(
        stderr.contains("CRUCIBLE_API_KEYS entry 2: the key name"),
        "{stderr}"
    );

    let open = keys_file(dir.path(), "ci:s3cr3t\n", 0o644);
    let stderr = serve_refusal(|c| {
        c.arg("--api-keys-file").arg(&open);
    });
    assert!(
        stderr.contains("mode 0644") && stderr.contains("chmod 600"),
        "{stderr}"
    );
    // The flag's former name still works.
    let stderr = serve_refusal(|c| {
        c.arg("--keys-file").arg(&open);
    });
    assert!(stderr.contains("mode 0644"), "{stderr}");

    let duplicated = keys_file(dir.path(), "# keys\nci:s3cr3t-1\nci:s3cr3t-2\n", 0o600);
    let stderr = serve_refusal(|c| {
        c.arg("--api-keys-file").arg(&duplicated);
    });
    assert!(
        stderr.contains("line 3: the key name \"ci\" is already used by")
            && stderr.contains("line 2"),
        "{stderr}"
    );

    let stderr = serve_refusal(|c| {
        c.env("CRUCIBLE_API_KEYS", "ci:s3cr3t-1")
            .args(["--admin-key-name", "ops"]);
    });
    assert!(
        stderr.contains("the admin key name \"ops\" names no configured API key"),
        "{stderr}"
    );
}

#[test]
fn image_import_takes_directories_archives_and_stdin_and_ls_inspect_rm_manage_them() {
    let daemon = TestDaemon::start();
    let dir = tempfile::tempdir().expect("tempdir");
    // A root filesystem directory: the busybox tree plus a file owned by a user.
    let root = dir.path().join("root");
    let status = Command::new("cp")
        .arg("-a")
        .arg(harness::image_dir().join("rootfs"))
        .arg(&root)
        .status()
        .expect("cp");
    assert!(status.success());
    std::fs::write(root.join("etc/from-dir"), "dir import\n").expect("write");
    std::os::unix::fs::chown(root.join("etc/from-dir"), Some(1234), Some(4321)).expect("chown");
    let out = run(crucible(&daemon)
        .arg("image")
        .arg("import")
        .arg("fromdir")
        .arg(&root));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "fromdir\n");
    assert!(
        text(&out.stderr).contains("imported fromdir (rootfs"),
        "{}",
        text(&out.stderr)
    );

    // An OCI layout directory, and a docker save archive on stdin.
    let layout = dir.path().join("layout");
    oci::write::oci_layout(&layout, &harness::images::two_layer_image(true)).expect("layout");
    let out = run(crucible(&daemon)
        .args(["image", "import", "fromlayout"])
        .arg(&layout));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let docker = dir.path().join("docker.tar");
    oci::write::docker_archive(&docker, &harness::images::two_layer_image(false)).expect("docker");
    let out = run(crucible(&daemon)
        .args(["image", "import", "fromstdin", "-"])
        .stdin(std::fs::File::open(&docker).expect("open")));
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = run(crucible(&daemon).args(["image", "ls"]));
    let listing = text(&out.stdout);
    for (name, format) in [
        ("default", "builtin"),
        ("fromdir", "rootfs"),
        ("fromlayout", "oci"),
        ("fromstdin", "docker_save"),
    ] {
        assert!(
            listing
                .lines()
                .any(|l| l.starts_with(name) && l.contains(format)),
            "{name} {format}: {listing}"
        );
    }
    let out = run(crucible(&daemon).args(["image", "inspect", "fromlayout"]));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(info["working_dir"], "/opt/app");
    assert_eq!(info["user"]["uid"], 1000);

    // The directory's owners survive the trip.
    let out = run(crucible(&daemon).args([
        "run",
        "--image",
        "fromdir",
        "--",
        "sh",
        "-c",
        "cat /etc/from-dir; stat -c %u:%g /etc/from-dir",
    ]));
    assert_eq!(
        text(&out.stdout),
        "dir import\n1234:4321\n",
        "{}",
        text(&out.stderr)
    );

    // prune: nothing has been idle an hour; with a prefix, only those names; then the rest.
    let out = run(crucible(&daemon).args(["image", "prune", "--unused-for", "1h"]));
    assert_eq!(
        (text(&out.stdout).as_str(), out.status.success()),
        ("", true),
        "{}",
        text(&out.stderr)
    );
    let out = run(crucible(&daemon).args(["image", "prune", "--prefix", "fromd"]));
    assert_eq!(text(&out.stdout), "fromdir\n", "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("removed 1 image(s)"));
    let out = run(crucible(&daemon).args(["--json", "image", "prune"]));
    let pruned: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        pruned["removed"],
        serde_json::json!(["fromlayout", "fromstdin"])
    );
    assert!(pruned["reclaimed_bytes"].as_u64().is_some_and(|b| b > 0));
    let out = run(crucible(&daemon).args(["image", "prune", "--unused-for", "soon"]));
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let out = run(crucible(&daemon).args(["image", "rm", "fromdir"]));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no image named"),
        "{}",
        text(&out.stderr)
    );
    // A source that is not there is one clear line, before anything is sent.
    let out = run(crucible(&daemon).args(["image", "import", "x", "/nonexistent/archive.tar"]));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("/nonexistent/archive.tar"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn exec_user_ulimit_and_kill_of_one_named_command() {
    let daemon = TestDaemon::start();
    let id = sandbox(&daemon);
    let out = run(crucible(&daemon).args([
        "sandbox",
        "exec",
        "--user",
        "4321:99",
        "--group-add",
        "77",
        "--ulimit",
        "nofile=64:128",
        "--ulimit",
        "core=0",
        id.as_str(),
        "--",
        "sh",
        "-c",
        "id -u; id -G; ulimit -n; ulimit -Hn; ulimit -c",
    ]));
    assert_eq!(
        (text(&out.stdout).as_str(), out.status.code()),
        ("4321\n99 77\n64\n128\n0\n", Some(0)),
        "{}",
        text(&out.stderr)
    );
    let bad =
        run(crucible(&daemon).args(["sandbox", "exec", "--ulimit", "files=1", &id, "--", "true"]));
    assert_eq!(
        bad.status.code(),
        Some(125),
        "a usage error is crucible's own (125)"
    );
    assert!(
        text(&bad.stderr).contains("nofile"),
        "{}",
        text(&bad.stderr)
    );

    // A named command in the background, killed alone with TERM; the exec reports 143.
    let mut long = crucible(&daemon)
        .args([
            "sandbox",
            "exec",
            "--exec-id",
            "long-step",
            &id,
            "--",
            "sh",
            "-c",
            "echo started; exec sleep 1000",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut first = [0u8; 8];
    std::io::Read::read_exact(long.stdout.as_mut().expect("stdout"), &mut first).expect("started");
    assert_eq!(&first, b"started\n");
    let kill = run(crucible(&daemon).args([
        "sandbox",
        "kill",
        "-s",
        "TERM",
        "--exec-id",
        "long-step",
        &id,
    ]));
    assert!(kill.status.success(), "{}", text(&kill.stderr));
    assert_eq!(long.wait().expect("wait").code(), Some(143));
    let again = run(crucible(&daemon).args(["sandbox", "kill", "--exec-id", "long-step", &id]));
    assert_eq!(again.status.code(), Some(125), "{}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains("no running command has exec_id"),
        "{}",
        text(&again.stderr)
    );
    let bad = run(crucible(&daemon).args(["sandbox", "kill", "-s", "NOPE", &id]));
    assert_eq!(bad.status.code(), Some(125), "{}", text(&bad.stderr));
}

#[test]
fn a_command_whose_client_dies_is_listed_by_ps_and_finished_by_attach() {
    use std::io::{BufRead, BufReader};
    let daemon = TestDaemon::start();
    let id = sandbox(&daemon);
    let mut client = crucible(&daemon)
        .args(["sandbox", "exec", "--exec-id", "job-1", &id, "--"])
        .args(["sh", "-c", "echo first; sleep 1; echo second; exit 4"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("crucible runs");
    let mut first = String::new();
    BufReader::new(client.stdout.take().expect("piped"))
        .read_line(&mut first)
        .expect("the first line");
    assert_eq!(first, "first\n");
    client.kill().expect("kill the client");
    client.wait().expect("reaped");

    let ps = run(crucible(&daemon).args(["sandbox", "ps", &id]));
    assert!(ps.status.success(), "{}", text(&ps.stderr));
    let table = text(&ps.stdout);
    assert!(table.starts_with("EXEC ID"), "{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with("job-1"))
        .unwrap_or_else(|| panic!("job-1 is listed: {table}"));
    assert!(row.contains("sh -c echo first"), "{row}");

    let attached =
        run(crucible(&daemon).args(["sandbox", "attach", &id, "job-1", "--offset", "6"]));
    assert_eq!(
        text(&attached.stdout),
        "second\n",
        "{}",
        text(&attached.stderr)
    );
    assert_eq!(attached.status.code(), Some(4));
    let again = run(crucible(&daemon).args(["sandbox", "attach", &id, "job-1"]));
    assert_eq!(
        again.status.code(),
        Some(125),
        "collected: {}",
        text(&again.stderr)
    );
    assert!(
        text(&again.stderr).contains("no command has exec_id \"job-1\""),
        "{}",
        text(&again.stderr)
    );
}

#[test]
fn an_interactive_command_that_keeps_is_re_attached_with_its_stdin() {
    use std::io::{BufRead, BufReader};
    let daemon = TestDaemon::start();
    let id = sandbox(&daemon);
    let mut first = crucible(&daemon)
        .args([
            "sandbox",
            "exec",
            "-i",
            "--on-disconnect",
            "keep",
            "--exec-id",
            "repl",
        ])
        .args([
            &id,
            "--",
            "sh",
            "-c",
            "read a; echo got $a; read b; echo got $b; exit 6",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("crucible runs");
    let mut stdin = first.stdin.take().expect("piped");
    stdin.write_all(b"one\n").expect("write");
    let mut line = String::new();
    BufReader::new(first.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("the first answer");
    assert_eq!(line, "got one\n");
    first.kill().expect("kill the client");
    first.wait().expect("reaped");

    let mut again = crucible(&daemon)
        .args(["sandbox", "attach", "-i", &id, "repl", "--offset", "8"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("crucible runs");
    again
        .stdin
        .take()
        .expect("piped")
        .write_all(b"two\n")
        .expect("write");
    let out = again.wait_with_output().expect("attach ends");
    assert_eq!(text(&out.stdout), "got two\n", "{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(6));
}

/// A Unix-socket proxy to `daemon`'s socket that cuts its first connection after `cut` bytes
/// of the daemon's answer (a network blip mid-stream) and passes every later one through.
fn cutting_proxy(daemon: &TestDaemon, dir: &std::path::Path, cut: usize) -> std::path::PathBuf {
    use std::io::Read;
    use std::os::unix::net::{UnixListener, UnixStream};
    let path = dir.join("proxy.sock");
    let listener = UnixListener::bind(&path).expect("bind the proxy");
    let upstream = daemon.socket.clone();
    std::thread::spawn(move || {
        for (n, client) in listener.incoming().enumerate() {
            let Ok(mut client) = client else { return };
            let Ok(mut server) = UnixStream::connect(&upstream) else {
                return;
            };
            let (mut client_in, mut server_out) = (
                client.try_clone().expect("clone"),
                server.try_clone().expect("clone"),
            );
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut client_in, &mut server_out);
            });
            std::thread::spawn(move || {
                let mut left = if n == 0 { cut } else { usize::MAX };
                let mut buf = [0u8; 4096];
                while left > 0 {
                    let got = match server.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(got) => got.min(left),
                    };
                    if client.write_all(&buf[..got]).is_err() {
                        break;
                    }
                    left -= got;
                }
                let _ = client.shutdown(std::net::Shutdown::Both);
                let _ = server.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    path
}

#[test]
fn exec_re_attaches_by_itself_when_its_connection_breaks_mid_stream() {
    let daemon = TestDaemon::start();
    let id = sandbox(&daemon);
    let dir = tempfile::tempdir().expect("temp dir");
    // The first answer is cut after 600 bytes: its head and a few lines.
    let proxy = cutting_proxy(&daemon, dir.path(), 600);
    let out = run(Command::new(env!("CARGO_BIN_EXE_crucible"))
        .arg("--host")
        .arg(&proxy)
        .env_remove("CRUCIBLE_API_KEY")
        .args(["sandbox", "exec", &id, "--", "sh", "-c"])
        .arg("for i in $(seq 1 300); do echo line$i; sleep 0.002; done; exit 3"));
    let expected: String = (1..=300).map(|i| format!("line{i}\n")).collect();
    assert_eq!(text(&out.stdout), expected, "nothing lost, nothing twice");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("re-attaching to ex-"),
        "{}",
        text(&out.stderr)
    );
}

/// `crucible run` of a CI job beside a service (`backend`: `--backend`'s value, if any): the
/// job reaches the service on localhost, exits with its own status, the service's log is
/// written out, and nothing is left.
fn run_job_with_a_service(daemon: &TestDaemon, backend: Option<&str>) {
    let logs = tempfile::tempdir().expect("tempdir");
    let mut command = crucible(daemon);
    command.arg("run");
    if let Some(backend) = backend {
        command.args(["--backend", backend]);
    }
    let out = run(command
        .args([
            "--service",
            "db=default:echo db up; while true; do echo hello-from-db | nc -l -p 5432; done",
            "--service-ready",
            "db=tcp:5432",
            "--service-logs",
        ])
        .arg(logs.path())
        .args([
            "--",
            "sh",
            "-c",
            "until nc -w 1 localhost 5432 </dev/null >/tmp/got; do sleep 0.1; done; cat /tmp/got; exit 4",
        ]));
    assert_eq!(
        text(&out.stdout),
        "hello-from-db\n",
        "{}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(4), "the job's status");
    assert_eq!(
        std::fs::read_to_string(logs.path().join("db.log")).expect("db.log"),
        "db up\n"
    );
    let left = run(crucible(daemon).args(["--json", "sandbox", "ls"]));
    let listed: serde_json::Value = serde_json::from_slice(&left.stdout).expect("JSON");
    assert_eq!(
        listed["sandboxes"],
        serde_json::json!([]),
        "run tore everything down"
    );
}

/// The finding of issue 42: `--service` could name no image with a tag (`postgres:16` read
/// as image `postgres`, command `16`) and give no user (PostgreSQL refuses root). A tagged
/// image, its user, its environment and its command, each by a flag of its own.
#[test]
fn a_service_takes_a_tagged_image_a_user_an_environment_and_a_command() {
    let daemon = TestDaemon::start();
    let out = run(crucible(&daemon)
        .args(["image", "import", "tools:1.0"])
        .arg(harness::image_dir().join("rootfs")));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(crucible(&daemon).args([
        "run",
        "--shared",
        "s:/s",
        "--service",
        "db=tools:1.0",
        "--service-user",
        "db=1000:1001",
        "--service-env",
        "db=GREETING=hello=there",
        "--service-cmd",
        "db=echo \"$(id -u):$(id -g) $GREETING\" > /s/who.tmp && mv /s/who.tmp /s/who; exec sleep 300",
        "--service-ready",
        "db=cmd:test -e /s/who",
        "--",
        "cat",
        "/s/who",
    ]));
    assert_eq!(
        (text(&out.stdout).as_str(), out.status.code()),
        ("1000:1001 hello=there\n", Some(0)),
        "{}",
        text(&out.stderr)
    );
    let out = run(crucible(&daemon).args([
        "run",
        "--service",
        "db=tools:1.0",
        "--service-user",
        "web=1000",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("--service-user web…: no --service web=…"),
        "{}",
        text(&out.stderr)
    );
}

/// The same CI job with a service, on the microVM backend (QEMU TCG here: a real guest kernel,
/// no KVM needed): the service is a container of the VM, the job reaches it on localhost.
#[test]
fn run_with_a_service_in_a_microvm_talks_to_it_and_keeps_its_log() {
    let daemon = TestDaemon::start_microvm(api_types::Hypervisor::QemuTcg, |_| {});
    run_job_with_a_service(&daemon, Some("microvm"));
}

/// The finding of issue 40: from the job of `crucible run --service db=…`, the service's
/// processes, environment and root were all there to read. Now none of them is.
#[test]
fn the_job_of_run_sees_none_of_its_services_processes_environment_or_root() {
    let daemon = TestDaemon::start();
    let out = run(crucible(&daemon).args([
        "run",
        "--service",
        "db=default:export DB_PASSWORD=s3cret-of-db; echo db-file > /tmp/dbsecret; exec sleep 301",
        "--service-ready",
        "db=cmd:test -e /tmp/dbsecret",
        "--",
        "sh",
        "-c",
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -c 'sleep 30[1]'; \
         cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c s3cret-of-db; \
         cat /proc/[0-9]*/root/tmp/dbsecret 2>/dev/null | grep -c db-file; true",
    ]));
    assert_eq!(
        text(&out.stdout),
        "0\n0\n0\n",
        "the job saw the service's process, environment or file: {}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn run_with_a_service_talks_to_it_on_localhost_and_keeps_its_log() {
    let daemon = TestDaemon::start();
    run_job_with_a_service(&daemon, None);

    // A sandbox's service log on demand, and a refused service.
    let out = run(crucible(&daemon).args([
        "sandbox",
        "create",
        "--service",
        "web=default:echo serving; echo oops >&2; sleep 300",
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let mut logged = None;
    for _ in 0..100 {
        let out = run(crucible(&daemon).args(["sandbox", "logs", &id, "web"]));
        if text(&out.stderr) == "oops\n" {
            logged = Some(out);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = logged.expect("the log reaches both streams");
    assert_eq!(text(&out.stdout), "serving\n");
    let out = run(crucible(&daemon).args([
        "sandbox",
        "exec",
        "--container",
        "web",
        &id,
        "--",
        "hostname",
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(crucible(&daemon).args(["sandbox", "get", &id]));
    assert!(
        text(&out.stdout).contains("\ncontainer: web (default) ready\n"),
        "{}",
        text(&out.stdout)
    );
    // What the service uses: its `sh` and `sleep` beside its agent, under the sandbox's limits.
    let out =
        run(crucible(&daemon).args(["--json", "sandbox", "stats", &id, "--container", "web"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(stats["pids"]["current"].as_u64() >= Some(2), "{stats}");
    assert!(stats["memory"]["limit_bytes"].as_u64() > Some(0), "{stats}");
    let out = run(crucible(&daemon).args(["sandbox", "stats", &id]));
    let table = text(&out.stdout);
    assert!(
        out.status.success() && table.starts_with("memory ") && table.contains("\nprocesses "),
        "{table}{}",
        text(&out.stderr)
    );
    let out = run(crucible(&daemon).args(["sandbox", "logs", &id, "nope"]));
    assert!(
        text(&out.stderr).contains("no container \"nope\""),
        "{}",
        text(&out.stderr)
    );
    assert!(!out.status.success());
    // The service removed, the sandbox runs on; two ids with --container is refused.
    let out = run(crucible(&daemon).args(["sandbox", "rm", "--container", "web", &id, "other"]));
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("exactly one sandbox id"),
        "{}",
        text(&out.stderr)
    );
    let out = run(crucible(&daemon).args(["sandbox", "rm", "--container", "web", &id]));
    assert_eq!(
        (text(&out.stdout).as_str(), out.status.code()),
        ("web\n", Some(0)),
        "{}",
        text(&out.stderr)
    );
    let out = run(crucible(&daemon).args(["sandbox", "logs", &id, "web"]));
    assert!(!out.status.success(), "a removed container has no log");
    let out = run(crucible(&daemon).args(["sandbox", "exec", &id, "--", "true"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(crucible(&daemon).args(["sandbox", "rm", &id]));
    assert!(out.status.success());
    let out = run(crucible(&daemon).args(["run", "--service", "db", "--", "true"]));
    assert_eq!(
        out.status.code(),
        Some(125),
        "a usage error: {}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("--service"),
        "{}",
        text(&out.stderr)
    );
}

/// A tenant's text (a label, a command line) that would drive the operator's terminal: a
/// title, a cleared screen, a C1 CSI, a line forged by a line break.
const TERMINAL_ATTACK: &str = "\x1b]0;pwned\x07\x1b[2J\u{9b}31m\nlabel:    forged=1";

#[test]
fn a_tenants_text_is_shown_escaped_by_get_and_ps_and_exact_in_json() {
    let shown = "\\x1b]0;pwned\\x07\\x1b[2J\\u{9b}31m\\nlabel:    forged=1";
    let daemon = TestDaemon::start();
    let out = run(crucible(&daemon)
        .args(["--json", "sandbox", "create", "--label"])
        .arg(format!("note={TERMINAL_ATTACK}")));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let id = info["id"].as_str().expect("id").to_string();

    let out = run(crucible(&daemon).args(["sandbox", "get", &id]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let details = text(&out.stdout);
    assert!(!has_control(&out.stdout), "{details:?}");
    assert!(
        details.contains(&format!("\nlabel:    note={shown}\n")),
        "{details}"
    );
    assert!(!details.contains("\nlabel:    forged"), "{details}");
    let out = run(crucible(&daemon).args(["--json", "sandbox", "get", &id]));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(got["labels"]["note"], TERMINAL_ATTACK, "byte-exact in JSON");

    // A command whose argv carries it, listed while it runs.
    let mut job = crucible(&daemon)
        .args(["sandbox", "exec", "--exec-id", "hostile", &id, "--"])
        .args(["sh", "-c", "sleep 60"])
        .arg(TERMINAL_ATTACK)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("crucible runs");
    let mut listed = None;
    for _ in 0..100 {
        let out = run(crucible(&daemon).args(["sandbox", "ps", &id]));
        if text(&out.stdout).contains("\nhostile ") {
            listed = Some(out);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = listed.expect("ps lists the command");
    let table = text(&out.stdout);
    assert!(!has_control(&out.stdout), "{table:?}");
    assert!(
        table.contains(&format!("sh -c sleep 60 {shown}\n")),
        "{table}"
    );
    let out = run(crucible(&daemon).args(["--json", "sandbox", "ps", &id]));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        list["execs"][0]["cmd"],
        serde_json::json!(["sh", "-c", "sleep 60", TERMINAL_ATTACK]),
        "byte-exact in JSON"
    );
    let out = run(crucible(&daemon).args(["sandbox", "kill", "--exec-id", "hostile", &id]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    job.wait().expect("the exec ends");
}

// The README's egress examples, run as written against a daemon started with the README's
// own `serve --egress-allow` line: each example's allowlist is accepted (no internet is
// needed to check that), and a rule without a port, which that daemon refuses, is answered
// with the rule to ask for instead.

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README")
}

/// The comma-separated value after `flag` on the README's line that holds `line_has`.
fn flag_value(readme: &str, line_has: &str, flag: &str) -> String {
    let line = readme
        .lines()
        .find(|l| l.contains(line_has) && l.contains(flag))
        .unwrap_or_else(|| panic!("no README line with {line_has:?} and {flag}"));
    let value = line
        .split(flag)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{flag} has no value in {line:?}"));
    value.trim_matches('\'').to_string()
}

/// The `"allow":[…]` list of the README's `curl … POST $U/sandboxes` example.
fn curl_allow(readme: &str) -> Vec<String> {
    let line = readme
        .lines()
        .find(|l| l.contains("POST $U/sandboxes") && l.contains("\"allow\""))
        .expect("the README's curl example with an allowlist");
    let list = line
        .split("\"allow\":[")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("an allow list");
    list.split(',')
        .map(|rule| rule.trim().trim_matches('"').to_string())
        .collect()
}

#[test]
fn the_readmes_egress_examples_are_accepted_by_the_readmes_daemon() {
    let readme = readme();
    let operator = flag_value(&readme, "crucible serve", "--egress-allow");
    let rules: Vec<String> = operator.split(',').map(str::to_string).collect();
    let daemon = TestDaemon::start_with(|config| config.egress_allow = rules);
    let crucible = || crucible_at(&daemon.socket);

    let cli_allow = flag_value(&readme, "crucible run", "--allow");
    let curl_allow = curl_allow(&readme).join(",");
    for allow in [&cli_allow, &curl_allow] {
        let out = run(crucible().args(["sandbox", "create", "--allow", allow]));
        assert!(
            out.status.success(),
            "--allow {allow} under --egress-allow {operator}: {}",
            text(&out.stderr)
        );
        let id = text(&out.stdout).trim().to_string();
        let out = run(crucible().args(["sandbox", "rm", &id]));
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    // cargo ≥ 1.70 reads the sparse index first: an example without it fetches nothing.
    assert!(cli_allow.contains("index.crates.io"), "{cli_allow}");

    let out = run(crucible().args(["sandbox", "create", "--allow", "index.crates.io"]));
    assert!(!out.status.success());
    let refusal = text(&out.stderr);
    assert!(
        refusal.contains("ask for `index.crates.io:80` or `index.crates.io:443`"),
        "{refusal}"
    );
}

/// Four CI jobs at once on one cache all run; afterwards the cache is one job's whole result
/// (what that job saw at its end, its manifest), never a mix, and `cache ls` says who saved it.
/// A fifth that only reads (`:nosave`) ends first and leaves nothing.
#[test]
fn parallel_runs_share_a_cache_and_one_whole_result_is_kept() {
    let daemon = TestDaemon::start();
    let list = "ls /cache | grep -v -e lost+found -e manifest | sort | tr '\\n' ' '";
    let jobs: Vec<_> = (1..=4)
        .map(|job| {
            let script = format!(
                "set -e; for f in a b c; do echo {job} > /cache/job{job}-$f; done; \
                 echo {job} > /cache/winner; sleep 0.3; m=$({list}); echo \"$m\" > /cache/manifest"
            );
            crucible(&daemon)
                .args(["run", "--cache", "ci:/cache:32", "--", "sh", "-c"])
                .arg(script)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn crucible run")
        })
        .collect();
    // A job that only reads the cache, ending first: its writes are never saved.
    let reader = run(crucible(&daemon).args([
        "run",
        "--cache",
        "ci:/cache:nosave",
        "--",
        "sh",
        "-c",
        "echo reader > /cache/reader",
    ]));
    assert!(reader.status.success(), "{}", text(&reader.stderr));
    assert_eq!(text(&reader.stderr), "", "a reader is never told of saving");
    let mut told = Vec::new();
    for (n, job) in jobs.into_iter().enumerate() {
        let out = job.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "job {}: {}{}",
            n + 1,
            text(&out.stdout),
            text(&out.stderr)
        );
        // A job whose writes another job's replaced is told so.
        told.push(text(&out.stderr).contains("cache ci: this run's writes were not saved"));
    }
    let listed = run(crucible(&daemon).args(["--json", "cache", "ls"]));
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    assert!(listed["caches"][0]["saved_by"].is_string(), "{listed}");
    assert_eq!(
        listed["caches"][0]["users"],
        serde_json::json!([]),
        "{listed}"
    );
    let check = format!("cat /cache/winner /cache/manifest; {list}");
    let out =
        run(crucible(&daemon).args(["run", "--cache", "ci:/cache", "--", "sh", "-c", &check]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let [winner, manifest, now] = lines[..] else {
        panic!("{stdout}");
    };
    assert!(["1", "2", "3", "4"].contains(&winner), "{stdout}");
    let winner_told = winner.parse::<usize>().map(|w| told[w - 1]);
    assert_eq!(
        winner_told,
        Ok(false),
        "the winner is not told it lost: {told:?}"
    );
    assert_eq!(now, manifest, "the cache is exactly what one job left");
    assert!(!now.contains("reader"), "{stdout}");
    for f in ["a", "b", "c"] {
        assert!(
            now.contains(&format!("job{winner}-{f}")),
            "the winner's files, all of them: {stdout}"
        );
    }
}
