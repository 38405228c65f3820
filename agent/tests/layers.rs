//! The layer order that `src/lib.rs` states is true: every module of the crate is in its
//! list, and no module's code (its tests aside) uses a module listed after it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

// Shared with the house test (`tests/house/main.rs`).
#[path = "../../tests/house/source.rs"]
mod source;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The modules in the order `lib.rs`'s documentation lists them (`//! 3. [`node`] — …`).
fn stated_order() -> Vec<String> {
    let lib = fs::read_to_string(src().join("lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.strip_prefix("//! "))
        .filter_map(|l| {
            let (number, rest) = l.split_once(". [`")?;
            number.trim().parse::<u32>().ok()?;
            Some(rest.split_once('`')?.0.to_string())
        })
        .collect()
}

/// The modules `lib.rs` declares.
fn declared() -> BTreeSet<String> {
    let lib = fs::read_to_string(src().join("lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| {
            // `pub mod x;`, or a layer of its own crate: `pub use gpushare_x as x;`.
            let module = l.strip_prefix("pub mod ").or_else(|| {
                l.strip_prefix("pub use gpushare_").and_then(|rest| rest.split(" as ").nth(1))
            })?;
            module.strip_suffix(';').map(str::to_string)
        })
        .collect()
}

/// A file's code without its inline test modules (by the crate's convention, `mod tests`
/// at the end of a file, or a `tests.rs` of its own) and without comments.
fn code(path: &Path) -> String {
    if path.file_name().is_some_and(|n| n == "tests.rs") {
        return String::new();
    }
    source::code(&fs::read_to_string(path).unwrap())
}

/// The crate modules `code` names: `crate::x` and `crate::{x, y::{z, w}}`.
fn used_modules(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let names = match rest.strip_prefix('{') {
            Some(group) => group_items(group),
            None => vec![rest.split(|c: char| !c.is_alphanumeric() && c != '_').next().unwrap()],
        };
        used.extend(names.into_iter().filter(|n| modules.contains(*n)).map(str::to_string));
    }
    used
}

/// The first path segment of each item of a `{…}` use group, given the text after `{`.
fn group_items(group: &str) -> Vec<&str> {
    let (mut depth, mut item_start, mut items) = (0, 0, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[item_start..i]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[item_start..i]);
                item_start = i + 1;
            }
            _ => {}
        }
    }
    items.into_iter().map(|item| item.trim().split("::").next().unwrap_or("")).collect()
}

#[test]
fn lib_rs_lists_every_module_once() {
    let order = stated_order();
    let listed: BTreeSet<String> = order.iter().cloned().collect();
    assert_eq!(listed.len(), order.len(), "a module is listed twice: {order:?}");
    assert_eq!(listed, declared(), "lib.rs's list and its `pub mod`s differ");
}

#[test]
fn no_module_uses_a_module_listed_after_it() {
    let order = stated_order();
    let modules: BTreeSet<String> = order.iter().cloned().collect();
    let rank: BTreeMap<&str, usize> =
        order.iter().enumerate().map(|(i, m)| (m.as_str(), i)).collect();
    let mut wrong = Vec::new();
    for file in source::rust_files(&src()) {
        let relative = file.strip_prefix(src()).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_string_lossy();
        let module = first.trim_end_matches(".rs");
        let Some(&own) = rank.get(module) else { continue };
        for used in used_modules(&code(&file), &modules) {
            if rank[used.as_str()] > own {
                wrong.push(format!("{} ({module}) uses {used}", relative.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "layer order broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_checker_sees_uses() {
    let modules: BTreeSet<String> = ["a", "b", "c"].into_iter().map(String::from).collect();
    let code = "use crate::a::X;\nuse crate::{b::{Y, Z}, c};\nlet v = crate::d::f();";
    let expected: BTreeSet<String> = ["a", "b", "c"].into_iter().map(String::from).collect();
    assert_eq!(used_modules(code, &modules), expected);
}
