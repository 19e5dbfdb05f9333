//! `cargo xtask gen-fixtures`: the conformance frame streams and their manifest.
//!
//! Every `.bin` is written by the real codec (`wire::FrameWriter`); the manifest is then derived
//! by decoding those bytes again with `wire::Decoder`, so the two cannot disagree. Invalid
//! fixtures are built by cutting or corrupting valid streams, and generation fails unless the
//! decoder rejects each with exactly the error it is meant to show.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};
use wire::{
    encode_header, Decoder, Direction, ExecResult, FrameType, FrameWriter, Usage, HEADER_SIZE,
    MAX_PAYLOAD,
};

use crate::util::workspace_root;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Directory to write into (default: `fixtures/` in the workspace).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Payloads at most this long, and printable UTF-8, are also given as `text`.
const TEXT_LIMIT: usize = 256;

#[derive(Serialize)]
struct Manifest {
    version: u32,
    header_size: usize,
    max_payload_size: usize,
    frame_types: FrameTypes,
    fixtures: Vec<FixtureEntry>,
}

#[derive(Serialize)]
struct FrameTypes {
    stdout: u8,
    stderr: u8,
    exit: u8,
    stdin: u8,
    stdin_close: u8,
    resize: u8,
}

#[derive(Serialize)]
struct FixtureEntry {
    file: String,
    description: String,
    direction: &'static str,
    invalid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    frames: Option<Vec<FrameEntry>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
}

#[derive(Serialize)]
struct FrameEntry {
    #[serde(rename = "type")]
    frame_type: u8,
    type_name: &'static str,
    length: usize,
    sha256: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exec_result: Option<ExecResult>,
}

/// One fixture to generate: its bytes and what it must decode to.
struct Fixture {
    file: &'static str,
    description: &'static str,
    direction: Direction,
    bytes: Vec<u8>,
    /// `Some(kind)` for an invalid stream: the decoder must fail with this error kind.
    expect_error: Option<&'static str>,
}

/// A stream written through the real frame writer.
struct StreamBuilder(FrameWriter<Vec<u8>>);

impl StreamBuilder {
    fn new() -> Self {
        StreamBuilder(FrameWriter::new(Vec::new()))
    }

    fn data(mut self, frame_type: FrameType, data: &[u8]) -> Self {
        // Writing into a Vec cannot fail.
        let _ = self.0.write_data(frame_type, data);
        self
    }

    fn exit(mut self, result: &ExecResult) -> Vec<u8> {
        let _ = self.0.write_exit(result);
        self.0.into_inner()
    }

    fn bytes(self) -> Vec<u8> {
        self.0.into_inner()
    }
}

fn usage() -> Usage {
    Usage {
        cpu_user_ms: 180,
        cpu_sys_ms: 40,
        peak_memory_bytes: 35_389_440,
        page_faults_major: 2,
        context_switches_involuntary: 14,
        io_read_bytes: 0,
        io_write_bytes: 4096,
    }
}

fn exited(code: i32, duration_ms: u64) -> ExecResult {
    ExecResult {
        exit_code: code,
        duration_ms,
        usage: Some(usage()),
        ..ExecResult::default()
    }
}

fn killed(signal: &str) -> ExecResult {
    ExecResult {
        exit_code: -1,
        signal: signal.into(),
        ..exited(-1, 1520)
    }
}

fn valid(file: &'static str, description: &'static str, bytes: Vec<u8>) -> Fixture {
    Fixture {
        file,
        description,
        direction: Direction::GuestToHost,
        bytes,
        expect_error: None,
    }
}

fn invalid(
    file: &'static str,
    description: &'static str,
    bytes: Vec<u8>,
    error: &'static str,
) -> Fixture {
    Fixture {
        file,
        description,
        direction: Direction::GuestToHost,
        bytes,
        expect_error: Some(error),
    }
}

fn fixtures() -> Vec<Fixture> {
    use FrameType::{Resize, Stderr, Stdin, StdinClose, Stdout};

    let chunked: Vec<u8> = (0..200 * 1024).map(|i| (i % 251) as u8).collect();
    let binary: Vec<u8> = (0..=255u8)
        .rev()
        .chain([0xc3, 0x28, 0xff, 0xfe, 0x00])
        .collect();
    let hello = StreamBuilder::new()
        .data(Stdout, b"hello\n")
        .exit(&exited(0, 3));

    let mut truncated_header = StreamBuilder::new().data(Stdout, b"partial").bytes();
    truncated_header.extend_from_slice(&encode_header(Stdout, 5)[..3]);
    let mut truncated_payload = StreamBuilder::new().data(Stdout, b"0123456789").bytes();
    truncated_payload.truncate(HEADER_SIZE + 4);
    let mut oversize = encode_header(Stdout, MAX_PAYLOAD).to_vec();
    oversize[4..8].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_be_bytes());
    oversize.extend_from_slice(b"xxxxxxxx");
    let mut unknown_type = StreamBuilder::new().data(Stdout, b"abc").bytes();
    unknown_type.extend_from_slice(&[9, 0, 0, 0, 0, 0, 0, 1, b'?']);
    unknown_type.extend(StreamBuilder::new().exit(&exited(0, 1)));
    let mut data_after_exit = hello.clone();
    data_after_exit.extend(StreamBuilder::new().data(Stdout, b"late\n").bytes());

    vec![
        valid(
            "hello.bin",
            "plain stdout, then a clean exit 0",
            hello.clone(),
        ),
        valid(
            "interleaved.bin",
            "stdout and stderr frames interleaved in the order the command wrote them",
            StreamBuilder::new()
                .data(Stdout, b"out 1\n")
                .data(Stderr, b"err 1\n")
                .data(Stdout, b"out 2\n")
                .data(Stderr, b"err 2\n")
                .data(Stdout, b"out 3\n")
                .exit(&exited(0, 12)),
        ),
        valid(
            "no_output.bin",
            "a command that printed nothing: the exit frame alone",
            StreamBuilder::new().exit(&exited(0, 1)),
        ),
        valid(
            "empty_frame.bin",
            "a zero-length stdout frame is valid and carries no data",
            StreamBuilder::new()
                .data(Stdout, b"")
                .data(Stdout, b"x\n")
                .exit(&exited(0, 1)),
        ),
        valid(
            "chunked_200k.bin",
            "a single 200 KiB write chunked into consecutive stdout frames of 65536, 65536, \
             65536 and 8192 bytes; readers join them into one stream",
            StreamBuilder::new()
                .data(Stdout, &chunked)
                .exit(&exited(0, 41)),
        ),
        valid(
            "max_payload.bin",
            "one stderr frame of exactly max_payload_size bytes (the largest legal frame)",
            StreamBuilder::new()
                .data(Stderr, &vec![b'e'; MAX_PAYLOAD])
                .exit(&exited(0, 5)),
        ),
        valid(
            "binary.bin",
            "stdout that is not UTF-8 (every byte value, an invalid sequence, a NUL): \
             payloads are bytes, never text",
            StreamBuilder::new()
                .data(Stdout, &binary)
                .exit(&exited(0, 2)),
        ),
        valid(
            "nonzero_exit.bin",
            "a command that failed: stderr output, exit_code 3",
            StreamBuilder::new()
                .data(Stderr, b"grep: pattern not found\n")
                .exit(&exited(3, 7)),
        ),
        valid(
            "signal_killed.bin",
            "killed by a signal: exit_code -1, signal SIGKILL",
            StreamBuilder::new()
                .data(Stdout, b"working...\n")
                .exit(&killed("SIGKILL")),
        ),
        valid(
            "signal_term.bin",
            "terminated by SIGTERM: exit_code -1, signal SIGTERM",
            StreamBuilder::new().exit(&killed("SIGTERM")),
        ),
        valid(
            "timed_out.bin",
            "killed at its timeout_s deadline: exit_code -1, SIGKILL, timed_out true",
            StreamBuilder::new()
                .data(Stdout, b"tick\n")
                .exit(&ExecResult {
                    timed_out: true,
                    duration_ms: 2003,
                    ..killed("SIGKILL")
                }),
        ),
        valid(
            "oom_killed.bin",
            "killed by the OOM killer: exit_code -1, SIGKILL, oom_killed true",
            StreamBuilder::new().exit(&ExecResult {
                oom_killed: true,
                usage: Some(Usage {
                    peak_memory_bytes: 254_803_968,
                    ..usage()
                }),
                ..killed("SIGKILL")
            }),
        ),
        valid(
            "usage_null.bin",
            "an exit frame with usage null: the agent collected no statistics",
            StreamBuilder::new()
                .data(Stdout, b"ok\n")
                .exit(&ExecResult {
                    usage: None,
                    ..exited(0, 0)
                }),
        ),
        valid(
            "spawn_error.bin",
            "a command that never started: exit_code -1 and an error naming why",
            StreamBuilder::new().exit(&ExecResult::failed(
                "cannot run \"no-such-command\": not found on PATH",
            )),
        ),
        valid(
            "daemon_error.bin",
            "output, then the guest died: the daemon's synthesized exit frame (exit_code -1, \
             error, usage null)",
            StreamBuilder::new()
                .data(Stdout, b"step 1 done\n")
                .exit(&ExecResult::failed(
                    "sandbox sb-1a2b3c died during exec: agent connection reset",
                )),
        ),
        Fixture {
            file: "stdin_session.bin",
            description: "an interactive session's input: stdin frames, then stdin_close",
            direction: Direction::HostToGuest,
            bytes: StreamBuilder::new()
                .data(Stdin, b"cd /tmp\n")
                .data(Stdin, b"echo $PWD\n")
                .data(Stdin, b"printf 'no newline'")
                .data(StdinClose, b"")
                .bytes(),
            expect_error: None,
        },
        Fixture {
            file: "tty_session.bin",
            description: "a terminal session's input: its size changes (a resize frame's payload \
                          is the TerminalSize JSON), keystrokes, then stdin_close",
            direction: Direction::HostToGuest,
            bytes: StreamBuilder::new()
                .data(Resize, br#"{"rows":40,"cols":120}"#)
                .data(Stdin, b"stty size\r")
                .data(Resize, br#"{"rows":50,"cols":132}"#)
                .data(Stdin, b"exit\r")
                .data(StdinClose, b"")
                .bytes(),
            expect_error: None,
        },
        invalid(
            "truncated_header.bin",
            "EOF three bytes into a frame header",
            truncated_header,
            "truncated_header",
        ),
        invalid(
            "truncated_payload.bin",
            "EOF after 4 of the 10 payload bytes a header declared",
            truncated_payload,
            "truncated_payload",
        ),
        invalid(
            "oversize.bin",
            "a header declaring 65537 bytes, one more than the maximum",
            oversize,
            "oversize",
        ),
        invalid(
            "unknown_type.bin",
            "a frame of type 9, which does not exist",
            unknown_type,
            "unknown_type",
        ),
        invalid(
            "missing_exit.bin",
            "output, then a clean EOF with no exit frame: the command's result was lost",
            StreamBuilder::new()
                .data(Stdout, b"partial output\n")
                .bytes(),
            "missing_exit",
        ),
        invalid(
            "data_after_exit.bin",
            "a stdout frame after the exit frame",
            data_after_exit,
            "data_after_exit",
        ),
    ]
}

fn is_printable(text: &str) -> bool {
    text.chars()
        .all(|c| !c.is_control() || matches!(c, '\n' | '\t' | '\r'))
}

/// Decodes `bytes` as the manifest describes them, or returns the decode error's kind.
fn describe_frames(bytes: &[u8], direction: Direction) -> Result<Vec<FrameEntry>, &'static str> {
    let mut decoder = Decoder::new(direction);
    decoder.push(bytes);
    let mut frames = Vec::new();
    loop {
        let frame = match decoder.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => return Err(e.kind()),
        };
        let text = std::str::from_utf8(frame.payload)
            .ok()
            .filter(|t| t.len() <= TEXT_LIMIT && is_printable(t))
            .map(String::from);
        let exec_result = if frame.frame_type == FrameType::Exit {
            match serde_json::from_slice::<ExecResult>(frame.payload) {
                Ok(r) => Some(r),
                Err(_) => return Err("exit payload is not an ExecResult"),
            }
        } else {
            None
        };
        frames.push(FrameEntry {
            frame_type: frame.frame_type.as_u8(),
            type_name: frame.frame_type.name(),
            length: frame.payload.len(),
            sha256: hex::encode(Sha256::digest(frame.payload)),
            text,
            exec_result,
        });
    }
    decoder.finish().map_err(|e| e.kind())?;
    Ok(frames)
}

pub(crate) fn run(args: Args) -> Result<()> {
    let out = args
        .out
        .unwrap_or_else(|| workspace_root().join("fixtures"));
    generate(&out)?;
    eprintln!("wrote fixtures to {}", out.display());
    Ok(())
}

fn generate(out: &Path) -> Result<()> {
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut entries = Vec::new();
    for fixture in fixtures() {
        let decoded = describe_frames(&fixture.bytes, fixture.direction);
        let (frames, error) = match (decoded, fixture.expect_error) {
            (Ok(frames), None) => (Some(frames), None),
            (Err(kind), Some(expected)) if kind == expected => (None, Some(expected)),
            (Ok(_), Some(expected)) => {
                bail!(
                    "{}: decoded cleanly, but must fail with {expected}",
                    fixture.file
                )
            }
            (Err(kind), expected) => {
                bail!(
                    "{}: decoder said {kind}, expected {expected:?}",
                    fixture.file
                )
            }
        };
        let path = out.join(fixture.file);
        fs::write(&path, &fixture.bytes).with_context(|| format!("writing {}", path.display()))?;
        entries.push(FixtureEntry {
            file: fixture.file.to_string(),
            description: fixture.description.to_string(),
            direction: match fixture.direction {
                Direction::GuestToHost => "guest_to_host",
                Direction::HostToGuest => "host_to_guest",
            },
            invalid: error.is_some(),
            frames,
            error,
        });
    }
    let manifest = Manifest {
        version: 1,
        header_size: HEADER_SIZE,
        max_payload_size: MAX_PAYLOAD,
        frame_types: FrameTypes {
            stdout: FrameType::Stdout.as_u8(),
            stderr: FrameType::Stderr.as_u8(),
            exit: FrameType::Exit.as_u8(),
            stdin: FrameType::Stdin.as_u8(),
            stdin_close: FrameType::StdinClose.as_u8(),
            resize: FrameType::Resize.as_u8(),
        },
        fixtures: entries,
    };
    let mut json = serde_json::to_string_pretty(&manifest)?;
    json.push('\n');
    let path = out.join("manifest.json");
    fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
