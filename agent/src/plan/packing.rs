//! Packing: which GPU instances a rule's MIG requests become, and which compute instances
//! each holds, as NVIDIA's mig-parted makes them.
//!
//! mig-parted (`pkg/mig/config`, `SetMigConfig`) flattens a config's `mig-devices` into
//! one entry per compute instance, sorted by the GPU instance's slices, then the compute
//! instance's, then the attributes (`+me.all`, `+me`, `+gfx`, none), each descending. It
//! creates them in that order: an entry of the same GPU-instance profile as the one before
//! goes into the GPU instance made for that one when the driver can place its compute
//! instance there (the lowest free start aligned to its size, within the count of that
//! size an instance offers); otherwise, and for the first, it makes a new GPU instance.
//! An instance once left is not gone back to. When an order fails (a GPU instance does
//! not fit), it tries the next permutation of the entries, in its own order, until one
//! succeeds. So `{"2c.3g.40gb": 1, "1c.3g.40gb": 1}` is one 3g instance holding both,
//! `{"1c.3g.40gb": 4}` two (1c ×3, then 1c ×1), and `{"3g.40gb": 1, "1c.3g.40gb": 1}`
//! two, the first used whole.
//!
//! [`pack`] follows the same rule, with one difference: an order is taken when
//! [`placement::solve`] places its GPU instances (in any arrangement), where mig-parted
//! takes it when the driver, choosing each placement as it goes, does. A GPU whose
//! compute instances already are what the rule asks for, counted as mig-parted's
//! `assert` counts them (per GPU-instance profile and compute size, however packed),
//! keeps them as they are.

use std::collections::HashSet;

use crate::catalog::{GpuModel, MigProfile, variant_of};
use crate::node::GpuState;

use super::placement::{self, ComputeLayout, Infeasible, Placed};

/// One compute instance a rule asks for: `compute` slices in a GPU instance of `profile`
/// (all of its slices for an instance used whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The GPU instance's profile.
    pub profile: &'static MigProfile,
    /// The compute instance's compute slices.
    pub compute: u8,
    /// Which of the rule's requests it is (its place in the rule): GPU instances take
    /// their places in the order of the first request each holds.
    pub request: usize,
}

impl Entry {
    /// mig-parted's sort key (`types.MigConfig.Flatten`): GPU-instance slices, compute
    /// slices, attributes, each descending. Ties (two profiles of one size, such as
    /// `1g.10gb` and `1g.20gb`, or `2g.48gb` and `2g.48gb-me`, whose negative attribute
    /// the sort ignores) fall in Go's map order there; here one profile's entries stay
    /// together, by profile id.
    fn order(&self) -> (std::cmp::Reverse<(u8, u8, &'static str)>, u32) {
        let attributes = variant_of(&self.profile.name).strip_prefix('+').unwrap_or("");
        (
            std::cmp::Reverse((self.profile.compute_slices, self.compute, attributes)),
            self.profile.id,
        )
    }
}

/// How many compute instances of `compute` slices one GPU instance of `profile` holds on
/// `model` (one of its own size); `None` when it offers none of that size (see
/// [`crate::profile::compute_instance_sizes`]).
pub fn per_instance(model: &GpuModel, profile: &MigProfile, compute: u8) -> Option<u8> {
    if compute == profile.compute_slices {
        return Some(1);
    }
    crate::profile::compute_instance_sizes(model, profile)
        .into_iter()
        .find(|&(c, n)| c == compute && n > 0)
        .map(|(_, n)| n)
}

/// What a GPU instance of `profile` holds, for messages: `1c ×3, 2c ×1 or 3c ×1`.
pub fn offered(model: &GpuModel, profile: &MigProfile) -> String {
    let sizes: Vec<String> = crate::profile::compute_instance_sizes(model, profile)
        .iter()
        .map(|(c, n)| format!("{c}c ×{n}"))
        .collect();
    match sizes.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => sizes.join(""),
    }
}

/// A GPU instance being filled: its profile, the compute slices taken (a bit each) and
/// its compute instances in the order they were made.
#[derive(Debug, Clone)]
struct Open {
    profile: &'static MigProfile,
    used: u16,
    sizes: Vec<u8>,
    request: usize,
}

impl Open {
    /// Adds a compute instance of `compute` slices where the driver puts it (the lowest
    /// free start aligned to the power of two at or above its size), within the count of
    /// that size an instance offers; `false` when it does not fit.
    fn add(&mut self, model: &GpuModel, compute: u8) -> bool {
        let slices = self.profile.compute_slices;
        let same = self.sizes.iter().filter(|&&c| c == compute).count();
        if per_instance(model, self.profile, compute).is_none_or(|n| same >= usize::from(n)) {
            return false;
        }
        let align = usize::from(compute.next_power_of_two().max(1));
        let mask = |start: u8| ((1u16 << compute) - 1) << start;
        let Some(start) =
            (0..slices).step_by(align).find(|&s| s + compute <= slices && self.used & mask(s) == 0)
        else {
            return false;
        };
        self.used |= mask(start);
        self.sizes.push(compute);
        true
    }
}

/// The GPU instances one order of entries makes, as mig-parted makes them, in the order
/// of the rule's requests.
fn fill(model: &GpuModel, order: &[Entry]) -> Vec<(&'static MigProfile, ComputeLayout)> {
    let mut made: Vec<Open> = Vec::new();
    let mut last: Option<u32> = None;
    for e in order {
        let reused = last == Some(e.profile.id)
            && made.last_mut().is_some_and(|open| {
                let added = open.add(model, e.compute);
                if added {
                    open.request = open.request.min(e.request);
                }
                added
            });
        if !reused {
            let mut open =
                Open { profile: e.profile, used: 0, sizes: Vec::new(), request: e.request };
            // A size the instance offers always fits a fresh one (checked before).
            open.add(model, e.compute);
            made.push(open);
        }
        last = Some(e.profile.id);
    }
    made.sort_by_key(|o| o.request);
    made.into_iter().map(|o| (o.profile, ComputeLayout::of(&o.sizes))).collect()
}

/// A packing in a form that does not depend on the order of its GPU instances.
fn canonical(packing: &[(&'static MigProfile, ComputeLayout)]) -> Vec<(u32, ComputeLayout)> {
    let mut key: Vec<(u32, ComputeLayout)> = packing.iter().map(|(p, l)| (p.id, *l)).collect();
    key.sort_unstable_by(|a, b| (a.0, a.1.sizes()).cmp(&(b.0, b.1.sizes())));
    key
}

/// The GPU instances `entries` become on `gpu` and where they go: the GPU's own, where
/// its compute instances are the ones asked for; else those of the first order, in
/// mig-parted's order of permutations, whose GPU instances [`placement::solve`] places.
/// Instances that exist stay where they are when they can.
///
/// # Errors
///
/// Why no order fits: the solver's answer for the order whose packing takes the fewest
/// GPU instances (the first such in mig-parted's order), after what the compute instances
/// took there where they needed more than one GPU instance of a profile.
pub fn pack(model: &GpuModel, gpu: &GpuState, entries: &[Entry]) -> Result<Vec<Placed>, String> {
    let preferred = current_layout(gpu);
    if let Some(current) = current_packing(gpu, entries) {
        let profiles: Vec<&'static MigProfile> = current.iter().map(|(p, _)| *p).collect();
        if let Ok(placed) = placement::solve(model, &profiles, &preferred) {
            return Ok(assign(gpu, placed, current));
        }
    }
    let mut order = entries.to_vec();
    order.sort_by_key(Entry::order);
    let mut tried: HashSet<Vec<(u32, ComputeLayout)>> = HashSet::new();
    // The refused packing with the fewest GPU instances, the first such in mig-parted's
    // order: compute instances that some order packs tighter are not what stands in the
    // way.
    let mut refusal: Option<(Vec<(&'static MigProfile, ComputeLayout)>, Infeasible)> = None;
    let mut found = None;
    permutations(&mut order, 0, &mut |order| {
        let packing = fill(model, order);
        if !tried.insert(canonical(&packing)) {
            return false;
        }
        let profiles: Vec<&'static MigProfile> = packing.iter().map(|(p, _)| *p).collect();
        match placement::solve(model, &profiles, &preferred) {
            Ok(placed) => {
                found = Some((placed, packing));
                true
            }
            Err(why) => {
                if refusal.as_ref().is_none_or(|(fewest, _)| packing.len() < fewest.len()) {
                    refusal = Some((packing, why));
                }
                false
            }
        }
    });
    if let Some((placed, packing)) = found {
        return Ok(assign(gpu, placed, packing));
    }
    let Some((packing, why)) = refusal else {
        return Err(String::new());
    };
    Err(match compute_spread(&packing) {
        Some(spread) => format!("{spread}, and {why}"),
        None => why.to_string(),
    })
}

/// Calls `leaf` on each distinct permutation of `order` in the order mig-parted's
/// `iteratePermutationsUntilSuccess` tries them, until it returns `true` (then `true`).
/// Equal entries are one (mig-parted swaps no two entries of one profile name).
pub(super) fn permutations(
    order: &mut [Entry],
    i: usize,
    leaf: &mut dyn FnMut(&[Entry]) -> bool,
) -> bool {
    if i >= order.len() {
        return leaf(order);
    }
    for j in i..order.len() {
        if order[i..j].contains(&order[j]) {
            continue;
        }
        order.swap(i, j);
        if permutations(order, i + 1, leaf) {
            return true;
        }
        order.swap(i, j);
    }
    false
}

/// Where compute instances of one profile took more than one GPU instance in `packing`:
/// `compute instances 4c ×1 + 3c ×1 + 2c ×1 of 7g.80gb need 2 GPU instances of it as
/// mig-parted packs them ([4c ×1 + 3c ×1] [2c ×1]; …)`, a clause a profile; `None` where
/// none did.
fn compute_spread(packing: &[(&'static MigProfile, ComputeLayout)]) -> Option<String> {
    let mut profiles: Vec<&'static MigProfile> = Vec::new();
    for (p, _) in packing {
        if !profiles.iter().any(|q| q.id == p.id) {
            profiles.push(p);
        }
    }
    let clauses: Vec<String> = profiles
        .iter()
        .filter_map(|p| {
            let mut layouts: Vec<&ComputeLayout> =
                packing.iter().filter(|(q, _)| q.id == p.id).map(|(_, l)| l).collect();
            layouts.sort_by(|a, b| b.sizes().cmp(a.sizes()));
            let subdivided = layouts.iter().any(|l| l.sizes() != [p.compute_slices]);
            if !subdivided || layouts.len() < 2 {
                return None;
            }
            let mut all: Vec<u8> = layouts.iter().flat_map(|l| l.sizes().iter().copied()).collect();
            all.sort_unstable_by(|a, b| b.cmp(a));
            let each: Vec<String> = layouts.iter().map(|l| format!("[{l}]")).collect();
            Some(format!(
                "compute instances {} of {} need {} GPU instances of it as mig-parted packs them ({}; a {} has {} compute slices)",
                ComputeLayout::of(&all),
                p.name,
                layouts.len(),
                each.join(" "),
                p.name,
                p.compute_slices
            ))
        })
        .collect();
    (!clauses.is_empty()).then(|| clauses.join("; "))
}

/// The GPU's instances as a packing, when their compute instances are exactly `entries`
/// (per GPU-instance profile and compute size, as mig-parted's `assert` counts them) and
/// each has some.
fn current_packing(
    gpu: &GpuState,
    entries: &[Entry],
) -> Option<Vec<(&'static MigProfile, ComputeLayout)>> {
    let model = gpu.model?;
    if !gpu.mig_enabled || entries.is_empty() {
        return None;
    }
    let mut packing = Vec::new();
    let mut have: Vec<(u32, u8)> = Vec::new();
    for gi in &gpu.instances {
        let profile = model.profile_by_id(gi.profile_id)?;
        let sizes = gi.compute_layout();
        if sizes.is_empty() || sizes.len() > 8 {
            return None;
        }
        have.extend(sizes.iter().map(|&c| (profile.id, c)));
        packing.push((profile, ComputeLayout::of(&sizes)));
    }
    let mut want: Vec<(u32, u8)> = entries.iter().map(|e| (e.profile.id, e.compute)).collect();
    have.sort_unstable();
    want.sort_unstable();
    (have == want).then_some(packing)
}

/// The GPU's instances as the solver's preferred placements.
fn current_layout(gpu: &GpuState) -> Vec<Placed> {
    let Some(model) = gpu.model else {
        return Vec::new();
    };
    if !gpu.mig_enabled {
        return Vec::new();
    }
    gpu.instances
        .iter()
        .filter_map(|gi| {
            model
                .profile_by_id(gi.profile_id)
                .map(|profile| Placed::new(profile, gi.placement_start))
        })
        .collect()
}

/// Gives each placed GPU instance one of the wanted compute layouts of its profile: an
/// instance that exists at its place with a wanted layout keeps it (and so stays), the
/// others take the rest in the order they were packed.
fn assign(
    gpu: &GpuState,
    mut placed: Vec<Placed>,
    wanted: Vec<(&'static MigProfile, ComputeLayout)>,
) -> Vec<Placed> {
    let mut left: Vec<Option<(&'static MigProfile, ComputeLayout)>> =
        wanted.into_iter().map(Some).collect();
    let mut assigned = vec![false; placed.len()];
    let mut take = |profile: &MigProfile, layout: Option<ComputeLayout>| {
        left.iter_mut()
            .find(|w| {
                w.is_some_and(|(p, l)| p.id == profile.id && layout.is_none_or(|want| want == l))
            })
            .and_then(Option::take)
            .map(|(_, l)| l)
    };
    for (i, p) in placed.iter_mut().enumerate() {
        let existing = gpu.mig_enabled.then_some(()).and_then(|()| {
            gpu.instances
                .iter()
                .find(|gi| gi.profile_id == p.profile.id && gi.placement_start == p.start)
        });
        if let Some(gi) = existing
            && let Some(layout) = take(p.profile, Some(ComputeLayout::of(&gi.compute_layout())))
        {
            p.compute = layout;
            assigned[i] = true;
        }
    }
    for (i, p) in placed.iter_mut().enumerate() {
        if !assigned[i]
            && let Some(layout) = take(p.profile, None)
        {
            p.compute = layout;
        }
    }
    placed
}
