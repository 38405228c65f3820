//! NVML backend: drives real NVIDIA GPUs through `libnvidia-ml.so.1`.
//!
//! The library is loaded at run time by nvml-wrapper, so the agent starts on hosts without
//! a driver and [`NvmlBackend::new`] answers [`ErrorCode::DriverNotLoaded`] there.
//! nvml-wrapper covers devices, MIG mode, compute mode and processes; GPU and compute
//! instances (list, create, destroy) and the possible placements are called raw through
//! the symbols nvml-wrapper loaded (`Nvml::lib()`), in the small `Raw` layer at the end
//! of this file. Only the `Result`-returning symbol fields are used, never the helper
//! methods of `NvmlLib` (they panic when a symbol is missing from an old driver).
//!
//! NVML semantics worth knowing when reading this file:
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::CStr;
use std::io;
use std::os::raw::c_uint;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use nvml_wrapper::enum_wrappers::device::ComputeMode as NvmlComputeMode;
use nvml_wrapper::error::{NvmlError, nvml_sym};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE, NVML_GPU_INSTANCE_PROFILE_COUNT, NvmlLib,
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t,
    nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_t, nvmlGpuInstanceProfileInfo_v2_t, nvmlReturn_t,
};

use super::{BackendKind, ErrorCode, GpuBackend, GpuError, MigModeActivation};
use crate::catalog::{self, GpuModel, MigProfile};
use crate::node::{ComputeInstance, ComputeMode, ComputeProcess, GpuInstance, GpuState, Operation};
use crate::sys::command::Command;
use crate::sys::procfs::holders_sentence;

/// The call name of errors from [`NvmlBackend::observe`](GpuBackend::observe).
const OBSERVE: &str = "observe";
/// The call name of errors from [`NvmlBackend::new`].
const INIT: &str = "init";
/// The call name of errors from [`NvmlBackend::profile_table`].
const PROFILE_TABLE: &str = "profile_table";
/// The nvidia-smi that [`NvmlBackend::new`] runs, looked up on `PATH`.
const DEFAULT_NVIDIA_SMI: &str = "nvidia-smi";
/// How long `nvidia-smi --gpu-reset` may run before it is killed.
const RESET_TIMEOUT: Duration = Duration::from_secs(120);

/// The GPU backend on real hardware, through NVML.
///
/// Holds the NVML session (the initialized library, which is `Send + Sync`) behind a
/// read-write lock. Every call runs on a `Session` borrowing it under the read lock;
/// device handles borrow the session, so every call looks its GPU up again by NVML index.
///
/// GPU resets run nvidia-smi, which refuses to reset a GPU that any NVML client has open,
/// and an initialized NVML keeps every `/dev/nvidiaN` open: the agent would block its own
/// resets. So [`GpuBackend::reset_gpu`] closes the session for the reset (`nvmlShutdown`,
/// by dropping the `Nvml`) under the write lock, which makes every other call, on any GPU,
/// wait until the session is initialized again afterwards. Should that re-initialization
/// fail, the slot stays empty and the next call initializes NVML itself. NVML counts
/// initializations per process, so this closes the device nodes only while the backend is
/// the process's one NVML client, as it is in the agent.
#[derive(Debug)]
pub struct NvmlBackend {
    /// The NVML session; `None` only while a reset runs or after its re-initialization
    /// failed.
    session: RwLock<Option<Nvml>>,
    /// The nvidia-smi that resets GPUs; a bare name is looked up on `PATH`.
    nvidia_smi: PathBuf,
}

/// One GPU-instance profile as NVML reports it (`nvidia-smi mig -lgip` and `-lgipp`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NvmlProfileInfo {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` enum index it was queried with.
    pub nvml_enum: u32,
    /// The profile id (`ProfileInfo.id`, nvidia-smi's profile id).
    pub id: u32,
    /// NVML's name without the `MIG ` prefix (`1g.10gb`); empty when the driver only
    /// answers the unversioned query, which has no name.
    pub name: String,
    /// Compute slices (`sliceCount`).
    pub slice_count: u32,
    /// Most instances of the profile on the GPU (`instanceCount`).
    pub instance_count: u32,
    /// Streaming multiprocessors of one instance.
    pub sms: u32,
    /// Memory of one instance (`memorySizeMB`, MiB).
    pub memory_mib: u64,
    /// Possible placements as `(start, size)` in memory slots, sorted.
    pub placements: Vec<(u32, u32)>,
}

impl NvmlBackend {
    /// Loads `libnvidia-ml.so.1` and initializes NVML.
    ///
    /// A missing library or an unloaded kernel driver answers
    /// [`ErrorCode::DriverNotLoaded`]. GPU resets run `nvidia-smi` from `PATH`; see
    /// [`NvmlBackend::with_nvidia_smi`].
    pub fn new() -> Result<Self, GpuError> {
        let nvml = Nvml::init().map_err(|e| wrapper_error(INIT, None, "nvmlInit_v2", e))?;
        Ok(Self { session: RwLock::new(Some(nvml)), nvidia_smi: PathBuf::from(DEFAULT_NVIDIA_SMI) })
    }

    /// The same backend, resetting GPUs with the nvidia-smi at `path` (a bare name is
    /// looked up on `PATH`).
    pub fn with_nvidia_smi(self, path: impl Into<PathBuf>) -> Self {
        Self { nvidia_smi: path.into(), ..self }
    }

    /// The GPU-instance profiles NVML reports for a GPU, with their possible placements.
    ///
    /// Read-only, and works with MIG off. Queries every enum index NVML defines and skips
    /// those the GPU answers Not Supported or Invalid Argument. nvml.h says the placement
    /// query needs a privileged user (a non-root user could run it on the test H100).
    pub fn profile_table(&self, gpu: u32) -> Result<Vec<NvmlProfileInfo>, GpuError> {
        self.with_session(PROFILE_TABLE, Some(gpu), |s| s.profile_table(gpu))
    }

    /// Runs `f` on the NVML session, under the read lock. Initializes NVML again first when
    /// a reset left the session closed (see [`NvmlBackend`]); a failure to do so is the
    /// error of `call` on `gpu`.
    fn with_session<T>(
        &self,
        call: &'static str,
        gpu: Option<u32>,
        f: impl FnOnce(Session<'_>) -> Result<T, GpuError>,
    ) -> Result<T, GpuError> {
        with_slot(
            &self.session,
            || {
                tracing::info!("initializing NVML again (it was closed for a GPU reset)");
                Nvml::init().map_err(|e| wrapper_error(call, gpu, "nvmlInit_v2", e))
            },
            |nvml| f(Session { nvml }),
        )
    }
}

/// The NVML session of an [`NvmlBackend`], borrowed under its lock for one call: what
/// every NVML call goes through. Device handles borrow it, so none outlives the lock (a
/// reset closes the session only under the write lock).
struct Session<'a> {
    nvml: &'a Nvml,
}

impl<'a> Session<'a> {
    /// [`NvmlBackend::profile_table`].
    fn profile_table(&self, gpu: u32) -> Result<Vec<NvmlProfileInfo>, GpuError> {
        let device = self.device(PROFILE_TABLE, gpu)?;
        let dev = device_handle(&device);
        let raw = self.raw(PROFILE_TABLE, gpu);
        let mut table = Vec::new();
        for nvml_enum in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            let Some(p) = raw.gi_profile(dev, nvml_enum)? else {
                continue;
            };
            let mut placements: Vec<(u32, u32)> = raw
                .gi_possible_placements(dev, p.id)?
                .into_iter()
                .map(|pl| (pl.start, pl.size))
                .collect();
            placements.sort_unstable();
            table.push(NvmlProfileInfo {
                nvml_enum,
                id: p.id,
                name: p.name,
                slice_count: p.slice_count,
                instance_count: p.instance_count,
                sms: p.sms,
                memory_mib: p.memory_mib,
                placements,
            });
        }
        Ok(table)
    }

    fn raw(&self, call: &'static str, gpu: u32) -> Raw<'a> {
        Raw { lib: self.nvml.lib(), call, gpu }
    }

    fn device(&self, call: &'static str, gpu: u32) -> Result<Device<'a>, GpuError> {
        self.nvml
            .device_by_index(gpu)
            .map_err(|e| wrapper_error(call, Some(gpu), "nvmlDeviceGetHandleByIndex_v2", e))
    }

    fn observe_gpu(&self, index: u32) -> Result<GpuState, GpuError> {
        let err =
            |function: &'static str| move |e| wrapper_error(OBSERVE, Some(index), function, e);
        let device = self.device(OBSERVE, index)?;
        let uuid = device.uuid().map_err(err("nvmlDeviceGetUUID"))?;
        let name = device.name().map_err(err("nvmlDeviceGetName"))?;
        let pci_device_id =
            device.pci_info().map_err(err("nvmlDeviceGetPciInfo_v3"))?.pci_device_id;
        let model =
            catalog::model_by_pci_id(pci_device_id).or_else(|| catalog::model_by_nvml_name(&name));
        let memory_total_bytes =
            device.memory_info().map_err(err("nvmlDeviceGetMemoryInfo_v2"))?.total;

        let (mig_enabled, mig_pending) = match device.mig_mode() {
            Ok(mode) => {
                let current = mode.current == NVML_DEVICE_MIG_ENABLE;
                let pending = mode.pending == NVML_DEVICE_MIG_ENABLE;
                (current, (pending != current).then_some(pending))
            }
            // A GPU without MIG.
            Err(NvmlError::NotSupported) => (false, None),
            Err(e) => return Err(err("nvmlDeviceGetMigMode")(e)),
        };

        let compute_mode = match device.compute_mode() {
            Ok(NvmlComputeMode::Default) => ComputeMode::Default,
            Ok(NvmlComputeMode::ExclusiveProcess) => ComputeMode::ExclusiveProcess,
            Ok(NvmlComputeMode::Prohibited) => ComputeMode::Prohibited,
            Ok(NvmlComputeMode::ExclusiveThread) => {
                tracing::warn!(
                    gpu = index,
                    "GPU reports the removed EXCLUSIVE_THREAD compute mode; treating it as exclusive_process"
                );
                ComputeMode::ExclusiveProcess
            }
            Err(e) => return Err(err("nvmlDeviceGetComputeMode")(e)),
        };

        let (instances, mig_devices) = if mig_enabled {
            let mig_devices = self.mig_devices(OBSERVE, index, &device)?;
            let instances = self.gpu_instances(index, &device, &mig_devices)?;
            (instances, mig_devices)
        } else {
            (Vec::new(), Vec::new())
        };
        let processes = self.processes(index, &device, mig_enabled, &mig_devices)?;

        Ok(GpuState {
            index,
            uuid,
            name,
            pci_device_id,
            model,
            memory_total_bytes,
            mig_enabled,
            mig_pending,
            compute_mode,
            instances,
            processes,
        })
    }

    /// The MIG devices (one per compute instance) under a GPU, with their ids and UUIDs.
    fn mig_devices(
        &self,
        call: &'static str,
        gpu: u32,
        device: &Device<'_>,
    ) -> Result<Vec<MigDevice>, GpuError> {
        let err = |function: &'static str| move |e| wrapper_error(call, Some(gpu), function, e);
        let raw = self.raw(call, gpu);
        let max = device.mig_device_count().map_err(err("nvmlDeviceGetMaxMigDeviceCount"))?;
        let mut found = Vec::new();
        for index in 0..max {
            let mig = match device.mig_device_by_index(index) {
                Ok(mig) => mig,
                // No MIG device at this index.
                Err(NvmlError::NotFound) => continue,
                Err(e) => return Err(err("nvmlDeviceGetMigDeviceHandleByIndex")(e)),
            };
            let handle = device_handle(&mig);
            let gpu_instance = raw.mig_gpu_instance_id(handle)?;
            let compute_instance = raw.mig_compute_instance_id(handle)?;
            let uuid = mig.uuid().map_err(err("nvmlDeviceGetUUID"))?;
            found.push(MigDevice { index, gpu_instance, compute_instance, uuid });
        }
        Ok(found)
    }

    /// Every GPU instance of a MIG-enabled GPU with its compute instances, by placement.
    fn gpu_instances(
        &self,
        gpu: u32,
        device: &Device<'_>,
        mig_devices: &[MigDevice],
    ) -> Result<Vec<GpuInstance>, GpuError> {
        let dev = device_handle(device);
        let raw = self.raw(OBSERVE, gpu);
        let uuids: HashMap<(u32, u32), &str> = mig_devices
            .iter()
            .map(|m| ((m.gpu_instance, m.compute_instance), m.uuid.as_str()))
            .collect();
        let mut profile_ids = HashSet::new();
        let mut found: BTreeMap<u32, GpuInstance> = BTreeMap::new();
        // Every enum, not only the catalog model's: an instance of a profile the catalog
        // lacks still occupies memory slots.
        for nvml_enum in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            let Some(profile) = raw.gi_profile(dev, nvml_enum)? else {
                continue;
            };
            if profile.instance_count == 0 || !profile_ids.insert(profile.id) {
                continue;
            }
            for gi in raw.gpu_instances(dev, profile.id, profile.instance_count)? {
                let info = raw.gi_info(gi)?;
                if found.contains_key(&info.id) {
                    continue;
                }
                let mut compute_instances = Vec::new();
                for (ci_id, _) in raw.compute_instances_of(gi)? {
                    let uuid = match uuids.get(&(info.id, ci_id)) {
                        Some(uuid) => (*uuid).to_owned(),
                        None => {
                            tracing::warn!(
                                gpu,
                                gpu_instance = info.id,
                                compute_instance = ci_id,
                                "no MIG device found for compute instance"
                            );
                            String::new()
                        }
                    };
                    compute_instances.push(ComputeInstance { id: ci_id, uuid });
                }
                found.insert(
                    info.id,
                    GpuInstance {
                        id: info.id,
                        profile_id: info.profileId,
                        placement_start: raw.to_u8("placement start", info.placement.start)?,
                        placement_size: raw.to_u8("placement size", info.placement.size)?,
                        compute_instances,
                    },
                );
            }
        }
        let mut instances: Vec<GpuInstance> = found.into_values().collect();
        instances.sort_by_key(|gi| (gi.placement_start, gi.id));
        Ok(instances)
    }

    /// The compute processes on a GPU. Under MIG the parent's aggregate list needs a
    /// privileged user; without one, the MIG devices are asked one by one.
    fn processes(
        &self,
        gpu: u32,
        device: &Device<'_>,
        mig_enabled: bool,
        mig_devices: &[MigDevice],
    ) -> Result<Vec<ComputeProcess>, GpuError> {
        const FUNCTION: &str = "nvmlDeviceGetComputeRunningProcesses_v3";
        let mut processes: Vec<ComputeProcess> = match running_compute_processes(device) {
            Ok(list) => list
                .into_iter()
                .map(|p| ComputeProcess { pid: p.pid, gpu_instance_id: p.gpu_instance_id })
                .collect(),
            Err(NvmlError::NoPermission | NvmlError::NotSupported) if mig_enabled => {
                let mut list = Vec::new();
                for mig in mig_devices {
                    let handle = match device.mig_device_by_index(mig.index) {
                        Ok(handle) => handle,
                        Err(e) => {
                            return Err(wrapper_error(
                                OBSERVE,
                                Some(gpu),
                                "nvmlDeviceGetMigDeviceHandleByIndex",
                                e,
                            ));
                        }
                    };
                    let on_mig = running_compute_processes(&handle)
                        .map_err(|e| wrapper_error(OBSERVE, Some(gpu), FUNCTION, e))?;
                    list.extend(on_mig.into_iter().map(|p| ComputeProcess {
                        pid: p.pid,
                        gpu_instance_id: Some(p.gpu_instance_id.unwrap_or(mig.gpu_instance)),
                    }));
                }
                list
            }
            Err(e) => return Err(wrapper_error(OBSERVE, Some(gpu), FUNCTION, e)),
        };
        let mut seen = HashSet::new();
        processes.retain(|p| seen.insert((p.pid, p.gpu_instance_id)));
        Ok(processes)
    }

    /// The GPU instance with this id.
    fn gpu_instance_by_id(
        &self,
        raw: &Raw<'_>,
        dev: nvmlDevice_t,
        id: u32,
    ) -> Result<nvmlGpuInstance_t, GpuError> {
        raw.gi_by_id(dev, id).map_err(|e| with_context(e, format!("GPU instance {id}")))
    }

    fn observe(&self) -> Result<Vec<GpuState>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| wrapper_error(OBSERVE, None, "nvmlDeviceGetCount_v2", e))?;
        let gpus = (0..count).map(|index| self.observe_gpu(index)).collect::<Result<_, _>>()?;
        Ok(gpus)
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigModeActivation, GpuError> {
        let call = Operation::SetMigMode.as_str();
        let device = self.device(call, gpu)?;
        let dev = device_handle(&device);
        let raw = self.raw(call, gpu);
        let wanted = if enabled { NVML_DEVICE_MIG_ENABLE } else { NVML_DEVICE_MIG_DISABLE };
        let status = raw.set_mig_mode(dev, wanted)?;
        if status == sys::nvmlReturn_enum_NVML_SUCCESS {
            return Ok(MigModeActivation::Activated);
        }
        // The mode is set but not activated: the reset failed or must happen elsewhere
        // (RESET_REQUIRED in pass-through VMs, IN_USE while processes hold the GPU).
        // Ask what the mode is now rather than guess from the status.
        let mode = device
            .mig_mode()
            .map_err(|e| wrapper_error(call, Some(gpu), "nvmlDeviceGetMigMode", e))?;
        if mode.current == wanted {
            Ok(MigModeActivation::Activated)
        } else if mode.pending == wanted {
            tracing::warn!(
                gpu,
                enabled,
                activation = return_name(status),
                "MIG mode change is pending until the GPU is reset"
            );
            Ok(MigModeActivation::PendingReset)
        } else {
            Err(raw_error(call, Some(gpu), "nvmlDeviceSetMigMode (activation status)", status))
        }
    }

    fn create_gpu_instance(
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
        let gi = raw
            .create_gi(dev, info.id, u32::from(start), u32::from(profile.memory_slices))
            .map_err(|e| with_context(e, format!("profile {} at slot {start}", profile.name)))?;
        Ok(raw.gi_info(gi)?.id)
    }

    fn create_compute_instance(&self, gpu: u32, gpu_instance: u32) -> Result<u32, GpuError> {
        let call = Operation::CreateComputeInstance.as_str();
        let device = self.device(call, gpu)?;
        let dev = device_handle(&device);
        let raw = self.raw(call, gpu);
        let gi = self.gpu_instance_by_id(&raw, dev, gpu_instance)?;
        let gi_profile_id = raw.gi_info(gi)?.profileId;

        // The GPU instance's compute slices, from its profile.
        let mut gi_slices = None;
        for nvml_enum in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            if let Some(p) = raw.gi_profile(dev, nvml_enum)?
                && p.id == gi_profile_id
            {
                gi_slices = Some(p.slice_count);
                break;
            }
        }
        let Some(gi_slices) = gi_slices else {
            return Err(GpuError::new(call, Some(gpu), ErrorCode::NotFound).with_detail(format!(
                "no GPU instance profile with id {gi_profile_id} (GPU instance {gpu_instance})"
            )));
        };

        // The full-size compute instance profile: as many compute slices as the GPU
        // instance. Lowest enum first, so 1_SLICE wins over 1_SLICE_REV1.
        let mut ci_profile = None;
        for ci_enum in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            if let Some(p) = raw.ci_profile(gi, ci_enum)?
                && p.sliceCount == gi_slices
            {
                ci_profile = Some(p.id);
                break;
            }
        }
        let Some(ci_profile) = ci_profile else {
            return Err(GpuError::new(call, Some(gpu), ErrorCode::NotSupported).with_detail(format!(
                "GPU instance {gpu_instance} offers no {gi_slices}-slice compute instance profile"
            )));
        };
        let ci = raw
            .create_ci(gi, ci_profile)
            .map_err(|e| with_context(e, format!("GPU instance {gpu_instance}")))?;
        Ok(raw.ci_info(ci)?.id)
    }

    fn destroy_compute_instance(
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
        raw.destroy_ci(ci).map_err(|e| with_context(e, what()))
    }

    fn destroy_gpu_instance(&self, gpu: u32, gpu_instance: u32) -> Result<(), GpuError> {
        let call = Operation::DestroyGpuInstance.as_str();
        let device = self.device(call, gpu)?;
        let dev = device_handle(&device);
        let raw = self.raw(call, gpu);
        let gi = self.gpu_instance_by_id(&raw, dev, gpu_instance)?;
        raw.destroy_gi(gi).map_err(|e| with_context(e, format!("GPU instance {gpu_instance}")))
    }

    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), GpuError> {
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

    /// The device node of a GPU (`/dev/nvidia<minor>`), or why it is unknown.
    fn device_node(
        &self,
        call: &'static str,
        gpu: u32,
    ) -> Result<Result<String, String>, GpuError> {
        Ok(self
            .device(call, gpu)?
            .minor_number()
            .map(|minor| format!("/dev/nvidia{minor}"))
            .map_err(|e| {
                wrapper_error(call, Some(gpu), "nvmlDeviceGetMinorNumber", e)
                    .detail
                    .unwrap_or_default()
            }))
    }

    /// After a reset: [`ErrorCode::ResetRequired`] if a MIG mode change is still pending.
    fn check_no_pending_mig_mode(&self, call: &'static str, gpu: u32) -> Result<(), GpuError> {
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

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Nvml
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

    fn create_compute_instance(&self, gpu: u32, gpu_instance: u32) -> Result<u32, GpuError> {
        let call = Operation::CreateComputeInstance.as_str();
        self.with_session(call, Some(gpu), |s| s.create_compute_instance(gpu, gpu_instance))
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
    fn reset_gpu(&self, gpu: u32) -> Result<(), GpuError> {
        let call = Operation::ResetGpu.as_str();
        // The device node, looked up before the reset while the handle surely works.
        let device_node = self.with_session(call, Some(gpu), |s| s.device_node(call, gpu))?;
        let (reset, reopened) = around_reset(&self.session, Nvml::init, || {
            // The holders are looked for before NVML is opened again, so the agent is none.
            run_nvidia_smi_reset(&self.nvidia_smi, gpu, RESET_TIMEOUT)
                .map_err(|error| with_holders(error, &device_node))
        });
        if reset.is_ok() {
            tracing::info!(gpu, "GPU reset");
        }
        let reopened = reopened.map_err(|e| wrapper_error(call, Some(gpu), "nvmlInit_v2", e));
        reset_outcome(reset, reopened)?;
        self.with_session(call, Some(gpu), |s| s.check_no_pending_mig_mode(call, gpu))
    }
}

/// A failed reset's error with what holds the GPU's device node (`device_node`, or why
/// it is unknown) added to its detail; unchanged when nvidia-smi was not found.
fn with_holders(error: GpuError, device_node: &Result<String, String>) -> GpuError {
    if error.code == ErrorCode::NotFound {
        return error;
    }
    let holders = match device_node {
        Ok(node) => holders_sentence(Path::new("/proc"), node, std::process::id()),
        Err(why) => format!("cannot tell what holds the GPU: no device node ({why})"),
    };
    let detail = match error.detail {
        Some(ref d) => format!("{d}; {holders}"),
        None => holders,
    };
    error.with_detail(detail)
}

/// What a reset comes to, from the reset itself and from initializing NVML again after
/// it: the reset's error first (noting a failed re-initialization in its detail), else the
/// re-initialization's, which says that the reset ran and that the next call retries.
fn reset_outcome(
    reset: Result<(), GpuError>,
    reopened: Result<(), GpuError>,
) -> Result<(), GpuError> {
    const RETRY: &str = "the next NVML call tries again";
    match (reset, reopened) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(error), Ok(())) => Err(error),
        (Ok(()), Err(init)) => Err(with_context(
            init,
            format!("the GPU was reset but NVML could not be initialized again ({RETRY})"),
        )),
        (Err(error), Err(init)) => {
            let init = init.detail.unwrap_or_else(|| init.code.nvml_text().to_owned());
            let note = format!("NVML could not be initialized again after it ({RETRY}): {init}");
            let detail = match error.detail {
                Some(ref d) => format!("{d}; {note}"),
                None => note,
            };
            Err(error.with_detail(detail))
        }
    }
}

/// Reads the session slot, whatever a panicking holder of the lock left: the slot only
/// ever holds a working session or `None`, never a half-changed one.
fn read_slot<S>(slot: &RwLock<Option<S>>) -> RwLockReadGuard<'_, Option<S>> {
    slot.read().unwrap_or_else(PoisonError::into_inner)
}

/// Writes the session slot; see [`read_slot`] about poisoning.
fn write_slot<S>(slot: &RwLock<Option<S>>) -> RwLockWriteGuard<'_, Option<S>> {
    slot.write().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f` on the session in `slot` under the read lock. When the slot is empty, takes
/// the write lock instead, opens a session with `init` (unless another thread did it in
/// the meantime) and runs `f` on it there; an `init` error leaves the slot empty and is
/// returned.
fn with_slot<S, T, E>(
    slot: &RwLock<Option<S>>,
    init: impl FnOnce() -> Result<S, E>,
    f: impl FnOnce(&S) -> Result<T, E>,
) -> Result<T, E> {
    {
        let session = read_slot(slot);
        if let Some(session) = session.as_ref() {
            return f(session);
        }
    }
    // Rare (a reset's re-initialization failed): running `f` under the write lock is fine.
    let mut session = write_slot(slot);
    let opened = match session.take() {
        Some(opened) => opened,
        None => init()?,
    };
    f(session.insert(opened))
}

/// Runs `run` with the session in `slot` closed: under the write lock, so that no call
/// uses the session meanwhile, drops the session (if any), runs `run`, then opens a new
/// one with `reinit` and puts it in the slot. Returns what `run` returned and whether
/// `reinit` succeeded; on its failure the slot is left empty, for [`with_slot`] to fill.
fn around_reset<S, E, R>(
    slot: &RwLock<Option<S>>,
    reinit: impl FnOnce() -> Result<S, E>,
    run: impl FnOnce() -> R,
) -> (R, Result<(), E>) {
    let mut session = write_slot(slot);
    drop(session.take());
    let ran = run();
    let reopened = reinit().map(|opened| *session = Some(opened));
    (ran, reopened)
}

/// Runs `<nvidia_smi> --gpu-reset -i <gpu>` with stdin closed, killing it past
/// `timeout`. The error's code comes from [`classify_reset`]; its detail names the
/// command and nvidia-smi's most relevant output line (not what holds the GPU).
fn run_nvidia_smi_reset(nvidia_smi: &Path, gpu: u32, timeout: Duration) -> Result<(), GpuError> {
    let call = Operation::ResetGpu.as_str();
    let error = |code| GpuError::new(call, Some(gpu), code);
    let shown = format!("{} --gpu-reset -i {gpu}", nvidia_smi.display());
    let command = Command::new(nvidia_smi, timeout).args(["--gpu-reset", "-i", &gpu.to_string()]);
    let finished = match command.run() {
        Ok(finished) => finished,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let on_path =
                if nvidia_smi.components().count() == 1 { " (searched PATH)" } else { "" };
            return Err(error(ErrorCode::NotFound).with_detail(format!(
                "nvidia-smi not found at {}{on_path}",
                nvidia_smi.display()
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Err(
                error(ErrorCode::NoPermission).with_detail(format!("cannot run {shown}: {e}"))
            );
        }
        Err(e) => {
            return Err(error(ErrorCode::Unknown).with_detail(format!("cannot run {shown}: {e}")));
        }
    };
    let Some(status) = finished.status else {
        return Err(error(ErrorCode::Unknown).with_detail(format!(
            "{shown} did not finish within {} s and was killed",
            timeout.as_secs_f64()
        )));
    };
    let output = format!("{}{}", finished.stdout_text(), finished.stderr_text());
    match classify_reset(status.code(), &output) {
        Ok(()) => Ok(()),
        Err((code, line)) => {
            let how = match status.code() {
                Some(c) => format!("exited with status {c}"),
                None => "was killed by a signal".to_owned(),
            };
            let detail = match line {
                Some(line) => format!("{shown} {how}: {line}"),
                None => format!("{shown} {how}"),
            };
            Err(error(code).with_detail(detail))
        }
    }
}

/// What [`classify_reset`] made of a reset: `Ok`, or the code and the telling line.
type ResetVerdict<'a> = Result<(), (ErrorCode, Option<&'a str>)>;

/// What `nvidia-smi --gpu-reset` meant, from its exit code (`None`: killed by a signal)
/// and its stdout and stderr: `Ok` on exit 0, else the agent's code and the output
/// line that says why (the first non-empty one when none stands out).
///
/// In-use wording wins (nvidia-smi exits 255 for it), then permission wording, then
/// nvidia-smi's documented exit codes; anything else is [`ErrorCode::Unknown`].
fn classify_reset(exit_code: Option<i32>, output: &str) -> ResetVerdict<'_> {
    if exit_code == Some(0) {
        return Ok(());
    }
    let lines = || output.lines().map(str::trim).filter(|l| !l.is_empty());
    let in_use = |l: &str| {
        let l = l.to_lowercase();
        ["in use", "being used by", "processes using"].iter().any(|k| l.contains(k))
    };
    let no_permission = |l: &str| {
        let l = l.to_lowercase();
        [
            "insufficient permission",
            "permission denied",
            "not permitted",
            "must be root",
            "requires root",
            "require root",
            "as root",
            "only root",
            "root user",
            "root privilege",
            "root access",
        ]
        .iter()
        .any(|k| l.contains(k))
    };
    if let Some(line) = lines().find(|l| in_use(l)) {
        return Err((ErrorCode::InUse, Some(line)));
    }
    if let Some(line) = lines().find(|l| no_permission(l)) {
        return Err((ErrorCode::NoPermission, Some(line)));
    }
    // nvidia-smi(1), RETURN VALUE.
    let code = match exit_code {
        Some(2) => ErrorCode::InvalidArgument,
        Some(3) => ErrorCode::NotSupported,
        Some(4) => ErrorCode::NoPermission,
        Some(9 | 12) => ErrorCode::DriverNotLoaded,
        Some(15) => ErrorCode::GpuLost,
        _ => ErrorCode::Unknown,
    };
    Err((code, lines().next()))
}

/// Every difference between the profiles NVML reports and a catalog model's table, one
/// line each: id, slices, instance count, SMs, memory, name, placements, and profiles
/// missing on either side. Empty when they agree. Profiles are matched by enum index.
pub fn compare_with_catalog(info: &[NvmlProfileInfo], model: &GpuModel) -> Vec<String> {
    let mut out = Vec::new();
    for p in model.mig_profiles {
        let label = format!("{} {} (enum {})", model.key, p.name, p.nvml_enum);
        let Some(n) = info.iter().find(|n| n.nvml_enum == p.nvml_enum) else {
            out.push(format!("{label}: in the catalog, not reported by NVML"));
            continue;
        };
        let mut differ = |what: &str, nvml: String, catalog: String| {
            if nvml != catalog {
                out.push(format!("{label}: {what}: NVML {nvml}, catalog {catalog}"));
            }
        };
        differ("id", n.id.to_string(), p.id.to_string());
        if !n.name.is_empty() {
            differ("name", n.name.clone(), p.name.to_owned());
        }
        differ("compute slices", n.slice_count.to_string(), p.compute_slices.to_string());
        differ("instance count", n.instance_count.to_string(), p.max_count.to_string());
        differ("SMs", n.sms.to_string(), p.sms.to_string());
        differ("memory MiB", n.memory_mib.to_string(), p.memory_mib.to_string());
        let mut catalog_placements: Vec<(u32, u32)> = p
            .placements
            .iter()
            .map(|&start| (u32::from(start), u32::from(p.memory_slices)))
            .collect();
        catalog_placements.sort_unstable();
        let mut nvml_placements = n.placements.clone();
        nvml_placements.sort_unstable();
        differ(
            "placements",
            format_placements(&nvml_placements),
            format_placements(&catalog_placements),
        );
    }
    for n in info {
        if !model.mig_profiles.iter().any(|p| p.nvml_enum == n.nvml_enum) {
            let name = if n.name.is_empty() { "unnamed" } else { n.name.as_str() };
            out.push(format!(
                "{} {name} (enum {}): reported by NVML (id {}, {} SMs, {} MiB), not in the catalog",
                model.key, n.nvml_enum, n.id, n.sms, n.memory_mib
            ));
        }
    }
    out
}

/// `{0,2,4}:2` when every placement has one size, else `0:1,2:2`; `none` when empty.
fn format_placements(placements: &[(u32, u32)]) -> String {
    match placements.first() {
        None => "none".to_owned(),
        Some(&(_, size)) if placements.iter().all(|&(_, s)| s == size) => {
            let starts: Vec<String> =
                placements.iter().map(|(start, _)| start.to_string()).collect();
            format!("{{{}}}:{size}", starts.join(","))
        }
        Some(_) => placements
            .iter()
            .map(|(start, size)| format!("{start}:{size}"))
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// A MIG device: the NVML device handle standing for one compute instance.
struct MigDevice {
    /// Its index under the parent (`nvmlDeviceGetMigDeviceHandleByIndex`).
    index: u32,
    gpu_instance: u32,
    compute_instance: u32,
    /// `MIG-…`.
    uuid: String,
}

/// A GPU-instance profile as queried by enum index.
struct GiProfile {
    id: u32,
    name: String,
    slice_count: u32,
    instance_count: u32,
    sms: u32,
    memory_mib: u64,
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`, retried when processes start between the
/// count and the fetch.
fn running_compute_processes(
    device: &Device<'_>,
) -> Result<Vec<nvml_wrapper::struct_wrappers::device::ProcessInfo>, NvmlError> {
    let mut attempt = 0;
    loop {
        match device.running_compute_processes() {
            Err(NvmlError::InsufficientSize(_)) if attempt < 3 => attempt += 1,
            other => return other,
        }
    }
}

/// The raw handle of a device, for the calls nvml-wrapper lacks.
fn device_handle(device: &Device<'_>) -> nvmlDevice_t {
    // SAFETY: `handle` is only unsafe to make callers think about the handle's lifetime:
    // it is valid while the `Nvml` that `device` borrows stays initialized, and every raw
    // call using it happens inside a method of `Session`, which borrows that `Nvml` under
    // the backend's lock: a reset shuts NVML down only under the write lock, once no
    // `Session` is left. No second `Device` is built from it.
    unsafe { device.handle() }
}

/// The text after `MIG ` of a NUL-terminated profile name.
fn profile_name(raw_name: &[std::os::raw::c_char]) -> String {
    // `c_char` is i8 or u8 depending on the target; reinterpret each as a byte.
    let bytes: Vec<u8> = raw_name.iter().map(|&c| c as u8).collect();
    let name = CStr::from_bytes_until_nul(&bytes)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
    let name = name.trim();
    name.strip_prefix("MIG ").unwrap_or(name).trim().to_owned()
}

/// Puts what the call was about in front of an error's detail.
fn with_context(error: GpuError, detail: String) -> GpuError {
    let detail = match error.detail {
        Some(ref existing) => format!("{detail}: {existing}"),
        None => detail,
    };
    GpuError { detail: Some(detail), ..error }
}

/// NVML's name of a return code (`NVML_ERROR_IN_USE`).
fn return_name(ret: nvmlReturn_t) -> &'static str {
    match ret {
        sys::nvmlReturn_enum_NVML_SUCCESS => "NVML_SUCCESS",
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => "NVML_ERROR_UNINITIALIZED",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => "NVML_ERROR_INVALID_ARGUMENT",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => "NVML_ERROR_NOT_SUPPORTED",
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => "NVML_ERROR_NO_PERMISSION",
        sys::nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED => "NVML_ERROR_ALREADY_INITIALIZED",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => "NVML_ERROR_NOT_FOUND",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => "NVML_ERROR_INSUFFICIENT_SIZE",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER => "NVML_ERROR_INSUFFICIENT_POWER",
        sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => "NVML_ERROR_DRIVER_NOT_LOADED",
        sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT => "NVML_ERROR_TIMEOUT",
        sys::nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE => "NVML_ERROR_IRQ_ISSUE",
        sys::nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND => "NVML_ERROR_LIBRARY_NOT_FOUND",
        sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => "NVML_ERROR_FUNCTION_NOT_FOUND",
        sys::nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM => "NVML_ERROR_CORRUPTED_INFOROM",
        sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => "NVML_ERROR_GPU_IS_LOST",
        sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => "NVML_ERROR_RESET_REQUIRED",
        sys::nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM => "NVML_ERROR_OPERATING_SYSTEM",
        sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => {
            "NVML_ERROR_LIB_RM_VERSION_MISMATCH"
        }
        sys::nvmlReturn_enum_NVML_ERROR_IN_USE => "NVML_ERROR_IN_USE",
        sys::nvmlReturn_enum_NVML_ERROR_MEMORY => "NVML_ERROR_MEMORY",
        sys::nvmlReturn_enum_NVML_ERROR_NO_DATA => "NVML_ERROR_NO_DATA",
        sys::nvmlReturn_enum_NVML_ERROR_VGPU_ECC_NOT_SUPPORTED => {
            "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED"
        }
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => {
            "NVML_ERROR_INSUFFICIENT_RESOURCES"
        }
        sys::nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED => "NVML_ERROR_FREQ_NOT_SUPPORTED",
        sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => {
            "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"
        }
        sys::nvmlReturn_enum_NVML_ERROR_DEPRECATED => "NVML_ERROR_DEPRECATED",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_READY => "NVML_ERROR_NOT_READY",
        sys::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND => "NVML_ERROR_GPU_NOT_FOUND",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_STATE => "NVML_ERROR_INVALID_STATE",
        sys::nvmlReturn_enum_NVML_ERROR_RESET_TYPE_NOT_SUPPORTED => {
            "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED"
        }
        sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN => "NVML_ERROR_UNKNOWN",
        _ => "an unknown NVML return code",
    }
}

/// The agent's code for an NVML return code.
fn return_code(ret: nvmlReturn_t) -> ErrorCode {
    match ret {
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        | sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED
        | sys::nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND
        | sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => ErrorCode::DriverNotLoaded,
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        | sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => ErrorCode::InvalidArgument,
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        | sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => ErrorCode::NotSupported,
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => ErrorCode::NoPermission,
        sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND
        | sys::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND => ErrorCode::NotFound,
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => ErrorCode::InsufficientResources,
        sys::nvmlReturn_enum_NVML_ERROR_IN_USE => ErrorCode::InUse,
        sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => ErrorCode::ResetRequired,
        sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => ErrorCode::GpuLost,
        _ => ErrorCode::Unknown,
    }
}

/// The error for a raw NVML return code from `function`.
fn raw_error(call: &str, gpu: Option<u32>, function: &str, ret: nvmlReturn_t) -> GpuError {
    let hint = match ret {
        sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => {
            ": is the nvidia kernel module loaded?"
        }
        sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => {
            ": libnvidia-ml and the kernel driver differ in version (reload the nvidia module or reboot)"
        }
        sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => {
            ": the driver is too old for this call"
        }
        _ => "",
    };
    let detail = if return_name(ret).starts_with("NVML_") {
        format!("{function} returned {}{hint}", return_name(ret))
    } else {
        format!("{function} returned NVML code {ret}{hint}")
    };
    GpuError::new(call, gpu, return_code(ret)).with_detail(detail)
}

/// The error for an nvml-wrapper failure in `function`.
fn wrapper_error(call: &str, gpu: Option<u32>, function: &str, error: NvmlError) -> GpuError {
    match error {
        NvmlError::LibloadingError(e) => GpuError::new(call, gpu, ErrorCode::DriverNotLoaded)
            .with_detail(format!(
                "libnvidia-ml.so.1 not found: is the NVIDIA driver installed? ({e})"
            )),
        NvmlError::FailedToLoadSymbol(e) => GpuError::new(call, gpu, ErrorCode::NotSupported)
            .with_detail(format!(
                "{function} is missing from libnvidia-ml.so.1: the driver is too old ({e})"
            )),
        NvmlError::Utf8Error(_)
        | NvmlError::NulError(_)
        | NvmlError::StringTooLong { .. }
        | NvmlError::IncorrectBits(_)
        | NvmlError::SetReleaseFailed
        | NvmlError::GetPciInfoFailed
        | NvmlError::PciInfoToCFailed => {
            GpuError::new(call, gpu, ErrorCode::Unknown).with_detail(format!("{function}: {error}"))
        }
        // Every other variant stands for an NVML return code (UnexpectedVariant carries
        // the codes nvml-wrapper has no variant for, e.g. INSUFFICIENT_RESOURCES).
        other => raw_error(call, gpu, function, nvmlReturn_t::from(other)),
    }
}

/// Whether a profile query's answer means "no such profile on this GPU".
fn is_absent(error: &GpuError) -> bool {
    matches!(error.code, ErrorCode::NotSupported | ErrorCode::InvalidArgument)
}

/// `NVML_STRUCT_VERSION(data, ver)` from nvml.h: the struct size with the version in the top byte.
const fn struct_version(size: usize, version: u32) -> u32 {
    size as u32 | (version << 24)
}

/// nvml.h structs NVML fills in, created all-zero as the C API expects.
trait Zeroed: Copy {
    /// The all-zero value.
    fn zeroed() -> Self;
}

macro_rules! impl_zeroed {
    ($($t:ty),* $(,)?) => {
        $(impl Zeroed for $t {
            fn zeroed() -> Self {
                // SAFETY: a bindgen `#[repr(C)]` struct from nvml.h made of integers,
                // integer arrays and raw pointers only: all-zero bytes are a valid value
                // (zero, or a null pointer).
                unsafe { std::mem::zeroed() }
            }
        })*
    };
}

impl_zeroed!(
    nvmlGpuInstanceProfileInfo_t,
    nvmlGpuInstanceProfileInfo_v2_t,
    nvmlGpuInstanceInfo_t,
    nvmlComputeInstanceProfileInfo_t,
    nvmlComputeInstanceInfo_t,
);

/// The NVML calls nvml-wrapper lacks, called through the symbols it loaded.
///
/// Handles passed in come from NVML on this same library while it is initialized (the
/// `lib` borrow keeps the owning `Nvml` alive); GPU and compute instance handles may go
/// stale when another client destroys the instance, which NVML reports as an error.
struct Raw<'a> {
    lib: &'a NvmlLib,
    call: &'static str,
    gpu: u32,
}

impl<'a> Raw<'a> {
    /// A loaded symbol, or NotSupported naming it.
    fn sym<T>(&self, function: &str, sym: Result<&'a T, NvmlError>) -> Result<&'a T, GpuError> {
        sym.map_err(|e| wrapper_error(self.call, Some(self.gpu), function, e))
    }

    fn check(&self, function: &str, ret: nvmlReturn_t) -> Result<(), GpuError> {
        if ret == sys::nvmlReturn_enum_NVML_SUCCESS {
            Ok(())
        } else {
            Err(raw_error(self.call, Some(self.gpu), function, ret))
        }
    }

    fn to_u8(&self, what: &str, value: u32) -> Result<u8, GpuError> {
        u8::try_from(value).map_err(|_| {
            GpuError::new(self.call, Some(self.gpu), ErrorCode::Unknown)
                .with_detail(format!("NVML reported {what} {value}, out of range"))
        })
    }

    /// The GPU-instance profile at an enum index, `None` where the GPU has none. Asks
    /// the versioned query with the v2 struct (it carries the name) and falls back to the
    /// unversioned one on drivers that lack it or reject the version.
    ///
    /// Not v3: driver 580.159 fills a v3 struct's numbers in the v3 layout but writes the
    /// name at the v2 offset, formatted from the wrong fields (`MIG 7g.0gb` for 1g.10gb),
    /// as seen on a real H100. v3 only adds capability bits, which the agent does not use.
    fn gi_profile(&self, dev: nvmlDevice_t, nvml_enum: u32) -> Result<Option<GiProfile>, GpuError> {
        if self.lib.nvmlDeviceGetGpuInstanceProfileInfoV.is_ok() {
            match self.gi_profile_info_v2(dev, nvml_enum) {
                Ok(i) => {
                    return Ok(Some(GiProfile {
                        id: i.id,
                        name: profile_name(&i.name),
                        slice_count: i.sliceCount,
                        instance_count: i.instanceCount,
                        sms: i.multiprocessorCount,
                        memory_mib: i.memorySizeMB,
                    }));
                }
                Err(e) if e.code == ErrorCode::NotSupported => return Ok(None),
                // An invalid argument may be the enum index or a rejected struct version:
                // the unversioned query below tells them apart.
                Err(e) if e.code == ErrorCode::InvalidArgument => {}
                Err(e) => return Err(e),
            }
        }
        match self.gi_profile_info_v1(dev, nvml_enum) {
            Ok(i) => Ok(Some(GiProfile {
                id: i.id,
                name: String::new(),
                slice_count: i.sliceCount,
                instance_count: i.instanceCount,
                sms: i.multiprocessorCount,
                memory_mib: i.memorySizeMB,
            })),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn gi_profile_info_v1(
        &self,
        dev: nvmlDevice_t,
        nvml_enum: u32,
    ) -> Result<nvmlGpuInstanceProfileInfo_t, GpuError> {
        const F: &str = "nvmlDeviceGetGpuInstanceProfileInfo";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceGetGpuInstanceProfileInfo.as_ref()))?;
        let mut info = nvmlGpuInstanceProfileInfo_t::zeroed();
        // SAFETY: `f` has nvml.h's signature; `dev` is a live device handle (see `Raw`);
        // `info` is a writable struct of the type the function fills.
        let ret = unsafe { f(dev, nvml_enum, &mut info) };
        self.check(F, ret).map(|()| info)
    }

    fn gi_profile_info_v2(
        &self,
        dev: nvmlDevice_t,
        nvml_enum: u32,
    ) -> Result<nvmlGpuInstanceProfileInfo_v2_t, GpuError> {
        const F: &str = "nvmlDeviceGetGpuInstanceProfileInfoV";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref()))?;
        let mut info = nvmlGpuInstanceProfileInfo_v2_t::zeroed();
        info.version = struct_version(std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>(), 2);
        // SAFETY: `f` has nvml.h's signature; `dev` is a live device handle (see `Raw`);
        // `info` is a writable v2 struct whose version field says so.
        let ret = unsafe { f(dev, nvml_enum, &mut info) };
        self.check(F, ret).map(|()| info)
    }

    fn gi_possible_placements(
        &self,
        dev: nvmlDevice_t,
        profile_id: u32,
    ) -> Result<Vec<nvmlGpuInstancePlacement_t>, GpuError> {
        const F: &str = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
        let f =
            self.sym(F, nvml_sym(self.lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref()))?;
        let mut count: c_uint = 0;
        // SAFETY: `f` has nvml.h's signature; a null `placements` asks for the count only,
        // written to the live local `count`. `dev` is a live device handle (see `Raw`).
        let ret = unsafe { f(dev, profile_id, ptr::null_mut(), &mut count) };
        self.check(F, ret)?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut placements = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
        let mut written = count;
        // SAFETY: as above; `placements` holds `count` elements, as many as NVML said the
        // profile has, which nvml.h requires of the buffer.
        let ret = unsafe { f(dev, profile_id, placements.as_mut_ptr(), &mut written) };
        self.check(F, ret)?;
        placements.truncate(written.min(count) as usize);
        Ok(placements)
    }

    fn gpu_instances(
        &self,
        dev: nvmlDevice_t,
        profile_id: u32,
        capacity: u32,
    ) -> Result<Vec<nvmlGpuInstance_t>, GpuError> {
        const F: &str = "nvmlDeviceGetGpuInstances";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceGetGpuInstances.as_ref()))?;
        let capacity = capacity.max(1);
        let mut handles: Vec<nvmlGpuInstance_t> = vec![ptr::null_mut(); capacity as usize];
        let mut count: c_uint = capacity;
        // SAFETY: `f` has nvml.h's signature; `handles` holds the profile's instanceCount
        // handles, the size nvml.h requires; `count` is a live local. `dev` is a live
        // device handle (see `Raw`).
        let ret = unsafe { f(dev, profile_id, handles.as_mut_ptr(), &mut count) };
        self.check(F, ret)?;
        handles.truncate(count.min(capacity) as usize);
        Ok(handles)
    }

    fn gi_info(&self, gi: nvmlGpuInstance_t) -> Result<nvmlGpuInstanceInfo_t, GpuError> {
        const F: &str = "nvmlGpuInstanceGetInfo";
        let f = self.sym(F, nvml_sym(self.lib.nvmlGpuInstanceGetInfo.as_ref()))?;
        let mut info = nvmlGpuInstanceInfo_t::zeroed();
        // SAFETY: `f` has nvml.h's signature; `gi` came from NVML (see `Raw`); `info` is
        // a writable struct of the type the function fills.
        let ret = unsafe { f(gi, &mut info) };
        self.check(F, ret).map(|()| info)
    }

    fn gi_by_id(&self, dev: nvmlDevice_t, id: u32) -> Result<nvmlGpuInstance_t, GpuError> {
        const F: &str = "nvmlDeviceGetGpuInstanceById";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceGetGpuInstanceById.as_ref()))?;
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: `f` has nvml.h's signature; `dev` is a live device handle (see `Raw`);
        // `gi` is a live local for the returned handle.
        let ret = unsafe { f(dev, id, &mut gi) };
        self.check(F, ret).map(|()| gi)
    }

    fn create_gi(
        &self,
        dev: nvmlDevice_t,
        profile_id: u32,
        start: u32,
        size: u32,
    ) -> Result<nvmlGpuInstance_t, GpuError> {
        const F: &str = "nvmlDeviceCreateGpuInstanceWithPlacement";
        let f =
            self.sym(F, nvml_sym(self.lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref()))?;
        let placement = nvmlGpuInstancePlacement_t { start, size };
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: `f` has nvml.h's signature; `placement` is a live struct NVML only
        // reads; `gi` is a live local for the new handle. `dev` is a live device handle
        // (see `Raw`).
        let ret = unsafe { f(dev, profile_id, &placement, &mut gi) };
        self.check(F, ret).map(|()| gi)
    }

    fn destroy_gi(&self, gi: nvmlGpuInstance_t) -> Result<(), GpuError> {
        const F: &str = "nvmlGpuInstanceDestroy";
        let f = self.sym(F, nvml_sym(self.lib.nvmlGpuInstanceDestroy.as_ref()))?;
        // SAFETY: `f` has nvml.h's signature; `gi` came from NVML (see `Raw`) and is not
        // used after this call.
        let ret = unsafe { f(gi) };
        self.check(F, ret)
    }

    /// The compute-instance profile at an enum index, `None` where the GPU instance has none.
    fn ci_profile(
        &self,
        gi: nvmlGpuInstance_t,
        ci_enum: u32,
    ) -> Result<Option<nvmlComputeInstanceProfileInfo_t>, GpuError> {
        const F: &str = "nvmlGpuInstanceGetComputeInstanceProfileInfo";
        let f =
            self.sym(F, nvml_sym(self.lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref()))?;
        let mut info = nvmlComputeInstanceProfileInfo_t::zeroed();
        // SAFETY: `f` has nvml.h's signature; `gi` came from NVML (see `Raw`); `info` is
        // a writable struct of the type the function fills.
        let ret = unsafe { f(gi, ci_enum, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &mut info) };
        match self.check(F, ret) {
            Ok(()) => Ok(Some(info)),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn compute_instances(
        &self,
        gi: nvmlGpuInstance_t,
        profile_id: u32,
        capacity: u32,
    ) -> Result<Vec<nvmlComputeInstance_t>, GpuError> {
        const F: &str = "nvmlGpuInstanceGetComputeInstances";
        let f = self.sym(F, nvml_sym(self.lib.nvmlGpuInstanceGetComputeInstances.as_ref()))?;
        let capacity = capacity.max(1);
        let mut handles: Vec<nvmlComputeInstance_t> = vec![ptr::null_mut(); capacity as usize];
        let mut count: c_uint = capacity;
        // SAFETY: `f` has nvml.h's signature; `handles` holds the profile's instanceCount
        // handles, the size nvml.h requires; `count` is a live local. `gi` came from NVML
        // (see `Raw`).
        let ret = unsafe { f(gi, profile_id, handles.as_mut_ptr(), &mut count) };
        self.check(F, ret)?;
        handles.truncate(count.min(capacity) as usize);
        Ok(handles)
    }

    /// Every compute instance of a GPU instance as `(id, handle)`, sorted by id.
    fn compute_instances_of(
        &self,
        gi: nvmlGpuInstance_t,
    ) -> Result<Vec<(u32, nvmlComputeInstance_t)>, GpuError> {
        let mut profile_ids = HashSet::new();
        let mut found: BTreeMap<u32, nvmlComputeInstance_t> = BTreeMap::new();
        for ci_enum in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            let Some(profile) = self.ci_profile(gi, ci_enum)? else {
                continue;
            };
            if profile.instanceCount == 0 || !profile_ids.insert(profile.id) {
                continue;
            }
            for ci in self.compute_instances(gi, profile.id, profile.instanceCount)? {
                found.entry(self.ci_info(ci)?.id).or_insert(ci);
            }
        }
        Ok(found.into_iter().collect())
    }

    fn ci_info(&self, ci: nvmlComputeInstance_t) -> Result<nvmlComputeInstanceInfo_t, GpuError> {
        const F: &str = "nvmlComputeInstanceGetInfo_v2";
        let f = self.sym(F, nvml_sym(self.lib.nvmlComputeInstanceGetInfo_v2.as_ref()))?;
        let mut info = nvmlComputeInstanceInfo_t::zeroed();
        // SAFETY: `f` has nvml.h's signature; `ci` came from NVML (see `Raw`); `info` is
        // a writable struct of the type the function fills.
        let ret = unsafe { f(ci, &mut info) };
        self.check(F, ret).map(|()| info)
    }

    fn ci_by_id(&self, gi: nvmlGpuInstance_t, id: u32) -> Result<nvmlComputeInstance_t, GpuError> {
        const F: &str = "nvmlGpuInstanceGetComputeInstanceById";
        let f = self.sym(F, nvml_sym(self.lib.nvmlGpuInstanceGetComputeInstanceById.as_ref()))?;
        let mut ci: nvmlComputeInstance_t = ptr::null_mut();
        // SAFETY: `f` has nvml.h's signature; `gi` came from NVML (see `Raw`); `ci` is a
        // live local for the returned handle.
        let ret = unsafe { f(gi, id, &mut ci) };
        self.check(F, ret).map(|()| ci)
    }

    fn create_ci(
        &self,
        gi: nvmlGpuInstance_t,
        profile_id: u32,
    ) -> Result<nvmlComputeInstance_t, GpuError> {
        const F: &str = "nvmlGpuInstanceCreateComputeInstance";
        let f = self.sym(F, nvml_sym(self.lib.nvmlGpuInstanceCreateComputeInstance.as_ref()))?;
        let mut ci: nvmlComputeInstance_t = ptr::null_mut();
        // SAFETY: `f` has nvml.h's signature; `gi` came from NVML (see `Raw`); `ci` is a
        // live local for the new handle.
        let ret = unsafe { f(gi, profile_id, &mut ci) };
        self.check(F, ret).map(|()| ci)
    }

    fn destroy_ci(&self, ci: nvmlComputeInstance_t) -> Result<(), GpuError> {
        const F: &str = "nvmlComputeInstanceDestroy";
        let f = self.sym(F, nvml_sym(self.lib.nvmlComputeInstanceDestroy.as_ref()))?;
        // SAFETY: `f` has nvml.h's signature; `ci` came from NVML (see `Raw`) and is not
        // used after this call.
        let ret = unsafe { f(ci) };
        self.check(F, ret)
    }

    fn mig_gpu_instance_id(&self, mig: nvmlDevice_t) -> Result<u32, GpuError> {
        const F: &str = "nvmlDeviceGetGpuInstanceId";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceGetGpuInstanceId.as_ref()))?;
        let mut id: c_uint = 0;
        // SAFETY: `f` has nvml.h's signature; `mig` is a live MIG device handle (see
        // `Raw`); `id` is a live local.
        let ret = unsafe { f(mig, &mut id) };
        self.check(F, ret).map(|()| id)
    }

    fn mig_compute_instance_id(&self, mig: nvmlDevice_t) -> Result<u32, GpuError> {
        const F: &str = "nvmlDeviceGetComputeInstanceId";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceGetComputeInstanceId.as_ref()))?;
        let mut id: c_uint = 0;
        // SAFETY: `f` has nvml.h's signature; `mig` is a live MIG device handle (see
        // `Raw`); `id` is a live local.
        let ret = unsafe { f(mig, &mut id) };
        self.check(F, ret).map(|()| id)
    }

    /// Sets the MIG mode; returns the activation status.
    fn set_mig_mode(&self, dev: nvmlDevice_t, mode: u32) -> Result<nvmlReturn_t, GpuError> {
        const F: &str = "nvmlDeviceSetMigMode";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceSetMigMode.as_ref()))?;
        let mut status: nvmlReturn_t = sys::nvmlReturn_enum_NVML_SUCCESS;
        // SAFETY: `f` has nvml.h's signature; `dev` is a live device handle (see `Raw`);
        // `status` is a live local for the activation status.
        let ret = unsafe { f(dev, mode, &mut status) };
        self.check(F, ret).map(|()| status)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::sync::{Arc, Mutex};
    use std::thread;
    use std::time::Instant;

    use super::*;

    fn h100() -> &'static GpuModel {
        catalog::model_by_key("h100-80gb").expect("H100 in the catalog")
    }

    /// What NVML would report for a model if the catalog were exact.
    fn table_of(model: &GpuModel) -> Vec<NvmlProfileInfo> {
        model
            .mig_profiles
            .iter()
            .map(|p| NvmlProfileInfo {
                nvml_enum: p.nvml_enum,
                id: p.id,
                name: p.name.to_owned(),
                slice_count: u32::from(p.compute_slices),
                instance_count: u32::from(p.max_count),
                sms: p.sms,
                memory_mib: p.memory_mib,
                placements: p
                    .placements
                    .iter()
                    .rev()
                    .map(|&s| (u32::from(s), u32::from(p.memory_slices)))
                    .collect(),
            })
            .collect()
    }

    #[test]
    fn raw_codes_map_to_the_agents_codes() {
        let cases = [
            (sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED, ErrorCode::DriverNotLoaded),
            (sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED, ErrorCode::DriverNotLoaded),
            (sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH, ErrorCode::DriverNotLoaded),
            (sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT, ErrorCode::InvalidArgument),
            (sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH, ErrorCode::InvalidArgument),
            (sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED, ErrorCode::NotSupported),
            (sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND, ErrorCode::NotSupported),
            (sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION, ErrorCode::NoPermission),
            (sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND, ErrorCode::NotFound),
            (
                sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
                ErrorCode::InsufficientResources,
            ),
            (sys::nvmlReturn_enum_NVML_ERROR_IN_USE, ErrorCode::InUse),
            (sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED, ErrorCode::ResetRequired),
            (sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST, ErrorCode::GpuLost),
            (sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN, ErrorCode::Unknown),
            (sys::nvmlReturn_enum_NVML_ERROR_MEMORY, ErrorCode::Unknown),
            (12345, ErrorCode::Unknown),
        ];
        for (ret, code) in cases {
            let e = raw_error("create_gpu_instance", Some(3), "nvmlX", ret);
            assert_eq!(e.code, code, "{}", return_name(ret));
            assert_eq!(e.call, "create_gpu_instance");
            assert_eq!(e.gpu, Some(3));
        }
        let e = raw_error(
            "create_gpu_instance",
            Some(0),
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
        );
        assert_eq!(
            e.to_string(),
            "create_gpu_instance on GPU 0: Insufficient Resources \
             (nvmlDeviceCreateGpuInstanceWithPlacement returned NVML_ERROR_INSUFFICIENT_RESOURCES)"
        );
        assert!(raw_error("observe", None, "f", 12345).detail.unwrap().contains("NVML code 12345"));
    }

    #[test]
    fn wrapper_errors_map_like_their_return_codes() {
        let map = |e| wrapper_error("destroy_gpu_instance", Some(1), "nvmlGpuInstanceDestroy", e);
        assert_eq!(map(NvmlError::InUse).code, ErrorCode::InUse);
        assert_eq!(map(NvmlError::NoPermission).code, ErrorCode::NoPermission);
        assert_eq!(map(NvmlError::DriverNotLoaded).code, ErrorCode::DriverNotLoaded);
        assert_eq!(map(NvmlError::Uninitialized).code, ErrorCode::DriverNotLoaded);
        assert_eq!(map(NvmlError::GpuLost).code, ErrorCode::GpuLost);
        assert_eq!(map(NvmlError::InvalidArg).code, ErrorCode::InvalidArgument);
        // nvml-wrapper has no variant for INSUFFICIENT_RESOURCES.
        let e = map(NvmlError::UnexpectedVariant(
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
        ));
        assert_eq!(e.code, ErrorCode::InsufficientResources);
        assert_eq!(e.call, "destroy_gpu_instance");
        assert_eq!(e.gpu, Some(1));
        let e = map(NvmlError::FailedToLoadSymbol("undefined symbol".into()));
        assert_eq!(e.code, ErrorCode::NotSupported);
        assert!(e.detail.unwrap().contains("nvmlGpuInstanceDestroy"));
        assert_eq!(map(NvmlError::GetPciInfoFailed).code, ErrorCode::Unknown);
        assert_eq!(map(NvmlError::Unknown).code, ErrorCode::Unknown);
    }

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

    #[test]
    fn the_catalog_agrees_with_itself() {
        for model in catalog::models() {
            assert_eq!(
                compare_with_catalog(&table_of(model), model),
                Vec::<String>::new(),
                "{}",
                model.key
            );
        }
    }

    #[test]
    fn the_h100_catalog_matches_what_nvml_reported() {
        // (enum, id, name, slices, max, SMs, memorySizeMB) from the read-only NVML run.
        let reported = [
            (0, 19, "1g.10gb", 1, 7, 16, 9984),
            (1, 14, "2g.20gb", 2, 3, 32, 20096),
            (2, 9, "3g.40gb", 3, 2, 60, 40448),
            (3, 5, "4g.40gb", 4, 1, 64, 40448),
            (4, 0, "7g.80gb", 7, 1, 132, 81152),
            (7, 20, "1g.10gb+me", 1, 1, 16, 9984),
            (9, 15, "1g.20gb", 1, 4, 26, 20096),
        ];
        let placements = |e: u32| -> Vec<(u32, u32)> {
            match e {
                0 | 7 => (0..7).map(|s| (s, 1)).collect(),
                9 => vec![(0, 2), (2, 2), (4, 2), (6, 2)],
                1 => vec![(0, 2), (2, 2), (4, 2)],
                2 => vec![(0, 4), (4, 4)],
                3 => vec![(0, 4)],
                _ => vec![(0, 8)],
            }
        };
        let info: Vec<NvmlProfileInfo> = reported
            .iter()
            .map(|&(e, id, name, slices, max, sms, mib)| NvmlProfileInfo {
                nvml_enum: e,
                id,
                name: name.to_owned(),
                slice_count: slices,
                instance_count: max,
                sms,
                memory_mib: mib,
                placements: placements(e),
            })
            .collect();
        assert_eq!(compare_with_catalog(&info, h100()), Vec::<String>::new());
    }

    #[test]
    fn every_mismatch_gets_one_line() {
        let model = h100();
        let mut info = table_of(model);
        let one_g = info.iter_mut().find(|p| p.nvml_enum == 0).unwrap();
        one_g.sms = 14;
        assert_eq!(
            compare_with_catalog(&info, model),
            vec!["h100-80gb 1g.10gb (enum 0): SMs: NVML 14, catalog 16".to_owned()]
        );

        let mut info = table_of(model);
        let half = info.iter_mut().find(|p| p.nvml_enum == 2).unwrap();
        half.id = 10;
        half.memory_mib = 40000;
        half.placements = vec![(0, 4)];
        half.instance_count = 1;
        assert_eq!(
            compare_with_catalog(&info, model),
            vec![
                "h100-80gb 3g.40gb (enum 2): id: NVML 10, catalog 9".to_owned(),
                "h100-80gb 3g.40gb (enum 2): instance count: NVML 1, catalog 2".to_owned(),
                "h100-80gb 3g.40gb (enum 2): memory MiB: NVML 40000, catalog 40448".to_owned(),
                "h100-80gb 3g.40gb (enum 2): placements: NVML {0}:4, catalog {0,4}:4".to_owned(),
            ]
        );

        let mut info = table_of(model);
        info.retain(|p| p.nvml_enum != 9);
        info.push(NvmlProfileInfo {
            nvml_enum: 13,
            id: 21,
            name: "1g.10gb-me".to_owned(),
            slice_count: 1,
            instance_count: 7,
            sms: 16,
            memory_mib: 9984,
            placements: vec![(0, 1)],
        });
        info[0].name = "1g.10gb.x".to_owned();
        info[1].slice_count = 5;
        assert_eq!(
            compare_with_catalog(&info, model),
            vec![
                "h100-80gb 1g.10gb (enum 0): name: NVML 1g.10gb.x, catalog 1g.10gb".to_owned(),
                "h100-80gb 1g.10gb+me (enum 7): compute slices: NVML 5, catalog 1".to_owned(),
                "h100-80gb 1g.20gb (enum 9): in the catalog, not reported by NVML".to_owned(),
                "h100-80gb 1g.10gb-me (enum 13): reported by NVML (id 21, 16 SMs, 9984 MiB), not in the catalog"
                    .to_owned(),
            ]
        );
    }

    #[test]
    fn an_unnamed_profile_is_not_a_name_mismatch() {
        let model = h100();
        let mut info = table_of(model);
        for p in &mut info {
            p.name.clear();
        }
        assert!(compare_with_catalog(&info, model).is_empty());
    }

    #[test]
    fn placements_format_compactly() {
        assert_eq!(format_placements(&[]), "none");
        assert_eq!(format_placements(&[(0, 2), (2, 2), (4, 2)]), "{0,2,4}:2");
        assert_eq!(format_placements(&[(0, 1), (2, 2)]), "0:1,2:2");
    }

    #[test]
    fn profile_names_lose_the_mig_prefix() {
        let mut raw = [0 as std::os::raw::c_char; 96];
        for (slot, b) in raw.iter_mut().zip(b"MIG 1g.10gb+me") {
            *slot = *b as std::os::raw::c_char;
        }
        assert_eq!(profile_name(&raw), "1g.10gb+me");
        let mut raw = [0 as std::os::raw::c_char; 96];
        for (slot, b) in raw.iter_mut().zip(b"3g.40gb") {
            *slot = *b as std::os::raw::c_char;
        }
        assert_eq!(profile_name(&raw), "3g.40gb");
        assert_eq!(profile_name(&[0; 4]), "");
    }

    #[test]
    fn struct_versions_are_nvml_h_values() {
        // NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2): 152 bytes, version 2.
        assert_eq!(std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>(), 152);
        assert_eq!(
            struct_version(std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>(), 2),
            0x0200_0098
        );
    }

    #[test]
    fn nvidia_smi_reset_outputs_are_classified() {
        let in_use_list = "The following GPUs could not be reset:\n  \
            GPU 00000000:1A:00.0: In use by another client\n\n\
            1 device is currently being used by one or more other processes (e.g., Fabric \
            Manager, CUDA application, graphics application such as an X server, or a \
            monitoring application such as another instance of nvidia-smi). Please first kill \
            all processes using this device and all compute applications running in the system.\n";
        let in_use_single = "GPU 00000000:C1:00.0 is currently in use by another process.\n\n\
            1 device is currently being used by one or more other processes.\n";
        let cases: [(Option<i32>, &str, ResetVerdict<'_>); 14] = [
            (Some(0), "GPU 00000000:1A:00.0 was successfully reset.\nAll done.\n", Ok(())),
            (Some(0), "", Ok(())),
            (
                Some(255),
                in_use_list,
                Err((ErrorCode::InUse, Some("GPU 00000000:1A:00.0: In use by another client"))),
            ),
            (
                Some(255),
                in_use_single,
                Err((
                    ErrorCode::InUse,
                    Some("GPU 00000000:C1:00.0 is currently in use by another process."),
                )),
            ),
            (
                Some(4),
                "Unable to reset GPU 00000000:1A:00.0: Insufficient Permissions\n",
                Err((
                    ErrorCode::NoPermission,
                    Some("Unable to reset GPU 00000000:1A:00.0: Insufficient Permissions"),
                )),
            ),
            (
                Some(255),
                "\n  Only root users can reset GPUs.  \n",
                Err((ErrorCode::NoPermission, Some("Only root users can reset GPUs."))),
            ),
            (Some(4), "", Err((ErrorCode::NoPermission, None))),
            (
                Some(3),
                "Resetting GPU 00000000:1A:00.0 is not supported.\n",
                Err((
                    ErrorCode::NotSupported,
                    Some("Resetting GPU 00000000:1A:00.0 is not supported."),
                )),
            ),
            (
                Some(9),
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
                Err((
                    ErrorCode::DriverNotLoaded,
                    Some(
                        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
                    ),
                )),
            ),
            (Some(15), "GPU is lost\n", Err((ErrorCode::GpuLost, Some("GPU is lost")))),
            (
                Some(2),
                "Invalid combination of input arguments.\n",
                Err((ErrorCode::InvalidArgument, Some("Invalid combination of input arguments."))),
            ),
            // "root" outside a permission phrase is not about permissions.
            (
                Some(255),
                "\nPCIe root port error on GPU 00000000:1A:00.0\nmore\n",
                Err((ErrorCode::Unknown, Some("PCIe root port error on GPU 00000000:1A:00.0"))),
            ),
            (Some(1), "", Err((ErrorCode::Unknown, None))),
            // Killed by a signal.
            (None, "partial\n", Err((ErrorCode::Unknown, Some("partial")))),
        ];
        for (exit, output, expected) in cases {
            assert_eq!(classify_reset(exit, output), expected, "{exit:?} {output:?}");
        }
    }

    #[test]
    fn a_missing_nvidia_smi_is_not_found() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("bin/nvidia-smi");
        let e = run_nvidia_smi_reset(&path, 2, Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(e.call, "reset_gpu");
        assert_eq!(e.gpu, Some(2));
        assert_eq!(
            e.detail.as_deref(),
            Some(format!("nvidia-smi not found at {}", path.display()).as_str())
        );
        let e = run_nvidia_smi_reset(
            Path::new("gpushare-test-no-such-nvidia-smi"),
            0,
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(
            e.detail.as_deref(),
            Some("nvidia-smi not found at gpushare-test-no-such-nvidia-smi (searched PATH)")
        );
    }

    /// Writes an executable `nvidia-smi` shell script into `dir`.
    fn fake_nvidia_smi(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("nvidia-smi");
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// `run_nvidia_smi_reset`, retried while another test's fork still holds the fresh
    /// script open for writing (ETXTBSY).
    fn reset_with(nvidia_smi: &Path, gpu: u32, timeout: Duration) -> Result<(), GpuError> {
        let mut attempt = 0;
        loop {
            let result = run_nvidia_smi_reset(nvidia_smi, gpu, timeout);
            match &result {
                Err(e)
                    if attempt < 20 && e.detail.as_deref().is_some_and(|d| d.contains("busy")) =>
                {
                    attempt += 1;
                    thread::sleep(Duration::from_millis(50));
                }
                _ => return result,
            }
        }
    }

    #[test]
    fn a_fake_nvidia_smi_is_run_with_the_reset_arguments() {
        let tmp = tempfile::tempdir().unwrap();
        let ok = fake_nvidia_smi(
            tmp.path(),
            r#"[ "$*" = "--gpu-reset -i 2" ] || { echo "wrong arguments: $*"; exit 7; }
echo "GPU 00000000:1A:00.0 was successfully reset.""#,
        );
        assert_eq!(reset_with(&ok, 2, Duration::from_secs(30)), Ok(()));
        let e = reset_with(&ok, 3, Duration::from_secs(30)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unknown);
        assert_eq!(
            e.detail.unwrap(),
            format!(
                "{} --gpu-reset -i 3 exited with status 7: wrong arguments: --gpu-reset -i 3",
                ok.display()
            )
        );

        let tmp = tempfile::tempdir().unwrap();
        let in_use = fake_nvidia_smi(
            tmp.path(),
            r#"echo "The following GPUs could not be reset:"
echo "  GPU 00000000:1A:00.0: In use by another client" >&2
exit 255"#,
        );
        let e = reset_with(&in_use, 0, Duration::from_secs(30)).unwrap_err();
        assert_eq!((e.call.as_str(), e.gpu, e.code), ("reset_gpu", Some(0), ErrorCode::InUse));
        assert_eq!(
            e.detail.unwrap(),
            format!(
                "{} --gpu-reset -i 0 exited with status 255: GPU 00000000:1A:00.0: In use by another client",
                in_use.display()
            )
        );

        let tmp = tempfile::tempdir().unwrap();
        let hangs = fake_nvidia_smi(tmp.path(), "exec sleep 30");
        let started = Instant::now();
        let e = reset_with(&hangs, 0, Duration::from_millis(200)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(e.code, ErrorCode::Unknown);
        assert_eq!(
            e.detail.unwrap(),
            format!(
                "{} --gpu-reset -i 0 did not finish within 0.2 s and was killed",
                hangs.display()
            )
        );
    }

    /// A stand-in for the NVML session that writes its opening and closing to a log.
    struct Probe {
        name: &'static str,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl Probe {
        fn open(name: &'static str, log: &Arc<Mutex<Vec<String>>>) -> Self {
            log.lock().unwrap().push(format!("open {name}"));
            Probe { name, log: Arc::clone(log) }
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.log.lock().unwrap().push(format!("close {}", self.name));
        }
    }

    fn take_log(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
        std::mem::take(&mut *log.lock().unwrap())
    }

    #[test]
    fn the_session_is_closed_while_a_reset_runs_and_opened_again() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let slot = RwLock::new(Some(Probe::open("first", &log)));
        let (ran, reopened) = around_reset(
            &slot,
            || Ok::<_, String>(Probe::open("second", &log)),
            || {
                // Closed before the reset runs, and every other call waits meanwhile.
                log.lock().unwrap().push("reset".to_owned());
                assert!(slot.try_read().is_err());
                "reset done"
            },
        );
        assert_eq!((ran, reopened), ("reset done", Ok(())));
        assert_eq!(take_log(&log), ["open first", "close first", "reset", "open second"]);
        assert_eq!(slot.read().unwrap().as_ref().map(|p| p.name), Some("second"));

        // A failed re-initialization leaves the slot empty; the reset's result still
        // comes back.
        let (ran, reopened) =
            around_reset(&slot, || Err::<Probe, _>("no driver"), || log.lock().unwrap().len());
        assert_eq!(ran, 1);
        assert_eq!(reopened.map(drop), Err("no driver"));
        assert_eq!(take_log(&log), ["close second"]);
        assert!(slot.read().unwrap().is_none());

        // From an empty slot: nothing to close.
        let (_, reopened) =
            around_reset(&slot, || Ok::<_, String>(Probe::open("third", &log)), || ());
        assert!(reopened.is_ok());
        assert_eq!(take_log(&log), ["open third"]);
    }

    #[test]
    fn an_empty_session_slot_is_filled_by_the_next_call() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let slot: RwLock<Option<Probe>> = RwLock::new(None);

        // The re-initialization fails again: the call fails with its error, never runs.
        let result: Result<(), String> =
            with_slot(&slot, || Err("no driver".to_owned()), |_| panic!("ran without a session"));
        assert_eq!(result, Err("no driver".to_owned()));
        assert!(slot.read().unwrap().is_none());

        let name = with_slot(&slot, || Ok(Probe::open("again", &log)), |p| Ok::<_, String>(p.name));
        assert_eq!(name, Ok("again"));
        assert_eq!(take_log(&log), ["open again"]);

        // An open session is used as it is.
        let name = with_slot(
            &slot,
            || -> Result<Probe, String> { panic!("initialized an open session") },
            |p| Ok(p.name),
        );
        assert_eq!(name, Ok("again"));
        let e = with_slot(&slot, || Ok(Probe::open("unused", &log)), |_| Err::<(), _>("failed"));
        assert_eq!(e, Err("failed"));
        assert!(take_log(&log).is_empty());
    }

    #[test]
    fn a_failed_reinitialization_after_a_reset_is_reported() {
        let reset_failed = || {
            Err(GpuError::new("reset_gpu", Some(1), ErrorCode::InUse)
                .with_detail("nvidia-smi --gpu-reset -i 1 exited with status 255: In use"))
        };
        let init_failed =
            || Err(wrapper_error("reset_gpu", Some(1), "nvmlInit_v2", NvmlError::DriverNotLoaded));
        assert_eq!(reset_outcome(Ok(()), Ok(())), Ok(()));
        assert_eq!(reset_outcome(reset_failed(), Ok(())), reset_failed());

        let e = reset_outcome(Ok(()), init_failed()).unwrap_err();
        assert_eq!(
            (e.call.as_str(), e.gpu, e.code),
            ("reset_gpu", Some(1), ErrorCode::DriverNotLoaded)
        );
        assert_eq!(
            e.detail.unwrap(),
            "the GPU was reset but NVML could not be initialized again (the next NVML call \
             tries again): nvmlInit_v2 returned NVML_ERROR_DRIVER_NOT_LOADED: is the nvidia \
             kernel module loaded?"
        );

        let e = reset_outcome(reset_failed(), init_failed()).unwrap_err();
        assert_eq!(e.code, ErrorCode::InUse);
        assert_eq!(
            e.detail.unwrap(),
            "nvidia-smi --gpu-reset -i 1 exited with status 255: In use; NVML could not be \
             initialized again after it (the next NVML call tries again): nvmlInit_v2 returned \
             NVML_ERROR_DRIVER_NOT_LOADED: is the nvidia kernel module loaded?"
        );
    }

    #[test]
    fn reset_failures_name_the_holders_unless_nvidia_smi_is_missing() {
        let missing = GpuError::new("reset_gpu", Some(0), ErrorCode::NotFound)
            .with_detail("nvidia-smi not found at nvidia-smi (searched PATH)");
        assert_eq!(with_holders(missing.clone(), &Ok("/dev/nvidia0".to_owned())), missing);

        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path().to_str().unwrap().to_owned();
        let e = with_holders(
            GpuError::new("reset_gpu", Some(0), ErrorCode::InUse).with_detail("in use"),
            &Ok(path.clone()),
        );
        // The test process holds the file but is the agent here: left out.
        assert_eq!(e.detail.unwrap(), format!("in use; no other process has {path} open"));
        let e = with_holders(
            GpuError::new("reset_gpu", Some(0), ErrorCode::Unknown),
            &Err("no minor".to_owned()),
        );
        assert_eq!(e.detail.unwrap(), "cannot tell what holds the GPU: no device node (no minor)");
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
