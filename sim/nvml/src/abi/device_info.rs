//! What NVIDIA's own clients ask of a device before they touch MIG (nvidia-ml-py's device
//! queries, go-nvml and go-nvlib as mig-parted uses them): handles by index, UUID, serial
//! and PCI bus id, the index, the NVML and CUDA driver versions, memory v1, architecture,
//! compute capability, brand, serial, board id, the PCI info versions, the virtualization
//! mode, and the older unversioned entry points nvml.h keeps for old binaries. Figures the
//! catalog lacks are the real H100's (tests/device/results/nvidia-tools-2026-11-27), named
//! where used.
//!
//! # Safety (for every function here)
//! As in [`super::exports`]: the caller follows nvml.h.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_uint};

use gpushare_catalog::Architecture;

use super::handles::{self, Device};
use super::shared::{c_name, out, put_str, whole_gpu, whole_gpu_ref};
use super::types::*;
use super::{init, read};
use crate::codes::Code;
use crate::device;
use crate::node::{Gpu, Node};
use crate::rules;

/// `nvmlSystemGetNVMLVersion` of driver 580.159.04 (the real H100 answered so).
const NVML_VERSION: &str = "13.580.159.04";
/// `nvmlSystemGetCudaDriverVersion`: CUDA 13.0 (the real H100's driver).
const CUDA_DRIVER_VERSION: c_int = 13000;
/// `nvmlBrandType_t`: NVML_BRAND_NVIDIA (the H100's), NVML_BRAND_GEFORCE_RTX.
const BRAND_NVIDIA: c_uint = 14;
const BRAND_GEFORCE_RTX: c_uint = 15;

/// `nvmlMemory_t` (v1).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlMemory_t {
    /// Total bytes.
    pub total: u64,
    /// Free bytes.
    pub free: u64,
    /// Used bytes (the reserved ones included).
    pub used: u64,
}

/// The PCI fields of a GPU.
fn pci_info(g: &Gpu) -> nvmlPciInfo_t {
    let pci = device::pci(g);
    nvmlPciInfo_t {
        busIdLegacy: c_name(&pci.legacy_bus_id()),
        domain: pci.domain,
        bus: pci.bus,
        device: pci.device,
        pciDeviceId: device::device_id(g),
        pciSubSystemId: device::subsystem_id(g),
        busId: c_name(&pci.bus_id()),
    }
}

/// Writes the handle of the GPU `find` picks.
fn handle_of(
    name: &'static str,
    device: *mut nvmlDevice_t,
    find: impl FnOnce(&Node) -> Result<u32, Code>,
) -> nvmlReturn_t {
    read(name, |node, epoch| {
        // SAFETY: null or a writable handle (nvml.h).
        let device = unsafe { out(device) }?;
        *device = handles::live_gpu(node, epoch, find(node)?)?;
        Ok(())
    })
}

/// The text a `const char *` argument holds: null is INVALID_ARGUMENT.
///
/// # Safety
/// `p` is null or a NUL-terminated string live for the call.
unsafe fn text_arg<'a>(p: *const c_char) -> Result<&'a str, Code> {
    if p.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| ret::INVALID_ARGUMENT)
}

// ---------------------------------------------------------------------------------------
// Library and system

/// `nvmlInit` (v1, kept by nvml.h for old binaries).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    init("nvmlInit")
}

/// `nvmlSystemGetNVMLVersion`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: null or `length` writable bytes (nvml.h).
    read("nvmlSystemGetNVMLVersion", |_, _| unsafe { put_str(version, length, NVML_VERSION) })
}

/// `nvmlSystemGetCudaDriverVersion`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(
    cudaDriverVersion: *mut c_int,
) -> nvmlReturn_t {
    read("nvmlSystemGetCudaDriverVersion", |_, _| {
        // SAFETY: null or a writable int (nvml.h).
        *unsafe { out(cudaDriverVersion) }? = CUDA_DRIVER_VERSION;
        Ok(())
    })
}

/// `nvmlSystemGetCudaDriverVersion_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(
    cudaDriverVersion: *mut c_int,
) -> nvmlReturn_t {
    read("nvmlSystemGetCudaDriverVersion_v2", |_, _| {
        // SAFETY: null or a writable int (nvml.h).
        *unsafe { out(cudaDriverVersion) }? = CUDA_DRIVER_VERSION;
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Handles and the index

/// `nvmlDeviceGetCount` (v1).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(deviceCount: *mut c_uint) -> nvmlReturn_t {
    read("nvmlDeviceGetCount", |node, _| {
        // SAFETY: null or a writable c_uint (nvml.h).
        *unsafe { out(deviceCount) }? = node.gpus.len() as c_uint;
        Ok(())
    })
}

/// `nvmlDeviceGetHandleByIndex` (v1).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    handle_of("nvmlDeviceGetHandleByIndex", device, |node| rules::gpu(node, index).map(|_| index))
}

/// `nvmlDeviceGetHandleByUUID`: a GPU's UUID gives its handle, a MIG device's (`MIG-…`,
/// one per compute instance) the MIG device handle (nvml.h: "the UUID of the target GPU
/// or MIG instance"; the container toolkit and DCGM look MIG devices up so); an unknown
/// one is NOT_FOUND, as on the real driver.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetHandleByUUID", |node, epoch| {
        // SAFETY: null or a writable handle and a NUL-terminated string (nvml.h).
        let (device, uuid) = unsafe { (out(device)?, text_arg(uuid)?) };
        let uuid = uuid.trim();
        for (index, g) in node.gpus.iter().enumerate() {
            if g.uuid.eq_ignore_ascii_case(uuid) {
                *device = handles::live_gpu(node, epoch, index as u32)?;
                return Ok(());
            }
            let mut cis = g.instances.iter().flat_map(|gi| gi.compute_instances.iter());
            if let Some(ci) = cis.find(|ci| ci.uuid.eq_ignore_ascii_case(uuid)) {
                handles::live_gpu(node, epoch, index as u32)?;
                *device = handles::mig(epoch, index as u32, ci.serial);
                return Ok(());
            }
        }
        Err(ret::NOT_FOUND)
    })
}

/// `nvmlDeviceGetHandleBySerial`: the board's serial ([`device::serial`]); NOT_FOUND otherwise.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    handle_of("nvmlDeviceGetHandleBySerial", device, |node| {
        // SAFETY: null or a NUL-terminated string (nvml.h).
        let serial = unsafe { text_arg(serial) }?;
        let found = node.gpus.iter().position(|g| device::serial(g) == serial.trim());
        found.map(|i| i as u32).ok_or(ret::NOT_FOUND)
    })
}

/// The GPU whose bus id `text` names in any form ([`device::PciAddress::parse`]): a malformed id is
/// INVALID_ARGUMENT and an unknown one NOT_FOUND, as the real driver answers.
fn by_bus_id(node: &Node, text: &str) -> Result<u32, Code> {
    let wanted = device::PciAddress::parse(text).ok_or(ret::INVALID_ARGUMENT)?;
    let found = node.gpus.iter().position(|g| device::pci(g) == wanted);
    found.map(|i| i as u32).ok_or(ret::NOT_FOUND)
}

/// `nvmlDeviceGetHandleByPciBusId_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pciBusId: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    handle_of("nvmlDeviceGetHandleByPciBusId_v2", device, |node| {
        // SAFETY: null or a NUL-terminated string (nvml.h).
        by_bus_id(node, unsafe { text_arg(pciBusId) }?)
    })
}

/// `nvmlDeviceGetHandleByPciBusId` (v1).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    pciBusId: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    handle_of("nvmlDeviceGetHandleByPciBusId", device, |node| {
        // SAFETY: null or a NUL-terminated string (nvml.h).
        by_bus_id(node, unsafe { text_arg(pciBusId) }?)
    })
}

/// `nvmlDeviceGetIndex`: a GPU's NVML index; a MIG device handle is NOT_SUPPORTED.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetIndex", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let index = unsafe { out(index) }?;
        *index = whole_gpu(node, epoch, device)?;
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// What the device is

/// `nvmlDeviceGetMemoryInfo` (v1): `used` counts the driver's reserved memory, as the real
/// H100's did (503316480 bytes used with nothing running). A MIG device has its profile's
/// memory and nothing reserved.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetMemoryInfo", |node, epoch| {
        // SAFETY: null or a writable nvmlMemory_t (nvml.h).
        let memory = unsafe { out(memory) }?;
        let (total, reserved, used) = memory_of(node, epoch, device)?;
        let used = (reserved + used).min(total);
        *memory = nvmlMemory_t { total, free: total - used, used };
        Ok(())
    })
}

/// `(total, reserved, used)` bytes of a GPU or MIG device: what its processes use, each
/// its own memory.
pub(super) fn memory_of(
    node: &Node,
    epoch: u32,
    device: nvmlDevice_t,
) -> Result<(u64, u64, u64), Code> {
    let used = |list: Vec<rules::ProcessView>| list.iter().map(|p| p.memory).sum::<u64>();
    Ok(match handles::device(node, epoch, device)? {
        Device::Gpu(i) => {
            let g = rules::gpu(node, i)?;
            let used = used(rules::processes(node, i, None)?);
            (g.model().memory_mib << 20, device::RESERVED_BYTES, used)
        }
        Device::Mig(i, gi, ci) => {
            let g = rules::gpu(node, i)?;
            let instance = g.instance(gi).ok_or(ret::INVALID_ARGUMENT)?;
            let used = used(rules::processes(node, i, Some((gi, ci)))?);
            (rules::profile_of(g, instance).memory_mib << 20, 0, used)
        }
    })
}

/// `nvmlDeviceGetArchitecture`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetArchitecture", |node, epoch| {
        // SAFETY: null or a writable nvmlDeviceArchitecture_t (nvml.h).
        let arch = unsafe { out(arch) }?;
        let index = handles::device(node, epoch, device)?.index();
        *arch = rules::gpu(node, index)?.model().architecture.nvml_value();
        Ok(())
    })
}

/// `nvmlDeviceGetCudaComputeCapability`: the model's (8.0 A100/A30, 9.0 H100/H200, 8.9
/// Ada, 10.0 B200, 12.0 RTX PRO 6000 Blackwell).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    read("nvmlDeviceGetCudaComputeCapability", |node, epoch| {
        // SAFETY: null or writable ints (nvml.h).
        let (major, minor) = unsafe { (out(major)?, out(minor)?) };
        let index = handles::device(node, epoch, device)?.index();
        let [cc_major, cc_minor] = rules::gpu(node, index)?.model().cuda_capability();
        (*major, *minor) = (cc_major as c_int, cc_minor as c_int);
        Ok(())
    })
}

/// `nvmlDeviceGetBrand`: NVIDIA for the data-center models, GeForce RTX for the RTX 4090.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    brand: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetBrand", |node, epoch| {
        // SAFETY: null or a writable nvmlBrandType_t (nvml.h).
        let brand = unsafe { out(brand) }?;
        let index = handles::device(node, epoch, device)?.index();
        let geforce = rules::gpu(node, index)?.model().nvml_name.contains("GeForce");
        *brand = if geforce { BRAND_GEFORCE_RTX } else { BRAND_NVIDIA };
        Ok(())
    })
}

/// `nvmlDeviceGetSerial`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetSerial", |node, epoch| {
        let text = device::serial(whole_gpu_ref(node, epoch, device)?);
        // SAFETY: null or `length` writable bytes (nvml.h).
        unsafe { put_str(serial, length, &text) }
    })
}

/// `nvmlDeviceGetBoardId`: one board per GPU, numbered from the GPU's PCI device (the real
/// H100 at 00:06.0 answered 6).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBoardId(
    device: nvmlDevice_t,
    boardId: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetBoardId", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let board = unsafe { out(boardId) }?;
        *board = device::board_id(whole_gpu_ref(node, epoch, device)?);
        Ok(())
    })
}

/// `nvmlDeviceGetMultiGpuBoard`: none is.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMultiGpuBoard(
    device: nvmlDevice_t,
    multiGpuBool: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetMultiGpuBoard", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let multi = unsafe { out(multiGpuBool) }?;
        whole_gpu_ref(node, epoch, device)?;
        *multi = 0;
        Ok(())
    })
}

/// `nvmlDeviceGetNumGpuCores`: the model's SMs times CUDA cores per SM (64 on GA100, 128 on
/// Hopper and Ada; the real H100 answered 16896).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumGpuCores(
    device: nvmlDevice_t,
    numCores: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetNumGpuCores", |node, epoch| {
        // SAFETY: null or a writable c_uint (nvml.h).
        let cores = unsafe { out(numCores) }?;
        let model = whole_gpu_ref(node, epoch, device)?.model();
        let per_sm = if model.architecture == Architecture::Ampere { 64 } else { 128 };
        *cores = model.sms * per_sm;
        Ok(())
    })
}

/// `nvmlDeviceGetVirtualizationMode`: the GPU's `virtualization_mode` (NONE on bare metal;
/// PASS_THROUGH as the cloud H100 VM gpushare was tested on answered). A MIG device
/// answers its parent's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVirtualizationMode(
    device: nvmlDevice_t,
    pVirtualMode: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetVirtualizationMode", |node, epoch| {
        // SAFETY: null or a writable nvmlGpuVirtualizationMode_t (nvml.h).
        let mode = unsafe { out(pVirtualMode) }?;
        let index = handles::device(node, epoch, device)?.index();
        *mode = rules::gpu(node, index)?.virtualization_mode.nvml_value();
        Ok(())
    })
}

/// `nvmlDeviceGetPciInfo_v3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    pci_query("nvmlDeviceGetPciInfo_v3", device, pci)
}

/// `nvmlDeviceGetPciInfo_v2`: nvml.h declares the older entry points with the same
/// `nvmlPciInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    pci_query("nvmlDeviceGetPciInfo_v2", device, pci)
}

/// The struct the unversioned `nvmlDeviceGetPciInfo` fills for the binaries that still
/// call it: NVML before version 9 had a 16-byte `busId` and four reserved words (52
/// bytes); writing today's 68-byte struct would overrun their buffers.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlPciInfo_v1_t {
    /// `"%04X:%02X:%02X.0"`.
    pub busId: [c_char; 16],
    /// PCI domain.
    pub domain: c_uint,
    /// PCI bus.
    pub bus: c_uint,
    /// PCI device.
    pub device: c_uint,
    /// Combined 16-bit device id and 16-bit vendor id.
    pub pciDeviceId: c_uint,
    /// Sub system id.
    pub pciSubSystemId: c_uint,
    /// Reserved: 0.
    pub reserved: [c_uint; 4],
}
const _: () = assert!(size_of::<nvmlPciInfo_v1_t>() == 52);

/// `nvmlDeviceGetPciInfo` (v1: the 52-byte struct).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_v1_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetPciInfo", |node, epoch| {
        // SAFETY: null or a writable v1 struct (old nvml.h).
        let pci = unsafe { out(pci) }?;
        let index = handles::device(node, epoch, device)?.index();
        let info = pci_info(rules::gpu(node, index)?);
        *pci = nvmlPciInfo_v1_t {
            busId: info.busIdLegacy,
            domain: info.domain,
            bus: info.bus,
            device: info.device,
            pciDeviceId: info.pciDeviceId,
            pciSubSystemId: info.pciSubSystemId,
            reserved: [0; 4],
        };
        Ok(())
    })
}

fn pci_query(name: &'static str, device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    read(name, |node, epoch| {
        // SAFETY: null or a writable nvmlPciInfo_t (nvml.h).
        let pci = unsafe { out(pci) }?;
        let index = handles::device(node, epoch, device)?.index();
        *pci = pci_info(rules::gpu(node, index)?);
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Telemetry: what `nvidia-smi` and `gpushare-ctl top` show of a live GPU

/// `nvmlUtilization_t`: percent of the last sample period.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlUtilization_t {
    /// Percent of time a kernel ran.
    pub gpu: c_uint,
    /// Percent of time device memory was read or written.
    pub memory: c_uint,
}

/// `NVML_TEMPERATURE_GPU`, the only sensor nvml.h's `nvmlTemperatureSensors_t` has.
pub const NVML_TEMPERATURE_GPU: c_uint = 0;
pub use crate::device::{IDLE_POWER_MW, IDLE_TEMPERATURE_C};

/// The readings of the whole GPU `device` is ([`crate::device::readings`]); a MIG device
/// has none of its own (NOT_SUPPORTED, as on hardware).
fn readings_of(
    node: &Node,
    epoch: u32,
    device: nvmlDevice_t,
) -> Result<crate::device::Readings, Code> {
    let index = whole_gpu(node, epoch, device)?;
    crate::device::readings(node, index).ok_or(ret::INVALID_ARGUMENT)
}

/// `nvmlDeviceGetUtilizationRates`: 0 % idle, 30 % GPU and 10 % memory per compute process
/// (at most 100). NOT_SUPPORTED on a MIG device and on a GPU with MIG on, as NVML's
/// reference says and nvidia-smi shows (`GPU-Util N/A` beside the temperature and power).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    read("nvmlDeviceGetUtilizationRates", |node, epoch| {
        let r = readings_of(node, epoch, device)?;
        let (Some(gpu), Some(memory)) = (r.gpu_util, r.memory_util) else {
            return Err(ret::NOT_SUPPORTED);
        };
        // SAFETY: null or a writable nvmlUtilization_t (nvml.h).
        let utilization = unsafe { out(utilization) }?;
        *utilization = nvmlUtilization_t { gpu, memory };
        Ok(())
    })
}

/// `nvmlDeviceGetTemperature`: sensor NVML_TEMPERATURE_GPU only (NOT_SUPPORTED for any
/// other); 35 °C idle, 3 °C more per compute process (at most 30 more).
/// NOT_SUPPORTED on a MIG device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensorType: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetTemperature", |node, epoch| {
        let r = readings_of(node, epoch, device)?;
        if sensorType != NVML_TEMPERATURE_GPU {
            return Err(ret::NOT_SUPPORTED);
        }
        // SAFETY: null or a writable c_uint (nvml.h).
        let temp = unsafe { out(temp) }?;
        *temp = r.temperature_c;
        Ok(())
    })
}

/// `nvmlDeviceGetPowerUsage` (milliwatts): 73.6 W idle, 50 W more per compute process
/// (at most 600 W more). NOT_SUPPORTED on a MIG device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    read("nvmlDeviceGetPowerUsage", |node, epoch| {
        let r = readings_of(node, epoch, device)?;
        // SAFETY: null or a writable c_uint (nvml.h).
        let power = unsafe { out(power) }?;
        *power = r.power_mw;
        Ok(())
    })
}
