//! The simulated nvidia-smi as a process: what it takes from the environment
//! (`GPUSHARE_SIM_STATE`, `GPUSHARE_SIM_FAIL`, `GPUSHARE_SIM_RECORD`), and injected failures
//! counted in the node across invocations.

use std::path::Path;
use std::process::{Command, Output};

use gpushare_catalog::parse_node_spec;
use gpushare_sim_nvml::node::Node;
use gpushare_sim_nvml::state_file::NodeFile;

mod smi;
use smi::text;

fn nvidia_smi(env: &[(&str, &Path)], fail: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpushare-sim-nvidia-smi"));
    command
        .args(args)
        .env_remove("GPUSHARE_SIM_STATE")
        .env_remove("GPUSHARE_SIM_FAIL")
        .env_remove("GPUSHARE_SIM_RECORD")
        .envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(fail) = fail {
        command.env("GPUSHARE_SIM_FAIL", fail);
    }
    command.output().unwrap()
}

#[test]
fn without_gpushare_sim_state_there_is_no_driver() {
    let (code, out, err) = text(&nvidia_smi(&[], None, &["-L"]));
    assert_eq!(code, Some(9));
    assert_eq!(
        out,
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure \
         that the latest NVIDIA driver is installed and running.\n"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("GPUSHARE_SIM_STATE"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("simulated-gpus.json");
    let (code, _, err) = text(&nvidia_smi(&[("GPUSHARE_SIM_STATE", &state)], None, &["-L"]));
    assert_eq!(code, Some(9));
    assert!(err.contains(&format!("GPUSHARE_SIM_STATE={}", state.display())), "{err}");
}

#[test]
fn the_second_reset_of_a_session_fails_when_injected() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("simulated-gpus.json");
    let record = dir.path().join("record");
    let file = NodeFile::new(&state);
    let mut node = Node::new(&parse_node_spec("a100-40gb:2").unwrap());
    for gpu in &mut node.gpus {
        gpu.persistence_mode = false;
    }
    file.write(&file.lock().unwrap(), &node).unwrap();
    let env = [("GPUSHARE_SIM_STATE", state.as_path()), ("GPUSHARE_SIM_RECORD", &record)];
    let fail = Some("gpu-reset:2");

    let (code, out, err) = text(&nvidia_smi(&env, fail, &["--gpu-reset", "-i", "0"]));
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (Some(0), "GPU 00000000:1B:00.0 was successfully reset.\nAll done.\n", "")
    );
    let (code, out, err) = text(&nvidia_smi(&env, fail, &["--gpu-reset", "-i", "1"]));
    assert_eq!(code, Some(255));
    assert!(out.contains("  GPU 00000000:1C:00.0: In use by another client\n"), "{out}");
    assert!(out.contains("Please first kill all processes using this device"), "{out}");
    assert_eq!(err.lines().count(), 1);
    assert!(err.contains("failure injected by GPUSHARE_SIM_FAIL"), "{err}");

    let node = file.read().unwrap();
    assert_eq!((node.gpus[0].reset_count, node.gpus[1].reset_count), (1, 0));
    assert_eq!(node.tool_calls["gpu-reset"], 2);
    let (code, out, _) = text(&nvidia_smi(&env, None, &["-L"]));
    assert_eq!(code, Some(0));
    assert!(
        out.ends_with(&format!("\nGPU 1: NVIDIA A100-SXM4-40GB (UUID: {})\n", node.gpus[1].uuid)),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(&record).unwrap(),
        "nvidia-smi --gpu-reset -i 0\nnvidia-smi --gpu-reset -i 1\nnvidia-smi -L\n"
    );
}
