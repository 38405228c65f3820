//! The event API (issue 42): `nvmlEventSetCreate`, `nvmlDeviceRegisterEvents`,
//! `nvmlDeviceGetSupportedEventTypes`, `nvmlEventSetWait_v2`, `nvmlEventSetWait` (v1) and
//! `nvmlEventSetFree`, over the node's log of raised events
//! ([`crate::health::EventLog`], raised by `gpushare-sim-fault`).
//!
//! An event set lives in this process (the library's state, gone at the last
//! `nvmlShutdown` as handles are); its handle is a tagged integer like a device's (kind 5,
//! the init epoch, the set's id). Every process reads the same log, so each client's sets
//! (the agent's, a pynvml script's) see every event. A set remembers the last event it
//! passed ([`EventSet::seen`]); a registration sees only the events raised on its GPU after
//! it (nvml.h: "All events that occurred before this call are not recorded"), and a set
//! delivers them in the order they were raised, whole-GPU events with instance ids
//! 0xFFFFFFFF, an instance's with its GPU- and compute-instance ids, the device being the
//! GPU's handle.
//!
//! A wait looks at the log when the node's generation moved, else sleeps [`POLL`] at a
//! time without the library's lock (other threads' calls go on): an idle one-second wait
//! costs 20 wake-ups that each read one mapped counter.
//!
//! Registration takes a whole GPU's handle: a MIG device's answers NOT_SUPPORTED, as
//! nvml.h says the API does not support per-instance registration; types outside
//! [`SUPPORTED_EVENTS`] answer NOT_SUPPORTED and register nothing (nvml.h: "None of the
//! requested eventTypes are registered in that case"). A GPU off the bus answers
//! GPU_IS_LOST to both; a wait goes on delivering the other GPUs' events (and the lost
//! GPU's `GpuUnavailableError`). Privileges are not modelled: every caller gets the
//! instances' events.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::os::raw::{c_uint, c_ulonglong};
use std::time::{Duration, Instant};

use super::handles;
use super::shared::{out, whole_gpu};
use super::types::*;
use super::{Lib, code, guarded, lib, read};
use crate::codes::Code;
use crate::health::{Event, SUPPORTED_EVENTS};

/// How long a wait sleeps between looks at the node's generation.
pub const POLL: Duration = Duration::from_millis(50);

const SET_KIND: u64 = 5;
const KIND_SHIFT: u32 = 56;
const EPOCH_SHIFT: u32 = 40;

/// One event set of this process.
#[derive(Debug, Default, Clone)]
pub(super) struct EventSet {
    /// What was registered on it, in order.
    registrations: Vec<Registration>,
    /// The sequence number of the last event it delivered or passed over.
    seen: u64,
}

#[derive(Debug, Clone, Copy)]
struct Registration {
    gpu: u32,
    mask: u64,
    /// The log's last sequence number when it was registered.
    since: u64,
}

impl EventSet {
    fn wants(&self, e: &Event) -> bool {
        self.registrations
            .iter()
            .any(|r| r.gpu == e.gpu && r.mask & e.event_type != 0 && e.seq > r.since)
    }
}

fn encode(epoch: u32, id: u32) -> nvmlEventSet_t {
    let v = SET_KIND << KIND_SHIFT | u64::from(epoch & 0xFFFF) << EPOCH_SHIFT | u64::from(id);
    v as usize as nvmlEventSet_t
}

/// The id of a live set of this process: INVALID_ARGUMENT for anything else.
fn set_id(lib: &Lib, set: nvmlEventSet_t) -> Result<u32, Code> {
    let v = set as usize as u64;
    let epoch = (v >> EPOCH_SHIFT) & 0xFFFF;
    let id = (v & 0xFFFF_FFFF) as u32;
    let ours = v >> KIND_SHIFT == SET_KIND && epoch == u64::from(lib.epoch & 0xFFFF);
    if ours && lib.event_sets.contains_key(&id) { Ok(id) } else { Err(ret::INVALID_ARGUMENT) }
}

/// A call on the library's state (the sets), after the checks every call makes.
fn locked(name: &'static str, f: impl FnOnce(&mut Lib) -> Result<(), Code>) -> nvmlReturn_t {
    guarded(|| {
        let mut lib = lib();
        if let Err(c) = lib.enter(name) {
            return c;
        }
        code(f(&mut lib))
    })
}

/// `nvmlEventSetCreate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    locked("nvmlEventSetCreate", |lib| {
        // SAFETY: null or a writable nvmlEventSet_t (nvml.h).
        let set = unsafe { out(set) }?;
        lib.last_event_set = lib.last_event_set.wrapping_add(1).max(1);
        let id = lib.last_event_set;
        lib.event_sets.insert(id, EventSet::default());
        *set = encode(lib.epoch, id);
        Ok(())
    })
}

/// `nvmlEventSetFree`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    locked("nvmlEventSetFree", |lib| {
        let id = set_id(lib, set)?;
        lib.event_sets.remove(&id);
        Ok(())
    })
}

/// `nvmlDeviceRegisterEvents`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    eventTypes: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    locked("nvmlDeviceRegisterEvents", |lib| {
        let id = set_id(lib, set)?;
        let epoch = lib.epoch;
        let node = lib.refresh()?;
        let gpu = whole_gpu(node, epoch, device)?;
        if eventTypes & !SUPPORTED_EVENTS != 0 {
            return Err(ret::NOT_SUPPORTED);
        }
        let since = node.events.last_seq;
        if eventTypes != 0 {
            let set = lib.event_sets.get_mut(&id).ok_or(ret::INVALID_ARGUMENT)?;
            set.registrations.push(Registration { gpu, mask: eventTypes, since });
        }
        Ok(())
    })
}

/// `nvmlDeviceGetSupportedEventTypes`: [`SUPPORTED_EVENTS`] on a GPU; NOT_SUPPORTED on a
/// MIG device (registration takes the GPU's handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    eventTypes: *mut c_ulonglong,
) -> nvmlReturn_t {
    read("nvmlDeviceGetSupportedEventTypes", |node, epoch| {
        // SAFETY: null or a writable unsigned long long (nvml.h).
        let types = unsafe { out(eventTypes) }?;
        whole_gpu(node, epoch, device)?;
        *types = SUPPORTED_EVENTS;
        Ok(())
    })
}

/// One look at the log, under the library's lock: the next event of `set` and its GPU's
/// handle, or None when there is none yet or the node's generation has not moved since
/// `looked_at`. The first look of a call makes the checks every call makes; a later one
/// answers UNINITIALIZED once the library was shut down meanwhile.
fn next_event(
    name: &'static str,
    set: nvmlEventSet_t,
    first: bool,
    looked_at: &mut Option<u64>,
) -> Result<Option<(Event, nvmlDevice_t)>, Code> {
    let mut lib = lib();
    if first {
        lib.enter(name)?;
    } else if lib.refcount == 0 {
        return Err(ret::UNINITIALIZED);
    }
    let id = set_id(&lib, set)?;
    let generation = lib.file()?.1.current();
    if *looked_at == Some(generation) {
        return Ok(None);
    }
    *looked_at = Some(generation);
    let epoch = lib.epoch;
    // The set's registrations (a few), so that the node can be read from the same lock.
    let es = lib.event_sets.get(&id).ok_or(ret::INVALID_ARGUMENT)?.clone();
    let log = &lib.node_at(generation)?.events;
    let next = log.after(es.seen).find(|e| es.wants(e)).copied();
    // None of the events passed over will ever be wanted: later registrations see only
    // later events.
    let seen = next.map_or(es.seen.max(log.last_seq), |e| e.seq);
    lib.event_sets.get_mut(&id).ok_or(ret::INVALID_ARGUMENT)?.seen = seen;
    Ok(next.map(|e| (e, handles::gpu(epoch, e.gpu))))
}

/// Waits up to `timeoutms` for the next event of `set`, handing it to `deliver` with the
/// GPU's handle; TIMEOUT when none came.
fn wait(
    name: &'static str,
    set: nvmlEventSet_t,
    timeoutms: c_uint,
    deliver: impl FnOnce(&Event, nvmlDevice_t) -> Result<(), Code>,
) -> nvmlReturn_t {
    guarded(|| {
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeoutms));
        let mut looked_at: Option<u64> = None;
        let mut first = true;
        loop {
            match next_event(name, set, first, &mut looked_at) {
                Ok(Some((e, device))) => return code(deliver(&e, device)),
                Ok(None) => first = false,
                Err(c) => return c,
            }
            let now = Instant::now();
            if now >= deadline {
                return ret::TIMEOUT;
            }
            std::thread::sleep(POLL.min(deadline - now));
        }
    })
}

/// Waits as [`wait`] does and writes the event into `data` as `fill` makes it; a null
/// `data` answers INVALID_ARGUMENT after the checks every call makes.
///
/// # Safety
/// `data` is null or valid for writes of a `T` for the call.
unsafe fn wait_into<T>(
    name: &'static str,
    set: nvmlEventSet_t,
    data: *mut T,
    timeoutms: c_uint,
    fill: impl FnOnce(&Event, nvmlDevice_t) -> T,
) -> nvmlReturn_t {
    if data.is_null() {
        return guarded(|| {
            let mut lib = lib();
            code(lib.enter(name).and(Err(ret::INVALID_ARGUMENT)))
        });
    }
    wait(name, set, timeoutms, |e, device| {
        // SAFETY: null or writable (the caller's contract), and not null (checked above).
        let data = unsafe { out(data) }?;
        *data = fill(e, device);
        Ok(())
    })
}

/// `nvmlEventSetWait_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    // SAFETY: null or a writable nvmlEventData_t (nvml.h).
    unsafe {
        wait_into("nvmlEventSetWait_v2", set, data, timeoutms, |e, device| nvmlEventData_t {
            device,
            eventType: e.event_type,
            eventData: e.event_data,
            gpuInstanceId: e.gpu_instance,
            computeInstanceId: e.compute_instance,
        })
    }
}

/// `nvmlEventSetWait` (v1): the event without its instance ids, in NVML 10's layout.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_v1_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    // SAFETY: null or a writable NVML 10 nvmlEventData_t (nvml.h).
    unsafe {
        wait_into("nvmlEventSetWait", set, data, timeoutms, |e, device| nvmlEventData_v1_t {
            device,
            eventType: e.event_type,
            eventData: e.event_data,
        })
    }
}
