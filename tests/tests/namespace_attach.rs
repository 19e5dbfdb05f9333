//! Commands that outlive their client connection, through the real daemon: a one-shot exec
//! whose client goes away runs on; `GET /sandboxes/{id}/execs` lists it; an attach from the
//! bytes the client had gets the rest and the one exit frame; what the agent no longer keeps
//! is reported as dropped; `on_disconnect: kill` and interactive sessions still die with their
//! connection, unless an interactive one asks to keep (then a re-attach carries its stdin on).

use std::time::Duration;

use client::{ClientError, ExecEvent};
use harness::{sh, TestDaemon};
use wire::{ExecRequest, ExecState, OnDisconnect};

/// Reads events until `want` stdout bytes arrived; returns them.
async fn read_stdout(stream: &mut client::ExecStream, want: usize) -> Vec<u8> {
    let mut got = Vec::new();
    while got.len() < want {
        match stream.next_event().await {
            Some(Ok(ExecEvent::Stdout(bytes))) => got.extend_from_slice(&bytes),
            other => panic!("expected stdout, got {other:?}"),
        }
    }
    got
}

/// Waits until `exec_id` in `id` is in `state` with no client attached.
async fn detached(
    c: &client::Client,
    id: &str,
    exec_id: &str,
    state: ExecState,
) -> wire::ExecStatus {
    for _ in 0..400 {
        if let Ok(status) = c.exec_status(id, exec_id).await {
            if status.state == state && !status.attached {
                return status;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{exec_id} never became {state:?} and detached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_outlives_its_client_and_an_attach_gets_the_rest_and_the_exit() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = daemon.sandbox().await;
    let script = "for i in $(seq 1 40); do echo line$i; sleep 0.02; done; echo bye >&2; exit 5";
    let mut first = c
        .exec(&id, &ExecRequest::new(["sh", "-c", script]))
        .await
        .expect("exec");
    let exec_id = first
        .exec_id()
        .expect("the daemon names every command")
        .to_string();
    assert!(exec_id.starts_with("ex-"), "{exec_id}");
    let head = read_stdout(&mut first, 6).await;
    drop(first); // the client goes away mid-command

    let running = detached(&c, &id, &exec_id, ExecState::Running).await;
    assert!(running.keep, "{running:?}");
    let listed = c.execs(&id).await.expect("list");
    assert!(listed.iter().any(|e| e.exec_id == exec_id), "{listed:?}");

    let rest = c
        .attach(&id, &exec_id, head.len() as u64)
        .await
        .expect("attach")
        .collect()
        .await
        .expect("the rest");
    let mut all = head;
    all.extend_from_slice(&rest.stdout);
    let expected: String = (1..=40).map(|i| format!("line{i}\n")).collect();
    assert_eq!(
        String::from_utf8_lossy(&all),
        expected,
        "nothing lost, nothing twice"
    );
    assert_eq!(rest.stderr, b"bye\n");
    assert_eq!(rest.result.exit_code, 5, "{:?}", rest.result);
    assert_eq!(rest.result.output_dropped_bytes, 0);

    // Collected: gone from the list; a second attach is a 404 with its own code.
    let gone = c.attach(&id, &exec_id, 0).await.expect_err("collected");
    assert!(
        matches!(&gone, ClientError::Api { status: 404, code, .. } if code == "exec_not_found"),
        "{gone}"
    );
    let bad = c.exec_status(&id, "no/such").await.expect_err("malformed");
    assert!(matches!(bad, ClientError::Api { status: 400, .. }), "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_beyond_the_kept_tail_is_reported_as_dropped() {
    // A 4 KiB tail per command, so that a small test overflows it.
    let daemon = TestDaemon::start_with(|c| c.engine.limits.exec_tail_bytes = 4096);
    let c = daemon.client();
    let id = daemon.sandbox().await;
    let request = ExecRequest {
        exec_id: "big-output".into(),
        ..ExecRequest::new([
            "sh",
            "-c",
            "while [ ! -e /tmp/go ]; do sleep 0.02; done; \
             head -c 100000 /dev/zero | tr '\\0' x; printf END",
        ])
    };
    let first = c.exec(&id, &request).await.expect("exec");
    drop(first);
    detached(&c, &id, "big-output", ExecState::Running).await;
    let (_, _, code) = sh(&c, &id, "touch /tmp/go").await;
    assert_eq!(code, 0);
    let ended = detached(&c, &id, "big-output", ExecState::Exited).await;
    assert_eq!(ended.output_bytes, 100_003);
    assert_eq!(ended.output_kept_from, 100_003 - 4096);

    let out = c
        .attach(&id, "big-output", 0)
        .await
        .expect("attach")
        .collect()
        .await
        .expect("collect");
    assert_eq!(out.stdout.len(), 4096);
    assert!(out.stdout.ends_with(b"xxEND"));
    assert_eq!(out.result.exit_code, 0, "{:?}", out.result);
    assert_eq!(
        out.result.output_dropped_bytes,
        100_003 - 4096,
        "dropped bytes are reported, never silently lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_disconnect_kill_and_interactive_sessions_die_with_their_connection() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = daemon.sandbox().await;
    let request = ExecRequest {
        exec_id: "dies".into(),
        on_disconnect: Some(OnDisconnect::Kill),
        ..ExecRequest::new(["sh", "-c", "echo up; exec sleep 1001"])
    };
    let mut stream = c.exec(&id, &request).await.expect("exec");
    read_stdout(&mut stream, 3).await;
    let attached = c.attach(&id, "dies", 0).await.expect_err("not kept");
    assert!(
        matches!(attached, ClientError::Api { status: 409, .. }),
        "{attached}"
    );
    drop(stream);
    for _ in 0..200 {
        let (ps, _, _) = sh(&c, &id, "ps -o args").await;
        if !ps.contains("sleep 1001") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (ps, _, _) = sh(&c, &id, "ps -o args").await;
    assert!(
        !ps.contains("sleep 1001"),
        "killed with its connection: {ps}"
    );

    // An interactive session dies with its connection by default...
    let mut session = c
        .interactive(
            &id,
            &ExecRequest::new(["sh", "-c", "echo up; exec sleep 1002"]),
        )
        .await
        .expect("interactive");
    let exec_id = session.exec_id().expect("named").to_string();
    match session.next_event().await {
        Some(Ok(ExecEvent::Stdout(bytes))) => assert_eq!(&bytes[..], b"up\n"),
        other => panic!("{other:?}"),
    }
    let attached = c.attach(&id, &exec_id, 0).await.expect_err("not kept");
    assert!(
        matches!(attached, ClientError::Api { status: 409, .. }),
        "{attached}"
    );
    drop(session);
    for _ in 0..200 {
        let (ps, _, _) = sh(&c, &id, "ps -o args").await;
        if !ps.contains("sleep 1002") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("an interactive session outlived its connection");
}

/// An interactive session that asks to outlive its connection (what the containerd shim's
/// tasks do) runs on when it drops; a re-attach with stdin says how much input the command
/// took, carries input on from there, and the command's end is reported once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_session_that_asks_to_keep_is_re_attached_with_its_stdin() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = daemon.sandbox().await;
    let request = ExecRequest {
        exec_id: "kept-shell".into(),
        on_disconnect: Some(OnDisconnect::Keep),
        ..ExecRequest::new(["sh", "-c", "cat; echo eof"])
    };
    let mut session = c.interactive(&id, &request).await.expect("interactive");
    assert_eq!(session.exec_id(), Some("kept-shell"));
    session.send_stdin(b"alpha\n").await.expect("stdin");
    match session.next_event().await {
        Some(Ok(ExecEvent::Stdout(bytes))) => assert_eq!(&bytes[..], b"alpha\n"),
        other => panic!("{other:?}"),
    }
    drop(session);
    let status = detached(&c, &id, "kept-shell", ExecState::Running).await;
    assert_eq!(status.stdin_bytes, Some(6), "{status:?}");
    assert!(status.keep && !status.stdin_closed, "{status:?}");

    // A one-shot attach reads it but cannot feed it; an interactive one does both.
    let (mut session, position) = c
        .attach_interactive(&id, "kept-shell", 6)
        .await
        .expect("attach with stdin");
    assert_eq!(
        position,
        client::AttachPosition {
            output_bytes: 6,
            output_kept_from: 0,
            stdin_bytes: 6,
            stdin_closed: false,
        }
    );
    session.send_stdin(b"beta\n").await.expect("stdin");
    session.close_stdin().await.expect("close");
    let mut out = Vec::new();
    let mut exits = 0;
    while let Some(event) = session.next_event().await {
        match event.expect("event") {
            ExecEvent::Stdout(bytes) => out.extend_from_slice(&bytes),
            ExecEvent::Exit(result) => {
                exits += 1;
                assert_eq!(result.exit_code, 0, "{result:?}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(String::from_utf8_lossy(&out), "beta\neof\n");
    assert_eq!(exits, 1);
    let gone = c
        .exec_status(&id, "kept-shell")
        .await
        .expect_err("collected");
    assert!(
        matches!(gone, ClientError::Api { status: 404, .. }),
        "{gone}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_command_keeps_its_sandbox_from_idling_out() {
    let daemon = TestDaemon::start_with(|c| c.engine.limits.idle_timeout_s = 2);
    let c = daemon.client();
    let id = daemon.sandbox().await;
    let request = ExecRequest {
        exec_id: "long-build".into(),
        ..ExecRequest::new(["sh", "-c", "while [ ! -e /tmp/done ]; do sleep 0.1; done"])
    };
    drop(c.exec(&id, &request).await.expect("exec"));
    detached(&c, &id, "long-build", ExecState::Running).await;
    // Three idle timeouts pass with nobody attached: the running command is activity.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        c.get(&id).await.expect("still there").state,
        api_types::SandboxState::Running
    );
    // Once it ends, the sandbox idles out as any other.
    let (_, _, code) = sh(&c, &id, "touch /tmp/done").await;
    assert_eq!(code, 0);
    for _ in 0..200 {
        if matches!(c.get(&id).await, Err(ClientError::Api { status: 404, .. })) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} outlived its idle timeout after its command ended");
}

/// The API error `result` is: status, code.
fn api_error<T: std::fmt::Debug>(result: Result<T, ClientError>) -> (u16, String) {
    match result {
        Err(ClientError::Api { status, code, .. }) => (status, code),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Waits until no process `pid` of sandbox `id` is left (not even a zombie); false if one
/// still is after 5 s.
async fn gone(c: &client::Client, id: &str, pid: &str) -> bool {
    for _ in 0..100 {
        let (out, _, _) = sh(c, id, &format!("cat /proc/{pid}/stat 2>/dev/null")).await;
        if out.is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_ends_a_command_with_its_process_group_and_forgets_it() {
    let daemon = TestDaemon::start();
    let c = daemon.client();
    let id = daemon.sandbox().await;

    // A command whose client went away, with a child in its process group.
    let mut request = ExecRequest::new([
        "sh",
        "-c",
        "sleep 300 & echo $! > /tmp/child; echo started; wait",
    ]);
    request.exec_id = "doomed".into();
    let mut stream = c.exec(&id, &request).await.expect("exec");
    read_stdout(&mut stream, "started\n".len()).await;
    drop(stream);
    let running = detached(&c, &id, "doomed", ExecState::Running).await;
    let (child, _, _) = sh(&c, &id, "cat /tmp/child").await;
    c.delete_exec(&id, "doomed")
        .await
        .expect("DELETE a running command");
    assert_eq!(
        api_error(c.exec_status(&id, "doomed").await),
        (404, "exec_not_found".to_string()),
        "forgotten, not kept as an ended command"
    );
    let listed = c.execs(&id).await.expect("list");
    assert!(listed.iter().all(|e| e.exec_id != "doomed"), "{listed:?}");
    assert!(
        gone(&c, &id, &running.pid.to_string()).await,
        "the command runs on"
    );
    assert!(gone(&c, &id, child.trim()).await, "its child runs on");
    // A second DELETE, and one of a name no command had: 404.
    for exec_id in ["doomed", "never-ran"] {
        assert_eq!(
            api_error(c.delete_exec(&id, exec_id).await),
            (404, "exec_not_found".to_string()),
            "{exec_id}"
        );
    }

    // An ended command whose result nobody collected: forgotten.
    let mut request = ExecRequest::new(["sh", "-c", "sleep 0.2; exit 3"]);
    request.exec_id = "ended".into();
    drop(c.exec(&id, &request).await.expect("exec"));
    let ended = detached(&c, &id, "ended", ExecState::Exited).await;
    assert_eq!(ended.result.map(|r| r.exit_code), Some(3));
    c.delete_exec(&id, "ended")
        .await
        .expect("DELETE an ended command");
    assert_eq!(
        api_error(c.attach(&id, "ended", 0).await),
        (404, "exec_not_found".to_string())
    );

    // A command with a client attached: the client gets its end, SIGKILL.
    let mut request = ExecRequest::new(["sleep", "300"]);
    request.exec_id = "watched".into();
    let watched = c.exec(&id, &request).await.expect("exec");
    let waiting = tokio::spawn(watched.collect());
    for _ in 0..100 {
        if c.exec_status(&id, "watched").await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.delete_exec(&id, "watched")
        .await
        .expect("DELETE an attached command");
    let out = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the attached client gets the end")
        .expect("join")
        .expect("its stream");
    assert_eq!(
        (out.result.exit_code, out.result.signal.as_str()),
        (-1, "SIGKILL")
    );
    assert_eq!(
        api_error(c.exec_status(&id, "watched").await),
        (404, "exec_not_found".to_string())
    );

    // The sandbox serves on; an invalid exec id is a 400.
    assert_eq!(sh(&c, &id, "echo still here").await.0, "still here\n");
    assert_eq!(api_error(c.delete_exec(&id, "bad id!").await).0, 400);
    c.delete(&id).await.expect("delete");
}
