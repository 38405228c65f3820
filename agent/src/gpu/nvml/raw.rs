//! The NVML calls nvml-wrapper lacks (GPU and compute instances, possible placements,
//! the MIG mode setter), called through the symbols nvml-wrapper loaded. Every `unsafe`
//! call into NVML is here, each with its `SAFETY` reasoning, but the health watcher's event
//! set and remapped rows, which [`super::events`] calls the same way.

use std::collections::{BTreeMap, HashSet};
use std::ffi::CStr;
use std::os::raw::c_uint;
use std::ptr;

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym};
use nvml_wrapper_sys::bindings as sys;
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    NVML_GPU_INSTANCE_PROFILE_COUNT, NvmlLib, nvmlComputeInstance_t, nvmlComputeInstanceInfo_t,
    nvmlComputeInstanceProfileInfo_t, nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t, nvmlGpuInstanceProfileInfo_v2_t,
    nvmlReturn_t,
};

use super::errors::{raw_error, wrapper_error};
use crate::catalog::Engines;
use crate::gpu::{ErrorCode, GpuError};

/// Enum indexes are never asked past this, whatever a driver answers: nvml.h's counts are
/// below 32.
const ENUM_CEILING: u32 = 64;

/// What a profile query by enum index answered.
pub(super) enum ProfileSlot<T> {
    /// The GPU (or GPU instance) offers this profile.
    Offered(T),
    /// It does not (NOT_SUPPORTED): a known enum this GPU lacks.
    Absent,
    /// INVALID_ARGUMENT: the enum is past the last one the driver knows.
    PastLast,
}

/// A failed profile query as a [`ProfileSlot`]; other errors stay errors.
fn absent_or_past_last<T>(error: GpuError) -> Result<ProfileSlot<T>, GpuError> {
    match error.code {
        ErrorCode::NotSupported => Ok(ProfileSlot::Absent),
        ErrorCode::InvalidArgument => Ok(ProfileSlot::PastLast),
        _ => Err(error),
    }
}

/// A GPU-instance profile as queried by enum index.
pub(super) struct GiProfile {
    pub(super) id: u32,
    pub(super) name: String,
    pub(super) slice_count: u32,
    pub(super) instance_count: u32,
    pub(super) sms: u32,
    pub(super) memory_mib: u64,
    pub(super) engines: Engines,
}

/// The most entries a buffer sized by a driver's count holds (placements of a profile,
/// instances of a profile): far above any GPU's, so that a wrong count cannot make the
/// agent allocate without bound.
const MAX_LISTED: c_uint = 64;

/// A profile's engine counts as NVML's `ProfileInfo` gives them (saturating: no MIG
/// instance has more than 255 of any engine).
fn engines(copy: u32, decoders: u32, encoders: u32, jpeg: u32, ofa: u32) -> Engines {
    let n = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
    Engines {
        copy: n(copy),
        decoders: n(decoders),
        encoders: n(encoders),
        jpeg: n(jpeg),
        ofa: n(ofa),
    }
}

/// The raw handle of a device, for the calls nvml-wrapper lacks.
pub(super) fn device_handle(device: &Device<'_>) -> nvmlDevice_t {
    // SAFETY: `handle` is only unsafe to make callers think about the handle's lifetime:
    // it is valid while the `Nvml` that `device` borrows stays initialized, and every raw
    // call using it happens inside a method of `Session`, which borrows that `Nvml` under
    // the backend's lock: a reset shuts NVML down only under the write lock, once no
    // `Session` is left. No second `Device` is built from it.
    unsafe { device.handle() }
}

/// The text after `MIG ` of a NUL-terminated profile name.
pub(super) fn profile_name(raw_name: &[std::os::raw::c_char]) -> String {
    // `c_char` is i8 or u8 depending on the target; reinterpret each as a byte.
    let bytes: Vec<u8> = raw_name.iter().map(|&c| c as u8).collect();
    let name = CStr::from_bytes_until_nul(&bytes)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
    let name = name.trim();
    name.strip_prefix("MIG ").unwrap_or(name).trim().to_owned()
}

/// `NVML_STRUCT_VERSION(data, ver)` from nvml.h: the struct size with the version in the top byte.
pub(super) const fn struct_version(size: usize, version: u32) -> u32 {
    size as u32 | (version << 24)
}

/// nvml.h structs NVML fills in, created all-zero as the C API expects.
trait Zeroed: Copy {
    /// The all-zero value.
    fn zeroed() -> Self;
}

macro_rules! impl_zeroed {
    ($($t:ty),* $(,)?) => {
        $(impl Zeroed for $t {
            fn zeroed() -> Self {
                // SAFETY: a bindgen `#[repr(C)]` struct from nvml.h made of integers,
                // integer arrays and raw pointers only: all-zero bytes are a valid value
                // (zero, or a null pointer).
                unsafe { std::mem::zeroed() }
            }
        })*
    };
}

impl_zeroed!(
    nvmlGpuInstanceProfileInfo_t,
    nvmlGpuInstanceProfileInfo_v2_t,
    nvmlGpuInstanceInfo_t,
    nvmlComputeInstanceProfileInfo_t,
    nvmlComputeInstanceInfo_t,
);

/// The NVML calls nvml-wrapper lacks, called through the symbols it loaded.
///
/// Handles passed in come from NVML on this same library while it is initialized (the
/// `lib` borrow keeps the owning `Nvml` alive); GPU and compute instance handles may go
/// stale when another client destroys the instance, which NVML reports as an error.
pub(super) struct Raw<'a> {
    pub(super) lib: &'a NvmlLib,
    pub(super) call: &'static str,
    pub(super) gpu: u32,
}

impl<'a> Raw<'a> {
    /// A loaded symbol, or NotSupported naming it.
    pub(super) fn sym<T>(
        &self,
        function: &str,
        sym: Result<&'a T, NvmlError>,
    ) -> Result<&'a T, GpuError> {
        sym.map_err(|e| wrapper_error(self.call, Some(self.gpu), function, e))
    }

    pub(super) fn check(&self, function: &str, ret: nvmlReturn_t) -> Result<(), GpuError> {
        if ret == sys::nvmlReturn_enum_NVML_SUCCESS {
            Ok(())
        } else {
            Err(raw_error(self.call, Some(self.gpu), function, ret))
        }
    }

    pub(super) fn to_u8(&self, what: &str, value: u32) -> Result<u8, GpuError> {
        u8::try_from(value).map_err(|_| {
            GpuError::new(self.call, Some(self.gpu), ErrorCode::Unknown)
                .with_detail(format!("NVML reported {what} {value}, out of range"))
        })
    }

    /// Every GPU-instance profile the GPU offers, by enum index: every index up to
    /// nvml.h's count as the bindings know it, then on until the driver answers "past the
    /// last" (newer drivers define more profiles than the bindings, e.g. `*_GFX`, and an
    /// instance of one still occupies memory slots).
    pub(super) fn gi_profiles(&self, dev: nvmlDevice_t) -> Result<Vec<(u32, GiProfile)>, GpuError> {
        let mut offered = Vec::new();
        for nvml_enum in 0..ENUM_CEILING {
            match self.gi_profile_slot(dev, nvml_enum)? {
                ProfileSlot::Offered(p) => offered.push((nvml_enum, p)),
                ProfileSlot::Absent => {}
                ProfileSlot::PastLast if nvml_enum >= NVML_GPU_INSTANCE_PROFILE_COUNT => break,
                ProfileSlot::PastLast => {}
            }
        }
        Ok(offered)
    }

    /// The GPU-instance profile at an enum index, `None` where the GPU has none.
    pub(super) fn gi_profile(
        &self,
        dev: nvmlDevice_t,
        nvml_enum: u32,
    ) -> Result<Option<GiProfile>, GpuError> {
        Ok(match self.gi_profile_slot(dev, nvml_enum)? {
            ProfileSlot::Offered(p) => Some(p),
            ProfileSlot::Absent | ProfileSlot::PastLast => None,
        })
    }

    /// What the driver answers for the GPU-instance profile at an enum index. Asks the
    /// versioned query with the v2 struct (it carries the name) and falls back to the
    /// unversioned one on drivers that lack it or reject the version.
    ///
    /// Not v3: driver 580.159 fills a v3 struct's numbers in the v3 layout but writes the
    /// name at the v2 offset, formatted from the wrong fields (`MIG 7g.0gb` for 1g.10gb),
    /// as seen on a real H100. v3 only adds capability bits, which the agent does not use.
    fn gi_profile_slot(
        &self,
        dev: nvmlDevice_t,
        nvml_enum: u32,
    ) -> Result<ProfileSlot<GiProfile>, GpuError> {
        if self.lib.nvmlDeviceGetGpuInstanceProfileInfoV.is_ok() {
            match self.gi_profile_info_v2(dev, nvml_enum) {
                Ok(i) => {
                    return Ok(ProfileSlot::Offered(GiProfile {
                        id: i.id,
                        name: profile_name(&i.name),
                        slice_count: i.sliceCount,
                        instance_count: i.instanceCount,
                        sms: i.multiprocessorCount,
                        memory_mib: i.memorySizeMB,
                        engines: engines(
                            i.copyEngineCount,
                            i.decoderCount,
                            i.encoderCount,
                            i.jpegCount,
                            i.ofaCount,
                        ),
                    }));
                }
                Err(e) if e.code == ErrorCode::NotSupported => return Ok(ProfileSlot::Absent),
                // An invalid argument may be the enum index or a rejected struct version:
                // the unversioned query below tells them apart.
                Err(e) if e.code == ErrorCode::InvalidArgument => {}
                Err(e) => return Err(e),
            }
        }
        match self.gi_profile_info_v1(dev, nvml_enum) {
            Ok(i) => Ok(ProfileSlot::Offered(GiProfile {
                id: i.id,
                name: String::new(),
                slice_count: i.sliceCount,
                instance_count: i.instanceCount,
                sms: i.multiprocessorCount,
                memory_mib: i.memorySizeMB,
                engines: engines(
                    i.copyEngineCount,
                    i.decoderCount,
                    i.encoderCount,
                    i.jpegCount,
                    i.ofaCount,
                ),
            })),
            Err(e) => Ok(absent_or_past_last(e)?),
        }
    }

    /// The name of what the versioned profile query answers for an enum index.
    pub(super) fn gi_profile_answer(&self, dev: nvmlDevice_t, nvml_enum: u32) -> &'static str {
        let Ok(f) = nvml_sym(self.lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref()) else {
            return "symbol missing";
        };
        let mut info = nvmlGpuInstanceProfileInfo_v2_t::zeroed();
        info.version = struct_version(std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>(), 2);
        // SAFETY: as in `gi_profile_info_v2`.
        let ret = unsafe { f(dev, nvml_enum, &mut info) };
        super::errors::return_name(ret)
    }

    pub(super) fn gi_profile_info_v1(
        &self,
        dev: nvmlDevice_t,
        nvml_enum: u32,
    ) -> Result<nvmlGpuInstanceProfileInfo_t, GpuError> {
        const F: &str = "nvmlDeviceGetGpuInstanceProfileInfo";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceGetGpuInstanceProfileInfo.as_ref()))?;
        let mut info = nvmlGpuInstanceProfileInfo_t::zeroed();
        // SAFETY: `f` has nvml.h's signature; `dev` is a live device handle (see `Raw`);
        // `info` is a writable struct of the type the function fills.
        let ret = unsafe { f(dev, nvml_enum, &mut info) };
        self.check(F, ret).map(|()| info)
    }

    pub(super) fn gi_profile_info_v2(
        &self,
        dev: nvmlDevice_t,
        nvml_enum: u32,
    ) -> Result<nvmlGpuInstanceProfileInfo_v2_t, GpuError> {
        const F: &str = "nvmlDeviceGetGpuInstanceProfileInfoV";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref()))?;
        let mut info = nvmlGpuInstanceProfileInfo_v2_t::zeroed();
        info.version = struct_version(std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>(), 2);
        // SAFETY: `f` has nvml.h's signature; `dev` is a live device handle (see `Raw`);
        // `info` is a writable v2 struct whose version field says so.
        let ret = unsafe { f(dev, nvml_enum, &mut info) };
        self.check(F, ret).map(|()| info)
    }

    pub(super) fn gi_possible_placements(
        &self,
        dev: nvmlDevice_t,
        profile_id: u32,
    ) -> Result<Vec<nvmlGpuInstancePlacement_t>, GpuError> {
        const F: &str = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
        let f =
            self.sym(F, nvml_sym(self.lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref()))?;
        let mut count: c_uint = 0;
        // SAFETY: `f` has nvml.h's signature; a null `placements` asks for the count only,
        // written to the live local `count`. `dev` is a live device handle (see `Raw`).
        let ret = unsafe { f(dev, profile_id, ptr::null_mut(), &mut count) };
        self.check(F, ret)?;
        if count == 0 {
            return Ok(Vec::new());
        }
        // The driver's count sizes a buffer: bounded (no GPU has more than a dozen
        // placements of a profile). A larger count is refused before the second call, not
        // capped: given a buffer, the real driver writes every placement whatever `*count`
        // says (an H100, sim/nvml/tests/data/h100-placements-probe-2026-12-06.json).
        if count > MAX_LISTED {
            return Err(GpuError::new(self.call, Some(self.gpu), ErrorCode::Unknown).with_detail(
                format!("{F} reported {count} placements, more than the {MAX_LISTED} read"),
            ));
        }
        let mut placements = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
        let mut written = count;
        // SAFETY: as above; `placements` holds `count` elements, as many as NVML said the
        // profile has (the driver writes that many, whatever `written` holds).
        let ret = unsafe { f(dev, profile_id, placements.as_mut_ptr(), &mut written) };
        self.check(F, ret)?;
        placements.truncate(written.min(count) as usize);
        Ok(placements)
    }

    pub(super) fn gpu_instances(
        &self,
        dev: nvmlDevice_t,
        profile_id: u32,
        capacity: u32,
    ) -> Result<Vec<nvmlGpuInstance_t>, GpuError> {
        const F: &str = "nvmlDeviceGetGpuInstances";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceGetGpuInstances.as_ref()))?;
        // The profile's instanceCount, from the driver, sizes a buffer: bounded.
        let capacity = capacity.clamp(1, MAX_LISTED);
        let mut handles: Vec<nvmlGpuInstance_t> = vec![ptr::null_mut(); capacity as usize];
        let mut count: c_uint = capacity;
        // SAFETY: `f` has nvml.h's signature; `handles` holds the profile's instanceCount
        // handles, the size nvml.h requires; `count` is a live local. `dev` is a live
        // device handle (see `Raw`).
        let ret = unsafe { f(dev, profile_id, handles.as_mut_ptr(), &mut count) };
        self.check(F, ret)?;
        handles.truncate(count.min(capacity) as usize);
        Ok(handles)
    }

    pub(super) fn gi_info(&self, gi: nvmlGpuInstance_t) -> Result<nvmlGpuInstanceInfo_t, GpuError> {
        const F: &str = "nvmlGpuInstanceGetInfo";
        let f = self.sym(F, nvml_sym(self.lib.nvmlGpuInstanceGetInfo.as_ref()))?;
        let mut info = nvmlGpuInstanceInfo_t::zeroed();
        // SAFETY: `f` has nvml.h's signature; `gi` came from NVML (see `Raw`); `info` is
        // a writable struct of the type the function fills.
        let ret = unsafe { f(gi, &mut info) };
        self.check(F, ret).map(|()| info)
    }

    pub(super) fn gi_by_id(
        &self,
        dev: nvmlDevice_t,
        id: u32,
    ) -> Result<nvmlGpuInstance_t, GpuError> {
        const F: &str = "nvmlDeviceGetGpuInstanceById";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceGetGpuInstanceById.as_ref()))?;
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: `f` has nvml.h's signature; `dev` is a live device handle (see `Raw`);
        // `gi` is a live local for the returned handle.
        let ret = unsafe { f(dev, id, &mut gi) };
        self.check(F, ret).map(|()| gi)
    }

    pub(super) fn create_gi(
        &self,
        dev: nvmlDevice_t,
        profile_id: u32,
        start: u32,
        size: u32,
    ) -> Result<nvmlGpuInstance_t, GpuError> {
        const F: &str = "nvmlDeviceCreateGpuInstanceWithPlacement";
        let f =
            self.sym(F, nvml_sym(self.lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref()))?;
        let placement = nvmlGpuInstancePlacement_t { start, size };
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: `f` has nvml.h's signature; `placement` is a live struct NVML only
        // reads; `gi` is a live local for the new handle. `dev` is a live device handle
        // (see `Raw`).
        let ret = unsafe { f(dev, profile_id, &placement, &mut gi) };
        self.check(F, ret).map(|()| gi)
    }

    pub(super) fn destroy_gi(&self, gi: nvmlGpuInstance_t) -> Result<(), GpuError> {
        const F: &str = "nvmlGpuInstanceDestroy";
        let f = self.sym(F, nvml_sym(self.lib.nvmlGpuInstanceDestroy.as_ref()))?;
        // SAFETY: `f` has nvml.h's signature; `gi` came from NVML (see `Raw`) and is not
        // used after this call.
        let ret = unsafe { f(gi) };
        self.check(F, ret)
    }

    /// Every compute-instance profile a GPU instance offers, by enum index, enumerated
    /// as [`Raw::gi_profiles`] does.
    pub(super) fn ci_profiles(
        &self,
        gi: nvmlGpuInstance_t,
    ) -> Result<Vec<(u32, nvmlComputeInstanceProfileInfo_t)>, GpuError> {
        let mut offered = Vec::new();
        for ci_enum in 0..ENUM_CEILING {
            match self.ci_profile_slot(gi, ci_enum)? {
                ProfileSlot::Offered(p) => offered.push((ci_enum, p)),
                ProfileSlot::Absent => {}
                ProfileSlot::PastLast if ci_enum >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT => break,
                ProfileSlot::PastLast => {}
            }
        }
        Ok(offered)
    }

    /// What the driver answers for the compute-instance profile at an enum index.
    fn ci_profile_slot(
        &self,
        gi: nvmlGpuInstance_t,
        ci_enum: u32,
    ) -> Result<ProfileSlot<nvmlComputeInstanceProfileInfo_t>, GpuError> {
        const F: &str = "nvmlGpuInstanceGetComputeInstanceProfileInfo";
        let f =
            self.sym(F, nvml_sym(self.lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref()))?;
        let mut info = nvmlComputeInstanceProfileInfo_t::zeroed();
        // SAFETY: `f` has nvml.h's signature; `gi` came from NVML (see `Raw`); `info` is
        // a writable struct of the type the function fills.
        let ret = unsafe { f(gi, ci_enum, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &mut info) };
        match self.check(F, ret) {
            Ok(()) => Ok(ProfileSlot::Offered(info)),
            Err(e) => absent_or_past_last(e),
        }
    }

    pub(super) fn compute_instances(
        &self,
        gi: nvmlGpuInstance_t,
        profile_id: u32,
        capacity: u32,
    ) -> Result<Vec<nvmlComputeInstance_t>, GpuError> {
        const F: &str = "nvmlGpuInstanceGetComputeInstances";
        let f = self.sym(F, nvml_sym(self.lib.nvmlGpuInstanceGetComputeInstances.as_ref()))?;
        // The profile's instanceCount, from the driver, sizes a buffer: bounded.
        let capacity = capacity.clamp(1, MAX_LISTED);
        let mut handles: Vec<nvmlComputeInstance_t> = vec![ptr::null_mut(); capacity as usize];
        let mut count: c_uint = capacity;
        // SAFETY: `f` has nvml.h's signature; `handles` holds the profile's instanceCount
        // handles, the size nvml.h requires; `count` is a live local. `gi` came from NVML
        // (see `Raw`).
        let ret = unsafe { f(gi, profile_id, handles.as_mut_ptr(), &mut count) };
        self.check(F, ret)?;
        handles.truncate(count.min(capacity) as usize);
        Ok(handles)
    }

    /// Every compute instance of a GPU instance as `(id, handle, compute slices)`, sorted
    /// by id. The slices are those of the profile it was found under, which is the one
    /// `nvmlComputeInstanceGetInfo_v2` names.
    pub(super) fn compute_instances_of(
        &self,
        gi: nvmlGpuInstance_t,
    ) -> Result<Vec<(u32, nvmlComputeInstance_t, u32)>, GpuError> {
        let mut profile_ids = HashSet::new();
        let mut found: BTreeMap<u32, (nvmlComputeInstance_t, u32)> = BTreeMap::new();
        for (_, profile) in self.ci_profiles(gi)? {
            if profile.instanceCount == 0 || !profile_ids.insert(profile.id) {
                continue;
            }
            for ci in self.compute_instances(gi, profile.id, profile.instanceCount)? {
                found.entry(self.ci_info(ci)?.id).or_insert((ci, profile.sliceCount));
            }
        }
        Ok(found.into_iter().map(|(id, (ci, slices))| (id, ci, slices)).collect())
    }

    pub(super) fn ci_info(
        &self,
        ci: nvmlComputeInstance_t,
    ) -> Result<nvmlComputeInstanceInfo_t, GpuError> {
        const F: &str = "nvmlComputeInstanceGetInfo_v2";
        let f = self.sym(F, nvml_sym(self.lib.nvmlComputeInstanceGetInfo_v2.as_ref()))?;
        let mut info = nvmlComputeInstanceInfo_t::zeroed();
        // SAFETY: `f` has nvml.h's signature; `ci` came from NVML (see `Raw`); `info` is
        // a writable struct of the type the function fills.
        let ret = unsafe { f(ci, &mut info) };
        self.check(F, ret).map(|()| info)
    }

    pub(super) fn ci_by_id(
        &self,
        gi: nvmlGpuInstance_t,
        id: u32,
    ) -> Result<nvmlComputeInstance_t, GpuError> {
        const F: &str = "nvmlGpuInstanceGetComputeInstanceById";
        let f = self.sym(F, nvml_sym(self.lib.nvmlGpuInstanceGetComputeInstanceById.as_ref()))?;
        let mut ci: nvmlComputeInstance_t = ptr::null_mut();
        // SAFETY: `f` has nvml.h's signature; `gi` came from NVML (see `Raw`); `ci` is a
        // live local for the returned handle.
        let ret = unsafe { f(gi, id, &mut ci) };
        self.check(F, ret).map(|()| ci)
    }

    pub(super) fn create_ci(
        &self,
        gi: nvmlGpuInstance_t,
        profile_id: u32,
    ) -> Result<nvmlComputeInstance_t, GpuError> {
        const F: &str = "nvmlGpuInstanceCreateComputeInstance";
        let f = self.sym(F, nvml_sym(self.lib.nvmlGpuInstanceCreateComputeInstance.as_ref()))?;
        let mut ci: nvmlComputeInstance_t = ptr::null_mut();
        // SAFETY: `f` has nvml.h's signature; `gi` came from NVML (see `Raw`); `ci` is a
        // live local for the new handle.
        let ret = unsafe { f(gi, profile_id, &mut ci) };
        self.check(F, ret).map(|()| ci)
    }

    pub(super) fn destroy_ci(&self, ci: nvmlComputeInstance_t) -> Result<(), GpuError> {
        const F: &str = "nvmlComputeInstanceDestroy";
        let f = self.sym(F, nvml_sym(self.lib.nvmlComputeInstanceDestroy.as_ref()))?;
        // SAFETY: `f` has nvml.h's signature; `ci` came from NVML (see `Raw`) and is not
        // used after this call.
        let ret = unsafe { f(ci) };
        self.check(F, ret)
    }

    pub(super) fn mig_gpu_instance_id(&self, mig: nvmlDevice_t) -> Result<u32, GpuError> {
        const F: &str = "nvmlDeviceGetGpuInstanceId";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceGetGpuInstanceId.as_ref()))?;
        let mut id: c_uint = 0;
        // SAFETY: `f` has nvml.h's signature; `mig` is a live MIG device handle (see
        // `Raw`); `id` is a live local.
        let ret = unsafe { f(mig, &mut id) };
        self.check(F, ret).map(|()| id)
    }

    pub(super) fn mig_compute_instance_id(&self, mig: nvmlDevice_t) -> Result<u32, GpuError> {
        const F: &str = "nvmlDeviceGetComputeInstanceId";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceGetComputeInstanceId.as_ref()))?;
        let mut id: c_uint = 0;
        // SAFETY: `f` has nvml.h's signature; `mig` is a live MIG device handle (see
        // `Raw`); `id` is a live local.
        let ret = unsafe { f(mig, &mut id) };
        self.check(F, ret).map(|()| id)
    }

    /// Sets the MIG mode; returns the activation status.
    pub(super) fn set_mig_mode(
        &self,
        dev: nvmlDevice_t,
        mode: u32,
    ) -> Result<nvmlReturn_t, GpuError> {
        const F: &str = "nvmlDeviceSetMigMode";
        let f = self.sym(F, nvml_sym(self.lib.nvmlDeviceSetMigMode.as_ref()))?;
        let mut status: nvmlReturn_t = sys::nvmlReturn_enum_NVML_SUCCESS;
        // SAFETY: `f` has nvml.h's signature; `dev` is a live device handle (see `Raw`);
        // `status` is a live local for the activation status.
        let ret = unsafe { f(dev, mode, &mut status) };
        self.check(F, ret).map(|()| status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_names_lose_the_mig_prefix() {
        let mut raw = [0 as std::os::raw::c_char; 96];
        for (slot, b) in raw.iter_mut().zip(b"MIG 1g.10gb+me") {
            *slot = *b as std::os::raw::c_char;
        }
        assert_eq!(profile_name(&raw), "1g.10gb+me");
        let mut raw = [0 as std::os::raw::c_char; 96];
        for (slot, b) in raw.iter_mut().zip(b"3g.40gb") {
            *slot = *b as std::os::raw::c_char;
        }
        assert_eq!(profile_name(&raw), "3g.40gb");
        assert_eq!(profile_name(&[0; 4]), "");
    }

    #[test]
    fn struct_versions_are_nvml_h_values() {
        // NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2): 152 bytes, version 2.
        assert_eq!(std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>(), 152);
        assert_eq!(
            struct_version(std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>(), 2),
            0x0200_0098
        );
    }
}
