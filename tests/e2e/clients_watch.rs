//! `gpushare-ctl clients --watch` and `--query` (issue 29) on simulated GPUs: into a pipe,
//! a new table per interval until SIGINT, which ends it with exit status 0; with `--json`
//! one document per line; and a client of a whole GPU (a real `sleep` the simulated
//! driver lists, `GPUSHARE_SIM_PROCESSES`) as CSV, with and without its header line.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpushare_proto::clients::ClientTable;
use gpushare_tests::{Agent, AgentOptions, stderr, stdout, text};

/// Runs `command` (a watching `gpushare-ctl`) for a second at least, until its stdout has
/// `frames` frames (as `count` counts them; 20 s at most), then interrupts it as Ctrl-C
/// would: its exit status and stdout. Nothing may come on its stderr.
pub(crate) fn watch_until(
    mut command: Command,
    frames: usize,
    count: impl Fn(&str) -> usize,
) -> (Option<i32>, String) {
    let child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let mut child = child.expect("gpushare-ctl runs");
    let mut pipe = child.stdout.take().unwrap();
    let seen = Arc::new(Mutex::new(String::new()));
    let reader = {
        let seen = Arc::clone(&seen);
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buffer) {
                seen.lock().unwrap().push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        })
    };
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1)
        || (count(&seen.lock().unwrap()) < frames && started.elapsed() < Duration::from_secs(20))
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.is_empty(), "{err}");
    let out = seen.lock().unwrap().clone();
    (status.code(), out)
}

/// The tables of `clients --watch` into a pipe, a blank line between two.
fn tables(out: &str) -> Vec<&str> {
    out.split("\n\n").filter(|t| !t.trim().is_empty()).collect()
}

#[test]
fn watch_prints_a_table_per_interval_until_interrupted() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    let args = ["clients", "--watch", "--interval", "0.2"];
    let (code, out) = watch_until(agent.ctl_command(&args), 2, |out| tables(out).len());
    assert_eq!(code, Some(0), "Ctrl-C ends a watch with 0: {out}");
    let tables = tables(&out);
    assert!(tables.len() >= 2, "at least two tables: {out:?}");
    for table in &tables {
        // Each under the time it was read: `2026-11-27 11:40:05 UTC`.
        let (time, table) = table.trim_start().split_once('\n').unwrap();
        let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
        let stamp: Vec<&str> = time.splitn(3, ' ').collect();
        assert!(stamp.len() == 3 && stamp[0].split('-').all(digits), "{time:?} in {out:?}");
        assert!(stamp[1].split(':').all(digits), "{time:?} in {out:?}");
        assert_eq!(table.trim(), "No process uses the GPUs.", "{out:?}");
    }
    assert!(!out.contains('\x1b'), "no terminal control into a pipe: {out:?}");

    let args = ["clients", "--watch", "--interval", "0.2", "--json"];
    let (code, out) = watch_until(agent.ctl_command(&args), 2, |out| out.matches('\n').count());
    assert_eq!(code, Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 2, "a document per interval: {out:?}");
    for line in lines {
        let table: ClientTable = serde_json::from_str(line).expect("each line one document");
        assert!(table.clients.is_empty(), "{line}");
        let doc: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(doc["time"].as_str().is_some_and(|t| t.len() >= 19), "{line}");
    }
}

#[test]
fn query_prints_csv() {
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    let mut sleeper = Command::new("sleep").arg("600").stdin(Stdio::null()).spawn().unwrap();
    let pid = sleeper.id();
    agent.restart_with_env(&[("GPUSHARE_SIM_PROCESSES", &format!("0:{pid}"))]);
    let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap();

    let out =
        agent.ctl(&["clients", "--query", "pid,user,via,memory_bytes,command", "--format", "csv"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        stdout(&out),
        format!(
            "pid,user,via,memory_bytes,command\n{pid},{},gpu,{},sleep 600\n",
            user.trim(),
            512 << 20
        )
    );
    let out = agent.ctl(&["clients", "--query", "pid,user", "--format", "csv,noheader"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(stdout(&out), format!("{pid},{}\n", user.trim()));

    let out = agent.ctl(&["clients", "--query", "pid,gpu_util"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("unknown field `gpu_util`; the fields are pid, user,"), "{err}");

    let _ = sleeper.kill();
    let _ = sleeper.wait();
}
