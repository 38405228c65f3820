//! A GPU's health as the agent reads it from the driver (issue 42): the faults that make a
//! GPU or one of its MIG instances unhealthy, each with the action the driver's catalogue
//! asks for. Part of [`crate::GpuStatus`], and what `gpushare-ctl status --json` prints.

use serde::{Deserialize, Serialize};

/// The most faults one GPU's status lists (the agent keeps the first; later ones are
/// counted in the metrics, not kept); a flood of Xids on a broken GPU never grows an
/// answer without bound.
pub const FAULTS_PER_GPU_MAX: usize = 32;

/// One fault on a GPU or on one of its MIG instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthFault {
    /// What the driver reported: `xid`, `double-bit-ecc`, `gpu-lost`, `row-remap-pending`,
    /// `row-remap-failure`, `retired-pages-pending`, `recovery-action` or `mps-server-died`
    /// (the metrics' `class` label).
    pub class: String,
    /// The Xid, for `xid`.
    pub xid: Option<u64>,
    /// What it asks for: `restart-application`, `reset-gpu`, `drain-and-reset` or
    /// `reboot-node`.
    pub action: String,
    /// The GPU instance it is confined to; `null`: the whole GPU.
    pub gpu_instance_id: Option<u32>,
    /// The compute instance it is confined to, with `gpu_instance_id`.
    pub compute_instance_id: Option<u32>,
    /// When the agent saw it, seconds since the Unix epoch.
    pub since_unix_seconds: u64,
    /// In words: `Xid 79 (GPU has fallen off the bus): reboot the node`.
    pub detail: String,
    /// The compute processes that were on the GPU or instance when it happened (what the
    /// clean check of an application fault waits for); `null` while the agent has not read
    /// them yet (for a moment after the fault shows, or while `/proc` or an MPS control
    /// daemon does not answer), never `[]` for "not known".
    pub clients: Option<Vec<u32>>,
}
