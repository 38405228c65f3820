//! MPS and time-slicing end to end, with the simulated MPS control daemon and the simulated
//! nvidia-smi of crate gpushare-sim-tools standing in for NVIDIA's (they speak the same protocol
//! and record what they were asked).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use gpushare_proto::types::PlanReport;
use gpushare_proto::{ServerState, Strategy};
use gpushare_tests::{
    Agent, AgentOptions, SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV, Sleeper, binary, stderr, stdout,
    text, wait_for,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Every GPU back to plain: no server, no server directory, default compute mode and
/// time-slice interval.
fn assert_nothing_left(agent: &Agent) {
    let servers = agent.mps_servers();
    assert!(servers.is_empty(), "{servers:?}");
    let left: Vec<_> = std::fs::read_dir(agent.mps_root())
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "server directories left: {left:?}");
    for gpu in agent.status().gpus {
        assert_eq!(gpu.compute_mode, "default", "{gpu:?}");
        assert_eq!(gpu.sharing.strategy, Strategy::Exclusive.as_str(), "{gpu:?}");
    }
    let smi = agent.nvidia_smi(&["compute-policy", "-l"]);
    assert!(smi.status.success(), "{}", text(&smi));
    let table = stdout(&smi);
    assert!(
        !table.contains("Short") && !table.contains("Medium") && !table.contains("Long"),
        "{table}"
    );
}

#[test]
fn all_mps_runs_one_server_per_gpu_with_limits_read_back() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    let status = agent.status();
    for gpu in &status.gpus {
        assert_eq!(gpu.compute_mode, "exclusive_process");
        assert_eq!(gpu.sharing.strategy, Strategy::Mps.as_str());
        let mps = gpu.sharing.mps.as_ref().expect("the GPU's MPS server");
        assert_eq!(mps.active_thread_percentage, 25);
        assert_eq!(mps.pinned_memory_limit_bytes, Some(10u64 << 30));
    }
    let found = agent.mps_servers();
    assert_eq!(found.len(), 2);
    for server in &found {
        assert_eq!(server.state, ServerState::Running.as_str());
        let pipe = std::path::Path::new(&server.pipe_directory);
        let mode = std::fs::metadata(pipe).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755, "the pipe directory is open to clients only after the limits");
    }
    let record = agent.sim_record();
    for line in
        ["set_default_active_thread_percentage 25", "set_default_device_pinned_mem_limit 0 10G"]
    {
        assert_eq!(record.matches(line).count(), 2, "{line} once per server:\n{record}");
    }
    // Read back at the start, and by every read of the live limits since (status, the
    // health check).
    for line in ["get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0"] {
        assert!(record.matches(line).count() >= 2, "{line} at least once per server:\n{record}");
    }
    // The environment a client needs.
    let out = agent.ctl(&["env", "0"]);
    let env = stdout(&out);
    assert!(env.contains("export CUDA_MPS_PIPE_DIRECTORY='"), "{env}");
    assert!(env.contains(&found[0].pipe_directory), "{env}");

    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    assert_eq!(agent.mps_servers(), found, "an idempotent apply leaves the servers alone");
    let out = agent.ctl(&["apply", "all-disabled"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_nothing_left(&agent);
    assert_eq!(agent.sim_record().matches("cmd=quit").count(), 2, "{}", agent.sim_record());
}

#[test]
fn time_slicing_sets_and_restores_the_interval() {
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:2"));
    let out = agent.ctl(&["apply", "all-time-sliced"]);
    assert!(out.status.success(), "{}", text(&out));
    let status = agent.status();
    for gpu in &status.gpus {
        assert_eq!(gpu.sharing.strategy, Strategy::TimeSlicing.as_str(), "{gpu:?}");
        assert_eq!(gpu.sharing.interval.as_deref(), Some("medium"), "{gpu:?}");
        assert_eq!(gpu.compute_mode, "default");
    }
    assert_eq!(
        agent.sim_record().matches("--set-timeslice 2").count(),
        2,
        "{}",
        agent.sim_record()
    );
    assert!(!agent.ctl_doc::<PlanReport>(&["plan", "all-time-sliced"]).changes);
    assert!(agent.ctl(&["apply", "all-disabled"]).status.success());
    assert_eq!(agent.sim_record().matches("--set-timeslice 0").count(), 2);
    assert_nothing_left(&agent);
}

#[test]
fn mps_on_mig_instances_and_switching_back_leaves_nothing_behind() {
    let layered = "name = \"layered\"\n\
                   [[gpu]]\nselect = \"first-half\"\nmig = { \"1g\" = 2, \"2g\" = 1, \"3g\" = 1 }\n\
                   instance_sharing.\"3g\".mps = { replicas = 2 }\n\
                   [[gpu]]\nselect = \"second-half\"\nmig = \"disabled\"\n";
    let agent =
        Agent::start(AgentOptions::simulate("a100-40gb:4").profile("layered.toml", layered));
    let out = agent.ctl(&["apply", "layered"]);
    assert!(out.status.success(), "{}", text(&out));
    let found = agent.mps_servers();
    assert_eq!(found.len(), 2, "{found:?}");
    let status = agent.status();
    for (i, server) in found.iter().enumerate() {
        assert_eq!(server.gpu as usize, i);
        assert_eq!(server.placement_start, Some(4));
        assert_eq!(server.active_thread_percentage, 50);
        let uuid = server.uuid.as_str();
        assert!(uuid.starts_with("MIG-"), "{uuid}");
        let instance = status.gpus[i]
            .instances
            .iter()
            .find(|inst| inst.uuid.as_deref() == Some(uuid))
            .unwrap();
        assert_eq!(instance.profile, "3g.20gb");
        assert_eq!(instance.sharing.strategy, Strategy::Mps.as_str());
        // Half the instance's memory for each of the two replicas.
        assert_eq!(server.pinned_memory_limit_bytes, Some((19968u64 << 20) / 2));
        // MPS on an instance leaves the GPU's compute mode alone.
        assert_eq!(status.gpus[i].compute_mode, "default");
        assert!(agent.sim_record().contains(&format!("visible={uuid}")), "{}", agent.sim_record());
    }
    for next in ["all-mps", "all-time-sliced", "layered", "all-disabled"] {
        let out = agent.ctl(&["apply", next]);
        assert!(out.status.success(), "{next}: {}", text(&out));
    }
    assert_nothing_left(&agent);
}

#[test]
fn a_killed_server_is_restarted_with_its_limits() {
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:1"));
    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    let before = agent.mps_servers()[0].clone();
    let pid = before.pid.expect("the server's pid") as i32;
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    // Restarted: a new daemon runs, and its pipe directory is open to clients again, which
    // the agent does only once the limits are set and read back.
    let after = wait_for(Duration::from_secs(15), Duration::from_millis(100), || {
        let Some(now) = agent.mps_servers().first().cloned() else {
            return Err("no server listed".into());
        };
        let open = std::fs::metadata(&now.pipe_directory)
            .is_ok_and(|m| m.permissions().mode() & 0o777 == 0o755);
        if now.state == ServerState::Running.as_str() && now.pid != before.pid && open {
            return Ok(now);
        }
        Err(format!("not restarted: {now:?}"))
    });
    // The status that saw it may have been read while the new daemon still had its
    // defaults (its read began before the limits were set); one begun now cannot have.
    let after = agent.mps_servers().first().cloned().unwrap_or(after);
    assert_eq!(after.restarts, 1);
    assert_eq!(after.active_thread_percentage, before.active_thread_percentage);
    assert_eq!(after.pinned_memory_limit_bytes, before.pinned_memory_limit_bytes);
    let record = agent.sim_record();
    assert_eq!(record.matches("set_default_active_thread_percentage 25").count(), 2, "{record}");
    // A quarter of the H100's 81559 MiB.
    assert_eq!(
        record.matches("set_default_device_pinned_mem_limit 0 20389M").count(),
        2,
        "{record}"
    );
}

#[test]
fn servers_outlive_the_agent_and_are_adopted() {
    let mut agent = Agent::start(AgentOptions::simulate("h100-80gb:1"));
    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    let before = agent.mps_servers();
    agent.restart();
    assert_eq!(agent.mps_servers(), before, "the same daemon, not a new one");
    assert_eq!(agent.status().active_profile.as_deref(), Some("all-mps"));
    assert!(!agent.ctl_doc::<PlanReport>(&["plan", "all-mps"]).changes);
}

#[test]
fn clients_are_listed_and_limited() {
    let agent = Agent::start(AgentOptions::simulate("h100-80gb:1"));
    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    let pipe = agent.mps_servers()[0].pipe_directory.clone();
    let sleeper = Sleeper::start(None, &[]);
    let pid = sleeper.pid().to_string();
    let client = std::process::Command::new(binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV))
        .args(["--fake-client", &pid])
        .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
        .output()
        .unwrap();
    assert!(client.status.success(), "{}", text(&client));
    assert_eq!(agent.mps_servers()[0].clients, [sleeper.pid()]);
    let out = agent.ctl(&["mps", "limit", "--pid", &pid, "--threads", "10", "--memory", "1GiB"]);
    assert!(out.status.success(), "{}", text(&out));
    let record = agent.sim_record();
    assert!(record.contains("set_active_thread_percentage"), "{record}");
    assert!(record.contains("set_device_pinned_mem_limit"), "{record}");
    let out = agent.ctl(&["mps", "limit", "--pid", "999", "--threads", "10"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("PID 999 is not a client"), "{}", text(&out));
}

#[test]
fn a_failed_apply_brings_the_mps_servers_back() {
    let layered = "name = \"layered\"\n\
                   [[gpu]]\nselect = \"all\"\nmig = { \"1g\" = 2, \"2g\" = 1, \"3g\" = 1 }\n\
                   instance_sharing.\"3g\".mps = { active_thread_percentage = 40 }\n";
    let mut agent =
        Agent::start(AgentOptions::simulate("h100-80gb:2").profile("layered.toml", layered));
    assert!(agent.ctl(&["apply", "layered"]).status.success());
    let before = agent.mps_servers();
    assert_eq!(before.len(), 2);
    // all-disabled stops both servers, then fails destroying an instance: the rollback
    // recreates what was destroyed and starts the servers again, with their limits.
    agent.restart_with_env(&[("GPUSHARE_SIM_FAIL", "nvmlGpuInstanceDestroy:3")]);
    let out = agent.ctl(&["apply", "all-disabled"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("rolled back"), "{}", text(&out));
    let after = agent.mps_servers();
    assert_eq!(after.len(), 2, "{after:?}");
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a.state, ServerState::Running.as_str());
        assert_eq!((a.gpu, a.placement_start), (b.gpu, b.placement_start));
        assert_eq!(a.active_thread_percentage, 40);
    }
    assert_eq!(agent.status().active_profile.as_deref(), Some("layered"));
    assert!(!agent.ctl_doc::<PlanReport>(&["plan", "layered"]).changes);
}

/// The simulated node brings its own tools: with no tool configured, `all-mps`,
/// `all-time-sliced` and MPS inside MIG instances apply on `--simulate`, through the
/// simulated `nvidia-cuda-mps-control` and `nvidia-smi` the agent finds beside itself.
#[test]
fn the_simulated_node_brings_its_own_tools() {
    let root = tempfile::tempdir().unwrap();
    // Only the server root is set (tests must not write /run); no control, no nvidia-smi.
    let config = format!("[mps]\nroot = {:?}\n[timeslice]\n", root.path());
    let layered = "name = \"layered\"\n[[gpu]]\nselect = \"all\"\nmig = { \"3g\" = 2 }\n\
                   instance_sharing.\"3g\".mps = { active_thread_percentage = 50 }\n";
    let agent = Agent::start(
        AgentOptions::simulate("h100-80gb:2").config(&config).profile("layered.toml", layered),
    );
    for profile in ["all-mps", "all-time-sliced", "layered", "all-disabled"] {
        let out = agent.ctl(&["apply", profile]);
        assert!(out.status.success(), "{profile}: {}", text(&out));
        assert_eq!(agent.status().active_profile.as_deref(), Some(profile));
    }
    let record = agent.sim_record();
    assert!(record.contains("mps-control daemon pipe="), "{record}");
    assert!(record.contains("nvidia-smi compute-policy"), "{record}");
    assert_nothing_left(&agent);
}

/// A plan that needs a tool the host cannot run is refused before its first step, in one
/// line naming the tool and the setting; nothing changes, nothing is rolled back.
#[test]
fn a_missing_tool_is_refused_before_the_first_step() {
    let root = tempfile::tempdir().unwrap();
    let config = format!(
        "[mps]\ncontrol = \"/nonexistent/nvidia-cuda-mps-control\"\nroot = {:?}\n\
         [timeslice]\nnvidia_smi = \"gpushare-no-such-nvidia-smi\"\n",
        root.path()
    );
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2").config(&config));
    let before = agent.status();
    let cases = [
        (
            "all-mps",
            "gpushare-ctl: all-mps needs /nonexistent/nvidia-cuda-mps-control to run MPS servers, \
             but it cannot run: no such file (set [mps] control in agent.toml); nothing was changed\n",
        ),
        (
            "all-time-sliced",
            "gpushare-ctl: all-time-sliced needs gpushare-no-such-nvidia-smi to set time-slice \
             intervals, but it cannot run: not found on PATH (set [timeslice] nvidia_smi in \
             agent.toml); nothing was changed\n",
        ),
        // The A100 needs a reset to turn MIG on: nvidia-smi again.
        (
            "all-balanced",
            "gpushare-ctl: all-balanced needs gpushare-no-such-nvidia-smi to reset GPUs, but it \
             cannot run: not found on PATH (set [timeslice] nvidia_smi in agent.toml); nothing \
             was changed\n",
        ),
    ];
    for (profile, refusal) in cases {
        for verb in ["apply", "plan"] {
            let out = agent.ctl(&[verb, profile]);
            assert_eq!(out.status.code(), Some(1), "{verb} {profile}: {}", text(&out));
            assert_eq!(stderr(&out), refusal, "{verb} {profile}");
        }
        assert_eq!(agent.status(), before, "{profile}: nothing changed");
        // No transaction was ever begun: the journal was never written.
        assert!(!agent.dir.path().join("state/state.json").exists(), "{profile}");
    }
    assert!(!agent.sim_record().contains("mps-control"), "{}", agent.sim_record());
}
