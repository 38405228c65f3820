//! nvml.h's types, constants and struct layouts, written from the header's text (NVML
//! 13.0.39, the header of the 580 driver branch this library simulates: go-nvml's
//! `gen/nvml/nvml.h` at that version). Every struct's size is asserted at compile time.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use std::mem::size_of;
use std::os::raw::{c_char, c_uint, c_ulonglong};

/// nvml.h's return codes, kept in [`crate::codes`] (a leaf the driver's rules use too).
pub use crate::codes::{nvmlReturn_t, ret};

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

/// `nvmlEventSet_t`: an opaque pointer (see `events`).
pub type nvmlEventSet_t = *mut std::ffi::c_void;

/// `nvmlEventData_t` (since NVML 11: with the instance ids).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlEventData_t {
    /// The GPU the event concerns (its whole-GPU handle).
    pub device: nvmlDevice_t,
    /// One `nvmlEventType*` bit.
    pub eventType: c_ulonglong,
    /// The Xid for an Xid event, else type-specific (0).
    pub eventData: c_ulonglong,
    /// The GPU instance, 0xFFFFFFFF for the whole GPU.
    pub gpuInstanceId: c_uint,
    /// The compute instance, 0xFFFFFFFF for the whole GPU.
    pub computeInstanceId: c_uint,
}
const _: () = assert!(size_of::<nvmlEventData_t>() == 32);

/// The `nvmlEventData_t` of NVML 10 and before, which `nvmlEventSetWait` (v1) fills: the
/// first three fields of today's.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlEventData_v1_t {
    /// As [`nvmlEventData_t::device`].
    pub device: nvmlDevice_t,
    /// As [`nvmlEventData_t::eventType`].
    pub eventType: c_ulonglong,
    /// As [`nvmlEventData_t::eventData`].
    pub eventData: c_ulonglong,
}
const _: () = assert!(size_of::<nvmlEventData_v1_t>() == 24);

/// `nvmlFieldValue_t`; `value` is the union `nvmlValue_t` (8 bytes), written here as the
/// unsigned long long it holds for every field the simulator answers.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlFieldValue_t {
    /// `NVML_FI_*`.
    pub fieldId: c_uint,
    /// The scope (an NVLink, a GPM instance); ignored by the fields answered here.
    pub scopeId: c_uint,
    /// Microseconds since 1970 when the value was read.
    pub timestamp: i64,
    /// How long the read took, in microseconds.
    pub latencyUsec: i64,
    /// `nvmlValueType_t`.
    pub valueType: c_uint,
    /// This field's own answer.
    pub nvmlReturn: nvmlReturn_t,
    /// `nvmlValue_t`.
    pub value: c_ulonglong,
}
const _: () = assert!(size_of::<nvmlFieldValue_t>() == 40);

/// `NVML_VALUE_TYPE_UNSIGNED_INT`.
pub const NVML_VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
/// `NVML_VALUE_TYPE_UNSIGNED_LONG_LONG`.
pub const NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;

/// `nvmlRowRemapperHistogramValues_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlRowRemapperHistogramValues_t {
    /// Banks with all their spare rows.
    pub max: c_uint,
    /// Banks with most of them.
    pub high: c_uint,
    /// Banks with some.
    pub partial: c_uint,
    /// Banks with few.
    pub low: c_uint,
    /// Banks with none.
    pub none: c_uint,
}
const _: () = assert!(size_of::<nvmlRowRemapperHistogramValues_t>() == 20);
