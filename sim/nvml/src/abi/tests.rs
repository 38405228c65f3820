//! The exported functions called in-process, as C would call them. Tests share the
//! library's process-wide state and the environment, so each takes [`Sim`] (a global
//! mutex, its own state file, a fresh "process").

use std::ffi::{CStr, c_void};
use std::os::raw::{c_char, c_uint};
use std::ptr::{null, null_mut};
use std::sync::{Mutex, MutexGuard};

use super::device_info::*;
use super::exports::*;
use super::instances::*;
use super::mig::*;
use super::processes::*;
use super::types::*;
use crate::node::Process;
use crate::state_file::NodeFile;

/// Calls exported functions (unsafe extern "C") from the tests.
macro_rules! nv {
    ($e:expr) => {{
        // SAFETY: the tests pass live locals, null where they test that, and buffers of
        // the sizes they state, as nvml.h asks of callers; handles are the library's own.
        unsafe { $e }
    }};
}

static SERIAL: Mutex<()> = Mutex::new(());

const KNOBS: &[&str] = &[
    "GPUSHARE_SIM_NODE",
    "GPUSHARE_SIM_STATE",
    "GPUSHARE_SIM_FAIL",
    "GPUSHARE_SIM_DELAY_MS",
    "GPUSHARE_SIM_PROCESSES",
    "GPUSHARE_SIM_REBOOT",
    "GPUSHARE_SIM_HOST",
    // Not a knob: what gpushare-agent declares (a test run from inside an agent has it).
    "GPUSHARE_AGENT_DRIVER",
];

/// One test's simulated process: the global lock, a temp dir, the environment set.
pub(super) struct Sim {
    dir: tempfile::TempDir,
    _serial: MutexGuard<'static, ()>,
}

impl Sim {
    /// A fresh process with `GPUSHARE_SIM_NODE=spec` and `env`; not initialized.
    fn process(spec: &str, env: &[(&str, &str)]) -> Sim {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        super::reset_process_for_tests();
        let dir = tempfile::tempdir().unwrap();
        for k in KNOBS {
            // SAFETY: environment changes happen only under SERIAL, and no test reads the
            // environment outside it.
            unsafe { std::env::remove_var(k) };
        }
        let state = dir.path().join("node.json");
        let mut all =
            vec![("GPUSHARE_SIM_NODE", spec), ("GPUSHARE_SIM_STATE", state.to_str().unwrap())];
        all.extend_from_slice(env);
        for (k, v) in all {
            // SAFETY: as above.
            unsafe { std::env::set_var(k, v) };
        }
        Sim { dir, _serial: serial }
    }

    /// A fresh process, initialized.
    pub(super) fn new(spec: &str, env: &[(&str, &str)]) -> Sim {
        let sim = Sim::process(spec, env);
        assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS, "{}", last_error());
        sim
    }

    pub(super) fn file(&self) -> NodeFile {
        NodeFile::new(self.dir.path().join("node.json"))
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        super::reset_process_for_tests();
    }
}

fn last_error() -> String {
    let mut buf = [0 as c_char; 512];
    assert_eq!(nv!(gpushare_sim_last_error(buf.as_mut_ptr(), 512)), ret::SUCCESS);
    nv!(CStr::from_ptr(buf.as_ptr())).to_string_lossy().into_owned()
}

pub(super) fn dev(i: u32) -> nvmlDevice_t {
    let mut d = null_mut();
    assert_eq!(nv!(nvmlDeviceGetHandleByIndex_v2(i, &mut d)), ret::SUCCESS);
    d
}

fn text(f: impl FnOnce(*mut c_char, c_uint) -> nvmlReturn_t) -> Result<String, nvmlReturn_t> {
    let mut buf = [0 as c_char; 96];
    match f(buf.as_mut_ptr(), 96) {
        ret::SUCCESS => Ok(nv!(CStr::from_ptr(buf.as_ptr())).to_string_lossy().into_owned()),
        code => Err(code),
    }
}

fn uuid(d: nvmlDevice_t) -> String {
    text(|b, n| nv!(nvmlDeviceGetUUID(d, b, n))).unwrap()
}

fn mig_mode(d: nvmlDevice_t) -> (c_uint, c_uint) {
    let (mut c, mut p) = (9, 9);
    assert_eq!(nv!(nvmlDeviceGetMigMode(d, &mut c, &mut p)), ret::SUCCESS);
    (c, p)
}

pub(super) fn set_mig(d: nvmlDevice_t, mode: c_uint) -> Result<nvmlReturn_t, nvmlReturn_t> {
    let mut status = 12345;
    match nv!(nvmlDeviceSetMigMode(d, mode, &mut status)) {
        ret::SUCCESS => Ok(status),
        code => Err(code),
    }
}

fn create_gi(
    d: nvmlDevice_t,
    profile: u32,
    start: u32,
    size: u32,
) -> Result<nvmlGpuInstance_t, nvmlReturn_t> {
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut gi = null_mut();
    match nv!(nvmlDeviceCreateGpuInstanceWithPlacement(d, profile, &placement, &mut gi)) {
        ret::SUCCESS => Ok(gi),
        code => Err(code),
    }
}

pub(super) fn create_ci(
    gi: nvmlGpuInstance_t,
    profile: u32,
) -> Result<nvmlComputeInstance_t, nvmlReturn_t> {
    let mut ci = null_mut();
    match nv!(nvmlGpuInstanceCreateComputeInstance(gi, profile, &mut ci)) {
        ret::SUCCESS => Ok(ci),
        code => Err(code),
    }
}

fn gi_info(gi: nvmlGpuInstance_t) -> Result<nvmlGpuInstanceInfo_t, nvmlReturn_t> {
    let mut info = nvmlGpuInstanceInfo_t {
        device: null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    };
    match nv!(nvmlGpuInstanceGetInfo(gi, &mut info)) {
        ret::SUCCESS => Ok(info),
        code => Err(code),
    }
}

fn ci_info(ci: nvmlComputeInstance_t) -> Result<nvmlComputeInstanceInfo_t, nvmlReturn_t> {
    let mut info = nvmlComputeInstanceInfo_t {
        device: null_mut(),
        gpuInstance: null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlComputeInstancePlacement_t { start: 0, size: 0 },
    };
    match nv!(nvmlComputeInstanceGetInfo_v2(ci, &mut info)) {
        ret::SUCCESS => Ok(info),
        code => Err(code),
    }
}

fn gi_profile_v2(d: nvmlDevice_t, e: u32) -> Result<nvmlGpuInstanceProfileInfo_v2_t, nvmlReturn_t> {
    // SAFETY: all-zero bytes are a valid value of this integer-only struct.
    // SAFETY: the struct is plain old data; all-zero is a valid value.
    let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    info.version = nvmlGpuInstanceProfileInfo_v2;
    match nv!(nvmlDeviceGetGpuInstanceProfileInfoV(d, e, &mut info)) {
        ret::SUCCESS => Ok(info),
        code => Err(code),
    }
}

fn ci_profile_v2(
    gi: nvmlGpuInstance_t,
    e: u32,
) -> Result<nvmlComputeInstanceProfileInfo_v2_t, nvmlReturn_t> {
    // SAFETY: all-zero bytes are a valid value of this integer-only struct.
    let mut info: nvmlComputeInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    info.version = nvmlComputeInstanceProfileInfo_v2;
    match nv!(nvmlGpuInstanceGetComputeInstanceProfileInfoV(gi, e, 0, &mut info)) {
        ret::SUCCESS => Ok(info),
        code => Err(code),
    }
}

fn name_of(raw: &[c_char]) -> String {
    nv!(CStr::from_ptr(raw.as_ptr())).to_string_lossy().into_owned()
}

fn processes(d: nvmlDevice_t) -> Result<Vec<(u32, u32, u32)>, nvmlReturn_t> {
    let mut n = 0;
    match nv!(nvmlDeviceGetComputeRunningProcesses_v3(d, &mut n, null_mut())) {
        ret::SUCCESS => return Ok(Vec::new()),
        ret::INSUFFICIENT_SIZE => {}
        code => return Err(code),
    }
    let mut buf =
        vec![
            nvmlProcessInfo_t { pid: 0, usedGpuMemory: 0, gpuInstanceId: 0, computeInstanceId: 0 };
            n as usize
        ];
    let mut short = n - 1;
    assert_eq!(
        nv!(nvmlDeviceGetComputeRunningProcesses_v3(d, &mut short, buf.as_mut_ptr())),
        ret::INSUFFICIENT_SIZE
    );
    assert_eq!(short, n);
    match nv!(nvmlDeviceGetComputeRunningProcesses_v3(d, &mut n, buf.as_mut_ptr())) {
        ret::SUCCESS => {}
        code => return Err(code),
    }
    Ok(buf.iter().take(n as usize).map(|p| (p.pid, p.gpuInstanceId, p.computeInstanceId)).collect())
}

#[test]
fn init_and_shutdown_are_refcounted() {
    let _sim = Sim::process("a100-40gb:2", &[]);
    let mut n = 0;
    assert_eq!(nv!(nvmlDeviceGetCount_v2(&mut n)), ret::UNINITIALIZED);
    assert_eq!(nv!(nvmlShutdown()), ret::UNINITIALIZED);
    assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
    assert_eq!(nv!(nvmlInitWithFlags(0)), ret::SUCCESS);
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
    assert_eq!(nv!(nvmlDeviceGetCount_v2(&mut n)), ret::SUCCESS);
    assert_eq!(n, 2);
    assert_eq!(nv!(nvmlDeviceGetCount_v2(null_mut())), ret::INVALID_ARGUMENT);
    let version = text(|b, n| nv!(nvmlSystemGetDriverVersion(b, n))).unwrap();
    assert_eq!(version, "580.159.04");
    let mut small = [0 as c_char; 4];
    assert_eq!(nv!(nvmlSystemGetDriverVersion(small.as_mut_ptr(), 4)), ret::INSUFFICIENT_SIZE);
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
    assert_eq!(nv!(nvmlDeviceGetCount_v2(&mut n)), ret::UNINITIALIZED);
    assert_eq!(nv!(nvmlShutdown()), ret::UNINITIALIZED);
    let mark = nv!(CStr::from_ptr(gpushare_sim_driver())).to_str().unwrap();
    assert_eq!(mark, concat!("gpushare simulated NVML ", env!("CARGO_PKG_VERSION")));
    let msg = nv!(CStr::from_ptr(nvmlErrorString(ret::IN_USE))).to_str().unwrap();
    assert_eq!(msg, "In use by another client");
}

#[test]
fn a_bad_configuration_fails_init_with_a_one_line_reason() {
    let _sim = Sim::process("a100-40gb:1", &[("GPUSHARE_SIM_FAIL", "nvmlDeviceSetMigMode:x")]);
    assert_eq!(nv!(nvmlInit_v2()), ret::UNKNOWN);
    let why = last_error();
    assert!(why.starts_with("GPUSHARE_SIM_FAIL: \"nvmlDeviceSetMigMode:x\""), "{why}");
    assert_eq!(nv!(nvmlShutdown()), ret::UNINITIALIZED);
    let mut tiny = [0 as c_char; 4];
    assert_eq!(nv!(gpushare_sim_last_error(tiny.as_mut_ptr(), 4)), ret::INSUFFICIENT_SIZE);
    assert_eq!(nv!(gpushare_sim_last_error(null_mut(), 4)), ret::INVALID_ARGUMENT);
    drop(_sim);

    let _sim = Sim::process("v100:2", &[]);
    assert_eq!(nv!(nvmlInit_v2()), ret::UNKNOWN);
    assert!(last_error().starts_with("GPUSHARE_SIM_NODE: --simulate: unknown GPU model"));
    // SAFETY: under SERIAL (held by `_sim`).
    unsafe { std::env::remove_var("GPUSHARE_SIM_NODE") };
    assert_eq!(nv!(nvmlInit_v2()), ret::UNKNOWN);
    assert!(last_error().starts_with("GPUSHARE_SIM_NODE is not set"));
    // SAFETY: under SERIAL.
    unsafe { std::env::set_var("GPUSHARE_SIM_NODE", "a100-40gb:1") };
    // SAFETY: under SERIAL.
    unsafe { std::env::set_var("GPUSHARE_SIM_PROCESSES", "3:77") };
    assert_eq!(nv!(nvmlInit_v2()), ret::UNKNOWN);
    assert_eq!(last_error(), "GPUSHARE_SIM_PROCESSES: GPU 3 does not exist (the node has 1)");
    // SAFETY: under SERIAL.
    unsafe { std::env::remove_var("GPUSHARE_SIM_PROCESSES") };
    assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
    assert_eq!(last_error(), "");
}

/// On a GPU in MIG mode every compute process runs in a GPU instance, and only there: a
/// `GPUSHARE_SIM_PROCESSES` entry the real driver could not have fails `nvmlInit`, as any
/// bad knob does, naming the entry; nothing of the session is applied.
#[test]
fn declared_processes_must_fit_the_gpus_mig_mode() {
    let sim = Sim::new("a100-40gb:2", &[]);
    let file = sim.file();
    let d = dev(1);
    assert_eq!(nv!(nvmlDeviceSetPersistenceMode(d, NVML_FEATURE_DISABLED)), ret::SUCCESS);
    assert_eq!(set_mig(d, NVML_DEVICE_MIG_ENABLE), Ok(ret::SUCCESS));
    let mut instance = null_mut();
    assert_eq!(nv!(nvmlDeviceCreateGpuInstance(d, 19, &mut instance)), ret::SUCCESS);
    let gi = gi_info(instance).unwrap().id;
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
    let before = file.read().unwrap();

    let init_with = |processes: &str, reboot: bool| {
        super::reset_process_for_tests();
        // SAFETY: under SERIAL (held by `sim`).
        unsafe { std::env::set_var("GPUSHARE_SIM_PROCESSES", processes) };
        if reboot {
            // SAFETY: under SERIAL.
            unsafe { std::env::set_var("GPUSHARE_SIM_REBOOT", "1") };
        }
        let code = nv!(nvmlInit_v2());
        let why = last_error();
        if code == ret::SUCCESS {
            assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
        }
        // SAFETY: under SERIAL.
        unsafe { std::env::remove_var("GPUSHARE_SIM_REBOOT") };
        (code, why)
    };
    let refused = [
        (
            "0:10,1:77".to_string(),
            "GPUSHARE_SIM_PROCESSES: \"1:77\": GPU 1 is in MIG mode, where every compute \
             process runs in a GPU instance: write 1/<gi>:77 (its GPU instances: {gi})",
        ),
        (
            format!("0/{gi}:78"),
            "GPUSHARE_SIM_PROCESSES: \"0/{gi}:78\": GPU 0 is not in MIG mode, so it has no \
             GPU instances: write 0:78",
        ),
        (
            format!("1/{}:79", gi + 1),
            "GPUSHARE_SIM_PROCESSES: \"1/{next}:79\": GPU 1 has no GPU instance {next} (its \
             GPU instances: {gi})",
        ),
    ];
    for (processes, why) in refused {
        let why = why.replace("{gi}", &gi.to_string()).replace("{next}", &(gi + 1).to_string());
        assert_eq!(init_with(&processes, false), (ret::UNKNOWN, why), "{processes}");
        assert_eq!(file.read().unwrap(), before, "nothing applied for {processes}");
    }
    // A reboot leaves no GPU instances: the one named is gone by the time the knob applies.
    let (code, why) = init_with(&format!("1/{gi}:80"), true);
    assert_eq!(code, ret::UNKNOWN);
    assert!(why.ends_with(&format!("GPU 1 has no GPU instance {gi} (its GPU instances: none)")));
    assert_eq!(file.read().unwrap(), before, "not even the reboot");

    assert_eq!(init_with(&format!("0:10,1/{gi}:81"), false), (ret::SUCCESS, String::new()));
    let declared: Vec<_> =
        file.read().unwrap().processes.iter().map(|p| (p.gpu, p.gpu_instance, p.pid)).collect();
    assert_eq!(declared, [(0, None, 10), (1, Some(gi), 81)]);
}

#[test]
fn devices_answer_like_nvml() {
    let _sim = Sim::new("a100-40gb:2,l40s:1", &[]);
    let mut d = null_mut();
    assert_eq!(nv!(nvmlDeviceGetHandleByIndex_v2(3, &mut d)), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlDeviceGetHandleByIndex_v2(0, null_mut())), ret::INVALID_ARGUMENT);
    let (a, b, l) = (dev(0), dev(1), dev(2));
    assert!(uuid(a).starts_with("GPU-") && uuid(a) != uuid(b));
    assert_eq!(text(|p, n| nv!(nvmlDeviceGetName(l, p, n))).unwrap(), "NVIDIA L40S");
    let mut small = [0 as c_char; 8];
    assert_eq!(nv!(nvmlDeviceGetUUID(a, small.as_mut_ptr(), 8)), ret::INSUFFICIENT_SIZE);
    assert_eq!(nv!(nvmlDeviceGetUUID(null_mut(), small.as_mut_ptr(), 8)), ret::INVALID_ARGUMENT);

    // SAFETY: all-zero bytes are a valid value of this integer-only struct.
    let mut pci: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
    assert_eq!(nv!(nvmlDeviceGetPciInfo_v3(b, &mut pci)), ret::SUCCESS);
    assert_eq!((pci.pciDeviceId, pci.bus), (0x20B0_10DE, 0x1C));
    assert_eq!(name_of(&pci.busId), "00000000:1C:00.0");
    assert_eq!(name_of(&pci.busIdLegacy), "0000:1C:00.0");

    let mut mem = nvmlMemory_v2_t { version: 0, total: 0, reserved: 0, free: 0, used: 0 };
    assert_eq!(nv!(nvmlDeviceGetMemoryInfo_v2(a, &mut mem)), ret::ARGUMENT_VERSION_MISMATCH);
    mem.version = struct_version(size_of::<nvmlMemory_v2_t>(), 1);
    assert_eq!(nv!(nvmlDeviceGetMemoryInfo_v2(a, &mut mem)), ret::ARGUMENT_VERSION_MISMATCH);
    mem.version = nvmlMemory_v2;
    assert_eq!(nv!(nvmlDeviceGetMemoryInfo_v2(a, &mut mem)), ret::SUCCESS);
    assert_eq!(mem.total, 40960 << 20);

    let mut v = 9;
    assert_eq!(nv!(nvmlDeviceGetMinorNumber(b, &mut v)), ret::SUCCESS);
    assert_eq!(v, 1);
    assert_eq!(nv!(nvmlDeviceGetPersistenceMode(a, &mut v)), ret::SUCCESS);
    assert_eq!(v, NVML_FEATURE_ENABLED, "nvidia-persistenced runs by default");
    assert_eq!(nv!(nvmlDeviceSetPersistenceMode(a, 2)), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlDeviceSetPersistenceMode(a, NVML_FEATURE_DISABLED)), ret::SUCCESS);
    assert_eq!(nv!(nvmlDeviceGetPersistenceMode(a, &mut v)), ret::SUCCESS);
    assert_eq!(v, NVML_FEATURE_DISABLED);
    assert_eq!(nv!(nvmlDeviceGetComputeMode(a, &mut v)), ret::SUCCESS);
    assert_eq!(v, 0);
    assert_eq!(nv!(nvmlDeviceSetComputeMode(a, 1)), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlDeviceSetComputeMode(a, 3)), ret::SUCCESS);
    assert_eq!(nv!(nvmlDeviceGetComputeMode(a, &mut v)), ret::SUCCESS);
    assert_eq!(v, 3);
    assert_eq!(nv!(nvmlDeviceGetMaxMigDeviceCount(a, &mut v)), ret::SUCCESS);
    assert_eq!(v, 0, "MIG off");
    let mut is_mig = 9;
    assert_eq!(nv!(nvmlDeviceIsMigDeviceHandle(a, &mut is_mig)), ret::SUCCESS);
    assert_eq!(is_mig, 0);
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceId(a, &mut v)), ret::INVALID_ARGUMENT);
    let mut parent = null_mut();
    assert_eq!(
        nv!(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(a, &mut parent)),
        ret::INVALID_ARGUMENT
    );
    let mut mig = null_mut();
    assert_eq!(nv!(nvmlDeviceGetMigDeviceHandleByIndex(l, 0, &mut mig)), ret::NOT_SUPPORTED);
    let (mut cur, mut pend) = (0, 0);
    assert_eq!(nv!(nvmlDeviceGetMigMode(l, &mut cur, &mut pend)), ret::NOT_SUPPORTED);
    assert_eq!(set_mig(l, NVML_DEVICE_MIG_ENABLE), Err(ret::NOT_SUPPORTED));
    assert_eq!(set_mig(a, 7), Err(ret::INVALID_ARGUMENT));

    // A device handle from before the last shutdown is stale.
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
    assert_eq!(nv!(nvmlDeviceGetUUID(a, small.as_mut_ptr(), 8)), ret::UNINITIALIZED);
    assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
    let mut buf = [0 as c_char; 96];
    assert_eq!(nv!(nvmlDeviceGetUUID(a, buf.as_mut_ptr(), 96)), ret::INVALID_ARGUMENT);
    assert!(name_of(&buf).is_empty());
    // State persisted across the re-init.
    assert_eq!(nv!(nvmlDeviceGetComputeMode(dev(0), &mut v)), ret::SUCCESS);
    assert_eq!(v, 3);
}

#[test]
fn ampere_mig_mode_is_pending_while_persistence_mode_is_on() {
    let sim = Sim::new("a100-40gb:2,h100-80gb:1", &[]);
    let (a, b, h) = (dev(0), dev(1), dev(2));
    assert_eq!(mig_mode(a), (0, 0));
    assert_eq!(set_mig(a, NVML_DEVICE_MIG_ENABLE), Ok(ret::IN_USE));
    assert_eq!(mig_mode(a), (0, 1), "pending until a reset");
    assert_eq!(nv!(nvmlDeviceSetPersistenceMode(b, NVML_FEATURE_DISABLED)), ret::SUCCESS);
    assert_eq!(set_mig(b, NVML_DEVICE_MIG_ENABLE), Ok(ret::SUCCESS));
    assert_eq!(mig_mode(b), (1, 1));
    assert_eq!(set_mig(h, NVML_DEVICE_MIG_ENABLE), Ok(ret::SUCCESS), "Hopper switches at once");
    assert_eq!(mig_mode(h), (1, 1));
    // nvidia-smi (another process) resets GPU 0: the library sees the change.
    sim.file()
        .update(|n| {
            n.gpus[0].persistence_mode = false;
            n.reset_gpu(0).unwrap();
        })
        .unwrap();
    assert_eq!(mig_mode(a), (1, 1));
    assert_eq!(sim.file().read().unwrap().gpus[0].reset_count, 1);
}

#[test]
fn mig_instances_follow_the_drivers_rules() {
    let _sim = Sim::new("a100-40gb:1", &[]);
    let d = dev(0);
    assert_eq!(create_gi(d, 9, 4, 4), Err(ret::NOT_SUPPORTED), "MIG off");
    assert_eq!(nv!(nvmlDeviceSetPersistenceMode(d, NVML_FEATURE_DISABLED)), ret::SUCCESS);
    assert_eq!(set_mig(d, NVML_DEVICE_MIG_ENABLE), Ok(ret::SUCCESS));

    // Profiles by enum: v1, v2, v3; NOT_SUPPORTED below COUNT, INVALID_ARGUMENT past it.
    let p = gi_profile_v2(d, 2).unwrap();
    assert_eq!((p.id, p.sliceCount, p.instanceCount, p.multiprocessorCount), (9, 3, 2, 42));
    assert_eq!((p.memorySizeMB, name_of(&p.name)), (19968, "MIG 3g.20gb".into()));
    assert_eq!(gi_profile_v2(d, 5).unwrap_err(), ret::NOT_SUPPORTED);
    assert_eq!(gi_profile_v2(d, 16).unwrap_err(), ret::NOT_SUPPORTED);
    assert_eq!(gi_profile_v2(d, 17).unwrap_err(), ret::INVALID_ARGUMENT);
    // SAFETY: all-zero bytes are a valid value of this integer-only struct.
    let mut v3: nvmlGpuInstanceProfileInfo_v3_t = unsafe { std::mem::zeroed() };
    v3.version = nvmlGpuInstanceProfileInfo_v3;
    let v3p = (&mut v3 as *mut nvmlGpuInstanceProfileInfo_v3_t).cast();
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceProfileInfoV(d, 7, v3p)), ret::SUCCESS);
    assert_eq!((v3.id, v3.instanceCount, name_of(&v3.name)), (20, 1, "MIG 1g.5gb+me".into()));
    v3.version = struct_version(152, 4);
    let v3p = (&mut v3 as *mut nvmlGpuInstanceProfileInfo_v3_t).cast();
    assert_eq!(
        nv!(nvmlDeviceGetGpuInstanceProfileInfoV(d, 7, v3p)),
        ret::ARGUMENT_VERSION_MISMATCH
    );
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceProfileInfoV(d, 7, null_mut())), ret::INVALID_ARGUMENT);
    // SAFETY: all-zero bytes are a valid value of this integer-only struct.
    let mut v1: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceProfileInfo(d, 4, &mut v1)), ret::SUCCESS);
    assert_eq!((v1.id, v1.sliceCount, v1.memorySizeMB), (0, 7, 40192));

    // Placements: two-phase.
    let mut n = 0;
    assert_eq!(
        nv!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, 15, null_mut(), &mut n)),
        ret::SUCCESS
    );
    assert_eq!(n, 4);
    let mut pl = vec![nvmlGpuInstancePlacement_t { start: 9, size: 9 }; 4];
    // `*count` is an output only: the buffer gets every placement (the real H100 did).
    let mut held = 2;
    assert_eq!(
        nv!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, 15, pl.as_mut_ptr(), &mut held)),
        ret::SUCCESS
    );
    assert_eq!(held, 4);
    assert_eq!(
        nv!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, 15, pl.as_mut_ptr(), &mut n)),
        ret::SUCCESS
    );
    let starts: Vec<(u32, u32)> = pl.iter().map(|p| (p.start, p.size)).collect();
    assert_eq!(starts, vec![(0, 2), (2, 2), (4, 2), (6, 2)]);
    assert_eq!(
        nv!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, 77, null_mut(), &mut n)),
        ret::INVALID_ARGUMENT
    );

    // Creation: invalid placements vs no room.
    assert_eq!(create_gi(d, 9, 2, 4), Err(ret::INVALID_ARGUMENT));
    assert_eq!(create_gi(d, 9, 4, 2), Err(ret::INVALID_ARGUMENT));
    assert_eq!(create_gi(d, 1234, 0, 4), Err(ret::INVALID_ARGUMENT));
    assert_eq!(
        nv!(nvmlDeviceCreateGpuInstanceWithPlacement(d, 9, null(), &mut null_mut())),
        ret::INVALID_ARGUMENT
    );
    let gi = create_gi(d, 9, 4, 4).unwrap();
    assert_eq!(create_gi(d, 0, 0, 8), Err(ret::INSUFFICIENT_RESOURCES));
    assert_eq!(create_gi(d, 9, 4, 4), Err(ret::INSUFFICIENT_RESOURCES));
    let mut cap = 9;
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceRemainingCapacity(d, 14, &mut cap)), ret::SUCCESS);
    assert_eq!(cap, 2);
    let info = gi_info(gi).unwrap();
    assert_eq!(
        (info.id, info.profileId, info.placement),
        (2, 9, nvmlGpuInstancePlacement_t { start: 4, size: 4 })
    );
    assert_eq!(info.device, d);

    // Listing and lookup.
    let mut list = [null_mut::<c_void>(); 2];
    let mut count = 0;
    assert_eq!(nv!(nvmlDeviceGetGpuInstances(d, 9, list.as_mut_ptr(), &mut count)), ret::SUCCESS);
    assert_eq!((count, list[0]), (1, gi));
    let mut by_id = null_mut();
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceById(d, 2, &mut by_id)), ret::SUCCESS);
    assert_eq!(by_id, gi);
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceById(d, 5, &mut by_id)), ret::NOT_FOUND);

    // Compute instances.
    let cp = ci_profile_v2(gi, 2).unwrap();
    assert_eq!((cp.id, cp.sliceCount, cp.instanceCount, cp.multiprocessorCount), (2, 3, 1, 42));
    assert_eq!(name_of(&cp.name), "MIG 3c.3g.20gb");
    assert_eq!(ci_profile_v2(gi, 4).unwrap_err(), ret::NOT_SUPPORTED);
    assert_eq!(ci_profile_v2(gi, 8).unwrap_err(), ret::INVALID_ARGUMENT);
    // SAFETY: all-zero bytes are a valid value of this integer-only struct.
    let mut c1: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    assert_eq!(nv!(nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0, &mut c1)), ret::SUCCESS);
    assert_eq!((c1.sliceCount, c1.instanceCount, c1.multiprocessorCount), (1, 3, 14));
    assert_eq!(
        nv!(nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 1, &mut c1)),
        ret::INVALID_ARGUMENT
    );
    let ci = create_ci(gi, 2).unwrap();
    assert_eq!(create_ci(gi, 2), Err(ret::INSUFFICIENT_RESOURCES));
    let ci_i = ci_info(ci).unwrap();
    assert_eq!((ci_i.id, ci_i.profileId, ci_i.gpuInstance, ci_i.device), (0, 2, gi, d));
    let mut cis = [null_mut::<c_void>(); 1];
    let mut count = 1;
    assert_eq!(
        nv!(nvmlGpuInstanceGetComputeInstances(gi, 2, cis.as_mut_ptr(), &mut count)),
        ret::SUCCESS
    );
    assert_eq!((count, cis[0]), (1, ci));
    let mut found = null_mut();
    assert_eq!(nv!(nvmlGpuInstanceGetComputeInstanceById(gi, 0, &mut found)), ret::SUCCESS);
    assert_eq!(nv!(nvmlGpuInstanceGetComputeInstanceById(gi, 3, &mut found)), ret::NOT_FOUND);

    // The MIG device of the compute instance.
    let mut max = 0;
    assert_eq!(nv!(nvmlDeviceGetMaxMigDeviceCount(d, &mut max)), ret::SUCCESS);
    assert_eq!(max, 7);
    let mut mig = null_mut();
    assert_eq!(nv!(nvmlDeviceGetMigDeviceHandleByIndex(d, 1, &mut mig)), ret::NOT_FOUND);
    assert_eq!(nv!(nvmlDeviceGetMigDeviceHandleByIndex(d, 7, &mut mig)), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlDeviceGetMigDeviceHandleByIndex(d, 0, &mut mig)), ret::SUCCESS);
    let mig_uuid = uuid(mig);
    assert!(mig_uuid.starts_with("MIG-"), "{mig_uuid}");
    assert_eq!(
        text(|p, n| nv!(nvmlDeviceGetName(mig, p, n))).unwrap(),
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    );
    let (mut gid, mut cid, mut is_mig) = (9, 9, 0);
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceId(mig, &mut gid)), ret::SUCCESS);
    assert_eq!(nv!(nvmlDeviceGetComputeInstanceId(mig, &mut cid)), ret::SUCCESS);
    assert_eq!(nv!(nvmlDeviceIsMigDeviceHandle(mig, &mut is_mig)), ret::SUCCESS);
    assert_eq!((gid, cid, is_mig), (2, 0, 1));
    let mut parent = null_mut();
    assert_eq!(nv!(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig, &mut parent)), ret::SUCCESS);
    assert_eq!(parent, d);
    let mut mem =
        nvmlMemory_v2_t { version: nvmlMemory_v2, total: 0, reserved: 0, free: 0, used: 0 };
    assert_eq!(nv!(nvmlDeviceGetMemoryInfo_v2(mig, &mut mem)), ret::SUCCESS);
    assert_eq!(mem.total, 19968 << 20);

    // Destroys: in order, and stale handles afterwards.
    assert_eq!(nv!(nvmlGpuInstanceDestroy(gi)), ret::IN_USE);
    assert_eq!(set_mig(d, NVML_DEVICE_MIG_DISABLE), Err(ret::IN_USE));
    assert_eq!(nv!(nvmlComputeInstanceDestroy(ci)), ret::SUCCESS);
    assert_eq!(nv!(nvmlComputeInstanceDestroy(ci)), ret::INVALID_ARGUMENT);
    assert_eq!(ci_info(ci).unwrap_err(), ret::INVALID_ARGUMENT);
    assert_eq!(uuid_result(mig), Err(ret::INVALID_ARGUMENT));
    let ci2 = create_ci(gi, 2).unwrap();
    assert_ne!(ci2, ci, "a new compute instance gets a new handle");
    let mut mig2 = null_mut();
    assert_eq!(nv!(nvmlDeviceGetMigDeviceHandleByIndex(d, 0, &mut mig2)), ret::SUCCESS);
    assert_ne!(uuid(mig2), mig_uuid, "and a new MIG UUID");
    assert_eq!(nv!(nvmlComputeInstanceDestroy(ci2)), ret::SUCCESS);
    assert_eq!(nv!(nvmlGpuInstanceDestroy(gi)), ret::SUCCESS);
    assert_eq!(gi_info(gi).unwrap_err(), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlGpuInstanceDestroy(gi)), ret::INVALID_ARGUMENT);
    assert_eq!(set_mig(d, NVML_DEVICE_MIG_DISABLE), Ok(ret::SUCCESS));
    assert_eq!(
        nv!(nvmlDeviceGetGpuInstances(d, 9, list.as_mut_ptr(), &mut count)),
        ret::NOT_SUPPORTED
    );
}

fn uuid_result(d: nvmlDevice_t) -> Result<String, nvmlReturn_t> {
    text(|b, n| nv!(nvmlDeviceGetUUID(d, b, n)))
}

#[test]
fn h100_1g_20gb_offers_1_slice_and_1_slice_rev1() {
    let _sim = Sim::new("h100-80gb:1", &[]);
    let d = dev(0);
    assert_eq!(set_mig(d, NVML_DEVICE_MIG_ENABLE), Ok(ret::SUCCESS));
    let p = gi_profile_v2(d, 9).unwrap();
    assert_eq!((p.id, p.sliceCount, p.multiprocessorCount, p.memorySizeMB), (15, 1, 26, 20096));
    let gi = create_gi(d, 15, 2, 2).unwrap();
    let standard = ci_profile_v2(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE).unwrap();
    let rev1 = ci_profile_v2(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1).unwrap();
    assert_eq!((standard.sliceCount, standard.multiprocessorCount), (1, 16));
    assert_eq!((rev1.id, rev1.sliceCount, rev1.multiprocessorCount), (7, 1, 26));
    assert_eq!(
        ci_profile_v2(gi, NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE).unwrap_err(),
        ret::NOT_SUPPORTED
    );
    create_ci(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1).unwrap();
    assert_eq!(
        create_ci(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE),
        Err(ret::INSUFFICIENT_RESOURCES)
    );
}

#[test]
fn processes_hold_gpus_and_instances() {
    let sim = Sim::new("h100-80gb:2", &[("GPUSHARE_SIM_PROCESSES", "0:100")]);
    let (a, b) = (dev(0), dev(1));
    assert_eq!(processes(a).unwrap(), vec![(100, NO_INSTANCE, NO_INSTANCE)]);
    assert_eq!(
        nv!(nvmlDeviceGetComputeRunningProcesses_v3(a, null_mut(), null_mut())),
        ret::INVALID_ARGUMENT
    );
    // Hopper under a process, as Ampere: the GPU cannot be unbound; the change waits.
    assert_eq!(set_mig(a, NVML_DEVICE_MIG_ENABLE), Ok(ret::IN_USE));
    assert_eq!(mig_mode(a), (0, 1));
    assert_eq!(set_mig(b, NVML_DEVICE_MIG_ENABLE), Ok(ret::SUCCESS));
    let gi = create_gi(b, 9, 0, 4).unwrap();
    assert_eq!(gi_info(gi).unwrap().id, 1);
    // A process starts in it (another client's, as nvidia-smi would see it).
    let runs = Process::new(1, Some(1), 200);
    sim.file().update(|n| n.processes.push(runs)).unwrap();
    assert_eq!(processes(b).unwrap(), vec![(200, 1, NO_INSTANCE)]);
    let ci = create_ci(gi, 2).unwrap();
    assert_eq!(processes(b).unwrap(), vec![(200, 1, 0)]);
    let mut mig = null_mut();
    assert_eq!(nv!(nvmlDeviceGetMigDeviceHandleByIndex(b, 0, &mut mig)), ret::SUCCESS);
    assert_eq!(processes(mig).unwrap(), vec![(200, 1, 0)]);
    assert_eq!(nv!(nvmlComputeInstanceDestroy(ci)), ret::IN_USE);
    assert_eq!(nv!(nvmlGpuInstanceDestroy(gi)), ret::IN_USE);
    // The process ends (as nvidia-smi would see it): the destroys go through.
    sim.file().update(|n| n.processes.retain(|p| p.pid != 200)).unwrap();
    assert!(processes(mig).unwrap().is_empty());
    assert_eq!(nv!(nvmlComputeInstanceDestroy(ci)), ret::SUCCESS);
    assert_eq!(nv!(nvmlGpuInstanceDestroy(gi)), ret::SUCCESS);
    // Ampere with a process: the mode change waits even with persistence mode off.
    drop(sim);
    let _sim = Sim::new("a100-40gb:1", &[("GPUSHARE_SIM_PROCESSES", "0:5")]);
    let a = dev(0);
    assert_eq!(nv!(nvmlDeviceSetPersistenceMode(a, NVML_FEATURE_DISABLED)), ret::SUCCESS);
    assert_eq!(set_mig(a, NVML_DEVICE_MIG_ENABLE), Ok(ret::IN_USE));
    assert_eq!(mig_mode(a), (0, 1));
}

#[test]
fn injected_failures_count_per_process_across_shutdown_and_init() {
    let _sim = Sim::new(
        "a100-40gb:2",
        &[(
            "GPUSHARE_SIM_FAIL",
            "nvmlDeviceSetComputeMode:2,nvmlDeviceGetCount_v2:2=NVML_ERROR_GPU_IS_LOST,nvmlInit_v2:3",
        )],
    );
    let mut n = 0;
    assert_eq!(nv!(nvmlDeviceSetComputeMode(dev(0), 2)), ret::SUCCESS);
    assert_eq!(nv!(nvmlDeviceGetCount_v2(&mut n)), ret::SUCCESS);
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
    assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
    assert_eq!(nv!(nvmlDeviceSetComputeMode(dev(1), 2)), ret::NO_PERMISSION);
    assert_eq!(nv!(nvmlDeviceGetCount_v2(&mut n)), ret::GPU_IS_LOST);
    assert_eq!(nv!(nvmlDeviceGetCount_v2(&mut n)), ret::SUCCESS);
    let mut mode = 9;
    assert_eq!(nv!(nvmlDeviceGetComputeMode(dev(1), &mut mode)), ret::SUCCESS);
    assert_eq!(mode, 0, "a failed call changes nothing");
    assert_eq!(nv!(nvmlDeviceSetComputeMode(dev(1), 2)), ret::SUCCESS);
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
    assert_eq!(nv!(nvmlInit_v2()), ret::UNKNOWN, "the third init is injected");
    assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
}

#[test]
fn a_declared_process_that_ended_stays_ended_when_declared_again() {
    let sim = Sim::new("a100-40gb:1", &[]);
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    let declare = || {
        super::reset_process_for_tests();
        // SAFETY: under SERIAL (held by `sim`).
        unsafe { std::env::set_var("GPUSHARE_SIM_PROCESSES", format!("0:{pid}")) };
        assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
        let listed = sim.file().read().unwrap().pids_on(0);
        assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
        listed
    };
    assert_eq!(declare(), [pid], "declared while it runs: listed");
    child.kill().unwrap();
    child.wait().unwrap();
    // The agent restarted with the same knob: the ended process is not taken for one of
    // another PID namespace.
    assert_eq!(declare(), Vec::<u32>::new());
    // SAFETY: under SERIAL (held by `sim`).
    unsafe { std::env::remove_var("GPUSHARE_SIM_PROCESSES") };
}

#[test]
fn the_session_applies_reboot_and_processes_once_per_process() {
    let sim = Sim::new("a100-40gb:2", &[]);
    let file = sim.file();
    assert_eq!(set_mig(dev(0), NVML_DEVICE_MIG_ENABLE), Ok(ret::IN_USE));
    assert_eq!(nv!(nvmlDeviceSetComputeMode(dev(1), 3)), ret::SUCCESS);
    file.update(|n| n.count_tool_call("gpu-reset")).unwrap();
    // A client that sets no knob starts no session of its own.
    assert_eq!(file.read().unwrap().session_pid, None);
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);

    // A new process (the agent restarted after a reboot) on the same state file.
    super::reset_process_for_tests();
    let knobs = [
        ("GPUSHARE_SIM_REBOOT", "1"),
        ("GPUSHARE_SIM_PROCESSES", "1:42"),
        ("GPUSHARE_SIM_FAIL", "nvmlDeviceGetPowerUsage:99"),
    ];
    for (k, v) in knobs {
        // SAFETY: under SERIAL (held by `sim`).
        unsafe { std::env::set_var(k, v) };
    }
    assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
    let node = file.read().unwrap();
    assert!(node.gpus[0].mig_enabled && node.gpus[0].mig_pending.is_none());
    assert_eq!(node.gpus[1].compute_mode, crate::node::ComputeMode::Default);
    assert!(node.tool_calls.is_empty(), "counted afresh for this session's failures");
    // PID 42 may run on this host (then it is listed while it runs) or not.
    let runs_here = crate::node::pid_alive(42);
    assert_eq!(node.processes, vec![Process { runs_here, ..Process::new(1, None, 42) }]);
    assert_eq!(node.session_pid, Some(std::process::id()));
    // Later inits in the same process start no session: nothing is applied again.
    assert_eq!(nv!(nvmlDeviceSetComputeMode(dev(1), 3)), ret::SUCCESS);
    file.update(|n| {
        n.processes.clear();
        n.count_tool_call("set-timeslice");
    })
    .unwrap();
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
    assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
    let node = file.read().unwrap();
    assert_eq!(node.gpus[1].compute_mode, crate::node::ComputeMode::ExclusiveProcess);
    assert!(node.processes.is_empty());
    assert_eq!(node.tool_calls["set-timeslice"], 1);
}

#[test]
fn the_host_knob_shows_in_nvml_and_in_the_host_files() {
    let sim = Sim::new("a100-40gb:2", &[("GPUSHARE_SIM_HOST", "passthrough=1,no-flr=1")]);
    let mode = |d| {
        let mut m: c_uint = 99;
        (nv!(nvmlDeviceGetVirtualizationMode(d, &mut m)), m)
    };
    assert_eq!(mode(dev(0)), (ret::SUCCESS, 0));
    assert_eq!(mode(dev(1)), (ret::SUCCESS, 1));
    assert_eq!(nv!(nvmlDeviceGetVirtualizationMode(dev(1), null_mut())), ret::INVALID_ARGUMENT);
    let host = crate::host::root_of(sim.file().path());
    let methods = |bdf: &str| {
        std::fs::read_to_string(host.join("sys/bus/pci/devices").join(bdf).join("reset_method"))
            .unwrap()
    };
    assert_eq!(
        (methods("0000:1b:00.0").as_str(), methods("0000:1c:00.0").as_str()),
        ("flr bus\n", "bus\n")
    );
    assert_eq!(sim.file().read().unwrap().session_pid, Some(std::process::id()));
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);

    // A client without the knob sees the host as it is; one with it, empty, makes it bare
    // metal again.
    super::reset_process_for_tests();
    // SAFETY: under SERIAL (held by `sim`).
    unsafe { std::env::remove_var("GPUSHARE_SIM_HOST") };
    assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
    assert_eq!(mode(dev(1)), (ret::SUCCESS, 1));
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
    super::reset_process_for_tests();
    // SAFETY: as above.
    unsafe { std::env::set_var("GPUSHARE_SIM_HOST", "") };
    assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
    assert_eq!(mode(dev(1)), (ret::SUCCESS, 0));
    assert_eq!(methods("0000:1c:00.0"), "flr bus\n");
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);

    // A GPU the node lacks fails init with the knob's one-line reason.
    super::reset_process_for_tests();
    // SAFETY: as above.
    unsafe { std::env::set_var("GPUSHARE_SIM_HOST", "vgpu=2") };
    assert_eq!(nv!(nvmlInit_v2()), ret::UNKNOWN);
    assert_eq!(last_error(), "GPUSHARE_SIM_HOST: GPU 2 does not exist (the node has 2)");
}

#[test]
fn a_state_file_of_other_gpus_starts_fresh() {
    let sim = Sim::new("a100-40gb:2", &[]);
    assert_eq!(nv!(nvmlDeviceSetComputeMode(dev(1), 3)), ret::SUCCESS);
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
    // SAFETY: under SERIAL (held by `sim`).
    unsafe { std::env::set_var("GPUSHARE_SIM_NODE", "a100-40gb:3") };
    assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
    let node = sim.file().read().unwrap();
    assert_eq!(node.gpus.len(), 3);
    assert_eq!(node.gpus[1].compute_mode, crate::node::ComputeMode::Default);
}

#[test]
fn the_driver_places_instances_itself_and_ids_follow_the_placement() {
    let _sim = Sim::new("a100-40gb:1", &[]);
    let d = dev(0);
    assert_eq!(nv!(nvmlDeviceSetPersistenceMode(d, NVML_FEATURE_DISABLED)), ret::SUCCESS);
    assert_eq!(set_mig(d, NVML_DEVICE_MIG_ENABLE), Ok(ret::SUCCESS));
    let create = |profile: c_uint| {
        let mut gi = null_mut();
        match nv!(nvmlDeviceCreateGpuInstance(d, profile, &mut gi)) {
            ret::SUCCESS => Ok(gi_info(gi).unwrap()),
            code => Err(code),
        }
    };
    // The highest placement that fits: a 1g at slot 6 (GI 13), a 2g at 4 (GI 5), a 3g at
    // 0 (GI 1); then a 1g finds no slot.
    let one = create(19).unwrap();
    assert_eq!((one.id, one.placement.start), (13, 6));
    let two = create(14).unwrap();
    assert_eq!((two.id, two.placement.start), (5, 4));
    let three = create(9).unwrap();
    assert_eq!((three.id, three.placement.start), (1, 0));
    assert_eq!(create(19).map(|i| i.id), Err(ret::INSUFFICIENT_RESOURCES));
    // By id (19), with the engine counts; the version field comes back 0.
    // SAFETY: the struct is plain old data; all-zero is a valid value.
    let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    info.version = nvmlGpuInstanceProfileInfo_v2;
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceProfileInfoByIdV(d, 19, &mut info)), ret::SUCCESS);
    assert_eq!((info.id, info.copyEngineCount, info.decoderCount, info.version), (19, 1, 0, 0));
    info.version = 7;
    assert_eq!(
        nv!(nvmlDeviceGetGpuInstanceProfileInfoByIdV(d, 19, &mut info)),
        ret::ARGUMENT_VERSION_MISMATCH
    );
}

fn destroy_gi(gi: nvmlGpuInstance_t) -> nvmlReturn_t {
    nv!(nvmlGpuInstanceDestroy(gi))
}

fn capacity(d: nvmlDevice_t, profile: u32) -> u32 {
    let mut n = 999;
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceRemainingCapacity(d, profile, &mut n)), ret::SUCCESS);
    n
}

pub(super) fn driver_gi(d: nvmlDevice_t, profile: u32) -> Result<nvmlGpuInstance_t, nvmlReturn_t> {
    let mut gi = null_mut();
    match nv!(nvmlDeviceCreateGpuInstance(d, profile, &mut gi)) {
        ret::SUCCESS => Ok(gi),
        code => Err(code),
    }
}

/// `NVML_COMPUTE_INSTANCE_PROFILE_*` of a compute instance of `slices` compute slices.
fn ci_enum(slices: u8) -> u32 {
    match slices {
        1 => NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        _ => NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    }
}

/// A MIG GPU of `model`, alone on a fresh node, with MIG on.
pub(super) fn mig_gpu(model: &gpushare_catalog::GpuModel) -> (Sim, nvmlDevice_t) {
    let sim = Sim::new(&format!("{}:1", model.key), &[]);
    let d = dev(0);
    assert_eq!(nv!(nvmlDeviceSetPersistenceMode(d, NVML_FEATURE_DISABLED)), ret::SUCCESS);
    assert_eq!(set_mig(d, NVML_DEVICE_MIG_ENABLE), Ok(ret::SUCCESS), "{}", model.key);
    (sim, d)
}

/// Every model the simulated driver plays, catalog and simulator-only, with MIG.
pub(super) fn mig_models() -> impl Iterator<Item = &'static gpushare_catalog::GpuModel> {
    gpushare_catalog::simulated_models().iter().filter(|m| m.supports_mig())
}

#[test]
fn every_model_answers_its_profile_table_by_enum() {
    for model in mig_models() {
        let (_sim, d) = mig_gpu(model);
        for e in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            let Some(p) = model.mig_profiles.iter().find(|p| p.nvml_enum == e) else {
                assert_eq!(
                    gi_profile_v2(d, e).unwrap_err(),
                    ret::NOT_SUPPORTED,
                    "{} {e}",
                    model.key
                );
                continue;
            };
            let v2 = gi_profile_v2(d, e).unwrap();
            let what = format!("{} {}", model.key, p.name);
            assert_eq!(
                (v2.id, v2.sliceCount, v2.instanceCount, v2.multiprocessorCount, v2.memorySizeMB),
                (p.id, u32::from(p.compute_slices), u32::from(p.max_count), p.sms, p.memory_mib),
                "{what}"
            );
            let engines =
                [v2.copyEngineCount, v2.decoderCount, v2.encoderCount, v2.jpegCount, v2.ofaCount];
            let e2 = p.engines;
            assert_eq!(
                engines,
                [e2.copy, e2.decoders, e2.encoders, e2.jpeg, e2.ofa].map(u32::from),
                "{what}"
            );
            assert_eq!(name_of(&v2.name), format!("MIG {}", p.name), "{what}");
            // v3: the name again, and GFX among the capabilities of a +gfx profile only.
            // SAFETY: all-zero bytes are a valid value of this integer-only struct.
            let mut v3: nvmlGpuInstanceProfileInfo_v3_t = unsafe { std::mem::zeroed() };
            v3.version = nvmlGpuInstanceProfileInfo_v3;
            let v3p = (&mut v3 as *mut nvmlGpuInstanceProfileInfo_v3_t).cast();
            assert_eq!(nv!(nvmlDeviceGetGpuInstanceProfileInfoV(d, e, v3p)), ret::SUCCESS);
            assert_eq!(name_of(&v3.name), format!("MIG {}", p.name), "{what}");
            let gfx = if p.variant() == "+gfx" { NVML_GPU_INSTANCE_PROFILE_CAPS_GFX } else { 0 };
            assert_eq!(v3.capabilities, gfx, "{what}");
        }
        assert_eq!(
            gi_profile_v2(d, NVML_GPU_INSTANCE_PROFILE_COUNT).unwrap_err(),
            ret::INVALID_ARGUMENT
        );
    }
}

#[test]
fn every_profile_of_every_model_fills_its_placements_and_empties_again() {
    for model in mig_models() {
        let (_sim, d) = mig_gpu(model);
        for p in &model.mig_profiles {
            let what = format!("{} {}", model.key, p.name);
            let mut n = 0;
            assert_eq!(
                nv!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, p.id, null_mut(), &mut n)),
                ret::SUCCESS
            );
            let mut pl = vec![nvmlGpuInstancePlacement_t { start: 99, size: 99 }; n as usize];
            assert_eq!(
                nv!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                    d,
                    p.id,
                    pl.as_mut_ptr(),
                    &mut n
                )),
                ret::SUCCESS
            );
            let want: Vec<(u32, u32)> =
                p.placements.iter().map(|&s| (u32::from(s), u32::from(p.memory_slices))).collect();
            assert_eq!(pl.iter().map(|p| (p.start, p.size)).collect::<Vec<_>>(), want, "{what}");
            assert_eq!(capacity(d, p.id), u32::from(p.max_count), "{what}");
            // Up to its count, at its placements in turn; then no more.
            let mut made = Vec::new();
            for &(start, size) in &want {
                if made.len() == usize::from(p.max_count) {
                    assert_eq!(create_gi(d, p.id, start, size), Err(ret::INSUFFICIENT_RESOURCES));
                    continue;
                }
                let gi = create_gi(d, p.id, start, size).unwrap_or_else(|e| panic!("{what}: {e}"));
                let info = gi_info(gi).unwrap();
                let id = crate::rules::gpu_instance_id(model, start as u8, size as u8);
                assert_eq!((info.id, info.profileId, info.placement.start), (id, p.id, start));
                made.push(gi);
            }
            assert_eq!(made.len(), usize::from(p.max_count), "{what}");
            assert_eq!(capacity(d, p.id), 0, "{what}");
            assert_eq!(driver_gi(d, p.id), Err(ret::INSUFFICIENT_RESOURCES), "{what}");
            for gi in made {
                assert_eq!(destroy_gi(gi), ret::SUCCESS, "{what}");
            }
            assert_eq!(capacity(d, p.id), u32::from(p.max_count), "{what}");
        }
    }
}

#[test]
fn every_model_takes_the_balanced_layout_and_its_variants() {
    for model in mig_models() {
        let (_sim, d) = mig_gpu(model);
        // NVIDIA's balanced layout (1g×2, 2g, 3g on 7 slices; 1g×2, 2g on 4; 1g×2 on 2),
        // largest first, where the driver places it, each with its default compute
        // instance.
        let slices: &[u8] = match model.compute_slices {
            7 => &[3, 2, 1, 1],
            4 => &[2, 1, 1],
            _ => &[1, 1],
        };
        let mut gis = Vec::new();
        for &c in slices {
            let p = model.profile_by_compute_slices(c).unwrap();
            let gi = driver_gi(d, p.id).unwrap_or_else(|e| panic!("{} {}: {e}", model.key, p.name));
            create_ci(gi, ci_enum(c)).unwrap();
            gis.push(gi);
        }
        let mut count = 0;
        assert_eq!(nv!(nvmlDeviceGetMaxMigDeviceCount(d, &mut count)), ret::SUCCESS);
        assert_eq!(count, u32::from(model.compute_slices));
        for (i, _) in gis.iter().enumerate() {
            let mut mig = null_mut();
            assert_eq!(
                nv!(nvmlDeviceGetMigDeviceHandleByIndex(d, i as c_uint, &mut mig)),
                ret::SUCCESS
            );
            assert!(text(|b, n| nv!(nvmlDeviceGetName(mig, b, n))).unwrap().contains(" MIG "));
        }
        for gi in gis {
            assert_eq!(destroy_gi(gi), ret::IN_USE, "{}: its compute instance first", model.key);
            let mut cis = [null_mut::<c_void>(); 1];
            let mut n = 0;
            let profile = gi_info(gi).unwrap().profileId;
            let slices = model.profile_by_id(profile).unwrap().compute_slices;
            assert_eq!(
                nv!(nvmlGpuInstanceGetComputeInstances(
                    gi,
                    ci_enum(slices),
                    cis.as_mut_ptr(),
                    &mut n
                )),
                ret::SUCCESS
            );
            assert_eq!(nv!(nvmlComputeInstanceDestroy(cis[0])), ret::SUCCESS);
            assert_eq!(destroy_gi(gi), ret::SUCCESS);
        }
        // Every variant (+me, +gfx, -me, +me.all) alone, named as such on its MIG device.
        for p in model.mig_profiles.iter().filter(|p| !p.is_plain()) {
            let gi = driver_gi(d, p.id).unwrap_or_else(|e| panic!("{} {}: {e}", model.key, p.name));
            let ci = create_ci(gi, ci_enum(p.compute_slices)).unwrap();
            let mut mig = null_mut();
            assert_eq!(nv!(nvmlDeviceGetMigDeviceHandleByIndex(d, 0, &mut mig)), ret::SUCCESS);
            let name = text(|b, n| nv!(nvmlDeviceGetName(mig, b, n))).unwrap();
            assert_eq!(name, format!("{} MIG {}", model.nvml_name, p.name));
            assert_eq!(nv!(nvmlComputeInstanceDestroy(ci)), ret::SUCCESS);
            assert_eq!(destroy_gi(gi), ret::SUCCESS);
        }
    }
}

#[test]
fn every_model_divides_a_gpu_instance_into_one_slice_compute_instances() {
    for model in mig_models() {
        let (_sim, d) = mig_gpu(model);
        // The largest plain profile of 3 compute slices or fewer: a 3g on 7-slice GPUs, a
        // 2g on the others.
        let p = (2..=3).rev().find_map(|c| model.profile_by_compute_slices(c)).unwrap();
        let what = format!("{} {}", model.key, p.name);
        let gi = driver_gi(d, p.id).unwrap();
        let one = NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE;
        let cp = ci_profile_v2(gi, one).unwrap();
        assert_eq!(cp.instanceCount, u32::from(p.compute_slices), "{what}");
        assert_eq!(name_of(&cp.name), format!("MIG 1c.{}", p.name));
        let mut n = 0;
        assert_eq!(
            nv!(nvmlGpuInstanceGetComputeInstancePossiblePlacements(gi, one, null_mut(), &mut n)),
            ret::SUCCESS
        );
        assert_eq!(n, u32::from(p.compute_slices), "{what}");
        let mut cis = Vec::new();
        for slot in 0..p.compute_slices {
            let ci = create_ci(gi, one).unwrap_or_else(|e| panic!("{what}: {e}"));
            let info = ci_info(ci).unwrap();
            assert_eq!((info.placement.start, info.placement.size), (u32::from(slot), 1), "{what}");
            cis.push(ci);
        }
        assert_eq!(create_ci(gi, one), Err(ret::INSUFFICIENT_RESOURCES), "{what}");
        let mut count = 0;
        assert_eq!(nv!(nvmlDeviceGetMaxMigDeviceCount(d, &mut count)), ret::SUCCESS);
        assert!(cis.len() <= count as usize, "{what}");
        for ci in cis {
            assert_eq!(nv!(nvmlComputeInstanceDestroy(ci)), ret::SUCCESS);
        }
        assert_eq!(destroy_gi(gi), ret::SUCCESS);
    }
}

#[test]
fn the_rtx_pro_6000s_variants_answer_by_their_assumed_enums() {
    let _sim = Sim::new("rtx-pro-6000-bse:1", &[]);
    let d = dev(0);
    assert_eq!(set_mig(d, NVML_DEVICE_MIG_ENABLE), Ok(ret::SUCCESS));
    let names: Vec<(u32, u32, String)> = (10..=16)
        .map(|e| {
            let p = gi_profile_v2(d, e).unwrap();
            (e, p.id, name_of(&p.name))
        })
        .collect();
    let want = [
        (10, 47, "MIG 1g.24gb+gfx"),
        (11, 35, "MIG 2g.48gb+gfx"),
        (12, 32, "MIG 4g.96gb+gfx"),
        (13, 67, "MIG 1g.24gb-me"),
        (14, 66, "MIG 2g.48gb-me"),
        (15, 65, "MIG 1g.24gb+me.all"),
        (16, 64, "MIG 2g.48gb+me.all"),
    ];
    assert_eq!(names, want.map(|(e, id, n)| (e, id, n.to_string())));
    // A +gfx instance, a -me one, and a 2g on the 12-slot grid: GI ids 1, 5, 6.
    let two = create_gi(d, 5, 0, 6).unwrap();
    let gfx = create_gi(d, 47, 6, 3).unwrap();
    let no_me = create_gi(d, 67, 9, 3).unwrap();
    let ids: Vec<u32> = [two, gfx, no_me].iter().map(|&gi| gi_info(gi).unwrap().id).collect();
    assert_eq!(ids, [1, 5, 6]);
    // Compute instances of a +gfx instance carry GFX.
    // SAFETY: all-zero bytes are a valid value of this integer-only struct.
    let mut v3: nvmlComputeInstanceProfileInfo_v3_t = unsafe { std::mem::zeroed() };
    v3.version = nvmlComputeInstanceProfileInfo_v3;
    let v3p = (&mut v3 as *mut nvmlComputeInstanceProfileInfo_v3_t).cast();
    assert_eq!(nv!(nvmlGpuInstanceGetComputeInstanceProfileInfoV(gfx, 0, 0, v3p)), ret::SUCCESS);
    assert_eq!((name_of(&v3.name), v3.capabilities), ("MIG 1c.1g.24gb+gfx".into(), 1));
    let v3p = (&mut v3 as *mut nvmlComputeInstanceProfileInfo_v3_t).cast();
    assert_eq!(nv!(nvmlGpuInstanceGetComputeInstanceProfileInfoV(two, 0, 0, v3p)), ret::SUCCESS);
    assert_eq!((v3.instanceCount, v3.capabilities), (2, 0));
}

#[test]
fn telemetry_answers_like_an_idle_h100_and_rises_with_processes() {
    let sim = Sim::new(
        "h100-80gb:2",
        &[
            ("GPUSHARE_SIM_PROCESSES", "1:100,1:101"),
            ("GPUSHARE_SIM_FAIL", "nvmlDeviceGetPowerUsage:2=NVML_ERROR_GPU_IS_LOST"),
        ],
    );
    let (a, b) = (dev(0), dev(1));
    let util = |d| {
        let mut u = nvmlUtilization_t::default();
        (nv!(nvmlDeviceGetUtilizationRates(d, &mut u)), u.gpu, u.memory)
    };
    let temp = |d, sensor| {
        let mut t: c_uint = 0;
        (nv!(nvmlDeviceGetTemperature(d, sensor, &mut t)), t)
    };
    let power = |d| {
        let mut p: c_uint = 0;
        (nv!(nvmlDeviceGetPowerUsage(d, &mut p)), p)
    };
    // Idle: what the real H100 answered (0 %, 35 °C, 73.6 W).
    assert_eq!(util(a), (ret::SUCCESS, 0, 0));
    assert_eq!(temp(a, NVML_TEMPERATURE_GPU), (ret::SUCCESS, 35));
    assert_eq!(power(a), (ret::SUCCESS, 73_600));
    // Two processes: 60 % and 20 %, 41 °C, 173.6 W.
    assert_eq!(util(b), (ret::SUCCESS, 60, 20));
    assert_eq!(temp(b, NVML_TEMPERATURE_GPU), (ret::SUCCESS, 41));
    // The second call fails as injected.
    assert_eq!(power(b), (ret::GPU_IS_LOST, 0));
    assert_eq!(power(b), (ret::SUCCESS, 173_600));
    assert_eq!(temp(a, 1).0, ret::NOT_SUPPORTED);
    assert_eq!(nv!(nvmlDeviceGetUtilizationRates(a, null_mut())), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlDeviceGetTemperature(a, 0, null_mut())), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlDeviceGetPowerUsage(a, null_mut())), ret::INVALID_ARGUMENT);
    // Ten processes: capped at 100 %, 65 °C.
    sim.file()
        .update(|n| n.processes = (0..10).map(|pid| Process::new(0, None, 300 + pid)).collect())
        .unwrap();
    assert_eq!(util(a), (ret::SUCCESS, 100, 100));
    assert_eq!(temp(a, NVML_TEMPERATURE_GPU), (ret::SUCCESS, 65));
    assert_eq!(power(a), (ret::SUCCESS, 573_600));
    sim.file().update(|n| n.processes.clear()).unwrap();

    // A MIG device: no utilisation, temperature or power, as on the real H100; memory works.
    // Its GPU, with MIG on, keeps its temperature and power but has no utilisation.
    assert_eq!(set_mig(a, NVML_DEVICE_MIG_ENABLE), Ok(ret::SUCCESS));
    assert_eq!(util(a).0, ret::NOT_SUPPORTED);
    assert_eq!(temp(a, NVML_TEMPERATURE_GPU), (ret::SUCCESS, 35));
    assert_eq!(power(a), (ret::SUCCESS, 73_600));
    let gi = create_gi(a, 9, 0, 4).unwrap();
    create_ci(gi, 2).unwrap();
    let mut mig = null_mut();
    assert_eq!(nv!(nvmlDeviceGetMigDeviceHandleByIndex(a, 0, &mut mig)), ret::SUCCESS);
    assert_eq!(util(mig).0, ret::NOT_SUPPORTED);
    assert_eq!(temp(mig, NVML_TEMPERATURE_GPU).0, ret::NOT_SUPPORTED);
    assert_eq!(power(mig).0, ret::NOT_SUPPORTED);
    let mut mem =
        nvmlMemory_v2_t { version: nvmlMemory_v2, total: 0, reserved: 0, free: 0, used: 0 };
    assert_eq!(nv!(nvmlDeviceGetMemoryInfo_v2(mig, &mut mem)), ret::SUCCESS);
    assert!(mem.total > 0 && mem.used == 0);
}

/// Every process of one list (v1, v2 or v3 of the compute, MPS or graphics list) as
/// `(pid, memory, gi, ci)`, read two-phase (a v1 entry has no instance ids: `NO_INSTANCE`).
fn listed(
    d: nvmlDevice_t,
    list: fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> nvmlReturn_t,
) -> Vec<(u32, u64, u32, u32)> {
    let mut n = 0;
    match list(d, &mut n, null_mut()) {
        ret::SUCCESS => {
            assert_eq!(n, 0);
            return Vec::new();
        }
        code => assert_eq!(code, ret::INSUFFICIENT_SIZE),
    }
    let empty =
        nvmlProcessInfo_t { pid: 0, usedGpuMemory: 0, gpuInstanceId: 0, computeInstanceId: 0 };
    let mut buf = vec![empty; n as usize];
    assert_eq!(list(d, &mut n, buf.as_mut_ptr()), ret::SUCCESS);
    buf.iter()
        .take(n as usize)
        .map(|p| (p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId))
        .collect()
}

fn listed_v1(
    d: nvmlDevice_t,
    list: unsafe extern "C" fn(
        nvmlDevice_t,
        *mut c_uint,
        *mut nvmlProcessInfo_v1_t,
    ) -> nvmlReturn_t,
) -> Vec<(u32, u64)> {
    let mut n = 0;
    // SAFETY: a live handle and a count; the buffer holds `n` entries.
    unsafe {
        if list(d, &mut n, null_mut()) == ret::SUCCESS {
            return Vec::new();
        }
        let mut buf = vec![nvmlProcessInfo_v1_t { pid: 0, usedGpuMemory: 0 }; n as usize];
        assert_eq!(list(d, &mut n, buf.as_mut_ptr()), ret::SUCCESS);
        buf.iter().take(n as usize).map(|p| (p.pid, p.usedGpuMemory)).collect()
    }
}

/// A PID no process has (a child that ran and was reaped).
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// The recorded H200 (driver 580.159.04, tests/device/results/clients-h200-2026-11-27): an
/// MPS server (66 MiB), one client through it (2370 MiB) and one direct client (3682 MiB).
/// The compute lists hold all three, each with its own memory; the MPS lists only the MPS
/// client, with the same memory; the graphics lists none.
#[test]
fn mps_clients_are_listed_as_the_real_driver_lists_them() {
    let sim =
        Sim::new("h100-80gb:2", &[("GPUSHARE_SIM_PROCESSES", "0:2676=69206016,0:3609=3682MiB")]);
    let me = std::process::id();
    let gone = dead_pid();
    let registered = |gpu, gi, pid, memory| Process {
        memory,
        mps: true,
        registered: true,
        ..Process::new(gpu, gi, pid)
    };
    sim.file()
        .update(|n| {
            n.processes.insert(1, registered(0, None, me, 2_485_125_120));
            n.processes.push(registered(0, None, gone, 1 << 30));
        })
        .unwrap();
    let a = dev(0);
    let none = NO_INSTANCE;
    let all = vec![
        (2676, 69_206_016, none, none),
        (me, 2_485_125_120, none, none),
        (3609, 3_860_856_832, none, none),
    ];
    assert_eq!(listed(a, |d, n, b| nv!(nvmlDeviceGetComputeRunningProcesses_v3(d, n, b))), all);
    assert_eq!(listed(a, |d, n, b| nv!(nvmlDeviceGetComputeRunningProcesses_v2(d, n, b))), all);
    let v1: Vec<(u32, u64)> = all.iter().map(|&(p, m, _, _)| (p, m)).collect();
    assert_eq!(listed_v1(a, nvmlDeviceGetComputeRunningProcesses), v1);
    let mps = vec![(me, 2_485_125_120, none, none)];
    assert_eq!(listed(a, |d, n, b| nv!(nvmlDeviceGetMPSComputeRunningProcesses_v3(d, n, b))), mps);
    assert_eq!(listed(a, |d, n, b| nv!(nvmlDeviceGetMPSComputeRunningProcesses_v2(d, n, b))), mps);
    assert_eq!(listed_v1(a, nvmlDeviceGetMPSComputeRunningProcesses), [(me, 2_485_125_120)]);
    // Two-phase as the compute list: a short buffer is INSUFFICIENT_SIZE with the count.
    let mut n = 0;
    assert_eq!(
        nv!(nvmlDeviceGetMPSComputeRunningProcesses_v3(a, &mut n, null_mut())),
        ret::INSUFFICIENT_SIZE
    );
    assert_eq!(n, 1);
    for graphics in [
        |d, n, b| nv!(nvmlDeviceGetGraphicsRunningProcesses_v3(d, n, b)),
        |d, n, b| nv!(nvmlDeviceGetGraphicsRunningProcesses_v2(d, n, b)),
    ] {
        assert!(listed(a, graphics).is_empty());
    }
    assert!(listed_v1(a, nvmlDeviceGetGraphicsRunningProcesses).is_empty());
    // Nothing on the other GPU; the first's used memory is its processes' own.
    assert!(
        listed(dev(1), |d, n, b| nv!(nvmlDeviceGetMPSComputeRunningProcesses_v3(d, n, b)))
            .is_empty()
    );
    let mut mem =
        nvmlMemory_v2_t { version: nvmlMemory_v2, total: 0, reserved: 0, free: 0, used: 0 };
    assert_eq!(nv!(nvmlDeviceGetMemoryInfo_v2(a, &mut mem)), ret::SUCCESS);
    assert_eq!(mem.used, 69_206_016 + 2_485_125_120 + 3_860_856_832);

    // In a MIG device, with its instance ids.
    let b = dev(1);
    assert_eq!(set_mig(b, NVML_DEVICE_MIG_ENABLE), Ok(ret::SUCCESS));
    let gi = create_gi(b, 9, 0, 4).unwrap();
    create_ci(gi, 2).unwrap();
    sim.file().update(|n| n.processes.push(registered(1, Some(1), me, 3 << 30))).unwrap();
    let mut mig = null_mut();
    assert_eq!(nv!(nvmlDeviceGetMigDeviceHandleByIndex(b, 0, &mut mig)), ret::SUCCESS);
    let in_mig = vec![(me, 3 << 30, 1, 0)];
    assert_eq!(
        listed(mig, |d, n, b| nv!(nvmlDeviceGetMPSComputeRunningProcesses_v3(d, n, b))),
        in_mig
    );
    assert_eq!(
        listed(mig, |d, n, b| nv!(nvmlDeviceGetComputeRunningProcesses_v3(d, n, b))),
        in_mig
    );

    // A new session's GPUSHARE_SIM_PROCESSES replaces the declared processes, keeps the
    // registered ones that run and drops those whose PID is gone.
    assert_eq!(nv!(nvmlShutdown()), ret::SUCCESS);
    super::reset_process_for_tests();
    // SAFETY: under SERIAL (held by `sim`).
    unsafe { std::env::set_var("GPUSHARE_SIM_PROCESSES", "0:5") };
    assert_eq!(nv!(nvmlInit_v2()), ret::SUCCESS);
    let pids: Vec<(u32, bool)> =
        sim.file().read().unwrap().processes.iter().map(|p| (p.pid, p.registered)).collect();
    assert_eq!(pids, [(me, true), (me, true), (5, false)]);
}

/// A process the MPS control daemon registered leaves the lists when its PID exits, as
/// the real driver drops it; a declared one (a fake PID) stays.
#[test]
fn a_registered_process_vanishes_when_its_pid_exits() {
    let sim = Sim::new("a100-40gb:1", &[("GPUSHARE_SIM_PROCESSES", "0:4242")]);
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    let client = Process { mps: true, registered: true, ..Process::new(0, None, pid) };
    sim.file().update(|n| n.processes.push(client)).unwrap();
    let compute = |d, n, b| nv!(nvmlDeviceGetComputeRunningProcesses_v3(d, n, b));
    let pids = || listed(dev(0), compute).iter().map(|p| p.0).collect::<Vec<_>>();
    assert_eq!(pids(), [4242, pid]);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(pids(), [4242]);
    assert!(
        listed(dev(0), |d, n, b| nv!(nvmlDeviceGetMPSComputeRunningProcesses_v3(d, n, b)))
            .is_empty()
    );
    // Nor does it hold the GPU any more.
    assert!(sim.file().read().unwrap().pids_on(0) == [4242]);
}
