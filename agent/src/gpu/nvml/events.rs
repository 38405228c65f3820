//! The driver's health for the agent's watcher (issue 42): one NVML event set registered
//! for the critical events on every GPU that supports them, waited on in slices, and the
//! readings no event carries (pending row remaps, retired pages, the recovery-action
//! field, a GPU lost). The event set is NVML's, valid only while the session that made it
//! is initialized: a GPU reset frees it first and suspends the watch until NVML is open
//! again ([`NvmlBackend::suspend_events`]).

use std::os::raw::c_uint;
use std::time::Duration;

use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper_sys::bindings as sys;
use nvml_wrapper_sys::bindings::{nvmlEventData_t, nvmlEventSet_t};

use super::errors::{raw_error, wrapper_error};
use super::event_set::{EventState, SetHandle};
use super::raw::device_handle;
use super::session::{NvmlBackend, Session};
use crate::gpu::{ErrorCode, GpuError, GpuEvent, GpuEventKind, HealthReading};

/// The call name of the watcher's errors.
const WATCH: &str = "watch_events";
/// The call name of the health readings' errors.
const HEALTH: &str = "health_reading";

/// The event types the agent registers for, where the GPU supports them: those NVIDIA's
/// device plugin and DRA driver register (Xid, double- and single-bit ECC), and the newer
/// drivers' GPU-unavailable and recovery-action events.
const WANTED: u64 = (sys::nvmlEventTypeXidCriticalError
    | sys::nvmlEventTypeDoubleBitEccError
    | sys::nvmlEventTypeSingleBitEccError
    | sys::nvmlEventTypeGpuUnavailableError
    | sys::nvmlEventTypeGpuRecoveryAction) as u64;

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`.
const RECOVERY_ACTION_FIELD: u32 = sys::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;

/// An event's instance id that means "the whole GPU".
const WHOLE_GPU: c_uint = 0xFFFF_FFFF;

/// What one wait came back with.
enum Waited {
    Event(GpuEvent),
    Nothing,
    Suspended,
}

impl NvmlBackend {
    /// [`crate::gpu::GpuBackend::wait_event`]: waits on the event set (made and registered
    /// first, if none is), up to `timeout`.
    pub(super) fn wait_event(&self, timeout: Duration) -> Result<Option<GpuEvent>, GpuError> {
        let waited = self.with_session(WATCH, None, |s| {
            let mut state = self.events.lock();
            if state.suspended {
                return Ok(Waited::Suspended);
            }
            s.register_into(&mut state)?;
            let set = state.set.as_ref().map_or(std::ptr::null_mut(), |s| s.0);
            match s.wait(set, timeout, &state.indexes) {
                // A registered GPU fell off the bus (nvml.h lets the wait say so): the set
                // is made again without it at the next call, after a slice's pause.
                Err(e) if e.code == ErrorCode::GpuLost => {
                    tracing::warn!("waiting on the driver's events: {e}: registering again");
                    s.drop_set(&mut state);
                    Ok(Waited::Suspended)
                }
                waited => waited,
            }
        })?;
        match waited {
            Waited::Event(event) => Ok(Some(event)),
            Waited::Nothing => Ok(None),
            Waited::Suspended => {
                // Never a busy loop while the reset runs.
                std::thread::sleep(timeout);
                Ok(None)
            }
        }
    }

    /// [`crate::gpu::GpuBackend::unwatched_gpus`]: the GPUs the registration left out.
    pub(super) fn unwatched_gpus(&self) -> Vec<(u32, String)> {
        self.events.lock().unwatched.clone()
    }

    /// Frees the event set and keeps the watch from making another until
    /// [`NvmlBackend::resume_events`]: called before a GPU reset closes the session.
    pub(super) fn suspend_events(&self) {
        let freed = self.with_session(WATCH, None, |s| {
            let mut state = self.events.lock();
            state.suspended = true;
            s.drop_set(&mut state);
            Ok(())
        });
        if freed.is_err() {
            // No session: nothing of NVML's is left to free; the set died with it.
            let mut state = self.events.lock();
            state.suspended = true;
            state.set = None;
        }
    }

    /// [`crate::gpu::GpuBackend::watch_again`]: frees the event set so that the next wait
    /// registers anew (a GPU back on the bus is watched again).
    pub(super) fn watch_again(&self) {
        let _ = self.with_session(WATCH, None, |s| {
            s.drop_set(&mut self.events.lock());
            Ok(())
        });
    }

    /// Lets the watch register again, after a reset, and registers at once: an event
    /// raised between the reset and the watcher's next wait is not lost.
    pub(super) fn resume_events(&self) {
        let registered = self.with_session(WATCH, None, |s| {
            let mut state = self.events.lock();
            state.suspended = false;
            s.register_into(&mut state)
        });
        if let Err(e) = registered {
            // The watcher's next wait registers, or says why not.
            self.events.lock().suspended = false;
            tracing::debug!("registering for the events after the reset: {e}");
        }
    }

    /// [`crate::gpu::GpuBackend::health_reading`].
    pub(super) fn health_reading(&self, gpu: u32) -> HealthReading {
        match self.with_session(HEALTH, Some(gpu), |s| s.health_reading(gpu)) {
            Ok(reading) => reading,
            Err(e) => HealthReading { lost: e.code == ErrorCode::GpuLost, ..Default::default() },
        }
    }
}

impl Session<'_> {
    /// Makes `state`'s event set when it has none: registered on every GPU for what it
    /// supports of [`WANTED`], with the GPUs left out (and why) and the registered handles'
    /// indexes. NotSupported when no GPU could be registered (the GPUs left out are kept).
    fn register_into(&self, state: &mut EventState) -> Result<(), GpuError> {
        if state.set.is_some() {
            return Ok(());
        }
        let lib = self.nvml.lib();
        let err = |function: &str, ret| raw_error(WATCH, None, function, ret);
        let create = nvml_sym(lib.nvmlEventSetCreate.as_ref())
            .map_err(|e| wrapper_error(WATCH, None, "nvmlEventSetCreate", e))?;
        let mut set: nvmlEventSet_t = std::ptr::null_mut();
        // SAFETY: `create` is NVML's nvmlEventSetCreate from the initialized library this
        // session borrows; it writes one handle through the valid pointer given.
        let ret = unsafe { create(&mut set) };
        if ret != sys::nvmlReturn_enum_NVML_SUCCESS {
            return Err(err("nvmlEventSetCreate", ret));
        }
        let set = SetHandle(set);
        let count = self
            .nvml
            .device_count()
            .map_err(|e| wrapper_error(WATCH, None, "nvmlDeviceGetCount_v2", e))?;
        let mut unwatched = Vec::new();
        let mut indexes = Vec::new();
        for gpu in 0..count {
            match self.register_gpu(&set, gpu) {
                Ok(handle) => indexes.push((handle, gpu)),
                Err(why) => unwatched.push((gpu, why)),
            }
        }
        if indexes.is_empty() && count > 0 {
            let why = unwatched.first().map(|(_, why)| why.clone()).unwrap_or_default();
            self.free_event_set(set);
            // Known as unwatched all the same: a GPU lost now is registered for again once
            // it is back ([`crate::gpu::GpuBackend::watch_again`]).
            state.unwatched = unwatched;
            return Err(GpuError::new(WATCH, None, ErrorCode::NotSupported)
                .with_detail(format!("no GPU delivers events: {why}")));
        }
        state.set = Some(set);
        state.unwatched = unwatched;
        state.indexes = indexes;
        Ok(())
    }

    /// Frees `state`'s event set, if any.
    fn drop_set(&self, state: &mut EventState) {
        if let Some(set) = state.set.take() {
            self.free_event_set(set);
        }
    }

    /// Registers `set` on `gpu` for what it supports of [`WANTED`], returning the device
    /// handle's address (what an event's `device` is); why not, in words.
    fn register_gpu(&self, set: &SetHandle, gpu: u32) -> Result<usize, String> {
        let device = self.device(WATCH, gpu).map_err(|e| e.to_string())?;
        let lib = self.nvml.lib();
        let supported = nvml_sym(lib.nvmlDeviceGetSupportedEventTypes.as_ref()).map_err(|e| {
            wrapper_error(WATCH, Some(gpu), "nvmlDeviceGetSupportedEventTypes", e).to_string()
        })?;
        let mut bits: std::os::raw::c_ulonglong = 0;
        // SAFETY: `supported` is NVML's nvmlDeviceGetSupportedEventTypes on a handle of this
        // session; it writes one integer through the valid pointer given.
        let ret = unsafe { supported(device_handle(&device), &mut bits) };
        if ret != sys::nvmlReturn_enum_NVML_SUCCESS {
            return Err(
                raw_error(WATCH, Some(gpu), "nvmlDeviceGetSupportedEventTypes", ret).to_string()
            );
        }
        let types = bits & WANTED;
        if types == 0 {
            return Err(format!("GPU {gpu} supports none of the critical events"));
        }
        let register = nvml_sym(lib.nvmlDeviceRegisterEvents.as_ref()).map_err(|e| {
            wrapper_error(WATCH, Some(gpu), "nvmlDeviceRegisterEvents", e).to_string()
        })?;
        let handle = device_handle(&device);
        // SAFETY: `register` is NVML's nvmlDeviceRegisterEvents; the device handle and the
        // set both come from this initialized session (the set is not freed while the
        // events mutex is held, which the caller holds).
        let ret = unsafe { register(handle, types, set.0) };
        if ret != sys::nvmlReturn_enum_NVML_SUCCESS {
            return Err(raw_error(WATCH, Some(gpu), "nvmlDeviceRegisterEvents", ret).to_string());
        }
        Ok(handle as usize)
    }

    /// One wait on `set`, up to `timeout`.
    fn wait(
        &self,
        set: nvmlEventSet_t,
        timeout: Duration,
        indexes: &[(usize, u32)],
    ) -> Result<Waited, GpuError> {
        let lib = self.nvml.lib();
        let wait = nvml_sym(lib.nvmlEventSetWait_v2.as_ref())
            .map_err(|e| wrapper_error(WATCH, None, "nvmlEventSetWait_v2", e))?;
        let millis = c_uint::try_from(timeout.as_millis()).unwrap_or(c_uint::MAX);
        // SAFETY: nvmlEventData_t is a C struct of a pointer and integers: all-zero bytes
        // are a valid value.
        let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
        // SAFETY: `wait` is NVML's nvmlEventSetWait_v2; `set` is a live set of this session
        // (the caller holds the events mutex, under which alone it is freed), `data` a
        // valid struct NVML fills in.
        let ret = unsafe { wait(set, &mut data, millis) };
        match ret {
            sys::nvmlReturn_enum_NVML_SUCCESS => Ok(Waited::Event(self.event_of(&data, indexes)?)),
            sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT => Ok(Waited::Nothing),
            ret => Err(raw_error(WATCH, None, "nvmlEventSetWait_v2", ret)),
        }
    }

    /// The event `data` describes, its GPU by NVML index: the index its handle was
    /// registered with (a lost GPU's handle answers no `nvmlDeviceGetIndex`), else the
    /// driver's answer.
    fn event_of(
        &self,
        data: &nvmlEventData_t,
        indexes: &[(usize, u32)],
    ) -> Result<GpuEvent, GpuError> {
        let registered = indexes.iter().find(|(h, _)| *h == data.device as usize).map(|(_, i)| *i);
        let gpu = match registered {
            Some(gpu) => gpu,
            None => self.index_of(data.device)?,
        };
        let kind = event_kind(data);
        let id = |v: c_uint| (v != WHOLE_GPU).then_some(v);
        Ok(GpuEvent {
            gpu,
            kind,
            gpu_instance: id(data.gpuInstanceId),
            compute_instance: id(data.computeInstanceId),
        })
    }

    /// `nvmlDeviceGetIndex` of a device handle NVML delivered.
    fn index_of(&self, device: sys::nvmlDevice_t) -> Result<u32, GpuError> {
        let lib = self.nvml.lib();
        let index = nvml_sym(lib.nvmlDeviceGetIndex.as_ref())
            .map_err(|e| wrapper_error(WATCH, None, "nvmlDeviceGetIndex", e))?;
        let mut gpu: c_uint = 0;
        // SAFETY: `index` is NVML's nvmlDeviceGetIndex; the device handle is the one NVML
        // put in the event it just delivered on this session.
        let ret = unsafe { index(device, &mut gpu) };
        if ret != sys::nvmlReturn_enum_NVML_SUCCESS {
            return Err(raw_error(WATCH, None, "nvmlDeviceGetIndex", ret));
        }
        Ok(gpu)
    }

    /// Frees a set made by this session.
    fn free_event_set(&self, set: SetHandle) {
        let lib = self.nvml.lib();
        if let Ok(free) = nvml_sym(lib.nvmlEventSetFree.as_ref()) {
            // SAFETY: `free` is NVML's nvmlEventSetFree; the set was made by this session
            // and is used no more (it is moved in here).
            let _ = unsafe { free(set.0) };
        }
    }

    /// The GPU's health readings, each on its own; the GPU lost when a read says so.
    fn health_reading(&self, gpu: u32) -> Result<HealthReading, GpuError> {
        let device = self.device(HEALTH, gpu)?;
        let mut reading = HealthReading::default();
        let mut any_lost = false;
        match self.remapped_rows(&device) {
            Ok((pending, failure)) => {
                reading.row_remap_pending = Some(pending);
                reading.row_remap_failure = Some(failure);
            }
            Err(e) => any_lost |= reading_lost(&e),
        }
        match device.are_pages_pending_retired() {
            Ok(pending) => reading.retired_pages_pending = Some(pending),
            Err(e) => any_lost |= reading_lost(&e),
        }
        match device.field_values_for(&[FieldId(RECOVERY_ACTION_FIELD)]) {
            Ok(samples) => {
                reading.recovery_action = samples.into_iter().next().and_then(field_u64);
            }
            Err(e) => any_lost |= reading_lost(&e),
        }
        // A GPU off the bus answers every read so; one read is asked for sure.
        if let Err(e) = device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
            any_lost |= reading_lost(&e);
        }
        reading.lost = any_lost;
        Ok(reading)
    }

    /// `nvmlDeviceGetRemappedRows`: (pending, failure occurred).
    fn remapped_rows(&self, device: &nvml_wrapper::Device<'_>) -> Result<(bool, bool), NvmlError> {
        let rows = nvml_sym(self.nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
        let (mut corr, mut unc, mut pending, mut failure): (c_uint, c_uint, c_uint, c_uint) =
            (0, 0, 0, 0);
        // SAFETY: `rows` is NVML's nvmlDeviceGetRemappedRows on a handle of this session;
        // it writes four unsigned ints through the valid pointers given.
        let ret =
            unsafe { rows(device_handle(device), &mut corr, &mut unc, &mut pending, &mut failure) };
        nvml_try(ret)?;
        Ok((pending != 0, failure != 0))
    }
}

/// Whether an error of a read says the GPU is lost.
fn reading_lost(e: &NvmlError) -> bool {
    matches!(e, NvmlError::GpuLost)
}

/// A field sample's value as an integer, when it has one.
fn field_u64(sample: Result<FieldValueSample, NvmlError>) -> Option<u64> {
    use nvml_wrapper::enums::device::SampleValue;
    match sample.ok()?.value.ok()? {
        SampleValue::U32(v) => Some(u64::from(v)),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::F64(_) => None,
    }
}

/// What kind of event `data` is.
fn event_kind(data: &nvmlEventData_t) -> GpuEventKind {
    match u32::try_from(data.eventType).unwrap_or(0) {
        sys::nvmlEventTypeXidCriticalError => GpuEventKind::Xid(data.eventData),
        sys::nvmlEventTypeDoubleBitEccError => GpuEventKind::DoubleBitEcc,
        sys::nvmlEventTypeSingleBitEccError => GpuEventKind::SingleBitEcc,
        sys::nvmlEventTypeGpuUnavailableError => GpuEventKind::GpuUnavailable,
        sys::nvmlEventTypeGpuRecoveryAction => GpuEventKind::RecoveryAction(data.eventData),
        _ => GpuEventKind::Other { event_type: data.eventType, data: data.eventData },
    }
}
