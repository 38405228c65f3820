//! A simulated NVIDIA driver library (`libgpushare_sim_nvml.so`): the C ABI of the NVML
//! functions gpushare-agent calls, over a simulated node persisted to a JSON file.
//!
//! [`node`] is the node and its state file, shared with the simulated tools
//! (`sim/tools`); [`faults`] reads the `GPUSHARE_SIM_*` knobs.

pub mod abi;
pub mod faults;
pub mod node;
