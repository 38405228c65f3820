//! The NVML session: [`NvmlBackend`] loads the library ([`Driver`]) and initializes NVML,
//! keeps the initialized library (closed only while a GPU reset runs, then initialized
//! again), the nvidia-smi that resets GPUs and the driver's MIG tables learned per GPU,
//! and lends every call a [`Session`] under its lock: the borrowed library, the
//! handle lookup by NVML index and the raw FFI. What the session asks is in
//! [`super::observe`], [`super::processes`] and [`super::changes`].

use std::path::PathBuf;
use std::sync::RwLock;

use nvml_wrapper::{Device, Nvml};

use super::catalog_check::NvmlProfileInfo;
use super::driver_table::DriverTables;
use super::errors::wrapper_error;
use super::library::Driver;
use super::raw::{Raw, device_handle};
use super::reset::with_slot;
use crate::gpu::GpuError;
#[cfg(doc)]
use crate::gpu::{ErrorCode, GpuBackend};

/// The call name of errors from [`NvmlBackend::observe`](GpuBackend::observe).
pub(super) const OBSERVE: &str = "observe";
/// The call name of errors from [`NvmlBackend::new`].
pub(super) const INIT: &str = "init";
/// The call name of errors from [`NvmlBackend::profile_table`].
pub(super) const PROFILE_TABLE: &str = "profile_table";
/// The nvidia-smi that [`NvmlBackend::new`] runs, looked up on `PATH`.
pub(super) const DEFAULT_NVIDIA_SMI: &str = "nvidia-smi";
/// The GPU backend on real hardware, through NVML.
///
/// Holds the NVML session (the initialized library, which is `Send + Sync`) behind a
/// read-write lock. Every call runs on a `Session` borrowing it under the read lock;
/// device handles borrow the session, so every call looks its GPU up again by NVML index.
///
/// GPU resets run nvidia-smi, which refuses to reset a GPU that any NVML client has open,
/// and an initialized NVML keeps every `/dev/nvidiaN` open: the agent would block its own
/// resets. So [`GpuBackend::reset_gpu`] closes the session for the reset (`nvmlShutdown`,
/// by dropping the `Nvml`) under the write lock, which makes every other call, on any GPU,
/// wait until the session is initialized again afterwards. Should that re-initialization
/// fail, the slot stays empty and the next call initializes NVML itself. NVML counts
/// initializations per process, so this closes the device nodes only while the backend is
/// the process's one NVML client, as it is in the agent.
#[derive(Debug)]
pub struct NvmlBackend {
    /// The NVML session; `None` only while a reset runs or after its re-initialization
    /// failed.
    pub(super) session: RwLock<Option<Nvml>>,
    /// The library the session is opened on, every time.
    pub(super) driver: Driver,
    /// The nvidia-smi that resets GPUs; a bare name is looked up on `PATH`.
    pub(super) nvidia_smi: PathBuf,
    /// Each GPU's MIG table as its driver reported it.
    pub(super) tables: DriverTables,
    /// The health watcher's event set.
    pub(super) events: super::event_set::Events,
    /// Each GPU as last observed: what a lost GPU is shown as.
    pub(super) last_seen: std::sync::Mutex<std::collections::BTreeMap<u32, crate::node::GpuState>>,
}

impl NvmlBackend {
    /// Loads `libnvidia-ml.so.1` and initializes NVML.
    ///
    /// A missing library or an unloaded kernel driver answers
    /// [`ErrorCode::DriverNotLoaded`]. GPU resets run `nvidia-smi` from `PATH`; see
    /// [`NvmlBackend::with_nvidia_smi`].
    pub fn new() -> Result<Self, GpuError> {
        Self::open(Driver::Nvidia)
    }

    /// Loads `driver`'s library and initializes NVML; every later initialization (after a
    /// GPU reset) opens the same library, and each checks that it is the one meant (see
    /// [`Driver`]).
    pub fn open(driver: Driver) -> Result<Self, GpuError> {
        let nvml = driver.open(INIT, None)?;
        Ok(Self {
            session: RwLock::new(Some(nvml)),
            driver,
            nvidia_smi: PathBuf::from(DEFAULT_NVIDIA_SMI),
            tables: DriverTables::default(),
            events: Default::default(),
            last_seen: Default::default(),
        })
    }

    /// The library this backend drives.
    pub fn driver(&self) -> &Driver {
        &self.driver
    }

    /// The same backend, resetting GPUs with the nvidia-smi at `path` (a bare name is
    /// looked up on `PATH`).
    pub fn with_nvidia_smi(self, path: impl Into<PathBuf>) -> Self {
        Self { nvidia_smi: path.into(), ..self }
    }

    /// The GPU-instance profiles NVML reports for a GPU, with their possible placements.
    ///
    /// Read-only, and works with MIG off. Queries every enum index NVML defines and skips
    /// those the GPU answers Not Supported or Invalid Argument. nvml.h says the placement
    /// query needs a privileged user (a non-root user could run it on the test H100).
    pub fn profile_table(&self, gpu: u32) -> Result<Vec<NvmlProfileInfo>, GpuError> {
        self.with_session(PROFILE_TABLE, Some(gpu), |s| s.profile_table(gpu))
    }

    /// What the driver answers for each GPU-instance profile enum index below `ceiling`
    /// (the versioned query with a v2 struct): `NVML_SUCCESS` or the error's name.
    /// Read-only; for comparing a driver's answers with the simulated driver's.
    pub fn profile_enum_answers(
        &self,
        gpu: u32,
        ceiling: u32,
    ) -> Result<Vec<(u32, &'static str)>, GpuError> {
        self.with_session(PROFILE_TABLE, Some(gpu), |s| {
            let device = s.device(PROFILE_TABLE, gpu)?;
            let dev = device_handle(&device);
            let raw = s.raw(PROFILE_TABLE, gpu);
            Ok((0..ceiling).map(|e| (e, raw.gi_profile_answer(dev, e))).collect())
        })
    }

    /// Whether each GPU is in persistence mode (`None` where it cannot tell), and its
    /// device node. Read-only.
    pub fn persistence_and_node(
        &self,
        gpu: u32,
    ) -> Result<(Option<bool>, Result<String, String>), GpuError> {
        self.with_session(PROFILE_TABLE, Some(gpu), |s| {
            let on = s.persistence_mode(PROFILE_TABLE, gpu).ok();
            Ok((on, s.device_node(PROFILE_TABLE, gpu)?))
        })
    }

    /// Runs `f` on the NVML session, under the read lock. Initializes NVML again first when
    /// a reset left the session closed (see [`NvmlBackend`]); a failure to do so is the
    /// error of `call` on `gpu`.
    pub(super) fn with_session<T>(
        &self,
        call: &'static str,
        gpu: Option<u32>,
        f: impl FnOnce(Session<'_>) -> Result<T, GpuError>,
    ) -> Result<T, GpuError> {
        with_slot(
            &self.session,
            || {
                tracing::info!("initializing NVML again (it was closed for a GPU reset)");
                self.driver.open(call, gpu)
            },
            |nvml| f(Session { nvml, tables: &self.tables, last_seen: &self.last_seen }),
        )
    }
}

/// The NVML session of an [`NvmlBackend`], borrowed under its lock for one call: what
/// every NVML call goes through. Device handles borrow it, so none outlives the lock (a
/// reset closes the session only under the write lock).
pub(super) struct Session<'a> {
    pub(super) nvml: &'a Nvml,
    pub(super) tables: &'a DriverTables,
    pub(super) last_seen:
        &'a std::sync::Mutex<std::collections::BTreeMap<u32, crate::node::GpuState>>,
}

impl<'a> Session<'a> {
    pub(super) fn raw(&self, call: &'static str, gpu: u32) -> Raw<'a> {
        Raw { lib: self.nvml.lib(), call, gpu }
    }

    pub(super) fn device(&self, call: &'static str, gpu: u32) -> Result<Device<'a>, GpuError> {
        self.nvml
            .device_by_index(gpu)
            .map_err(|e| wrapper_error(call, Some(gpu), "nvmlDeviceGetHandleByIndex_v2", e))
    }
}
