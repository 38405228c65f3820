//! The NVML session's process queries: a GPU's compute processes (asked of its MIG
//! devices one by one where the parent's list is refused) and which of them the driver
//! names MPS clients, read so that a client coming or going between reads is never taken
//! for a process of its own.

use std::collections::HashSet;

use nvml_wrapper::Device;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;

use super::errors::wrapper_error;
use super::observe::MigDevice;
use super::session::{OBSERVE, Session};
use crate::gpu::GpuError;
use crate::node::ComputeProcess;

impl<'a> Session<'a> {
    /// The compute processes on a GPU, those the driver names MPS clients marked, and
    /// whether it names them all (see `mps_clients` below and
    /// [`GpuState::mps_clients_named`]). An idle GPU costs one
    /// driver call: with no compute process there is no MPS client either (a running MPS
    /// server is a compute process itself). On a busy one the MPS list is read before and
    /// after the compute list: a client that comes or goes between the reads is in the
    /// compute list only if it was a client at one of them, so it is never taken for a
    /// process of its own.
    pub(super) fn processes(
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
    pub(super) fn compute_processes(
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
    pub(super) fn mps_clients(
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
