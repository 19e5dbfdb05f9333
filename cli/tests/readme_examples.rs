//! The README's egress examples, run as written against a daemon started with the README's
//! own `serve --egress-allow` line: each example's allowlist is accepted (no internet is
//! needed to check that), and a rule without a port, which that daemon refuses, is answered
//! with the rule to ask for instead.

use harness::TestDaemon;

mod common;
use common::{crucible_at, run, text};

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README")
}

/// The comma-separated value after `flag` on the README's line that holds `line_has`.
fn flag_value(readme: &str, line_has: &str, flag: &str) -> String {
    let line = readme
        .lines()
        .find(|l| l.contains(line_has) && l.contains(flag))
        .unwrap_or_else(|| panic!("no README line with {line_has:?} and {flag}"));
    let value = line
        .split(flag)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{flag} has no value in {line:?}"));
    value.trim_matches('\'').to_string()
}

/// The `"allow":[…]` list of the README's `curl … POST $U/sandboxes` example.
fn curl_allow(readme: &str) -> Vec<String> {
    let line = readme
        .lines()
        .find(|l| l.contains("POST $U/sandboxes") && l.contains("\"allow\""))
        .expect("the README's curl example with an allowlist");
    let list = line
        .split("\"allow\":[")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("an allow list");
    list.split(',')
        .map(|rule| rule.trim().trim_matches('"').to_string())
        .collect()
}

#[test]
fn the_readmes_egress_examples_are_accepted_by_the_readmes_daemon() {
    let readme = readme();
    let operator = flag_value(&readme, "crucible serve", "--egress-allow");
    let rules: Vec<String> = operator.split(',').map(str::to_string).collect();
    let daemon = TestDaemon::start_with(|config| config.egress_allow = rules);
    let crucible = || crucible_at(&daemon.socket);

    let cli_allow = flag_value(&readme, "crucible run", "--allow");
    let curl_allow = curl_allow(&readme).join(",");
    for allow in [&cli_allow, &curl_allow] {
        let out = run(crucible().args(["sandbox", "create", "--allow", allow]));
        assert!(
            out.status.success(),
            "--allow {allow} under --egress-allow {operator}: {}",
            text(&out.stderr)
        );
        let id = text(&out.stdout).trim().to_string();
        let out = run(crucible().args(["sandbox", "rm", &id]));
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    // cargo ≥ 1.70 reads the sparse index first: an example without it fetches nothing.
    assert!(cli_allow.contains("index.crates.io"), "{cli_allow}");

    let out = run(crucible().args(["sandbox", "create", "--allow", "index.crates.io"]));
    assert!(!out.status.success());
    let refusal = text(&out.stderr);
    assert!(
        refusal.contains("ask for `index.crates.io:80` or `index.crates.io:443`"),
        "{refusal}"
    );
}
