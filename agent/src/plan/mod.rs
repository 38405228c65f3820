//! Planning: a pure function from the observed node and a profile to the ordered steps
//! that turn one into the other.
//!
//! Everything that can fail for reasons of the profile fails here, before anything is
//! touched: a selector naming GPUs the node lacks, a MIG profile a model lacks, a layout
//! that does not fit, a GPU without MIG asked for MIG, an MPS memory limit larger than its
//! device, processes on an instance that must go, MPS clients of a server that must stop.
//! Same inputs, same plan.

mod mps;
mod packing;
pub mod placement;
mod step;
mod verify;

use gpushare_proto::types::{GpuTarget as ReportTarget, PlanReport, PlanStep, TargetInstance};

use crate::node::{ComputeMode, GpuInstance, GpuState, MpsSpec, NodeState, TimeSliceInterval};
use crate::profile::{GpuRef, GpuRule, MigLayout, Profile, Selector, Sharing};
pub use mps::mps_limits;
use mps::{check_no_mps_clients, device_mps_spec, mps_steps};
pub use placement::{ComputeLayout, Placed};
pub use step::{MpsDevice, Step};
pub use verify::verify;

/// What the agent may change, and whether busy instances may be destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOptions {
    /// Whether MIG mode and instances may change (agent.toml `[gpu] manage_mig`).
    pub manage_mig: bool,
    /// Whether compute modes may change (agent.toml `[gpu] manage_compute_mode`).
    pub manage_compute_mode: bool,
    /// Whether time-slice intervals may change (agent.toml `[gpu] manage_timeslice`).
    pub manage_timeslice: bool,
    /// Proceed although compute processes use what must change.
    pub force: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self { manage_mig: true, manage_compute_mode: true, manage_timeslice: true, force: false }
    }
}

/// The steps that apply a profile, grouped by GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Profile name.
    pub profile: String,
    /// Every GPU the profile selects, by index, including those already in shape.
    pub gpus: Vec<GpuPlan>,
}

impl Plan {
    /// Every step in execution order (GPU by GPU).
    pub fn steps(&self) -> impl Iterator<Item = &Step> {
        self.gpus.iter().flat_map(|g| g.steps.iter())
    }

    /// Number of steps.
    pub fn step_count(&self) -> usize {
        self.gpus.iter().map(|g| g.steps.len()).sum()
    }

    /// Whether applying changes nothing.
    pub fn is_empty(&self) -> bool {
        self.step_count() == 0
    }

    /// The plan as the JSON document clients get.
    pub fn report(&self) -> PlanReport {
        PlanReport {
            profile: self.profile.clone(),
            changes: !self.is_empty(),
            steps: self
                .steps()
                .map(|s| PlanStep {
                    gpu: s.gpu(),
                    operation: s.operation().as_str().to_string(),
                    description: s.to_string(),
                })
                .collect(),
            targets: self
                .gpus
                .iter()
                .map(|g| ReportTarget {
                    gpu: g.gpu,
                    model: g.model.clone(),
                    mig_enabled: g.target.mig_enabled,
                    instances: g
                        .target
                        .instances
                        .iter()
                        .map(|p| TargetInstance {
                            profile: p.profile.name.to_string(),
                            placement_start: u32::from(p.start),
                        })
                        .collect(),
                    unchanged: g.steps.is_empty(),
                })
                .collect(),
        }
    }
}

/// The plan for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuPlan {
    /// GPU index.
    pub gpu: u32,
    /// Model display name.
    pub model: String,
    /// What the GPU becomes.
    pub target: GpuTarget,
    /// Steps in order; empty when the GPU already matches.
    pub steps: Vec<Step>,
}

/// The end state of one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTarget {
    /// MIG on or off.
    pub mig_enabled: bool,
    /// MIG instances, by placement start.
    pub instances: Vec<Placed>,
    /// Compute mode, when the agent manages it.
    pub compute_mode: Option<ComputeMode>,
    /// An MPS server for the whole GPU (MIG off): its limits and mode.
    pub mps: Option<MpsSpec>,
    /// MPS servers for MIG devices: the GPU instance's placement start, the compute
    /// instance's index in it (0 for an instance used whole; see
    /// [`crate::node::MpsServerState::compute_instance`]) and the limits and mode.
    pub instance_mps: Vec<(u8, u8, MpsSpec)>,
    /// Time-slice interval of the whole GPU; `None` leaves it alone.
    pub timeslice: Option<TimeSliceInterval>,
    /// The clients a time-sliced whole GPU is meant for (the rule's `replicas`): nothing on
    /// the GPU records them, so they come from here to the views that advertise them
    /// (NVIDIA's device plugin config, the node labels). `None` for any other target.
    pub replicas: Option<u32>,
}

/// Why a profile cannot be carried out here. Each message is one line naming the GPU (or
/// the rule, for selectors).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The profile asks for something the GPU cannot be.
    #[error("{0}")]
    Infeasible(String),
    /// The profile asks for something this version does not carry out.
    #[error("{0}")]
    Unsupported(String),
    /// The agent's configuration forbids the change.
    #[error("{0}")]
    Forbidden(String),
    /// Compute processes or MPS clients use what must change, and the apply is not forced.
    #[error("{0}")]
    GpuBusy(String),
}

/// Plans `profile` against the observed `node`.
pub fn plan(node: &NodeState, profile: &Profile, options: &PlanOptions) -> Result<Plan, PlanError> {
    check_selectors(node, profile)?;
    let mut gpus = Vec::new();
    for gpu in &node.gpus {
        let Some(rule) = profile.rule_for(&gpu_ref(node, gpu)) else {
            continue;
        };
        gpus.push(plan_gpu(gpu, node, rule, options)?);
    }
    Ok(Plan { profile: profile.name.clone(), gpus })
}

/// `gpu` as selectors see it.
fn gpu_ref<'a>(node: &NodeState, gpu: &'a GpuState) -> GpuRef<'a> {
    GpuRef {
        index: gpu.index,
        count: u32::try_from(node.gpus.len()).unwrap_or(u32::MAX),
        uuid: &gpu.uuid,
        pci_device_id: gpu.pci_device_id,
        model: gpu.model,
    }
}

/// Indices and UUIDs name this node's GPUs: one it lacks is a mistake (or a profile meant
/// for another node), never "nothing to do". A model selector or device filter may match
/// nothing here — fleet-wide profiles have one rule per model — as long as the profile
/// selects some GPU.
fn check_selectors(node: &NodeState, profile: &Profile) -> Result<(), PlanError> {
    let last = node.gpus.iter().map(|g| g.index).max();
    for rule in &profile.rules {
        let lacking = match &rule.select {
            // `hi` first: a range as wide as u32 is not walked.
            Selector::Indices(ranges) => ranges.iter().any(|&(lo, hi)| {
                last.is_none_or(|last| hi > last) || (lo..=hi).any(|i| node.gpu(i).is_none())
            }),
            Selector::Uuid(uuid) => !node.gpus.iter().any(|g| g.uuid.eq_ignore_ascii_case(uuid)),
            _ => false,
        };
        if !lacking {
            continue;
        }
        let has = match &rule.select {
            Selector::Uuid(_) => {
                let uuids: Vec<String> =
                    node.gpus.iter().map(|g| format!("GPU {}: {}", g.index, g.uuid)).collect();
                format!("no GPU of this node has that UUID ({})", uuids.join(", "))
            }
            _ => format!("this node has {}", gpu_indices(node)),
        };
        return Err(PlanError::Infeasible(format!(
            "rule at {}: {}: {has}",
            rule.location,
            selector_text(rule)
        )));
    }
    if node.gpus.iter().any(|g| profile.rule_for(&gpu_ref(node, g)).is_some()) {
        return Ok(());
    }
    let rules: Vec<String> =
        profile.rules.iter().map(|r| format!("{} ({})", r.location, rule_text(r))).collect();
    let rules = if rules.is_empty() { "it has no rules".to_string() } else { rules.join(", ") };
    Err(PlanError::Infeasible(format!(
        "profile {} selects no GPU of this node ({}: {}); its rules: {rules}",
        profile.name,
        gpu_indices(node),
        gpu_kinds(node)
    )))
}

/// A GPU a caller named (`env`, `probe`, `bench` targets) that this node lacks, worded as
/// every such refusal is: what was named, then the GPUs there are, `GPU "9": this node has
/// no such GPU; its GPUs are 0-7 (by index or GPU-… UUID)`. With `mig_too` the name may
/// also have been a MIG device's, and the line says so.
pub fn no_such_gpu(node: &NodeState, named: &str, mig_too: bool) -> String {
    let indices: Vec<u32> = node.gpus.iter().map(|g| g.index).collect();
    let text = crate::node::index_ranges(&indices);
    let there = match indices.len() {
        0 => "it has no GPUs".to_string(),
        1 => format!("its GPU is {text} (by index or GPU-… UUID)"),
        _ => format!("its GPUs are {text} (by index or GPU-… UUID)"),
    };
    if mig_too {
        format!(
            "GPU or MIG device {named:?}: this node has no such GPU or MIG device; {there}, its MIG devices by MIG-… UUID (see gpushare-ctl status)"
        )
    } else {
        format!("GPU {named:?}: this node has no such GPU; {there}")
    }
}

/// `GPUs 0-7`, `GPU 0`, `no GPUs`.
fn gpu_indices(node: &NodeState) -> String {
    let text = crate::node::index_ranges(&node.gpus.iter().map(|g| g.index).collect::<Vec<_>>());
    match node.gpus.len() {
        0 => "no GPUs".to_string(),
        1 => format!("GPU {text}"),
        _ => format!("GPUs {text}"),
    }
}

/// The node's GPUs by model and PCI device id: `8 × A100-SXM4-40GB (0x20B010DE)`.
fn gpu_kinds(node: &NodeState) -> String {
    let mut kinds: Vec<(String, u32, usize)> = Vec::new();
    for g in &node.gpus {
        let name = g.model_name().to_string();
        match kinds.iter_mut().find(|(n, id, _)| *n == name && *id == g.pci_device_id) {
            Some((_, _, count)) => *count += 1,
            None => kinds.push((name, g.pci_device_id, 1)),
        }
    }
    let kinds: Vec<String> =
        kinds.iter().map(|(name, id, count)| format!("{count} × {name} (0x{id:08X})")).collect();
    kinds.join(", ")
}

/// Whether a rule comes from a mig-parted file, whose words its messages then use.
fn from_mig_parted(rule: &GpuRule) -> bool {
    let origin = &rule.location.origin;
    origin.ends_with(".yaml") || origin.ends_with(".yml")
}

/// What a rule selects, as written: `select = "9"`, or mig-parted's `devices: [0, 99]`.
fn selector_text(rule: &GpuRule) -> String {
    match (&rule.select, from_mig_parted(rule)) {
        (Selector::All, true) => "devices: all".to_string(),
        (Selector::Indices(ranges), true) => {
            let indices: Vec<String> = ranges
                .iter()
                .map(|&(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") })
                .collect();
            format!("devices: [{}]", indices.join(", "))
        }
        (select, _) => format!("select = \"{select}\""),
    }
}

/// A rule's selector with its device filter: `select = "all", device_filter = [...]`.
fn rule_text(rule: &GpuRule) -> String {
    let selector = selector_text(rule);
    if rule.device_filter.is_empty() {
        return selector;
    }
    let ids: Vec<String> = rule.device_filter.iter().map(|id| format!("0x{id:08X}")).collect();
    if from_mig_parted(rule) {
        format!("{selector}, device-filter: [{}]", ids.join(", "))
    } else {
        let ids: Vec<String> = ids.iter().map(|id| format!("\"{id}\"")).collect();
        format!("{selector}, device_filter = [{}]", ids.join(", "))
    }
}

fn plan_gpu(
    gpu: &GpuState,
    node: &NodeState,
    rule: &GpuRule,
    options: &PlanOptions,
) -> Result<GpuPlan, PlanError> {
    let label = gpu.label();
    let target_instances = match &rule.mig {
        MigLayout::Disabled => Vec::new(),
        MigLayout::Enabled(_) | MigLayout::Balanced => {
            let model = gpu.model.filter(|m| m.supports_mig()).ok_or_else(|| {
                PlanError::Infeasible(format!(
                    "{label}: has no MIG, but the rule at {} asks for a MIG layout",
                    rule.location
                ))
            })?;
            let mut entries: Vec<packing::Entry> = Vec::new();
            for (request, (key, count)) in rule.mig.requests(model).iter().enumerate() {
                let profile = key.resolve(model).ok_or_else(|| {
                    let names: Vec<&str> =
                        model.mig_profiles.iter().map(|p| p.name.as_str()).collect();
                    // By slices, memory and variant: a renamed profile (a driver's
                    // `1g.24gb` → `1g.23gb`) names its heir, `3g.40gb` the 3-slice one.
                    let guess =
                        crate::profile::suggest::mig_profile(&key.instance().to_string(), model)
                            .map(|n| format!("did you mean {n}? "))
                            .unwrap_or_default();
                    PlanError::Infeasible(format!(
                        "{label}: no MIG profile {} (the rule at {}); {guess}{} has {}",
                        key.instance(),
                        rule.location,
                        model.display_name,
                        names.join(", ")
                    ))
                })?;
                let compute = key.compute_slices().unwrap_or(profile.compute_slices);
                if packing::per_instance(model, profile, compute).is_none() {
                    return Err(PlanError::Infeasible(format!(
                        "{label}: {key} does not fit (the rule at {}): a {} instance holds {}",
                        rule.location,
                        profile.name,
                        packing::offered(model, profile)
                    )));
                }
                entries.extend(std::iter::repeat_n(
                    packing::Entry { profile, compute, request },
                    *count as usize,
                ));
            }
            packing::pack(model, gpu, &entries).map_err(|why| {
                PlanError::Infeasible(format!("{label}: {why} (the rule at {})", rule.location))
            })?
        }
    };
    let mig_enabled = rule.mig.is_enabled();
    let mps = match (&rule.sharing, mig_enabled) {
        (Sharing::Mps(s), false) => {
            Some(device_mps_spec(gpu, rule, s, gpu.memory_total_bytes, "the GPU's")?)
        }
        _ => None,
    };
    // Only a time-sliced whole GPU keeps an interval; every other target (MPS, exclusive,
    // MIG) runs at the default, so an interval a previous profile set does not linger.
    let (timeslice, replicas) = match (&rule.sharing, mig_enabled) {
        (Sharing::TimeSlicing { interval, replicas }, false) => (*interval, *replicas),
        _ => (TimeSliceInterval::Default, None),
    };
    // Hands off: the interval stays as it is; a profile that needs one set is refused.
    let timeslice = match (options.manage_timeslice, timeslice) {
        (true, interval) => Some(interval),
        (false, TimeSliceInterval::Default) => None,
        (false, interval) => {
            return Err(PlanError::Forbidden(format!(
                "{}: the profile sets the time-slice interval {} (the rule at {}), but the agent's configuration sets manage_timeslice = false",
                gpu.label(),
                interval.as_str(),
                rule.location
            )));
        }
    };
    let mut instance_mps = Vec::new();
    if mig_enabled {
        for p in &target_instances {
            let memory = p.profile.memory_mib << 20;
            if !p.is_subdivided() {
                if let Sharing::Mps(s) = rule.sharing_for(p.profile, None) {
                    let device = format!("the {} instance's", p.profile.name);
                    let spec = device_mps_spec(gpu, rule, s, memory, &device)?;
                    instance_mps.push((p.start, 0, spec));
                }
                continue;
            }
            // Compute instances share their GPU instance's memory: each MPS server's
            // device is its compute instance's share of it, in proportion to its compute
            // slices among the instance's (a 2c beside a 1c gets two thirds).
            let sizes = p.compute.sizes();
            let slices: u64 = sizes.iter().map(|&c| u64::from(c)).sum::<u64>().max(1);
            for (index, &compute) in sizes.iter().enumerate() {
                let share = memory * u64::from(compute) / slices;
                if let Sharing::Mps(s) = rule.sharing_for(p.profile, Some(compute)) {
                    let device = format!(
                        "the {compute}c.{} compute instance's share of memory,",
                        p.profile.name
                    );
                    let spec = device_mps_spec(gpu, rule, s, share, &device)?;
                    instance_mps.push((p.start, index as u8, spec));
                }
            }
        }
    }
    let compute_mode = options.manage_compute_mode.then_some(if mps.is_some() {
        ComputeMode::ExclusiveProcess
    } else {
        ComputeMode::Default
    });
    let target = GpuTarget {
        mig_enabled,
        instances: target_instances,
        compute_mode,
        mps,
        instance_mps,
        timeslice,
        replicas,
    };
    plan_gpu_to(gpu, node, target, options)
}

/// Plans the named GPUs to explicit targets: how a rollback returns GPUs to a checkpoint.
pub fn plan_to(
    node: &NodeState,
    name: &str,
    targets: Vec<(u32, GpuTarget)>,
    options: &PlanOptions,
) -> Result<Plan, PlanError> {
    let mut gpus = Vec::new();
    for (index, target) in targets {
        let gpu = node
            .gpu(index)
            .ok_or_else(|| PlanError::Infeasible(format!("GPU {index} is no longer there")))?;
        gpus.push(plan_gpu_to(gpu, node, target, options)?);
    }
    Ok(Plan { profile: name.to_string(), gpus })
}

/// The steps that turn `gpu` into `target`: destroy what does not stay (compute instances
/// before their GPU instance), switch the MIG mode (and reset where the switch stays
/// pending), create what is missing, set the compute mode.
fn plan_gpu_to(
    gpu: &GpuState,
    node: &NodeState,
    target: GpuTarget,
    options: &PlanOptions,
) -> Result<GpuPlan, PlanError> {
    let label = gpu.label();
    let mut steps = Vec::new();
    // Sharing that goes first: MPS servers that are not wanted as they are, and a
    // time-slice interval back to default while the GPU is still whole.
    let (mps_stops, mps_starts) = mps_steps(gpu, node, &target);
    if !options.force {
        check_no_mps_clients(gpu, &node.mps, &mps_stops)?;
    }
    let mut sharing_first = mps_stops;
    let mut sharing_last = mps_starts;
    if let Some(interval) = target.timeslice {
        let differs = match node.timeslice(gpu.index) {
            Some(current) => current != interval,
            // Unknown: only an interval other than the default needs setting.
            None => interval != TimeSliceInterval::Default,
        };
        if differs && !(gpu.mig_enabled && target.mig_enabled) {
            let step = Step::SetTimeslice { gpu: gpu.index, interval };
            if interval == TimeSliceInterval::Default {
                sharing_first.push(step);
            } else {
                sharing_last.push(step);
            }
        }
    }
    let mut freed = Vec::new();
    for gi in &gpu.instances {
        let profile = profile_of(gpu, gi.profile_id);
        let fate = instance_fate(gpu, gi, &target);
        if fate == Fate::Stays {
            continue;
        }
        // A rollback recreates what goes from the GPU's MIG table: what it could not
        // recreate, the agent does not destroy.
        let Some(known) = gpu.model.and_then(|m| m.profile_by_id(gi.profile_id)) else {
            return Err(PlanError::Infeasible(format!(
                "{label}: GPU instance {} has MIG profile id {}, which the GPU's MIG table lacks; gpushare could not restore it after a failure, so it leaves this GPU alone",
                gi.id, gi.profile_id
            )));
        };
        if placement::creation_order(known.compute_slices, &gi.compute_layout()).is_none() {
            return Err(PlanError::Infeasible(format!(
                "{label}: the compute instances of GPU instance {} ({} of {}c) could be created again in no order, so gpushare could not restore them after a failure and leaves this GPU alone",
                gi.id,
                gi.compute_instances.len(),
                gi.compute_layout().iter().map(u8::to_string).collect::<Vec<_>>().join("c, ")
            )));
        }
        // Its compute instances go either way (processes in them with them).
        freed.push(gi);
        for ci in &gi.compute_instances {
            steps.push(Step::DestroyComputeInstance {
                gpu: gpu.index,
                gpu_instance: gi.id,
                compute_instance: ci.id,
                profile,
                start: gi.placement_start,
            });
        }
        if instance_fate(gpu, gi, &target) == Fate::Destroyed {
            steps.push(Step::DestroyGpuInstance {
                gpu: gpu.index,
                gpu_instance: gi.id,
                profile,
                start: gi.placement_start,
            });
        }
    }
    steps.extend(mode_steps(gpu, target.mig_enabled));
    for placed in &target.instances {
        let existing = gpu.instances.iter().find(|gi| {
            gpu.mig_enabled
                && gi.profile_id == placed.profile.id
                && gi.placement_start == placed.start
        });
        if existing.is_none() {
            steps.push(Step::CreateGpuInstance {
                gpu: gpu.index,
                profile: placed.profile,
                start: placed.start,
            });
        }
        if existing.is_none_or(|gi| instance_fate(gpu, gi, &target) != Fate::Stays) {
            let whole = !placed.is_subdivided();
            let sizes =
                placement::creation_order(placed.profile.compute_slices, placed.compute.sizes())
                    .ok_or_else(|| {
                        PlanError::Infeasible(format!(
                            "{label}: compute instances {} do not fit in {} in any order",
                            placed.compute, placed.profile.name
                        ))
                    })?;
            for slices in sizes {
                steps.push(Step::CreateComputeInstance {
                    gpu: gpu.index,
                    start: placed.start,
                    gpu_instance: existing.map(|gi| gi.id),
                    profile: &placed.profile.name,
                    slices,
                    whole,
                });
            }
        }
    }

    let changes_mig = !steps.is_empty();
    if changes_mig && !options.manage_mig {
        return Err(PlanError::Forbidden(format!(
            "{label}: the profile changes MIG ({} steps), but the agent's configuration sets manage_mig = false",
            steps.len()
        )));
    }
    if changes_mig && !options.force {
        check_not_busy(gpu, &freed, &steps)?;
    }
    if let Some(mode) = target.compute_mode
        && gpu.compute_mode != mode
    {
        steps.push(Step::SetComputeMode { gpu: gpu.index, mode });
    }
    let steps = sharing_first.into_iter().chain(steps).chain(sharing_last).collect();
    Ok(GpuPlan { gpu: gpu.index, model: gpu.model_name().to_string(), target, steps })
}

/// MIG mode steps. A mode already pending towards the target needs only the reset; a
/// mode pending the other way is cancelled by setting the current mode again. On models
/// whose mode change may stay pending (Ampere) a reset follows the change, carried out
/// only if the driver reports it pending; Hopper needs none.
fn mode_steps(gpu: &GpuState, want: bool) -> Vec<Step> {
    let index = gpu.index;
    if gpu.mig_enabled == want {
        return match gpu.mig_pending {
            Some(_) => vec![Step::SetMigMode { gpu: index, enabled: want }],
            None => Vec::new(),
        };
    }
    if gpu.mig_pending == Some(want) {
        return vec![Step::ResetGpu { gpu: index, always: true }];
    }
    let mut steps = vec![Step::SetMigMode { gpu: index, enabled: want }];
    if gpu.model.is_some_and(|m| m.mode_change_may_need_reset()) {
        steps.push(Step::ResetGpu { gpu: index, always: false });
    }
    steps
}

/// Refuses to destroy instances, or to switch MIG mode, under running processes.
fn check_not_busy(gpu: &GpuState, freed: &[&GpuInstance], steps: &[Step]) -> Result<(), PlanError> {
    let mode_change =
        steps.iter().any(|s| matches!(s, Step::SetMigMode { .. } | Step::ResetGpu { .. }));
    let mut pids: Vec<u32> = gpu
        .processes
        .iter()
        .filter(|p| {
            mode_change || p.gpu_instance_id.is_some_and(|id| freed.iter().any(|gi| gi.id == id))
        })
        .map(|p| p.pid)
        .collect();
    if pids.is_empty() {
        return Ok(());
    }
    pids.sort_unstable();
    pids.dedup();
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    let what =
        if mode_change { "the MIG mode change" } else { "the instances the profile removes" };
    Err(PlanError::GpuBusy(format!(
        "{}: compute processes (PID {}) use what {what} touches; stop them, or apply with --force",
        gpu.label(),
        list.join(", ")
    )))
}

/// What a plan does to an existing GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// It stays as it is: the target has its profile at its start with the compute
    /// instances it has.
    Stays,
    /// It stays, but its compute instances are destroyed and made anew (another layout).
    Recomputed,
    /// It is destroyed.
    Destroyed,
}

pub(super) fn instance_fate(gpu: &GpuState, gi: &GpuInstance, target: &GpuTarget) -> Fate {
    if !(gpu.mig_enabled && target.mig_enabled) {
        return Fate::Destroyed;
    }
    let Some(placed) = target
        .instances
        .iter()
        .find(|p| p.profile.id == gi.profile_id && p.start == gi.placement_start)
    else {
        return Fate::Destroyed;
    };
    if placed.compute.sizes() == gi.compute_layout().as_slice() {
        Fate::Stays
    } else {
        Fate::Recomputed
    }
}

fn profile_of(gpu: &GpuState, profile_id: u32) -> &'static str {
    gpu.model.and_then(|m| m.profile_by_id(profile_id)).map_or("MIG instance", |p| &p.name)
}

#[cfg(test)]
mod tests;
