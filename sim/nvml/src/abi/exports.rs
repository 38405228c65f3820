//! The exported NVML functions. Each one: `#[unsafe(no_mangle)] pub unsafe extern "C"`,
//! its body inside `read`/`mutate`/`guarded` (a panic answers NVML_ERROR_UNKNOWN), its
//! out-pointers turned into references once, null ones answering
//! NVML_ERROR_INVALID_ARGUMENT.
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
use super::types::*;
use super::{init, mutate, out, put_str, read};
use crate::node::{Gpu, GpuInstance, Node};
use crate::rules::{self, CiProfile, Code};

/// The simulated driver's version.
pub const DRIVER_VERSION: &str = "580.159.04";

/// What `gpushare_sim_driver` returns.
pub const DRIVER_MARK: &CStr = match CStr::from_bytes_with_nul(
    concat!("gpushare simulated NVML ", env!("CARGO_PKG_VERSION"), "\0").as_bytes(),
) {
    Ok(c) => c,
    Err(_) => panic!("the marker is NUL-terminated"),
};

fn gpu_at(node: &Node, index: u32) -> Result<&Gpu, Code> {
    rules::gpu(node, index)
}

/// A whole-GPU handle: MIG device handles are NOT_SUPPORTED for this query.
pub(super) fn whole_gpu(node: &Node, epoch: u32, device: nvmlDevice_t) -> Result<u32, Code> {
    match handles::device(node, epoch, device)? {
        Device::Gpu(i) => Ok(i),
        Device::Mig(..) => Err(ret::NOT_SUPPORTED),
    }
}

fn gi_of(g: &Gpu, id: u32) -> Result<&GpuInstance, Code> {
    g.instance(id).ok_or(ret::INVALID_ARGUMENT)
}

/// `s` as a NUL-terminated C array, cut to fit.
pub(super) fn c_name<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (slot, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *slot = b as c_char;
    }
    out
}

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
        gpu_at(node, index)?;
        *device = handles::gpu(epoch, index);
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
                let ci = gi.compute_instances.iter().find(|c| c.id == ci);
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
                let ci = gi.compute_instances.iter().find(|c| c.id == ci);
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
        *minor = gpu_at(node, whole_gpu(node, epoch, device)?)?.minor_number;
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
        let on = gpu_at(node, whole_gpu(node, epoch, device)?)?.persistence_mode;
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
        let g = gpu_at(node, whole_gpu(node, epoch, device)?)?;
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
        *mode = gpu_at(node, whole_gpu(node, epoch, device)?)?.compute_mode.nvml_value();
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

/// `nvmlDeviceGetGpuInstanceId`: a GPU handle is NOT_SUPPORTED.
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
            Device::Gpu(_) => return Err(ret::NOT_SUPPORTED),
        }
        Ok(())
    })
}

/// `nvmlDeviceGetComputeInstanceId`: a GPU handle is NOT_SUPPORTED.
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
            Device::Gpu(_) => return Err(ret::NOT_SUPPORTED),
        }
        Ok(())
    })
}

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
    super::mig::processes_into(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        super::mig::Listed::Compute,
        device,
        infoCount,
        infos,
        super::mig::process_info,
    )
}

// ---------------------------------------------------------------------------------------
// GPU instances

/// `NVML_GPU_INSTANCE_PROFILE_CAPS_GFX` (nvml.h): the GPU-instance profile offers graphics.
pub(super) const NVML_GPU_INSTANCE_PROFILE_CAPS_GFX: c_uint = 0x2;
/// `NVML_COMPUTE_INSTANCE_PROFILE_CAPS_GFX` (nvml.h).
pub(super) const NVML_COMPUTE_INSTANCE_PROFILE_CAPS_GFX: c_uint = 0x1;

/// The `NVML_GPU_INSTANCE_PROFILE_CAPS_*` bits of a profile: GFX for a `+gfx` one (the only
/// variant the guide says adds graphics), never P2P (`isP2pSupported` is 0 on the real
/// H100). No driver's answer was recorded: the bits follow the constants' names.
pub(super) fn gi_capabilities(p: &gpushare_catalog::MigProfile) -> c_uint {
    if p.variant() == "+gfx" { NVML_GPU_INSTANCE_PROFILE_CAPS_GFX } else { 0 }
}

/// The figures of a GPU-instance profile; `isP2pSupported` is 0, as on the real H100.
pub(super) struct GiFigures {
    pub(super) id: u32,
    pub(super) slices: u32,
    pub(super) count: u32,
    pub(super) sms: u32,
    pub(super) memory: u64,
    pub(super) engines: gpushare_catalog::Engines,
    pub(super) name: [c_char; NVML_DEVICE_NAME_V2_BUFFER_SIZE],
    pub(super) capabilities: c_uint,
}

impl GiFigures {
    /// The figures of `p`.
    pub(super) fn of(p: &gpushare_catalog::MigProfile) -> GiFigures {
        GiFigures {
            id: p.id,
            slices: u32::from(p.compute_slices),
            count: u32::from(p.max_count),
            sms: p.sms,
            memory: p.memory_mib,
            engines: p.engines,
            name: c_name(&format!("MIG {}", p.name)),
            capabilities: gi_capabilities(p),
        }
    }

    /// The v2 struct (`nvmlDeviceGetGpuInstanceProfileInfoV`, `…ByIdV`).
    pub(super) fn v2(&self, version: c_uint) -> nvmlGpuInstanceProfileInfo_v2_t {
        let e = self.engines;
        nvmlGpuInstanceProfileInfo_v2_t {
            version,
            id: self.id,
            isP2pSupported: 0,
            sliceCount: self.slices,
            instanceCount: self.count,
            multiprocessorCount: self.sms,
            copyEngineCount: e.copy.into(),
            decoderCount: e.decoders.into(),
            encoderCount: e.encoders.into(),
            jpegCount: e.jpeg.into(),
            ofaCount: e.ofa.into(),
            memorySizeMB: self.memory,
            name: self.name,
        }
    }

    /// The v3 struct, with the profile's `NVML_GPU_INSTANCE_PROFILE_CAPS_*` bits.
    pub(super) fn v3(&self, version: c_uint) -> nvmlGpuInstanceProfileInfo_v3_t {
        let e = self.engines;
        nvmlGpuInstanceProfileInfo_v3_t {
            version,
            id: self.id,
            sliceCount: self.slices,
            instanceCount: self.count,
            multiprocessorCount: self.sms,
            copyEngineCount: e.copy.into(),
            decoderCount: e.decoders.into(),
            encoderCount: e.encoders.into(),
            jpegCount: e.jpeg.into(),
            ofaCount: e.ofa.into(),
            memorySizeMB: self.memory,
            name: self.name,
            capabilities: self.capabilities,
        }
    }
}

fn gi_figures(node: &Node, epoch: u32, device: nvmlDevice_t, e: u32) -> Result<GiFigures, Code> {
    let g = gpu_at(node, whole_gpu(node, epoch, device)?)?;
    Ok(GiFigures::of(rules::gi_profile_by_enum(g, e)?))
}

/// `nvmlDeviceGetGpuInstanceProfileInfo` (v1 struct, no name).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetGpuInstanceProfileInfo", |node, epoch| {
        // SAFETY: null or a writable v1 struct (nvml.h).
        let info = unsafe { out(info) }?;
        let f = gi_figures(node, epoch, device, profile)?;
        let e = f.engines;
        *info = nvmlGpuInstanceProfileInfo_t {
            id: f.id,
            isP2pSupported: 0,
            sliceCount: f.slices,
            instanceCount: f.count,
            multiprocessorCount: f.sms,
            copyEngineCount: e.copy.into(),
            decoderCount: e.decoders.into(),
            encoderCount: e.encoders.into(),
            jpegCount: e.jpeg.into(),
            ofaCount: e.ofa.into(),
            memorySizeMB: f.memory,
        };
        Ok(())
    })
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV`: the v2 and v3 structs; another version is
/// NVML_ERROR_ARGUMENT_VERSION_MISMATCH.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetGpuInstanceProfileInfoV", |node, epoch| {
        // SAFETY: null or a struct whose version field says its layout (nvml.h); v2 and
        // v3 are both 152 bytes, so reading the version through the v2 type is sound.
        let v2 = unsafe { out(info) }?;
        let version = v2.version;
        if version != nvmlGpuInstanceProfileInfo_v2 && version != nvmlGpuInstanceProfileInfo_v3 {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        let f = gi_figures(node, epoch, device, profile)?;
        // The real driver leaves the version field 0 in what it writes (the H100 did).
        if version == nvmlGpuInstanceProfileInfo_v2 {
            *v2 = f.v2(0);
        } else {
            // SAFETY: the caller's version field says the struct is a v3 (nvml.h), of
            // the same size as the v2 checked above.
            let v3 = unsafe { out(info.cast::<nvmlGpuInstanceProfileInfo_v3_t>()) }?;
            *v3 = f.v3(0);
        }
        Ok(())
    })
}

/// `nvmlDeviceGetGpuInstanceRemainingCapacity`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: nvmlDevice_t,
    profileId: c_uint,
    count: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetGpuInstanceRemainingCapacity", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let count = unsafe { out(count) }?;
        *count =
            rules::remaining_capacity(gpu_at(node, whole_gpu(node, epoch, device)?)?, profileId)?;
        Ok(())
    })
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`: see `rules::create_gpu_instance`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profileId: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    mutate("nvmlDeviceCreateGpuInstanceWithPlacement", |node, epoch| {
        // SAFETY: null or a readable placement and a writable handle (nvml.h).
        let (placement, handle) = unsafe { (placement.as_ref(), out(gpuInstance)?) };
        let placement = *placement.ok_or(ret::INVALID_ARGUMENT)?;
        let index = whole_gpu(node, epoch, device)?;
        let id =
            rules::create_gpu_instance(node, index, profileId, placement.start, placement.size)?;
        let gi = gi_of(gpu_at(node, index)?, id)?;
        *handle = handles::gpu_instance(epoch, index, gi);
        Ok(())
    })
}

/// Fills a handle buffer. `*count` 0 means the buffer holds `fallback` handles (nvml.h:
/// "the buffer must be large enough to accommodate the instances supported by the
/// profile"); a smaller nonzero `*count` than the list is INSUFFICIENT_SIZE.
fn fill_handles(
    list: Vec<*mut std::ffi::c_void>,
    buf: *mut *mut std::ffi::c_void,
    count: &mut c_uint,
    fallback: u32,
) -> Result<(), Code> {
    let capacity = if *count == 0 { fallback } else { *count } as usize;
    *count = list.len() as c_uint;
    if list.is_empty() {
        return Ok(());
    }
    if capacity < list.len() {
        return Err(ret::INSUFFICIENT_SIZE);
    }
    if buf.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    // SAFETY: a non-null buffer holds `capacity` >= `list.len()` handles (nvml.h).
    let out = unsafe { std::slice::from_raw_parts_mut(buf, list.len()) };
    out.copy_from_slice(&list);
    Ok(())
}

/// `nvmlDeviceGetGpuInstances`: the instances of one profile, by id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profileId: c_uint,
    gpuInstances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetGpuInstances", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let count = unsafe { out(count) }?;
        let index = whole_gpu(node, epoch, device)?;
        let g = gpu_at(node, index)?;
        let profile = rules::gi_profile_by_id(g, profileId)?;
        if !g.mig_enabled {
            return Err(ret::NOT_SUPPORTED);
        }
        let mut gis: Vec<&GpuInstance> =
            g.instances.iter().filter(|gi| gi.profile_id == profileId).collect();
        gis.sort_by_key(|gi| gi.id);
        let list = gis.iter().map(|gi| handles::gpu_instance(epoch, index, gi)).collect();
        fill_handles(list, gpuInstances, count, u32::from(profile.max_count))
    })
}

/// `nvmlDeviceGetGpuInstanceById`: NOT_FOUND when there is none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetGpuInstanceById", |node, epoch| {
        // SAFETY: null or a writable handle (nvml.h).
        let handle = unsafe { out(gpuInstance) }?;
        let index = whole_gpu(node, epoch, device)?;
        let g = gpu_at(node, index)?;
        if !g.model().supports_mig() || !g.mig_enabled {
            return Err(ret::NOT_SUPPORTED);
        }
        *handle = handles::gpu_instance(epoch, index, g.instance(id).ok_or(ret::NOT_FOUND)?);
        Ok(())
    })
}

/// `nvmlGpuInstanceGetInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpuInstance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    read("nvmlGpuInstanceGetInfo", |node, epoch| {
        // SAFETY: null or a writable nvmlGpuInstanceInfo_t (nvml.h).
        let info = unsafe { out(info) }?;
        let (index, id) = handles::resolve_gpu_instance(node, epoch, gpuInstance)?;
        let gi = gi_of(gpu_at(node, index)?, id)?;
        *info = nvmlGpuInstanceInfo_t {
            device: handles::gpu(epoch, index),
            id: gi.id,
            profileId: gi.profile_id,
            placement: nvmlGpuInstancePlacement_t {
                start: c_uint::from(gi.start),
                size: c_uint::from(gi.size),
            },
        };
        Ok(())
    })
}

/// `nvmlGpuInstanceDestroy`: IN_USE with compute instances or processes in it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gpuInstance: nvmlGpuInstance_t) -> nvmlReturn_t {
    mutate("nvmlGpuInstanceDestroy", |node, epoch| {
        let (index, id) = handles::resolve_gpu_instance(node, epoch, gpuInstance)?;
        rules::destroy_gpu_instance(node, index, id)
    })
}

// ---------------------------------------------------------------------------------------
// Compute instances

/// A compute-instance profile, its name, its `NVML_COMPUTE_INSTANCE_PROFILE_CAPS_*` bits
/// (GFX inside a `+gfx` GPU instance: assumed, as no driver's answer was recorded) and its
/// shared engines: the GPU instance's, which its compute instances share (as
/// `nvidia-smi mig -lcip` shows them on an A100: `1c.3g.20gb` CE 3, DEC 2).
fn ci_figures(
    node: &Node,
    epoch: u32,
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
) -> Result<(CiProfile, String, c_uint, gpushare_catalog::Engines), Code> {
    let (index, id) = handles::resolve_gpu_instance(node, epoch, gpu_instance)?;
    if eng_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
        return Err(ret::INVALID_ARGUMENT);
    }
    let g = gpu_at(node, index)?;
    let gi = gi_of(g, id)?;
    let p = rules::ci_profile(g, gi, profile)?;
    let gi_profile = rules::profile_of(g, gi);
    let caps =
        if gi_profile.variant() == "+gfx" { NVML_COMPUTE_INSTANCE_PROFILE_CAPS_GFX } else { 0 };
    Ok((p, format!("MIG {}c.{}", p.slices, gi_profile.name), caps, gi_profile.engines))
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo` (v1 struct).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpuInstance: nvmlGpuInstance_t,
    profile: c_uint,
    engProfile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    read("nvmlGpuInstanceGetComputeInstanceProfileInfo", |node, epoch| {
        // SAFETY: null or a writable v1 struct (nvml.h).
        let info = unsafe { out(info) }?;
        let (p, _, _, e) = ci_figures(node, epoch, gpuInstance, profile, engProfile)?;
        *info = nvmlComputeInstanceProfileInfo_t {
            id: p.nvml_enum,
            sliceCount: c_uint::from(p.slices),
            instanceCount: p.instance_count,
            multiprocessorCount: p.sms,
            sharedCopyEngineCount: e.copy.into(),
            sharedDecoderCount: e.decoders.into(),
            sharedEncoderCount: e.encoders.into(),
            sharedJpegCount: e.jpeg.into(),
            sharedOfaCount: e.ofa.into(),
        };
        Ok(())
    })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfoV`: the v2 and v3 structs; another
/// version is NVML_ERROR_ARGUMENT_VERSION_MISMATCH.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gpuInstance: nvmlGpuInstance_t,
    profile: c_uint,
    engProfile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    read("nvmlGpuInstanceGetComputeInstanceProfileInfoV", |node, epoch| {
        // SAFETY: null or a struct whose version field says its layout (nvml.h); the
        // version field is first in both, and v2 is the smaller.
        let v2 = unsafe { out(info) }?;
        let version = v2.version;
        if version != nvmlComputeInstanceProfileInfo_v2
            && version != nvmlComputeInstanceProfileInfo_v3
        {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        let (p, name, caps, e) = ci_figures(node, epoch, gpuInstance, profile, engProfile)?;
        *v2 = nvmlComputeInstanceProfileInfo_v2_t {
            version,
            id: p.nvml_enum,
            sliceCount: c_uint::from(p.slices),
            instanceCount: p.instance_count,
            multiprocessorCount: p.sms,
            sharedCopyEngineCount: e.copy.into(),
            sharedDecoderCount: e.decoders.into(),
            sharedEncoderCount: e.encoders.into(),
            sharedJpegCount: e.jpeg.into(),
            sharedOfaCount: e.ofa.into(),
            name: c_name(&name),
        };
        if version == nvmlComputeInstanceProfileInfo_v3 {
            // SAFETY: the version says the caller's struct is a v3 (nvml.h), whose first
            // fields are the v2's and whose `capabilities` follows them.
            let v3 = unsafe { out(info.cast::<nvmlComputeInstanceProfileInfo_v3_t>()) }?;
            v3.capabilities = caps;
        }
        Ok(())
    })
}

/// `nvmlGpuInstanceCreateComputeInstance`: see `rules::create_compute_instance`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpuInstance: nvmlGpuInstance_t,
    profileId: c_uint,
    computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    mutate("nvmlGpuInstanceCreateComputeInstance", |node, epoch| {
        // SAFETY: null or a writable handle (nvml.h).
        let handle = unsafe { out(computeInstance) }?;
        let (index, gi_id) = handles::resolve_gpu_instance(node, epoch, gpuInstance)?;
        let id = rules::create_compute_instance(node, index, gi_id, profileId)?;
        let gi = gi_of(gpu_at(node, index)?, gi_id)?;
        let ci = gi.compute_instances.iter().find(|c| c.id == id).ok_or(ret::UNKNOWN)?;
        *handle = handles::compute_instance(epoch, index, ci);
        Ok(())
    })
}

/// `nvmlGpuInstanceGetComputeInstances`: the compute instances of one profile, by id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpuInstance: nvmlGpuInstance_t,
    profileId: c_uint,
    computeInstances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlGpuInstanceGetComputeInstances", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let count = unsafe { out(count) }?;
        let (index, gi_id) = handles::resolve_gpu_instance(node, epoch, gpuInstance)?;
        let g = gpu_at(node, index)?;
        let gi = gi_of(g, gi_id)?;
        let profile = rules::ci_profile(g, gi, profileId)?;
        let mut cis: Vec<_> =
            gi.compute_instances.iter().filter(|c| c.profile_id == profileId).collect();
        cis.sort_by_key(|c| c.id);
        let list = cis.iter().map(|c| handles::compute_instance(epoch, index, c)).collect();
        fill_handles(list, computeInstances, count, profile.instance_count)
    })
}

/// `nvmlGpuInstanceGetComputeInstanceById`: NOT_FOUND when there is none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpuInstance: nvmlGpuInstance_t,
    id: c_uint,
    computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    read("nvmlGpuInstanceGetComputeInstanceById", |node, epoch| {
        // SAFETY: null or a writable handle (nvml.h).
        let handle = unsafe { out(computeInstance) }?;
        let (index, gi_id) = handles::resolve_gpu_instance(node, epoch, gpuInstance)?;
        let gi = gi_of(gpu_at(node, index)?, gi_id)?;
        let ci = gi.compute_instances.iter().find(|c| c.id == id).ok_or(ret::NOT_FOUND)?;
        *handle = handles::compute_instance(epoch, index, ci);
        Ok(())
    })
}

/// `nvmlComputeInstanceGetInfo_v2` (what the agent calls; nvml.h maps
/// `nvmlComputeInstanceGetInfo` to it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    computeInstance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    read("nvmlComputeInstanceGetInfo_v2", |node, epoch| {
        // SAFETY: null or a writable nvmlComputeInstanceInfo_t (nvml.h).
        let info = unsafe { out(info) }?;
        let (index, gi_id, ci_id) =
            handles::resolve_compute_instance(node, epoch, computeInstance)?;
        let gi = gi_of(gpu_at(node, index)?, gi_id)?;
        let ci = gi.compute_instances.iter().find(|c| c.id == ci_id).ok_or(ret::UNKNOWN)?;
        *info = nvmlComputeInstanceInfo_t {
            device: handles::gpu(epoch, index),
            gpuInstance: handles::gpu_instance(epoch, index, gi),
            id: ci.id,
            profileId: ci.profile_id,
            placement: nvmlComputeInstancePlacement_t {
                start: c_uint::from(ci.start),
                size: c_uint::from(ci.size),
            },
        };
        Ok(())
    })
}

/// `nvmlComputeInstanceDestroy`: IN_USE while a compute process runs in it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(
    computeInstance: nvmlComputeInstance_t,
) -> nvmlReturn_t {
    mutate("nvmlComputeInstanceDestroy", |node, epoch| {
        let (index, gi, ci) = handles::resolve_compute_instance(node, epoch, computeInstance)?;
        rules::destroy_compute_instance(node, index, gi, ci)
    })
}
