//! What a plan must refuse or undo, end to end (issue 10): sharing left behind by the
//! previous profile, MPS clients under a server that would stop, limits larger than the
//! device, selectors naming GPUs this node does not have.

use gpushare_proto::Strategy;
use gpushare_proto::types::PlanReport;
use gpushare_tests::{Agent, AgentOptions, binary, stdout, text};

/// The time-slice intervals the fake nvidia-smi holds for the node's GPUs, one word each
/// (`Default`, …); the fake lists eight GPUs whatever the node has.
fn intervals(agent: &Agent) -> Vec<String> {
    let gpus = agent.status().gpus.len();
    let smi = std::process::Command::new(binary("fake-nvidia-smi", "GPUSHARE_FAKE_NVIDIA_SMI_BIN"))
        .args(["compute-policy", "-l"])
        .env("GPUSHARE_FAKE_NVIDIA_SMI_STATE", agent.dir.path().join("fake-nvidia-smi.json"))
        .output()
        .unwrap();
    stdout(&smi)
        .lines()
        .filter(|l| l.contains("Timeslice"))
        .filter_map(|l| l.split_whitespace().nth(3).map(String::from))
        .take(gpus)
        .collect()
}

#[test]
fn mps_after_time_slicing_returns_the_interval_to_default() {
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let out = agent.ctl(&["apply", "all-time-sliced"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(intervals(&agent), ["Medium", "Medium"]);
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(intervals(&agent), ["Default", "Default"], "{}", agent.fake_record());
    for gpu in agent.status().gpus {
        assert_eq!(gpu.sharing.strategy, Strategy::Mps.as_str(), "{gpu:?}");
        assert_eq!(gpu.sharing.interval, None, "{gpu:?}");
    }
    let out = agent.ctl(&["assert", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!agent.ctl_doc::<PlanReport>(&["plan", "all-mps"]).changes);
    let out = agent.ctl(&["assert", "all-time-sliced"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // The interval set by hand under MPS is noticed and undone too.
    let smi = std::process::Command::new(binary("fake-nvidia-smi", "GPUSHARE_FAKE_NVIDIA_SMI_BIN"))
        .args(["compute-policy", "-i", "1", "--set-timeslice", "3"])
        .env("GPUSHARE_FAKE_NVIDIA_SMI_STATE", agent.dir.path().join("fake-nvidia-smi.json"))
        .output()
        .unwrap();
    assert!(smi.status.success(), "{}", text(&smi));
    let out = agent.ctl(&["assert", "all-mps"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let plan: PlanReport = agent.ctl_doc(&["plan", "all-mps"]);
    let steps: Vec<&str> = plan.steps.iter().map(|s| s.description.as_str()).collect();
    assert_eq!(steps, ["GPU 1: set the time-slice interval to default"]);
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(intervals(&agent), ["Default", "Default"]);
}
