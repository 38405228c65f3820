//! Stubs for the rest of nvml.h: every function of `abi/nvml-functions.txt` (nvml.h's
//! list) that no `src/abi/*.rs` exports gets an export answering
//! `NVML_ERROR_NOT_SUPPORTED`, as a driver does for a feature a GPU lacks. Clients that
//! bind every symbol up front (go-nvml resolves lazily and crashes on a missing one) load
//! the library; what the simulator does not model says so at the call.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let manifest = Path::new(&manifest);
    let list = manifest.join("abi/nvml-functions.txt");
    let abi = manifest.join("src/abi");
    println!("cargo::rerun-if-changed={}", list.display());
    println!("cargo::rerun-if-changed={}", abi.display());

    let mut modelled = BTreeSet::new();
    for entry in std::fs::read_dir(&abi).expect("src/abi reads") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        println!("cargo::rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path).expect("an abi source reads");
        // `pub unsafe extern "C" fn nvmlXxx(` after `#[unsafe(no_mangle)]`.
        for line in text.lines() {
            if let Some(rest) = line.trim_start().strip_prefix("pub unsafe extern \"C\" fn ")
                && let Some(name) = rest.split('(').next()
                && name.starts_with("nvml")
            {
                modelled.insert(name.to_string());
            }
        }
    }

    let names = std::fs::read_to_string(&list).expect("abi/nvml-functions.txt reads");
    let mut stubs = String::new();
    for name in names.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if modelled.contains(name) {
            continue;
        }
        // Declared without parameters: under the C calling convention the caller's
        // arguments are the caller's to clean up, and a stub never reads them.
        let _ = writeln!(
            stubs,
            "/// `{name}`: not modelled.\n#[unsafe(no_mangle)]\npub unsafe extern \"C\" fn {name}() -> nvmlReturn_t {{\n    not_modelled(\"{name}\")\n}}\n"
        );
    }
    let out = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("stubs.rs");
    std::fs::write(out, stubs).expect("OUT_DIR is writable");
}
