//! The hardware seam: a thin, NVML-shaped [`GpuBackend`] trait and its two backends.
//!
//! [`nvml::NvmlBackend`] drives real GPUs through NVML; [`sim::SimBackend`] simulates a
//! node in process with the driver's rules and error codes, persists its state, and
//! injects faults. Everything above this line (planning, applying, verification) is the
//! same code for both, so the simulator exercises the engine that runs on hardware.

pub mod nvml;
pub mod sim;

use std::fmt;

use crate::catalog::{GpuModel, MigProfile};

/// NVML compute modes the agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// The observed state of a node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeState {
    /// GPUs by NVML index.
    pub gpus: Vec<GpuState>,
    /// MPS servers the agent runs (not from the GPU backend: the engine adds them).
    pub mps: Vec<MpsServerState>,
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
    /// Its limits.
    pub limits: crate::mps::MpsLimits,
    /// The control daemon's pid; `None` when it is not running.
    pub pid: Option<u32>,
    /// Restarts by the supervisor.
    pub restarts: u32,
}

impl NodeState {
    /// The GPU with this index.
    pub fn gpu(&self, index: u32) -> Option<&GpuState> {
        self.gpus.iter().find(|g| g.index == index)
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
    /// Time-slice interval, when read (`nvidia-smi compute-policy`; not a backend call).
    pub timeslice: Option<crate::profile::TimeSliceInterval>,
    /// GPU instances, ordered by placement start.
    pub instances: Vec<GpuInstance>,
    /// Compute processes on the GPU or its instances.
    pub processes: Vec<ComputeProcess>,
}

impl GpuState {
    /// The model's display name, or NVML's name for a GPU the catalog lacks.
    pub fn model_name(&self) -> &str {
        self.model.map(|m| m.display_name).unwrap_or(&self.name)
    }

    /// `GPU 2 (A100-SXM4-40GB)`, the way messages name a GPU.
    pub fn label(&self) -> String {
        format!("GPU {} ({})", self.index, self.model_name())
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
    /// Compute instances inside it.
    pub compute_instances: Vec<ComputeInstance>,
}

/// A MIG compute instance.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeInstance {
    /// NVML compute instance id.
    pub id: u32,
    /// `MIG-…` of the MIG device this compute instance is.
    pub uuid: String,
}

/// A process holding a compute context.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeProcess {
    /// Process id.
    pub pid: u32,
    /// GPU instance the process runs in, under MIG.
    pub gpu_instance_id: Option<u32>,
}

/// What setting the MIG mode did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigModeActivation {
    /// The new mode is in effect.
    Activated,
    /// The new mode waits for a GPU reset (Ampere).
    PendingReset,
}

/// The backend operations that change the GPUs, named as in `GPUSHARE_SIM_FAIL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `nvmlDeviceSetMigMode`.
    SetMigMode,
    /// `nvmlDeviceCreateGpuInstanceWithPlacement`.
    CreateGpuInstance,
    /// `nvmlGpuInstanceCreateComputeInstance`.
    CreateComputeInstance,
    /// `nvmlGpuInstanceDestroy`.
    DestroyGpuInstance,
    /// `nvmlComputeInstanceDestroy`.
    DestroyComputeInstance,
    /// `nvmlDeviceSetComputeMode`.
    SetComputeMode,
    /// Start an MPS control daemon with its limits (not a backend call).
    StartMps,
    /// Stop an MPS control daemon (not a backend call).
    StopMps,
    /// `nvidia-smi compute-policy --set-timeslice` (not a backend call).
    SetTimeslice,
    /// A GPU reset (`nvidia-smi --gpu-reset`; NVML has no public call).
    ResetGpu,
}

impl Operation {
    /// Every mutating operation.
    pub const ALL: [Operation; 10] = [
        Operation::SetMigMode,
        Operation::CreateGpuInstance,
        Operation::CreateComputeInstance,
        Operation::DestroyGpuInstance,
        Operation::DestroyComputeInstance,
        Operation::SetComputeMode,
        Operation::ResetGpu,
        Operation::StartMps,
        Operation::StopMps,
        Operation::SetTimeslice,
    ];

    /// The snake_case name used in plans, fault injection and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::SetMigMode => "set_mig_mode",
            Operation::CreateGpuInstance => "create_gpu_instance",
            Operation::CreateComputeInstance => "create_compute_instance",
            Operation::DestroyGpuInstance => "destroy_gpu_instance",
            Operation::DestroyComputeInstance => "destroy_compute_instance",
            Operation::SetComputeMode => "set_compute_mode",
            Operation::ResetGpu => "reset_gpu",
            Operation::StartMps => "start_mps",
            Operation::StopMps => "stop_mps",
            Operation::SetTimeslice => "set_timeslice",
        }
    }

    /// Whether the GPU backend carries the operation out (the others are MPS and
    /// time-slice steps, carried out by the sharing layers).
    pub fn is_backend(self) -> bool {
        !matches!(self, Operation::StartMps | Operation::StopMps | Operation::SetTimeslice)
    }

    /// The operation with this name.
    pub fn from_name(name: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|op| op.as_str() == name)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// NVML return codes the agent distinguishes, with NVML's own wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// NVML_ERROR_UNINITIALIZED / library missing / driver not loaded.
    DriverNotLoaded,
    /// NVML_ERROR_INVALID_ARGUMENT.
    InvalidArgument,
    /// NVML_ERROR_NOT_SUPPORTED.
    NotSupported,
    /// NVML_ERROR_NO_PERMISSION.
    NoPermission,
    /// NVML_ERROR_NOT_FOUND.
    NotFound,
    /// NVML_ERROR_INSUFFICIENT_RESOURCES.
    InsufficientResources,
    /// NVML_ERROR_IN_USE.
    InUse,
    /// NVML_ERROR_RESET_REQUIRED.
    ResetRequired,
    /// NVML_ERROR_GPU_IS_LOST.
    GpuLost,
    /// NVML_ERROR_UNKNOWN or anything else.
    Unknown,
    /// A tool the agent runs (the MPS control daemon, nvidia-smi) failed; the detail
    /// says how.
    Failed,
}

impl ErrorCode {
    /// NVML's `nvmlErrorString` text for the code.
    pub fn nvml_text(self) -> &'static str {
        match self {
            ErrorCode::DriverNotLoaded => "Driver Not Loaded",
            ErrorCode::InvalidArgument => "Invalid Argument",
            ErrorCode::NotSupported => "Not Supported",
            ErrorCode::NoPermission => "Insufficient Permissions",
            ErrorCode::NotFound => "Not Found",
            ErrorCode::InsufficientResources => "Insufficient Resources",
            ErrorCode::InUse => "In use by another client",
            ErrorCode::ResetRequired => "GPU requires reset",
            ErrorCode::GpuLost => "GPU is lost",
            ErrorCode::Unknown => "Unknown Error",
            ErrorCode::Failed => "failed",
        }
    }
}

/// A backend failure: which call, on which GPU, and the driver's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call}{}: {}{}", gpu.map(|g| format!(" on GPU {g}")).unwrap_or_default(), code.nvml_text(), detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
pub struct GpuError {
    /// The call that failed (`create_gpu_instance`, `observe`, …).
    pub call: String,
    /// The GPU, when the call concerns one.
    pub gpu: Option<u32>,
    /// The driver's return code.
    pub code: ErrorCode,
    /// More context, when there is any.
    pub detail: Option<String>,
}

impl GpuError {
    /// An error of `call` on `gpu` with `code`.
    pub fn new(call: impl Into<String>, gpu: Option<u32>, code: ErrorCode) -> Self {
        Self { call: call.into(), gpu, code, detail: None }
    }

    /// The same error with more context.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

/// The hardware seam. Calls block (NVML is synchronous): async callers run them on a
/// blocking thread. GPUs are addressed by NVML index, GPU instances by NVML id.
pub trait GpuBackend: Send + Sync {
    /// `nvml` or `simulated`.
    fn kind(&self) -> &'static str;

    /// A fresh observation of every GPU.
    fn observe(&self) -> Result<NodeState, GpuError>;

    /// Turns MIG mode on or off.
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigModeActivation, GpuError>;

    /// Creates a GPU instance of `profile` at memory slot `start`; returns its id.
    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile: &MigProfile,
        start: u8,
    ) -> Result<u32, GpuError>;

    /// Creates the full-size compute instance in a GPU instance; returns its id.
    fn create_compute_instance(&self, gpu: u32, gpu_instance: u32) -> Result<u32, GpuError>;

    /// Destroys a compute instance.
    fn destroy_compute_instance(
        &self,
        gpu: u32,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<(), GpuError>;

    /// Destroys a GPU instance (its compute instances must be gone).
    fn destroy_gpu_instance(&self, gpu: u32, gpu_instance: u32) -> Result<(), GpuError>;

    /// Sets the compute mode.
    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), GpuError>;

    /// Resets the GPU so that a pending MIG mode takes effect. Fails while anything
    /// holds the GPU; the error's detail says what.
    fn reset_gpu(&self, gpu: u32) -> Result<(), GpuError>;
}
