//! Human and JSON output.

use std::time::{SystemTime, UNIX_EPOCH};

use api_types::SandboxInfo;
use wire::ExecResult;

/// One line for an error, with its causes, never a debug dump.
pub(crate) fn error_line(error: &anyhow::Error) -> String {
    report::chain(error.as_ref())
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
            s.id,
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
            (wire::ExecState::Exited, Some(r)) if !r.signal.is_empty() => r.signal.clone(),
            (wire::ExecState::Exited, Some(r)) => format!("exit {}", r.exit_code),
            (wire::ExecState::Exited, None) => "exited".to_string(),
        };
        out.push_str(&format!(
            "{:<24} {:>7} {:<8} {:<9} {:>10} {:>10} {:>6}  {}\n",
            e.exec_id,
            e.pid,
            state,
            if e.attached { "yes" } else { "no" },
            e.output_bytes,
            e.output_kept_from,
            age(e.started_unix_ms),
            e.cmd.join(" ")
        ));
    }
    out
}

/// The `cache ls` table.
pub(crate) fn cache_table(caches: &[api_types::CacheInfo]) -> String {
    let mut out = format!(
        "{:<24} {:<12} {:<10} {:>9} {:>9} {:<20}\n",
        "NAME", "OWNER", "BACKEND", "SIZE", "USED", "IN USE BY"
    );
    for c in caches {
        out.push_str(&format!(
            "{:<24} {:<12} {:<10} {:>8}M {:>8}M {:<20}\n",
            c.name,
            c.owner,
            c.backend,
            c.size_mib,
            c.used_mib,
            c.in_use_by.as_deref().unwrap_or("-")
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
            i.name,
            i.owner,
            i.format,
            i.layers.len(),
            i.size_bytes.div_ceil(1024 * 1024),
            i.user.as_ref().map_or("root", |u| u.spec.as_str()),
            i.working_dir.as_deref().unwrap_or("-")
        ));
    }
    out
}

/// A sandbox's details.
pub(crate) fn sandbox_details(s: &SandboxInfo) -> String {
    let mut out = format!(
        "id:       {}\nstate:    {}\nbackend:  {}\nimage:    {}\nmemory:   {} MiB\nvcpus:    {}\nage:      {}\nexpires:  in {}\nexecs:    {}\nready in: {:.1} ms\n",
        s.id,
        state_name(&s.state),
        s.backend,
        s.image,
        s.memory_mib,
        s.vcpus,
        age(s.created_at_ms),
        age(s.expires_at_ms),
        s.active_execs,
        s.timings.create_to_ready_ms
    );
    if let Some(owner) = &s.owner {
        out.push_str(&format!("owner:    {owner}\n"));
    }
    for (k, v) in &s.labels {
        out.push_str(&format!("label:    {k}={v}\n"));
    }
    if let Some(n) = &s.network {
        out.push_str(&format!(
            "network:  {} via {} ({} connections, {} denied, {} B out, {} B in)\n",
            n.allow.join(","),
            n.proxy,
            n.connections,
            n.denied,
            n.bytes_out,
            n.bytes_in
        ));
    }
    for c in &s.caches {
        out.push_str(&format!("cache:    {} at {}\n", c.name, c.path));
    }
    for v in &s.volumes {
        out.push_str(&format!("volume:   {} at {} (read-only)\n", v.name, v.path));
    }
    if let Some(mib) = s.disk_mib {
        out.push_str(&format!("disk:     {mib} MiB on the host's disk\n"));
    }
    for c in &s.containers {
        out.push_str(&format!("container: {}\n", container_line(c)));
    }
    if !s.error.is_empty() {
        out.push_str(&format!("error:    {}\n", s.error));
    }
    out
}

/// One container in `sandbox get`: its name, image and state, then what went wrong, if
/// anything did.
fn container_line(c: &api_types::ContainerInfo) -> String {
    let mut line = format!("{} ({}) {}", c.name, c.image, state_name(&c.state));
    if c.restarts > 0 {
        line.push_str(&format!(", restarted {}×", c.restarts));
    }
    if let Some(code) = c.exit_code {
        line.push_str(&format!(", last exit {code}"));
    }
    if !c.error.is_empty() {
        line.push_str(&format!(": {}", c.error));
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
        out.push_str(&format!("signal        {}\n", result.signal));
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
    fn an_error_line_names_each_cause_once() {
        let line =
            "cannot connect to the crucible daemon at unix:/run/crucible.sock: no such socket";
        assert_eq!(error_line(&unreachable().into()), line);
        assert_eq!(report::chain(&unreachable()), line);
        let error = anyhow::Error::new(unreachable()).context("deleting sb-1");
        assert_eq!(error_line(&error), format!("deleting sb-1: {line}"));
    }
}
