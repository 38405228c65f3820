//! The operations that change a node, named as plans, fault injection and messages name
//! them.

use std::fmt;

/// The operations that change a node: the GPU backend carries out some, the sharing layer
/// the others. Named as in plans and `GPUSHARE_SIM_FAIL`.
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
    /// Start an MPS control daemon with its limits (the sharing layer).
    StartMps,
    /// Stop an MPS control daemon (the sharing layer).
    StopMps,
    /// Put an MPS control daemon's limits back (the sharing layer).
    SetMpsLimits,
    /// `nvidia-smi compute-policy --set-timeslice` (the sharing layer).
    SetTimeslice,
    /// A GPU reset (`nvidia-smi --gpu-reset`; NVML has no public call).
    ResetGpu,
}

impl Operation {
    /// Every mutating operation.
    pub const ALL: [Operation; 11] = [
        Operation::SetMigMode,
        Operation::CreateGpuInstance,
        Operation::CreateComputeInstance,
        Operation::DestroyGpuInstance,
        Operation::DestroyComputeInstance,
        Operation::SetComputeMode,
        Operation::ResetGpu,
        Operation::StartMps,
        Operation::StopMps,
        Operation::SetMpsLimits,
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
            Operation::SetMpsLimits => "set_mps_limits",
            Operation::SetTimeslice => "set_timeslice",
        }
    }

    /// Whether the GPU backend carries the operation out (the others are MPS and
    /// time-slice steps, carried out by the sharing layer).
    pub fn is_hardware(self) -> bool {
        !matches!(
            self,
            Operation::StartMps
                | Operation::StopMps
                | Operation::SetMpsLimits
                | Operation::SetTimeslice
        )
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
