//! The built cdylib loaded by nvml-wrapper, as `gpushare-agent --simulate` loads it: proves
//! the symbol set and layouts work through the real wrapper. One test function: the
//! environment is set before the only init.

mod common;

use common::library;

use std::ffi::OsStr;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::error::NvmlError;

#[test]
fn nvml_wrapper_drives_the_simulated_library() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("node.json");
    // SAFETY: the only test in this binary sets the environment before anything reads it.
    unsafe {
        std::env::set_var("GPUSHARE_SIM_NODE", "a100-40gb:2,h100-80gb:1,l40s:1");
        std::env::set_var("GPUSHARE_SIM_STATE", &state);
        std::env::set_var("GPUSHARE_SIM_PROCESSES", "3:4242");
    }
    let lib = library();
    let nvml = Nvml::builder().lib_path(OsStr::new(&lib)).init().expect("init");
    assert_eq!(nvml.sys_driver_version().unwrap(), "580.159.04");
    assert_eq!(nvml.device_count().unwrap(), 4);

    let a100 = nvml.device_by_index(0).unwrap();
    assert_eq!(a100.name().unwrap(), "NVIDIA A100-SXM4-40GB");
    assert!(a100.uuid().unwrap().starts_with("GPU-"));
    assert_eq!(a100.pci_info().unwrap().pci_device_id, 0x20B0_10DE);
    assert_eq!(a100.pci_info().unwrap().bus_id, "00000000:1B:00.0");
    assert_eq!(a100.memory_info().unwrap().total, 40960 << 20);
    assert_eq!(a100.minor_number().unwrap(), 0);
    let mode = a100.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (0, 0));
    assert_eq!(a100.compute_mode().unwrap(), ComputeMode::Default);
    assert_eq!(a100.mig_device_count().unwrap(), 0);
    assert!(a100.running_compute_processes().unwrap().is_empty());

    let mut h100 = nvml.device_by_index(2).unwrap();
    assert_eq!(h100.name().unwrap(), "NVIDIA H100 80GB HBM3");
    h100.set_compute_mode(ComputeMode::ExclusiveProcess).unwrap();
    assert_eq!(h100.compute_mode().unwrap(), ComputeMode::ExclusiveProcess);

    let l40s = nvml.device_by_index(3).unwrap();
    assert!(matches!(l40s.mig_mode(), Err(NvmlError::NotSupported)));
    let procs = l40s.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, 4242);
    assert_eq!(procs[0].gpu_instance_id, None);
    assert!(matches!(nvml.device_by_index(4), Err(NvmlError::InvalidArg)));

    // Shut down (nvml-wrapper dlcloses the library) and load it again: the state is kept.
    nvml.shutdown().unwrap();
    let nvml = Nvml::builder().lib_path(OsStr::new(&lib)).init().expect("init again");
    let h100 = nvml.device_by_index(2).unwrap();
    assert_eq!(h100.compute_mode().unwrap(), ComputeMode::ExclusiveProcess);
    assert!(state.exists());
}
