//! What the integration tests share.

use std::path::PathBuf;

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
