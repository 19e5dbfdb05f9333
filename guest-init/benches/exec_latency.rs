//! Exec round-trip latency of `true` through the agent over a Unix socket, side by side with the
//! floor: a plain fork/exec/wait of `true` with `std::process::Command` in this process.
//!
//! `cargo bench -p guest-init` (set `BENCH_ITERS` to change the sample count). The two are
//! measured alternately, one sample each, so that machine noise hits both alike; besides the
//! difference of the two medians it reports the median of the paired differences, which is
//! the steadier figure on a busy machine.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use wire::ExecRequest;

/// p50/p99 overhead target of the agent over the floor.
const TARGET_P50_OVERHEAD: Duration = Duration::from_micros(150);

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

struct Stats {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let total: Duration = samples.iter().sum();
    Stats {
        p50: percentile(&samples, 0.50),
        p99: percentile(&samples, 0.99),
        mean: total / u32::try_from(samples.len().max(1)).unwrap_or(u32::MAX),
    }
}

/// The exit frame of a complete response (which must end with it).
fn last_exit(mut bytes: &[u8]) -> wire::ExecResult {
    let mut exit = None;
    while bytes.len() >= wire::HEADER_SIZE {
        let len = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
        let (frame, rest) = bytes.split_at(wire::HEADER_SIZE + len);
        if frame[0] == wire::FrameType::Exit.as_u8() {
            exit = Some(serde_json::from_slice(&frame[wire::HEADER_SIZE..]).expect("exit json"));
        }
        bytes = rest;
    }
    assert!(bytes.is_empty(), "trailing bytes");
    exit.expect("exit frame")
}

fn main() {
    let iters: usize = std::env::var("BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let agent = common::Agent::start();

    // A lean client, so that the figure is the agent's and not the test client's allocations:
    // the request is encoded once and the response read into one reused buffer.
    let request = wire::encode_message(&wire::agent::AgentRequest::Exec {
        tail_bytes: None,
        request: ExecRequest::new(["true"]),
        interactive: false,
        user: None,
    })
    .expect("encode");
    let mut response = Vec::with_capacity(64 * 1024);
    let mut agent_exec = || {
        let start = Instant::now();
        let mut s = agent.connect();
        s.write_all(&request).expect("send");
        response.clear();
        s.read_to_end(&mut response).expect("read");
        let took = start.elapsed();
        let result = last_exit(&response);
        assert_eq!(result.exit_code, 0, "{}", result.error);
        took
    };
    let floor_exec = || {
        let start = Instant::now();
        let status = Command::new("true").status().expect("spawn true");
        let took = start.elapsed();
        assert!(status.success());
        took
    };

    let ping = || {
        let start = Instant::now();
        let reply = agent.reply(&wire::agent::AgentRequest::Ping);
        let took = start.elapsed();
        assert!(matches!(reply, wire::agent::AgentReply::Pong(_)));
        took
    };

    // Warm up both paths (page cache, allocator, the agent's first threads).
    for _ in 0..200 {
        agent_exec();
        floor_exec();
    }
    let mut through_agent = Vec::with_capacity(iters);
    let mut floor = Vec::with_capacity(iters);
    let mut paired = Vec::with_capacity(iters);
    while through_agent.len() < iters {
        let a = agent_exec();
        let f = floor_exec();
        through_agent.push(a);
        floor.push(f);
        paired.push(a.as_secs_f64() - f.as_secs_f64());
    }
    paired.sort_by(f64::total_cmp);
    let paired50 = paired[paired.len() / 2] * 1e6;
    let p = stats((0..iters.min(1000)).map(|_| ping()).collect());
    let a = stats(through_agent);
    let f = stats(floor);
    let overhead50 = a.p50.saturating_sub(f.p50);
    let overhead99 = a.p99.saturating_sub(f.p99);

    println!("exec round trip of `true`, {iters} samples each");
    println!(
        "{:<38} {:>10} {:>10} {:>10}",
        "", "p50 (µs)", "p99 (µs)", "mean (µs)"
    );
    println!(
        "{:<38} {:>10.1} {:>10.1} {:>10.1}",
        "agent (unix socket, frames, exit)",
        micros(a.p50),
        micros(a.p99),
        micros(a.mean)
    );
    println!(
        "{:<38} {:>10.1} {:>10.1} {:>10.1}",
        "floor (std::process::Command)",
        micros(f.p50),
        micros(f.p99),
        micros(f.mean)
    );
    println!(
        "{:<38} {:>10.1} {:>10.1} {:>10.1}",
        "ping (connect, dispatch, reply)",
        micros(p.p50),
        micros(p.p99),
        micros(p.mean)
    );
    println!(
        "{:<38} {:>10.1} {:>10.1}",
        "overhead (agent - floor)",
        micros(overhead50),
        micros(overhead99)
    );
    println!("{:<38} {:>10.1}", "median of paired differences", paired50);
    println!(
        "target: p50 overhead <= {} µs: {}",
        TARGET_P50_OVERHEAD.as_micros(),
        if overhead50 <= TARGET_P50_OVERHEAD && paired50 <= micros(TARGET_P50_OVERHEAD) {
            "met"
        } else {
            "NOT met"
        }
    );
}
