//! Blocking clients on a plain thread, no async runtime: what the daemon itself adds to an exec
//! and what the agent can stream, measured without the bench's own runtime in the way.
//!
//! The API figures elsewhere go through the Rust client (an async runtime, as users run it),
//! which costs tens of microseconds of its own per exec. To see the daemon's share alone, the
//! same `true` runs through the API and over the agent socket by equally simple blocking
//! clients, interleaved, and the figure is the median of the paired differences.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use wire::agent::AgentRequest;
use wire::{Decoder, Direction, ExecRequest, ExecResult, FrameReader, FrameType};

/// The exec of `true`: one `POST /sandboxes/{id}/exec` on a new connection, read to the end
/// (`Connection: close`). Returns the round trip; the answer is checked afterwards, untimed.
pub(crate) fn api_exec_true(daemon: &Path, id: &str) -> Result<Duration> {
    let body = br#"{"cmd":["true"]}"#;
    let mut request = format!(
        "POST /sandboxes/{id}/exec HTTP/1.1\r\nHost: localhost\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    let mut response = Vec::with_capacity(1024);
    let started = Instant::now();
    let mut stream = UnixStream::connect(daemon)
        .with_context(|| format!("connecting to {}", daemon.display()))?;
    stream.write_all(&request).context("sending the exec")?;
    stream
        .read_to_end(&mut response)
        .context("reading the exec's answer")?;
    let elapsed = started.elapsed();
    check_exit_zero(&response)?;
    Ok(elapsed)
}

/// The same exec over the agent protocol on the sandbox's agent socket, until the agent closes.
pub(crate) fn agent_exec_true(agent: &Path) -> Result<Duration> {
    let request = AgentRequest::Exec {
        tail_bytes: None,
        request: ExecRequest::new(["true"]),
        interactive: false,
        user: None,
    };
    let started = Instant::now();
    let mut stream =
        UnixStream::connect(agent).with_context(|| format!("connecting to {}", agent.display()))?;
    wire::write_message(&mut stream, &request).context("sending the exec to the agent")?;
    let mut frames = FrameReader::new(stream, Direction::GuestToHost);
    let mut code = None;
    while let Some(frame) = frames.read_frame().context("reading the agent's frames")? {
        if frame.frame_type == FrameType::Exit {
            let result: ExecResult =
                serde_json::from_slice(frame.payload).context("the exit frame")?;
            code = Some(result.exit_code);
        }
    }
    let elapsed = started.elapsed();
    ensure!(
        code == Some(0),
        "`true` over the agent socket ended {code:?}"
    );
    Ok(elapsed)
}

/// Streams `cmd`'s stdout over the agent socket; returns the stdout bytes (exit 0 required).
pub(crate) fn agent_stream(agent: &Path, cmd: &[String]) -> Result<u64> {
    let request = AgentRequest::Exec {
        tail_bytes: None,
        request: ExecRequest::new(cmd.iter().cloned()),
        interactive: false,
        user: None,
    };
    let mut stream =
        UnixStream::connect(agent).with_context(|| format!("connecting to {}", agent.display()))?;
    wire::write_message(&mut stream, &request).context("sending the exec to the agent")?;
    let mut frames = FrameReader::new(stream, Direction::GuestToHost);
    let (mut got, mut code) = (0u64, None);
    while let Some(frame) = frames.read_frame().context("reading the agent's frames")? {
        match frame.frame_type {
            FrameType::Stdout => got += frame.payload.len() as u64,
            FrameType::Exit => {
                let result: ExecResult =
                    serde_json::from_slice(frame.payload).context("the exit frame")?;
                code = Some(result.exit_code);
            }
            _ => {}
        }
    }
    ensure!(
        code == Some(0),
        "{cmd:?} over the agent socket ended {code:?}"
    );
    Ok(got)
}

/// Requires a `200` whose chunked body of frames ends with an exit frame of code 0.
fn check_exit_zero(response: &[u8]) -> Result<()> {
    let Some(head_end) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        bail!("the daemon's answer has no complete head");
    };
    let head = String::from_utf8_lossy(&response[..head_end]);
    ensure!(
        head.starts_with("HTTP/1.1 200"),
        "the exec was refused: {}",
        String::from_utf8_lossy(response)
    );
    ensure!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "the exec answer is not chunked: {head}"
    );
    let frames = dechunk(&response[head_end + 4..])?;
    let mut decoder = Decoder::with_capacity(Direction::GuestToHost, frames.len());
    decoder.unfilled_mut()[..frames.len()].copy_from_slice(&frames);
    decoder.mark_filled(frames.len());
    while let Some(frame) = decoder.next_frame().context("decoding the exec's frames")? {
        if frame.frame_type == FrameType::Exit {
            let result: ExecResult =
                serde_json::from_slice(frame.payload).context("the exit frame")?;
            ensure!(result.exit_code == 0, "`true` exited {}", result.exit_code);
            return Ok(());
        }
    }
    bail!("the exec answer ended without an exit frame")
}

/// The data of an HTTP/1.1 chunked body (a whole one, already read).
fn dechunk(mut body: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = body.windows(2).position(|w| w == b"\r\n") else {
            bail!("a chunked body without its last chunk");
        };
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        ensure!(body.len() >= size + 2, "a chunk cut short");
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dechunk_joins_chunks_and_stops_at_the_last() {
        let body = b"3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n";
        assert_eq!(dechunk(body).expect("valid"), b"abcde");
        assert!(dechunk(b"3\r\nab").is_err());
        assert!(dechunk(b"zz\r\n").is_err());
    }

    #[test]
    fn an_exit_frame_of_zero_is_required() {
        let mut frames = Vec::new();
        wire::encode_frames(FrameType::Stdout, b"hi", &mut frames);
        let exit = wire::encode_exit_payload(&ExecResult::default());
        wire::encode_frames(FrameType::Exit, &exit, &mut frames);
        let mut response = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        response.extend(format!("{:x}\r\n", frames.len()).into_bytes());
        response.extend(&frames);
        response.extend(b"\r\n0\r\n\r\n");
        check_exit_zero(&response).expect("exit 0 accepted");
        assert!(check_exit_zero(b"HTTP/1.1 404 Not Found\r\n\r\n").is_err());
    }
}
