//! How a build reports what it is doing, so xtask and the CLI can each show it their way.

use std::time::Duration;

/// How an artifact came to be: reused from a cache, or made now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Taken from the cache without building.
    Cached,
    /// Built (or copied from a file the caller gave) during this run.
    Built,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Cached => "cached",
            Origin::Built => "built",
        }
    }
}

/// Receives one call per phase start and end, plus notes in between.
///
/// Phases do not nest: every `phase_started` is followed by exactly one `phase_finished` or
/// `phase_failed` for the same name before the next phase starts.
pub trait Progress {
    /// A phase (e.g. `kernel`, `agent`, `initramfs`) began.
    fn phase_started(&self, phase: &str);
    /// What the running phase is doing now (e.g. `make vmlinux (log: …)`).
    fn status(&self, message: &str);
    /// Something the user should see and keep, such as "installing X with apt-get".
    fn note(&self, message: &str);
    /// The phase ended; `detail` says how (e.g. `cached`, `built, 14.8 MiB`).
    fn phase_finished(&self, phase: &str, elapsed: Duration, detail: &str);
    /// The phase failed; the error follows as the build's result.
    fn phase_failed(&self, phase: &str, elapsed: Duration);
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Progress for Silent {
    fn phase_started(&self, _: &str) {}
    fn status(&self, _: &str) {}
    fn note(&self, _: &str) {}
    fn phase_finished(&self, _: &str, _: Duration, _: &str) {}
    fn phase_failed(&self, _: &str, _: Duration) {}
}

/// Prints one plain line per event to stderr (for logs and non-terminals).
#[derive(Debug, Default, Clone, Copy)]
pub struct Plain;

impl Progress for Plain {
    fn phase_started(&self, phase: &str) {
        eprintln!("==> {phase}");
    }
    fn status(&self, message: &str) {
        eprintln!("    {message}");
    }
    fn note(&self, message: &str) {
        eprintln!("    note: {message}");
    }
    fn phase_finished(&self, phase: &str, elapsed: Duration, detail: &str) {
        eprintln!("    {phase}: {detail} ({})", format_duration(elapsed));
    }
    fn phase_failed(&self, phase: &str, elapsed: Duration) {
        eprintln!("    {phase}: FAILED after {}", format_duration(elapsed));
    }
}

/// `4m53s`, `12.3s`, `0.41s`.
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs >= 60.0 {
        let whole = d.as_secs();
        format!("{}m{:02}s", whole / 60, whole % 60)
    } else {
        format!("{secs:.2}s")
    }
}

/// `14.8 MiB`, `912 KiB`, `17 B`.
pub fn format_size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if b >= KIB * KIB {
        format!("{:.1} MiB", b / KIB / KIB)
    } else if b >= KIB {
        format!("{:.0} KiB", b / KIB)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes_read_like_cargo_output() {
        assert_eq!(format_duration(Duration::from_secs(293)), "4m53s");
        assert_eq!(format_duration(Duration::from_millis(410)), "0.41s");
        assert_eq!(format_size(17), "17 B");
        assert_eq!(format_size(15 * 1024 * 1024 + 800 * 1024), "15.8 MiB");
    }
}
