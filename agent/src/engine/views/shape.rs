//! The node as the Kubernetes views ([`super::device_plugin`], [`super::labels`]) see it:
//! per GPU, MIG off with its sharing, or MIG on with its MIG devices and theirs. Made two
//! ways, from an observation (what the GPUs are, to render) and from a plan (what they
//! will be, to refuse a profile before its first step), so that both views judge both
//! alike. Owns the one rule of what counts as shared: MPS where a server runs, time-slicing
//! where the whole GPU's interval is not the default (as `status` says).

use std::collections::BTreeMap;

use super::{Ahead, Observation};
use crate::node::TimeSliceInterval;
use crate::node::{ComputeInstance, GpuInstance, GpuState, MpsLimits, MpsServerState, NodeState};
use crate::plan::GpuPlan;

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuShape {
    /// NVML index.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Its model, as `status` names it.
    pub model: String,
    /// `None`: MIG off; else its MIG devices (an empty list: MIG on, nothing made).
    pub mig: Option<Vec<MigDevice>>,
    /// How the whole GPU is shared (MIG off).
    pub whole: Shared,
}

/// One MIG device: a GPU instance used whole, or one compute instance of a subdivided one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// Its kind as gpushare names it: the GPU instance's profile (`1g.10gb`,
    /// `1g.24gb+gfx`), or `<c>c.<profile>` for a compute instance of a subdivided one.
    pub kind: String,
    /// Whether it is a compute instance smaller than its GPU instance.
    pub subdivided: bool,
    /// Its MPS server, if one serves it.
    pub mps: Option<Mps>,
}

/// How a whole GPU is shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shared {
    /// Not at all (or MIG on).
    Exclusive,
    /// A time-slice interval other than the default, with the clients the profile meant
    /// it for (its `replicas`, which nothing on the GPU records).
    TimeSliced {
        /// `short`, `medium` or `long`.
        interval: &'static str,
        /// The profile's `replicas`, where it gave them.
        replicas: Option<u32>,
    },
    /// An MPS server.
    Mps(Mps),
}

/// An MPS server's shares and the limits a client connecting gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mps {
    /// 100 / its configured thread percentage (as the CDI spec counts shares).
    pub replicas: u32,
    /// Active thread percentage.
    pub thread_percentage: u32,
    /// Pinned device memory limit, bytes.
    pub memory_limit_bytes: Option<u64>,
}

impl GpuShape {
    /// `mig`, `mps`, `time-slicing` or `exclusive`.
    pub fn sharing(&self) -> &'static str {
        match (&self.mig, &self.whole) {
            (Some(_), _) => "mig",
            (None, Shared::Mps(_)) => "mps",
            (None, Shared::TimeSliced { .. }) => "time-slicing",
            (None, Shared::Exclusive) => "exclusive",
        }
    }
}

/// The GPUs the applies time-sliced, by index, each with the replicas its profile meant
/// it for, where it gave them (see [`super::Intent`]).
pub type Replicas = BTreeMap<u32, Option<u32>>;

/// The GPUs of `seen`, as they are.
pub fn observed(seen: &Observation<'_>) -> Vec<GpuShape> {
    seen.node.gpus.iter().map(|g| of_gpu(g, seen.node, &seen.intent.replicas)).collect()
}

/// The GPUs as `ahead`'s plan leaves them: a GPU it selects as its target, the others as
/// they are.
pub fn planned(ahead: &Ahead<'_>) -> Vec<GpuShape> {
    let before = ahead.before;
    before
        .gpus
        .iter()
        .map(|g| match ahead.plan.gpus.iter().find(|p| p.gpu == g.index) {
            Some(p) => of_target(g, p, before),
            None => of_gpu(g, before, ahead.replicas),
        })
        .collect()
}

impl Mps {
    /// A server configured with `configured` (its shares) whose clients get `now`.
    fn of(configured: &MpsLimits, now: &MpsLimits) -> Mps {
        Mps {
            replicas: configured.shares(),
            thread_percentage: now.active_thread_percentage,
            memory_limit_bytes: now.pinned_memory_limit_bytes,
        }
    }
}

impl GpuShape {
    /// `gpu` with its MIG devices (`None`: MIG off) and its whole sharing.
    fn new(gpu: &GpuState, mig: Option<Vec<MigDevice>>, whole: Shared) -> GpuShape {
        let model = gpu.model_name().to_string();
        GpuShape { index: gpu.index, uuid: gpu.uuid.clone(), model, mig, whole }
    }
}

/// The MPS shape of `server` on `node`.
fn mps_of(server: &MpsServerState, node: &NodeState) -> Mps {
    Mps::of(&node.mps_spec(server).limits, &server.limits)
}

/// A MIG device's kind: its GPU instance's profile `name`, or `<c>c.<name>` for a compute
/// instance of `slices` in a subdivided one.
fn kind_of(name: &str, slices: u8, subdivided: bool) -> String {
    if subdivided { format!("{slices}c.{name}") } else { name.to_string() }
}

/// The kind of MIG device compute instance `ci` of `gi` is on `gpu`: its GPU instance's
/// profile (`1g.10gb`), or `<c>c.<profile>` when it is smaller than its GPU instance
/// (then `true`).
pub fn mig_kind(gpu: &GpuState, gi: &GpuInstance, ci: &ComputeInstance) -> (String, bool) {
    let profile = gpu.model.and_then(|m| m.profile_by_id(gi.profile_id));
    let name = profile.map_or_else(|| format!("profile-{}", gi.profile_id), |p| p.name.clone());
    let subdivided = profile.is_some_and(|p| ci.slices < p.compute_slices);
    (kind_of(&name, ci.slices, subdivided), subdivided)
}

/// `gpu` of `node` as it is, time-sliced with the replicas of `replicas`.
pub fn of_gpu(gpu: &GpuState, node: &NodeState, replicas: &Replicas) -> GpuShape {
    let served = |uuid: &str| {
        node.mps.iter().find(|s| s.uuid == uuid && s.pid.is_some()).map(|s| mps_of(s, node))
    };
    if gpu.mig_enabled {
        let mut devices = Vec::new();
        for gi in &gpu.instances {
            for ci in &gi.compute_instances {
                let (kind, subdivided) = mig_kind(gpu, gi, ci);
                devices.push(MigDevice { kind, subdivided, mps: served(&ci.uuid) });
            }
        }
        return GpuShape::new(gpu, Some(devices), Shared::Exclusive);
    }
    let whole = match (served(&gpu.uuid), node.time_sliced(gpu.index)) {
        (Some(mps), _) => Shared::Mps(mps),
        (None, Some(interval)) => Shared::TimeSliced {
            interval: interval.as_str(),
            replicas: replicas.get(&gpu.index).copied().flatten(),
        },
        (None, None) => Shared::Exclusive,
    };
    GpuShape::new(gpu, None, whole)
}

fn of_target(gpu: &GpuState, plan: &GpuPlan, before: &NodeState) -> GpuShape {
    let target = &plan.target;
    let mps = |spec: &crate::node::MpsSpec| Mps::of(&spec.limits, &spec.limits);
    if target.mig_enabled {
        let mut devices = Vec::new();
        for placed in &target.instances {
            let subdivided = placed.is_subdivided();
            for (index, &slices) in placed.compute.sizes().iter().enumerate() {
                let kind = kind_of(&placed.profile.name, slices, subdivided);
                let served = target
                    .instance_mps
                    .iter()
                    .find(|(start, ci, _)| *start == placed.start && usize::from(*ci) == index)
                    .map(|(_, _, spec)| mps(spec));
                devices.push(MigDevice { kind, subdivided, mps: served });
            }
        }
        return GpuShape::new(gpu, Some(devices), Shared::Exclusive);
    }
    let whole = match (&target.mps, target.timeslice) {
        (Some(spec), _) => Shared::Mps(mps(spec)),
        (None, Some(interval)) if interval != TimeSliceInterval::Default => {
            Shared::TimeSliced { interval: interval.as_str(), replicas: target.replicas }
        }
        // Left alone (`manage_timeslice = false`): as it is.
        (None, None) => match before.time_sliced(gpu.index) {
            Some(interval) => {
                Shared::TimeSliced { interval: interval.as_str(), replicas: target.replicas }
            }
            None => Shared::Exclusive,
        },
        (None, Some(_)) => Shared::Exclusive,
    };
    GpuShape::new(gpu, None, whole)
}

/// The time-sliced GPUs as `plan` leaves them: a GPU it time-slices with its target's
/// replicas, a GPU it selects otherwise not, the others as in `before`.
pub fn replicas_after(before: &Replicas, plan: &[GpuPlan]) -> Replicas {
    let mut after = before.clone();
    for g in plan {
        let sliced = !g.target.mig_enabled
            && g.target.mps.is_none()
            && g.target.timeslice.is_some_and(|i| i != TimeSliceInterval::Default);
        if sliced {
            after.insert(g.gpu, g.target.replicas);
        } else {
            after.remove(&g.gpu);
        }
    }
    after
}
