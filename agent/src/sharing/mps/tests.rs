//! Tests of the MPS controller: records, pid files, units, answers of the control daemon.

use super::limits::ps_client_pids;
use super::*;
use crate::node::{LimitOverride, MpsLimits};

#[test]
fn pinned_limits_read_back_as_the_daemon_rounds_them() {
    assert!(pinned_limit_reads_back(2 << 30, "2G"));
    assert!(pinned_limit_reads_back(512 << 20, "512M"));
    // Answers of the real daemon on an H100 (tests/device/results, issue 12).
    assert!(pinned_limit_reads_back(81559 << 20, "79G"));
    assert!(pinned_limit_reads_back(20389 << 20, "19G"));
    assert!(!pinned_limit_reads_back(20389 << 20, "20G"));
    assert!(!pinned_limit_reads_back(2 << 30, "1G"));
    assert!(!pinned_limit_reads_back(2 << 30, ""));
    assert!(!pinned_limit_reads_back(2 << 30, "No default pinned memory limit set"));
}

#[test]
fn percentages_read_back_as_the_daemon_prints_them() {
    assert_eq!(parse_percentage("25.0"), Some(25));
    assert_eq!(parse_percentage("100.0"), Some(100));
    assert_eq!(parse_percentage("12.5"), None);
    assert_eq!(parse_percentage(""), None);
}

#[test]
fn an_exit_is_seen_when_it_happens_and_a_timeout_is_kept() {
    let mut quick = std::process::Command::new("sleep").arg("0.1").spawn().unwrap();
    let started = Instant::now();
    assert!(wait_for_exit(quick.id(), unix::pidfd_open(quick.id()), Duration::from_secs(5)));
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    quick.wait().unwrap();
    let mut slow = std::process::Command::new("sleep").arg("5").spawn().unwrap();
    let started = Instant::now();
    let pidfd = unix::pidfd_open(slow.id());
    assert!(!wait_for_exit(slow.id(), pidfd, Duration::from_millis(100)));
    assert!(started.elapsed() >= Duration::from_millis(100));
    slow.kill().unwrap();
    slow.wait().unwrap();
}

#[test]
fn units_are_named_by_the_uuid_and_odd_ones_refused() {
    assert_eq!(
        unit_name("GPU-cc30f0e5-9f43-576f-a1b2-0123456789ab").as_deref(),
        Some("gpushare-mps@GPU-cc30f0e5-9f43-576f-a1b2-0123456789ab.service")
    );
    assert_eq!(unit_name(""), None);
    assert_eq!(unit_name("GPU-a/b"), None);
    assert_eq!(unit_name("GPU a"), None);
}

#[test]
fn the_environment_file_quotes_as_systemd_reads_it() {
    use std::ffi::OsStr;
    let text = environment_file(&[
        ("GPUSHARE_MPS_CONTROL", OsStr::new("/usr/bin/nvidia-cuda-mps-control")),
        ("ODD", OsStr::new(r#"a "b" \ $c `d`"#)),
    ])
    .unwrap();
    assert_eq!(
        text,
        "GPUSHARE_MPS_CONTROL=\"/usr/bin/nvidia-cuda-mps-control\"\n\
         ODD=\"a \\\"b\\\" \\\\ \\$c \\`d\\`\"\n"
    );
    assert_eq!(environment_file(&[("A", OsStr::new("x\ny"))]), None);
}

#[test]
fn the_unit_launch_needs_a_systemd_service_and_the_packaged_root() {
    // Tests do not run as a systemd service with /run/gpushare/mps as their root.
    let (launch, why) = MpsLaunch::detect(Path::new("/tmp/elsewhere"));
    assert_eq!(launch, MpsLaunch::Direct);
    assert!(!why.is_empty());
}

#[test]
fn clients_are_read_from_ps_as_the_real_h100_printed_it() {
    let lines = [
        "PID       ID        SERVER         DEVICE                    NAMESPACE      COMMAND",
        "438       1         441            GPU-cc30f0e5-9f43-576f    4026531836     python3",
        "512       2         441            GPU-cc30f0e5-9f43-576f    4026531836     python3",
    ]
    .map(String::from);
    assert_eq!(ps_client_pids(&lines), [438, 512]);
    assert!(ps_client_pids(&[]).is_empty());
}

/// A controller on `root` whose control tool does not exist.
fn controller_without_tool(root: &Path) -> MpsController {
    MpsController::new(MpsConfig {
        control: PathBuf::from("/nonexistent/nvidia-cuda-mps-control"),
        root: root.to_path_buf(),
        launch: MpsLaunch::Direct,
    })
}

/// The record of a server on whole GPU `gpu` (`GPU-abc`, 25 % threads) whose daemon is
/// process `pid`.
fn whole_gpu_record(gpu: u32, pid: u32) -> ServerRecord {
    ServerRecord {
        uuid: "GPU-abc".into(),
        gpu,
        placement_start: None,
        compute_instance: 0,
        limits: MpsLimits { active_thread_percentage: 25, pinned_memory_limit_bytes: None },
        multi_user: false,
        restarts: 0,
        overrides: Vec::new(),
        daemon: DaemonIdentity::of(pid),
    }
}

#[test]
fn servers_are_found_from_their_records() {
    let dir = tempfile::tempdir().unwrap();
    let mps = controller_without_tool(dir.path());
    // This test process stands for the daemon the agent started.
    let record = whole_gpu_record(1, std::process::id());
    std::fs::create_dir_all(mps.pipe_dir("GPU-abc")).unwrap();
    write_json(&mps.server_dir("GPU-abc").join("server.json"), &record, PRIVATE).unwrap();
    // Whatever the world-writable pid file says is not read.
    std::fs::write(mps.pipe_dir("GPU-abc").join(PID_FILE), "1").unwrap();
    let found = mps.daemons();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].record, record);
    assert_eq!(found[0].pid, Some(std::process::id()));
    let e = mps.start(&record).unwrap_err();
    assert!(e.to_string().contains("already runs"), "{e}");
    let e = mps.command("GPU-abc", "get_server_list").unwrap_err();
    assert!(e.to_string().contains("cannot run /nonexistent/nvidia-cuda-mps-control"), "{e}");
    // A record whose daemon is gone (another process now has its pid, or none does)
    // has no daemon, whatever the pid file says.
    let gone = ServerRecord {
        daemon: Some(DaemonIdentity { pid: std::process::id(), start_time: 1 }),
        ..record.clone()
    };
    write_json(&mps.server_dir("GPU-abc").join("server.json"), &gone, PRIVATE).unwrap();
    std::fs::write(mps.pipe_dir("GPU-abc").join(PID_FILE), std::process::id().to_string()).unwrap();
    assert_eq!(mps.daemons()[0].pid, None);
}

#[test]
fn records_under_a_root_others_may_write_are_ignored_and_never_acted_on() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mps = controller_without_tool(&root);
    // A record someone forged there, naming a process that is not a daemon.
    let mut victim = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let record = whole_gpu_record(0, victim.id());
    std::fs::create_dir_all(mps.pipe_dir("GPU-abc")).unwrap();
    let file = mps.server_dir("GPU-abc").join("server.json");
    std::fs::write(&file, serde_json::to_vec(&record).unwrap()).unwrap();
    assert!(mps.daemons().is_empty());
    assert_eq!(mps.running_identity("GPU-abc"), None);
    let e = mps.stop("GPU-abc").unwrap_err().to_string();
    assert!(e.contains("writable by others") && e.contains("[mps] root"), "{e}");
    let e = mps.start(&record).unwrap_err().to_string();
    assert!(e.contains("writable by others") && e.contains("[mps] root"), "{e}");
    assert!(file.exists(), "another user's files were removed");
    assert!(victim.try_wait().unwrap().is_none(), "the process the record named was signalled");
    victim.kill().unwrap();
    victim.wait().unwrap();
}

#[test]
fn a_pid_file_alone_names_only_a_process_of_this_pipe_directory() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = dir.path().join("pipe");
    std::fs::create_dir(&pipe).unwrap();
    // A "daemon" of this user started for that pipe directory; the same program not
    // started for it; another program started for it.
    let daemon = dir.path().join("nvidia-cuda-mps-control");
    let sleep = find_program(Path::new("sleep")).unwrap();
    std::fs::copy(&sleep, &daemon).unwrap();
    let spawn = |program: &Path, env: bool| {
        let mut cmd = std::process::Command::new(program);
        if env {
            cmd.env("CUDA_MPS_PIPE_DIRECTORY", &pipe);
        }
        cmd.arg("30");
        // A copy just written may be open for writing in a child another test forks
        // meanwhile (ETXTBSY) for a moment.
        loop {
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ETXTBSY as i32) => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                started => break started.unwrap(),
            }
        }
    };
    let mut ours = spawn(&daemon, true);
    let mut other = spawn(&daemon, false);
    let mut not_a_daemon = spawn(&sleep, true);
    for stranger in [&other, &not_a_daemon] {
        std::fs::write(pipe.join(PID_FILE), stranger.id().to_string()).unwrap();
        assert_eq!(legacy_daemon(&pipe), None);
    }
    std::fs::write(pipe.join(PID_FILE), ours.id().to_string()).unwrap();
    assert_eq!(legacy_daemon(&pipe).map(|d| d.pid), Some(ours.id()));
    for child in [&mut ours, &mut other, &mut not_a_daemon] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

#[test]
fn a_servers_overrides_are_one_that_holds_every_limit_set() {
    let dir = tempfile::tempdir().unwrap();
    let mps = controller_without_tool(dir.path());
    let record = whole_gpu_record(1, std::process::id());
    std::fs::create_dir_all(mps.pipe_dir("GPU-abc")).unwrap();
    write_json(&mps.server_dir("GPU-abc").join("server.json"), &record, PRIVATE).unwrap();
    let made = |threads: Option<u32>, memory: Option<u64>, at| LimitOverride {
        server_pid: 4242,
        active_thread_percentage: threads,
        pinned_memory_limit_bytes: memory,
        by_uid: Some(0),
        at_unix_seconds: at,
    };
    // Threads, then memory, on the same server; then threads on another, which is gone.
    mps.record_override("GPU-abc", made(Some(50), None, 1), &[4242]).unwrap();
    mps.record_override("GPU-abc", made(None, Some(4 << 30), 2), &[4242]).unwrap();
    let overrides = &mps.daemons()[0].record.overrides;
    assert_eq!(overrides.as_slice(), [made(Some(50), Some(4 << 30), 2)]);
    let other = LimitOverride { server_pid: 4343, ..made(Some(10), None, 3) };
    mps.record_override("GPU-abc", other, &[4343]).unwrap();
    assert_eq!(mps.daemons()[0].record.overrides, [other]);
}

#[test]
fn a_root_too_long_for_the_control_socket_is_refused_with_its_limit() {
    let fits = std::path::PathBuf::from(format!("/{}", "r".repeat(52)));
    assert_eq!(check_root(&fits, "[mps] root"), Ok(()));
    let long = std::path::PathBuf::from(format!("/{}", "r".repeat(53)));
    let e = check_root(&long, "[mps] root").unwrap_err();
    assert!(e.contains("([mps] root) is 1 bytes too long") && e.contains("108 bytes"), "{e}");
    // The longest server directory a MIG device's UUID makes, with its socket, fits the
    // longest root allowed exactly.
    let socket = fits.join(format!("MIG-{}", "0".repeat(36))).join("pipe/control");
    assert_eq!(socket.as_os_str().len(), 107);
}
