//! The process lists: compute processes (v1, v2, v3 structs), MPS clients and the (empty)
//! graphics lists, on a GPU or a MIG device, two-phase into a caller's buffer.
//!
//! # Safety (for every function here)
//! As in [`super::exports`]: the caller follows nvml.h.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::mem::size_of;
use std::os::raw::c_uint;

use super::handles::{self, Device};
use super::read;
use super::shared::out;
use super::types::*;
use crate::rules;

/// `nvmlDeviceGetComputeRunningProcesses_v3`: on a GPU every process (instance ids
/// 0xFFFFFFFF outside an instance), on a MIG device those of its instance, MPS clients
/// included, each with its own memory (`usedGpuMemory`). Two-phase: a
/// `*infoCount` smaller than the list (with `infos` null when it is 0) answers
/// INSUFFICIENT_SIZE and the count; none running answers SUCCESS and 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    processes_into(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        Listed::Compute,
        device,
        infoCount,
        infos,
        process_info,
    )
}

/// `nvmlProcessInfo_v1_t`: pid and used memory.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlProcessInfo_v1_t {
    /// Process id.
    pub pid: c_uint,
    /// Used GPU memory in bytes.
    pub usedGpuMemory: u64,
}
const _: () = assert!(size_of::<nvmlProcessInfo_v1_t>() == 16);

/// Which processes a list holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Listed {
    /// Every compute process, MPS clients included (`nvmlDeviceGetComputeRunningProcesses*`:
    /// the real driver 580 lists an MPS server and its clients there, each with its own
    /// memory).
    Compute,
    /// Only the MPS clients (`nvmlDeviceGetMPSComputeRunningProcesses*`).
    Mps,
    /// None: no graphics context runs on a simulated GPU
    /// (`nvmlDeviceGetGraphicsRunningProcesses*`).
    Graphics,
}

/// The processes of a GPU or MIG device that `listed` names, into a caller's buffer of
/// `T`, two-phase as `nvmlDeviceGetComputeRunningProcesses_v3` (see there).
pub(super) fn processes_into<T>(
    name: &'static str,
    listed: Listed,
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut T,
    entry: impl Fn(&rules::ProcessView) -> T,
) -> nvmlReturn_t {
    read(name, |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let count = unsafe { out(infoCount) }?;
        let mut list = match handles::device(node, epoch, device)? {
            Device::Gpu(i) => rules::processes(node, i, None)?,
            Device::Mig(i, gi, ci) => rules::processes(node, i, Some((gi, ci)))?,
        };
        match listed {
            Listed::Compute => {}
            Listed::Mps => list.retain(|p| p.mps),
            Listed::Graphics => list.clear(),
        }
        let capacity = *count as usize;
        *count = list.len() as c_uint;
        if list.is_empty() {
            return Ok(());
        }
        if capacity < list.len() {
            return Err(ret::INSUFFICIENT_SIZE);
        }
        if infos.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: `infos` holds `capacity` writable entries of `T` (nvml.h), at least
        // `list.len()`.
        let slots = unsafe { std::slice::from_raw_parts_mut(infos, list.len()) };
        for (slot, p) in slots.iter_mut().zip(&list) {
            *slot = entry(p);
        }
        Ok(())
    })
}

/// A process as the v1 struct has it.
fn process_info_v1(p: &rules::ProcessView) -> nvmlProcessInfo_v1_t {
    nvmlProcessInfo_v1_t { pid: p.pid, usedGpuMemory: p.memory }
}

/// A process as the v2/v3 struct has it.
pub(super) fn process_info(p: &rules::ProcessView) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid: p.pid,
        usedGpuMemory: p.memory,
        gpuInstanceId: p.gpu_instance,
        computeInstanceId: p.compute_instance,
    }
}

/// `nvmlDeviceGetComputeRunningProcesses` (v1 struct: pid and used memory): as `_v3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    processes_into(
        "nvmlDeviceGetComputeRunningProcesses",
        Listed::Compute,
        device,
        infoCount,
        infos,
        process_info_v1,
    )
}

/// `nvmlDeviceGetComputeRunningProcesses_v2` (the v2 struct, which is v3's): as `_v3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    processes_into(
        "nvmlDeviceGetComputeRunningProcesses_v2",
        Listed::Compute,
        device,
        infoCount,
        infos,
        process_info,
    )
}

/// `nvmlDeviceGetMPSComputeRunningProcesses` (v1 struct): as `_v3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    processes_into(
        "nvmlDeviceGetMPSComputeRunningProcesses",
        Listed::Mps,
        device,
        infoCount,
        infos,
        process_info_v1,
    )
}

/// `nvmlDeviceGetMPSComputeRunningProcesses_v2` (the v2 struct, which is v3's): as `_v3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    processes_into(
        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        Listed::Mps,
        device,
        infoCount,
        infos,
        process_info,
    )
}

/// `nvmlDeviceGetMPSComputeRunningProcesses_v3`: the MPS clients among the compute
/// processes (`nvmlDeviceGetComputeRunningProcesses_v3` lists them too, with the same
/// memory, beside the MPS server and the direct clients, as the real driver 580 on an
/// H200 did: tests/device/results/clients-h200-2026-11-27), each with its own memory;
/// two-phase as the compute list.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    processes_into(
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        Listed::Mps,
        device,
        infoCount,
        infos,
        process_info,
    )
}

/// `nvmlDeviceGetGraphicsRunningProcesses` (v1 struct): none, as `_v3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    processes_into(
        "nvmlDeviceGetGraphicsRunningProcesses",
        Listed::Graphics,
        device,
        infoCount,
        infos,
        process_info_v1,
    )
}

/// `nvmlDeviceGetGraphicsRunningProcesses_v2`: none, as `_v3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    processes_into(
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        Listed::Graphics,
        device,
        infoCount,
        infos,
        process_info,
    )
}

/// `nvmlDeviceGetGraphicsRunningProcesses_v3`: no graphics context runs on a simulated
/// GPU: SUCCESS and a count of 0, as a datacenter GPU running compute work answers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    processes_into(
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        Listed::Graphics,
        device,
        infoCount,
        infos,
        process_info,
    )
}
