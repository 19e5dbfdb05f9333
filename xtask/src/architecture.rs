//! `cargo xtask architecture`: the rules of `docs/architecture.md` that a compiler does not
//! check, checked on every CI run (the `fast` tier):
//!
//! - **no module cycle in any crate**: within a crate, modules refer to each other through
//!   `crate::…` and `super::…` paths; the graph those paths draw between a crate's modules has
//!   no cycle, file by file and again with every module folded into its top-level one (so a
//!   cycle between two subtrees is found even when it runs through a parent's re-export). A
//!   module may use its own ancestors' items (a child of `backend` naming
//!   `crate::backend::Backend` is how a parent shares its types), so edges to an ancestor do
//!   not count, and neither do a module's unit tests (`#[cfg(test)] mod …`, or a `tests.rs`);
//! - **the engine knows no HTTP**: `crucible-engine`'s dependency tree holds no HTTP server,
//!   WebSocket or HTTP edge crate, and neither does the egress proxy's; the edge depends on
//!   the engine, never the reverse;
//! - **the guest links no host code**: the guest agent's dependency tree (`guest-init`,
//!   hence `wire` and `contract`) holds no async runtime, no REST type and no host crate: it
//!   runs as PID 1 inside a hostile sandbox, and every crate it links is attack surface there;
//! - **no function in the engine is over 120 lines**: past that, a function does several
//!   jobs, and each deserves a name and tests of its own (the create path is named steps);
//! - **an error never repeats its cause**: no `thiserror` message interpolates the field that
//!   is its `#[source]` / `#[from]` (`report::chain` prints the cause once).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use crate::util::cargo;

/// Crates the engine (and the egress proxy) must never pull in.
const HTTP_CRATES: &[&str] = &[
    "hyper",
    "hyper-util",
    "axum",
    "tungstenite",
    "tokio-tungstenite",
    "tower",
    "crucible-api",
];

/// Crates the guest agent must never pull in.
const HOST_CRATES: &[&str] = &[
    "tokio",
    "crucible-api-types",
    "crucible-engine",
    "crucible-api",
    "crucible-vmm",
    "crucible-client",
];

/// The layers of docs/architecture.md, bottom first: a crate depends (normal and build
/// dependencies; dev-dependencies are free) only on crates of lower layers.
const LAYERS: &[&[&str]] = &[
    &[
        "crucible-wire",
        "crucible-api-types",
        "crucible-contract",
        "crucible-host-probe",
        "crucible-report",
        "crucible-http1",
        "crucible-oci",
        "crucible-testkit",
    ],
    &[
        "crucible-namespace",
        "crucible-devices",
        "crucible-guest-image",
    ],
    &["guest-init", "crucible-vmm", "crucible-engine"],
    &["crucible-egress"],
    &["crucible-api", "crucible-client"],
    &[
        "crucible-cli",
        "crucible-shim",
        "crucible-bench",
        "crucible-tests",
    ],
];

/// What `cargo xtask` may link: it builds the guest image and drives tests, and must never
/// compile the daemon.
const XTASK_MAY_USE: &[&str] = &[
    "crucible-guest-image",
    "crucible-contract",
    "crucible-host-probe",
    "crucible-wire",
];

pub(crate) fn run(sh: &Shell) -> Result<()> {
    let mut problems = Vec::new();
    let packages = workspace_packages(sh)?;
    for package in &packages {
        let name = &package.name;
        let graph = module_graph(&package.src)?;
        for cycle in cycles(&graph) {
            problems.push(format!("{name}: module cycle {}", cycle.join(" → ")));
        }
        for cycle in cycles(&top_level(&graph)) {
            problems.push(format!(
                "{name}: a cycle between top-level modules {} ({})",
                cycle.join(" → "),
                witnesses(&graph, &cycle).join("; ")
            ));
        }
        for violation in errors_repeating_their_source(&package.src)? {
            problems.push(format!("{name}: {violation}"));
        }
    }
    problems.extend(layer_violations(&packages));
    for package in packages.iter().filter(|p| p.name == "crucible-engine") {
        for (file, function, lines) in long_functions(&package.src)? {
            problems.push(format!(
                "{}: fn {function} in {} is {lines} lines, over {MAX_ENGINE_FN_LINES}: split \
                 it into named steps (docs/architecture.md)",
                package.name,
                file.display()
            ));
        }
    }
    for package in ["crucible-engine", "crucible-egress"] {
        for dependency in forbidden_dependencies(sh, package, HTTP_CRATES)? {
            problems.push(format!(
                "{package} depends on {dependency}: the engine and the egress proxy know no HTTP \
                 (docs/architecture.md)"
            ));
        }
    }
    for dependency in forbidden_dependencies(sh, "guest-init", HOST_CRATES)? {
        problems.push(format!(
            "guest-init depends on {dependency}: the guest links no host code \
             (docs/architecture.md)"
        ));
    }
    if !problems.is_empty() {
        bail!(
            "the architecture's rules are broken:\n  {}",
            problems.join("\n  ")
        );
    }
    eprintln!(
        "    every crate in its layer; no module cycle in any crate; the engine knows no HTTP \
         and has no function over {MAX_ENGINE_FN_LINES} lines; the guest links no host code; \
         no error repeats its cause"
    );
    Ok(())
}

/// The longest function the engine may have: past it, a function does several jobs and its
/// steps deserve names (and tests) of their own.
const MAX_ENGINE_FN_LINES: usize = 120;

/// Every function of the `.rs` files under `src` (tests left out) longer than
/// [`MAX_ENGINE_FN_LINES`], from its `fn` line to its closing brace at the same indent.
fn long_functions(src: &Path) -> Result<Vec<(PathBuf, String, usize)>> {
    let mut long = Vec::new();
    for path in modules(src)?.into_values() {
        let text = std::fs::read_to_string(&path)?;
        for (name, lines) in function_lengths(without_tests(&text)) {
            if lines > MAX_ENGINE_FN_LINES {
                long.push((path.strip_prefix(src)?.to_path_buf(), name, lines));
            }
        }
    }
    long.sort();
    Ok(long)
}

/// Each function with a body in `code` and its length in lines (rustfmt's layout: the body
/// closes with `}` at the indent of its `fn`).
fn function_lengths(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let after_keywords = [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "async ",
            "unsafe ",
            "const ",
        ]
        .iter()
        .fold(trimmed, |rest, keyword| {
            rest.strip_prefix(keyword).unwrap_or(rest)
        });
        let Some(signature) = after_keywords.strip_prefix("fn ") else {
            continue;
        };
        if line.trim_end().ends_with(';') {
            continue;
        }
        let name: String = signature
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let closing = " ".repeat(indent) + "}";
        if let Some(end) = lines[start + 1..]
            .iter()
            .position(|l| l.trim_end() == closing)
        {
            found.push((name, end + 2));
        }
    }
    found
}

/// A workspace crate: its name, `src` directory and the workspace crates it depends on
/// (normal and build dependencies).
struct Package {
    name: String,
    src: PathBuf,
    dependencies: Vec<String>,
}

/// Every workspace crate (xtask's own included), from `cargo metadata` run in `sh`'s
/// directory (the workspace root).
fn workspace_packages(sh: &Shell) -> Result<Vec<Package>> {
    let cargo = cargo();
    // Status checked below, so that the failure shows what cargo said.
    let out = cmd!(sh, "{cargo} metadata --format-version 1 --no-deps")
        .ignore_status()
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let listed = meta["packages"].as_array().cloned().unwrap_or_default();
    let names: BTreeSet<&str> = listed.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut packages = Vec::new();
    for package in &listed {
        let manifest = PathBuf::from(package["manifest_path"].as_str().unwrap_or_default());
        let dependencies = package["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"].as_str() != Some("dev"))
            .filter_map(|d| d["name"].as_str())
            .filter(|d| names.contains(d))
            .map(str::to_string)
            .collect();
        packages.push(Package {
            name: package["name"].as_str().unwrap_or_default().to_string(),
            src: manifest.with_file_name("src"),
            dependencies,
        });
    }
    Ok(packages)
}

/// Each crate outside the layers, and each dependency on a crate of the same or a higher
/// layer.
fn layer_violations(packages: &[Package]) -> Vec<String> {
    let layer_of = |name: &str| LAYERS.iter().position(|layer| layer.contains(&name));
    let mut problems = Vec::new();
    for package in packages {
        let name = package.name.as_str();
        if name == "xtask" {
            for dependency in &package.dependencies {
                if !XTASK_MAY_USE.contains(&dependency.as_str()) {
                    problems.push(format!(
                        "xtask depends on {dependency}: cargo xtask must not compile the \
                         daemon (docs/architecture.md)"
                    ));
                }
            }
            continue;
        }
        let Some(layer) = layer_of(name) else {
            problems.push(format!(
                "{name} is in no layer: give it one in docs/architecture.md and in LAYERS \
                 (xtask/src/architecture.rs)"
            ));
            continue;
        };
        for dependency in &package.dependencies {
            match layer_of(dependency) {
                Some(below) if below < layer => {}
                _ => problems.push(format!(
                    "{name} (layer {layer}) depends on {dependency}, which is not below it \
                     (docs/architecture.md)"
                )),
            }
        }
    }
    problems
}

/// Every `.rs` file under `dir`, with its module path (`backend::microvm`; the crate root and
/// `bin/*` binaries are modules of their own).
fn modules(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(dir)?.with_extension("");
                let mut parts: Vec<String> = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if parts.last().is_some_and(|p| p == "mod") {
                    parts.pop();
                }
                if parts == ["lib"] || parts == ["main"] {
                    parts = vec!["crate".into()];
                }
                found.insert(parts.join("::"), path);
            }
        }
    }
    Ok(found)
}

/// The modules each module refers to through `crate::` and `super::` paths, ancestors left
/// out.
fn module_graph(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let mods = modules(src)?;
    let mut graph = BTreeMap::new();
    for (module, path) in &mods {
        // A module's tests in a file of their own (`foo/tests.rs`) are tests all the same.
        if module.rsplit("::").next() == Some("tests") {
            continue;
        }
        let text = std::fs::read_to_string(path)?;
        let code = strip_comments(without_tests(&text));
        let parent = module.rsplit_once("::").map(|(p, _)| p).unwrap_or("");
        let mut refs = BTreeSet::new();
        for path in paths_in(&code) {
            let absolute = if let Some(rest) = path.strip_prefix("crate::") {
                rest.to_string()
            } else if let Some(rest) = path.strip_prefix("super::") {
                if parent.is_empty() {
                    rest.to_string()
                } else {
                    format!("{parent}::{rest}")
                }
            } else {
                continue;
            };
            // The longest module the path names.
            let segments: Vec<&str> = absolute.split("::").collect();
            let target = (1..=segments.len())
                .rev()
                .map(|n| segments[..n].join("::"))
                .find(|candidate| mods.contains_key(candidate));
            if let Some(target) = target {
                let ancestor = module == &target || module.starts_with(&format!("{target}::"));
                if !ancestor {
                    refs.insert(target);
                }
            }
        }
        graph.insert(module.clone(), refs);
    }
    Ok(graph)
}

/// `graph` with every module folded into its top-level one (`backend::microvm` into
/// `backend`): a cycle between two subtrees is a cycle even when each file's edges go to a
/// different child, or through a parent's re-export. The crate root is left out: it is where
/// a crate names its modules.
fn top_level(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let top = |module: &str| module.split("::").next().unwrap_or(module).to_string();
    let mut folded: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, refs) in graph {
        let from = top(module);
        if from == "crate" {
            continue;
        }
        let edges = folded.entry(from.clone()).or_default();
        edges.extend(
            refs.iter()
                .map(|r| top(r))
                .filter(|to| *to != from && to != "crate"),
        );
    }
    folded
}

/// The file-level edges behind a top-level `cycle`: which module names which.
fn witnesses(graph: &BTreeMap<String, BTreeSet<String>>, cycle: &[String]) -> Vec<String> {
    let top = |module: &str| module.split("::").next().unwrap_or(module).to_string();
    let members: BTreeSet<&String> = cycle.iter().collect();
    let mut found = Vec::new();
    for (module, refs) in graph {
        let from = top(module);
        if !members.contains(&from) {
            continue;
        }
        for to in refs {
            if top(to) != from && members.contains(&top(to)) {
                found.push(format!("{module} uses {to}"));
            }
        }
    }
    found
}

/// `text` up to its `#[cfg(test)]` module: a test may use any module of its crate without
/// that being a dependency of the code it tests.
fn without_tests(text: &str) -> &str {
    match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    }
}

/// The code of `text` without `//` comments (doc comments name modules in prose).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path starting `crate::` or `super::` in `code`, with `{a, b}` groups expanded.
fn paths_in(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for start in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(i) = rest.find(start) {
            let before = rest[..i].chars().next_back();
            let tail = &rest[i..];
            rest = &rest[i + start.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let path: String = tail
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let path = path.trim_end_matches(':').to_string();
            if tail[path.len()..].starts_with("::{") {
                let group = &tail[path.len() + 3..];
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let item = item.split_whitespace().next().unwrap_or("");
                    if !item.is_empty() && item != "self" {
                        paths.push(format!("{path}::{item}"));
                    }
                }
            }
            paths.push(path);
        }
    }
    paths
}

/// The cycles of `graph` (its strongly connected components of more than one module).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.found
}

/// `thiserror` variants whose message interpolates their own cause.
fn errors_repeating_their_source(src: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for path in modules(src)?.values() {
        let text = std::fs::read_to_string(path)?;
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(format) = error_format(line) else {
                continue;
            };
            // The variant it belongs to: the next lines up to the variant's end.
            let variant: String = lines[i + 1..]
                .iter()
                .take_while(|l| !l.trim_start().starts_with("#[error"))
                .take(40)
                .copied()
                .collect::<Vec<_>>()
                .join("\n");
            let named_source = format.contains("{source}")
                && (variant.contains("source:") || variant.contains("#[source]"));
            let first_field_is_source = format.contains("{0}")
                && variant
                    .lines()
                    .next()
                    .is_some_and(|l| l.contains("(#[from]") || l.contains("(#[source]"));
            if named_source || first_field_is_source {
                found.push(format!(
                    "{}:{}: the message {format:?} repeats its cause (report::chain prints it)",
                    path.display(),
                    i + 1
                ));
            }
        }
    }
    Ok(found)
}

/// The format string of a one-line `#[error("…")]`.
fn error_format(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix("#[error(\"")?;
    rest.rfind("\")]").map(|end| &rest[..end])
}

/// The crates of `forbidden` in `package`'s normal dependency tree (`cargo tree` in `sh`'s
/// directory, the workspace root).
fn forbidden_dependencies(sh: &Shell, package: &str, forbidden: &[&str]) -> Result<Vec<String>> {
    let cargo = cargo();
    // Status checked below, so that the failure shows what cargo said.
    let out = cmd!(
        sh,
        "{cargo} tree -p {package} -e normal --prefix none --format '{p}'"
    )
    .ignore_status()
    .output()
    .with_context(|| format!("running cargo tree -p {package}"))?;
    if !out.status.success() {
        bail!(
            "cargo tree -p {package} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut found: BTreeSet<String> = BTreeSet::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if forbidden.contains(&name) {
            found.insert(name.to_string());
        }
    }
    Ok(found.into_iter().collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        edges
            .iter()
            .map(|(m, to)| (m.to_string(), to.iter().map(|t| t.to_string()).collect()))
            .collect()
    }

    fn package(name: &str, dependencies: &[&str]) -> Package {
        Package {
            name: name.into(),
            src: PathBuf::new(),
            dependencies: dependencies.iter().map(|d| d.to_string()).collect(),
        }
    }

    #[test]
    fn a_dependency_must_point_down_the_layers() {
        let fine = [
            package("crucible-api", &["crucible-engine", "crucible-wire"]),
            package("xtask", &["crucible-guest-image"]),
        ];
        assert!(layer_violations(&fine).is_empty());
        let upward = [package("crucible-engine", &["crucible-egress"])];
        let sideways = [package("crucible-engine", &["crucible-vmm"])];
        let unplaced = [package("crucible-new", &[])];
        let daemon_in_xtask = [package("xtask", &["crucible-api"])];
        for broken in [&upward[..], &sideways, &unplaced, &daemon_in_xtask] {
            let problems = layer_violations(broken);
            assert_eq!(problems.len(), 1, "{problems:?}");
        }
    }

    #[test]
    fn a_cycle_is_found_and_a_chain_is_not() {
        let chain = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &[])]);
        assert!(cycles(&chain).is_empty());
        let cycle = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"]), ("d", &["a"])]);
        assert_eq!(cycles(&cycle), vec![vec!["a", "b", "c"]]);
    }

    #[test]
    fn paths_are_read_with_their_groups_and_comments_ignored() {
        let code = strip_comments(
            "use crate::{agent, sandbox::{Sandbox}};\nuse super::relay::X; // crate::nope\n\
             let y = my_crate::z;",
        );
        let paths = paths_in(&code);
        assert!(paths.contains(&"crate::agent".to_string()), "{paths:?}");
        assert!(paths.contains(&"super::relay::X".to_string()), "{paths:?}");
        assert!(!paths.iter().any(|p| p.contains("nope")), "{paths:?}");
        assert!(!paths.iter().any(|p| p.contains("z")), "{paths:?}");
    }

    #[test]
    fn the_module_graph_of_a_tree_names_siblings_and_skips_ancestors() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        std::fs::create_dir_all(src.join("backend")).unwrap();
        std::fs::write(src.join("lib.rs"), "pub mod backend; pub mod state;").unwrap();
        std::fs::write(src.join("state.rs"), "use crate::backend::microvm::M;").unwrap();
        std::fs::write(src.join("backend/mod.rs"), "pub mod microvm;").unwrap();
        std::fs::write(
            src.join("backend/microvm.rs"),
            "use super::Backend; use crate::backend::X; use crate::state::S;",
        )
        .unwrap();
        let g = module_graph(src).unwrap();
        assert_eq!(g["state"], ["backend::microvm".to_string()].into());
        assert_eq!(g["backend::microvm"], ["state".to_string()].into());
        assert_eq!(cycles(&g), vec![vec!["backend::microvm", "state"]]);
    }

    #[test]
    fn a_cycle_hidden_behind_a_parents_re_export_is_found_between_top_level_modules() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        std::fs::create_dir_all(src.join("storage")).unwrap();
        std::fs::write(src.join("lib.rs"), "pub mod state; pub mod storage;").unwrap();
        // `state` names `storage`'s re-export; `storage::images` names `state`: no file
        // names a file that names it back.
        std::fs::write(src.join("state.rs"), "use crate::storage::Image;").unwrap();
        std::fs::write(
            src.join("storage/mod.rs"),
            "mod images; pub use images::Image;",
        )
        .unwrap();
        std::fs::write(
            src.join("storage/images.rs"),
            "pub struct Image; fn f() { let _ = crate::state::DEFAULT; }",
        )
        .unwrap();
        // A test file's edge back is not a dependency.
        std::fs::write(src.join("storage/tests.rs"), "use crate::state::X;").unwrap();
        let g = module_graph(src).unwrap();
        assert!(cycles(&g).is_empty(), "no cycle file by file: {g:?}");
        let folded = top_level(&g);
        assert_eq!(cycles(&folded), vec![vec!["state", "storage"]]);
        assert_eq!(
            witnesses(&g, &["state".into(), "storage".into()]),
            ["state uses storage", "storage::images uses state"]
        );
        // Cut, the same tree passes.
        std::fs::write(src.join("storage/images.rs"), "pub struct Image;").unwrap();
        assert!(cycles(&top_level(&module_graph(src).unwrap())).is_empty());
    }

    #[test]
    fn a_functions_length_runs_from_its_signature_to_its_closing_brace() {
        let code = "fn short() {\n    1\n}\n\nimpl X {\n    pub(crate) async fn long(\n        a: u8,\n    ) -> u8 {\n        if a > 0 {\n            a\n        } else {\n            0\n        }\n    }\n    fn declared(&self);\n}\n";
        assert_eq!(
            function_lengths(code),
            [("short".to_string(), 3), ("long".to_string(), 9)]
        );
        let dir = tempfile::tempdir().unwrap();
        let body = "    let _ = 1;\n".repeat(MAX_ENGINE_FN_LINES);
        std::fs::write(
            dir.path().join("lib.rs"),
            format!("fn knot() {{\n{body}}}\n"),
        )
        .unwrap();
        let long = long_functions(dir.path()).unwrap();
        assert_eq!(long.len(), 1);
        assert_eq!(
            (long[0].1.as_str(), long[0].2),
            ("knot", MAX_ENGINE_FN_LINES + 2)
        );
    }

    #[test]
    fn an_error_that_prints_its_source_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("lib.rs"),
            "enum E {\n    #[error(\"reading {path}: {source}\")]\n    Read { path: String, source: std::io::Error },\n    #[error(\"opening: {0}\")]\n    Open(#[from] std::io::Error),\n    #[error(\"fine {0}\")]\n    Fine(String),\n    #[error(\"also fine\")]\n    Also { #[source] source: std::io::Error },\n}\n",
        )
        .unwrap();
        let found = errors_repeating_their_source(dir.path()).unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].contains(":2:") && found[1].contains(":4:"),
            "{found:?}"
        );
    }
}
