//! The hardware seam, a thin, NVML-shaped [`GpuBackend`] trait and its two
//! backends. Hardware only: MPS and time-slicing are the sharing layer's.
//!
//! [`nvml::NvmlBackend`] is the one production backend: it drives NVIDIA's
//! `libnvidia-ml`, or with `--simulate` gpushare's simulated driver library through the
//! very same calls (see [`nvml::Driver`]). The unit tests' in-process double, `sim`,
//! exists only under `cfg(test)`.

pub mod device_nodes;
pub mod nvml;
#[cfg(test)]
pub mod sim;

use std::fmt;
use std::path::Path;

use crate::catalog::MigProfile;
use crate::node::{ComputeMode, GpuState};

pub use nvml::reset_blockers::ResetBlocker;

/// Which backend drives the GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Real GPUs through NVML.
    Nvml,
    /// Simulated GPUs: the NVML backend on gpushare's simulated driver.
    Simulated,
}

impl BackendKind {
    /// `nvml` or `simulated`, as `status` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Nvml => "nvml",
            BackendKind::Simulated => "simulated",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What setting the MIG mode did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigModeActivation {
    /// The new mode is in effect.
    Activated,
    /// The new mode waits for a GPU reset (Ampere).
    PendingReset,
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
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// A fresh observation of every GPU, by index.
    fn observe(&self) -> Result<Vec<GpuState>, GpuError>;

    /// Turns MIG mode on or off.
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigModeActivation, GpuError>;

    /// Creates a GPU instance of `profile` at memory slot `start`; returns its id.
    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile: &MigProfile,
        start: u8,
    ) -> Result<u32, GpuError>;

    /// Creates a compute instance of `slices` compute slices in a GPU instance (all of
    /// its slices: the full-size one), at the lowest free place; returns its id.
    fn create_compute_instance(
        &self,
        gpu: u32,
        gpu_instance: u32,
        slices: u8,
    ) -> Result<u32, GpuError>;

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

    /// The external program [`GpuBackend::reset_gpu`] runs, if any, so that a plan with
    /// resets is refused before its first step when the program is missing.
    fn reset_program(&self) -> Option<&std::path::Path> {
        None
    }

    /// What would make [`GpuBackend::reset_gpu`] fail on this host whatever the agent did
    /// first (a VM that does not let the GPU be reset, `nvidia_drm` holding it, NVSwitches
    /// without Fabric Manager), found without changing anything: from the driver, and from
    /// the host's files under `host_root` (`/` on a real host). `None` when nothing known
    /// blocks a reset, so that a plan that resets a blocked GPU is refused before its first
    /// step instead of leaving a MIG mode pending.
    fn reset_blocker(&self, _gpu: u32, _host_root: &Path) -> Option<ResetBlocker> {
        None
    }

    /// The GPU's PCI address as NVML writes it (`00000000:1B:00.0`), which names its
    /// sysfs directory (its NUMA node's CPUs, for a bench's pinning); `None` when the
    /// driver does not say.
    fn pci_bus_id(&self, _gpu: u32) -> Option<String> {
        None
    }

    /// The GPU's device minor number (`nvmlDeviceGetMinorNumber`): the `N` of its
    /// `/dev/nvidia<N>` and of the `gpu<N>` of its MIG capabilities ([`device_nodes`]);
    /// `None` when the driver does not say.
    fn minor_number(&self, _gpu: u32) -> Option<u32> {
        None
    }

    /// What the GPU is doing now (utilisation, memory, temperature, power), each read on
    /// its own: a value the driver does not answer is `None`, never an error. `None` when
    /// the backend reads none or the GPU cannot be reached.
    fn telemetry(&self, _gpu: u32) -> Option<GpuTelemetry> {
        None
    }

    /// Waits up to `timeout` for the next event the driver raises on any GPU (an Xid, an
    /// ECC error, a GPU gone, a recovery action: [`GpuEvent`]); `Ok(None)` when none came.
    /// The first call registers for them on every GPU that supports them. NotSupported
    /// when the driver delivers no events at all; the caller then polls only.
    fn wait_event(&self, _timeout: std::time::Duration) -> Result<Option<GpuEvent>, GpuError> {
        Err(GpuError::new("wait_event", None, ErrorCode::NotSupported))
    }

    /// What the driver says of the GPU's health that no event carries, each read on its
    /// own ([`HealthReading`]).
    fn health_reading(&self, _gpu: u32) -> HealthReading {
        HealthReading::default()
    }

    /// The GPUs the event registration left out, with why (a GPU that supports no
    /// critical event, one lost at registration); empty while every GPU is watched.
    fn unwatched_gpus(&self) -> Vec<(u32, String)> {
        Vec::new()
    }

    /// Registers for the events anew at the next [`GpuBackend::wait_event`] (a GPU the
    /// registration left out is back).
    fn watch_again(&self) {}
}

/// An event the driver delivered (`nvmlEventSetWait_v2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuEvent {
    /// The GPU, by NVML index.
    pub gpu: u32,
    /// What happened.
    pub kind: GpuEventKind,
    /// The GPU instance the event names (on a GPU in MIG mode); `None`: the whole GPU
    /// (the driver's 0xFFFFFFFF).
    pub gpu_instance: Option<u32>,
    /// The compute instance the event names, likewise.
    pub compute_instance: Option<u32>,
}

/// The kinds of [`GpuEvent`] the agent registers for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuEventKind {
    /// `nvmlEventTypeXidCriticalError`, with the Xid.
    Xid(u64),
    /// `nvmlEventTypeDoubleBitEccError`.
    DoubleBitEcc,
    /// `nvmlEventTypeSingleBitEccError`.
    SingleBitEcc,
    /// `nvmlEventTypeGpuUnavailableError`: the GPU is gone.
    GpuUnavailable,
    /// `nvmlEventTypeGpuRecoveryAction`, with the action's value (as field
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` gives it).
    RecoveryAction(u64),
    /// Any other type bit, with its data.
    Other {
        /// The event type bit.
        event_type: u64,
        /// Its data.
        data: u64,
    },
}

/// The health readings of one GPU ([`GpuBackend::health_reading`]); `None` where the
/// driver does not answer that read (not supported, no permission, any failure of it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthReading {
    /// The driver answered NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus.
    pub lost: bool,
    /// A row remap waits for the next GPU reset (`nvmlDeviceGetRemappedRows`).
    pub row_remap_pending: Option<bool>,
    /// A row remap failed: the memory cannot be repaired by a reset.
    pub row_remap_failure: Option<bool>,
    /// Pages wait for retirement at the next reset (`nvmlDeviceGetRetiredPagesPendingStatus`,
    /// GPUs before row remapping).
    pub retired_pages_pending: Option<bool>,
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: 0 none, 1 GPU reset, 2 node reboot, 3 drain
    /// P2P, 4 drain and reset.
    pub recovery_action: Option<u64>,
}

/// A GPU's live readings ([`GpuBackend::telemetry`]); `None` where the driver answers
/// none (NOT_SUPPORTED, no permission, or any failure of that one read).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuTelemetry {
    /// Percent of the last sample period a kernel ran (`nvmlDeviceGetUtilizationRates`).
    pub utilization_percent: Option<u32>,
    /// Percent of the period device memory was read or written.
    pub memory_utilization_percent: Option<u32>,
    /// Device memory used, bytes (`nvmlDeviceGetMemoryInfo_v2`, reserved apart).
    pub memory_used_bytes: Option<u64>,
    /// Device memory, bytes.
    pub memory_total_bytes: Option<u64>,
    /// GPU temperature, °C (`nvmlDeviceGetTemperature`, the GPU sensor).
    pub temperature_c: Option<u32>,
    /// Power draw, watts (`nvmlDeviceGetPowerUsage`).
    pub power_watts: Option<f64>,
    /// Each MIG device's memory (NVML answers no utilisation, temperature or power for a
    /// MIG device).
    pub mig_devices: Vec<MigTelemetry>,
}

/// A MIG device's live readings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MigTelemetry {
    /// The MIG device's UUID.
    pub uuid: String,
    /// Its GPU instance id.
    pub gpu_instance: u32,
    /// Its compute instance id.
    pub compute_instance: u32,
    /// Device memory used, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Device memory, bytes.
    pub memory_total_bytes: Option<u64>,
}
