//! NVML backend: drives real NVIDIA GPUs through `libnvidia-ml.so.1`.
//!
//! The library is loaded at run time by nvml-wrapper, so the agent starts on hosts without
//! a driver and [`NvmlBackend::new`] answers [`ErrorCode::DriverNotLoaded`] there.
//! nvml-wrapper covers devices, MIG mode, compute mode and processes; GPU and compute
//! instances (list, create, destroy) and the possible placements are called raw through
//! the symbols nvml-wrapper loaded (`Nvml::lib()`), in [`raw`]. Only the
//! `Result`-returning symbol fields are used, never the helper methods of `NvmlLib` (they
//! panic when a symbol is missing from an old driver).
//!
//! Files: this one ([`GpuBackend`] for [`NvmlBackend`]: each call run on the session, and
//! the GPU reset that closes it), [`session`] (loading the library, initializing NVML and
//! again after a reset, the session every call borrows, the handle lookup), the session's
//! queries [`observe`] (device facts, MIG tables, instances, telemetry) and [`processes`],
//! its [`changes`] (MIG and compute modes, instances, persistence), [`raw`] (the FFI),
//! [`errors`] (return codes), [`library`] (which libnvidia-ml is loaded), [`driver_table`]
//! (each GPU's MIG table as its driver reports it), [`reset`] (GPU resets around a closed
//! session), [`reset_blockers`] (what keeps a GPU from being reset), [`catalog_check`]
//! (`--check-catalog`).
//!
//! NVML semantics worth knowing when reading these files:
//! - `nvmlDeviceGetGpuInstanceProfileInfo*` takes the `NVML_GPU_INSTANCE_PROFILE_*` enum
//!   index; every other call takes the profile *id* it reports (`ProfileInfo.id`).
//! - Listing GPU/compute instances "requires privileged user" (nvml.h): as non-root,
//!   observing a GPU with MIG on may fail with `NoPermission`. nvml.h says the same of
//!   the possible placements, yet a non-root user read them on the test H100.
//! - The versioned profile query is asked with the v2 struct: driver 580 garbles the
//!   name of a v3 struct (see `Raw::gi_profile`).
//! - `sliceCount` counts compute slices; a placement's size counts memory slots.
//! - NVML has no public reset call: [`GpuBackend::reset_gpu`] runs
//!   `nvidia-smi --gpu-reset -i <index>` (path set with [`NvmlBackend::with_nvidia_smi`])
//!   and, when it fails, names the processes that have the GPU's device node open.
//!   nvidia-smi refuses to reset a GPU that any NVML client has open, the agent's own
//!   session included: the agent shuts NVML down for the reset and initializes it again
//!   afterwards (see [`NvmlBackend`]).

pub mod catalog_check;
mod changes;
mod driver_table;
mod errors;
mod event_set;
mod events;
mod library;
mod observe;
mod processes;
mod raw;
mod reset;
pub mod reset_blockers;
mod session;

use std::time::Duration;

#[cfg(doc)]
use super::ErrorCode;
use super::{BackendKind, GpuBackend, GpuError, MigModeActivation};
use crate::catalog::MigProfile;
use crate::node::{ComputeMode, GpuState, Operation};
use errors::with_context;
pub use library::Driver;
use reset::{around_reset, reset_outcome, run_nvidia_smi_reset, with_holders};
pub use session::NvmlBackend;
use session::OBSERVE;

/// How long `nvidia-smi --gpu-reset` may run before it is killed.
const RESET_TIMEOUT: Duration = Duration::from_secs(120);

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> BackendKind {
        if self.driver.is_simulated() { BackendKind::Simulated } else { BackendKind::Nvml }
    }

    fn observe(&self) -> Result<Vec<GpuState>, GpuError> {
        self.with_session(OBSERVE, None, |s| s.observe())
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigModeActivation, GpuError> {
        let call = Operation::SetMigMode.as_str();
        self.with_session(call, Some(gpu), |s| s.set_mig_mode(gpu, enabled))
    }

    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile: &MigProfile,
        start: u8,
    ) -> Result<u32, GpuError> {
        let call = Operation::CreateGpuInstance.as_str();
        self.with_session(call, Some(gpu), |s| s.create_gpu_instance(gpu, profile, start))
    }

    fn create_compute_instance(
        &self,
        gpu: u32,
        gpu_instance: u32,
        slices: u8,
    ) -> Result<u32, GpuError> {
        let call = Operation::CreateComputeInstance.as_str();
        self.with_session(call, Some(gpu), |s| s.create_compute_instance(gpu, gpu_instance, slices))
    }

    fn destroy_compute_instance(
        &self,
        gpu: u32,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<(), GpuError> {
        let call = Operation::DestroyComputeInstance.as_str();
        self.with_session(call, Some(gpu), |s| {
            s.destroy_compute_instance(gpu, gpu_instance, compute_instance)
        })
    }

    fn destroy_gpu_instance(&self, gpu: u32, gpu_instance: u32) -> Result<(), GpuError> {
        let call = Operation::DestroyGpuInstance.as_str();
        self.with_session(call, Some(gpu), |s| s.destroy_gpu_instance(gpu, gpu_instance))
    }

    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), GpuError> {
        let call = Operation::SetComputeMode.as_str();
        self.with_session(call, Some(gpu), |s| s.set_compute_mode(gpu, mode))
    }

    /// Closes the NVML session (other calls wait, see [`NvmlBackend`]), runs
    /// `nvidia-smi --gpu-reset -i <gpu>` (killed after two minutes), initializes NVML
    /// again, then checks that no MIG mode is still pending ([`ErrorCode::ResetRequired`]
    /// if one is). A failure's detail has nvidia-smi's message and the processes that have
    /// the GPU's device node open while the agent's session is closed.
    fn reset_program(&self) -> Option<&std::path::Path> {
        Some(&self.nvidia_smi)
    }

    fn reset_blocker(&self, gpu: u32, host_root: &std::path::Path) -> Option<super::ResetBlocker> {
        self.find_reset_blocker(gpu, host_root)
    }

    fn pci_bus_id(&self, gpu: u32) -> Option<String> {
        let call = "nvmlDeviceGetPciInfo_v3";
        self.with_session(call, Some(gpu), |s| {
            let info = s.device(call, gpu)?.pci_info();
            info.map_err(|e| errors::wrapper_error(call, Some(gpu), call, e))
        })
        .map(|info| info.bus_id)
        .map_err(|e| tracing::warn!("the PCI address of GPU {gpu}: {e}"))
        .ok()
    }

    fn telemetry(&self, gpu: u32) -> Option<super::GpuTelemetry> {
        self.with_session("telemetry", Some(gpu), |s| s.telemetry(gpu))
            .map_err(|e| tracing::debug!("the telemetry of GPU {gpu}: {e}"))
            .ok()
    }

    fn wait_event(&self, timeout: Duration) -> Result<Option<super::GpuEvent>, GpuError> {
        NvmlBackend::wait_event(self, timeout)
    }

    fn health_reading(&self, gpu: u32) -> super::HealthReading {
        NvmlBackend::health_reading(self, gpu)
    }

    fn unwatched_gpus(&self) -> Vec<(u32, String)> {
        NvmlBackend::unwatched_gpus(self)
    }

    fn watch_again(&self) {
        NvmlBackend::watch_again(self);
    }

    fn minor_number(&self, gpu: u32) -> Option<u32> {
        let call = "nvmlDeviceGetMinorNumber";
        self.with_session(call, Some(gpu), |s| {
            let minor = s.device(call, gpu)?.minor_number();
            minor.map_err(|e| errors::wrapper_error(call, Some(gpu), call, e))
        })
        .map_err(|e| tracing::warn!("the device minor number of GPU {gpu}: {e}"))
        .ok()
    }

    fn reset_gpu(&self, gpu: u32) -> Result<(), GpuError> {
        let call = Operation::ResetGpu.as_str();
        // The device node, looked up before the reset while the handle surely works.
        let device_node = self.with_session(call, Some(gpu), |s| s.device_node(call, gpu))?;
        // Persistence mode (nvidia-persistenced, which the agent's unit wants) keeps the
        // GPU attached, and nvidia-smi refuses to reset an attached GPU ("In use by
        // another client"): off for the reset, on again after it, as NVSentinel does.
        let persistence = self.with_session(call, Some(gpu), |s| s.persistence_mode(call, gpu))?;
        if persistence {
            self.with_session(call, Some(gpu), |s| s.set_persistence_mode(call, gpu, false))
                .map_err(|e| {
                    with_context(
                        e,
                        "persistence mode (nvidia-persistenced) keeps the GPU attached and could \
                         not be turned off for the reset"
                            .to_owned(),
                    )
                })?;
            tracing::info!(gpu, "persistence mode off for the reset");
        }
        let reopen = || self.driver.open(call, Some(gpu));
        // The health watcher's event set dies with the session: freed first, made again
        // once NVML is open.
        self.suspend_events();
        let (reset, reopened) = around_reset(&self.session, reopen, || {
            // The holders are looked for before NVML is opened again, so the agent is none.
            run_nvidia_smi_reset(&self.nvidia_smi, gpu, RESET_TIMEOUT)
                .map_err(|error| with_holders(error, &device_node))
        });
        self.resume_events();
        if reset.is_ok() {
            tracing::info!(gpu, "GPU reset");
        }
        if persistence && reopened.is_ok() {
            match self.with_session(call, Some(gpu), |s| s.set_persistence_mode(call, gpu, true)) {
                Ok(()) => tracing::info!(gpu, "persistence mode on again"),
                Err(e) => tracing::warn!(gpu, "persistence mode stays off after the reset: {e}"),
            }
        }
        reset_outcome(reset, reopened)?;
        self.with_session(call, Some(gpu), |s| s.check_no_pending_mig_mode(call, gpu))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ErrorCode;
    use catalog_check::compare_with_catalog;

    #[test]
    fn new_without_a_driver_says_so_instead_of_panicking() {
        match NvmlBackend::new() {
            // A host with a driver: nothing to check here.
            Ok(backend) => assert_eq!(backend.kind(), BackendKind::Nvml),
            Err(e) => {
                assert_eq!(e.code, ErrorCode::DriverNotLoaded, "{e}");
                assert_eq!(e.call, "init");
                assert_eq!(e.gpu, None);
                let detail = e.detail.unwrap_or_default();
                assert!(
                    detail.contains("libnvidia-ml") || detail.contains("kernel module"),
                    "{detail}"
                );
            }
        }
    }

    /// Read-only check on a host with GPUs: `cargo test -- --ignored --nocapture
    /// nvml_read_only`. Observes every GPU and compares NVML's profile table with the
    /// catalog; changes nothing.
    #[test]
    #[ignore = "needs an NVIDIA GPU and driver"]
    fn nvml_read_only() {
        let backend = NvmlBackend::new().expect("NVML");
        let state = backend.observe().expect("observe");
        let mut mismatches = 0;
        for gpu in &state {
            println!("{gpu:#?}");
            match backend.profile_table(gpu.index) {
                Ok(table) => {
                    for p in &table {
                        println!("{p:?}");
                    }
                    if let Some(model) = gpu.model.filter(|m| m.supports_mig()) {
                        for line in compare_with_catalog(&table, model) {
                            println!("MISMATCH {line}");
                            mismatches += 1;
                        }
                    }
                }
                Err(e) => println!("profile_table: {e}"),
            }
        }
        assert_eq!(mismatches, 0);
    }
}
