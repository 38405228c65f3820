//! What the agent itself says about its state, and that it stays the one agent on its
//! bus: issue 10's hands-off configuration, bus-name ownership, status after a failed
//! start-up or rollback, and the job's end as status sees it.

use std::process::{Command, Stdio};
use std::time::Duration;

use gpushare_proto::types::{JobOutcome, ProfileDetail, ProfileList};
use gpushare_tests::{
    Agent, AgentOptions, SIM_NVIDIA_SMI, SIM_NVIDIA_SMI_ENV, binary, ctl_error, stdout, temp_file,
    text,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A second agent on the same bus (its own state directory) is refused the name and
/// exits; the first keeps it and answers.
#[test]
fn a_second_agent_does_not_take_the_bus_name() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let other = tempfile::tempdir().unwrap();
    let second = Command::new(binary("gpushare-agent", "GPUSHARE_AGENT_BIN"))
        .args(["--simulate", "h100-80gb:1", "--bus", agent.bus.address()])
        .arg("--state-dir")
        .arg(other.path().join("state"))
        .arg("--config")
        .arg(other.path().join("absent.toml"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_with_timeout(second, Duration::from_secs(15));
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("already owned"), "{stderr}");
    // The first agent still answers for the name: its two A100s, not the second's H100.
    let status = agent.status();
    assert_eq!(status.gpus.len(), 2);
    assert_eq!(status.gpus[0].model, "A100-SXM4-40GB");
}

/// An agent that loses its bus (the bus daemon goes away) does not run on unreachable:
/// it stops, with an error.
#[test]
fn an_agent_that_loses_its_bus_stops_loudly() {
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    agent.bus.stop();
    let exit = agent.wait_exit(Duration::from_secs(15)).expect("the agent stops");
    assert!(!exit.success(), "{exit:?}");
}

fn wait_with_timeout(mut child: std::process::Child, timeout: Duration) -> std::process::Output {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    panic!("the second agent was still running after {timeout:?}: {}", text(&out));
}

/// An agent.toml that does not read makes the agent hands-off for every kind of change,
/// not MIG alone; status says why.
#[test]
fn a_malformed_configuration_stops_every_change_and_status_says_why() {
    // The simulated nvidia-smi is what a host's PATH would find: a change would reach it.
    let tools = tempfile::tempdir().unwrap();
    let sim_smi = binary(SIM_NVIDIA_SMI, SIM_NVIDIA_SMI_ENV);
    std::os::unix::fs::symlink(sim_smi, tools.path().join("nvidia-smi")).unwrap();
    let path = format!("{}:{}", tools.path().display(), std::env::var("PATH").unwrap());
    let agent = Agent::start(
        AgentOptions::simulate("a100-40gb:2")
            .config("[apply]\nmax_parallel_gpus = -1\n")
            .env("PATH", &path),
    );
    for profile in ["all-time-sliced", "all-mps", "all-balanced"] {
        let out = agent.ctl(&["apply", profile, "--json"]);
        assert!(!out.status.success(), "{profile}: {}", text(&out));
        let error = ctl_error(&out);
        assert!(error.message.contains("changes nothing on the GPUs"), "{profile}: {error:?}");
        assert!(error.message.contains("agent.toml:2:"), "names the place: {error:?}");
        assert!(!error.message.contains("manage_mig"), "{error:?}");
    }
    assert!(!agent.sim_record().contains("set-timeslice"), "{}", agent.sim_record());
    assert!(agent.mps_servers().is_empty());
    let status = agent.status();
    let why = status.hands_off.expect("status says the agent is hands-off");
    assert!(why.contains("agent.toml:2:"), "{why}");
    let human = agent.ctl(&["status"]);
    assert!(stdout(&human).contains("Hands-off (no GPU changes): "), "{}", text(&human));
}

/// The active profile's time-slicing shows in status also when it was applied from a
/// file; and a file named like a known profile is not that profile.
#[test]
fn status_shows_what_a_profile_applied_from_a_file_did() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let (_dir, file) = temp_file(
        "ts-short.toml",
        "[[gpu]]\nselect = \"all\"\nsharing = { time-slicing = { interval = \"short\" } }\n",
    );
    let out = agent.ctl(&["apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let status = agent.status();
    assert_eq!(status.active_profile.as_deref(), Some("ts-short"));
    assert_eq!(status.active_source.as_deref(), file.to_str());
    for gpu in &status.gpus {
        assert_eq!(gpu.sharing.strategy, "time-slicing", "{gpu:?}");
        assert_eq!(gpu.sharing.interval.as_deref(), Some("short"), "{gpu:?}");
    }

    let (_dir, file) = temp_file("all-balanced.toml", "[[gpu]]\nselect = \"all\"\n");
    assert!(agent.ctl(&["apply", "-f", file.to_str().unwrap()]).status.success());
    let status = agent.status();
    assert_eq!(status.active_profile.as_deref(), Some("all-balanced"));
    assert_eq!(status.active_source.as_deref(), file.to_str());
    let human = stdout(&agent.ctl(&["status"]));
    assert!(human.contains(&format!("all-balanced, from {}", file.display())), "{human}");
    let list: ProfileList = agent.ctl_doc(&["profiles"]);
    let built_in = list.profiles.iter().find(|p| p.name == "all-balanced").unwrap();
    assert!(!built_in.active, "the built-in is not what was applied: {built_in:?}");
    let detail: ProfileDetail = agent.ctl_doc(&["profiles", "show", "all-balanced"]);
    assert!(!detail.summary.active);
}

/// A start-up re-apply that fails shows in status until an apply succeeds.
#[test]
fn a_failed_start_up_re_apply_shows_in_status() {
    let custom = "[[gpu]]\nselect = \"all\"\nmig = { \"3g\" = 2 }\n";
    let mut agent =
        Agent::start(AgentOptions::simulate("a100-40gb:2").profile("custom.toml", custom));
    assert!(agent.ctl(&["apply", "custom"]).status.success());
    std::fs::remove_file(agent.dir.path().join("profiles.d/custom.toml")).unwrap();
    agent.restart_with_env(&[("GPUSHARE_SIM_REBOOT", "1")]);
    let status = agent.status();
    let error = status.start_up_error.expect("status shows the failed re-apply");
    assert!(error.contains("unknown profile \"custom\""), "{error}");
    assert_eq!(status.active_source.as_deref(), Some("no longer known"));
    let human = stdout(&agent.ctl(&["status"]));
    assert!(human.contains("Start-up re-apply failed: unknown profile \"custom\""), "{human}");
    // A successful apply settles it.
    assert!(agent.ctl(&["apply", "all-disabled"]).status.success());
    assert_eq!(agent.status().start_up_error, None);
}

/// The apply after a failed rollback first finishes that rollback, and says so: it does
/// not report "nothing changed" while it repaired the GPUs.
#[test]
fn an_apply_that_repairs_a_failed_rollback_says_what_it_repaired() {
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    assert!(agent.ctl(&["apply", "all-balanced"]).status.success());
    agent.restart_with_env(&[(
        "GPUSHARE_SIM_FAIL",
        "nvmlGpuInstanceDestroy:3,nvmlDeviceCreateGpuInstanceWithPlacement:1",
    )]);
    let out = agent.ctl(&["apply", "all-disabled"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(agent.status().rollback_error.is_some());

    let outcome: JobOutcome = agent.ctl_doc(&["apply", "all-balanced"]);
    assert!(outcome.ok, "{outcome:?}");
    assert!(outcome.changed, "the GPUs were repaired: {outcome:?}");
    assert!(
        outcome
            .warnings
            .iter()
            .any(|w| w.contains("rolled back the unfinished apply of all-disabled")),
        "{outcome:?}"
    );
    assert_eq!(agent.status().rollback_error, None);
}

/// Once an apply has returned, status no longer shows it running (the job is cleared
/// before its client hears the outcome).
#[test]
fn status_right_after_an_apply_never_shows_it_running() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    for profile in ["all-balanced", "all-disabled"].iter().cycle().take(20) {
        let out = agent.ctl(&["apply", profile]);
        assert!(out.status.success(), "{}", text(&out));
        let status = agent.status();
        assert_eq!(status.apply_in_progress, None, "after applying {profile}");
    }
}

/// SIGHUP (`systemctl reload`) reads profiles.d again; the agent keeps serving.
#[test]
fn sighup_reloads_the_profile_directory() {
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    assert!(!stdout(&agent.ctl(&["profiles"])).contains("added-later"));
    let file = agent.dir.path().join("profiles.d/added-later.toml");
    std::fs::write(&file, "[[gpu]]\nselect = \"all\"\n").unwrap();
    let pid = agent.pid().expect("agent running");
    assert_eq!(kill(Pid::from_raw(pid as i32), Signal::SIGHUP), Ok(()));
    gpushare_tests::wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        let list: ProfileList = agent.ctl_doc(&["profiles"]);
        match list.profiles.iter().any(|p| p.name == "added-later") {
            true => Ok(()),
            false => Err(format!("not reloaded: {list:?}")),
        }
    });
    assert!(agent.is_running());
    assert!(agent.ctl(&["apply", "added-later"]).status.success());
}
