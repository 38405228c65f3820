//! MIG placement solver: where each GPU instance of a wanted layout goes on one GPU.
//!
//! A MIG layout is valid when every instance sits at one of its profile's allowed start
//! slots and occupies memory slots `start..start + memory_slices`, no two instances share
//! a memory slot, no profile appears more than its `max_count` times, and the compute
//! slices of all instances add up to at most the model's `compute_slices`
//! ([`validate_layout`] checks exactly these rules).
//!
//! [`solve`] is pure and deterministic. It first refuses requests that cannot fit for a
//! simple reason (no MIG, too many of one profile, too many memory or compute slices),
//! then searches depth first: larger instances first (by memory slices, then compute
//! slices, then profile id), start slots in ascending order, and identical profiles at
//! increasing starts so that permutations of one layout are never tried twice. The search
//! is complete: it finds a layout whenever one exists.
//!
//! Placements that exist on the GPU now can be passed as `preferred`: the solver tries
//! their starts first and returns, among all valid layouts, one that keeps as many of
//! them in place as possible, so that instances which can stay where they are stay.

use std::fmt;

use crate::catalog::{GpuModel, MigProfile};

/// One GPU instance of a layout: a profile at a start slot (in memory-slice units), and
/// the compute instances it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// The instance's MIG profile.
    pub profile: &'static MigProfile,
    /// The first memory slot it occupies; it covers `start..start + memory_slices`.
    pub start: u8,
    /// Its compute instances: one full-size one, unless it is subdivided.
    pub compute: ComputeLayout,
}

impl Placed {
    /// An instance of `profile` at `start` used whole (one full-size compute instance).
    pub fn new(profile: &'static MigProfile, start: u8) -> Placed {
        Placed { profile, start, compute: ComputeLayout::whole(profile) }
    }

    /// Whether it holds compute instances smaller than itself.
    pub fn is_subdivided(&self) -> bool {
        self.compute.sizes() != [self.profile.compute_slices]
    }
}

impl fmt::Display for Placed {
    /// `3g.20gb@4`, or a subdivided one `3g.20gb(1c ×3)@4`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_subdivided() {
            write!(f, "{}({})@{}", self.profile.name, self.compute, self.start)
        } else {
            write!(f, "{}@{}", self.profile.name, self.start)
        }
    }
}

/// The compute instances of one GPU instance: the compute slices of each, largest first,
/// the order they are created in (the driver places each at the lowest free start
/// aligned to its size, where larger ones first always fit). At most 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ComputeLayout {
    sizes: [u8; 8],
    len: u8,
}

impl ComputeLayout {
    /// One full-size compute instance of `profile`.
    pub fn whole(profile: &MigProfile) -> ComputeLayout {
        ComputeLayout::of(&[profile.compute_slices])
    }

    /// Compute instances of these slices (the first 8), sorted largest first.
    pub fn of(slices: &[u8]) -> ComputeLayout {
        let mut sizes = [0u8; 8];
        let len = slices.len().min(8);
        sizes[..len].copy_from_slice(&slices[..len]);
        sizes[..len].sort_unstable_by(|a, b| b.cmp(a));
        ComputeLayout { sizes, len: len as u8 }
    }

    /// The compute slices of each, largest first.
    pub fn sizes(&self) -> &[u8] {
        &self.sizes[..usize::from(self.len)]
    }
}

impl fmt::Display for ComputeLayout {
    /// `1c ×3`, `2c ×1 + 1c ×1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut groups: Vec<(u8, usize)> = Vec::new();
        for &c in self.sizes() {
            match groups.last_mut() {
                Some((size, n)) if *size == c => *n += 1,
                _ => groups.push((c, 1)),
            }
        }
        let parts: Vec<String> = groups.iter().map(|(c, n)| format!("{c}c ×{n}")).collect();
        f.write_str(&parts.join(" + "))
    }
}

/// An order to create compute instances of `sizes` (compute slices each) in a GPU
/// instance of `gi_slices` in which each fits where the driver puts it: the lowest free
/// start aligned to the power of two at or above its size (the simulated driver's
/// `ci_placements`). Largest first works for every layout but a few mixed ones (a 7g of
/// 2c, 2c and 3c needs the 2c's first), so it is tried first, then the others; `None`
/// when no order fits.
pub fn creation_order(gi_slices: u8, sizes: &[u8]) -> Option<Vec<u8>> {
    fn place(gi_slices: u8, used: u8, left: &mut Vec<u8>, order: &mut Vec<u8>) -> bool {
        if left.is_empty() {
            return true;
        }
        let mut tried: Vec<u8> = Vec::new();
        for i in 0..left.len() {
            let size = left[i];
            if tried.contains(&size) {
                continue;
            }
            tried.push(size);
            let align = size.next_power_of_two().max(1);
            let Some(start) = (0..gi_slices).step_by(usize::from(align)).find(|&s| {
                let mask = ((1u16 << size) - 1) << s;
                u16::from(s) + u16::from(size) <= u16::from(gi_slices)
                    && u16::from(used) & mask == 0
            }) else {
                continue;
            };
            let taken = (((1u16 << size) - 1) << start) as u8;
            left.remove(i);
            order.push(size);
            if place(gi_slices, used | taken, left, order) {
                return true;
            }
            order.pop();
            left.insert(i, size);
        }
        false
    }
    if gi_slices > 8 || sizes.iter().any(|&s| s == 0 || s > gi_slices) {
        return None;
    }
    let mut left = sizes.to_vec();
    left.sort_unstable_by(|a, b| b.cmp(a));
    let mut order = Vec::with_capacity(left.len());
    place(gi_slices, 0, &mut left, &mut order).then_some(order)
}

/// Why a wanted set of MIG instances cannot be placed on a GPU. `Display` gives a
/// one-line explanation, such as `3g.20gb ×3 exceeds the maximum of 2 per GPU`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Infeasible {
    /// The GPU model has no MIG profiles at all.
    NoMig {
        /// The model's display name.
        model: String,
    },
    /// A wanted profile is not one of the model's profiles.
    ForeignProfile {
        /// The profile's name.
        profile: &'static str,
        /// The model's display name.
        model: String,
    },
    /// More instances of one profile than a GPU can hold.
    TooMany {
        /// The profile's name.
        profile: &'static str,
        /// How many were wanted.
        count: usize,
        /// The profile's `max_count`.
        max: u8,
    },
    /// The memory slices of the request add up to more than the GPU has.
    MemorySlices {
        /// The request as [`describe_request`] writes it.
        request: String,
        /// Memory slices the request needs.
        needed: u32,
        /// Memory slots of the GPU.
        available: u8,
    },
    /// The compute slices of the request add up to more than the GPU has.
    ComputeSlices {
        /// The request as [`describe_request`] writes it.
        request: String,
        /// Compute slices the request needs.
        needed: u32,
        /// Compute slices of the GPU.
        available: u8,
    },
    /// The instances need more of one kind of engine than the GPU has (a `+me.all`
    /// instance takes every media engine: nothing else with one fits beside it).
    Engines {
        /// The request as [`describe_request`] writes it.
        request: String,
        /// Which engine, as nvidia-smi names its column (`DEC`).
        engine: &'static str,
        /// How many the request needs.
        needed: u32,
        /// How many the GPU has.
        available: u32,
    },
    /// The totals fit, but no arrangement of the allowed start slots does.
    NoPlacement {
        /// The request as [`describe_request`] writes it.
        request: String,
        /// The allowed start slots of each wanted profile, e.g. `1g.5gb {0..6}, 3g.20gb {0,4}`.
        placements: String,
    },
}

impl fmt::Display for Infeasible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoMig { model } => write!(f, "{model} has no MIG"),
            Self::ForeignProfile { profile, model } => {
                write!(f, "{profile} is not a MIG profile of {model}")
            }
            Self::TooMany { profile, count, max } => {
                write!(f, "{profile} ×{count} exceeds the maximum of {max} per GPU")
            }
            Self::MemorySlices { request, needed, available } => {
                write!(f, "{request} needs {needed} of {available} memory slices")
            }
            Self::ComputeSlices { request, needed, available } => {
                write!(f, "{request} needs {needed} of {available} compute slices")
            }
            Self::Engines { request, engine, needed, available } => {
                write!(f, "{request} needs {needed} {engine} engines, the GPU has {available}")
            }
            Self::NoPlacement { request, placements } => {
                write!(f, "no placement fits {request} (placements: {placements})")
            }
        }
    }
}

impl std::error::Error for Infeasible {}

/// Describes a request grouped by profile, smallest profile first (by memory slices, then
/// compute slices, then profile id): `1g.5gb ×2, 2g.10gb ×1, 3g.20gb ×1`. An empty request
/// reads `nothing`.
pub fn describe_request(wanted: &[&'static MigProfile]) -> String {
    let groups = group(wanted);
    if groups.is_empty() {
        return "nothing".to_owned();
    }
    groups.iter().map(|(p, n)| format!("{} ×{n}", p.name)).collect::<Vec<_>>().join(", ")
}

/// Places exactly the `wanted` multiset of instances on one GPU of `model`.
///
/// `preferred` are placements that exist on the GPU now. Of all valid layouts the solver
/// returns one that keeps the most of them at their current start (preferred entries
/// whose profile is not wanted, or whose start is not allowed, are ignored). Without
/// preferences it returns the first layout of a search that places larger instances
/// first at ascending starts. The result is sorted by start and depends only on the
/// multisets `wanted` and `preferred`, not on their order. An empty request gives an
/// empty layout.
///
/// # Errors
///
/// [`Infeasible`] when no valid layout holds the request, checked in this order: the
/// model has no MIG, a profile is not the model's, a profile exceeds its `max_count`,
/// the memory slices or compute slices add up to too many, and finally no arrangement
/// of the allowed starts fits.
pub fn solve(
    model: &GpuModel,
    wanted: &[&'static MigProfile],
    preferred: &[Placed],
) -> Result<Vec<Placed>, Infeasible> {
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    if !model.supports_mig() {
        return Err(Infeasible::NoMig { model: model.display_name.clone() });
    }
    if let Some(p) = wanted.iter().find(|p| !model.mig_profiles.contains(p)) {
        return Err(Infeasible::ForeignProfile {
            profile: &p.name,
            model: model.display_name.clone(),
        });
    }
    let groups = group(wanted);
    if let Some((p, n)) = groups.iter().find(|(p, n)| *n > usize::from(p.max_count)) {
        return Err(Infeasible::TooMany { profile: &p.name, count: *n, max: p.max_count });
    }
    let memory: u32 = wanted.iter().map(|p| u32::from(p.memory_slices)).sum();
    if memory > u32::from(model.memory_slots) {
        return Err(Infeasible::MemorySlices {
            request: describe_request(wanted),
            needed: memory,
            available: model.memory_slots,
        });
    }
    let compute: u32 = wanted.iter().map(|p| u32::from(p.compute_slices)).sum();
    if compute > u32::from(model.compute_slices) {
        return Err(Infeasible::ComputeSlices {
            request: describe_request(wanted),
            needed: compute,
            available: model.compute_slices,
        });
    }
    if let Some(short) = engine_shortfall(model, wanted) {
        return Err(short);
    }

    let mut search = Search::new(model, &groups, preferred);
    search.run(0, 0, 0);
    match search.best {
        Some((_, starts)) => {
            let mut layout: Vec<Placed> = search
                .instances
                .iter()
                .zip(starts)
                .map(|(inst, start)| Placed::new(inst.profile, start))
                .collect();
            layout.sort_by_key(|p| (p.start, size_key(p.profile)));
            Ok(layout)
        }
        None => Err(Infeasible::NoPlacement {
            request: describe_request(wanted),
            placements: groups
                .iter()
                .map(|(p, _)| format!("{} {}", p.name, describe_starts(&p.placements)))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The first kind of engine the request needs more of than the GPU has. A GPU instance
/// takes its profile's copy and media engines out of the whole GPU's, which are the most
/// any one profile has (the whole-GPU profile's): so a `+me.all` instance, which takes
/// every media engine, fits beside no instance with one. The simulated driver follows
/// the same rule; on every modelled GPU it never binds a layout of plain profiles.
fn engine_shortfall(model: &GpuModel, wanted: &[&'static MigProfile]) -> Option<Infeasible> {
    engine_need(model, wanted).map(|(engine, needed, available)| Infeasible::Engines {
        request: describe_request(wanted),
        engine,
        needed,
        available,
    })
}

/// Whether instances of these profiles, together, leave the GPU's engines enough (see
/// [`engine_shortfall`]).
pub fn engines_fit(model: &GpuModel, profiles: &[&MigProfile]) -> bool {
    engine_need(model, profiles).is_none()
}

/// The first engine `profiles` need more of than `model` has: (nvidia-smi's column name,
/// needed, available).
fn engine_need(model: &GpuModel, profiles: &[&MigProfile]) -> Option<(&'static str, u32, u32)> {
    type Count = fn(&MigProfile) -> u8;
    let kinds: [(&'static str, Count); 5] = [
        ("CE", |p| p.engines.copy),
        ("DEC", |p| p.engines.decoders),
        ("ENC", |p| p.engines.encoders),
        ("JPEG", |p| p.engines.jpeg),
        ("OFA", |p| p.engines.ofa),
    ];
    kinds.iter().find_map(|&(engine, count)| {
        let available: u32 = model.mig_profiles.iter().map(|p| u32::from(count(p))).max()?;
        let needed: u32 = profiles.iter().map(|p| u32::from(count(p))).sum();
        (needed > available).then_some((engine, needed, available))
    })
}

/// Checks a layout against the MIG rules of `model`: each instance at an allowed start of
/// one of the model's profiles and inside the memory slots, no shared memory slot, no
/// profile over its `max_count`, and no more compute slices than the model has.
///
/// # Errors
///
/// A one-line description of the first broken rule, e.g.
/// `3g.20gb@0 overlaps 2g.10gb@2 on memory slot 2`.
pub fn validate_layout(model: &GpuModel, layout: &[Placed]) -> Result<(), String> {
    if layout.is_empty() {
        return Ok(());
    }
    if !model.supports_mig() {
        return Err(format!("{model} has no MIG"));
    }
    for placed in layout {
        let p = placed.profile;
        if !model.mig_profiles.contains(p) {
            return Err(format!("{} is not a MIG profile of {model}", p.name));
        }
        if !p.placements.contains(&placed.start) {
            return Err(format!(
                "{placed} is not an allowed placement of {} (starts {})",
                p.name,
                describe_starts(&p.placements)
            ));
        }
        let end = u32::from(placed.start) + u32::from(p.memory_slices);
        if end > u32::from(model.memory_slots) {
            return Err(format!(
                "{placed} runs past the {} memory slots of {model}",
                model.memory_slots
            ));
        }
    }
    for (i, a) in layout.iter().enumerate() {
        for b in &layout[i + 1..] {
            let (a_end, b_end) = (end_of(a), end_of(b));
            if u32::from(a.start) < b_end && u32::from(b.start) < a_end {
                let slot = a.start.max(b.start);
                return Err(format!("{a} overlaps {b} on memory slot {slot}"));
            }
        }
    }
    let profiles: Vec<&'static MigProfile> = layout.iter().map(|p| p.profile).collect();
    for (p, n) in group(&profiles) {
        if n > usize::from(p.max_count) {
            return Err(
                Infeasible::TooMany { profile: &p.name, count: n, max: p.max_count }.to_string()
            );
        }
    }
    let compute: u32 = profiles.iter().map(|p| u32::from(p.compute_slices)).sum();
    if compute > u32::from(model.compute_slices) {
        return Err(Infeasible::ComputeSlices {
            request: describe_request(&profiles),
            needed: compute,
            available: model.compute_slices,
        }
        .to_string());
    }
    if let Some(short) = engine_shortfall(model, &profiles) {
        return Err(short.to_string());
    }
    Ok(())
}

/// One past the last memory slot an instance occupies.
fn end_of(p: &Placed) -> u32 {
    u32::from(p.start) + u32::from(p.profile.memory_slices)
}

/// Orders profiles by size, smallest first; unique within one model.
fn size_key(p: &MigProfile) -> (u8, u8, u32, &str) {
    (p.memory_slices, p.compute_slices, p.id, &p.name)
}

/// The request as (profile, count) pairs, smallest profile first.
fn group(wanted: &[&'static MigProfile]) -> Vec<(&'static MigProfile, usize)> {
    let mut sorted = wanted.to_vec();
    sorted.sort_by_key(|p| size_key(p));
    let mut groups: Vec<(&'static MigProfile, usize)> = Vec::new();
    for p in sorted {
        match groups.last_mut() {
            Some((q, n)) if *q == p => *n += 1,
            _ => groups.push((p, 1)),
        }
    }
    groups
}

/// `{0..6}` for a run of three or more consecutive starts, otherwise `{0,2,4}`.
fn describe_starts(starts: &[u8]) -> String {
    let consecutive = starts.windows(2).all(|w| w[1] == w[0].wrapping_add(1));
    match (starts.first(), starts.last()) {
        (Some(first), Some(last)) if starts.len() >= 3 && consecutive => {
            format!("{{{first}..{last}}}")
        }
        _ => {
            let list: Vec<String> = starts.iter().map(u8::to_string).collect();
            format!("{{{}}}", list.join(","))
        }
    }
}

/// The memory slots `start..start + size` as a bit mask, or `None` when they do not lie
/// inside `slots` memory slots.
fn span(start: u8, size: u8, slots: u8) -> Option<u128> {
    let end = u32::from(start) + u32::from(size);
    if size == 0 || end > u32::from(slots) || end > 128 {
        return None;
    }
    let width = u32::from(size);
    let ones = if width == 128 { u128::MAX } else { (1u128 << width) - 1 };
    Some(ones << start)
}

/// One instance to place, with its candidate starts in the order they are tried.
struct Instance {
    profile: &'static MigProfile,
    /// Whether the previous instance has the same profile (see the symmetry breaking).
    same_as_previous: bool,
    /// Candidate (start, occupied-slot mask, kept) triples: preferred starts first.
    candidates: Vec<(u8, u128, bool)>,
}

/// Depth-first branch-and-bound search for the layout keeping the most preferred starts.
struct Search {
    instances: Vec<Instance>,
    /// Memory slices still needed by instances `i..`, indexed by `i`.
    memory_after: Vec<u32>,
    /// Most preferred placements any layout could keep; the search stops on reaching it.
    target: usize,
    /// Start and whether it is a preferred one, for instances `0..i`.
    current: Vec<(u8, bool)>,
    /// Kept count and starts of the best layout found so far.
    best: Option<(usize, Vec<u8>)>,
}

impl Search {
    fn new(
        model: &GpuModel,
        groups: &[(&'static MigProfile, usize)],
        preferred: &[Placed],
    ) -> Self {
        let slots = model.memory_slots;
        let mut order: Vec<(&'static MigProfile, usize)> = groups.to_vec();
        // Larger first: memory slices, then compute slices (descending), then profile id.
        order.sort_by(|(a, _), (b, _)| {
            (b.memory_slices, b.compute_slices)
                .cmp(&(a.memory_slices, a.compute_slices))
                .then(a.id.cmp(&b.id))
                .then(a.name.cmp(&b.name))
        });
        let mut instances = Vec::new();
        let mut target = 0;
        for (profile, count) in order {
            let mut starts: Vec<u8> = profile.placements.to_vec();
            starts.sort_unstable();
            starts.dedup();
            let kept: Vec<u8> = starts
                .iter()
                .copied()
                .filter(|s| preferred.iter().any(|p| p.profile == profile && p.start == *s))
                .collect();
            let mut candidates: Vec<(u8, u128, bool)> = Vec::new();
            for (list, is_kept) in [(&kept, true), (&starts, false)] {
                for &s in list {
                    if !is_kept && kept.contains(&s) {
                        continue;
                    }
                    if let Some(mask) = span(s, profile.memory_slices, slots) {
                        candidates.push((s, mask, is_kept));
                    }
                }
            }
            target += count.min(candidates.iter().filter(|c| c.2).count());
            for k in 0..count {
                instances.push(Instance {
                    profile,
                    same_as_previous: k > 0,
                    candidates: candidates.clone(),
                });
            }
        }
        let mut memory_after = vec![0u32; instances.len() + 1];
        for i in (0..instances.len()).rev() {
            memory_after[i] = memory_after[i + 1] + u32::from(instances[i].profile.memory_slices);
        }
        let current = Vec::with_capacity(instances.len());
        Self { instances, memory_after, target, current, best: None }
    }

    /// Places instance `i` and the ones after it; `true` once the target is reached.
    fn run(&mut self, i: usize, occupied: u128, kept: usize) -> bool {
        if i == self.instances.len() {
            if self.best.as_ref().is_none_or(|(b, _)| kept > *b) {
                let starts = self.current.iter().map(|&(s, _)| s).collect();
                self.best = Some((kept, starts));
            }
            return kept >= self.target;
        }
        if let Some((b, _)) = &self.best {
            // Even keeping every remaining instance cannot beat the best layout.
            if kept + (self.instances.len() - i) <= *b {
                return false;
            }
        }
        // Not enough free memory slots left for the remaining instances.
        if self.memory_after[i] > (!occupied).count_ones() {
            return false;
        }
        // Symmetry breaking among identical instances: those at preferred starts come
        // first, at increasing starts, then the others, at increasing starts.
        let previous =
            if self.instances[i].same_as_previous { self.current.last().copied() } else { None };
        for c in 0..self.instances[i].candidates.len() {
            let (start, mask, is_kept) = self.instances[i].candidates[c];
            let in_order = match previous {
                None => true,
                Some((p, true)) => !is_kept || start > p,
                Some((p, false)) => !is_kept && start > p,
            };
            if !in_order || occupied & mask != 0 {
                continue;
            }
            self.current.push((start, is_kept));
            let done = self.run(i + 1, occupied | mask, kept + usize::from(is_kept));
            self.current.pop();
            if done {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{model_by_key, models};
    use proptest::prelude::*;

    fn model(key: &str) -> &'static GpuModel {
        model_by_key(key).unwrap()
    }

    fn profiles(model: &'static GpuModel, spec: &[(&str, usize)]) -> Vec<&'static MigProfile> {
        let mut out = Vec::new();
        for &(name, n) in spec {
            let p = model.profile_by_name(name).unwrap_or_else(|| panic!("{name}"));
            out.extend(std::iter::repeat_n(p, n));
        }
        out
    }

    fn at(model: &'static GpuModel, name: &str, start: u8) -> Placed {
        Placed::new(model.profile_by_name(name).unwrap(), start)
    }

    fn text(layout: &[Placed]) -> String {
        layout.iter().map(Placed::to_string).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn a100_balanced_has_a_fixed_layout() {
        let a100 = model("a100-40gb");
        let wanted = profiles(a100, &[("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)]);
        let layout = solve(a100, &wanted, &[]).unwrap();
        // 3g.20gb at 0 leaves only slot 6 for the two 1g.5gb, so the 3g goes to 4.
        assert_eq!(text(&layout), "2g.10gb@0 1g.5gb@2 1g.5gb@3 3g.20gb@4");
        validate_layout(a100, &layout).unwrap();
        assert_eq!(describe_request(&wanted), "1g.5gb ×2, 2g.10gb ×1, 3g.20gb ×1");
    }

    #[test]
    fn compute_instances_are_created_in_an_order_the_driver_can_place() {
        // Largest first where that fits.
        assert_eq!(creation_order(3, &[1, 1, 1]), Some(vec![1, 1, 1]));
        assert_eq!(creation_order(7, &[1, 2, 4]), Some(vec![4, 2, 1]));
        // A 7g of 2c, 2c and 3c: the 3c first would take 0-2, leaving the 2c's 4-5 only;
        // a 2c first (at 0), the 3c (at 4), the other 2c (at 2) all fit.
        assert_eq!(creation_order(7, &[3, 2, 2]), Some(vec![2, 3, 2]));
        // Too much, or a size past the instance: no order.
        assert_eq!(creation_order(7, &[4, 4]), None);
        assert_eq!(creation_order(3, &[4]), None);
        assert_eq!(creation_order(3, &[0]), None);
    }

    #[test]
    fn an_instance_with_every_media_engine_fits_beside_none_with_one() {
        let rtx = model("rtx-pro-6000-bse");
        let wanted = profiles(rtx, &[("1g.24gb+me.all", 1), ("1g.24gb", 1)]);
        let err = solve(rtx, &wanted, &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "1g.24gb ×1, 1g.24gb+me.all ×1 needs 5 DEC engines, the GPU has 4"
        );
        // Beside instances without media engines it fits.
        let wanted = profiles(rtx, &[("1g.24gb+me.all", 1), ("1g.24gb-me", 3)]);
        let layout = solve(rtx, &wanted, &[]).unwrap();
        validate_layout(rtx, &layout).unwrap();
        // No catalog model's plain profiles run out of engines at their most.
        for m in models().iter().filter(|m| m.supports_mig()) {
            for p in m.mig_profiles.iter().filter(|p| p.is_plain()) {
                let all = vec![p; usize::from(p.max_count)];
                assert!(engine_shortfall(m, &all).is_none(), "{} {}", m.key, p.name);
            }
        }
    }

    #[test]
    fn h100_balanced_solves() {
        let h100 = model("h100");
        let wanted = profiles(h100, &[("3g.40gb", 1), ("1g.10gb", 2), ("2g.20gb", 1)]);
        let layout = solve(h100, &wanted, &[]).unwrap();
        assert_eq!(text(&layout), "2g.20gb@0 1g.10gb@2 1g.10gb@3 3g.40gb@4");
        validate_layout(h100, &layout).unwrap();
    }

    #[test]
    fn seven_small_instances_fill_slots_zero_to_six() {
        let a100 = model("a100-40gb");
        let layout = solve(a100, &profiles(a100, &[("1g.5gb", 7)]), &[]).unwrap();
        assert_eq!(layout.iter().map(|p| p.start).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5, 6]);
        let err = solve(a100, &profiles(a100, &[("1g.5gb", 8)]), &[]).unwrap_err();
        assert_eq!(err.to_string(), "1g.5gb ×8 exceeds the maximum of 7 per GPU");
    }

    #[test]
    fn three_3g_exceed_the_maximum() {
        let a100 = model("a100-40gb");
        let err = solve(a100, &profiles(a100, &[("3g.20gb", 3)]), &[]).unwrap_err();
        assert_eq!(err, Infeasible::TooMany { profile: "3g.20gb", count: 3, max: 2 });
        assert_eq!(err.to_string(), "3g.20gb ×3 exceeds the maximum of 2 per GPU");
    }

    #[test]
    fn too_many_memory_slices_are_refused_with_the_request() {
        let a100 = model("a100-40gb");
        let wanted = profiles(a100, &[("2g.10gb", 1), ("3g.20gb", 2)]);
        let err = solve(a100, &wanted, &[]).unwrap_err();
        assert_eq!(err.to_string(), "2g.10gb ×1, 3g.20gb ×2 needs 10 of 8 memory slices");
    }

    #[test]
    fn too_many_compute_slices_are_refused() {
        let a100 = model("a100-40gb");
        let wanted = profiles(a100, &[("4g.20gb", 1), ("2g.10gb", 2)]);
        let err = solve(a100, &wanted, &[]).unwrap_err();
        assert_eq!(err.to_string(), "2g.10gb ×2, 4g.20gb ×1 needs 8 of 7 compute slices");
    }

    #[test]
    fn a30_balanced_solves() {
        let a30 = model("a30");
        let wanted = profiles(a30, &[("1g.6gb", 2), ("2g.12gb", 1)]);
        let layout = solve(a30, &wanted, &[]).unwrap();
        assert_eq!(text(&layout), "2g.12gb@0 1g.6gb@2 1g.6gb@3");
        let err = solve(a30, &profiles(a30, &[("2g.12gb", 2), ("1g.6gb", 1)]), &[]).unwrap_err();
        assert_eq!(err.to_string(), "1g.6gb ×1, 2g.12gb ×2 needs 5 of 4 memory slices");
    }

    #[test]
    fn preferred_placements_stay_where_they_are() {
        let a100 = model("a100-40gb");
        let wanted = profiles(a100, &[("3g.20gb", 1), ("1g.5gb", 3)]);
        assert_eq!(
            text(&solve(a100, &wanted, &[]).unwrap()),
            "3g.20gb@0 1g.5gb@4 1g.5gb@5 1g.5gb@6"
        );
        // An existing 3g at 4 stays there, and so do the small ones that can.
        let now = [at(a100, "3g.20gb", 4), at(a100, "1g.5gb", 2)];
        assert_eq!(
            text(&solve(a100, &wanted, &now).unwrap()),
            "1g.5gb@0 1g.5gb@1 1g.5gb@2 3g.20gb@4"
        );
        // An existing 3g at 0 stays at 0 when that is feasible.
        let wanted = profiles(a100, &[("3g.20gb", 1), ("2g.10gb", 1), ("1g.5gb", 1)]);
        let now = [at(a100, "3g.20gb", 0), at(a100, "7g.40gb", 0)];
        assert_eq!(text(&solve(a100, &wanted, &now).unwrap()), "3g.20gb@0 2g.10gb@4 1g.5gb@6");
        let now = [at(a100, "3g.20gb", 4), at(a100, "1g.5gb", 1), at(a100, "1g.5gb", 1)];
        assert_eq!(text(&solve(a100, &wanted, &now).unwrap()), "1g.5gb@1 2g.10gb@2 3g.20gb@4");
    }

    #[test]
    fn preferred_placements_that_cannot_all_stay_fall_back() {
        let a100 = model("a100-40gb");
        let wanted = profiles(a100, &[("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)]);
        // Balanced does not fit around a 3g at 0: it has to move.
        let now = [at(a100, "3g.20gb", 0)];
        assert_eq!(
            text(&solve(a100, &wanted, &now).unwrap()),
            "2g.10gb@0 1g.5gb@2 1g.5gb@3 3g.20gb@4"
        );
        // The 3g has to move, but the 1g at 0 and the 2g at 2 can stay.
        let now = [at(a100, "3g.20gb", 0), at(a100, "1g.5gb", 0), at(a100, "2g.10gb", 2)];
        let layout = solve(a100, &wanted, &now).unwrap();
        assert_eq!(text(&layout), "1g.5gb@0 1g.5gb@1 2g.10gb@2 3g.20gb@4");
        // Junk preferences (unwanted profiles, disallowed starts) are ignored.
        let junk = [at(a100, "7g.40gb", 0), at(a100, "3g.20gb", 2), at(a100, "1g.5gb", 7)];
        assert_eq!(solve(a100, &wanted, &junk), solve(a100, &wanted, &[]));
    }

    #[test]
    fn models_without_mig_refuse() {
        let l40s = model("l40s");
        let a100 = model("a100-40gb");
        let wanted = profiles(a100, &[("1g.5gb", 1)]);
        let err = solve(l40s, &wanted, &[]).unwrap_err();
        assert_eq!(err.to_string(), "L40S has no MIG");
        assert_eq!(solve(l40s, &[], &[]), Ok(vec![]));
        assert_eq!(solve(a100, &[], &[at(a100, "1g.5gb", 0)]), Ok(vec![]));
        assert!(validate_layout(l40s, &[at(a100, "1g.5gb", 0)]).is_err());
    }

    #[test]
    fn profiles_of_another_model_are_refused() {
        let a100 = model("a100-40gb");
        let h100 = model("h100");
        let err = solve(a100, &profiles(h100, &[("1g.10gb", 1)]), &[]).unwrap_err();
        assert_eq!(err.to_string(), "1g.10gb is not a MIG profile of A100-SXM4-40GB");
    }

    /// A model whose placements no real GPU has, so that placement failures show.
    fn odd() -> &'static GpuModel {
        let file = r#"
            key = "odd"
            source = "a test double"
            display_name = "Odd"
            nvml_name = "Odd"
            pci_device_ids = []
            architecture = "hopper"
            memory_mib = 4096
            sms = 4
            memory_slots = 4
            compute_slices = 4
            [[mig_profile]]
            name = "1g.odd"
            id = 1
            nvml_enum = 0
            compute_slices = 1
            memory_slices = 1
            memory_mib = 1024
            sms = 1
            max_count = 2
            placements = [1, 2]
            engines = { copy = 0, decoders = 0, encoders = 0, jpeg = 0, ofa = 0 }
            [[mig_profile]]
            name = "2g.odd"
            id = 2
            nvml_enum = 1
            compute_slices = 2
            memory_slices = 2
            memory_mib = 2048
            sms = 2
            max_count = 1
            placements = [1]
            engines = { copy = 0, decoders = 0, encoders = 0, jpeg = 0, ofa = 0 }
        "#;
        gpushare_catalog::intern(gpushare_catalog::parse_model_file(file).unwrap())
    }

    #[test]
    fn totals_that_fit_without_a_placement_are_explained() {
        let odd = odd();
        let wanted = [&odd.mig_profiles[1], &odd.mig_profiles[0]];
        let err = solve(odd, &wanted, &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no placement fits 1g.odd ×1, 2g.odd ×1 (placements: 1g.odd {1,2}, 2g.odd {1})"
        );
        assert_eq!(describe_starts(&[0, 1, 2, 3, 4, 5, 6]), "{0..6}");
        assert_eq!(describe_starts(&[0, 2, 4]), "{0,2,4}");
    }

    #[test]
    fn validate_layout_names_the_broken_rule() {
        let a100 = model("a100-40gb");
        let ok = [at(a100, "2g.10gb", 0), at(a100, "3g.20gb", 4)];
        validate_layout(a100, &ok).unwrap();
        let overlap = [at(a100, "3g.20gb", 0), at(a100, "2g.10gb", 2)];
        assert_eq!(
            validate_layout(a100, &overlap).unwrap_err(),
            "3g.20gb@0 overlaps 2g.10gb@2 on memory slot 2"
        );
        let bad_start = [at(a100, "3g.20gb", 2)];
        assert_eq!(
            validate_layout(a100, &bad_start).unwrap_err(),
            "3g.20gb@2 is not an allowed placement of 3g.20gb (starts {0,4})"
        );
        let full = [at(a100, "4g.20gb", 0), at(a100, "2g.10gb", 4), at(a100, "1g.10gb", 6)];
        validate_layout(a100, &full).unwrap();
        let media = [at(a100, "1g.5gb+me", 0), at(a100, "1g.5gb+me", 1)];
        assert_eq!(
            validate_layout(a100, &media).unwrap_err(),
            "1g.5gb+me ×2 exceeds the maximum of 1 per GPU"
        );
        let odd = odd();
        let past = [Placed::new(&odd.mig_profiles[1], 1)];
        validate_layout(odd, &past).unwrap();
    }

    // ---- properties -------------------------------------------------------------------

    /// Cap on the brute force's leaves (product of the placement counts).
    const BRUTE_FORCE_LEAVES: usize = 20_000;

    /// Every assignment of allowed starts to the instances, each checked by
    /// `validate_layout`; the most preferred placements any valid layout keeps, or `None`
    /// when no assignment is valid.
    fn brute_force(
        model: &GpuModel,
        wanted: &[&'static MigProfile],
        preferred: &[Placed],
    ) -> Option<usize> {
        fn go(
            model: &GpuModel,
            wanted: &[&'static MigProfile],
            preferred: &[Placed],
            current: &mut Vec<Placed>,
            best: &mut Option<usize>,
        ) {
            let Some((&profile, rest)) = wanted.split_first() else {
                if validate_layout(model, current).is_ok() {
                    let kept = kept(current, preferred);
                    *best = Some(best.map_or(kept, |b| b.max(kept)));
                }
                return;
            };
            for &start in &profile.placements {
                current.push(Placed::new(profile, start));
                go(model, rest, preferred, current, best);
                current.pop();
            }
        }
        let mut best = None;
        go(model, wanted, preferred, &mut Vec::new(), &mut best);
        best
    }

    /// How many placements of the layout are also among the preferred ones.
    fn kept(layout: &[Placed], preferred: &[Placed]) -> usize {
        layout.iter().filter(|p| preferred.contains(p)).count()
    }

    fn sorted_profiles(
        list: impl IntoIterator<Item = &'static MigProfile>,
    ) -> Vec<(u32, &'static str)> {
        let mut v: Vec<_> = list.into_iter().map(|p| (p.id, p.name.as_str())).collect();
        v.sort();
        v
    }

    type Case = (&'static GpuModel, Vec<&'static MigProfile>, Vec<Placed>);

    /// A model with MIG, a wanted multiset (up to six instances, so profiles with a small
    /// `max_count` appear one too many times now and then) and preferred placements: mostly wanted profiles at allowed starts, some
    /// junk (any profile of the model at any slot, allowed or not).
    fn case() -> impl Strategy<Value = Case> {
        let mig: Vec<&'static GpuModel> = models().iter().filter(|m| m.supports_mig()).collect();
        prop::sample::select(mig)
            .prop_flat_map(|model| {
                let profiles: Vec<&'static MigProfile> = model.mig_profiles.iter().collect();
                let wanted = prop::collection::vec(prop::sample::select(profiles), 0..=6);
                let preferred = prop::collection::vec(
                    (
                        prop::bool::weighted(0.25),
                        any::<prop::sample::Index>(),
                        any::<prop::sample::Index>(),
                        0..=model.memory_slots,
                    ),
                    0..=5,
                );
                (Just(model), wanted, preferred)
            })
            .prop_map(|(model, wanted, preferred)| {
                let preferred = preferred
                    .into_iter()
                    .map(|(junk, i, j, slot)| {
                        if junk || wanted.is_empty() {
                            Placed::new(i.get(&model.mig_profiles), slot)
                        } else {
                            let profile = *i.get(&wanted);
                            Placed::new(profile, *j.get(&profile.placements))
                        }
                    })
                    .collect();
                (model, wanted, preferred)
            })
            .prop_filter("small enough for the brute force", |(_, wanted, _)| {
                wanted.iter().map(|p| p.placements.len()).product::<usize>() <= BRUTE_FORCE_LEAVES
            })
            .prop_flat_map(|(model, wanted, preferred)| {
                (Just(model), Just(wanted).prop_shuffle(), Just(preferred).prop_shuffle())
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn finds_a_layout_exactly_when_one_exists((model, wanted, preferred) in case()) {
            let solved = solve(model, &wanted, &preferred);
            let best = brute_force(model, &wanted, &preferred);
            prop_assert_eq!(solved.is_ok(), best.is_some(), "{:?}", solved);
            if let Ok(layout) = solved {
                prop_assert!(validate_layout(model, &layout).is_ok(), "{}", text(&layout));
                prop_assert_eq!(
                    sorted_profiles(layout.iter().map(|p| p.profile)),
                    sorted_profiles(wanted.iter().copied())
                );
                prop_assert!(layout.windows(2).all(|w| w[0].start < w[1].start));
                // Keeps as many of the preferred placements as any valid layout can.
                prop_assert_eq!(Some(kept(&layout, &preferred)), best, "{}", text(&layout));
            }
        }

        #[test]
        fn is_deterministic_and_order_independent((model, wanted, preferred) in case()) {
            let first = solve(model, &wanted, &preferred);
            prop_assert_eq!(&first, &solve(model, &wanted, &preferred));
            let mut w = wanted.clone();
            w.reverse();
            let mut p = preferred.clone();
            p.reverse();
            prop_assert_eq!(&first, &solve(model, &w, &p));
        }
    }
}
