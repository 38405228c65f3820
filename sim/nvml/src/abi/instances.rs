//! GPU and compute instances as gpushare drives them: GPU-instance profile info (v1, v2,
//! v3) and remaining capacity, creation with a placement, listing, lookup by id, info and
//! destruction; the same for compute instances (`GiFigures` gives a GPU-instance
//! profile's figures to [`super::mig`] too). The calls only NVIDIA's other clients make
//! are in [`super::mig`].
//!
//! # Safety (for every function here)
//! As in [`super::exports`]: the caller follows nvml.h.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::os::raw::{c_char, c_uint};

use super::handles;
use super::shared::{c_name, gi_of, gpu_at, out, whole_gpu, whole_gpu_ref};
use super::types::*;
use super::{mutate, read};
use crate::codes::Code;
use crate::node::{GpuInstance, Node};
use crate::rules::{self, CiProfile};

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
    let g = whole_gpu_ref(node, epoch, device)?;
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
        *count = rules::remaining_capacity(whole_gpu_ref(node, epoch, device)?, profileId)?;
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
        let ci = gi.compute_instance(id).ok_or(ret::UNKNOWN)?;
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
        let ci = gi.compute_instance(id).ok_or(ret::NOT_FOUND)?;
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
        let ci = gi.compute_instance(ci_id).ok_or(ret::UNKNOWN)?;
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
