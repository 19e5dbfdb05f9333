//! Exec over a Unix socket against the real binary.

mod common;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::{read_output, sh, wait_gone, write_frame, Agent};
use wire::agent::{AgentReply, AgentRequest};
use wire::{Direction, ExecRequest, FrameReader, FrameType};

#[test]
fn stdout_and_stderr_are_separate_and_each_in_order() {
    let agent = Agent::start();
    let out = agent.exec(sh(
        "for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; done",
    ));
    assert_eq!(out.stdout_str(), "out1\nout2\nout3\nout4\nout5\n");
    assert_eq!(out.stderr_str(), "err1\nerr2\nerr3\nerr4\nerr5\n");
    assert_eq!(out.result.exit_code, 0);
    assert_eq!(out.result.error, "");

    // A long stream arrives complete and in order across many frames.
    let out = agent.exec(ExecRequest::new(["seq", "1", "200000"]));
    let expected: String = (1..=200_000).map(|i| format!("{i}\n")).collect();
    assert!(out.stdout == expected.as_bytes(), "seq output differs");
    assert!(out.frames.len() > 3, "{} frames", out.frames.len());
}

#[test]
fn exit_codes_are_reported() {
    let agent = Agent::start();
    for code in [0, 1, 7, 255] {
        let out = agent.exec(sh(&format!("exit {code}")));
        assert_eq!(out.result.exit_code, code);
        assert_eq!(out.result.signal, "");
        assert!(!out.result.timed_out);
        let usage = out.result.usage.expect("usage collected");
        assert!(usage.peak_memory_bytes > 0);
    }
}

#[test]
fn signalled_commands_report_the_signal_name() {
    let agent = Agent::start();
    for (sig, name) in [("TERM", "SIGTERM"), ("KILL", "SIGKILL"), ("INT", "SIGINT")] {
        let out = agent.exec(sh(&format!("kill -{sig} $$")));
        assert_eq!(out.result.exit_code, -1, "{name}");
        assert_eq!(out.result.signal, name);
        assert!(!out.result.timed_out);
    }
}

#[test]
fn a_command_gets_default_signal_dispositions_whatever_the_agent_inherited() {
    let agent = Agent::start_ignoring_signals();
    for (sig, name) in [("INT", "SIGINT"), ("QUIT", "SIGQUIT"), ("TERM", "SIGTERM")] {
        let out = agent.exec(sh(&format!("kill -{sig} $$")));
        assert_eq!(
            (out.result.exit_code, out.result.signal.as_str()),
            (-1, name),
            "{name} must not stay ignored in the command"
        );
    }
}

#[test]
fn env_is_added_to_the_agents_and_cwd_is_honoured() {
    let agent = Agent::start_with(|c| {
        c.env("CRUCIBLE_INHERITED", "from-agent");
    });
    let mut req = sh("echo $CRUCIBLE_INHERITED $FOO; pwd");
    req.env.insert("FOO".into(), "bar baz".into());
    req.cwd = "/usr".into();
    let out = agent.exec(req);
    assert_eq!(out.stdout_str(), "from-agent bar baz\n/usr\n");

    // A request's variable overrides the agent's.
    let mut req = sh("echo $CRUCIBLE_INHERITED");
    req.env
        .insert("CRUCIBLE_INHERITED".into(), "overridden".into());
    assert_eq!(agent.exec(req).stdout_str(), "overridden\n");

    // cmd[0] is looked up on the request's PATH when it sets one.
    let mut req = ExecRequest::new(["sh", "-c", "true"]);
    req.env.insert("PATH".into(), "/nonexistent".into());
    let out = agent.exec(req);
    assert_eq!(out.result.exit_code, -1);
    assert!(
        out.result.error.contains("not found"),
        "{}",
        out.result.error
    );
}

#[test]
fn spawn_errors_say_why_and_send_no_output() {
    let agent = Agent::start();
    let script = agent.dir.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).expect("chmod");

    let cases = [
        (ExecRequest::new(["no-such-cmd"]), "not found"),
        (ExecRequest::new(["/definitely/not/here"]), "not found"),
        (
            ExecRequest::new([script.to_string_lossy().into_owned()]),
            "permission denied",
        ),
        (
            ExecRequest {
                cwd: "/no/such/dir".into(),
                ..ExecRequest::new(["true"])
            },
            "cwd",
        ),
        (ExecRequest::new(Vec::<String>::new()), "invalid request"),
        (
            // Found on PATH but not executable: reported as such, naming the file.
            ExecRequest {
                env: [(
                    "PATH".to_string(),
                    format!("/nonexistent:{}:/bin", agent.dir.path().display()),
                )]
                .into_iter()
                .collect(),
                ..ExecRequest::new(["not-executable.sh"])
            },
            "permission denied",
        ),
    ];
    for (req, why) in cases {
        let out = agent.exec(req.clone());
        assert_eq!(out.result.exit_code, -1, "{req:?}");
        assert!(
            out.result.error.contains(why),
            "{req:?}: error {:?} should mention {why:?}",
            out.result.error
        );
        assert_eq!(
            out.frames,
            vec![FrameType::Exit],
            "{req:?}: no output frames"
        );
    }
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let agent = Agent::start();
    let mut req = sh("sleep 100 & echo $!; sleep 100");
    req.timeout_s = 1;
    let started = Instant::now();
    let out = agent.exec(req);
    assert!(started.elapsed() < Duration::from_secs(10), "hang guard");
    assert!(out.result.timed_out);
    assert_eq!(out.result.signal, "SIGKILL");
    assert_eq!(out.result.exit_code, -1);
    assert!(!out.result.oom_killed);
    let grandchild: u32 = out.stdout_str().trim().parse().expect("grandchild pid");
    assert!(
        wait_gone(grandchild, Duration::from_secs(10)),
        "grandchild {grandchild} survived the timeout"
    );
}

#[test]
fn interactive_stdin_reaches_the_command_and_close_ends_it() {
    let agent = Agent::start();
    let mut s = agent.interactive(ExecRequest::new(["cat"]));
    write_frame(&mut s, FrameType::Stdin, b"hello\n");
    write_frame(&mut s, FrameType::Stdin, b"world\n");
    write_frame(&mut s, FrameType::StdinClose, b"");
    let out = read_output(s);
    assert_eq!(out.stdout_str(), "hello\nworld\n");
    assert_eq!(out.result.exit_code, 0);

    // State persists across lines of one shell.
    let mut s = agent.interactive(ExecRequest::new(["sh"]));
    write_frame(&mut s, FrameType::Stdin, b"cd /tmp\n");
    write_frame(&mut s, FrameType::Stdin, b"pwd\n");
    write_frame(&mut s, FrameType::StdinClose, b"");
    let out = read_output(s);
    assert_eq!(out.stdout_str(), "/tmp\n");
    assert_eq!(out.result.exit_code, 0);
}

#[test]
fn interactive_large_input_round_trips_with_backpressure() {
    let agent = Agent::start();
    let s = agent.interactive(ExecRequest::new(["cat"]));
    let mut writer = s.try_clone().expect("clone");
    let data: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let sent = data.clone();
    let t = std::thread::spawn(move || {
        for chunk in sent.chunks(50_000) {
            write_frame(&mut writer, FrameType::Stdin, chunk);
        }
        write_frame(&mut writer, FrameType::StdinClose, b"");
    });
    let out = read_output(s);
    t.join().expect("writer");
    assert!(out.stdout == data, "cat echoed {} bytes", out.stdout.len());
    assert_eq!(out.result.exit_code, 0);
}

#[test]
fn a_tty_command_runs_on_a_sized_terminal_that_carries_stderr_too() {
    let agent = Agent::start();
    let mut req = sh("tty; stty size; echo to-stderr >&2; test -t 0 && test -t 1 && test -t 2");
    req.tty = true;
    req.tty_size = Some(wire::TerminalSize {
        rows: 30,
        cols: 100,
    });
    let out = agent.exec(req);
    let shown = out.stdout_str();
    assert!(shown.starts_with("/dev/pts/"), "{shown:?}");
    assert!(shown.contains("\r\n30 100\r\nto-stderr\r\n"), "{shown:?}");
    assert_eq!(out.stderr_str(), "", "a terminal has no separate stderr");
    assert_eq!(
        out.result.exit_code, 0,
        "stdin, stdout and stderr are the terminal"
    );

    // The default size; the terminal is the command's controlling one (`/dev/tty` opens it).
    let mut req = sh("stty size; echo via-dev-tty > /dev/tty; echo $TERM");
    req.tty = true;
    let out = agent.exec(req);
    assert_eq!(out.stdout_str(), "24 80\r\nvia-dev-tty\r\nxterm\r\n");
    let mut req = sh("echo $TERM");
    req.tty = true;
    req.env.insert("TERM".into(), "vt100".into());
    assert_eq!(
        agent.exec(req).stdout_str(),
        "vt100\r\n",
        "the request's TERM wins"
    );

    // Without `tty`, nothing is a terminal; a size without a terminal is refused.
    let out = agent.exec(sh("test -t 0 || test -t 1 || test -t 2"));
    assert_eq!(out.result.exit_code, 1);
    let mut req = sh("true");
    req.tty_size = Some(wire::TerminalSize { rows: 1, cols: 1 });
    let out = agent.exec(req);
    assert!(
        out.result.error.contains("tty_size"),
        "{:?}",
        out.result.error
    );
}

#[test]
fn a_terminal_session_is_resized_typed_into_and_ended_by_stdin_close() {
    let agent = Agent::start();
    let mut request = ExecRequest::new(["sh"]);
    request.tty = true;
    let mut s = agent.send(&AgentRequest::Exec {
        tail_bytes: None,
        request,
        interactive: true,
        user: None,
    });
    // Each size is read back once the shell has shown it, so each `stty` sees its own.
    let mut frames = FrameReader::new(s.try_clone().expect("clone"), Direction::GuestToHost);
    let mut shown = String::new();
    let mut exit = None;
    let mut read_until = |needle: &str, shown: &mut String| {
        while !shown.contains(needle) {
            let frame = frames
                .read_frame()
                .expect("valid frames")
                .unwrap_or_else(|| panic!("ended before {needle:?}: {shown:?}"));
            match frame.frame_type {
                FrameType::Stdout => shown.push_str(&String::from_utf8_lossy(frame.payload)),
                FrameType::Exit => {
                    exit = Some(serde_json::from_slice::<wire::ExecResult>(frame.payload));
                    return;
                }
                other => panic!("unexpected {other} frame"),
            }
        }
    };
    write_frame(&mut s, FrameType::Resize, br#"{"rows":40,"cols":120}"#);
    write_frame(&mut s, FrameType::Stdin, b"stty size; echo one >&2\r");
    read_until("one\r\n", &mut shown);
    assert!(shown.contains("40 120\r\n"), "{shown:?}");
    write_frame(&mut s, FrameType::Resize, br#"{"rows":50,"cols":132}"#);
    write_frame(&mut s, FrameType::Stdin, b"stty size\r");
    read_until("50 132\r\n", &mut shown);
    // stdin_close types the terminal's end of file: the shell reads it and exits.
    write_frame(&mut s, FrameType::StdinClose, b"");
    read_until("never shown", &mut shown);
    let result = exit.expect("an exit frame").expect("an ExecResult");
    assert_eq!(result.exit_code, 0, "{shown:?}");

    // ^C through the terminal interrupts the foreground command, as a keyboard's would.
    let mut request = ExecRequest::new(["sh", "-c", "sleep 30"]);
    request.tty = true;
    let mut s = agent.send(&AgentRequest::Exec {
        tail_bytes: None,
        request,
        interactive: true,
        user: None,
    });
    std::thread::sleep(Duration::from_millis(200));
    write_frame(&mut s, FrameType::Stdin, b"\x03");
    let started = Instant::now();
    let out = read_output(s);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "^C did not interrupt"
    );
    assert_eq!(out.result.signal, "SIGINT", "{:?}", out.result);

    // A resize frame that is not a size is a protocol error, as any bad frame is.
    let mut request = ExecRequest::new(["cat"]);
    request.tty = true;
    let mut s = agent.send(&AgentRequest::Exec {
        tail_bytes: None,
        request,
        interactive: true,
        user: None,
    });
    write_frame(&mut s, FrameType::Resize, b"{\"rows\":-1}");
    let out = read_output(s);
    assert!(
        out.result.error.contains("resize"),
        "{:?}",
        out.result.error
    );
}

#[test]
fn a_terminal_left_open_by_a_background_job_does_not_hold_the_exit() {
    let agent = Agent::start();
    let mut req = sh("echo before; sleep 30 & echo after");
    req.tty = true;
    let started = Instant::now();
    let out = agent.exec(req);
    assert!(started.elapsed() < Duration::from_secs(10), "hang guard");
    assert_eq!(out.stdout_str(), "before\r\nafter\r\n");
    assert_eq!(out.result.exit_code, 0);
}

#[test]
fn non_interactive_stdin_is_dev_null() {
    let agent = Agent::start();
    let out = agent.exec(ExecRequest::new(["cat"]));
    assert_eq!(out.stdout, b"");
    assert_eq!(out.result.exit_code, 0);
}

#[test]
fn one_gib_through_a_slow_reader_keeps_the_agent_small() {
    let agent = Agent::start();
    let mut s = agent.send(&AgentRequest::Exec {
        tail_bytes: None,
        request: sh("head -c 1G /dev/zero"),
        interactive: false,
        user: None,
    });
    // Read raw bytes slowly (a pause every 4 MiB), counting stdout payload via the decoder.
    let mut decoder = wire::Decoder::new(wire::Direction::GuestToHost);
    let mut stdout = 0u64;
    let mut exit = None;
    let mut since_pause = 0usize;
    loop {
        let n = s.read(decoder.unfilled_mut()).expect("read");
        if n == 0 {
            decoder.finish().expect("clean end");
            break;
        }
        decoder.mark_filled(n);
        while let Some(f) = decoder.next_frame().expect("valid") {
            match f.frame_type {
                FrameType::Stdout => stdout += f.payload.len() as u64,
                FrameType::Exit => {
                    exit =
                        Some(serde_json::from_slice::<wire::ExecResult>(f.payload).expect("exit"))
                }
                other => panic!("unexpected {other}"),
            }
        }
        since_pause += n;
        if since_pause >= 4 << 20 {
            since_pause = 0;
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let exit = exit.expect("exit frame");
    assert_eq!(exit.exit_code, 0);
    assert_eq!(stdout, 1 << 30);
    let peak = agent.peak_rss();
    eprintln!("agent VmHWM after 1 GiB: {} KiB", peak >> 10);
    assert!(peak < 64 << 20, "agent peak RSS {} MiB", peak >> 20);
}

#[test]
fn a_host_that_stops_reading_blocks_only_its_own_command() {
    let agent = Agent::start();
    // This stream is never read: the agent must stop reading the pipe, not buffer.
    let _stalled = agent.send(&AgentRequest::Exec {
        tail_bytes: None,
        request: sh("head -c 200M /dev/zero"),
        interactive: false,
        user: None,
    });
    std::thread::sleep(Duration::from_millis(300));
    let out = agent.exec(sh("echo still here"));
    assert_eq!(out.stdout_str(), "still here\n");
    let peak = agent.peak_rss();
    assert!(peak < 64 << 20, "agent peak RSS {} MiB", peak >> 20);
}

#[test]
fn host_disconnect_kills_the_command() {
    let agent = Agent::start();
    let mut s = agent.send(&AgentRequest::Exec {
        tail_bytes: None,
        request: sh("echo $$; exec sleep 100"),
        interactive: false,
        user: None,
    });
    let mut reader = wire::FrameReader::new(&mut s, wire::Direction::GuestToHost);
    let frame = reader.read_frame().expect("frame").expect("first frame");
    assert_eq!(frame.frame_type, FrameType::Stdout);
    let pid: u32 = String::from_utf8_lossy(frame.payload)
        .trim()
        .parse()
        .expect("pid");
    drop(reader);
    drop(s);
    assert!(
        wait_gone(pid, Duration::from_secs(10)),
        "command {pid} survived the disconnect"
    );
    // Interactive sessions too.
    let mut s = agent.interactive(sh("echo $$; exec cat"));
    let mut reader = wire::FrameReader::new(&mut s, wire::Direction::GuestToHost);
    let frame = reader.read_frame().expect("frame").expect("first frame");
    let pid: u32 = String::from_utf8_lossy(frame.payload)
        .trim()
        .parse()
        .expect("pid");
    drop(reader);
    drop(s);
    assert!(
        wait_gone(pid, Duration::from_secs(10)),
        "cat {pid} survived"
    );
}

#[test]
fn fifty_concurrent_execs_each_get_their_own_stream() {
    let agent = std::sync::Arc::new(Agent::start());
    let threads: Vec<_> = (0..50)
        .map(|i| {
            let agent = std::sync::Arc::clone(&agent);
            std::thread::spawn(move || {
                let req = ExecRequest::new([
                    "sh",
                    "-c",
                    "sleep 0.2; echo \"$1\"; echo \"e$1\" >&2",
                    "sh",
                    &i.to_string(),
                ]);
                let out = agent.exec(req);
                assert_eq!(out.stdout_str(), format!("{i}\n"));
                assert_eq!(out.stderr_str(), format!("e{i}\n"));
                assert_eq!(out.result.exit_code, 0);
            })
        })
        .collect();
    for t in threads {
        t.join().expect("exec thread");
    }
}

#[test]
fn exit_is_reported_even_when_a_background_child_holds_the_pipes() {
    let agent = Agent::start();
    let started = Instant::now();
    let out = agent.exec(sh("echo before; sleep 30 & echo after"));
    assert!(started.elapsed() < Duration::from_secs(10), "hang guard");
    assert_eq!(out.stdout_str(), "before\nafter\n");
    assert_eq!(out.result.exit_code, 0);
}

#[test]
fn ping_answers_with_the_hello_and_shutdown_exits() {
    let mut agent = Agent::start();
    match agent.reply(&AgentRequest::Ping) {
        AgentReply::Pong(hello) => {
            assert_eq!(hello.pid, agent.pid());
            assert_eq!(hello.protocol, wire::agent::PROTOCOL_VERSION);
            assert_eq!(hello, agent.hello);
        }
        other => panic!("expected pong, got {other:?}"),
    }
    assert_eq!(
        agent.reply(&AgentRequest::Shutdown),
        AgentReply::ShuttingDown
    );
    let status = agent
        .wait_exit(Duration::from_secs(10))
        .expect("agent exited");
    assert!(status.success(), "{status:?}");
}

#[test]
fn garbage_first_message_gets_an_error_reply() {
    let agent = Agent::start();
    let mut s = agent.connect();
    std::io::Write::write_all(&mut s, b"\0\0\0\x05hello").expect("write");
    match wire::read_message::<_, AgentReply>(&mut s).expect("reply") {
        AgentReply::Error(e) => assert_eq!(e.code, "invalid_request"),
        other => panic!("expected error, got {other:?}"),
    }
    // The agent is still fine.
    assert_eq!(agent.exec(sh("echo ok")).stdout_str(), "ok\n");
}

#[test]
fn interactive_half_close_ends_stdin_after_the_frames_already_sent() {
    let agent = Agent::start();
    let mut s = agent.interactive(ExecRequest::new(["cat"]));
    write_frame(&mut s, FrameType::Stdin, b"one\n");
    write_frame(&mut s, FrameType::Stdin, b"two\n");
    s.shutdown(std::net::Shutdown::Write).expect("half-close");
    let out = read_output(s);
    assert_eq!(out.stdout_str(), "one\ntwo\n");
    assert_eq!(out.result.exit_code, 0);
}

#[test]
fn invalid_stdin_frames_kill_the_command_with_an_error() {
    let agent = Agent::start();
    let mut s = agent.interactive(ExecRequest::new(["cat"]));
    // A guest-to-host frame type is not valid input.
    write_frame(&mut s, FrameType::Stdout, b"nope");
    let out = read_output(s);
    assert_eq!(out.result.exit_code, -1);
    assert_eq!(out.result.signal, "SIGKILL");
    assert!(out.result.error.contains("stdin"), "{}", out.result.error);
}

#[test]
fn as_pid1_of_a_namespace_it_reaps_orphans() {
    let agent = common::Agent::start_in_pid_namespace();
    assert_eq!(agent.hello.pid, 1);
    // The subshell exits at once, orphaning its sleep to the agent (PID 1).
    let out = agent.exec(sh("(sleep 0.2 &); echo started"));
    assert_eq!(out.stdout_str(), "started\n");
    // After the orphan has exited, no zombie may remain in the namespace.
    let scan = "sleep 0.5; for f in /proc/[0-9]*/stat; do cat $f 2>/dev/null; echo; done";
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = agent.exec(sh(scan));
        let zombies: Vec<&str> = out
            .stdout_str()
            .leak()
            .lines()
            .filter(|l| {
                l.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .collect();
        if zombies.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "zombies left: {zombies:?}");
    }
    // The usual exec semantics hold as PID 1 too.
    let mut req = sh("sleep 100 & echo $!; sleep 100");
    req.timeout_s = 1;
    let out = agent.exec(req);
    assert!(out.result.timed_out);
}

#[test]
fn storage_writes_are_counted_including_reaped_descendants() {
    // Block I/O accounting needs a disk-backed filesystem (tmpfs counts no storage writes).
    let agent = Agent::start();
    let file = agent.dir.path().join("written");
    let out = agent.exec(sh(&format!(
        "dd if=/dev/zero of={} bs=1M count=4 conv=fsync status=none",
        file.display()
    )));
    assert_eq!(out.result.exit_code, 0, "{}", out.result.error);
    let usage = out.result.usage.expect("usage collected");
    // `dd` is the shell's child: its writes reach us through the rusage of reaped descendants.
    assert!(
        usage.io_write_bytes >= 4 << 20,
        "io_write_bytes {} after writing 4 MiB",
        usage.io_write_bytes
    );
}

/// Starts the agent with the open-file limit Linux gives a VM's PID 1: 1,024 soft, 4,096 hard.
fn agent_with_1024_files() -> common::Agent {
    common::Agent::start_with(|c| {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit is async-signal-safe and reads one live rlimit; the closure runs
        // in the forked child before exec and touches nothing else.
        unsafe {
            c.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: 1024,
                    rlim_max: 4096,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    })
}

#[test]
fn commands_get_the_open_file_limit_the_agent_started_with() {
    let agent = agent_with_1024_files();
    let out = agent.exec(sh("ulimit -n; ulimit -Hn"));
    assert_eq!(out.stdout_str(), "1024\n4096\n");
}

#[test]
fn hundreds_of_sessions_at_once_do_not_run_the_agent_out_of_descriptors() {
    // Each held session costs the agent about six descriptors: 300 of them need ~1,800, more
    // than the 1,024 it was started with.
    let agent = agent_with_1024_files();
    let sessions: Vec<_> = (0..300)
        .map(|_| agent.interactive(ExecRequest::new(["cat"])))
        .collect();
    for (i, mut s) in sessions.into_iter().enumerate() {
        let line = format!("session {i}\n");
        write_frame(&mut s, FrameType::Stdin, line.as_bytes());
        write_frame(&mut s, FrameType::StdinClose, b"");
        let out = read_output(s);
        assert_eq!(out.result.exit_code, 0, "session {i}: {:?}", out.result);
        assert_eq!(out.stdout_str(), line, "session {i}");
    }
}

#[test]
fn a_command_runs_as_the_user_it_is_given_with_no_capabilities() {
    let agent = Agent::start();
    let mut request = ExecRequest::new([
        "sh",
        "-c",
        "id -u; id -g; id -G; grep CapEff /proc/self/status; touch /proc/sys/kernel/hostname",
    ]);
    request.cwd = "/tmp".into();
    let s = agent.send(&AgentRequest::Exec {
        tail_bytes: None,
        request,
        interactive: false,
        user: Some(wire::agent::RunAs {
            uid: 4321,
            gid: 4322,
            groups: vec![5, 6],
        }),
    });
    let out = read_output(s);
    let stdout = out.stdout_str();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[..3], ["4321", "4322", "4322 5 6"], "{stdout}");
    assert_eq!(lines[3].split_whitespace().nth(1), Some("0000000000000000"));
    assert_ne!(
        out.result.exit_code, 0,
        "an unprivileged user wrote a sysctl"
    );
}

#[test]
fn a_directory_the_user_cannot_enter_is_a_bad_cwd() {
    let agent = Agent::start();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    let mut request = ExecRequest::new(["true"]);
    request.cwd = dir.path().display().to_string();
    let s = agent.send(&AgentRequest::Exec {
        tail_bytes: None,
        request,
        interactive: false,
        user: Some(wire::agent::RunAs {
            uid: 4321,
            gid: 4321,
            groups: vec![],
        }),
    });
    let out = read_output(s);
    let error = out.result.error;
    assert_eq!(
        error,
        format!(
            "bad cwd {:?}: Permission denied (os error 13)",
            dir.path().display().to_string()
        )
    );
}

#[test]
fn a_command_starts_with_the_resource_limits_it_asks_for() {
    let agent = agent_with_1024_files();
    let mut request = sh("ulimit -n; ulimit -Hn; ulimit -c; ulimit -Hc");
    request.rlimits = vec![
        wire::Rlimit {
            kind: "RLIMIT_NOFILE".into(),
            soft: 64,
            hard: 128,
        },
        wire::Rlimit {
            kind: "core".into(),
            soft: 0,
            hard: 0,
        },
    ];
    let out = agent.exec(request);
    assert_eq!(out.stdout_str(), "64\n128\n0\n0\n", "{:?}", out.result);
    // Unlimited is u64::MAX, as the kernel spells RLIM_INFINITY.
    let mut request = sh("ulimit -s");
    request.rlimits = vec![wire::Rlimit {
        kind: "stack".into(),
        soft: u64::MAX,
        hard: u64::MAX,
    }];
    let out = agent.exec(request);
    assert_eq!(out.stdout_str(), "unlimited\n", "{:?}", out.result);
}

#[test]
fn a_limit_the_agent_may_not_set_fails_the_command_and_says_which() {
    // As nobody, the agent cannot raise a hard limit: the command must not start at all.
    let agent = Agent::start_as_nobody();
    let mut request = ExecRequest::new(["true"]);
    request.rlimits = vec![wire::Rlimit {
        kind: "RLIMIT_NOFILE".into(),
        soft: 1 << 20,
        hard: 1 << 20,
    }];
    let out = agent.exec(request);
    assert_eq!(out.result.exit_code, -1, "{:?}", out.result);
    assert_eq!(
        out.result.error,
        "cannot set the nofile limit to soft 1048576 hard 1048576: \
         Operation not permitted (os error 1)"
    );
}

#[test]
fn a_signal_with_an_exec_id_reaches_that_command_only() {
    let agent = Agent::start();
    let start = |exec_id: &str, script: &str| {
        let mut request = sh(script);
        request.exec_id = exec_id.into();
        agent.send(&AgentRequest::Exec {
            tail_bytes: None,
            request,
            interactive: false,
            user: None,
        })
    };
    let target = start("step-1", "echo started; sleep 30 & wait");
    let bystander = start("step-2", "sleep 1; echo done");
    let mut target = std::io::BufReader::new(target);
    // Wait for the target to run before signalling it.
    let mut header = [0u8; 8];
    target.read_exact(&mut header).expect("first frame");
    let mut payload =
        vec![0u8; u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize];
    target.read_exact(&mut payload).expect("its payload");
    assert_eq!(payload, b"started\n");
    let signal = |exec_id: &str| {
        agent.reply(&AgentRequest::Signal {
            signal: libc::SIGTERM,
            exec_id: Some(exec_id.into()),
        })
    };
    assert_eq!(signal("step-1"), AgentReply::Signaled);
    let rest = read_output(target);
    assert_eq!(rest.result.signal, "SIGTERM", "{:?}", rest.result);
    let done = read_output(bystander);
    assert_eq!(done.result.exit_code, 0, "{:?}", done.result);
    assert_eq!(done.stdout_str(), "done\n");
    match signal("step-1") {
        AgentReply::Error(e) => assert_eq!(e.code, "not_found", "{e:?}"),
        other => panic!("signal to a finished command: {other:?}"),
    }
    // A name in use is refused; the first command is untouched.
    let first = start("same", "sleep 1; echo first");
    std::thread::sleep(Duration::from_millis(200));
    let second = read_output(start("same", "echo second"));
    assert!(
        second.result.error.contains("exec_id \"same\" is taken"),
        "{:?}",
        second.result
    );
    assert_eq!(read_output(first).stdout_str(), "first\n");
}
