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
//! Files: this one (the backend and its session), [`raw`] (the FFI), [`errors`] (return
//! codes), [`reset`] (GPU resets around a closed session), [`catalog_check`]
//! (`--check-catalog`).
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

pub mod catalog_check;
mod driver_table;
mod errors;
mod library;
mod raw;
mod reset;
pub mod reset_blockers;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::RwLock;
use std::time::Duration;

use nvml_wrapper::enum_wrappers::device::ComputeMode as NvmlComputeMode;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;
use nvml_wrapper_sys::bindings::{
    NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE, nvmlDevice_t, nvmlGpuInstance_t,
};

use super::{BackendKind, ErrorCode, GpuBackend, GpuError, MigModeActivation};
use crate::catalog::{self, GpuModel, MigProfile};
use crate::node::{ComputeInstance, ComputeMode, ComputeProcess, GpuInstance, GpuState, Operation};
use catalog_check::NvmlProfileInfo;
use driver_table::{ComputeProfilesLearned, DeviceFacts, DriverTables, compute_sizes};
use errors::{raw_error, return_name, with_context, wrapper_error};
pub use library::Driver;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use raw::{Raw, device_handle};
use reset::{around_reset, reset_outcome, run_nvidia_smi_reset, with_holders, with_slot};

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
    /// The library the session is opened on, every time.
    driver: Driver,
    /// The nvidia-smi that resets GPUs; a bare name is looked up on `PATH`.
    nvidia_smi: PathBuf,
    /// Each GPU's MIG table as its driver reported it.
    tables: DriverTables,
}

impl NvmlBackend {
    /// Loads `libnvidia-ml.so.1` and initializes NVML.
    ///
    /// A missing library or an unloaded kernel driver answers
    /// [`ErrorCode::DriverNotLoaded`]. GPU resets run `nvidia-smi` from `PATH`; see
    /// [`NvmlBackend::with_nvidia_smi`].
    pub fn new() -> Result<Self, GpuError> {
        Self::open(Driver::Nvidia)
    }

    /// Loads `driver`'s library and initializes NVML; every later initialization (after a
    /// GPU reset) opens the same library, and each checks that it is the one meant (see
    /// [`Driver`]).
    pub fn open(driver: Driver) -> Result<Self, GpuError> {
        let nvml = driver.open(INIT, None)?;
        Ok(Self {
            session: RwLock::new(Some(nvml)),
            driver,
            nvidia_smi: PathBuf::from(DEFAULT_NVIDIA_SMI),
            tables: DriverTables::default(),
        })
    }

    /// The library this backend drives.
    pub fn driver(&self) -> &Driver {
        &self.driver
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

    /// What the driver answers for each GPU-instance profile enum index below `ceiling`
    /// (the versioned query with a v2 struct): `NVML_SUCCESS` or the error's name.
    /// Read-only; for comparing a driver's answers with the simulated driver's.
    pub fn profile_enum_answers(
        &self,
        gpu: u32,
        ceiling: u32,
    ) -> Result<Vec<(u32, &'static str)>, GpuError> {
        self.with_session(PROFILE_TABLE, Some(gpu), |s| {
            let device = s.device(PROFILE_TABLE, gpu)?;
            let dev = device_handle(&device);
            let raw = s.raw(PROFILE_TABLE, gpu);
            Ok((0..ceiling).map(|e| (e, raw.gi_profile_answer(dev, e))).collect())
        })
    }

    /// Whether each GPU is in persistence mode (`None` where it cannot tell), and its
    /// device node. Read-only.
    pub fn persistence_and_node(
        &self,
        gpu: u32,
    ) -> Result<(Option<bool>, Result<String, String>), GpuError> {
        self.with_session(PROFILE_TABLE, Some(gpu), |s| {
            let on = s.persistence_mode(PROFILE_TABLE, gpu).ok();
            Ok((on, s.device_node(PROFILE_TABLE, gpu)?))
        })
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
                self.driver.open(call, gpu)
            },
            |nvml| f(Session { nvml, tables: &self.tables }),
        )
    }
}

/// The NVML session of an [`NvmlBackend`], borrowed under its lock for one call: what
/// every NVML call goes through. Device handles borrow it, so none outlives the lock (a
/// reset closes the session only under the write lock).
struct Session<'a> {
    nvml: &'a Nvml,
    tables: &'a DriverTables,
}

impl<'a> Session<'a> {
    /// [`NvmlBackend::profile_table`].
    fn profile_table(&self, gpu: u32) -> Result<Vec<NvmlProfileInfo>, GpuError> {
        let device = self.device(PROFILE_TABLE, gpu)?;
        let dev = device_handle(&device);
        let raw = self.raw(PROFILE_TABLE, gpu);
        let mut table = Vec::new();
        for (nvml_enum, p) in raw.gi_profiles(dev)? {
            // A profile whose placements cannot be read (nvml.h: the query may need a
            // privileged user) stays in the table without them: unplaceable, not fatal.
            let mut placements: Vec<(u32, u32)> = match raw.gi_possible_placements(dev, p.id) {
                Ok(found) => found.into_iter().map(|pl| (pl.start, pl.size)).collect(),
                Err(e) => {
                    tracing::debug!(
                        gpu,
                        "the placements of MIG profile {} could not be read: {e}",
                        p.id
                    );
                    Vec::new()
                }
            };
            placements.sort_unstable();
            table.push(NvmlProfileInfo {
                nvml_enum,
                id: p.id,
                name: p.name,
                slice_count: p.slice_count,
                instance_count: p.instance_count,
                sms: p.sms,
                memory_mib: p.memory_mib,
                engines: p.engines,
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

    /// [`GpuBackend::telemetry`] of one GPU: each value read on its own, a failed read
    /// `None` (logged at debug); the MIG devices' memory where MIG is on.
    fn telemetry(&self, gpu: u32) -> Result<super::GpuTelemetry, GpuError> {
        const CALL: &str = "telemetry";
        let device = self.device(CALL, gpu)?;
        fn ok<T>(gpu: u32, what: &str, r: Result<T, NvmlError>) -> Option<T> {
            r.map_err(|e| tracing::debug!("GPU {gpu}: no {what}: {e}")).ok()
        }
        let utilization = ok(gpu, "utilisation", device.utilization_rates());
        let memory = ok(gpu, "memory information", device.memory_info());
        let mig_on = matches!(device.mig_mode(), Ok(m) if m.current == NVML_DEVICE_MIG_ENABLE);
        let mut mig_devices = Vec::new();
        let migs = if mig_on { self.mig_devices(CALL, gpu, &device) } else { Ok(Vec::new()) };
        let migs = migs.map_err(|e| tracing::debug!("GPU {gpu}: no MIG devices: {e}"));
        if let Ok(migs) = migs {
            for mig in migs {
                let memory =
                    device.mig_device_by_index(mig.index).and_then(|handle| handle.memory_info());
                let memory = ok(gpu, "MIG device memory information", memory);
                mig_devices.push(super::MigTelemetry {
                    uuid: mig.uuid,
                    gpu_instance: mig.gpu_instance,
                    compute_instance: mig.compute_instance,
                    memory_used_bytes: memory.as_ref().map(|m| m.used),
                    memory_total_bytes: memory.as_ref().map(|m| m.total),
                });
            }
        }
        Ok(super::GpuTelemetry {
            utilization_percent: utilization.as_ref().map(|u| u.gpu),
            memory_utilization_percent: utilization.as_ref().map(|u| u.memory),
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            temperature_c: ok(gpu, "temperature", device.temperature(TemperatureSensor::Gpu)),
            power_watts: ok(gpu, "power draw", device.power_usage())
                .map(|mw| f64::from(mw) / 1000.0),
            mig_devices,
        })
    }

    /// One GPU; `driver_version` keys its MIG table (read once per observation).
    fn observe_gpu(&self, index: u32, driver_version: &str) -> Result<GpuState, GpuError> {
        let err =
            |function: &'static str| move |e| wrapper_error(OBSERVE, Some(index), function, e);
        let device = self.device(OBSERVE, index)?;
        let uuid = device.uuid().map_err(err("nvmlDeviceGetUUID"))?;
        let name = device.name().map_err(err("nvmlDeviceGetName"))?;
        let pci_device_id =
            device.pci_info().map_err(err("nvmlDeviceGetPciInfo_v3"))?.pci_device_id;
        let memory_total_bytes =
            device.memory_info().map_err(err("nvmlDeviceGetMemoryInfo_v2"))?.total;

        let (mig_enabled, mig_pending, supports_mig) = match device.mig_mode() {
            Ok(mode) => {
                let current = mode.current == NVML_DEVICE_MIG_ENABLE;
                let pending = mode.pending == NVML_DEVICE_MIG_ENABLE;
                (current, (pending != current).then_some(pending), true)
            }
            // A GPU without MIG.
            Err(NvmlError::NotSupported) => (false, None, false),
            Err(e) => return Err(err("nvmlDeviceGetMigMode")(e)),
        };
        // The driver's MIG table is the truth on a MIG GPU; the catalog names the others.
        let model = if supports_mig {
            let facts = DeviceFacts {
                uuid: &uuid,
                index,
                name: &name,
                pci_device_id,
                memory_total_bytes,
                architecture: device
                    .architecture()
                    .ok()
                    .map(|a| catalog::Architecture::from_nvml(a.as_c())),
                driver_version,
            };
            self.tables.model(&facts, || self.profile_table(index))
        } else {
            catalog::model_by_pci_id(pci_device_id).or_else(|| catalog::model_by_nvml_name(&name))
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

        let mut model = model;
        let (instances, mig_devices) = if mig_enabled {
            let mig_devices = self.mig_devices(OBSERVE, index, &device)?;
            let (instances, learned) = self.gpu_instances(index, &device, &mig_devices, model)?;
            if let Some(known) = model {
                model = Some(self.tables.learn_compute_profiles(&uuid, index, known, learned));
            }
            (instances, mig_devices)
        } else {
            (Vec::new(), Vec::new())
        };
        let (processes, mps_clients_named) =
            self.processes(index, &device, mig_enabled, &mig_devices)?;

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
            mps_clients_named,
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
                // No MIG device at this index (drivers answer either; go-nvlib skips both).
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
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

    /// Every GPU instance of a MIG-enabled GPU with its compute instances, by placement;
    /// and, for each GPU-instance profile whose compute-instance sizes `model` does not yet
    /// hold, the sizes the driver offers in an instance of it (NVML answers them only for
    /// an instance that exists).
    fn gpu_instances(
        &self,
        gpu: u32,
        device: &Device<'_>,
        mig_devices: &[MigDevice],
        model: Option<&GpuModel>,
    ) -> Result<(Vec<GpuInstance>, ComputeProfilesLearned), GpuError> {
        let mut learned = ComputeProfilesLearned::new();
        let dev = device_handle(device);
        let raw = self.raw(OBSERVE, gpu);
        let uuids: HashMap<(u32, u32), &str> = mig_devices
            .iter()
            .map(|m| ((m.gpu_instance, m.compute_instance), m.uuid.as_str()))
            .collect();
        let mut profile_ids = HashSet::new();
        let mut found: BTreeMap<u32, GpuInstance> = BTreeMap::new();
        // Every enum the driver offers, not only the catalog model's: an instance of a
        // profile the catalog lacks still occupies memory slots.
        for (_, profile) in raw.gi_profiles(dev)? {
            if profile.instance_count == 0 || !profile_ids.insert(profile.id) {
                continue;
            }
            for gi in raw.gpu_instances(dev, profile.id, profile.instance_count)? {
                let info = raw.gi_info(gi)?;
                if found.contains_key(&info.id) {
                    continue;
                }
                let unknown = model
                    .and_then(|m| m.profile_by_id(info.profileId))
                    .is_some_and(|p| p.compute_profiles.is_empty());
                if unknown && !learned.contains_key(&info.profileId) {
                    match raw.ci_profiles(gi) {
                        Ok(offered) => {
                            learned.insert(info.profileId, compute_sizes(&offered));
                        }
                        Err(e) => tracing::warn!(
                            gpu,
                            "the compute-instance profiles of GPU instance {} could not be read: {e}",
                            info.id
                        ),
                    }
                }
                let mut compute_instances = Vec::new();
                for (ci_id, _, slices) in raw.compute_instances_of(gi)? {
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
                    let slices = raw.to_u8("compute instance slices", slices)?;
                    compute_instances.push(ComputeInstance { id: ci_id, uuid, slices });
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
        Ok((instances, learned))
    }

    /// The compute processes on a GPU, those the driver names MPS clients marked, and
    /// whether it names them all (see `mps_clients` below and
    /// [`GpuState::mps_clients_named`]). An idle GPU costs one
    /// driver call: with no compute process there is no MPS client either (a running MPS
    /// server is a compute process itself). On a busy one the MPS list is read before and
    /// after the compute list: a client that comes or goes between the reads is in the
    /// compute list only if it was a client at one of them, so it is never taken for a
    /// process of its own.
    fn processes(
        &self,
        gpu: u32,
        device: &Device<'_>,
        mig_enabled: bool,
        mig_devices: &[MigDevice],
    ) -> Result<(Vec<ComputeProcess>, bool), GpuError> {
        let first = self.compute_processes(gpu, device, mig_enabled, mig_devices)?;
        if first.is_empty() {
            return Ok((first, true));
        }
        let (before, named_before) = self.mps_clients(device, mig_enabled, mig_devices);
        let mut processes = self.compute_processes(gpu, device, mig_enabled, mig_devices)?;
        let (after, named_after) = self.mps_clients(device, mig_enabled, mig_devices);
        let same = |p: &ComputeProcess, c: &ComputeProcess| {
            p.pid == c.pid && p.gpu_instance_id == c.gpu_instance_id
        };
        // A client of the first read that is in neither later one has gone.
        for client in &before {
            if let Some(listed) = processes.iter_mut().find(|p| same(p, client)) {
                listed.mps_client = true;
            }
        }
        for client in after {
            match processes.iter_mut().find(|p| same(p, &client)) {
                Some(listed) => {
                    listed.mps_client = true;
                    listed.used_memory_bytes =
                        listed.used_memory_bytes.or(client.used_memory_bytes);
                }
                // A driver that names an MPS client in its MPS list alone.
                None => processes.push(client),
            }
        }
        Ok((processes, named_before && named_after))
    }

    /// The driver's compute processes of a GPU, each once. Under MIG the parent's
    /// aggregate list needs a privileged user; without one, the MIG devices are asked one
    /// by one.
    fn compute_processes(
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
                .map(|p| ComputeProcess {
                    pid: p.pid,
                    gpu_instance_id: p.gpu_instance_id,
                    used_memory_bytes: used_memory(&p.used_gpu_memory),
                    mps_client: false,
                })
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
                        used_memory_bytes: used_memory(&p.used_gpu_memory),
                        mps_client: false,
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

    /// The MPS clients the driver lists on a GPU (`nvmlDeviceGetMPSComputeRunningProcesses_v3`,
    /// asked of the MIG devices one by one where the parent's list is refused). The driver
    /// 580 lists them among the compute processes too (recorded on an H200,
    /// tests/device/results/clients-h200-2026-11-27): this only marks them. A driver that
    /// lacks the call or refuses it gives none: the MPS control daemons' lists still tell.
    /// The flag says whether the GPU itself answered (not only its MIG devices).
    fn mps_clients(
        &self,
        device: &Device<'_>,
        mig_enabled: bool,
        mig_devices: &[MigDevice],
    ) -> (Vec<ComputeProcess>, bool) {
        let entry = |p: &ProcessInfo, gi: Option<u32>| ComputeProcess {
            pid: p.pid,
            gpu_instance_id: p.gpu_instance_id.or(gi),
            used_memory_bytes: used_memory(&p.used_gpu_memory),
            mps_client: true,
        };
        match running_processes(device, Device::mps_running_compute_processes) {
            Ok(list) => (list.iter().map(|p| entry(p, None)).collect(), true),
            // The parent's MPS list of a GPU in MIG mode was never seen on hardware: any
            // answer but a missing function sends the question to its MIG devices.
            Err(e) if mig_enabled && !matches!(e, NvmlError::FailedToLoadSymbol(_)) => {
                let on_mig = mig_devices
                    .iter()
                    .filter_map(|mig| {
                        let handle = device.mig_device_by_index(mig.index).ok()?;
                        let list =
                            running_processes(&handle, Device::mps_running_compute_processes)
                                .ok()?;
                        Some(
                            list.iter()
                                .map(|p| entry(p, Some(mig.gpu_instance)))
                                .collect::<Vec<_>>(),
                        )
                    })
                    .flatten()
                    .collect();
                (on_mig, false)
            }
            Err(_) => (Vec::new(), false),
        }
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
        // The driver's version keys the MIG tables: one query per observation, not per GPU.
        let driver_version = self.nvml.sys_driver_version().unwrap_or_default();
        let gpus = (0..count)
            .map(|index| self.observe_gpu(index, &driver_version))
            .collect::<Result<_, _>>()?;
        Ok(gpus)
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigModeActivation, GpuError> {
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

    fn create_compute_instance(
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
        let destroyed = raw.destroy_ci(ci).map_err(|e| with_context(e, what()));
        self.naming_holders(call, gpu, destroyed)
    }

    fn destroy_gpu_instance(&self, gpu: u32, gpu_instance: u32) -> Result<(), GpuError> {
        let call = Operation::DestroyGpuInstance.as_str();
        let device = self.device(call, gpu)?;
        let dev = device_handle(&device);
        let raw = self.raw(call, gpu);
        let gi = self.gpu_instance_by_id(&raw, dev, gpu_instance)?;
        let destroyed =
            raw.destroy_gi(gi).map_err(|e| with_context(e, format!("GPU instance {gpu_instance}")));
        self.naming_holders(call, gpu, destroyed)
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

    /// A destroy's result, its IN_USE error with the processes that hold the GPU open: no
    /// compute process runs there (plans refuse that unless forced), so the holder is
    /// something like DCGM or dcgm-exporter, which keep MIG devices open (DCGM#276).
    fn naming_holders(
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

    /// Whether the GPU is in persistence mode (`false` where the GPU cannot tell).
    fn persistence_mode(&self, call: &'static str, gpu: u32) -> Result<bool, GpuError> {
        match self.device(call, gpu)?.is_in_persistent_mode() {
            Ok(on) => Ok(on),
            Err(NvmlError::NotSupported) => Ok(false),
            Err(e) => Err(wrapper_error(call, Some(gpu), "nvmlDeviceGetPersistenceMode", e)),
        }
    }

    /// Turns persistence mode on or off.
    fn set_persistence_mode(&self, call: &'static str, gpu: u32, on: bool) -> Result<(), GpuError> {
        self.device(call, gpu)?
            .set_persistent(on)
            .map_err(|e| wrapper_error(call, Some(gpu), "nvmlDeviceSetPersistenceMode", e))
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
        let (reset, reopened) = around_reset(&self.session, reopen, || {
            // The holders are looked for before NVML is opened again, so the agent is none.
            run_nvidia_smi_reset(&self.nvidia_smi, gpu, RESET_TIMEOUT)
                .map_err(|error| with_holders(error, &device_node))
        });
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

/// A MIG device: the NVML device handle standing for one compute instance.
struct MigDevice {
    /// Its index under the parent (`nvmlDeviceGetMigDeviceHandleByIndex`).
    index: u32,
    gpu_instance: u32,
    compute_instance: u32,
    /// `MIG-…`.
    uuid: String,
}

/// A process's GPU memory as NVML reports it (not available under some drivers and
/// virtualization modes).
fn used_memory(used: &nvml_wrapper::enums::device::UsedGpuMemory) -> Option<u64> {
    match used {
        nvml_wrapper::enums::device::UsedGpuMemory::Used(bytes) => Some(*bytes),
        nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
    }
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`, retried when processes start between the
/// count and the fetch.
fn running_compute_processes(device: &Device<'_>) -> Result<Vec<ProcessInfo>, NvmlError> {
    running_processes(device, Device::running_compute_processes)
}

/// A process list of the driver, asked again (up to three times) when it grew between the
/// count and the read.
fn running_processes<'nvml>(
    device: &Device<'nvml>,
    list: impl Fn(&Device<'nvml>) -> Result<Vec<ProcessInfo>, NvmlError>,
) -> Result<Vec<ProcessInfo>, NvmlError> {
    let mut attempt = 0;
    loop {
        match list(device) {
            Err(NvmlError::InsufficientSize(_)) if attempt < 3 => attempt += 1,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
