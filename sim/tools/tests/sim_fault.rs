//! `gpushare-sim-fault` on a node of its own (issue 42): each fault shows in the simulated
//! `nvidia-smi -q` where the real one shows it, `nvidia-smi -r` settles what a reset
//! settles and refuses a GPU off the bus, and bad input changes nothing.

mod smi;

use std::process::Command;

use smi::Sim;

const FAULT: &str = env!("CARGO_BIN_EXE_gpushare-sim-fault");

fn ok(sim: &Sim, args: &[&str]) {
    assert_eq!(sim.fault(args), (0, String::new()), "{args:?}");
}

/// The value at the end of `path` (keys joined by `/`) in a `-q` log.
fn value(log: &str, path: &str) -> String {
    let found =
        smi::log_entries(log).into_iter().find_map(|(p, v)| v.filter(|_| p.ends_with(path)));
    found.unwrap_or_else(|| panic!("no {path} in\n{log}")).trim().to_string()
}

#[test]
fn faults_show_in_the_query_log_and_a_reset_settles_them() {
    let sim = Sim::new("h100-80gb:2");
    let q = || sim.ok(&["-q", "-i", "0"]);
    let healthy = q();
    assert_eq!(value(&healthy, "GPU Recovery Action"), "None");
    assert_eq!(value(&healthy, "Remapped Rows/Pending"), "No");
    ok(&sim, &["ecc", "0", "--sbe", "3", "--dbe", "2"]);
    ok(&sim, &["remap", "0", "pending"]);
    ok(&sim, &["recovery", "0", "gpu-reset"]);
    ok(&sim, &["xid", "0", "48"]);
    let sick = q();
    assert_eq!(value(&sick, "GPU Recovery Action"), "GPU Reset");
    assert_eq!(value(&sick, "ECC Errors/Volatile/DRAM Correctable"), "3");
    assert_eq!(value(&sick, "ECC Errors/Volatile/DRAM Uncorrectable"), "2");
    assert_eq!(value(&sick, "ECC Errors/Aggregate/DRAM Uncorrectable"), "2");
    assert_eq!(value(&sick, "Remapped Rows/Uncorrectable Error"), "1");
    assert_eq!(value(&sick, "Remapped Rows/Pending"), "Yes");
    assert_eq!(value(&sick, "Remapped Rows/Remapping Failure Occurred"), "No");
    assert_eq!(value(&sick, "Bank Remap Availability Histogram/Max"), "2559 bank(s)");
    assert_eq!(value(&sim.ok(&["-q", "-i", "1"]), "GPU Recovery Action"), "None", "GPU 1 is well");
    let d = sim.ok(&["-q", "-i", "0", "-d", "ROW_REMAPPER"]);
    assert_eq!(value(&d, "Remapped Rows/Pending"), "Yes");
    assert!(!d.contains("ECC Errors"), "-d ROW_REMAPPER alone");
    assert_eq!(sim.node().events.last_seq, 4, "SBE, DBE, recovery action, Xid");

    // A reset (persistence mode off first) settles the remap, the volatile counts, the action.
    sim.ok(&["-pm", "0", "-i", "0"]);
    sim.ok(&["-r", "-i", "0"]);
    let reset = q();
    assert_eq!(value(&reset, "GPU Recovery Action"), "None");
    assert_eq!(value(&reset, "ECC Errors/Volatile/DRAM Correctable"), "0");
    assert_eq!(value(&reset, "ECC Errors/Aggregate/DRAM Correctable"), "3");
    assert_eq!(value(&reset, "Remapped Rows/Uncorrectable Error"), "1", "the row stays remapped");
    assert_eq!(value(&reset, "Remapped Rows/Pending"), "No");

    ok(&sim, &["remap", "0", "failure"]);
    assert_eq!(value(&q(), "Remapped Rows/Remapping Failure Occurred"), "Yes");
}

#[test]
fn a_lost_gpu_cannot_be_queried_or_reset_until_cleared() {
    let sim = Sim::new("a100-40gb:2");
    sim.change(|n| n.gpus.iter_mut().for_each(|g| g.persistence_mode = false));
    ok(&sim, &["lost", "1"]);
    let (out, status) = sim.run(&["-q"]);
    assert_eq!(status, 15, "nvidia-smi's status for a lost GPU");
    let bus = sim.node().gpus[1].pci_bus_id.clone();
    let lines: Vec<&str> = out.lines().filter(|l| l.contains(&bus[4..])).collect();
    assert_eq!(lines.len(), 1, "one line for the lost GPU:\n{out}");
    assert!(lines[0].contains("GPU is lost"), "{}", lines[0]);
    assert_eq!(value(&out, "Product Name"), "NVIDIA A100-SXM4-40GB", "GPU 0 still answers");
    let (summary, status) = sim.run(&[]);
    assert_eq!((summary.lines().count(), status), (1, 15), "the lost GPU's line alone");
    assert!(sim.run(&["-i", "0"]).0.contains("NVIDIA A100"), "GPU 0's table");
    let before = sim.node();
    let (out, status) = sim.run(&["-r", "-i", "1"]);
    assert_eq!(status, 15, "{out}");
    assert_eq!(sim.node().gpus[1].reset_count, before.gpus[1].reset_count, "not reset");
    assert_eq!(sim.run(&["-r", "-i", "0"]).1, 0, "the other GPU resets");
    ok(&sim, &["clear", "1"]);
    assert_eq!(sim.run(&["-q"]).1, 0);
    assert_eq!(sim.run(&["-r", "-i", "1"]).1, 0);
}

#[test]
fn bad_input_is_one_line_exit_2_and_nothing_changed() {
    let sim = Sim::new("h100-80gb:1");
    let before = std::fs::read(sim.state()).unwrap();
    for args in [
        &["xid", "1", "79"][..],
        &["xid", "0/1/0", "79"],
        &["xid", "0", "x"],
        &["ecc", "0"],
        &["remap", "0", "maybe"],
        &["recovery", "0", "reboot"],
        &["unplug", "0"],
        &[],
    ] {
        let (status, stderr) = sim.fault(args);
        assert_eq!(status, 2, "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("gpushare-sim-fault: "), "{stderr}");
    }
    assert_eq!(std::fs::read(sim.state()).unwrap(), before, "the node is unchanged");
    let out =
        Command::new(FAULT).args(["lost", "0"]).env_remove("GPUSHARE_SIM_STATE").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("GPUSHARE_SIM_STATE"));
}
