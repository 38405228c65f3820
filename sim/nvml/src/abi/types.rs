//! nvml.h's types, constants and struct layouts, written from the header's text (NVML
//! 13.0.39, the header of the 580 driver branch this library simulates: go-nvml's
//! `gen/nvml/nvml.h` at that version). Every struct's size is asserted at compile time.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use std::mem::size_of;
use std::os::raw::{c_char, c_uint, c_ulonglong};

/// `nvmlReturn_t`.
pub type nvmlReturn_t = c_uint;

/// `nvmlReturn_t` values (nvml.h `nvmlReturn_enum`).
pub mod ret {
    use super::nvmlReturn_t;
    /// The operation was successful.
    pub const SUCCESS: nvmlReturn_t = 0;
    /// NVML was not first initialized with nvmlInit().
    pub const UNINITIALIZED: nvmlReturn_t = 1;
    /// A supplied argument is invalid.
    pub const INVALID_ARGUMENT: nvmlReturn_t = 2;
    /// The requested operation is not available on target device.
    pub const NOT_SUPPORTED: nvmlReturn_t = 3;
    /// The current user does not have permission for operation.
    pub const NO_PERMISSION: nvmlReturn_t = 4;
    /// Deprecated: multiple initializations are allowed through ref counting.
    pub const ALREADY_INITIALIZED: nvmlReturn_t = 5;
    /// A query to find an object was unsuccessful.
    pub const NOT_FOUND: nvmlReturn_t = 6;
    /// An input argument is not large enough.
    pub const INSUFFICIENT_SIZE: nvmlReturn_t = 7;
    /// A device's external power cables are not properly attached.
    pub const INSUFFICIENT_POWER: nvmlReturn_t = 8;
    /// NVIDIA driver is not loaded.
    pub const DRIVER_NOT_LOADED: nvmlReturn_t = 9;
    /// User provided timeout passed.
    pub const TIMEOUT: nvmlReturn_t = 10;
    /// NVIDIA Kernel detected an interrupt issue with a GPU.
    pub const IRQ_ISSUE: nvmlReturn_t = 11;
    /// NVML Shared Library couldn't be found or loaded.
    pub const LIBRARY_NOT_FOUND: nvmlReturn_t = 12;
    /// Local version of NVML doesn't implement this function.
    pub const FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
    /// infoROM is corrupted.
    pub const CORRUPTED_INFOROM: nvmlReturn_t = 14;
    /// The GPU has fallen off the bus or has otherwise become inaccessible.
    pub const GPU_IS_LOST: nvmlReturn_t = 15;
    /// The GPU requires a reset before it can be used again.
    pub const RESET_REQUIRED: nvmlReturn_t = 16;
    /// The GPU control device has been blocked by the operating system/cgroups.
    pub const OPERATING_SYSTEM: nvmlReturn_t = 17;
    /// RM detects a driver/library version mismatch.
    pub const LIB_RM_VERSION_MISMATCH: nvmlReturn_t = 18;
    /// An operation cannot be performed because the GPU is currently in use.
    pub const IN_USE: nvmlReturn_t = 19;
    /// Insufficient memory.
    pub const MEMORY: nvmlReturn_t = 20;
    /// No data.
    pub const NO_DATA: nvmlReturn_t = 21;
    /// The requested vgpu operation is not available because ECC is enabled.
    pub const VGPU_ECC_NOT_SUPPORTED: nvmlReturn_t = 22;
    /// Ran out of critical resources, other than memory.
    pub const INSUFFICIENT_RESOURCES: nvmlReturn_t = 23;
    /// Ran out of critical resources, other than memory (sic, nvml.h).
    pub const FREQ_NOT_SUPPORTED: nvmlReturn_t = 24;
    /// The provided version is invalid/unsupported.
    pub const ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
    /// The requested functionality has been deprecated.
    pub const DEPRECATED: nvmlReturn_t = 26;
    /// The system is not ready for the request.
    pub const NOT_READY: nvmlReturn_t = 27;
    /// No GPUs were found.
    pub const GPU_NOT_FOUND: nvmlReturn_t = 28;
    /// Resource not in correct state to perform requested operation.
    pub const INVALID_STATE: nvmlReturn_t = 29;
    /// Reset not supported for given device/parameters.
    pub const RESET_TYPE_NOT_SUPPORTED: nvmlReturn_t = 30;
    /// An internal driver error occurred.
    pub const UNKNOWN: nvmlReturn_t = 999;

    /// Every code with its nvml.h name.
    pub const NAMES: &[(nvmlReturn_t, &str)] = &[
        (SUCCESS, "NVML_SUCCESS"),
        (UNINITIALIZED, "NVML_ERROR_UNINITIALIZED"),
        (INVALID_ARGUMENT, "NVML_ERROR_INVALID_ARGUMENT"),
        (NOT_SUPPORTED, "NVML_ERROR_NOT_SUPPORTED"),
        (NO_PERMISSION, "NVML_ERROR_NO_PERMISSION"),
        (ALREADY_INITIALIZED, "NVML_ERROR_ALREADY_INITIALIZED"),
        (NOT_FOUND, "NVML_ERROR_NOT_FOUND"),
        (INSUFFICIENT_SIZE, "NVML_ERROR_INSUFFICIENT_SIZE"),
        (INSUFFICIENT_POWER, "NVML_ERROR_INSUFFICIENT_POWER"),
        (DRIVER_NOT_LOADED, "NVML_ERROR_DRIVER_NOT_LOADED"),
        (TIMEOUT, "NVML_ERROR_TIMEOUT"),
        (IRQ_ISSUE, "NVML_ERROR_IRQ_ISSUE"),
        (LIBRARY_NOT_FOUND, "NVML_ERROR_LIBRARY_NOT_FOUND"),
        (FUNCTION_NOT_FOUND, "NVML_ERROR_FUNCTION_NOT_FOUND"),
        (CORRUPTED_INFOROM, "NVML_ERROR_CORRUPTED_INFOROM"),
        (GPU_IS_LOST, "NVML_ERROR_GPU_IS_LOST"),
        (RESET_REQUIRED, "NVML_ERROR_RESET_REQUIRED"),
        (OPERATING_SYSTEM, "NVML_ERROR_OPERATING_SYSTEM"),
        (LIB_RM_VERSION_MISMATCH, "NVML_ERROR_LIB_RM_VERSION_MISMATCH"),
        (IN_USE, "NVML_ERROR_IN_USE"),
        (MEMORY, "NVML_ERROR_MEMORY"),
        (NO_DATA, "NVML_ERROR_NO_DATA"),
        (VGPU_ECC_NOT_SUPPORTED, "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED"),
        (INSUFFICIENT_RESOURCES, "NVML_ERROR_INSUFFICIENT_RESOURCES"),
        (FREQ_NOT_SUPPORTED, "NVML_ERROR_FREQ_NOT_SUPPORTED"),
        (ARGUMENT_VERSION_MISMATCH, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"),
        (DEPRECATED, "NVML_ERROR_DEPRECATED"),
        (NOT_READY, "NVML_ERROR_NOT_READY"),
        (GPU_NOT_FOUND, "NVML_ERROR_GPU_NOT_FOUND"),
        (INVALID_STATE, "NVML_ERROR_INVALID_STATE"),
        (RESET_TYPE_NOT_SUPPORTED, "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED"),
        (UNKNOWN, "NVML_ERROR_UNKNOWN"),
    ];

    /// The nvml.h name of a code (`NVML_ERROR_IN_USE`).
    pub fn name(code: nvmlReturn_t) -> &'static str {
        NAMES.iter().find(|(c, _)| *c == code).map_or("NVML_ERROR_UNKNOWN", |(_, n)| n)
    }

    /// The code of an nvml.h name.
    pub fn by_name(name: &str) -> Option<nvmlReturn_t> {
        NAMES.iter().find(|(_, n)| *n == name).map(|(c, _)| *c)
    }

    /// `nvmlErrorString`'s text for a code, as the real library words it. Recorded: see
    /// [`crate::abi::features`] ("Recorded and derived answers") for which texts a real
    /// driver 580 answered and which are still nvml.h's or nvidia-ml-py's wording.
    pub fn message(code: nvmlReturn_t) -> &'static std::ffi::CStr {
        match code {
            SUCCESS => c"Success",
            UNINITIALIZED => c"Uninitialized",
            INVALID_ARGUMENT => c"Invalid Argument",
            NOT_SUPPORTED => c"Not Supported",
            NO_PERMISSION => c"Insufficient Permissions",
            ALREADY_INITIALIZED => c"Already Initialized",
            NOT_FOUND => c"Not Found",
            INSUFFICIENT_SIZE => c"Insufficient Size",
            INSUFFICIENT_POWER => c"Insufficient External Power",
            DRIVER_NOT_LOADED => c"Driver Not Loaded",
            TIMEOUT => c"Timeout",
            IRQ_ISSUE => c"Interrupt Request Issue",
            LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
            FUNCTION_NOT_FOUND => c"Function Not Found",
            CORRUPTED_INFOROM => c"Corrupted infoROM",
            GPU_IS_LOST => c"GPU is lost",
            RESET_REQUIRED => c"GPU requires reset",
            OPERATING_SYSTEM => c"GPU access blocked by the operating system",
            LIB_RM_VERSION_MISMATCH => c"Driver/library version mismatch",
            IN_USE => c"In use by another client",
            MEMORY => c"Insufficient Memory",
            NO_DATA => c"No data",
            VGPU_ECC_NOT_SUPPORTED => c"vGPU ECC not supported",
            INSUFFICIENT_RESOURCES => c"Insufficient Resources",
            FREQ_NOT_SUPPORTED => c"Frequency not supported",
            ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
            DEPRECATED => c"Deprecated",
            NOT_READY => c"Not ready",
            GPU_NOT_FOUND => c"GPU not found",
            INVALID_STATE => c"Invalid state",
            RESET_TYPE_NOT_SUPPORTED => c"Reset type not supported",
            _ => c"Unknown Error",
        }
    }
}

/// `NVML_STRUCT_VERSION(data, ver)`: the struct's size with the version in the top byte.
pub const fn struct_version(size: usize, version: u32) -> c_uint {
    size as c_uint | (version << 24)
}

/// `NVML_DEVICE_MIG_DISABLE`.
pub const NVML_DEVICE_MIG_DISABLE: c_uint = 0;
/// `NVML_DEVICE_MIG_ENABLE`.
pub const NVML_DEVICE_MIG_ENABLE: c_uint = 1;
/// `NVML_FEATURE_DISABLED` (`nvmlEnableState_t`).
pub const NVML_FEATURE_DISABLED: c_uint = 0;
/// `NVML_FEATURE_ENABLED` (`nvmlEnableState_t`).
pub const NVML_FEATURE_ENABLED: c_uint = 1;
/// `NVML_GPU_INSTANCE_PROFILE_COUNT` of the 580 branch's header (0x11; 13.2 raised it to
/// 0x12). The real H100 on driver 580.159.04 answered enum 17 Invalid Argument.
pub const NVML_GPU_INSTANCE_PROFILE_COUNT: c_uint = 0x11;
/// `NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE`.
pub const NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: c_uint = 0x0;
/// `NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE`.
pub const NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: c_uint = 0x1;
/// `NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE`.
pub const NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: c_uint = 0x2;
/// `NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE`.
pub const NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: c_uint = 0x3;
/// `NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE`.
pub const NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: c_uint = 0x4;
/// `NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1`.
pub const NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1: c_uint = 0x7;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` of the 580 branch's header (13.3 raised it to 9).
pub const NVML_COMPUTE_INSTANCE_PROFILE_COUNT: c_uint = 0x8;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`, the only engine profile.
pub const NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: c_uint = 0x0;
/// `NVML_DEVICE_NAME_V2_BUFFER_SIZE`.
pub const NVML_DEVICE_NAME_V2_BUFFER_SIZE: usize = 96;
/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE`.
pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE: usize = 32;
/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE`.
pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE: usize = 16;
/// `gpuInstanceId`/`computeInstanceId` of a process outside any instance.
pub const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `nvmlDevice_t`: an opaque pointer the caller never dereferences (see `handles`).
pub type nvmlDevice_t = *mut std::ffi::c_void;
/// `nvmlGpuInstance_t`.
pub type nvmlGpuInstance_t = *mut std::ffi::c_void;
/// `nvmlComputeInstance_t`.
pub type nvmlComputeInstance_t = *mut std::ffi::c_void;

/// `nvmlPciInfo_t` (filled by `nvmlDeviceGetPciInfo_v3`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlPciInfo_t {
    /// `"%04X:%02X:%02X.0"`.
    pub busIdLegacy: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE],
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
    /// `"%08X:%02X:%02X.0"`.
    pub busId: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE],
}
const _: () = assert!(size_of::<nvmlPciInfo_t>() == 68);

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlMemory_v2_t {
    /// `nvmlMemory_v2`.
    pub version: c_uint,
    /// Total bytes.
    pub total: c_ulonglong,
    /// Reserved bytes.
    pub reserved: c_ulonglong,
    /// Free bytes.
    pub free: c_ulonglong,
    /// Used bytes.
    pub used: c_ulonglong,
}
const _: () = assert!(size_of::<nvmlMemory_v2_t>() == 40);
/// `nvmlMemory_v2`.
pub const nvmlMemory_v2: c_uint = struct_version(size_of::<nvmlMemory_v2_t>(), 2);

/// `nvmlProcessInfo_t` (= `nvmlProcessInfo_v2_t`), filled by the `_v3` process query.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlProcessInfo_t {
    /// Process id.
    pub pid: c_uint,
    /// Used GPU memory in bytes.
    pub usedGpuMemory: c_ulonglong,
    /// GPU instance id, or 0xFFFFFFFF.
    pub gpuInstanceId: c_uint,
    /// Compute instance id, or 0xFFFFFFFF.
    pub computeInstanceId: c_uint,
}
const _: () = assert!(size_of::<nvmlProcessInfo_t>() == 24);

/// `nvmlGpuInstancePlacement_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct nvmlGpuInstancePlacement_t {
    /// First memory slice.
    pub start: c_uint,
    /// Memory slices.
    pub size: c_uint,
}
const _: () = assert!(size_of::<nvmlGpuInstancePlacement_t>() == 8);

/// `nvmlComputeInstancePlacement_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct nvmlComputeInstancePlacement_t {
    /// First compute slice within the GPU instance.
    pub start: c_uint,
    /// Compute slices.
    pub size: c_uint,
}
const _: () = assert!(size_of::<nvmlComputeInstancePlacement_t>() == 8);

/// `nvmlGpuInstanceProfileInfo_t` (v1, no version field).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlGpuInstanceProfileInfo_t {
    /// Profile id.
    pub id: c_uint,
    /// Peer-to-peer support.
    pub isP2pSupported: c_uint,
    /// Compute slices.
    pub sliceCount: c_uint,
    /// Most instances.
    pub instanceCount: c_uint,
    /// SMs.
    pub multiprocessorCount: c_uint,
    /// Copy engines.
    pub copyEngineCount: c_uint,
    /// Decoders.
    pub decoderCount: c_uint,
    /// Encoders.
    pub encoderCount: c_uint,
    /// JPEG engines.
    pub jpegCount: c_uint,
    /// OFA engines.
    pub ofaCount: c_uint,
    /// Memory in MiB.
    pub memorySizeMB: c_ulonglong,
}
const _: () = assert!(size_of::<nvmlGpuInstanceProfileInfo_t>() == 48);

/// `nvmlGpuInstanceProfileInfo_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlGpuInstanceProfileInfo_v2_t {
    /// `nvmlGpuInstanceProfileInfo_v2`.
    pub version: c_uint,
    /// Profile id.
    pub id: c_uint,
    /// Peer-to-peer support.
    pub isP2pSupported: c_uint,
    /// Compute slices.
    pub sliceCount: c_uint,
    /// Most instances.
    pub instanceCount: c_uint,
    /// SMs.
    pub multiprocessorCount: c_uint,
    /// Copy engines.
    pub copyEngineCount: c_uint,
    /// Decoders.
    pub decoderCount: c_uint,
    /// Encoders.
    pub encoderCount: c_uint,
    /// JPEG engines.
    pub jpegCount: c_uint,
    /// OFA engines.
    pub ofaCount: c_uint,
    /// Memory in MiB.
    pub memorySizeMB: c_ulonglong,
    /// `MIG 1g.10gb`.
    pub name: [c_char; NVML_DEVICE_NAME_V2_BUFFER_SIZE],
}
const _: () = assert!(size_of::<nvmlGpuInstanceProfileInfo_v2_t>() == 152);
/// `nvmlGpuInstanceProfileInfo_v2`.
pub const nvmlGpuInstanceProfileInfo_v2: c_uint =
    struct_version(size_of::<nvmlGpuInstanceProfileInfo_v2_t>(), 2);

/// `nvmlGpuInstanceProfileInfo_v3_t`: v2 without `isP2pSupported`, with `capabilities`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlGpuInstanceProfileInfo_v3_t {
    /// `nvmlGpuInstanceProfileInfo_v3`.
    pub version: c_uint,
    /// Profile id.
    pub id: c_uint,
    /// Compute slices.
    pub sliceCount: c_uint,
    /// Most instances.
    pub instanceCount: c_uint,
    /// SMs.
    pub multiprocessorCount: c_uint,
    /// Copy engines.
    pub copyEngineCount: c_uint,
    /// Decoders.
    pub decoderCount: c_uint,
    /// Encoders.
    pub encoderCount: c_uint,
    /// JPEG engines.
    pub jpegCount: c_uint,
    /// OFA engines.
    pub ofaCount: c_uint,
    /// Memory in MiB.
    pub memorySizeMB: c_ulonglong,
    /// `MIG 1g.10gb`.
    pub name: [c_char; NVML_DEVICE_NAME_V2_BUFFER_SIZE],
    /// `NVML_GPU_INSTANCE_PROFILE_CAPS_*` bits.
    pub capabilities: c_uint,
}
const _: () = assert!(size_of::<nvmlGpuInstanceProfileInfo_v3_t>() == 152);
/// `nvmlGpuInstanceProfileInfo_v3`.
pub const nvmlGpuInstanceProfileInfo_v3: c_uint =
    struct_version(size_of::<nvmlGpuInstanceProfileInfo_v3_t>(), 3);

/// `nvmlGpuInstanceInfo_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlGpuInstanceInfo_t {
    /// Parent device.
    pub device: nvmlDevice_t,
    /// Instance id.
    pub id: c_uint,
    /// Profile id.
    pub profileId: c_uint,
    /// Placement.
    pub placement: nvmlGpuInstancePlacement_t,
}
const _: () = assert!(size_of::<nvmlGpuInstanceInfo_t>() == 24);

/// `nvmlComputeInstanceProfileInfo_t` (v1).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlComputeInstanceProfileInfo_t {
    /// Profile id.
    pub id: c_uint,
    /// Compute slices.
    pub sliceCount: c_uint,
    /// Most instances in the GPU instance.
    pub instanceCount: c_uint,
    /// SMs.
    pub multiprocessorCount: c_uint,
    /// Shared copy engines.
    pub sharedCopyEngineCount: c_uint,
    /// Shared decoders.
    pub sharedDecoderCount: c_uint,
    /// Shared encoders.
    pub sharedEncoderCount: c_uint,
    /// Shared JPEG engines.
    pub sharedJpegCount: c_uint,
    /// Shared OFA engines.
    pub sharedOfaCount: c_uint,
}
const _: () = assert!(size_of::<nvmlComputeInstanceProfileInfo_t>() == 36);

/// `nvmlComputeInstanceProfileInfo_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlComputeInstanceProfileInfo_v2_t {
    /// `nvmlComputeInstanceProfileInfo_v2`.
    pub version: c_uint,
    /// Profile id.
    pub id: c_uint,
    /// Compute slices.
    pub sliceCount: c_uint,
    /// Most instances in the GPU instance.
    pub instanceCount: c_uint,
    /// SMs.
    pub multiprocessorCount: c_uint,
    /// Shared copy engines.
    pub sharedCopyEngineCount: c_uint,
    /// Shared decoders.
    pub sharedDecoderCount: c_uint,
    /// Shared encoders.
    pub sharedEncoderCount: c_uint,
    /// Shared JPEG engines.
    pub sharedJpegCount: c_uint,
    /// Shared OFA engines.
    pub sharedOfaCount: c_uint,
    /// `MIG 1c.3g.20gb` style name.
    pub name: [c_char; NVML_DEVICE_NAME_V2_BUFFER_SIZE],
}
const _: () = assert!(size_of::<nvmlComputeInstanceProfileInfo_v2_t>() == 136);
/// `nvmlComputeInstanceProfileInfo_v2`.
pub const nvmlComputeInstanceProfileInfo_v2: c_uint =
    struct_version(size_of::<nvmlComputeInstanceProfileInfo_v2_t>(), 2);

/// `nvmlComputeInstanceProfileInfo_v3_t`: v2 plus `capabilities`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlComputeInstanceProfileInfo_v3_t {
    /// `nvmlComputeInstanceProfileInfo_v3`.
    pub version: c_uint,
    /// Profile id.
    pub id: c_uint,
    /// Compute slices.
    pub sliceCount: c_uint,
    /// Most instances in the GPU instance.
    pub instanceCount: c_uint,
    /// SMs.
    pub multiprocessorCount: c_uint,
    /// Shared copy engines.
    pub sharedCopyEngineCount: c_uint,
    /// Shared decoders.
    pub sharedDecoderCount: c_uint,
    /// Shared encoders.
    pub sharedEncoderCount: c_uint,
    /// Shared JPEG engines.
    pub sharedJpegCount: c_uint,
    /// Shared OFA engines.
    pub sharedOfaCount: c_uint,
    /// Profile name.
    pub name: [c_char; NVML_DEVICE_NAME_V2_BUFFER_SIZE],
    /// `NVML_COMPUTE_INSTANCE_PROFILE_CAPS_*` bits.
    pub capabilities: c_uint,
}
const _: () = assert!(size_of::<nvmlComputeInstanceProfileInfo_v3_t>() == 140);
/// `nvmlComputeInstanceProfileInfo_v3`.
pub const nvmlComputeInstanceProfileInfo_v3: c_uint =
    struct_version(size_of::<nvmlComputeInstanceProfileInfo_v3_t>(), 3);

/// `nvmlComputeInstanceInfo_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlComputeInstanceInfo_t {
    /// Parent device.
    pub device: nvmlDevice_t,
    /// Parent GPU instance.
    pub gpuInstance: nvmlGpuInstance_t,
    /// Instance id within the GPU instance.
    pub id: c_uint,
    /// Profile id.
    pub profileId: c_uint,
    /// Placement within the GPU instance's compute slices.
    pub placement: nvmlComputeInstancePlacement_t,
}
const _: () = assert!(size_of::<nvmlComputeInstanceInfo_t>() == 32);

/// `nvmlComputeInstanceInfo_t` as NVML 11.0 had it, before `placement` was added: what the
/// unversioned `nvmlComputeInstanceGetInfo` fills for the binaries that still call it
/// (writing today's 32-byte struct would overrun their 24-byte buffers).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlComputeInstanceInfo_v1_t {
    /// Parent device.
    pub device: nvmlDevice_t,
    /// Parent GPU instance.
    pub gpuInstance: nvmlGpuInstance_t,
    /// Instance id within the GPU instance.
    pub id: c_uint,
    /// Profile id.
    pub profileId: c_uint,
}
const _: () = assert!(size_of::<nvmlComputeInstanceInfo_v1_t>() == 24);

/// `nvmlDeviceAttributes_t` (`nvmlDeviceGetAttributes_v2`; the unversioned entry point
/// fills the same struct).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlDeviceAttributes_t {
    /// Streaming multiprocessors.
    pub multiprocessorCount: c_uint,
    /// Shared copy engines.
    pub sharedCopyEngineCount: c_uint,
    /// Shared decoders.
    pub sharedDecoderCount: c_uint,
    /// Shared encoders.
    pub sharedEncoderCount: c_uint,
    /// Shared JPEG engines.
    pub sharedJpegCount: c_uint,
    /// Shared OFA engines.
    pub sharedOfaCount: c_uint,
    /// GPU instance slices.
    pub gpuInstanceSliceCount: c_uint,
    /// Compute instance slices.
    pub computeInstanceSliceCount: c_uint,
    /// Device memory in MiB.
    pub memorySizeMB: c_ulonglong,
}
const _: () = assert!(size_of::<nvmlDeviceAttributes_t>() == 40);

/// `NVML_GPU_FABRIC_UUID_LEN`.
pub const NVML_GPU_FABRIC_UUID_LEN: usize = 16;
/// `NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`.
pub const NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: u8 = 0;
/// `NVML_GPU_FABRIC_STATE_NOT_STARTED`.
pub const NVML_GPU_FABRIC_STATE_NOT_STARTED: u8 = 1;
/// `NVML_GPU_FABRIC_STATE_COMPLETED`.
pub const NVML_GPU_FABRIC_STATE_COMPLETED: u8 = 3;

/// `nvmlGpuFabricInfo_t` (the deprecated unversioned `nvmlDeviceGetGpuFabricInfo`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlGpuFabricInfo_t {
    /// The cluster's UUID.
    pub clusterUuid: [u8; NVML_GPU_FABRIC_UUID_LEN],
    /// The probe's error status (meaningful once `state` is COMPLETED).
    pub status: nvmlReturn_t,
    /// The fabric clique.
    pub cliqueId: c_uint,
    /// `NVML_GPU_FABRIC_STATE_*`.
    pub state: u8,
}
const _: () = assert!(size_of::<nvmlGpuFabricInfo_t>() == 28);

/// `nvmlGpuFabricInfo_v2_t`: a version field first and `healthMask` last.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlGpuFabricInfo_v2_t {
    /// `nvmlGpuFabricInfo_v2`.
    pub version: c_uint,
    /// The cluster's UUID.
    pub clusterUuid: [u8; NVML_GPU_FABRIC_UUID_LEN],
    /// The probe's error status.
    pub status: nvmlReturn_t,
    /// The fabric clique.
    pub cliqueId: c_uint,
    /// `NVML_GPU_FABRIC_STATE_*`.
    pub state: u8,
    /// `NVML_GPU_FABRIC_HEALTH_MASK_*` fields.
    pub healthMask: c_uint,
}
const _: () = assert!(size_of::<nvmlGpuFabricInfo_v2_t>() == 36);
/// `nvmlGpuFabricInfo_v2`.
pub const nvmlGpuFabricInfo_v2: c_uint = struct_version(size_of::<nvmlGpuFabricInfo_v2_t>(), 2);

/// `nvmlGpuFabricInfo_v3_t` (`nvmlGpuFabricInfoV_t`): v2 and `healthSummary`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlGpuFabricInfo_v3_t {
    /// `nvmlGpuFabricInfo_v3`.
    pub version: c_uint,
    /// The cluster's UUID.
    pub clusterUuid: [u8; NVML_GPU_FABRIC_UUID_LEN],
    /// The probe's error status.
    pub status: nvmlReturn_t,
    /// The fabric clique.
    pub cliqueId: c_uint,
    /// `NVML_GPU_FABRIC_STATE_*`.
    pub state: u8,
    /// `NVML_GPU_FABRIC_HEALTH_MASK_*` fields.
    pub healthMask: c_uint,
    /// `NVML_GPU_FABRIC_HEALTH_SUMMARY_*`.
    pub healthSummary: u8,
}
const _: () = assert!(size_of::<nvmlGpuFabricInfo_v3_t>() == 40);
/// `nvmlGpuFabricInfo_v3`.
pub const nvmlGpuFabricInfo_v3: c_uint = struct_version(size_of::<nvmlGpuFabricInfo_v3_t>(), 3);

/// `nvmlDeviceAddressingMode_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlDeviceAddressingMode_t {
    /// `nvmlDeviceAddressingMode_v1`.
    pub version: c_uint,
    /// `NVML_DEVICE_ADDRESSING_MODE_*`.
    pub value: c_uint,
}
const _: () = assert!(size_of::<nvmlDeviceAddressingMode_t>() == 8);
/// `nvmlDeviceAddressingMode_v1`.
pub const nvmlDeviceAddressingMode_v1: c_uint =
    struct_version(size_of::<nvmlDeviceAddressingMode_t>(), 1);
/// `NVML_DEVICE_ADDRESSING_MODE_NONE`: neither HMM nor ATS.
pub const NVML_DEVICE_ADDRESSING_MODE_NONE: c_uint = 0;
/// `NVML_DEVICE_ADDRESSING_MODE_ATS`: Address Translation Services (the Grace Hopper and
/// Grace Blackwell superchips' coherent CPU memory).
pub const NVML_DEVICE_ADDRESSING_MODE_ATS: c_uint = 2;
