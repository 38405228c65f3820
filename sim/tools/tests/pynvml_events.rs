//! NVIDIA's own Python bindings (nvidia-ml-py) wait on the simulated driver's events
//! (issue 42): two `tests/nvidia/pynvml_events.py` processes register as NVIDIA's device
//! plugin does, `gpushare-sim-fault` raises an Xid on a whole GPU, one on a MIG instance
//! and an ECC error meanwhile, and each process sees each event, with its ids, in the
//! order raised; a type neither registered (a recovery action) reaches neither. Skipped
//! (said on stderr) without python3 and nvidia-ml-py.

// Shared with sim/nvml's integration tests: where cargo built the simulated library.
#[path = "../../nvml/tests/common/mod.rs"]
mod common;
mod smi;

use std::io::{BufRead, BufReader, Lines};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};

use serde_json::Value;
use smi::Sim;

const SPEC: &str = "h100-80gb:2";

fn script() -> PathBuf {
    common::workspace().join("tests/nvidia/pynvml_events.py")
}

fn have_pynvml() -> bool {
    let found = Command::new("python3").args(["-c", "import pynvml"]).output();
    found.is_ok_and(|o| o.status.success())
}

/// A waiting script: the process and its stdout's lines.
struct Waiter {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Waiter {
    fn start(sim: &Sim, count: usize) -> Waiter {
        let mut python = Command::new("python3");
        python.arg(script()).args(["--count", &count.to_string(), "--timeout-s", "120"]);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("GPUSHARE_") {
                python.env_remove(k);
            }
        }
        let mut child = python
            .env("PYNVML_LIB", common::library())
            .env("GPUSHARE_SIM_NODE", SPEC)
            .env("GPUSHARE_SIM_STATE", sim.state())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Waiter { child, lines }
    }

    fn next(&mut self) -> Value {
        let line = self.lines.next().expect("a line from pynvml_events.py").unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // Only a waiter left behind by a failed assertion still runs.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn fault(sim: &Sim, args: &[&str]) {
    let (status, stderr) = sim.fault(args);
    assert_eq!(status, 0, "{args:?}: {stderr}");
}

#[test]
fn pynvml_clients_each_see_every_event_raised() {
    if !have_pynvml() {
        gpushare_test_skip::skip(
            "needs python3 with nvidia-ml-py (python3 -m pip install nvidia-ml-py; .ci/run does)",
        );
        return;
    }
    let sim = Sim::new(SPEC);
    let gi = sim.file().update(|n| {
        n.gpus[1].mig_enabled = true;
        let gi = gpushare_sim_nvml::rules::create_gpu_instance(n, 1, 19, 0, 1).unwrap();
        gpushare_sim_nvml::rules::create_compute_instance(n, 1, gi, 0).unwrap();
        gi
    });
    let gi = gi.unwrap();
    fault(&sim, &["xid", "0", "31"]); // before anyone registered: seen by no one
    let mut waiters = [Waiter::start(&sim, 3), Waiter::start(&sim, 3)];
    for w in &mut waiters {
        assert_eq!(w.next(), serde_json::json!({"ready": 2}), "registered on both GPUs");
    }
    fault(&sim, &["xid", "0", "79"]);
    fault(&sim, &["recovery", "0", "gpu-reset"]);
    fault(&sim, &["xid", &format!("1/{gi}/0"), "43"]);
    fault(&sim, &["ecc", "1", "--dbe", "1"]);
    let whole = u64::from(u32::MAX);
    let event = |gpu: u32, t: u64, d: u64, gi: u64, ci: u64| {
        serde_json::json!({"gpu": gpu, "eventType": t, "eventData": d,
                           "gpuInstanceId": gi, "computeInstanceId": ci})
    };
    let want = [
        event(0, 8, 79, whole, whole),
        event(1, 8, 43, gi.into(), 0),
        event(1, 2, 0, whole, whole),
    ];
    for w in &mut waiters {
        for e in &want {
            assert_eq!(&w.next(), e);
        }
        let status = w.child.wait().unwrap();
        assert!(status.success(), "pynvml_events.py: {status}");
    }
}
