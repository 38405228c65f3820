//! What the integration tests share.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `libgpushare_sim_nvml.so` as cargo built it for these tests: the newer of target/debug's
/// copy and deps/'s (`cargo test` alone updates only the one in deps/).
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.parent().unwrap(), deps]
        .iter()
        .map(|d| d.join("libgpushare_sim_nvml.so"))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p)
        .expect("cargo builds the cdylib before the integration tests")
}

/// The repository's root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The recordings `tests/device/results/<prefix>*/<file>`, in order of their directory's
/// name, each as (path, JSON); none when nothing is recorded yet.
#[allow(dead_code)] // each test file uses what it needs
pub fn recordings(prefix: &str, file: &str) -> Vec<(PathBuf, serde_json::Value)> {
    let results = workspace().join("tests/device/results");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&results)
        .unwrap_or_else(|e| panic!("{}: {e}", results.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix)))
        .map(|p| p.join(file))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
            (path, value)
        })
        .collect()
}

/// What a recorder script of `tests/device` (which prints one JSON document) answers on the
/// simulated library with the node `spec`, none of the caller's own knobs set; `None` when
/// python3 is missing.
#[allow(dead_code)] // each test file uses what it needs
pub fn run_recorder(script: &str, spec: &str) -> Option<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    let script = workspace().join("tests/device").join(script);
    let mut cmd = Command::new("python3");
    cmd.arg(&script);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GPUSHARE_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("NVML_LIB", library())
        .env("GPUSHARE_SIM_NODE", spec)
        .env("GPUSHARE_SIM_STATE", dir.path().join("node.json"));
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("python3 {}: {e}", script.display()),
    };
    assert!(
        out.status.success(),
        "{} on the simulator: {}\n{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).expect("the recorder prints JSON"))
}
