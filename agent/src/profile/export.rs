//! The observed state of the GPUs written as a profile (`gpushare-ctl export`): the MIG
//! layout, the sharing (MPS with its limits and mode per whole GPU, GPU instance and
//! compute instance; time-slicing with its interval) and so the compute modes, which
//! follow from the sharing as the planner sets them; applying the text changes nothing.
//! What a profile cannot say is said in notes, which lead the text as comment lines. Also
//! the MIG layout alone as NVIDIA mig-parted's config file, with what it leaves out.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::node::{
    ComputeMode, GpuInstance, GpuState, MpsServerState, MpsSpec, NodeState, TimeSliceInterval,
    index_ranges, limits_text,
};

/// A node written as a profile and as a mig-parted file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    /// The profile's TOML, without the notes.
    body: String,
    /// What the profile cannot say (and what applying it would change), one line each.
    pub notes: Vec<String>,
    /// The MIG layout as NVIDIA mig-parted's file, what it leaves out as leading comments.
    pub mig_parted: String,
    /// What the mig-parted file leaves out (sharing, compute modes), one line each.
    pub left_out: Vec<String>,
}

impl Exported {
    /// The profile's TOML, the notes as comment lines before it.
    pub fn text(&self) -> String {
        let mut text = String::new();
        if !self.notes.is_empty() {
            text.push_str(
                "# Not written (a profile cannot say it), and what applying this does:\n",
            );
            for note in &self.notes {
                let _ = writeln!(text, "#   {}", note.replace('\n', " "));
            }
        }
        text.push_str(&self.body);
        text
    }
}

/// How a GPU or one MIG device is shared, as observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Share {
    Exclusive,
    TimeSlicing(TimeSliceInterval),
    Mps(MpsSpec),
}

impl Share {
    /// The profile's words for it: `"exclusive"`, `{ mps = { ... } }`.
    fn toml(self) -> String {
        match self {
            Share::Exclusive => "\"exclusive\"".to_string(),
            Share::TimeSlicing(interval) => {
                format!("{{ time-slicing = {{ interval = \"{}\" }} }}", interval.as_str())
            }
            Share::Mps(spec) => {
                let mut settings =
                    format!("active_thread_percentage = {}", spec.limits.active_thread_percentage);
                if let Some(bytes) = spec.limits.pinned_memory_limit_bytes {
                    let size = gpushare_proto::exact_size(bytes).replace(' ', "");
                    let _ = write!(settings, ", pinned_memory_limit = \"{size}\"");
                }
                if spec.multi_user {
                    settings.push_str(", multi_user = true");
                }
                format!("{{ mps = {{ {settings} }} }}")
            }
        }
    }

    /// For people: `MPS (25% threads, 10 GiB)`, `time-slicing (medium interval)`.
    fn text(self) -> String {
        match self {
            Share::Exclusive => "no sharing".to_string(),
            Share::TimeSlicing(interval) => {
                format!("time-slicing ({} interval)", interval.as_str())
            }
            Share::Mps(spec) => {
                let multi = if spec.multi_user { ", multi-user" } else { "" };
                format!("MPS ({}{multi})", limits_text(spec.limits))
            }
        }
    }
}

/// A MIG layout as instance counts by key (`3g.20gb`, `1c.3g.40gb`); `None` with MIG off.
type Layout = Option<BTreeMap<String, u32>>;

/// What a GPU looks like as a rule: GPUs that look alike share one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shape {
    /// The MIG layout.
    mig: Layout,
    /// The whole GPU's sharing, or every MIG device's when all are shared alike.
    sharing: Share,
    /// Sharing by MIG key where the devices are not all alike (exclusive ones left out).
    instance_sharing: BTreeMap<String, Share>,
    /// The compute mode, for the mig-parted file's list of what it leaves out.
    compute_mode: ComputeMode,
}

/// A GPU's MIG devices: per GPU instance, per compute instance, the key a profile counts
/// it under and the compute instance's `MIG-…` UUID (none for an instance without compute
/// instances, which a profile counts whole).
fn mig_devices(gpu: &GpuState, gi: &GpuInstance, name: &str) -> Vec<(String, Option<String>)> {
    let whole = gpu.model.and_then(|m| m.profile_by_id(gi.profile_id)).map(|p| p.compute_slices);
    let sizes = gi.compute_layout();
    if sizes.is_empty() {
        return vec![(name.to_string(), None)];
    }
    // A subdivided instance counts its compute instances (`1c.3g.40gb`); one used whole
    // counts 1.
    let used_whole = sizes.iter().all(|&c| Some(c) == whole);
    gi.compute_instances
        .iter()
        .map(|ci| {
            let key = if used_whole { name.to_string() } else { format!("{}c.{name}", ci.slices) };
            (key, Some(ci.uuid.clone()))
        })
        .collect()
}

/// The MPS server of `uuid` on `gpu`, if the agent runs one.
fn server_of<'a>(node: &'a NodeState, gpu: u32, uuid: &str) -> Option<&'a MpsServerState> {
    node.mps.iter().find(|s| s.gpu == gpu && s.uuid == uuid)
}

/// What a server gives new clients, as a share, with notes on what a profile cannot say
/// of it: a daemon that is not running, limits changed behind the agent's back, a server
/// process `mps limit` changed.
fn server_share(
    node: &NodeState,
    server: &MpsServerState,
    device: &str,
    notes: &mut Vec<String>,
) -> Share {
    let spec = node.mps_spec(server);
    if server.pid.is_none() {
        notes.push(format!("{device}: its MPS server is not running; applying this starts it"));
    }
    if let Some(detail) = node.mps_detail(&server.uuid) {
        let drift = detail.drift();
        if let Some((live, _)) = drift.defaults {
            notes.push(format!(
                "{device}: the MPS daemon's defaults are {}, set by hand (drift); written as the profile's {}, which applying puts back",
                limits_text(live),
                limits_text(spec.limits)
            ));
        }
        for (pid, live, set) in &drift.servers {
            notes.push(format!(
                "{device}: MPS server process {pid} gives {}, set by hand (drift); applying puts back {}",
                limits_text(*live),
                limits_text(*set)
            ));
        }
        if let Some(live) = &detail.live {
            for s in live.servers.iter().filter(|s| {
                detail.override_of(s.pid).is_some()
                    && detail.server_source(s) == crate::node::LimitSource::MpsLimit
            }) {
                notes.push(format!(
                    "{device}: MPS server process {} gives {} by `mps limit`, which a profile cannot set (it sets the daemon's defaults, written here); the process keeps it",
                    s.pid,
                    limits_text(s.limits)
                ));
            }
        }
    }
    Share::Mps(spec)
}

/// The shape of one GPU, or `None` (with a note) for one a profile cannot describe at
/// all: a MIG instance of a profile the GPU's MIG table lacks.
fn shape(node: &NodeState, gpu: &GpuState, notes: &mut Vec<String>) -> Option<Shape> {
    let label = gpu.label();
    if let Some(pending) = gpu.mig_pending {
        let mode = if pending { "on" } else { "off" };
        notes.push(format!(
            "{label}: MIG mode {mode} is pending a reset; written as it is now, which applying keeps (cancelling the change)"
        ));
    }
    let mine: Vec<&MpsServerState> = node.mps.iter().filter(|s| s.gpu == gpu.index).collect();
    let mut used: Vec<&str> = Vec::new();
    let shape = if gpu.mig_enabled {
        let mut counts: BTreeMap<String, u32> = BTreeMap::new();
        // Per key, each device's share (with where it is, for notes).
        let mut shares: BTreeMap<String, Vec<(Share, String)>> = BTreeMap::new();
        for gi in &gpu.instances {
            let Some(profile) = gpu.model.and_then(|m| m.profile_by_id(gi.profile_id)) else {
                notes.push(format!(
                    "{label}: left out: GPU instance {} has MIG profile id {}, which the GPU's MIG table lacks; no rule selects the GPU, so applying leaves it as it is",
                    gi.id, gi.profile_id
                ));
                return None;
            };
            for (key, uuid) in mig_devices(gpu, gi, &profile.name) {
                *counts.entry(key.clone()).or_insert(0) += 1;
                let place = format!("{label}: {key} at slot {}", gi.placement_start);
                let share = match uuid.as_deref().and_then(|u| server_of(node, gpu.index, u)) {
                    Some(server) => {
                        used.push(&server.uuid);
                        server_share(node, server, &place, notes)
                    }
                    None => Share::Exclusive,
                };
                shares.entry(key).or_default().push((share, place));
            }
        }
        let mut instance_sharing = BTreeMap::new();
        for (key, devices) in &shares {
            let first = devices[0].0;
            if let Some((other, place)) = devices.iter().find(|(s, _)| *s != first) {
                notes.push(format!(
                    "{place}: {} where another {key} has {}: a profile shares every {key} alike, written as the first one's",
                    other.text(),
                    first.text()
                ));
            }
            instance_sharing.insert(key.clone(), first);
        }
        // Every device alike: one `sharing` says it.
        let first = instance_sharing.values().next().copied();
        let sharing = match first {
            Some(one) if instance_sharing.values().all(|s| *s == one) => {
                instance_sharing.clear();
                one
            }
            _ => {
                instance_sharing.retain(|_, s| *s != Share::Exclusive);
                Share::Exclusive
            }
        };
        if gpu.compute_mode != ComputeMode::Default {
            notes.push(format!(
                "{label}: compute mode {} under MIG; a profile gives a MIG GPU default",
                gpu.compute_mode.as_str()
            ));
        }
        Shape { mig: Some(counts), sharing, instance_sharing, compute_mode: gpu.compute_mode }
    } else {
        let whole = mine.iter().find(|s| s.placement_start.is_none() && s.uuid == gpu.uuid);
        let interval = node.time_sliced(gpu.index);
        let sharing = match (whole, interval) {
            (Some(server), interval) => {
                used.push(&server.uuid);
                if let Some(interval) = interval {
                    notes.push(format!(
                        "{label}: time-slice interval {} under MPS; a profile has one or the other, written as MPS (the interval goes back to default)",
                        interval.as_str()
                    ));
                }
                server_share(node, server, &label, notes)
            }
            (None, Some(interval)) => Share::TimeSlicing(interval),
            (None, None) => Share::Exclusive,
        };
        let mode = match sharing {
            Share::Mps(_) => ComputeMode::ExclusiveProcess,
            _ => ComputeMode::Default,
        };
        if gpu.compute_mode != mode {
            notes.push(format!(
                "{label}: compute mode {} with {}; a profile gives it {}",
                gpu.compute_mode.as_str(),
                sharing.text(),
                mode.as_str()
            ));
        }
        Shape {
            mig: None,
            sharing,
            instance_sharing: BTreeMap::new(),
            compute_mode: gpu.compute_mode,
        }
    };
    for server in mine.iter().filter(|s| !used.contains(&s.uuid.as_str())) {
        notes.push(format!(
            "{label}: an MPS server of {} serves no device the GPU has now; applying stops it",
            server.uuid
        ));
    }
    Some(shape)
}

/// The GPUs grouped by shape, in the order of their first GPU, and the notes.
fn groups(node: &NodeState) -> (Vec<(Shape, Vec<u32>)>, Vec<String>) {
    let mut notes = Vec::new();
    let mut groups: Vec<(Shape, Vec<u32>)> = Vec::new();
    for gpu in &node.gpus {
        let Some(s) = shape(node, gpu, &mut notes) else { continue };
        match groups.iter_mut().find(|(g, _)| *g == s) {
            Some((_, gpus)) => gpus.push(gpu.index),
            None => groups.push((s, vec![gpu.index])),
        }
    }
    let whole = node.gpus.iter().any(|g| !g.mig_enabled);
    if whole && node.timeslices.is_empty() {
        notes.push(
            "time-slice intervals could not be read (nvidia-smi): none written, and applying leaves them as they are"
                .to_string(),
        );
    }
    (groups, notes)
}

/// The node as a profile named `exported` and as a mig-parted file: one rule (entry) per
/// group of GPUs that look alike, MIG instances by exact profile name, subdivided
/// instances as their compute instances (`"1c.3g.40gb" = 3`), MPS with the limits the
/// agent set (the daemon's defaults) and the daemon's mode, time-slicing with its
/// interval. Placements are not written: the planner keeps instances where they are.
/// Applying the profile changes nothing, but for what the notes say.
pub fn export(node: &NodeState) -> Exported {
    let (groups, notes) = groups(node);
    Exported {
        body: profile_body(&groups),
        notes,
        mig_parted: mig_parted_text(&groups),
        left_out: left_out(&groups),
    }
}

fn profile_body(groups: &[(Shape, Vec<u32>)]) -> String {
    let mut text = String::from(
        "name = \"exported\"\ndescription = \"The GPUs as gpushare-ctl export found them\"\n",
    );
    for (shape, gpus) in groups {
        let _ = write!(text, "\n[[gpu]]\nselect = \"{}\"\n", index_ranges(gpus));
        match &shape.mig {
            None => text.push_str("mig = \"disabled\"\n"),
            Some(counts) => {
                let items: Vec<String> =
                    counts.iter().map(|(name, n)| format!("\"{name}\" = {n}")).collect();
                let _ = writeln!(text, "mig = {{ {} }}", items.join(", "));
            }
        }
        if shape.mig.is_none() || shape.sharing != Share::Exclusive {
            let _ = writeln!(text, "sharing = {}", shape.sharing.toml());
        }
        for (key, share) in &shape.instance_sharing {
            let _ = writeln!(text, "instance_sharing.\"{key}\" = {}", share.toml());
        }
    }
    text
}

/// What the mig-parted file leaves out: each group's sharing and compute mode other than
/// the default.
fn left_out(groups: &[(Shape, Vec<u32>)]) -> Vec<String> {
    let mut lines = Vec::new();
    for (shape, gpus) in groups {
        let which = match gpus.len() {
            1 => format!("GPU {}", gpus[0]),
            _ => format!("GPUs {}", index_ranges(gpus)),
        };
        let mut what = Vec::new();
        if shape.sharing != Share::Exclusive {
            let on = if shape.mig.is_some() { " on every MIG device" } else { "" };
            what.push(format!("{}{on}", shape.sharing.text()));
        }
        for (key, share) in &shape.instance_sharing {
            what.push(format!("{} on {key}", share.text()));
        }
        if shape.compute_mode != ComputeMode::Default {
            what.push(format!("compute mode {}", shape.compute_mode.as_str()));
        }
        if !what.is_empty() {
            lines.push(format!("{which}: {}", what.join(", ")));
        }
    }
    lines
}

/// The MIG layout as NVIDIA mig-parted's config file: one config, `exported`, with one
/// entry per group (exact profile names, GPUs by index). The groups select disjoint GPUs,
/// so mig-parted's every-matching-entry and gpushare's first-rule readings agree. MIG
/// names and indices need no YAML quoting but are quoted anyway, as mig-parted's own
/// files do. Groups that differ in sharing only are entries of the same layout.
fn mig_parted_text(groups: &[(Shape, Vec<u32>)]) -> String {
    let mut text =
        String::from("# The GPUs as gpushare-ctl export found them (NVIDIA mig-parted's format)\n");
    let left_out = left_out(groups);
    if !left_out.is_empty() {
        text.push_str(
            "# MIG only: this file leaves out the following, which applying it with gpushare\n\
             # undoes (gpushare-ctl export without --format keeps them):\n",
        );
        for line in &left_out {
            let _ = writeln!(text, "#   {line}");
        }
    }
    text.push_str("version: v1\nmig-configs:\n  exported:\n");
    // Groups of one layout (they differ in sharing) make one entry.
    let mut layouts: Vec<(&Layout, Vec<u32>)> = Vec::new();
    for (shape, gpus) in groups {
        match layouts.iter_mut().find(|(l, _)| **l == shape.mig) {
            Some((_, all)) => all.extend(gpus),
            None => layouts.push((&shape.mig, gpus.clone())),
        }
    }
    for (layout, mut gpus) in layouts {
        gpus.sort_unstable();
        let devices: Vec<String> = gpus.iter().map(u32::to_string).collect();
        let _ = writeln!(text, "    - devices: [{}]", devices.join(", "));
        match layout {
            None => text.push_str("      mig-enabled: false\n"),
            Some(counts) if counts.is_empty() => {
                text.push_str("      mig-enabled: true\n      mig-devices: {}\n");
            }
            Some(counts) => {
                text.push_str("      mig-enabled: true\n      mig-devices:\n");
                for (name, n) in counts {
                    let _ = writeln!(text, "        \"{name}\": {n}");
                }
            }
        }
    }
    text
}

#[cfg(test)]
mod tests;
