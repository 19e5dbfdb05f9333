//! Judging a critest run: each handler's results (ginkgo's JSON report), the committed list
//! of known crucible failures, and the comparison that passes or fails the tier.
//!
//! The tier fails when the baseline (runc) fails a spec (the environment is broken, and
//! nothing can be compared), when a spec passes with runc and fails with crucible without
//! being listed, and when a listed spec passes with crucible (the list must stay true).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// How one spec ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Passed,
    Failed,
    Skipped,
}

/// One spec's result.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// The full name: its containers' texts and its own, as ginkgo prints them.
    pub(crate) name: String,
    pub(crate) outcome: Outcome,
    /// The first line of the failure's message (empty unless failed).
    pub(crate) first_error: String,
}

/// One handler's run.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) handler: String,
    pub(crate) specs: Vec<Spec>,
    pub(crate) elapsed: Duration,
}

impl Run {
    fn count(&self, outcome: Outcome) -> usize {
        self.specs.iter().filter(|s| s.outcome == outcome).count()
    }

    /// The spec named `name`, if it ran.
    fn get(&self, name: &str) -> Option<&Spec> {
        self.specs.iter().find(|s| s.name == name)
    }
}

/// The specs of ginkgo's JSON report (`--ginkgo.json-report`): the `It`s, not the suite's
/// set-up nodes.
pub(crate) fn read_report(path: &Path) -> Result<Vec<Spec>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_report(&text).with_context(|| format!("parsing {}", path.display()))
}

fn parse_report(text: &str) -> Result<Vec<Spec>> {
    let suites: serde_json::Value = serde_json::from_str(text)?;
    let mut specs = Vec::new();
    for suite in suites.as_array().context("not a JSON array of suites")? {
        let Some(reports) = suite["SpecReports"].as_array() else {
            continue;
        };
        for report in reports {
            if report["LeafNodeType"] != "It" {
                // A failed set-up node fails the run as a whole: shown as a spec of its own.
                if report["State"] == "passed" || report["State"] == "skipped" {
                    continue;
                }
            }
            let mut words: Vec<&str> = report["ContainerHierarchyTexts"]
                .as_array()
                .map(|t| t.iter().filter_map(|t| t.as_str()).collect())
                .unwrap_or_default();
            let leaf = report["LeafNodeText"].as_str().unwrap_or_default();
            if leaf.is_empty() {
                words.push(report["LeafNodeType"].as_str().unwrap_or("(unnamed node)"));
            } else {
                words.push(leaf);
            }
            let state = report["State"].as_str().unwrap_or("unknown");
            let outcome = match state {
                "passed" => Outcome::Passed,
                "skipped" | "pending" => Outcome::Skipped,
                // failed, panicked, timedout, interrupted, aborted.
                _ => Outcome::Failed,
            };
            let first_error = match outcome {
                Outcome::Failed => {
                    let message = report["Failure"]["Message"].as_str().unwrap_or_default();
                    let line = first_error(message);
                    if state == "failed" {
                        line
                    } else {
                        format!("{state}: {line}")
                    }
                }
                _ => String::new(),
            };
            specs.push(Spec {
                name: words.join(" "),
                outcome,
                first_error,
            });
        }
    }
    Ok(specs)
}

/// The most that is kept of a failure's summary line.
const FIRST_ERROR_MAX: usize = 300;

/// A failure's message in one line: its first line, and when that line is gomega's bare
/// header (`Expected`, `Timed out after 60s.`, `failed to execSync in container "…"`), the
/// value it shows (`Get "http://…": connection refused`, `command 'ls …' exited with 1: …`)
/// and, after `Expected`, what was expected (`to equal 1`).
fn first_error(message: &str) -> String {
    let mut lines = message.lines().map(str::trim).filter(|l| !l.is_empty());
    let Some(head) = lines.next() else {
        return "(no failure message)".into();
    };
    let rest: Vec<&str> = lines.collect();
    // The first value gomega prints: `<type>: value`, or `<type>: ` with the value below.
    let value_at = |from: usize| -> Option<String> {
        let at = (from..rest.len()).find(|&i| is_value_header(rest[i]))?;
        let inline = rest[at]
            .split_once(">:")
            .map(|(_, v)| v.trim())
            .unwrap_or("");
        if inline.is_empty() {
            rest.get(at + 1).map(|l| l.to_string())
        } else {
            Some(inline.to_string())
        }
    };
    let mut line = head.to_string();
    // A value that ends as the head does (`…: Operation not permitted`) would say it twice.
    let new = |v: &String| {
        let end = v.rsplit(": ").next().unwrap_or(v).trim();
        !matches!(v.as_str(), "nil" | "true" | "false") && !head.contains(end)
    };
    if let Some(value) = value_at(0).filter(new) {
        line.push_str(if head == "Expected" { " " } else { " — " });
        line.push_str(&value);
    }
    if head == "Expected" {
        if let Some(at) = rest.iter().position(|l| l.starts_with("to ")) {
            line.push(' ');
            line.push_str(rest[at]);
            if let Some(expected) = value_at(at + 1) {
                line.push(' ');
                line.push_str(&expected);
            }
        }
    }
    let line = shorten_ids(&line.split_whitespace().collect::<Vec<_>>().join(" "));
    match line.char_indices().nth(FIRST_ERROR_MAX) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// `text` with each run of 32 or more hex digits (container and exec ids, the specs' random
/// directory names) cut to its first 12.
fn shorten_ids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.len() >= 32 {
            out.push_str(&run[..12]);
            out.push('…');
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in text.chars() {
        if c.is_ascii_hexdigit() {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// Whether a line is gomega's `<type | 0xADDR>: …` header of a printed value.
fn is_value_header(line: &str) -> bool {
    line.starts_with('<') && line.contains(">:")
}

/// One line of the known-failures file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KnownFailure {
    pub(crate) spec: String,
    /// The part of the work it waits for ("pod network", "host paths", …).
    pub(crate) waits_for: String,
    pub(crate) reason: String,
}

/// Parses the known-failures file: `#` comments and blank lines, else one spec a line as
/// `SPEC | WAITS FOR | REASON`.
pub(crate) fn parse_known(text: &str, file: &str) -> Result<Vec<KnownFailure>> {
    let mut known: Vec<KnownFailure> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split('|').map(str::trim).collect();
        let [spec, waits_for, reason] = fields[..] else {
            bail!(
                "{file}:{}: expected `SPEC | WAITS FOR | REASON`, found {} field(s): {line}",
                number + 1,
                fields.len()
            );
        };
        if spec.is_empty() || waits_for.is_empty() || reason.is_empty() {
            bail!("{file}:{}: a field is empty: {line}", number + 1);
        }
        if known.iter().any(|k| k.spec == spec) {
            bail!("{file}:{}: {spec:?} is listed twice", number + 1);
        }
        known.push(KnownFailure {
            spec: spec.into(),
            waits_for: waits_for.into(),
            reason: reason.into(),
        });
    }
    Ok(known)
}

/// What the comparison found.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    /// Specs the baseline failed: (name, first error).
    pub(crate) baseline_failures: Vec<(String, String)>,
    /// Passed with runc, failed with crucible, and listed: (entry, first error).
    pub(crate) known: Vec<(KnownFailure, String)>,
    /// Passed with runc, failed with crucible, not listed: (name, first error).
    pub(crate) unexpected: Vec<(String, String)>,
    /// Listed, and passed with crucible.
    pub(crate) now_passing: Vec<KnownFailure>,
    /// Listed, but not a spec of this run (misspelt, or not run with --focus).
    pub(crate) not_run: Vec<KnownFailure>,
}

impl Verdict {
    /// Whether the tier passes. A listed spec that did not run fails it too, unless only some
    /// specs were asked for (`focused`).
    pub(crate) fn passed(&self, focused: bool) -> bool {
        self.baseline_failures.is_empty()
            && self.unexpected.is_empty()
            && self.now_passing.is_empty()
            && (focused || self.not_run.is_empty())
    }
}

/// Compares crucible's run with the baseline's against the known failures.
pub(crate) fn judge(baseline: &Run, crucible: &Run, known: &[KnownFailure]) -> Verdict {
    let mut verdict = Verdict::default();
    for spec in &baseline.specs {
        if spec.outcome == Outcome::Failed {
            verdict
                .baseline_failures
                .push((spec.name.clone(), spec.first_error.clone()));
        }
    }
    for spec in &crucible.specs {
        if spec.outcome != Outcome::Failed {
            continue;
        }
        let baseline_passed = baseline
            .get(&spec.name)
            .is_some_and(|b| b.outcome == Outcome::Passed);
        if !baseline_passed {
            // Failed with both (or not run with runc): the baseline's failure says it.
            continue;
        }
        match known.iter().find(|k| k.spec == spec.name) {
            Some(k) => verdict.known.push((k.clone(), spec.first_error.clone())),
            None => verdict
                .unexpected
                .push((spec.name.clone(), spec.first_error.clone())),
        }
    }
    for k in known {
        match crucible.get(&k.spec) {
            Some(s) if s.outcome == Outcome::Passed => verdict.now_passing.push(k.clone()),
            Some(_) => {}
            None => verdict.not_run.push(k.clone()),
        }
    }
    verdict
}

/// `| handler | passed | failed | skipped | time |`, a row per run.
pub(crate) fn table(runs: &[&Run]) -> String {
    let mut out = String::from(
        "| handler | passed | failed | skipped | time |\n| --- | --- | --- | --- | --- |\n",
    );
    for run in runs {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} s |",
            run.handler,
            run.count(Outcome::Passed),
            run.count(Outcome::Failed),
            run.count(Outcome::Skipped),
            run.elapsed.as_secs_f64()
        );
    }
    out
}

/// The verdict in words: the crucible-only failures with their first error lines, then what
/// fails the tier, each with what to do.
/// Every failed spec of `run` with its first error line (a measured run that is not judged).
pub(crate) fn failures(run: &Run) -> String {
    let failed: Vec<&Spec> = run
        .specs
        .iter()
        .filter(|s| s.outcome == Outcome::Failed)
        .collect();
    let mut out = format!("{} failures with {}:\n", failed.len(), run.handler);
    for spec in failed {
        let _ = writeln!(out, "  - {}\n      {}", spec.name, spec.first_error);
    }
    out
}

pub(crate) fn report(verdict: &Verdict, known_file: &str, focused: bool) -> String {
    let mut out = String::new();
    if !verdict.known.is_empty() {
        let _ = writeln!(
            out,
            "crucible-only failures, known ({} in {known_file}):",
            verdict.known.len()
        );
        for (k, error) in &verdict.known {
            let _ = writeln!(out, "  - {} [{}]\n      {error}", k.spec, k.waits_for);
        }
    }
    if !verdict.unexpected.is_empty() {
        let _ = writeln!(
            out,
            "\nFAILED: {} spec(s) pass with runc and fail with crucible, and are not in \
             {known_file} (fix crucible, or list them with the part of the work they wait for):",
            verdict.unexpected.len()
        );
        for (name, error) in &verdict.unexpected {
            let _ = writeln!(out, "  - {name}\n      {error}");
        }
    }
    if !verdict.now_passing.is_empty() {
        let _ = writeln!(
            out,
            "\nFAILED: {} listed spec(s) now pass with crucible: remove it from the list \
             ({known_file}):",
            verdict.now_passing.len()
        );
        for k in &verdict.now_passing {
            let _ = writeln!(out, "  - {}", k.spec);
        }
    }
    if !verdict.not_run.is_empty() {
        let _ = writeln!(
            out,
            "\n{}{} listed spec(s) did not run (misspelt in {known_file}, or no longer in the \
             suite):",
            if focused { "note: " } else { "FAILED: " },
            verdict.not_run.len()
        );
        for k in &verdict.not_run {
            let _ = writeln!(out, "  - {}", k.spec);
        }
    }
    if !verdict.baseline_failures.is_empty() {
        let _ = writeln!(
            out,
            "\nFAILED: the baseline (runc) failed {} spec(s): the environment is broken, not \
             crucible (see runc/critest.log):",
            verdict.baseline_failures.len()
        );
        for (name, error) in &verdict.baseline_failures {
            let _ = writeln!(out, "  - {name}\n      {error}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, outcome: Outcome) -> Spec {
        Spec {
            name: name.into(),
            outcome,
            first_error: if outcome == Outcome::Failed {
                format!("{name} broke")
            } else {
                String::new()
            },
        }
    }

    fn run(handler: &str, specs: Vec<Spec>) -> Run {
        Run {
            handler: handler.into(),
            specs,
            elapsed: Duration::from_secs(80),
        }
    }

    fn known(spec: &str) -> KnownFailure {
        KnownFailure {
            spec: spec.into(),
            waits_for: "pod network".into(),
            reason: "no CNI".into(),
        }
    }

    #[test]
    fn the_report_gives_its_specs_full_names_outcomes_and_first_error_lines() {
        let json = r#"[{"SpecReports": [
            {"LeafNodeType": "BeforeSuite", "State": "passed"},
            {"ContainerHierarchyTexts": ["[k8s.io] Networking", "runtime should support networking"],
             "LeafNodeType": "It", "LeafNodeText": "runtime should support DNS config [Conformance]",
             "State": "passed"},
            {"ContainerHierarchyTexts": ["[k8s.io] Image Manager"], "LeafNodeType": "It",
             "LeafNodeText": "public image with digest should be pulled and removed [Conformance]",
             "State": "skipped"},
            {"ContainerHierarchyTexts": ["[k8s.io] Security Context", "bucket"], "LeafNodeType": "It",
             "LeafNodeText": "runtime should support MaskedPaths", "State": "failed",
             "Failure": {"Message": "\nExpected\n    <string>: a\nto equal b"}},
            {"ContainerHierarchyTexts": ["[k8s.io] Streaming"], "LeafNodeType": "It",
             "LeafNodeText": "runtime should support attach", "State": "timedout",
             "Failure": {"Message": "A suite timeout occurred"}}
        ]}]"#;
        let specs = parse_report(json).expect("a report");
        assert_eq!(specs.len(), 4);
        assert_eq!(
            specs[0].name,
            "[k8s.io] Networking runtime should support networking runtime should support DNS \
             config [Conformance]"
        );
        assert_eq!(specs[0].outcome, Outcome::Passed);
        assert_eq!(specs[1].outcome, Outcome::Skipped);
        assert_eq!(specs[2].outcome, Outcome::Failed);
        assert_eq!(specs[2].first_error, "Expected a to equal b");
        assert_eq!(specs[3].first_error, "timedout: A suite timeout occurred");
    }

    #[test]
    fn a_failures_summary_shows_the_value_gomega_printed_under_its_header() {
        let timed_out = "Timed out after 60.001s.\nExpected\n    <*url.Error | 0xc00059b560>: \n    \
                         Get \"http://10.88.77.74:80\": connection refused\n    {\n        Op: \"Get\",\n\
                         }\nto be nil";
        assert_eq!(
            first_error(timed_out),
            "Timed out after 60.001s. — Get \"http://10.88.77.74:80\": connection refused"
        );
        let sysctl = "Expected\n    <string>: 0\nto equal\n    <string>: 1";
        assert_eq!(first_error(sysctl), "Expected 0 to equal 1");
        let masked = "Expected an error to have occurred.  Got:\n    <nil>: nil";
        assert_eq!(
            first_error(masked),
            "Expected an error to have occurred. Got:"
        );
        assert_eq!(first_error(""), "(no failure message)");
        let exec = format!(
            "cmd [hostname x], stderr \"hostname: sethostname: Operation not permitted\"\n\
             Unexpected error:\n    <exec.CodeExitError>: \n    \
             command 'hostname x' exited with 1: hostname: sethostname: Operation not permitted\n\
             occurred in container \"{}\"",
            "ab".repeat(32)
        );
        assert_eq!(
            first_error(&exec),
            "cmd [hostname x], stderr \"hostname: sethostname: Operation not permitted\""
        );
        assert_eq!(
            shorten_ids(&format!("container \"{}\" failed", "0a".repeat(32))),
            "container \"0a0a0a0a0a0a…\" failed"
        );
        let long = "x".repeat(FIRST_ERROR_MAX + 10);
        assert_eq!(first_error(&long).chars().count(), FIRST_ERROR_MAX + 1);
    }

    #[test]
    fn the_known_failures_file_takes_three_fields_and_no_repeats() {
        let text = "# comment\n\nspec a | pod network | no CNI\n";
        assert_eq!(
            parse_known(text, "k").expect("valid"),
            [KnownFailure {
                spec: "spec a".into(),
                waits_for: "pod network".into(),
                reason: "no CNI".into()
            }]
        );
        let two = parse_known("spec a | pod network\n", "k").expect_err("two fields");
        assert!(two.to_string().contains("k:1: expected"), "{two}");
        let twice = parse_known("a | b | c\na | b | c\n", "k").expect_err("twice");
        assert!(twice.to_string().contains("listed twice"), "{twice}");
    }

    #[test]
    fn only_unlisted_crucible_only_failures_and_listed_passes_fail_the_tier() {
        use Outcome::*;
        let baseline = run(
            "runc",
            vec![
                spec("ok", Passed),
                spec("listed", Passed),
                spec("regressed", Passed),
                spec("fixed", Passed),
                spec("skipped", Skipped),
            ],
        );
        let crucible = run(
            "crucible",
            vec![
                spec("ok", Passed),
                spec("listed", Failed),
                spec("regressed", Failed),
                spec("fixed", Passed),
                spec("skipped", Skipped),
            ],
        );
        let list = [known("listed"), known("fixed"), known("gone")];
        let v = judge(&baseline, &crucible, &list);
        assert_eq!(v.known.len(), 1);
        assert_eq!(v.known[0].0.spec, "listed");
        assert_eq!(
            v.unexpected,
            [("regressed".into(), "regressed broke".into())]
        );
        assert_eq!(v.now_passing, [known("fixed")]);
        assert_eq!(v.not_run, [known("gone")]);
        assert!(!v.passed(false));
        let text = report(&v, "known-failures.txt", false);
        assert!(text.contains("remove it from the list"), "{text}");
        assert!(text.contains("regressed broke"), "{text}");

        let v = judge(&baseline, &crucible, &[known("listed"), known("regressed")]);
        assert!(v.passed(false), "{v:?}");
    }

    #[test]
    fn a_baseline_failure_fails_the_tier_and_is_not_blamed_on_crucible() {
        use Outcome::*;
        let baseline = run("runc", vec![spec("env", Failed)]);
        let crucible = run("crucible", vec![spec("env", Failed)]);
        let v = judge(&baseline, &crucible, &[]);
        assert!(v.unexpected.is_empty());
        assert_eq!(v.baseline_failures.len(), 1);
        assert!(!v.passed(false));
    }

    #[test]
    fn the_table_counts_each_outcome() {
        use Outcome::*;
        let r = run(
            "runc",
            vec![spec("a", Passed), spec("b", Failed), spec("c", Skipped)],
        );
        assert!(table(&[&r]).contains("| runc | 1 | 1 | 1 | 80 s |"));
    }
}
