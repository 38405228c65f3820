//! Issue 36, finding 6: loaded into a gpushare-agent that drives NVIDIA's driver (one
//! that found this library as `libnvidia-ml.so.1` by mistake), the simulated driver
//! refuses `nvmlInit` before it reads any `GPUSHARE_SIM_*` knob or touches any file: no
//! state file, no host directory, no device node. Under `--simulate` it runs, and the
//! device nodes it makes as root are root's alone. One test function: the environment is
//! set before each init.

mod common;

use std::ffi::{CStr, CString, OsStr};
use std::os::raw::{c_char, c_uint};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

/// The simulated library's `gpushare_sim_last_error`, through its own handle.
fn last_error(library: &Path) -> String {
    let name = CString::new(library.as_os_str().as_bytes()).unwrap();
    // dlopen, dlsym and dlclose through libc, for nix does not wrap the dynamic loader.
    // SAFETY: a NUL-terminated path; the library's initializers have no preconditions.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {}", library.display());
    // SAFETY: a live handle and a NUL-terminated name.
    let symbol = unsafe { libc::dlsym(handle, c"gpushare_sim_last_error".as_ptr()) };
    assert!(!symbol.is_null(), "gpushare_sim_last_error is exported");
    // SAFETY: the symbol is `nvmlReturn_t gpushare_sim_last_error(char *, unsigned)`.
    let function: unsafe extern "C" fn(*mut c_char, c_uint) -> c_uint =
        unsafe { std::mem::transmute(symbol) };
    let mut buffer = [0 as c_char; 1024];
    // SAFETY: a writable buffer of the length passed.
    assert_eq!(unsafe { function(buffer.as_mut_ptr(), buffer.len() as c_uint) }, 0);
    // SAFETY: NUL-terminated within the buffer on success.
    let text = unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned();
    // SAFETY: the handle came from dlopen; nothing of it is used after.
    unsafe { libc::dlclose(handle) };
    text
}

/// Every path under `dir`.
fn everything(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        found.push(entry.path().display().to_string());
        if entry.path().is_dir() {
            found.extend(everything(&entry.path()));
        }
    }
    found
}

#[test]
fn a_production_agent_gets_a_refusal_before_any_knob_or_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("node.json");
    // SAFETY: the only test in this binary sets the environment before each init.
    unsafe {
        std::env::set_var("GPUSHARE_AGENT_DRIVER", "nvidia");
        std::env::set_var("GPUSHARE_SIM_NODE", "a100-40gb:2");
        std::env::set_var("GPUSHARE_SIM_STATE", &state);
        // A malformed knob: were it read, its error would be the one given.
        std::env::set_var("GPUSHARE_SIM_FAIL", "not a knob");
    }
    let library = common::library();
    let refused = Nvml::builder().lib_path(OsStr::new(&library)).init();
    assert!(matches!(refused, Err(NvmlError::DriverNotLoaded)), "{refused:?}");
    let why = last_error(&library);
    assert!(why.contains("refuses to run in a gpushare-agent that drives NVIDIA's"), "{why}");
    assert!(!why.contains("GPUSHARE_SIM_FAIL"), "no knob read: {why}");
    assert_eq!(everything(dir.path()), Vec::<String>::new(), "no file touched");

    // Under --simulate the agent says so, and the library runs.
    // SAFETY: as above.
    unsafe {
        std::env::set_var("GPUSHARE_AGENT_DRIVER", "simulated");
        std::env::remove_var("GPUSHARE_SIM_FAIL");
    }
    let nvml = Nvml::builder().lib_path(OsStr::new(&library)).init().expect("init");
    assert_eq!(nvml.device_count().unwrap(), 2);
    assert!(state.is_file());
    // As root it made device nodes: root's alone, none another user may open.
    let dev = dir.path().join("node.json.host/dev");
    // SAFETY: geteuid has no preconditions.
    if nix::unistd::geteuid().is_root() && dev.exists() {
        let nodes: Vec<String> = everything(&dev);
        assert!(nodes.iter().any(|n| n.ends_with("/nvidia0")), "{nodes:?}");
        for node in nodes {
            let meta = std::fs::symlink_metadata(&node).unwrap();
            if !meta.is_dir() {
                assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o600, 0), "{node}");
            }
        }
    }
    nvml.shutdown().unwrap();
}
