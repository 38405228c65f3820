//! NVIDIA's own clients on the simulated driver (issue 25): nvidia-ml-py (PyPI's
//! `nvidia-ml-py`, which CI installs) reads a simulated H100 as the real H100 answered it
//! (tests/device/results/nvidia-tools-2026-11-27), runs a whole MIG session with the
//! driver's codes, and sees the same node as the agent at the same time.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use gpushare_tests::{Agent, AgentOptions, repo_root, simulated_library, text};

/// Fails the test, saying how to get it, when nvidia-ml-py is not installed.
fn require_pynvml() {
    let found = Command::new("python3").args(["-c", "import pynvml"]).output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "these tests drive the simulator with NVIDIA's nvidia-ml-py: python3 -m pip install nvidia-ml-py==13.615.71 (.ci/run does)"
    );
}

/// python3 with nvidia-ml-py loading the simulated driver, on the node `spec` kept in
/// `state`, as another NVML client on the host: none of the agent's knobs of its own.
pub(crate) fn pynvml_python(spec: &str, state: &Path) -> Command {
    require_pynvml();
    let mut python = Command::new("python3");
    python
        .env("PYNVML_LIB", simulated_library())
        .env("GPUSHARE_SIM_NODE", spec)
        .env("GPUSHARE_SIM_STATE", state)
        .env_remove("GPUSHARE_SIM_PROCESSES")
        .env_remove("GPUSHARE_SIM_FAIL")
        .env_remove("GPUSHARE_SIM_REBOOT")
        .env_remove("GPUSHARE_SIM_DELAY_MS")
        .stdin(Stdio::null());
    python
}

/// Runs `script` (under tests/nvidia) with [`pynvml_python`].
fn pynvml(script: &str, spec: &str, state: &Path) -> Output {
    pynvml_python(spec, state)
        .arg(repo_root().join("tests/nvidia").join(script))
        .output()
        .expect("python3 runs")
}

#[test]
fn nvidia_ml_py_reads_a_simulated_h100_as_the_real_one_answered() {
    let dir = tempfile::tempdir().unwrap();
    let out = pynvml("pynvml_readonly.py", "h100-80gb:1", &dir.path().join("node.json"));
    assert!(out.status.success(), "{}", text(&out));
    let simulated = dir.path().join("simulated.json");
    std::fs::write(&simulated, &out.stdout).unwrap();
    let real =
        repo_root().join("tests/device/results/nvidia-tools-2026-11-27/pynvml-readonly.json");
    let compared = Command::new("python3")
        .arg(repo_root().join("tests/nvidia/compare.py"))
        .args([&real, &simulated])
        .output()
        .unwrap();
    assert!(compared.status.success(), "{}", text(&compared));
    assert!(String::from_utf8_lossy(&compared.stdout).contains("0 differences"));
    // The comparison is not empty: engine counts, versions and memory are in it.
    let doc = String::from_utf8_lossy(&out.stdout);
    for field in
        ["\"copyEngineCount\": 8", "\"nvml_version\": \"13.580.159.04\"", "\"reserved\": 503316480"]
    {
        assert!(doc.contains(field), "{field} not in {doc}");
    }
}

#[test]
fn nvidia_ml_py_runs_a_mig_session_with_the_drivers_codes() {
    for spec in ["a100-40gb:1", "h100-80gb:1"] {
        let dir = tempfile::tempdir().unwrap();
        let out = pynvml("pynvml_mig.py", spec, &dir.path().join("node.json"));
        assert!(out.status.success(), "{spec}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok 33 checks"), "{}", text(&out));
    }
}

/// Two NVML clients at once: the agent (whose session declares a process on GPU 1) and a
/// pynvml script see the same processes and layouts; the script does not clear the
/// agent's processes (before, every client replaced them with its own, none); a MIG mode
/// change under that process on the Hopper GPU waits (IN_USE), as on Ampere.
#[test]
fn two_nvml_clients_see_the_same_processes_and_layouts() {
    require_pynvml();
    let agent =
        Agent::start(AgentOptions::simulate("h100-80gb:2").env("GPUSHARE_SIM_PROCESSES", "1:4242"));
    assert!(agent.ctl(&["apply", "half-balanced"]).status.success());
    let script = "import ctypes, os, pynvml as nv\n\
                  nv.nvmlLib = ctypes.CDLL(os.environ['PYNVML_LIB'])\n\
                  nv.nvmlInit()\n\
                  g0, g1 = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)\n\
                  print('pids', [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(g1)])\n\
                  print('used', nv.nvmlDeviceGetMemoryInfo(g1).used)\n\
                  print('mig devices', sum(1 for i in range(7) if _try(lambda: nv.nvmlDeviceGetMigDeviceHandleByIndex(g0, i))))\n\
                  print('activation', nv.nvmlDeviceSetMigMode(g1, 1))\n\
                  print('mode', nv.nvmlDeviceGetMigMode(g1))\n\
                  print('back', nv.nvmlDeviceSetMigMode(g1, 0), nv.nvmlDeviceGetMigMode(g1))\n\
                  nv.nvmlShutdown()\n";
    let script = format!(
        "def _try(f):\n    try:\n        f()\n        return True\n    except Exception:\n        return False\n{script}"
    );
    let out =
        pynvml_python("h100-80gb:2", &agent.sim_state()).args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    // 480 MiB reserved plus the process's 512 MiB.
    let expected = format!(
        "pids [4242]\nused {}\nmig devices 4\nactivation 19\nmode [0, 1]\nback 0 [0, 0]\n",
        (480u64 + 512) << 20
    );
    assert_eq!(said, expected);
    // The agent still sees its process (the script cleared nothing), and its layout.
    let status = agent.status();
    assert_eq!(status.gpus[1].processes, vec![4242], "{status:?}");
    assert_eq!(gpushare_tests::instance_profiles(&status, 0).len(), 4);
}
