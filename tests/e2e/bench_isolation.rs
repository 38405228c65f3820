//! Bench replicas are the caller's own processes (issue 22): contained, private, bounded.
//! Each test is one point of the issue, as a hostile or careless user would meet it, on
//! simulated GPUs with the real agent and ctl (and, where other users are involved, a
//! system-type bus with the package's policy). The replicas are started as they are on a
//! host without systemd (a gate forked into a new session); under a booted systemd,
//! `packaging/check-system` checks the transient units.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpushare_proto::bench::BenchReport;
use gpushare_tests::{
    Agent, AgentOptions, MEMBER, OTHER, SECRET_GROUP, directory_of, id_of, is_root, stderr, text,
    wait_for,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A replica script in a directory of `owner`'s (root's when `None`), readable by all.
struct Script {
    dir: tempfile::TempDir,
}

impl Script {
    fn new(owner: Option<&str>, body: &str) -> Script {
        let dir = match owner {
            Some(user) => directory_of(user),
            None => tempfile::tempdir().unwrap(),
        };
        let script = dir.path().join("replica.sh");
        std::fs::write(&script, body).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        Script { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// What the replica wrote into `name` in its directory.
    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path().join(name))
            .unwrap_or_else(|e| panic!("the replica wrote no {name}: {e}"))
    }
}

/// `gpushare-ctl bench ARGS -- ./replica.sh` in the script's directory, as root.
fn bench(agent: &Agent, script: &Script, args: &[&str]) -> Command {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--", "./replica.sh"]);
    let mut cmd = agent.ctl_command(&all);
    cmd.current_dir(script.path());
    cmd
}

fn report_of(out: &Output) -> BenchReport {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bench --json printed no report ({e}): {}", text(out)))
}

/// Runs `cmd` for at most `limit`: a command still running then is killed, and its output
/// is what it wrote so far, with no exit status.
fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let until = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

/// Whether no process of the system has `marker` in its command line.
fn none_running(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().all(|entry| {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat.rfind(')').is_some_and(|i| stat[i + 1..].trim_start().starts_with('Z'));
        zombie || !String::from_utf8_lossy(&cmdline).contains(marker)
    })
}

/// An agent that serves [`MEMBER`] and [`OTHER`] too, on a system-type bus with the
/// package's policy; `None` (the test skipped) without root, which creating users needs.
fn agent_for_other_users() -> Option<Agent> {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users and own the bus name");
        return None;
    }
    Some(Agent::start(AgentOptions::simulate("a100-40gb:1").for_other_users()))
}

/// Whether the agent's journal holds a bench record.
fn bench_record(agent: &Agent) -> bool {
    agent.dir.path().join("state/state.json").exists() && agent.journal().get("bench").is_some()
}

/// Point 2: a replica started by an agent that has a controlling terminal cannot reach it
/// (the TIOCSTI attack needs `/dev/tty`).
#[test]
fn a_replica_cannot_reach_the_agents_terminal() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1").with_terminal());
    let script = Script::new(
        None,
        r#"#!/bin/sh
if (exec 4</dev/tty) 2>/dev/null; then echo yes > tty; else echo no > tty; fi
if [ -t 0 ] || [ -t 1 ] || [ -t 2 ]; then echo yes > std; else echo no > std; fi
echo >&3
"#,
    );
    let out = bench(&agent, &script, &["--replicas", "1", "--strategies", "mps", "--until-exit"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(script.read("tty").trim(), "no", "the replica opened the agent's terminal");
    assert_eq!(script.read("std").trim(), "no");
}

/// Point 3: a replica has exactly the caller's groups, not every group of its passwd
/// entry.
#[test]
fn a_replica_has_exactly_the_callers_groups() {
    let Some(agent) = agent_for_other_users() else { return };
    let secret = tempfile::tempdir().unwrap();
    std::fs::set_permissions(secret.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret_file = secret.path().join("secret");
    std::fs::write(&secret_file, "the secret group's\n").unwrap();
    std::os::unix::fs::chown(&secret_file, Some(0), Some(id_of("group", SECRET_GROUP))).unwrap();
    std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let script = Script::new(
        Some(MEMBER),
        &format!(
            "#!/bin/sh\nid -G > groups\nif cat {} >/dev/null 2>&1; then echo yes > read; else echo no > read; fi\necho >&3\n",
            secret_file.display()
        ),
    );
    let home = directory_of(MEMBER);
    // The caller gave up its secret group: gpushare alone beside its own.
    let gpushare = id_of("group", "gpushare");
    let out = agent
        .ctl_as(
            MEMBER,
            Some(&gpushare.to_string()),
            home.path(),
            script.path(),
            &[
                "bench",
                "--replicas",
                "1",
                "--strategies",
                "mps",
                "--until-exit",
                "--",
                "./replica.sh",
            ],
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let own = id_of("group", MEMBER);
    assert_eq!(script.read("groups").trim(), format!("{own} {gpushare}"));
    assert_eq!(script.read("read").trim(), "no", "the replica used a group the caller dropped");
}

/// Point 4: nobody but the caller and root reads what a bench ran and printed: not through
/// `Job1` (property, signal, `GetOutcome`), not through its files.
#[test]
fn a_bench_is_its_callers_alone() {
    let Some(agent) = agent_for_other_users() else { return };
    let script = Script::new(Some(MEMBER), "#!/bin/sh\necho printed-TOKEN-4711\necho >&3\n");
    let home = directory_of(MEMBER);
    let out = agent
        .ctl_as(
            MEMBER,
            None,
            home.path(),
            script.path(),
            &[
                "bench",
                "--replicas",
                "1",
                "--strategies",
                "mps",
                "--until-exit",
                "--json",
                "--",
                "./replica.sh",
                "--api-key=SECRET-0815",
            ],
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report = report_of(&out);
    assert!(report.command.iter().any(|a| a.contains("SECRET-0815")));
    let job = agent.call(None, &["latest-job"]);
    assert!(job.starts_with("/io/gpushare/Agent1/jobs/"), "{job}");

    // Another user: the public outcome only, and no GetOutcome.
    let public = agent.call(Some(OTHER), &["outcome", &job]);
    assert!(public.contains("\"private\":true"), "{public}");
    assert!(!public.contains("SECRET-0815") && !public.contains("TOKEN-4711"), "{public}");
    let refused = agent.call(Some(OTHER), &["get-outcome", &job]);
    assert!(refused.starts_with("error "), "{refused}");
    // The caller and root read the whole.
    for user in [Some(MEMBER), None] {
        let whole = agent.call(user, &["get-outcome", &job]);
        assert!(whole.contains("SECRET-0815") && whole.contains("TOKEN-4711"), "{user:?}: {whole}");
    }

    // The files are the caller's, owner-only, in the caller's place; the agent keeps none.
    let logs = PathBuf::from(&report.logs_dir);
    assert!(logs.starts_with(home.path()), "{logs:?}");
    let saved = PathBuf::from(&report.saved_to);
    for path in [logs.clone(), logs.join("mps-1"), logs.join("mps-1/replica-0.out"), saved.clone()]
    {
        let meta = std::fs::metadata(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        use std::os::unix::fs::MetadataExt;
        assert_eq!(meta.uid(), id_of("passwd", MEMBER), "{path:?}");
        let mode = meta.mode() & 0o777;
        assert_eq!(mode, if meta.is_dir() { 0o700 } else { 0o600 }, "{path:?}");
    }
    let peek = gpushare_tests::as_user(OTHER)
        .arg("cat")
        .arg(logs.join("mps-1/replica-0.out"))
        .output()
        .unwrap();
    assert!(!peek.status.success(), "another user read the replica's output");
    assert!(!agent.dir.path().join("state/bench").exists(), "the agent kept bench files");
}

/// Point 5: the directory and the command are checked as the caller, before the GPU is
/// touched: a path the caller cannot see reads the same whether it exists or not.
#[test]
fn paths_are_checked_as_the_caller_before_anything_is_touched() {
    let Some(agent) = agent_for_other_users() else { return };
    let hidden = tempfile::tempdir().unwrap();
    std::fs::set_permissions(hidden.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret_dir = hidden.path().join("secret-dir");
    std::fs::create_dir(&secret_dir).unwrap();
    std::fs::write(secret_dir.join("tool.sh"), "#!/bin/sh\necho >&3\n").unwrap();
    std::fs::set_permissions(secret_dir.join("tool.sh"), std::fs::Permissions::from_mode(0o755))
        .unwrap();
    let own = directory_of(MEMBER);
    let member_home = own.path().display().to_string();
    let request = |command: &str, cwd: &str| {
        serde_json::json!({
            "command": [command],
            "options": {
                "cwd": cwd, "replicas": [1], "strategies": ["mps"], "until_exit": true,
                "environment": ["PATH=/usr/bin:/bin"],
            }
        })
        .to_string()
    };
    let answer =
        |command: &str, cwd: &str| agent.call(Some(MEMBER), &["bench", &request(command, cwd)]);
    let existing = answer("/bin/true", &secret_dir.display().to_string());
    let missing = answer("/bin/true", &hidden.path().join("nope").display().to_string());
    for a in [&existing, &missing] {
        assert!(a.starts_with("error ") && a.contains("Permission denied"), "{a}");
    }
    let same = |a: &str, path: &Path| a.replace(&path.display().to_string(), "PATH");
    assert_eq!(same(&existing, &secret_dir), same(&missing, &hidden.path().join("nope")));
    let tool = answer(&secret_dir.join("tool.sh").display().to_string(), &member_home);
    let no_tool = answer(&hidden.path().join("nope.sh").display().to_string(), &member_home);
    for a in [&tool, &no_tool] {
        assert!(a.starts_with("error ") && a.contains("Permission denied"), "{a}");
    }
    assert_eq!(agent.sim_record(), "", "nothing was set up");
    assert!(!bench_record(&agent));
}

/// Point 6: a replica flooding its report descriptor costs the agent bounded memory: 500 MB
/// of lines, then 1 GB without a newline.
#[test]
fn a_flood_of_reports_is_counted_not_stored() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    let pid = agent.pid().unwrap();
    let script = Script::new(
        None,
        r#"#!/bin/sh
if mkdir lines 2>/dev/null; then
  yes 0 | head -c 500000000 >&3
elif mkdir bytes 2>/dev/null; then
  echo 1 >&3
  head -c 1000000000 /dev/zero | tr '\0' 7 >&3
else
  echo 1 >&3
fi
"#,
    );
    let status = |key: &str| -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = text.lines().find(|l| l.starts_with(key)).unwrap().to_string();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    let before = status("VmRSS:");
    // The peak from now on (writing 5 resets it).
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    // Until exit: each replica's run lasts until the agent has read all it wrote.
    let out = bench(
        &agent,
        &script,
        &["--replicas", "1", "--strategies", "time-slicing", "--until-exit", "--json"],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let peak = status("VmHWM:");
    assert!(script.path().join("lines").exists() && script.path().join("bytes").exists());
    let grown = peak.saturating_sub(before);
    eprintln!("the agent's peak grew by {} KiB reading the flood", grown >> 10);
    assert!(grown < 64 << 20, "the agent grew by {} MiB reading a flood", grown >> 20);
    assert!(agent.ctl(&["status"]).status.success());
}

/// Point 7: a replica's output is capped and lands in the caller's place, never in the
/// agent's state directory.
#[test]
fn output_is_capped_and_kept_where_the_caller_owns_it() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    let script = Script::new(None, "#!/bin/sh\nhead -c 100000000 /dev/zero\necho >&3\n");
    let out = bench(
        &agent,
        &script,
        &["--replicas", "1", "--strategies", "time-slicing", "--until-exit", "--json"],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report = report_of(&out);
    assert!(
        report.logs_dir.starts_with(&agent.ctl_state().display().to_string()),
        "{}",
        report.logs_dir
    );
    let log = Path::new(&report.logs_dir).join("time-slicing-1-1/replica-0.out");
    let size = std::fs::metadata(&log).unwrap_or_else(|e| panic!("{log:?}: {e}")).len();
    assert!(size <= (8 << 20) + 200, "the log holds {size} bytes");
    let replica = &report.baseline.as_ref().unwrap().per_replica[0];
    assert_eq!(replica.output_dropped_bytes, 100_000_000 - (8 << 20));
    assert!(!agent.dir.path().join("state/bench").exists(), "the agent kept bench files");
    assert!(report.restored.contains("as before"), "{}", report.restored);
    assert!(Path::new(&report.saved_to).is_file());
}

/// Point 8: what a replica starts and hides (a new session, a double fork) does not
/// survive the bench.
#[test]
fn processes_a_replica_hides_do_not_survive_the_bench() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    // A sleep whose command line no other process has.
    let marker = format!("600.{}1", std::process::id());
    let script = Script::new(
        None,
        &format!(
            r#"#!/bin/sh
setsid sleep {marker} &
( ( sleep {marker} & ) & ) &
sleep 0.3
echo >&3
"#
        ),
    );
    let out = bench(&agent, &script, &["--replicas", "2", "--strategies", "mps", "--until-exit"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        none_running(&marker).then_some(()).ok_or("the hidden processes run on".to_string())
    });
}

/// Point 9: a restore that fails is a rollback error in status and is never replayed over a
/// newer apply.
#[test]
fn a_failed_restore_is_shown_and_never_replayed_over_a_newer_apply() {
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    // The bench's setup sets the compute mode (1st call), its restore sets it back (2nd).
    agent.restart_with_env(&[("GPUSHARE_SIM_FAIL", "nvmlDeviceSetComputeMode:2")]);
    let script = Script::new(None, "#!/bin/sh\necho >&3\n");
    let out = bench(
        &agent,
        &script,
        &["--replicas", "1", "--strategies", "time-slicing", "--until-exit"],
    )
    .output()
    .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        stderr(&out).contains("restoring the sharing after the bench failed"),
        "{}",
        text(&out)
    );
    let status = agent.status();
    let error = status.rollback_error.expect("status tells of the failed restore");
    assert!(error.contains("restoring the GPU after the bench"), "{error}");
    // No bench until then: its checkpoint would be this broken state.
    let out = bench(&agent, &script, &["--replicas", "1", "--strategies", "mps", "--until-exit"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("apply a profile first"), "{}", text(&out));
    // A newer apply settles it, and a restart does not undo that apply.
    let out = agent.ctl(&["apply", "all-disabled"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(agent.status().rollback_error, None, "{}\n{}", text(&out), agent.journal());
    agent.restart_with_env(&[]);
    let status = agent.status();
    assert_eq!(status.active_profile.as_deref(), Some("all-disabled"));
    assert_eq!(status.gpus[0].sharing.strategy, "exclusive");
    assert!(agent.mps_servers().is_empty(), "the old bench record was replayed");
    assert!(!bench_record(&agent));
}

/// Point 10: durations are bounded where they are parsed; nothing panics, nothing hangs.
#[test]
fn durations_beyond_their_bounds_are_refused_in_one_line() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    let script = Script::new(None, "#!/bin/sh\necho >&3\n");
    for args in [["--time-limit", "18446744073709551615s"], ["--duration", "2h"]] {
        let out = output_within(bench(&agent, &script, &args), Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert_eq!(stderr(&out).trim().lines().count(), 1, "{}", text(&out));
    }
    let dir = script.path().display().to_string();
    for (key, value) in [("time_limit", 1e300), ("duration", 1e300), ("time_limit", 0.5)] {
        let request = serde_json::json!({
            "command": ["./replica.sh"],
            "options": { "cwd": dir, key: value, "environment": ["PATH=/usr/bin:/bin"] },
        });
        let answer = agent.call(None, &["bench", &request.to_string()]);
        assert!(answer.starts_with("error io.gpushare.Agent1.Error.Failed"), "{answer}");
        assert!(answer.contains(key), "{answer}");
    }
    assert!(agent.ctl(&["status"]).status.success(), "the agent answers");
    assert_eq!(agent.sim_record(), "");
    assert!(!bench_record(&agent));
}

/// Point 11: SIGTERM to the agent (`systemctl stop`) cancels a running bench, which stops
/// its replicas and restores the GPU within seconds.
#[test]
fn sigterm_cancels_a_bench_and_restores_within_seconds() {
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    // A sleep whose command line no other process has.
    let marker = format!("600.{}2", std::process::id());
    let script = Script::new(None, &format!("#!/bin/sh\necho >&3\nexec sleep {marker}\n"));
    let ctl =
        bench(&agent, &script, &["--replicas", "1", "--strategies", "mps", "--duration", "30s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
    wait_for(Duration::from_secs(30), Duration::from_millis(20), || {
        (!none_running(&marker)).then_some(()).ok_or("no replica yet".to_string())
    });
    let pid = agent.pid().unwrap();
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
    let stopped = Instant::now();
    let exited = agent.wait_exit(Duration::from_secs(10));
    assert!(exited.is_some(), "the agent still ran 10 s after SIGTERM");
    assert!(stopped.elapsed() < Duration::from_secs(10));
    // The caller still learns how its bench ended, although the agent is gone.
    let out = ctl.wait_with_output().unwrap();
    assert!(stderr(&out).contains("cancelled; the sharing was restored"), "{}", text(&out));
    assert!(none_running(&marker), "the replica outlived the agent");
    agent.restart_with_env(&[]);
    let status = agent.status();
    assert_eq!(status.active_profile.as_deref(), Some("all-mps"));
    assert_eq!(agent.mps_servers().len(), 1);
    assert!(!bench_record(&agent));
}
