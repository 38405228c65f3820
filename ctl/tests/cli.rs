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

/// `bench` with the bus pointed nowhere: what it refuses, it refuses before calling.
fn bench(args: &[&str]) -> std::process::Output {
    ctl()
        .arg("bench")
        .args(args)
        .env("GPUSHARE_BUS_ADDRESS", "unix:path=/nonexistent/bus")
        .output()
        .unwrap()
}

#[test]
fn bench_refuses_bad_input_in_one_line_before_calling_the_agent() {
    for (args, code, expected) in [
        (
            &["--replicas", "1,0", "--", "true"][..],
            2,
            "gpushare-ctl: invalid value '0' for '--replicas <N,…>': N = 0: a run has 1 to 48 replicas; see 'gpushare-ctl bench --help'",
        ),
        (&["--replicas", "3,3", "--", "true"], 2, "gpushare-ctl: --replicas: N = 3 is given twice"),
        (
            &["--", "gpushare-no-such-program"],
            1,
            "gpushare-ctl: bench: COMMAND `gpushare-no-such-program`: not found (PATH=/usr/bin:/bin)",
        ),
        (
            &["--report", "/nonexistent/dir/r.html", "--", "true"],
            1,
            "gpushare-ctl: --report /nonexistent/dir/r.html: no directory /nonexistent/dir",
        ),
    ] {
        let out = ctl()
            .arg("bench")
            .args(args)
            .env("GPUSHARE_BUS_ADDRESS", "unix:path=/nonexistent/bus")
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), format!("{expected}\n"), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // Good input goes on to the agent: here, to a bus that is not there.
    let out = bench(&["--replicas", "1,2", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("gpushare-ctl: cannot connect to the bus at unix:path=/nonexistent/bus"),
        "{err}"
    );
    // With --json, the refusal is the JSON error object.
    let out = bench(&["--json", "--", "gpushare-no-such-program"]);
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["name"], "gpushare.Ctl.Error.CommandNotFound", "{doc}");
}

#[test]
fn bench_help_explains_the_methods() {
    let out = ctl().args(["bench", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "$GPUSHARE_BENCH_REPORT",
        "--histogram",
        "--until-exit",
        "-- COMMAND",
        "Examples:",
        "--cpus <LIST>",
        "--no-pin",
        "equal, disjoint sets, the same set for replica i in every run",
        "the baseline on replica 0's",
    ] {
        assert!(help.contains(needle), "{needle} missing from bench --help:\n{help}");
    }
}
