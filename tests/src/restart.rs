//! Helpers for the live-restore tests of both backends: a long command that prints a line
//! every half second, what a listing must keep across a restart, re-attaching to a command and
//! checking its whole output, a sandbox's record.

use std::collections::BTreeMap;
use std::path::PathBuf;

use client::{Client, ExecEvent};
use wire::ExecRequest;

use crate::process::DaemonHome;

/// Lines each long command prints, one every 0.5 s: 20 s in all.
pub const LINES: usize = 40;

pub fn script(tag: &str) -> String {
    format!("for i in $(seq 1 {LINES}); do echo {tag}-line$i; sleep 0.5; done; exit 7")
}

pub fn expected(tag: &str) -> String {
    (1..=LINES).map(|i| format!("{tag}-line{i}\n")).collect()
}

/// Starts the long command in `id` and reads its first line; the stream stays open.
pub async fn start_long(c: &Client, id: &str) -> (client::ExecStream, Vec<u8>) {
    let mut stream = c
        .exec(id, &ExecRequest::new(["sh", "-c", &script(id)]))
        .await
        .expect("exec");
    match stream.next_event().await {
        Some(Ok(ExecEvent::Stdout(bytes))) => {
            let first = bytes.to_vec();
            (stream, first)
        }
        other => panic!("{id}: the first line: {other:?}"),
    }
}

/// What a listing says of each sandbox that must survive a restart.
pub fn identities(list: &[api_types::SandboxInfo]) -> BTreeMap<String, String> {
    list.iter()
        .map(|s| {
            (
                s.id.clone(),
                format!(
                    "{:?} {:?} {} {} {:?}",
                    s.owner, s.state, s.created_at_ms, s.expires_at_ms, s.labels
                ),
            )
        })
        .collect()
}

/// Re-attaches to each command from the bytes it had and checks its whole output and status.
pub async fn finish_commands(c: &Client, started: Vec<(String, String, Vec<u8>)>) {
    for (id, exec_id, head) in started {
        let rest = c
            .attach(&id, &exec_id, head.len() as u64)
            .await
            .unwrap_or_else(|e| panic!("{id}: attach {exec_id}: {e}"))
            .collect()
            .await
            .unwrap_or_else(|e| panic!("{id}: the rest of {exec_id}: {e}"));
        let mut all = head;
        all.extend_from_slice(&rest.stdout);
        assert_eq!(
            String::from_utf8_lossy(&all),
            expected(&id),
            "{id}: nothing lost"
        );
        assert_eq!(rest.result.exit_code, 7, "{id}: {:?}", rest.result);
        assert_eq!(rest.result.output_dropped_bytes, 0, "{id}");
    }
}

/// Where sandbox `id`'s live-restore record is.
pub fn record_path(home: &DaemonHome, id: &str) -> PathBuf {
    home.state_dir().join("records").join(format!("{id}.json"))
}

/// Cuts sandbox `id`'s record in half: a daemon must refuse it.
pub fn truncate_record(home: &DaemonHome, id: &str) {
    let path = record_path(home, id);
    let whole = std::fs::read(&path).expect("the record");
    std::fs::write(&path, &whole[..whole.len() / 2]).expect("cut the record");
}
