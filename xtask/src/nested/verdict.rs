//! What one L1 run came to, from what L1 said (`@@nested` lines on its result port), its
//! kernel console, and how it ended: the steps passed, *ours* failed (a step failed, or L1
//! could not get `/dev/kvm`), or *the emulator's* (L1's kernel panicked, L1 froze, QEMU died):
//! only the last may be retried.

use std::fmt;
use std::time::Duration;

/// The protocol prefix of L1's own lines.
pub(crate) const PREFIX: &str = "@@nested ";

/// One step's end as L1 reported it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepEnd {
    /// The step's name.
    pub name: String,
    /// Its exit status (137 when L1's deadline killed it).
    pub status: i32,
    /// Seconds it took, by L1's clock.
    pub seconds: f64,
    /// Its deadline in seconds.
    pub limit: u64,
}

impl StepEnd {
    /// Whether L1's deadline ended it.
    pub(crate) fn timed_out(&self) -> bool {
        self.status != 0 && self.seconds + 1.0 >= self.limit as f64
    }
}

/// Everything L1 said, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Transcript {
    /// Steps begun.
    pub begun: Vec<String>,
    /// Steps ended.
    pub ended: Vec<StepEnd>,
    /// L1 gave up before running the steps, and why.
    pub fatal: Option<String>,
    /// L1 reached the end of its plan.
    pub done: bool,
    /// Heartbeats seen.
    pub heartbeats: u32,
    /// The `kvm ready` line (kvm_amd's parameters), once seen.
    pub kvm: Option<String>,
}

/// One parsed `@@nested` line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    /// `heartbeat UPTIME`.
    Heartbeat,
    /// `step-begin NAME`.
    StepBegin(String),
    /// `step-end NAME rc=N seconds=S limit=L`.
    StepEnd(StepEnd),
    /// `fatal REASON`.
    Fatal(String),
    /// `done …`.
    Done,
    /// `kvm ready …`.
    KvmReady(String),
    /// Anything else L1 says about itself (`booted …`).
    Note(String),
}

/// The event on `line`, if it is one of L1's own.
pub(crate) fn parse(line: &str) -> Option<Event> {
    let rest = line.trim_end().strip_prefix(PREFIX)?;
    let (word, args) = rest.split_once(' ').unwrap_or((rest, ""));
    Some(match word {
        "heartbeat" => Event::Heartbeat,
        "step-begin" => Event::StepBegin(args.to_string()),
        "step-end" => {
            let mut fields = args.split(' ');
            let name = fields.next().unwrap_or_default().to_string();
            let (mut status, mut seconds, mut limit) = (-1, 0.0, 0);
            for field in fields {
                match field.split_once('=') {
                    Some(("rc", v)) => status = v.parse().unwrap_or(-1),
                    Some(("seconds", v)) => seconds = v.parse().unwrap_or(0.0),
                    Some(("limit", v)) => limit = v.parse().unwrap_or(0),
                    _ => {}
                }
            }
            Event::StepEnd(StepEnd {
                name,
                status,
                seconds,
                limit,
            })
        }
        "fatal" => Event::Fatal(args.to_string()),
        "done" => Event::Done,
        "kvm" => Event::KvmReady(args.trim_start_matches("ready ").to_string()),
        _ => Event::Note(rest.to_string()),
    })
}

impl Transcript {
    /// Takes in one event.
    pub(crate) fn record(&mut self, event: Event) {
        match event {
            Event::Heartbeat => self.heartbeats += 1,
            Event::StepBegin(name) => self.begun.push(name),
            Event::StepEnd(end) => self.ended.push(end),
            Event::Fatal(why) => self.fatal = Some(why),
            Event::Done => self.done = true,
            Event::KvmReady(params) => self.kvm = Some(params),
            Event::Note(_) => {}
        }
    }

    /// The steps that failed.
    pub(crate) fn failed(&self) -> impl Iterator<Item = &StepEnd> {
        self.ended.iter().filter(|s| s.status != 0)
    }
}

/// How the host saw the run end.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ending {
    /// QEMU exited by itself (L1 powered off, rebooted, or QEMU died), with this description.
    Exited(String),
    /// The watchdog killed it: no heartbeat for this long; `at` says where its vCPUs were.
    Silent {
        /// How long L1 said nothing.
        quiet: Duration,
        /// Where L1's vCPUs were (from QEMU's monitor), if known.
        at: String,
    },
    /// The whole run passed its deadline while L1 still answered.
    Deadline {
        /// The deadline.
        limit: Duration,
        /// Where L1's vCPUs were, if known.
        at: String,
    },
}

/// What a run came to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Every step passed.
    Passed,
    /// Our failure: never retried.
    Ours(String),
    /// The emulator's: may be retried.
    Emulator(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Passed => write!(f, "passed"),
            Verdict::Ours(why) => write!(f, "failed (ours): {why}"),
            Verdict::Emulator(why) => write!(f, "failed (the emulator's): {why}"),
        }
    }
}

/// The first line of L1's kernel console that says its kernel panicked or oopsed.
pub(crate) fn kernel_panic(console: &str) -> Option<&str> {
    console.lines().find(|l| {
        l.contains("Kernel panic - not syncing")
            || l.contains("BUG: kernel NULL pointer")
            || l.contains("general protection fault")
            || l.contains("corrupted stack end detected")
    })
}

/// What L1's kernel said about a CPU that stopped making progress: its first soft-lockup or
/// RCU-stall report, with the instruction pointer it printed (`RIP: 0010:function+0x…`).
pub(crate) fn lockup_report(console: &str) -> Option<String> {
    let lines: Vec<&str> = console.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("soft lockup") || l.contains("self-detected stall"))?;
    let what = lines[at].split("] ").nth(1).unwrap_or(lines[at]).trim();
    let rip = lines[at..]
        .iter()
        .find_map(|l| l.split("RIP: 0010:").nth(1))
        .map(|r| format!(" at {}", r.trim()))
        .unwrap_or_default();
    Some(format!("{what}{rip}"))
}

/// Judges a run. A failed step is ours whatever happened after it; a run whose steps all ended
/// well but did not reach its end is the emulator's when L1's kernel panicked, L1 fell silent
/// or QEMU died, and ours when it ran out of time while still answering.
pub(crate) fn judge(t: &Transcript, console: &str, ending: &Ending) -> Verdict {
    if let Some(why) = &t.fatal {
        return Verdict::Ours(format!("L1 could not run the tier: {why}"));
    }
    let failed: Vec<String> = t
        .failed()
        .map(|s| {
            let how = if s.timed_out() {
                format!("killed at its {} s deadline", s.limit)
            } else {
                format!("exit status {}", s.status)
            };
            format!("{} ({how})", s.name)
        })
        .collect();
    if !failed.is_empty() {
        return Verdict::Ours(format!("step {} failed", failed.join(", step ")));
    }
    let unended: Vec<&String> = t
        .begun
        .iter()
        .filter(|b| !t.ended.iter().any(|e| &e.name == *b))
        .collect();
    if t.done {
        return match unended.first() {
            None => Verdict::Passed,
            Some(step) => Verdict::Ours(format!("step {step} began but never reported its end")),
        };
    }
    let running = unended
        .first()
        .map(|s| format!(" during step {s}"))
        .unwrap_or_default();
    if let Some(line) = kernel_panic(console) {
        return Verdict::Emulator(format!("L1's kernel died{running}: {}", line.trim()));
    }
    let located = |at: &str| {
        if at.is_empty() {
            String::new()
        } else {
            format!(" ({at})")
        }
    };
    match ending {
        Ending::Silent { quiet, at } => Verdict::Emulator(format!(
            "L1 froze{running}: no heartbeat for {} s{}{}",
            quiet.as_secs(),
            located(at),
            lockup_report(console)
                .map(|r| format!("; its kernel reported: {r}"))
                .unwrap_or_default()
        )),
        Ending::Exited(how) => {
            Verdict::Emulator(format!("QEMU ended{running} before L1 finished: {how}"))
        }
        Ending::Deadline { limit, at } => Verdict::Ours(format!(
            "the run passed its {} s deadline{running} while L1 still answered{}",
            limit.as_secs(),
            located(at)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript(lines: &[&str]) -> Transcript {
        let mut t = Transcript::default();
        for l in lines {
            if let Some(e) = parse(l) {
                t.record(e);
            }
        }
        t
    }

    #[test]
    fn lines_parse_into_events_and_other_output_does_not() {
        assert_eq!(parse("@@nested heartbeat 12.5"), Some(Event::Heartbeat));
        assert_eq!(
            parse("@@nested step-end vmm-e2e rc=0 seconds=12.5 limit=300\n"),
            Some(Event::StepEnd(StepEnd {
                name: "vmm-e2e".into(),
                status: 0,
                seconds: 12.5,
                limit: 300
            }))
        );
        assert_eq!(
            parse("@@nested fatal no-kvm: x"),
            Some(Event::Fatal("no-kvm: x".into()))
        );
        assert_eq!(parse("test foo ... ok"), None);
        assert_eq!(
            parse("  @@nested done"),
            None,
            "only at the start of a line"
        );
    }

    #[test]
    fn every_step_passing_to_the_end_passes() {
        let t = transcript(&[
            "@@nested step-begin a",
            "@@nested step-end a rc=0 seconds=1.0 limit=10",
            "@@nested done passed=1 failed=0",
        ]);
        assert_eq!(
            judge(&t, "", &Ending::Exited("exit status: 0".into())),
            Verdict::Passed
        );
    }

    #[test]
    fn a_failed_step_is_ours_even_if_l1_then_panicked() {
        let t = transcript(&[
            "@@nested step-begin a",
            "@@nested step-end a rc=101 seconds=1.0 limit=10",
        ]);
        let v = judge(
            &t,
            "[ 9.1] Kernel panic - not syncing: x",
            &Ending::Exited("0".into()),
        );
        assert!(
            matches!(&v, Verdict::Ours(w) if w.contains("step a (exit status 101) failed")),
            "{v}"
        );
        let t = transcript(&["@@nested step-end b rc=137 seconds=60.2 limit=60"]);
        assert!(
            matches!(judge(&t, "", &Ending::Exited("0".into())), Verdict::Ours(w) if w.contains("deadline")),
        );
    }

    #[test]
    fn a_frozen_l1_is_described_by_its_kernels_own_lockup_report() {
        let console = "[ 32.5] watchdog: BUG: soft lockup - CPU#1 stuck for 26s! [t:166]\n\
                       [ 32.5] Modules linked in: kvm_amd\n\
                       [ 32.5] RIP: 0010:finish_task_switch.isra.0+0x9f/0x2d0\n";
        assert_eq!(
            lockup_report(console).as_deref(),
            Some(
                "watchdog: BUG: soft lockup - CPU#1 stuck for 26s! [t:166] at \
                 finish_task_switch.isra.0+0x9f/0x2d0"
            )
        );
        assert_eq!(lockup_report("all quiet\n"), None);
    }

    #[test]
    fn a_step_without_its_end_never_passes() {
        let t = transcript(&["@@nested step-begin a", "@@nested done passed=0 failed=0"]);
        assert!(matches!(
            judge(&t, "", &Ending::Exited("0".into())),
            Verdict::Ours(w) if w.contains("step a began but never reported its end")
        ));
    }

    #[test]
    fn no_kvm_in_l1_is_ours_and_never_retried() {
        let t = transcript(&["@@nested fatal no-kvm: /dev/kvm is missing"]);
        assert!(matches!(
            judge(&t, "", &Ending::Exited("0".into())),
            Verdict::Ours(w) if w.contains("no-kvm")
        ));
    }

    #[test]
    fn a_panic_a_freeze_or_a_dead_qemu_before_the_end_is_the_emulators() {
        let t = transcript(&["@@nested step-begin daemon"]);
        let panic = "[  40.0] corrupted stack end detected inside scheduler\n";
        assert!(matches!(
            judge(&t, panic, &Ending::Exited("0".into())),
            Verdict::Emulator(w) if w.contains("during step daemon") && w.contains("corrupted stack")
        ));
        let silent = Ending::Silent {
            quiet: Duration::from_secs(90),
            at: "vCPU 0 at 0xffffffff81000000 x+0x0".into(),
        };
        assert!(matches!(
            judge(&t, "", &silent),
            Verdict::Emulator(w) if w.contains("froze") && w.contains("90 s") && w.contains("x+0x0")
        ));
        assert!(matches!(
            judge(&t, "", &Ending::Exited("signal 6".into())),
            Verdict::Emulator(w) if w.contains("signal 6")
        ));
        let deadline = Ending::Deadline {
            limit: Duration::from_secs(900),
            at: String::new(),
        };
        assert!(matches!(judge(&t, "", &deadline), Verdict::Ours(_)));
    }
}
