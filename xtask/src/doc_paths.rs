//! The docs cite only what exists: every repository path a doc names in backquotes
//! (`engine/src/state.rs`, `vmm/tests/`, `.ci/run`) and every relative link target must be in
//! the repository, no doc may point outside it (`../shared`, a `spec/` directory), and none
//! ships a placeholder for a figure not yet measured (`TODO(figure)`). Checked
//! by unit tests (`cargo test -p xtask doc_paths`), so `cargo xtask ci`'s unit tests keep it.
//!
//! Read: `README.md`, the `[Unreleased]` section of `CHANGELOG.md` (released entries are
//! history and name what existed then), and every `docs/**/*.md`.

#![cfg(test)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::util::workspace_root;

/// One doc's text, as lines with their 1-based numbers in the file.
struct Doc {
    /// The doc's path relative to the workspace root.
    path: PathBuf,
    /// The lines checked, with their line numbers in the file.
    lines: Vec<(usize, String)>,
}

/// The docs whose citations must hold.
fn docs(root: &Path) -> Vec<Doc> {
    let mut docs = Vec::new();
    for name in ["README.md", "CHANGELOG.md"] {
        let text = read(&root.join(name));
        let lines = if name == "CHANGELOG.md" {
            unreleased(&text)
        } else {
            numbered(&text)
        };
        docs.push(Doc {
            path: PathBuf::from(name),
            lines,
        });
    }
    let mut found = Vec::new();
    markdown_under(&root.join("docs"), &mut found);
    found.sort();
    for path in found {
        let text = read(&path);
        let path = path
            .strip_prefix(root)
            .expect("docs/ is under the root")
            .to_path_buf();
        docs.push(Doc {
            path,
            lines: numbered(&text),
        });
    }
    docs
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every `*.md` file under `dir`, recursively.
fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            markdown_under(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "md") {
            out.push(path);
        }
    }
}

fn numbered(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line.to_string()))
        .collect()
}

/// The lines of the changelog's `## [Unreleased]` section (heading excluded), up to the next
/// `## ` heading.
fn unreleased(text: &str) -> Vec<(usize, String)> {
    numbered(text)
        .into_iter()
        .skip_while(|(_, line)| !line.starts_with("## [Unreleased]"))
        .skip(1)
        .take_while(|(_, line)| !line.starts_with("## "))
        .collect()
}

/// The inline code spans of `lines` outside fenced code blocks, each with the line it starts
/// on. A span may continue onto the next lines (its line breaks become spaces).
fn code_spans(lines: &[(usize, String)]) -> Vec<(usize, String)> {
    let mut spans = Vec::new();
    let mut in_fence = false;
    let mut open: Option<(usize, String)> = None;
    for (number, line) in lines {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            open = None;
            continue;
        }
        if in_fence {
            continue;
        }
        if line.trim().is_empty() {
            // A paragraph ends: an unclosed backquote was a literal one.
            open = None;
            continue;
        }
        for (i, part) in line.split('`').enumerate() {
            if i > 0 {
                match open.take() {
                    Some(span) => spans.push(span),
                    None => open = Some((*number, String::new())),
                }
            }
            if let Some((_, span)) = &mut open {
                span.push_str(part);
            }
        }
        if let Some((_, span)) = &mut open {
            span.push(' ');
        }
    }
    spans
}

/// The relative link targets (`[text](target)`) of `line`, without their `#anchor`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        let target = target.split('#').next().unwrap_or("");
        let external = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !external {
            targets.push(target.to_string());
        }
        rest = &rest[end..];
    }
    targets
}

/// The top-level entries of the repository a citation may start with (`target`, the build's
/// output, and `.git` are not cited paths).
fn top_level(root: &Path) -> BTreeSet<String> {
    fs::read_dir(root)
        .expect("listing the workspace root")
        .map(|entry| entry.expect("a directory entry").file_name())
        .filter_map(|name| name.into_string().ok())
        .filter(|name| name != "target" && name != ".git")
        .collect()
}

/// The repository paths a code span cites: words with a `/` whose first component is a
/// top-level entry of the repository, with trailing punctuation, a `:line` or `#anchor`
/// suffix removed. Words with glob or placeholder characters (`*`, `<…>`, `{a,b}`, `…`, `$`)
/// name many paths or none, and are skipped.
fn cited_paths(span: &str, top: &BTreeSet<String>) -> Vec<String> {
    span.split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '(' | ')' | '"' | '\''))
        .map(|word| word.trim_end_matches(['.', ':']))
        .map(|word| word.split(['#', ':']).next().unwrap_or(""))
        .map(|word| word.strip_prefix("./").unwrap_or(word))
        .filter(|word| word.contains('/'))
        .filter(|word| !word.contains(['*', '<', '>', '{', '}', '…', '$']))
        .filter(|word| {
            let first = word.split('/').next().unwrap_or("");
            top.contains(first)
        })
        .map(str::to_string)
        .collect()
}

/// Every cited repository path that does not exist, as `doc:line: path`.
fn missing_citations(root: &Path) -> Vec<String> {
    let top = top_level(root);
    let mut missing = Vec::new();
    for doc in docs(root) {
        for (line, span) in code_spans(&doc.lines) {
            for path in cited_paths(&span, &top) {
                if !root.join(&path).exists() {
                    missing.push(format!("{}:{line}: `{path}`", doc.path.display()));
                }
            }
        }
    }
    missing
}

/// Every relative link target that does not exist, as `doc:line: target`.
fn broken_links(root: &Path) -> Vec<String> {
    let mut broken = Vec::new();
    for doc in docs(root) {
        let dir = root.join(doc.path.parent().unwrap_or(Path::new("")));
        for (line, text) in &doc.lines {
            for target in link_targets(text) {
                if !dir.join(&target).exists() {
                    broken.push(format!("{}:{line}: ({target})", doc.path.display()));
                }
            }
        }
    }
    broken
}

/// Whether `word` points outside the repository: into `../shared` or a `spec/` directory
/// (the protocol's contract is restated in `docs/protocol.md`, not deferred to).
fn points_outside(word: &str) -> bool {
    word.contains("../shared")
        || word.starts_with("shared/")
        || word.starts_with("spec/")
        || word.contains("/spec/")
}

/// Every place a doc points outside the repository, as `doc:line: word`.
fn outside_references(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for doc in docs(root) {
        for (line, text) in &doc.lines {
            let words = text.split(|c: char| {
                c.is_whitespace() || matches!(c, '`' | '(' | ')' | '[' | ']' | '"' | '\'' | ',')
            });
            for word in words.filter(|word| points_outside(word)) {
                found.push(format!("{}:{line}: {word}", doc.path.display()));
            }
        }
    }
    found
}

#[test]
fn every_repository_path_the_docs_cite_exists() {
    let missing = missing_citations(&workspace_root());
    assert!(
        missing.is_empty(),
        "docs cite {} path(s) that are not in the repository (fix each to where the code \
         lives now):\n{}",
        missing.len(),
        missing.join("\n")
    );
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let broken = broken_links(&workspace_root());
    assert!(
        broken.is_empty(),
        "docs link to {} file(s) that are not in the repository:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn no_doc_points_outside_the_repository() {
    let found = outside_references(&workspace_root());
    assert!(
        found.is_empty(),
        "the repository stands alone, but docs point outside it (to `../shared` or a `spec/` \
         directory); restate what they need instead:\n{}",
        found.join("\n")
    );
}

/// Lines that still hold a placeholder where a measured figure belongs.
fn placeholders(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for doc in docs(root) {
        for (number, line) in &doc.lines {
            if line.contains(PLACEHOLDER) {
                found.push(format!("{}:{number}: {}", doc.path.display(), line.trim()));
            }
        }
    }
    found
}

/// What a doc writes where a figure is still to be measured; it never reaches main.
const PLACEHOLDER: &str = concat!("TODO", "(figure)");

#[test]
fn no_doc_ships_a_placeholder_for_a_figure() {
    let found = placeholders(&workspace_root());
    assert!(
        found.is_empty(),
        "docs hold {} placeholder(s) where a measured figure belongs (measure it, with the \
         command, or drop the claim):\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn code_spans_are_found_across_line_breaks_and_not_in_fences() {
    let lines = numbered("a `x/y` b `c\nd` e\n```\n`not/this`\n```\n`z`");
    let spans = code_spans(&lines);
    assert_eq!(
        spans,
        vec![
            (1, "x/y".to_string()),
            (1, "c d".to_string()),
            (6, "z".to_string())
        ]
    );
}

#[test]
fn cited_paths_are_repository_paths_without_suffixes_or_placeholders() {
    let top: BTreeSet<String> = ["engine", "vmm", ".ci", "docs"]
        .into_iter()
        .map(String::from)
        .collect();
    let span = "engine/src/state.rs:42, vmm/tests/x.rs. .ci/run docs/a.md#b \
                /dev/kvm a/b vmm/tests/*.S engine/src/<name>.rs vmm/{a,b}.rs no-slash";
    assert_eq!(
        cited_paths(span, &top),
        [
            "engine/src/state.rs",
            "vmm/tests/x.rs",
            ".ci/run",
            "docs/a.md"
        ]
    );
}

#[test]
fn only_the_unreleased_changelog_section_is_read() {
    let text = "# Changelog\n\n## [Unreleased]\nnew `a/b`\n## [1.0.0]\nold `c/d`\n";
    assert_eq!(unreleased(text), vec![(4, "new `a/b`".to_string())]);
}

#[test]
fn links_and_outside_references_are_recognised() {
    assert_eq!(
        link_targets("see [a](vmm.md#x), [b](https://e.org/y) and [c](../fuzz/README.md)"),
        ["vmm.md", "../fuzz/README.md"]
    );
    assert!(points_outside("../shared/spec/wire-protocol.txt"));
    assert!(points_outside("spec/wire-protocol.txt"));
    assert!(!points_outside("engine/src/pool/spec.rs"));
}
