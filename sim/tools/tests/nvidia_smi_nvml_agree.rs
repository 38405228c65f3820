//! The summary's temperature, power draw, GPU-Util and memory are the simulated NVML
//! library's answers for the same node: both take the load rule from
//! `gpushare_sim_nvml::device::readings`, and this checks the table shows what NVML's
//! calls answer. The library is called
//! in this test's own process (one test in this file: it sets the environment NVML reads).

mod smi;

use std::os::raw::c_uint;

use gpushare_sim_nvml::abi::device_info::{
    NVML_TEMPERATURE_GPU, nvmlDeviceGetHandleByIndex, nvmlDeviceGetPowerUsage,
    nvmlDeviceGetTemperature, nvmlDeviceGetUtilizationRates, nvmlUtilization_t,
};
use gpushare_sim_nvml::abi::exports::{nvmlDeviceGetMemoryInfo_v2, nvmlInit_v2, nvmlShutdown};
use gpushare_sim_nvml::abi::types::{nvmlDevice_t, nvmlMemory_v2, nvmlMemory_v2_t, ret};
use gpushare_sim_nvml::node::Process;
use smi::Sim;

/// What the simulated NVML answers for GPU `index`: (°C, W, GPU-Util or None, used MiB).
fn nvml_readings(index: u32) -> (u32, u32, Option<u32>, u64) {
    let mut device: nvmlDevice_t = std::ptr::null_mut();
    let (mut temp, mut power): (c_uint, c_uint) = (0, 0);
    let mut util = nvmlUtilization_t::default();
    let mut memory =
        nvmlMemory_v2_t { version: nvmlMemory_v2, total: 0, reserved: 0, free: 0, used: 0 };
    // SAFETY: live locals as nvml.h's out-pointers, the handle the library just gave.
    unsafe {
        assert_eq!(nvmlDeviceGetHandleByIndex(index, &mut device), ret::SUCCESS);
        assert_eq!(nvmlDeviceGetTemperature(device, NVML_TEMPERATURE_GPU, &mut temp), 0);
        assert_eq!(nvmlDeviceGetPowerUsage(device, &mut power), ret::SUCCESS);
        assert_eq!(nvmlDeviceGetMemoryInfo_v2(device, &mut memory), ret::SUCCESS);
        let util = match nvmlDeviceGetUtilizationRates(device, &mut util) {
            ret::SUCCESS => Some(util.gpu),
            code => {
                assert_eq!(code, ret::NOT_SUPPORTED);
                None
            }
        };
        (temp, power / 1000, util, memory.used >> 20)
    }
}

/// The same figures read off the summary's second line of GPU `index`.
fn summary_readings(out: &str, index: usize) -> (u32, u32, Option<u32>, u64) {
    let line = out.lines().nth(9 + 4 * index).unwrap();
    let cells: Vec<&str> = line.split('|').collect();
    let left: Vec<&str> = cells[1].split_whitespace().collect();
    let temp = left[1].trim_end_matches('C').parse().unwrap();
    let power = left[3].trim_end_matches('W').parse().unwrap();
    let used = cells[2].split_whitespace().next().unwrap().trim_end_matches("MiB").parse().unwrap();
    let util = cells[3].split_whitespace().next().unwrap();
    let util = (util != "N/A").then(|| util.trim_end_matches('%').parse().unwrap());
    (temp, power, util, used)
}

#[test]
fn the_summary_shows_what_the_simulated_nvml_answers() {
    let sim = Sim::new("h100-80gb:3");
    assert_eq!(sim.run(&["-mig", "1", "-i", "2"]).1, 0);
    assert_eq!(sim.run(&["mig", "-i", "2", "-cgi", "1g.10gb", "-C"]).1, 0);
    let gi = sim.node().gpus[2].instances[0].id;
    sim.change(|node| {
        node.processes = (0..4)
            .map(|n: u32| Process {
                memory: u64::from(n + 1) << 28,
                ..Process::new(1, None, 5_000_000 + n)
            })
            .chain([Process::new(2, Some(gi), 5_000_100)])
            .collect();
    });
    for (key, value) in
        [("GPUSHARE_SIM_NODE", "h100-80gb:3".into()), ("GPUSHARE_SIM_STATE", sim.state())]
    {
        // SAFETY: this file's only test, so no other thread reads the environment.
        unsafe { std::env::set_var(key, value) };
    }
    for key in ["GPUSHARE_SIM_PROCESSES", "GPUSHARE_SIM_FAIL", "GPUSHARE_SIM_REBOOT"] {
        // SAFETY: as above.
        unsafe { std::env::remove_var(key) };
    }
    // SAFETY: no arguments; the library reads the environment set above.
    assert_eq!(unsafe { nvmlInit_v2() }, ret::SUCCESS);
    let out = sim.ok(&[]);
    for index in 0..3 {
        let nvml = nvml_readings(index as u32);
        assert_eq!(summary_readings(&out, index), nvml, "GPU {index}:\n{out}");
    }
    // Idle, busy (capped nowhere yet), MIG on.
    assert_eq!(nvml_readings(0), (35, 73, Some(0), 0));
    assert_eq!(nvml_readings(1).0, 47);
    assert_eq!(nvml_readings(2).2, None);
    // SAFETY: matches the init above.
    assert_eq!(unsafe { nvmlShutdown() }, ret::SUCCESS);
}
