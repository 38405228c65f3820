//! The library's and the devices' entry points: init and shutdown, error strings, the
//! driver version and gpushare's markers; device count and handles, UUID, name, memory,
//! minor number, persistence, MIG and compute modes, MIG device handles and their
//! instance ids. (Device facts NVIDIA's other clients ask are in [`super::device_info`],
//! instances in [`super::instances`] and [`super::mig`], process lists in
//! [`super::processes`].)
//!
//! Every exported function, in this file and the others: `#[unsafe(no_mangle)] pub unsafe
//! extern "C"`, its body inside `read`/`mutate`/`guarded` (a panic answers
//! NVML_ERROR_UNKNOWN), its out-pointers turned into references once
//! (`shared::out`), null ones answering NVML_ERROR_INVALID_ARGUMENT.
//!
//! # Safety (for every function here)
//! The caller follows nvml.h: pointers are null or point to valid objects of the declared
//! type (buffers of the stated length or count), live for the duration of the call.
//! Handles are opaque values this library handed out; garbage is answered
//! NVML_ERROR_INVALID_ARGUMENT, never dereferenced.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::CStr;
use std::os::raw::{c_char, c_uint};

use super::handles::{self, Device};
use super::shared::{gi_of, gpu_at, out, put_str, whole_gpu, whole_gpu_ref};
use super::types::*;
use super::{init, mutate, read};
use crate::rules;

/// The simulated driver's version.
pub const DRIVER_VERSION: &str = "580.159.04";

/// What `gpushare_sim_driver` returns.
pub const DRIVER_MARK: &CStr = match CStr::from_bytes_with_nul(
    concat!("gpushare simulated NVML ", env!("CARGO_PKG_VERSION"), "\0").as_bytes(),
) {
    Ok(c) => c,
    Err(_) => panic!("the marker is NUL-terminated"),
};

// ---------------------------------------------------------------------------------------
// Library

/// `nvmlInit_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init("nvmlInit_v2")
}

/// `nvmlInitWithFlags`: the flags (`NVML_INIT_FLAG_NO_GPUS`, `NO_ATTACH`) change nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init("nvmlInitWithFlags")
}

/// `nvmlShutdown`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    super::shutdown()
}

/// `nvmlErrorString`: a static string, valid with or without init.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    ret::message(result).as_ptr()
}

/// `nvmlSystemGetDriverVersion`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: `version` is null or `length` writable bytes (nvml.h).
    read("nvmlSystemGetDriverVersion", |_, _| unsafe { put_str(version, length, DRIVER_VERSION) })
}

/// gpushare only: marks this library as the simulator, never the real driver.
#[unsafe(no_mangle)]
pub extern "C" fn gpushare_sim_driver() -> *const c_char {
    DRIVER_MARK.as_ptr()
}

/// gpushare only: the one-line reason the last `nvmlInit` failed (empty after a success).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushare_sim_last_error(buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    super::last_error(buf, len)
}

// ---------------------------------------------------------------------------------------
// Devices

/// `nvmlDeviceGetCount_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> nvmlReturn_t {
    read("nvmlDeviceGetCount_v2", |node, _| {
        // SAFETY: null or a writable c_uint (nvml.h).
        *unsafe { out(deviceCount) }? = node.gpus.len() as c_uint;
        Ok(())
    })
}

/// `nvmlDeviceGetHandleByIndex_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetHandleByIndex_v2", |node, epoch| {
        // SAFETY: null or a writable handle (nvml.h).
        let device = unsafe { out(device) }?;
        *device = handles::live_gpu(node, epoch, index)?;
        Ok(())
    })
}

/// `nvmlDeviceGetUUID`: `GPU-…` for a GPU, `MIG-…` for a MIG device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetUUID", |node, epoch| {
        let text = match handles::device(node, epoch, device)? {
            Device::Gpu(i) => gpu_at(node, i)?.uuid.clone(),
            Device::Mig(i, gi, ci) => {
                let gi = gi_of(gpu_at(node, i)?, gi)?;
                let ci = gi.compute_instance(ci);
                ci.ok_or(ret::INVALID_ARGUMENT)?.uuid.clone()
            }
        };
        // SAFETY: null or `length` writable bytes (nvml.h).
        unsafe { put_str(uuid, length, &text) }
    })
}

/// `nvmlDeviceGetName`: the model's name; a MIG device's adds `MIG <profile>`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetName", |node, epoch| {
        let text = match handles::device(node, epoch, device)? {
            Device::Gpu(i) => gpu_at(node, i)?.name().to_string(),
            Device::Mig(i, gi, ci) => {
                let g = gpu_at(node, i)?;
                let gi = gi_of(g, gi)?;
                let profile = rules::profile_of(g, gi);
                let ci = gi.compute_instance(ci);
                let ci = ci.ok_or(ret::INVALID_ARGUMENT)?;
                if ci.size == profile.compute_slices {
                    format!("{} MIG {}", g.name(), profile.name)
                } else {
                    format!("{} MIG {}c.{}", g.name(), ci.size, profile.name)
                }
            }
        };
        // SAFETY: null or `length` writable bytes (nvml.h).
        unsafe { put_str(name, length, &text) }
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: the version must be `nvmlMemory_v2`
/// (NVML_ERROR_ARGUMENT_VERSION_MISMATCH otherwise). The driver's reserved memory is apart
/// from `used`, as on the real H100 (see [`super::device_info::memory_of`]).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetMemoryInfo_v2", |node, epoch| {
        // SAFETY: null or a writable nvmlMemory_v2_t (nvml.h).
        let memory = unsafe { out(memory) }?;
        if memory.version != nvmlMemory_v2 {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved, used) = super::device_info::memory_of(node, epoch, device)?;
        *memory = nvmlMemory_v2_t {
            version: nvmlMemory_v2,
            total,
            reserved,
            free: total.saturating_sub(reserved + used),
            used,
        };
        Ok(())
    })
}

/// `nvmlDeviceGetMinorNumber`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minorNumber: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetMinorNumber", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let minor = unsafe { out(minorNumber) }?;
        *minor = whole_gpu_ref(node, epoch, device)?.minor_number;
        Ok(())
    })
}

/// `nvmlDeviceGetPersistenceMode`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetPersistenceMode", |node, epoch| {
        // SAFETY: null or a writable nvmlEnableState_t (nvml.h).
        let mode = unsafe { out(mode) }?;
        let on = whole_gpu_ref(node, epoch, device)?.persistence_mode;
        *mode = if on { NVML_FEATURE_ENABLED } else { NVML_FEATURE_DISABLED };
        Ok(())
    })
}

/// `nvmlDeviceSetPersistenceMode`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPersistenceMode(
    device: nvmlDevice_t,
    mode: c_uint,
) -> nvmlReturn_t {
    mutate("nvmlDeviceSetPersistenceMode", |node, epoch| {
        let index = whole_gpu(node, epoch, device)?;
        let on = match mode {
            NVML_FEATURE_ENABLED => true,
            NVML_FEATURE_DISABLED => false,
            _ => return Err(ret::INVALID_ARGUMENT),
        };
        rules::set_persistence_mode(node, index, on)
    })
}

/// `nvmlDeviceGetMigMode`: NOT_SUPPORTED on a GPU without MIG; `pending` differs from
/// `current` while a change waits for a reset.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    currentMode: *mut c_uint,
    pendingMode: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetMigMode", |node, epoch| {
        // SAFETY: null or writable c_uints (nvml.h).
        let (current, pending) = unsafe { (out(currentMode)?, out(pendingMode)?) };
        let g = whole_gpu_ref(node, epoch, device)?;
        if !g.model().supports_mig() {
            return Err(ret::NOT_SUPPORTED);
        }
        *current = c_uint::from(g.mig_enabled);
        *pending = c_uint::from(g.mig_mode_after_reset());
        Ok(())
    })
}

/// `nvmlDeviceSetMigMode`: see `rules::set_mig_mode`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: nvmlDevice_t,
    mode: c_uint,
    activationStatus: *mut nvmlReturn_t,
) -> nvmlReturn_t {
    mutate("nvmlDeviceSetMigMode", |node, epoch| {
        // SAFETY: null or a writable nvmlReturn_t (nvml.h).
        let status = unsafe { out(activationStatus) }?;
        let index = whole_gpu(node, epoch, device)?;
        let enabled = match mode {
            NVML_DEVICE_MIG_ENABLE => true,
            NVML_DEVICE_MIG_DISABLE => false,
            _ => return Err(ret::INVALID_ARGUMENT),
        };
        *status = rules::set_mig_mode(node, index, enabled)?;
        Ok(())
    })
}

/// `nvmlDeviceGetComputeMode`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetComputeMode", |node, epoch| {
        // SAFETY: null or a writable nvmlComputeMode_t (nvml.h).
        let mode = unsafe { out(mode) }?;
        *mode = whole_gpu_ref(node, epoch, device)?.compute_mode.nvml_value();
        Ok(())
    })
}

/// `nvmlDeviceSetComputeMode`: EXCLUSIVE_THREAD (removed from the driver) and unknown
/// values are INVALID_ARGUMENT.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetComputeMode(
    device: nvmlDevice_t,
    mode: c_uint,
) -> nvmlReturn_t {
    mutate("nvmlDeviceSetComputeMode", |node, epoch| {
        let index = whole_gpu(node, epoch, device)?;
        rules::set_compute_mode(node, index, mode)
    })
}

/// `nvmlDeviceGetMaxMigDeviceCount`: 0 with MIG off or unsupported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetMaxMigDeviceCount", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let count = unsafe { out(count) }?;
        *count = match handles::device(node, epoch, device)? {
            Device::Gpu(i) => rules::max_mig_devices(gpu_at(node, i)?),
            Device::Mig(..) => 0,
        };
        Ok(())
    })
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`: with MIG off every index is NOT_FOUND (the real
/// H100 answered so); with MIG on an index past the maximum is INVALID_ARGUMENT, one with
/// no MIG device NOT_FOUND.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    migDevice: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetMigDeviceHandleByIndex", |node, epoch| {
        // SAFETY: null or a writable handle (nvml.h).
        let mig = unsafe { out(migDevice) }?;
        let gpu = match handles::device(node, epoch, device)? {
            Device::Gpu(i) => i,
            Device::Mig(..) => return Err(ret::INVALID_ARGUMENT),
        };
        let g = gpu_at(node, gpu)?;
        if !g.model().supports_mig() {
            return Err(ret::NOT_SUPPORTED);
        }
        if !g.mig_enabled {
            return Err(ret::NOT_FOUND);
        }
        if index >= rules::max_mig_devices(g) {
            return Err(ret::INVALID_ARGUMENT);
        }
        let (_, _, serial) = *rules::mig_devices(g).get(index as usize).ok_or(ret::NOT_FOUND)?;
        *mig = handles::mig(epoch, gpu, serial);
        Ok(())
    })
}

/// `nvmlDeviceIsMigDeviceHandle`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    isMigDevice: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceIsMigDeviceHandle", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let is_mig = unsafe { out(isMigDevice) }?;
        *is_mig = c_uint::from(matches!(handles::device(node, epoch, device)?, Device::Mig(..)));
        Ok(())
    })
}

/// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`: a GPU handle is INVALID_ARGUMENT.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    migDevice: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", |node, epoch| {
        // SAFETY: null or a writable handle (nvml.h).
        let device = unsafe { out(device) }?;
        match handles::device(node, epoch, migDevice)? {
            Device::Mig(i, _, _) => *device = handles::gpu(epoch, i),
            Device::Gpu(_) => return Err(ret::INVALID_ARGUMENT),
        }
        Ok(())
    })
}

/// `nvmlDeviceGetGpuInstanceId`: a GPU handle is INVALID_ARGUMENT (the real H100 answered so, MIG off).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetGpuInstanceId", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let id = unsafe { out(id) }?;
        match handles::device(node, epoch, device)? {
            Device::Mig(_, gi, _) => *id = gi,
            Device::Gpu(_) => return Err(ret::INVALID_ARGUMENT),
        }
        Ok(())
    })
}

/// `nvmlDeviceGetComputeInstanceId`: a GPU handle is INVALID_ARGUMENT (the real H100 answered so, MIG off).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetComputeInstanceId", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let id = unsafe { out(id) }?;
        match handles::device(node, epoch, device)? {
            Device::Mig(_, _, ci) => *id = ci,
            Device::Gpu(_) => return Err(ret::INVALID_ARGUMENT),
        }
        Ok(())
    })
}
