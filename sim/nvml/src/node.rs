//! The simulated node: its GPUs, MIG instances, compute processes, host facts and
//! tool-call counters, as the JSON state file holds them (a leaf: it uses nothing else of
//! the crate). Reading and writing that file is [`crate::state_file`]'s; the driver's
//! rules that change a node are [`crate::rules`]'.
//!
//! The serde field names are the file format the tools read: add fields with
//! `#[serde(default)]`, never rename one.

use std::collections::BTreeMap;

use gpushare_catalog::{self as catalog, GpuModel};
use serde::{Deserialize, Serialize};

use crate::health::{EventLog, GpuHealth};

/// The environment variable naming the node's JSON state file.
pub const STATE_ENV: &str = "GPUSHARE_SIM_STATE";
/// GPU memory each simulated compute process uses unless said otherwise (the simulated
/// tools report it through [`crate::device::PROCESS_MEMORY`]).
pub const PROCESS_MEMORY: u64 = 512 << 20;

/// The environment variable holding the node spec (`a100-40gb:8`, `h100-80gb:4,a30:2`).
pub const NODE_ENV: &str = "GPUSHARE_SIM_NODE";

/// NVML compute modes (`nvmlComputeMode_t`), as the state file writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMode {
    /// `NVML_COMPUTEMODE_DEFAULT` (0): any number of contexts.
    #[default]
    Default,
    /// `NVML_COMPUTEMODE_PROHIBITED` (2): no contexts.
    Prohibited,
    /// `NVML_COMPUTEMODE_EXCLUSIVE_PROCESS` (3): one process.
    ExclusiveProcess,
}

impl ComputeMode {
    /// The `nvmlComputeMode_t` value.
    pub fn nvml_value(self) -> u32 {
        match self {
            ComputeMode::Default => 0,
            ComputeMode::Prohibited => 2,
            ComputeMode::ExclusiveProcess => 3,
        }
    }

    /// The mode of an `nvmlComputeMode_t` value; `None` for `EXCLUSIVE_THREAD` (1, support
    /// removed from the driver) and values past `NVML_COMPUTEMODE_COUNT`.
    pub fn from_nvml(value: u32) -> Option<Self> {
        match value {
            0 => Some(ComputeMode::Default),
            2 => Some(ComputeMode::Prohibited),
            3 => Some(ComputeMode::ExclusiveProcess),
            _ => None,
        }
    }
}

/// The whole simulated node, as persisted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// One entry per GPU, by NVML index.
    pub gpus: Vec<Gpu>,
    /// Compute processes on the GPUs: those the `GPUSHARE_SIM_PROCESSES` of the last client
    /// that set it declared, and those the simulated MPS control daemon registered
    /// ([`Process::registered`]).
    #[serde(default)]
    pub processes: Vec<Process>,
    /// Calls of tool actions (`gpu-reset`, `set-timeslice`) counted for
    /// `GPUSHARE_SIM_FAIL`, cleared when a client that sets it starts.
    #[serde(default)]
    pub tool_calls: BTreeMap<String, u32>,
    /// The pid of the last process whose first `nvmlInit` applied knobs to the node.
    #[serde(default)]
    pub session_pid: Option<u32>,
    /// The last serial handed out to a GPU or compute instance; serials are never reused,
    /// so a handle to a destroyed instance is recognized as stale, and MIG UUIDs change on
    /// every creation.
    #[serde(default)]
    pub last_serial: u64,
    /// What the host around the GPUs holds that decides whether a GPU can be reset
    /// (`nvidia_drm`, NVSwitches, Fabric Manager), shown as files in the simulated host
    /// directory beside the state file ([`crate::host`]).
    #[serde(default)]
    pub host: Host,
    /// The driver events raised on the GPUs (issue 42), for every client's event sets.
    #[serde(default, skip_serializing_if = "EventLog::is_empty")]
    pub events: EventLog,
}

/// The host around the simulated GPUs, as far as GPU resets care (issue 26, point 5).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// The `nvidia_drm` kernel module, when loaded.
    #[serde(default)]
    pub nvidia_drm: Option<NvidiaDrm>,
    /// NVSwitch PCI functions (six on an HGX A100 baseboard); every GPU of the node is on
    /// their fabric.
    #[serde(default)]
    pub nvswitches: u8,
    /// Whether NVIDIA Fabric Manager runs (only meaningful with NVSwitches).
    #[serde(default)]
    pub fabric_manager: FabricManager,
    /// The CPUs local to GPUs of a host of several NUMA nodes, as CPU lists (`0-3,8`) by
    /// GPU index (issue 27: a bench pins its replicas there); empty: one NUMA node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub numa: BTreeMap<u32, String>,
}

/// The loaded `nvidia_drm` module's parameters (`/sys/module/nvidia_drm/parameters/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvidiaDrm {
    /// `modeset`: with it, nvidia-drm allocates an NVKMS device on every GPU at load and
    /// keeps it open, so resets find the GPU "In use by another client".
    pub modeset: bool,
}

/// NVIDIA Fabric Manager (`nv-fabricmanager`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FabricManager {
    /// Running (its pid file names a live `nv-fabricmanager`).
    #[default]
    Running,
    /// Not running (no pid file).
    Stopped,
}

/// `nvmlGpuVirtualizationMode_t`: how the GPU is virtualized, as NVML reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VirtualizationMode {
    /// `NVML_GPU_VIRTUALIZATION_MODE_NONE` (0): bare metal.
    #[default]
    None,
    /// `NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH` (1): passed through to a VM (this node is
    /// the VM; a cloud GPU VM reports this).
    Passthrough,
    /// `NVML_GPU_VIRTUALIZATION_MODE_VGPU` (2): a vGPU inside a VM.
    Vgpu,
    /// `NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU` (3): a hypervisor host in vGPU mode.
    HostVgpu,
    /// `NVML_GPU_VIRTUALIZATION_MODE_HOST_VSGA` (4): a hypervisor host in vSGA mode.
    HostVsga,
}

impl VirtualizationMode {
    /// The `nvmlGpuVirtualizationMode_t` value.
    pub fn nvml_value(self) -> u32 {
        match self {
            VirtualizationMode::None => 0,
            VirtualizationMode::Passthrough => 1,
            VirtualizationMode::Vgpu => 2,
            VirtualizationMode::HostVgpu => 3,
            VirtualizationMode::HostVsga => 4,
        }
    }
}

/// One simulated GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// The catalog model key (`a100-40gb`).
    pub model: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, stable per model and index.
    pub uuid: String,
    /// `00000000:XX:00.0`.
    pub pci_bus_id: String,
    /// The minor number of `/dev/nvidiaN` (the index).
    pub minor_number: u32,
    /// The current MIG mode.
    pub mig_enabled: bool,
    /// The MIG mode that takes effect at the next reset (Ampere), when it differs.
    #[serde(default)]
    pub mig_pending: Option<bool>,
    /// The compute mode.
    pub compute_mode: ComputeMode,
    /// Persistence mode; on by default (a host running nvidia-persistenced).
    #[serde(default = "default_persistence_mode")]
    pub persistence_mode: bool,
    /// `nvidia-smi compute-policy --set-timeslice` value, 0 (default) to 3.
    #[serde(default)]
    pub timeslice: u8,
    /// GPU resets so far.
    #[serde(default)]
    pub reset_count: u64,
    /// The GPU instances.
    #[serde(default)]
    pub instances: Vec<GpuInstance>,
    /// How NVML reports the GPU virtualized (`nvmlDeviceGetVirtualizationMode`).
    #[serde(default)]
    pub virtualization_mode: VirtualizationMode,
    /// Whether the GPU's PCI function offers a function-level reset (its PCIe Device
    /// Capabilities' FLR bit, the `flr` of sysfs `reset_method`). On by default, as on
    /// bare metal and on the cloud H100 VM gpushare was tested on; a VM whose hypervisor
    /// hides it cannot reset the GPU.
    #[serde(default = "default_flr")]
    pub flr: bool,
    /// Its faults (issue 42); healthy by default and then not written.
    #[serde(default, skip_serializing_if = "GpuHealth::is_healthy")]
    pub health: GpuHealth,
}

fn default_persistence_mode() -> bool {
    true
}

fn default_flr() -> bool {
    true
}

/// One MIG GPU instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInstance {
    /// The instance id within the GPU.
    pub id: u32,
    /// The GPU-instance profile id (nvidia-smi's, `ProfileInfo.id`).
    pub profile_id: u32,
    /// First memory slot.
    pub start: u8,
    /// Memory slots occupied.
    pub size: u8,
    /// Unique over the node's life (see [`Node::last_serial`]).
    pub serial: u64,
    /// The compute instances.
    #[serde(default)]
    pub compute_instances: Vec<ComputeInstance>,
}

impl GpuInstance {
    /// The compute instance with this id.
    pub fn compute_instance(&self, id: u32) -> Option<&ComputeInstance> {
        self.compute_instances.iter().find(|c| c.id == id)
    }
}

/// One compute instance inside a GPU instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputeInstance {
    /// The instance id within the GPU instance.
    pub id: u32,
    /// The compute-instance profile id (the `NVML_COMPUTE_INSTANCE_PROFILE_*` enum it was
    /// created from, as NVML's `ProfileInfo.id` is on real GPUs).
    pub profile_id: u32,
    /// First compute slice within the GPU instance.
    #[serde(default)]
    pub start: u8,
    /// Compute slices occupied.
    #[serde(default)]
    pub size: u8,
    /// `MIG-…`, new on every creation.
    pub uuid: String,
    /// Unique over the node's life.
    pub serial: u64,
}

/// A compute process on a GPU, or inside one of its GPU instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// GPU index.
    pub gpu: u32,
    /// GPU instance id, when the process runs inside one.
    #[serde(default)]
    pub gpu_instance: Option<u32>,
    /// Process id.
    pub pid: u32,
    /// The GPU memory it uses, in bytes, as NVML's `usedGpuMemory` and nvidia-smi report
    /// it ([`PROCESS_MEMORY`] unless said otherwise).
    #[serde(default = "default_process_memory")]
    pub memory: u64,
    /// Whether it is a client of an MPS server: the driver lists it among the compute
    /// processes and in `nvmlDeviceGetMPSComputeRunningProcesses`, nvidia-smi as `M+C`.
    #[serde(default)]
    pub mps: bool,
    /// Registered by a simulated program (the simulated MPS control daemon) for a process
    /// it was told of, rather than declared by `GPUSHARE_SIM_PROCESSES`: listed only while
    /// its PID runs ([`pid_alive`]), as the real driver drops a process's entry when it exits.
    #[serde(default)]
    pub registered: bool,
    /// For an MPS client, the PID of the simulated MPS daemon that registered it: listed
    /// only while that process lives too, as a real client's context (and so its entry)
    /// goes with its server when the server dies.
    #[serde(default)]
    pub server: Option<u32>,
    /// Declared by `GPUSHARE_SIM_PROCESSES` for a PID that ran in the declaring process's
    /// PID namespace: listed while it runs, as the real driver drops an ended process. A
    /// declared PID that did not run there stands for a process of another PID namespace
    /// (a container's, which the host's driver lists by its host PID) and is listed until
    /// the knob or a reboot says otherwise.
    #[serde(default)]
    pub runs_here: bool,
}

fn default_process_memory() -> u64 {
    PROCESS_MEMORY
}

impl Process {
    /// A process as `GPUSHARE_SIM_PROCESSES` declares it: not an MPS client, listed until
    /// the knob or a reboot says otherwise, using [`PROCESS_MEMORY`].
    pub fn new(gpu: u32, gpu_instance: Option<u32>, pid: u32) -> Process {
        Process {
            gpu,
            gpu_instance,
            pid,
            memory: default_process_memory(),
            mps: false,
            registered: false,
            server: None,
            runs_here: false,
        }
    }

    /// Whether the driver lists it now: while its PID (and its MPS server's, when it has
    /// one) lives when [`Process::registered`] or [`Process::runs_here`]; else always.
    pub fn listed(&self) -> bool {
        if !self.registered && !self.runs_here {
            return true;
        }
        pid_alive(self.pid) && self.server.is_none_or(pid_alive)
    }
}

/// Whether the process of this PID still runs, as the driver counts one: gpushare's one
/// rule, [`gpushare_base::process::alive`] (a zombie whose every thread has exited has
/// ended; its CUDA contexts went at its exit, and the driver's entries with them; a zombie
/// leader whose other threads run on still holds the GPU). The simulated driver lists a
/// registered process, and the simulated MPS control daemon a client, only while this
/// holds.
pub fn pid_alive(pid: u32) -> bool {
    gpushare_base::process::alive(pid)
}

/// Why `nvidia-smi --gpu-reset` refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetRefused {
    /// No GPU at that index.
    NoSuchGpu,
    /// The GPU fell off the bus ([`GpuHealth::lost`]): only a reboot brings it back.
    Lost,
    /// Compute processes hold the GPU.
    InUse {
        /// Their pids.
        pids: Vec<u32>,
    },
    /// Persistence mode is on: nvidia-persistenced keeps the GPU open ("In use by another
    /// client").
    PersistenceMode,
    /// `nvidia_drm` is loaded with `modeset=Y`: its NVKMS device keeps the GPU open ("In
    /// use by another client", NVIDIA/mig-parted#181).
    NvidiaDrm,
    /// The GPU cannot be reset here at all ("Resetting GPU … is not supported."): a vGPU
    /// guest, or a VM whose PCI function offers no function-level reset (the MIG user
    /// guide's passthrough example).
    NotSupported,
    /// An Ampere GPU on an NVSwitch fabric without Fabric Manager: only all its NVLink
    /// peers together can be reset (nvidia-smi(1), `-r`); these are the ones missing.
    NvLinkPeers {
        /// Indexes of the peers that must be reset in the same command.
        missing: Vec<usize>,
    },
}

impl Gpu {
    /// A fresh GPU of `model` at `index`: MIG off, default compute mode, persistence mode on.
    pub fn new(model: &'static GpuModel, index: usize) -> Gpu {
        Gpu {
            model: model.key.to_string(),
            uuid: format!(
                "GPU-{}",
                uuid_like(&[model.key.as_bytes(), &(index as u64).to_le_bytes()])
            ),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x1B + index),
            minor_number: index as u32,
            mig_enabled: false,
            mig_pending: None,
            compute_mode: ComputeMode::Default,
            persistence_mode: default_persistence_mode(),
            timeslice: 0,
            reset_count: 0,
            instances: Vec::new(),
            virtualization_mode: VirtualizationMode::None,
            flr: default_flr(),
            health: GpuHealth::default(),
        }
    }

    /// The catalog model. The state file is checked to hold catalog keys when read.
    pub fn model(&self) -> &'static GpuModel {
        catalog::simulated_model_by_key(&self.model).expect("simulated GPU models are known keys")
    }

    /// The name NVML reports (`nvmlDeviceGetName`).
    pub fn name(&self) -> &'static str {
        &self.model().nvml_name
    }

    /// The MIG mode after the next reset: the pending one, else the current one.
    pub fn mig_mode_after_reset(&self) -> bool {
        self.mig_pending.unwrap_or(self.mig_enabled)
    }

    /// Whether the driver answers its row remaps: not on a MIG-enabled GPU with GPU
    /// instances (nvml.h, `nvmlDeviceGetRemappedRows`).
    pub fn remaps_answered(&self) -> bool {
        !self.mig_enabled || self.instances.is_empty()
    }

    /// The GPU instance with this id.
    pub fn instance(&self, id: u32) -> Option<&GpuInstance> {
        self.instances.iter().find(|gi| gi.id == id)
    }
}

impl Node {
    /// A fresh node of these GPUs (MIG off everywhere).
    pub fn new(models: &[&'static GpuModel]) -> Node {
        Node {
            gpus: models.iter().enumerate().map(|(i, m)| Gpu::new(m, i)).collect(),
            processes: Vec::new(),
            tool_calls: BTreeMap::new(),
            session_pid: None,
            last_serial: 0,
            host: Host::default(),
            events: EventLog::default(),
        }
    }

    /// The model keys, one per GPU.
    pub fn models(&self) -> Vec<&str> {
        self.gpus.iter().map(|g| g.model.as_str()).collect()
    }

    /// Whether the node holds exactly these models, in this order.
    pub fn has_models(&self, models: &[&'static GpuModel]) -> bool {
        self.gpus.len() == models.len()
            && self.gpus.iter().zip(models).all(|(g, m)| g.model == m.key)
    }

    /// A new serial, never handed out before on this node.
    pub fn next_serial(&mut self) -> u64 {
        self.last_serial += 1;
        self.last_serial
    }

    /// The compute processes the driver lists now (see [`Process::listed`]).
    pub fn listed_processes(&self) -> impl Iterator<Item = &Process> {
        self.processes.iter().filter(|p| p.listed())
    }

    /// Drops the registered processes whose PID is gone (their entries are never listed
    /// again; writers prune them so that the file does not grow).
    pub fn prune_exited(&mut self) {
        self.processes.retain(Process::listed);
    }

    /// The compute processes the driver lists now on GPU `gpu` (only theirs are checked
    /// for liveness: a read of `/proc/PID/stat` each).
    pub fn listed_on(&self, gpu: u32) -> impl Iterator<Item = &Process> {
        // Each PID once per call: an MPS daemon's clients all name the same server.
        let mut alive: std::collections::HashMap<u32, bool> = std::collections::HashMap::new();
        let mut runs = |pid: u32| *alive.entry(pid).or_insert_with(|| pid_alive(pid));
        let listed: Vec<&Process> = (self.processes.iter())
            .filter(|p| p.gpu == gpu)
            .filter(|p| {
                (!p.registered && !p.runs_here) || (runs(p.pid) && p.server.is_none_or(&mut runs))
            })
            .collect();
        listed.into_iter()
    }

    /// The pids of the compute processes on a GPU.
    pub fn pids_on(&self, gpu: u32) -> Vec<u32> {
        self.listed_on(gpu).map(|p| p.pid).collect()
    }

    /// What `nvidia-smi --gpu-reset -i N` does: [`Node::reset_gpu_among`] of that GPU alone.
    pub fn reset_gpu(&mut self, index: usize) -> Result<(), ResetRefused> {
        self.reset_gpu_among(index, &[index])
    }

    /// Why GPU `index` cannot be reset in a command that resets the GPUs `together`, if
    /// it cannot; changes nothing. In the order the checks are made:
    /// - a GPU off the bus: [`ResetRefused::Lost`];
    /// - a vGPU guest, or a GPU passed through to a VM without function-level reset:
    ///   [`ResetRefused::NotSupported`] (the MIG user guide's passthrough example: the
    ///   hypervisor does not allow the reset);
    /// - compute processes, persistence mode, `nvidia_drm` with `modeset=Y`: "In use by
    ///   another client";
    /// - an Ampere GPU on an NVSwitch fabric whose Fabric Manager is not running, reset
    ///   without all its NVLink peers (nvidia-smi(1): "On Ampere NVSwitch systems, Fabric
    ///   Manager is required to facilitate reset"; without it "any GPUs with NVLink
    ///   connections to a GPU being reset must also be reset in the same command").
    pub fn reset_refusal(&self, index: usize, together: &[usize]) -> Option<ResetRefused> {
        let Some(gpu) = self.gpus.get(index) else { return Some(ResetRefused::NoSuchGpu) };
        if gpu.health.lost {
            return Some(ResetRefused::Lost);
        }
        let not_exposed = gpu.virtualization_mode == VirtualizationMode::Passthrough && !gpu.flr;
        if gpu.virtualization_mode == VirtualizationMode::Vgpu || not_exposed {
            return Some(ResetRefused::NotSupported);
        }
        let pids = self.pids_on(index as u32);
        if !pids.is_empty() {
            return Some(ResetRefused::InUse { pids });
        }
        if gpu.persistence_mode {
            return Some(ResetRefused::PersistenceMode);
        }
        if self.host.nvidia_drm.is_some_and(|drm| drm.modeset) {
            return Some(ResetRefused::NvidiaDrm);
        }
        let ampere = gpu.model().architecture == catalog::Architecture::Ampere;
        if ampere && self.host.nvswitches > 0 && self.host.fabric_manager == FabricManager::Stopped
        {
            let missing: Vec<usize> =
                (0..self.gpus.len()).filter(|i| !together.contains(i)).collect();
            if !missing.is_empty() {
                return Some(ResetRefused::NvLinkPeers { missing });
            }
        }
        None
    }

    /// What `nvidia-smi --gpu-reset` does to GPU `index` in a command resetting the GPUs
    /// `together`: refused as [`Node::reset_refusal`] says; otherwise a pending MIG mode
    /// takes effect; the GPU and compute instances are gone (nvml.h,
    /// `nvmlDeviceCreateGpuInstanceWithPlacement`: "If the parent device is unbound, reset
    /// or the GPU instance is destroyed explicitly, the GPU instance handle would become
    /// invalid. The GPU instance must be recreated to acquire a valid handle."); the
    /// compute mode and the time-slice go back to their defaults; `reset_count` counts it;
    /// a pending row remap takes effect, the volatile ECC counts and the recovery action
    /// are cleared ([`GpuHealth::after_reset`]).
    pub fn reset_gpu_among(
        &mut self,
        index: usize,
        together: &[usize],
    ) -> Result<(), ResetRefused> {
        if let Some(refused) = self.reset_refusal(index, together) {
            return Err(refused);
        }
        let gpu = &mut self.gpus[index];
        if let Some(mode) = gpu.mig_pending.take() {
            gpu.mig_enabled = mode;
        }
        gpu.instances.clear();
        gpu.compute_mode = ComputeMode::Default;
        gpu.timeslice = 0;
        gpu.reset_count += 1;
        gpu.health.after_reset();
        Ok(())
    }

    /// What a reboot does: instances never survive it; the MIG mode does and a pending one
    /// takes effect; compute modes, time-slices and persistence modes return to their
    /// defaults; no process survives; every GPU is healthy again but for its aggregate
    /// ECC counts and remapped rows ([`GpuHealth::after_reboot`]).
    pub fn reboot(&mut self) {
        for gpu in &mut self.gpus {
            if let Some(mode) = gpu.mig_pending.take() {
                gpu.mig_enabled = mode;
            }
            gpu.instances.clear();
            gpu.compute_mode = ComputeMode::Default;
            gpu.persistence_mode = default_persistence_mode();
            gpu.timeslice = 0;
            gpu.health.after_reboot();
        }
        self.processes.clear();
    }

    /// Counts a call of a tool action for `GPUSHARE_SIM_FAIL` and returns its 1-based number.
    pub fn count_tool_call(&mut self, name: &str) -> u32 {
        let n = self.tool_calls.entry(name.to_string()).or_insert(0);
        *n += 1;
        *n
    }

    /// Checks what serde cannot: every model is a catalog key.
    pub(crate) fn validate(&self) -> Result<(), String> {
        for (i, gpu) in self.gpus.iter().enumerate() {
            if catalog::simulated_model_by_key(&gpu.model).is_none() {
                return Err(format!("GPU {i} has unknown model {:?}", gpu.model));
            }
        }
        Ok(())
    }
}

/// A UUID-shaped lowercase hex string derived from `parts` (FNV-1a 128, split 8-4-4-4-12),
/// as the in-process simulator made them (same inputs, same UUIDs).
pub fn uuid_like(parts: &[&[u8]]) -> String {
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for part in parts {
        for b in part.iter().chain(b"|") {
            h ^= u128::from(*b);
            h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013B);
        }
    }
    let hex = format!("{h:032x}");
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_catalog::parse_node_spec;

    fn a100(n: usize) -> Node {
        Node::new(&parse_node_spec(&format!("a100-40gb:{n}")).unwrap())
    }

    #[test]
    fn fresh_gpus_look_like_a_real_node() {
        let node = a100(2);
        let g = &node.gpus[1];
        assert_eq!(g.name(), "NVIDIA A100-SXM4-40GB");
        assert_eq!(g.minor_number, 1);
        assert_eq!(g.pci_bus_id, "00000000:1C:00.0");
        assert!(g.persistence_mode && !g.mig_enabled);
        assert!(g.uuid.starts_with("GPU-") && g.uuid.len() == 40, "{}", g.uuid);
        assert_eq!(g.uuid, a100(3).gpus[1].uuid, "stable per model and index");
        assert_ne!(g.uuid, node.gpus[0].uuid);
    }

    #[test]
    fn resets_are_refused_while_held_and_settle_pending_modes() {
        let mut node = a100(2);
        node.gpus[0].mig_pending = Some(true);
        node.processes.push(Process::new(0, None, 7));
        assert_eq!(node.reset_gpu(5), Err(ResetRefused::NoSuchGpu));
        assert_eq!(node.reset_gpu(0), Err(ResetRefused::InUse { pids: vec![7] }));
        node.processes.clear();
        assert_eq!(node.reset_gpu(0), Err(ResetRefused::PersistenceMode));
        node.gpus[0].persistence_mode = false;
        node.gpus[0].compute_mode = ComputeMode::Prohibited;
        node.reset_gpu(0).unwrap();
        let g = &node.gpus[0];
        assert!(g.mig_enabled && g.mig_pending.is_none());
        assert_eq!((g.compute_mode, g.reset_count), (ComputeMode::Default, 1));
    }

    #[test]
    fn reset_blockers_refuse_resets_as_the_real_tool_does() {
        let mut node = a100(2);
        for gpu in &mut node.gpus {
            gpu.persistence_mode = false;
        }
        assert_eq!(node.reset_refusal(0, &[0]), None);
        // Passed through with FLR (the cloud H100 VM): resets; without: not supported.
        node.gpus[0].virtualization_mode = VirtualizationMode::Passthrough;
        assert_eq!(node.reset_refusal(0, &[0]), None);
        node.gpus[0].flr = false;
        assert_eq!(node.reset_refusal(0, &[0]), Some(ResetRefused::NotSupported));
        // Bare metal without FLR resets another way (a bus reset).
        node.gpus[0].virtualization_mode = VirtualizationMode::None;
        assert_eq!(node.reset_refusal(0, &[0]), None);
        node.gpus[1].virtualization_mode = VirtualizationMode::Vgpu;
        assert_eq!(node.reset_refusal(1, &[1]), Some(ResetRefused::NotSupported));
        node.gpus[1].virtualization_mode = VirtualizationMode::None;

        node.host.nvidia_drm = Some(NvidiaDrm { modeset: false });
        assert_eq!(node.reset_refusal(0, &[0]), None);
        node.host.nvidia_drm = Some(NvidiaDrm { modeset: true });
        assert_eq!(node.reset_refusal(0, &[0]), Some(ResetRefused::NvidiaDrm));
        node.host.nvidia_drm = None;

        node.host.nvswitches = 6;
        assert_eq!(node.reset_refusal(0, &[0]), None, "Fabric Manager runs");
        node.host.fabric_manager = FabricManager::Stopped;
        assert_eq!(
            node.reset_refusal(0, &[0]),
            Some(ResetRefused::NvLinkPeers { missing: vec![1] })
        );
        assert_eq!(node.reset_gpu_among(0, &[0, 1]), Ok(()), "all peers together");
        // Hopper resets alone without Fabric Manager.
        let mut h100 = Node::new(&parse_node_spec("h100-80gb:2").unwrap());
        h100.gpus[0].persistence_mode = false;
        h100.host.nvswitches = 4;
        h100.host.fabric_manager = FabricManager::Stopped;
        assert_eq!(h100.reset_refusal(0, &[0]), None);
    }

    #[test]
    fn a_reboot_drops_instances_and_restores_defaults() {
        let mut node = a100(1);
        node.gpus[0].mig_pending = Some(true);
        node.gpus[0].persistence_mode = false;
        node.gpus[0].timeslice = 2;
        node.gpus[0].instances.push(GpuInstance {
            id: 1,
            profile_id: 19,
            start: 0,
            size: 1,
            serial: 1,
            compute_instances: Vec::new(),
        });
        node.processes.push(Process::new(0, Some(1), 9));
        node.reboot();
        let g = &node.gpus[0];
        assert!(g.mig_enabled && g.instances.is_empty() && g.persistence_mode);
        assert_eq!(g.timeslice, 0);
        assert!(node.processes.is_empty());
    }

    #[test]
    fn processes_of_an_older_file_load_with_the_defaults() {
        let old: Process = serde_json::from_str(r#"{"gpu": 1, "pid": 42}"#).unwrap();
        assert_eq!(old, Process::new(1, None, 42));
        assert_eq!((old.memory, old.mps, old.registered), (512 << 20, false, false));
        // A declared process is listed whatever its PID; a registered one while it runs.
        assert!(old.listed());
        let me = Process { registered: true, ..Process::new(0, None, std::process::id()) };
        assert!(me.listed());
        // An MPS client goes with its server.
        assert!(Process { server: Some(std::process::id()), ..me.clone() }.listed());
        assert!(!Process { server: Some(u32::MAX), ..me.clone() }.listed());
        let mut node = a100(1);
        node.processes = vec![me.clone(), Process { pid: u32::MAX, ..me.clone() }, old];
        assert_eq!(node.pids_on(0), [std::process::id()]);
        node.prune_exited();
        assert_eq!(node.processes.len(), 2);
    }

    #[test]
    fn an_ended_process_awaiting_its_parent_does_not_run() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(0));
        assert!(!pid_alive(u32::MAX));
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        assert!(pid_alive(pid));
        let registered = Process { registered: true, ..Process::new(0, None, pid) };
        assert!(registered.listed());
        // Declared while it ran here: listed while it runs. Declared for a PID that ran
        // nowhere here (another PID namespace's): listed regardless.
        let declared = Process { runs_here: true, ..Process::new(0, None, pid) };
        assert!(declared.listed());
        assert!(Process::new(0, None, u32::MAX).listed());
        child.kill().unwrap();
        // Not reaped yet: a zombie of one thread, whose `/proc/<pid>` is still there.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while pid_alive(pid) {
            assert!(std::time::Instant::now() < deadline, "a killed child still runs");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "the zombie awaits its parent"
        );
        assert!(!registered.listed());
        assert!(!declared.listed());
        child.wait().unwrap();
        assert!(!pid_alive(pid));
    }

    #[test]
    fn a_healthy_node_is_written_as_before_and_old_files_load_healthy() {
        let mut node = a100(2);
        let text = serde_json::to_string(&node).unwrap();
        assert!(!text.contains("\"health\"") && !text.contains("\"events\""), "{text}");
        assert_eq!(serde_json::from_str::<Node>(&text).unwrap(), node);
        node.gpus[1].health.lost = true;
        node.events.raise(1, crate::health::EVENT_GPU_UNAVAILABLE, 0, None);
        let text = serde_json::to_string(&node).unwrap();
        assert_eq!(serde_json::from_str::<Node>(&text).unwrap(), node, "faults round-trip");
        let mut old: serde_json::Value = serde_json::to_value(a100(1)).unwrap();
        old.as_object_mut().unwrap().remove("events");
        let old: Node = serde_json::from_value(old).unwrap();
        assert!(old.gpus[0].health.is_healthy() && old.events.is_empty());
    }

    #[test]
    fn compute_modes_map_to_nvml_values() {
        for m in [ComputeMode::Default, ComputeMode::Prohibited, ComputeMode::ExclusiveProcess] {
            assert_eq!(ComputeMode::from_nvml(m.nvml_value()), Some(m));
        }
        assert_eq!(ComputeMode::from_nvml(1), None);
        assert_eq!(ComputeMode::from_nvml(4), None);
        assert_eq!(
            serde_json::to_string(&ComputeMode::ExclusiveProcess).unwrap(),
            "\"exclusive_process\""
        );
    }
}
