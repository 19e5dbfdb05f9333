//! Small helpers shared by the xtask commands.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use xshell::{Cmd, Shell};

/// The workspace root (xtask lives one level below it).
pub(crate) fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}

/// The shell every command runs through, in the workspace root.
pub(crate) fn shell() -> Result<Shell> {
    let sh = Shell::new().context("creating the shell xtask runs its commands in")?;
    sh.change_dir(workspace_root());
    Ok(sh)
}

/// The cargo that runs xtask (`$CARGO`), else `cargo` from `PATH`.
pub(crate) fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Runs `cmd` as the step `name` (in its shell's directory, the workspace root unless pushed
/// elsewhere), its output shown as it comes, echoing it and its duration; fails naming the
/// step, the command and how it ended.
pub(crate) fn run_step(name: &str, cmd: Cmd<'_>) -> Result<()> {
    run_timed(name, cmd).1
}

/// [`run_step`], also returning how long the command took, whether it passed or not.
pub(crate) fn run_timed(name: &str, cmd: Cmd<'_>) -> (Duration, Result<()>) {
    eprintln!("==> {name}: {cmd}");
    let started = Instant::now();
    // Quiet: the line above already shows the command, with the step's name.
    let result = cmd.quiet().run();
    let elapsed = started.elapsed();
    let result = match result {
        Ok(()) => {
            eprintln!("    {name} ok in {elapsed:.1?}");
            Ok(())
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("{name} failed after {elapsed:.1?}"))),
    };
    (elapsed, result)
}

/// The command line of `cmd`, for messages about the commands still run through
/// `std::process::Command` (an xshell [`Cmd`] shows itself with `Display`).
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use xshell::cmd;

    #[test]
    fn a_step_runs_in_the_workspace_root() {
        let sh = shell().expect("a shell");
        run_step("probe", cmd!(sh, "test -f xtask/Cargo.toml")).expect("run in the root");
    }

    #[test]
    fn a_failed_step_names_itself_the_command_and_its_exit_code() {
        let sh = shell().expect("a shell");
        let (_, result) = run_timed("probe", cmd!(sh, "sh -c 'exit 3'"));
        let message = format!("{:#}", result.expect_err("exit 3 fails"));
        assert!(message.starts_with("probe failed after "), "{message}");
        assert!(message.contains(r#"`sh -c "exit 3"`: 3"#), "{message}");
    }

    #[test]
    fn a_step_whose_program_is_missing_says_so() {
        let sh = shell().expect("a shell");
        let message = format!(
            "{:#}",
            run_step("probe", cmd!(sh, "no-such-program-crucible")).expect_err("no such program")
        );
        assert!(message.starts_with("probe failed after "), "{message}");
        assert!(
            message.contains("command not found: `no-such-program-crucible`"),
            "{message}"
        );
    }
}
