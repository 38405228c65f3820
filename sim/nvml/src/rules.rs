//! The driver's MIG and compute rules on a [`Node`], pure (no I/O), answering NVML return
//! codes. The C ABI (`abi`) looks handles up and calls these.

use gpushare_catalog::{Engines, GpuModel, MigProfile};

use crate::abi::types::{
    NO_INSTANCE, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1, NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    NVML_GPU_INSTANCE_PROFILE_COUNT,
};
use crate::codes::{Code, ret};
use crate::node::{ComputeInstance, ComputeMode, Gpu, GpuInstance, Node, uuid_like};

/// The standard compute-instance profiles: (enum, compute slices).
const CI_STANDARD: [(u32, u8); 5] = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 7)];

/// A compute-instance profile offered inside a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CiProfile {
    /// `NVML_COMPUTE_INSTANCE_PROFILE_*`; also the profile id (`ProfileInfo.id`).
    pub nvml_enum: u32,
    /// Compute slices.
    pub slices: u8,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Most instances of it in the GPU instance (GI slices / slices).
    pub instance_count: u32,
}

/// A compute process as NVML lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessView {
    /// Process id.
    pub pid: u32,
    /// GPU instance id or [`NO_INSTANCE`].
    pub gpu_instance: u32,
    /// Compute instance id or [`NO_INSTANCE`].
    pub compute_instance: u32,
    /// The GPU memory it uses, in bytes.
    pub memory: u64,
    /// Whether it is an MPS client.
    pub mps: bool,
}

/// The GPU at `index`, or INVALID_ARGUMENT.
pub fn gpu(node: &Node, index: u32) -> Result<&Gpu, Code> {
    node.gpus.get(index as usize).ok_or(ret::INVALID_ARGUMENT)
}

fn gpu_mut(node: &mut Node, index: u32) -> Result<&mut Gpu, Code> {
    node.gpus.get_mut(index as usize).ok_or(ret::INVALID_ARGUMENT)
}

fn mig_model(g: &Gpu) -> Result<&'static GpuModel, Code> {
    let model = g.model();
    if model.supports_mig() { Ok(model) } else { Err(ret::NOT_SUPPORTED) }
}

/// `nvmlDeviceGetGpuInstanceProfileInfo*` by enum: a MIG-less GPU or an enum the model
/// lacks is NOT_SUPPORTED; an enum at or past `NVML_GPU_INSTANCE_PROFILE_COUNT` is
/// INVALID_ARGUMENT (as the real H100 answered). Works with MIG off.
pub fn gi_profile_by_enum(g: &Gpu, nvml_enum: u32) -> Result<&'static MigProfile, Code> {
    let model = mig_model(g)?;
    if nvml_enum >= NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(ret::INVALID_ARGUMENT);
    }
    model.mig_profiles.iter().find(|p| p.nvml_enum == nvml_enum).ok_or(ret::NOT_SUPPORTED)
}

/// A GPU-instance profile by id: MIG-less GPU NOT_SUPPORTED, unknown id INVALID_ARGUMENT.
pub fn gi_profile_by_id(g: &Gpu, id: u32) -> Result<&'static MigProfile, Code> {
    mig_model(g)?.profile_by_id(id).ok_or(ret::INVALID_ARGUMENT)
}

/// The profile of an existing GPU instance.
pub fn profile_of(g: &Gpu, gi: &GpuInstance) -> &'static MigProfile {
    g.model().profile_by_id(gi.profile_id).expect("GPU instances have catalog profiles")
}

/// `nvmlDeviceSetMigMode`: returns the activation status. A GPU without MIG is
/// NOT_SUPPORTED; disabling with GPU instances is IN_USE. A GPU that is not idle cannot be
/// unbound to switch (nvml.h: the activation status is IN_USE "if device unbind fails
/// because the device isn't idle"): the change stays pending until a reset, on every
/// model while compute processes run, and on Ampere also while persistence mode holds the
/// GPU. Otherwise it takes effect at once.
pub fn set_mig_mode(node: &mut Node, index: u32, enabled: bool) -> Result<Code, Code> {
    let busy = !node.pids_on(index).is_empty();
    let g = gpu_mut(node, index)?;
    let model = mig_model(g)?;
    if !enabled && !g.instances.is_empty() {
        return Err(ret::IN_USE);
    }
    if enabled == g.mig_enabled {
        g.mig_pending = None;
        return Ok(ret::SUCCESS);
    }
    if busy || (model.mode_change_may_need_reset() && g.persistence_mode) {
        g.mig_pending = Some(enabled);
        return Ok(ret::IN_USE);
    }
    g.mig_enabled = enabled;
    g.mig_pending = None;
    Ok(ret::SUCCESS)
}

/// `nvmlDeviceSetComputeMode`.
pub fn set_compute_mode(node: &mut Node, index: u32, mode: u32) -> Result<(), Code> {
    let mode = ComputeMode::from_nvml(mode).ok_or(ret::INVALID_ARGUMENT)?;
    gpu_mut(node, index)?.compute_mode = mode;
    Ok(())
}

/// `nvmlDeviceSetPersistenceMode`.
pub fn set_persistence_mode(node: &mut Node, index: u32, enabled: bool) -> Result<(), Code> {
    gpu_mut(node, index)?.persistence_mode = enabled;
    Ok(())
}

/// The copy and media engines of the whole GPU: the most of each kind that one profile of
/// the model gets (the full-GPU profile's on every model the catalog has).
pub fn engine_totals(model: &GpuModel) -> Engines {
    model.mig_profiles.iter().fold(Engines::default(), |all, p| {
        let e = p.engines;
        Engines {
            copy: all.copy.max(e.copy),
            decoders: all.decoders.max(e.decoders),
            encoders: all.encoders.max(e.encoders),
            jpeg: all.jpeg.max(e.jpeg),
            ofa: all.ofa.max(e.ofa),
        }
    })
}

/// `a + b`, kind by kind.
fn add_engines(a: Engines, b: Engines) -> Engines {
    Engines {
        copy: a.copy.saturating_add(b.copy),
        decoders: a.decoders.saturating_add(b.decoders),
        encoders: a.encoders.saturating_add(b.encoders),
        jpeg: a.jpeg.saturating_add(b.jpeg),
        ofa: a.ofa.saturating_add(b.ofa),
    }
}

/// Whether `used` fits in `total`, kind by kind.
fn engines_within(used: Engines, total: Engines) -> bool {
    used.copy <= total.copy
        && used.decoders <= total.decoders
        && used.encoders <= total.encoders
        && used.jpeg <= total.jpeg
        && used.ofa <= total.ofa
}

/// Why a GPU instance of `profile` at `start` cannot be added: INSUFFICIENT_RESOURCES when
/// it overlaps an instance, exceeds the profile's count, the GPU's compute slices or its
/// engines.
///
/// The engines are a budget: each GPU instance takes its profile's copy and media engines
/// out of the whole GPU's ([`engine_totals`]). Assumed, not recorded on hardware: it is
/// what the guide's words mean ("+me.all takes every media engine", "only one instance
/// can own" the OFA), and it never binds a layout of plain profiles within their counts
/// and slices on any catalog model (the tests check); it is what keeps, on an RTX PRO
/// 6000, a `1g.24gb+me.all` (all four decoders) from sharing the GPU with a `1g.24gb`
/// (one decoder) while three `1g.24gb-me` (none) fit beside it.
fn check_fits(
    g: &Gpu,
    extra: &[(u8, u8, u32)],
    profile: &MigProfile,
    start: u8,
) -> Result<(), Code> {
    let model = g.model();
    let end = start + profile.memory_slices;
    let taken = g
        .instances
        .iter()
        .map(|gi| (gi.start, gi.size, gi.profile_id))
        .chain(extra.iter().copied());
    let mut same = 0;
    let mut compute = 0;
    let mut engines = profile.engines;
    for (s, size, profile_id) in taken {
        if start < s + size && s < end {
            return Err(ret::INSUFFICIENT_RESOURCES);
        }
        if profile_id == profile.id {
            same += 1;
        }
        if let Some(p) = model.profile_by_id(profile_id) {
            compute += p.compute_slices;
            engines = add_engines(engines, p.engines);
        }
    }
    if same >= profile.max_count
        || compute + profile.compute_slices > model.compute_slices
        || !engines_within(engines, engine_totals(model))
    {
        return Err(ret::INSUFFICIENT_RESOURCES);
    }
    Ok(())
}

/// `nvmlDeviceGetGpuInstanceRemainingCapacity`: how many more instances of the profile
/// fit, placed greedily on its possible placements. With MIG off it answers for the empty
/// GPU, as the real H100 did (7 for 1g.10gb).
pub fn remaining_capacity(g: &Gpu, profile_id: u32) -> Result<u32, Code> {
    let profile = gi_profile_by_id(g, profile_id)?;
    let mut extra = Vec::new();
    for &start in &profile.placements {
        if check_fits(g, &extra, profile, start).is_ok() {
            extra.push((start, profile.memory_slices, profile.id));
        }
    }
    Ok(extra.len() as u32)
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`: returns the new instance's id. MIG off is
/// NOT_SUPPORTED (nvml.h: "If device doesn't have MIG mode enabled"); an unknown profile,
/// a start that is not one of the profile's placements, or a size other than its
/// placement size is INVALID_ARGUMENT; no room is INSUFFICIENT_RESOURCES.
pub fn create_gpu_instance(
    node: &mut Node,
    index: u32,
    profile_id: u32,
    start: u32,
    size: u32,
) -> Result<u32, Code> {
    let g = gpu(node, index)?;
    mig_model(g)?;
    if !g.mig_enabled {
        return Err(ret::NOT_SUPPORTED);
    }
    let profile = gi_profile_by_id(g, profile_id)?;
    let start = u8::try_from(start).map_err(|_| ret::INVALID_ARGUMENT)?;
    if !profile.placements.contains(&start) || size != u32::from(profile.memory_slices) {
        return Err(ret::INVALID_ARGUMENT);
    }
    check_fits(g, &[], profile, start)?;
    let id = gpu_instance_id(g.model(), start, profile.memory_slices);
    let serial = node.next_serial();
    let g = gpu_mut(node, index)?;
    g.instances.push(GpuInstance {
        id,
        profile_id,
        start,
        size: profile.memory_slices,
        serial,
        compute_instances: Vec::new(),
    });
    Ok(id)
}

/// The id the driver gives a GPU instance: its node in the binary tree of the GPU's
/// memory slots (the whole GPU 0; halves 1-2; quarters 3-6; eighths 7-14 on an 8-slot
/// GPU), so that it follows from the placement as on hardware: a 7g is GI 0, a 3g at slot
/// 4 GI 2, a 1g at slot 2 GI 9 (NVIDIA's MIG user guide's A100 listings). Published H100
/// listings number the eighths from slot 4 on (slots 4-6 are GI 7-9, slots 0-3 GI 11-14);
/// Hopper's eighths follow that. Its larger instances keep the A100's numbering: no
/// listing of them was at hand.
///
/// The tree's leaves are the model's smallest placement, not one memory slot: an instance
/// of `size` slots is one of `memory_slots / size` nodes on its level. On the 8-slot
/// GPUs and the A30's 4 slots that is the slot tree; on the RTX PRO 6000's 12-slot grid
/// (a compute slice takes 3 slots) the 1g's at 0, 3, 6, 9 are GI 3-6 and a 2g at 0 GI 1,
/// as the published `-lgi` shows (catalog/listings.md, KS). Every catalog model's sizes
/// divide its slots into a power of two of positions, which a tree needs (the tests
/// check that no two placements share an id). Assumed for models nobody recorded: the
/// Blackwell 7-slice GPUs number as the guide's A100 (their eighths not rotated as
/// Hopper's), and the RTX PRO 5000's 6-slot grid as the 6000's.
pub fn gpu_instance_id(model: &GpuModel, start: u8, size: u8) -> u32 {
    let slots = u32::from(model.memory_slots);
    let size = u32::from(size.max(1));
    let positions = slots / size;
    let mut position = u32::from(start) / size;
    if model.architecture == gpushare_catalog::Architecture::Hopper && size == 1 && positions == 8 {
        position = (position + 4) % 8;
    }
    positions.saturating_sub(1) + position
}

/// Gives every GPU instance of a node the id its placement implies
/// ([`gpu_instance_id`]), moving the processes that name an old id along: a state file
/// written before ids followed placements numbered them in creation order, and two
/// instances must never share an id. Placements never overlap, so the new ids are unique.
pub fn renumber_instances(node: &mut Node) {
    for (index, g) in node.gpus.iter_mut().enumerate() {
        let model = g.model();
        let mut moved = Vec::new();
        for gi in &mut g.instances {
            let id = gpu_instance_id(model, gi.start, gi.size);
            if gi.id != id {
                moved.push((gi.id, id));
                gi.id = id;
            }
        }
        for p in node.processes.iter_mut().filter(|p| p.gpu as usize == index) {
            if let Some(&(_, new)) = moved.iter().find(|(old, _)| Some(*old) == p.gpu_instance) {
                p.gpu_instance = Some(new);
            }
        }
    }
}

/// The placement the driver picks when none is given (`nvmlDeviceCreateGpuInstance`,
/// `nvidia-smi mig -cgi`): it keeps room for large instances, taking the free placement
/// that makes the fewest other placements (of any profile) unusable, the lowest start on
/// a tie. That rule gives every placement of NVIDIA's MIG user guide examples (A100-40GB
/// `-cgi 19,14,5` at 6, 4, 0; `9,19,14,19` at 4, 0, 2, 1; `14,19,19,19,19,19` at 4, 6, 0,
/// 1, 2, 3; `19,19,14,9` failing on the 3g after 6, 4, 0) and the published H100 `-cgi`
/// of seven 1g (6, 4, 5, 0, 1, 2, 3). It knows no slot count: on the RTX PRO 6000's
/// 12-slot grid, where every profile's placements cover the whole grid, each free start
/// blocks as many as any other and the lowest wins, which is the published order (four
/// 1g.24gb at 0, 3, 6, 9; a 2g.48gb at 0, then 1g's at 6 and 9; catalog/listings.md, KS)
/// and the A30's (1g's at 0 then 1, a 2g at 2; A30L). For the models nobody recorded it
/// is assumed to hold as it does for these.
pub fn driver_placement(g: &Gpu, profile_id: u32) -> Result<u8, Code> {
    let profile = gi_profile_by_id(g, profile_id)?;
    let taken: Vec<(u8, u8)> = g.instances.iter().map(|gi| (gi.start, gi.size)).collect();
    let overlap = |a: u8, a_size: u8, b: u8, b_size: u8| a < b + b_size && b < a + a_size;
    let free = |start: u8, size: u8| taken.iter().all(|&(s, n)| !overlap(start, size, s, n));
    let usable: Vec<(u8, u8)> = g
        .model()
        .mig_profiles
        .iter()
        .flat_map(|p| p.placements.iter().map(|&s| (s, p.memory_slices)))
        .filter(|&(s, n)| free(s, n))
        .collect();
    let size = profile.memory_slices;
    profile
        .placements
        .iter()
        .copied()
        .filter(|&start| check_fits(g, &[], profile, start).is_ok())
        .min_by_key(|&start| {
            let blocked = usable.iter().filter(|&&(s, n)| overlap(start, size, s, n)).count();
            (blocked, start)
        })
        .ok_or(ret::INSUFFICIENT_RESOURCES)
}

/// `nvmlGpuInstanceDestroy`: IN_USE while it has compute instances or compute processes.
pub fn destroy_gpu_instance(node: &mut Node, index: u32, gi_id: u32) -> Result<(), Code> {
    let in_use = node.listed_on(index).any(|p| p.gpu_instance == Some(gi_id));
    let g = gpu_mut(node, index)?;
    let pos = g.instances.iter().position(|gi| gi.id == gi_id).ok_or(ret::INVALID_ARGUMENT)?;
    if in_use || !g.instances[pos].compute_instances.is_empty() {
        return Err(ret::IN_USE);
    }
    g.instances.remove(pos);
    Ok(())
}

/// The compute-instance profiles a GPU instance offers: one per standard slice count `c`
/// up to its compute slices that the catalog has a `c`-slice profile for, with the GPU
/// instance's SMs when `c` is all of it and the standard `cg` profile's SMs otherwise; and,
/// where the GPU instance is a 1-slice profile with more SMs than the standard 1g one
/// (H100 1g.20gb: 26 vs 16), also `1_SLICE_REV1` with its SMs (then `1_SLICE` has the
/// standard 16).
pub fn ci_profiles(model: &GpuModel, gi_profile: &MigProfile) -> Vec<CiProfile> {
    let gi_slices = gi_profile.compute_slices;
    let standard_1g = model.profile_by_compute_slices(1);
    let rev1 = gi_slices == 1 && standard_1g.is_some_and(|p| p.sms != gi_profile.sms);
    let mut out = Vec::new();
    for (nvml_enum, c) in CI_STANDARD {
        if c > gi_slices {
            continue;
        }
        let Some(standard) = model.profile_by_compute_slices(c) else {
            continue;
        };
        let sms = if c == gi_slices && !rev1 { gi_profile.sms } else { standard.sms };
        out.push(CiProfile { nvml_enum, slices: c, sms, instance_count: u32::from(gi_slices / c) });
    }
    if rev1 {
        out.push(CiProfile {
            nvml_enum: NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1,
            slices: 1,
            sms: gi_profile.sms,
            instance_count: 1,
        });
    }
    out
}

/// The compute-instance profile at `nvml_enum` in a GPU instance: at or past
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` INVALID_ARGUMENT, not offered NOT_SUPPORTED.
pub fn ci_profile(g: &Gpu, gi: &GpuInstance, nvml_enum: u32) -> Result<CiProfile, Code> {
    if nvml_enum >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        return Err(ret::INVALID_ARGUMENT);
    }
    ci_profiles(g.model(), profile_of(g, gi))
        .into_iter()
        .find(|p| p.nvml_enum == nvml_enum)
        .ok_or(ret::NOT_SUPPORTED)
}

/// The starts a compute instance of `slices` may take in a GPU instance of `gi_slices`
/// compute slices: aligned to the power of two at or above its size, as GPU-instance
/// placements are (on a 7-slice GPU instance 1c {0..6}, 2c {0,2,4}, 3c {0,4}, 4c {0}; in
/// the RTX PRO 6000's 4-slice one 1c {0..3}, 2c {0,2}, 4c {0}). Compute slices are
/// counted alone, whatever memory slots a compute slice spans (3 on the RTX PRO 6000).
pub fn ci_placements(gi_slices: u8, slices: u8) -> Vec<u8> {
    let align = slices.max(1).next_power_of_two();
    (0..gi_slices).step_by(usize::from(align)).filter(|&s| s + slices <= gi_slices).collect()
}

/// Whether a compute instance of `slices` at `start` overlaps none of `gi`'s.
fn ci_free(gi: &GpuInstance, start: u8, slices: u8) -> bool {
    gi.compute_instances.iter().all(|ci| start + slices <= ci.start || ci.start + ci.size <= start)
}

/// `nvmlGpuInstanceGetComputeInstanceRemainingCapacity`: how many more compute instances
/// of the profile fit, placed greedily, within its count.
pub fn ci_remaining_capacity(g: &Gpu, gi: &GpuInstance, profile_id: u32) -> Result<u32, Code> {
    let profile = ci_profile(g, gi, profile_id)?;
    let gi_slices = profile_of(g, gi).compute_slices;
    let same = gi.compute_instances.iter().filter(|ci| ci.profile_id == profile_id).count();
    let mut trial = gi.clone();
    let mut fits = 0;
    for start in ci_placements(gi_slices, profile.slices) {
        if ci_free(&trial, start, profile.slices) {
            trial.compute_instances.push(ComputeInstance {
                id: u32::MAX,
                profile_id,
                start,
                size: profile.slices,
                uuid: String::new(),
                serial: 0,
            });
            fits += 1;
        }
    }
    Ok(fits.min(profile.instance_count.saturating_sub(same as u32)))
}

/// `nvmlGpuInstanceCreateComputeInstance`: returns the new compute instance's id. A
/// profile the GPU instance does not offer is NOT_SUPPORTED (INVALID_ARGUMENT past the
/// enum count); no free aligned compute slices or the profile's count reached is
/// INSUFFICIENT_RESOURCES. The MIG UUID is new on every creation.
pub fn create_compute_instance(
    node: &mut Node,
    index: u32,
    gi_id: u32,
    profile_id: u32,
) -> Result<u32, Code> {
    create_compute_instance_at(node, index, gi_id, profile_id, None)
}

/// [`create_compute_instance`] at `placement` (`nvmlGpuInstanceCreateComputeInstance-
/// WithPlacement`): a start that is not one of the profile's placements, or a size other
/// than its slices, is INVALID_ARGUMENT; a taken one INSUFFICIENT_RESOURCES. Without one,
/// the lowest free placement.
pub fn create_compute_instance_at(
    node: &mut Node,
    index: u32,
    gi_id: u32,
    profile_id: u32,
    placement: Option<(u32, u32)>,
) -> Result<u32, Code> {
    let g = gpu(node, index)?;
    let gi = g.instance(gi_id).ok_or(ret::INVALID_ARGUMENT)?;
    let profile = ci_profile(g, gi, profile_id)?;
    let gi_slices = profile_of(g, gi).compute_slices;
    let placements = ci_placements(gi_slices, profile.slices);
    let wanted = match placement {
        None => None,
        Some((start, size)) => {
            let start = u8::try_from(start).map_err(|_| ret::INVALID_ARGUMENT)?;
            if !placements.contains(&start) || size != u32::from(profile.slices) {
                return Err(ret::INVALID_ARGUMENT);
            }
            Some(start)
        }
    };
    let same = gi.compute_instances.iter().filter(|ci| ci.profile_id == profile_id).count();
    if same as u32 >= profile.instance_count {
        return Err(ret::INSUFFICIENT_RESOURCES);
    }
    let start = match wanted {
        Some(start) if ci_free(gi, start, profile.slices) => start,
        Some(_) => return Err(ret::INSUFFICIENT_RESOURCES),
        None => placements
            .into_iter()
            .find(|&s| ci_free(gi, s, profile.slices))
            .ok_or(ret::INSUFFICIENT_RESOURCES)?,
    };
    let id = (0..).find(|id| gi.compute_instances.iter().all(|ci| ci.id != *id)).expect("an id");
    let gpu_uuid = g.uuid.clone();
    let serial = node.next_serial();
    let uuid = format!(
        "MIG-{}",
        uuid_like(&[
            gpu_uuid.as_bytes(),
            &gi_id.to_le_bytes(),
            &id.to_le_bytes(),
            &serial.to_le_bytes()
        ])
    );
    let gi = gpu_mut(node, index)?
        .instances
        .iter_mut()
        .find(|gi| gi.id == gi_id)
        .expect("looked up above");
    gi.compute_instances.push(ComputeInstance {
        id,
        profile_id,
        start,
        size: profile.slices,
        uuid,
        serial,
    });
    Ok(id)
}

/// The compute instance a process in GPU instance `gi` runs in: its lowest-id one.
fn process_ci(gi: Option<&GpuInstance>) -> Option<u32> {
    gi?.compute_instances.iter().map(|ci| ci.id).min()
}

/// `nvmlComputeInstanceDestroy`: IN_USE while a compute process runs in it.
pub fn destroy_compute_instance(
    node: &mut Node,
    index: u32,
    gi_id: u32,
    ci_id: u32,
) -> Result<(), Code> {
    let holders = processes(node, index, Some((gi_id, ci_id)))?;
    if !holders.is_empty() {
        return Err(ret::IN_USE);
    }
    let gi = gpu_mut(node, index)?
        .instances
        .iter_mut()
        .find(|gi| gi.id == gi_id)
        .ok_or(ret::INVALID_ARGUMENT)?;
    let pos =
        gi.compute_instances.iter().position(|ci| ci.id == ci_id).ok_or(ret::INVALID_ARGUMENT)?;
    gi.compute_instances.remove(pos);
    Ok(())
}

/// The compute processes of a GPU, or of one of its MIG devices (`(gi, ci)`), as the
/// driver lists them now ([`Node::listed_processes`]: a registered process whose PID is
/// gone is not). A process placed in a GPU instance runs in its lowest-id compute
/// instance.
pub fn processes(
    node: &Node,
    index: u32,
    mig: Option<(u32, u32)>,
) -> Result<Vec<ProcessView>, Code> {
    let g = gpu(node, index)?;
    let views = node.listed_on(index).map(|p| {
        let (gpu_instance, compute_instance) = match p.gpu_instance {
            None => (NO_INSTANCE, NO_INSTANCE),
            Some(gi) => (gi, process_ci(g.instance(gi)).unwrap_or(NO_INSTANCE)),
        };
        ProcessView { pid: p.pid, gpu_instance, compute_instance, memory: p.memory, mps: p.mps }
    });
    Ok(match mig {
        None => views.collect(),
        Some((gi, ci)) => {
            views.filter(|v| v.gpu_instance == gi && v.compute_instance == ci).collect()
        }
    })
}

/// The MIG devices of a GPU, one per compute instance, in index order (by GPU instance
/// placement, then compute instance id): `(gi id, ci id, ci serial)`. None with MIG off.
pub fn mig_devices(g: &Gpu) -> Vec<(u32, u32, u64)> {
    if !g.mig_enabled {
        return Vec::new();
    }
    let mut gis: Vec<&GpuInstance> = g.instances.iter().collect();
    gis.sort_by_key(|gi| (gi.start, gi.id));
    let mut out = Vec::new();
    for gi in gis {
        let mut cis: Vec<&ComputeInstance> = gi.compute_instances.iter().collect();
        cis.sort_by_key(|ci| ci.id);
        out.extend(cis.into_iter().map(|ci| (gi.id, ci.id, ci.serial)));
    }
    out
}

/// `nvmlDeviceGetMaxMigDeviceCount`: 0 with MIG off or unsupported (nvml.h: "Returns zero
/// if MIG is not supported or enabled"), else the model's compute slices (each compute
/// instance takes at least one).
pub fn max_mig_devices(g: &Gpu) -> u32 {
    if g.mig_enabled { u32::from(g.model().compute_slices) } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Process;
    use gpushare_catalog::{model_by_key, parse_node_spec};

    fn node(spec: &str) -> Node {
        Node::new(&parse_node_spec(spec).unwrap())
    }

    #[test]
    fn ampere_mode_changes_wait_for_a_reset_only_while_the_gpu_is_held() {
        let mut n = node("a100-40gb:2");
        assert_eq!(set_mig_mode(&mut n, 0, true), Ok(ret::IN_USE));
        assert_eq!((n.gpus[0].mig_enabled, n.gpus[0].mig_pending), (false, Some(true)));
        n.gpus[1].persistence_mode = false;
        assert_eq!(set_mig_mode(&mut n, 1, true), Ok(ret::SUCCESS));
        assert!(n.gpus[1].mig_enabled);
        n.gpus[0].persistence_mode = false;
        n.processes.push(Process::new(0, None, 5));
        assert_eq!(set_mig_mode(&mut n, 0, true), Ok(ret::IN_USE));
        let mut h = node("h100-80gb:1");
        assert_eq!(set_mig_mode(&mut h, 0, true), Ok(ret::SUCCESS));
        assert!(h.gpus[0].mig_enabled);
        let mut l = node("l40s:1");
        assert_eq!(set_mig_mode(&mut l, 0, true), Err(ret::NOT_SUPPORTED));
    }

    /// The starts the driver picks for `profiles` in turn on a fresh `spec` GPU, up to the
    /// first that does not fit.
    fn driver_starts(spec: &str, profiles: &[u32]) -> Vec<u8> {
        let mut n = node(spec);
        n.gpus[0].mig_enabled = true;
        let mut out = Vec::new();
        for &id in profiles {
            let Ok(start) = driver_placement(&n.gpus[0], id) else { break };
            let size = u32::from(n.gpus[0].model().profile_by_id(id).unwrap().memory_slices);
            create_gpu_instance(&mut n, 0, id, u32::from(start), size).unwrap();
            out.push(start);
        }
        out
    }

    #[test]
    fn the_driver_places_as_the_mig_user_guide_examples_show() {
        assert_eq!(driver_starts("a100-40gb:1", &[19, 14, 5]), [6, 4, 0]);
        assert_eq!(driver_starts("a100-40gb:1", &[9, 19, 14, 19]), [4, 0, 2, 1]);
        assert_eq!(driver_starts("a100-40gb:1", &[14, 19, 19, 19, 19, 19]), [4, 6, 0, 1, 2, 3]);
        // The guide's failing order: the 3g.20gb no longer fits after these three.
        assert_eq!(driver_starts("a100-40gb:1", &[19, 19, 14, 9]), [6, 4, 0]);
        assert_eq!(driver_starts("h100-80gb:1", &[19; 7]), [6, 4, 5, 0, 1, 2, 3]);
        assert_eq!(driver_starts("h100-80gb:1", &[0, 19]), [0]);
        assert_eq!(driver_starts("a30:1", &[5, 5, 14]), [0, 2]);
    }

    #[test]
    fn an_older_state_files_ids_follow_the_placement_once_loaded() {
        let mut n = node("a100-40gb:1");
        n.gpus[0].mig_enabled = true;
        create_gpu_instance(&mut n, 0, 9, 4, 4).unwrap();
        create_gpu_instance(&mut n, 0, 9, 0, 4).unwrap();
        // As an older simulator numbered them: in creation order, from 1.
        n.gpus[0].instances[0].id = 1;
        n.gpus[0].instances[1].id = 2;
        n.processes.push(Process::new(0, Some(2), 7));
        renumber_instances(&mut n);
        let ids: Vec<(u8, u32)> = n.gpus[0].instances.iter().map(|gi| (gi.start, gi.id)).collect();
        assert_eq!(ids, [(4, 2), (0, 1)]);
        assert_eq!(n.processes[0].gpu_instance, Some(1), "the process moves with its instance");
    }

    #[test]
    fn instance_ids_follow_the_placement_as_published() {
        let (a100, h100) = (model_by_key("a100-40gb").unwrap(), model_by_key("h100-80gb").unwrap());
        let a30 = model_by_key("a30").unwrap();
        // A100 (MIG user guide): 7g 0, 3g at 4 2, 2g at 0 3, 1g at 2 9.
        let ids: Vec<u32> =
            [(0, 8), (4, 4), (0, 2), (2, 1)].map(|(s, n)| gpu_instance_id(a100, s, n)).to_vec();
        assert_eq!(ids, [0, 2, 3, 9]);
        // H100 (published -lgi of seven 1g): slots 4, 5, 6, 0, 1, 2, 3 are 7, 8, 9, 11-14.
        let ids: Vec<u32> = [4, 5, 6, 0, 1, 2, 3].map(|s| gpu_instance_id(h100, s, 1)).to_vec();
        assert_eq!(ids, [7, 8, 9, 11, 12, 13, 14]);
        // A30: four slots, the whole GPU 0, halves 1-2, quarters 3-6.
        let ids: Vec<u32> =
            [(0, 4), (2, 2), (3, 1)].map(|(s, n)| gpu_instance_id(a30, s, n)).to_vec();
        assert_eq!(ids, [0, 2, 6]);
    }

    #[test]
    fn placements_are_invalid_or_insufficient() {
        let mut n = node("a100-40gb:1");
        assert_eq!(create_gpu_instance(&mut n, 0, 9, 0, 4), Err(ret::NOT_SUPPORTED));
        n.gpus[0].mig_enabled = true;
        assert_eq!(create_gpu_instance(&mut n, 0, 99, 0, 4), Err(ret::INVALID_ARGUMENT));
        assert_eq!(create_gpu_instance(&mut n, 0, 9, 2, 4), Err(ret::INVALID_ARGUMENT));
        assert_eq!(create_gpu_instance(&mut n, 0, 9, 0, 2), Err(ret::INVALID_ARGUMENT));
        // Ids follow the placement, as on hardware: a 3g at slot 4 is GI 2, at 0 GI 1.
        assert_eq!(create_gpu_instance(&mut n, 0, 9, 4, 4), Ok(2));
        assert_eq!(create_gpu_instance(&mut n, 0, 0, 0, 8), Err(ret::INSUFFICIENT_RESOURCES));
        assert_eq!(remaining_capacity(&n.gpus[0], 9), Ok(1));
        assert_eq!(remaining_capacity(&n.gpus[0], 19), Ok(4));
        assert_eq!(create_gpu_instance(&mut n, 0, 9, 0, 4), Ok(1));
        assert_eq!(remaining_capacity(&n.gpus[0], 19), Ok(0));
        // 3g + 3g use 6 of 7 compute slices and all memory.
        assert_eq!(create_gpu_instance(&mut n, 0, 19, 0, 1), Err(ret::INSUFFICIENT_RESOURCES));
        assert_eq!(n.gpus[0].instances[1].serial, 2);
    }

    #[test]
    fn h100_1g_20gb_offers_both_1_slice_compute_profiles() {
        let h100 = model_by_key("h100-80gb").unwrap();
        let p = ci_profiles(h100, h100.profile_by_name("1g.20gb").unwrap());
        assert_eq!(
            p,
            vec![
                CiProfile { nvml_enum: 0, slices: 1, sms: 16, instance_count: 1 },
                CiProfile { nvml_enum: 7, slices: 1, sms: 26, instance_count: 1 },
            ]
        );
        let p = ci_profiles(h100, h100.profile_by_name("3g.40gb").unwrap());
        let sms: Vec<(u32, u32, u32)> =
            p.iter().map(|c| (c.nvml_enum, c.sms, c.instance_count)).collect();
        assert_eq!(sms, vec![(0, 16, 3), (1, 32, 1), (2, 60, 1)]);
        let a30 = model_by_key("a30").unwrap();
        let p = ci_profiles(a30, a30.profile_by_name("4g.24gb").unwrap());
        let e: Vec<u32> = p.iter().map(|c| c.nvml_enum).collect();
        assert_eq!(e, vec![0, 1, 3], "no 3-slice profile on the A30");
    }

    #[test]
    fn compute_instances_fill_their_gpu_instance_honestly() {
        let mut n = node("a100-40gb:1");
        n.gpus[0].mig_enabled = true;
        let gi = create_gpu_instance(&mut n, 0, 9, 0, 4).unwrap();
        assert_eq!(create_compute_instance(&mut n, 0, gi, 9), Err(ret::INVALID_ARGUMENT));
        assert_eq!(create_compute_instance(&mut n, 0, gi, 4), Err(ret::NOT_SUPPORTED));
        assert_eq!(create_compute_instance(&mut n, 0, gi, 1), Ok(0));
        assert_eq!(create_compute_instance(&mut n, 0, gi, 1), Err(ret::INSUFFICIENT_RESOURCES));
        assert_eq!(create_compute_instance(&mut n, 0, gi, 0), Ok(1));
        assert_eq!(create_compute_instance(&mut n, 0, gi, 0), Err(ret::INSUFFICIENT_RESOURCES));
        let cis = &n.gpus[0].instances[0].compute_instances;
        assert_eq!((cis[0].start, cis[0].size, cis[1].start), (0, 2, 2));
        assert_ne!(cis[0].uuid, cis[1].uuid);
        assert_eq!(destroy_gpu_instance(&mut n, 0, gi), Err(ret::IN_USE));
        n.processes.push(Process::new(0, Some(gi), 42));
        assert_eq!(
            processes(&n, 0, Some((gi, 0))).unwrap(),
            vec![ProcessView {
                pid: 42,
                gpu_instance: gi,
                compute_instance: 0,
                memory: crate::device::PROCESS_MEMORY,
                mps: false
            }]
        );
        assert!(processes(&n, 0, Some((gi, 1))).unwrap().is_empty());
        assert_eq!(destroy_compute_instance(&mut n, 0, gi, 0), Err(ret::IN_USE));
        destroy_compute_instance(&mut n, 0, gi, 1).unwrap();
        n.processes.clear();
        destroy_compute_instance(&mut n, 0, gi, 0).unwrap();
        n.processes.push(Process::new(0, Some(gi), 42));
        assert_eq!(destroy_gpu_instance(&mut n, 0, gi), Err(ret::IN_USE));
        n.processes.clear();
        destroy_gpu_instance(&mut n, 0, gi).unwrap();
        // A new compute instance gets a new MIG UUID.
        let gi = create_gpu_instance(&mut n, 0, 9, 0, 4).unwrap();
        create_compute_instance(&mut n, 0, gi, 2).unwrap();
        let again = &n.gpus[0].instances[0].compute_instances[0];
        assert!(again.uuid.starts_with("MIG-"));
    }

    #[test]
    fn profile_queries_by_enum() {
        let n = node("h100-80gb:1,l40s:1");
        assert_eq!(gi_profile_by_enum(&n.gpus[0], 9).unwrap().name, "1g.20gb");
        assert_eq!(gi_profile_by_enum(&n.gpus[0], 5), Err(ret::NOT_SUPPORTED));
        assert_eq!(gi_profile_by_enum(&n.gpus[0], 16), Err(ret::NOT_SUPPORTED));
        assert_eq!(gi_profile_by_enum(&n.gpus[0], 17), Err(ret::INVALID_ARGUMENT));
        assert_eq!(gi_profile_by_enum(&n.gpus[1], 0), Err(ret::NOT_SUPPORTED));
        assert_eq!(max_mig_devices(&n.gpus[0]), 0);
    }

    /// A fresh one-GPU node of `key` with MIG on.
    fn mig_node(key: &str) -> Node {
        let mut n = node(&format!("{key}:1"));
        n.gpus[0].mig_enabled = true;
        n
    }

    /// Creates GPU instances of the named profiles where the driver would place them:
    /// `(start, id)` of each, stopping at the first that fails.
    fn driver_creates(n: &mut Node, names: &[&str]) -> Result<Vec<(u8, u32)>, Code> {
        let mut out = Vec::new();
        for name in names {
            let p = n.gpus[0].model().profile_by_name(name).ok_or(ret::INVALID_ARGUMENT)?;
            let start = driver_placement(&n.gpus[0], p.id)?;
            let id = create_gpu_instance(n, 0, p.id, u32::from(start), u32::from(p.memory_slices))?;
            out.push((start, id));
        }
        Ok(out)
    }

    #[test]
    fn no_two_placements_of_a_model_share_an_instance_id() {
        for model in gpushare_catalog::simulated_models().iter().filter(|m| m.supports_mig()) {
            let mut seen = std::collections::HashMap::new();
            for p in &model.mig_profiles {
                assert_eq!(model.memory_slots % p.memory_slices, 0, "{} {}", model.key, p.name);
                let positions = model.memory_slots / p.memory_slices;
                assert!(positions.is_power_of_two(), "{} {}: a tree level", model.key, p.name);
                for &start in &p.placements {
                    let id = gpu_instance_id(model, start, p.memory_slices);
                    if let Some(other) = seen.insert(id, (start, p.memory_slices)) {
                        assert_eq!(other, (start, p.memory_slices), "{} GI {id}", model.key);
                    }
                }
            }
        }
    }

    #[test]
    fn the_rtx_pro_6000_numbers_and_places_as_published() {
        // kubesimplify's -cgi of four 1g.24gb: GI 3, 4, 5, 6 at 0, 3, 6, 9.
        let mut n = mig_node("rtx-pro-6000-bse");
        let four = driver_creates(&mut n, &["1g.24gb"; 4]).unwrap();
        assert_eq!(four, [(0, 3), (3, 4), (6, 5), (9, 6)]);
        assert_eq!(remaining_capacity(&n.gpus[0], 14), Ok(0));
        // Its -cgi 2g.48gb,1g.24gb,1g.24gb: GI 1 at 0, GI 5 at 6, GI 6 at 9.
        let mut n = mig_node("rtx-pro-6000-bse");
        let mixed = driver_creates(&mut n, &["2g.48gb", "1g.24gb", "1g.24gb"]).unwrap();
        assert_eq!(mixed, [(0, 1), (6, 5), (9, 6)]);
        // The whole card, with graphics, is GI 0.
        let mut n = mig_node("rtx-pro-6000-bse");
        assert_eq!(driver_creates(&mut n, &["4g.96gb+gfx"]), Ok(vec![(0, 0)]));
        assert_eq!(driver_creates(&mut n, &["1g.24gb-me"]), Err(ret::INSUFFICIENT_RESOURCES));
        // Placements off the 12-slot grid are refused.
        let mut n = mig_node("rtx-pro-6000-bse");
        assert_eq!(create_gpu_instance(&mut n, 0, 14, 1, 3), Err(ret::INVALID_ARGUMENT));
        assert_eq!(create_gpu_instance(&mut n, 0, 5, 3, 6), Err(ret::INVALID_ARGUMENT));
        assert_eq!(create_gpu_instance(&mut n, 0, 5, 0, 3), Err(ret::INVALID_ARGUMENT));
        assert_eq!(max_mig_devices(&n.gpus[0]), 4);
    }

    #[test]
    fn the_a30_numbers_and_places_as_published() {
        // A30L: -cgi 14, 14, then 5: GI 3 at 0, GI 4 at 1, GI 2 at 2.
        let mut n = mig_node("a30");
        let made = driver_creates(&mut n, &["1g.6gb", "1g.6gb", "2g.12gb"]).unwrap();
        assert_eq!(made, [(0, 3), (1, 4), (2, 2)]);
        // The 2g.12gb+me, at either half.
        let mut n = mig_node("a30");
        assert_eq!(create_gpu_instance(&mut n, 0, 6, 2, 2), Ok(2));
        assert_eq!(create_gpu_instance(&mut n, 0, 6, 0, 2), Err(ret::INSUFFICIENT_RESOURCES));
        assert_eq!(gi_profile_by_enum(&n.gpus[0], 8).unwrap().name, "2g.12gb+me");
    }

    #[test]
    fn media_engines_are_shared_out_of_the_whole_gpus() {
        let mut n = mig_node("rtx-pro-6000-bse");
        // +me.all takes all four decoders: a plain 1g (one decoder) no longer fits, -me does.
        assert_eq!(driver_creates(&mut n, &["1g.24gb+me.all"]), Ok(vec![(0, 3)]));
        assert_eq!(remaining_capacity(&n.gpus[0], 14), Ok(0));
        assert_eq!(remaining_capacity(&n.gpus[0], 67), Ok(3));
        assert_eq!(driver_creates(&mut n, &["1g.24gb"]), Err(ret::INSUFFICIENT_RESOURCES));
        assert_eq!(driver_creates(&mut n, &["1g.24gb-me"; 3]).unwrap().len(), 3);
        // The same with 2g's.
        let mut n = mig_node("rtx-pro-6000-bse");
        driver_creates(&mut n, &["2g.48gb+me.all"]).unwrap();
        assert_eq!(driver_creates(&mut n, &["2g.48gb+gfx"]), Err(ret::INSUFFICIENT_RESOURCES));
        assert_eq!(driver_creates(&mut n, &["2g.48gb-me"]).unwrap().len(), 1);
        // The one OFA: a 1g.24gb+me and a 2g.48gb+me.all exclude each other; the A30's
        // one JPEG and OFA keep its two +me profiles apart.
        let mut n = mig_node("rtx-pro-6000-bse");
        driver_creates(&mut n, &["1g.24gb+me"]).unwrap();
        assert_eq!(remaining_capacity(&n.gpus[0], 64), Ok(0));
        let mut n = mig_node("a30");
        driver_creates(&mut n, &["1g.6gb+me"]).unwrap();
        assert_eq!(driver_creates(&mut n, &["2g.12gb+me"]), Err(ret::INSUFFICIENT_RESOURCES));
        assert_eq!(driver_creates(&mut n, &["2g.12gb"]).unwrap().len(), 1);
    }

    /// Every layout of `model`'s plain profiles that fits memory, compute slices and counts,
    /// visited once each, checking the driver's rules admit it (the engine budget never
    /// binds these).
    fn admit_every_plain_layout(
        n: &mut Node,
        seen: &mut std::collections::HashSet<Vec<(u8, u32)>>,
    ) {
        let model = n.gpus[0].model();
        for p in model.mig_profiles.iter().filter(|p| p.is_plain()) {
            for &start in &p.placements {
                let g = &n.gpus[0];
                let end = start + p.memory_slices;
                let free =
                    g.instances.iter().all(|gi| end <= gi.start || gi.start + gi.size <= start);
                let same = g.instances.iter().filter(|gi| gi.profile_id == p.id).count();
                let compute: u8 =
                    g.instances.iter().map(|gi| profile_of(g, gi).compute_slices).sum();
                let fits = free
                    && same < usize::from(p.max_count)
                    && compute + p.compute_slices <= model.compute_slices;
                if !fits {
                    continue;
                }
                let mut next = n.clone();
                let made = create_gpu_instance(
                    &mut next,
                    0,
                    p.id,
                    u32::from(start),
                    u32::from(p.memory_slices),
                );
                assert!(
                    made.is_ok(),
                    "{}: {} at {start} after {:?}",
                    model.key,
                    p.name,
                    layout_of(n)
                );
                if seen.insert(layout_of(&next)) {
                    admit_every_plain_layout(&mut next, seen);
                }
            }
        }
    }

    fn layout_of(n: &Node) -> Vec<(u8, u32)> {
        let mut l: Vec<(u8, u32)> =
            n.gpus[0].instances.iter().map(|gi| (gi.start, gi.profile_id)).collect();
        l.sort_unstable();
        l
    }

    #[test]
    fn the_engine_budget_never_refuses_a_layout_of_plain_profiles() {
        for model in gpushare_catalog::simulated_models().iter().filter(|m| m.supports_mig()) {
            let mut seen = std::collections::HashSet::new();
            admit_every_plain_layout(&mut mig_node(&model.key), &mut seen);
            assert!(seen.len() >= model.mig_profiles.iter().filter(|p| p.is_plain()).count());
        }
    }

    #[test]
    fn compute_instances_divide_the_rtx_pro_6000s_instances() {
        let rtx = model_by_key("rtx-pro-6000-bse").unwrap();
        let four = ci_profiles(rtx, rtx.profile_by_name("4g.96gb+gfx").unwrap());
        let e: Vec<(u32, u8, u32, u32)> =
            four.iter().map(|c| (c.nvml_enum, c.slices, c.sms, c.instance_count)).collect();
        assert_eq!(e, [(0, 1, 46, 4), (1, 2, 94, 2), (3, 4, 188, 1)], "no 3-slice profile");
        assert_eq!(ci_placements(4, 1), [0, 1, 2, 3]);
        assert_eq!(ci_placements(4, 2), [0, 2]);
        let mut n = mig_node("rtx-pro-6000-bse");
        let gi = create_gpu_instance(&mut n, 0, 0, 0, 12).unwrap();
        assert_eq!(create_compute_instance(&mut n, 0, gi, 1), Ok(0));
        assert_eq!(create_compute_instance(&mut n, 0, gi, 0), Ok(1));
        assert_eq!(create_compute_instance(&mut n, 0, gi, 0), Ok(2));
        assert_eq!(create_compute_instance(&mut n, 0, gi, 0), Err(ret::INSUFFICIENT_RESOURCES));
        let starts: Vec<(u8, u8)> =
            n.gpus[0].instances[0].compute_instances.iter().map(|c| (c.start, c.size)).collect();
        assert_eq!(starts, [(0, 2), (2, 1), (3, 1)]);
        let one = ci_profiles(rtx, rtx.profile_by_name("1g.24gb-me").unwrap());
        assert_eq!(one, [CiProfile { nvml_enum: 0, slices: 1, sms: 46, instance_count: 1 }]);
    }
}
