//! Issue 28: the CDI spec follows the node through every apply, rollback and restart, on
//! simulated GPUs (device nodes made by the simulator, as root).

use std::path::PathBuf;

use gpushare_proto::cdi::CdiReport;
use gpushare_tests::{Agent, AgentOptions, is_root, stderr, text};
use serde_json::Value;

/// `<state-dir>/cdi/gpushare.json`: where a simulated agent keeps its spec.
fn spec_path(agent: &Agent) -> PathBuf {
    agent.sim_state().parent().unwrap().join("cdi/gpushare.json")
}

pub(crate) fn spec(agent: &Agent) -> Value {
    let text = std::fs::read_to_string(spec_path(agent)).expect("the CDI spec is written");
    serde_json::from_str(&text).expect("the CDI spec is JSON")
}

pub(crate) fn names(spec: &Value) -> Vec<String> {
    spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

fn device<'a>(spec: &'a Value, name: &str) -> &'a Value {
    spec["devices"].as_array().unwrap().iter().find(|d| d["name"] == name).unwrap()
}

fn env_of(device: &Value) -> Vec<String> {
    device["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_spec_names_what_every_apply_leaves_and_a_rollback_leaves_it_byte_for_byte() {
    if !is_root() {
        gpushare_tests::skip("the simulator makes device nodes only as root");
        return;
    }
    let mut agent = Agent::start(AgentOptions::simulate("a100-40gb:2"));
    let status = agent.status();
    let (gpu0, gpu1) = (status.gpus[0].uuid.clone(), status.gpus[1].uuid.clone());
    // At start-up: the whole GPUs.
    let at_start = spec(&agent);
    assert_eq!(
        (at_start["cdiVersion"].as_str(), at_start["kind"].as_str()),
        (Some("0.5.0"), Some("gpushare.io/gpu"))
    );
    assert_eq!(names(&at_start), ["0", gpu0.as_str(), "1", gpu1.as_str()]);
    let nodes = &device(&at_start, "0")["containerEdits"]["deviceNodes"];
    assert_eq!(nodes[0]["path"], "/dev/nvidia0");
    let host_node = PathBuf::from(nodes[0]["hostPath"].as_str().unwrap());
    assert!(host_node.exists(), "{}", host_node.display());

    // all-mps: four shares per GPU, each with the server's limits.
    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    let mps = spec(&agent);
    let mut want = vec!["0".to_string(), gpu0.clone()];
    want.extend((0..4).map(|i| format!("0-mps-{i}")));
    want.extend(["1".to_string(), gpu1.clone()]);
    want.extend((0..4).map(|i| format!("1-mps-{i}")));
    assert_eq!(names(&mps), want);
    let share = env_of(device(&mps, "1-mps-2"));
    let pipe = agent.mps_root().join(&gpu1).join("pipe").display().to_string();
    assert!(share.contains(&format!("CUDA_VISIBLE_DEVICES={gpu1}")), "{share:?}");
    assert!(share.contains(&format!("CUDA_MPS_PIPE_DIRECTORY={pipe}")), "{share:?}");
    assert!(share.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".to_string()), "{share:?}");
    assert!(share.contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10G".to_string()), "{share:?}");
    assert_eq!(device(&mps, "1-mps-2")["containerEdits"]["mounts"][0]["hostPath"], pipe.as_str());
    // `gpushare-ctl cdi` lists the same devices, with their podman lines.
    let report: CdiReport = agent.ctl_doc(&["cdi"]);
    let listed: Vec<&str> = report.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(listed, want);
    assert_eq!(
        report.devices[2].podman,
        "podman run --device nvidia.com/gpu=0 --device gpushare.io/gpu=0-mps-0 --ipc=host IMAGE"
    );
    let shown = text(&agent.ctl(&["cdi"]));
    assert!(shown.contains("share 2 of 4 of the MPS server of GPU 1"), "{shown}");
    let mps_bytes = std::fs::read(spec_path(&agent)).unwrap();

    // A failed apply rolls back: the spec is the one before it, byte for byte.
    agent.restart_with_env(&[("GPUSHARE_SIM_FAIL", "nvmlDeviceCreateGpuInstanceWithPlacement:2")]);
    let out = agent.ctl(&["apply", "all-balanced"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read(spec_path(&agent)).unwrap(),
        mps_bytes,
        "rolled back, the spec as before"
    );
    agent.restart_with_env(&[]);

    // all-balanced: MIG devices by index path and UUID, with their capability nodes.
    assert!(agent.ctl(&["apply", "all-balanced"]).status.success());
    let mig = spec(&agent);
    let status = agent.status();
    let mut want = Vec::new();
    for g in &status.gpus {
        for (k, i) in g.instances.iter().enumerate() {
            want.push(format!("{}:{k}", g.index));
            want.push(i.uuid.clone().expect("a MIG device"));
        }
    }
    assert_eq!(names(&mig), want);
    let first = device(&mig, "0:0");
    let caps: Vec<&str> = first["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["path"].as_str())
        .filter(|p| p.starts_with("/dev/nvidia-caps/"))
        .collect();
    assert_eq!(caps.len(), 2, "the GPU instance's and the compute instance's: {first}");
    assert!(env_of(first)[0].starts_with("CUDA_VISIBLE_DEVICES=MIG-"), "{first}");

    // all-disabled: the MPS and MIG names are gone, and looking one up says so in a line.
    assert!(agent.ctl(&["apply", "all-disabled"]).status.success());
    assert_eq!(names(&spec(&agent)), ["0", gpu0.as_str(), "1", gpu1.as_str()]);
    let out = agent.ctl(&["cdi", "0-mps-2"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("no CDI device \"0-mps-2\"") && err.contains(&format!("has: 0, {gpu0}, 1")),
        "{err}"
    );
    let one: gpushare_proto::cdi::CdiDevice = agent.ctl_doc(&["cdi", "gpushare.io/gpu=1"]);
    assert_eq!(one.uuid, gpu1);
}

#[test]
fn a_cdi_directory_the_agent_cannot_use_refuses_the_apply_before_its_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let config = format!("[cdi]\ndir = \"{}\"\n", file.join("cdi").display());
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1").config(&config));
    let before = agent.status();
    let record = agent.sim_record();
    let out = agent.ctl(&["apply", "all-mps"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(&format!("CDI spec directory {}", file.join("cdi").display())), "{err}");
    assert!(err.contains("[cdi] dir"), "{err}");
    assert_eq!(agent.status().gpus, before.gpus, "nothing applied");
    let since = agent.sim_record();
    let since = since.strip_prefix(&record).unwrap_or(&since);
    assert!(!since.contains("mps-control daemon"), "no MPS server started: {since}");
}

/// Issue 28's acceptance with a real podman: a container asks for a device of the agent's
/// spec with one flag and gets what the spec says.
#[test]
fn podman_containers_get_mps_shares_and_mig_devices_and_refuse_what_is_gone() {
    let Some(podman) = gpushare_tests::Podman::available() else { return };
    let agent = Agent::start(AgentOptions::simulate("a100-40gb:1"));
    let dir = spec_path(&agent).parent().unwrap().to_path_buf();
    let podman = podman.with_cdi_dir(&dir);
    let valid = |agent: &Agent| {
        gpushare_tests::validate_cdi(&spec_path(agent))
            .unwrap_or_else(|e| panic!("the spec breaks the CDI schema: {e}"))
    };

    // all-mps: one share, with the server's pipe directory, the limits and the nodes.
    assert!(agent.ctl(&["apply", "all-mps"]).status.success());
    valid(&agent);
    let uuid = agent.status().gpus[0].uuid.clone();
    let pipe = agent.mps_root().join(&uuid).join("pipe");
    let out = podman.run(
        &["gpushare.io/gpu=0-mps-1"],
        "env | grep -E '^(CUDA_|GPUSHARE_CDI)' | sort; ls -ld /dev/nvidia0 /dev/nvidiactl; \
         test -d \"$CUDA_MPS_PIPE_DIRECTORY\" && echo pipe-dir-seen",
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    for line in [
        format!("CUDA_VISIBLE_DEVICES={uuid}"),
        format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display()),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".to_string(),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10G".to_string(),
        "GPUSHARE_CDI_DEVICE=gpushare.io/gpu=0-mps-1".to_string(),
        "pipe-dir-seen".to_string(),
    ] {
        assert!(said.contains(&line), "`{line}` missing:\n{said}");
    }
    assert!(said.lines().any(|l| l.starts_with('c') && l.ends_with("/dev/nvidia0")), "{said}");

    // all-balanced: a MIG device, its UUID and its capability nodes.
    assert!(agent.ctl(&["apply", "all-balanced"]).status.success());
    valid(&agent);
    let mig = agent.status().gpus[0].instances[0].uuid.clone().expect("a MIG device");
    let out =
        podman.run(&["gpushare.io/gpu=0:0"], "echo $CUDA_VISIBLE_DEVICES; ls -l /dev/nvidia-caps");
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains(&mig), "{said}");
    assert_eq!(said.lines().filter(|l| l.starts_with('c')).count(), 2, "{said}");

    // all-disabled: the MPS and MIG names are gone; the GPU itself still resolves.
    assert!(agent.ctl(&["apply", "all-disabled"]).status.success());
    valid(&agent);
    for gone in ["gpushare.io/gpu=0-mps-1", "gpushare.io/gpu=0:0"] {
        gpushare_tests::podman::assert_unresolvable(&podman.run(&[gone], "true"), gone);
    }
    let out = podman.run(&["gpushare.io/gpu=0"], "echo $CUDA_VISIBLE_DEVICES");
    assert!(out.status.success() && text(&out).contains(&uuid), "{}", text(&out));
}
