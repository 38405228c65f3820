//! The bench's replica runner with the real gate (`gpushare-agent --bench-gate`) and small
//! shell scripts as replicas: no GPU needed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpushare_agent::bench::replicas::{Batch, ReplicaSpec};
use gpushare_agent::sys::procfs;
use gpushare_agent::sys::unix::{self, Identity};

fn gate() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpushare-agent"))
}

fn script(dir: &Path, body: &str) -> ReplicaSpec {
    ReplicaSpec {
        command: ["/bin/sh", "-c", body].iter().map(OsString::from).collect(),
        env: vec![
            ("CUDA_VISIBLE_DEVICES".into(), "GPU-test".into()),
            ("DIR".into(), dir.display().to_string()),
        ],
        clear_env: false,
        cwd: None,
        identity: None,
        log_dir: dir.to_path_buf(),
    }
}

const GRACE: Duration = Duration::from_secs(2);

#[test]
fn units_by_line_are_counted_exactly_and_replicas_see_their_environment() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"echo "$GPUSHARE_BENCH_REPLICA/$GPUSHARE_BENCH_REPLICAS $CUDA_VISIBLE_DEVICES"
i=0
while [ $i -lt $((GPUSHARE_BENCH_REPLICA + 5)) ]; do echo 1.5 >&$GPUSHARE_BENCH_REPORT; i=$((i+1)); done
echo >&$GPUSHARE_BENCH_REPORT
echo not-a-number >&$GPUSHARE_BENCH_REPORT"#;
    let specs = (0..3).map(|_| script(dir.path(), body)).collect();
    let mut batch = Batch::spawn(&gate(), specs).unwrap();
    batch.release().unwrap();
    assert!(batch.wait_until(Instant::now() + Duration::from_secs(20)));
    let outcomes = batch.finish(GRACE);
    for (i, o) in outcomes.iter().enumerate() {
        assert!(o.succeeded(), "{o:?}");
        assert_eq!(o.units.count, i as u64 + 6, "{o:?}");
        assert_eq!(o.units.latencies_ms, vec![1.5; i + 5]);
        assert_eq!(o.units.malformed, 1);
        assert_eq!(o.units.first_malformed.as_deref(), Some("not-a-number"));
        let out = std::fs::read_to_string(&o.stdout).unwrap();
        assert_eq!(out, format!("{i}/3 GPU-test\n"));
    }
}

#[test]
fn nothing_runs_before_the_release_and_all_start_together() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"date +%s%N > "$DIR/started-$GPUSHARE_BENCH_REPLICA""#;
    let specs = (0..4).map(|_| script(dir.path(), body)).collect();
    let mut batch = Batch::spawn(&gate(), specs).unwrap();
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
    let mut batch = Batch::spawn(&gate(), specs).unwrap();
    batch.release().unwrap();
    assert!(batch.wait_until(Instant::now() + Duration::from_secs(20)));
    let o = batch.finish(GRACE);
    assert!(o[0].succeeded());
    assert_eq!((o[1].code, o[1].signal, o[1].stopped), (Some(3), None, false));
    assert_eq!(std::fs::read_to_string(&o[1].stderr).unwrap(), "out of memory\n");
    assert_eq!((o[2].code, o[2].signal), (None, Some(9)));
    assert!(!o[2].succeeded());
}

#[test]
fn a_missing_command_fails_its_replica_with_127() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = script(dir.path(), "");
    spec.command = vec!["/nonexistent/gpushare-bench-command".into()];
    let mut batch = Batch::spawn(&gate(), vec![spec]).unwrap();
    batch.release().unwrap();
    assert!(batch.wait_until(Instant::now() + Duration::from_secs(20)));
    let o = batch.finish(GRACE);
    assert_eq!(o[0].code, Some(127));
    assert!(std::fs::read_to_string(&o[0].stderr).unwrap().contains("cannot run"));
}

#[test]
fn stopping_ends_each_replica_and_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"sleep 1000 & echo $! > "$DIR/child-$GPUSHARE_BENCH_REPLICA"; trap '' TERM; while :; do echo >&$GPUSHARE_BENCH_REPORT; sleep 0.01; done"#;
    let specs = (0..2).map(|_| script(dir.path(), body)).collect();
    let mut batch = Batch::spawn(&gate(), specs).unwrap();
    batch.release().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while batch.units().iter().any(|u| u.count < 3) && Instant::now() < deadline {
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
        let text = std::fs::read_to_string(dir.path().join(format!("child-{i}"))).unwrap();
        let pid: u32 = text.trim().parse().unwrap();
        let gone = Instant::now() + Duration::from_secs(5);
        while procfs::alive(pid) && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!procfs::alive(pid), "the replica's child {pid} outlived the stop");
    }
}

#[test]
fn replicas_dropped_before_the_release_never_run_their_command() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"touch "$DIR/ran""#;
    let batch = Batch::spawn(&gate(), vec![script(dir.path(), body)]).unwrap();
    let pid = batch.pids()[0];
    drop(batch);
    assert!(!procfs::alive(pid));
    assert!(!dir.path().join("ran").exists());
}

#[test]
fn replicas_run_as_the_identity_asked_for() {
    if !unix::is_root() {
        eprintln!("skipped: changing identity needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nobody = Identity::of_user(65534).expect("user nobody (65534)");
    let mut spec =
        script(dir.path(), "id -u; id -g; echo $GPUSHARE_BENCH_REPORT; ls /proc/self/fd");
    spec.identity = Some(nobody.clone());
    // What any child of this test inherits (cargo's jobserver, say), plus `ls`'s own.
    let baseline = std::process::Command::new("ls").arg("/proc/self/fd").output().unwrap();
    let baseline = String::from_utf8(baseline.stdout).unwrap();
    let mut batch = Batch::spawn(&gate(), vec![spec]).unwrap();
    batch.release().unwrap();
    assert!(batch.wait_until(Instant::now() + Duration::from_secs(20)));
    let o = batch.finish(GRACE);
    assert!(o[0].succeeded(), "{o:?} {}", std::fs::read_to_string(&o[0].stderr).unwrap());
    let out = std::fs::read_to_string(&o[0].stdout).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "65534");
    assert_eq!(lines[1], nobody.gid.to_string());
    // The replica holds what any child holds, and its report descriptor: not the gate.
    assert_eq!(lines[2], "3");
    let fds: Vec<&str> = lines[3..].to_vec();
    // One more than a plain child: the report (`ls`'s own directory moves from 3 to 4).
    assert!(
        fds.contains(&"3") && fds.len() == baseline.lines().count() + 1,
        "descriptors: {fds:?}, a plain child has {baseline:?}"
    );
}
