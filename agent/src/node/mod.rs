//! The model of a GPU node — what is observed of it ([`NodeState`]: GPUs, MIG
//! instances, compute processes, MPS servers and their clients, time-slice intervals) and
//! the operations that change it ([`Operation`]), and of each MPS server what its control
//! daemon says of its limits ([`mps`]). Plain data: the GPU backend and the sharing layer
//! fill it in, the planner reads it, and nothing here does I/O.

mod mps;
mod operation;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::catalog::GpuModel;
pub use mps::{
    LimitDrift, LimitOverride, LimitSource, LiveLimits, LiveServer, MpsServerDetail, MpsSpec,
    limits_text,
};
pub use operation::Operation;

/// NVML compute modes the agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMode {
    /// Any number of processes (NVML_COMPUTEMODE_DEFAULT).
    Default,
    /// One process, e.g. the MPS server (NVML_COMPUTEMODE_EXCLUSIVE_PROCESS).
    ExclusiveProcess,
    /// No compute contexts (NVML_COMPUTEMODE_PROHIBITED).
    Prohibited,
}

impl ComputeMode {
    /// The name used in status output.
    pub fn as_str(self) -> &'static str {
        match self {
            ComputeMode::Default => "default",
            ComputeMode::ExclusiveProcess => "exclusive_process",
            ComputeMode::Prohibited => "prohibited",
        }
    }
}

/// The observed state of a node: its GPUs as the GPU backend reports them, and the
/// sharing set up on them as the sharing layer finds it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeState {
    /// GPUs by NVML index.
    pub gpus: Vec<GpuState>,
    /// MPS servers the agent runs.
    pub mps: Vec<MpsServerState>,
    /// Time-slice intervals by GPU index, where they were read (an nvidia-smi run).
    pub timeslices: BTreeMap<u32, TimeSliceInterval>,
    /// What the agent knows of each MPS server of `mps` besides its state, by the device
    /// UUID it serves: configured and live limits, mode, recorded overrides.
    pub mps_details: BTreeMap<String, MpsServerDetail>,
}

/// An MPS server as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsServerState {
    /// `GPU-…` or `MIG-…` it serves.
    pub uuid: String,
    /// GPU index.
    pub gpu: u32,
    /// Placement start of the MIG instance it serves; `None` for a whole GPU.
    pub placement_start: Option<u8>,
    /// Which compute instance of that GPU instance it serves, by index in the instance's
    /// compute instances (ordered by id); 0 for a GPU instance used whole.
    pub compute_instance: u8,
    /// The limits a client connecting now gets: the live ones where the control daemon
    /// was asked ([`NodeState::with_live_limits`]), else those the agent configured (its
    /// record's, as every observation has them).
    pub limits: MpsLimits,
    /// The control daemon's pid; `None` when it is not running.
    pub pid: Option<u32>,
    /// Restarts by the supervisor.
    pub restarts: u32,
    /// PIDs of the CUDA clients of a running server, where they were read (for plans: a
    /// server with clients is not stopped unless forced); empty otherwise.
    pub clients: Vec<u32>,
    /// Whether `clients` is the control daemon's answer (it was asked, and answered), so
    /// that a client missing from it is no client of this server.
    pub clients_read: bool,
}

impl NodeState {
    /// A node of these GPUs, with no sharing observed.
    pub fn of_gpus(gpus: Vec<GpuState>) -> Self {
        NodeState { gpus, ..NodeState::default() }
    }

    /// The GPU with this index.
    pub fn gpu(&self, index: u32) -> Option<&GpuState> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The time-slice interval of GPU `index`, when it was read.
    pub fn timeslice(&self, index: u32) -> Option<TimeSliceInterval> {
        self.timeslices.get(&index).copied()
    }

    /// The memory of the device an MPS server serves — GPU `gpu` whole, or its MIG
    /// instance at slot `start` — and the device as messages name it.
    pub fn device_memory(&self, gpu: u32, start: Option<u8>) -> Option<(u64, String)> {
        let g = self.gpu(gpu)?;
        let Some(start) = start else {
            return Some((g.memory_total_bytes, g.label()));
        };
        let gi = g.instance_at(start)?;
        let profile = g.model?.profile_by_id(gi.profile_id)?;
        let name = format!("{} instance {} at slot {start}", g.label(), profile.name);
        Some((profile.memory_mib << 20, name))
    }

    /// The interval of GPU `index` when it is time-sliced: read, and not the default.
    pub fn time_sliced(&self, index: u32) -> Option<TimeSliceInterval> {
        self.timeslice(index).filter(|&interval| interval != TimeSliceInterval::Default)
    }

    /// What the agent knows of the MPS server of `uuid` besides its state.
    pub fn mps_detail(&self, uuid: &str) -> Option<&MpsServerDetail> {
        self.mps_details.get(uuid)
    }

    /// What `server` was started with: its record's limits and mode (a server without a
    /// detail, as unit tests make them, is a single-user one with its `limits`).
    pub fn mps_spec(&self, server: &MpsServerState) -> MpsSpec {
        self.mps_detail(&server.uuid)
            .map_or(MpsSpec::single_user(server.limits), MpsServerDetail::spec)
    }

    /// The same node with each server's `limits` those a client connecting now gets,
    /// where its control daemon was asked: what the views of clients and shares show.
    pub fn with_live_limits(&self) -> NodeState {
        let mut node = self.clone();
        for server in &mut node.mps {
            if let Some((live, _)) =
                self.mps_detail(&server.uuid).and_then(MpsServerDetail::for_new_clients)
            {
                server.limits = live;
            }
        }
        node
    }
}

/// The observed state of one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuState {
    /// NVML index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// NVML's name (`NVIDIA A100-SXM4-40GB`).
    pub name: String,
    /// PCI device id as NVML reports it (`0x20B010DE`).
    pub pci_device_id: u32,
    /// The catalog model, when known.
    pub model: Option<&'static GpuModel>,
    /// Total device memory in bytes.
    pub memory_total_bytes: u64,
    /// Current MIG mode; false on GPUs without MIG.
    pub mig_enabled: bool,
    /// MIG mode after the next reset, when it differs from the current one.
    pub mig_pending: Option<bool>,
    /// Compute mode.
    pub compute_mode: ComputeMode,
    /// GPU instances, ordered by placement start.
    pub instances: Vec<GpuInstance>,
    /// Compute processes on the GPU or its instances.
    pub processes: Vec<ComputeProcess>,
    /// Whether every MPS client of the GPU is among `processes`, marked: the driver
    /// answered the GPU's MPS process list (driver 580 does; an older one may lack the
    /// call), or the GPU had no compute process at all (then no MPS server runs there,
    /// which is a compute process itself, and so no client either).
    pub mps_clients_named: bool,
}

impl GpuState {
    /// The model's display name, or NVML's name for a GPU the catalog lacks.
    pub fn model_name(&self) -> &str {
        self.model.map_or(&self.name, |m| &m.display_name)
    }

    /// `GPU 2 (A100-SXM4-40GB)`, the way messages name a GPU.
    pub fn label(&self) -> String {
        format!("GPU {} ({})", self.index, self.model_name())
    }

    /// The GPU instance at placement slot `start`.
    pub fn instance_at(&self, start: u8) -> Option<&GpuInstance> {
        self.instances.iter().find(|gi| gi.placement_start == start)
    }
}

/// A MIG GPU instance.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInstance {
    /// NVML GPU instance id.
    pub id: u32,
    /// nvidia-smi/NVML profile id.
    pub profile_id: u32,
    /// First memory slot.
    pub placement_start: u8,
    /// Memory slots occupied.
    pub placement_size: u8,
    /// Compute instances inside it, ordered by id.
    pub compute_instances: Vec<ComputeInstance>,
}

impl GpuInstance {
    /// The compute slices of its compute instances, largest first (the order a plan
    /// creates them in): `[3]` for an instance of 3 slices used whole, `[1, 1, 1]` for one
    /// subdivided into three, `[]` for one without compute instances.
    pub fn compute_layout(&self) -> Vec<u8> {
        let mut sizes: Vec<u8> = self.compute_instances.iter().map(|ci| ci.slices).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        sizes
    }
}

/// A MIG compute instance.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeInstance {
    /// NVML compute instance id.
    pub id: u32,
    /// `MIG-…` of the MIG device this compute instance is.
    pub uuid: String,
    /// Its compute slices (all of its GPU instance's when it is the full-size one).
    pub slices: u8,
}

/// A process holding a compute context.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeProcess {
    /// Process id.
    pub pid: u32,
    /// GPU instance the process runs in, under MIG.
    pub gpu_instance_id: Option<u32>,
    /// GPU memory it holds, when the driver says.
    pub used_memory_bytes: Option<u64>,
    /// Whether the driver lists it as an MPS client (NVML's MPS process list; nvidia-smi's
    /// `M+C`). The driver lists MPS clients among the compute processes too, and the MPS
    /// server itself as a plain one.
    pub mps_client: bool,
}

/// Limits every client of a server starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsLimits {
    /// Default active thread percentage (1-100).
    pub active_thread_percentage: u32,
    /// Default pinned device memory limit in bytes; `None` for no limit.
    pub pinned_memory_limit_bytes: Option<u64>,
}

impl MpsLimits {
    /// How many clients these limits share a device among: as many as the thread limit
    /// gives (100 % / threads: 4 at 25 %), at least one. A profile's MPS `replicas` sets
    /// 100/replicas %, so this is its replicas again.
    pub fn shares(&self) -> u32 {
        (100 / self.active_thread_percentage.clamp(1, 100)).max(1)
    }
}

/// A pinned memory limit as MPS takes it: `2G` when whole GiB, else `<n>M`.
pub fn mps_memory_value(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if bytes.is_multiple_of(GIB) {
        format!("{}G", bytes / GIB)
    } else {
        format!("{}M", (bytes / MIB).max(1))
    }
}

/// GPU indices as runs: `0-3,6`.
pub fn index_ranges(indices: &[u32]) -> String {
    let mut indices = indices.to_vec();
    indices.sort_unstable();
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for i in indices {
        match runs.last_mut() {
            Some((_, hi)) if *hi + 1 == i => *hi = i,
            _ => runs.push((i, i)),
        }
    }
    let runs: Vec<String> = runs
        .iter()
        .map(|&(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") })
        .collect();
    runs.join(",")
}

/// A size for people: `40 GiB`, `4.75 GiB`, `999 TiB` (binary units, at most two
/// decimals).
pub fn size_text(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut unit = 0;
    while unit + 1 < UNITS.len() && bytes >= 1 << (10 * (unit + 1)) {
        unit += 1;
    }
    let value = bytes as f64 / (1u64 << (10 * unit)) as f64;
    let text = format!("{value:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} {}", UNITS[unit])
}

/// Time-slice intervals `nvidia-smi compute-policy --set-timeslice` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeSliceInterval {
    /// 0.
    Default,
    /// 1.
    Short,
    /// 2.
    Medium,
    /// 3.
    Long,
}

impl TimeSliceInterval {
    /// `default`, `short`, `medium`, `long`.
    pub fn as_str(self) -> &'static str {
        match self {
            TimeSliceInterval::Default => "default",
            TimeSliceInterval::Short => "short",
            TimeSliceInterval::Medium => "medium",
            TimeSliceInterval::Long => "long",
        }
    }

    /// Parses `default`, `short`, `medium` or `long`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "default" => Some(Self::Default),
            "short" => Some(Self::Short),
            "medium" => Some(Self::Medium),
            "long" => Some(Self::Long),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_for_people() {
        assert_eq!(size_text(40 << 30), "40 GiB");
        assert_eq!(size_text(4864 << 20), "4.75 GiB");
        assert_eq!(size_text(999 << 40), "999 TiB");
        assert_eq!(size_text(81559 << 20), "79.65 GiB");
        assert_eq!(size_text(512), "512 B");
        assert_eq!(size_text(u64::MAX), "16 EiB");
    }

    #[test]
    fn memory_values_use_the_largest_whole_unit() {
        assert_eq!(mps_memory_value(2 << 30), "2G");
        assert_eq!(mps_memory_value(512 << 20), "512M");
        assert_eq!(mps_memory_value((3 << 30) + (1 << 29)), "3584M");
        assert_eq!(mps_memory_value(1), "1M");
    }
}
