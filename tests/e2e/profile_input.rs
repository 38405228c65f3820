//! Profile documents as a hostile operator writes them, through `gpushare-ctl` and the
//! agent: every one refused with one line naming the place, quickly, changing nothing.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpushare_tests::{Agent, AgentOptions, ctl_error, reason_lines, stderr, temp_file, text};

/// Runs `cmd` with `input` on stdin, within `limit` and 2 GiB of address space (a ctl
/// that reads without bound fails here instead of taking the machine's memory).
fn run_bounded(mut cmd: Command, input: &[u8], limit: Duration) -> Output {
    // SAFETY: between fork and exec the closure only calls setrlimit, which is
    // async-signal-safe, on a value on its own stack.
    unsafe {
        cmd.pre_exec(|| {
            let bound = libc::rlimit { rlim_cur: 2 << 30, rlim_max: 2 << 30 };
            if libc::setrlimit(libc::RLIMIT_AS, &bound) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpushare-ctl runs");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // A ctl that stops reading early closes the pipe: the writer's error is expected.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("gpushare-ctl {:?} ran past {limit:?}", cmd.get_args().collect::<Vec<_>>());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    writer.join().unwrap();
    child.wait_with_output().unwrap()
}

/// Asserts a failure of one line, `gpushare-ctl: …` ending in `reason`.
fn assert_one_line_refusal(out: &Output, reason: &str) {
    assert!(!out.status.success(), "{}", text(out));
    let err = stderr(out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(reason_lines(&err), 1, "{err}");
    assert!(err.trim().ends_with(reason), "{err}");
}

#[test]
fn endless_and_oversized_documents_are_refused_at_once_in_one_line() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let before = agent.status();
    let limit = Duration::from_secs(20);
    let too_large = "larger than 256 KiB, the most a profile may be";

    for args in [
        &["validate", "/dev/zero"][..],
        &["apply", "-f", "/dev/zero"],
        &["plan", "-f", "/dev/zero"],
        &["assert", "-f", "/dev/zero", "-c", "all-balanced"],
    ] {
        let out = run_bounded(agent.ctl_command(args), b"", limit);
        assert_one_line_refusal(&out, &format!("/dev/zero: {too_large}"));
    }

    // A regular file and standard input one byte over the limit; at the limit, the agent
    // reads the profile.
    let mut at_limit = b"[[gpu]]\nselect = \"all\"\n".to_vec();
    at_limit.resize(256 * 1024, b'#');
    let (_dir, file) = temp_file("at-limit.toml", &at_limit);
    let out = run_bounded(agent.ctl_command(&["validate", file.to_str().unwrap()]), b"", limit);
    assert!(out.status.success(), "{}", text(&out));
    let mut over = at_limit.clone();
    over.push(b'#');
    let (_dir, file) = temp_file("over.toml", &over);
    let path = file.to_str().unwrap();
    let out = run_bounded(agent.ctl_command(&["validate", path]), b"", limit);
    assert_one_line_refusal(&out, &format!("{path}: {too_large}"));
    let out = run_bounded(agent.ctl_command(&["apply", "-f", "-"]), &over, limit);
    assert_one_line_refusal(&out, &format!("<stdin>: {too_large}"));
    let out = run_bounded(agent.ctl_command(&["apply", "-f", "-", "--json"]), &over, limit);
    assert!(!out.status.success());
    assert_eq!(ctl_error(&out).message, format!("<stdin>: {too_large}"));

    assert_eq!(agent.status(), before, "the GPUs must be unchanged");
}
