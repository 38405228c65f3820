//! The NVML session's read-only queries of device facts: one observation of every GPU
//! (identity, MIG and compute modes, the driver's MIG table, GPU and compute instances
//! with their MIG devices, and, through [`super::processes`], the processes), the MIG
//! profile table, telemetry, persistence mode and device nodes.

use std::collections::{BTreeMap, HashMap, HashSet};

use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::ComputeMode as NvmlComputeMode;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE;

use super::catalog_check::NvmlProfileInfo;
use super::driver_table::{ComputeProfilesLearned, DeviceFacts, compute_sizes};
use super::errors::wrapper_error;
use super::raw::device_handle;
use super::session::{OBSERVE, PROFILE_TABLE, Session};
use crate::catalog::{self, GpuModel};
use crate::gpu::{ErrorCode, GpuError, GpuTelemetry, MigTelemetry};
use crate::node::{ComputeInstance, ComputeMode, GpuInstance, GpuState};

/// A GPU lost before it was ever observed: its index and nothing else known.
fn lost_placeholder(index: u32) -> GpuState {
    GpuState {
        index,
        uuid: String::new(),
        name: "lost GPU".to_string(),
        pci_device_id: 0,
        model: None,
        memory_total_bytes: 0,
        mig_enabled: false,
        mig_pending: None,
        compute_mode: ComputeMode::Default,
        instances: Vec::new(),
        processes: Vec::new(),
        mps_clients_named: true,
    }
}

impl<'a> Session<'a> {
    pub(super) fn observe(&self) -> Result<Vec<GpuState>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| wrapper_error(OBSERVE, None, "nvmlDeviceGetCount_v2", e))?;
        // The driver's version keys the MIG tables: one query per observation, not per GPU.
        let driver_version = self.nvml.sys_driver_version().unwrap_or_default();
        // Taken per GPU, never across its NVML calls: observations run in parallel.
        let seen = || self.last_seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let gpus = (0..count)
            .map(|index| match self.observe_gpu(index, &driver_version) {
                Ok(gpu) => {
                    seen().insert(index, gpu.clone());
                    Ok(gpu)
                }
                // A GPU off the bus answers nothing (issue 42): it stays as last seen (or
                // a bare placeholder), so that the other GPUs are observed and the health
                // watcher, which reads the loss, tells status why.
                Err(e) if e.code == ErrorCode::GpuLost => {
                    Ok(seen().get(&index).cloned().unwrap_or_else(|| lost_placeholder(index)))
                }
                Err(e) => Err(e),
            })
            .collect::<Result<_, _>>()?;
        Ok(gpus)
    }

    /// One GPU; `driver_version` keys its MIG table (read once per observation).
    pub(super) fn observe_gpu(
        &self,
        index: u32,
        driver_version: &str,
    ) -> Result<GpuState, GpuError> {
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
    pub(super) fn mig_devices(
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
    pub(super) fn gpu_instances(
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

    /// [`NvmlBackend::profile_table`].
    pub(super) fn profile_table(&self, gpu: u32) -> Result<Vec<NvmlProfileInfo>, GpuError> {
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

    /// [`GpuBackend::telemetry`] of one GPU: each value read on its own, a failed read
    /// `None` (logged at debug); the MIG devices' memory where MIG is on.
    pub(super) fn telemetry(&self, gpu: u32) -> Result<GpuTelemetry, GpuError> {
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
                mig_devices.push(MigTelemetry {
                    uuid: mig.uuid,
                    gpu_instance: mig.gpu_instance,
                    compute_instance: mig.compute_instance,
                    memory_used_bytes: memory.as_ref().map(|m| m.used),
                    memory_total_bytes: memory.as_ref().map(|m| m.total),
                });
            }
        }
        Ok(GpuTelemetry {
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

    /// The device node of a GPU (`/dev/nvidia<minor>`), or why it is unknown.
    pub(super) fn device_node(
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

    /// Whether the GPU is in persistence mode (`false` where the GPU cannot tell).
    pub(super) fn persistence_mode(&self, call: &'static str, gpu: u32) -> Result<bool, GpuError> {
        match self.device(call, gpu)?.is_in_persistent_mode() {
            Ok(on) => Ok(on),
            Err(NvmlError::NotSupported) => Ok(false),
            Err(e) => Err(wrapper_error(call, Some(gpu), "nvmlDeviceGetPersistenceMode", e)),
        }
    }
}

/// A MIG device: the NVML device handle standing for one compute instance.
pub(super) struct MigDevice {
    /// Its index under the parent (`nvmlDeviceGetMigDeviceHandleByIndex`).
    pub(super) index: u32,
    pub(super) gpu_instance: u32,
    pub(super) compute_instance: u32,
    /// `MIG-…`.
    pub(super) uuid: String,
}
