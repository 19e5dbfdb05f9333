//! Human and JSON output.
//!
//! Every string a daemon sends (a tenant's labels and command lines, names, the daemon's
//! own error messages) goes through [`escape`] before it reaches human output: a terminal
//! acts on the control characters in what it prints (kubectl's CVE-2021-25743). `--json`
//! prints the daemon's text exactly, JSON escaping it.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use api_types::SandboxInfo;
use wire::ExecResult;

/// `text` fit for a terminal, on one line and in one table cell: each control character (C0,
/// tab and line feed included; DEL; C1) is written out as an escape, `\t`, `\n` and `\r`
/// for the common ones, `\x1b` for the rest of C0 and DEL, `\u{9b}` for C1. Everything
/// else is kept, so escaping twice changes nothing.
pub(crate) fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c <= '\u{1f}' || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `parts` joined by spaces, [`escape`]d.
fn escape_joined(parts: &[String]) -> String {
    escape(&parts.join(" ")).into_owned()
}

/// One line for an error, with its causes, never a debug dump; escaped, for the causes
/// include what the daemon said.
pub(crate) fn error_line(error: &anyhow::Error) -> String {
    chain(error.as_ref())
}

/// [`report::chain`], escaped: an error and its causes on one line.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    escape(&report::chain(error)).into_owned()
}

/// Prints a value as pretty JSON.
pub(crate) fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn state_name<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

fn age(ms: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let secs = now.abs_diff(ms) / 1000;
    match secs {
        0..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        _ => format!("{}h", secs / 3600),
    }
}

/// The `sandbox ls` table.
pub(crate) fn sandbox_table(sandboxes: &[SandboxInfo]) -> String {
    let mut out = format!(
        "{:<20} {:<9} {:<10} {:>7} {:>6} {:>8} {:>6}\n",
        "ID", "STATE", "BACKEND", "MEMORY", "AGE", "EXPIRES", "EXECS"
    );
    for s in sandboxes {
        out.push_str(&format!(
            "{:<20} {:<9} {:<10} {:>6}M {:>6} {:>8} {:>6}\n",
            escape(&s.id),
            state_name(&s.state),
            s.backend,
            s.memory_mib,
            age(s.created_at_ms),
            age(s.expires_at_ms),
            s.active_execs
        ));
    }
    out
}

/// The `sandbox ps` table.
pub(crate) fn exec_table(execs: &[wire::ExecStatus]) -> String {
    let mut out = format!(
        "{:<24} {:>7} {:<8} {:<9} {:>10} {:>10} {:>6}  {}\n",
        "EXEC ID", "PID", "STATE", "ATTACHED", "OUTPUT", "KEPT FROM", "AGE", "COMMAND"
    );
    for e in execs {
        let state = match (&e.state, &e.result) {
            (wire::ExecState::Running, _) => "running".to_string(),
            (wire::ExecState::Exited, Some(r)) if !r.signal.is_empty() => {
                escape(&r.signal).into_owned()
            }
            (wire::ExecState::Exited, Some(r)) => format!("exit {}", r.exit_code),
            (wire::ExecState::Exited, None) => "exited".to_string(),
        };
        out.push_str(&format!(
            "{:<24} {:>7} {:<8} {:<9} {:>10} {:>10} {:>6}  {}\n",
            escape(&e.exec_id),
            e.pid,
            state,
            if e.attached { "yes" } else { "no" },
            e.output_bytes,
            e.output_kept_from,
            age(e.started_unix_ms),
            escape_joined(&e.cmd)
        ));
    }
    out
}

/// The `cache ls` table.
pub(crate) fn cache_table(caches: &[api_types::CacheInfo]) -> String {
    let mut out = format!(
        "{:<24} {:<12} {:<10} {:>9} {:>9} {:<20} {:<20}\n",
        "NAME", "OWNER", "BACKEND", "SIZE", "USED", "SAVED BY", "IN USE BY"
    );
    for c in caches {
        let users = if c.users.is_empty() {
            // A daemon from before caches were shared names one user at most.
            c.in_use_by.iter().cloned().collect()
        } else {
            c.users.clone()
        };
        let users = if users.is_empty() {
            "-".to_string()
        } else {
            users.join(",")
        };
        out.push_str(&format!(
            "{:<24} {:<12} {:<10} {:>8}M {:>8}M {:<20} {:<20}\n",
            escape(&c.name),
            escape(&c.owner),
            c.backend,
            c.size_mib,
            c.used_mib,
            escape(c.saved_by.as_deref().unwrap_or("-")),
            escape(&users)
        ));
    }
    out
}

/// `crucible image ls`.
pub(crate) fn image_table(images: &[api_types::ImageInfo]) -> String {
    let mut out = format!(
        "{:<32} {:<12} {:<12} {:>6} {:>10} {:<12} {:<20}\n",
        "NAME", "OWNER", "FORMAT", "LAYERS", "SIZE", "USER", "WORKDIR"
    );
    for i in images {
        out.push_str(&format!(
            "{:<32} {:<12} {:<12} {:>6} {:>9}M {:<12} {:<20}\n",
            escape(&i.name),
            escape(&i.owner),
            escape(&i.format),
            i.layers.len(),
            i.size_bytes.div_ceil(1024 * 1024),
            escape(i.user.as_ref().map_or("root", |u| u.spec.as_str())),
            escape(i.working_dir.as_deref().unwrap_or("-"))
        ));
    }
    out
}

/// A sandbox's details.
pub(crate) fn sandbox_details(s: &SandboxInfo) -> String {
    let mut out = format!(
        "id:       {}\nstate:    {}\nbackend:  {}\nimage:    {}\nmemory:   {} MiB\nvcpus:    {}\nage:      {}\nexpires:  in {}\nexecs:    {}\nready in: {:.1} ms\n",
        escape(&s.id),
        state_name(&s.state),
        s.backend,
        escape(&s.image),
        s.memory_mib,
        s.vcpus,
        age(s.created_at_ms),
        age(s.expires_at_ms),
        s.active_execs,
        s.timings.create_to_ready_ms
    );
    if let Some(owner) = &s.owner {
        out.push_str(&format!("owner:    {}\n", escape(owner)));
    }
    for (k, v) in &s.labels {
        out.push_str(&format!("label:    {}={}\n", escape(k), escape(v)));
    }
    if let Some(n) = &s.network {
        out.push_str(&format!(
            "network:  {} via {} ({} connections, {} denied, {} B out, {} B in)\n",
            escape(&n.allow.join(",")),
            escape(&n.proxy),
            n.connections,
            n.denied,
            n.bytes_out,
            n.bytes_in
        ));
    }
    for c in &s.caches {
        out.push_str(&format!(
            "cache:    {} at {}{}\n",
            escape(&c.name),
            escape(&c.path),
            if c.save { "" } else { " (never saved)" }
        ));
    }
    for v in &s.volumes {
        out.push_str(&format!(
            "volume:   {} at {} (read-only)\n",
            escape(&v.name),
            escape(&v.path)
        ));
    }
    if let Some(mib) = s.disk_mib {
        out.push_str(&format!("disk:     {mib} MiB on the host's disk\n"));
    }
    if let Some(hostname) = &s.hostname {
        out.push_str(&format!("hostname: {}\n", escape(hostname)));
    }
    if s.share_process_namespace {
        out.push_str("pids:     one PID namespace for the sandbox and its containers\n");
    }
    for c in &s.containers {
        out.push_str(&format!("container: {}\n", container_line(c)));
    }
    if !s.error.is_empty() {
        out.push_str(&format!("error:    {}\n", escape(&s.error)));
    }
    out
}

/// One container in `sandbox get`: its name, image and state, then what went wrong, if
/// anything did.
fn container_line(c: &api_types::ContainerInfo) -> String {
    let mut line = format!(
        "{} ({}) {}",
        escape(&c.name),
        escape(&c.image),
        state_name(&c.state)
    );
    if c.restarts > 0 {
        line.push_str(&format!(", restarted {}×", c.restarts));
    }
    if let Some(code) = c.exit_code {
        line.push_str(&format!(", last exit {code}"));
    }
    if !c.error.is_empty() {
        line.push_str(&format!(": {}", escape(&c.error)));
    }
    line
}

/// `sandbox stats`: what a sandbox (or one of its containers) uses; a limit or a figure the
/// backend does not keep (0) is left out.
pub(crate) fn usage_table(stats: &wire::SandboxStats) -> String {
    let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / 1048576.0);
    let (memory, cpu, pids) = (&stats.memory, &stats.cpu, &stats.pids);
    let mut line = mib(memory.usage_bytes);
    if memory.limit_bytes > 0 {
        line.push_str(&format!(" of {}", mib(memory.limit_bytes)));
    }
    let mut out = format!("memory     {line}\n");
    if memory.max_usage_bytes > 0 {
        out.push_str(&format!("peak       {}\n", mib(memory.max_usage_bytes)));
    }
    if memory.cache_bytes > 0 {
        out.push_str(&format!("cache      {}\n", mib(memory.cache_bytes)));
    }
    if memory.oom_kills > 0 {
        out.push_str(&format!("oom kills  {}\n", memory.oom_kills));
    }
    out.push_str(&format!("cpu        {:.3} s\n", cpu.usage_ns as f64 / 1e9));
    let mut processes = pids.current.to_string();
    if pids.limit > 0 {
        processes.push_str(&format!(" of {}", pids.limit));
    }
    out.push_str(&format!("processes  {processes}\n"));
    out
}

/// What `crucible run` says at its end of the connections its sandbox's egress refused: a
/// line for the count, then one per destination with the reason its client was given
/// (escaped: the destinations are the sandbox's). Nothing when there were none.
pub(crate) fn egress_refusals(refused: &[api_types::EgressRefusal]) -> String {
    if refused.is_empty() {
        return String::new();
    }
    let total: u64 = refused.iter().map(|r| r.count).sum();
    let mut text = format!(
        "crucible: egress refused {total} connection{} to {} destination{} (allow one with \
         --allow HOST:PORT, within the daemon's --egress-allow):\n",
        if total == 1 { "" } else { "s" },
        refused.len(),
        if refused.len() == 1 { "" } else { "s" },
    );
    for r in refused {
        text.push_str(&format!(
            "  {} ({}x): {}\n",
            escape(&r.destination),
            r.count,
            escape(&r.reason)
        ));
    }
    text
}

/// What `crucible run` says at the end of a job that failed with its writable layer full: its
/// writes past it failed with ENOSPC, which the job's own message rarely blames on the
/// sandbox. Nothing when it is not full (or its size is unknown).
pub(crate) fn full_writable_layer(disk: &wire::DiskStats, on_disk: bool) -> String {
    if !disk.is_full() {
        return String::new();
    }
    let mib = |bytes: u64| bytes / (1024 * 1024);
    let (used, size) = (mib(disk.used_bytes), mib(disk.limit_bytes));
    if on_disk {
        format!(
            "crucible: the sandbox's writable layer was full ({used} of {size} MiB on its \
             disk): writes failed with ENOSPC; give a larger --disk MIB\n"
        )
    } else {
        format!(
            "crucible: the sandbox's writable layer was full ({used} of {size} MiB, held in \
             memory): writes failed with ENOSPC; give --disk MIB for a layer on the host's \
             disk, or more --memory (the layer in memory is at most 3/4 of it)\n"
        )
    }
}

/// The `--stats` table.
pub(crate) fn stats_table(result: &ExecResult) -> String {
    let mut out = format!("duration      {} ms\n", result.duration_ms);
    match &result.usage {
        None => out.push_str("usage         (not collected)\n"),
        Some(u) => {
            out.push_str(&format!("cpu user      {} ms\n", u.cpu_user_ms));
            out.push_str(&format!("cpu system    {} ms\n", u.cpu_sys_ms));
            out.push_str(&format!(
                "peak memory   {:.1} MiB\n",
                u.peak_memory_bytes as f64 / 1048576.0
            ));
            out.push_str(&format!("major faults  {}\n", u.page_faults_major));
            out.push_str(&format!(
                "preemptions   {}\n",
                u.context_switches_involuntary
            ));
            out.push_str(&format!("io read       {} bytes\n", u.io_read_bytes));
            out.push_str(&format!("io write      {} bytes\n", u.io_write_bytes));
        }
    }
    if !result.signal.is_empty() {
        out.push_str(&format!("signal        {}\n", escape(&result.signal)));
    }
    if result.timed_out {
        out.push_str("timed out     yes\n");
    }
    if result.oom_killed {
        out.push_str("oom killed    yes\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable() -> client::ClientError {
        client::ClientError::Connect {
            endpoint: "unix:/run/crucible.sock".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such socket"),
        }
    }

    #[test]
    fn a_container_line_says_what_went_wrong_only_when_something_did() {
        let mut c = api_types::ContainerInfo {
            name: "db".into(),
            image: "postgres:16".into(),
            state: api_types::ContainerState::Ready,
            command: vec!["postgres".into()],
            exec_id: Some("main".into()),
            restarts: 0,
            exit_code: None,
            error: String::new(),
        };
        assert_eq!(container_line(&c), "db (postgres:16) ready");
        c.state = api_types::ContainerState::Exited;
        c.restarts = 2;
        c.exit_code = Some(3);
        c.error = "its main process exited with 3".into();
        assert_eq!(
            container_line(&c),
            "db (postgres:16) exited, restarted 2×, last exit 3: its main process exited with 3"
        );
    }

    #[test]
    fn the_usage_table_shows_limits_only_where_there_are_some() {
        let mut stats = wire::SandboxStats::default();
        stats.memory.usage_bytes = 3 * 1048576;
        stats.cpu.usage_ns = 1_500_000_000;
        stats.pids.current = 4;
        assert_eq!(
            usage_table(&stats),
            "memory     3.0 MiB\ncpu        1.500 s\nprocesses  4\n"
        );
        stats.memory.limit_bytes = 512 * 1048576;
        stats.memory.oom_kills = 1;
        stats.pids.limit = 1024;
        assert_eq!(
            usage_table(&stats),
            "memory     3.0 MiB of 512.0 MiB\noom kills  1\ncpu        1.500 s\n\
             processes  4 of 1024\n"
        );
    }

    #[test]
    fn escape_writes_out_every_control_character_and_keeps_the_rest() {
        assert!(matches!(
            escape("db-1 (postgres:16) at /work: ünï ✓ \\x1b"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            escape("\x1b]0;pwned\x07\x1b[2J"),
            "\\x1b]0;pwned\\x07\\x1b[2J"
        );
        assert_eq!(escape("a\tb\nc\rd"), "a\\tb\\nc\\rd");
        assert_eq!(escape("\0\x08\x7f"), "\\x00\\x08\\x7f");
        assert_eq!(escape("\u{9b}31m\u{80}\u{9f}"), "\\u{9b}31m\\u{80}\\u{9f}");
        let once = escape("\x1b[2J\u{9b}\n");
        assert_eq!(escape(&once), once, "escaping twice changes nothing");
        for c in (0..=0x2ffu32).filter_map(char::from_u32) {
            let shown = escape(c.encode_utf8(&mut [0; 4])).into_owned();
            let control = c < ' ' || ('\u{7f}'..='\u{9f}').contains(&c);
            assert_eq!(shown.len() > c.len_utf8(), control, "{c:?}: {shown}");
            assert!(shown.chars().all(|s| !s.is_control()), "{c:?}: {shown}");
        }
    }

    fn hostile_exec() -> wire::ExecStatus {
        wire::ExecStatus {
            exec_id: "job\x1b[2J".into(),
            cmd: vec!["sh".into(), "-c".into(), "echo\n\x1b]0;title\x07".into()],
            state: wire::ExecState::Exited,
            pid: 7,
            started_unix_ms: 0,
            attached: false,
            keep: true,
            output_bytes: 0,
            output_kept_from: 0,
            result: Some(ExecResult {
                signal: "SIG\u{9b}".into(),
                ..ExecResult::default()
            }),
            stdin_bytes: None,
            stdin_closed: false,
        }
    }

    #[test]
    fn tables_and_details_show_a_daemons_text_escaped_one_row_a_line() {
        let table = exec_table(&[hostile_exec()]);
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(rows[1].starts_with("job\\x1b[2J "), "{table}");
        assert!(rows[1].contains(" SIG\\u{9b} "), "{table}");
        assert!(
            rows[1].ends_with("  sh -c echo\\n\\x1b]0;title\\x07"),
            "{table}"
        );
        let c = api_types::ContainerInfo {
            name: "db\x1b".into(),
            image: "pg\u{85}".into(),
            state: api_types::ContainerState::Failed,
            command: vec![],
            exec_id: None,
            restarts: 0,
            exit_code: None,
            error: "no\nway".into(),
        };
        assert_eq!(container_line(&c), "db\\x1b (pg\\u{85}) failed: no\\nway");
        let result = ExecResult {
            signal: "SIG\x07".into(),
            ..ExecResult::default()
        };
        assert!(stats_table(&result).contains("signal        SIG\\x07\n"));
    }

    #[test]
    fn an_error_line_shows_what_the_daemon_said_escaped() {
        let error = anyhow::Error::new(client::ClientError::Api {
            status: 404,
            code: "not_found".into(),
            message: "no sandbox\x1b]0;pwned\x07\nforged".into(),
        })
        .context("getting sb-1");
        assert_eq!(
            error_line(&error),
            "getting sb-1: no sandbox\\x1b]0;pwned\\x07\\nforged (HTTP 404, not_found)"
        );
    }

    #[test]
    fn an_error_line_names_each_cause_once() {
        let line =
            "cannot connect to the crucible daemon at unix:/run/crucible.sock: no such socket";
        assert_eq!(error_line(&unreachable().into()), line);
        assert_eq!(report::chain(&unreachable()), line);
        let error = anyhow::Error::new(unreachable()).context("deleting sb-1");
        assert_eq!(error_line(&error), format!("deleting sb-1: {line}"));
    }
}
