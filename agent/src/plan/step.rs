//! The steps of a plan: one change each, in the order they run.

use std::fmt;

use crate::catalog::MigProfile;
use gpushare_proto::exact_size;

use crate::node::{ComputeMode, LimitDrift, MpsLimits, Operation, TimeSliceInterval, limits_text};

/// The device an MPS server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MpsDevice {
    /// The whole GPU.
    Gpu {
        /// `GPU-…`.
        uuid: String,
    },
    /// The MIG instance at a placement (its `MIG-…` is known once it exists).
    Instance {
        /// Placement start.
        start: u8,
        /// Profile name, for people.
        profile: &'static str,
        /// In a subdivided GPU instance: which compute instance, by index (see
        /// [`crate::node::MpsServerState::compute_instance`]), and its compute slices.
        compute_instance: Option<(u8, u8)>,
    },
}

/// One change to a GPU: a backend call, or an MPS or time-slice step.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Destroy a compute instance.
    DestroyComputeInstance {
        /// GPU index.
        gpu: u32,
        /// GPU instance id.
        gpu_instance: u32,
        /// Compute instance id.
        compute_instance: u32,
        /// Profile of the GPU instance, for people.
        profile: &'static str,
        /// Placement start of the GPU instance, for people.
        start: u8,
    },
    /// Destroy a GPU instance.
    DestroyGpuInstance {
        /// GPU index.
        gpu: u32,
        /// GPU instance id.
        gpu_instance: u32,
        /// Profile name, for people.
        profile: &'static str,
        /// Placement start, for people.
        start: u8,
    },
    /// Turn MIG mode on or off.
    SetMigMode {
        /// GPU index.
        gpu: u32,
        /// The new mode.
        enabled: bool,
    },
    /// Create a GPU instance at a placement.
    CreateGpuInstance {
        /// GPU index.
        gpu: u32,
        /// Profile.
        profile: &'static MigProfile,
        /// Placement start.
        start: u8,
    },
    /// Create a compute instance of `slices` compute slices in the GPU instance at
    /// `start`: its full-size one, or one of several (`whole` false).
    CreateComputeInstance {
        /// GPU index.
        gpu: u32,
        /// Placement start of the GPU instance (its id is known only once created).
        start: u8,
        /// Id of the GPU instance when it exists already.
        gpu_instance: Option<u32>,
        /// Profile name, for people.
        profile: &'static str,
        /// Compute slices of the compute instance.
        slices: u8,
        /// Whether it is the full-size compute instance (the GPU instance used whole).
        whole: bool,
    },
    /// Reset the GPU so that a pending MIG mode takes effect.
    ResetGpu {
        /// GPU index.
        gpu: u32,
        /// Reset even if the plan's own mode change took effect at once (the mode was
        /// pending before the plan).
        always: bool,
    },
    /// Set the compute mode.
    SetComputeMode {
        /// GPU index.
        gpu: u32,
        /// The new mode.
        mode: ComputeMode,
    },
    /// Stop an MPS server.
    StopMps {
        /// GPU index.
        gpu: u32,
        /// The device it serves.
        uuid: String,
    },
    /// Start an MPS server with its limits.
    StartMps {
        /// GPU index.
        gpu: u32,
        /// The device it serves.
        device: MpsDevice,
        /// Its limits.
        limits: MpsLimits,
        /// Whether it serves every user's clients at once (`-M`).
        multi_user: bool,
    },
    /// Put back the limits of a running MPS server that its control daemon answers
    /// otherwise than the agent set them (changed behind the agent's back).
    SetMpsLimits {
        /// GPU index.
        gpu: u32,
        /// The device it serves.
        uuid: String,
        /// What differs: the daemon's defaults and server processes, live and wanted.
        drift: LimitDrift,
    },
    /// Set the time-slice interval of a whole GPU.
    SetTimeslice {
        /// GPU index.
        gpu: u32,
        /// The interval.
        interval: TimeSliceInterval,
    },
}

impl Step {
    /// The GPU the step changes.
    pub fn gpu(&self) -> u32 {
        match self {
            Step::DestroyComputeInstance { gpu, .. }
            | Step::DestroyGpuInstance { gpu, .. }
            | Step::SetMigMode { gpu, .. }
            | Step::CreateGpuInstance { gpu, .. }
            | Step::CreateComputeInstance { gpu, .. }
            | Step::ResetGpu { gpu, .. }
            | Step::SetComputeMode { gpu, .. }
            | Step::StopMps { gpu, .. }
            | Step::StartMps { gpu, .. }
            | Step::SetMpsLimits { gpu, .. }
            | Step::SetTimeslice { gpu, .. } => *gpu,
        }
    }

    /// The backend operation the step calls.
    pub fn operation(&self) -> Operation {
        match self {
            Step::DestroyComputeInstance { .. } => Operation::DestroyComputeInstance,
            Step::DestroyGpuInstance { .. } => Operation::DestroyGpuInstance,
            Step::SetMigMode { .. } => Operation::SetMigMode,
            Step::CreateGpuInstance { .. } => Operation::CreateGpuInstance,
            Step::CreateComputeInstance { .. } => Operation::CreateComputeInstance,
            Step::ResetGpu { .. } => Operation::ResetGpu,
            Step::StopMps { .. } => Operation::StopMps,
            Step::StartMps { .. } => Operation::StartMps,
            Step::SetMpsLimits { .. } => Operation::SetMpsLimits,
            Step::SetTimeslice { .. } => Operation::SetTimeslice,
            Step::SetComputeMode { .. } => Operation::SetComputeMode,
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::DestroyComputeInstance {
                gpu,
                gpu_instance,
                compute_instance,
                profile,
                start,
            } => {
                write!(
                    f,
                    "GPU {gpu}: destroy compute instance {compute_instance} of {profile} at slot {start} (GI {gpu_instance})"
                )
            }
            Step::DestroyGpuInstance { gpu, gpu_instance, profile, start } => {
                write!(f, "GPU {gpu}: destroy {profile} at slot {start} (GI {gpu_instance})")
            }
            Step::SetMigMode { gpu, enabled } => {
                write!(f, "GPU {gpu}: {} MIG mode", if *enabled { "enable" } else { "disable" })
            }
            Step::CreateGpuInstance { gpu, profile, start } => {
                write!(f, "GPU {gpu}: create {} at slot {start}", profile.name)
            }
            Step::CreateComputeInstance { gpu, start, profile, whole: true, .. } => {
                write!(f, "GPU {gpu}: create the compute instance of {profile} at slot {start}")
            }
            Step::CreateComputeInstance { gpu, start, profile, slices, whole: false, .. } => {
                write!(
                    f,
                    "GPU {gpu}: create a {slices}c compute instance ({slices}c.{profile}) in {profile} at slot {start}"
                )
            }
            Step::ResetGpu { gpu, always: true } => {
                write!(f, "GPU {gpu}: reset the GPU (a MIG mode change is pending)")
            }
            Step::ResetGpu { gpu, always: false } => {
                write!(f, "GPU {gpu}: reset the GPU if the MIG mode change is pending")
            }
            Step::SetComputeMode { gpu, mode } => {
                write!(f, "GPU {gpu}: set compute mode {}", mode.as_str())
            }
            Step::StopMps { gpu, uuid } => write!(f, "GPU {gpu}: stop the MPS server of {uuid}"),
            Step::StartMps { gpu, device, limits, multi_user } => {
                let on = match device {
                    MpsDevice::Gpu { .. } => "the GPU".to_string(),
                    MpsDevice::Instance { start, profile, compute_instance: None } => {
                        format!("{profile} at slot {start}")
                    }
                    MpsDevice::Instance {
                        start,
                        profile,
                        compute_instance: Some((index, slices)),
                    } => {
                        format!(
                            "compute instance {index} ({slices}c.{profile}) of {profile} at slot {start}"
                        )
                    }
                };
                let memory = limits
                    .pinned_memory_limit_bytes
                    .map(|b| format!(", pinned memory {}", exact_size(b)))
                    .unwrap_or_default();
                let mode = if *multi_user { ", multi-user" } else { "" };
                write!(
                    f,
                    "GPU {gpu}: start an MPS server on {on} (threads {}%{memory}{mode})",
                    limits.active_thread_percentage
                )
            }
            Step::SetMpsLimits { gpu, uuid, drift } => {
                let mut parts = Vec::new();
                if let Some((live, want)) = drift.defaults {
                    parts.push(format!(
                        "its defaults {} -> {}",
                        limits_text(live),
                        limits_text(want)
                    ));
                }
                for (pid, live, want) in &drift.servers {
                    parts.push(format!(
                        "server {pid} {} -> {}",
                        limits_text(*live),
                        limits_text(*want)
                    ));
                }
                write!(
                    f,
                    "GPU {gpu}: set the MPS limits of {uuid} back ({}; changed outside gpushare)",
                    parts.join(", ")
                )
            }
            Step::SetTimeslice { gpu, interval, .. } => {
                write!(f, "GPU {gpu}: set the time-slice interval to {}", interval.as_str())
            }
        }
    }
}
