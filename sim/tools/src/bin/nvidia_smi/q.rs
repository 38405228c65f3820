//! `-q [-d TYPES]`: the sections of nvidia-smi's query log a MIG operator reads, in the
//! real tool's order and layout (keys padded to column 54, then ` : value`), with the
//! health sections of issue 42 (`GPU Recovery Action`, `ECC Mode`, `ECC Errors`,
//! `Retired Pages`, `Remapped Rows`) from each GPU's [`gpushare_sim_nvml::health`]. A GPU
//! off the bus prints one line instead of its entry (see [`lost_line`]).

use std::fmt::Write;

use gpushare_sim_nvml::abi::types::NO_INSTANCE;
use gpushare_sim_nvml::node::{Gpu, Node};
use gpushare_sim_nvml::rules;

use crate::device;

/// The display types `-d` takes (nvidia-smi's help lists them).
const DISPLAY_TYPES: &[&str] = &[
    "MEMORY",
    "UTILIZATION",
    "ECC",
    "TEMPERATURE",
    "POWER",
    "CLOCK",
    "COMPUTE",
    "PIDS",
    "PERFORMANCE",
    "SUPPORTED_CLOCKS",
    "PAGE_RETIREMENT",
    "ACCOUNTING",
    "ENCODER_STATS",
    "SUPPORTED_GPU_TARGET_TEMP",
    "VOLTAGE",
    "FBC_STATS",
    "ROW_REMAPPER",
    "GSP_FIRMWARE_VERSION",
    "POWER_SMOOTHING",
    "POWER_PROFILES",
];

/// What `-d` selected: `None` for everything.
pub struct Display(Option<Vec<&'static str>>);

impl Display {
    /// Parses `-d MEMORY,COMPUTE` (any case); `None` for a type nvidia-smi lacks.
    pub fn parse(text: Option<&str>) -> Option<Display> {
        let Some(text) = text else { return Some(Display(None)) };
        let types = text
            .split(',')
            .map(|t| DISPLAY_TYPES.iter().copied().find(|d| d.eq_ignore_ascii_case(t.trim())))
            .collect::<Option<Vec<_>>>()?;
        Some(Display(Some(types)))
    }

    /// Whether the whole log is shown (no `-d`).
    fn all(&self) -> bool {
        self.0.is_none()
    }

    fn shows(&self, kind: &str) -> bool {
        self.0.as_ref().is_none_or(|types| types.contains(&kind))
    }
}

/// The log's lines, written at a depth of indentation.
struct Log(String);

impl Log {
    /// `key : value`, the key indented and padded as nvidia-smi pads it.
    fn value(&mut self, depth: usize, key: &str, value: impl std::fmt::Display) {
        let key = format!("{}{key}", "    ".repeat(depth));
        let _ = writeln!(self.0, "{key:<54} : {value}");
    }

    /// A section's title.
    fn section(&mut self, depth: usize, title: &str) {
        let _ = writeln!(self.0, "{}{title}", "    ".repeat(depth));
    }

    fn memory(&mut self, depth: usize, memory: device::Memory) {
        self.section(depth, "FB Memory Usage");
        self.value(depth + 1, "Total", format_args!("{} MiB", memory.total));
        self.value(depth + 1, "Reserved", format_args!("{} MiB", memory.reserved));
        self.value(depth + 1, "Used", format_args!("{} MiB", memory.used));
        self.value(depth + 1, "Free", format_args!("{} MiB", memory.free()));
    }
}

/// The query log of the GPUs at `indexes`.
pub fn render(node: &Node, indexes: &[usize], display: &Display) -> String {
    let mut log = Log(String::new());
    let (timestamp, _) = device::local_time("%a %b %e %H:%M:%S %Y");
    log.0.push_str("\n==============NVSMI LOG==============\n\n");
    log.value(0, "Timestamp", timestamp);
    log.value(0, "Driver Version", device::DRIVER_VERSION);
    log.value(0, "CUDA Version", device::CUDA_VERSION);
    log.0.push('\n');
    log.value(0, "Attached GPUs", node.gpus.len());
    for &index in indexes {
        if node.gpus[index].health.lost {
            let _ = writeln!(log.0, "{}", lost_line(&node.gpus[index]));
            continue;
        }
        gpu(&mut log, node, index, display);
        log.0.push('\n');
    }
    log.0
}

/// What nvidia-smi prints for a GPU that fell off the bus, in place of its entry (as
/// operators' transcripts show it, the bus id with a 4-digit domain; not recorded here);
/// the command then exits 15.
pub fn lost_line(g: &Gpu) -> String {
    let bus = g.pci_bus_id.get(4..).unwrap_or(&g.pci_bus_id);
    format!(
        "Unable to determine the device handle for GPU{bus}: GPU is lost.  Reboot the system to recover this GPU"
    )
}

fn gpu(log: &mut Log, node: &Node, index: usize, display: &Display) {
    let g = &node.gpus[index];
    log.section(0, &format!("GPU {}", g.pci_bus_id));
    if display.all() {
        log.value(1, "Product Name", g.name());
        log.value(1, "Product Brand", device::brand(g));
        log.value(1, "Product Architecture", device::architecture(g));
        log.value(1, "Persistence Mode", device::enabled(g.persistence_mode));
        log.section(1, "MIG Mode");
        let (current, pending) = device::mig_modes(g).unwrap_or(("N/A", "N/A"));
        log.value(2, "Current", current);
        log.value(2, "Pending", pending);
        if g.mig_enabled {
            mig_devices(log, node, index);
        }
        log.value(1, "Serial Number", device::serial(g));
        log.value(1, "GPU UUID", &g.uuid);
        log.value(1, "Minor Number", g.minor_number);
        log.value(1, "Board ID", format_args!("{:#x}", device::board_id(g)));
        log.value(1, "GPU Recovery Action", g.health.recovery_action.smi_text());
        let pci = device::pci(g);
        log.section(1, "PCI");
        log.value(2, "Bus", format_args!("0x{:02X}", pci.bus));
        log.value(2, "Device", format_args!("0x{:02X}", pci.device));
        log.value(2, "Domain", format_args!("0x{:04X}", pci.domain));
        log.value(2, "Device Id", format_args!("0x{:08X}", device::device_id(g)));
        log.value(2, "Bus Id", &g.pci_bus_id);
        log.value(2, "Sub System Id", format_args!("0x{:08X}", device::subsystem_id(g)));
    }
    if display.shows("MEMORY") {
        log.memory(1, device::memory(node, index));
    }
    if display.shows("COMPUTE") {
        log.value(1, "Compute Mode", device::compute_mode(g.compute_mode));
    }
    if display.shows("ECC") {
        ecc(log, g);
    }
    if display.shows("PAGE_RETIREMENT") {
        log.section(1, "Retired Pages");
        log.value(2, "Single Bit ECC", "N/A");
        log.value(2, "Double Bit ECC", "N/A");
        log.value(2, "Pending Page Blacklist", "N/A");
    }
    if display.shows("ROW_REMAPPER") {
        remapped_rows(log, g);
    }
    if display.shows("PIDS") {
        processes(log, node, index);
    }
}

/// `ECC Mode` and `ECC Errors`, as the real H100 lays them out: the simulated counts are
/// device memory's (DRAM), SRAM's are 0.
fn ecc(log: &mut Log, g: &Gpu) {
    log.section(1, "ECC Mode");
    log.value(2, "Current", "Enabled");
    log.value(2, "Pending", "Enabled");
    log.section(1, "ECC Errors");
    let e = g.health.ecc;
    for (title, corrected, uncorrected) in [
        ("Volatile", e.corrected_volatile, e.uncorrected_volatile),
        ("Aggregate", e.corrected_aggregate, e.uncorrected_aggregate),
    ] {
        log.section(2, title);
        log.value(3, "SRAM Correctable", 0);
        log.value(3, "SRAM Uncorrectable Parity", 0);
        log.value(3, "SRAM Uncorrectable SEC-DED", 0);
        log.value(3, "DRAM Correctable", corrected);
        log.value(3, "DRAM Uncorrectable", uncorrected);
    }
    log.value(3, "SRAM Threshold Exceeded", "No");
    log.section(2, "Aggregate Uncorrectable SRAM Sources");
    for source in ["SRAM L2", "SRAM SM", "SRAM Microcontroller", "SRAM PCIE", "SRAM Other"] {
        log.value(3, source, 0);
    }
    log.value(2, "Channel Repair Pending", "No");
    log.value(2, "TPC Repair Pending", "No");
    log.value(2, "Unrepairable Memory", "No");
}

/// `Remapped Rows`: N/A on a MIG-enabled GPU with GPU instances, where NVML does not
/// answer them (nvml.h); the histogram as [`gpushare_sim_nvml::health::GpuHealth::remap_histogram`].
fn remapped_rows(log: &mut Log, g: &Gpu) {
    let known = g.remaps_answered();
    let shown = |v: String| if known { v } else { "N/A".to_string() };
    let yes_no = |b: bool| shown(if b { "Yes" } else { "No" }.to_string());
    let r = g.health.remap;
    log.section(1, "Remapped Rows");
    log.value(2, "Correctable Error", shown(r.correctable.to_string()));
    log.value(2, "Inactive Correctable Error", shown("0".into()));
    log.value(2, "Uncorrectable Error", shown(r.uncorrectable.to_string()));
    log.value(2, "Inactive Uncorrectable Error", shown("0".into()));
    log.value(2, "Pending", yes_no(r.pending));
    log.value(2, "Remapping Failure Occurred", yes_no(r.failure));
    log.section(2, "Bank Remap Availability Histogram");
    let banks = g.health.remap_histogram();
    for (name, n) in ["Max", "High", "Partial", "Low", "None"].into_iter().zip(banks) {
        log.value(3, name, shown(format!("{n} bank(s)")));
    }
}

/// `MIG Devices`: one entry per MIG device, in NVML's device order, with the engines
/// it shares (its GPU instance's) and its memory.
fn mig_devices(log: &mut Log, node: &Node, index: usize) {
    let g = &node.gpus[index];
    let devices = rules::mig_devices(g);
    if devices.is_empty() {
        log.value(1, "MIG Devices", "None");
        return;
    }
    log.section(1, "MIG Devices");
    for (device_index, (gi_id, ci_id, _)) in devices.into_iter().enumerate() {
        let Some(gi) = g.instance(gi_id) else { continue };
        let profile = rules::profile_of(g, gi);
        let sms = device::mig_device_sms(g, gi, ci_id);
        log.section(2, "MIG Device");
        log.value(3, "Index", device_index);
        log.value(3, "GPU Instance ID", gi_id);
        log.value(3, "Compute Instance ID", ci_id);
        log.section(3, "Device Attributes");
        log.section(4, "Shared");
        let e = profile.engines;
        log.value(5, "Multiprocessor count", sms);
        log.value(5, "Copy Engine count", e.copy);
        log.value(5, "Encoder count", e.encoders);
        log.value(5, "Decoder count", e.decoders);
        log.value(5, "OFA count", e.ofa);
        log.value(5, "JPG count", e.jpeg);
        log.memory(3, device::mig_memory(node, index, gi_id, ci_id));
    }
}

/// `Processes`: `None`, or each compute process with its GPU and compute instance.
fn processes(log: &mut Log, node: &Node, index: usize) {
    let views = rules::processes(node, index as u32, None).unwrap_or_default();
    if views.is_empty() {
        log.value(1, "Processes", "None");
        return;
    }
    let id = |v: u32| if v == NO_INSTANCE { "N/A".to_string() } else { v.to_string() };
    log.section(1, "Processes");
    for view in views {
        log.value(2, "GPU instance ID", id(view.gpu_instance));
        log.value(2, "Compute instance ID", id(view.compute_instance));
        log.value(2, "Process ID", view.pid);
        log.value(2, "Type", device::process_type(&view));
        log.value(2, "Used GPU Memory", format_args!("{} MiB", device::process_mib(&view)));
    }
}
