//! The bench's replica runner with the real gate (`gpushare-agent --bench-gate`, started
//! by the direct launcher: a child in a new session) and small shell scripts as replicas:
//! no GPU needed.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpushare_agent::bench::control::{self, FromGate, Logs, Spec, ToGate};
use gpushare_agent::bench::launch::Launcher;
use gpushare_agent::bench::pinning::CpuList;
use gpushare_agent::bench::replicas::{self, Batch, Launch, ReplicaSpec};
use gpushare_agent::sys::procfs;
use gpushare_agent::sys::unix::{self, Identity};

fn gate() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpushare-agent"))
}

fn launch<'a>(program: &'a Path, identity: Option<&'a Identity>) -> Launch<'a> {
    static DIRECT: Launcher = Launcher::Direct;
    Launch {
        launcher: &DIRECT,
        program,
        identity,
        label: "0",
        runtime_max: Duration::from_secs(600),
        cancel: None,
    }
}

fn script(dir: &Path, body: &str) -> ReplicaSpec {
    ReplicaSpec {
        command: ["/bin/sh", "-c", body].iter().map(|s| s.to_string()).collect(),
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("CUDA_VISIBLE_DEVICES".into(), "GPU-test".into()),
            ("DIR".into(), dir.display().to_string()),
        ],
        cwd: dir.display().to_string(),
        logs: None,
        cpus: None,
    }
}

/// `script`, with its output written to `dir/run/`.
fn logged(dir: &Path, body: &str, index: u32) -> ReplicaSpec {
    let mut spec = script(dir, body);
    spec.logs =
        Some(Logs { dir: dir.display().to_string(), run: "run".into(), index, cap_bytes: 1 << 20 });
    spec
}

const GRACE: Duration = Duration::from_secs(2);

/// Waits up to 5 s for `pid` to be gone.
fn gone(pid: u32) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while procfs::alive(pid) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    !procfs::alive(pid)
}

#[test]
fn units_by_line_are_counted_exactly_and_replicas_see_their_environment() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"echo "$GPUSHARE_BENCH_REPLICA/$GPUSHARE_BENCH_REPLICAS $CUDA_VISIBLE_DEVICES $(pwd)"
i=0
while [ $i -lt $((GPUSHARE_BENCH_REPLICA + 5)) ]; do echo 1.5 >&$GPUSHARE_BENCH_REPORT; i=$((i+1)); done
echo >&$GPUSHARE_BENCH_REPORT
echo not-a-number >&$GPUSHARE_BENCH_REPORT"#;
    let specs = (0..3).map(|i| logged(dir.path(), body, i)).collect();
    let program = gate();
    let mut batch = Batch::spawn(launch(&program, None), specs).unwrap();
    batch.release().unwrap();
    assert!(batch.wait_until(Instant::now() + Duration::from_secs(20)));
    let outcomes = batch.finish(GRACE);
    for (i, o) in outcomes.iter().enumerate() {
        assert!(o.succeeded(), "{o:?}");
        assert_eq!(o.units.count, i as u64 + 6, "{o:?}");
        assert_eq!(o.units.latencies.kept(), vec![1.5; i + 5]);
        assert_eq!(o.units.malformed, 1);
        assert_eq!(o.units.first_malformed.as_deref(), Some("not-a-number"));
        let line = format!("{i}/3 GPU-test {}\n", dir.path().display());
        assert_eq!(o.stdout_tail, line);
        let file = dir.path().join(format!("run/replica-{i}.out"));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), line);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(o.pid > 0);
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("run")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[test]
fn nothing_runs_before_the_release_and_all_start_together() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"date +%s%N > "$DIR/started-$GPUSHARE_BENCH_REPLICA""#;
    let specs = (0..4).map(|_| script(dir.path(), body)).collect();
    let program = gate();
    let mut batch = Batch::spawn(launch(&program, None), specs).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        std::fs::read_dir(dir.path())
            .unwrap()
            .all(|e| { !e.unwrap().file_name().to_string_lossy().starts_with("started-") })
    );
    assert_eq!(batch.running(), 4, "held at the gate, not ended");
    batch.release().unwrap();
    assert!(batch.wait_until(Instant::now() + Duration::from_secs(20)));
    let outcomes = batch.finish(GRACE);
    assert!(outcomes.iter().all(|o| o.succeeded()), "{outcomes:?}");
    let starts: Vec<u128> = (0..4)
        .map(|i| {
            let text = std::fs::read_to_string(dir.path().join(format!("started-{i}"))).unwrap();
            text.trim().parse().unwrap()
        })
        .collect();
    let spread_ms = (starts.iter().max().unwrap() - starts.iter().min().unwrap()) / 1_000_000;
    // Generous: four shells starting on a loaded 2-core CI machine.
    assert!(spread_ms < 500, "the replicas started {spread_ms} ms apart");
}

#[test]
fn failures_are_reported_per_replica() {
    let dir = tempfile::tempdir().unwrap();
    let specs = vec![
        script(dir.path(), "exit 0"),
        script(dir.path(), "echo out of memory >&2; exit 3"),
        script(dir.path(), "kill -9 $$"),
    ];
    let program = gate();
    let mut batch = Batch::spawn(launch(&program, None), specs).unwrap();
    batch.release().unwrap();
    assert!(batch.wait_until(Instant::now() + Duration::from_secs(20)));
    let o = batch.finish(GRACE);
    assert!(o[0].succeeded());
    assert_eq!((o[1].code, o[1].signal, o[1].stopped), (Some(3), None, false));
    assert_eq!(o[1].stderr_tail, "out of memory\n");
    assert_eq!((o[2].code, o[2].signal), (None, Some(9)));
    assert!(!o[2].succeeded());
}

/// A real-time signal (nix's `Signal` names none of them) ends a replica like any other:
/// the gate reaps it and reports the signal's number, instead of losing the child.
#[test]
fn a_replica_ended_by_a_real_time_signal_is_reported_with_it() {
    let dir = tempfile::tempdir().unwrap();
    // Signal 40 is a real-time signal on Linux (32 to 64); its default action ends the process.
    let specs = vec![script(dir.path(), "kill -40 $$")];
    let program = gate();
    let mut batch = Batch::spawn(launch(&program, None), specs).unwrap();
    batch.release().unwrap();
    assert!(
        batch.wait_until(Instant::now() + Duration::from_secs(20)),
        "the gate never told the end"
    );
    let o = batch.finish(GRACE);
    assert_eq!((o[0].code, o[0].signal), (None, Some(40)), "{:?}", o[0]);
}

#[test]
fn a_command_or_directory_the_caller_cannot_use_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let program = gate();
    let mut spec = script(dir.path(), "");
    spec.command = vec!["gpushare-no-such-command".into()];
    let e = replicas::check(&launch(&program, None), spec.clone()).unwrap_err();
    assert_eq!(e, "command `gpushare-no-such-command`: not found (PATH=/usr/bin:/bin)");
    let e = Batch::spawn(launch(&program, None), vec![spec]).err().unwrap();
    assert!(e.contains("not found"), "{e}");
    let mut spec = script(dir.path(), "true");
    spec.cwd = dir.path().join("missing").display().to_string();
    let e = replicas::check(&launch(&program, None), spec).unwrap_err();
    assert!(e.starts_with("cwd ") && e.contains("No such file or directory"), "{e}");
    assert!(replicas::check(&launch(&program, None), script(dir.path(), "true")).is_ok());
}

/// The CPUs a process may run on, as `/proc/PID/status` lists them (`Cpus_allowed_list`).
fn allowed_cpus(pid: u32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap();
    CpuList::parse(line).unwrap().cpus().to_vec()
}

#[test]
fn each_replica_and_what_it_starts_run_on_its_own_cpus() {
    let dir = tempfile::tempdir().unwrap();
    let own = unix::cpu_affinity().unwrap();
    // Replica 0 on the first CPU, replica 1 on the last (the same one on a single CPU),
    // replica 2 unpinned.
    let sets = [Some(vec![own[0]]), Some(vec![*own.last().unwrap()]), None];
    let body = r#"sleep 30 & echo $! > "$DIR/child-$GPUSHARE_BENCH_REPLICA"; echo 1 >&3; wait"#;
    let specs = sets
        .iter()
        .map(|cpus| ReplicaSpec { cpus: cpus.clone(), ..script(dir.path(), body) })
        .collect();
    let program = gate();
    let mut batch = Batch::spawn(launch(&program, None), specs).unwrap();
    batch.release().unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while (0..3).any(|i| batch.unit_count(i) == 0) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    for (i, cpus) in sets.iter().enumerate() {
        let child: u32 = std::fs::read_to_string(dir.path().join(format!("child-{i}")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let expected = cpus.clone().unwrap_or_else(|| own.clone());
        for pid in batch.processes(i).into_iter().chain([child]) {
            assert_eq!(allowed_cpus(pid), expected, "replica {i}, process {pid}");
        }
    }
    let outcomes = batch.finish(GRACE);
    assert!(outcomes.iter().all(|o| o.problem.is_none()), "{outcomes:?}");
}

#[test]
fn cpus_the_caller_may_not_use_are_refused_before_anything_runs_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let program = gate();
    let own = unix::cpu_affinity().unwrap();
    let absent = ReplicaSpec { cpus: Some(vec![4000, 4001]), ..script(dir.path(), "touch ran") };
    let e = replicas::check(&launch(&program, None), absent.clone()).unwrap_err();
    assert!(e.starts_with("cpus 4000-4001: the replica cannot be pinned to them ("), "{e}");
    assert!(e.ends_with("; give --cpus others, or --no-pin"), "{e}");
    let e = Batch::spawn(launch(&program, None), vec![absent]).err().unwrap();
    assert!(e.starts_with("cpus 4000-4001"), "{e}");
    // Partly outside: the kernel would keep the rest; refused all the same.
    let partly = ReplicaSpec { cpus: Some(vec![own[0], 4000]), ..script(dir.path(), "touch ran") };
    let e = replicas::check(&launch(&program, None), partly).unwrap_err();
    assert!(e.contains(&format!("only {} of them may be used here", own[0])), "{e}");
    assert!(!dir.path().join("ran").exists());
    let fine = ReplicaSpec { cpus: Some(own.clone()), ..script(dir.path(), "true") };
    assert_eq!(replicas::check(&launch(&program, None), fine), Ok(()));
}

#[test]
fn numbers_on_stdout_are_told_at_once_and_once() {
    let dir = tempfile::tempdir().unwrap();
    // Units to stdout instead of descriptor 3, then more of them, never ending by itself.
    let body = r#"echo starting; echo 12.5; echo 13; while :; do sleep 1; done"#;
    let specs = vec![script(dir.path(), body), script(dir.path(), "echo 7 >&3; sleep 30")];
    let program = gate();
    let mut batch = Batch::spawn(launch(&program, None), specs).unwrap();
    batch.release().unwrap();
    // Both replicas heard from (on a busy machine the second may start well after the
    // first has printed), within a minute.
    let until = Instant::now() + Duration::from_secs(60);
    while (batch.stdout_number(0).is_none() || batch.unit_count(1) == 0) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(batch.stdout_number(0).as_deref(), Some("12.5"));
    assert_eq!(batch.stdout_number(1), None, "its number went to descriptor 3");
    assert_eq!(batch.stdout_number(7), None);
    let outcomes = batch.finish(GRACE);
    assert_eq!(outcomes[0].stdout_tail, "starting\n12.5\n13\n");
    assert_eq!(outcomes[1].units.count, 1);
}

#[test]
fn stopping_ends_each_replica_and_everything_it_started_even_in_other_sessions() {
    let dir = tempfile::tempdir().unwrap();
    // A child in the replica's group, and one that left it and its session (setsid), each
    // ignoring SIGTERM as the replica itself does.
    let body = r#"sleep 1000 & echo $! > "$DIR/child-$GPUSHARE_BENCH_REPLICA"
setsid sh -c 'trap "" TERM; echo $$ > "$DIR/escaped-$GPUSHARE_BENCH_REPLICA"; while :; do sleep 1; done' &
trap '' TERM; while :; do echo >&$GPUSHARE_BENCH_REPORT; sleep 0.01; done"#;
    let specs = (0..2).map(|_| script(dir.path(), body)).collect();
    let program = gate();
    let mut batch = Batch::spawn(launch(&program, None), specs).unwrap();
    batch.release().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let escaped = |i: usize| dir.path().join(format!("escaped-{i}"));
    while (batch.units().iter().any(|u| u.count < 3)
        || !escaped(0).exists()
        || !escaped(1).exists())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let o = batch.finish(Duration::from_millis(300));
    for r in &o {
        assert!(r.stopped && !r.succeeded(), "{r:?}");
        // It ignored SIGTERM: SIGKILL after the grace.
        assert_eq!(r.signal, Some(9), "{r:?}");
        assert!(r.units.count >= 3);
    }
    for i in 0..2 {
        for name in [format!("child-{i}"), format!("escaped-{i}")] {
            let text = std::fs::read_to_string(dir.path().join(&name)).unwrap();
            let pid: u32 = text.trim().parse().unwrap();
            assert!(gone(pid), "{name} ({pid}) outlived the stop");
        }
    }
}

#[test]
fn what_a_replica_leaves_behind_stops_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"setsid sh -c 'echo $$ > "$DIR/left"; exec sleep 1000' & sleep 0.2; exit 0"#;
    let program = gate();
    let mut batch = Batch::spawn(launch(&program, None), vec![script(dir.path(), body)]).unwrap();
    batch.release().unwrap();
    assert!(batch.wait_until(Instant::now() + Duration::from_secs(20)));
    let o = batch.finish(GRACE);
    assert!(o[0].succeeded(), "{o:?}");
    let pid: u32 =
        std::fs::read_to_string(dir.path().join("left")).unwrap().trim().parse().unwrap();
    assert!(gone(pid), "the left-over {pid} runs on");
}

#[test]
fn replicas_dropped_before_the_release_never_run_their_command() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"touch "$DIR/ran""#;
    let program = gate();
    let batch = Batch::spawn(launch(&program, None), vec![script(dir.path(), body)]).unwrap();
    drop(batch);
    std::thread::sleep(Duration::from_millis(200));
    assert!(!dir.path().join("ran").exists());
}

#[test]
fn output_beyond_the_cap_is_counted_not_written() {
    let dir = tempfile::tempdir().unwrap();
    // 3 MiB on stdout against a 1 MiB cap; the end is still the end.
    let body = r#"head -c 3145728 /dev/zero | tr '\0' x; echo; echo the end"#;
    let program = gate();
    let spec = logged(dir.path(), body, 0);
    let mut batch = Batch::spawn(launch(&program, None), vec![spec]).unwrap();
    batch.release().unwrap();
    assert!(batch.wait_until(Instant::now() + Duration::from_secs(20)));
    let o = batch.finish(GRACE);
    assert!(o[0].succeeded(), "{o:?}");
    assert_eq!(o[0].dropped_bytes, 3 * (1 << 20) + 1 + 8 - (1 << 20));
    assert!(o[0].stdout_tail.ends_with("the end\n"), "{:?}", o[0].stdout_tail);
    let log = std::fs::read_to_string(dir.path().join("run/replica-0.out")).unwrap();
    assert!(log.len() < (1 << 20) + 200, "{}", log.len());
    assert!(log.ends_with("more were dropped]\n"), "{}", &log[log.len() - 100..]);
}

#[test]
fn a_gate_whose_agent_goes_away_stops_its_replica() {
    let dir = tempfile::tempdir().unwrap();
    let (mut agent, gate_end) = UnixStream::pair().unwrap();
    let (_report_read, report_write) = unix::pipe().unwrap();
    let mut child = Command::new(gate())
        .arg("--bench-gate")
        .stdin(Stdio::from(OwnedFd::from(gate_end)))
        .stdout(Stdio::from(report_write))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let spec = Spec {
        check_only: false,
        argv: vec!["/bin/sh".into(), "-c".into(), "echo $$ > pid; exec sleep 1000".into()],
        env: Vec::new(),
        cwd: dir.path().display().to_string(),
        logs: None,
        cpus: None,
    };
    control::send(&mut agent, &ToGate::Spec(spec)).unwrap();
    let ready = control::receive::<FromGate>(&mut agent, control::FROM_GATE_MAX).unwrap();
    assert_eq!(ready, Some(FromGate::Ready));
    control::send(&mut agent, &ToGate::Go).unwrap();
    let running = control::receive::<FromGate>(&mut agent, control::FROM_GATE_MAX).unwrap();
    assert!(matches!(running, Some(FromGate::Running { .. })), "{running:?}");
    let pid_file = dir.path().join("pid");
    let until = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&pid_file).map_or(true, |t| !t.ends_with('\n')) {
        assert!(Instant::now() < until, "the replica did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    drop(agent);
    assert!(child.wait().unwrap().success());
    assert!(gone(pid), "the replica {pid} outlived its gate's agent");
}

/// Where [`replicas_run_as_exactly_the_identity_asked_for_without_a_terminal_or_privileges`]
/// writes the inheritable capabilities it ran with, when set.
const MARK_ENV: &str = "GPUSHARE_TEST_CAPS_MARK";

/// An agent started with an inheritable capability (a container's payload often is: leaving
/// root keeps that set) hands none of it to a replica: the test above, run again in a copy
/// of this test program holding one.
#[test]
fn an_inheritable_capability_of_the_agent_reaches_no_replica() {
    if !unix::is_root() {
        gpushare_test_skip::skip("changing identity needs root");
        return;
    }
    // CAP_NET_RAW (bit 13) can be made inheritable only where the bounding set keeps it
    // (podman's default set does not), and only with util-linux's setpriv.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let bounding = status.lines().find_map(|l| l.strip_prefix("CapBnd:")).unwrap_or("0");
    if u64::from_str_radix(bounding.trim(), 16).unwrap_or(0) & (1 << 13) == 0 {
        gpushare_test_skip::skip("CAP_NET_RAW is not in this process's bounding set");
        return;
    }
    if std::process::Command::new("setpriv").arg("--version").output().is_err() {
        gpushare_test_skip::skip("no setpriv (util-linux) to start a copy with a capability");
        return;
    }
    let mark = tempfile::NamedTempFile::new().unwrap();
    let out = std::process::Command::new("setpriv")
        .arg("--inh-caps=+net_raw")
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "replicas_run_as_exactly_the_identity_asked_for_without_a_terminal_or_privileges",
        ])
        .env(MARK_ENV, mark.path())
        .output()
        .expect("setpriv runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    // The test ran in the copy, which held the capability (CAP_NET_RAW, bit 13), beside
    // any this process holds already (a container's payload may hold them all).
    let held = std::fs::read_to_string(mark.path()).unwrap();
    let held = u64::from_str_radix(held.trim(), 16).unwrap_or_else(|e| panic!("{held:?}: {e}"));
    assert_ne!(held & (1 << 13), 0, "CapInh {held:016x} lacks CAP_NET_RAW\n{text}");
}

#[test]
fn replicas_run_as_exactly_the_identity_asked_for_without_a_terminal_or_privileges() {
    if !unix::is_root() {
        gpushare_test_skip::skip("changing identity needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // nobody, with group 4 (adm) alone beside its own: not what its passwd entry says.
    let nobody = Identity::of_caller(65534, Some(&[4])).expect("user nobody (65534)");
    let body = r#"id -u; id -g; id -G; echo $GPUSHARE_BENCH_REPORT
grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status | awk '{print $2}' | sort -u
awk '{print $7}' /proc/self/stat
ls /proc/self/fd"#;
    let program = gate();
    let mut batch =
        Batch::spawn(launch(&program, Some(&nobody)), vec![script(dir.path(), body)]).unwrap();
    batch.release().unwrap();
    assert!(batch.wait_until(Instant::now() + Duration::from_secs(20)));
    let o = batch.finish(GRACE);
    assert!(o[0].succeeded(), "{o:?}");
    let lines: Vec<&str> = o[0].stdout_tail.lines().collect();
    assert_eq!(lines[0], "65534");
    assert_eq!(lines[1], nobody.gid.to_string());
    assert_eq!(lines[2], format!("{} 4", nobody.gid), "exactly these groups");
    assert_eq!(lines[3], "3");
    assert_eq!(lines[4], "0000000000000000", "no capability of any kind");
    if let Some(mark) = std::env::var_os(MARK_ENV) {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let held = status.lines().find_map(|l| l.strip_prefix("CapInh:")).unwrap();
        std::fs::write(mark, held.trim()).unwrap();
    }
    assert_eq!(lines[5], "0", "no controlling terminal");
    // 0-2, the report, and `ls`'s own directory: nothing of the agent's or the gate's.
    assert_eq!(lines[6..], ["0", "1", "2", "3", "4"], "{lines:?}");
    // What nobody may not enter is refused as nobody sees it.
    let mut spec = script(dir.path(), "true");
    spec.cwd = "/root".into();
    let e = replicas::check(&launch(&program, Some(&nobody)), spec).unwrap_err();
    assert_eq!(e, "cwd /root: Permission denied (os error 13)");
}

#[test]
fn output_goes_only_into_a_directory_of_the_callers_and_into_files_made_anew() {
    use std::os::unix::fs::PermissionsExt;
    let program = gate();
    // A log directory others may write in is refused, as the check would.
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = replicas::check(&launch(&program, None), logged(shared.path(), "true", 0)).unwrap_err();
    assert!(e.contains("others may write in the directory (mode 777)"), "{e}");
    // A name prepared in the run's directory (a link to somewhere else) is replaced, and
    // what it pointed to is untouched.
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("elsewhere");
    std::fs::write(&elsewhere, "untouched\n").unwrap();
    std::fs::create_dir(dir.path().join("run")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dir.path().join("run/replica-0.out")).unwrap();
    let spec = logged(dir.path(), "echo written by the replica", 0);
    let mut batch = Batch::spawn(launch(&program, None), vec![spec]).unwrap();
    batch.release().unwrap();
    assert!(batch.wait_until(Instant::now() + Duration::from_secs(20)));
    assert!(batch.finish(GRACE)[0].succeeded());
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "untouched\n");
    let log = dir.path().join("run/replica-0.out");
    assert!(std::fs::symlink_metadata(&log).unwrap().file_type().is_file());
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "written by the replica\n");
}

#[test]
fn a_replica_whose_gate_was_killed_does_not_run_on() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"echo $$ > "$DIR/pid"; echo >&3; exec sleep 1000"#;
    let program = gate();
    let mut batch = Batch::spawn(launch(&program, None), vec![script(dir.path(), body)]).unwrap();
    let Some(gpushare_agent::apply::journal::ReplicaHandle::Session { pid: gate, .. }) =
        batch.handles().first().cloned()
    else {
        panic!("no session handle: {:?}", batch.handles());
    };
    batch.release().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(dir.path().join("pid")).map_or(true, |t| !t.ends_with('\n')) {
        assert!(Instant::now() < until, "the replica did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    let replica: u32 =
        std::fs::read_to_string(dir.path().join("pid")).unwrap().trim().parse().unwrap();
    // The user kills their own gate.
    unix::signal(gate, unix::Signal::SIGKILL).unwrap();
    let o = batch.finish(GRACE);
    assert!(o[0].problem.is_some(), "{o:?}");
    assert!(gone(replica), "the replica {replica} ran on after its gate was killed");
}

#[test]
fn recovery_leaves_a_session_whose_leader_is_not_the_recorded_gate() {
    use gpushare_agent::apply::journal::ReplicaHandle;
    // A process in a session of its own, standing in for a new process that got the pid
    // of a gate an earlier agent recorded.
    let mut stranger = Command::new("setsid").args(["sleep", "30"]).spawn().unwrap();
    let pid = stranger.id();
    let until = Instant::now() + Duration::from_secs(5);
    while procfs::session(pid) != Some(pid) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let started = procfs::start_time(pid).unwrap();
    let uid = unix::effective_uid();
    let old = ReplicaHandle::Session { pid, start_time: started.saturating_sub(1) };
    assert_eq!(Launcher::Direct.stop_left_over(&[old], uid), 0);
    assert!(procfs::alive(pid), "a session that is not the gate's was killed");
    // The recorded gate itself (same start) is stopped, its session with it.
    let same = ReplicaHandle::Session { pid, start_time: started };
    assert_eq!(Launcher::Direct.stop_left_over(&[same], uid), 1);
    let _ = stranger.wait();
    assert!(!procfs::alive(pid));
}
