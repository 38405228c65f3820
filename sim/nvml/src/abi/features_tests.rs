//! Tests of [`super::features`] and the issue-38 answers elsewhere (MIG-device attributes
//! and the profile name NVIDIA's go-nvlib derives from them, fabric info, addressing mode,
//! the v1 entry points, MIG-off lookups, error texts), called in-process as C would call
//! them, on the shared [`super::tests::Sim`].

use std::ffi::CStr;
use std::os::raw::c_uint;
use std::ptr::null_mut;

use super::device_info::*;
use super::exports::*;
use super::features::*;
use super::instances::*;
use super::mig::*;
use super::tests::{Sim, create_ci, dev, driver_gi, mig_gpu, mig_models, set_mig};
use super::types::*;
use gpushare_catalog::naming;

/// Calls exported functions (unsafe extern "C") from the tests.
macro_rules! nv {
    ($e:expr) => {{
        // SAFETY: the tests pass live locals, null where they test that, and buffers of
        // the sizes they state, as nvml.h asks of callers; handles are the library's own.
        unsafe { $e }
    }};
}

fn attributes_of(d: nvmlDevice_t) -> Result<nvmlDeviceAttributes_t, nvmlReturn_t> {
    let mut a = nvmlDeviceAttributes_t::default();
    match nv!(nvmlDeviceGetAttributes_v2(d, &mut a)) {
        ret::SUCCESS => Ok(a),
        code => Err(code),
    }
}

/// The MIG device handles of GPU `d`, as go-nvlib walks them (max count, then by index,
/// NOT_FOUND and INVALID_ARGUMENT skipped).
fn mig_devices(d: nvmlDevice_t) -> Vec<nvmlDevice_t> {
    let mut max = 0;
    assert_eq!(nv!(nvmlDeviceGetMaxMigDeviceCount(d, &mut max)), ret::SUCCESS);
    (0..max)
        .filter_map(|i| {
            let mut m = null_mut();
            match nv!(nvmlDeviceGetMigDeviceHandleByIndex(d, i, &mut m)) {
                ret::SUCCESS => Some(m),
                ret::NOT_FOUND | ret::INVALID_ARGUMENT => None,
                code => panic!("MIG device {i}: {code}"),
            }
        })
        .collect()
}

/// `[SMs, copy, decoders, encoders, jpeg, ofa, GI slices, CI slices, MiB]`.
fn figures(a: nvmlDeviceAttributes_t) -> [u64; 9] {
    [
        a.multiprocessorCount,
        a.sharedCopyEngineCount,
        a.sharedDecoderCount,
        a.sharedEncoderCount,
        a.sharedJpegCount,
        a.sharedOfaCount,
        a.gpuInstanceSliceCount,
        a.computeInstanceSliceCount,
    ]
    .map(u64::from)
    .into_iter()
    .chain([a.memorySizeMB])
    .collect::<Vec<_>>()
    .try_into()
    .unwrap()
}

/// The attributes of the one MIG device of a GPU instance of GPU-instance profile id
/// `gi_profile` holding one compute instance of enum `ci_enum`, on a fresh `model` GPU.
fn one_mig_device(model: &str, gi_profile: u32, ci_enum: u32) -> [u64; 9] {
    let _sim = Sim::new(&format!("{model}:1"), &[]);
    let d = dev(0);
    assert_eq!(nv!(nvmlDeviceSetPersistenceMode(d, NVML_FEATURE_DISABLED)), ret::SUCCESS);
    assert_eq!(set_mig(d, NVML_DEVICE_MIG_ENABLE), Ok(ret::SUCCESS));
    let gi = driver_gi(d, gi_profile).unwrap();
    create_ci(gi, ci_enum).unwrap();
    let migs = mig_devices(d);
    assert_eq!(migs.len(), 1, "{model} {gi_profile} {ci_enum}");
    // The unversioned entry point fills the same struct.
    let mut v1 = nvmlDeviceAttributes_t::default();
    assert_eq!(nv!(nvmlDeviceGetAttributes(migs[0], &mut v1)), ret::SUCCESS);
    let v2 = attributes_of(migs[0]).unwrap();
    assert_eq!(v1, v2);
    figures(v2)
}

#[test]
fn mig_device_attributes_are_the_profile_tables() {
    // H100 1g.10gb (profile id 19): NVIDIA's GFD labels these on a real H100 (copy 1,
    // decoder 1, encoder 0, jpeg 1, ofa 0, memory 9984, multiprocessors 16, slices 1/1).
    let c1 = NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE;
    assert_eq!(one_mig_device("h100-80gb", 19, c1), [16, 1, 1, 0, 1, 0, 1, 1, 9984]);
    // 1g.10gb+me (20): the OFA too.
    assert_eq!(one_mig_device("h100-80gb", 20, c1), [16, 1, 1, 0, 1, 1, 1, 1, 9984]);
    // A 1c.3g.40gb compute instance: its own 16 SMs and one slice, the 3g's shared engines,
    // three slices and memory.
    assert_eq!(one_mig_device("h100-80gb", 9, c1), [16, 3, 3, 0, 3, 0, 3, 1, 40448]);
    // H100 1g.20gb with its 1_SLICE_REV1 compute instance: all 26 SMs.
    let rev1 = NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1;
    assert_eq!(one_mig_device("h100-80gb", 15, rev1), [26, 1, 1, 0, 1, 0, 1, 1, 20096]);
    // A100-40GB 7g.40gb (0) whole.
    let c7 = NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE;
    assert_eq!(one_mig_device("a100-40gb", 0, c7), [98, 7, 5, 0, 1, 1, 7, 7, 40192]);
    // A30 2g.12gb+me (6) and a 1c of 4g.24gb (0).
    let c2 = NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE;
    assert_eq!(one_mig_device("a30-24gb", 6, c2), [28, 2, 2, 0, 1, 1, 2, 2, 11971]);
    assert_eq!(one_mig_device("a30-24gb", 0, c1), [14, 4, 4, 0, 1, 1, 4, 1, 24064]);
}

#[test]
fn attributes_of_a_whole_gpu_and_bad_arguments() {
    let _sim = Sim::new("h100-80gb:1", &[]);
    let d = dev(0);
    assert_eq!(attributes_of(d), Err(WHOLE_GPU_ATTRIBUTES));
    assert_eq!(nv!(nvmlDeviceGetAttributes_v2(d, null_mut())), ret::INVALID_ARGUMENT);
    assert_eq!(attributes_of(null_mut()), Err(ret::INVALID_ARGUMENT));
}

/// go-nvlib's slice count of `NVML_COMPUTE_INSTANCE_PROFILE_*` enum `e`.
fn go_nvlib_ci(e: u32) -> u8 {
    match e {
        0 | 7 => 1,
        1 => 2,
        2 => 3,
        3 => 4,
        4 => 7,
        5 => 8,
        6 => 6,
        _ => panic!("compute-instance profile enum {e} is unknown to go-nvlib"),
    }
}

/// The profile name NVIDIA's go-nvlib derives for MIG device `m` (`migdevice.GetProfile`,
/// as GFD and the device plugin call it), step by step through the same NVML calls.
fn go_nvlib_name(m: nvmlDevice_t) -> String {
    let mut parent = null_mut();
    assert_eq!(nv!(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m, &mut parent)), ret::SUCCESS);
    let mut memory = nvmlMemory_t { total: 0, free: 0, used: 0 };
    assert_eq!(nv!(nvmlDeviceGetMemoryInfo(parent, &mut memory)), ret::SUCCESS);
    let attributes = attributes_of(m).expect("GetAttributes on a MIG device");
    let (mut gi_id, mut ci_id) = (0, 0);
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceId(m, &mut gi_id)), ret::SUCCESS);
    assert_eq!(nv!(nvmlDeviceGetComputeInstanceId(m, &mut ci_id)), ret::SUCCESS);
    let (mut gi, mut ci) = (null_mut(), null_mut());
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceById(parent, gi_id, &mut gi)), ret::SUCCESS);
    assert_eq!(nv!(nvmlGpuInstanceGetComputeInstanceById(gi, ci_id, &mut ci)), ret::SUCCESS);
    // SAFETY: both structs are plain old data; all-zero is a valid value.
    let (mut gi_info, mut ci_info): (nvmlGpuInstanceInfo_t, nvmlComputeInstanceInfo_t) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    assert_eq!(nv!(nvmlGpuInstanceGetInfo(gi, &mut gi_info)), ret::SUCCESS);
    assert_eq!(nv!(nvmlComputeInstanceGetInfo_v2(ci, &mut ci_info)), ret::SUCCESS);
    // go-nvml's GPU_INSTANCE_PROFILE_COUNT and COMPUTE_INSTANCE_PROFILE_COUNT are newer
    // than the 580 header's; the driver answers INVALID_ARGUMENT past its own, skipped.
    for i in 0..NVML_GPU_INSTANCE_PROFILE_COUNT + 2 {
        // SAFETY: plain old data.
        let mut gp: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        match nv!(nvmlDeviceGetGpuInstanceProfileInfo(parent, i, &mut gp)) {
            ret::SUCCESS => {}
            ret::NOT_SUPPORTED | ret::INVALID_ARGUMENT => continue,
            code => panic!("GetGpuInstanceProfileInfo({i}): {code}"),
        }
        if gp.id != gi_info.profileId {
            continue;
        }
        for j in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT + 1 {
            // SAFETY: plain old data.
            let mut cp: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            match nv!(nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, j, 0, &mut cp)) {
                ret::SUCCESS => {}
                ret::NOT_SUPPORTED | ret::INVALID_ARGUMENT => continue,
                code => panic!("GetComputeInstanceProfileInfo({j}): {code}"),
            }
            if cp.id != ci_info.profileId {
                continue;
            }
            // go-nvlib's `NewMigProfile` and `String` (NVIDIA's rule, `catalog::naming`).
            let gi_name = naming::gpu_instance_name(i, attributes.memorySizeMB, memory.total)
                .unwrap_or_else(|| panic!("GPU-instance profile enum {i} is unknown to go-nvlib"));
            let c = go_nvlib_ci(j);
            return naming::compute_instance_name(c, &gi_name);
        }
    }
    panic!("no matching profile IDs found");
}

#[test]
fn go_nvlib_derives_the_drivers_profile_name_on_every_model() {
    let mut checked = 0;
    for model in mig_models() {
        let (_sim, d) = mig_gpu(model);
        for p in &model.mig_profiles {
            let gi = driver_gi(d, p.id).unwrap_or_else(|e| panic!("{} {}: {e}", model.key, p.name));
            for ci_enum in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
                let Ok(ci) = create_ci(gi, ci_enum) else {
                    continue;
                };
                let mut slices = 0;
                for m in mig_devices(d) {
                    let mut a = nvmlDeviceAttributes_t::default();
                    assert_eq!(nv!(nvmlDeviceGetAttributes_v2(m, &mut a)), ret::SUCCESS);
                    slices = a.computeInstanceSliceCount;
                    let want = if slices == u32::from(p.compute_slices) {
                        p.name.clone()
                    } else {
                        format!("{slices}c.{}", p.name)
                    };
                    assert_eq!(
                        go_nvlib_name(m),
                        want,
                        "{} {} CI enum {ci_enum}",
                        model.key,
                        p.name
                    );
                    checked += 1;
                }
                assert!(slices > 0, "{} {}: no MIG device", model.key, p.name);
                assert_eq!(nv!(nvmlComputeInstanceDestroy(ci)), ret::SUCCESS);
            }
            assert_eq!(nv!(nvmlGpuInstanceDestroy(gi)), ret::SUCCESS);
        }
    }
    assert!(checked > 100, "{checked} MIG devices named");
}

// ---------------------------------------------------------------------------------------
// Fabric info, addressing mode

fn fabric_v3(d: nvmlDevice_t) -> Result<nvmlGpuFabricInfo_v3_t, nvmlReturn_t> {
    let mut f = nvmlGpuFabricInfo_v3_t { version: nvmlGpuFabricInfo_v3, ..Default::default() };
    let p = (&mut f as *mut nvmlGpuFabricInfo_v3_t).cast();
    match nv!(nvmlDeviceGetGpuFabricInfoV(d, p)) {
        ret::SUCCESS => Ok(f),
        code => Err(code),
    }
}

#[test]
fn fabric_info_says_whether_the_gpu_is_on_an_nvlink_fabric() {
    // A Hopper GPU without NVSwitches: SUCCESS, the state says not supported (recorded).
    let sim = Sim::new("h100-80gb:1", &[]);
    let d = dev(0);
    let f = fabric_v3(d).unwrap();
    assert_eq!((f.state, f.status, f.cliqueId, f.clusterUuid), (0, 0, 0, [0; 16]));
    assert_eq!((f.version, f.healthMask, f.healthSummary), (nvmlGpuFabricInfo_v3, 0, 0));
    let mut v1 = nvmlGpuFabricInfo_t { state: 9, ..Default::default() };
    assert_eq!(nv!(nvmlDeviceGetGpuFabricInfo(d, &mut v1)), ret::SUCCESS);
    assert_eq!(v1.state, NVML_GPU_FABRIC_STATE_NOT_SUPPORTED);
    assert_eq!(nv!(nvmlDeviceGetGpuFabricInfo(d, null_mut())), ret::INVALID_ARGUMENT);
    let mut v2 =
        nvmlGpuFabricInfo_v2_t { version: nvmlGpuFabricInfo_v2, state: 9, ..Default::default() };
    assert_eq!(nv!(nvmlDeviceGetGpuFabricInfoV(d, &mut v2)), ret::SUCCESS);
    assert_eq!((v2.version, v2.state), (nvmlGpuFabricInfo_v2, 0));
    let mut bad = nvmlGpuFabricInfo_v2_t { version: struct_version(36, 9), ..Default::default() };
    assert_eq!(nv!(nvmlDeviceGetGpuFabricInfoV(d, &mut bad)), ret::ARGUMENT_VERSION_MISMATCH);
    drop(sim);

    // Ampere: not a Hopper-or-newer feature.
    let sim = Sim::new("a100-40gb:1", &[]);
    assert_eq!(fabric_v3(dev(0)), Err(ret::NOT_SUPPORTED));
    drop(sim);

    // An HGX with NVSwitches: registered once Fabric Manager runs, healthy; no cluster.
    let sim = Sim::new("h100-80gb:2", &[("GPUSHARE_SIM_HOST", "nvswitches=4")]);
    let f = fabric_v3(dev(1)).unwrap();
    assert_eq!((f.state, f.status, f.clusterUuid), (NVML_GPU_FABRIC_STATE_COMPLETED, 0, [0; 16]));
    assert_eq!(f.healthSummary, 1);
    drop(sim);
    let stopped = [("GPUSHARE_SIM_HOST", "nvswitches=4,fabric-manager=stopped")];
    let sim = Sim::new("h100-80gb:2", &stopped);
    assert_eq!(fabric_v3(dev(0)).unwrap().state, NVML_GPU_FABRIC_STATE_NOT_STARTED);
    drop(sim);

    // GB200: one cluster and clique for every GPU of the node, which GFD labels.
    let _sim = Sim::new("gb200:2", &[("GPUSHARE_SIM_HOST", "nvswitches=2")]);
    let (a, b) = (fabric_v3(dev(0)).unwrap(), fabric_v3(dev(1)).unwrap());
    assert_ne!(a.clusterUuid, [0; 16]);
    assert_eq!((a.clusterUuid, a.cliqueId), (b.clusterUuid, b.cliqueId));
    assert_eq!(a.cliqueId, 1);
}

fn addressing(d: nvmlDevice_t, version: c_uint) -> Result<c_uint, nvmlReturn_t> {
    let mut m = nvmlDeviceAddressingMode_t { version, value: 99 };
    match nv!(nvmlDeviceGetAddressingMode(d, &mut m)) {
        ret::SUCCESS => Ok(m.value),
        code => Err(code),
    }
}

#[test]
fn addressing_mode_is_none_but_on_grace() {
    let sim = Sim::new("h100-80gb:1", &[]);
    let d = dev(0);
    assert_eq!(addressing(d, nvmlDeviceAddressingMode_v1), Ok(NVML_DEVICE_ADDRESSING_MODE_NONE));
    assert_eq!(addressing(d, struct_version(8, 2)), Err(ret::ARGUMENT_VERSION_MISMATCH));
    assert_eq!(nv!(nvmlDeviceGetAddressingMode(d, null_mut())), ret::INVALID_ARGUMENT);
    drop(sim);
    let _sim = Sim::new("gh200-144gb:1", &[]);
    assert_eq!(
        addressing(dev(0), nvmlDeviceAddressingMode_v1),
        Ok(NVML_DEVICE_ADDRESSING_MODE_ATS)
    );
}

// ---------------------------------------------------------------------------------------
// MIG-off lookups, v1 entry points, error texts

#[test]
fn with_mig_off_every_mig_device_index_is_not_found() {
    let _sim = Sim::new("h100-80gb:1", &[]);
    let d = dev(0);
    for i in [0, 1, 6, 7, 99] {
        let mut m = null_mut();
        assert_eq!(nv!(nvmlDeviceGetMigDeviceHandleByIndex(d, i, &mut m)), ret::NOT_FOUND, "{i}");
    }
    assert_eq!(nv!(nvmlDeviceGetMigDeviceHandleByIndex(d, 0, null_mut())), ret::INVALID_ARGUMENT);
}

#[test]
fn v1_placements_need_a_buffer_and_v1_compute_instance_info_has_no_placement() {
    let model = gpushare_catalog::model_by_key("a100-40gb").unwrap();
    let sim = Sim::new("a100-40gb:1", &[]);
    let d = dev(0);
    let mut n = 0;
    let v1 = |d, id, buf: *mut nvmlGpuInstancePlacement_t, n: *mut c_uint| {
        nv!(nvmlDeviceGetGpuInstancePossiblePlacements(d, id, buf, n))
    };
    // As the real H100 answered with MIG off: bad arguments and a null buffer (the count
    // query of _v2) INVALID_ARGUMENT, a buffer filled.
    assert_eq!(v1(d, 9, null_mut(), null_mut()), ret::INVALID_ARGUMENT);
    assert_eq!(v1(d, 99, null_mut(), &mut n), ret::INVALID_ARGUMENT);
    assert_eq!(v1(null_mut(), 9, null_mut(), &mut n), ret::INVALID_ARGUMENT);
    assert_eq!(v1(d, 9, null_mut(), &mut n), ret::INVALID_ARGUMENT);
    let mut n2 = 0;
    let v2 = nv!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, 9, null_mut(), &mut n2));
    assert_eq!((v2, n2), (ret::SUCCESS, 2));
    // 3g.20gb (profile id 9): starts 0 and 4, with MIG off and on.
    let mut buf = [nvmlGpuInstancePlacement_t { start: 9, size: 9 }; 2];
    n = 2;
    assert_eq!(v1(d, 9, buf.as_mut_ptr(), &mut n), ret::SUCCESS);
    assert_eq!((n, buf.map(|p| (p.start, p.size))), (2, [(0, 4), (4, 4)]));
    // `*count` is an output only (the real H100 answered so).
    n = 1;
    assert_eq!(v1(d, 9, buf.as_mut_ptr(), &mut n), ret::SUCCESS);
    assert_eq!(n, 2);
    drop(sim);
    let (_sim, d) = mig_gpu(model);
    let mut buf = [nvmlGpuInstancePlacement_t { start: 9, size: 9 }; 2];
    n = 2;
    assert_eq!(v1(d, 9, buf.as_mut_ptr(), &mut n), ret::SUCCESS);
    assert_eq!(buf.map(|p| (p.start, p.size)), [(0, 4), (4, 4)]);

    let gi = driver_gi(d, 9).unwrap();
    let ci = create_ci(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE).unwrap();
    // A 32-byte buffer: the v1 call writes the first 24 bytes only.
    #[repr(C)]
    struct Padded {
        info: nvmlComputeInstanceInfo_v1_t,
        after: [u32; 2],
    }
    let mut p = Padded {
        info: nvmlComputeInstanceInfo_v1_t {
            device: null_mut(),
            gpuInstance: null_mut(),
            id: 77,
            profileId: 77,
        },
        after: [0xAAAA_AAAA; 2],
    };
    assert_eq!(nv!(nvmlComputeInstanceGetInfo(ci, &mut p.info)), ret::SUCCESS);
    assert_eq!((p.info.device, p.info.gpuInstance), (d, gi));
    assert_eq!((p.info.id, p.info.profileId, p.after), (0, 0, [0xAAAA_AAAA; 2]));
    assert_eq!(nv!(nvmlComputeInstanceGetInfo(null_mut(), &mut p.info)), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlComputeInstanceGetInfo(ci, null_mut())), ret::INVALID_ARGUMENT);
}

/// Recorded read-only on a real H100 80GB HBM3 (driver 580.159.04, MIG off), 2026-12-06
/// (`tests/data/h100-placements-probe-2026-12-06.json`): given a buffer, v1 and `_v2`
/// write every placement and their count whatever `*count` held (0, 1 or 8), as nvml.h
/// has it ("If non-NULL must be large enough to accommodate the placements"); an unknown
/// profile is INVALID_ARGUMENT with `*count` untouched.
#[test]
fn placements_fill_the_buffer_whatever_count_held_as_the_real_h100_does() {
    let _sim = Sim::new("h100-80gb:1", &[]);
    let d = dev(0);
    type Placements = unsafe extern "C" fn(
        nvmlDevice_t,
        c_uint,
        *mut nvmlGpuInstancePlacement_t,
        *mut c_uint,
    ) -> nvmlReturn_t;
    let calls: [(&str, Placements); 2] = [
        ("v1", nvmlDeviceGetGpuInstancePossiblePlacements),
        ("_v2", nvmlDeviceGetGpuInstancePossiblePlacements_v2),
    ];
    let ones: Vec<(u32, u32)> = (0..7).map(|s| (s, 1)).collect();
    for (which, call) in calls {
        // Profile ids 0 (7g.80gb, one placement) and 19 (1g.10gb, seven).
        for (id, want) in [(0, vec![(0, 8)]), (19, ones.clone())] {
            for held in [0, 1, 8] {
                let mut buf = [nvmlGpuInstancePlacement_t { start: 77, size: 77 }; 8];
                let mut n = held;
                let code = nv!(call(d, id, buf.as_mut_ptr(), &mut n));
                let got: Vec<(u32, u32)> =
                    buf.iter().filter(|p| p.start != 77).map(|p| (p.start, p.size)).collect();
                assert_eq!(
                    (code, n, got),
                    (ret::SUCCESS, want.len() as u32, want.clone()),
                    "{which} profile {id}, *count {held}"
                );
            }
        }
        for held in [0, 1, 8] {
            let mut n = held;
            let mut buf = [nvmlGpuInstancePlacement_t { start: 77, size: 77 }; 8];
            let code = nv!(call(d, 99, buf.as_mut_ptr(), &mut n));
            assert_eq!((code, n), (ret::INVALID_ARGUMENT, held), "{which} profile 99");
        }
    }
}

#[test]
fn compute_instance_profiles_share_their_gpu_instances_engines() {
    let model = gpushare_catalog::model_by_key("a100-40gb").unwrap();
    let (_sim, d) = mig_gpu(model);
    let gi = driver_gi(d, 9).unwrap();
    // SAFETY: plain old data.
    let mut cp: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    let one = NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE;
    assert_eq!(
        nv!(nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, one, 0, &mut cp)),
        ret::SUCCESS
    );
    // `nvidia-smi mig -lcip` on an A100's 3g.20gb: 1c, 14 SMs, shared CE 3, DEC 2.
    let shared = [
        cp.sharedCopyEngineCount,
        cp.sharedDecoderCount,
        cp.sharedEncoderCount,
        cp.sharedJpegCount,
        cp.sharedOfaCount,
    ];
    assert_eq!((cp.multiprocessorCount, shared), (14, [3, 2, 0, 0, 0]));
}

#[test]
fn error_texts_are_driver_580s() {
    let text = |c| nv!(CStr::from_ptr(nvmlErrorString(c))).to_str().unwrap();
    assert_eq!(text(ret::RESET_REQUIRED), "GPU requires reset");
    assert_eq!(text(ret::OPERATING_SYSTEM), "GPU access blocked by the operating system");
    assert_eq!(text(ret::LIB_RM_VERSION_MISMATCH), "Driver/library version mismatch");
    assert_eq!(text(ret::INSUFFICIENT_RESOURCES), "Insufficient Resources");
    assert_eq!(text(ret::FREQ_NOT_SUPPORTED), "Invalid Frequency");
    assert_eq!(text(ret::NOT_READY), "System is not in ready state");
    assert_eq!(text(ret::RESET_TYPE_NOT_SUPPORTED), "Reset type is not supported for given device");
    assert_eq!(text(ret::UNKNOWN), "Unknown Error");
    assert_eq!(text(31), "Unknown Error");
}

#[test]
fn instance_ids_of_a_whole_gpu_are_invalid_arguments() {
    let _sim = Sim::new("h100-80gb:1", &[]);
    let (d, mut id) = (dev(0), 7);
    assert_eq!(nv!(nvmlDeviceGetGpuInstanceId(d, &mut id)), ret::INVALID_ARGUMENT);
    assert_eq!(nv!(nvmlDeviceGetComputeInstanceId(d, &mut id)), ret::INVALID_ARGUMENT);
}
