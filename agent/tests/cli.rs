//! The `gpushare-agent` binary's command line. (Being an integration test of this
//! package, it also makes `cargo test --workspace` build the binary that the end-to-end
//! tests under `tests/` run.)

use std::process::Command;

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpushare-agent"))
}

#[test]
fn help_names_the_options() {
    let out = agent().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for option in ["--simulate", "--bus", "--config", "--state-dir", "--check-catalog"] {
        assert!(help.contains(option), "{option} missing from --help:\n{help}");
    }
}

/// Runs the agent with `args` on a bus that is not there and a fresh state directory;
/// it must fail, and its stderr is returned.
fn failing_start(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = agent()
        .args(args)
        .args(["--config", "/dev/null", "--bus", "unix:path=/nonexistent"])
        .arg("--state-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_bad_simulation_spec_is_one_line() {
    let err = failing_start(&["--simulate", "v100:2"]);
    assert!(err.contains("unknown GPU model \"v100\""), "{err}");
}

#[test]
fn without_a_driver_the_nvml_backend_says_how_to_try_it() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        gpushare_test_skip::skip("a GPU host: the NVML backend would start");
        return;
    }
    // A bus that is there (the agent asks for one before it loads a driver): a private
    // dbus-daemon, stopped when the test ends.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bus");
    let address = format!("unix:path={}", socket.display());
    let Ok(mut bus) = Command::new("dbus-daemon")
        .args(["--session", "--nofork", "--nopidfile", "--address", &address])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    else {
        gpushare_test_skip::skip("no dbus-daemon to give the agent a bus");
        return;
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !socket.exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = agent()
        .args(["--config", "/dev/null", "--bus", &address, "--state-dir"])
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    let _ = bus.kill();
    let _ = bus.wait();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--simulate a100-40gb:8"), "{err}");
}
