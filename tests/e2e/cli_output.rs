//! What `gpushare-ctl` prints for people and scripts: usage errors in one line, progress
//! counted once per step, one name for a MIG instance, one way of writing sizes.

use gpushare_tests::{binary, ctl_error, stderr, stdout, text};

/// Runs `gpushare-ctl ARGS` with no agent to talk to (usage errors need none).
fn ctl_alone(args: &[&str]) -> std::process::Output {
    std::process::Command::new(binary("gpushare-ctl", "GPUSHARE_CTL_BIN"))
        .args(args)
        .env("GPUSHARE_BUS_ADDRESS", "unix:path=/nonexistent/gpushare-test-bus")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("gpushare-ctl runs")
}

/// Command lines clap refuses, of every kind of refusal.
const USAGE_ERRORS: &[&[&str]] = &[
    &[],
    &["bogus"],
    &["stauts"],
    &["generat"],
    &["apply"],
    &["apply", "x", "-c", "y"],
    &["status", "--bogus"],
    &["status", "extra"],
    &["mps", "limit", "--pid", "1"],
    &["mps", "bogus"],
    &["probe", "--workload", "flops"],
    &["probe", "--clients", "0"],
    &["profiles", "show"],
    &["help", "bogus"],
    &["--address"],
];

#[test]
fn usage_errors_are_one_line_with_exit_status_2() {
    for args in USAGE_ERRORS {
        let out = ctl_alone(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: {}", text(&out));
        assert!(err.starts_with("gpushare-ctl: ") && err.ends_with('\n'), "{args:?}: {err}");
        assert!(!err.contains("generate"), "{args:?}: {err}");

        let mut json = args.to_vec();
        json.push("--json");
        let out = ctl_alone(&json);
        assert_eq!(out.status.code(), Some(2), "{json:?}: {}", text(&out));
        assert!(out.stderr.is_empty(), "{json:?}: {}", text(&out));
        assert_eq!(stdout(&out).lines().count(), 1, "{json:?}: {}", text(&out));
        let error = ctl_error(&out);
        assert_eq!(error.name, "gpushare.Ctl.Error.Usage", "{json:?}");
        assert!(!error.message.contains("generate"), "{json:?}: {error:?}");
    }
    // The reason, the tip, and where to read more.
    let err = stderr(&ctl_alone(&["stauts"]));
    assert_eq!(
        err,
        "gpushare-ctl: unrecognized subcommand 'stauts'; a similar subcommand exists: 'status'; see 'gpushare-ctl --help'\n"
    );
    let err = stderr(&ctl_alone(&["mps", "limit", "--pid", "1"]));
    assert_eq!(
        err,
        "gpushare-ctl: the following required arguments were not provided: <--threads <PCT>|--memory <SIZE>>; see 'gpushare-ctl mps limit --help'\n"
    );
    // Help and version are no errors: stdout, exit 0.
    for flag in ["--help", "--version"] {
        let out = ctl_alone(&[flag]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(out.stderr.is_empty() && !out.stdout.is_empty(), "{}", text(&out));
    }
}
