//! Which `libnvidia-ml` the backend loads, and the check that it is the one meant.
//!
//! On a real host the dynamic loader finds NVIDIA's `libnvidia-ml.so.1`. With
//! `--simulate` the backend loads gpushare's simulated driver (crate `sim/nvml`) from a
//! path instead, through the same nvml-wrapper calls. The two must never be mixed up: a
//! simulated library found first on `LD_LIBRARY_PATH` would make a real host look idle
//! while nothing is applied, and the real library loaded for a simulation would change real
//! GPUs. The simulated library exports a marker symbol, [`SIM_MARKER`]; every
//! initialization (the first, and the one after each GPU reset) checks that the library
//! has it exactly when a simulation was asked for, before `nvmlInit` (the library loaded
//! and held, so that nvml-wrapper loads the same one) and after it. The simulated library
//! also refuses by itself, before it reads a knob or touches a file, in an agent that
//! declared NVIDIA's driver (`simulator::declare_driver`, issue 36).

use std::ffi::{CStr, CString, OsStr, c_char, c_uint, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nvml_wrapper::Nvml;

use super::errors::wrapper_error;
use crate::gpu::{ErrorCode, GpuError};

/// The marker symbol of gpushare's simulated driver: `const char *gpushare_sim_driver(void)`.
const SIM_MARKER: &CStr = c"gpushare_sim_driver";
/// `nvmlReturn_t gpushare_sim_last_error(char *buf, unsigned len)`: why the simulated
/// library's last `nvmlInit` failed, in one line.
const SIM_LAST_ERROR: &CStr = c"gpushare_sim_last_error";
/// The soname nvml-wrapper loads by default.
const NVIDIA_LIBRARY: &str = "libnvidia-ml.so.1";

/// Which `libnvidia-ml` to drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Driver {
    /// NVIDIA's `libnvidia-ml.so.1`, found by the dynamic loader.
    Nvidia,
    /// gpushare's simulated driver library at this path (`--simulate`).
    Simulated(PathBuf),
}

impl Driver {
    /// Whether this is the simulated driver.
    pub fn is_simulated(&self) -> bool {
        matches!(self, Driver::Simulated(_))
    }

    /// The library's file name or path, as the loader is given it.
    pub fn library(&self) -> &OsStr {
        match self {
            Driver::Nvidia => OsStr::new(NVIDIA_LIBRARY),
            Driver::Simulated(path) => path.as_os_str(),
        }
    }

    /// Loads the library, initializes NVML, and checks that the library is the one meant
    /// (see the module docs). `call` and `gpu` name the error.
    pub(super) fn open(&self, call: &str, gpu: Option<u32>) -> Result<Nvml, GpuError> {
        if let Driver::Simulated(path) = self
            && !path.is_file()
        {
            return Err(GpuError::new(call, gpu, ErrorCode::DriverNotLoaded).with_detail(format!(
                "the simulated driver library {} does not exist (is gpushare's simulator installed?)",
                path.display()
            )));
        }
        // Looked at before nvmlInit too, in a library loaded here and held while
        // nvml-wrapper loads it (so both are the same one): a simulated library loaded for
        // real GPUs refuses to start by itself (the agent declared `nvidia`, see
        // `simulator::declare_driver`), and this says why in the agent's words.
        let loaded = Library::open(Path::new(self.library()), false);
        if let Some(library) = &loaded
            && let Some(e) = self.mismatch(call, gpu, library.symbol(SIM_MARKER).is_some())
        {
            return Err(e);
        }
        let nvml = match Nvml::builder().lib_path(self.library()).init() {
            Ok(nvml) => nvml,
            Err(e) => {
                let mut error = wrapper_error(call, gpu, "nvmlInit_v2", e);
                if let Some(why) = self.simulated_init_error() {
                    error.detail = Some(why);
                }
                return Err(error);
            }
        };
        // NVML stays loaded while `nvml` lives, so the check sees the library in use.
        let simulated = has_symbol(self.library(), SIM_MARKER).unwrap_or(false);
        self.mismatch(call, gpu, simulated).map_or(Ok(nvml), Err)
    }

    /// The refusal when a library that has the simulator's marker (`simulated`) or lacks
    /// it is not the one meant.
    fn mismatch(&self, call: &str, gpu: Option<u32>, simulated: bool) -> Option<GpuError> {
        match (self, simulated) {
            (Driver::Nvidia, true) => {
                Some(GpuError::new(call, gpu, ErrorCode::DriverNotLoaded).with_detail(format!(
                    "{NVIDIA_LIBRARY} is gpushare's simulated driver, not NVIDIA's (check \
                     LD_LIBRARY_PATH and /etc/ld.so.conf.d); refusing to drive it as real GPUs"
                )))
            }
            (Driver::Simulated(path), false) => {
                Some(GpuError::new(call, gpu, ErrorCode::DriverNotLoaded).with_detail(format!(
                    "{} is not gpushare's simulated driver (it lacks {}); refusing to simulate \
                     on it",
                    path.display(),
                    SIM_MARKER.to_string_lossy()
                )))
            }
            _ => None,
        }
    }

    /// The simulated library's own one-line reason for a failed `nvmlInit` (a bad
    /// `GPUSHARE_SIM_*` knob, say), when this is the simulated driver and it gives one.
    fn simulated_init_error(&self) -> Option<String> {
        let Driver::Simulated(path) = self else {
            return None;
        };
        let library = Library::open(path, false)?;
        let symbol = library.symbol(SIM_LAST_ERROR)?;
        // SAFETY: the simulated library (its marker checked by name, the symbol's
        // signature is its documented one) exports
        // `nvmlReturn_t gpushare_sim_last_error(char *, unsigned)`.
        let last_error: unsafe extern "C" fn(*mut c_char, c_uint) -> c_uint =
            unsafe { std::mem::transmute(symbol) };
        let mut buffer = [0 as c_char; 512];
        // SAFETY: the buffer is writable and its length is passed; the function writes at
        // most that many bytes, NUL included.
        let ret = unsafe { last_error(buffer.as_mut_ptr(), buffer.len() as c_uint) };
        if ret != 0 {
            return None;
        }
        // SAFETY: the function NUL-terminates within the buffer on success.
        let text = unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().trim().to_owned();
        (!text.is_empty()).then_some(text)
    }
}

/// Whether the library `name`, already loaded in this process, exports `symbol`; `None`
/// when it is not loaded.
fn has_symbol(name: &OsStr, symbol: &CStr) -> Option<bool> {
    let library = Library::open(Path::new(name), true)?;
    Some(library.symbol(symbol).is_some())
}

/// A `dlopen` handle, closed on drop. Through `libc`: `nix` wraps neither `dlopen`,
/// `dlsym` nor `dlclose`.
struct Library(*mut c_void);

impl Library {
    /// `dlopen`s `path`; with `loaded_only`, only finds a library the process has loaded
    /// already (RTLD_NOLOAD), by path or soname.
    fn open(path: &Path, loaded_only: bool) -> Option<Library> {
        let name = CString::new(path.as_os_str().as_bytes()).ok()?;
        let flags =
            libc::RTLD_LAZY | libc::RTLD_LOCAL | if loaded_only { libc::RTLD_NOLOAD } else { 0 };
        // SAFETY: `name` is a NUL-terminated path; dlopen has no other preconditions. A
        // library loaded here runs its initializers, which the simulated driver and
        // NVIDIA's library both allow (nvml-wrapper loads the same file the same way).
        let handle = unsafe { libc::dlopen(name.as_ptr(), flags) };
        // Not `then_some`: that would build (and drop, dlclose-ing) a null handle.
        if handle.is_null() { None } else { Some(Library(handle)) }
    }

    /// The address of `symbol`, if exported.
    fn symbol(&self, symbol: &CStr) -> Option<*mut c_void> {
        // SAFETY: the handle is a live dlopen handle (closed only on drop) and `symbol`
        // is NUL-terminated.
        let address = unsafe { libc::dlsym(self.0, symbol.as_ptr()) };
        (!address.is_null()).then_some(address)
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and is closed once; no symbol looked up
        // through it is used after this (callers copy what they read).
        unsafe { libc::dlclose(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_simulated_library_is_named() {
        let driver = Driver::Simulated(PathBuf::from("/nonexistent/libgpushare_sim_nvml.so"));
        let e = driver.open("init", None).unwrap_err();
        assert_eq!(e.code, ErrorCode::DriverNotLoaded);
        assert_eq!(
            e.detail.as_deref(),
            Some(
                "the simulated driver library /nonexistent/libgpushare_sim_nvml.so does not exist \
                 (is gpushare's simulator installed?)"
            )
        );
    }

    #[test]
    fn the_marker_is_looked_up_in_loaded_libraries_only() {
        // libc is loaded in every process, exports malloc and no marker.
        assert_eq!(has_symbol(OsStr::new("libc.so.6"), c"malloc"), Some(true));
        assert_eq!(has_symbol(OsStr::new("libc.so.6"), SIM_MARKER), Some(false));
        assert_eq!(has_symbol(OsStr::new("libgpushare-no-such-library.so"), SIM_MARKER), None);
    }
}
