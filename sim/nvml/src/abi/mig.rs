//! MIG calls NVIDIA's clients make beyond gpushare's: `nvmlDeviceCreateGpuInstance` with the
//! driver's own placement (go-nvlib, mig-parted, `nvidia-smi mig -cgi`), profile info by
//! id, GPU-instance placements (v1 and v2), compute-instance info (v1), placements,
//! capacity and creation with a placement, and the older process queries (v1 and v2
//! structs) that nvidia-ml-py and go-nvml still call.
//!
//! # Safety (for every function here)
//! As in [`super::exports`]: the caller follows nvml.h.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::os::raw::c_uint;

use super::handles;
use super::instances::GiFigures;
use super::shared::{out, whole_gpu, whole_gpu_ref};
use super::types::*;
use super::{mutate, read};
use crate::rules;

/// `nvmlDeviceCreateGpuInstance`: the driver picks the placement
/// ([`rules::driver_placement`]); MIG off is NOT_SUPPORTED, no room
/// INSUFFICIENT_RESOURCES.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: nvmlDevice_t,
    profileId: c_uint,
    gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    mutate("nvmlDeviceCreateGpuInstance", |node, epoch| {
        // SAFETY: null or a writable handle (nvml.h).
        let handle = unsafe { out(gpuInstance) }?;
        let index = whole_gpu(node, epoch, device)?;
        let g = rules::gpu(node, index)?;
        if !g.model().supports_mig() || !g.mig_enabled {
            return Err(ret::NOT_SUPPORTED);
        }
        let start = rules::driver_placement(g, profileId)?;
        let size = rules::gi_profile_by_id(g, profileId)?.memory_slices;
        let id = rules::create_gpu_instance(
            node,
            index,
            profileId,
            c_uint::from(start),
            c_uint::from(size),
        )?;
        let gi = rules::gpu(node, index)?.instance(id).ok_or(ret::UNKNOWN)?;
        *handle = handles::gpu_instance(epoch, index, gi);
        Ok(())
    })
}

/// The placements of GPU-instance profile `profileId` (its id, as `ProfileInfo.id`) into
/// a caller's buffer, with MIG on or off. `*count` is an output only: a buffer gets every
/// placement whatever it held (nvml.h: the buffer "must be large enough to accommodate the
/// placements supported by the profile"; the real H100 wrote all seven 1g placements with
/// `*count` 0 or 1). `_v2` takes a null buffer as asking for the count; the v1 entry point
/// answers it INVALID_ARGUMENT after the other argument checks (the real H100 did, MIG off).
fn gi_placements(
    name: &'static str,
    device: nvmlDevice_t,
    profileId: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
    counts_on_null: bool,
) -> nvmlReturn_t {
    read(name, |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let count = unsafe { out(count) }?;
        let g = whole_gpu_ref(node, epoch, device)?;
        let p = rules::gi_profile_by_id(g, profileId)?;
        if !counts_on_null && placements.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let n = p.placements.len();
        *count = n as c_uint;
        if placements.is_null() {
            return Ok(());
        }
        // SAFETY: a non-null buffer holds every placement of the profile (nvml.h), `n`.
        let buf = unsafe { std::slice::from_raw_parts_mut(placements, n) };
        for (slot, &start) in buf.iter_mut().zip(&p.placements) {
            *slot = nvmlGpuInstancePlacement_t {
                start: c_uint::from(start),
                size: c_uint::from(p.memory_slices),
            };
        }
        Ok(())
    })
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: see [`gi_placements`]; a null buffer
/// asks for the count.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profileId: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let name = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
    gi_placements(name, device, profileId, placements, count, true)
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements` (v1, kept by nvml.h for old binaries): see
/// [`gi_placements`]; a null buffer is INVALID_ARGUMENT.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements(
    device: nvmlDevice_t,
    profileId: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let name = "nvmlDeviceGetGpuInstancePossiblePlacements";
    gi_placements(name, device, profileId, placements, count, false)
}

/// `nvmlComputeInstanceGetInfo` (v1, kept by nvml.h for old binaries): the 24-byte struct
/// of NVML 11.0, without the placement; otherwise as `_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo(
    computeInstance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_v1_t,
) -> nvmlReturn_t {
    read("nvmlComputeInstanceGetInfo", |node, epoch| {
        // SAFETY: null or a writable v1 struct (NVML 11.0's nvml.h).
        let info = unsafe { out(info) }?;
        let (index, gi_id, ci_id) =
            handles::resolve_compute_instance(node, epoch, computeInstance)?;
        let gi = rules::gpu(node, index)?.instance(gi_id).ok_or(ret::UNKNOWN)?;
        let ci = gi.compute_instance(ci_id).ok_or(ret::UNKNOWN)?;
        *info = nvmlComputeInstanceInfo_v1_t {
            device: handles::gpu(epoch, index),
            gpuInstance: handles::gpu_instance(epoch, index, gi),
            id: ci.id,
            profileId: ci.profile_id,
        };
        Ok(())
    })
}

/// `nvmlDeviceGetGpuInstanceProfileInfoByIdV`: the profile by its id (19 for 1g.10gb)
/// rather than its enum; v2 and v3 structs, the version field written as 0 afterwards as
/// the real H100's driver does.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoByIdV(
    device: nvmlDevice_t,
    profileId: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetGpuInstanceProfileInfoByIdV", |node, epoch| {
        // SAFETY: null or a struct whose version says its layout; v2 and v3 have the same
        // size (see nvmlDeviceGetGpuInstanceProfileInfoV).
        let v2 = unsafe { out(info) }?;
        let version = v2.version;
        if version != nvmlGpuInstanceProfileInfo_v2 && version != nvmlGpuInstanceProfileInfo_v3 {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        let g = whole_gpu_ref(node, epoch, device)?;
        let figures = GiFigures::of(rules::gi_profile_by_id(g, profileId)?);
        if version == nvmlGpuInstanceProfileInfo_v2 {
            *v2 = figures.v2(0);
        } else {
            // SAFETY: the caller's version says v3 (nvml.h), of the v2's size.
            let v3 = unsafe { out(info.cast::<nvmlGpuInstanceProfileInfo_v3_t>()) }?;
            *v3 = figures.v3(0);
        }
        Ok(())
    })
}

/// `nvmlGpuInstanceGetComputeInstanceRemainingCapacity`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    gpuInstance: nvmlGpuInstance_t,
    profileId: c_uint,
    count: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlGpuInstanceGetComputeInstanceRemainingCapacity", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let count = unsafe { out(count) }?;
        let (index, gi_id) = handles::resolve_gpu_instance(node, epoch, gpuInstance)?;
        let g = rules::gpu(node, index)?;
        let gi = g.instance(gi_id).ok_or(ret::INVALID_ARGUMENT)?;
        *count = rules::ci_remaining_capacity(g, gi, profileId)?;
        Ok(())
    })
}

/// `nvmlGpuInstanceGetComputeInstancePossiblePlacements`: a null buffer asks for the
/// count; a smaller `*count` than the placements is INSUFFICIENT_SIZE with the count.
/// (nvml.h documents `count` as an output only; reading it as the buffer's size is
/// deliberate, to keep a short buffer from being overrun, as no real answer was recorded;
/// the GPU-instance call's real answer was, and ignores it: [`gi_placements`].)
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    gpuInstance: nvmlGpuInstance_t,
    profileId: c_uint,
    placements: *mut nvmlComputeInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlGpuInstanceGetComputeInstancePossiblePlacements", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let count = unsafe { out(count) }?;
        let (index, gi_id) = handles::resolve_gpu_instance(node, epoch, gpuInstance)?;
        let g = rules::gpu(node, index)?;
        let gi = g.instance(gi_id).ok_or(ret::INVALID_ARGUMENT)?;
        let profile = rules::ci_profile(g, gi, profileId)?;
        let starts = rules::ci_placements(rules::profile_of(g, gi).compute_slices, profile.slices);
        let capacity = *count as usize;
        *count = starts.len() as c_uint;
        if placements.is_null() {
            return Ok(());
        }
        if capacity < starts.len() {
            return Err(ret::INSUFFICIENT_SIZE);
        }
        // SAFETY: a non-null buffer holds `capacity` >= `starts.len()` placements (nvml.h).
        let buf = unsafe { std::slice::from_raw_parts_mut(placements, starts.len()) };
        for (slot, start) in buf.iter_mut().zip(starts) {
            *slot = nvmlComputeInstancePlacement_t {
                start: c_uint::from(start),
                size: c_uint::from(profile.slices),
            };
        }
        Ok(())
    })
}

/// `nvmlGpuInstanceCreateComputeInstanceWithPlacement`: see
/// `rules::create_compute_instance_at`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    gpuInstance: nvmlGpuInstance_t,
    profileId: c_uint,
    placement: *const nvmlComputeInstancePlacement_t,
    computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    mutate("nvmlGpuInstanceCreateComputeInstanceWithPlacement", |node, epoch| {
        // SAFETY: null or a readable placement and a writable handle (nvml.h).
        let (placement, handle) = unsafe { (placement.as_ref(), out(computeInstance)?) };
        let placement = *placement.ok_or(ret::INVALID_ARGUMENT)?;
        let (index, gi_id) = handles::resolve_gpu_instance(node, epoch, gpuInstance)?;
        let id = rules::create_compute_instance_at(
            node,
            index,
            gi_id,
            profileId,
            Some((placement.start, placement.size)),
        )?;
        let gi = rules::gpu(node, index)?.instance(gi_id).ok_or(ret::UNKNOWN)?;
        let ci = gi.compute_instance(id).ok_or(ret::UNKNOWN)?;
        *handle = handles::compute_instance(epoch, index, ci);
        Ok(())
    })
}
