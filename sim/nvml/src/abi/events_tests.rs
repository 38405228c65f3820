//! Tests of [`super::events`] and [`super::health`] (issue 42): events raised in the node
//! (as `gpushare-sim-fault` raises them) delivered to event sets in order, per set, with
//! MIG ids; timeouts; a lost GPU; the polled answers and field 230. Called in-process as
//! C would call them, on the shared [`super::tests::Sim`].

use std::os::raw::c_uint;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use super::device_info::*;
use super::events::*;
use super::exports::*;
use super::health::*;
use super::tests::{Sim, dev};
use super::types::*;
use crate::health::{
    EVENT_DBE, EVENT_GPU_UNAVAILABLE, EVENT_SBE, EVENT_XID, RecoveryAction, SUPPORTED_EVENTS,
    WHOLE_GPU,
};

/// Calls exported functions (unsafe extern "C") from the tests.
macro_rules! nv {
    ($e:expr) => {{
        // SAFETY: the tests pass live locals, null where they test that, and buffers of
        // the sizes they state, as nvml.h asks of callers; handles are the library's own.
        unsafe { $e }
    }};
}

fn new_set() -> nvmlEventSet_t {
    let mut set = null_mut();
    assert_eq!(nv!(nvmlEventSetCreate(&mut set)), ret::SUCCESS);
    set
}

fn wait(set: nvmlEventSet_t, ms: c_uint) -> Result<(u32, u64, u64, u32, u32), nvmlReturn_t> {
    let mut d = nvmlEventData_t {
        device: null_mut(),
        eventType: 0,
        eventData: 0,
        gpuInstanceId: 7,
        computeInstanceId: 7,
    };
    match nv!(nvmlEventSetWait_v2(set, &mut d, ms)) {
        ret::SUCCESS => {
            let mut index = 99;
            assert_eq!(nv!(nvmlDeviceGetIndex(d.device, &mut index)), ret::SUCCESS);
            Ok((index, d.eventType, d.eventData, d.gpuInstanceId, d.computeInstanceId))
        }
        code => Err(code),
    }
}

fn raise(sim: &Sim, gpu: u32, event_type: u64, data: u64, instance: Option<(u32, u32)>) {
    sim.file().update(|n| n.events.raise(gpu, event_type, data, instance)).unwrap();
}

#[test]
fn sets_see_events_raised_after_registration_in_order_each_its_own() {
    let sim = Sim::new("h100-80gb:3", &[]);
    raise(&sim, 0, EVENT_XID, 31, None);
    let (a, b) = (new_set(), new_set());
    let critical = EVENT_XID | EVENT_DBE | EVENT_SBE;
    for i in 0..3 {
        assert_eq!(nv!(nvmlDeviceRegisterEvents(dev(i), critical, a)), ret::SUCCESS);
    }
    assert_eq!(nv!(nvmlDeviceRegisterEvents(dev(1), EVENT_XID, b)), ret::SUCCESS);
    assert_eq!(wait(a, 0), Err(ret::TIMEOUT), "the Xid before the registration is not seen");
    raise(&sim, 2, EVENT_XID, 79, None);
    raise(&sim, 1, EVENT_DBE, 0, None);
    raise(&sim, 1, EVENT_XID, 48, None);
    raise(&sim, 0, EVENT_GPU_UNAVAILABLE, 0, None); // not registered
    let whole = (WHOLE_GPU, WHOLE_GPU);
    assert_eq!(wait(a, 0), Ok((2, EVENT_XID, 79, whole.0, whole.1)));
    assert_eq!(wait(a, 0), Ok((1, EVENT_DBE, 0, whole.0, whole.1)));
    assert_eq!(wait(b, 0), Ok((1, EVENT_XID, 48, whole.0, whole.1)), "b only wants GPU 1's Xids");
    assert_eq!(wait(a, 0), Ok((1, EVENT_XID, 48, whole.0, whole.1)));
    assert_eq!(wait(a, 0), Err(ret::TIMEOUT));
    assert_eq!(wait(b, 0), Err(ret::TIMEOUT));
    // v1 delivers the same events without the instance ids.
    raise(&sim, 0, EVENT_SBE, 0, None);
    let mut v1 = nvmlEventData_v1_t { device: null_mut(), eventType: 0, eventData: 0 };
    assert_eq!(nv!(nvmlEventSetWait(a, &mut v1, 0)), ret::SUCCESS);
    assert_eq!((v1.device, v1.eventType), (dev(0), EVENT_SBE));
    assert_eq!(nv!(nvmlEventSetWait(a, null_mut(), 0)), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlEventSetFree(a)), ret::SUCCESS);
    assert_eq!(wait(a, 0), Err(ret::INVALID_ARGUMENT), "a freed set");
    assert_eq!(nv!(nvmlEventSetFree(a)), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlEventSetCreate(null_mut())), ret::INVALID_ARGUMENT);
    // Sets die with the library.
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
    assert_eq!(wait(b, 0), Err(ret::UNINITIALIZED));
    assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
    assert_eq!(wait(b, 0), Err(ret::INVALID_ARGUMENT));
}

#[test]
fn a_wait_blocks_until_an_event_or_its_timeout() {
    let sim = Sim::new("a100-40gb:2", &[]);
    let set = new_set();
    assert_eq!(nv!(nvmlDeviceRegisterEvents(dev(1), EVENT_XID, set)), ret::SUCCESS);
    let started = Instant::now();
    assert_eq!(wait(set, 120), Err(ret::TIMEOUT));
    assert!(started.elapsed() >= Duration::from_millis(120), "waited its timeout");
    let file = sim.file();
    // Another process (a thread here, the lock released while waiting) raises meanwhile.
    let raiser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        file.update(|n| n.events.raise(1, EVENT_XID, 94, None)).unwrap();
    });
    let started = Instant::now();
    assert_eq!(wait(set, 60_000), Ok((1, EVENT_XID, 94, WHOLE_GPU, WHOLE_GPU)));
    let waited = started.elapsed();
    raiser.join().unwrap();
    assert!(waited < Duration::from_secs(60), "woken by the event, not the timeout");
    // Other calls go on while a thread waits.
    let set_bits = set as usize;
    let waiter = std::thread::spawn(move || wait(set_bits as nvmlEventSet_t, 300));
    std::thread::sleep(Duration::from_millis(50));
    let mut count = 0;
    assert_eq!(nv!(nvmlDeviceGetCount_v2(&mut count)), ret::SUCCESS);
    assert_eq!(waiter.join().unwrap(), Err(ret::TIMEOUT));
}

#[test]
fn mig_events_carry_their_instance_ids_and_registration_takes_the_gpu() {
    let sim = Sim::new("h100-80gb:2", &[]);
    let gi = sim
        .file()
        .update(|n| {
            n.gpus[1].mig_enabled = true;
            let gi = crate::rules::create_gpu_instance(n, 1, 19, 0, 1).unwrap();
            crate::rules::create_compute_instance(n, 1, gi, 0).unwrap();
            gi
        })
        .unwrap();
    let set = new_set();
    let mut mig = null_mut();
    assert_eq!(nv!(nvmlDeviceGetMigDeviceHandleByIndex(dev(1), 0, &mut mig)), ret::SUCCESS);
    assert_eq!(nv!(nvmlDeviceRegisterEvents(mig, EVENT_XID, set)), ret::NOT_SUPPORTED);
    let mut types = 0;
    assert_eq!(nv!(nvmlDeviceGetSupportedEventTypes(mig, &mut types)), ret::NOT_SUPPORTED);
    assert_eq!(nv!(nvmlDeviceGetSupportedEventTypes(dev(1), &mut types)), ret::SUCCESS);
    assert_eq!(types, SUPPORTED_EVENTS);
    // Unknown types register nothing.
    assert_eq!(nv!(nvmlDeviceRegisterEvents(dev(1), EVENT_XID | 1 << 40, set)), ret::NOT_SUPPORTED);
    raise(&sim, 1, EVENT_XID, 13, None);
    assert_eq!(wait(set, 0), Err(ret::TIMEOUT));
    assert_eq!(nv!(nvmlDeviceRegisterEvents(dev(1), EVENT_XID, null_mut())), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlDeviceRegisterEvents(dev(1), EVENT_XID, set)), ret::SUCCESS);
    raise(&sim, 1, EVENT_XID, 43, Some((gi, 0)));
    raise(&sim, 1, EVENT_XID, 48, None);
    assert_eq!(wait(set, 0), Ok((1, EVENT_XID, 43, gi, 0)));
    assert_eq!(wait(set, 0), Ok((1, EVENT_XID, 48, WHOLE_GPU, WHOLE_GPU)));
    // Row remapping is not asked on a MIG GPU with instances (nvml.h).
    let (mut c, mut u, mut p, mut f) = (0, 0, 0, 0);
    let mut rows = |d| nv!(nvmlDeviceGetRemappedRows(d, &mut c, &mut u, &mut p, &mut f));
    assert_eq!(rows(dev(1)), ret::NOT_SUPPORTED);
    assert_eq!(rows(dev(0)), ret::SUCCESS);
}

#[test]
fn a_lost_gpu_answers_gpu_is_lost_and_the_others_answer() {
    let sim = Sim::new("h100-80gb:2", &[]);
    let (d0, d1) = (dev(0), dev(1));
    let set = new_set();
    assert_eq!(nv!(nvmlDeviceRegisterEvents(d1, EVENT_XID | EVENT_GPU_UNAVAILABLE, set)), 0);
    sim.file().update(|n| n.gpus[1].health.lost = true).unwrap();
    raise(&sim, 1, EVENT_GPU_UNAVAILABLE, 0, None);
    let mut index = 9;
    assert_eq!(nv!(nvmlDeviceGetIndex(d1, &mut index)), ret::GPU_IS_LOST);
    assert_eq!(nv!(nvmlDeviceGetIndex(d0, &mut index)), ret::SUCCESS);
    let mut h = null_mut();
    assert_eq!(nv!(nvmlDeviceGetHandleByIndex_v2(1, &mut h)), ret::GPU_IS_LOST);
    assert_eq!(nv!(nvmlDeviceGetHandleByIndex(1, &mut h)), ret::GPU_IS_LOST);
    let node = sim.file().read().unwrap();
    let uuid = std::ffi::CString::new(node.gpus[1].uuid.clone()).unwrap();
    let bus = std::ffi::CString::new(node.gpus[1].pci_bus_id.clone()).unwrap();
    assert_eq!(nv!(nvmlDeviceGetHandleByUUID(uuid.as_ptr(), &mut h)), ret::GPU_IS_LOST);
    assert_eq!(nv!(nvmlDeviceGetHandleByPciBusId_v2(bus.as_ptr(), &mut h)), ret::GPU_IS_LOST);
    let bus0 = std::ffi::CString::new(node.gpus[0].pci_bus_id.clone()).unwrap();
    assert_eq!(nv!(nvmlDeviceGetHandleByPciBusId_v2(bus0.as_ptr(), &mut h)), ret::SUCCESS);
    let mut count = 0;
    assert_eq!(nv!(nvmlDeviceGetCount_v2(&mut count)), ret::SUCCESS);
    assert_eq!(count, 2, "a lost GPU is still counted");
    let mut types = 0;
    assert_eq!(nv!(nvmlDeviceGetSupportedEventTypes(d1, &mut types)), ret::GPU_IS_LOST);
    assert_eq!(nv!(nvmlDeviceRegisterEvents(d1, EVENT_XID, set)), ret::GPU_IS_LOST);
    // The set still delivers the lost GPU's unavailable event (its device answers lost).
    let mut d = nvmlEventData_t {
        device: null_mut(),
        eventType: 0,
        eventData: 0,
        gpuInstanceId: 0,
        computeInstanceId: 0,
    };
    assert_eq!(nv!(nvmlEventSetWait_v2(set, &mut d, 0)), ret::SUCCESS);
    assert_eq!((d.device, d.eventType), (d1, EVENT_GPU_UNAVAILABLE));
    let mut value = nvmlFieldValue_t {
        fieldId: FI_GPU_RECOVERY_ACTION,
        scopeId: 0,
        timestamp: 0,
        latencyUsec: 0,
        valueType: 0,
        nvmlReturn: 0,
        value: 0,
    };
    assert_eq!(nv!(nvmlDeviceGetFieldValues(d1, 1, &mut value)), ret::GPU_IS_LOST);
    assert_eq!(nv!(nvmlDeviceGetFieldValues(d0, 1, &mut value)), ret::SUCCESS);
    // A reboot brings it back.
    sim.file().update(|n| n.reboot()).unwrap();
    assert_eq!(nv!(nvmlDeviceGetIndex(d1, &mut index)), ret::SUCCESS);
}

fn fields(d: nvmlDevice_t, ids: &[c_uint]) -> Vec<(nvmlReturn_t, c_uint, u64)> {
    let mut values: Vec<nvmlFieldValue_t> = ids
        .iter()
        .map(|&id| nvmlFieldValue_t {
            fieldId: id,
            scopeId: 0,
            timestamp: 0,
            latencyUsec: 0,
            valueType: 99,
            nvmlReturn: 99,
            value: 0,
        })
        .collect();
    let n = values.len() as i32;
    assert_eq!(nv!(nvmlDeviceGetFieldValues(d, n, values.as_mut_ptr())), ret::SUCCESS);
    assert!(values.iter().all(|v| v.timestamp > 0));
    values.iter().map(|v| (v.nvmlReturn, v.valueType, v.value)).collect()
}

#[test]
fn the_polled_answers_follow_the_gpus_health() {
    let sim = Sim::new("h100-80gb:1", &[]);
    let d = dev(0);
    let healthy = fields(d, &[230, 142, 143, 144, 145, 3, 6, 1]);
    let (uint, ull) = (NVML_VALUE_TYPE_UNSIGNED_INT, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG);
    // The remapped rows' counts as an H100 typed them (health-h100-2026-12-07).
    assert_eq!(
        &healthy[..5],
        &[
            (ret::SUCCESS, uint, 0),
            (ret::SUCCESS, ull, 0),
            (ret::SUCCESS, ull, 0),
            (ret::SUCCESS, uint, 0),
            (ret::SUCCESS, uint, 0)
        ]
    );
    assert_eq!(healthy[6], (ret::SUCCESS, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 0));
    assert_eq!(healthy[7].0, ret::NOT_SUPPORTED, "a field not modelled");
    sim.file()
        .update(|n| {
            let h = &mut n.gpus[0].health;
            h.recovery_action = RecoveryAction::DrainAndReset;
            h.remap.uncorrectable = 1;
            h.remap.pending = true;
            h.ecc.uncorrected_volatile = 2;
            h.ecc.uncorrected_aggregate = 3;
        })
        .unwrap();
    let sick = fields(d, &[230, 143, 144, 145, 4, 6]);
    let values: Vec<u64> = sick.iter().map(|f| f.2).collect();
    assert_eq!(values, [4, 1, 1, 0, 2, 3]);
    let (mut c, mut u, mut p, mut f) = (9, 9, 9, 9);
    assert_eq!(nv!(nvmlDeviceGetRemappedRows(d, &mut c, &mut u, &mut p, &mut f)), ret::SUCCESS);
    assert_eq!((c, u, p, f), (0, 1, 1, 0));
    let mut h = nvmlRowRemapperHistogramValues_t::default();
    assert_eq!(nv!(nvmlDeviceGetRowRemapperHistogram(d, &mut h)), ret::SUCCESS);
    assert_eq!((h.max, h.high), (2559, 1));
    let mut n = 0;
    assert_eq!(nv!(nvmlDeviceGetTotalEccErrors(d, 1, 0, &mut n)), ret::SUCCESS);
    assert_eq!(n, 2);
    assert_eq!(nv!(nvmlDeviceGetTotalEccErrors(d, 1, 1, &mut n)), ret::SUCCESS);
    assert_eq!(n, 3);
    assert_eq!(nv!(nvmlDeviceGetTotalEccErrors(d, 2, 1, &mut n)), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlDeviceGetMemoryErrorCounter(d, 1, 1, 8, &mut n)), ret::SUCCESS);
    assert_eq!(n, 3);
    assert_eq!(nv!(nvmlDeviceGetMemoryErrorCounter(d, 1, 1, 7, &mut n)), ret::SUCCESS);
    assert_eq!(n, 0);
    assert_eq!(nv!(nvmlDeviceGetMemoryErrorCounter(d, 1, 1, 0, &mut n)), ret::NOT_SUPPORTED);
    let (mut cur, mut pend) = (0, 0);
    assert_eq!(nv!(nvmlDeviceGetEccMode(d, &mut cur, &mut pend)), ret::SUCCESS);
    assert_eq!((cur, pend), (NVML_FEATURE_ENABLED, NVML_FEATURE_ENABLED));
    let mut count = 0;
    let retired = nv!(nvmlDeviceGetRetiredPages(d, 1, &mut count, null_mut()));
    assert_eq!(retired, ret::NOT_SUPPORTED, "Hopper remaps rows instead");
    assert_eq!(nv!(nvmlDeviceGetRetiredPagesPendingStatus(d, &mut count)), ret::NOT_SUPPORTED);
    // A reset settles the remap, the volatile counts and the action.
    sim.file()
        .update(|n| {
            n.gpus[0].persistence_mode = false;
            n.reset_gpu(0).unwrap();
        })
        .unwrap();
    let after = fields(d, &[230, 143, 144, 4, 6]);
    let values: Vec<u64> = after.iter().map(|f| f.2).collect();
    assert_eq!(values, [0, 1, 0, 0, 3]);
}
