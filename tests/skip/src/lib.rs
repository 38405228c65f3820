//! Owns how a test that cannot run here says so (issue 37, item 3): [`skip`] records the
//! test and the reason, and when the test executable exits it prints every skip of that
//! executable on stderr, after libtest's `test result:` line:
//!
//! ```text
//! gpushare: 2 tests of e2e skipped themselves (passed without running):
//!   skipped: access::member_may_apply: needs root to create test users
//!   skipped: cdi::podman_containers_get_mps_shares: no podman (apt-get install podman runc)
//! ```
//!
//! libtest captures what a passing test prints, so a `skipped: …` line printed by the test
//! alone is seen only with `--nocapture`; the summary is printed by an `atexit` handler,
//! registered on the first skip, outside any test's capture (libtest ends the process
//! with `exit` on success and failure alike). The test's name is its thread's, which
//! libtest names after the test.
//!
//! With `GPUSHARE_SKIP_LOG=<file>` every skip is also appended to that file as one line,
//! `<executable>\t<test>\t<reason>`, so that a run of many test executables (`.ci/run`)
//! can list them all at its end.

use std::io::Write;
use std::sync::Mutex;

/// The variable naming a file every skip is appended to (one line each).
pub const LOG_ENV: &str = "GPUSHARE_SKIP_LOG";

/// One skipped test: its name and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    /// The test's name as libtest gives it (`module::test`), or `?` off a test's thread.
    pub test: String,
    /// Why it did not run: one line.
    pub reason: String,
}

static SKIPS: Mutex<Vec<Skip>> = Mutex::new(Vec::new());

/// Says that the calling test skips itself because of `reason` (one line, what is
/// missing and how to get it): printed at once (seen with `--nocapture`) and in the
/// summary when the executable exits. The caller then returns.
pub fn skip(reason: impl std::fmt::Display) {
    let reason = reason.to_string().replace('\n', " ");
    let test = std::thread::current().name().unwrap_or("?").to_string();
    eprintln!("skipped: {reason}");
    if let Some(path) = std::env::var_os(LOG_ENV) {
        let line = format!("{}\t{test}\t{reason}\n", executable());
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("gpushare: {}: {e}", std::path::Path::new(&path).display());
        }
    }
    let mut skips = SKIPS.lock().unwrap_or_else(|e| e.into_inner());
    if skips.is_empty() {
        // atexit through libc, for nix does not wrap it.
        // SAFETY: atexit only stores the pointer to a function that takes no arguments,
        // lives as long as the program and never unwinds (it catches nothing: it only
        // formats and writes to stderr, ignoring errors).
        let registered = unsafe { libc::atexit(print_summary) } == 0;
        if !registered {
            eprintln!("gpushare: the skipped tests cannot be listed at exit (atexit failed)");
        }
    }
    skips.push(Skip { test, reason });
}

/// The skips recorded so far in this process, in the order they happened.
pub fn skips() -> Vec<Skip> {
    SKIPS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The test executable's name without cargo's hash (`e2e`, `gpushare_agent`).
fn executable() -> String {
    let exe = std::env::current_exe().ok();
    let name = exe.as_ref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
    let name = name.unwrap_or_else(|| "?".into());
    match name.rsplit_once('-') {
        Some((stem, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            stem.to_string()
        }
        _ => name,
    }
}

/// The summary printed at exit: a heading, then one `skipped: <test>: <reason>` line per
/// skip, sorted by test; empty when nothing was skipped.
pub fn summary(executable: &str, skips: &[Skip]) -> String {
    if skips.is_empty() {
        return String::new();
    }
    let mut sorted = skips.to_vec();
    sorted.sort_by(|a, b| (&a.test, &a.reason).cmp(&(&b.test, &b.reason)));
    sorted.dedup();
    let tests = {
        let mut names: Vec<&str> = sorted.iter().map(|s| s.test.as_str()).collect();
        names.dedup();
        names.len()
    };
    let (count, verb) = if tests == 1 {
        ("1 test".into(), "skipped itself")
    } else {
        (format!("{tests} tests"), "skipped themselves")
    };
    let mut text =
        format!("\ngpushare: {count} of {executable} {verb} (passed without running):\n");
    for s in &sorted {
        text.push_str(&format!("  skipped: {}: {}\n", s.test, s.reason));
    }
    text
}

extern "C" fn print_summary() {
    // try_lock: a test thread still running at exit (libtest does not wait for a test
    // that hangs) may hold it; then the summary says what it can.
    let text = match SKIPS.try_lock() {
        Ok(skips) => summary(&executable(), &skips),
        Err(_) => "gpushare: some tests skipped themselves (still recording at exit)\n".into(),
    };
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_each_skipped_test_once_with_its_reason() {
        let skip = |test: &str, reason: &str| Skip { test: test.into(), reason: reason.into() };
        assert_eq!(summary("e2e", &[]), "");
        let text = summary(
            "e2e",
            &[
                skip("b::two", "no podman"),
                skip("a::one", "needs root"),
                skip("b::two", "no podman"),
            ],
        );
        assert_eq!(
            text,
            "\ngpushare: 2 tests of e2e skipped themselves (passed without running):\n  \
             skipped: a::one: needs root\n  skipped: b::two: no podman\n"
        );
        assert!(summary("x", &[skip("t", "r")]).contains("1 test of x skipped itself"));
    }
}
