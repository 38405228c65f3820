//! What NVIDIA's GPU Feature Discovery, device plugin and go-nvml's examples ask beyond
//! gpushare and mig-parted (issue 38): a MIG device's attributes
//! (`nvmlDeviceGetAttributes_v2`, from which go-nvlib names the MIG profile), the GPU
//! fabric info (its three forms) and the addressing mode. The answers the real driver gave
//! and the ones derived are listed below, in one place.
//!
//! # Recorded and derived answers
//! Recorded read-only on a real H100 80GB HBM3, driver 580.159.04, MIG off, by
//! `tests/device/nvml_answers.py` (`tests/device/results/nvml-answers-h100-2026-12-06/`;
//! `tests/recorded_answers.rs` holds the simulated H100 to it key by key):
//! - every `nvmlErrorString` text (0 to 30, 999; `Unknown Error` past them);
//! - `nvmlDeviceGetAddressingMode`: SUCCESS, `NONE`; a wrong version
//!   ARGUMENT_VERSION_MISMATCH, a null pointer INVALID_ARGUMENT;
//! - `nvmlDeviceGetGpuFabricInfo` and `…V` (v2, v3) with no NVSwitch: SUCCESS, state
//!   `NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`, every other field 0, the caller's version kept;
//!   a wrong version ARGUMENT_VERSION_MISMATCH;
//! - `nvmlDeviceGetAttributes(_v2)` on a whole GPU: NOT_SUPPORTED ([`WHOLE_GPU_ATTRIBUTES`]);
//! - with MIG off: `nvmlDeviceGetMigDeviceHandleByIndex` NOT_FOUND at every index,
//!   `nvmlDeviceGetGpuInstanceId`/`…ComputeInstanceId` of a GPU INVALID_ARGUMENT;
//! - the v1 entry points: `nvmlDeviceGetGpuInstancePossiblePlacements` fills a buffer
//!   with MIG off but answers a null buffer (the count query of `_v2`) INVALID_ARGUMENT;
//!   v1 and `_v2` fill a buffer whatever `*count` held (an output only; a probe beside the
//!   recorder, 2026-12-06, same GPU and driver: `tests/data/h100-placements-probe-*.json`);
//!   `nvmlComputeInstanceGetInfo` checks its arguments as `_v2`.
//!
//! Derived (no real answer recorded):
//! - A MIG device's attributes: the compute instance's SMs and slices, the GPU instance's
//!   shared engines, slices and memory, from the model's profile tables (which were read
//!   off real GPUs: `catalog/models/*.toml`); the numbers equal what NVIDIA's GFD labels on
//!   a real H100 (`mig-1g.10gb.memory=9984`, `.multiprocessors=16`, `.engines.copy=1`, …).
//! - Fabric info: Ampere and Ada answer NOT_SUPPORTED (nvml.h: "Hopper or newer"); on
//!   Hopper and Blackwell a host with NVSwitches and Fabric Manager running answers a
//!   completed registration (a healthy mask; a cluster UUID and clique 1 only on GB200,
//!   whose NVLink domain spans trays; zeros on a single HGX), with Fabric Manager stopped
//!   `NOT_STARTED`. A MIG device handle answers NOT_SUPPORTED, as other whole-GPU queries.
//! - Addressing mode: ATS on the Grace superchips (GH200, GB200), NONE elsewhere; a MIG
//!   device answers its GPU's.
//! - The v1 compute-instance info writes NVML 11's 24-byte struct, without the placement.
//!
//! # Safety (for every function here)
//! As in [`super::exports`]: the caller follows nvml.h.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::os::raw::c_uint;

use super::handles::{self, Device};
use super::read;
use super::shared::{out, whole_gpu_ref};
use super::types::*;
use crate::codes::Code;
use crate::node::{FabricManager, Gpu, Node};
use crate::rules;
use gpushare_catalog::Architecture;

/// What `nvmlDeviceGetAttributes(_v2)` answers for a whole GPU (a valid out-pointer), as
/// the real H100 did: nvml.h says the call serves MIG device handles only.
pub const WHOLE_GPU_ATTRIBUTES: Code = ret::NOT_SUPPORTED;

/// The attributes of a GPU or MIG device: a MIG device's are its compute instance's SMs
/// and slices and its GPU instance's shared engines, slices and memory.
pub fn attributes(
    node: &Node,
    epoch: u32,
    device: nvmlDevice_t,
) -> Result<nvmlDeviceAttributes_t, Code> {
    let (index, gi_id, ci_id) = match handles::device(node, epoch, device)? {
        Device::Gpu(_) => return Err(WHOLE_GPU_ATTRIBUTES),
        Device::Mig(i, gi, ci) => (i, gi, ci),
    };
    let g = rules::gpu(node, index)?;
    let gi = g.instance(gi_id).ok_or(ret::INVALID_ARGUMENT)?;
    let ci = gi.compute_instance(ci_id).ok_or(ret::INVALID_ARGUMENT)?;
    let profile = rules::profile_of(g, gi);
    let ci_profile = rules::ci_profile(g, gi, ci.profile_id)?;
    let e = profile.engines;
    Ok(nvmlDeviceAttributes_t {
        multiprocessorCount: ci_profile.sms,
        sharedCopyEngineCount: e.copy.into(),
        sharedDecoderCount: e.decoders.into(),
        sharedEncoderCount: e.encoders.into(),
        sharedJpegCount: e.jpeg.into(),
        sharedOfaCount: e.ofa.into(),
        gpuInstanceSliceCount: profile.compute_slices.into(),
        computeInstanceSliceCount: ci.size.into(),
        memorySizeMB: profile.memory_mib,
    })
}

fn attributes_call(
    name: &'static str,
    device: nvmlDevice_t,
    attributes_out: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    read(name, |node, epoch| {
        // SAFETY: null or a writable nvmlDeviceAttributes_t (nvml.h).
        let slot = unsafe { out(attributes_out) }?;
        *slot = attributes(node, epoch, device)?;
        Ok(())
    })
}

/// `nvmlDeviceGetAttributes_v2`: see [`attributes`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    attributes_call("nvmlDeviceGetAttributes_v2", device, attributes)
}

/// `nvmlDeviceGetAttributes` (v1, kept by nvml.h for old binaries): the same struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    attributes_call("nvmlDeviceGetAttributes", device, attributes)
}

// ---------------------------------------------------------------------------------------
// Fabric

/// The health mask of a healthy registration: bandwidth not degraded, no route recovery,
/// routes healthy, no access-timeout recovery, a correct configuration
/// (`NVML_GPU_FABRIC_HEALTH_MASK_*_FALSE`/`_NONE` at their shifts).
const HEALTHY_MASK: u32 = 2 | (2 << 2) | (2 << 4) | (2 << 6) | (1 << 8);
/// `NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY`.
const HEALTH_SUMMARY_HEALTHY: u8 = 1;

/// The fabric info of GPU `g` on `node`, as the v3 struct (the others are cut from it).
fn fabric(node: &Node, g: &Gpu) -> Result<nvmlGpuFabricInfo_v3_t, Code> {
    let model = g.model();
    if !matches!(model.architecture, Architecture::Hopper | Architecture::Blackwell) {
        return Err(ret::NOT_SUPPORTED);
    }
    let mut info = nvmlGpuFabricInfo_v3_t::default();
    if node.host.nvswitches == 0 {
        info.state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
        return Ok(info);
    }
    if node.host.fabric_manager != FabricManager::Running {
        info.state = NVML_GPU_FABRIC_STATE_NOT_STARTED;
        return Ok(info);
    }
    info.state = NVML_GPU_FABRIC_STATE_COMPLETED;
    info.status = ret::SUCCESS;
    info.healthMask = HEALTHY_MASK;
    info.healthSummary = HEALTH_SUMMARY_HEALTHY;
    if model.nvml_name.contains("GB200") {
        // One cluster for the node: GPU 0's UUID digits.
        let hex: Vec<u8> = node.gpus[0].uuid.bytes().filter(u8::is_ascii_hexdigit).collect();
        for (slot, pair) in info.clusterUuid.iter_mut().zip(hex.chunks(2)) {
            let text = std::str::from_utf8(pair).unwrap_or("0");
            *slot = u8::from_str_radix(text, 16).unwrap_or(0);
        }
        info.cliqueId = 1;
    }
    Ok(info)
}

fn fabric_of(
    node: &Node,
    epoch: u32,
    device: nvmlDevice_t,
) -> Result<nvmlGpuFabricInfo_v3_t, Code> {
    let g = whole_gpu_ref(node, epoch, device)?;
    fabric(node, g)
}

/// `nvmlDeviceGetGpuFabricInfo` (deprecated, unversioned): see [`fabric`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: nvmlDevice_t,
    gpuFabricInfo: *mut nvmlGpuFabricInfo_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetGpuFabricInfo", |node, epoch| {
        // SAFETY: null or a writable nvmlGpuFabricInfo_t (nvml.h).
        let slot = unsafe { out(gpuFabricInfo) }?;
        let f = fabric_of(node, epoch, device)?;
        *slot = nvmlGpuFabricInfo_t {
            clusterUuid: f.clusterUuid,
            status: f.status,
            cliqueId: f.cliqueId,
            state: f.state,
        };
        Ok(())
    })
}

/// `nvmlDeviceGetGpuFabricInfoV`: the v2 and v3 structs, the caller's version kept;
/// another version is ARGUMENT_VERSION_MISMATCH.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: nvmlDevice_t,
    gpuFabricInfo: *mut nvmlGpuFabricInfo_v2_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetGpuFabricInfoV", |node, epoch| {
        // SAFETY: null or a struct whose version field (first in both) says its layout;
        // v2 is the smaller.
        let v2 = unsafe { out(gpuFabricInfo) }?;
        let version = v2.version;
        if version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3 {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        let f = fabric_of(node, epoch, device)?;
        if version == nvmlGpuFabricInfo_v3 {
            // SAFETY: the caller's version says its struct is a v3 (nvml.h).
            let v3 = unsafe { out(gpuFabricInfo.cast::<nvmlGpuFabricInfo_v3_t>()) }?;
            *v3 = nvmlGpuFabricInfo_v3_t { version, ..f };
        } else {
            *v2 = nvmlGpuFabricInfo_v2_t {
                version,
                clusterUuid: f.clusterUuid,
                status: f.status,
                cliqueId: f.cliqueId,
                state: f.state,
                healthMask: f.healthMask,
            };
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Addressing mode

/// The addressing mode of GPU `g`: ATS on a Grace superchip, else NONE.
fn addressing_mode(g: &Gpu) -> c_uint {
    let name = &g.model().nvml_name;
    if name.contains("GH200") || name.contains("GB200") {
        NVML_DEVICE_ADDRESSING_MODE_ATS
    } else {
        NVML_DEVICE_ADDRESSING_MODE_NONE
    }
}

/// `nvmlDeviceGetAddressingMode`: the v1 struct (another version is
/// ARGUMENT_VERSION_MISMATCH); a MIG device answers its GPU's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAddressingMode(
    device: nvmlDevice_t,
    mode: *mut nvmlDeviceAddressingMode_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetAddressingMode", |node, epoch| {
        // SAFETY: null or a writable nvmlDeviceAddressingMode_t (nvml.h).
        let mode = unsafe { out(mode) }?;
        let g = rules::gpu(node, handles::device(node, epoch, device)?.index())?;
        if mode.version != nvmlDeviceAddressingMode_v1 {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        mode.value = addressing_mode(g);
        Ok(())
    })
}
