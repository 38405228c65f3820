//! What nvidia-smi shows of a GPU beyond the node's own fields: figures derived the way
//! the simulated driver derives them for NVML (serial, PCI subsystem id, board id,
//! reserved and used memory), so that the tool and the library answer alike, and the
//! words nvidia-smi prints for modes.

use gpushare_catalog::Architecture;
use gpushare_sim_nvml::device::Readings;
use gpushare_sim_nvml::node::{ComputeMode, Gpu, GpuInstance, Node};
use gpushare_sim_nvml::rules;

/// The driver's version (`nvmlSystemGetDriverVersion`).
pub use gpushare_sim_nvml::abi::exports::DRIVER_VERSION;

/// The CUDA version driver 580 reports (the real H100 printed 13.0).
pub const CUDA_VERSION: &str = "13.0";
/// Framebuffer memory the driver keeps for itself (memory v2's `reserved`), in MiB.
pub const RESERVED_MIB: u64 = gpushare_sim_nvml::device::RESERVED_BYTES >> 20;
/// A process's GPU memory as nvidia-smi shows it, in MiB (the real tool showed 2370MiB for
/// NVML's 2485125120 bytes).
pub fn process_mib(p: &rules::ProcessView) -> u64 {
    p.memory >> 20
}

/// A process's name as nvidia-smi shows it: the first word of its command line
/// (`/proc/<pid>/cmdline`'s argv[0]: `python3`, `nvidia-cuda-mps-server`, a full path
/// when the program was started by one), else its `comm`, `[Not Found]` when neither can
/// be read (a fake PID, or one in another PID namespace, as published transcripts of the
/// real tool show). argv[0], not `comm`: the real tool showed `nvidia-cuda-mps-server`
/// (tests/device/results/clients-h200-2026-11-27/smi.txt), which `comm` cuts to 15 bytes,
/// and published transcripts show paths (`/usr/bin/python`) where `comm` has none.
pub fn process_name(pid: u32) -> String {
    let argv0 = std::fs::read(format!("/proc/{pid}/cmdline")).ok().and_then(|line| {
        let first = line.split(|&b| b == 0).next().unwrap_or_default();
        let first = String::from_utf8_lossy(first).trim().to_string();
        (!first.is_empty()).then_some(first)
    });
    argv0
        .or_else(|| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
        })
        .unwrap_or_else(|| "[Not Found]".into())
}

/// nvidia-smi's process type: `C` (compute), `M+C` for an MPS client (as the real tool
/// showed one on driver 580).
pub fn process_type(p: &rules::ProcessView) -> &'static str {
    if p.mps { "M+C" } else { "C" }
}
/// What nvidia-smi prints for a value it cannot read.
pub const NOT_AVAILABLE: &str = "[N/A]";

// Serial, PCI address and ids as the simulated driver reports them (one definition).
pub use gpushare_sim_nvml::device::{PciAddress, board_id, device_id, pci, serial, subsystem_id};

/// `Product Brand`.
pub fn brand(g: &Gpu) -> &'static str {
    if g.name().contains("GeForce") { "GeForce" } else { "NVIDIA" }
}

/// `Product Architecture`.
pub fn architecture(g: &Gpu) -> &'static str {
    match g.model().architecture {
        Architecture::Ampere => "Ampere",
        Architecture::Hopper => "Hopper",
        Architecture::AdaLovelace => "Ada Lovelace",
        Architecture::Blackwell => "Blackwell",
        Architecture::Other => "Unknown",
    }
}

/// Framebuffer memory in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub total: u64,
    pub reserved: u64,
    pub used: u64,
}

impl Memory {
    pub fn free(self) -> u64 {
        self.total.saturating_sub(self.reserved + self.used)
    }
}

/// A GPU's memory: the driver's reserve, and what its compute processes use.
pub fn memory(node: &Node, index: usize) -> Memory {
    let g = &node.gpus[index];
    let used = used_mib(rules::processes(node, index as u32, None).unwrap_or_default());
    Memory { total: g.model().memory_mib, reserved: RESERVED_MIB, used }
}

/// The SMs of MIG device `ci` of GPU instance `gi`: its compute-instance profile's, or the
/// GPU instance's when that profile is not known.
pub fn mig_device_sms(g: &Gpu, gi: &GpuInstance, ci: u32) -> u32 {
    let profile = rules::profile_of(g, gi);
    gi.compute_instances
        .iter()
        .find(|c| c.id == ci)
        .and_then(|c| rules::ci_profile(g, gi, c.profile_id).ok())
        .map_or(profile.sms, |p| p.sms)
}

/// A MIG device's memory: its GPU instance's, none reserved, what its processes use.
pub fn mig_memory(node: &Node, index: usize, gi: u32, ci: u32) -> Memory {
    let g = &node.gpus[index];
    let total = g.instance(gi).map_or(0, |i| rules::profile_of(g, i).memory_mib);
    let used = used_mib(rules::processes(node, index as u32, Some((gi, ci))).unwrap_or_default());
    Memory { total, reserved: 0, used }
}

/// What processes use together, in MiB.
fn used_mib(processes: Vec<rules::ProcessView>) -> u64 {
    processes.iter().map(|p| p.memory).sum::<u64>() >> 20
}

/// What the simulated driver's sensors read for GPU `index` (the library's own rule,
/// [`gpushare_sim_nvml::device::readings`], as its NVML calls answer it).
pub fn readings(node: &Node, index: usize) -> Readings {
    u32::try_from(index)
        .ok()
        .and_then(|i| gpushare_sim_nvml::device::readings(node, i))
        .expect("a GPU of the node")
}

/// The enforced power limit in watts nvidia-smi shows beside the draw, where a real one of
/// the model was seen: 700 W on the recorded H100 80GB HBM3 (q.txt, "Current Power
/// Limit") and H200 (clients-h200-2026-11-27/smi.txt); 400 W on A100-SXM4-40GB/80GB and
/// 165 W on the A30 in published transcripts (drivers 535 to 590). `None` (nvidia-smi
/// prints N/A) for the other models: neither the catalog nor the simulated NVML holds a
/// power limit.
pub fn power_cap_w(g: &Gpu) -> Option<u32> {
    match g.model().key.as_str() {
        "h100-80gb" | "h200-141gb" => Some(700),
        "a100-40gb" | "a100-80gb" => Some(400),
        "a30-24gb" => Some(165),
        _ => None,
    }
}

/// `Enabled` / `Disabled`.
pub fn enabled(on: bool) -> &'static str {
    if on { "Enabled" } else { "Disabled" }
}

/// The compute mode as nvidia-smi writes it.
pub fn compute_mode(mode: ComputeMode) -> &'static str {
    match mode {
        ComputeMode::Default => "Default",
        ComputeMode::Prohibited => "Prohibited",
        ComputeMode::ExclusiveProcess => "Exclusive_Process",
    }
}

/// The current and pending MIG modes; `None` for a GPU without MIG (nvidia-smi: N/A).
pub fn mig_modes(g: &Gpu) -> Option<(&'static str, &'static str)> {
    g.model().supports_mig().then(|| (enabled(g.mig_enabled), enabled(g.mig_mode_after_reset())))
}

/// The local time formatted by `strftime(format)`, and its milliseconds.
pub fn local_time(format: &str) -> (String, u32) {
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let local = gpushare_base::local_time::format(now.as_secs(), format).unwrap_or_default();
    (local, now.subsec_millis())
}
