//! Lists `models/*.toml` and `models/simulator-only/*.toml` for `include!`, so that adding
//! a model is adding a file.

use std::fmt::Write;
use std::path::Path;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let mut files = Vec::new();
    for sub in ["", "simulator-only"] {
        let dir = root.join(sub);
        println!("cargo:rerun-if-changed={}", dir.display());
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut names: Vec<String> = entries
            .map(|e| {
                e.expect("readable catalog/models entry").file_name().to_string_lossy().into_owned()
            })
            .filter(|n| n.ends_with(".toml"))
            .collect();
        names.sort();
        for name in names {
            let rel = if sub.is_empty() { name } else { format!("{sub}/{name}") };
            println!("cargo:rerun-if-changed={}", root.join(&rel).display());
            files.push(rel);
        }
    }
    let mut out = String::from("&[\n");
    for rel in files {
        let path = root.join(&rel);
        writeln!(out, "    ({rel:?}, include_str!({:?})),", path.display().to_string()).unwrap();
    }
    out.push(']');
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap()).join("model_files.rs");
    std::fs::write(dest, out).unwrap();
}
