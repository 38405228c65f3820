//! What a health watcher polls (issue 42), from each GPU's [`crate::health::GpuHealth`]:
//! remapped rows and the remapper's histogram, ECC mode and counters, retired pages, and
//! the field values (the recovery action, 230; remapped rows, 142 to 145; the ECC totals,
//! 3 to 6).
//!
//! As nvml.h and the real H100 answer: row remapping on a MIG-enabled GPU with GPU
//! instances is NOT_SUPPORTED ("On MIG-enabled GPUs with active instances, querying the
//! number of remapped rows is not supported"); retired pages are NOT_SUPPORTED (GPUs since
//! Ampere remap rows instead: the H100's nvidia-smi shows them N/A); ECC is enabled; the
//! ECC counters count device memory (DRAM) errors, SRAM's are 0. A MIG device handle is
//! NOT_SUPPORTED but for the field values (its GPU's); a GPU off the bus answers
//! GPU_IS_LOST to all of them.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::os::raw::{c_int, c_uint, c_ulonglong};

use super::handles;
use super::read;
use super::shared::{gpu_at, out, whole_gpu_ref};
use super::types::*;
use crate::codes::Code;
use crate::health::GpuHealth;
use crate::node::Node;

/// `NVML_FI_DEV_ECC_SBE_VOL_TOTAL` .. `NVML_FI_DEV_ECC_DBE_AGG_TOTAL`.
const FI_ECC_SBE_VOL: c_uint = 3;
const FI_ECC_DBE_VOL: c_uint = 4;
const FI_ECC_SBE_AGG: c_uint = 5;
const FI_ECC_DBE_AGG: c_uint = 6;
/// `NVML_FI_DEV_REMAPPED_COR` .. `NVML_FI_DEV_REMAPPED_FAILURE`.
const FI_REMAPPED_COR: c_uint = 142;
const FI_REMAPPED_UNC: c_uint = 143;
const FI_REMAPPED_PENDING: c_uint = 144;
const FI_REMAPPED_FAILURE: c_uint = 145;
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`.
pub const FI_GPU_RECOVERY_ACTION: c_uint = 230;

/// `NVML_MEMORY_LOCATION_DEVICE_MEMORY`, `_SRAM`, `_DRAM`.
const LOCATION_DEVICE_MEMORY: c_uint = 2;
const LOCATION_SRAM: c_uint = 7;
const LOCATION_DRAM: c_uint = 8;

/// The GPU's health where row remapping can be asked: not on a MIG-enabled GPU with
/// GPU instances.
fn remapper(node: &Node, epoch: u32, device: nvmlDevice_t) -> Result<&GpuHealth, Code> {
    let g = whole_gpu_ref(node, epoch, device)?;
    if !g.remaps_answered() {
        return Err(ret::NOT_SUPPORTED);
    }
    Ok(&g.health)
}

/// A count of `nvmlMemoryErrorType_t` (0 corrected, 1 uncorrected) and `nvmlEccCounterType_t`
/// (0 volatile, 1 aggregate).
fn ecc_count(h: &GpuHealth, error_type: c_uint, counter_type: c_uint) -> Result<u64, Code> {
    let e = &h.ecc;
    Ok(match (error_type, counter_type) {
        (0, 0) => e.corrected_volatile,
        (0, 1) => e.corrected_aggregate,
        (1, 0) => e.uncorrected_volatile,
        (1, 1) => e.uncorrected_aggregate,
        _ => return Err(ret::INVALID_ARGUMENT),
    })
}

/// `nvmlDeviceGetRemappedRows`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corrRows: *mut c_uint,
    uncRows: *mut c_uint,
    isPending: *mut c_uint,
    failureOccurred: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetRemappedRows", |node, epoch| {
        // SAFETY: null or writable unsigned ints (nvml.h).
        let outs =
            unsafe { (out(corrRows)?, out(uncRows)?, out(isPending)?, out(failureOccurred)?) };
        let r = remapper(node, epoch, device)?.remap;
        *outs.0 = r.correctable;
        *outs.1 = r.uncorrectable;
        *outs.2 = c_uint::from(r.pending);
        *outs.3 = c_uint::from(r.failure);
        Ok(())
    })
}

/// `nvmlDeviceGetRowRemapperHistogram` ([`GpuHealth::remap_histogram`]).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRowRemapperHistogram(
    device: nvmlDevice_t,
    values: *mut nvmlRowRemapperHistogramValues_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetRowRemapperHistogram", |node, epoch| {
        // SAFETY: null or a writable nvmlRowRemapperHistogramValues_t (nvml.h).
        let values = unsafe { out(values) }?;
        let [max, high, partial, low, none] = remapper(node, epoch, device)?.remap_histogram();
        *values = nvmlRowRemapperHistogramValues_t { max, high, partial, low, none };
        Ok(())
    })
}

/// `nvmlDeviceGetEccMode`: enabled, and so after the next reboot.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetEccMode", |node, epoch| {
        // SAFETY: null or writable nvmlEnableState_t (nvml.h).
        let (current, pending) = unsafe { (out(current)?, out(pending)?) };
        whole_gpu_ref(node, epoch, device)?;
        (*current, *pending) = (NVML_FEATURE_ENABLED, NVML_FEATURE_ENABLED);
        Ok(())
    })
}

/// `nvmlDeviceGetTotalEccErrors`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    errorType: c_uint,
    counterType: c_uint,
    eccCounts: *mut c_ulonglong,
) -> nvmlReturn_t {
    read("nvmlDeviceGetTotalEccErrors", |node, epoch| {
        // SAFETY: null or a writable unsigned long long (nvml.h).
        let count = unsafe { out(eccCounts) }?;
        *count = ecc_count(&whole_gpu_ref(node, epoch, device)?.health, errorType, counterType)?;
        Ok(())
    })
}

/// `nvmlDeviceGetMemoryErrorCounter`: device memory and DRAM count the GPU's errors, SRAM
/// none; the other locations (L1, L2, register file, texture, CBU) are NOT_SUPPORTED.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(
    device: nvmlDevice_t,
    errorType: c_uint,
    counterType: c_uint,
    locationType: c_uint,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    read("nvmlDeviceGetMemoryErrorCounter", |node, epoch| {
        // SAFETY: null or a writable unsigned long long (nvml.h).
        let count = unsafe { out(count) }?;
        let n = ecc_count(&whole_gpu_ref(node, epoch, device)?.health, errorType, counterType)?;
        *count = match locationType {
            LOCATION_DEVICE_MEMORY | LOCATION_DRAM => n,
            LOCATION_SRAM => 0,
            0..LOCATION_DRAM => return Err(ret::NOT_SUPPORTED),
            _ => return Err(ret::INVALID_ARGUMENT),
        };
        Ok(())
    })
}

/// The retired-pages calls: NOT_SUPPORTED on a GPU that is there (see the module).
fn retired_pages(name: &'static str, device: nvmlDevice_t) -> nvmlReturn_t {
    read(name, |node, epoch| {
        whole_gpu_ref(node, epoch, device)?;
        Err(ret::NOT_SUPPORTED)
    })
}

/// `nvmlDeviceGetRetiredPages`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: nvmlDevice_t,
    _cause: c_uint,
    _pageCount: *mut c_uint,
    _addresses: *mut c_ulonglong,
) -> nvmlReturn_t {
    retired_pages("nvmlDeviceGetRetiredPages", device)
}

/// `nvmlDeviceGetRetiredPages_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: nvmlDevice_t,
    _cause: c_uint,
    _pageCount: *mut c_uint,
    _addresses: *mut c_ulonglong,
    _timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    retired_pages("nvmlDeviceGetRetiredPages_v2", device)
}

/// `nvmlDeviceGetRetiredPagesPendingStatus`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: nvmlDevice_t,
    _isPending: *mut c_uint,
) -> nvmlReturn_t {
    retired_pages("nvmlDeviceGetRetiredPagesPendingStatus", device)
}

/// One field's value and type, or its own NVML code.
fn field(h: &GpuHealth, remaps: bool, id: c_uint) -> Result<(c_uint, u64), Code> {
    let uint = |v: u32| Ok((NVML_VALUE_TYPE_UNSIGNED_INT, u64::from(v)));
    let ull = |v: u64| Ok((NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, v));
    let r = h.remap;
    match id {
        FI_GPU_RECOVERY_ACTION => uint(h.recovery_action.nvml_value()),
        FI_ECC_SBE_VOL => ull(h.ecc.corrected_volatile),
        FI_ECC_DBE_VOL => ull(h.ecc.uncorrected_volatile),
        FI_ECC_SBE_AGG => ull(h.ecc.corrected_aggregate),
        FI_ECC_DBE_AGG => ull(h.ecc.uncorrected_aggregate),
        FI_REMAPPED_COR..=FI_REMAPPED_FAILURE if !remaps => Err(ret::NOT_SUPPORTED),
        // As an H100 answered them (tests/device/results/health-h100-2026-12-07).
        FI_REMAPPED_COR => ull(u64::from(r.correctable)),
        FI_REMAPPED_UNC => ull(u64::from(r.uncorrectable)),
        FI_REMAPPED_PENDING => uint(u32::from(r.pending)),
        FI_REMAPPED_FAILURE => uint(u32::from(r.failure)),
        _ => Err(ret::NOT_SUPPORTED),
    }
}

/// `nvmlDeviceGetFieldValues`: each field answered in its own `nvmlReturn`; on a MIG
/// device, its GPU's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    valuesCount: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetFieldValues", |node, epoch| {
        let g = gpu_at(node, handles::device(node, epoch, device)?.index())?;
        let count = usize::try_from(valuesCount).map_err(|_| ret::INVALID_ARGUMENT)?;
        if count == 0 {
            return Ok(());
        }
        if values.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: `values` points to `valuesCount` nvmlFieldValue_t (nvml.h), not null.
        let values = unsafe { std::slice::from_raw_parts_mut(values, count) };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let timestamp = now.map(|d| d.as_micros() as i64).unwrap_or(0);
        let remaps = g.remaps_answered();
        for v in values {
            v.timestamp = timestamp;
            v.latencyUsec = 0;
            match field(&g.health, remaps, v.fieldId) {
                Ok((value_type, value)) => {
                    (v.valueType, v.value, v.nvmlReturn) = (value_type, value, ret::SUCCESS);
                }
                Err(c) => v.nvmlReturn = c,
            }
        }
        Ok(())
    })
}
