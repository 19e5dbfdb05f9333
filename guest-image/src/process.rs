//! Running external commands with clear errors: which command, its status, and its output.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use thiserror::Error;

/// How many lines of a failed command's log are shown in its error.
pub const LOG_TAIL_LINES: usize = 40;

#[derive(Debug, Error)]
pub enum CommandError {
    #[error("could not start `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    #[error("could not create the log file {}", path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("`{command}` failed ({status}){}", if output.is_empty() { String::new() } else { format!(":\n{output}") })]
    Failed {
        command: String,
        status: ExitStatus,
        output: String,
    },
    #[error(
        "`{command}` failed ({status}); full log: {}\n--- last {LOG_TAIL_LINES} lines ---\n{tail}",
        log.display()
    )]
    FailedLogged {
        command: String,
        status: ExitStatus,
        log: PathBuf,
        tail: String,
    },
}

/// The command line of `cmd`, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = String::new();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            s.push_str(&format!(
                "{}={} ",
                key.to_string_lossy(),
                value.to_string_lossy()
            ));
        }
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Runs `cmd` and returns its stdout; on failure the error carries stderr.
pub fn output(cmd: &mut Command) -> Result<String, CommandError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| CommandError::Spawn {
            command: describe(cmd),
            source,
        })?;
    if !out.status.success() {
        return Err(CommandError::Failed {
            command: describe(cmd),
            status: out.status,
            output: String::from_utf8_lossy(&out.stderr).trim_end().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `cmd` with stdout and stderr appended to `log`; on failure the error shows the log's
/// last [`LOG_TAIL_LINES`] lines.
pub fn run_logged(cmd: &mut Command, log: &Path) -> Result<(), CommandError> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(|source| CommandError::Log {
            path: log.to_path_buf(),
            source,
        })?;
    }
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|source| CommandError::Log {
                path: log.to_path_buf(),
                source,
            })
    };
    let mut file = open()?;
    {
        use std::io::Write;
        let _ = writeln!(file, "$ {}", describe(cmd));
    }
    let stderr = open()?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(stderr)
        .status()
        .map_err(|source| CommandError::Spawn {
            command: describe(cmd),
            source,
        })?;
    if status.success() {
        return Ok(());
    }
    Err(CommandError::FailedLogged {
        command: describe(cmd),
        status,
        log: log.to_path_buf(),
        tail: tail(log, LOG_TAIL_LINES).unwrap_or_else(|e| format!("(could not read log: {e})")),
    })
}

/// The last `lines` lines of the file at `path` (reads at most its last 256 KiB).
pub fn tail(path: &Path, lines: usize) -> io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(256 * 1024);
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    Ok(last_lines(&text, lines))
}

fn last_lines(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.trim_end().lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_command_error_shows_log_tail() {
        let dir = std::env::temp_dir().join(format!("crucible-image-proc-{}", std::process::id()));
        let log = dir.join("x.log");
        let _ = std::fs::remove_file(&log);
        let err = run_logged(
            Command::new("sh").args(["-c", "for i in $(seq 1 100); do echo line$i; done; exit 3"]),
            &log,
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("line100"), "{text}");
        assert!(text.contains("line61"), "{text}");
        assert!(!text.contains("line60\n"), "{text}");
        assert!(text.contains(&log.display().to_string()));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn last_lines_keeps_the_end() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(last_lines("a", 5), "a");
    }
}
