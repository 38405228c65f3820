//! Issue 36, a hostile member's benches: a member's stopped check never holds the node
//! (finding 3), a bench has a bound and root can cancel it, and its report is its
//! caller's alone (finding 6). The bench is [`MEMBER`]'s, run through its own
//! `gpushare-ctl`; root applies and cancels. Simulated GPUs, the real agent and ctl, a
//! system-type bus with the package's policy.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use gpushare_proto::types::Status;
use gpushare_tests::{
    Agent, AgentOptions, MEMBER, OTHER, directory_of, id_of, is_root, layout, reason_lines, stderr,
    stdout, text, wait_for,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{AccessFlags, Pid, access};

/// How long the agent gives a bench's check as the caller (`CHECK_WITHIN`).
const CHECK_BOUND: Duration = Duration::from_secs(5);

/// GPU 1 alone, under MPS for two clients.
const GPU1_MPS: &str = "name = \"gpu1-mps\"\n[[gpu]]\nselect = 1\nmig = \"disabled\"\nsharing.mps = { replicas = 2 }\n";
/// GPU 1 alone, whole.
const GPU1_WHOLE: &str =
    "name = \"gpu1-whole\"\n[[gpu]]\nselect = 1\nmig = \"disabled\"\nsharing = \"exclusive\"\n";

/// A replica that reports one unit, five more 1 s later, and idles until stopped.
const IDLING: &str = "#!/bin/sh\necho >&3\nsleep 1\nfor ms in 10 20 30 40 50; do echo $ms >&3; done\nexec sleep 600\n";

/// An agent of `gpus` serving [`MEMBER`] and [`OTHER`] too, with agent.toml `config`,
/// under `all-mps`; `None` (the test skipped) without root, which the users need.
fn agent(gpus: &str, config: &str) -> Option<Agent> {
    if !is_root() {
        gpushare_tests::skip("needs root to create test users and own the bus name");
        return None;
    }
    let options = AgentOptions::simulate(gpus)
        .for_other_users()
        .config(config)
        .profile("gpu1-mps.toml", GPU1_MPS)
        .profile("gpu1-whole.toml", GPU1_WHOLE);
    let agent = Agent::start(options);
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    Some(agent)
}

/// A directory of [`MEMBER`]'s holding `replica` (executable), readable by all.
fn member_dir(replica: &str) -> tempfile::TempDir {
    let dir = directory_of(MEMBER);
    let script = dir.path().join("replica");
    std::fs::write(&script, replica).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&script, Some(id_of("passwd", MEMBER)), None).unwrap();
    dir
}

/// `gpushare-ctl bench ARGS -- COMMAND` as [`MEMBER`] in `dir`, started.
fn member_bench(agent: &Agent, dir: &Path, args: &[&str], command: &[&str]) -> Child {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.push("--");
    all.extend_from_slice(command);
    agent
        .ctl_as(MEMBER, None, dir, dir, &all)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// GPU `index`'s sharing as `status` shows it.
fn shape(status: &Status, index: usize) -> String {
    let g = &status.gpus[index];
    let mps =
        g.sharing.mps.as_ref().map(|m| (m.active_thread_percentage, m.pinned_memory_limit_bytes));
    format!("{:?} {} {} {mps:?}", layout(status)[index], g.compute_mode, g.sharing.strategy)
}

/// `gpushare-ctl apply PROFILE` as root, and how long it took.
fn timed_apply(agent: &Agent, profile: &str) -> (Output, Duration) {
    let began = Instant::now();
    let out = agent.ctl(&["apply", profile]);
    (out, began.elapsed())
}

/// The real user of process `pid`.
fn real_user(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()
}

/// The state letter of process `pid` (`T` stopped, `Z` a zombie), `None` once it is gone.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// The children of process `parent` (every thread's), from `/proc`.
fn children(parent: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// Stops (SIGSTOP) the first bench gate of the agent's children that has become `uid`, as
/// that user may stop their own process; its pid, or `None` if none came within `within`.
/// (Sent by the test, which is root, at the moment the gate is the user's: what the user
/// does with `kill -STOP`, without a user's shell's delay.)
fn stop_first_gate_of(agent_pid: u32, uid: u32, within: Duration) -> Option<u32> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        for pid in children(agent_pid) {
            if real_user(pid) != Some(uid) {
                continue;
            }
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains("--bench-gate") {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
                return Some(pid);
            }
        }
    }
    None
}

/// A `PATH` that takes the check a while to search (thousands of directories, relative to
/// the bench's directory, that do not hold the command, each reached through 33 links),
/// then `dir`, which does: a window in which the member's gate is theirs and still
/// checking. (A variable is at most 128 KiB: execve's limit.)
fn slow_path(dir: &Path) -> String {
    std::os::unix::fs::symlink(".", dir.join("s")).unwrap();
    std::os::unix::fs::symlink("s/s/s/s/s/s/s/s/s/s", dir.join("t")).unwrap();
    let mut path: Vec<String> = (0..11_000).map(|i| format!("t/t/t/{i}")).collect();
    path.push(dir.display().to_string());
    path.push("/usr/bin:/bin".into());
    path.join(":")
}

/// Finding 3: a member whose check gate is stopped (SIGSTOP) holds nothing of root's: an
/// apply by root meanwhile takes about as long as one without it (not the 20 s after
/// which it used to fail "busy"), the member's bench is refused once its check's bound
/// passed, and the stopped gate is killed.
#[test]
fn a_members_stopped_check_does_not_hold_roots_apply() {
    let Some(agent) = agent("a100-40gb:2", "") else { return };
    // Root's apply of GPU 1 alone, twice, with nothing else going on: the baseline.
    let (out, _) = timed_apply(&agent, "gpu1-whole");
    assert!(out.status.success(), "{}", text(&out));
    let (out, baseline) = timed_apply(&agent, "gpu1-mps");
    assert!(out.status.success(), "{}", text(&out));

    let dir = member_dir(IDLING);
    let path = slow_path(dir.path());
    let mut all = vec!["bench", "--target", "0", "--replicas", "1", "--strategies", "mps"];
    all.extend_from_slice(&["--duration", "2s", "--", "replica"]);
    let ctl = agent
        .ctl_as(MEMBER, None, dir.path(), dir.path(), &all)
        .env("PATH", &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let member = id_of("passwd", MEMBER);
    let gate = stop_first_gate_of(agent.pid().unwrap(), member, Duration::from_secs(20))
        .expect("the member's check gate did not start");
    wait_for(Duration::from_secs(2), Duration::from_millis(5), || match state(gate) {
        Some('T') => Ok(()),
        s => Err(format!("the member's gate {gate} did not stop ({s:?}): it answered first?")),
    });

    // Root's apply of GPU 1 while the member's check is stopped: no refusal, no wait
    // beyond the check's bound.
    let (out, during) = timed_apply(&agent, "gpu1-whole");
    assert!(out.status.success(), "root's apply failed beside a stopped check: {}", text(&out));
    assert!(
        during < baseline + CHECK_BOUND,
        "root's apply took {during:?} beside a stopped check, {baseline:?} alone"
    );

    // The member's bench is refused in one line once its check's bound passed; the
    // stopped gate is gone, and nothing of the bench is left.
    let out = ctl.wait_with_output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert_eq!(reason_lines(&err), 1, "{err}");
    assert!(err.contains("did not answer within 5 s"), "{err}");
    wait_for(Duration::from_secs(5), Duration::from_millis(20), || match state(gate) {
        None | Some('Z') => Ok(()),
        s => Err(format!("the stopped gate {gate} is still there ({s:?})")),
    });
    let status = agent.status();
    assert!(status.benches.is_empty(), "{status:?}");
    assert!(agent.journal().get("bench").is_none(), "{}", agent.journal());
    // And the member may bench again: nothing of theirs is held.
    let out = agent.ctl(&["apply", "gpu1-mps"]);
    assert!(out.status.success(), "{}", text(&out));
}

/// Finding 6: a bench longer than agent.toml's `[bench] max_total_seconds` is refused in
/// one line before any setup, and one that reaches the bound while it runs is stopped, its
/// GPU restored.
#[test]
fn a_bench_over_the_bound_is_refused_and_one_that_reaches_it_is_stopped() {
    let Some(agent) = agent("a100-40gb:1", "[bench]\nmax_total_seconds = 6\n") else { return };
    let before = agent.status();
    let dir = member_dir(IDLING);

    // Windows of 5 s: the baseline three times and one cell, 20 s at least.
    let ctl = member_bench(
        &agent,
        dir.path(),
        &["--replicas", "1", "--strategies", "mps", "--duration", "5s"],
        &["./replica"],
    );
    let out = ctl.wait_with_output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert_eq!(reason_lines(&err), 1, "{err}");
    assert!(err.contains("takes at least 20 s (4 measurements of 5 s windows)"), "{err}");
    assert!(err.contains("6 s a bench may take here ([bench] max_total_seconds"), "{err}");
    assert_eq!(shape(&agent.status(), 0), shape(&before, 0), "a refused bench changed the GPU");

    // Until exit: nothing tells its length before it runs; the bound stops it.
    let began = Instant::now();
    let ctl = member_bench(
        &agent,
        dir.path(),
        &["--replicas", "1", "--strategies", "mps", "--until-exit"],
        &["/bin/sleep", "600"],
    );
    let out = ctl.wait_with_output().unwrap();
    let took = began.elapsed();
    assert!(!out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    assert!(err.contains("stopped at 6 s, the most a bench may take here"), "{err}");
    assert!(err.contains("the sharing was restored"), "{err}");
    assert!(took < Duration::from_secs(60), "the bench ran for {took:?}");
    let after = agent.status();
    assert!(after.benches.is_empty(), "{after:?}");
    assert_eq!(shape(&after, 0), shape(&before, 0));
    assert!(agent.journal().get("bench").is_none(), "{}", agent.journal());
}

/// MEMBER's bench of an idling replica in `dir` (30 s windows, MPS only), once its replica
/// runs: the `gpushare-ctl bench` running it, and the bench as `status` shows it.
fn idling_bench(agent: &Agent, dir: &Path) -> (Child, gpushare_proto::types::BenchStatus) {
    let ctl = member_bench(
        agent,
        dir,
        &["--replicas", "1", "--strategies", "mps", "--duration", "30s"],
        &["./replica"],
    );
    let bench = wait_for(Duration::from_secs(30), Duration::from_millis(20), || {
        let status = agent.status();
        let replicas = agent.journal()["bench"]["replicas"].as_array().map_or(0, Vec::len);
        match status.benches.first() {
            Some(b) if replicas > 0 => Ok(b.clone()),
            _ => Err(format!("the member's bench did not start: {status:?}")),
        }
    });
    (ctl, bench)
}

/// Finding 6: root cancels a member's bench with `gpushare-ctl cancel`, which `status`
/// says how to do; the GPU is restored. Another user may not; an apply cannot be.
#[test]
fn root_cancels_a_members_bench() {
    let Some(agent) = agent("a100-40gb:1", "") else { return };
    let before = agent.status();
    let apply_job = agent.call(None, &["latest-job"]);
    let dir = member_dir(IDLING);
    let (ctl, bench) = idling_bench(&agent, dir.path());
    let number = bench.job.rsplit('/').next().unwrap().to_string();
    let shown = stdout(&agent.ctl(&["status"]));
    assert!(shown.contains(&format!("gpushare-ctl cancel {number}\n")), "{shown}");

    // Another user may not, and an apply cannot be cancelled.
    let other = directory_of(OTHER);
    let out = agent.ctl_as(OTHER, None, other.path(), other.path(), &["cancel", &number]).output();
    let out = out.unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(reason_lines(&stderr(&out)), 1, "{}", text(&out));
    assert_eq!(agent.status().benches.len(), 1, "another user cancelled the bench");
    let out = agent.ctl(&["cancel", &apply_job]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains("only a bench can be cancelled"), "{}", text(&out));
    let out = agent.ctl(&["cancel", "999999"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains("no job /io/gpushare/Agent1/jobs/999999"), "{}", text(&out));

    // Root cancels it: ctl waits for its end; the GPU is as before.
    let out = agent.ctl(&["cancel", &bench.job, "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let done: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(done["job"], bench.job.as_str(), "{done}");
    assert_eq!(
        (done["was_running"].as_bool(), done["state"].as_str()),
        (Some(true), Some("failed"))
    );
    assert!(done["ended"].as_str().unwrap_or("").contains("cancelled"), "{done}");
    let after = agent.status();
    assert!(after.benches.is_empty(), "{after:?}");
    assert_eq!(shape(&after, 0), shape(&before, 0));
    let out = ctl.wait_with_output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(stderr(&out).contains("cancelled"), "{}", text(&out));
    // Cancelling it again says it had ended.
    let out = agent.ctl(&["cancel", &number]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("had already ended"), "{}", text(&out));
}

/// A bench's user cancels it from another terminal (another connection of theirs), not
/// only with Ctrl-C in the client that started it.
#[test]
fn a_members_bench_is_cancelled_by_its_user_from_another_terminal() {
    let Some(agent) = agent("a100-40gb:1", "") else { return };
    let dir = member_dir(IDLING);
    let (ctl, bench) = idling_bench(&agent, dir.path());
    let number = bench.job.rsplit('/').next().unwrap().to_string();
    let out =
        agent.ctl_as(MEMBER, None, dir.path(), dir.path(), &["cancel", &number]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(agent.status().benches.is_empty());
    let out = ctl.wait_with_output().unwrap();
    assert!(stderr(&out).contains("cancelled"), "{}", text(&out));
}

/// Finding 6: `--report FILE.html` holds the command line and the output tails: it is
/// made readable by its caller alone, and a link planted at its name is replaced, not
/// followed.
#[test]
fn a_bench_report_is_its_callers_alone() {
    let Some(agent) = agent("a100-40gb:1", "") else { return };
    let dir = member_dir("#!/bin/sh\necho >&3\n");
    let target = dir.path().join("elsewhere");
    std::fs::write(&target, "untouched\n").unwrap();
    std::os::unix::fs::symlink(&target, dir.path().join("report.html")).unwrap();
    let ctl = member_bench(
        &agent,
        dir.path(),
        &["--replicas", "1", "--strategies", "mps", "--until-exit", "--report", "report.html"],
        &["./replica", "--token=SECRET-4711"],
    );
    let out = ctl.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report = dir.path().join("report.html");
    let meta = std::fs::symlink_metadata(&report).unwrap();
    assert!(meta.is_file(), "the report is not a file of its own: {meta:?}");
    assert_eq!(meta.mode() & 0o777, 0o600, "the report's mode");
    assert_eq!(meta.uid(), id_of("passwd", MEMBER));
    assert!(std::fs::read_to_string(&report).unwrap().contains("SECRET-4711"));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched\n");
}

/// A metrics endpoint of the test's own (standing for another user's program), on every
/// port written into `port_file` as replicas name theirs: each scrape answers a histogram
/// that grew by 100 observations. Ends when `stop` is set.
fn impostor(port_file: std::path::PathBuf, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let mut listeners: Vec<(u16, std::net::TcpListener)> = Vec::new();
    let mut count = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let named = std::fs::read_to_string(&port_file).ok().and_then(|p| p.trim().parse().ok());
        if let Some(port) = named.filter(|p| !listeners.iter().any(|(q, _)| q == p))
            && let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port))
        {
            l.set_nonblocking(true).unwrap();
            listeners.push((port, l));
        }
        for (_, l) in &listeners {
            while let Ok((mut conn, _)) = l.accept() {
                conn.set_nonblocking(false).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                count += 100;
                let body = format!(
                    "# TYPE request_latency_seconds histogram\nrequest_latency_seconds_bucket{{le=\"0.01\"}} {count}\nrequest_latency_seconds_bucket{{le=\"+Inf\"}} {count}\nrequest_latency_seconds_sum {}\nrequest_latency_seconds_count {count}\n",
                    count as f64 * 0.005
                );
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Finding 7: a replica binds `$GPUSHARE_BENCH_METRICS_PORT` itself, a moment after the
/// agent found the port free. A program that is not the replica's takes it first and
/// answers the scrapes (here the test's, as another user's would): its figures are not
/// believed, and the bench says so in one line instead of reporting them.
#[test]
fn a_metrics_port_someone_else_took_is_not_believed() {
    let Some(agent) = agent("a100-40gb:1", "") else { return };
    // The replica names its port and never binds it: the impostor does.
    let dir = member_dir(
        "#!/bin/sh\necho \"$GPUSHARE_BENCH_METRICS_PORT\" > port.new && mv port.new port\nexec sleep 600\n",
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let serving = {
        let (file, stop) = (dir.path().join("port"), std::sync::Arc::clone(&stop));
        std::thread::spawn(move || impostor(file, stop))
    };
    let mut all = vec!["bench", "--replicas", "1", "--strategies", "mps", "--duration", "1s"];
    all.extend_from_slice(&["--histogram", "request_latency_seconds", "--time-limit", "30s"]);
    all.extend_from_slice(&["--", "./replica"]);
    let out = agent.ctl_as(MEMBER, None, dir.path(), dir.path(), &all).output().unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    serving.join().unwrap();
    assert!(!out.status.success(), "the impostor's figures were reported: {}", text(&out));
    let err = stderr(&out);
    assert_eq!(reason_lines(&err), 1, "{err}");
    assert!(err.contains("is listened on by another user's process, not replica 0's"), "{err}");
    let after = agent.status();
    assert!(after.benches.is_empty(), "{after:?}");
}

/// The unified (cgroup v2) path of process `pid` (`0::/…` of `/proc/PID/cgroup`).
fn unified_cgroup(pid: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_string)
}

/// Finding 6: without systemd a replica gets a service's default limit of open files
/// (1024 soft), not the agent's (root's), and, where the agent's cgroup v2 directory is
/// writable, a cgroup of its own below it, gone after the bench.
#[test]
fn a_replica_without_systemd_has_a_services_limits_and_a_cgroup_of_its_own() {
    let Some(agent) = agent("a100-40gb:1", "") else { return };
    let dir =
        member_dir("#!/bin/sh\nulimit -Sn > nofile\ncat /proc/self/cgroup > cgroup\necho >&3\n");
    let ctl = member_bench(
        &agent,
        dir.path(),
        &["--replicas", "1", "--strategies", "mps", "--until-exit"],
        &["./replica"],
    );
    let out = ctl.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let soft: u64 =
        std::fs::read_to_string(dir.path().join("nofile")).unwrap().trim().parse().unwrap();
    assert!(soft <= 1024, "the replica's soft limit of open files is {soft}");
    let replica = std::fs::read_to_string(dir.path().join("cgroup")).unwrap();
    let replica = replica.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("").to_string();
    let own = unified_cgroup(&agent.pid().unwrap().to_string()).unwrap_or_default();
    let mount = std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().find_map(|l| {
        let (fields, rest) = l.split_once(" - ")?;
        (rest.starts_with("cgroup2 "))
            .then(|| fields.split_whitespace().nth(4).map(str::to_string))?
    });
    let writable = mount.as_ref().is_some_and(|m| {
        let dir = Path::new(m).join(own.trim_start_matches('/'));
        let may_write = access(&dir, AccessFlags::W_OK | AccessFlags::X_OK).is_ok();
        dir.join("cgroup.procs").is_file() && may_write
    });
    if !writable {
        gpushare_tests::skip(
            "the cgroup part: the agent's cgroup v2 directory is not writable here",
        );
        return;
    }
    assert!(
        replica.starts_with(&format!("{}/gpushare-bench-", own.trim_end_matches('/'))),
        "the replica ran in {replica}, the agent in {own}"
    );
    let leaf = Path::new(mount.as_deref().unwrap()).join(replica.trim_start_matches('/'));
    assert!(!leaf.exists(), "the replica's cgroup {} is left", leaf.display());
}
