//! The NVML session's changes: MIG mode, creating and destroying GPU and compute
//! instances (the placement and compute-instance profile chosen as the driver lists
//! them), compute mode, persistence mode, and the check after a reset that no MIG mode
//! change is still pending. A destroy refused IN_USE names the processes holding the GPU.

use nvml_wrapper::enum_wrappers::device::ComputeMode as NvmlComputeMode;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;
use nvml_wrapper_sys::bindings::{
    NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE, nvmlDevice_t, nvmlGpuInstance_t,
};

use super::errors::{raw_error, return_name, with_context, wrapper_error};
use super::raw::{self, Raw, device_handle};
use super::reset::with_holders;
use super::session::Session;
use crate::catalog::MigProfile;
use crate::gpu::{ErrorCode, GpuError, MigModeActivation};
use crate::node::{ComputeMode, Operation};

impl<'a> Session<'a> {
    pub(super) fn set_mig_mode(
        &self,
        gpu: u32,
        enabled: bool,
    ) -> Result<MigModeActivation, GpuError> {
        let call = Operation::SetMigMode.as_str();
        let device = self.device(call, gpu)?;
        let dev = device_handle(&device);
        let raw = self.raw(call, gpu);
        let wanted = if enabled { NVML_DEVICE_MIG_ENABLE } else { NVML_DEVICE_MIG_DISABLE };
        let status = raw.set_mig_mode(dev, wanted)?;
        // Whatever the activation status says, ask what the mode is now (as mig-parted
        // does): the status reports the reset NVML tried, not the mode it left.
        let mode = device
            .mig_mode()
            .map_err(|e| wrapper_error(call, Some(gpu), "nvmlDeviceGetMigMode", e))?;
        if mode.current == wanted && mode.pending == wanted {
            Ok(MigModeActivation::Activated)
        } else if mode.pending == wanted {
            // Set but not activated: the reset failed or must happen elsewhere
            // (RESET_REQUIRED in pass-through VMs, IN_USE while anything holds the GPU).
            // The usual course on an A100: the plan's next step resets the GPU.
            tracing::info!(
                gpu,
                enabled,
                activation = return_name(status),
                "MIG mode change is pending until the GPU is reset"
            );
            Ok(MigModeActivation::PendingReset)
        } else {
            Err(raw_error(call, Some(gpu), "nvmlDeviceSetMigMode (activation status)", status)
                .with_detail(format!(
                    "nvmlDeviceSetMigMode answered {} but the mode is still current {}, pending {}",
                    return_name(status),
                    mode.current,
                    mode.pending
                )))
        }
    }

    pub(super) fn create_gpu_instance(
        &self,
        gpu: u32,
        profile: &MigProfile,
        start: u8,
    ) -> Result<u32, GpuError> {
        let call = Operation::CreateGpuInstance.as_str();
        let device = self.device(call, gpu)?;
        let dev = device_handle(&device);
        let raw = self.raw(call, gpu);
        let Some(info) = raw.gi_profile(dev, profile.nvml_enum)? else {
            return Err(GpuError::new(call, Some(gpu), ErrorCode::NotSupported).with_detail(
                format!(
                    "NVML does not offer profile {} (enum {}) on this GPU",
                    profile.name, profile.nvml_enum
                ),
            ));
        };
        if info.id != profile.id {
            return Err(GpuError::new(call, Some(gpu), ErrorCode::InvalidArgument).with_detail(
                format!(
                    "catalog profile {} has id {} but NVML reports id {} for enum {}",
                    profile.name, profile.id, info.id, profile.nvml_enum
                ),
            ));
        }
        // The placement exactly as the driver lists it (the DRA driver does the same): its
        // size is the driver's, which need not be the catalog's slice count.
        let start = u32::from(start);
        let Some(placement) =
            raw.gi_possible_placements(dev, info.id)?.into_iter().find(|p| p.start == start)
        else {
            return Err(GpuError::new(call, Some(gpu), ErrorCode::InvalidArgument).with_detail(
                format!("NVML offers no placement of profile {} at slot {start}", profile.name),
            ));
        };
        let gi = raw
            .create_gi(dev, info.id, placement.start, placement.size)
            .map_err(|e| with_context(e, format!("profile {} at slot {start}", profile.name)))?;
        Ok(raw.gi_info(gi)?.id)
    }

    pub(super) fn create_compute_instance(
        &self,
        gpu: u32,
        gpu_instance: u32,
        slices: u8,
    ) -> Result<u32, GpuError> {
        let call = Operation::CreateComputeInstance.as_str();
        let device = self.device(call, gpu)?;
        let dev = device_handle(&device);
        let raw = self.raw(call, gpu);
        let gi = self.gpu_instance_by_id(&raw, dev, gpu_instance)?;
        let gi_profile_id = raw.gi_info(gi)?.profileId;

        // The GPU instance's compute slices and SMs, from its profile.
        let Some((_, gi_profile)) =
            raw.gi_profiles(dev)?.into_iter().find(|(_, p)| p.id == gi_profile_id)
        else {
            return Err(GpuError::new(call, Some(gpu), ErrorCode::NotFound).with_detail(format!(
                "no GPU instance profile with id {gi_profile_id} (GPU instance {gpu_instance})"
            )));
        };
        let ci_profiles = raw.ci_profiles(gi)?;
        let ci_profile = if u32::from(slices) == gi_profile.slice_count {
            full_size_ci_profile(&gi_profile, &ci_profiles)
        } else {
            // A part of the GPU instance: the lowest enum of that many slices
            // (NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE=0, 2=1, 3=2, 4=3, 7=4, 8=5, 6=6).
            ci_profiles.iter().find(|(_, p)| p.sliceCount == u32::from(slices)).map(|(_, p)| p.id)
        };
        let Some(ci_profile) = ci_profile else {
            return Err(GpuError::new(call, Some(gpu), ErrorCode::NotSupported).with_detail(
                format!(
                    "GPU instance {gpu_instance} offers no {slices}-slice compute instance profile"
                ),
            ));
        };
        let ci = raw
            .create_ci(gi, ci_profile)
            .map_err(|e| with_context(e, format!("GPU instance {gpu_instance}")))?;
        Ok(raw.ci_info(ci)?.id)
    }

    pub(super) fn destroy_compute_instance(
        &self,
        gpu: u32,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<(), GpuError> {
        let call = Operation::DestroyComputeInstance.as_str();
        let device = self.device(call, gpu)?;
        let dev = device_handle(&device);
        let raw = self.raw(call, gpu);
        let gi = self.gpu_instance_by_id(&raw, dev, gpu_instance)?;
        let what = || format!("compute instance {compute_instance} of GPU instance {gpu_instance}");
        let ci = raw.ci_by_id(gi, compute_instance).map_err(|e| with_context(e, what()))?;
        let destroyed = raw.destroy_ci(ci).map_err(|e| with_context(e, what()));
        self.naming_holders(call, gpu, destroyed)
    }

    pub(super) fn destroy_gpu_instance(&self, gpu: u32, gpu_instance: u32) -> Result<(), GpuError> {
        let call = Operation::DestroyGpuInstance.as_str();
        let device = self.device(call, gpu)?;
        let dev = device_handle(&device);
        let raw = self.raw(call, gpu);
        let gi = self.gpu_instance_by_id(&raw, dev, gpu_instance)?;
        let destroyed =
            raw.destroy_gi(gi).map_err(|e| with_context(e, format!("GPU instance {gpu_instance}")));
        self.naming_holders(call, gpu, destroyed)
    }

    /// The GPU instance with this id.
    pub(super) fn gpu_instance_by_id(
        &self,
        raw: &Raw<'_>,
        dev: nvmlDevice_t,
        id: u32,
    ) -> Result<nvmlGpuInstance_t, GpuError> {
        raw.gi_by_id(dev, id).map_err(|e| with_context(e, format!("GPU instance {id}")))
    }

    pub(super) fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), GpuError> {
        let call = Operation::SetComputeMode.as_str();
        let mut device = self.device(call, gpu)?;
        let nvml_mode = match mode {
            ComputeMode::Default => NvmlComputeMode::Default,
            ComputeMode::ExclusiveProcess => NvmlComputeMode::ExclusiveProcess,
            ComputeMode::Prohibited => NvmlComputeMode::Prohibited,
        };
        device
            .set_compute_mode(nvml_mode)
            .map_err(|e| wrapper_error(call, Some(gpu), "nvmlDeviceSetComputeMode", e))
    }

    /// A destroy's result, its IN_USE error with the processes that hold the GPU open: no
    /// compute process runs there (plans refuse that unless forced), so the holder is
    /// something like DCGM or dcgm-exporter, which keep MIG devices open (DCGM#276).
    pub(super) fn naming_holders(
        &self,
        call: &'static str,
        gpu: u32,
        destroyed: Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        match destroyed {
            Err(e) if e.code == ErrorCode::InUse => {
                let node = self.device_node(call, gpu)?;
                Err(with_holders(e, &node))
            }
            other => other,
        }
    }

    /// Turns persistence mode on or off.
    pub(super) fn set_persistence_mode(
        &self,
        call: &'static str,
        gpu: u32,
        on: bool,
    ) -> Result<(), GpuError> {
        self.device(call, gpu)?
            .set_persistent(on)
            .map_err(|e| wrapper_error(call, Some(gpu), "nvmlDeviceSetPersistenceMode", e))
    }

    /// After a reset: [`ErrorCode::ResetRequired`] if a MIG mode change is still pending.
    pub(super) fn check_no_pending_mig_mode(
        &self,
        call: &'static str,
        gpu: u32,
    ) -> Result<(), GpuError> {
        // Look the GPU up again: the reset may have invalidated the old handle.
        let mode = match self.device(call, gpu)?.mig_mode() {
            Ok(mode) => mode,
            // A GPU without MIG: nothing can be pending.
            Err(NvmlError::NotSupported) => return Ok(()),
            Err(e) => return Err(wrapper_error(call, Some(gpu), "nvmlDeviceGetMigMode", e)),
        };
        if mode.pending != mode.current {
            let what = if mode.pending == NVML_DEVICE_MIG_ENABLE { "enable" } else { "disable" };
            return Err(GpuError::new(call, Some(gpu), ErrorCode::ResetRequired).with_detail(
                format!(
                    "nvidia-smi reset the GPU but the MIG mode change ({what}) is still pending"
                ),
            ));
        }
        Ok(())
    }
}

/// The compute-instance profile that spans a whole GPU instance: as many compute slices
/// and as many SMs as the GPU instance. Hopper's 1g.20gb (H100) offers `1_SLICE` with 16
/// SMs and `1_SLICE_REV1` with all 26: the lowest enum with the slice count would leave 10
/// SMs unused while status shows 26. Always taking REV1 instead fails where it does not
/// exist (go-nvlib #85, #102), so the SM count decides; without a profile of equal SMs,
/// the lowest enum with the slice count.
fn full_size_ci_profile(
    gi_profile: &raw::GiProfile,
    ci_profiles: &[(u32, sys::nvmlComputeInstanceProfileInfo_t)],
) -> Option<u32> {
    let spanning = |p: &&(u32, sys::nvmlComputeInstanceProfileInfo_t)| {
        p.1.sliceCount == gi_profile.slice_count
    };
    ci_profiles
        .iter()
        .filter(spanning)
        .find(|(_, p)| p.multiprocessorCount == gi_profile.sms)
        .or_else(|| ci_profiles.iter().find(spanning))
        .map(|(_, p)| p.id)
}
