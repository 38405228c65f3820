//! What the GPUs are doing now: per GPU its utilisation, memory, temperature and power,
//! and per MIG device its memory, as NVML answers them (issue 29). `Telemetry`'s answer,
//! and the `telemetry` of each line `gpushare-ctl top --json` prints. A value the driver
//! does not answer (NOT_SUPPORTED, as on a MIG device, or a failed read) is `null`.

use serde::{Deserialize, Serialize};

/// Every GPU's live readings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    /// By GPU index.
    pub gpus: Vec<GpuTelemetryDoc>,
}

/// One GPU's live readings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuTelemetryDoc {
    /// GPU index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Percent of the last sample period a kernel ran.
    pub utilization_percent: Option<u32>,
    /// Percent of the last sample period device memory was read or written.
    pub memory_utilization_percent: Option<u32>,
    /// Device memory used, bytes (the driver's reserved memory apart).
    pub memory_used_bytes: Option<u64>,
    /// Device memory, bytes.
    pub memory_total_bytes: Option<u64>,
    /// GPU temperature, °C.
    pub temperature_c: Option<u32>,
    /// Power draw, watts.
    pub power_watts: Option<f64>,
    /// Each MIG device's memory (the driver answers nothing else for one).
    #[serde(default)]
    pub mig_devices: Vec<MigTelemetryDoc>,
}

/// One MIG device's live readings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MigTelemetryDoc {
    /// `MIG-…`.
    pub uuid: String,
    /// GPU instance id.
    pub gpu_instance: u32,
    /// Compute instance id.
    pub compute_instance: u32,
    /// Device memory used, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Device memory, bytes.
    pub memory_total_bytes: Option<u64>,
}
