//! NVML's return codes and nvml-wrapper's errors turned into [`GpuError`]s that name the
//! call, the GPU and the NVML function.

use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;
use nvml_wrapper_sys::bindings::nvmlReturn_t;

use crate::gpu::{ErrorCode, GpuError};

/// Puts what the call was about in front of an error's detail.
pub(super) fn with_context(error: GpuError, detail: String) -> GpuError {
    let detail = match error.detail {
        Some(ref existing) => format!("{detail}: {existing}"),
        None => detail,
    };
    GpuError { detail: Some(detail), ..error }
}

/// NVML's name of a return code (`NVML_ERROR_IN_USE`).
pub(super) fn return_name(ret: nvmlReturn_t) -> &'static str {
    match ret {
        sys::nvmlReturn_enum_NVML_SUCCESS => "NVML_SUCCESS",
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => "NVML_ERROR_UNINITIALIZED",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => "NVML_ERROR_INVALID_ARGUMENT",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => "NVML_ERROR_NOT_SUPPORTED",
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => "NVML_ERROR_NO_PERMISSION",
        sys::nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED => "NVML_ERROR_ALREADY_INITIALIZED",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => "NVML_ERROR_NOT_FOUND",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => "NVML_ERROR_INSUFFICIENT_SIZE",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER => "NVML_ERROR_INSUFFICIENT_POWER",
        sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => "NVML_ERROR_DRIVER_NOT_LOADED",
        sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT => "NVML_ERROR_TIMEOUT",
        sys::nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE => "NVML_ERROR_IRQ_ISSUE",
        sys::nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND => "NVML_ERROR_LIBRARY_NOT_FOUND",
        sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => "NVML_ERROR_FUNCTION_NOT_FOUND",
        sys::nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM => "NVML_ERROR_CORRUPTED_INFOROM",
        sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => "NVML_ERROR_GPU_IS_LOST",
        sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => "NVML_ERROR_RESET_REQUIRED",
        sys::nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM => "NVML_ERROR_OPERATING_SYSTEM",
        sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => {
            "NVML_ERROR_LIB_RM_VERSION_MISMATCH"
        }
        sys::nvmlReturn_enum_NVML_ERROR_IN_USE => "NVML_ERROR_IN_USE",
        sys::nvmlReturn_enum_NVML_ERROR_MEMORY => "NVML_ERROR_MEMORY",
        sys::nvmlReturn_enum_NVML_ERROR_NO_DATA => "NVML_ERROR_NO_DATA",
        sys::nvmlReturn_enum_NVML_ERROR_VGPU_ECC_NOT_SUPPORTED => {
            "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED"
        }
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => {
            "NVML_ERROR_INSUFFICIENT_RESOURCES"
        }
        sys::nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED => "NVML_ERROR_FREQ_NOT_SUPPORTED",
        sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => {
            "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"
        }
        sys::nvmlReturn_enum_NVML_ERROR_DEPRECATED => "NVML_ERROR_DEPRECATED",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_READY => "NVML_ERROR_NOT_READY",
        sys::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND => "NVML_ERROR_GPU_NOT_FOUND",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_STATE => "NVML_ERROR_INVALID_STATE",
        sys::nvmlReturn_enum_NVML_ERROR_RESET_TYPE_NOT_SUPPORTED => {
            "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED"
        }
        sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN => "NVML_ERROR_UNKNOWN",
        _ => "an unknown NVML return code",
    }
}

/// The agent's code for an NVML return code.
pub(super) fn return_code(ret: nvmlReturn_t) -> ErrorCode {
    match ret {
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        | sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED
        | sys::nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND
        | sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => ErrorCode::DriverNotLoaded,
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        | sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => ErrorCode::InvalidArgument,
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        | sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => ErrorCode::NotSupported,
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => ErrorCode::NoPermission,
        sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND
        | sys::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND => ErrorCode::NotFound,
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => ErrorCode::InsufficientResources,
        sys::nvmlReturn_enum_NVML_ERROR_IN_USE => ErrorCode::InUse,
        sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => ErrorCode::ResetRequired,
        sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => ErrorCode::GpuLost,
        _ => ErrorCode::Unknown,
    }
}

/// The error for a raw NVML return code from `function`.
pub(super) fn raw_error(
    call: &str,
    gpu: Option<u32>,
    function: &str,
    ret: nvmlReturn_t,
) -> GpuError {
    let hint = match ret {
        sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => {
            ": is the nvidia kernel module loaded?"
        }
        sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => {
            ": libnvidia-ml and the kernel driver differ in version (reload the nvidia module or reboot)"
        }
        sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => {
            ": the driver is too old for this call"
        }
        _ => "",
    };
    let detail = if return_name(ret).starts_with("NVML_") {
        format!("{function} returned {}{hint}", return_name(ret))
    } else {
        format!("{function} returned NVML code {ret}{hint}")
    };
    GpuError::new(call, gpu, return_code(ret)).with_detail(detail)
}

/// The error for an nvml-wrapper failure in `function`.
pub(super) fn wrapper_error(
    call: &str,
    gpu: Option<u32>,
    function: &str,
    error: NvmlError,
) -> GpuError {
    match error {
        NvmlError::LibloadingError(e) => GpuError::new(call, gpu, ErrorCode::DriverNotLoaded)
            .with_detail(format!(
                "libnvidia-ml.so.1 not found: is the NVIDIA driver installed? ({e})"
            )),
        NvmlError::FailedToLoadSymbol(e) => GpuError::new(call, gpu, ErrorCode::NotSupported)
            .with_detail(format!(
                "{function} is missing from libnvidia-ml.so.1: the driver is too old ({e})"
            )),
        NvmlError::Utf8Error(_)
        | NvmlError::NulError(_)
        | NvmlError::StringTooLong { .. }
        | NvmlError::IncorrectBits(_)
        | NvmlError::SetReleaseFailed
        | NvmlError::GetPciInfoFailed
        | NvmlError::PciInfoToCFailed => {
            GpuError::new(call, gpu, ErrorCode::Unknown).with_detail(format!("{function}: {error}"))
        }
        // Every other variant stands for an NVML return code (UnexpectedVariant carries
        // the codes nvml-wrapper has no variant for, e.g. INSUFFICIENT_RESOURCES).
        other => raw_error(call, gpu, function, nvmlReturn_t::from(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_codes_map_to_the_agents_codes() {
        let cases = [
            (sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED, ErrorCode::DriverNotLoaded),
            (sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED, ErrorCode::DriverNotLoaded),
            (sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH, ErrorCode::DriverNotLoaded),
            (sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT, ErrorCode::InvalidArgument),
            (sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH, ErrorCode::InvalidArgument),
            (sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED, ErrorCode::NotSupported),
            (sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND, ErrorCode::NotSupported),
            (sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION, ErrorCode::NoPermission),
            (sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND, ErrorCode::NotFound),
            (
                sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
                ErrorCode::InsufficientResources,
            ),
            (sys::nvmlReturn_enum_NVML_ERROR_IN_USE, ErrorCode::InUse),
            (sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED, ErrorCode::ResetRequired),
            (sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST, ErrorCode::GpuLost),
            (sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN, ErrorCode::Unknown),
            (sys::nvmlReturn_enum_NVML_ERROR_MEMORY, ErrorCode::Unknown),
            (12345, ErrorCode::Unknown),
        ];
        for (ret, code) in cases {
            let e = raw_error("create_gpu_instance", Some(3), "nvmlX", ret);
            assert_eq!(e.code, code, "{}", return_name(ret));
            assert_eq!(e.call, "create_gpu_instance");
            assert_eq!(e.gpu, Some(3));
        }
        let e = raw_error(
            "create_gpu_instance",
            Some(0),
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
        );
        assert_eq!(
            e.to_string(),
            "create_gpu_instance on GPU 0: Insufficient Resources \
             (nvmlDeviceCreateGpuInstanceWithPlacement returned NVML_ERROR_INSUFFICIENT_RESOURCES)"
        );
        assert!(raw_error("observe", None, "f", 12345).detail.unwrap().contains("NVML code 12345"));
    }

    #[test]
    fn wrapper_errors_map_like_their_return_codes() {
        let map = |e| wrapper_error("destroy_gpu_instance", Some(1), "nvmlGpuInstanceDestroy", e);
        assert_eq!(map(NvmlError::InUse).code, ErrorCode::InUse);
        assert_eq!(map(NvmlError::NoPermission).code, ErrorCode::NoPermission);
        assert_eq!(map(NvmlError::DriverNotLoaded).code, ErrorCode::DriverNotLoaded);
        assert_eq!(map(NvmlError::Uninitialized).code, ErrorCode::DriverNotLoaded);
        assert_eq!(map(NvmlError::GpuLost).code, ErrorCode::GpuLost);
        assert_eq!(map(NvmlError::InvalidArg).code, ErrorCode::InvalidArgument);
        // nvml-wrapper has no variant for INSUFFICIENT_RESOURCES.
        let e = map(NvmlError::UnexpectedVariant(
            sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
        ));
        assert_eq!(e.code, ErrorCode::InsufficientResources);
        assert_eq!(e.call, "destroy_gpu_instance");
        assert_eq!(e.gpu, Some(1));
        let e = map(NvmlError::FailedToLoadSymbol("undefined symbol".into()));
        assert_eq!(e.code, ErrorCode::NotSupported);
        assert!(e.detail.unwrap().contains("nvmlGpuInstanceDestroy"));
        assert_eq!(map(NvmlError::GetPciInfoFailed).code, ErrorCode::Unknown);
        assert_eq!(map(NvmlError::Unknown).code, ErrorCode::Unknown);
    }
}
