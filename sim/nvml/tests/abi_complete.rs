//! Every function nvml.h declares resolves in the built library (`dlsym` over the header's
//! list, `abi/nvml-functions.txt`), and one the simulator does not model answers
//! `NVML_ERROR_NOT_SUPPORTED` once initialized, `NVML_ERROR_UNINITIALIZED` before.

mod common;

use common::library;

use std::ffi::CString;

fn header_functions() -> Vec<String> {
    let list = concat!(env!("CARGO_MANIFEST_DIR"), "/abi/nvml-functions.txt");
    std::fs::read_to_string(list)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_function_of_nvml_h_resolves() {
    let path = CString::new(library().to_str().unwrap()).unwrap();
    // dlopen and dlsym through libc, for nix does not wrap the dynamic loader.
    // SAFETY: dlopen with a NUL-terminated path; the handle stays open for the test.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {}", library().display());
    let names = header_functions();
    assert!(names.len() > 400, "the list holds nvml.h's functions: {}", names.len());
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| {
            let symbol = CString::new(name.as_str()).unwrap();
            // SAFETY: dlsym on a live handle with a NUL-terminated name.
            unsafe { libc::dlsym(handle, symbol.as_ptr()) }.is_null()
        })
        .collect();
    assert!(missing.is_empty(), "{} of {} missing: {missing:?}", missing.len(), names.len());
    // nvmlErrorString returns a string, not nvmlReturn_t: modelled, outside the list.
    let symbol = CString::new("nvmlErrorString").unwrap();
    // SAFETY: as above.
    assert!(!unsafe { libc::dlsym(handle, symbol.as_ptr()) }.is_null());
}

#[test]
fn an_unmodelled_function_is_not_supported_once_initialized() {
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: the only test in this binary that touches the environment or NVML.
    unsafe {
        std::env::set_var("GPUSHARE_SIM_NODE", "h100-80gb:1");
        std::env::set_var("GPUSHARE_SIM_STATE", dir.path().join("node.json"));
    }
    let path = CString::new(library().to_str().unwrap()).unwrap();
    // SAFETY: as above.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null());
    let function = |name: &str| {
        let symbol = CString::new(name).unwrap();
        // SAFETY: dlsym on a live handle; the symbol is a C function of the stated type
        // (`nvmlReturn_t f(void)` for init/shutdown; the stub ignores its arguments).
        let f = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
        assert!(!f.is_null(), "{name}");
        // SAFETY: a function pointer of the library, called with no arguments, which the
        // functions used here take none of or (the stub) never read.
        unsafe { std::mem::transmute::<*mut libc::c_void, extern "C" fn() -> u32>(f) }
    };
    // NVML_ERROR_UNINITIALIZED is 1, NVML_ERROR_NOT_SUPPORTED 3.
    let unmodelled = "nvmlDeviceGetFanSpeed";
    assert_eq!(function(unmodelled)(), 1);
    assert_eq!(function("nvmlInit_v2")(), 0);
    assert_eq!(function(unmodelled)(), 3);
    assert_eq!(function("nvmlShutdown")(), 0);
}
