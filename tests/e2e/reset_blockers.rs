//! Reset blockers found before the first step (issue 26, point 5): on an Ampere node whose
//! host cannot reset a GPU (a VM without function-level reset, a vGPU guest, `nvidia_drm`
//! with modesetting, NVSwitches without Fabric Manager), a profile that changes MIG mode,
//! which takes a reset there, is refused in one line naming the GPUs, the blocker and what
//! to do; the simulated node is left exactly as it was (no MIG mode pending, nothing
//! created, nothing reset). Without the blocker the same apply goes through.

use gpushare_tests::{Agent, AgentOptions, stderr, stdout, text};
use serde_json::Value;

/// The simulator's knob for the host around the GPUs.
const HOST_KNOB: &str = "GPUSHARE_SIM_HOST";

/// An agent on `spec` whose simulated host is what `host` (`GPUSHARE_SIM_HOST`) says.
fn agent_on(spec: &str, host: &str) -> Agent {
    Agent::start(AgentOptions::simulate(spec).env(HOST_KNOB, host))
}

/// The simulated node's state file, parsed.
fn node_state(agent: &Agent) -> Value {
    let bytes = std::fs::read(agent.sim_state()).expect("the simulated node's state file");
    serde_json::from_slice(&bytes).expect("the state file is JSON")
}

/// `apply` and `plan` of `profile` are refused with `line` (after `gpushare-ctl: `), and
/// the node, its state file and the tools' record are as they were.
fn assert_refused(agent: &Agent, profile: &str, line: &str) {
    let state = node_state(agent);
    let status = agent.status();
    for verb in ["apply", "plan"] {
        let out = agent.ctl(&[verb, profile]);
        assert_eq!(out.status.code(), Some(1), "{verb} {profile}: {}", text(&out));
        assert_eq!(stderr(&out), format!("gpushare-ctl: {line}\n"), "{verb} {profile}");
    }
    assert_eq!(node_state(agent), state, "{profile}: the simulated node is unchanged");
    assert_eq!(agent.status(), status, "{profile}: nothing changed");
    for gpu in &state["gpus"].as_array().unwrap()[..] {
        assert_eq!(gpu["mig_pending"], Value::Null, "no MIG mode pending: {gpu}");
        assert_eq!(gpu["instances"], serde_json::json!([]), "nothing created: {gpu}");
    }
    // No transaction was begun, and no tool was asked to change anything.
    assert!(!agent.dir.path().join("state/state.json").exists(), "{profile}");
    let record = agent.sim_record();
    for change in ["--gpu-reset", "-r", "-mig", "-pm"] {
        assert!(!record.split_whitespace().any(|w| w == change), "{change}: {record}");
    }
}

/// `apply profile` succeeds and turns MIG on on every GPU.
fn assert_applied(agent: &Agent, profile: &str) {
    let out = agent.ctl(&["apply", profile]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains(profile), "{}", text(&out));
    let status = agent.status();
    assert!(status.gpus.iter().all(|g| g.mig_enabled && !g.instances.is_empty()), "{status:?}");
    for gpu in &node_state(agent)["gpus"].as_array().unwrap()[..] {
        assert_eq!(gpu["mig_pending"], Value::Null, "{gpu}");
    }
}

/// An A100 VM whose hypervisor offers no function-level reset (NVIDIA's MIG user guide:
/// "GPU reset is not allowed via the hypervisor"; GCP's A100 VMs,
/// kubernetes-sigs/dra-driver-nvidia-gpu#883); pass-through with FLR, as on the cloud H100
/// VM gpushare was tested on, resets.
#[test]
fn a_vm_without_function_level_reset_is_refused_and_one_with_it_resets() {
    let agent = agent_on("a100-40gb:2", "passthrough,no-flr");
    assert_refused(
        &agent,
        "all-balanced",
        "all-balanced: GPU 0 (A100-SXM4-40GB) and GPU 1 (A100-SXM4-40GB) cannot be reset to \
         change their MIG mode: they are passed through to a virtual machine that does not let \
         them be reset (no function-level reset: reset methods bus) (set the mode with \
         nvidia-smi -i 0,1 -mig 1 and reboot the VM, which makes it take effect, then apply \
         again); nothing was changed",
    );
    // The simulated nvidia-smi refuses the reset as the real one does.
    let smi = agent.nvidia_smi(&["--gpu-reset", "-i", "0"]);
    assert_eq!(smi.status.code(), Some(3), "{}", text(&smi));
    assert_eq!(stdout(&smi), "Resetting GPU 00000000:1B:00.0 is not supported.\n");

    // One GPU without FLR: only it is named; a profile that resets only the other passes.
    let agent = agent_on("a100-40gb:2", "passthrough,no-flr=1");
    assert_refused(
        &agent,
        "all-balanced",
        "all-balanced: GPU 1 (A100-SXM4-40GB) cannot be reset to change its MIG mode: it is \
         passed through to a virtual machine that does not let it be reset (no function-level \
         reset: reset methods bus) (set the mode with nvidia-smi -i 1 -mig 1 and reboot the \
         VM, which makes it take effect, then apply again); nothing was changed",
    );
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(out.status.success(), "{}", text(&out));

    assert_applied(&agent_on("a100-40gb:2", "passthrough"), "all-balanced");
}

#[test]
fn a_vgpu_guest_is_refused() {
    let agent = agent_on("a100-40gb:2", "vgpu=0");
    assert_refused(
        &agent,
        "all-balanced",
        "all-balanced: GPU 0 (A100-SXM4-40GB) cannot be reset to change its MIG mode: it is a \
         vGPU in a virtual machine, whose MIG mode the vGPU profile on the hypervisor sets \
         (choose a vGPU profile with the MIG layout wanted on the hypervisor); nothing was \
         changed",
    );
    let smi = agent.nvidia_smi(&["-r", "-i", "0"]);
    assert_eq!(smi.status.code(), Some(3), "{}", text(&smi));
}

/// `nvidia_drm` with modesetting keeps every GPU open (NVIDIA/mig-parted#181); loaded
/// without it, it holds nothing.
#[test]
fn nvidia_drm_with_modesetting_is_refused_and_without_it_resets() {
    let agent = agent_on("a100-40gb:2", "nvidia-drm.modeset=1");
    assert_refused(
        &agent,
        "all-balanced",
        "all-balanced: GPU 0 (A100-SXM4-40GB) and GPU 1 (A100-SXM4-40GB) cannot be reset to \
         change their MIG mode: nvidia_drm holds them with modeset=Y (stop the display manager \
         and run modprobe -r nvidia_drm, or boot with nvidia-drm.modeset=0, then apply again); \
         nothing was changed",
    );
    // The module's parameter is where a real host shows it.
    let modeset = agent.sim_state().with_extension("json.host");
    let modeset = modeset.join("sys/module/nvidia_drm/parameters/modeset");
    assert_eq!(std::fs::read_to_string(&modeset).unwrap(), "Y\n");
    let smi = agent.nvidia_smi(&["--gpu-reset", "-i", "1"]);
    assert_eq!(smi.status.code(), Some(255), "{}", text(&smi));
    assert!(stdout(&smi).contains("GPU 00000000:1C:00.0: In use by another client"));

    assert_applied(&agent_on("a100-40gb:2", "nvidia-drm.modeset=0"), "all-balanced");
}

/// On an NVSwitch system an A100 is reset alone only through Fabric Manager (nvidia-smi(1),
/// `-r`); Hopper needs neither Fabric Manager nor a reset.
#[test]
fn nvswitches_without_fabric_manager_are_refused_and_with_it_reset() {
    let agent = agent_on("a100-40gb:2", "nvswitches=6,fabric-manager=stopped");
    assert_refused(
        &agent,
        "all-balanced",
        "all-balanced: GPU 0 (A100-SXM4-40GB) and GPU 1 (A100-SXM4-40GB) cannot be reset to \
         change their MIG mode: on this NVSwitch system (6 NVSwitches) an Ampere GPU is reset \
         alone only through NVIDIA Fabric Manager, which is not running (start it with \
         systemctl start nvidia-fabricmanager, then apply again); nothing was changed",
    );
    // With persistence mode off (the agent turns it off for a reset), nvidia-smi asks for
    // the GPU's NVLink peers.
    assert!(agent.nvidia_smi(&["-pm", "0"]).status.success());
    let smi = agent.nvidia_smi(&["-r", "-i", "0"]);
    assert_eq!(smi.status.code(), Some(255), "{}", text(&smi));
    assert!(
        stdout(&smi).contains("must be reset in the same command: 00000000:1C:00.0"),
        "{}",
        text(&smi)
    );

    assert_applied(&agent_on("a100-40gb:2", "nvswitches=6"), "all-balanced");
    assert_applied(&agent_on("h100-80gb:2", "nvswitches=4,fabric-manager=stopped"), "all-balanced");
}

/// A blocker on a GPU whose MIG mode the profile leaves alone refuses nothing, and the
/// knob set empty makes the host bare metal again.
#[test]
fn only_gpus_the_plan_resets_are_asked_about() {
    let mut agent = agent_on("a100-40gb:2", "vgpu=1");
    let out = agent.ctl(&["apply", "half-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = agent.ctl(&["plan", "all-balanced"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains("GPU 1 (A100-SXM4-40GB) cannot be reset"), "{}", text(&out));
    agent.restart_with_env(&[(HOST_KNOB, "")]);
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(out.status.success(), "{}", text(&out));
}

/// `gpushare-agent --check-driver` names each GPU whose reset the host would block, and
/// says nothing of a host without blockers: an operator's read-only look before applying.
#[test]
fn check_driver_names_the_gpus_the_host_would_not_let_reset() {
    let check = |host: &str| {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(gpushare_tests::binary(
            "gpushare-agent",
            "GPUSHARE_AGENT_BIN",
        ))
        .args(["--simulate", "a100-40gb:2", "--state-dir"])
        .arg(dir.path().join("state"))
        .arg("--check-driver")
        .env("GPUSHARE_SIM_HOST", host)
        .env("GPUSHARE_LOG", "warn")
        .output()
        .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        stdout(&out)
    };
    let blocked = check("passthrough=1,no-flr=1");
    assert!(blocked.contains("answers: 2 GPUs"), "{blocked}");
    assert!(
        blocked.contains("GPU 1 (A100-SXM4-40GB) cannot be reset here: it is passed through"),
        "{blocked}"
    );
    assert!(!blocked.contains("GPU 0 (A100-SXM4-40GB) cannot"), "{blocked}");
    assert!(!check("").contains("cannot be reset"));
}
