//! The boot self-test (`crucible.selftest=1` or `--selftest`): a few commands through the real
//! connection handler over a socket pair, one console line each; then the block devices of
//! `crucible.selftest_block=` ([`block`]).

mod block;

use std::io;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use wire::agent::AgentRequest;
use wire::{Direction, ExecRequest, ExecResult, FrameReader, FrameType};

use crate::log;
use crate::server::{self, Agent};

/// What one exec produced.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Everything on stdout.
    pub stdout: Vec<u8>,
    /// Everything on stderr.
    pub stderr: Vec<u8>,
    /// The exit frame.
    pub result: ExecResult,
    /// Wall time of the whole exchange.
    pub elapsed: Duration,
}

/// Runs `req` through the agent's own connection handler and collects the stream.
pub fn exec(agent: &'static Agent, req: ExecRequest) -> io::Result<Outcome> {
    let (mut client, server_end) = UnixStream::pair()?;
    let started = Instant::now();
    std::thread::Builder::new()
        .name("selftest".into())
        .spawn(move || server::handle(server_end, agent))?;
    wire::write_message(
        &mut client,
        &AgentRequest::Exec {
            tail_bytes: None,
            request: req,
            interactive: false,
            user: None,
        },
    )
    .map_err(|e| io::Error::other(e.to_string()))?;
    let mut out = Outcome::default();
    let mut reader = FrameReader::new(client, Direction::GuestToHost);
    let mut exits = 0;
    while let Some(frame) = reader
        .read_frame()
        .map_err(|e| io::Error::other(e.to_string()))?
    {
        match frame.frame_type {
            FrameType::Stdout => out.stdout.extend_from_slice(frame.payload),
            FrameType::Stderr => out.stderr.extend_from_slice(frame.payload),
            FrameType::Exit => {
                exits += 1;
                out.result = serde_json::from_slice(frame.payload)
                    .map_err(|e| io::Error::other(format!("bad exit frame: {e}")))?;
            }
            other => return Err(io::Error::other(format!("unexpected {other} frame"))),
        }
    }
    if exits != 1 {
        return Err(io::Error::other(format!("{exits} exit frames")));
    }
    out.elapsed = started.elapsed();
    Ok(out)
}

fn sh(script: &str) -> ExecRequest {
    ExecRequest::new(["sh", "-c", script])
}

fn check(agent: &'static Agent, name: &str) -> Result<(), String> {
    let run = |req| exec(agent, req).map_err(|e| format!("exec failed: {e}"));
    match name {
        "echo_stdout" => {
            let o = run(sh("echo hello"))?;
            expect(o.stdout == b"hello\n", || {
                format!("stdout {:?}", lossy(&o.stdout))
            })?;
            expect(o.stderr.is_empty(), || {
                format!("stderr {:?}", lossy(&o.stderr))
            })?;
            expect(o.result.exit_code == 0, || {
                format!("exit {}", o.result.exit_code)
            })
        }
        "stderr" => {
            let o = run(sh("echo oops >&2"))?;
            expect(o.stderr == b"oops\n", || {
                format!("stderr {:?}", lossy(&o.stderr))
            })?;
            expect(o.stdout.is_empty(), || {
                format!("stdout {:?}", lossy(&o.stdout))
            })?;
            expect(o.result.exit_code == 0, || {
                format!("exit {}", o.result.exit_code)
            })
        }
        "exit_code" => {
            let o = run(sh("exit 7"))?;
            expect(o.result.exit_code == 7, || {
                format!("exit {}", o.result.exit_code)
            })
        }
        "timeout" => {
            let mut req = sh("sleep 10");
            req.timeout_s = 1;
            let o = run(req)?;
            expect(o.result.timed_out, || "timed_out is false".into())?;
            expect(o.result.signal == "SIGKILL", || {
                format!("signal {:?}", o.result.signal)
            })?;
            expect(o.elapsed < Duration::from_millis(2500), || {
                format!("took {} ms", o.elapsed.as_millis())
            })
        }
        "not_found" => {
            let o = run(ExecRequest::new(["no-such-cmd"]))?;
            expect(o.result.exit_code == -1, || {
                format!("exit {}", o.result.exit_code)
            })?;
            expect(!o.result.error.is_empty(), || "no error message".into())?;
            expect(o.stdout.is_empty() && o.stderr.is_empty(), || {
                "output frames".into()
            })
        }
        "pid1" => {
            let pid = std::process::id();
            expect(pid == 1, || format!("pid is {pid}"))
        }
        other => Err(format!("unknown test {other}")),
    }
}

fn expect(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(why())
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The tests, in the order they run; the names are part of the console contract.
pub const TESTS: [&str; 6] = [
    "echo_stdout",
    "stderr",
    "exit_code",
    "timeout",
    "not_found",
    "pid1",
];

/// Runs every test, then the block test of each of `block_devices`, printing one line each
/// and a summary. Returns `(passed, failed)`.
pub fn run(agent: &'static Agent, block_devices: &[String]) -> (u32, u32) {
    let (mut passed, mut failed) = (0, 0);
    let mut report = |name: &str, result: Result<String, String>| match result {
        Ok(facts) => {
            passed += 1;
            let sep = if facts.is_empty() { "" } else { " " };
            log::console(format_args!("crucible-selftest: {name} ok{sep}{facts}"));
        }
        Err(why) => {
            failed += 1;
            log::console(format_args!("crucible-selftest: {name} FAIL {why}"));
        }
    };
    for name in TESTS {
        report(name, check(agent, name).map(|()| String::new()));
    }
    for device in block_devices {
        report(
            &contract::block_selftest::test_name(device),
            block::check(device),
        );
    }
    log::console(format_args!(
        "crucible-selftest: done passed={passed} failed={failed}"
    ));
    (passed, failed)
}
