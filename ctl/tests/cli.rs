//! The `gpushare-ctl` binary's command line. (Being an integration test of this package,
//! it also makes `cargo test --workspace` build the binary that the end-to-end tests
//! under `tests/` run.)

use std::process::Command;

fn ctl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpushare-ctl"))
}

#[test]
fn help_lists_the_verbs() {
    let out = ctl().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for verb in ["apply", "plan", "status", "profiles", "validate", "export", "assert"] {
        assert!(help.contains(verb), "{verb} missing from --help:\n{help}");
    }
}

#[test]
fn usage_errors_exit_2_and_json_errors_are_one_object() {
    let out = ctl().args(["apply"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = ctl().args(["--json", "apply"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["error"]["message"].is_string(), "{doc}");
}

#[test]
fn an_unreachable_bus_is_one_line() {
    let out = ctl()
        .args(["status"])
        .env("GPUSHARE_BUS_ADDRESS", "unix:path=/nonexistent/bus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
