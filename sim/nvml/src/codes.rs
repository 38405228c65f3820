//! NVML's return codes (nvml.h `nvmlReturn_t`): their values, nvml.h names and
//! `nvmlErrorString` texts, and [`Code`], the error type of every simulated call. A leaf:
//! it uses nothing else of the crate, and everything that answers a code (the driver's
//! rules, the knobs, the C ABI, the simulated tools) uses it.

#![allow(non_camel_case_types)]

use std::os::raw::c_uint;

/// `nvmlReturn_t`.
pub type nvmlReturn_t = c_uint;

/// An NVML return code other than success.
pub type Code = nvmlReturn_t;

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

    /// `nvmlErrorString`'s text for a code, as driver 580.159.04 words every one of them
    /// (recorded on an H100: tests/device/results/nvml-answers-h100-2026-12-06).
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
            FREQ_NOT_SUPPORTED => c"Invalid Frequency",
            ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
            DEPRECATED => c"Requested functionality has been deprecated",
            NOT_READY => c"System is not in ready state",
            GPU_NOT_FOUND => c"No supported GPUs were found",
            INVALID_STATE => c"Resource not in correct state to perform requested operation",
            RESET_TYPE_NOT_SUPPORTED => c"Reset type is not supported for given device",
            _ => c"Unknown Error",
        }
    }
}
