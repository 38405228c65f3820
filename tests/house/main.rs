//! The house rules a newcomer relies on, checked on every source file of the agent, its
//! protocol crates, ctl, the simulator and the catalog (DESIGN.md, "Rooms"):
//!
//! - no logic file over [`MAX_LOGIC_LINES`] lines (non-blank, non-comment lines outside the
//!   file's inline test modules; test files do not count);
//! - no two modules of one crate that use each other, directly or round a longer cycle.
//!   A module and its own descendants do not count: a parent declares its children and a
//!   child may name its parent's items.
//!
//! Only the crate's own paths are read (`crate::…`, `super::…`, `self::…`, with `{…}`
//! groups), the way `agent/tests/layers.rs` reads them; comments are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

mod source;

use source::{code, rust_files, without_tests};

/// The most logic lines one file may hold.
const MAX_LOGIC_LINES: usize = 800;

/// The source directories the rules hold for, from the workspace root.
const SOURCES: &[&str] =
    &["agent/src", "agent/proto/src", "agent/base/src", "ctl/src", "sim", "catalog/src"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Whether a file holds tests only: `tests.rs`, `*_tests.rs`, or anything under a `tests`
/// or `benches` directory.
fn test_only(path: &Path) -> bool {
    let name = path.file_stem().unwrap().to_string_lossy();
    name == "tests"
        || name.ends_with("_tests")
        || path.components().any(|c| c.as_os_str() == "tests" || c.as_os_str() == "benches")
}

/// Non-blank lines that are not comments.
fn logic_lines(text: &str) -> usize {
    without_tests(text)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .count()
}

/// One crate: its root file's directory and its modules, by path from the root.
struct Crate {
    name: String,
    modules: BTreeMap<Vec<String>, PathBuf>,
}

/// The crates under `SOURCES`: each `lib.rs` or `main.rs` in a `src` directory, and each
/// binary under `src/bin/` (a `bin/NAME.rs` or `bin/NAME/main.rs`).
fn crates() -> Vec<Crate> {
    let root = workspace();
    let mut roots: Vec<PathBuf> = Vec::new();
    for source in SOURCES {
        for file in rust_files(&root.join(source)) {
            let name = file.file_name().unwrap().to_string_lossy().to_string();
            let parent = file.parent().unwrap();
            let in_src = parent.file_name().is_some_and(|d| d == "src");
            let in_bin = parent.file_name().is_some_and(|d| d == "bin");
            let bin_dir = parent.parent().and_then(Path::file_name).is_some_and(|d| d == "bin");
            // A `main.rs` beside a `lib.rs` is a thin binary of the library's modules.
            let library_binary = name == "main.rs" && parent.join("lib.rs").exists();
            if (in_src && (name == "lib.rs" || (name == "main.rs" && !library_binary)))
                || in_bin
                || (bin_dir && name == "main.rs")
            {
                roots.push(file);
            }
        }
    }
    roots.sort();
    roots.dedup();
    roots.iter().map(|r| crate_of(r, &roots)).collect()
}

/// The modules of the crate rooted at `root_file`: files reached from its directory,
/// leaving out other crates' roots and the directories under them.
fn crate_of(root_file: &Path, roots: &[PathBuf]) -> Crate {
    let in_bin = root_file.parent().unwrap().file_name().is_some_and(|d| d == "bin");
    let dir = root_file.parent().unwrap();
    let mut modules = BTreeMap::new();
    modules.insert(Vec::new(), root_file.to_path_buf());
    let files = if in_bin {
        // `bin/NAME.rs` with its modules in `bin/NAME/`.
        rust_files(&dir.join(root_file.file_stem().unwrap()))
    } else {
        rust_files(dir)
    };
    for file in files {
        if file == root_file || test_only(&file) {
            continue;
        }
        let relative = file.strip_prefix(dir).unwrap();
        // Another crate's files: a binary's own directory, from the library's root.
        if relative.components().next().is_some_and(|c| c.as_os_str() == "bin") {
            continue;
        }
        if roots.iter().any(|r| r == &file) {
            continue;
        }
        let mut path: Vec<String> =
            relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        let last = path.pop().unwrap();
        let stem = last.trim_end_matches(".rs");
        if in_bin {
            path.remove(0);
        }
        if stem != "mod" {
            path.push(stem.to_string());
        }
        modules.insert(path, file);
    }
    let name = root_file.strip_prefix(workspace()).unwrap().display().to_string();
    Crate { name, modules }
}

/// The paths a `{…}` group names, given the text after `{`, each as its segments.
fn group_paths(group: &str) -> Vec<Vec<String>> {
    let (mut depth, mut start, mut items) = (0, 0, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.into_iter().map(str::trim).filter(|i| !i.is_empty()).flat_map(paths_in).collect()
}

/// The paths `text` names, read from its start: `a::b::C`, `a::{b, c::D}`.
fn paths_in(text: &str) -> Vec<Vec<String>> {
    let mut head = Vec::new();
    let mut rest = text;
    loop {
        let rest_trimmed = rest.trim_start();
        if let Some(group) = rest_trimmed.strip_prefix('{') {
            return group_paths(group)
                .into_iter()
                .map(|tail| head.iter().cloned().chain(tail).collect())
                .collect();
        }
        let end = rest_trimmed
            .find(|c: char| !c.is_alphanumeric() && c != '_')
            .unwrap_or(rest_trimmed.len());
        if end == 0 {
            return vec![head];
        }
        head.push(rest_trimmed[..end].to_string());
        match rest_trimmed[end..].strip_prefix("::") {
            Some(after) => rest = after,
            None => return vec![head],
        }
    }
}

/// The modules of `krate` that the module at `own` (from `file`) names.
fn used_modules(krate: &Crate, own: &[String], code: &str) -> BTreeSet<Vec<String>> {
    // `self::` names a module's children: in `a.rs` or `a/mod.rs` both live under `a`.
    let mut used = BTreeSet::new();
    for keyword in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(keyword) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let mut rest = &code[at + keyword.len()..];
            let mut base: Vec<String> = match keyword {
                "crate::" => Vec::new(),
                "self::" => own.to_vec(),
                _ => own[..own.len().saturating_sub(1)].to_vec(),
            };
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
            for path in paths_in(rest) {
                let full: Vec<String> =
                    base.iter().cloned().chain(path.into_iter().filter(|s| s != "self")).collect();
                let module = (1..=full.len())
                    .rev()
                    .map(|n| full[..n].to_vec())
                    .find(|m| krate.modules.contains_key(m));
                if let Some(module) = module
                    && module != own
                {
                    used.insert(module);
                }
            }
        }
    }
    used
}

fn related(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The cycles among `edges` (strongly connected components of more than one module),
/// leaving out edges between a module and its ancestors or descendants.
fn cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    // Reachability by search from each module: the crates are small.
    let reach = |from: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                if !related(&m, next) && seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> =
        edges.keys().map(|m| (m, reach(m))).collect();
    let mut found: Vec<Vec<Vec<String>>> = Vec::new();
    let mut placed = BTreeSet::new();
    for (m, from_m) in &reached {
        if placed.contains(*m) || !from_m.contains(*m) {
            continue;
        }
        let component: Vec<Vec<String>> = from_m
            .iter()
            .filter(|o| reached.get(o).is_some_and(|r| r.contains(*m)))
            .cloned()
            .collect();
        placed.extend(component.iter().cloned());
        found.push(component);
    }
    found
}

fn shown(module: &[String]) -> String {
    if module.is_empty() { "(root)".to_string() } else { module.join("::") }
}

#[test]
fn no_logic_file_is_over_the_limit() {
    let root = workspace();
    let mut over = Vec::new();
    let mut counted = 0;
    for source in SOURCES {
        for file in rust_files(&root.join(source)) {
            if test_only(&file) {
                continue;
            }
            counted += 1;
            let lines = logic_lines(&fs::read_to_string(&file).unwrap());
            if lines > MAX_LOGIC_LINES {
                over.push(format!("{} ({lines})", file.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    assert!(counted > 100, "only {counted} source files found under {SOURCES:?}");
    assert!(
        over.is_empty(),
        "files over {MAX_LOGIC_LINES} logic lines: split them by responsibility:\n{}",
        over.join("\n")
    );
}

#[test]
fn no_two_modules_use_each_other() {
    let mut wrong = Vec::new();
    let all = crates();
    assert!(all.len() >= 6, "crates found: {:?}", all.iter().map(|c| &c.name).collect::<Vec<_>>());
    for krate in &all {
        let mut edges = BTreeMap::new();
        for (module, file) in &krate.modules {
            let code = code(&fs::read_to_string(file).unwrap());
            edges.insert(module.clone(), used_modules(krate, module, &code));
        }
        for cycle in cycles(&edges) {
            let names: Vec<String> = cycle.iter().map(|m| shown(m)).collect();
            wrong.push(format!("{}: {}", krate.name, names.join(" ↔ ")));
        }
    }
    assert!(wrong.is_empty(), "modules that use each other:\n{}", wrong.join("\n"));
}

#[test]
fn the_checker_reads_paths_and_finds_cycles() {
    assert_eq!(paths_in("a::b::C;"), vec![vec!["a", "b", "C"]]);
    assert_eq!(
        paths_in("a::{b::{C, D}, e, self};"),
        vec![vec!["a", "b", "C"], vec!["a", "b", "D"], vec!["a", "e"], vec!["a", "self"]]
    );
    let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let krate = Crate {
        name: "x".into(),
        modules: [vec![], m("a"), m("a::b"), m("c"), m("d")]
            .into_iter()
            .map(|p| (p, PathBuf::new()))
            .collect(),
    };
    let code = "use crate::{a::b::X, c};\nuse super::d::Y;\nlet z = crate::c::f();";
    let used = used_modules(&krate, &m("a"), code);
    assert_eq!(used, [m("a::b"), m("c"), m("d")].into_iter().collect(), "super of a is the root");
    let used = used_modules(&krate, &m("a::b"), "use super::super::d::Y;");
    assert_eq!(used, [m("d")].into_iter().collect());

    let edges: BTreeMap<_, BTreeSet<_>> = [
        (m("a"), [m("a::b"), m("c")].into_iter().collect()),
        (m("a::b"), [m("a")].into_iter().collect()),
        (m("c"), [m("d")].into_iter().collect()),
        (m("d"), [m("a")].into_iter().collect()),
    ]
    .into_iter()
    .collect();
    let found = cycles(&edges);
    assert_eq!(found, vec![vec![m("a"), m("c"), m("d")]], "a parent and its child are no cycle");
    assert_eq!(
        logic_lines("// x\n\nfn a() {}\n  /// y\n#[cfg(test)]\nmod tests {\nfn b() {}\n}"),
        1
    );
}
