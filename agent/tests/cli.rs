//! The `gpushare-agent` binary's command line. (Being an integration test of this
//! package, it also makes `cargo test --workspace` build the binary that the end-to-end
//! tests under `tests/` run.)

use std::process::Command;

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpushare-agent"))
}

#[test]
fn help_names_the_options() {
    let out = agent().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for option in ["--simulate", "--bus", "--config", "--state-dir", "--check-catalog"] {
        assert!(help.contains(option), "{option} missing from --help:\n{help}");
    }
}

#[test]
fn a_bad_simulation_spec_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = agent()
        .args(["--simulate", "v100:2", "--config", "/dev/null", "--bus", "unix:path=/nonexistent"])
        .arg("--state-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown GPU model \"v100\""), "{err}");
}

#[test]
fn without_a_driver_the_nvml_backend_says_how_to_try_it() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // A GPU host: the NVML backend would start.
    }
    let dir = tempfile::tempdir().unwrap();
    let out = agent()
        .args(["--config", "/dev/null", "--bus", "unix:path=/nonexistent"])
        .arg("--state-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--simulate a100-40gb:8"), "{err}");
}
