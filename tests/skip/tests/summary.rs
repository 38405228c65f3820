//! A plain `cargo test` run (output captured) shows which tests skipped themselves and
//! why: this executable runs itself with one test that skips, and reads the summary.

use std::process::Command;

/// Set by [`a_plain_run_ends_by_listing_its_skips`] for the run of itself it makes.
const CHILD_ENV: &str = "GPUSHARE_TEST_SKIP_CHILD";

/// Skips itself, when run by [`a_plain_run_ends_by_listing_its_skips`]; passes otherwise.
#[test]
fn child_that_skips() {
    if std::env::var_os(CHILD_ENV).is_some() {
        gpushare_test_skip::skip("the child cannot run here (on purpose)");
    }
}

#[test]
fn a_plain_run_ends_by_listing_its_skips() {
    let log = std::env::temp_dir().join(format!("gpushare-skip-log-{}", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_that_skips", "--test-threads", "1"])
        .env(CHILD_ENV, "1")
        .env(gpushare_test_skip::LOG_ENV, &log)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert!(
        stderr.contains("1 test of summary skipped itself")
            && stderr.contains("skipped: child_that_skips: the child cannot run here (on purpose)"),
        "no summary of the skip on stderr:\n{stderr}"
    );
    assert_eq!(logged, "summary\tchild_that_skips\tthe child cannot run here (on purpose)\n");
}
