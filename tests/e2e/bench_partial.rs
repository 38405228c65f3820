//! Issue 37, item 4, end to end on a simulated GPU: the bench says what it will run and
//! leave out before its first measurement, and Ctrl-C keeps what was measured (the
//! report shows it, marked partial).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use gpushare_tests::{Agent, AgentOptions, stderr, text};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

/// A replica: one unit at once (so the window may open), then a unit of 10 ms every
/// 50 ms until stopped.
const REPLICA: &str = r#"#!/bin/sh
echo >&3
while :; do echo 10 >&3; sleep 0.05; done
"#;

/// The replica's directory, and the bench's log directory in it.
fn replica() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("replica.sh"), REPLICA).unwrap();
    dir
}

/// `gpushare-ctl bench ARGS --logs DIR/logs -- /bin/sh replica.sh`, in the script's
/// directory.
fn bench(agent: &Agent, dir: &TempDir, args: &[&str]) -> Command {
    let logs = dir.path().join("logs");
    let mut all = vec!["bench", "--logs", logs.to_str().unwrap()];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--", "/bin/sh", "replica.sh"]);
    let mut cmd = agent.ctl_command(&all);
    cmd.current_dir(dir.path());
    cmd
}

#[test]
fn the_plan_comes_before_the_first_measurement() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    let dir = replica();
    // One CPU to pin on: the default counts 3, 5 and 7 are left out, said up front.
    let out = bench(&agent, &dir, &["--cpus", "0", "--strategies", "mps", "--duration", "1s"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    let at = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no line with {what:?}:\n{err}"))
    };
    let plan = at("Will measure: the baseline (1 replica alone) 3 times, then mps at 1");
    let left_out = at("Left out: 3, 5, 7 replicas: 1 CPU to pin one replica each");
    let first = at("baseline: one replica alone");
    assert!(plan < first && left_out < first, "{err}");
    // The report does not say it a second time; the left out counts stay in it.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("Will measure"), "{stdout}");
    assert!(stdout.contains("Left out: 3, 5, 7 replicas"), "{stdout}");
}

#[test]
fn ctrl_c_keeps_what_was_measured() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    let dir = replica();
    let mut ctl = bench(
        &agent,
        &dir,
        &["--replicas", "1,2", "--no-pin", "--strategies", "mps", "--duration", "1s"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // The progress lines, as they come; Ctrl-C once the baseline's 3 measurements are
    // taken and mps at 2 has begun.
    let (lines, got) = mpsc::channel::<String>();
    let err = ctl.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            all.push_str(&line);
            all.push('\n');
            let _ = lines.send(line);
        }
        all
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match got.recv_timeout(left) {
            Ok(line) if line.contains("mps: 2 replicas") => break,
            Ok(_) => {}
            Err(e) => {
                let _ = ctl.kill();
                let _ = ctl.wait();
                panic!("no progress line for mps at 2 ({e})")
            }
        }
    }
    let _ = kill(Pid::from_raw(ctl.id() as i32), Signal::SIGINT);
    let out = ctl.wait_with_output().unwrap();
    let err = reader.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}\n{err}");
    // What was measured before the Ctrl-C: the baseline and mps at 1, with figures.
    assert!(
        stdout.contains("Partial: cancelled in round 1 of 1, after 4 measurements"),
        "{stdout}\n{err}"
    );
    assert!(stdout.contains("Baseline: 1 replica alone: "), "{stdout}");
    assert!(!stdout.contains("Baseline: error") && !stdout.contains("cancelled\n"), "{stdout}");
    // Read as JSON, field by field: the same test runs against a build before issue 37.
    let kept = std::fs::read_to_string(dir.path().join("logs/report.json")).unwrap();
    let report: serde_json::Value = serde_json::from_str(&kept).unwrap();
    let partial = report["partial"].as_str().unwrap_or_default();
    assert!(partial.starts_with("cancelled"), "{partial}");
    let baseline = &report["baseline"];
    assert!(baseline["error"].is_null() && baseline["throughput_per_s"].as_f64() > Some(0.0));
    assert_eq!(baseline["repeat_throughputs_per_s"].as_array().map(Vec::len), Some(3));
    // mps at 2 was cut short: no run of it, and mps at 1 with its figures.
    let runs = report["strategies"][0]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0]["error"].is_null() && runs[0]["throughput_per_s"].as_f64() > Some(0.0));
    // Four measurements taken, none of them the one the Ctrl-C cut short.
    let sequence = report["sequence"].as_array().unwrap();
    assert_eq!(sequence.len(), 4, "{sequence:?}");
    assert!(sequence.iter().all(|m| m["failed"].is_null()), "{sequence:?}");
    assert!(!report["restored"].as_str().unwrap().starts_with("NOT"), "{}", report["restored"]);
}

/// `cmd` as one line for `sh -c`, every word quoted.
fn shell_line(cmd: &Command) -> String {
    let quote = |w: &std::ffi::OsStr| format!("'{}'", w.to_string_lossy().replace('\'', "'\\''"));
    std::iter::once(quote(cmd.get_program()))
        .chain(cmd.get_args().map(quote))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_plan_is_said_on_a_terminal_too() {
    if !Path::new("/usr/bin/script").exists() {
        gpushare_tests::skip("no /usr/bin/script to give gpushare-ctl a terminal");
        return;
    }
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    let dir = replica();
    let ctl = bench(&agent, &dir, &["--cpus", "0", "--strategies", "mps", "--duration", "1s"]);
    // script(1) runs it on a pseudo-terminal (a progress bar, not lines), with ctl's
    // environment.
    let mut tty = Command::new("/usr/bin/script");
    tty.args(["-qec", &shell_line(&ctl), "/dev/null"]).current_dir(dir.path());
    for (name, value) in ctl.get_envs() {
        match value {
            Some(value) => tty.env(name, value),
            None => tty.env_remove(name),
        };
    }
    let out = tty.env("TERM", "xterm").stdin(Stdio::null()).output().unwrap();
    let all = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{all}\n{}", stderr(&out));
    let plan = all.find("Will measure: the baseline (1 replica alone) 3 times, then mps at 1");
    let left_out = all.find("Left out: 3, 5, 7 replicas: 1 CPU to pin one replica each");
    let report = all.find("Bench of ");
    assert!(plan.is_some() && left_out.is_some(), "{all}");
    assert!(plan < report && left_out < report, "{all}");
}
