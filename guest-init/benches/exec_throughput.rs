//! Stdout throughput of a command through the agent over a Unix socket, side by side with the
//! floor: the same command writing into a pipe that this process reads.
//!
//! `cargo bench -p guest-init --bench exec_throughput` (`BENCH_MIB` sets the size, default
//! 1024; `BENCH_RUNS` the number of runs, default 5). The command is `dd` with 64 KiB blocks
//! from `/dev/zero`; the client reads the frame stream into one reused 256 KiB buffer and
//! counts payload bytes as it decodes headers, so the figure is the agent's, not the client's.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

use wire::ExecRequest;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn dd(mib: u64) -> Vec<String> {
    vec![
        "dd".into(),
        "if=/dev/zero".into(),
        "bs=65536".into(),
        format!("count={}", mib * 16),
        "status=none".into(),
    ]
}

/// Reads a whole exec response, returning (stdout payload bytes, exit frames seen).
fn count_stdout(stream: &mut impl Read) -> (u64, usize) {
    let mut buf = vec![0u8; 256 * 1024];
    let (mut filled, mut pos) = (0usize, 0usize);
    let (mut stdout, mut exits) = (0u64, 0usize);
    loop {
        // Whole headers in the buffer: account for their payloads, which may run past it.
        while filled - pos >= wire::HEADER_SIZE {
            let h = &buf[pos..pos + wire::HEADER_SIZE];
            let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
            let kind = h[0];
            if kind == wire::FrameType::Exit.as_u8() {
                exits += 1;
            }
            let have = filled - pos - wire::HEADER_SIZE;
            if kind == wire::FrameType::Stdout.as_u8() {
                stdout += len as u64;
            }
            if have >= len {
                pos += wire::HEADER_SIZE + len;
            } else {
                // Skip the rest of this payload as it arrives.
                let mut skip = len - have;
                filled = 0;
                pos = 0;
                while skip > 0 {
                    let want = skip.min(buf.len());
                    let n = stream.read(&mut buf[..want]).expect("read payload");
                    assert!(n > 0, "stream ended inside a payload");
                    skip -= n;
                }
            }
        }
        buf.copy_within(pos..filled, 0);
        filled -= pos;
        pos = 0;
        let n = stream.read(&mut buf[filled..]).expect("read");
        if n == 0 {
            assert_eq!(filled, 0, "stream ended inside a header");
            return (stdout, exits);
        }
        filled += n;
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mib = env_or("BENCH_MIB", 1024);
    let runs = env_or("BENCH_RUNS", 5).max(1);
    let bytes = mib * 1024 * 1024;
    let agent = common::Agent::start();
    let request = wire::encode_message(&wire::agent::AgentRequest::Exec {
        tail_bytes: None,
        request: ExecRequest::new(dd(mib)),
        interactive: false,
        user: None,
    })
    .expect("encode");

    let through_agent = || {
        let start = Instant::now();
        let mut s = agent.connect();
        s.write_all(&request).expect("send");
        let (got, exits) = count_stdout(&mut s);
        let secs = start.elapsed().as_secs_f64();
        assert_eq!((got, exits), (bytes, 1), "bytes and exit frames");
        bytes as f64 / secs / (1u64 << 30) as f64
    };
    let floor = || {
        let start = Instant::now();
        let mut child = Command::new(&dd(mib)[0])
            .args(&dd(mib)[1..])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn dd");
        let mut out = child.stdout.take().expect("stdout");
        let mut buf = vec![0u8; 256 * 1024];
        let mut got = 0u64;
        loop {
            let n = out.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        assert!(child.wait().expect("wait").success());
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(got, bytes);
        bytes as f64 / secs / (1u64 << 30) as f64
    };

    through_agent();
    floor();
    let (mut a, mut f) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        a.push(through_agent());
        f.push(floor());
    }
    let (a, f) = (median(a), median(f));
    println!("stdout throughput of `dd bs=64K` ({mib} MiB), median of {runs} runs");
    println!("{:<42} {:>8.2} GiB/s", "agent (unix socket, frames)", a);
    println!(
        "{:<42} {:>8.2} GiB/s",
        "floor (dd into a pipe this process reads)", f
    );
    println!("{:<42} {:>8.2}", "agent / floor", a / f);
}
