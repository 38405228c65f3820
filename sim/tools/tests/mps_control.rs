//! The simulated nvidia-cuda-mps-control as a process: `--fake-client` takes only a
//! running process, and a client whose process ends leaves the server's lists by itself.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod smi;
use smi::text;

const MPS_CONTROL: &str = env!("CARGO_BIN_EXE_gpushare-sim-nvidia-cuda-mps-control");

/// The tool with `args` (and `input` on stdin) on pipe directory `pipe`, recording to
/// `record`, without a simulated node.
fn mps_control(pipe: &Path, record: &Path, args: &[&str], input: &str) -> Output {
    let mut child = Command::new(MPS_CONTROL)
        .args(args)
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", pipe.with_extension("log"))
        .env("GPUSHARE_SIM_RECORD", record)
        .env_remove("GPUSHARE_SIM_STATE")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn a_fake_client_that_is_no_process_is_refused_before_the_daemon_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (pipe, record) = (dir.path().join("pipe"), dir.path().join("record"));
    // Above the largest pid_max Linux allows (2^22): never a process.
    let out = mps_control(&pipe, &record, &["--fake-client", "4194305", "--memory", "1GiB"], "");
    assert_eq!(
        text(&out),
        (
            Some(1),
            String::new(),
            "simulated nvidia-cuda-mps-control: no process 4194305: a simulated MPS client must \
             be a running process\n"
                .to_string()
        )
    );
    assert!(!record.exists(), "the daemon was not asked");
    // A running process gets as far as the daemon (here: none).
    let me = std::process::id().to_string();
    let (code, out, err) = text(&mps_control(&pipe, &record, &["--fake-client", &me], ""));
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (Some(1), "Cannot find MPS control daemon process\n", "")
    );
    let record = std::fs::read_to_string(&record).unwrap();
    assert_eq!(record, format!("mps-control pipe={} error=no-daemon\n", pipe.display()));
}

#[test]
fn a_client_whose_process_is_killed_leaves_the_servers_lists() {
    let dir = tempfile::tempdir().unwrap();
    let (pipe, record) = (dir.path().join("pipe"), dir.path().join("record"));
    let ask = |input: &str| text(&mps_control(&pipe, &record, &[], input));
    assert_eq!(text(&mps_control(&pipe, &record, &["-d"], "")).0, Some(0));
    let daemon: u32 =
        std::fs::read_to_string(pipe.join("nvidia-cuda-mps-control.pid")).unwrap().parse().unwrap();
    let server = daemon + 1;

    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let client = child.id().to_string();
    let connected = mps_control(&pipe, &record, &["--fake-client", &client], "");
    assert_eq!(text(&connected).0, Some(0), "{:?}", text(&connected));
    assert_eq!(ask(&format!("get_client_list {server}\n")).1, format!("{client}\n"));

    // Killed, and no `--fake-client-exit`: gone from every list, at once.
    child.kill().unwrap();
    child.wait().unwrap();
    let (code, out, _) =
        ask(&format!("get_client_list {server}\nget_device_client_list\nps\nget_server_list\n"));
    assert_eq!((code, out), (Some(0), format!("{server}\n")), "the server stays");

    let (code, _, _) = ask("quit\n");
    assert_eq!(code, Some(0));
    let deadline = Instant::now() + Duration::from_secs(5);
    while pipe.join("control").exists() {
        assert!(Instant::now() < deadline, "the daemon did not quit");
        std::thread::sleep(Duration::from_millis(10));
    }
}
